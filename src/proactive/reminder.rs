//! A due reminder reaches the user: the schedule `schedule_reminder` set fires
//! `<prefix>.signal.reminder.<id>` with `{ "reminderId", "fireAt" }`, and the companion that promised it
//! writes to the user in the thread it was promised in. A cancelled reminder is dropped (its schedule
//! still fired). Whether it was sent or dropped is its job's state (`reminder:<id>`); the row keeps what
//! the user asked for.

use serde::Deserialize;

use super::{Found, News, ProactiveError, SignalBody, Sources, Thread, invalid};
use crate::{bus::event::parse_object_id, character::fill, store::ReminderState};

/// The trigger kind of a reminder's message.
pub(crate) const KIND: &str = crate::store::REMINDER_KIND;

/// The fired schedule's body.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Due {
    reminder_id: String,
}

impl SignalBody for Due {
    const WHAT: &'static str = "due reminder";
    const ID_FIELD: &'static str = "reminderId";
    fn id(&self) -> &str {
        &self.reminder_id
    }
}

/// Reads the fired reminder and says what to tell whom.
pub(super) async fn follow_up(t: Sources<'_>, due: Due) -> Result<Found<'_>, ProactiveError> {
    let r =
        t.pg.reminder(&due.reminder_id)
            .await?
            .ok_or_else(|| invalid(format!("no reminder {}", due.reminder_id)))?;
    let ids = (
        parse_object_id(&r.user_id),
        parse_object_id(&r.bot_id),
        parse_object_id(&r.conversation_id),
    );
    let (Some(user), Some(bot), Some(conversation)) = ids else {
        return Err(invalid(format!("reminder {} has malformed ids", r.id)));
    };
    let character = t
        .characters
        .by_bot(&bot)
        .ok_or_else(|| invalid(format!("reminder {}: no character for bot {bot}", r.id)))?;
    let stale =
        (r.state == ReminderState::Cancelled).then(|| "the user cancelled the reminder".to_owned());
    let brief = format!(
        "[Not a reply: you are following up on your own.] You promised to remind the user of this, for \
         {}: \"{}\". That time is now. Write the user one short DM, in character, reminding them.",
        r.due_at.format("%A %-d %B %H:%M UTC"),
        r.text
    );
    let plain = fill(&character.follow_ups.reminder, &[("text", &r.text)]);
    let thread: Thread = (user, bot, conversation, character);
    Ok((r.id, thread, News::new(brief, plain, None, stale)))
}
