//! A DM to one companion: held while a moderator pauses its conversation, answered once a day by a fixed
//! line under 13, within the flood limit; its burst taken in; answered with the history, the user's
//! data, the knowledge its messages call up, what the companion remembers and the user's guided flow.

use chrono::Utc;
use serde_json::Value;
use tracing::warn;

use crate::{
    bus::DmEvent,
    character::Character,
    flow::{self, TurnFlow},
    journal::{Job, StepKind, names::key},
    llm::Message,
    memory::{Access, Recall},
    pipeline::{
        Arrival, Fixed, PipelineError,
        burst::{TakeIn, Taken},
        compose::{Ask, Call, Composer, Instead, SlotView},
        gate::{Asked, Passage, Plan},
        input::Admitted,
        prompt::{self, PromptContext},
        reply::Recalled,
    },
    rag::SearchRide,
    safety::Age,
    spend::Spent,
    store::{Rides, Seen},
    timing::{Stage, stage},
    tools::{Group, Offer, Signals, offer_for_turn},
};

/// The user's guided flow as a turn sees it. Keyed once; lazy.
pub(crate) const FLOW: StepKind<TurnFlow> =
    StepKind::new("flow").says(|_| ("the user's guided flow read".into(), serde_json::json!({})));
/// Stage 4 for a DM: held while paused (a user in crisis gets the crisis line), the under-13 line, else
/// one companion within the flood limit.
pub(super) fn plan<'t>(a: &Admitted<'t>, crisis: bool, paused: bool) -> Asked<'t> {
    let first = a.members[0];
    if paused {
        Asked::Decided(match crisis {
            true => Passage::Go(Plan::fixed(first, Fixed::Crisis)),
            false => Passage::Hold,
        })
    } else if a.age == Age::Under13 {
        Asked::Under13 { crisis }
    } else {
        Asked::WithinFlood(Plan::one(first, false))
    }
}

/// Stage 5 for a DM: its burst (none when a busy or fixed line answers).
pub(super) async fn take_in(
    t: &TakeIn,
    job: &Job,
    a: &Admitted<'_>,
    event: &DmEvent,
    plan: &Plan<'_>,
    arrival: Option<&Arrival<'_>>,
) -> Result<Taken, PipelineError> {
    if plan.busy || plan.fixed.is_some() {
        return Ok(Taken::default());
    }
    let burst = t.burst(job, a.new_job(None), event, arrival);
    Ok(Taken {
        burst: stage(Stage::Order, Box::pin(burst)).await?,
        flow_note: None,
    })
}

/// What a DM's tools may do with the companion's memory of the user.
fn memory(composer: &Composer) -> Access<'_> {
    match composer.memory.config.enabled {
        true => Access::Dm(&composer.memory),
        false => Access::Off,
    }
}

/// What a DM and the rest of its burst ask the model, with the history, the user's data, the knowledge
/// the messages call up, what the companion remembers and the user's flow with the companion: every tool,
/// or none for a user in crisis, who gets the crisis line if the model fails.
pub(super) async fn ask<'c>(
    composer: &'c Composer,
    t: &SlotView<'_, '_>,
    event: &DmEvent,
) -> Result<Ask<'c>, PipelineError> {
    let (a, c) = (t.admitted, t.speaker.character);
    let followers = t.burst.events(event);
    let events: Vec<&DmEvent> = std::iter::once(event).chain(&followers).collect();
    let query = events
        .iter()
        .map(|e| e.content.as_str())
        .filter(|c| !c.is_empty())
        .collect::<Vec<_>>()
        .join("\n");
    let mut ctx = context(composer, t, &query).await?;
    let recalled = Recalled::of(&ctx.knowledge, &ctx.memory);
    let flow = turn_flow(composer, t.job, a, c, ctx.flow.take()).await;
    // A message kept in history before this answer (held while paused) is the one answered now.
    let answering: Vec<String> = events.iter().map(|e| e.message_id.to_hex()).collect();
    (ctx.history.messages).retain(|m| !answering.contains(&m.message_id));
    let turn_flow = flow?;
    let offer = match turn_flow.open() || !composer.settings.prompt.tools_by_turn {
        true => Offer::all(),
        false => dm_offer(&events, &ctx.history, c, &composer.settings.prompt),
    };
    let offered_flows: &[String] = match offer.has(Group::Flows) {
        true => &c.flows,
        false => &[],
    };
    let flow = turn_flow.prompt(&composer.flows, offered_flows);
    drop(turn_flow);
    let tools = super::tools_for(t.crisis);
    let messages = messages(composer, t, &ctx, &events, &flow, offer);
    let (seen, spent) = (ctx.seen.take(), ctx.spent.take());
    // A turn waits on the model holding its request and nothing it was built from.
    drop((ctx, flow, query, answering));
    Ok(Ask {
        call: Call {
            event: event.clone(),
            messages,
            tools,
            offer,
            spent,
            memory: memory(composer),
        },
        recalled: Some(recalled),
        seen,
        instead: Instead::CrisisLine,
    })
}

