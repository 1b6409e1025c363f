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

    pub(crate) fn as_str(self) -> &'static str {
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
