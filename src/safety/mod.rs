//! Safety for people: what every user message is screened for (a crisis: [`screen`]), what a companion
//! message may not say ([`screen::check_output`]), where a user in crisis is referred ([`lines`]), and
//! what a user's age allows ([`age`]). Pure rules and configuration; the pipeline applies them at its
//! two hooks.

pub(crate) mod age;
pub(crate) mod disclosure;
pub(crate) mod lines;
pub(crate) mod screen;

use serde::{Deserialize, Serialize};

/// What a companion message is, for the app and its moderators: written on its `dm_messages` document
/// and its completion event as they are named here.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Marks {
    /// `crisis` on a crisis referral (a fixed message, never the model's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub safety: Option<String>,
    /// The only users who may see it (a referral in a group: its user); none: everyone in the
    /// conversation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub visible_to: Option<Vec<String>>,
    /// It carries the character's line that it is an AI, not a human.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ai_disclosure: bool,
    /// It carries a break reminder (a minor after hours of continuing interaction).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub break_reminder: bool,
}

impl Marks {
    /// Only some may see it: kept out of the conversation's shared history and preview.
    pub(crate) fn is_private(&self) -> bool {
        self.visible_to.is_some()
    }
}

/// The protocol's settings and data, loaded once per process.
#[derive(Clone, Debug)]
pub(crate) struct Safety {
    pub(crate) config: crate::config::SafetyConfig,
    /// Crisis lines and referral texts.
    pub(crate) lines: lines::CrisisLines,
    pub(crate) age_fields: age::AgeFields,
}

impl Safety {
    /// The configured crisis lines (the built-in ones without a file), checked.
    pub(crate) fn load(config: &crate::config::SafetyConfig) -> Result<Self, lines::LinesError> {
        let lines = match config.crisis_lines_file.trim() {
            "" => lines::CrisisLines::builtin(),
            path => lines::CrisisLines::load(std::path::Path::new(path))?,
        };
        Ok(Self {
            config: config.clone(),
            lines,
            age_fields: age::AgeFields {
                is_minor: config.field_is_minor.clone(),
                age_bracket: config.field_age_bracket.clone(),
                birthdate: config.field_birthdate.clone(),
            },
        })
    }

    /// What the user document says of its user's age (unknown: as configured).
    pub(crate) fn age(
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
    pub(crate) fn rhythm(&self) -> disclosure::Rhythm {
        let secs = |s: u64| chrono::Duration::seconds(s.min(i64::MAX as u64) as i64);
        disclosure::Rhythm {
            every: secs(self.config.disclosure_every_secs.max(1)),
            gap: secs(self.config.disclosure_gap_secs),
        }
    }

    /// Whether `local` is in a minor's quiet hours.
    pub(crate) fn quiet(&self, local: chrono::NaiveTime) -> bool {
        age::in_quiet_hours(
            local,
            self.config.minor_quiet_start,
            self.config.minor_quiet_end,
        )
    }
}
