//! The per-user inbound flood limit: a user who sends faster than anyone chats does not cost an LLM
//! call per message. Turns over the limit are answered once with the character's busy line; the rest of
//! that minute's messages are recorded (journal and history) without a reply of their own.
//!
//! The limit is per process (governor, keyed by user): with N workers a user gets at most N times the
//! quota, and in practice less, since one conversation's messages are handled one at a time and a burst
//! is answered by one turn.

use std::{num::NonZeroU32, time::Duration};

use bson::oid::ObjectId;
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};

pub struct FloodLimit {
    limiter: Option<DefaultKeyedRateLimiter<ObjectId>>,
    /// How long one busy line answers for: further limited messages in this window get none.
    pub window: Duration,
}

impl FloodLimit {
    /// `per_minute` turns per user per minute (as a burst too); 0 turns the limit off.
    pub fn new(per_minute: u32) -> Self {
        Self {
            limiter: NonZeroU32::new(per_minute)
                .map(|n| RateLimiter::keyed(Quota::per_minute(n).allow_burst(n))),
            window: Duration::from_secs(60),
        }
    }

    /// Takes one turn from the user's allowance; false when over the limit.
    pub fn allow(&self, user: ObjectId) -> bool {
        let Some(l) = &self.limiter else { return true };
        let ok = l.check_key(&user).is_ok();
        if l.len() > 100_000 {
            l.retain_recent();
        }
        ok
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_user_over_the_limit_is_refused_others_are_not() {
        let f = FloodLimit::new(3);
        let (a, b) = (ObjectId::new(), ObjectId::new());
        assert!((0..3).all(|_| f.allow(a)));
        assert!(!f.allow(a));
        assert!(f.allow(b));
        let off = FloodLimit::new(0);
        assert!((0..1000).all(|_| off.allow(a)));
    }
}
