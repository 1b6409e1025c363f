//! The incoming hook: every user message a job takes in passes it, a DM or a group message once its job
//! is open, each later message of a burst once the burst is fixed, before any limit, coverage, routing
//! or model call can skip it (docs/safety.md). It screens the message for a crisis; a flagged message
//! gets its yearly record, the referral that is owed (at most one per conversation per window) and the
//! moderators' alert, each a step keyed by the message. The conductor sends the referral through the
//! outgoing hook and delivery like any companion message, before anything else is said.

use std::sync::Arc;

use async_nats::HeaderMap;
use chrono::Utc;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tracing::{debug, info, warn};

use super::{
    PipelineError, Reply,
    input::{Admitted, UserMessage},
};
use crate::parts::Parts;
use crate::{
    bus::Bus,
    genai,
    journal::{Admission, Counted, Job, StepKind, Telling, Told, names::tally},
    llm::Moderator,
    metrics::{Metric, Metrics},
    rag::Retriever,
    safety::{Category, Decision, Layer, Safety},
    store::Pg,
};

/// User messages seen by the incoming hook, by kind (`dm`, `group`).
pub(crate) const INCOMING: Metric = Metric::new(
    "companion_user_messages_total",
    "User messages seen by the incoming hook, by kind (`dm`, `group`)",
);
/// User messages the crisis screen flagged, by category and language.
pub(crate) const CRISIS_FLAGS: Metric = Metric::new(
    "companion_crisis_flags_total",
    "User messages the crisis screen flagged, by category and language",
);
/// Crisis referrals sent, by category and language.
pub(crate) const CRISIS_REFERRALS: Metric = Metric::new(
    "companion_crisis_referrals_total",
    "Crisis referrals sent, by category and language",
);
/// Questions to the moderation endpoint, by outcome (`flagged`, `clear`, `timeout`, `error`).
pub(crate) const MODERATION: Metric = Metric::new(
    "companion_moderation_requests_total",
    "Questions to the moderation endpoint, by outcome (`flagged`, `clear`, `timeout`, `error`)",
);

/// A user message the crisis screen flagged: its category and language, and whether a referral is owed;
/// the yearly report's row is written in its transaction. Keyed by the message.
pub(crate) const CRISIS: StepKind<Flagged> = StepKind::new("crisis").told(tell_flagged);
/// The crisis decision on a user message: which layer flagged it (or none did), and what the moderation
/// endpoint answered. Keyed by the message; lazy.
pub(crate) const SCREEN: StepKind<Screened> = StepKind::new("screen").told(tell_screened);
/// The crisis referral counted against the conversation's window (tally [`tally::crisis`]).
pub(crate) const REFERRAL: StepKind<Counted> = StepKind::new("referral").says(|_| {
    (
        "referral counted against the conversation's window".into(),
        json!({}),
    )
});
/// The moderators' crisis alert, published. Keyed by the message.
pub(crate) const ALERT: StepKind<()> = StepKind::new("alert").says(|_| {
    (
        "moderators alerted (ids, category, layer; never the text)".into(),
        json!({}),
    )
});

fn tell_flagged(t: &Told<'_>, f: &Flagged) -> Telling {
    let referral = match f.referred {
        true => "owed",
        false => "already sent this window",
    };
    (
        format!(
            "crisis protocol for {}: {} ({}), layer {}, referral {referral}",
            t.key,
            f.category.as_str(),
            f.lang,
            f.layer.as_str(),
        ),
        json!({ "message": t.key, "category": f.category.as_str(), "lang": f.lang,
                "layer": f.layer.as_str(), "referred": f.referred }),
    )
}

fn tell_screened(t: &Told<'_>, s: &Screened) -> Telling {
    let says = match &s.decision {
        None => format!("crisis screen of {}: nothing found", t.key),
        Some(d) => format!(
            "crisis screen of {}: FLAGGED {} by layer {}",
            t.key,
            d.category.as_str(),
            d.layer.as_str()
        ),
    };
    let moderation_says = s.moderation.as_deref().unwrap_or("not configured");
    (
        format!("{says} (moderation endpoint: {moderation_says})"),
        json!({ "message": t.key, "decision": s.decision, "moderation": s.moderation }),
    )
}

/// The `crisis` step's record: what the screen found in a user message, and whether a referral is owed
/// (at most one per conversation per window).
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

/// The incoming hook, with what the screen and the protocol use.
pub(crate) struct Incoming {
    /// The message's embedding for the learned layer (cached for the turn's retrieval).
    pub(crate) retriever: Retriever,
    /// The moderation endpoint the screen also asks, when one is configured.
    pub(crate) moderator: Option<Moderator>,
    /// The protocol's settings and the crisis lines.
    pub(crate) safety: Arc<Safety>,
    /// The yearly crisis record, and whether a moderator holds the conversation.
    pub(crate) pg: Pg,
    /// The moderators' alert.
    pub(crate) bus: Bus,
    pub(crate) metrics: Arc<Metrics>,
}

impl Incoming {
    /// The incoming hook from the shared handles.
    pub(crate) fn new(p: &Parts) -> Self {
        Self {
            retriever: p.retriever.clone(),
            moderator: p.moderator.clone(),
            safety: p.safety.clone(),
            pg: p.pg.clone(),
            bus: p.bus.clone(),
            metrics: p.metrics.clone(),
        }
    }
}

