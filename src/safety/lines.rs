//! Where a user in crisis is referred: the fixed, reviewed referral message in the user's language and
//! the crisis lines of the user's country.
//!
//! The referral is never written by the model. The built-in configuration (`crisis.json`, embedded) can
//! be replaced by a file of the same shape; either is validated before use, so a typo cannot leave a
//! user in crisis with an empty message.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

/// The configuration shipped with the worker, used when no override file is configured.
const BUILTIN: &str = include_str!("crisis.json");

/// One service a user can reach: at least one of `phone`, `text` or `url` is set.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Line {
    /// What the user will recognise, in the country's language where that helps.
    pub(crate) name: String,
    /// The number to call, as written locally.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) phone: Option<String>,
    /// Where to text: a number, or "KEYWORD to NUMBER" when the service needs a first word.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) text: Option<String>,
    /// The service's web site or chat.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) url: Option<String>,
}

/// The referral texts and the lines, per country, as loaded and validated.
#[derive(Clone, Debug, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct CrisisLines {
    /// The referral message by language (ISO 639-1, lower case); "en" is required as the fallback.
    pub(crate) referral: BTreeMap<String, String>,
    /// The lines for a user whose country is unknown or not configured.
    pub(crate) fallback_lines: Vec<Line>,
    /// The lines by country (ISO 3166-1 alpha-2, upper case).
    pub(crate) countries: BTreeMap<String, Vec<Line>>,
    /// Who checked the lines, when, and what: kept with the data so a stale review is visible.
    pub(crate) reviewed: String,
}

/// Why a crisis-lines file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum LinesError {
    #[error("cannot read crisis lines {}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot parse crisis lines {}: {source}", path.display())]
    Parse {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("invalid crisis lines: {0}")]
    Invalid(String),
}

impl CrisisLines {
    /// The configuration shipped with the worker.
    pub(crate) fn builtin() -> Self {
        Self::parse(BUILTIN, Path::new("crisis.json (built in)"))
            .expect("the built-in crisis.json is valid (checked by a unit test)")
    }

    /// A configuration file of the same shape as the built-in one, validated.
    pub(crate) fn load(path: &Path) -> Result<Self, LinesError> {
        let text = std::fs::read_to_string(path).map_err(|source| LinesError::Io {
            path: path.to_owned(),
            source,
        })?;
        let lines = Self::parse(&text, path)?;
        tracing::info!(path = %path.display(), reviewed = %lines.reviewed, "crisis lines loaded");
        Ok(lines)
    }

    fn parse(text: &str, path: &Path) -> Result<Self, LinesError> {
        let lines: Self = serde_json::from_str(text).map_err(|source| LinesError::Parse {
            path: path.to_owned(),
            source,
        })?;
        lines.validate()?;
        Ok(lines)
    }

    fn validate(&self) -> Result<(), LinesError> {
        let invalid = |why: String| Err(LinesError::Invalid(why));
        if self.referral.get("en").is_none_or(|t| t.trim().is_empty()) {
            return invalid("no \"en\" referral".into());
        }
        if let Some((lang, _)) = self.referral.iter().find(|(_, t)| t.trim().is_empty()) {
            return invalid(format!("empty referral for {lang:?}"));
        }
        if self.fallback_lines.is_empty() {
            return invalid("no fallback lines".into());
        }
        validate_lines("fallbackLines", &self.fallback_lines)?;
        for (code, lines) in &self.countries {
            if code.len() != 2 || !code.bytes().all(|b| b.is_ascii_uppercase()) {
                return invalid(format!("country {code:?} is not two upper-case letters"));
            }
            if lines.is_empty() {
                return invalid(format!("country {code} has no lines"));
            }
            validate_lines(code, lines)?;
        }
        Ok(())
    }

    /// The referral message in `lang` (a language tag such as "pt-BR" or "ja"; only the primary subtag
    /// counts), or in English when the language has none. Returns the language used and the text.
    pub(crate) fn referral(&self, lang: Option<&str>) -> (&str, &str) {
        let primary = lang
            .and_then(|l| l.split(['-', '_']).next())
            .map(|l| l.trim().to_ascii_lowercase());
        primary
            .and_then(|l| self.referral.get_key_value(l.as_str()))
            .or_else(|| self.referral.get_key_value("en"))
            .map(|(lang, text)| (lang.as_str(), text.as_str()))
            .expect("validated: an \"en\" referral exists")
    }

