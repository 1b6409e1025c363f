//! The two places every message passes, whatever its path, and where the safety protocol stands
//! (docs/safety.md):
//! - every incoming user message ([`Turns::incoming`]), before any limit, coverage, routing or model call
//!   can skip it: the crisis screen, and when it fires the referral, the yearly record and the
//!   moderators' alert, each a step keyed by the message;
//! - every outgoing companion message ([`Turns::outgoing`]), before its `reply` step fixes it: cleaned and
//!   bounded, the output check, and the AI disclosure (with a minor's break reminder) when one is due.

use async_nats::HeaderMap;
use chrono::Utc;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tracing::{debug, info, warn};

use super::{
    Reply, Said, TurnError, Turns,
    deliver::Outgoing,
    input::{Admitted, Kind, UserMessage},
};
use crate::{
    bus::event::clean_text,
    group::Member,
    journal::{
        Admission, Job,
        names::{key, step, tally},
    },
    safety::{
        detect::{self, Decision, Layer},
        disclosure::{self, Due},
        screen::{Blocked, Category},
    },
    store::{
        Pg,
        safety::{Between, Seen},
    },
    tools::clip,
};

/// User messages seen by the incoming hook, by kind (`dm`, `group`).
pub(crate) const INCOMING: &str = "companion_user_messages_total";
/// User messages the crisis screen flagged, by category and language.
pub(crate) const CRISIS_FLAGS: &str = "companion_crisis_flags_total";
/// Crisis referrals sent, by category and language.
pub(crate) const CRISIS_REFERRALS: &str = "companion_crisis_referrals_total";
/// Questions to the moderation endpoint, by outcome (`flagged`, `clear`, `timeout`, `error`).
pub(crate) const MODERATION: &str = "companion_moderation_requests_total";
/// Companion messages the output check replaced, by what it found.
pub(crate) const OUTPUT_BLOCKED: &str = "companion_output_blocked_total";
/// Companion messages that carried the AI disclosure, by why (`first_today`, `continuing`).
pub(crate) const DISCLOSURES: &str = "companion_ai_disclosures_total";

/// The `crisis` step: what the screen found in a user message, and whether a referral is owed (at most
/// one per conversation per window).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Flagged {
    pub(crate) category: Category,
    /// The language the screen matched in; the referral's.
    pub(crate) lang: String,
    pub(crate) referred: bool,
    /// The layer that flagged it (records before layers: the rules).
    #[serde(default = "rules")]
    pub(crate) layer: Layer,
}

fn rules() -> Layer {
    Layer::Rules
}

/// The `screen` step: the crisis decision on a user message (none: nothing found), and what the
/// moderation endpoint did (`flagged`, `clear`, `timeout`, `error`; none when not configured).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct Screened {
    pub(crate) decision: Option<Decision>,
    pub(crate) moderation: Option<String>,
}

impl Turns {
    /// Sees every user message a job takes in: a DM or a group message once its job is open, each later
    /// message of a burst once the burst is fixed. This runs before the flood limit, the spend budget or
    /// a group's routing can skip the message, so a limited or unanswered message is screened all the
    /// same (and a retried attempt replays what the first recorded). A crisis gets its referral here,
    /// before anything else is said.
    pub(crate) async fn incoming(
        &self,
        job: &Job,
        a: &Admitted<'_>,
        m: &UserMessage<'_>,
    ) -> Result<Option<Flagged>, TurnError> {
        debug!(kind = m.kind, message = %m.id, sender = %m.sender, chars = m.text.chars().count(),
               images = m.images.len(), "user message in");
        if a.members.iter().any(|c| c.bot == m.sender) {
            return Ok(None);
        }
        // Lazy: a retried attempt reads the decision the first one made (the moderation endpoint may
        // answer differently twice); its record rides with the job's next one, and counts the message
        // once it is committed.
        let screened = job
            .step(step::SCREEN, m.id.to_hex())
            .lazy()
            .counts(INCOMING, format!("kind=\"{}\"", m.kind))
            .run(async {
                match m.text.trim().is_empty() {
                    true => Ok(Screened {
                        decision: None,
                        moderation: None,
                    }),
                    false => self.screen_message(m.text).await,
                }
            })
            .await?;
        match screened.decision {
            Some(decision) => self.flag(job, a, m, decision).await.map(Some),
            None => Ok(None),
        }
    }

    /// Whether the reply model flagged a concern in the user's message just before this job's (and
    /// within the referral window). Its turn had the referral and the model's own reply, written
    /// before the brief could shape it; the next turn is answered with the safety brief.
    pub(crate) async fn after_model_flag(&self, job: &Job) -> Result<bool, TurnError> {
        let window =
            chrono::Duration::seconds(self.safety.config.crisis_referral_window_secs.max(1) as i64);
        job.step(step::AFTER_FLAG, key::ONCE)
            .lazy()
            .run(async {
                let before = self
                    .journal
                    .previous_steps(job.id(), step::CRISIS, Utc::now() - window)
                    .await?;
                Ok::<_, TurnError>(before.into_iter().any(|v| {
                    serde_json::from_value::<Flagged>(v).is_ok_and(|f| f.layer == Layer::Model)
                }))
            })
            .await
    }

