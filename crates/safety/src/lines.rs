//! Where a user in crisis is referred: the fixed, reviewed referral message in the user's language and
//! the crisis lines of the user's country that fit what the screen found, each with its evidence.
//!
//! The referral is never written by the model. The built-in configuration (`crisis.json`, embedded) can
//! be replaced by a file of the same shape; either is validated before use, so a typo cannot leave a
//! user in crisis with an empty message, and a line without its evidence (kind, hours, cost, source, the
//! date it was checked) cannot reach a user at all. The file keeps the evidence; the card carries what
//! the user needs (how to reach a line, what kind it is, when it is open, what it costs).

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use chrono::NaiveDate;
use serde::{Deserialize, Serialize};

use super::screen::Category;

/// The configuration shipped with the worker, used when no override file is configured.
const BUILTIN: &str = include_str!("crisis.json");

/// `hours` of a line that answers at any time.
const ALWAYS_OPEN: &str = "24/7";
/// `cost` of a line that costs its caller nothing.
const FREE: &str = "free";

/// What a line is, for the user who reaches it; the card lists the kinds in this order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// A person listens and talks with the user (crisis lines, youth helplines).
    Counselling,
    /// Takes reports and passes them to police or child protection: not confidential by design.
    Reporting,
    /// The country's emergency number, for danger now.
    Emergency,
    /// A directory of helplines by country, for a user whose country is unknown.
    Directory,
}

impl Kind {
    /// The snake_case name, as serialized.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Counselling => "counselling",
            Kind::Reporting => "reporting",
            Kind::Emergency => "emergency",
            Kind::Directory => "directory",
        }
    }
}

/// One entry as written in the file. The evidence fields are optional here only so that validation
/// can say which entry lacks which; a [`CrisisLine`] has them all.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    name: String,
    #[serde(default)]
    phone: Option<String>,
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    url: Option<String>,
    #[serde(default)]
    kind: Option<Kind>,
    #[serde(default)]
    serves: Option<Vec<Category>>,
    #[serde(default)]
    hours: Option<String>,
    #[serde(default)]
    cost: Option<String>,
    #[serde(default)]
    source: Option<String>,
    #[serde(default)]
    checked: Option<String>,
    #[serde(default)]
    evidence: Option<String>,
    #[serde(default)]
    unconfirmed: Option<String>,
}

/// One service a user can reach, with its evidence: at least one of `phone`, `text` or `url` is set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CrisisLine {
    /// What the user will recognise, in the country's language where that helps.
    pub name: String,
    /// The number to call, as written locally.
    pub phone: Option<String>,
    /// Where to text: a number, or "KEYWORD to NUMBER" when the service needs a first word.
    pub text: Option<String>,
    /// The service's web site or chat.
    pub url: Option<String>,
    pub kind: Kind,
    /// The crisis categories the line is for (a child-abuse line is not a suicide line).
    pub serves: Vec<Category>,
    /// [`ALWAYS_OPEN`], or the hours with their time zone, as the user should read them.
    pub hours: String,
    /// [`FREE`], or what it costs the caller.
    pub cost: String,
    /// The page where the number, hours and cost were checked.
    pub source: String,
    /// When they were checked there; older than the review interval, the line is due for review.
    pub checked: NaiveDate,
    /// What the source says, quoted, for the reviewer.
    pub evidence: Option<String>,
    /// What no source showed, for the reviewer to settle first.
    pub unconfirmed: Option<String>,
}

impl CrisisLine {
    pub(crate) fn always_open(&self) -> bool {
        self.hours == ALWAYS_OPEN
    }

    pub(crate) fn free(&self) -> bool {
        self.cost == FREE
    }

    /// Free and open at any hour first, then free, then open at any hour.
    fn rank(&self) -> (Kind, u8) {
        let rank = match (self.free(), self.always_open()) {
            (true, true) => 0,
            (true, false) => 1,
            (false, true) => 2,
            (false, false) => 3,
        };
        (self.kind, rank)
    }

    /// What the `crisis_resources` card carries of the line.
    pub fn card(&self) -> CardLine<'_> {
        CardLine {
            name: &self.name,
            phone: self.phone.as_deref(),
            text: self.text.as_deref(),
            url: self.url.as_deref(),
            kind: self.kind,
            hours: &self.hours,
            cost: &self.cost,
        }
    }
}

/// A line as the app renders it (`richContent.data.lines[]`, docs/tb-backend.md).
#[derive(Clone, Debug, Serialize)]
pub struct CardLine<'a> {
    pub(crate) name: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) phone: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) text: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) url: Option<&'a str>,
    pub(crate) kind: Kind,
    pub(crate) hours: &'a str,
    pub(crate) cost: &'a str,
}

/// The words the referral text puts beside a line, in one language.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Labels {
    /// Before a line's hours when it is not open at any time ("open").
    hours: String,
    /// Before a line's cost when it is not free ("cost").
    cost: String,
    /// Beside a reporting line: what happens to what the user tells it.
    reporting: String,
}

/// The file, as written.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct File {
    referral: BTreeMap<String, String>,
    no_country: BTreeMap<String, String>,
    ai_notice: BTreeMap<String, String>,
    labels: BTreeMap<String, Labels>,
    directory: Entry,
    #[serde(default)]
    aliases: BTreeMap<String, String>,
    countries: BTreeMap<String, Vec<Entry>>,
    reviewed: String,
}

