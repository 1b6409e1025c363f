//! A moderator's takeover of a conversation, handled apart from the pipeline it pauses ([`Takeovers`]).
//! TB-Backend's admin tool publishes
//! `<prefix>.signal.takeover.<conversationId>` to pause the conversation (while paused the pipeline sends
//! no companion message and holds the users' messages, see its gate) or to resume it. Each signal is one
//! job of the journal, kind `takeover`, id `takeover:<conversationId>:<action>:<at>` (however often it is
//! published or delivered), with these steps:
//!
//! | step | what it does | recorded |
//! |---|---|---|
//! | `takeover` | sets the state unless an equal or later signal set it (the latest `at` wins), in its transaction | whether it changed the state, and when the pause began |
//! | `moderator_history` | on a resume that changed the state: what moderators wrote in the app during the pause joins the companion's history as role `moderator` (lazy; a keyed write) | how many messages |
//! | `catch_up` | on such a resume, unless `catchUp` is false: the latest held job of the pause | its id, or none |
//!
//! Then that job is opened again while it is still held, and its message runs through the pipeline once
//! more; a retry finds `catch_up` recorded and the job running (a crash after it was opened) or answered,
//! which the held job's own journal makes harmless. The job ends `done`.

use std::sync::Arc;

use bson::{Bson, Document, oid::ObjectId};
use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Deserialize, Serialize};
use tracing::{Instrument, info, info_span, warn};

use crate::{
    bus::{
        Bus, BusError, Inbound,
        event::{InvalidEvent, clean_text, parse_event, parse_object_id},
    },
    journal::{Attempt, Finish, Job, Journal, NewJob, State, StepKind, names::key},
    pipeline::{Input, Pipeline, PipelineError, prompt},
    proactive::ProactiveError,
    store::{Mongo, NewHistory, Pg, Takeover},
};
use crate::{config::Config, parts::Parts};

/// The kind of a takeover signal (`<prefix>.signal.takeover.<conversationId>`) and of its job.
pub(crate) const KIND: &str = "takeover";
/// Longest moderator id accepted (it is the job's user).
const MAX_BY: usize = 200;
/// Longest reason kept.
const MAX_REASON: usize = 1000;
/// Why a held job goes back to `held` when its event cannot be read again (its `last_error`).
const GONE: &str = "the held message's event is no longer in the inbound stream";

/// What a moderator did to the conversation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Pause,
    Resume,
}

impl Action {
    /// As the signal and the job id spell it.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Action::Pause => "pause",
            Action::Resume => "resume",
        }
    }
}

/// The body as the admin tool publishes it.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Body {
    action: String,
    by: String,
    /// Kept as text, so that a bad time says so rather than "invalid JSON".
    at: String,
    #[serde(default)]
    reason: Option<String>,
    #[serde(default)]
    catch_up: Option<bool>,
}

/// A takeover signal, validated.
#[derive(Clone, Debug)]
pub(crate) struct Signal {
    pub(crate) conversation: ObjectId,
    pub(crate) action: Action,
    /// The state it asks for, as the store keeps it (`paused_at` is the store's to say).
    pub(crate) takeover: Takeover,
}

impl Signal {
    /// Its job's id (see [`job_id`]).
    pub(crate) fn job_id(&self) -> String {
        job_id(
            &self.takeover.conversation_id,
            self.action,
            self.takeover.at,
        )
    }
}

/// The job of a takeover signal: `takeover:<conversationId>:<action>:<at>`, `at` in RFC 3339 UTC, so that
/// every copy of one moderator's action is one job, whatever offset or precision it was written with.
pub fn job_id(conversation: &str, action: Action, at: DateTime<Utc>) -> String {
    let at = at.to_rfc3339_opts(SecondsFormat::AutoSi, true);
    format!("{KIND}:{conversation}:{}:{at}", action.as_str())
}

