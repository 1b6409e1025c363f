//! The consumer loop: pulls events from the shared durable consumer and runs turns, boundedly.

use std::{sync::Arc, time::Duration};

use async_nats::jetstream::{self, AckKind};
use futures::StreamExt;
use tokio::{sync::Semaphore, task::JoinSet};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, error, info, info_span, warn};

use crate::{
    bus::{BusError, DmEvent, event::parse_inbound, settle},
    services::Services,
    timing::{self, Stage},
    turn::{self, Disposition, TurnError},
};

/// Counter of turns by outcome.
const TURNS: &str = "companion_turns_total";

/// Runs until `shutdown` fires, then drains in-flight turns within the grace period.
pub async fn run(svc: Arc<Services>, shutdown: CancellationToken) -> Result<(), BusError> {
    svc.bus.ensure_streams().await?;
    if let Err(e) = svc.mongo.ensure_indexes().await {
        warn!(error = %e, "could not ensure MongoDB indexes; continuing");
    }
    let consumer = svc.bus.ensure_consumer(&svc.config).await?;
    let ops = start_ops(&svc).await;
    let exhausted = tokio::spawn(watch_exhausted(svc.clone()));
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
                    let svc = svc.clone();
                    let hard_stop = hard_stop.clone();
                    tasks.spawn(async move {
                        handle(&svc, msg, hard_stop).await;
                        drop(permit);
                    });
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
    info!("worker stopped");
    Ok(())
}

/// Events whose deliveries ran out without a worker settling them (crashed or killed mid-turn) would
/// otherwise just stop: each gets a dead letter and, when it was a valid turn not yet answered, the
/// character's failure line. One worker of the queue group handles each advisory; repeats are harmless
/// (the dead letter and the reply are keyed by the event).
async fn watch_exhausted(svc: Arc<Services>) {
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
        handle_exhausted(&svc, a.stream_seq, a.deliveries)
            .instrument(span)
            .await;
    }
}

async fn handle_exhausted(svc: &Services, sequence: u64, deliveries: i64) {
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
    if let Ok(event) = parse_inbound(
        &msg.payload,
        msg.subject.as_str(),
        &svc.bus.names.prefix,
        svc.config.event_limits(),
    ) {
        match svc.pg.turn_state(&event.message_id.to_hex()).await {
            Ok(Some(state)) if state == "done" => {
                return info!("the exhausted event was answered after all; nothing to do");
            }
            Err(e) => error!(error = %e, "cannot read the journal; dead-lettering without a reply"),
            // The same admission checks as a turn: no reply into a conversation the event may not use.
            Ok(_) => match turn::answer_with_failure(svc, &event, &reason).await {
                Ok(_) => {}
                Err(e) if e.disposition() == Disposition::Reject => {
                    info!(error = %e, "not a valid turn; dead-lettering without a reply")
                }
                Err(e) => error!(error = %e, "failure line not delivered"),
            },
        }
    }
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

/// One delivery, from bytes to ack; never panics on input.
async fn handle(svc: &Services, msg: jetstream::Message, hard_stop: CancellationToken) {
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
        let limits = svc.config.event_limits();
        let parse_started = std::time::Instant::now();
        let event = match parse_inbound(&msg.payload, msg.subject.as_str(), &svc.bus.names.prefix, limits) {
            Ok(e) => e,
            Err(e) => return reject(svc, &msg, &e.to_string(), delivered).await,
        };
        timing::add(Stage::Parse, parse_started);
        let span = tracing::Span::current();
        span.record("event_id", event.message_id.to_hex());
        span.record("conversation_id", event.conversation_id.to_hex());
        span.record("bot_id", event.bot_id.to_hex());

        let progress = keep_alive(&msg, svc.config.ack_wait());
        let started = std::time::Instant::now();
        let result = tokio::select! {
            r = turn::run(svc, &event) => Some(r),
            _ = hard_stop.cancelled() => None,
        };
        progress.abort();
        match result {
            None => {
                svc.metrics.inc(TURNS, "outcome=\"returned\"");
                settle(&msg, AckKind::Nak(None)).await
            }
            Some(Ok(outcome)) => {
                let label = match outcome {
                    turn::Outcome::Answered { .. } => "outcome=\"answered\"",
                    turn::Outcome::AlreadyDone => "outcome=\"already_done\"",
                };
                svc.metrics.inc(TURNS, label);
                svc.metrics.observe_turn(started.elapsed());
                if let Err(e) = timing::stage(Stage::Ack, msg.double_ack()).await {
                    warn!(error = %e, ?outcome, "ack not confirmed; a redelivery will find the turn done");
                }
                let name = match &outcome {
                    turn::Outcome::Answered { .. } => "answered",
                    turn::Outcome::AlreadyDone => "already_done",
                };
                timing::report(&svc.metrics, name);
            }
            Some(Err(e)) => fail(svc, &msg, &event, e, delivered).await,
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
            if msg.ack_with(AckKind::Progress).await.is_err() {
                return;
            }
        }
    })
}

async fn fail(
    svc: &Services,
    msg: &jetstream::Message,
    event: &DmEvent,
    err: TurnError,
    delivered: i64,
) {
    let reason = err.to_string();
    let err_retry_after = err.retry_after();
    match err.disposition() {
        Disposition::Reject => reject(svc, msg, &reason, delivered).await,
        Disposition::Retry if delivered < svc.config.max_deliver => {
            let delay = retry_delay(svc.config.retry_delay_secs, delivered)
                .max(err_retry_after.unwrap_or_default());
            warn!(error = %reason, retry_in_ms = delay.as_millis() as u64, "turn failed; will retry");
            svc.metrics.inc(TURNS, "outcome=\"retried\"");
            if let Err(e) = svc.pg.note_error(&event.message_id.to_hex(), &reason).await {
                warn!(error = %e, "could not record the error in the journal");
            }
            settle(msg, AckKind::Nak(Some(delay))).await;
        }
        Disposition::Retry | Disposition::Fail => {
            error!(error = %reason, "turn cannot be answered; sending the failure line and dead-lettering");
            svc.metrics.inc(TURNS, "outcome=\"failed\"");
            if let Err(e) = turn::answer_with_failure(svc, event, &reason).await {
                error!(error = %e, "failure line not delivered");
            }
            reject(svc, msg, &reason, delivered).await;
        }
    }
}

/// Dead-letters and terminates; if the dead letter cannot be written the event is NAKed instead.
async fn reject(svc: &Services, msg: &jetstream::Message, reason: &str, delivered: i64) {
    warn!(reason, "event rejected");
    match svc.bus.dead_letter(msg, reason, delivered).await {
        Ok(()) => {
            svc.metrics.inc("companion_dead_letters_total", "");
            settle(msg, AckKind::Term).await
        }
        Err(e) => {
            error!(error = %e, "dead letter not written; the event stays in the stream");
            settle(msg, AckKind::Nak(Some(Duration::from_secs(5)))).await;
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