    /// The crisis decision on a user message's text: the rules, the learned layer (with the message's
    /// embedding, computed here and cached for the turn's retrieval) and the moderation endpoint when one
    /// is configured, asked at once; the endpoint's timeout or error leaves the local decision.
    async fn screen_message(&self, text: &str) -> Result<Screened, TurnError> {
        let learned = self.safety.config.screen_learned;
        let (vector, (moderation, outcome)) = tokio::join!(
            async {
                match learned {
                    true => self.retriever.vector(text).await,
                    false => None,
                }
            },
            self.moderate(text),
        );
        let decision = detect::decide(
            text,
            learned,
            vector.as_deref().map(Vec::as_slice),
            moderation,
        );
        Ok(Screened {
            decision,
            moderation: outcome.map(str::to_owned),
        })
    }

    /// The moderation endpoint's category for `text` (none when it flags nothing of ours, is not
    /// configured, or gave no answer) and the outcome of asking it (none when not configured).
    async fn moderate(&self, text: &str) -> (Option<Category>, Option<&'static str>) {
        let Some(moderator) = &self.moderator else {
            return (None, None);
        };
        let (category, outcome) = match moderator.moderate(text).await {
            Ok(verdict) => {
                let c = detect::from_moderation(&verdict.categories);
                (c, if c.is_some() { "flagged" } else { "clear" })
            }
            Err(e) => {
                warn!(error = %e, "the moderation endpoint gave no answer; the local layers decide");
                (None, e.outcome())
            }
        };
        self.metrics
            .inc(MODERATION, &format!("outcome=\"{outcome}\""));
        (category, Some(outcome))
    }

    /// A user message flagged by `decision`'s layer (at admission, or the reply model's flag later in
    /// the turn): the `crisis` step (the yearly record, counted), the referral when one is owed, and the
    /// moderators' alert, each once per message.
    pub(crate) async fn flag(
        &self,
        job: &Job,
        a: &Admitted<'_>,
        m: &UserMessage<'_>,
        decision: Decision,
    ) -> Result<Flagged, TurnError> {
        let key = m.id.to_hex();
        let window =
            std::time::Duration::from_secs(self.safety.config.crisis_referral_window_secs.max(1));
        let conversation = tally::crisis(&a.ids.conversation);
        let counted = job
            .counted(step::REFERRAL, &key, &conversation, 1, window, Utc::now())
            .await?;
        let owed = !matches!(counted, Admission::Exceeded { .. });
        let kind = m.kind;
        let f = Flagged {
            category: decision.category,
            lang: decision.lang.clone(),
            referred: owed,
            layer: decision.layer,
        };
        // Counted when the record (and the yearly row with it) commits, once per message.
        let flagged = job
            .step(step::CRISIS, &key)
            .counts(CRISIS_FLAGS, labels(&f))
            .run_in_tx(|mut tx| async move {
                let at = Utc::now();
                let logged =
                    Pg::log_crisis(&mut tx, at, f.category.as_str(), &f.lang, owed, kind).await;
                (tx, logged.map(|()| f).map_err(TurnError::from))
            })
            .await?;
        warn!(message = %m.id, category = flagged.category.as_str(), lang = %flagged.lang,
              layer = flagged.layer.as_str(), referred = flagged.referred,
              "a user message was flagged for a crisis");
        if flagged.referred {
            self.refer(job, a, m, &flagged).await?;
        }
        self.alert(job, a, m, &flagged).await?;
        Ok(flagged)
    }

