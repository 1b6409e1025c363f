//! Stage 7: what a companion says in one slot. The prompt differs by input (a DM with its history and
//! burst; a group's shared history and the answers before; a follow-up's brief), then every slot asks the
//! model the same way ([`Composer::converse`]: the tool loop, the per-slot ceiling, the spend budgets).
//! Over the flood limit the character's busy line stands in, at a spend budget its budget line, and for
//! a follow-up whose model fails its plain line. The conductor passes what is composed through the
//! outgoing hook before its `reply` step fixes it, and a concern the model flagged through the crisis
//! protocol first.

use std::{
    collections::HashMap,
    sync::{Arc, LazyLock},
};

use bson::oid::ObjectId;
use chrono::Utc;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tracing::{debug, info, warn};

use super::{
    Burst, Fixed, PipelineError, Reply,
    gate::Plan,
    input::{Admitted, Kind},
    outgoing::Clean,
    prompt::{self, PromptContext},
    tool_loop::{self, LoopLimits},
};
use crate::{
    bus::{Bus, DmEvent, Typing},
    character::Character,
    config::PromptConfig,
    flow::{self, Flows, TurnFlow},
    group::{self, Member},
    journal::{
        Job, StepKind,
        names::{key, key::Slot},
    },
    llm::{CallBudget, ChatRequest, LlmClient, LlmError, Message},
    memory::{Memory, recall::Recall},
    metrics::Metrics,
    proactive::FollowUp,
    rag::{Retriever, SearchRide},
    safety::screen::Category,
    spend::{SpendGuard, Spent},
    store::{Mongo, Pg, pg::Rides, safety::Seen},
    timing::{Stage, stage},
    tools::{
        Clock, Group, REGISTRY, Registry, ToolContext, Toolbox,
        offer::{self, Offer, Signals},
    },
};

/// Stage 7, with what a slot's message is composed from.
pub(crate) struct Composer {
    /// History and the user's flow with the companion.
    pub(crate) pg: Pg,
    /// Tricklists and the group's display names.
    pub(crate) mongo: Mongo,
    /// The knowledge the messages call up.
    pub(crate) retriever: Retriever,
    /// What the companion remembers of the user.
    pub(crate) memory: Memory,
    /// The guided flows the characters offer.
    pub(crate) flows: Arc<Flows>,
    /// The typing indicator.
    pub(crate) bus: Bus,
    pub(crate) talk: Talk,
    pub(crate) settings: ComposeSettings,
    pub(crate) metrics: Arc<Metrics>,
}

/// The model and the tools a slot converses with, and how far.
pub(crate) struct Talk {
    pub(crate) llm: LlmClient,
    /// The tools, built once with the stores they use.
    pub(crate) tools: Arc<Toolbox>,
    /// The spend budgets, checked before each paid call.
    pub(crate) spend: Arc<SpendGuard>,
    pub(crate) limits: LoopLimits,
    /// Model calls one slot may make (`COMPANION_MAX_LLM_CALLS_PER_TURN`).
    pub(crate) max_calls: u32,
    /// The model a character without its own is answered by.
    pub(crate) model: String,
    /// Longest answer asked for, in tokens.
    pub(crate) max_tokens: u32,
    pub(crate) temperature: f32,
}

/// The settings a slot is composed with.
pub(crate) struct ComposeSettings {
    /// History rows read for the prompt.
    pub(crate) history_limit: i64,
    /// The caps of what a slot sends the model.
    pub(crate) prompt: PromptConfig,
    /// Days a user's place in a guided flow is kept.
    pub(crate) flow_idle_days: u32,
    /// The one line a user under 13 gets a day.
    pub(crate) under_13_line: String,
    /// A minor's quiet hours (start, end; local time), for the reminders a tool sets.
    pub(crate) minor_quiet: (chrono::NaiveTime, chrono::NaiveTime),
    pub(crate) clean: Clean,
    /// The output check of the model's own words after its flag.
    pub(crate) screen: crate::safety::detect::CrisisScreen,
    /// How far back the AI disclosure's rule reads a DM (none: the disclosure is off): read with the
    /// history, not after the model answered.
    pub(crate) disclosure_lookback: Option<chrono::Duration>,
}

/// A slot's message as composed, and a concern the model flagged for its user (the conductor runs the
/// crisis protocol on it before the message is fixed).
pub(crate) struct Composed {
    pub(crate) said: Reply,
    pub(crate) concern: Option<Category>,
    /// What the AI disclosure's rule reads, when it rode with the history's statement (a DM).
    pub(crate) seen: Option<Seen>,
}

