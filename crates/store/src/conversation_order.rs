//! Per-conversation order across any number of worker processes.
//!
//! Every inbound subject (`<prefix>.in.<botId>.<conversationId>`, or `<prefix>.group.<conversationId>`
//! for a group) is one conversation. A delivery is
//! handled only when it is the first unsettled message of its subject in the stream: the floor in
//! PostgreSQL (`order_floors`) says which earlier messages are settled, and a JetStream direct get finds
//! the first message at or above it. A message behind an unsettled one waits, spending no delivery
//! attempt (the worker keeps it with progress acks) and no turn slot. It is woken when the earlier one
//! settles: through a local notification in the same process, through a core NATS notice on
//! `<prefix>.settled.<botId>.<conversationId>` (`<prefix>.settled.group.<conversationId>`) from another process, and by a slow poll in case a notice
//! is lost. A message that waits longer than `COMPANION_ORDER_MAX_WAIT_SECS` goes ahead anyway, with an
//! error in the log: out of order is better than a conversation stuck for good.
//!
//! Settlement is always in stream order (every message, valid or not, passes the gate), so one floor
//! per subject is enough. The floor is the conversation's cursor, not a step of any one job: it only ever
//! moves forward (`GREATEST`), so writing it again is harmless.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use async_nats::jetstream::{self, message::StreamMessage, stream::DirectGetErrorKind};
use bytes::Bytes;
use futures::StreamExt;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, warn};

use crate::store::Pool;
use crate::{
    failure::{Class, Classify},
    store::StoreError,
};

#[derive(Debug, thiserror::Error)]
pub enum OrderError {
    #[error("order floor unavailable: {0}")]
    Store(#[from] StoreError),
    #[error("cannot read the inbound stream: {0}")]
    Stream(String),
    #[error("cannot open the inbound stream: {0}")]
    Open(String),
}

impl From<sqlx::Error> for OrderError {
    fn from(e: sqlx::Error) -> Self {
        Self::Store(StoreError::Pg(e))
    }
}

impl Classify for OrderError {
    fn class(&self) -> Class {
        match self {
            Self::Store(e) => e.class(),
            Self::Stream(_) | Self::Open(_) => Class::Transient,
        }
    }
}

/// Where a delivery stands in its conversation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Position {
    /// The first unsettled message of its subject: handle it now.
    Head,
    /// Already settled by an earlier delivery (or covered by a burst): the journal says how.
    Settled,
    /// Waiting for the earlier message at this sequence.
    Behind(u64),
}

/// How a wait ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Waited {
    /// Handle the message (it is the head, or it is settled already).
    Go { waited: Duration },
    /// The worker is stopping.
    Cancelled,
}

/// The order gate of one inbound stream.
pub struct Order {
    pool: Pool,
    client: async_nats::Client,
    stream: jetstream::stream::Stream,
    /// Stream name and creation time: floors of a recreated stream start over.
    key: String,
    prefix: String,
    max_wait: Duration,
    /// Local waiters by subject, with how many wait on each.
    wakeups: Mutex<HashMap<String, (Arc<Notify>, usize)>>,
    /// The highest floor this process has read or written, by subject. The floor only rises, so the
    /// true one is at least this: a message below it is settled, and when the stream's first message
    /// at or above it is the delivery's own, nothing earlier is unsettled (whatever other workers
    /// settled since), so the floor is not read. Otherwise it is read as before.
    known_floors: Mutex<HashMap<String, u64>>,
}

/// A conversation's order floor to move with a job's settlement: the stream (name and creation), the
/// conversation's subject, and the message whose job it is. The floor goes past the last message the job
/// answered (its burst's), and never down.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FloorAt {
    pub stream: String,
    pub subject: String,
    pub seq: u64,
}

/// The floor's upsert of `rows` (stream, subject, next sequence: a `VALUES` or a `SELECT`): one
/// statement for [`Order::advance_floor`] and for the journal's finish, which writes it with the job's
/// settlement.
pub fn upsert_floor(rows: &str) -> String {
    format!(
        "INSERT INTO order_floors (stream, subject, next_seq) {rows}
         ON CONFLICT (stream, subject) DO UPDATE
            SET next_seq = GREATEST(order_floors.next_seq, EXCLUDED.next_seq), updated_at = now()"
    )
}

/// Subjects [`Order::known_floors`] keeps before it starts over (each entry is a subject and a number).
const KNOWN_FLOORS: usize = 65_536;

