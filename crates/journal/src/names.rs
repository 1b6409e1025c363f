//! The names the journal itself reads ([`REPLY`], [`PACKED`]), the tallies, and the shape of step keys.
//! Each step is defined once, with its record, by the stage that records it ([`crate::StepKind`]); the
//! conversation pipeline (the worker's `pipeline`) says in which order they run.

/// The `reply` step: a companion message, fixed before it is delivered, keyed by its reply generation and
/// slot ([`key::Slot::reply`]). The journal reads its keys to open a replay in the next generation; the
/// pipeline defines the step ([`crate::StepKind`]) with its record.
pub const REPLY: &str = "reply";

/// Not a step: one row holding the lazy records of packable steps ([`crate::StepKind::packed`]) that one
/// statement wrote, keyed `<attempt>.<n>` (the view `job_records` reads them one row each).
pub const PACKED: &str = "packed";

/// Tallies: limits every worker counts against together (`job_steps.tally`).
pub mod tally {
    /// A user's turns, for the flood limit.
    pub fn turns(user: &str) -> String {
        format!("turns:{user}")
    }

    /// The busy line a companion said to a user.
    pub fn busy(user: &str, bot: &str) -> String {
        format!("busy:{user}:{bot}")
    }

    /// A user's writes through tools, for the hourly quota.
    pub fn writes(user: &str) -> String {
        format!("writes:{user}")
    }

    /// The model's answers on behalf of a user, for the spend budgets.
    pub fn spend(user: &str) -> String {
        format!("spend:{user}")
    }

    /// Follow-ups sent to a user, for the daily cap.
    pub fn proactive(user: &str) -> String {
        format!("proactive:{user}")
    }

    /// Crisis referrals in a conversation, one per window.
    pub fn crisis(conversation: &str) -> String {
        format!("crisis:{conversation}")
    }

    /// What a user asked to be remembered, for its daily bound.
    pub fn remember(user: &str) -> String {
        format!("remember:{user}")
    }

    /// The under-13 line said to a user, once a day.
    pub fn under_13(user: &str) -> String {
        format!("under_13:{user}")
    }
}

/// Step keys.
pub mod key {
    /// The key of a step that happens once per job.
    pub const ONCE: &str = "";
    /// A flow change made by the event a follow-up is about.
    pub const EVENT: &str = "event";
    /// The user's message kept in history without an answer of its own.
    pub const USER: &str = "user";

    /// The delivery steps of the crisis referral for user message `message` (hex).
    pub fn crisis(message: &str) -> String {
        format!("crisis.{message}")
    }

    /// Which companion message of a job a step belongs to: the only one (a DM reply, a follow-up) or the
    /// n-th of several (a group message's answers).
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Slot {
        Only,
        Nth(usize),
    }

    impl Slot {
        /// The key of the slot's `reply` and delivery steps in a reply generation: `g<generation>`, or
        /// `g<generation>.<n>`.
        pub fn reply(self, generation: i32) -> String {
            match self {
                Slot::Only => format!("g{generation}"),
                Slot::Nth(n) => format!("g{generation}.{n}"),
            }
        }

        /// The prefix of the slot's `llm` and `tool` keys: none, or `<n>.` (several model conversations
        /// share one job).
        pub fn calls(self) -> String {
            match self {
                Slot::Only => String::new(),
                Slot::Nth(n) => format!("{n}."),
            }
        }

        /// The generation and slot of a key [`Slot::reply`] made; none for another key.
        pub fn of_reply(key: &str) -> Option<(i32, Slot)> {
            let rest = key.strip_prefix('g')?;
            match rest.split_once('.') {
                Some((g, n)) => Some((g.parse().ok()?, Slot::Nth(n.parse().ok()?))),
                None => Some((rest.parse().ok()?, Slot::Only)),
            }
        }

        /// The slot of a key that starts with a prefix [`Slot::calls`] made.
        pub fn of_call(key: &str) -> Slot {
            key.split_once('.')
                .and_then(|(n, _)| n.parse().ok())
                .map_or(Slot::Only, Slot::Nth)
        }

        /// The slot's place among the job's messages (the only one is the first).
        pub fn index(self) -> usize {
            match self {
                Slot::Only => 0,
                Slot::Nth(n) => n,
            }
        }
    }

    /// Whether `key` is a `reply` key of `generation`, of any slot.
    pub(crate) fn is_reply_of(key: &str, generation: i32) -> bool {
        Slot::of_reply(key).is_some_and(|(g, _)| g == generation)
    }
}

#[cfg(test)]
mod tests {
    use super::key::{Slot, is_reply_of};

    #[test]
    fn reply_keys_name_their_generation_and_slot() {
        assert_eq!(Slot::Only.reply(0), "g0");
        assert_eq!(Slot::Nth(2).reply(1), "g1.2");
        assert_eq!(Slot::Only.calls(), "");
        assert_eq!(Slot::Nth(1).calls(), "1.");
        assert!(is_reply_of("g1", 1) && is_reply_of("g1.0", 1));
        assert!(!is_reply_of("g10", 1) && !is_reply_of("g0", 1));
        for slot in [Slot::Only, Slot::Nth(0), Slot::Nth(3)] {
            assert_eq!(Slot::of_reply(&slot.reply(7)), Some((7, slot)));
            assert_eq!(Slot::of_call(&format!("{}2", slot.calls())), slot);
        }
        assert_eq!(Slot::of_reply("crisis.g1"), None);
        assert_eq!(Slot::of_call("call_r1_0:ab12"), Slot::Only);
    }
}