/// The referral texts and the lines, per country, as loaded and validated.
#[derive(Clone, Debug)]
pub struct CrisisLines {
    /// The referral message by language (ISO 639-1, lower case), for a user whose country has lines;
    /// "en" is required as the fallback. It claims only what holds for every line it can show.
    referral: BTreeMap<String, String>,
    /// The message for a user whose country is unknown or has no lines: the local emergency number and
    /// the directory, never a line that works in one country only. Same languages as `referral`.
    no_country: BTreeMap<String, String>,
    /// The plain sentence that the companion is an AI, not a person, which a referral carries (after its
    /// first sentence) when the AI disclosure is due, and any message to a user in crisis instead of the
    /// character's own disclosure line. Same languages as `referral`, under the same review.
    ai_notice: BTreeMap<String, String>,
    labels: BTreeMap<String, Labels>,
    /// The international directory, the one line of a user without a known country.
    directory: CrisisLine,
    /// Codes that are served by another country's lines (US territories by the US, "UK" by GB).
    aliases: BTreeMap<String, String>,
    /// The lines by country (ISO 3166-1 alpha-2, upper case).
    pub countries: BTreeMap<String, Vec<CrisisLine>>,
    /// Who checked the lines, when, and how: kept with the data.
    pub reviewed: String,
}

/// What a user in crisis is sent: the text (which lists the lines too) and the card's lines.
#[derive(Clone, Debug)]
pub struct Referral<'a> {
    /// The language of the text.
    pub lang: &'a str,
    /// The country whose lines these are; None: the user's country is unknown or has none.
    pub country: Option<&'a str>,
    /// In the card's order: counselling (free and open at any hour first), reporting, emergency,
    /// directory.
    pub lines: Vec<&'a CrisisLine>,
    pub text: String,
}

