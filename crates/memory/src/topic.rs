//! What a fact is about. A topic that holds one value (stance, level, home spot, name) is replaced by a
//! newer fact of the same topic; the others hold many facts, and only a near-duplicate replaces one.

use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Topic {
    Name,
    Level,
    Stance,
    HomeSpot,
    Sport,
    Goal,
    Injury,
    Gear,
    Like,
    Fear,
    Other,
}

impl Topic {
    pub(crate) const ALL: [Topic; 11] = [
        Topic::Name,
        Topic::Level,
        Topic::Stance,
        Topic::HomeSpot,
        Topic::Sport,
        Topic::Goal,
        Topic::Injury,
        Topic::Gear,
        Topic::Like,
        Topic::Fear,
        Topic::Other,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Topic::Name => "name",
            Topic::Level => "level",
            Topic::Stance => "stance",
            Topic::HomeSpot => "home_spot",
            Topic::Sport => "sport",
            Topic::Goal => "goal",
            Topic::Injury => "injury",
            Topic::Gear => "gear",
            Topic::Like => "like",
            Topic::Fear => "fear",
            Topic::Other => "other",
        }
    }

    pub(crate) fn parse(s: &str) -> Option<Topic> {
        let s = s.trim().to_ascii_lowercase().replace([' ', '-'], "_");
        Topic::ALL.into_iter().find(|t| t.as_str() == s)
    }

    /// One value at a time: a newer fact replaces the older.
    pub(crate) fn single(self) -> bool {
        matches!(
            self,
            Topic::Name | Topic::Level | Topic::Stance | Topic::HomeSpot
        )
    }

    /// In every prompt of the user's DM with the companion, whatever the message.
    pub(crate) fn pinned(self) -> bool {
        self.single()
    }

    /// How the prompt labels it.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Topic::Name => "name",
            Topic::Level => "level",
            Topic::Stance => "stance",
            Topic::HomeSpot => "home spot",
            Topic::Sport => "rides",
            Topic::Goal => "goal",
            Topic::Injury => "injury",
            Topic::Gear => "gear",
            Topic::Like => "likes",
            Topic::Fear => "afraid of",
            Topic::Other => "note",
        }
    }
}

/// Words that place a fact under a topic, first match wins (lower-case, matched in the lower-cased
/// fact). Used for what the user asks to remember; the extraction model names the topic itself.
const RULES: &[(Topic, &[&str])] = &[
    (
        Topic::Injury,
        &[
            "broke",
            "broken",
            "injur",
            "sprain",
            "fracture",
            "concussion",
            "hurt my",
            "torn",
            "surgery",
            "cast",
            "bruised",
        ],
    ),
    (
        Topic::Fear,
        &[
            "scared",
            "afraid",
            "fear",
            "nervous about",
            "terrified",
            "freaks me out",
        ],
    ),
    (
        Topic::Stance,
        &[
            "goofy",
            "regular stance",
            "ride regular",
            "rides regular",
            "switch stance",
            "mongo",
        ],
    ),
    (
        Topic::HomeSpot,
        &[
            "home park",
            "home spot",
            "local park",
            "local spot",
            "usually skate at",
            "usually ride at",
            "my park is",
        ],
    ),
    (
        Topic::Level,
        &[
            "beginner",
            "intermediate",
            "advanced",
            "just started",
            "been skating for",
            "been riding for",
            "years of riding",
            "pro level",
            "newbie",
        ],
    ),
    (
        Topic::Name,
        &["my name is", "call me ", "i'm called", "name's "],
    ),
    (
        Topic::Goal,
        &[
            "want to learn",
            "wants to learn",
            "wanna learn",
            "wants to land",
            "goal",
            "trying to land",
            "working on",
            "want to land",
            "dream",
        ],
    ),
    (
        Topic::Gear,
        &[
            "deck", "board", "trucks", "wheels", "bindings", "bike", "helmet", "pads", "shoes",
            "skis",
        ],
    ),
    (
        Topic::Sport,
        &[
            "i skate",
            "i snowboard",
            "i ski",
            "i ride bmx",
            "bmx",
            "snowboard",
            "skateboard",
        ],
    ),
    (
        Topic::Like,
        &["love", "like", "favorite", "favourite", "into "],
    ),
];

/// The topic a fact's words suggest; [`Topic::Other`] when none does.
pub(crate) fn topic_of(fact: &str) -> Topic {
    let f = fact.to_lowercase();
    RULES
        .iter()
        .find(|(_, words)| words.iter().any(|w| f.contains(w)))
        .map_or(Topic::Other, |(t, _)| *t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn facts_fall_under_their_topic() {
        for (fact, topic) in [
            ("rides goofy", Topic::Stance),
            ("I switched to regular stance", Topic::Stance),
            ("home park is Burnside", Topic::HomeSpot),
            ("broke their wrist last month", Topic::Injury),
            ("scared of dropping in", Topic::Fear),
            ("wants to learn kickflips", Topic::Goal),
            ("is a beginner", Topic::Level),
            ("my name is Sam", Topic::Name),
            ("has a birthday in May", Topic::Other),
        ] {
            assert_eq!(topic_of(fact), topic, "{fact}");
        }
        for t in Topic::ALL {
            assert_eq!(Topic::parse(t.as_str()), Some(t));
        }
        assert_eq!(Topic::parse("Home Spot"), Some(Topic::HomeSpot));
        assert_eq!(Topic::parse("weather"), None);
    }
}

/// A remembered statement as facts of one topic each: "rides goofy and home park is Glenhaven" is two,
/// so forgetting one leaves the other. Split at ";", "," and " and " only when two parts name different
/// topics; a part of no topic stays with the one before it ("home park is Glenhaven and Burnside").
pub fn one_topic_each(statement: &str) -> Vec<(Topic, String)> {
    let parts: Vec<&str> = statement
        .split(';')
        .flat_map(|p| p.split(','))
        .flat_map(|p| p.split(" and "))
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .collect();
    let mut facts: Vec<(Topic, String)> = Vec::new();
    for part in parts {
        let topic = topic_of(part);
        match facts.last_mut() {
            Some((t, text)) if topic == Topic::Other || topic == *t => {
                text.push_str(" and ");
                text.push_str(part);
            }
            _ => facts.push((topic, part.to_owned())),
        }
    }
    let topics: std::collections::HashSet<Topic> = facts
        .iter()
        .map(|(t, _)| *t)
        .filter(|t| *t != Topic::Other)
        .collect();
    match topics.len() >= 2 {
        true => facts,
        false => vec![(topic_of(statement), statement.trim().to_owned())],
    }
}

/// What a request to forget names: a topic alone ("my stance", "what I told you about my goals"), or the
/// words of a fact ("that I ride goofy"), as stemmed content words.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Named {
    Topic(Topic),
    Words(Vec<String>),
}

