//! A slot's model call ([`Call`]): asked as the slot's companion through the tool loop, with the
//! per-slot ceiling and the spend budgets, its tools acting for the message's sender; what the model said
//! ([`ModelAnswer`]), with the character's crisis line when it flagged a concern its own words cannot
//! carry.

use std::sync::LazyLock;

use chrono::Utc;
use serde_json::Value;

use super::{Composer, SlotView, note_fixed};
use crate::{
    bus::DmEvent,
    llm::{CallBudget, ChatRequest, Message},
    memory::Access,
    pipeline::{PipelineError, tool_loop},
    safety::Category,
    spend::Spent,
    tools::{Clock, Offer, Registry, ToolContext, Toolbox},
};

/// What runs a call no tool was offered for: nothing (every call is an unknown tool).
static NO_TOOLBOX: LazyLock<Toolbox> = LazyLock::new(Toolbox::empty);

/// The model call of a slot: the request's messages and what its tools act with.
pub(crate) struct Call<'a> {
    /// The message answered, whose sender the tools act for (a follow-up's answers none: a placeholder,
    /// and no tools).
    pub(crate) event: DmEvent,
    /// The system prompt first.
    pub(crate) messages: Vec<Message>,
    /// The tools offered: none for a user in crisis or a follow-up.
    pub(crate) tools: &'static Registry,
    pub(crate) offer: Offer,
    /// The user's spending, when it was read already (with a DM's history).
    pub(crate) spent: Option<Spent>,
    /// What the tools may do with the companion's memory of the user.
    pub(crate) memory: Access<'a>,
}

/// What the model said in one slot: its text, or none when a spend budget stopped it.
pub(super) struct ModelAnswer {
    pub(super) text: Option<String>,
    pub(super) card: Option<Value>,
    pub(super) log: Option<Value>,
    /// The model flagged a concern for the user.
    pub(super) concern: Option<Category>,
}

impl Composer {
    /// Asks the model as the slot's companion with `call`'s messages (the system prompt first) and runs
    /// the tool loop with its tools for its event's sender. Its model answers and tool calls are journal
    /// steps keyed under the slot, and the per-turn ceiling counts those of the slot.
    pub(super) async fn converse(
        &self,
        t: &SlotView<'_, '_>,
        call: Call<'_>,
    ) -> Result<ModelAnswer, PipelineError> {
        let (c, job) = (t.speaker.character, t.job);
        let slot = t.slot.calls();
        let request = ChatRequest {
            model: c.model.clone().unwrap_or_else(|| self.talk.model.clone()),
            messages: call.messages,
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
                known: call.spent,
            }),
            llm: &self.talk.llm,
            registry: call.tools,
            // Offered nothing, the model can run nothing.
            toolbox: match call.tools.is_empty() {
                true => &NO_TOOLBOX,
                false => &self.talk.tools,
            },
            offer: call.offer,
            limits: self.talk.limits,
            metrics: &self.metrics,
            tools: self.tool_context(t, &call.event, call.memory),
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
        memory: Access<'a>,
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
}