/// A line not checked within the review interval.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Stale<'a> {
    /// The country code, or "directory".
    pub(crate) whose: &'a str,
    pub(crate) name: &'a str,
    pub(crate) checked: NaiveDate,
    /// Days since it was checked.
    pub(crate) days: i64,
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
    pub fn builtin() -> Self {
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
        tracing::info!(path = %path.display(), countries = lines.countries.len(), "crisis lines loaded");
        Ok(lines)
    }

    fn parse(text: &str, path: &Path) -> Result<Self, LinesError> {
        let file: File = serde_json::from_str(text).map_err(|source| LinesError::Parse {
            path: path.to_owned(),
            source,
        })?;
        Self::validate(file)
    }

    fn validate(file: File) -> Result<Self, LinesError> {
        let invalid = |why: String| Err(LinesError::Invalid(why));
        check_texts(&file)?;
        let directory = line("directory", file.directory)?;
        if directory.kind != Kind::Directory || directory.url.is_none() {
            return invalid("directory: kind must be \"directory\", with a url".into());
        }
        let mut countries = BTreeMap::new();
        for (code, entries) in file.countries {
            if !is_code(&code) {
                return invalid(format!("country {code:?} is not two upper-case letters"));
            }
            let lines = entries
                .into_iter()
                .map(|e| line(&code, e))
                .collect::<Result<Vec<_>, _>>()?;
            if let Some(l) = lines.iter().find(|l| l.kind == Kind::Directory) {
                return invalid(format!("{code}: {:?} is a directory, not a line", l.name));
            }
            if !lines
                .iter()
                .any(|l| l.kind == Kind::Counselling && l.serves.contains(&Category::SelfHarm))
            {
                return invalid(format!(
                    "country {code} has no counselling line for self_harm (its crisis line)"
                ));
            }
            countries.insert(code, lines);
        }
        for (alias, to) in &file.aliases {
            if !is_code(alias) || countries.contains_key(alias) || !countries.contains_key(to) {
                return invalid(format!(
                    "alias {alias:?} -> {to:?}: an alias is a code without lines of its own, for a country with lines"
                ));
            }
        }
        Ok(Self {
            referral: file.referral,
            no_country: file.no_country,
            ai_notice: file.ai_notice,
            labels: file.labels,
            directory,
            aliases: file.aliases,
            countries,
            reviewed: file.reviewed,
        })
    }

    /// The language used for `lang` (a tag such as "pt-BR" or "ja"; only the primary subtag counts):
    /// itself when the file has its texts, else English.
    fn language(&self, lang: Option<&str>) -> &str {
        let primary = lang
            .and_then(|l| l.split(['-', '_']).next())
            .map(|l| l.trim().to_ascii_lowercase());
        primary
            .and_then(|l| self.referral.get_key_value(l.as_str()))
            .or_else(|| self.referral.get_key_value("en"))
            .map(|(lang, _)| lang.as_str())
            .expect("validated: an \"en\" referral exists")
    }

    /// The plain sentence that the companion is an AI, not a person, in the language used for `lang`
    /// (as a referral's: English when the file lacks it).
    pub fn ai_notice(&self, lang: Option<&str>) -> &str {
        self.ai_notice[self.language(lang)].trim()
    }

    /// A referral's text (as [`Self::referral`] made it, in `lang`) carrying the AI notice after its
    /// first sentence: the user in crisis reads that their words were heard, then that this is an AI,
    /// then who can help. Every referral text has a first sentence (checked when the file is loaded); a
    /// text without one gets the notice after it.
    pub fn with_ai_notice(&self, text: &str, lang: Option<&str>) -> String {
        let notice = self.ai_notice(lang);
        let text = text.trim();
        match first_sentence_end(text) {
            Some(end) => {
                let (first, rest) = text.split_at(end);
                let rest = rest.trim_start();
                // No space between sentences in a script written without them (Japanese).
                let gap = |s: &str| match s.chars().last().is_some_and(is_wide_stop) {
                    true => "",
                    false => " ",
                };
                format!("{first}{}{notice}{}{rest}", gap(first), gap(notice))
            }
            None => format!("{text} {notice}"),
        }
    }

    /// The country whose lines serve a user: `country` (ISO 3166-1 alpha-2, any case, or an alias) when
    /// the file has it, else the country of `time_zone` (IANA), else none.
    pub(crate) fn country_of(
        &self,
        country: Option<&str>,
        time_zone: Option<&str>,
    ) -> Option<&str> {
        let by_country = country.map(|c| c.trim().to_ascii_uppercase());
        let by_zone = time_zone.and_then(country_of_time_zone).map(str::to_owned);
        by_country.into_iter().chain(by_zone).find_map(|code| {
            let code = self.aliases.get(&code).unwrap_or(&code);
            self.countries.get_key_value(code).map(|(c, _)| c.as_str())
        })
    }

    /// The referral for a user flagged for `category`: in `lang` (English when the file lacks it), with
    /// the lines of the user's country that fit the category ([`Self::fitting`]), in the card's order. A user without a known country gets the emergency-number sentence
    /// and the directory.
    pub fn referral(
        &self,
        lang: Option<&str>,
        country: Option<&str>,
        time_zone: Option<&str>,
        category: Category,
    ) -> Referral<'_> {
        let lang = self.language(lang);
        let country = self.country_of(country, time_zone);
        let (intro, lines) = match country {
            Some(code) => (&self.referral[lang], self.fitting(code, category)),
            None => (&self.no_country[lang], vec![&self.directory]),
        };
        let labels = &self.labels[lang];
        let mut text = intro.trim().to_owned();
        for l in &lines {
            text.push_str(&describe(l, labels));
        }
        Referral {
            lang,
            country,
            lines,
            text,
        }
    }

    /// The lines of `code` that serve `category`, in the card's order. When none of them is a
    /// counselling line that answers at any hour, the country's crisis lines (counselling lines for
    /// `self_harm`) that do are added, or all its crisis lines when none fits at all: whatever was
    /// found, someone to talk to now comes first.
    fn fitting(&self, code: &str, category: Category) -> Vec<&CrisisLine> {
        let all = &self.countries[code];
        let mut lines: Vec<&CrisisLine> = all
            .iter()
            .filter(|l| l.serves.contains(&category))
            .collect();
        let talks = |l: &&CrisisLine| l.kind == Kind::Counselling;
        let any_talks = lines.iter().any(talks);
        if !lines.iter().any(|l| talks(l) && l.always_open()) {
            let crisis: Vec<&CrisisLine> = all
                .iter()
                .filter(|l| talks(l) && l.serves.contains(&Category::SelfHarm))
                .filter(|l| !lines.iter().any(|m| std::ptr::eq(*m, *l)))
                .filter(|l| l.always_open() || !any_talks)
                .collect();
            lines.extend(crisis);
        }
        lines.sort_by_key(|l| l.rank());
        lines
    }

    /// Every entry: the directory, then each country's lines, with whose they are.
    pub fn entries(&self) -> impl Iterator<Item = (&str, &CrisisLine)> {
        std::iter::once(("directory", &self.directory)).chain(
            self.countries
                .iter()
                .flat_map(|(code, lines)| lines.iter().map(move |l| (code.as_str(), l))),
        )
    }

    /// Every entry checked more than `review_days` days before `today`.
    pub(crate) fn stale(&self, today: NaiveDate, review_days: u32) -> Vec<Stale<'_>> {
        self.entries()
            .filter_map(|(whose, l)| {
                let days = (today - l.checked).num_days();
                (days > i64::from(review_days)).then_some(Stale {
                    whose,
                    name: &l.name,
                    checked: l.checked,
                    days,
                })
            })
            .collect()
    }
}

/// A full stop of a script written without spaces between sentences.
fn is_wide_stop(c: char) -> bool {
    matches!(c, '。' | '！' | '？')
}

/// Where a text's first sentence ends (the byte after its stop), when more follows it.
fn first_sentence_end(text: &str) -> Option<usize> {
    let text = text.trim_end();
    let mut chars = text.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        let end = i + c.len_utf8();
        let stop = match c {
            c if is_wide_stop(c) => true,
            '.' | '!' | '?' => chars.peek().is_some_and(|(_, n)| n.is_whitespace()),
            _ => false,
        };
        if stop && end < text.len() {
            return Some(end);
        }
    }
    None
}

fn is_code(code: &str) -> bool {
    code.len() == 2 && code.bytes().all(|b| b.is_ascii_uppercase())
}

/// A line of the referral text: how to reach it, and what the user should know before they do (it
/// reports rather than listens, it has opening hours, it costs something).
fn describe(l: &CrisisLine, labels: &Labels) -> String {
    let ways: Vec<String> = [
        l.phone.as_ref().map(|p| format!("📞 {p}")),
        l.text.as_ref().map(|t| format!("💬 {t}")),
        l.url.as_ref().map(|u| format!("🌐 {u}")),
    ]
    .into_iter()
    .flatten()
    .collect();
    let mut notes = Vec::new();
    if l.kind == Kind::Reporting {
        notes.push(labels.reporting.trim().to_owned());
    }
    if !l.always_open() {
        notes.push(format!("{}: {}", labels.hours.trim(), l.hours));
    }
    if !l.free() {
        notes.push(format!("{}: {}", labels.cost.trim(), l.cost));
    }
    let notes = match notes.is_empty() {
        true => String::new(),
        false => format!(" — {}", notes.join("; ")),
    };
    format!("\n• {}: {}{notes}", l.name, ways.join(" · "))
}

