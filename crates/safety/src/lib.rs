//! Safety for people: what every user message is screened for (a crisis: [`screen`]), what a companion
//! message may not say ([`screen::check_output`]), where a user in crisis is referred ([`lines`]), and
//! what a user's age allows ([`age`]). Pure rules and configuration; the pipeline applies them at its
//! two hooks.

mod age;
mod detect;
mod disclosure;
/// The learned layer's model files: the dev tooling trains and writes them, the screen reads them.
pub mod learned;
mod lines;
mod screen;

pub use age::{Age, after_quiet_hours, local};
pub use detect::{CrisisScreen, Decision, FirstCheck, Layer};
pub use disclosure::{Due, Rhythm, due};
pub use lines::{CardLine, CrisisLine, CrisisLines, Kind as LineKind, LinesError, Referral};
pub use screen::{Blocked, Category, Flag, language, screen};

// The screen's decisions with a model given, and the output rules alone, for the tests and the dev
// tooling that evaluate a model before it ships.
#[cfg(any(test, feature = "testing"))]
pub use {
    detect::{check_reply_vector_with, check_reply_with, decide_with, first_check_with},
    screen::check_output,
};

use companion_core::{config, metrics};

use crate::metrics::{Metric, Metrics};

/// Crisis lines (with the directory) not checked within `COMPANION_CRISIS_LINES_REVIEW_DAYS`, as of the
/// worker's start.
pub(crate) const LINES_STALE: Metric = Metric::new(
    "companion_crisis_lines_stale",
    "Crisis lines (with the directory) not checked within `COMPANION_CRISIS_LINES_REVIEW_DAYS`, as of the worker's start",
);

/// The protocol's settings and data, loaded once per process.
#[derive(Clone, Debug)]
pub struct Safety {
    pub config: crate::config::SafetyConfig,
    /// Crisis lines and referral texts.
    pub lines: lines::CrisisLines,
    /// The crisis decision and the output check, as the settings have them
    /// ([`detect::CrisisScreen::reading`] once the encoder is known).
    pub screen: detect::CrisisScreen,
    pub(crate) age_fields: age::AgeFields,
}

impl Safety {
    /// The configured crisis lines (the built-in ones without a file), checked.
    pub fn load(config: &crate::config::SafetyConfig) -> Result<Self, lines::LinesError> {
        let lines = match config.crisis_lines_file.trim() {
            "" => lines::CrisisLines::builtin(),
            path => lines::CrisisLines::load(std::path::Path::new(path))?,
        };
        Ok(Self {
            config: config.clone(),
            lines,
            screen: detect::CrisisScreen::new(config.screen_learned),
            age_fields: age::AgeFields {
                is_minor: config.field_is_minor.clone(),
                age_bracket: config.field_age_bracket.clone(),
                birthdate: config.field_birthdate.clone(),
            },
        })
    }

    /// Warns of every crisis line not checked within the review interval as of `today`, and reports
    /// how many there are in [`LINES_STALE`]; returns that number. Run at start-up.
    pub fn review_lines(&self, today: chrono::NaiveDate, metrics: &Metrics) -> usize {
        let days = self.config.crisis_lines_review_days;
        let stale = self.lines.stale(today, days);
        for s in &stale {
            tracing::warn!(
                country = s.whose,
                line = s.name,
                checked = %s.checked,
                days_ago = s.days,
                review_days = days,
                "a crisis line is due for review: call it, then update its source and checked date"
            );
        }
        metrics.set_level(&LINES_STALE, &[], stale.len() as i64);
        stale.len()
    }

    /// What the user document says of its user's age (unknown: as configured).
    pub fn age(
        &self,
        user: Option<&bson::Document>,
        now: chrono::DateTime<chrono::Utc>,
    ) -> age::Age {
        let today = now.date_naive();
        age::age_of(
            user,
            &self.age_fields,
            self.config.unknown_age_is_minor,
            today,
        )
        .0
    }

