//! The consumer loop: pulls events from the shared durable consumer and runs turns, boundedly.
//!
//! Every delivery first passes the conversation's order gate ([`crate::order`]); one waiting behind an
//! earlier message holds no turn slot. A delivery is acknowledged (or terminated) only after its
//! conversation's order floor moved past it, so a lost settlement means a redelivery, never a stuck
//! conversation.

use std::{sync::Arc, time::Duration};

use async_nats::jetstream::{self, AckKind};
use futures::StreamExt;
use tokio::{
    sync::{OwnedSemaphorePermit, Semaphore},
    task::JoinSet,
};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, error, info, info_span, warn};

use crate::{
    bus::{BusError, DmEvent, event::parse_inbound, settle},
    order::{Order, OrderError, Position, Waited},
    services::Services,
    timing::{self, Stage},
    turn::{self, Delivery, Disposition, Outcome, TurnError},
};

/// Counter of turns by outcome.
const TURNS: &str = "companion_turns_total";

#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error(transparent)]
    Bus(#[from] BusError),
    #[error(transparent)]
    Order(#[from] OrderError),
}

/// Runs until `shutdown` fires, then drains in-flight turns within the grace period.
pub async fn run(svc: Arc<Services>, shutdown: CancellationToken) -> Result<(), WorkerError> {
    svc.bus.ensure_streams().await?;
    if let Err(e) = svc.mongo.ensure_indexes().await {
        warn!(error = %e, "could not ensure MongoDB indexes; continuing");
    }
    let consumer = svc.bus.ensure_consumer(&svc.config).await?;
    let order = Arc::new(
        Order::open(
            &svc.bus.js,
            svc.bus.client.clone(),
            &svc.bus.names.stream_in,
            &svc.bus.names.prefix,
            svc.pg.clone(),
            svc.config.order_max_wait(),
        )
        .await?,
    );
    let notices = tokio::spawn(order.clone().listen());
    let ops = start_ops(&svc).await;
    let exhausted = tokio::spawn(watch_exhausted(svc.clone(), order.clone()));
    let concurrency = svc.config.concurrency.max(1);
    let semaphore = Arc::new(Semaphore::new(concurrency));
    // Fired when the grace period is over: in-flight turns NAK and stop.
    let hard_stop = CancellationToken::new();
    let mut tasks = JoinSet::new();
    info!(
        consumer = %svc.bus.names.consumer,
        stream = %svc.bus.names.stream_in,
        concurrency,
        characters = svc.characters.len(),
        "worker ready"
    );

    'pull: while !shutdown.is_cancelled() {
        let mut messages = match consumer
            .stream()
            .max_messages_per_batch(concurrency.min(64))
            .heartbeat(Duration::from_secs(5))
            .expires(Duration::from_secs(30))
            .messages()
            .await
        {
            Ok(m) => m,
            Err(e) => {
                warn!(error = %e, "cannot start pulling; retrying in 1 s");
                tokio::select! {
                    _ = shutdown.cancelled() => break 'pull,
                    _ = tokio::time::sleep(Duration::from_secs(1)) => continue 'pull,
                }
            }
        };
        loop {
            while tasks.try_join_next().is_some() {}
            let permit = tokio::select! {
                _ = shutdown.cancelled() => break 'pull,
                p = semaphore.clone().acquire_owned() => p.expect("semaphore is never closed"),
            };
            let next = tokio::select! {
                _ = shutdown.cancelled() => break 'pull,
                m = messages.next() => m,
            };
            match next {
                Some(Ok(msg)) => {
                    let slot = Slot {
                        permit: Some(permit),
                        semaphore: semaphore.clone(),
                        shutdown: shutdown.clone(),
                        hard_stop: hard_stop.clone(),
                    };
                    let (svc, order) = (svc.clone(), order.clone());
                    tasks.spawn(async move { handle(&svc, &order, msg, slot).await });
                }
                Some(Err(e)) => {
                    warn!(error = %e, "pull error");
                    if matches!(
                        e.kind(),
                        jetstream::consumer::pull::MessagesErrorKind::ConsumerDeleted
                    ) {
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        match svc.bus.ensure_consumer(&svc.config).await {
                            Ok(_) => continue 'pull,
                            Err(e) => error!(error = %e, "cannot recreate the consumer"),
                        }
                    }
                }
                None => {
                    warn!("message stream ended; pulling again");
                    continue 'pull;
                }
            }
        }
    }

    let in_flight = tasks.len();
    info!(
        in_flight,
        grace_secs = svc.config.shutdown_grace_secs,
        "stopping: no longer pulling"
    );
    let drained = tokio::time::timeout(svc.config.shutdown_grace(), async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        warn!(
            left = tasks.len(),
            "grace period over; returning unfinished turns to the stream"
        );
        hard_stop.cancel();
        while tasks.join_next().await.is_some() {}
    }
    // Acks and NAKs are buffered: make sure the server has them before the process exits.
    if let Err(e) = svc.bus.client.flush().await {
        warn!(error = %e, "could not flush the last acks; the server will redeliver those events");
    }
    if let Some(task) = ops {
        task.abort();
    }
    exhausted.abort();
    notices.abort();
    info!("worker stopped");
    Ok(())
}

