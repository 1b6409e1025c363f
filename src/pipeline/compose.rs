//! Stage 7: what a companion says in one slot, composed here once per slot. A fixed line stands in when
//! the plan or the flood limit says so (the under-13 line, the crisis line, the busy line); otherwise the
//! job's kind builds its request as data ([`Ask`]: a DM with its history and burst, a group's shared
//! history and the answers before, a follow-up's brief; `kind/`) and every slot asks the model the same
//! way (the tool loop, the per-slot ceiling, the spend budgets). At a spend budget the character's budget
//! line stands in, and when the model fails, what the kind said stands in ([`Instead`]). The conductor
//! passes what is composed through the outgoing hook before its `reply` step fixes it, and a concern the
//! model flagged through the crisis protocol first.

use std::{future::Future, sync::Arc};

use bson::oid::ObjectId;
use chrono::Utc;
use serde_json::Value;
use tracing::{debug, info, warn};

use super::{
    Burst, Fixed, PipelineError, Reply, gate::Plan, input::Admitted, outgoing::Clean,
    reply::Recalled, tool_loop::Talk,
};
use crate::{
    bus::{Bus, Typing},
    config::PromptConfig,
    flow::Flows,
    group::{self, Member},
    journal::{Job, names::key::Slot},
    llm::LlmError,
    memory::Memory,
    metrics::Metrics,
    rag::Retriever,
    safety::Category,
    store::{Mongo, Pg, Seen},
    timing::{Stage, stage},
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
    pub(crate) screen: crate::safety::CrisisScreen,
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

mod call;

pub(crate) use call::Call;
use call::ModelAnswer;

/// What a kind asks the model in one slot, as data: [`Composer::compose`] asks it, and makes the slot's
/// message of the answer.
pub(crate) struct Ask<'a> {
    pub(crate) call: Call<'a>,
    /// The knowledge and memory the request was built with, kept on the `reply` step.
    pub(crate) recalled: Option<Recalled>,
    /// What the AI disclosure's rule reads, when it rode with the history's statement (a DM).
    pub(crate) seen: Option<Seen>,
    /// What is said when the model fails.
    pub(crate) instead: Instead,
}

/// What a slot says when its model fails (after its retries and fallbacks).
pub(crate) enum Instead {
    /// The error stands, and the job's failure handling answers it.
    Error,
    /// For a user in crisis, the character's crisis line (never the failure); otherwise the error stands.
    CrisisLine,
    /// This plain line, whatever stopped the model (a budget too, or an empty answer), with this card: a
    /// follow-up's news is never held back.
    Plain { line: String, card: Option<Value> },
}

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

/// [`note_fixed_line`](super::reply::note_fixed_line) for slot `t`'s reply.
async fn note_fixed(t: &SlotView<'_, '_>, which: &str, why: String) {
    super::reply::note_fixed_line(t.job, &t.slot.reply(t.job.record.generation), which, why).await;
}

impl Composer {
    /// Stage 7 of slot `t`: a fixed line when one stands in for the model; otherwise, with the typing
    /// indicator on while a message is answered, the request the kind builds (`ask`), asked of the model,
    /// and the slot's message of its answer.
    pub(crate) async fn compose<'c, K, F>(
        &'c self,
        t: &SlotView<'_, '_>,
        ask: K,
    ) -> Result<Composed, PipelineError>
    where
        K: FnOnce(&'c Composer) -> F,
        F: Future<Output = Result<Ask<'c>, PipelineError>>,
    {
        if let Some(fixed) = self.fixed_line(t).await {
            return Ok(fixed);
        }
        let a = t.admitted;
        if a.message().is_some() {
            self.typing(a.ids.conversation_id, t.speaker.bot).await;
        }
        let Ask {
            call,
            recalled,
            seen,
            instead,
        } = ask(self).await?;
        let spoken = match (self.converse(t, call).await, instead) {
            (Ok(spoken), Instead::Plain { line, card }) => {
                if spoken.text.is_none() {
                    info!("the spend budget is used up; sending the plain line");
                }
                return Ok(self.plain(spoken.text, line, card).into());
            }
            (Ok(spoken), _) => spoken,
            (Err(PipelineError::Llm(e)), Instead::Plain { line, card }) => {
                warn!(error = %e, "the model could not write the message; sending the plain line");
                return Ok(self.plain(None, line, card).into());
            }
            (Err(PipelineError::Llm(e)), Instead::CrisisLine) if t.crisis => {
                warn!(error = %e, "the model could not answer a user in crisis; the crisis line goes");
                let why = format!("the model could not answer a user in crisis: {e}");
                note_fixed(t, "crisis", why).await;
                let line = t.speaker.character.crisis_line.clone();
                return Ok(self.line(a, t.speaker, line).into());
            }
            (Err(e), _) => return Err(e),
        };
        let concern = spoken.concern;
        let mut said = self.model_said(t, spoken).await?;
        if a.kind.shared() && !said.last {
            // Several companions share the conversation: the one the message names is handed over to.
            said.tags = group::route::handover(&said.content, t.speaker.bot, &a.members)
                .map(|b| b.to_hex());
        }
        said.recalled = recalled;
        Ok(Composed {
            said,
            concern,
            seen,
        })
    }

    /// A plain line's message: the model's text when it wrote one (cleaned, not empty), else `line`.
    fn plain(&self, text: Option<String>, line: String, card: Option<Value>) -> Reply {
        let written = text
            .map(|t| self.settings.clean.text(&t))
            .unwrap_or_default();
        let content = match written.is_empty() {
            true => self.settings.clean.text(&line),
            false => written,
        };
        Reply::new(content, card, None)
    }
}

impl Composer {
    /// The character's line that stands in for the model in this slot, if one does: the under-13 line,
    /// the crisis line the plan fixed, the busy line over the flood limit (the crisis line for a user in
    /// crisis); noted in the journal.
    async fn fixed_line(&self, t: &SlotView<'_, '_>) -> Option<Composed> {
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

    /// A line of the character's own (busy, budget, failure, crisis), as `speaker`; nobody speaks after
    /// it.
    pub(crate) fn line(&self, a: &Admitted<'_>, speaker: Member<'_>, text: String) -> Reply {
        Reply {
            bot: speaker_id(a, speaker),
            last: true,
            ..Reply::new(self.settings.clean.text(&text), None, None)
        }
    }

    /// The model's text as the slot's message (a group's speaker's own name stripped), through the
    /// outgoing hook; the budget line when a spend budget stopped the model.
    async fn model_said(
        &self,
        t: &SlotView<'_, '_>,
        spoken: ModelAnswer,
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
        let text = text.trim();
        let text = match t.admitted.kind.shared() {
            true => group::strip_own_name(text, &t.speaker.character.name),
            false => text,
        };
        let reply = Reply::new(self.settings.clean.text(text), spoken.card, spoken.log);
        if reply.content.is_empty() {
            return Err(LlmError::EmptyAnswer.into());
        }
        Ok(Reply {
            bot: speaker_id(t.admitted, t.speaker),
            ..reply
        })
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
}

/// The speaker as the `reply` step names it: only where the job has several (a group).
fn speaker_id(a: &Admitted<'_>, speaker: Member<'_>) -> Option<String> {
    a.kind.shared().then(|| speaker.bot.to_hex())
}
