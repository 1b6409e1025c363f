//! Every step and tally name the journal records, and the shape of their keys: the one list, so a reader
//! (replay, the spend check, `companion usage`, an operator's query) and the writer cannot disagree. The
//! conversation pipeline (the worker's `pipeline`) says in which order they run.

/// Step names, by the stage that records them.
pub mod step {
    /// Over the flood limit or not, and who says the busy line ([`crate::flood`]).
    pub const FLOOD: &str = "flood";
    /// A turn's admission against the user's flood allowance (tally [`super::tally::turns`]).
    pub const TURN: &str = "turn";
    /// The busy line said to a user by a companion (tally [`super::tally::busy`], one per window).
    pub const BUSY: &str = "busy";
    /// A follow-up's checks before anything is sent: stale news, a blocked or departed companion, the
    /// daily cap.
    pub const GATE: &str = "gate";
    /// A follow-up counted against the user's daily cap (tally [`super::tally::proactive`]).
    pub const CAP: &str = "cap";
    /// Who answers a group message, and why.
    pub const ROUTE: &str = "route";
    /// The later messages of a burst that one reply answers.
    pub const BURST: &str = "burst";
    /// The user's guided flow as a turn sees it.
    pub const FLOW: &str = "flow";
    /// A change to the user's guided flow: by a tool call (keyed by the call) or by the event a waiting
    /// step waited for (key [`super::key::EVENT`]). Written in the transaction that records it.
    pub const FLOW_CHANGE: &str = "flow_change";
    /// One answer of the model, with its usage and cost (tally [`super::tally::spend`]).
    pub const LLM: &str = "llm";
    /// One tool call's result, as the model saw it.
    pub const TOOL: &str = "tool";
    /// A write counted against the user's hourly quota (tally [`super::tally::writes`]).
    pub const QUOTA: &str = "quota";
    /// A companion message, fixed before it is delivered.
    pub const REPLY: &str = "reply";
    /// Delivering it: the dm_messages document, the history rows, the conversation's last message and
    /// the completion event.
    pub const STORE_REPLY: &str = "store_reply";
    pub const HISTORY: &str = "history";
    pub const TOUCH: &str = "touch";
    pub const PUBLISH: &str = "publish";
    /// A message withdrawn after it went out: a deletion committed between the turn's last check and
    /// the completion (see `pipeline::deliver`).
    pub const WITHDRAW: &str = "withdraw";
    /// A user message the crisis screen flagged: its category and language, and whether a referral is
    /// owed; the yearly report's row is written in its transaction. Keyed by the message.
    pub const CRISIS: &str = "crisis";
    /// The crisis decision on a user message: which layer flagged it (or none did), and what the
    /// moderation endpoint answered. Keyed by the message; lazy.
    pub const SCREEN: &str = "screen";
    /// Whether the reply model flagged the user's message just before this one (within the referral
    /// window): then this turn, too, is answered with the safety brief. Keyed once; lazy.
    pub const AFTER_FLAG: &str = "after_flag";
    /// The crisis referral counted against the conversation's window (tally [`super::tally::crisis`]).
    pub const REFERRAL: &str = "referral";
    /// The referral message, fixed before it is delivered (its delivery steps are keyed
    /// [`super::key::crisis`]).
    pub const REFERRAL_MESSAGE: &str = "referral_message";
    /// The moderators' crisis alert, published.
    pub const ALERT: &str = "alert";
    /// The one line a user under 13 gets a day (tally [`super::tally::under_13`]).
    pub const UNDER_13: &str = "under_13";
    /// A moderator's pause or resume of a conversation: whether it changed the takeover state, which is
    /// written in its transaction.
    pub const TAKEOVER: &str = "takeover";
    /// On resume: what moderators wrote during the pause, added to the companion's history.
    pub const MODERATOR_HISTORY: &str = "moderator_history";
    /// On resume: the latest held job, opened again to be answered (or none).
    pub const CATCH_UP: &str = "catch_up";
    /// A fact the user asked to be remembered, written in the transaction that records it (keyed by the
    /// call).
    pub const REMEMBER: &str = "remember";
    /// A `remember` counted against the user's daily bound (tally [`super::tally::remember`]).
    pub const REMEMBER_QUOTA: &str = "remember_quota";
    /// Facts the user asked to be forgotten, removed in the transaction that records it (keyed by the
    /// call).
    pub const FORGET: &str = "forget";
    /// After a DM's reply: memory's extraction signal (when enough messages wait) and its quiet-period
    /// schedule, published. Keyed by the reply generation; lazy (recorded when the job settles, so a
    /// crash before that publishes them again, which the stream's duplicate window absorbs).
    pub const MEMORY_TRIGGER: &str = "memory_trigger";
    /// A memory extraction's history rows read (ids only), keyed `facts` or `summary`.
    pub const MEMORY_BATCH: &str = "memory_batch";
    /// The facts an extraction kept and what they replaced, written in its transaction with the cursor.
    pub const MEMORY_FACTS: &str = "memory_facts";
    /// The rolling summary, written in its transaction with its cursor.
    pub const MEMORY_SUMMARY: &str = "memory_summary";
    /// A deletion's transaction (`message_deleted`, `memory_cleared`, `user_erased`): the tombstone and
    /// every row it removes or scrubs, with this record (counts, never text). Keyed once.
    pub const ERASE: &str = "erase";
    /// A deletion's removal of messages from the streams, after its transaction. Keyed once.
    pub const ERASE_STREAMS: &str = "erase_streams";
    /// A `message_deleted`'s signals to rebuild the summaries it was in. Keyed once.
    pub const REBUILD: &str = "rebuild";
    /// An operator asked `companion explain --show-text` for this job's messages: who, which message,
    /// whether the text was shown (never for a deleted message or an erased user). Keyed
    /// `<operator>@<time>`, so an erasure's scrub of its output leaves who and when.
    pub const TEXT_SHOWN: &str = "text_shown";
    /// A note ([`crate::Job::note`]), not a side effect: one failed request to the model (the model
    /// asked, the error, its class, how long it took), keyed `<llm key>@<attempt>.<n>`.
    pub const MODEL_FAILED: &str = "model_failed";
    /// A note: why a fixed line (the failure line, the crisis line, the busy or budget line) stands in
    /// for the model's answer, keyed `<reply key>@<attempt>.<n>`.
    pub const FIXED_LINE: &str = "fixed_line";
    /// Not a step: one row holding the lazy records of [`PACKABLE`] steps that one statement wrote, keyed
    /// `<attempt>.<n>` (the view `job_records` reads them one row each).
    pub const PACKED: &str = "packed";

    /// Steps whose lazy records are written packed ([`PACKED`]), one row a statement instead of one each.
    /// Each is a few bytes that hold no user's words (so no erasure scrubs it by name), moves no counter
    /// and no tally, and no statement selects it by name: it is read only among all of its job's records
    /// (a reopen that forgets one, as a replay forgets `flood`, takes it out of its pack).
    pub const PACKABLE: &[&str] = &[
        STORE_REPLY,
        HISTORY,
        TOUCH,
        PUBLISH,
        MEMORY_TRIGGER,
        AFTER_FLAG,
        FLOOD,
    ];
}

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