/// Events whose deliveries ran out without a worker settling them (crashed or killed mid-turn) would
/// otherwise just stop: each gets a dead letter and, when it was a valid turn not yet answered, the
/// character's failure line. One worker of the queue group handles each advisory; repeats are harmless
/// (the dead letter and the reply are keyed by the event).
async fn watch_exhausted(svc: Arc<Services>, order: Arc<Order>) {
    let subject = svc.bus.max_deliveries_advisory();
    let mut advisories = match svc
        .bus
        .client
        .queue_subscribe(subject, "companion-advisories".into())
        .await
    {
        Ok(s) => s,
        Err(e) => {
            error!(error = %e, "cannot watch for events that ran out of deliveries");
            return;
        }
    };
    while let Some(advisory) = advisories.next().await {
        #[derive(serde::Deserialize)]
        struct MaxDeliveries {
            stream_seq: u64,
            deliveries: i64,
        }
        let Ok(a) = serde_json::from_slice::<MaxDeliveries>(&advisory.payload) else {
            warn!("unreadable max-deliveries advisory");
            continue;
        };
        let span = info_span!("exhausted", seq = a.stream_seq, deliveries = a.deliveries);
        handle_exhausted(&svc, &order, a.stream_seq, a.deliveries)
            .instrument(span)
            .await;
    }
}

