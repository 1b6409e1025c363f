//! What a user's age allows: the age class read from the user's profile, and the quiet hours (in the
//! user's own time zone) during which a companion does not reach out to a minor.

use bson::{Bson, Document};
use chrono::{
    DateTime, Datelike, Duration, Months, NaiveDate, NaiveDateTime, NaiveTime, TimeZone, Utc,
};
use chrono_tz::Tz;

/// What a user's age allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Age {
    /// Younger than 13: the strictest rules apply. Named like the `ageBracket` value.
    #[serde(rename = "under_13")]
    Under13,
    /// 13 to 17.
    Minor,
    /// 18 or older.
    Adult,
}

impl Age {
    /// Whether the rules for minors apply (under 13 included).
    pub fn is_minor(self) -> bool {
        matches!(self, Self::Under13 | Self::Minor)
    }
}

/// Where the age came from, so the logs show which profile field decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AgeSource {
    IsMinor,
    AgeBracket,
    Birthdate,
    /// No usable field: the configured default applied.
    Unknown,
}

/// The users-document fields the age is read from (configurable by the worker).
#[derive(Clone, Debug)]
pub(crate) struct AgeFields {
    /// A boolean set by the app.
    pub(crate) is_minor: String,
    /// One of "under_13", "13_15", "16_17", "adult".
    pub(crate) age_bracket: String,
    /// A BSON date, or a string "YYYY-MM-DD" or RFC 3339.
    pub(crate) birthdate: String,
}

impl Default for AgeFields {
    fn default() -> Self {
        Self {
            is_minor: "isMinor".into(),
            age_bracket: "ageBracket".into(),
            birthdate: "birthdate".into(),
        }
    }
}

/// The age class of a user, and which field decided it.
///
/// Reads, in order: `isMinor` (boolean; true → Minor, but an under-13 `ageBracket` or `birthdate` still
/// makes it Under13; false → Adult), `ageBracket` ("under_13" → Under13, "13_15" | "16_17" → Minor,
/// "adult" → Adult; anything else is ignored), `birthdate` (age in whole years on `today`: < 13
/// Under13, < 18 Minor, else Adult; a birthdate in the future or more than 120 years ago is ignored).
/// None of them usable → Unknown, and Minor when `unknown_is_minor`, else Adult.
pub(crate) fn age_of(
    user: Option<&Document>,
    fields: &AgeFields,
    unknown_is_minor: bool,
    today: NaiveDate,
) -> (Age, AgeSource) {
    let unknown = if unknown_is_minor {
        Age::Minor
    } else {
        Age::Adult
    };
    let Some(user) = user else {
        return (unknown, AgeSource::Unknown);
    };
    let bracket = user.get(&fields.age_bracket).and_then(bracket_age);
    let birthdate = user
        .get(&fields.birthdate)
        .and_then(|b| birthdate_age(b, today));
    match user.get(&fields.is_minor) {
        Some(Bson::Boolean(true)) => {
            if bracket == Some(Age::Under13) {
                (Age::Under13, AgeSource::AgeBracket)
            } else if birthdate == Some(Age::Under13) {
                (Age::Under13, AgeSource::Birthdate)
            } else {
                (Age::Minor, AgeSource::IsMinor)
            }
        }
        Some(Bson::Boolean(false)) => (Age::Adult, AgeSource::IsMinor),
        _ => bracket
            .map(|age| (age, AgeSource::AgeBracket))
            .or(birthdate.map(|age| (age, AgeSource::Birthdate)))
            .unwrap_or((unknown, AgeSource::Unknown)),
    }
}

fn bracket_age(value: &Bson) -> Option<Age> {
    match value.as_str()?.trim().to_ascii_lowercase().as_str() {
        "under_13" => Some(Age::Under13),
        "13_15" | "16_17" => Some(Age::Minor),
        "adult" => Some(Age::Adult),
        _ => None,
    }
}

