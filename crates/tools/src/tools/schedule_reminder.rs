//! `schedule_reminder`: the companion promises to remind the user of something at a time, and keeps it.
//! The reminder is a row of `reminders` and a one-shot JetStream message schedule that fires
//! `<prefix>.signal.reminder.<id>` at the time, whether or not a worker runs then; the companion then
//! writes to the user in the same thread (the worker's `proactive`).
//!
//! Bounds: `at` at least the minimum lead ahead (`COMPANION_REMINDER_MIN_LEAD_SECS`) and at most 30 days;
//! at most [`MAX_PENDING`] pending per user; counted in the write quota. Quiet hours: with a time zone on
//! the user's document, a reminder due between 23:00 and 07:00 there is held to 07:00 unless the user
//! asked for that exact time (`exact`); for a minor, none fires in their quiet hours (22:00–07:00 by
//! default, UTC without a time zone) whatever `exact` says.

use chrono::{DateTime, Duration, NaiveTime, TimeZone, Timelike, Utc};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;

use super::{Group, Tool, ToolContext, ToolError, ToolOutput, ToolStores, derived_id, guard_write};
use crate::store::{Reminder, ReminderState};

/// Longest reminder text.
pub(crate) const TEXT_MAX: usize = 200;
/// Furthest ahead a reminder may be.
pub(crate) const MAX_AHEAD_DAYS: i64 = 30;
/// Pending reminders one user may have.
pub(crate) const MAX_PENDING: i64 = 10;

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct Args {
    // What to remind the user of, in a few words ("wax the board before saturday").
    #[schemars(length(min = 1, max = TEXT_MAX), regex(pattern = r"\S"))]
    pub(crate) text: String,
    // E.g. `2026-11-28T09:00:00-08:00`; at least the minimum lead and at most 30 days ahead.
    /// RFC 3339 with the user's UTC offset, 1 min to 30 days ahead.
    #[schemars(length(min = 1, max = 64))]
    pub(crate) at: String,
    // False: a reminder due in the user's quiet hours (23:00–07:00) is held to 07:00.
    /// The user wants this time even in night quiet hours.
    #[serde(default)]
    pub(crate) exact: bool,
}

pub(crate) struct ScheduleReminder {
    /// The service's database.
    pg: crate::store::Pg,
    /// Where reminders are scheduled.
    bus: crate::bus::Bus,
    reminders: super::ReminderBounds,
    /// Things a user may create per rolling hour (the write quota).
    writes_per_hour: u32,
}

impl Tool for ScheduleReminder {
    const NAME: &'static str = "schedule_reminder";
    const GROUPS: &'static [Group] = &[Group::Reminders];
    type Args = Args;

    fn description() -> &'static str {
        "Remind the user of something: at `at` you will message them in this chat. Use when they ask for a reminder or accept your offer. Counts toward an hourly limit."
    }

    fn new(s: &ToolStores) -> Self {
        Self {
            pg: s.pg.clone(),
            bus: s.bus.clone(),
            reminders: s.reminders,
            writes_per_hour: s.writes_per_hour,
        }
    }

    async fn call(&self, ctx: &ToolContext<'_>, args: Args) -> Result<ToolOutput, ToolError> {
        let text = args.text.trim().to_owned();
        let min_lead = Duration::from_std(self.reminders.min_lead).unwrap_or(Duration::minutes(1));
        let due = due_time(&args.at, ctx.clock.now, min_lead)?;
        let id = derived_id(ctx.message_id, Self::NAME, &ctx.call.id).to_hex();
        let user = ctx.user.to_hex();
        let existing = self.pg.reminder(&id).await?;
        let stored = match existing {
            Some(r) => r,
            None => {
                if self.pg.pending_reminders(&user).await? >= MAX_PENDING {
                    return Err(ToolError::Forbidden(format!(
                        "the user already has {MAX_PENDING} pending reminders; cancel one first"
                    )));
                }
                guard_write(ctx, self.writes_per_hour, Self::NAME).await?;
                let mut fire_at = if args.exact {
                    due
                } else {
                    out_of_quiet_hours(due, ctx.clock.time_zone)
                };
                if let Some((start, end)) = ctx.clock.minor_quiet {
                    fire_at =
                        crate::safety::after_quiet_hours(fire_at, ctx.clock.time_zone, start, end);
                }
                self.pg
                    .insert_reminder(&Reminder {
                        id: id.clone(),
                        user_id: user,
                        bot_id: ctx.bot.to_hex(),
                        conversation_id: ctx.conversation.to_hex(),
                        text,
                        due_at: due,
                        fire_at,
                        state: ReminderState::Pending,
                    })
                    .await?
            }
        };
        if stored.state == ReminderState::Pending {
            let names = &self.bus.names;
            let body = json!({ "reminderId": &stored.id, "fireAt": stored.fire_at });
            self.bus
                .schedule_at(
                    names.reminder_schedule(&stored.id),
                    &names.reminder_due(&stored.id),
                    stored.fire_at,
                    &stored.id,
                    body.to_string().into(),
                )
                .await?;
        }
        Ok(ToolOutput::data(json!({
            "reminderId": stored.id,
            "text": stored.text,
            "at": stored.due_at,
            "firesAt": stored.fire_at,
            "heldForQuietHours": stored.fire_at != stored.due_at,
            "state": stored.state.as_str(),
        })))
    }
}