async fn handle_exhausted(svc: &Services, order: &Order, sequence: u64, deliveries: i64) {
    let stream = match svc.bus.js.get_stream(&svc.bus.names.stream_in).await {
        Ok(s) => s,
        Err(e) => return error!(error = %e, "cannot open the inbound stream"),
    };
    let msg = match stream.get_raw_message(sequence).await {
        Ok(m) => m,
        Err(e) => return error!(error = %e, "the exhausted event is no longer in the stream"),
    };
    let reason =
        format!("no worker finished this event in {deliveries} deliveries (crashed or timed out)");
    let mut through = sequence;
    // An event answered after all (done, covered, limited) is not a dead letter; a failed one is.
    let mut dead = true;
    if let Ok(event) = parse_inbound(
        &msg.payload,
        msg.subject.as_str(),
        &svc.bus.names.prefix,
        svc.config.event_limits(),
    ) {
        // The same admission checks as a turn: no reply into a conversation the event may not use.
        match turn::answer_with_failure(svc, &event, &reason).await {
            Ok(settled) => {
                if let Outcome::AlreadySettled { state } = &settled.outcome {
                    info!(
                        state,
                        "the exhausted event was settled after all; no failure line"
                    );
                    dead = state == "failed";
                }
                through = through.max(settled.through_seq.unwrap_or(0));
            }
            Err(e) if e.disposition() == Disposition::Reject => {
                info!(error = %e, "not a valid turn; dead-lettering without a reply")
            }
            Err(e) => error!(error = %e, "failure line not delivered"),
        }
    }
    if dead {
        match svc
            .bus
            .dead_letter_raw(
                msg.subject.as_str(),
                sequence,
                msg.payload.clone(),
                &reason,
                deliveries,
            )
            .await
        {
            Ok(()) => {
                svc.metrics.inc("companion_dead_letters_total", "");
                warn!(
                    reason,
                    "event dead-lettered after running out of deliveries"
                );
            }
            Err(e) => error!(error = %e, "dead letter not written"),
        }
    }
    // Nothing will deliver this event again: its conversation moves on (retrying a moment, since no
    // redelivery would retry it; waiters behind it go ahead after COMPANION_ORDER_MAX_WAIT_SECS anyway).
    for attempt in 0..5u64 {
        match order.settle(msg.subject.as_str(), through).await {
            Ok(()) => return,
            Err(e) => {
                warn!(error = %e, attempt, "cannot settle the exhausted event yet");
                tokio::time::sleep(Duration::from_secs(1 + attempt * 2)).await;
            }
        }
    }
    error!("the exhausted event could not be settled; its conversation waits for the order valve");
}

/// Serves the operations endpoint when configured; a failure to bind is logged, not fatal.
async fn start_ops(svc: &Arc<Services>) -> Option<tokio::task::JoinHandle<()>> {
    let addr = svc.config.http_addr.trim();
    if addr.is_empty() {
        return None;
    }
    let parsed = match addr.parse() {
        Ok(a) => a,
        Err(e) => {
            error!(addr, error = %e, "COMPANION_HTTP_ADDR is not an address; no health endpoint");
            return None;
        }
    };
    match crate::ops::serve(parsed, svc.clone()).await {
        Ok((bound, task)) => {
            info!(addr = %bound, "health and metrics endpoint listening");
            Some(task)
        }
        Err(e) => {
            error!(addr, error = %e, "cannot serve the health endpoint; continuing without it");
            None
        }
    }
}

/// A delivery's turn slot and the stop signals it obeys.
struct Slot {
    /// Held while the delivery does work; released while it waits for its conversation.
    permit: Option<OwnedSemaphorePermit>,
    semaphore: Arc<Semaphore>,
    /// The worker stops pulling: waiting deliveries go back to the stream.
    shutdown: CancellationToken,
    /// The grace period is over: in-flight turns go back to the stream.
    hard_stop: CancellationToken,
}

