//! A follow-up: news a companion tells its user unprompted (a spot review, a due reminder). Dropped when
//! the news is stale, the user cannot be written to, a minor's quiet hours or the daily cap stand in the
//! way; the user's flow moved on when a waiting step waited for the news; written by the model with the
//! news in its context, without tools, and the character's plain line when the model cannot.

use bson::oid::ObjectId;
use chrono::Utc;
use serde_json::json;
use tracing::info;

use crate::{
    bus::DmEvent,
    flow::{self, state::Applied},
    journal::{Counted, Job, StepKind, names::key},
    llm::Message,
    memory::{Access, Recall},
    pipeline::{
        HELD, PipelineError, UNDER_13,
        burst::{TakeIn, Taken},
        compose::{Ask, Call, Composer, Instead, SlotView},
        gate::{Gate, Passage, Plan},
        input::{Admitted, Reach},
        prompt::{self, PromptContext},
    },
    proactive::FollowUp,
    safety::Age,
    store::Rides,
    tools::Offer,
};

/// A follow-up's checks before anything is sent: stale news, a blocked or departed companion, the daily
/// cap. Why it was dropped, or nothing.
pub(crate) const GATE: StepKind<Option<String>> =
    StepKind::new("gate").told(|_, dropped| match dropped {
        Some(reason) => (
            format!("gate: dropped ({reason})"),
            json!({ "dropped": reason }),
        ),
        None => ("gate: passed".into(), json!({ "dropped": null })),
    });
/// A follow-up counted against the user's daily cap (tally [`crate::journal::names::tally::proactive`]).
pub(crate) const CAP: StepKind<Counted> = StepKind::new("cap")
    .says(|t| crate::flood::counted(t, "gate: counted against the daily follow-up cap"));

/// Stage 4 for a follow-up: the `gate` step (why it is dropped, or nothing: it is sent), then its one
/// companion.
pub(super) async fn plan<'t>(
    gate: &'t Gate,
    job: &Job,
    a: &Admitted<'t>,
    f: &FollowUp<'_>,
    access: Reach,
    paused: bool,
) -> Result<Passage<'t>, PipelineError> {
    let dropped = job
        .step(&GATE, key::ONCE)
        .lazy()
        .run(checks(gate, job, a, f, access, paused))
        .await?;
    Ok(match dropped {
        Some(reason) => Passage::Drop {
            reason,
            keep: false,
        },
        None => Passage::Go(Plan::one(a.members[0], false)),
    })
}

/// A follow-up's checks: the news is still news, the user can still be written to, and the daily cap
/// has room (a counted step, tally `proactive:<user>`). Why it is dropped, or nothing.
async fn checks(
    gate: &Gate,
    job: &Job,
    a: &Admitted<'_>,
    f: &FollowUp<'_>,
    access: Reach,
    paused: bool,
) -> Result<Option<String>, PipelineError> {
    let drop = |why: &str| Ok(Some(why.to_owned()));
    if let Some(stale) = &f.stale {
        return drop(stale);
    }
    if let Some(why) = access.refusal() {
        return drop(why);
    }
    if paused {
        return drop(HELD);
    }
    if a.age == Age::Under13 {
        return drop(UNDER_13);
    }
    let tz = a.user.profile.as_ref().and_then(|p| p.time_zone.as_deref());
    let local = crate::safety::local(Utc::now(), tz);
    if a.age.is_minor() && gate.safety.quiet(local.time()) {
        let c = &gate.safety.config;
        return drop(&format!(
            "quiet hours for a minor ({}–{} local; it is {})",
            c.minor_quiet_start.format("%H:%M"),
            c.minor_quiet_end.format("%H:%M"),
            local.format("%H:%M")
        ));
    }
    let cap = gate.follow_ups.daily_cap;
    let counted = job
        .counted(
            &CAP,
            key::ONCE,
            &crate::journal::names::tally::proactive(&a.ids.user),
            cap,
            std::time::Duration::from_secs(24 * 3600),
            Utc::now(),
        )
        .await?;
    if let crate::journal::Admission::Exceeded { .. } = counted {
        return drop(&format!("the user's daily cap of {cap} proactive messages"));
    }
    Ok(None)
}

/// A follow-up's take-in: the user's flow with its companion moves on when a waiting step waited for
/// this news (step `flow_change`/`event`); the note for the brief when it did. No burst.
pub(super) async fn take_in(
    t: &TakeIn,
    job: &Job,
    a: &Admitted<'_>,
    follow_up: &FollowUp<'_>,
) -> Result<Taken, PipelineError> {
    let Some(awaited) = follow_up.awaited() else {
        return Ok(Taken::default());
    };
    let applied = flow::state::change(job, key::EVENT, &a.ids.user, &a.ids.bot, |current| {
        Ok::<_, ()>(
            current
                .filter(|c| c.waiting_for.as_deref() == Some(awaited.as_str()))
                .filter(|c| c.status == flow::state::status::WAITING)
                .and_then(|c| Some(flow::resume(t.flows.get(&c.flow)?, c.clone()))),
        )
    })
    .await?;
    let Applied::Changed(Some(s)) = applied else {
        return Ok(Taken::default());
    };
    let Some(def) = t.flows.get(&s.flow) else {
        return Ok(Taken::default());
    };
    info!(flow = %s.flow, step = %s.step, status = %s.status, "the news moved the user's flow on");
    Ok(Taken {
        burst: Default::default(),
        flow_note: Some(flow::resumed_note(def, &s)),
    })
}

/// What a follow-up asks the model: the news in its context (the brief after the conversation so far),
/// without tools; the character's plain line when the model fails after all its retries and fallbacks or
/// a budget stops it (the news is never held back for it).
pub(super) async fn ask<'c>(
    composer: &'c Composer,
    t: &SlotView<'_, '_>,
    f: &FollowUp<'_>,
) -> Result<Ask<'c>, PipelineError> {
    let a = t.admitted;
    let (history, tricklists) = Box::pin(async {
        tokio::try_join!(
            async {
                let limit = composer.settings.history_limit;
                let none = Rides::default();
                let history = composer.pg.history(&a.ids.user, &a.ids.bot, limit, &none);
                Ok::<_, PipelineError>(history.await?)
            },
            async {
                Ok(composer
                    .mongo
                    .resolve_tricklists(&a.user.tricklists)
                    .await?)
            },
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
        budget: &composer.settings.prompt,
    });
    let mut messages = prompt::conversation(system, &history, &[], &composer.settings.prompt, 0);
    let brief = format!("{}{}", f.brief, t.flow_note.unwrap_or_default());
    messages.push(Message::system(brief));
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
    Ok(Ask {
        call: Call {
            event: as_if,
            messages,
            tools: &super::NO_TOOLS,
            offer: Offer::none(),
            spent: None,
            memory: Access::Group,
        },
        recalled: None,
        seen: None,
        instead: Instead::Plain {
            line: f.plain.clone(),
            card: f.card.clone(),
        },
    })
}