/// The request's messages: the system prompt (the character, the user's data, the knowledge, the
/// reminders, the flow, the memory), the history and the messages answered; the safety brief last for a
/// user in crisis.
fn messages(
    composer: &Composer,
    t: &SlotView<'_, '_>,
    ctx: &Context,
    events: &[&DmEvent],
    flow: &str,
    offer: Offer,
) -> Vec<Message> {
    let prompt_started = std::time::Instant::now();
    let budget = &composer.settings.prompt;
    let system = prompt::system_prompt(&PromptContext {
        character: t.speaker.character,
        profile: t.admitted.user.profile.as_ref(),
        tricklists: &ctx.tricklists,
        knowledge: &ctx.knowledge,
        reminders: &ctx.history.reminders,
        now: Utc::now(),
        tools_enabled: true,
        flow,
        memory: &ctx.memory,
        budget,
    });
    let tools_tokens = super::tools_for(t.crisis).offered_tokens(offer);
    let mut messages = prompt::conversation(system, &ctx.history, events, budget, tools_tokens);
    crate::timing::add(Stage::Prompt, prompt_started);
    if t.crisis {
        messages.push(Message::system(prompt::SAFETY_BRIEF.to_owned()));
    }
    messages
}

/// What a DM's answer is built from: the history, read in one statement with what rides on it (what
/// the disclosure's rule reads, the user's flow and spending, the knowledge search when the messages'
/// vector is known, the burst's owed record), beside the trick names, the knowledge and the memory.
struct Context {
    history: crate::store::History,
    tricklists: Vec<crate::store::Tricklist>,
    knowledge: Vec<crate::rag::KnowledgeSnippet>,
    memory: Recall,
    seen: Option<Seen>,
    /// The user's flow as the history's statement read it (a companion with flows).
    flow: Option<Value>,
    spent: Option<Spent>,
}

/// What rides with a DM's history statement about its user, in this order: what the disclosure's rule
/// reads, the user's flow (whether it does: a companion with flows), their spending (whether it does).
fn user_rides(composer: &Composer, t: &SlotView<'_, '_>) -> (Rides, bool, bool) {
    let mut rides = Rides::default();
    if let Some(back) = composer.settings.disclosure_lookback {
        let (sql, args) = Seen::dm_ride(Utc::now() - back);
        rides.push(sql, args);
    }
    let has_flows = !t.speaker.character.flows.is_empty();
    if has_flows {
        rides.push(flow::state::RIDE, Default::default());
    }
    let reads_spent = match composer.talk.spend.ride(&t.admitted.ids.user) {
        Some((sql, args)) => {
            rides.push(sql, args);
            true
        }
        None => false,
    };
    (rides, has_flows, reads_spent)
}

/// Reads [`Context`] for the slot `t`, whose messages are `query`.
async fn context(
    composer: &Composer,
    t: &SlotView<'_, '_>,
    query: &str,
) -> Result<Context, PipelineError> {
    let (a, c) = (t.admitted, t.speaker.character);
    let (mut rides, has_flows, reads_spent) = user_rides(composer, t);
    // Knowledge search rides too when the messages' vector is known already (a single message's was
    // embedded at admission for the crisis screen); otherwise retrieval (embedding + vector search)
    // runs beside the history load and the trick names (mostly cached), not after them.
    let search = composer
        .retriever
        .ride(&c.knowledge, query)
        .filter(|r| rides.push_with_floats(r.sql, r.args.clone(), r.vector.to_vec()));
    // And the burst's record, owed before the turn's next record, is written by this statement.
    let owing = t
        .job
        .owing()
        .filter(|o| rides.push_write(crate::journal::OWED_WRITE, o.args()));
    let (context, looked_up) = Box::pin(async {
        tokio::join!(
            stage(Stage::Context, async {
                tokio::try_join!(
                    composer.pg.history(
                        &a.ids.user,
                        &a.ids.bot,
                        composer.settings.history_limit,
                        &rides
                    ),
                    composer.mongo.resolve_tricklists(&a.user.tricklists),
                )
            }),
            knowledge_and_memory(composer, a, &c.knowledge, query, search.as_ref()),
        )
    })
    .await;
    let (mut history, tricklists) = context?;
    let mut ridden = std::mem::take(&mut history.rides).into_iter();
    let seen = (composer.settings.disclosure_lookback)
        .and_then(|_| ridden.next())
        .and_then(Seen::ridden);
    let flow = has_flows.then(|| ridden.next()).flatten();
    let spent = reads_spent
        .then(|| ridden.next())
        .flatten()
        .and_then(|v| Spent::ridden(&v));
    let (knowledge, memory) = looked_up;
    let knowledge = match search {
        // The search ran in the context stage; `retrieve` times reading its hits.
        Some(_) => {
            let value = ridden.next();
            stage(Stage::Retrieve, async {
                composer.retriever.ridden(&c.knowledge, value)
            })
            .await
        }
        None => knowledge,
    };
    if let Some(owing) = owing {
        // Another attempt's burst, recorded first, ends this attempt here, before its model call.
        owing.ridden(ridden.next()).await?;
    }
    Ok(Context {
        history,
        tricklists,
        knowledge,
        memory,
        seen,
        flow,
        spent,
    })
}

