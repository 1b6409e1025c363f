//! `companion replay`: reprocesses stored events on purpose, after the cause of a failure is fixed.
//!
//! Events are read from the inbound stream (or the dead-letter stream with `--dlq`) by subject filter,
//! time range and sequence range, and run through the same turn code the workers use, in stream order
//! per conversation. The journal decides what runs: completed turns (answered, covered by a burst,
//! limited) are skipped unless `--force`; a failed turn (the user got the failure line) is answered with
//! a new reply generation, resuming from its journaled model responses so no paid call or tool write is
//! repeated; `--force` re-asks the model from scratch. A turn a worker is working on right now is left
//! alone unless `--force`.

use std::{
    collections::{BTreeMap, HashSet},
    io::{IsTerminal, Write},
    sync::{Arc, Mutex},
};

use async_nats::jetstream::{message::StreamMessage, stream::DirectGetErrorKind};
use chrono::{DateTime, Utc};
use tokio::sync::Semaphore;
use tracing::{Instrument, info_span, warn};

use crate::{
    bus::{Bus, DLQ_REASON, DLQ_SEQUENCE, DLQ_SUBJECT, Inbound, event::parse_event},
    journal::{JournalError, State},
    pipeline::{Outcome, Pipeline},
};

/// A turn updated this recently is taken to be in a worker's hands.
const IN_PROGRESS_SECS: i64 = 120;

/// Which events to replay and how.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct ReplayArgs {
    /// Read the dead-letter stream instead of the inbound stream.
    #[arg(long)]
    pub(crate) dlq: bool,
    /// Subject filter, NATS wildcards allowed (default: every subject of the stream).
    #[arg(long)]
    pub(crate) subject: Option<String>,
    /// Only this conversation (24-hex id); shorthand for the subject filter.
    #[arg(long, conflicts_with = "subject")]
    pub(crate) conversation: Option<String>,
    /// Only events stored at or after this time (RFC 3339).
    #[arg(long)]
    pub(crate) since: Option<DateTime<Utc>>,
    /// Only events stored before this time (RFC 3339).
    #[arg(long)]
    pub(crate) until: Option<DateTime<Utc>>,
    /// First stream sequence to read.
    #[arg(long)]
    pub(crate) from_seq: Option<u64>,
    /// Last stream sequence to read.
    #[arg(long)]
    pub(crate) to_seq: Option<u64>,
    /// Most events selected in one run.
    #[arg(long, default_value_t = 10_000)]
    pub(crate) limit: usize,
    /// Run completed turns again (a new reply; the model is asked again).
    #[arg(long)]
    pub(crate) force: bool,
    /// List what would run, change nothing.
    #[arg(long)]
    pub(crate) dry_run: bool,
    /// Conversations replayed at once (each one's events in order).
    #[arg(long, default_value_t = 4)]
    pub(crate) concurrency: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("cannot open stream {stream}: {reason}")]
    Stream { stream: String, reason: String },
    #[error("cannot read stream {stream}: {reason}")]
    Read { stream: String, reason: String },
    #[error("conversation must be a 24-hex id")]
    BadConversation,
    #[error(transparent)]
    Journal(#[from] JournalError),
}

/// What a replay runs on: the bus it reads the streams from, and the turns it runs.
pub(crate) struct Replayer {
    pub(crate) bus: Bus,
    pub(crate) pipeline: Arc<Pipeline>,
    /// The tombstones an event is checked against before it is replayed.
    pub(crate) memory: crate::memory::Memory,
}

/// What happened to each selected event.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Summary {
    pub selected: usize,
    pub done: usize,
    pub skipped: usize,
    pub failed: usize,
    /// `(stream sequence, why)` of every failed event.
    pub failures: Vec<(u64, String)>,
}

/// One stored event, with where it originally arrived.
struct Item {
    /// Sequence in the stream read.
    seq: u64,
    /// Sequence in the inbound stream, for a dead letter.
    original_seq: Option<u64>,
    subject: String,
    parsed: Result<Inbound, String>,
    dlq_reason: Option<String>,
}

enum Verdict {
    Done(String),
    Skipped(String),
    Failed(String),
}