/// The texts of every language: an English referral; for each language with a referral, its
/// no-country text, AI notice and labels, each text with a first sentence the AI notice goes after; no
/// texts of a language without a referral.
fn check_texts(file: &File) -> Result<(), LinesError> {
    let invalid = |why: String| Err(LinesError::Invalid(why));
    if file.referral.get("en").is_none_or(|t| t.trim().is_empty()) {
        return invalid("no \"en\" referral".into());
    }
    for (lang, text) in &file.referral {
        if text.trim().is_empty() {
            return invalid(format!("empty referral for {lang:?}"));
        }
        if file
            .no_country
            .get(lang)
            .is_none_or(|t| t.trim().is_empty())
        {
            return invalid(format!("no noCountry text for {lang:?}"));
        }
        if file.ai_notice.get(lang).is_none_or(|t| t.trim().is_empty()) {
            return invalid(format!("no aiNotice for {lang:?}"));
        }
        for (which, intro) in [("referral", text), ("noCountry", &file.no_country[lang])] {
            if first_sentence_end(intro).is_none() {
                return invalid(format!(
                    "the {which} text for {lang:?} has no first sentence before its end: the AI notice goes after it"
                ));
            }
        }
        let Some(l) = file.labels.get(lang) else {
            return invalid(format!("no labels for {lang:?}"));
        };
        if [&l.hours, &l.cost, &l.reporting]
            .iter()
            .any(|s| s.trim().is_empty())
        {
            return invalid(format!("an empty label for {lang:?}"));
        }
    }
    if let Some(lang) = file
        .no_country
        .keys()
        .chain(file.ai_notice.keys())
        .chain(file.labels.keys())
        .find(|l| !file.referral.contains_key(*l))
    {
        return invalid(format!("{lang:?} has texts but no referral"));
    }
    Ok(())
}

/// An entry of `whose` with its evidence checked.
fn line(whose: &str, e: Entry) -> Result<CrisisLine, LinesError> {
    let name = e.name.trim().to_owned();
    if name.is_empty() {
        return Err(LinesError::Invalid(format!("{whose}: a line has no name")));
    }
    if [&e.phone, &e.text, &e.url]
        .iter()
        .all(|v| v.as_deref().is_none_or(|s| s.trim().is_empty()))
    {
        return Err(LinesError::Invalid(format!(
            "{whose}: {name:?} has neither phone, text nor url"
        )));
    }
    let missing = |field: &str| {
        LinesError::Invalid(format!(
            "{whose}: {name:?} has no {field:?} (every line carries kind, serves, hours, cost, source and checked)"
        ))
    };
    let kind = e.kind.ok_or_else(|| missing("kind"))?;
    let serves = e
        .serves
        .filter(|s| !s.is_empty())
        .ok_or_else(|| missing("serves"))?;
    let hours = filled(e.hours).ok_or_else(|| missing("hours"))?;
    let cost = filled(e.cost).ok_or_else(|| missing("cost"))?;
    let source = filled(e.source).ok_or_else(|| missing("source"))?;
    let checked = filled(e.checked).ok_or_else(|| missing("checked"))?;
    if !(source.starts_with("https://") || source.starts_with("http://")) {
        return Err(LinesError::Invalid(format!(
            "{whose}: {name:?}: source {source:?} is not a web page"
        )));
    }
    let checked = NaiveDate::parse_from_str(checked.trim(), "%Y-%m-%d").map_err(|_| {
        LinesError::Invalid(format!(
            "{whose}: {name:?}: checked {checked:?} is not a date (YYYY-MM-DD)"
        ))
    })?;
    Ok(CrisisLine {
        name,
        phone: filled(e.phone),
        text: filled(e.text),
        url: filled(e.url),
        kind,
        serves,
        hours: hours.trim().to_owned(),
        cost: cost.trim().to_owned(),
        source: source.trim().to_owned(),
        checked,
        evidence: filled(e.evidence),
        unconfirmed: filled(e.unconfirmed),
    })
}