    /// The disclosure rule's intervals.
    pub fn rhythm(&self) -> disclosure::Rhythm {
        let secs = |s: u64| chrono::Duration::seconds(s.min(i64::MAX as u64) as i64);
        disclosure::Rhythm {
            every: secs(self.config.disclosure_every_secs.max(1)),
            gap: secs(self.config.disclosure_gap_secs),
        }
    }

    /// Whether `local` is in a minor's quiet hours.
    pub fn quiet(&self, local: chrono::NaiveTime) -> bool {
        age::in_quiet_hours(
            local,
            self.config.minor_quiet_start,
            self.config.minor_quiet_end,
        )
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    /// What is logged while `f` runs, as text.
    fn logged(f: impl FnOnce()) -> String {
        #[derive(Clone, Default)]
        struct Buf(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Buf {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let buf = Buf::default();
        let writer = buf.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        tracing::subscriber::with_default(subscriber, f);
        String::from_utf8(buf.0.lock().unwrap().clone()).unwrap()
    }

    fn date(s: &str) -> chrono::NaiveDate {
        chrono::NaiveDate::parse_from_str(s, "%Y-%m-%d").unwrap()
    }

    /// The protocol with the crisis lines of `file` (the built-in ones when None).
    fn safety(file: Option<&str>) -> (Safety, Option<std::path::PathBuf>) {
        let mut config = crate::config::from_env::<crate::config::SafetyConfig>().unwrap();
        config.crisis_lines_review_days = 365;
        let path = file.map(|contents| {
            let path = std::env::temp_dir().join(format!(
                "crisis-stale-{}-{}.json",
                std::process::id(),
                fastrand::u64(..)
            ));
            std::fs::write(&path, contents).unwrap();
            path
        });
        config.crisis_lines_file = path
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        (Safety::load(&config).unwrap(), path)
    }

    #[test]
    fn a_line_not_checked_within_the_interval_warns_and_is_counted_on_a_fixed_clock() {
        // The clock is fixed: the shipped lines were checked on 2026-11-26.
        let today = date("2026-12-01");
        let (fresh, _) = safety(None);
        let metrics = Metrics::default();
        let log = logged(|| assert_eq!(fresh.review_lines(today, &metrics), 0));
        assert!(!log.contains("due for review"), "{log}");
        let stale = |m: &Metrics| {
            let text = m.render();
            let line = text.lines().find_map(|l| l.strip_prefix(LINES_STALE.name));
            line.and_then(|v| v.trim().parse::<f64>().ok())
        };
        assert_eq!(stale(&metrics), Some(0.0), "{}", metrics.render());

        let mut v: serde_json::Value = serde_json::from_str(include_str!("crisis.json")).unwrap();
        v["countries"]["GB"][1]["checked"] = "2025-11-30".into();
        let (old, path) = safety(Some(&v.to_string()));
        std::fs::remove_file(path.unwrap()).unwrap();
        let metrics = Metrics::default();
        let log = logged(|| assert_eq!(old.review_lines(today, &metrics), 1));
        let warning = log
            .lines()
            .find(|l| l.contains("due for review"))
            .unwrap_or_else(|| panic!("a warning: {log}"));
        assert!(warning.contains("WARN"), "{warning}");
        for what in [
            "country=\"GB\"",
            "Childline",
            "checked=2025-11-30",
            "days_ago=366",
        ] {
            assert!(warning.contains(what), "{what}: {warning}");
        }
        assert_eq!(log.matches("due for review").count(), 1, "{log}");
        assert_eq!(stale(&metrics), Some(1.0), "{}", metrics.render());
        // A year to the day is still within the interval.
        let metrics = Metrics::default();
        let log = logged(|| assert_eq!(old.review_lines(date("2026-11-30"), &metrics), 0));
        assert!(!log.contains("due for review"), "{log}");
    }
}