/// Selects, then (unless a dry run) replays; prints one line per event and a progress bar on stderr.
pub(crate) async fn replay_events(
    svc: Arc<Replayer>,
    args: &ReplayArgs,
) -> Result<Summary, ReplayError> {
    let items = select(&svc, args).await?;
    let mut summary = Summary {
        selected: items.len(),
        ..Summary::default()
    };
    println!(
        "replay: {} event(s) selected from {}",
        items.len(),
        stream_name(&svc, args)
    );
    if args.dry_run {
        for item in &items {
            let plan = match &item.parsed {
                Err(why) => format!("cannot run: {why}"),
                Ok(e) => match plan(&svc, e, args.force).await?.1 {
                    Ok(why) => format!("would run ({why})"),
                    Err(why) => format!("would skip ({why})"),
                },
            };
            println!("{}  {plan}", describe(item));
        }
        return Ok(summary);
    }

    // One task per conversation, in stream order inside it.
    let mut by_subject: BTreeMap<String, Vec<Item>> = BTreeMap::new();
    for item in items {
        by_subject
            .entry(item.subject.clone())
            .or_default()
            .push(item);
    }
    let progress = Arc::new(Mutex::new(Progress::new(summary.selected)));
    let limit = Arc::new(Semaphore::new(args.concurrency.max(1)));
    let mut tasks = tokio::task::JoinSet::new();
    for (_, items) in by_subject {
        let (svc, progress, limit, force) =
            (svc.clone(), progress.clone(), limit.clone(), args.force);
        tasks.spawn(async move {
            let _slot = limit.acquire_owned().await;
            let mut out = Vec::new();
            for item in items {
                let verdict = replay_one(&svc, &item, force).await;
                let line = match &verdict {
                    Verdict::Done(s) => format!("done     {}  {s}", describe(&item)),
                    Verdict::Skipped(s) => format!("skipped  {}  {s}", describe(&item)),
                    Verdict::Failed(s) => format!("failed   {}  {s}", describe(&item)),
                };
                progress.lock().expect("progress").record(&verdict, &line);
                out.push((item.seq, verdict));
            }
            out
        });
    }
    while let Some(done) = tasks.join_next().await {
        for (seq, verdict) in done.unwrap_or_default() {
            match verdict {
                Verdict::Done(_) => summary.done += 1,
                Verdict::Skipped(_) => summary.skipped += 1,
                Verdict::Failed(why) => {
                    summary.failed += 1;
                    summary.failures.push((seq, why));
                }
            }
        }
    }
    progress.lock().expect("progress").finish();
    summary.failures.sort();
    println!(
        "replay summary: {} selected, {} done, {} skipped, {} failed",
        summary.selected, summary.done, summary.skipped, summary.failed
    );
    Ok(summary)
}

fn stream_name(svc: &Replayer, args: &ReplayArgs) -> String {
    if args.dlq {
        svc.bus.names.stream_dlq.clone()
    } else {
        svc.bus.names.stream_in.clone()
    }
}

fn describe(item: &Item) -> String {
    let id = match &item.parsed {
        Ok(e) => e.message_id().to_hex(),
        Err(_) => "-".repeat(24),
    };
    let mut s = format!("seq {:>6}  {id}  {}", item.seq, item.subject);
    if let Some(r) = &item.dlq_reason {
        let original = item
            .original_seq
            .map(|o| format!(" at inbound seq {o}"))
            .unwrap_or_default();
        s.push_str(&format!("  [dead-lettered{original}: {r}]"));
    }
    s
}

/// Reads the events the arguments select, in stream order, at most `limit`, once per message id.
async fn select(svc: &Replayer, args: &ReplayArgs) -> Result<Vec<Item>, ReplayError> {
    let names = &svc.bus.names;
    let name = stream_name(svc, args);
    // The inbound stream holds DMs (`in.<bot>.<conv>`) and group messages (`group.<conv>`); dead letters
    // keep the tail (`dlq.<bot>.<conv>`, `dlq.group.<conv>`).
    let p = &names.prefix;
    let filters = match (&args.subject, &args.conversation) {
        (Some(s), _) => vec![s.clone()],
        (None, Some(c)) => {
            if crate::bus::event::parse_object_id(c).is_none() {
                return Err(ReplayError::BadConversation);
            }
            if args.dlq {
                vec![format!("{p}.dlq.*.{c}")]
            } else {
                vec![format!("{p}.in.*.{c}"), names.group(c)]
            }
        }
        (None, None) if args.dlq => vec![format!("{p}.dlq.>")],
        (None, None) => vec![format!("{p}.>")],
    };
    let stream = svc
        .bus
        .js
        .get_stream(&name)
        .await
        .map_err(|e| ReplayError::Stream {
            stream: name.clone(),
            reason: e.to_string(),
        })?;
    let mut items = Vec::new();
    let mut seen = HashSet::new();
    for filter in &filters {
        items.extend(read(&stream, &name, filter, svc, args, &mut seen).await?);
    }
    // Several filters: one stream order, within the limit.
    items.sort_by_key(|i| i.seq);
    items.truncate(args.limit);
    Ok(items)
}

