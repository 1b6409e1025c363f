//! Settlement: what becomes of a delivery once its turn ended. [`decide`] is a pure function from the
//! ending, the delivery count and the limits to a [`Verdict`]; [`Settler::execute`] carries a verdict out,
//! always in the same order: the failure line when one is owed, the dead letter, the conversation's order
//! floor, then the ack, NAK or terminate. When one of its own writes fails, the event is NAKed instead
//! ([`on_failed_write`]) and its redelivery does the rest again, harmlessly (every write is keyed).
//!
//! | ending | delivery | verdict |
//! |---|---|---|
//! | settled: answered, limited, already settled | any | ack (after moving the floor past the burst) |
//! | the worker stops | any | NAK now |
//! | reject: malformed, unknown bot, missing conversation, not a participant | any | terminate, dead letter, no reply |
//! | permanent: the model refuses (4xx), data the stores refuse | any | terminate, failure line, dead letter |
//! | transient: a server down, model timeout, 429, 5xx, failed or empty answer | not the last | NAK after the backoff (or the server's `Retry-After`, if longer) |
//! | (before any of these: a shared dependency does not answer) | any | held and run again once it does ([`crate::outage`]); past `COMPANION_OUTAGE_MAX_SECS`, permanent |
//! | transient | the last | terminate, failure line, dead letter |
//! | every worker died on it: the max-deliveries advisory | the last | as a transient failure on the last delivery |

use std::{sync::Arc, time::Duration};

use async_nats::jetstream::{self, AckKind};
use bytes::Bytes;
use tracing::{error, info, warn};

use crate::{
    bus::{Bus, Inbound},
    conversation_order::Order,
    failure::{self, Class, Failure},
    journal::State,
    metrics::{Metric, Metrics},
    outage::{Outages, WaitOut},
    pipeline::{Outcome, Pipeline},
    timing::{self, Stage},
};

/// Turns by outcome (answered, limited, failed, retried, ...).
pub(crate) const TURNS: Metric = Metric::new(
    "companion_turns_total",
    "Turns by outcome (answered, limited, held, dropped, failed, retried, returned, already_done)",
);
/// Events recorded in the dead-letter stream.
pub(crate) const DEAD_LETTERS: Metric = Metric::new(
    "companion_dead_letters_total",
    "Events recorded in the dead-letter stream",
);

/// How a delivery's turn ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Ending {
    /// The turn settled the message; `through` is the last stream sequence its reply answered (a burst);
    /// `floored`, the sequence the job's own settlement moved the order floor past, if it did.
    Settled {
        through: Option<u64>,
        floored: Option<u64>,
    },
    /// The worker is stopping: the message goes back to the stream at once.
    Returned,
    /// The turn failed.
    Failed(Failure),
}

/// What is done with the delivery.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Settled: move the order floor through `through` (or the message itself), unless the job's
    /// settlement moved it there already (`floored`), and acknowledge.
    Ack {
        through: Option<u64>,
        floored: Option<u64>,
    },
    /// Hand it back to the stream, redelivered after `delay`.
    Nak { delay: Duration },
    /// Never again: the failure line first when owed, a dead letter with `reason`, then terminate.
    Term {
        reason: String,
        answer_with_failure_line: bool,
    },
}

/// The bounds the decision depends on.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RetryLimits {
    /// Deliveries of one event (the consumer's `max_deliver`).
    pub(crate) max_deliver: i64,
    /// First NAK delay, doubled per delivery.
    pub(crate) retry_base: Duration,
    /// Longest NAK delay.
    pub(crate) retry_cap: Duration,
}

/// The one decision.
pub(crate) fn decide(ending: &Ending, delivered: i64, limits: &RetryLimits) -> Verdict {
    match ending {
        Ending::Settled { through, floored } => Verdict::Ack {
            through: *through,
            floored: *floored,
        },
        Ending::Returned => Verdict::Nak {
            delay: Duration::ZERO,
        },
        Ending::Failed(f) => match f.class {
            Class::Reject => Verdict::Term {
                reason: f.reason.clone(),
                answer_with_failure_line: false,
            },
            Class::Transient if delivered < limits.max_deliver => Verdict::Nak {
                delay: backoff(limits, delivered).max(f.retry_after.unwrap_or_default()),
            },
            Class::Transient | Class::Permanent => Verdict::Term {
                reason: f.reason.clone(),
                answer_with_failure_line: true,
            },
        },
    }
}

/// The settlement's own writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Write {
    DeadLetter,
    OrderFloor,
}

/// A write of the settlement failed: the event comes back, and its redelivery settles it again.
pub(crate) fn on_failed_write(write: Write) -> Verdict {
    Verdict::Nak {
        delay: match write {
            Write::DeadLetter => Duration::from_secs(5),
            Write::OrderFloor => Duration::from_secs(2),
        },
    }
}

/// `retry_base` doubled per delivery so far, capped.
fn backoff(limits: &RetryLimits, delivered: i64) -> Duration {
    let retries = delivered.clamp(1, 10) as u32 - 1;
    failure::backoff(
        limits.retry_base.max(Duration::from_millis(1)),
        retries,
        limits.retry_cap,
    )
}

