//! Stage 7: what a companion says in one slot. Each kind builds its prompt (`kind/`: a DM with its history
//! and burst; a group's shared history and the answers before; a follow-up's brief), then every slot asks
//! the model the same way ([`Composer::converse`]: the tool loop, the per-slot ceiling, the spend budgets).
//! Over the flood limit the character's busy line stands in, at a spend budget its budget line, and for
//! a follow-up whose model fails its plain line. The conductor passes what is composed through the
//! outgoing hook before its `reply` step fixes it, and a concern the model flagged through the crisis
//! protocol first.

use std::sync::{Arc, LazyLock};

use bson::oid::ObjectId;
use chrono::Utc;
use serde_json::Value;
use tracing::{debug, info};

use super::{
    Burst, Fixed, PipelineError, Reply,
    gate::Plan,
    input::Admitted,
    outgoing::Clean,
    tool_loop::{self, Talk},
};
use crate::{
    bus::{Bus, DmEvent, Typing},
    config::PromptConfig,
    flow::Flows,
    group::Member,
    journal::{Job, names::key::Slot},
    llm::{CallBudget, ChatRequest, LlmError, Message},
    memory::Memory,
    metrics::Metrics,
    rag::Retriever,
    safety::screen::Category,
    spend::Spent,
    store::{Mongo, Pg, safety::Seen},
    timing::{Stage, stage},
    tools::{Clock, REGISTRY, Registry, ToolContext, Toolbox, offer::Offer},
};
use crate::{config::Config, parts::Parts};

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

impl Composer {
    /// Stage 7 from the shared handles: the model and the tools ([`Talk`]), the prompt's caps
    /// (`prompt`), the flows' idle days, and the safety settings a slot's lines and checks read.
    pub(crate) fn new(p: &Parts, c: &Config) -> Self {
        Self {
            pg: p.pg.clone(),
            mongo: p.mongo.clone(),
            retriever: p.retriever.clone(),
            memory: p.memory.clone(),
            flows: p.flows.clone(),
            bus: p.bus.clone(),
            talk: Talk::new(p, c),
            settings: ComposeSettings::new(p, c),
            metrics: p.metrics.clone(),
        }
    }
}

impl ComposeSettings {
    fn new(p: &Parts, c: &Config) -> Self {
        Self {
            history_limit: c.turn.history_limit,
            prompt: c.prompt.clone(),
            flow_idle_days: c.flow.idle_days,
            under_13_line: c.safety.under_13_line.clone(),
            minor_quiet: (c.safety.minor_quiet_start, c.safety.minor_quiet_end),
            clean: Clean::of(c),
            screen: p.safety.screen,
            disclosure_lookback: c.safety.ai_disclosure.then(|| {
                let rhythm = p.safety.rhythm();
                rhythm.every + rhythm.every + rhythm.gap
            }),
        }
    }
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

/// What a follow-up's model is offered: no tools (it tells, it does not act).
pub(crate) static NO_TOOLS: LazyLock<Registry> = LazyLock::new(Registry::empty);
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

/// [`note_fixed_line`](super::reply::note_fixed_line) for slot `t`'s reply.
pub(crate) async fn note_fixed(t: &SlotView<'_, '_>, which: &str, why: String) {
    super::reply::note_fixed_line(t.job, &t.slot.reply(t.job.record.generation), which, why).await;
}

impl Composer {
    /// The character's line that stands in for the model in this slot, if one does: the under-13 line,
    /// the crisis line the plan fixed, the busy line over the flood limit (the crisis line for a user in
    /// crisis); noted in the journal.
    pub(crate) async fn fixed_line(&self, t: &SlotView<'_, '_>) -> Option<Composed> {
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
        let (line, which, why) = fixed?;
        note_fixed(t, which, why.to_owned()).await;
        Some(self.line(t.admitted, t.speaker, line.clone()).into())
    }

    /// The tools a slot may call: none for a user in crisis.
    pub(crate) fn tools_for(&self, crisis: bool) -> &'static Registry {
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

    /// The model's text as the slot's message (`shape` first: a group strips the speaker's own name),
    /// through the outgoing hook; the budget line when a spend budget stopped the model.
    pub(crate) async fn model_said(
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
    pub(crate) async fn converse(
        &self,
        t: &SlotView<'_, '_>,
        event: &DmEvent,
        messages: Vec<Message>,
        (tools, offer): (&Registry, Offer),
        spent: Option<Spent>,
        memory: crate::memory::Access<'_>,
    ) -> Result<ModelAnswer, PipelineError> {
        let (c, job) = (t.speaker.character, t.job);
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
            tools: self.tool_context(t, event, memory),
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

    /// What the slot's tool calls act with: for `event`'s sender, as the slot's companion, on the job's
    /// clock (a minor's quiet hours for the reminders a tool sets).
    fn tool_context<'a>(
        &'a self,
        t: &SlotView<'a, '_>,
        event: &DmEvent,
        memory: crate::memory::Access<'a>,
    ) -> ToolContext<'a> {
        let (c, user) = (t.speaker.character, &t.admitted.user);
        let minor = t.admitted.age.is_minor();
        ToolContext {
            user: event.sender_id,
            bot: event.bot_id,
            conversation: event.conversation_id,
            character: &c.name,
            message_id: event.message_id,
            call: Default::default(),
            clock: Clock {
                now: Utc::now(),
                time_zone: user.profile.as_ref().and_then(|p| p.time_zone.as_deref()),
                minor_quiet: minor.then_some(self.settings.minor_quiet),
            },
            job: t.job,
            offered_flows: &c.flows,
            memory,
        }
    }

    /// The typing indicator of `bot` in the conversation, best effort.
    pub(crate) async fn typing(&self, conversation: ObjectId, bot: ObjectId) {
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
}

/// The speaker as the `reply` step names it: only where the job has several (a group).
fn speaker_id(a: &Admitted<'_>, speaker: Member<'_>) -> Option<String> {
    a.kind.shared().then(|| speaker.bot.to_hex())
}