impl From<Reply> for Composed {
    fn from(said: Reply) -> Self {
        Self {
            said,
            concern: None,
            seen: None,
        }
    }
}

/// What a slot's model was given, kept on its `reply` step: the knowledge chunks (`kb_chunks.id`) and
/// the facts remembered (`memory_facts.id`), each with its similarity to the messages (none for a
/// pinned fact).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct Recalled {
    pub(crate) knowledge: Vec<(String, Option<f32>)>,
    pub(crate) memory: Vec<(String, Option<f32>)>,
}

impl Recalled {
    fn of(knowledge: &[crate::rag::KnowledgeSnippet], memory: &Recall) -> Self {
        Self {
            knowledge: knowledge
                .iter()
                .map(|k| (k.id.to_string(), Some(k.score)))
                .collect(),
            memory: memory.ids().map(|(id, s)| (id.to_owned(), s)).collect(),
        }
    }
}

/// The companion's last message before the new ones: a "yes please" answers what it offered.
fn last_said(history: &[crate::store::pg::HistoryMessage]) -> Option<&str> {
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
    history: &crate::store::pg::History,
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
    offer::for_turn(&signals(texts, !history.reminders.is_empty(), has_flows)).or_earlier(|| {
        let window = prompt::window(history, budget, usize::MAX);
        window
            .iter()
            .rev()
            .filter(|m| m.role == "user")
            .map(move |m| offer::for_turn(&signals(vec![m.content.as_str()], false, has_flows)))
    })
}

/// The tools a companion's slot in a group is offered: what the message and the lines said to it
/// so far call for.
fn group_offer(text: &str, said: &[Reply]) -> Offer {
    offer::for_turn(&Signals {
        texts: std::iter::once(text)
            .chain(said.iter().map(|s| s.content.as_str()))
            .collect(),
        ..Default::default()
    })
}

/// An earlier line of a group as the companion `mine` reads it: its own as its, a moderator's marked,
/// everyone else's with their name (`line`).
fn as_read_by(
    l: &crate::store::pg::GroupLine,
    mine: &str,
    line: &impl Fn(&str, &str) -> Message,
) -> Message {
    match (l.role.as_str(), l.bot_id == mine) {
        ("assistant", true) => Message::assistant(l.content.clone()),
        ("assistant", false) => line(&l.bot_id, &l.content),
        (prompt::MODERATOR, _) => {
            Message::user(format!("{}: {}", prompt::MODERATOR_LABEL, l.content))
        }
        _ => line(&l.user_id, &l.content),
    }
}

/// What a follow-up's model is offered: no tools (it tells, it does not act).
static NO_TOOLS: LazyLock<Registry> = LazyLock::new(Registry::empty);
/// What runs a call no tool was offered for: nothing (every call is an unknown tool).
static NO_TOOLBOX: LazyLock<Toolbox> = LazyLock::new(Toolbox::empty);

/// One slot about to be composed, with what it sees.
pub(crate) struct SlotView<'a, 't> {
    pub(crate) job: &'a Job,
    pub(crate) admitted: &'a Admitted<'t>,
    pub(crate) speaker: Member<'t>,
    /// Another companion's message named this one.
    pub(crate) handed_over: bool,
    /// Which message of the job this is (the key of its steps).
    pub(crate) slot: Slot,
    /// The later messages of a DM's burst, answered too.
    pub(crate) burst: &'a Burst,
    /// The messages already fixed for this job.
    pub(crate) said: &'a [Reply],
    /// Who speaks, and whether a busy or fixed line stands in for the model.
    pub(crate) plan: &'a Plan<'t>,
    /// A message this slot answers was flagged by the crisis screen: the model answers with the safety
    /// brief and no tools, and the character's crisis line stands in when it cannot.
    pub(crate) crisis: bool,
    /// For a follow-up: how its news moved the user's flow on.
    pub(crate) flow_note: Option<&'a str>,
}

/// What the model said in one slot: its text, or none when a spend budget stopped it.
pub(crate) struct ModelAnswer {
    pub(crate) text: Option<String>,
    pub(crate) card: Option<Value>,
    pub(crate) log: Option<Value>,
    /// The model flagged a concern for the user.
    pub(crate) concern: Option<Category>,
}