fn birthdate_age(value: &Bson, today: NaiveDate) -> Option<Age> {
    let born = match value {
        Bson::DateTime(dt) => dt.to_chrono().date_naive(),
        Bson::String(s) => {
            let s = s.trim();
            NaiveDate::parse_from_str(s, "%Y-%m-%d").ok().or_else(|| {
                DateTime::parse_from_rfc3339(s)
                    .ok()
                    .map(|dt| dt.date_naive())
            })?
        }
        _ => return None,
    };
    if born > today || Some(born) < today.checked_sub_months(Months::new(120 * 12)) {
        return None;
    }
    let had_birthday = (today.month(), today.day()) >= (born.month(), born.day());
    let years = today.year() - born.year() - i32::from(!had_birthday);
    Some(if years < 13 {
        Age::Under13
    } else if years < 18 {
        Age::Minor
    } else {
        Age::Adult
    })
}

/// Whether `local` (a user's local time of day) is in the quiet hours from `start` (inclusive) to `end`
/// (exclusive), which may wrap midnight (22:00–07:00). Equal `start` and `end` mean no quiet hours.
pub(crate) fn in_quiet_hours(local: NaiveTime, start: NaiveTime, end: NaiveTime) -> bool {
    if start <= end {
        start <= local && local < end
    } else {
        local >= start || local < end
    }
}

fn zone(tz: Option<&str>) -> Tz {
    tz.and_then(|name| name.trim().parse().ok())
        .unwrap_or(Tz::UTC)
}

/// The user's local date and time at `now` in IANA zone `tz` (UTC when None or unknown).
pub fn local(now: DateTime<Utc>, tz: Option<&str>) -> NaiveDateTime {
    now.with_timezone(&zone(tz)).naive_local()
}

/// The first instant at or after `now` outside the quiet hours in zone `tz` (UTC when None or
/// unknown): `now` itself when it is not quiet, else the end of the quiet hours in local time.
pub fn after_quiet_hours(
    now: DateTime<Utc>,
    tz: Option<&str>,
    start: NaiveTime,
    end: NaiveTime,
) -> DateTime<Utc> {
    let zone = zone(tz);
    let here = now.with_timezone(&zone).naive_local();
    if !in_quiet_hours(here.time(), start, end) {
        return now;
    }
    let end_day = if start > end && here.time() >= start {
        here.date() + Duration::days(1)
    } else {
        here.date()
    };
    let mut wall = end_day.and_time(end);
    // A wall time skipped by a clock change (spring forward) does not exist: the quiet hours end
    // at the first wall time after the gap. Gaps are at most a day long.
    for _ in 0..=48 * 60 {
        let found = zone
            .from_local_datetime(&wall)
            .map(|t| t.with_timezone(&Utc));
        // When the wall time happens twice (fall back), the first one not before `now`.
        match (found.earliest(), found.latest()) {
            (Some(first), _) if first >= now => return first,
            (_, Some(second)) if second >= now => return second,
            (Some(_), _) => return now,
            _ => wall += Duration::minutes(1),
        }
    }
    now
}

#[cfg(test)]
mod tests {
    use bson::doc;

    use super::*;

    fn today() -> NaiveDate {
        NaiveDate::from_ymd_opt(2026, 6, 15).unwrap()
    }

    fn age(user: &Document) -> (Age, AgeSource) {
        age_of(Some(user), &AgeFields::default(), true, today())
    }

    fn t(h: u32, m: u32) -> NaiveTime {
        NaiveTime::from_hms_opt(h, m, 0).unwrap()
    }

    #[test]
    fn is_minor_flag() {
        assert_eq!(
            age(&doc! {"isMinor": true}),
            (Age::Minor, AgeSource::IsMinor)
        );
        assert_eq!(
            age(&doc! {"isMinor": false, "ageBracket": "13_15"}),
            (Age::Adult, AgeSource::IsMinor)
        );
        assert_eq!(
            age(&doc! {"isMinor": "yes"}),
            (Age::Minor, AgeSource::Unknown)
        );
    }