    /// The lines for a user: by `country` (ISO 3166-1 alpha-2, any case) when the config has it, else by
    /// the country of `time_zone` (IANA), else the fallback lines. Returns the country used (None for the
    /// fallback).
    pub(crate) fn for_user(
        &self,
        country: Option<&str>,
        time_zone: Option<&str>,
    ) -> (Option<String>, &[Line]) {
        let by_country = country.map(|c| match c.trim().to_ascii_uppercase().as_str() {
            // Not ISO, but what many people (and some profiles) write for the United Kingdom.
            "UK" => "GB".to_owned(),
            code => code.to_owned(),
        });
        let by_zone = time_zone.and_then(country_of_time_zone).map(str::to_owned);
        by_country
            .into_iter()
            .chain(by_zone)
            .find_map(|code| self.countries.get_key_value(&code))
            .map_or((None, self.fallback_lines.as_slice()), |(code, lines)| {
                (Some(code.clone()), lines.as_slice())
            })
    }
}

fn validate_lines(whose: &str, lines: &[Line]) -> Result<(), LinesError> {
    let set = |v: &Option<String>| v.as_deref().is_some_and(|s| !s.trim().is_empty());
    for line in lines {
        if line.name.trim().is_empty() {
            return Err(LinesError::Invalid(format!("{whose}: a line has no name")));
        }
        if !set(&line.phone) && !set(&line.text) && !set(&line.url) {
            return Err(LinesError::Invalid(format!(
                "{whose}: {:?} has neither phone, text nor url",
                line.name
            )));
        }
    }
    Ok(())
}

/// Whole regions whose zones all belong to one country.
const ZONE_PREFIXES: &[(&str, &str)] = &[
    ("America/Argentina/", "AR"),
    ("America/Indiana/", "US"),
    ("America/Kentucky/", "US"),
    ("America/North_Dakota/", "US"),
    ("Australia/", "AU"),
    ("Brazil/", "BR"),
    ("Canada/", "CA"),
    ("US/", "US"),
];

