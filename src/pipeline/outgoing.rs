//! The outgoing hook: every companion message passes it before its step fixes it, whoever wrote it (the
//! model, a character's fixed line, the crisis referral). It is cleaned of control characters, trimmed
//! and bounded; the output check replaces it by the character's safe line when it blocks it; and it
//! carries the AI disclosure (with a minor's break reminder) when one is due (docs/safety.md, section 3).
//!
//! A crisis referral is the configured text with the user's crisis lines: it is cleaned but never cut
//! (its lines reach the user whole) and never replaced (it speaks of self-harm by design). Help comes
//! first: a disclosure due with a referral is the reviewed plain sentence of `crisis.json` (`aiNotice`,
//! "I'm an AI, a computer program, not a person."), in the referral's language, after the referral's
//! first sentence; never the character's playful disclosure line. Any other message to a user in crisis
//! (this job's message was flagged, or one of the conversation's within the referral window) carries
//! that plain sentence after its text instead of the character's line. A group's referral is private
//! to its user: it carries the notice for them, and the group's disclosure, owed to everyone, still
//! goes with the next shared message (a private message is not in the history the rhythm reads).

use std::sync::Arc;

use chrono::Utc;
use companion_knowledge::rag::Retriever;
use serde::{Deserialize, Serialize};
use tracing::warn;

use super::{PipelineError, Reply, incoming::CRISIS, input::Admitted};
use crate::{
    bus::event::clean_text,
    genai,
    group::Member,
    journal::Journal,
    metrics::{Metric, Metrics},
    safety::{self, Blocked, Due, FirstCheck, Safety},
    store::{Between, Pg, Seen},
    tools::clip,
};
use crate::{config::Config, parts::Parts};

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
    /// As configured (`COMPANION_MAX_REPLY_CHARS`).
    pub(crate) fn of(c: &Config) -> Self {
        Self {
            max_chars: c.turn.max_reply_chars,
        }
    }

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
    /// A reply's embedding, for the output check's vector head behind its gate.
    pub(crate) retriever: Retriever,
    /// Whether the disclosure is on, its rhythm, and minors.
    pub(crate) safety: Arc<Safety>,
    /// When the user last heard the disclosure, and their activity since.
    pub(crate) pg: Pg,
    /// Whether a message of the conversation was flagged within the referral window, when a disclosure
    /// is due and the job knows of no crisis of its own.
    pub(crate) journal: Journal,
    pub(crate) metrics: Arc<Metrics>,
}

impl Outgoing {
    /// The outgoing hook from the shared handles (`turn`: the longest reply).
    pub(crate) fn new(p: &Parts, c: &Config) -> Self {
        Self {
            clean: Clean::of(c),
            retriever: p.retriever.clone(),
            safety: p.safety.clone(),
            pg: p.pg.clone(),
            journal: p.journal.clone(),
            metrics: p.metrics.clone(),
        }
    }
}

/// How a disclosure that is due is said.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Notice<'a> {
    /// The character's own line, before the message (with a minor's break reminder after it when the
    /// interaction has gone on).
    Character,
    /// The plain sentence after a referral's first sentence (its language's).
    InReferral { lang: &'a str },
    /// The plain sentence after the message, for a user in crisis (the crisis's language).
    AfterMessage { lang: String },
}

/// The message `content` carrying the disclosure as `notice` says it; whether a break reminder went
/// with it.
fn disclosed(
    content: &str,
    notice: &Notice<'_>,
    lines: &crate::safety::CrisisLines,
    c: &crate::character::Character,
    break_due: bool,
) -> (String, bool) {
    let mut text = match notice {
        Notice::Character => format!("{}\n\n{content}", c.disclosure_line.trim()),
        Notice::InReferral { lang } => return (lines.with_ai_notice(content, Some(lang)), false),
        Notice::AfterMessage { lang } => {
            format!("{content}\n\n{}", lines.ai_notice(Some(lang)))
        }
    };
    if break_due {
        text = format!("{text}\n\n{}", c.break_line.trim());
    }
    (text, break_due)
}

impl Outgoing {
    /// `said`, as `speaker` may send it in answer to `a`. `crisis` is the language of this job's crisis
    /// when the message answers a user message the crisis protocol flagged (a referral's own language).
    pub(crate) async fn pass(
        &self,
        a: &Admitted<'_>,
        speaker: Member<'_>,
        mut said: Reply,
        crisis: Option<&str>,
        seen: Option<Seen>,
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
        let blocked = match referral {
            true => None,
            false => self.check(&said.content, crisis.is_some()).await,
        };
        if let Some(blocked) = blocked {
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
            // In answer to a crisis, the character's crisis line (kind, fixed): its safe line ("not
            // going there, back to riding") would turn away a user who was just referred.
            said.content = self.clean.text(match crisis {
                Some(_) => &c.crisis_line,
                None => &c.safe_line,
            });
            said.rich_content = None;
            hooked.replaced = Some(what.to_owned());
        }
        said.hooked = Some(hooked);
        // A private message other than a referral (none today) is no one's disclosure.
        if said.marks.is_private() && !referral {
            return Ok(said);
        }
        let due = self.disclosure_due(a, speaker, seen).await?;
        if due == Due::No {
            return Ok(said);
        }
        let why = match due {
            Due::Continuing => "continuing",
            _ => "first_today",
        };
        self.metrics.inc(&DISCLOSURES, &[("why", why)]);
        let notice = match (referral, crisis) {
            (true, lang) => Notice::InReferral {
                lang: lang.unwrap_or("en"),
            },
            (false, Some(lang)) => Notice::AfterMessage {
                lang: lang.to_owned(),
            },
            (false, None) => match self.recent_crisis(a).await? {
                Some(lang) => Notice::AfterMessage { lang },
                None => Notice::Character,
            },
        };
        let break_due = due == Due::Continuing && a.age.is_minor();
        let (content, with_break) =
            disclosed(&said.content, &notice, &self.safety.lines, c, break_due);
        said.content = content;
        said.marks.ai_disclosure = true;
        said.marks.break_reminder = with_break;
        Ok(said)
    }