/// The events of `stream` on `filter` the arguments select, in stream order, at most `limit`, each
/// message id once (`seen`).
async fn read(
    stream: &async_nats::jetstream::stream::Stream,
    name: &str,
    filter: &str,
    svc: &Replayer,
    args: &ReplayArgs,
    seen: &mut HashSet<bson::oid::ObjectId>,
) -> Result<Vec<Item>, ReplayError> {
    let names = &svc.bus.names;
    let mut items = Vec::new();
    let mut next = args.from_seq.unwrap_or(1).max(1);
    while items.len() < args.limit {
        let m: StreamMessage = match stream.direct_get_next_for_subject(filter, Some(next)).await {
            Ok(m) => m,
            Err(e) if e.kind() == DirectGetErrorKind::NotFound => break,
            Err(e) => {
                return Err(ReplayError::Read {
                    stream: name.to_owned(),
                    reason: e.to_string(),
                });
            }
        };
        next = m.sequence + 1;
        if args.to_seq.is_some_and(|to| m.sequence > to) {
            break;
        }
        let at = DateTime::from_timestamp_nanos(m.time.unix_timestamp_nanos() as i64);
        if args.since.is_some_and(|s| at < s) {
            continue;
        }
        if args.until.is_some_and(|u| at >= u) {
            break;
        }
        let header = |k: &str| m.headers.get(k).map(|v| v.to_string());
        let (subject, dlq_reason) = if args.dlq {
            let original = header(DLQ_SUBJECT).unwrap_or_else(|| {
                m.subject.replacen(
                    &format!("{}.dlq.", names.prefix),
                    &format!("{}.in.", names.prefix),
                    1,
                )
            });
            (original, header(DLQ_REASON))
        } else {
            (m.subject.to_string(), None)
        };
        let parsed = parse_event(&m.payload, &subject, &names.prefix, svc.pipeline.limits())
            .map_err(|e| format!("invalid event: {e}"));
        if let Ok(e) = &parsed
            && !seen.insert(e.message_id())
        {
            continue;
        }
        items.push(Item {
            seq: m.sequence,
            original_seq: header(DLQ_SEQUENCE).and_then(|s| s.parse().ok()),
            subject,
            parsed,
            dlq_reason,
        });
    }
    Ok(items)
}

/// The journal's state of the event's turn (none if never processed), and whether the event would run
/// (`Ok(why)`) or be skipped (`Err(why)`).
async fn plan(
    svc: &Replayer,
    event: &Inbound,
    force: bool,
) -> Result<(Option<State>, Result<String, String>), ReplayError> {
    let gone = svc
        .memory
        .probe(
            &event.sender_id().to_hex(),
            "",
            &[event.message_id().to_hex()],
        )
        .await
        .map(|p| p.gone)
        .map_err(|e| ReplayError::Read {
            stream: "tombstones".into(),
            reason: e.to_string(),
        })?;
    let job = svc
        .pipeline
        .journal
        .get(&event.message_id().to_hex())
        .await?;
    if gone {
        let state = job.as_ref().map(|j| j.state);
        return Ok((
            state,
            Err("deleted (the message or its user): it stays gone".into()),
        ));
    }
    let state = job.as_ref().map(|j| j.state);
    let verdict = match job {
        None => Ok("never processed".into()),
        Some(j) if j.state == State::Running => {
            if !force && (Utc::now() - j.updated_at).num_seconds() < IN_PROGRESS_SECS {
                Err("in progress on a worker; --force to run it anyway".into())
            } else {
                Ok("unfinished".into())
            }
        }
        Some(j) if j.state == State::Failed => Ok(format!(
            "failed earlier: {}",
            j.last_error.unwrap_or_else(|| "no reason recorded".into())
        )),
        Some(j) if force => Ok(format!("{}, forced", j.state.as_str())),
        Some(j) => Err(format!("{}; --force to run it again", j.state.as_str())),
    };
    Ok((state, verdict))
}