/// The common zones by name, including the old names (links) that devices still report.
const ZONES: &[(&str, &str)] = &[
    ("America/New_York", "US"),
    ("America/Chicago", "US"),
    ("America/Denver", "US"),
    ("America/Phoenix", "US"),
    ("America/Los_Angeles", "US"),
    ("America/Anchorage", "US"),
    ("America/Juneau", "US"),
    ("America/Sitka", "US"),
    ("America/Nome", "US"),
    ("America/Yakutat", "US"),
    ("America/Metlakatla", "US"),
    ("America/Adak", "US"),
    ("America/Boise", "US"),
    ("America/Detroit", "US"),
    ("America/Menominee", "US"),
    ("America/Indianapolis", "US"),
    ("America/Louisville", "US"),
    ("Pacific/Honolulu", "US"),
    ("America/Puerto_Rico", "PR"),
    ("America/Toronto", "CA"),
    ("America/Montreal", "CA"),
    ("America/Vancouver", "CA"),
    ("America/Edmonton", "CA"),
    ("America/Calgary", "CA"),
    ("America/Winnipeg", "CA"),
    ("America/Regina", "CA"),
    ("America/Swift_Current", "CA"),
    ("America/Halifax", "CA"),
    ("America/Moncton", "CA"),
    ("America/Glace_Bay", "CA"),
    ("America/Goose_Bay", "CA"),
    ("America/St_Johns", "CA"),
    ("America/Whitehorse", "CA"),
    ("America/Dawson", "CA"),
    ("America/Dawson_Creek", "CA"),
    ("America/Fort_Nelson", "CA"),
    ("America/Creston", "CA"),
    ("America/Yellowknife", "CA"),
    ("America/Inuvik", "CA"),
    ("America/Iqaluit", "CA"),
    ("America/Rankin_Inlet", "CA"),
    ("America/Resolute", "CA"),
    ("America/Cambridge_Bay", "CA"),
    ("America/Thunder_Bay", "CA"),
    ("America/Nipigon", "CA"),
    ("America/Rainy_River", "CA"),
    ("America/Atikokan", "CA"),
    ("America/Blanc-Sablon", "CA"),
    ("America/Mexico_City", "MX"),
    ("America/Cancun", "MX"),
    ("America/Merida", "MX"),
    ("America/Monterrey", "MX"),
    ("America/Matamoros", "MX"),
    ("America/Chihuahua", "MX"),
    ("America/Ciudad_Juarez", "MX"),
    ("America/Ojinaga", "MX"),
    ("America/Mazatlan", "MX"),
    ("America/Bahia_Banderas", "MX"),
    ("America/Hermosillo", "MX"),
    ("America/Tijuana", "MX"),
    ("America/Buenos_Aires", "AR"),
    ("America/Cordoba", "AR"),
    ("America/Mendoza", "AR"),
    ("America/Santiago", "CL"),
    ("America/Punta_Arenas", "CL"),
    ("Pacific/Easter", "CL"),
    ("America/Bogota", "CO"),
    ("America/Lima", "PE"),
    ("America/Caracas", "VE"),
    ("America/Montevideo", "UY"),
    ("America/Sao_Paulo", "BR"),
    ("America/Rio_Branco", "BR"),
    ("America/Manaus", "BR"),
    ("America/Belem", "BR"),
    ("America/Fortaleza", "BR"),
    ("America/Recife", "BR"),
    ("America/Bahia", "BR"),
    ("America/Maceio", "BR"),
    ("America/Araguaina", "BR"),
    ("America/Cuiaba", "BR"),
    ("America/Campo_Grande", "BR"),
    ("America/Porto_Velho", "BR"),
    ("America/Boa_Vista", "BR"),
    ("America/Santarem", "BR"),
    ("America/Eirunepe", "BR"),
    ("America/Noronha", "BR"),
    ("Europe/London", "GB"),
    ("Europe/Belfast", "GB"),
    ("Europe/Dublin", "IE"),
    ("Europe/Madrid", "ES"),
    ("Atlantic/Canary", "ES"),
    ("Africa/Ceuta", "ES"),
    ("Europe/Lisbon", "PT"),
    ("Atlantic/Madeira", "PT"),
    ("Atlantic/Azores", "PT"),
    ("Europe/Paris", "FR"),
    ("Europe/Brussels", "BE"),
    ("Europe/Luxembourg", "LU"),
    ("Europe/Amsterdam", "NL"),
    ("Europe/Zurich", "CH"),
    ("Europe/Berlin", "DE"),
    ("Europe/Busingen", "DE"),
    ("Europe/Vienna", "AT"),
    ("Europe/Rome", "IT"),
    ("Europe/Stockholm", "SE"),
    ("Europe/Oslo", "NO"),
    ("Europe/Copenhagen", "DK"),
    ("Europe/Helsinki", "FI"),
    ("Europe/Warsaw", "PL"),
    ("Europe/Prague", "CZ"),
    ("Europe/Athens", "GR"),
    ("Asia/Tokyo", "JP"),
    ("Asia/Seoul", "KR"),
    ("Asia/Kolkata", "IN"),
    ("Asia/Calcutta", "IN"),
    ("Asia/Singapore", "SG"),
    ("Asia/Manila", "PH"),
    ("Africa/Johannesburg", "ZA"),
    ("Pacific/Auckland", "NZ"),
    ("Pacific/Chatham", "NZ"),
    ("Antarctica/McMurdo", "NZ"),
];