    /// The output check of a companion message: the rules and the n-gram layer, then, behind the reply
    /// head's gate (or always in answer to a crisis), the head on the message's embedding. An embedding
    /// that fails leaves the first two's decision (logged by the retriever).
    async fn check(&self, text: &str, crisis: bool) -> Option<Blocked> {
        let screen = &self.safety.screen;
        match screen.first_check_reply(text, crisis) {
            FirstCheck::Blocked(blocked) => Some(blocked),
            FirstCheck::Passes => None,
            FirstCheck::AskHead => {
                let vector = self.retriever.vector(text).await?;
                screen.check_reply_vector(text, &vector)
            }
        }
    }

    /// The language of the latest crisis flagged in the conversation within the referral window (none:
    /// no user in crisis there). Read only when a disclosure is due and the job has no crisis of its
    /// own: a follow-up, or the turn after the reply model's flag.
    async fn recent_crisis(&self, a: &Admitted<'_>) -> Result<Option<String>, PipelineError> {
        let window =
            chrono::Duration::seconds(self.safety.config.crisis_referral_window_secs.max(1) as i64);
        let latest = self
            .journal
            .latest_in(&a.ids.conversation, &CRISIS, Utc::now() - window)
            .await?;
        Ok(latest.map(|f| f.lang))
    }

    /// Whether the speaker's message now must carry the disclosure: DMs per user and companion, a group
    /// per conversation and companion. `seen`: what the rule reads, when it was read already (with a
    /// DM's history, before the model answered).
    async fn disclosure_due(
        &self,
        a: &Admitted<'_>,
        speaker: Member<'_>,
        seen: Option<Seen>,
    ) -> Result<Due, PipelineError> {
        if !self.safety.config.ai_disclosure {
            return Ok(Due::No);
        }
        let now = Utc::now();
        let rhythm = self.safety.rhythm();
        let since = now - rhythm.every - rhythm.every - rhythm.gap;
        let tz = a.user.profile.as_ref().and_then(|p| p.time_zone.as_deref());
        let Seen {
            last_disclosure,
            activity,
        } = match seen {
            // Read a little earlier, over a window that started earlier: the same window from now.
            Some(mut seen) => {
                seen.activity.retain(|at| *at > since);
                seen
            }
            None => {
                let bot = speaker.bot.to_hex();
                let between = match a.kind.shared() {
                    true => Between::Group {
                        conversation: &a.ids.conversation,
                        bot: &bot,
                    },
                    false => Between::Dm {
                        user: &a.ids.user,
                        bot: &bot,
                    },
                };
                self.pg.disclosures(between, since).await?
            }
        };
        Ok(safety::due(rhythm, last_disclosure, &activity, now, tz))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kaori() -> crate::character::Character {
        let dir = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/characters"));
        let all = crate::character::Characters::load(dir).expect("the shipped characters");
        let (_, kaori) = all.by_name("kaori").expect("kaori");
        kaori.clone()
    }

    /// The character's playful line only where no one is in crisis; a referral and any message to a user
    /// in crisis carry the plain sentence in the crisis's language, help first.
    #[test]
    fn a_user_in_crisis_hears_the_plain_notice_never_the_character_s_line() {
        let (lines, c) = (crate::safety::CrisisLines::builtin(), kaori());
        let playful = c.disclosure_line.trim();
        let (plain, with_break) = disclosed("hey!", &Notice::Character, &lines, &c, true);
        assert!(plain.starts_with(playful) && plain.ends_with(c.break_line.trim()));
        assert!(with_break);

        let referral = lines.referral(
            Some("ja"),
            Some("JP"),
            None,
            crate::safety::Category::SelfHarm,
        );
        let (text, with_break) = disclosed(
            &referral.text,
            &Notice::InReferral { lang: "ja" },
            &lines,
            &c,
            true,
        );
        assert!(!text.contains(playful) && !with_break, "{text}");
        assert!(
            text.starts_with("話してくれたこと、とても深刻なことだと感じました。私はAI"),
            "{text}"
        );

        let reply = "i'm really glad you told me.";
        let (text, _) = disclosed(
            reply,
            &Notice::AfterMessage { lang: "en".into() },
            &lines,
            &c,
            false,
        );
        assert_eq!(
            text,
            format!("{reply}\n\nI'm an AI, a computer program, not a person.")
        );
    }
}