/// When a reminder given `at` (RFC 3339 with an offset) is due: at least `min_lead` from `now` and at
/// most `MAX_AHEAD_DAYS` ahead, else an error the model reads.
fn due_time(at: &str, now: DateTime<Utc>, min_lead: Duration) -> Result<DateTime<Utc>, ToolError> {
    let due = DateTime::parse_from_rfc3339(at.trim())
        .map_err(|e| {
            ToolError::invalid(
                "at",
                format!(
                    "not an RFC 3339 timestamp with an offset ({e}), e.g. 2026-11-28T09:00:00-08:00"
                ),
            )
        })?
        .with_timezone(&Utc);
    if due < now + min_lead {
        return Err(ToolError::invalid(
            "at",
            format!(
                "must be at least {} seconds from now (it is {})",
                min_lead.num_seconds(),
                now.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
            ),
        ));
    }
    if due > now + Duration::days(MAX_AHEAD_DAYS) {
        return Err(ToolError::invalid(
            "at",
            format!("must be at most {MAX_AHEAD_DAYS} days from now"),
        ));
    }
    Ok(due)
}

/// `due`, or 07:00 local when it falls in the quiet hours (23:00–07:00) of the time zone `tz` (IANA name;
/// none or unknown: no quiet hours).
pub(crate) fn out_of_quiet_hours(due: DateTime<Utc>, tz: Option<&str>) -> DateTime<Utc> {
    let Some(tz) = tz.and_then(|t| t.parse::<chrono_tz::Tz>().ok()) else {
        return due;
    };
    let local = due.with_timezone(&tz);
    let hour = local.hour();
    if (7..23).contains(&hour) {
        return due;
    }
    let day = if hour >= 23 {
        local.date_naive() + Duration::days(1)
    } else {
        local.date_naive()
    };
    let morning = day.and_time(NaiveTime::from_hms_opt(7, 0, 0).expect("07:00"));
    tz.from_local_datetime(&morning)
        .earliest()
        .map_or(due, |m| m.with_timezone(&Utc))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn utc(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    #[test]
    fn quiet_hours_hold_a_night_reminder_to_seven_local() {
        let la = Some("America/Los_Angeles");
        // 23:30 in Los Angeles (UTC-8) → 07:00 the next morning.
        assert_eq!(
            out_of_quiet_hours(utc("2026-11-28T07:30:00Z"), la),
            utc("2026-11-28T15:00:00Z")
        );
        // 03:00 → 07:00 the same day.
        assert_eq!(
            out_of_quiet_hours(utc("2026-11-28T11:00:00Z"), la),
            utc("2026-11-28T15:00:00Z")
        );
        // Daytime, no zone, an unknown zone: as asked.
        for (at, tz) in [
            ("2026-11-28T20:00:00Z", la),
            ("2026-11-28T07:30:00Z", None),
            ("2026-11-28T07:30:00Z", Some("Mars/Olympus")),
        ] {
            assert_eq!(out_of_quiet_hours(utc(at), tz), utc(at), "{at} {tz:?}");
        }
    }
}
