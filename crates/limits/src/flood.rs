//! The per-user inbound flood limit: a user who sends faster than anyone chats does not cost an LLM
//! call per message. Turns over the limit are answered once with the character's busy line; the rest of
//! that minute's messages are recorded (journal and history) without a reply of their own.
//!
//! The limit holds across every worker: each admitted turn is a counted journal step of the tally
//! `turns:<user>` ([`Job::counted`], one transaction under a lock per tally), so N workers together admit
//! exactly `per_minute` turns of one user per rolling minute, whichever companions they are with. The busy
//! line is a counted step too (tally `busy:<user>:<bot>`, limit 1): one per companion per window, however
//! many workers see the flood at once.

use std::time::Duration;

use chrono::Utc;

use serde_json::json;

use crate::journal::{
    Admission, Counted, Job, Journal, JournalError, StepKind, Telling, Told, names::tally,
};

/// A turn's admission against the user's flood allowance (tally [`tally::turns`]).
pub const TURN: StepKind<Counted> =
    StepKind::new("turn").says(|t| counted(t, "gate: counted against the user's flood allowance"));
/// The busy line said to a user by a companion (tally [`tally::busy`], one per window).
pub const BUSY: StepKind<Counted> =
    StepKind::new("busy").says(|t| counted(t, "gate: the busy line counted for this window"));

/// A counted step told: what it counted for, and its tally.
pub fn counted(t: &Told<'_>, says: &str) -> Telling {
    (says.to_owned(), json!({ "tally": t.tally }))
}

/// How long one busy line answers for, and the window turns are counted over.
pub(crate) const WINDOW: Duration = Duration::from_secs(60);

pub struct FloodLimit {
    /// Turns per user per rolling minute; 0: no limit.
    pub(crate) per_minute: u32,
}

impl FloodLimit {
    pub fn new(per_minute: u32) -> Self {
        Self { per_minute }
    }

    /// Takes one turn from the user's allowance for `job`: `None` when it goes ahead, else the job whose
    /// busy line answers it (this one, when it is the first over the limit this window).
    pub async fn decide(
        &self,
        journal: &Journal,
        job: &Job,
        user: &str,
        bot: &str,
    ) -> Result<Option<String>, JournalError> {
        if self.per_minute == 0 {
            return Ok(None);
        }
        let now = Utc::now();
        let turns = tally::turns(user);
        if !matches!(
            job.counted(&TURN, "", &turns, self.per_minute, WINDOW, now)
                .await?,
            Admission::Exceeded { .. }
        ) {
            return Ok(None);
        }
        let busy = tally::busy(user, bot);
        if !matches!(
            job.counted(&BUSY, "", &busy, 1, WINDOW, now).await?,
            Admission::Exceeded { .. }
        ) {
            return Ok(Some(job.id().to_owned()));
        }
        let since = now - chrono::Duration::from_std(WINDOW).unwrap_or_default();
        Ok(Some(
            journal
                .last_tallied(&busy, BUSY.name, since)
                .await?
                .unwrap_or_else(|| job.id().to_owned()),
        ))
    }
}