/// The user's guided flow as a turn sees it. Keyed once; lazy.
pub(crate) const FLOW: StepKind<TurnFlow> =
    StepKind::new("flow").says(|_| ("the user's guided flow read".into(), serde_json::json!({})));
/// A note: why a fixed line (the failure line, the crisis line, the busy or budget line) stands in for the
/// model's answer, keyed `<reply key>@<attempt>.<n>`.
pub(crate) const FIXED_LINE: StepKind<FixedLine> = StepKind::new("fixed_line").told(|_, f| {
    (
        format!(
            "fixed line: the {} line instead of the model's answer, because {}",
            f.line, f.why
        ),
        serde_json::json!({ "line": f.line, "why": f.why }),
    )
});

/// The record of a [`FIXED_LINE`] note.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct FixedLine {
    /// Which line: crisis, busy, budget, under_13, failure.
    line: String,
    why: String,
}

/// Notes in the journal why a fixed line (`which`: crisis, busy, budget, under_13, failure) stands in for the
/// model's answer of the reply keyed `key` ([`FIXED_LINE`]); a note that cannot be written is logged.
pub(super) async fn note_fixed_line(job: &Job, key: &str, which: &str, why: String) {
    let detail = FixedLine {
        line: which.to_owned(),
        why,
    };
    if let Err(e) = job.note(&FIXED_LINE, key, &detail).await {
        warn!(error = %e, "why a fixed line was said not noted in the journal");
    }
}

/// [`note_fixed_line`] for slot `t`'s reply.
async fn note_fixed(t: &SlotView<'_, '_>, which: &str, why: String) {
    note_fixed_line(t.job, &t.slot.reply(t.job.record.generation), which, why).await;
}

impl Composer {
    /// The slot's message.
    pub(crate) async fn compose(&self, t: &SlotView<'_, '_>) -> Result<Composed, PipelineError> {
        let c = t.speaker.character;
        let fixed = match (t.plan.fixed, t.plan.busy, t.crisis) {
            (Some(Fixed::Under13), ..) => Some((
                &self.settings.under_13_line,
                "under_13",
                "the user is under 13: the day's one line",
            )),
            (Some(Fixed::Crisis), ..) => Some((
                &c.crisis_line,
                "crisis",
                "the plan: a user in crisis gets the character's crisis line, no model",
            )),
            (None, true, true) => Some((
                &c.crisis_line,
                "crisis",
                "over the flood limit, a user in crisis: the crisis line instead of the busy line",
            )),
            (None, true, false) => Some((&c.busy_line, "busy", "over the flood limit")),
            (None, false, _) => None,
        };
        if let Some((line, which, why)) = fixed {
            note_fixed(t, which, why.to_owned()).await;
            return Ok(self.line(t.admitted, t.speaker, line.clone()).into());
        }
        match &t.admitted.kind {
            Kind::Dm(event) => self.answer_dm(t, event).await,
            Kind::Group { .. } => self.answer_in_group(t).await,
            Kind::FollowUp { follow_up, .. } => self.follow_up(t, follow_up).await.map(Into::into),
        }
    }