impl Order {
    pub async fn open(
        js: &jetstream::Context,
        client: async_nats::Client,
        stream_name: &str,
        prefix: &str,
        pool: Pool,
        max_wait: Duration,
    ) -> Result<Self, OrderError> {
        let mut stream = js
            .get_stream(stream_name)
            .await
            .map_err(|e| OrderError::Open(e.to_string()))?;
        let created = stream
            .info()
            .await
            .map_err(|e| OrderError::Open(e.to_string()))?
            .created
            .unix_timestamp_nanos();
        Ok(Self {
            pool,
            client,
            stream,
            key: format!("{stream_name}@{created}"),
            prefix: prefix.to_owned(),
            max_wait,
            wakeups: Mutex::new(HashMap::new()),
            known_floors: Mutex::new(HashMap::new()),
        })
    }

    /// The order floor of `subject`: every message below it is settled (0 when none is).
    async fn floor(&self, subject: &str) -> Result<u64, OrderError> {
        let floor: Option<i64> = sqlx::query_scalar(
            "SELECT next_seq FROM order_floors WHERE stream = $1 AND subject = $2",
        )
        .bind(&self.key)
        .bind(subject)
        .fetch_optional(&self.pool)
        .await?;
        let floor = floor.unwrap_or(0).max(0) as u64;
        self.know_floor(subject, floor);
        Ok(floor)
    }

    fn known_floor(&self, subject: &str) -> Option<u64> {
        let known = self.known_floors.lock().expect("floors lock");
        known.get(subject).copied()
    }

    fn know_floor(&self, subject: &str, floor: u64) {
        let mut known = self.known_floors.lock().expect("floors lock");
        if let Some(f) = known.get_mut(subject) {
            *f = (*f).max(floor);
            return;
        }
        if known.len() >= KNOWN_FLOORS {
            known.clear();
        }
        known.insert(subject.to_owned(), floor);
    }

    /// Where the message `seq` of `subject` stands now.
    pub async fn position(&self, subject: &str, seq: u64) -> Result<Position, OrderError> {
        if let Some(known) = self.known_floor(subject) {
            if known > seq {
                return Ok(Position::Settled);
            }
            // The first message at or above a floor no higher than the true one: when it is this one,
            // nothing before it is unsettled.
            if let Ok(m) = self
                .stream
                .direct_get_next_for_subject(subject, Some(known.max(1)))
                .await
                && m.sequence == seq
            {
                return Ok(Position::Head);
            }
        }
        let floor = self.floor(subject).await?;
        if floor > seq {
            return Ok(Position::Settled);
        }
        // A follower replica may not have the message yet: ask again briefly before going ahead.
        for attempt in 0..5u32 {
            match self
                .stream
                .direct_get_next_for_subject(subject, Some(floor.max(1)))
                .await
            {
                Ok(m) if m.sequence == seq => return Ok(Position::Head),
                Ok(m) if m.sequence < seq => return Ok(Position::Behind(m.sequence)),
                Ok(_) => {}
                Err(e) if e.kind() == DirectGetErrorKind::NotFound => {}
                Err(e) => return Err(OrderError::Stream(e.to_string())),
            }
            tokio::time::sleep(Duration::from_millis(20 * u64::from(attempt + 1))).await;
        }
        warn!(
            seq,
            "message not visible in the stream (removed, or a lagging replica); handling it now"
        );
        Ok(Position::Head)
    }

    /// Waits until the message may be handled, or the worker stops.
    pub async fn wait_for_earlier(
        &self,
        subject: &str,
        seq: u64,
        stop: &CancellationToken,
    ) -> Result<Waited, OrderError> {
        let started = Instant::now();
        let notify = self.watch(subject);
        let mut poll = Duration::from_millis(100);
        let mut logged = false;
        loop {
            let notified = notify.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let position = self.position(subject, seq).await?;
            let Position::Behind(first) = position else {
                return Ok(Waited::Go {
                    waited: started.elapsed(),
                });
            };
            if started.elapsed() >= self.max_wait {
                error!(
                    seq,
                    waiting_for = first,
                    waited_secs = started.elapsed().as_secs(),
                    "an earlier message of this conversation is still unsettled; going ahead out of order"
                );
                return Ok(Waited::Go {
                    waited: started.elapsed(),
                });
            }
            if !logged {
                debug!(
                    seq,
                    waiting_for = first,
                    "waiting for an earlier message of this conversation"
                );
                logged = true;
            }
            tokio::select! {
                _ = notified => {}
                _ = tokio::time::sleep(poll) => poll = (poll * 2).min(Duration::from_secs(2)),
                _ = stop.cancelled() => return Ok(Waited::Cancelled),
            }
        }
    }