/// The knowledge for a DM's messages and what the companion remembers of its user: the pinned facts,
/// the summary, and the facts nearest the messages by the vector retrieval computed (no second model
/// run). Memory that cannot be read is logged and left out, like knowledge.
async fn knowledge_and_memory(
    composer: &Composer,
    a: &Admitted<'_>,
    collections: &[String],
    query: &str,
    ridden: Option<&SearchRide>,
) -> (Vec<crate::rag::KnowledgeSnippet>, Recall) {
    let remembers = a.memory().remembers;
    let (knowledge, vector) = match (ridden, remembers) {
        // The search rides with the history's statement: its value is read there.
        (Some(r), _) => (Vec::new(), Some(r.vector.clone())),
        (None, false) => (composer.retriever.for_turn(collections, query).await, None),
        (None, true) => composer.retriever.lookup(collections, query).await,
    };
    if !remembers {
        return (knowledge, Recall::default());
    }
    let recall = composer
        .memory
        .recall(
            &a.ids.user,
            &a.ids.bot,
            vector.as_deref().map(Vec::as_slice),
        )
        .await
        .unwrap_or_else(|e| {
            warn!(error = %e, "cannot read what the companion remembers; answering without it");
            Recall::default()
        });
    (knowledge, recall)
}

/// The user's flow with the companion as this turn sees it (the `flow` step: a retry after the first
/// model answer sees the same), from `ridden` ([`flow::state::RIDE`]'s value) when it was read with
/// the history; nothing for a companion without flows.
async fn turn_flow(
    composer: &Composer,
    job: &Job,
    a: &Admitted<'_>,
    c: &Character,
    ridden: Option<Value>,
) -> Result<TurnFlow, PipelineError> {
    if c.flows.is_empty() {
        return Ok(Default::default());
    }
    let (pool, user, bot) = (&composer.pg.pool, &a.ids.user, &a.ids.bot);
    let idle_since =
        Utc::now() - chrono::Duration::days(i64::from(composer.settings.flow_idle_days.max(1)));
    // Lazy: reading it again is harmless, and its record rides with the turn's first model answer.
    job.step(&FLOW, key::ONCE)
        .lazy()
        .run(async {
            let flow = match ridden {
                Some(v) => {
                    let current = flow::state::ridden(v)?;
                    TurnFlow::of(current, pool, user, bot, idle_since).await
                }
                None => TurnFlow::load(pool, user, bot, idle_since).await,
            };
            flow.map_err(PipelineError::from)
        })
        .await
}

/// The companion's last message before the new ones: a "yes please" answers what it offered.
fn last_said(history: &[crate::store::HistoryMessage]) -> Option<&str> {
    history
        .iter()
        .rev()
        .find(|m| m.role == "assistant")
        .map(|m| m.content.as_str())
}

/// The tools a DM turn is offered: the groups its messages (and the companion's last message) call for,
/// or, for small talk, those of the conversation's last ask in the history window.
fn dm_offer(
    events: &[&DmEvent],
    history: &crate::store::History,
    c: &Character,
    budget: &crate::config::PromptConfig,
) -> Offer {
    let has_flows = !c.flows.is_empty();
    fn signals(texts: Vec<&str>, pending_reminders: bool, has_flows: bool) -> Signals<'_> {
        Signals {
            texts,
            pending_reminders,
            in_flow: false,
            has_flows,
        }
    }
    let texts = events
        .iter()
        .map(|e| e.content.as_str())
        .chain(last_said(&history.messages))
        .collect();
    offer_for_turn(&signals(texts, !history.reminders.is_empty(), has_flows)).or_earlier(|| {
        let window = prompt::window(history, budget, usize::MAX);
        window
            .iter()
            .rev()
            .filter(|m| m.role == "user")
            .map(move |m| offer_for_turn(&signals(vec![m.content.as_str()], false, has_flows)))
    })
}