/// The country (ISO alpha-2, upper case) of an IANA time zone, for the common zones; None for zones
/// such as UTC or Etc/* that name no country, and for zones not in the table.
pub(crate) fn country_of_time_zone(tz: &str) -> Option<&'static str> {
    let tz = tz.trim();
    ZONES
        .iter()
        .find(|(zone, _)| *zone == tz)
        .or_else(|| {
            ZONE_PREFIXES
                .iter()
                .find(|(prefix, _)| tz.starts_with(prefix))
        })
        .map(|(_, country)| *country)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_file(name: &str, contents: &str) -> PathBuf {
        let path = std::env::temp_dir().join(format!("{name}-{}.json", std::process::id()));
        std::fs::write(&path, contents).unwrap();
        path
    }

    #[test]
    fn builtin_parses_and_validates() {
        let lines = CrisisLines::parse(BUILTIN, Path::new("crisis.json")).unwrap();
        for lang in ["en", "es", "pt", "fr", "de", "ja"] {
            assert!(lines.referral.contains_key(lang), "{lang}");
        }
        for text in lines.referral.values() {
            assert!(!text.to_lowercase().contains("suicid"), "{text}");
        }
        assert!(lines.countries.len() >= 20);
        assert!(!lines.reviewed.is_empty());
    }

    #[test]
    fn referral_falls_back_to_english() {
        let lines = CrisisLines::builtin();
        assert_eq!(lines.referral(Some("pt-BR")).0, "pt");
        assert_eq!(lines.referral(Some("JA")).0, "ja");
        assert_eq!(lines.referral(Some("ko")).0, "en");
        let (lang, text) = lines.referral(None);
        assert_eq!(lang, "en");
        assert!(text.contains("real person"));
    }

    #[test]
    fn for_user_by_country_in_any_case() {
        let lines = CrisisLines::builtin();
        let (country, gb) = lines.for_user(Some("gb"), Some("America/New_York"));
        assert_eq!(country.as_deref(), Some("GB"));
        assert!(gb.iter().any(|l| l.phone.as_deref() == Some("116 123")));
        assert_eq!(lines.for_user(Some(" uk "), None).0.as_deref(), Some("GB"));
        assert_eq!(lines.for_user(Some("JP"), None).0.as_deref(), Some("JP"));
    }

    #[test]
    fn for_user_by_time_zone_when_country_is_not_configured() {
        let lines = CrisisLines::builtin();
        let (country, br) = lines.for_user(None, Some("America/Sao_Paulo"));
        assert_eq!(country.as_deref(), Some("BR"));
        assert!(br.iter().any(|l| l.phone.as_deref() == Some("188")));
        assert_eq!(
            lines
                .for_user(Some("XX"), Some("Australia/Perth"))
                .0
                .as_deref(),
            Some("AU")
        );
    }

    #[test]
    fn for_user_falls_back() {
        let lines = CrisisLines::builtin();
        for (country, tz) in [
            (None, Some("UTC")),
            (None, None),
            (Some("XX"), Some("Etc/GMT+3")),
            (Some("KE"), None),
        ] {
            let (used, got) = lines.for_user(country, tz);
            assert_eq!(used, None, "{country:?} {tz:?}");
            assert_eq!(got, lines.fallback_lines.as_slice());
        }
    }

    #[test]
    fn time_zones_map_to_countries() {
        assert_eq!(country_of_time_zone("America/Los_Angeles"), Some("US"));
        assert_eq!(
            country_of_time_zone("America/Indiana/Indianapolis"),
            Some("US")
        );
        assert_eq!(country_of_time_zone("America/Toronto"), Some("CA"));
        assert_eq!(country_of_time_zone("Atlantic/Canary"), Some("ES"));
        assert_eq!(
            country_of_time_zone("America/Argentina/Buenos_Aires"),
            Some("AR")
        );
        assert_eq!(country_of_time_zone("Australia/Sydney"), Some("AU"));
        assert_eq!(country_of_time_zone("UTC"), None);
        assert_eq!(country_of_time_zone("Etc/UTC"), None);
    }

    #[test]
    fn load_accepts_a_valid_file() {
        let path = temp_file("crisis-valid", BUILTIN);
        let lines = CrisisLines::load(&path);
        std::fs::remove_file(&path).unwrap();
        assert_eq!(
            lines.unwrap().countries.len(),
            CrisisLines::builtin().countries.len()
        );
    }

    #[test]
    fn load_rejects_invalid_files() {
        let valid: serde_json::Value = serde_json::from_str(BUILTIN).unwrap();
        let broken = |edit: fn(&mut serde_json::Value)| {
            let mut v = valid.clone();
            edit(&mut v);
            v.to_string()
        };
        let cases = [
            broken(|v| _ = v["referral"].as_object_mut().unwrap().remove("en")),
            broken(|v| v["fallbackLines"] = serde_json::json!([])),
            broken(|v| v["countries"]["us"] = v["countries"]["US"].clone()),
            broken(|v| v["countries"]["GB"][0] = serde_json::json!({"name": "Nothing"})),
        ];
        for (i, contents) in cases.iter().enumerate() {
            let path = temp_file(&format!("crisis-invalid-{i}"), contents);
            let result = CrisisLines::load(&path);
            std::fs::remove_file(&path).unwrap();
            assert!(
                matches!(result, Err(LinesError::Invalid(_))),
                "case {i}: {result:?}"
            );
        }
        let path = temp_file("crisis-unknown-field", &broken(|v| v["extra"] = 1.into()));
        let result = CrisisLines::load(&path);
        std::fs::remove_file(&path).unwrap();
        assert!(
            matches!(result, Err(LinesError::Parse { .. })),
            "{result:?}"
        );
        let missing = std::env::temp_dir().join("crisis-does-not-exist.json");
        assert!(matches!(
            CrisisLines::load(&missing),
            Err(LinesError::Io { .. })
        ));
    }
}