async fn replay_one(svc: &Replayer, item: &Item, force: bool) -> Verdict {
    let event = match &item.parsed {
        Ok(e) => e,
        Err(why) => return Verdict::Failed(why.clone()),
    };
    let id = event.message_id().to_hex();
    let span = info_span!("replay", event_id = %id, seq = item.seq);
    let journal = &svc.pipeline.journal;
    async {
        let state = match plan(svc, event, force).await {
            Err(e) => return Verdict::Failed(e.to_string()),
            Ok((_, Err(why))) => return Verdict::Skipped(why),
            Ok((state, Ok(_))) => state,
        };
        if let Some(state) = state
            && state.is_settled()
        {
            // A failed job resumes from its journal; a forced one asks the model again.
            let fresh = force && state != State::Failed;
            if let Err(e) = svc.pipeline.reopen(&id, fresh).await {
                return Verdict::Failed(e.to_string());
            }
        }
        let ran = Box::pin(svc.pipeline.handle(&event.into(), None)).await;
        match ran.map(|s| s.outcome) {
            Ok(Outcome::Dropped { reason }) => Verdict::Done(format!("no answer ({reason})")),
            Ok(Outcome::Held) => Verdict::Done("held: a moderator paused the conversation".into()),
            Ok(Outcome::Answered { reply_id }) => Verdict::Done(format!("reply {reply_id}")),
            Ok(Outcome::Limited { reply_id }) => Verdict::Done(format!(
                "over the flood limit; reply {}",
                reply_id.unwrap_or_else(|| "none".into())
            )),
            Ok(Outcome::AlreadySettled { state }) => Verdict::Skipped(state.as_str().into()),
            Err(e) => {
                // Leave it failed (not half-open, also when this run started it), so a later replay
                // can try again.
                let reason = e.to_string();
                let _ = journal.force_state(&id, State::Failed, Some(&reason)).await;
                warn!(error = %reason, "replay failed");
                Verdict::Failed(reason)
            }
        }
    }
    .instrument(span)
    .await
}

/// A progress bar on stderr: redrawn in place on a terminal, a line per tenth otherwise.
struct Progress {
    total: usize,
    seen: usize,
    done: usize,
    skipped: usize,
    failed: usize,
    tty: bool,
    last_tenth: usize,
}

impl Progress {
    fn new(total: usize) -> Self {
        Self {
            total,
            seen: 0,
            done: 0,
            skipped: 0,
            failed: 0,
            tty: std::io::stderr().is_terminal(),
            last_tenth: 0,
        }
    }

    fn record(&mut self, verdict: &Verdict, line: &str) {
        self.seen += 1;
        match verdict {
            Verdict::Done(_) => self.done += 1,
            Verdict::Skipped(_) => self.skipped += 1,
            Verdict::Failed(_) => self.failed += 1,
        }
        let mut err = std::io::stderr().lock();
        if self.tty {
            let _ = write!(err, "\r\x1b[2K");
        }
        println!("{line}");
        let tenth = self.seen * 10 / self.total.max(1);
        if self.tty || tenth > self.last_tenth || self.seen == self.total {
            self.last_tenth = tenth;
            let _ = write!(err, "{}", self.bar());
            if !self.tty {
                let _ = writeln!(err);
            }
        }
        let _ = err.flush();
    }

    fn bar(&self) -> String {
        const WIDTH: usize = 30;
        let filled = self.seen * WIDTH / self.total.max(1);
        format!(
            "[{}{}] {}/{}  done {}  skipped {}  failed {}",
            "#".repeat(filled),
            "-".repeat(WIDTH - filled),
            self.seen,
            self.total,
            self.done,
            self.skipped,
            self.failed
        )
    }

    fn finish(&self) {
        if self.tty {
            eprintln!();
        }
    }
}