    /// The tools a slot may call: none for a user in crisis.
    fn tools_for(&self, crisis: bool) -> &'static Registry {
        match crisis {
            true => &NO_TOOLS,
            false => &REGISTRY,
        }
    }

    /// A line of the character's own (busy, budget, failure, crisis), as `speaker`; nobody speaks after
    /// it.
    pub(crate) fn line(&self, a: &Admitted<'_>, speaker: Member<'_>, text: String) -> Reply {
        Reply {
            bot: speaker_id(a, speaker),
            last: true,
            ..Reply::new(self.settings.clean.text(&text), None, None)
        }
    }

    /// The model's answer to a DM and the rest of its burst, with the history, the user's data, the
    /// knowledge the messages call up and the user's flow with the companion.
    async fn answer_dm(
        &self,
        t: &SlotView<'_, '_>,
        event: &DmEvent,
    ) -> Result<Composed, PipelineError> {
        let (a, c) = (t.admitted, t.speaker.character);
        self.typing(event.conversation_id, event.bot_id).await;
        let followers = t.burst.events(event);
        let events: Vec<&DmEvent> = std::iter::once(event).chain(&followers).collect();
        let query = events
            .iter()
            .map(|e| e.content.as_str())
            .filter(|c| !c.is_empty())
            .collect::<Vec<_>>()
            .join("\n");
        // What the disclosure's rule reads, the user's flow and their spending ride with the history's
        // statement, in this order.
        let mut rides = Rides::default();
        if let Some(back) = self.settings.disclosure_lookback {
            let (sql, args) = Seen::dm_ride(Utc::now() - back);
            rides.push(sql, args);
        }
        let has_flows = !c.flows.is_empty();
        if has_flows {
            rides.push(flow::state::RIDE, Default::default());
        }
        let reads_spent = match self.talk.spend.ride(&a.ids.user) {
            Some((sql, args)) => {
                rides.push(sql, args);
                true
            }
            None => false,
        };
        // Knowledge search rides too when the messages' vector is known already (a single message's was
        // embedded at admission for the crisis screen); otherwise retrieval (embedding + vector search)
        // runs beside the history load and the trick names (mostly cached), not after them.
        let search = self
            .retriever
            .ride(&c.knowledge, &query)
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
                        self.pg.history(
                            &a.ids.user,
                            &a.ids.bot,
                            self.settings.history_limit,
                            &rides
                        ),
                        self.mongo.resolve_tricklists(&a.user.tricklists),
                    )
                }),
                self.knowledge_and_memory(a, &c.knowledge, &query, search.as_ref()),
            )
        })
        .await;
        let (mut history, tricklists) = context?;
        let mut ridden = std::mem::take(&mut history.rides).into_iter();
        let seen = (self.settings.disclosure_lookback)
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
                    self.retriever.ridden(&c.knowledge, value)
                })
                .await
            }
            None => knowledge,
        };
        if let Some(owing) = owing {
            // Another attempt's burst, recorded first, ends this attempt here, before its model call.
            owing.ridden(ridden.next()).await?;
        }
        let recalled = Recalled::of(&knowledge, &memory);
        let flow = self.turn_flow(t.job, a, c, flow).await;
        // A message kept in history before this answer (held while paused) is the one answered now.
        let answering: Vec<String> = events.iter().map(|e| e.message_id.to_hex()).collect();
        history
            .messages
            .retain(|m| !answering.contains(&m.message_id));
        let turn_flow = flow?;
        let offer = match turn_flow.open() || !self.settings.prompt.tools_by_turn {
            true => Offer::all(),
            false => dm_offer(&events, &history, c, &self.settings.prompt),
        };
        let offered_flows: &[String] = match offer.has(Group::Flows) {
            true => &c.flows,
            false => &[],
        };
        let flow = turn_flow.prompt(&self.flows, offered_flows);
        drop(turn_flow);
        let prompt_started = std::time::Instant::now();
        let system = prompt::system_prompt(&PromptContext {
            character: c,
            profile: a.user.profile.as_ref(),
            tricklists: &tricklists,
            knowledge: &knowledge,
            reminders: &history.reminders,
            now: Utc::now(),
            tools_enabled: true,
            flow: &flow,
            memory: &memory,
            budget: &self.settings.prompt,
        });
        let tools = self.tools_for(t.crisis);
        let tools_tokens = tools.offered_tokens(offer);
        let mut messages = prompt::conversation(
            system,
            &history,
            &events,
            &self.settings.prompt,
            tools_tokens,
        );
        crate::timing::add(Stage::Prompt, prompt_started);
        // A turn waits on the model holding its request and nothing it was built from.
        drop((
            history, tricklists, knowledge, flow, query, answering, memory,
        ));
        if t.crisis {
            messages.push(Message::system(prompt::SAFETY_BRIEF.to_owned()));
        }
        let Some(spoken) = self
            .converse_safely(t, event, messages, offer, spent)
            .await?
        else {
            return Ok(self.line(a, t.speaker, c.crisis_line.clone()).into());
        };
        let concern = spoken.concern;
        let mut said = self.model_said(t, spoken, |text| text).await?;
        said.recalled = Some(recalled);
        Ok(Composed {
            said,
            concern,
            seen,
        })
    }

    /// [`Composer::converse`] with every tool, or for a user in crisis without tools; none when the model
    /// failed a user in crisis (the crisis line stands in, never a failure).
    async fn converse_safely(
        &self,
        t: &SlotView<'_, '_>,
        event: &DmEvent,
        messages: Vec<Message>,
        offer: Offer,
        spent: Option<Spent>,
    ) -> Result<Option<ModelAnswer>, PipelineError> {
        let tools = self.tools_for(t.crisis);
        if !t.crisis {
            return self
                .converse(t, event, messages, tools, offer, spent)
                .await
                .map(Some);
        }
        match self.converse(t, event, messages, tools, offer, spent).await {
            Err(PipelineError::Llm(e)) => {
                warn!(error = %e, "the model could not answer a user in crisis; the crisis line goes");
                let why = format!("the model could not answer a user in crisis: {e}");
                note_fixed(t, "crisis", why).await;
                Ok(None)
            }
            other => other.map(Some),
        }
    }

    /// The knowledge for a DM's messages and what the companion remembers of its user: the pinned facts,
    /// the summary, and the facts nearest the messages by the vector retrieval computed (no second model
    /// run). Memory that cannot be read is logged and left out, like knowledge.
    async fn knowledge_and_memory(
        &self,
        a: &Admitted<'_>,
        collections: &[String],
        query: &str,
        ridden: Option<&SearchRide>,
    ) -> (Vec<crate::rag::KnowledgeSnippet>, Recall) {
        let remembers = a.memory().remembers;
        let (knowledge, vector) = match (ridden, remembers) {
            // The search rides with the history's statement: its value is read there.
            (Some(r), _) => (Vec::new(), Some(r.vector.clone())),
            (None, false) => (self.retriever.for_turn(collections, query).await, None),
            (None, true) => self.retriever.lookup(collections, query).await,
        };
        if !remembers {
            return (knowledge, Recall::default());
        }
        let recall = self
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

    /// The model's answer as one companion of a group, seeing the group's history, the message and the
    /// answers before it.
    async fn answer_in_group(&self, t: &SlotView<'_, '_>) -> Result<Composed, PipelineError> {
        let (a, c, me) = (t.admitted, t.speaker.character, t.speaker.bot);
        let Kind::Group {
            event: group_event,
            participants,
        } = &a.kind
        else {
            unreachable!("a group slot of a group message");
        };
        if t.handed_over {
            self.metrics.inc(&group::HANDOVERS, &[]);
            info!(to = %c.id, "handed over by the companion before");
        }
        self.typing(group_event.conversation_id, me).await;
        let event = group_event.to_bot(me);
        let g = t
            .plan
            .group
            .as_ref()
            .expect("a group message has its group plan");
        let (tricklists, knowledge, names) = Box::pin(async {
            tokio::join!(
                stage(
                    Stage::Context,
                    self.mongo.resolve_tricklists(&a.user.tricklists)
                ),
                self.retriever.for_turn(&c.knowledge, &event.content),
                g.names
                    .get_or_init(|| self.display_names(&a.members, participants)),
            )
        })
        .await;
        let name_of = |id: &str| names.get(id).cloned().unwrap_or_else(|| "someone".into());
        let line = |id: &str, text: &str| Message::user(format!("{}: {text}", name_of(id)));
        let mut prompt = self.group_prompt(t, &tricklists?, &knowledge, participants, &name_of);
        let recalled = Recalled::of(&knowledge, &Recall::default());
        drop(knowledge);
        let mine = me.to_hex();
        let this_message: Vec<&str> = t.said.iter().map(|s| s.id.as_str()).collect();
        let head = event.message_id.to_hex();
        let named = DmEvent {
            content: format!("{}: {}", name_of(&a.ids.user), event.content),
            ..event.clone()
        };
        let offer = match self.settings.prompt.tools_by_turn {
            false => Offer::all(),
            true => group_offer(&event.content, t.said),
        };
        let tools = self.tools_for(t.crisis);
        let said_tokens: usize = t.said.iter().map(|s| prompt::tokens(&s.content)).sum();
        let fixed = tools.offered_tokens(offer) + prompt::tokens(&named.content) + said_tokens;
        let (knowledge, history_cap) = prompt.room(&self.settings.prompt, fixed);
        let earlier: Vec<_> = g
            .history
            .iter()
            .filter(|l| l.message_id != head && !this_message.contains(&l.message_id.as_str()))
            .collect();
        let earlier = prompt::recent(&earlier, history_cap, |l| l.content.len() + 8);
        let mut messages = vec![Message::system(std::mem::take(&mut prompt.system))];
        messages.extend(earlier.iter().map(|l| as_read_by(l, &mine, &line)));
        messages.push(Message::system(format!("{knowledge}{}", prompt.turn)));
        messages.push(prompt::user_message(&named));
        messages.extend(t.said.iter().map(|s| {
            let bot = s.bot.as_deref().unwrap_or_default();
            match bot == mine {
                true => Message::assistant(s.content.clone()),
                false => line(bot, &for_the_others(s, &a.members)),
            }
        }));
        if t.crisis {
            messages.push(Message::system(prompt::GROUP_SAFETY_BRIEF.to_owned()));
        }
        drop((prompt, knowledge, named));
        let spoken = self
            .converse(t, &event, messages, tools, offer, None)
            .await?;
        let concern = spoken.concern;
        let mut said = self
            .model_said(t, spoken, |text| group::strip_own_name(text, &c.name))
            .await?;
        if !said.last {
            said.tags = group::route::handover(&said.content, me, &a.members).map(|b| b.to_hex());
        }
        said.recalled = Some(recalled);
        Ok(Composed {
            said,
            concern,
            seen: None,
        })
    }

    /// The system prompt of a companion's slot in a group: who it is, the sender's tricklists, the
    /// knowledge, and who is in the group; no memory (a group never reads a DM's) and no flows.
    fn group_prompt(
        &self,
        t: &SlotView<'_, '_>,
        tricklists: &[crate::store::mongo::Tricklist],
        knowledge: &[crate::rag::KnowledgeSnippet],
        participants: &[ObjectId],
        name_of: &dyn Fn(&str) -> String,
    ) -> prompt::Prompt {
        let a = t.admitted;
        let mut prompt = prompt::system_prompt(&PromptContext {
            character: t.speaker.character,
            profile: a.user.profile.as_ref(),
            tricklists,
            knowledge,
            reminders: &[],
            now: Utc::now(),
            tools_enabled: true,
            flow: "",
            memory: &Recall::default(),
            budget: &self.settings.prompt,
        });
        let note = group_note(t.speaker, &a.members, participants, name_of, &a.ids.user);
        prompt.system.push_str(&note);
        prompt
    }

    /// The follow-up the model writes with the news in its context (the brief after the conversation so
    /// far, without tools); the character's plain line when the model fails after all its retries and
    /// fallbacks or a budget stops it (the news is never held back for it).
    async fn follow_up(
        &self,
        t: &SlotView<'_, '_>,
        f: &FollowUp<'_>,
    ) -> Result<Reply, PipelineError> {
        let a = t.admitted;
        let (history, tricklists) = Box::pin(async {
            tokio::try_join!(
                async {
                    let limit = self.settings.history_limit;
                    let none = Rides::default();
                    let history = self.pg.history(&a.ids.user, &a.ids.bot, limit, &none);
                    Ok::<_, PipelineError>(history.await?)
                },
                async { Ok(self.mongo.resolve_tricklists(&a.user.tricklists).await?) },
            )
        })
        .await?;
        let system = prompt::system_prompt(&PromptContext {
            character: f.character,
            profile: a.user.profile.as_ref(),
            tricklists: &tricklists,
            knowledge: &[],
            reminders: &[],
            now: Utc::now(),
            tools_enabled: false,
            flow: "",
            memory: &Recall::default(),
            budget: &self.settings.prompt,
        });
        let mut messages = prompt::conversation(system, &history, &[], &self.settings.prompt, 0);
        let brief = format!("{}{}", f.brief, t.flow_note.unwrap_or_default());
        messages.push(Message::system(brief));
        drop((history, tricklists));
        // A follow-up answers no user message: the tool context's message is only a placeholder (no
        // tools are offered, so none is called).
        let as_if = DmEvent {
            message_id: ObjectId::from_bytes([0; 12]),
            conversation_id: f.conversation,
            sender_id: f.user,
            bot_id: f.bot,
            content: String::new(),
            images: Vec::new(),
            sent_at: Utc::now(),
        };
        let written = match self
            .converse(t, &as_if, messages, &NO_TOOLS, Offer::none(), None)
            .await
        {
            Ok(ModelAnswer {
                text: Some(text), ..
            }) => self.settings.clean.text(&text),
            Ok(ModelAnswer { text: None, .. }) => {
                info!("the spend budget is used up; sending the plain line");
                String::new()
            }
            Err(PipelineError::Llm(e)) => {
                warn!(error = %e, "the model could not write the follow-up; sending the plain line");
                String::new()
            }
            Err(e) => return Err(e),
        };
        let content = match written.is_empty() {
            true => self.settings.clean.text(&f.plain),
            false => written,
        };
        Ok(Reply::new(content, f.card.clone(), None))
    }

    /// The model's text as the slot's message (`shape` first: a group strips the speaker's own name),
    /// through the outgoing hook; the budget line when a spend budget stopped the model.
    async fn model_said(
        &self,
        t: &SlotView<'_, '_>,
        spoken: ModelAnswer,
        shape: impl for<'s> Fn(&'s str) -> &'s str,
    ) -> Result<Reply, PipelineError> {
        let Some(text) = spoken.text else {
            info!("the spend budget is used up; answering with the budget line");
            let c = t.speaker.character;
            let (which, line) = match t.crisis {
                true => ("crisis", c.crisis_line.clone()),
                false => ("budget", c.budget_line.clone()),
            };
            let why = "a spend budget (the user's or the service's) is used up, so the model was not asked \
                       (`companion usage --top 10` shows who spent it)";
            note_fixed(t, which, why.to_owned()).await;
            let mut said = self.line(t.admitted, t.speaker, line);
            said.rich_content = spoken.card;
            said.tool_log = spoken.log;
            return Ok(said);
        };
        let reply = Reply::new(
            self.settings.clean.text(shape(text.trim())),
            spoken.card,
            spoken.log,
        );
        if reply.content.is_empty() {
            return Err(LlmError::EmptyAnswer.into());
        }
        Ok(Reply {
            bot: speaker_id(t.admitted, t.speaker),
            ..reply
        })
    }

    /// Asks the model as the slot's companion with `messages` (the system prompt first) and runs the
    /// tool loop with `tools` for `event`'s sender; `spent`, the user's spending when it was read
    /// already (with a DM's history). Its model answers and tool calls are journal steps
    /// keyed under the slot, and the per-turn ceiling counts those of the slot.
    async fn converse(
        &self,
        t: &SlotView<'_, '_>,
        event: &DmEvent,
        messages: Vec<Message>,
        tools: &Registry,
        offer: Offer,
        spent: Option<Spent>,
    ) -> Result<ModelAnswer, PipelineError> {
        let (c, job, user) = (t.speaker.character, t.job, &t.admitted.user);
        let slot = t.slot.calls();
        let request = ChatRequest {
            model: c.model.clone().unwrap_or_else(|| self.talk.model.clone()),
            messages,
            tools: Default::default(),
            tool_choice: None,
            max_tokens: Some(self.talk.max_tokens),
            temperature: Some(self.talk.temperature),
        };
        // Answers recorded by earlier attempts were paid once and are replayed for free.
        let budget = CallBudget::new(
            self.talk
                .max_calls
                .saturating_sub(job.recorded_count_under(&crate::calls::LLM, &slot) as u32),
            self.talk.spend.limits.per_turn_prompt_tokens,
        );
        let cx = tool_loop::LoopContext {
            slot: &slot,
            budget: &budget,
            spend: Some(tool_loop::Spending {
                guard: &self.talk.spend,
                known: spent,
            }),
            llm: &self.talk.llm,
            registry: tools,
            // Offered nothing, the model can run nothing.
            toolbox: match tools.is_empty() {
                true => &NO_TOOLBOX,
                false => &self.talk.tools,
            },
            offer,
            limits: self.talk.limits,
            metrics: &self.metrics,
            tools: ToolContext {
                user: event.sender_id,
                bot: event.bot_id,
                conversation: event.conversation_id,
                character: &c.name,
                message_id: event.message_id,
                call: Default::default(),
                clock: Clock {
                    now: Utc::now(),
                    time_zone: user.profile.as_ref().and_then(|p| p.time_zone.as_deref()),
                    minor_quiet: t
                        .admitted
                        .age
                        .is_minor()
                        .then_some(self.settings.minor_quiet),
                },
                job,
                offered_flows: &c.flows,
                memory: match (&t.admitted.kind, self.memory.config.enabled) {
                    (Kind::Dm(_), true) => crate::memory::Access::Dm(&self.memory),
                    (Kind::Dm(_), false) => crate::memory::Access::Off,
                    _ => crate::memory::Access::Group,
                },
            },
        };
        let out = tool_loop::converse(&cx, request).await?;
        let mut text = out.stopped.is_none().then_some(out.text);
        if let Some(concern) = out.concern {
            // Its own words go after the referral if they may; else the character's crisis line.
            let fits = text.as_deref().is_some_and(|s| {
                !s.trim().is_empty() && self.settings.screen.check_reply(s).is_none()
            });
            if !fits {
                text = Some(c.crisis_line.clone());
                let why = format!(
                    "the model flagged a concern ({}) and its own words were empty or failed the reply check",
                    concern.as_str()
                );
                note_fixed(t, "crisis", why).await;
            }
        }
        Ok(ModelAnswer {
            text,
            card: out.card,
            log: (!out.log.is_empty()).then(|| Value::Array(out.log)),
            concern: out.concern,
        })
    }

    /// The user's flow with the companion as this turn sees it (the `flow` step: a retry after the first
    /// model answer sees the same), from `ridden` ([`flow::state::RIDE`]'s value) when it was read with
    /// the history; nothing for a companion without flows.
    async fn turn_flow(
        &self,
        job: &Job,
        a: &Admitted<'_>,
        c: &Character,
        ridden: Option<Value>,
    ) -> Result<TurnFlow, PipelineError> {
        if c.flows.is_empty() {
            return Ok(Default::default());
        }
        let (pool, user, bot) = (&self.pg.pool, &a.ids.user, &a.ids.bot);
        let idle_since =
            Utc::now() - chrono::Duration::days(i64::from(self.settings.flow_idle_days.max(1)));
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

    /// The typing indicator of `bot` in the conversation, best effort.
    async fn typing(&self, conversation: ObjectId, bot: ObjectId) {
        let typing = Typing {
            conversation_id: conversation.to_hex(),
            sender_id: bot.to_hex(),
            typing: true,
            at: Utc::now(),
        };
        if let Err(e) = stage(Stage::Publish, self.bus.publish_typing(&typing)).await {
            debug!(error = %e, "typing indicator not sent");
        }
    }

    /// Names of the group's people and companions by id (hex), for the history the model reads.
    async fn display_names(
        &self,
        members: &[Member<'_>],
        participants: &[ObjectId],
    ) -> HashMap<String, String> {
        let mut names: HashMap<String, String> = members
            .iter()
            .map(|m| (m.bot.to_hex(), m.character.name.clone()))
            .collect();
        let people: Vec<ObjectId> = participants
            .iter()
            .filter(|p| !names.contains_key(&p.to_hex()))
            .copied()
            .collect();
        match self.mongo.display_names(&people).await {
            Ok(found) => names.extend(found.into_iter().map(|(id, n)| (id.to_hex(), n))),
            Err(e) => {
                debug!(error = %e, "participants' names not read; the history says `someone`")
            }
        }
        names
    }
}

/// The speaker as the `reply` step names it: only where the job has several (a group).
fn speaker_id(a: &Admitted<'_>, speaker: Member<'_>) -> Option<String> {
    matches!(a.kind, Kind::Group { .. }).then(|| speaker.bot.to_hex())
}

/// What a companion is told about the group.
fn group_note(
    me: Member<'_>,
    members: &[Member<'_>],
    participants: &[ObjectId],
    name_of: &dyn Fn(&str) -> String,
    sender: &str,
) -> String {
    let others: Vec<String> = members
        .iter()
        .filter(|m| m.bot != me.bot)
        .map(|m| format!("{} ({})", m.character.name, m.character.sport))
        .collect();
    let people: Vec<String> = participants
        .iter()
        .filter(|p| !members.iter().any(|m| m.bot == **p))
        .map(|p| name_of(&p.to_hex()))
        .collect();
    format!(
        "\n## This is a group chat\nThis conversation is a group chat in TrickBook, not a DM. In it: {} \
         and the companions {}. Messages from others start with the speaker's name and a colon. You \
         are {}: write one short message as yourself only, without a name prefix, and never speak \
         for the others. Your tools act for {} only. If another companion of the group knows this \
         better, you may hand over by naming them in your message; do it only when they would really \
         help, and never just to be polite.\n",
        people.join(", "),
        others.join(", "),
        me.character.name,
        name_of(sender),
    )
}

/// Another companion's message of this round as the next speaker reads it: without the AI disclosure and
/// the break reminder it carries for the user, which the next companion would otherwise answer as if the
/// user had said them.
fn for_the_others(s: &Reply, members: &[Member<'_>]) -> String {
    let content = s.content.as_str();
    let Some(m) = members
        .iter()
        .find(|m| s.bot.as_deref() == Some(m.bot.to_hex().as_str()))
    else {
        return content.to_owned();
    };
    let mut text = content;
    if s.marks.ai_disclosure {
        text = text
            .strip_prefix(m.character.disclosure_line.trim())
            .unwrap_or(text);
    }
    if s.marks.break_reminder {
        text = text
            .trim_end()
            .strip_suffix(m.character.break_line.trim())
            .unwrap_or(text);
    }
    text.trim().to_owned()
}
