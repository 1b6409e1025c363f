//! The outgoing hook: every companion message passes it before its step fixes it, whoever wrote it (the
//! model, a character's fixed line, the crisis referral). It is cleaned of control characters, trimmed
//! and bounded; the output check replaces it by the character's safe line when it blocks it; and it
//! carries the AI disclosure (with a minor's break reminder) when one is due (docs/safety.md).
//!
//! A crisis referral is the configured text with the user's crisis lines: it is cleaned but never cut
//! (its lines reach the user whole) and never replaced (it speaks of self-harm by design). In a DM it
//! carries the disclosure when one is due, like any message; in a group it is private to one user,
//! and the group's disclosure is owed to everyone, so it goes with the next shared message instead.

use std::sync::Arc;

use chrono::Utc;
use serde::{Deserialize, Serialize};
use tracing::warn;

use super::{PipelineError, Reply, input::Admitted, input::Kind};
use crate::{
    bus::event::clean_text,
    genai,
    group::Member,
    metrics::{Metric, Metrics},
    safety::{
        Safety, detect,
        disclosure::{self, Due},
        screen::Blocked,
    },
    store::{
        Pg,
        safety::{Between, Seen},
    },
    tools::clip,
};

/// Companion messages the output check replaced, by what it found.
pub(crate) const OUTPUT_BLOCKED: Metric = Metric::new(
    "companion_output_blocked_total",
    "Companion messages the output check replaced, by what it found",
);
/// Companion messages that carried the AI disclosure, by why (`first_today`, `continuing`).
pub(crate) const DISCLOSURES: Metric = Metric::new(
    "companion_ai_disclosures_total",
    "Companion messages that carried the AI disclosure, by why (`first_today`, `continuing`)",
);

/// The bound of a companion message's text: what every writer of one shapes it with.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Clean {
    /// Longest message, in characters (`COMPANION_MAX_REPLY_CHARS`).
    pub(crate) max_chars: usize,
}

impl Clean {
    /// The text of a companion message as the outgoing hook lets it out.
    pub(crate) fn text(self, text: &str) -> String {
        clip(clean_text(text).trim(), self.max_chars.max(1))
    }
}

/// What the outgoing hook changed in a message, kept on its `reply` step (the AI disclosure it added
/// is the message's mark).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct Hooked {
    /// Cut to the longest message.
    pub(crate) clipped: bool,
    /// Replaced by the character's safe line: what the output check found (`sexual`, `self_harm`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) replaced: Option<String>,
}

/// The outgoing hook, with what it reads.
pub(crate) struct Outgoing {
    pub(crate) clean: Clean,
    /// Whether the disclosure is on, its rhythm, and minors.
    pub(crate) safety: Arc<Safety>,
    /// When the user last heard the disclosure, and their activity since.
    pub(crate) pg: Pg,
    pub(crate) metrics: Arc<Metrics>,
}

impl Outgoing {
    /// `said`, as `speaker` may send it in answer to `a`.
    pub(crate) async fn pass(
        &self,
        a: &Admitted<'_>,
        speaker: Member<'_>,
        mut said: Reply,
    ) -> Result<Reply, PipelineError> {
        let c = speaker.character;
        let referral = said.marks.safety.is_some();
        let mut hooked = Hooked {
            clipped: !referral
                && clean_text(&said.content).trim().chars().count() > self.clean.max_chars.max(1),
            replaced: None,
        };
        said.content = match referral {
            true => clean_text(&said.content).trim().to_owned(),
            false => self.clean.text(&said.content),
        };
        if let Some(blocked) = detect::check_reply(&said.content).filter(|_| !referral) {
            let what = match blocked {
                Blocked::Sexual => "sexual",
                Blocked::SelfHarm => "self_harm",
            };
            warn!(
                found = what,
                "the output check blocked a companion message; the safe line goes instead"
            );
            self.metrics.inc(&OUTPUT_BLOCKED, &[("found", what)]);
            genai::Safety::OutputReplaced { category: what }.record();
            said.content = self.clean.text(&c.safe_line);
            said.rich_content = None;
            hooked.replaced = Some(what.to_owned());
        }
        said.hooked = Some(hooked);
        if said.marks.is_private() {
            return Ok(said);
        }
        let due = self.disclosure_due(a, speaker).await?;
        if due == Due::No {
            return Ok(said);
        }
        let why = match due {
            Due::Continuing => "continuing",
            _ => "first_today",
        };
        self.metrics.inc(&DISCLOSURES, &[("why", why)]);
        let mut content = format!("{}\n\n{}", c.disclosure_line.trim(), said.content);
        said.marks.ai_disclosure = true;
        if due == Due::Continuing && a.age.is_minor() {
            content = format!("{content}\n\n{}", c.break_line.trim());
            said.marks.break_reminder = true;
        }
        said.content = content;
        Ok(said)
    }

    /// Whether the speaker's message now must carry the disclosure: DMs per user and companion, a group
    /// per conversation and companion.
    async fn disclosure_due(
        &self,
        a: &Admitted<'_>,
        speaker: Member<'_>,
    ) -> Result<Due, PipelineError> {
        if !self.safety.config.ai_disclosure {
            return Ok(Due::No);
        }
        let now = Utc::now();
        let rhythm = self.safety.rhythm();
        let bot = speaker.bot.to_hex();
        let between = match a.kind {
            Kind::Group { .. } => Between::Group {
                conversation: &a.ids.conversation,
                bot: &bot,
            },
            _ => Between::Dm {
                user: &a.ids.user,
                bot: &bot,
            },
        };
        let since = now - rhythm.every - rhythm.every - rhythm.gap;
        let Seen {
            last_disclosure,
            activity,
        } = self.pg.disclosures(between, since).await?;
        let tz = a.user.profile.as_ref().and_then(|p| p.time_zone.as_deref());
        Ok(disclosure::due(rhythm, last_disclosure, &activity, now, tz))
    }
}