/// Parses the body of a takeover signal for `conversation` (the subject's last token), at most
/// `max_bytes` long.
pub(crate) fn parse(
    conversation: &str,
    payload: &[u8],
    max_bytes: usize,
) -> Result<Signal, InvalidEvent> {
    let malformed = |why: &str| InvalidEvent::Malformed(why.chars().take(200).collect());
    let id = parse_object_id(conversation).ok_or(InvalidEvent::BadId {
        field: "conversationId",
    })?;
    if payload.len() > max_bytes {
        return Err(InvalidEvent::TooLarge {
            size: payload.len(),
            limit: max_bytes,
        });
    }
    let text = std::str::from_utf8(payload).map_err(|_| InvalidEvent::NotUtf8)?;
    let body: Body = serde_json::from_str(text).map_err(|e| malformed(&e.to_string()))?;
    let action = match body.action.as_str() {
        "pause" => Action::Pause,
        "resume" => Action::Resume,
        _ => return Err(malformed("`action` must be \"pause\" or \"resume\"")),
    };
    let at = DateTime::parse_from_rfc3339(&body.at)
        .map_err(|_| malformed("`at` is not an RFC 3339 time"))?
        .with_timezone(&Utc);
    let by = clean_text(&body.by).trim().to_owned();
    if by.chars().count() > MAX_BY {
        return Err(malformed("`by` is longer than 200 characters"));
    }
    let reason = body
        .reason
        .map(|r| clean_text(&r).trim().chars().take(MAX_REASON).collect())
        .filter(|r: &String| !r.is_empty());
    Ok(Signal {
        conversation: id,
        action,
        takeover: Takeover {
            conversation_id: id.to_hex(),
            paused: action == Action::Pause,
            by,
            reason,
            catch_up: body.catch_up.unwrap_or(true),
            at,
            paused_at: None,
        },
    })
}

/// The `takeover` step's record.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct StateChange {
    /// This signal is the latest: it set the state (false: an equal or later one had).
    changed: bool,
    /// When the pause began: a resume's window for the held and the moderators' messages.
    paused_at: Option<DateTime<Utc>>,
}

/// A moderator's pause or resume of a conversation: whether it changed the takeover state, which is
/// written in its transaction. Keyed once.
const TAKEOVER: StepKind<StateChange> = StepKind::new("takeover");
/// On resume: what moderators wrote during the pause, added to the companion's history (how many lines).
/// Keyed once; lazy.
const MODERATOR_HISTORY: StepKind<usize> = StepKind::new("moderator_history");
/// On resume: the latest held job, opened again to be answered (or none). Keyed once.
const CATCH_UP: StepKind<CatchUp> = StepKind::new("catch_up");

/// The steps this module records, for `companion explain` (told by their names).
pub(crate) const STEPS: [&dyn crate::journal::Tell; 3] = [&TAKEOVER, &MODERATOR_HISTORY, &CATCH_UP];

/// The `catch_up` step's record: the held job opened again, if there was one.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct CatchUp {
    job: Option<HeldJob>,
}

/// A held job, and where its event is.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct HeldJob {
    id: String,
    kind: String,
    /// Its event's sequence in the inbound stream.
    stream_seq: Option<u64>,
}

/// A message a moderator wrote, as the history keeps it.
struct ModeratorLine {
    id: String,
    sender: String,
    content: String,
    at: DateTime<Utc>,
}

impl ModeratorLine {
    /// A `dm_messages` document with an id, a sender, text and a time; none otherwise (an image alone).
    fn of(d: &Document) -> Option<Self> {
        let hex = |b: &Bson| match b {
            Bson::ObjectId(o) => Some(o.to_hex()),
            Bson::String(s) => Some(s.to_ascii_lowercase()),
            _ => None,
        };
        let content = clean_text(d.get_str("content").ok()?).trim().to_owned();
        if content.is_empty() {
            return None;
        }
        Some(Self {
            id: hex(d.get("_id")?)?,
            sender: hex(d.get("senderId")?)?,
            content,
            at: d.get_datetime("timestamp").ok()?.to_chrono(),
        })
    }
}