    /// The referral: a fixed message from configuration in the flagged language, with the crisis lines of
    /// the user's country, sent by the conversation's (first) companion; in a group, visible to its user
    /// only.
    async fn refer(
        &self,
        job: &Job,
        a: &Admitted<'_>,
        m: &UserMessage<'_>,
        f: &Flagged,
    ) -> Result<(), TurnError> {
        let key = m.id.to_hex();
        let group = matches!(a.kind, Kind::Group { .. });
        let reply = job
            .step(step::REFERRAL_MESSAGE, &key)
            .run(async {
                let profile = a.user.profile.as_ref();
                let referral = self.safety.lines.referral(
                    Some(&f.lang),
                    profile.and_then(|p| p.country.as_deref()),
                    profile.and_then(|p| p.time_zone.as_deref()),
                    f.category,
                );
                let lines: Vec<_> = referral.lines.iter().map(|l| l.card()).collect();
                let mut data = json!({ "lines": lines, "lang": referral.lang });
                if let Some(country) = referral.country {
                    data["country"] = country.into();
                }
                let card = json!({ "type": "crisis_resources", "data": data });
                let mut r = Reply::new(referral.text, Some(card), None);
                r.marks.safety = Some("crisis".into());
                r.marks.visible_to = group.then(|| vec![m.sender.to_hex()]);
                info!(
                    country = referral.country.unwrap_or("unknown"),
                    lang = referral.lang,
                    category = f.category.as_str(),
                    lines = referral.lines.len(),
                    "crisis referral fixed"
                );
                self.metrics.inc(CRISIS_REFERRALS, &labels(f));
                Ok::<_, TurnError>(r)
            })
            .await?;
        let out = Outgoing {
            conversation: a.ids.conversation_id,
            bot: a.members[0].bot,
            user: m.sender,
            in_reply_to: None,
            user_rows: Vec::new(),
            covers: Vec::new(),
            trigger: None,
            responds_to: Some(m.id),
            group,
            key: key::crisis(&key),
        };
        // A referral is never withdrawn.
        let _ = self.write_reply(job, &out, &reply).await?;
        // Fixed before the reply goes on: a crash from here on never sends the referral again.
        job.flush().await?;
        Ok(())
    }

    /// The moderators' alert on `<prefix>.alert.crisis.<conversationId>`: ids, category and language,
    /// never the text; `paused` when a moderator holds the conversation.
    async fn alert(
        &self,
        job: &Job,
        a: &Admitted<'_>,
        m: &UserMessage<'_>,
        f: &Flagged,
    ) -> Result<(), TurnError> {
        let key = m.id.to_hex();
        job.step(step::ALERT, &key)
            .lazy()
            .run(async {
                let paused = self.pg.paused(&a.ids.conversation).await?;
                let body = json!({
                    "conversationId": a.ids.conversation,
                    "userId": m.sender.to_hex(),
                    "messageId": key,
                    "category": f.category.as_str(),
                    "lang": f.lang,
                    "layer": f.layer.as_str(),
                    "paused": paused,
                    "at": Utc::now(),
                });
                let subject = self.bus.names.crisis_alert(&a.ids.conversation);
                let id = format!("crisis:{key}");
                let payload = bytes::Bytes::from(body.to_string());
                self.bus
                    .publish_durable(subject, &id, HeaderMap::new(), payload)
                    .await?;
                Ok::<_, TurnError>(())
            })
            .await
    }

    /// Sees every companion message before it is fixed and written, whoever wrote it (the model, or a
    /// fixed line): without control characters, trimmed and bounded; replaced by the character's safe
    /// line when the output check blocks it; with the disclosure (and a minor's break reminder) when one
    /// is due.
    pub(crate) async fn outgoing(
        &self,
        a: &Admitted<'_>,
        speaker: Member<'_>,
        mut said: Said,
    ) -> Result<Said, TurnError> {
        let c = speaker.character;
        said.reply.content = self.outgoing_text(&said.reply.content);
        if let Some(blocked) = detect::check_reply(&said.reply.content) {
            let what = match blocked {
                Blocked::Sexual => "sexual",
                Blocked::SelfHarm => "self_harm",
            };
            warn!(
                found = what,
                "the output check blocked a companion message; the safe line goes instead"
            );
            self.metrics
                .inc(OUTPUT_BLOCKED, &format!("found=\"{what}\""));
            said.reply.content = self.outgoing_text(&c.safe_line);
            said.reply.rich_content = None;
        }
        let due = self.disclosure_due(a, speaker).await?;
        if due == Due::No {
            return Ok(said);
        }
        let why = match due {
            Due::Continuing => "continuing",
            _ => "first_today",
        };
        self.metrics.inc(DISCLOSURES, &format!("why=\"{why}\""));
        let mut content = format!("{}\n\n{}", c.disclosure_line.trim(), said.reply.content);
        said.reply.marks.ai_disclosure = true;
        if due == Due::Continuing && a.age.is_minor() {
            content = format!("{content}\n\n{}", c.break_line.trim());
            said.reply.marks.break_reminder = true;
        }
        said.reply.content = content;
        Ok(said)
    }

    /// Whether the speaker's message now must carry the disclosure: DMs per user and companion, a group
    /// per conversation and companion.
    async fn disclosure_due(
        &self,
        a: &Admitted<'_>,
        speaker: Member<'_>,
    ) -> Result<Due, TurnError> {
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

    /// The text of a companion message as the outgoing hook lets it out.
    pub(crate) fn outgoing_text(&self, text: &str) -> String {
        clip(clean_text(text).trim(), self.config.max_reply_chars.max(1))
    }
}

/// A flag's metric labels.
fn labels(f: &Flagged) -> String {
    format!(
        "category=\"{}\",lang=\"{}\",layer=\"{}\"",
        f.category.as_str(),
        f.lang,
        f.layer.as_str()
    )
}