/// Words that carry nothing of what is to be forgotten ("forget what I told you about my …").
const FILLER: &[&str] = &[
    "a",
    "about",
    "all",
    "an",
    "and",
    "any",
    "anything",
    "are",
    "bout",
    "could",
    "do",
    "ever",
    "everything",
    "for",
    "forget",
    "from",
    "had",
    "has",
    "have",
    "her",
    "his",
    "i",
    "i'd",
    "i'm",
    "i've",
    "info",
    "information",
    "is",
    "it",
    "just",
    "know",
    "me",
    "mentioned",
    "my",
    "of",
    "on",
    "please",
    "pls",
    "remember",
    "said",
    "say",
    "stuff",
    "tell",
    "that",
    "the",
    "their",
    "them",
    "they",
    "thing",
    "things",
    "to",
    "told",
    "user",
    "user's",
    "users",
    "was",
    "were",
    "what",
    "you",
    "your",
];

/// The words that name each topic on their own.
fn named_topic(word: &str) -> Option<Topic> {
    Some(match word {
        "name" | "called" => Topic::Name,
        "level" | "skill" => Topic::Level,
        "stance" | "footed" => Topic::Stance,
        "home" | "park" | "spot" | "local" => Topic::HomeSpot,
        "sport" => Topic::Sport,
        "goal" | "aim" | "plan" | "target" => Topic::Goal,
        "injury" | "injured" | "hurt" => Topic::Injury,
        "gear" | "setup" | "equipment" => Topic::Gear,
        "like" | "favorite" | "favourite" => Topic::Like,
        "fear" | "scared" | "afraid" => Topic::Fear,
        _ => return None,
    })
}

/// A word, lower case, without a plural or third-person `s` ("rides" → "ride", "injuries" →
/// "injury"), so "I ride goofy" meets "rides goofy".
pub(crate) fn stem(word: &str) -> String {
    let w = word.to_lowercase();
    if let Some(base) = w.strip_suffix("ies").filter(|b| b.len() >= 2) {
        return format!("{base}y");
    }
    match w.strip_suffix('s') {
        Some(base) if base.len() >= 3 && !base.ends_with('s') => base.to_owned(),
        _ => w,
    }
}

/// The stemmed content words of `text`.
pub(crate) fn content_words(text: &str) -> Vec<String> {
    text.split(|c: char| !(c.is_alphanumeric() || c == '\''))
        .map(|w| w.trim_matches('\'').to_lowercase())
        .filter(|w| !w.is_empty() && !FILLER.contains(&w.as_str()))
        .map(|w| stem(&w))
        .collect()
}

/// What `about` names: a topic when every content word names the same one, else its content words.
pub(crate) fn named(about: &str) -> Named {
    let words = content_words(about);
    let topics: Vec<Option<Topic>> = words.iter().map(|w| named_topic(w)).collect();
    match topics.first() {
        Some(Some(t)) if topics.iter().all(|x| *x == Some(*t)) => Named::Topic(*t),
        _ => Named::Words(words),
    }
}

#[cfg(test)]
mod forget_tests {
    use super::*;

    #[test]
    fn a_topic_named_alone_is_the_topic_and_a_fact_is_its_words() {
        for about in [
            "my stance",
            "what I told you about my stance",
            "the user's stance",
            "stance",
        ] {
            assert_eq!(named(about), Named::Topic(Topic::Stance), "{about}");
        }
        assert_eq!(named("my goals"), Named::Topic(Topic::Goal));
        assert_eq!(named("my home park"), Named::Topic(Topic::HomeSpot));
        assert_eq!(named("my injuries"), Named::Topic(Topic::Injury));
        assert_eq!(
            named("that I ride goofy"),
            Named::Words(vec!["ride".into(), "goofy".into()])
        );
        assert_eq!(
            named("that I want to learn a kickflip"),
            Named::Words(vec!["want".into(), "learn".into(), "kickflip".into()])
        );
        assert_eq!(
            one_topic_each("rides goofy and home park is Glenhaven"),
            [
                (Topic::Stance, "rides goofy".to_owned()),
                (Topic::HomeSpot, "home park is Glenhaven".to_owned())
            ]
        );
        assert_eq!(
            one_topic_each("home park is Glenhaven and Burnside"),
            [(
                Topic::HomeSpot,
                "home park is Glenhaven and Burnside".to_owned()
            )]
        );
        assert_eq!(
            one_topic_each("wants to learn kickflips, heelflips and shuvits"),
            [(
                Topic::Goal,
                "wants to learn kickflips, heelflips and shuvits".to_owned()
            )]
        );
        assert_eq!(stem("rides"), "ride");
        assert_eq!(stem("glass"), "glass");
    }
}