/// The takeover signals' handler: the state it sets is the pipeline's gate's to read; on a resume it
/// hands the latest held message back to the pipeline.
pub(crate) struct Takeovers {
    pub(crate) journal: Journal,
    pub(crate) pg: Pg,
    pub(crate) mongo: Mongo,
    pub(crate) bus: Bus,
    /// Bounds a signal's body like any inbound event's.
    pub(crate) max_event_bytes: usize,
    /// The pipeline a held message goes back through.
    pub(crate) pipeline: Arc<Pipeline>,
}

impl Takeovers {
    /// The takeover handler from the shared handles; a resume hands held messages to `pipeline`.
    pub(crate) fn new(p: &Parts, c: &Config, pipeline: Arc<Pipeline>) -> Self {
        Self {
            journal: p.journal.clone(),
            pg: p.pg.clone(),
            mongo: p.mongo.clone(),
            bus: p.bus.clone(),
            max_event_bytes: c.turn.max_event_bytes,
            pipeline,
        }
    }

    /// Acts on a takeover signal received on `subject` (see the module documentation). A body that can
    /// never be acted on is an [`InvalidEvent`] (dead-lettered); a store or bus failure is transient.
    pub(crate) async fn takeover(
        &self,
        subject: &str,
        payload: &[u8],
    ) -> Result<(), PipelineError> {
        let conversation = self
            .bus
            .names
            .signal_parts(subject)
            .filter(|(kind, _)| *kind == KIND)
            .map(|(_, id)| id)
            .ok_or_else(|| InvalidEvent::SubjectMismatch {
                subject: subject.chars().take(200).collect(),
            })?;
        let signal = parse(conversation, payload, self.max_event_bytes)?;
        let id = signal.job_id();
        let t = &signal.takeover;
        let current = tracing::Span::current();
        current.record("job", id.as_str());
        current.record("conversation_id", t.conversation_id.as_str());
        let span = info_span!("takeover", job = %id, conversation_id = %t.conversation_id,
                              action = signal.action.as_str(), by = %t.by);
        self.run_takeover(&id, &signal).instrument(span).await
    }

    /// Opens the signal's job and runs it, unless an earlier delivery settled it.
    async fn run_takeover(&self, id: &str, s: &Signal) -> Result<(), PipelineError> {
        let t = &s.takeover;
        let new = NewJob {
            id,
            kind: KIND,
            user: &t.by,
            bot: "",
            conversation: &t.conversation_id,
            stream_seq: None,
            reads: Default::default(),
        };
        let job = self.journal.open(&new).await?;
        let attempt = job.attempt(async |job| self.conduct_takeover(job, s).await);
        if let Attempt::Settled = attempt.await? {
            info!(
                state = job.record.state.as_str(),
                "already settled; acknowledging"
            );
        }
        Ok(())
    }

    /// The job's steps, then `done`.
    async fn conduct_takeover(&self, job: &Job, s: &Signal) -> Result<(), PipelineError> {
        let t = s.takeover.clone();
        let applied = job
            .step(&TAKEOVER, key::ONCE)
            .run_in_tx(|mut tx| async move {
                let now = Pg::apply_takeover(&mut tx, &t).await;
                let applied = now.map(|now| StateChange {
                    changed: now.is_some(),
                    paused_at: now.and_then(|n| n.paused_at),
                });
                (tx, applied.map_err(PipelineError::from))
            })
            .await?;
        match applied.changed {
            true => info!(paused = s.takeover.paused, "takeover state set"),
            false => info!("an equal or later signal already set the takeover state"),
        }
        if let (Action::Resume, true, Some(since)) = (s.action, applied.changed, applied.paused_at)
        {
            self.moderator_history(job, s, since).await?;
            match s.takeover.catch_up {
                true => self.catch_up(job, s, since).await?,
                false => info!("catchUp is false: the held messages stay unanswered"),
            }
        }
        job.finish(State::Done, Finish::default()).await?;
        Ok(())
    }