/// The delivery being settled.
pub(crate) enum Handle<'a> {
    /// A message this worker holds (a DM or a signal): acked, NAKed or terminated.
    Message(&'a jetstream::Message),
    /// A message no worker holds any more (it ran out of deliveries): nothing will deliver it again; a
    /// write that fails is tried again when the server's notice of it is delivered again.
    Exhausted {
        subject: &'a str,
        seq: u64,
        payload: Bytes,
    },
}

impl Handle<'_> {
    fn subject(&self) -> &str {
        match self {
            Handle::Message(m) => m.subject.as_str(),
            Handle::Exhausted { subject, .. } => subject,
        }
    }

    fn seq(&self) -> u64 {
        match self {
            Handle::Message(m) => m.info().map(|i| i.stream_sequence).unwrap_or(0),
            Handle::Exhausted { seq, .. } => *seq,
        }
    }

    fn payload(&self) -> Bytes {
        match self {
            Handle::Message(m) => m.payload.clone(),
            Handle::Exhausted { payload, .. } => payload.clone(),
        }
    }

    async fn answer(&self, kind: AckKind) {
        if let Handle::Message(m) = self {
            let result = match kind {
                AckKind::Ack => m.double_ack().await,
                kind => m.ack_with(kind).await,
            };
            if let Err(e) = result {
                warn!(error = %e, "could not settle the message; the server will redeliver it");
            }
        }
    }
}

/// Carries verdicts out.
pub(crate) struct Settler {
    pub(crate) bus: Bus,
    pub(crate) order: Arc<Order>,
    pub(crate) pipeline: Arc<Pipeline>,
    pub(crate) metrics: Arc<Metrics>,
    /// A write that fails during an outage waits it out and is tried again, instead of a NAK.
    pub(crate) outages: Arc<Outages>,
    /// The worker's hard stop: a write waiting out an outage gives up and NAKs.
    pub(crate) stop: tokio_util::sync::CancellationToken,
}

impl Settler {
    /// Executes `verdict` for the delivery; `event` is the parsed event when the payload was valid.
    /// False when a write it needed failed (a held message was NAKed; an exhausted one is left for its
    /// notice to be tried again).
    pub(crate) async fn execute(
        &self,
        handle: Handle<'_>,
        event: Option<&Inbound>,
        verdict: Verdict,
        delivered: i64,
    ) -> bool {
        match verdict {
            Verdict::Ack { through, floored } => {
                let advanced = self.advance(&handle, through, floored).await;
                if advanced {
                    handle.answer(AckKind::Ack).await;
                }
                advanced
            }
            Verdict::Nak { delay } => {
                handle
                    .answer(AckKind::Nak(Some(failure::jittered(delay))))
                    .await;
                true
            }
            Verdict::Term {
                reason,
                answer_with_failure_line,
            } => {
                let mut through = None;
                let mut dead = true;
                if let (true, Some(event)) = (answer_with_failure_line, event) {
                    error!(error = %reason, "turn cannot be answered; sending the failure line and dead-lettering");
                    self.metrics.inc(&TURNS, &[("outcome", "failed")]);
                    let answered = self.pipeline.fail(&event.into(), &reason).await;
                    match answered {
                        Ok(settled) => {
                            through = settled.through_seq;
                            if let Outcome::AlreadySettled { state } = settled.outcome {
                                info!(?state, "the event was settled after all");
                                // Answered after all (done, covered, limited): not a dead letter.
                                dead = state == State::Failed;
                            }
                        }
                        Err(e) if crate::failure::Classify::class(&e) == Class::Reject => {
                            info!(error = %e, "not a valid turn; dead-lettering without a reply")
                        }
                        Err(e) => error!(error = %e, "failure line not delivered"),
                    }
                } else {
                    warn!(reason, "event rejected");
                }
                if dead && !self.dead_letter(&handle, &reason, delivered).await {
                    return false;
                }
                let advanced = self.advance(&handle, through, None).await;
                if advanced {
                    handle.answer(AckKind::Term).await;
                }
                advanced
            }
        }
    }

    /// Records the event in the dead-letter stream; false when the event was NAKed instead.
    async fn dead_letter(&self, handle: &Handle<'_>, reason: &str, delivered: i64) -> bool {
        let write = || {
            self.bus.dead_letter_raw(
                handle.subject(),
                handle.seq(),
                handle.payload(),
                reason,
                delivered,
            )
        };
        if self.retrying(handle, Write::DeadLetter, write).await {
            self.metrics.inc(&DEAD_LETTERS, &[]);
            warn!(reason, "event dead-lettered");
            true
        } else {
            false
        }
    }

