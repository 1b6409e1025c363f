//! When a companion must say it is an AI: on the first message it sends a user in the user's local day,
//! and again once a continuing interaction (no gap longer than a configured one) has gone on for a
//! configured time since the last disclosure or since it began. For a minor, the second kind also carries
//! a break reminder.

use chrono::{DateTime, Duration, Utc};

/// Why a message must carry the disclosure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Due {
    /// Nothing is owed.
    No,
    /// The companion's first message to the user in the user's day.
    FirstToday,
    /// The interaction has gone on, without a long gap, for the whole interval.
    Continuing,
}

/// The two intervals the rule reads.
#[derive(Clone, Copy, Debug)]
pub struct Rhythm {
    /// Disclose again after this much continuing interaction (3 hours).
    pub every: Duration,
    /// A gap longer than this ends an interaction (30 minutes).
    pub gap: Duration,
}

/// Where the interaction that goes on at `now` began: walking back from `now` over the message times
/// (newest first) while no two are further apart than `gap`.
pub(crate) fn began(
    activity: &[DateTime<Utc>],
    now: DateTime<Utc>,
    gap: Duration,
) -> DateTime<Utc> {
    let mut start = now;
    for &t in activity {
        if start - t > gap {
            break;
        }
        start = start.min(t);
    }
    start
}

/// Whether the message a companion sends at `now` must carry the disclosure, given the last one it sent
/// (`last`) and the interaction's message times since at least `now - 2 × every` (newest first). The
/// day is the user's local day in time zone `tz` (UTC without one).
pub fn due(
    rhythm: Rhythm,
    last: Option<DateTime<Utc>>,
    activity: &[DateTime<Utc>],
    now: DateTime<Utc>,
    tz: Option<&str>,
) -> Due {
    let Some(last) = last else {
        return Due::FirstToday;
    };
    let day = |t: DateTime<Utc>| super::age::local(t, tz).date();
    if day(last) != day(now) {
        return Due::FirstToday;
    }
    let since = last.max(began(activity, now, rhythm.gap));
    if now - since >= rhythm.every {
        Due::Continuing
    } else {
        Due::No
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(h: u32, m: u32) -> DateTime<Utc> {
        use chrono::TimeZone;
        Utc.with_ymd_and_hms(2026, 11, 25, h, m, 0).unwrap()
    }

    const R: Rhythm = Rhythm {
        every: Duration::hours(3),
        gap: Duration::minutes(30),
    };

    /// Messages every 10 minutes from `from` up to (not including) `to`, newest first.
    fn every_10(from: DateTime<Utc>, to: DateTime<Utc>) -> Vec<DateTime<Utc>> {
        let mut out = Vec::new();
        let mut t = from;
        while t < to {
            out.push(t);
            t += Duration::minutes(10);
        }
        out.reverse();
        out
    }

    #[test]
    fn the_first_message_ever_and_of_a_new_day_disclose() {
        assert_eq!(due(R, None, &[], at(12, 0), None), Due::FirstToday);
        let yesterday = at(12, 0) - Duration::days(1);
        assert_eq!(
            due(R, Some(yesterday), &[], at(12, 0), None),
            Due::FirstToday
        );
    }

    #[test]
    fn the_day_is_the_user_s_local_day() {
        // 06:00 UTC on the 25th is still the 24th in Los Angeles (22:00), like 01:00 UTC.
        let tz = Some("America/Los_Angeles");
        assert_eq!(due(R, Some(at(1, 0)), &[], at(6, 0), tz), Due::No);
        assert_eq!(due(R, Some(at(1, 0)), &[], at(9, 0), tz), Due::FirstToday);
    }

    #[test]
    fn three_hours_of_continuing_interaction_disclose_again_and_not_before() {
        let last = at(9, 0);
        let talk = every_10(at(9, 0), at(11, 50));
        assert_eq!(due(R, Some(last), &talk, at(11, 50), None), Due::No);
        let talk = every_10(at(9, 0), at(12, 0));
        assert_eq!(due(R, Some(last), &talk, at(12, 0), None), Due::Continuing);
    }

    #[test]
    fn a_long_gap_starts_a_new_interaction() {
        // Disclosed at 9:00, talked until 9:30, came back at 11:00 and talked on: three hours count
        // from 11:00.
        let mut talk = every_10(at(11, 0), at(13, 50));
        talk.extend(every_10(at(9, 0), at(9, 40)));
        assert_eq!(due(R, Some(at(9, 0)), &talk, at(13, 50), None), Due::No);
        let mut talk = every_10(at(11, 0), at(14, 0));
        talk.extend(every_10(at(9, 0), at(9, 40)));
        assert_eq!(
            due(R, Some(at(9, 0)), &talk, at(14, 0), None),
            Due::Continuing
        );
    }

    #[test]
    fn where_an_interaction_began() {
        let talk = vec![at(10, 50), at(10, 30), at(9, 0)];
        assert_eq!(began(&talk, at(11, 0), Duration::minutes(30)), at(10, 30));
        assert_eq!(began(&talk, at(12, 0), Duration::minutes(30)), at(12, 0));
    }
}