    /// The `moderator_history` step: what moderators (senders who are not participants) wrote from
    /// `since` to the resume joins the history the companion reads, as role `moderator`: a DM's window
    /// of its user and companion, or the group's. How many messages.
    async fn moderator_history(
        &self,
        job: &Job,
        s: &Signal,
        since: DateTime<Utc>,
    ) -> Result<usize, PipelineError> {
        let conversation = &s.takeover.conversation_id;
        let add = async {
            let found = self
                .mongo
                .outsider_messages(s.conversation, since, s.takeover.at)
                .await?;
            let Some((participants, group, messages)) = found else {
                warn!("the conversation no longer exists; no moderators' messages to add");
                return Ok(0);
            };
            let lines: Vec<ModeratorLine> = messages.iter().filter_map(ModeratorLine::of).collect();
            let is_bot = |p: &&ObjectId| self.pipeline.is_companion(p);
            let bot = participants.iter().find(is_bot).map(|p| p.to_hex());
            let user = participants.iter().find(|p| !is_bot(p)).map(|p| p.to_hex());
            let (user, bot) = match (group, user, bot) {
                (true, _, _) => (None, String::new()),
                (false, Some(u), Some(b)) => (Some(u), b),
                _ => {
                    warn!("a DM without a user and a companion; no moderators' messages to add");
                    return Ok(0);
                }
            };
            let rows: Vec<NewHistory<'_>> = lines
                .iter()
                .map(|l| NewHistory {
                    user_id: user.as_deref().unwrap_or(&l.sender),
                    bot_id: &bot,
                    conversation_id: conversation,
                    role: prompt::MODERATOR,
                    content: &l.content,
                    message_id: &l.id,
                    tool_calls: None,
                    created_at: l.at,
                    group_chat: group,
                    ai_disclosure: false,
                })
                .collect();
            if !rows.is_empty() {
                self.pg.append_history(&rows).await?;
            }
            info!(
                messages = rows.len(),
                "moderators' messages added to the history"
            );
            Ok::<_, PipelineError>(rows.len())
        };
        job.step(&MODERATOR_HISTORY, key::ONCE)
            .lazy()
            .run(add)
            .await
    }

    /// The `catch_up` step (the latest job held since `since`, opened again once), then that job's
    /// message through the pipeline.
    async fn catch_up(
        &self,
        job: &Job,
        s: &Signal,
        since: DateTime<Utc>,
    ) -> Result<(), PipelineError> {
        let conversation = &s.takeover.conversation_id;
        let caught = job
            .step(&CATCH_UP, key::ONCE)
            .run(async {
                let held = self
                    .journal
                    .latest_in_state(conversation, State::Held, since);
                let held = held.await?;
                let job = held.map(|(id, kind, stream_seq)| HeldJob {
                    id,
                    kind,
                    stream_seq,
                });
                Ok::<_, PipelineError>(CatchUp { job })
            })
            .await?;
        let Some(held) = caught.job else {
            info!("no held message to answer");
            return Ok(());
        };
        // Opened again only while it is still held: a retry after a crash finds it running (and goes on
        // with it) or answered (and leaves it).
        let state = self.journal.get(&held.id).await?.map(|j| j.state);
        if state == Some(State::Held) {
            self.pipeline.reopen(&held.id, false).await?;
            info!(held = %held.id, "the latest held message is opened again to be answered");
        }
        self.answer_held(&held).await
    }

    /// Runs the held job's event through the pipeline; a job whose event is gone goes back to `held`.
    async fn answer_held(&self, held: &HeldJob) -> Result<(), PipelineError> {
        let Some(inbound) = self.held_event(held).await? else {
            self.journal
                .force_state(&held.id, State::Held, Some(GONE))
                .await?;
            return Ok(());
        };
        let settled = Box::pin(self.pipeline.handle(&Input::from(&inbound), None)).await?;
        info!(held = %held.id, kind = %held.kind, outcome = settled.outcome.name(), "held message caught up");
        Ok(())
    }