    /// Where the settlement of the message `seq` of `subject` moves the floor, for a job that writes it
    /// with its own settlement (the journal's finish) rather than by [`Order::advance_floor`].
    pub fn floor_at(&self, subject: &str, seq: u64) -> FloorAt {
        FloorAt {
            stream: self.key.clone(),
            subject: subject.to_owned(),
            seq,
        }
    }

    /// Marks every message of `subject` up to `through_seq` settled and wakes whoever waits on it.
    pub async fn advance_floor(&self, subject: &str, through_seq: u64) -> Result<(), OrderError> {
        sqlx::query(sqlx::AssertSqlSafe(upsert_floor("VALUES ($1, $2, $3)")))
            .bind(&self.key)
            .bind(subject)
            .bind(through_seq.saturating_add(1) as i64)
            .execute(&self.pool)
            .await?;
        self.advanced(subject, through_seq).await;
        Ok(())
    }

    /// After the floor of `subject` was written past `through_seq` (here, or with a job's settlement):
    /// remembers it, wakes the local waiters and tells the other workers.
    pub async fn advanced(&self, subject: &str, through_seq: u64) {
        self.know_floor(subject, through_seq.saturating_add(1));
        self.wake(subject);
        if let Some(tail) = self.tail(subject) {
            let notice = format!("{}.settled.{tail}", self.prefix);
            if let Err(e) = self
                .client
                .publish(notice, Bytes::from(through_seq.to_string()))
                .await
            {
                debug!(error = %e, "settled notice not sent; waiters elsewhere poll");
            }
        }
    }

    /// Up to `max` messages of `subject` after `seq`, in stream order.
    pub async fn followers(
        &self,
        subject: &str,
        seq: u64,
        max: usize,
    ) -> Result<Vec<StreamMessage>, OrderError> {
        let mut out = Vec::new();
        let mut next = seq + 1;
        while out.len() < max {
            match self
                .stream
                .direct_get_next_for_subject(subject, Some(next))
                .await
            {
                Ok(m) => {
                    next = m.sequence + 1;
                    out.push(m);
                }
                Err(e) if e.kind() == DirectGetErrorKind::NotFound => break,
                Err(e) => return Err(OrderError::Stream(e.to_string())),
            }
        }
        Ok(out)
    }

    /// Wakes local waiters when another process settles a message (runs until the connection closes).
    pub async fn listen(self: Arc<Self>) {
        let filter = format!("{}.settled.>", self.prefix);
        let mut notices = match self.client.subscribe(filter).await {
            Ok(s) => s,
            Err(e) => {
                warn!(error = %e, "cannot subscribe to settled notices; waiters rely on polling");
                return;
            }
        };
        let head = format!("{}.settled.", self.prefix);
        while let Some(n) = notices.next().await {
            if let Some(tail) = n.subject.as_str().strip_prefix(&head) {
                // `group.<conv>` for a group; `<botId>.<conv>` for a DM (bot ids are hex).
                let subject = if tail.starts_with("group.") {
                    format!("{}.{tail}", self.prefix)
                } else {
                    format!("{}.in.{tail}", self.prefix)
                };
                self.wake(&subject);
            }
        }
    }

    /// The notice's tail: `<botId>.<conv>` for a DM subject, `group.<conv>` for a group's.
    fn tail<'a>(&self, subject: &'a str) -> Option<&'a str> {
        let rest = subject.strip_prefix(&self.prefix)?;
        rest.strip_prefix(".in.")
            .or_else(|| rest.strip_prefix(".").filter(|r| r.starts_with("group.")))
            .filter(|t| !t.is_empty())
    }

    fn wake(&self, subject: &str) {
        let wakeups = self.wakeups.lock().expect("wakeups lock");
        if let Some((n, _)) = wakeups.get(subject) {
            n.notify_waiters();
        }
    }

    fn watch(&self, subject: &str) -> Watch<'_> {
        let mut wakeups = self.wakeups.lock().expect("wakeups lock");
        let entry = wakeups
            .entry(subject.to_owned())
            .or_insert_with(|| (Arc::new(Notify::new()), 0));
        entry.1 += 1;
        Watch {
            order: self,
            subject: subject.to_owned(),
            notify: entry.0.clone(),
        }
    }
}

/// A local waiter's registration; the last one out removes the subject's entry.
struct Watch<'a> {
    order: &'a Order,
    subject: String,
    notify: Arc<Notify>,
}

impl Drop for Watch<'_> {
    fn drop(&mut self) {
        let mut wakeups = self.order.wakeups.lock().expect("wakeups lock");
        if let Some(entry) = wakeups.get_mut(&self.subject) {
            entry.1 -= 1;
            if entry.1 == 0 {
                wakeups.remove(&self.subject);
            }
        }
    }
}
