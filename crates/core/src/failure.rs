//! How a failure is handled, decided where it arises: every error a turn can meet says its [`Class`],
//! and the settlement (the worker's `settle`) maps the class and the delivery count to ack, NAK or terminate.

use std::time::Duration;

/// What a failure means for the event that met it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    /// Another delivery may succeed: a server down or slow, a rate limit, a model answer that failed
    /// or came back empty. NAKed with backoff until the last delivery.
    Transient,
    /// Fails the same way every time (bad data, a request the model refuses), but the user is owed an
    /// answer: the character's honest failure line, then a dead letter.
    Permanent,
    /// Not a valid turn at all (malformed event, unknown bot, a conversation the sender is not in):
    /// a dead letter, no reply.
    Reject,
}

/// Exponential backoff: `base` doubled `retries` times, at most `cap`. The one formula of the retries
/// within a turn (the model client's) and across deliveries (the settlement's NAK delay).
pub fn backoff(base: Duration, retries: u32, cap: Duration) -> Duration {
    base.saturating_mul(2u32.saturating_pow(retries)).min(cap)
}

/// `d` ±20 %, so that the retries of many failures spread out.
pub fn jittered(d: Duration) -> Duration {
    d.mul_f64(0.8 + fastrand::f64() * 0.4)
}

/// An error that knows its [`Class`].
pub trait Classify {
    fn class(&self) -> Class;

    /// A wait the failing service asked for (e.g. the model's `Retry-After`).
    fn retry_after(&self) -> Option<Duration> {
        None
    }
}

/// A classified failure, as the settlement sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    pub class: Class,
    /// Logged, recorded in the journal and in the dead letter.
    pub reason: String,
    pub retry_after: Option<Duration>,
}

impl Failure {
    pub fn of<E: Classify + std::fmt::Display>(e: &E) -> Self {
        Self {
            class: e.class(),
            reason: e.to_string(),
            retry_after: e.retry_after(),
        }
    }

    pub fn new(class: Class, reason: impl Into<String>) -> Self {
        Self {
            class,
            reason: reason.into(),
            retry_after: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_stays_within_a_fifth() {
        for _ in 0..1000 {
            let d = jittered(Duration::from_secs(10));
            assert!(d >= Duration::from_secs(8) && d <= Duration::from_secs(12));
        }
    }

    #[test]
    fn the_backoff_doubles_up_to_its_cap() {
        let s = Duration::from_secs;
        let steps: Vec<Duration> = (0..5).map(|n| backoff(s(1), n, s(10))).collect();
        assert_eq!(steps, [s(1), s(2), s(4), s(8), s(10)]);
        assert_eq!(
            backoff(s(1), 40, Duration::MAX),
            s(1).saturating_mul(u32::MAX)
        );
    }
}