    /// The held job's event, read again from the inbound stream by its sequence; none when it is no
    /// longer there (aged out, or the stream was recreated).
    async fn held_event(&self, held: &HeldJob) -> Result<Option<Inbound>, PipelineError> {
        use async_nats::jetstream::stream::RawMessageErrorKind;
        let Some(seq) = held.stream_seq else {
            warn!(held = %held.id, "the held job has no stream sequence; it stays held");
            return Ok(None);
        };
        let name = &self.bus.names.stream_in;
        let stream = self
            .bus
            .js
            .get_stream(name)
            .await
            .map_err(|e| BusError::NoStream(name.clone(), e.to_string()))?;
        let msg = match stream.get_raw_message(seq).await {
            Ok(m) => m,
            Err(e) if matches!(e.kind(), RawMessageErrorKind::NoMessageFound) => {
                warn!(held = %held.id, seq, "{GONE}; it stays held");
                return Ok(None);
            }
            Err(e) => {
                let why = format!("the held message {seq} cannot be read from {name}: {e}");
                return Err(ProactiveError::NotYet(why).into());
            }
        };
        let prefix = &self.bus.names.prefix;
        let inbound = parse_event(
            &msg.payload,
            msg.subject.as_str(),
            prefix,
            self.pipeline.limits(),
        )?;
        if inbound.message_id().to_hex() != held.id {
            warn!(held = %held.id, seq, found = %inbound.message_id(), "{GONE} (another event has its sequence); it stays held");
            return Ok(None);
        }
        Ok(Some(inbound))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONV: &str = "65f000000000000000000001";

    fn body(v: serde_json::Value) -> Vec<u8> {
        v.to_string().into_bytes()
    }

    #[test]
    fn a_signal_parses_and_names_one_job_per_action_and_time() {
        let pause = body(serde_json::json!({"action": "pause", "by": "mod-1",
            "at": "2026-11-26T10:00:00+01:00", "reason": "  checking in\u{0}  "}));
        let s = parse(CONV, &pause, 65536).unwrap();
        assert_eq!(s.action, Action::Pause);
        assert!(s.takeover.paused && s.takeover.catch_up);
        assert_eq!(s.takeover.reason.as_deref(), Some("checking in"));
        assert_eq!(
            s.job_id(),
            format!("takeover:{CONV}:pause:2026-11-26T09:00:00Z")
        );
        let resume = body(serde_json::json!({"action": "resume", "by": "mod-1",
            "at": "2026-11-26T09:30:00.000Z", "catchUp": false}));
        let r = parse(&CONV.to_uppercase(), &resume, 65536).unwrap();
        assert!(!r.takeover.paused && !r.takeover.catch_up);
        assert_eq!(r.takeover.conversation_id, CONV);
        assert_eq!(
            r.job_id(),
            format!("takeover:{CONV}:resume:2026-11-26T09:30:00Z")
        );
    }

    #[test]
    fn a_bad_signal_says_why() {
        let ok = serde_json::json!({"action": "pause", "by": "m", "at": "2026-11-26T10:00:00Z"});
        let with = |k: &str, v: serde_json::Value| {
            let mut b = ok.clone();
            b[k] = v;
            body(b)
        };
        let bad = |conv: &str, payload: &[u8]| parse(conv, payload, 1024).unwrap_err();
        assert!(matches!(
            bad("nope", &body(ok.clone())),
            InvalidEvent::BadId { .. }
        ));
        assert!(matches!(bad(CONV, b"{"), InvalidEvent::Malformed(_)));
        assert!(matches!(bad(CONV, b"\xff"), InvalidEvent::NotUtf8));
        assert!(matches!(
            bad(CONV, &[b' '; 2000]),
            InvalidEvent::TooLarge { .. }
        ));
        let e = bad(CONV, &with("action", "stop".into()));
        assert!(e.to_string().contains("`action`"), "{e}");
        let e = bad(CONV, &with("at", "yesterday".into()));
        assert!(e.to_string().contains("`at`"), "{e}");
        let e = bad(CONV, &with("by", "x".repeat(201).into()));
        assert!(e.to_string().contains("`by`"), "{e}");
    }
}