impl Incoming {
    /// The crisis decision on a user message (none: nothing found, or a companion's own message). A
    /// retried attempt replays what the first recorded.
    pub(crate) async fn screen(
        &self,
        job: &Job,
        a: &Admitted<'_>,
        m: &UserMessage<'_>,
    ) -> Result<Option<Decision>, PipelineError> {
        debug!(kind = m.kind, message = %m.id, sender = %m.sender, chars = m.text.chars().count(),
               images = m.images.len(), "user message in");
        if a.members.iter().any(|c| c.bot == m.sender) {
            return Ok(None);
        }
        // Lazy: a retried attempt reads the decision the first one made (the moderation endpoint may
        // answer differently twice); its record rides with the job's next one, and counts the message
        // once it is committed.
        let screened = job
            .step(&SCREEN, m.id.to_hex())
            .lazy()
            .counts(&INCOMING, &[("kind", m.kind)])
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
        let layer = screened
            .decision
            .as_ref()
            .map_or("none", |d| d.layer.as_str());
        genai::Safety::Screened { layer }.record();
        Ok(screened.decision)
    }

    /// The crisis decision on a user message's text: the rules, the learned layer (with the message's
    /// embedding, computed here and cached for the turn's retrieval) and the moderation endpoint when one
    /// is configured, asked at once; the endpoint's timeout or error leaves the local decision.
    async fn screen_message(&self, text: &str) -> Result<Screened, PipelineError> {
        let screen = &self.safety.screen;
        let (vector, (moderation, outcome)) = tokio::join!(
            async {
                match screen.wants_vector() {
                    true => self.retriever.vector(text).await,
                    false => None,
                }
            },
            self.moderate(text),
        );
        let decision = screen.screen(text, vector.as_deref().map(Vec::as_slice), moderation);
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
                let c = self.safety.screen.moderation(&verdict.categories);
                (c, if c.is_some() { "flagged" } else { "clear" })
            }
            Err(e) => {
                warn!(error = %e, "the moderation endpoint gave no answer; the local layers decide");
                (None, e.outcome())
            }
        };
        self.metrics.inc(&MODERATION, &[("outcome", outcome)]);
        (category, Some(outcome))
    }

    /// A user message flagged by `decision`'s layer (at admission, or the reply model's flag later in
    /// the turn): whether a referral is owed (the `referral` tally), and the `crisis` step (the yearly
    /// record, counted), once per message.
    pub(crate) async fn flag(
        &self,
        job: &Job,
        a: &Admitted<'_>,
        m: &UserMessage<'_>,
        decision: Decision,
    ) -> Result<Flagged, PipelineError> {
        let key = m.id.to_hex();
        let window =
            std::time::Duration::from_secs(self.safety.config.crisis_referral_window_secs.max(1));
        let conversation = tally::crisis(&a.ids.conversation);
        let counted = job
            .counted(&REFERRAL, &key, &conversation, 1, window, Utc::now())
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
            .step(&CRISIS, &key)
            .counts(&CRISIS_FLAGS, &labels(&f))
            .run_in_tx(|mut tx| async move {
                let at = Utc::now();
                let logged =
                    Pg::log_crisis(&mut tx, at, f.category.as_str(), &f.lang, owed, kind).await;
                (tx, logged.map(|()| f).map_err(PipelineError::from))
            })
            .await?;
        warn!(message = %m.id, category = flagged.category.as_str(), lang = %flagged.lang,
              layer = flagged.layer.as_str(), referred = flagged.referred,
              "a user message was flagged for a crisis");
        genai::Safety::Flagged {
            category: flagged.category.as_str(),
            layer: flagged.layer.as_str(),
        }
        .record();
        Ok(flagged)
    }

    /// The referral: a fixed message from configuration in the flagged language, with the crisis lines of
    /// the user's country, said by the conversation's (first) companion; in a group, visible to its user
    /// only.
    pub(crate) fn referral(&self, a: &Admitted<'_>, m: &UserMessage<'_>, f: &Flagged) -> Reply {
        let group = a.kind.shared();
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
        let mut reply = Reply::new(referral.text, Some(card), None);
        reply.marks.safety = Some("crisis".into());
        reply.marks.visible_to = group.then(|| vec![m.sender.to_hex()]);
        info!(
            country = referral.country.unwrap_or("unknown"),
            lang = referral.lang,
            category = f.category.as_str(),
            lines = referral.lines.len(),
            "crisis referral fixed"
        );
        self.metrics.inc(&CRISIS_REFERRALS, &labels(f));
        genai::Safety::Referral {
            category: f.category.as_str(),
        }
        .record();
        reply
    }

    /// The moderators' alert on `<prefix>.alert.crisis.<conversationId>`: ids, category and language,
    /// never the text; `paused` when a moderator holds the conversation.
    pub(crate) async fn alert(
        &self,
        job: &Job,
        a: &Admitted<'_>,
        m: &UserMessage<'_>,
        f: &Flagged,
    ) -> Result<(), PipelineError> {
        let key = m.id.to_hex();
        job.step(&ALERT, &key)
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
                Ok::<_, PipelineError>(())
            })
            .await
    }
}

/// A flag's metric labels.
fn labels(f: &Flagged) -> [(&'static str, &str); 3] {
    [
        ("category", f.category.as_str()),
        ("lang", &f.lang),
        ("layer", f.layer.as_str()),
    ]
}