/// One delivery, from bytes to ack; never panics on input.
async fn handle(svc: &Services, order: &Order, msg: jetstream::Message, mut slot: Slot) {
    let (delivered, sequence) = msg
        .info()
        .map(|i| (i.delivered, i.stream_sequence))
        .unwrap_or((1, 0));
    let span = info_span!(
        "turn",
        event_id = tracing::field::Empty,
        conversation_id = tracing::field::Empty,
        bot_id = tracing::field::Empty,
        delivery = delivered,
        seq = sequence,
    );
    timing::scope(async {
        let progress = keep_alive(&msg, svc.config.ack_wait());
        let subject = msg.subject.as_str();
        let position = match timing::stage(Stage::Order, Box::pin(order.position(subject, sequence))).await {
            Ok(p) => p,
            Err(e) => {
                progress.abort();
                return retry(svc, &msg, None, &e.to_string(), delivered, None).await;
            }
        };
        if let Position::Behind(first) = position {
            // Waiting holds no turn slot: the slots stay free for the messages that can run.
            drop(slot.permit.take());
            svc.metrics.inc("companion_order_waits_total", "");
            let wait = Box::pin(order.wait_turn(subject, sequence, &slot.shutdown));
            let waited = timing::stage(Stage::Wait, wait).await;
            match waited {
                Ok(Waited::Go { waited, .. }) => {
                    svc.metrics.add(
                        "companion_order_wait_milliseconds_total",
                        "",
                        waited.as_millis() as u64,
                    );
                    tracing::debug!(after = first, waited_ms = waited.as_millis() as u64, "conversation's turn came");
                }
                Ok(Waited::Cancelled) => {
                    progress.abort();
                    svc.metrics.inc(TURNS, "outcome=\"returned\"");
                    return settle(&msg, AckKind::Nak(None)).await;
                }
                Err(e) => {
                    progress.abort();
                    return retry(svc, &msg, None, &e.to_string(), delivered, None).await;
                }
            }
            let slot_started = std::time::Instant::now();
            tokio::select! {
                p = slot.semaphore.clone().acquire_owned() => {
                    slot.permit = p.ok();
                    timing::add(Stage::Wait, slot_started);
                }
                _ = slot.shutdown.cancelled() => {
                    progress.abort();
                    svc.metrics.inc(TURNS, "outcome=\"returned\"");
                    return settle(&msg, AckKind::Nak(None)).await;
                }
            }
        }

        let limits = svc.config.event_limits();
        let parse_started = std::time::Instant::now();
        let event = match parse_inbound(&msg.payload, subject, &svc.bus.names.prefix, limits) {
            Ok(e) => e,
            Err(e) => {
                progress.abort();
                return Box::pin(reject(svc, order, &msg, &e.to_string(), delivered, None)).await;
            }
        };
        timing::add(Stage::Parse, parse_started);
        let span = tracing::Span::current();
        span.record("event_id", event.message_id.to_hex());
        span.record("conversation_id", event.conversation_id.to_hex());
        span.record("bot_id", event.bot_id.to_hex());

        let started = std::time::Instant::now();
        let delivery = Delivery {
            order,
            subject,
            seq: sequence,
        };
        // The turn (and the other large futures here) are boxed: a delivery waiting for its
        // conversation stays a small task (6 KB instead of 29 KB in a debug build), and a turn's large
        // state is allocated only while it runs.
        let turn = Box::pin(turn::run_delivered(svc, &event, Some(&delivery)));
        let result = tokio::select! {
            r = turn => Some(r),
            _ = slot.hard_stop.cancelled() => None,
        };
        progress.abort();
        match result {
            None => {
                svc.metrics.inc(TURNS, "outcome=\"returned\"");
                settle(&msg, AckKind::Nak(None)).await
            }
            Some(Ok(settled)) => {
                let name = settled.outcome.name();
                svc.metrics.inc(TURNS, &format!("outcome=\"{name}\""));
                svc.metrics.observe_turn(started.elapsed());
                // The reply is out; if the floor cannot move, a redelivery finds the turn settled and
                // moves it then.
                if !timing::stage(Stage::Order, Box::pin(advance_order(order, &msg, settled.through_seq))).await {
                    return;
                }
                if let Err(e) = timing::stage(Stage::Ack, msg.double_ack()).await {
                    warn!(error = %e, outcome = ?settled.outcome, "ack not confirmed; a redelivery will find the turn settled");
                }
                timing::report(&svc.metrics, name);
            }
            Some(Err(e)) => Box::pin(fail(svc, order, &msg, &event, e, delivered)).await,
        }
    })
    .instrument(span)
    .await
}

/// Sends progress acks so a long turn keeps its message.
fn keep_alive(msg: &jetstream::Message, ack_wait: Duration) -> tokio::task::JoinHandle<()> {
    let msg = msg.clone();
    let every = (ack_wait / 3).max(Duration::from_millis(200));
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.tick().await;
        loop {
            tick.tick().await;
            // Keep trying through a NATS reconnect: the turn may still finish in time.
            if let Err(e) = msg.ack_with(AckKind::Progress).await {
                tracing::debug!(error = %e, "progress ack not sent");
            }
        }
    })
}