    /// Moves the conversation's order floor past this event (and the burst it answered, `through`);
    /// false when the event was NAKed instead. When the job's settlement wrote it already (`floored`),
    /// only the waiters are told.
    async fn advance(
        &self,
        handle: &Handle<'_>,
        through: Option<u64>,
        floored: Option<u64>,
    ) -> bool {
        // Signals are not steps of a conversation: no order floor.
        if self.bus.names.is_signal(handle.subject()) {
            return true;
        }
        let seq = handle.seq();
        let through = through.unwrap_or(seq).max(seq);
        if floored == Some(through) {
            self.order.advanced(handle.subject(), through).await;
            return true;
        }
        let write = || self.order.advance_floor(handle.subject(), through);
        timing::stage(
            Stage::Order,
            self.retrying(handle, Write::OrderFloor, write),
        )
        .await
    }

    /// Runs one of the settlement's writes: once, and for a held message again after each outage it
    /// waits out. When it fails otherwise, a held message is NAKed; an exhausted event is left to its
    /// notice, which the server delivers again (the notice's redelivery is the retry).
    async fn retrying<F, Fut, E>(&self, handle: &Handle<'_>, write: Write, f: F) -> bool
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<(), E>>,
        E: std::fmt::Display,
    {
        let held_since = std::time::Instant::now();
        loop {
            let e = match f().await {
                Ok(()) => return true,
                Err(e) => e,
            };
            warn!(error = %e, ?write, "settlement write failed");
            if let Handle::Exhausted { .. } = handle {
                error!(
                    ?write,
                    "the exhausted event could not be settled; its notice is tried again later"
                );
                return false;
            }
            let cause = e.to_string();
            if let WaitOut::Resumed { .. } =
                self.outages.wait_out(&cause, held_since, &self.stop).await
            {
                continue;
            }
            if let Verdict::Nak { delay } = on_failed_write(write) {
                handle.answer(AckKind::Nak(Some(delay))).await;
            }
            return false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: RetryLimits = RetryLimits {
        max_deliver: 5,
        retry_base: Duration::from_secs(2),
        retry_cap: Duration::from_secs(60),
    };

    fn failed(class: Class) -> Ending {
        Ending::Failed(Failure::new(class, "why"))
    }

    fn term(line: bool) -> Verdict {
        Verdict::Term {
            reason: "why".into(),
            answer_with_failure_line: line,
        }
    }

    fn nak(secs: u64) -> Verdict {
        Verdict::Nak {
            delay: Duration::from_secs(secs),
        }
    }

    /// Every row of the failure table (docs/pipeline.md), and the module's.
    #[test]
    fn the_settlement_table() {
        let rows: Vec<(&str, Ending, i64, Verdict)> = vec![
            (
                "answered (or limited, or settled earlier): ack through the burst",
                Ending::Settled {
                    through: Some(9),
                    floored: Some(9),
                },
                1,
                Verdict::Ack {
                    through: Some(9),
                    floored: Some(9),
                },
            ),
            (
                "over the flood limit: acked like any answer",
                Ending::Settled {
                    through: None,
                    floored: None,
                },
                5,
                Verdict::Ack {
                    through: None,
                    floored: None,
                },
            ),
            (
                "the worker stops: back at once",
                Ending::Returned,
                3,
                nak(0),
            ),
            (
                "malformed, unknown bot, missing conversation, not a participant: no reply",
                failed(Class::Reject),
                1,
                term(false),
            ),
            (
                "rejected on the last delivery too: still no reply",
                failed(Class::Reject),
                5,
                term(false),
            ),
            (
                "MongoDB, PostgreSQL, NATS down; model timeout, 429, 5xx, failed or empty answer",
                failed(Class::Transient),
                1,
                nak(2),
            ),
            ("the backoff doubles", failed(Class::Transient), 2, nak(4)),
            ("and doubles", failed(Class::Transient), 4, nak(16)),
            (
                "the last delivery fails: failure line",
                failed(Class::Transient),
                5,
                term(true),
            ),
            (
                "every worker died on it (max-deliveries advisory): as a last delivery",
                failed(Class::Transient),
                5,
                term(true),
            ),
            (
                "the model rejects the request (4xx), data the stores refuse: failure line at once",
                failed(Class::Permanent),
                1,
                term(true),
            ),
        ];
        for (row, ending, delivered, want) in rows {
            assert_eq!(decide(&ending, delivered, &LIMITS), want, "{row}");
        }
    }

    #[test]
    fn a_server_s_retry_after_wins_when_longer_and_the_backoff_is_capped() {
        let mut f = Failure::new(Class::Transient, "429");
        f.retry_after = Some(Duration::from_secs(30));
        assert_eq!(decide(&Ending::Failed(f.clone()), 1, &LIMITS), nak(30));
        f.retry_after = Some(Duration::from_secs(1));
        assert_eq!(decide(&Ending::Failed(f), 1, &LIMITS), nak(2));
        let long = RetryLimits {
            max_deliver: 100,
            ..LIMITS
        };
        assert_eq!(decide(&failed(Class::Transient), 50, &long), nak(60));
    }

    #[test]
    fn a_settlement_write_that_fails_hands_the_event_back() {
        assert_eq!(on_failed_write(Write::DeadLetter), nak(5));
        assert_eq!(on_failed_write(Write::OrderFloor), nak(2));
    }
}