    #[test]
    fn under_13_overrides_is_minor_true() {
        let bracket = doc! {"isMinor": true, "ageBracket": "under_13"};
        assert_eq!(age(&bracket), (Age::Under13, AgeSource::AgeBracket));
        let born = doc! {"isMinor": true, "birthdate": "2016-01-01"};
        assert_eq!(age(&born), (Age::Under13, AgeSource::Birthdate));
        let teen = doc! {"isMinor": true, "ageBracket": "16_17"};
        assert_eq!(age(&teen), (Age::Minor, AgeSource::IsMinor));
    }

    #[test]
    fn age_brackets() {
        for (bracket, expected) in [
            ("under_13", Age::Under13),
            ("13_15", Age::Minor),
            ("16_17", Age::Minor),
            ("adult", Age::Adult),
        ] {
            assert_eq!(
                age(&doc! {"ageBracket": bracket}),
                (expected, AgeSource::AgeBracket)
            );
        }
        let ignored = doc! {"ageBracket": "teen", "birthdate": "2000-01-01"};
        assert_eq!(age(&ignored), (Age::Adult, AgeSource::Birthdate));
    }

    #[test]
    fn birthdate_strings() {
        for (born, expected) in [
            ("2013-06-16", Age::Under13),
            ("2013-06-15", Age::Minor),
            ("2008-06-16", Age::Minor),
            ("2008-06-15", Age::Adult),
            ("2010-03-01T12:00:00+02:00", Age::Minor),
            ("1990-12-31T23:00:00Z", Age::Adult),
        ] {
            assert_eq!(
                age(&doc! {"birthdate": born}),
                (expected, AgeSource::Birthdate),
                "{born}"
            );
        }
    }

    #[test]
    fn birthdate_bson_dates() {
        let at = |y, m, d| {
            let dt = NaiveDate::from_ymd_opt(y, m, d)
                .unwrap()
                .and_time(t(0, 0))
                .and_utc();
            bson::DateTime::from_chrono(dt)
        };
        assert_eq!(
            age(&doc! {"birthdate": at(2015, 1, 1)}),
            (Age::Under13, AgeSource::Birthdate)
        );
        assert_eq!(
            age(&doc! {"birthdate": at(2011, 1, 1)}),
            (Age::Minor, AgeSource::Birthdate)
        );
        assert_eq!(
            age(&doc! {"birthdate": at(1980, 1, 1)}),
            (Age::Adult, AgeSource::Birthdate)
        );
    }

    #[test]
    fn implausible_birthdates_are_ignored() {
        for born in ["2030-01-01", "1900-01-01", "15/06/2010", "not a date"] {
            assert_eq!(
                age(&doc! {"birthdate": born}),
                (Age::Minor, AgeSource::Unknown),
                "{born}"
            );
        }
    }

    #[test]
    fn unknown_both_ways() {
        let empty = doc! {};
        let fields = AgeFields::default();
        assert_eq!(
            age_of(Some(&empty), &fields, true, today()),
            (Age::Minor, AgeSource::Unknown)
        );
        assert_eq!(
            age_of(Some(&empty), &fields, false, today()),
            (Age::Adult, AgeSource::Unknown)
        );
        assert_eq!(
            age_of(None, &fields, true, today()),
            (Age::Minor, AgeSource::Unknown)
        );
        assert_eq!(
            age_of(None, &fields, false, today()),
            (Age::Adult, AgeSource::Unknown)
        );
    }

    #[test]
    fn configured_field_names() {
        let fields = AgeFields {
            is_minor: "minor".into(),
            age_bracket: "bracket".into(),
            birthdate: "dob".into(),
        };
        let user = doc! {"isMinor": false, "dob": "2016-01-01"};
        assert_eq!(
            age_of(Some(&user), &fields, false, today()),
            (Age::Under13, AgeSource::Birthdate)
        );
    }