/// The value when it says something.
fn filled(v: Option<String>) -> Option<String> {
    v.filter(|s| !s.trim().is_empty())
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
    ("America/St_Thomas", "VI"),
    ("America/Virgin", "VI"),
    ("Pacific/Guam", "GU"),
    ("Pacific/Saipan", "MP"),
    ("Pacific/Pago_Pago", "AS"),
    ("Pacific/Samoa", "AS"),
    ("Pacific/Midway", "UM"),
    ("Pacific/Wake", "UM"),
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
    ("Atlantic/Reykjavik", "IS"),
    ("Iceland", "IS"),
    ("Europe/Athens", "GR"),
    ("Asia/Tokyo", "JP"),
    ("Japan", "JP"),
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

    const LANGS: [&str; 6] = ["en", "es", "pt", "fr", "de", "ja"];

    fn temp_file(name: &str, contents: &str) -> PathBuf {
        let path = std::env::temp_dir().join(format!("{name}-{}.json", std::process::id()));
        std::fs::write(&path, contents).unwrap();
        path
    }

    fn builtin_json() -> serde_json::Value {
        serde_json::from_str(BUILTIN).unwrap()
    }

    fn parse(v: &serde_json::Value) -> Result<CrisisLines, LinesError> {
        CrisisLines::parse(&v.to_string(), Path::new("test.json"))
    }

    fn date(s: &str) -> NaiveDate {
        NaiveDate::parse_from_str(s, "%Y-%m-%d").unwrap()
    }

    /// Every entry of the file as written: (whose, entry).
    fn raw_entries(v: &serde_json::Value) -> Vec<(String, serde_json::Value)> {
        let mut out = vec![("directory".to_owned(), v["directory"].clone())];
        for (code, lines) in v["countries"].as_object().unwrap() {
            for l in lines.as_array().unwrap() {
                out.push((code.clone(), l.clone()));
            }
        }
        out
    }

    #[test]
    fn every_shipped_entry_carries_its_evidence() {
        let v = builtin_json();
        let entries = raw_entries(&v);
        assert!(entries.len() > 60, "{}", entries.len());
        let mut missing = Vec::new();
        for (whose, e) in &entries {
            for field in ["kind", "hours", "cost", "source", "checked"] {
                let ok = e[field].as_str().is_some_and(|s| !s.trim().is_empty());
                if !ok {
                    missing.push(format!("{whose}: {} has no {field}", e["name"]));
                }
            }
            let checked = e["checked"].as_str().unwrap_or_default();
            if NaiveDate::parse_from_str(checked, "%Y-%m-%d").is_err() {
                missing.push(format!("{whose}: {}: checked {checked:?}", e["name"]));
            }
            if !e["source"].as_str().unwrap_or_default().starts_with("http") {
                missing.push(format!("{whose}: {}: source is no page", e["name"]));
            }
        }
        assert!(missing.is_empty(), "{missing:#?}");
        let lines = CrisisLines::builtin();
        for lang in LANGS {
            assert!(lines.referral.contains_key(lang), "{lang}");
        }
        for text in lines.referral.values().chain(lines.no_country.values()) {
            assert!(!text.to_lowercase().contains("suicid"), "{text}");
        }
        assert!(lines.countries.len() >= 25, "{}", lines.countries.len());
    }

    /// In every language, a referral carrying the AI notice opens with its own first sentence, then the
    /// plain notice (never a character's playful line), then the rest of the referral, whole.
    #[test]
    fn the_ai_notice_follows_the_referral_s_first_sentence_in_its_language() {
        let lines = CrisisLines::builtin();
        for lang in LANGS {
            for country in [Some("JP"), Some("US"), None] {
                let r = lines.referral(Some(lang), country, None, Category::SelfHarm);
                let notice = lines.ai_notice(Some(lang));
                let with = lines.with_ai_notice(&r.text, Some(lang));
                let at = with.find(notice).expect("the notice is in it");
                let first = with[..at].trim_end();
                assert!(
                    r.text.starts_with(first) && first.chars().count() >= 10,
                    "{lang}: the referral's first sentence first: {with}"
                );
                assert!(
                    first.ends_with(['.', '。']),
                    "{lang}: a whole sentence before the notice: {first}"
                );
                let rest = with[at + notice.len()..].trim_start();
                assert_eq!(
                    format!("{first}{rest}").replace(' ', ""),
                    r.text.replace(' ', "")
                );
                assert_eq!(with.matches(notice).count(), 1);
                assert!(!notice.to_lowercase().contains("suicid"), "{notice}");
            }
        }
        let en = lines.referral(Some("en"), Some("US"), None, Category::SelfHarm);
        assert!(
            lines.with_ai_notice(&en.text, Some("en")).starts_with(
                "What you told me sounds really serious, and you deserve support from a real person. \
                 I'm an AI, a computer program, not a person. You can reach"
            ),
            "{}",
            lines.with_ai_notice(&en.text, Some("en"))
        );
        let ja = lines.referral(Some("ja"), Some("JP"), None, Category::SelfHarm);
        assert!(
            lines
                .with_ai_notice(&ja.text, Some("ja"))
                .starts_with("話してくれたこと、とても深刻なことだと感じました。私はAIで、人ではなくコンピューターのプログラムです。あなたは"),
            "{}",
            lines.with_ai_notice(&ja.text, Some("ja"))
        );
        // A language without texts: the English referral carries the English notice.
        assert_eq!(lines.ai_notice(Some("it")), lines.ai_notice(Some("en")));
        assert_eq!(lines.ai_notice(Some("pt-BR")), lines.ai_notice(Some("pt")));
    }

    #[test]
    fn a_file_without_the_ai_notice_or_a_first_sentence_is_refused() {
        let mut v = builtin_json();
        v["aiNotice"].as_object_mut().unwrap().remove("fr");
        assert!(
            matches!(parse(&v), Err(LinesError::Invalid(why)) if why.contains("aiNotice")),
            "a language without its notice"
        );
        let mut v = builtin_json();
        v["referral"]["de"] = "Ruf diese Stellen an:".into();
        assert!(
            matches!(parse(&v), Err(LinesError::Invalid(why)) if why.contains("first sentence")),
            "a referral of one sentence"
        );
        assert_eq!(first_sentence_end("One. Two."), Some(4));
        assert_eq!(first_sentence_end("Version 2.0 is out. Yes"), Some(19));
        assert_eq!(first_sentence_end("只一句。"), None);
        assert_eq!(first_sentence_end("一。二。"), Some("一。".len()));
    }

    #[test]
    fn a_line_without_any_of_its_evidence_is_refused() {
        for field in ["kind", "serves", "hours", "cost", "source", "checked"] {
            let mut v = builtin_json();
            v["countries"]["GB"][0]
                .as_object_mut()
                .unwrap()
                .remove(field);
            match parse(&v) {
                Err(LinesError::Invalid(why)) => {
                    assert!(why.contains(&format!("no \"{field}\"")), "{field}: {why}")
                }
                other => panic!("{field}: {other:?}"),
            }
            let mut v = builtin_json();
            v["countries"]["JP"][1][field] = "".into();
            assert!(
                matches!(
                    parse(&v),
                    Err(LinesError::Invalid(_) | LinesError::Parse { .. })
                ),
                "{field} empty"
            );
        }
        let mut v = builtin_json();
        v["directory"].as_object_mut().unwrap().remove("checked");
        assert!(matches!(parse(&v), Err(LinesError::Invalid(_))));
        for (field, bad) in [
            ("checked", "last spring"),
            ("checked", "2026-13-01"),
            ("source", "the service's site"),
            ("kind", "hotline"),
            ("hours", "   "),
        ] {
            let mut v = builtin_json();
            v["countries"]["US"][0][field] = bad.into();
            assert!(parse(&v).is_err(), "{field}: {bad:?}");
        }
    }

    #[test]
    fn load_rejects_invalid_files() {
        let valid = builtin_json();
        let broken = |edit: fn(&mut serde_json::Value)| {
            let mut v = valid.clone();
            edit(&mut v);
            v.to_string()
        };
        let cases = [
            broken(|v| _ = v["referral"].as_object_mut().unwrap().remove("en")),
            broken(|v| _ = v["noCountry"].as_object_mut().unwrap().remove("de")),
            broken(|v| _ = v["labels"].as_object_mut().unwrap().remove("ja")),
            broken(|v| v["countries"]["us"] = v["countries"]["US"].clone()),
            broken(|v| v["countries"]["GB"][0] = serde_json::json!({"name": "Nothing"})),
            broken(|v| v["directory"]["kind"] = "counselling".into()),
            broken(|v| v["aliases"]["PR"] = "XX".into()),
            broken(|v| v["aliases"]["GB"] = "US".into()),
            // A country with only a reporting line has nobody to talk to.
            broken(|v| {
                let nc = v["countries"]["US"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|l| l["kind"] == "reporting")
                    .cloned()
                    .unwrap();
                v["countries"]["US"] = serde_json::json!([nc]);
            }),
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
        let path = temp_file("crisis-valid", BUILTIN);
        let lines = CrisisLines::load(&path);
        std::fs::remove_file(&path).unwrap();
        assert_eq!(
            lines.unwrap().countries.len(),
            CrisisLines::builtin().countries.len()
        );
    }

    #[test]
    fn staleness_on_a_fixed_clock() {
        // Every shipped entry was checked on or after this date, and none after the clock below.
        let mut v = builtin_json();
        for (code, lines) in v["countries"].as_object_mut().unwrap() {
            for l in lines.as_array_mut().unwrap() {
                assert!(
                    date(l["checked"].as_str().unwrap()) >= date("2026-01-01"),
                    "{code}"
                );
                l["checked"] = "2026-11-26".into();
            }
        }
        v["directory"]["checked"] = "2026-11-26".into();
        let today = date("2027-03-01");
        let fresh = parse(&v).unwrap();
        assert_eq!(fresh.stale(today, 365), vec![]);
        assert_eq!(fresh.stale(today, 95), vec![], "95 days is within 95");
        assert_eq!(
            fresh.stale(today, 94).len(),
            raw_entries(&v).len(),
            "all of them past 94"
        );

        v["countries"]["JP"][0]["checked"] = "2025-11-30".into();
        let lines = parse(&v).unwrap();
        let name = lines.countries["JP"][0].name.clone();
        assert_eq!(
            lines.stale(today, 365),
            vec![Stale {
                whose: "JP",
                name: &name,
                checked: date("2025-11-30"),
                days: 456,
            }]
        );
        assert_eq!(
            lines.stale(date("2026-11-30"), 365),
            vec![],
            "a year to the day"
        );
        assert_eq!(lines.stale(date("2026-12-01"), 365).len(), 1);
    }

    fn referral(
        lang: &str,
        country: Option<&str>,
        tz: Option<&str>,
        category: Category,
    ) -> (Option<String>, Vec<CrisisLine>, String) {
        let lines = CrisisLines::builtin();
        let r = lines.referral(Some(lang), country, tz, category);
        (
            r.country.map(str::to_owned),
            r.lines.into_iter().cloned().collect(),
            r.text,
        )
    }

    #[test]
    fn japan_gets_a_free_line_first_and_a_paid_line_is_labelled() {
        for category in Category::ALL {
            let (country, lines, text) = referral("ja", Some("JP"), None, category);
            assert_eq!(country.as_deref(), Some("JP"));
            assert!(
                lines[0].free() && lines[0].always_open(),
                "{category:?}: {lines:#?}"
            );
            assert_eq!(lines[0].kind, Kind::Counselling);
            for l in lines.iter().filter(|l| !l.free() || !l.always_open()) {
                let shown = text.lines().find(|t| t.contains(&l.name)).unwrap();
                if !l.free() {
                    assert!(shown.contains(&format!("料金: {}", l.cost)), "{shown}");
                }
                if !l.always_open() {
                    assert!(shown.contains(&format!("受付: {}", l.hours)), "{shown}");
                }
            }
        }
        let (_, lines, text) = referral("ja", Some("jp"), None, Category::SelfHarm);
        if let Some(navi) = lines
            .iter()
            .find(|l| l.phone.as_deref() == Some("0570-783-556"))
        {
            assert!(!navi.free() && !navi.always_open(), "{navi:?}");
            let shown = text.lines().find(|t| t.contains("0570-783-556")).unwrap();
            assert!(shown.contains("料金") && shown.contains("受付"), "{shown}");
        }
    }

    #[test]
    fn no_country_and_no_time_zone_gets_the_emergency_sentence_and_the_directory_only() {
        for (country, tz) in [
            (None, None),
            (None, Some("UTC")),
            (Some("XX"), Some("Etc/GMT+3")),
            (Some("KE"), None),
            (Some(""), Some("Africa/Nairobi")),
        ] {
            for lang in LANGS {
                let (used, lines, text) = referral(lang, country, tz, Category::SelfHarm);
                assert_eq!(used, None, "{country:?} {tz:?}");
                assert_eq!(lines.len(), 1, "{lines:#?}");
                assert_eq!(lines[0].kind, Kind::Directory);
                assert!(lines[0].phone.is_none() && lines[0].text.is_none());
                let all = CrisisLines::builtin();
                assert!(text.starts_with(all.no_country[lang].trim()), "{text}");
                assert!(text.contains(lines[0].url.as_deref().unwrap()), "{text}");
                assert!(!text.contains("📞 988"), "{text}");
            }
        }
        let (_, _, text) = referral("en", None, None, Category::Abuse);
        assert!(text.contains("call your local emergency number"), "{text}");
        let (_, _, text) = referral("de", None, None, Category::Abuse);
        assert!(text.contains("örtlichen Notruf"), "{text}");
    }

    #[test]
    fn a_us_time_zone_or_territory_gets_988() {
        for (country, tz) in [
            (None, Some("America/Chicago")),
            (None, Some("America/Indiana/Knox")),
            (Some("PR"), None),
            (None, Some("America/Puerto_Rico")),
            (None, Some("Pacific/Guam")),
            (Some("vi"), Some("Europe/Paris")),
        ] {
            let (used, lines, text) = referral("en", country, tz, Category::SelfHarm);
            assert_eq!(used.as_deref(), Some("US"), "{country:?} {tz:?}");
            assert_eq!(lines[0].phone.as_deref(), Some("988"), "{lines:#?}");
            assert!(text.contains("📞 988"), "{text}");
        }
        // Canada runs its own 988; the country on the profile wins over the time zone.
        let (used, lines, _) = referral(
            "en",
            Some("CA"),
            Some("America/Chicago"),
            Category::SelfHarm,
        );
        assert_eq!(used.as_deref(), Some("CA"));
        assert!(
            lines[0]
                .url
                .as_deref()
                .is_some_and(|u| u.contains("988.ca")),
            "{lines:#?}"
        );
        assert_eq!(
            referral("en", Some(" uk "), None, Category::SelfHarm)
                .0
                .as_deref(),
            Some("GB")
        );
    }

    #[test]
    fn lines_fit_the_category_and_reporting_lines_come_after_counselling() {
        let (_, us_self_harm, text) = referral("en", Some("US"), None, Category::SelfHarm);
        for l in &us_self_harm {
            assert!(
                l.serves.contains(&Category::SelfHarm),
                "a suicidal user gets no child-abuse or exploitation line: {l:#?}"
            );
            assert_ne!(l.kind, Kind::Reporting, "{l:#?}");
        }
        for not in [
            "Childhelp",
            "CyberTipline",
            "1-800-843-5678",
            "1-800-422-4453",
        ] {
            assert!(!text.contains(not), "{text}");
        }
        let (_, grooming, text) = referral("en", Some("US"), None, Category::Grooming);
        assert!(
            grooming
                .iter()
                .any(|l| l.name.contains("CyberTipline") && l.kind == Kind::Reporting),
            "{grooming:#?}"
        );
        assert!(
            grooming.iter().any(|l| l.name.contains("Childhelp")),
            "{grooming:#?}"
        );
        let labels = &CrisisLines::builtin().labels["en"];
        let tip = text.lines().find(|t| t.contains("CyberTipline")).unwrap();
        assert!(tip.contains(labels.reporting.trim()), "{tip}");

        // Nobody for the category who answers at any hour: the always-open crisis lines join them.
        let phones = |lines: &[CrisisLine]| -> Vec<String> {
            lines.iter().filter_map(|l| l.phone.clone()).collect()
        };
        let br = phones(&referral("pt", Some("BR"), None, Category::Grooming).1);
        assert!(br.contains(&"188".into()), "{br:?}");
        let us = phones(&grooming);
        assert!(
            !us.contains(&"988".into()),
            "Childhelp answers at any hour: {us:?}"
        );
        let fr = phones(&referral("fr", Some("FR"), None, Category::Abuse).1);
        assert!(fr.contains(&"3114".into()), "{fr:?}");
        assert!(
            !fr.contains(&"3018".into()),
            "an online-harassment line is no abuse line: {fr:?}"
        );

        let all = CrisisLines::builtin();
        let mut reporting_seen = 0;
        for code in all.countries.keys() {
            for category in Category::ALL {
                let r = all.referral(Some("en"), Some(code), None, category);
                assert!(!r.lines.is_empty());
                assert_eq!(r.lines[0].kind, Kind::Counselling, "{code} {category:?}");
                let kinds: Vec<Kind> = r.lines.iter().map(|l| l.kind).collect();
                let mut sorted = kinds.clone();
                sorted.sort();
                assert_eq!(
                    kinds, sorted,
                    "{code} {category:?}: counselling, reporting, emergency"
                );
                reporting_seen += kinds.iter().filter(|k| **k == Kind::Reporting).count();
                let open_crisis_line = all.countries[code].iter().any(|l| {
                    l.kind == Kind::Counselling
                        && l.always_open()
                        && l.serves.contains(&Category::SelfHarm)
                });
                assert_eq!(
                    r.lines
                        .iter()
                        .any(|l| l.kind == Kind::Counselling && l.always_open()),
                    open_crisis_line,
                    "{code} {category:?}: someone to talk to at any hour, where the country has one"
                );
                if category == Category::SelfHarm {
                    assert!(
                        r.lines.iter().all(|l| l.kind != Kind::Reporting),
                        "{code}: no reporting line for self-harm"
                    );
                }
            }
        }
        assert!(reporting_seen > 0);
    }

    #[test]
    fn the_text_states_what_a_line_costs_when_it_opens_and_what_it_reports() {
        let all = CrisisLines::builtin();
        let mut annotated = 0;
        for lang in LANGS {
            let labels = &all.labels[lang];
            for code in all.countries.keys() {
                for category in Category::ALL {
                    let r = all.referral(Some(lang), Some(code), None, category);
                    assert!(r.text.starts_with(all.referral[lang].trim()));
                    for l in &r.lines {
                        let shown = r
                            .text
                            .lines()
                            .find(|t| t.starts_with(&format!("• {}:", l.name)))
                            .unwrap_or_else(|| panic!("{code}: {} not in the text", l.name));
                        for way in [&l.phone, &l.text, &l.url].into_iter().flatten() {
                            assert!(shown.contains(way.as_str()), "{shown}");
                        }
                        let cost = format!("{}: {}", labels.cost, l.cost);
                        let hours = format!("{}: {}", labels.hours, l.hours);
                        assert_eq!(!l.free(), shown.contains(&cost), "{shown}");
                        assert_eq!(!l.always_open(), shown.contains(&hours), "{shown}");
                        assert_eq!(
                            l.kind == Kind::Reporting,
                            shown.contains(labels.reporting.trim()),
                            "{shown}"
                        );
                        annotated += usize::from(shown.contains(" — "));
                    }
                }
            }
        }
        assert!(annotated > 0);
    }

    #[test]
    fn the_referral_texts_promise_nothing_some_line_cannot_keep() {
        let all = CrisisLines::builtin();
        // Promises some shown line does not keep (free, confidential, reachable right now): no text makes them.
        let promises: [(&str, &[&str]); 6] = [
            ("en", &["free", "confidential", "right now, any"]),
            ("es", &["gratuit", "confidencial"]),
            ("pt", &["gratuit", "confidencia"]),
            ("fr", &["gratuit", "confidentiel"]),
            ("de", &["kostenlos", "vertraulich", "jederzeit"]),
            ("ja", &["無料", "秘密"]),
        ];
        for (lang, words) in promises {
            for text in [&all.referral[lang], &all.no_country[lang]] {
                let lower = text.to_lowercase();
                for w in words {
                    assert!(!lower.contains(w), "{lang}: {w:?} in {text}");
                }
            }
        }
        // Some shown line is indeed neither free nor open at all hours, and some reports.
        let lines = all.countries.values().flatten();
        assert!(lines.clone().any(|l| !l.free()));
        assert!(lines.clone().any(|l| !l.always_open()));
        assert!(lines.clone().any(|l| l.kind == Kind::Reporting));
    }

    #[test]
    fn the_language_falls_back_to_english() {
        let lines = CrisisLines::builtin();
        assert_eq!(lines.language(Some("pt-BR")), "pt");
        assert_eq!(lines.language(Some("JA")), "ja");
        assert_eq!(lines.language(Some("ko")), "en");
        assert_eq!(lines.language(None), "en");
        let r = lines.referral(None, Some("GB"), None, Category::SelfHarm);
        assert!(r.text.contains("real person"), "{}", r.text);
    }

    #[test]
    fn the_card_carries_what_the_user_needs_and_not_the_evidence() {
        let lines = CrisisLines::builtin();
        let r = lines.referral(Some("en"), Some("US"), None, Category::Grooming);
        let card =
            serde_json::to_value(r.lines.iter().map(|l| l.card()).collect::<Vec<_>>()).unwrap();
        for l in card.as_array().unwrap() {
            for field in ["name", "kind", "hours", "cost"] {
                assert!(l[field].is_string(), "{l}");
            }
            for never in ["source", "checked", "evidence", "serves"] {
                assert!(l.get(never).is_none(), "{l}");
            }
        }
        assert!(
            card.as_array()
                .unwrap()
                .iter()
                .any(|l| l["kind"] == "reporting")
        );
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
        assert_eq!(country_of_time_zone("America/Puerto_Rico"), Some("PR"));
        assert_eq!(country_of_time_zone("UTC"), None);
        assert_eq!(country_of_time_zone("Etc/UTC"), None);
    }

    #[test]
    fn a_country_by_time_zone_when_the_profile_s_is_not_configured() {
        let lines = CrisisLines::builtin();
        assert_eq!(
            lines.country_of(None, Some("America/Sao_Paulo")),
            Some("BR")
        );
        assert_eq!(
            lines.country_of(Some("XX"), Some("Australia/Perth")),
            Some("AU")
        );
        assert_eq!(
            lines.country_of(Some("gb"), Some("America/New_York")),
            Some("GB")
        );
    }
}