async fn fail(
    svc: &Services,
    order: &Order,
    msg: &jetstream::Message,
    event: &DmEvent,
    err: TurnError,
    delivered: i64,
) {
    let reason = err.to_string();
    match err.disposition() {
        Disposition::Reject => reject(svc, order, msg, &reason, delivered, None).await,
        Disposition::Retry if delivered < svc.config.max_deliver => {
            retry(svc, msg, Some(event), &reason, delivered, err.retry_after()).await
        }
        Disposition::Retry | Disposition::Fail => {
            error!(error = %reason, "turn cannot be answered; sending the failure line and dead-lettering");
            svc.metrics.inc(TURNS, "outcome=\"failed\"");
            let through = match turn::answer_with_failure(svc, event, &reason).await {
                Ok(settled) => settled.through_seq,
                Err(e) => {
                    error!(error = %e, "failure line not delivered");
                    None
                }
            };
            reject(svc, order, msg, &reason, delivered, through).await;
        }
    }
}

/// Hands the event back to the stream for a later attempt (NAK with backoff).
async fn retry(
    svc: &Services,
    msg: &jetstream::Message,
    event: Option<&DmEvent>,
    reason: &str,
    delivered: i64,
    wait: Option<Duration>,
) {
    let delay = retry_delay(svc.config.retry_delay_secs, delivered).max(wait.unwrap_or_default());
    warn!(error = %reason, retry_in_ms = delay.as_millis() as u64, "turn failed; will retry");
    svc.metrics.inc(TURNS, "outcome=\"retried\"");
    if let Some(event) = event
        && let Err(e) = svc.pg.note_error(&event.message_id.to_hex(), reason).await
    {
        warn!(error = %e, "could not record the error in the journal");
    }
    settle(msg, AckKind::Nak(Some(delay))).await;
}

/// Dead-letters, settles the conversation's order and terminates; if the dead letter or the order floor
/// cannot be written the event is NAKed instead (its redelivery does both again, idempotently).
async fn reject(
    svc: &Services,
    order: &Order,
    msg: &jetstream::Message,
    reason: &str,
    delivered: i64,
    through: Option<u64>,
) {
    warn!(reason, "event rejected");
    if let Err(e) = svc.bus.dead_letter(msg, reason, delivered).await {
        error!(error = %e, "dead letter not written; the event stays in the stream");
        return settle(msg, AckKind::Nak(Some(Duration::from_secs(5)))).await;
    }
    svc.metrics.inc("companion_dead_letters_total", "");
    if advance_order(order, msg, through).await {
        settle(msg, AckKind::Term).await
    }
}

/// Moves the conversation's order floor past this event (and the burst it answered, `through`); when
/// the floor cannot be written the event is NAKed, so its redelivery moves it. True when it moved.
async fn advance_order(order: &Order, msg: &jetstream::Message, through: Option<u64>) -> bool {
    let sequence = msg.info().map(|i| i.stream_sequence).unwrap_or(0);
    let through = through.unwrap_or(sequence).max(sequence);
    match order.settle(msg.subject.as_str(), through).await {
        Ok(()) => true,
        Err(e) => {
            warn!(error = %e, "conversation order not advanced; the event comes back to do it");
            settle(msg, AckKind::Nak(Some(Duration::from_secs(2)))).await;
            false
        }
    }
}

/// Exponential backoff with jitter, capped at a minute.
fn retry_delay(base_secs: u64, delivered: i64) -> Duration {
    let exp = delivered.clamp(1, 10) as u32 - 1;
    let base = Duration::from_secs(base_secs.max(1))
        .saturating_mul(2u32.saturating_pow(exp))
        .min(Duration::from_secs(60));
    base.mul_f64(0.8 + fastrand::f64() * 0.4)
}