    impl Age {
        fn as_str(self) -> &'static str {
            match self {
                Self::Under13 => "under_13",
                Self::Minor => "minor",
                Self::Adult => "adult",
            }
        }
    }

    #[test]
    fn age_names_and_minority() {
        assert!(Age::Under13.is_minor() && Age::Minor.is_minor() && !Age::Adult.is_minor());
        for a in [Age::Under13, Age::Minor, Age::Adult] {
            assert_eq!(serde_json::to_value(a).unwrap(), a.as_str());
        }
    }

    #[test]
    fn quiet_hours_wrapping_midnight() {
        let (start, end) = (t(22, 0), t(7, 0));
        assert!(in_quiet_hours(t(22, 0), start, end));
        assert!(in_quiet_hours(t(23, 59), start, end));
        assert!(in_quiet_hours(t(0, 0), start, end));
        assert!(in_quiet_hours(t(6, 59), start, end));
        assert!(!in_quiet_hours(t(7, 0), start, end));
        assert!(!in_quiet_hours(t(12, 0), start, end));
        assert!(!in_quiet_hours(t(21, 59), start, end));
    }

    #[test]
    fn quiet_hours_not_wrapping() {
        let (start, end) = (t(1, 0), t(6, 0));
        assert!(in_quiet_hours(t(1, 0), start, end));
        assert!(in_quiet_hours(t(5, 59), start, end));
        assert!(!in_quiet_hours(t(6, 0), start, end));
        assert!(!in_quiet_hours(t(0, 30), start, end));
        assert!(!in_quiet_hours(t(23, 0), start, end));
        assert!(!in_quiet_hours(t(3, 0), t(3, 0), t(3, 0)));
    }

    #[test]
    fn local_time_in_zone() {
        let now = Utc.with_ymd_and_hms(2026, 1, 15, 12, 0, 0).unwrap();
        assert_eq!(local(now, Some("Asia/Tokyo")).time(), t(21, 0));
        assert_eq!(local(now, Some("Nowhere/Else")).time(), t(12, 0));
        assert_eq!(local(now, None), now.naive_utc());
    }

    #[test]
    fn after_quiet_hours_in_los_angeles() {
        let la = Some("America/Los_Angeles");
        let (start, end) = (t(22, 0), t(7, 0));
        // 23:30 PDT on June 15 → 07:00 PDT on June 16 (14:00 UTC).
        let now = Utc.with_ymd_and_hms(2026, 6, 16, 6, 30, 0).unwrap();
        assert_eq!(local(now, la).time(), t(23, 30));
        let next = after_quiet_hours(now, la, start, end);
        assert_eq!(next, Utc.with_ymd_and_hms(2026, 6, 16, 14, 0, 0).unwrap());
        assert_eq!(
            local(next, la),
            NaiveDate::from_ymd_opt(2026, 6, 16)
                .unwrap()
                .and_time(t(7, 0))
        );
        // 03:00 local (after midnight) → 07:00 the same day.
        let early = Utc.with_ymd_and_hms(2026, 6, 16, 10, 0, 0).unwrap();
        assert_eq!(after_quiet_hours(early, la, start, end), next);
        let noon = Utc.with_ymd_and_hms(2026, 6, 16, 19, 0, 0).unwrap();
        assert_eq!(after_quiet_hours(noon, la, start, end), noon);
    }

    #[test]
    fn after_quiet_hours_across_clock_changes() {
        let la = Some("America/Los_Angeles");
        // Spring forward on 2026-03-08: 02:00–03:00 local does not exist; quiet 22:00–02:30 ends at 03:00 PDT.
        let now = Utc.with_ymd_and_hms(2026, 3, 8, 8, 0, 0).unwrap();
        let next = after_quiet_hours(now, la, t(22, 0), t(2, 30));
        assert_eq!(next, Utc.with_ymd_and_hms(2026, 3, 8, 10, 0, 0).unwrap());
        // Fall back on 2026-11-01: 01:30 happens twice; from 00:30 PDT the first one (08:30 UTC) is next.
        let now = Utc.with_ymd_and_hms(2026, 11, 1, 7, 30, 0).unwrap();
        let next = after_quiet_hours(now, la, t(22, 0), t(1, 30));
        assert_eq!(next, Utc.with_ymd_and_hms(2026, 11, 1, 8, 30, 0).unwrap());
    }
}
