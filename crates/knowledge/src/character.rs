//! Companion characters: personality files in `characters/*.json`, looked up by the bot's user id.

use std::{collections::HashMap, path::Path};

use bson::{doc, oid::ObjectId};
use serde::Deserialize;

use crate::store::{Mongo, StoreError, USERS};

/// One companion, as written in its character file.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Character {
    /// Stable slug (`kaori`), used in logs and as `createdBy` on what the companion creates.
    pub id: String,
    pub name: String,
    #[serde(default)]
    pub emoji: String,
    /// The bot's user `_id` in MongoDB; when absent it is looked up by `username` at start-up.
    #[serde(default)]
    pub(crate) bot_user_id: Option<String>,
    pub username: String,
    /// The companion's sport, e.g. `snowboard`.
    pub sport: String,
    pub bio: String,
    #[serde(default)]
    pub lore: Vec<String>,
    #[serde(default)]
    pub personality: Vec<String>,
    #[serde(default)]
    pub style: Style,
    #[serde(default)]
    pub topics: Vec<String>,
    #[serde(default)]
    pub message_examples: Vec<Example>,
    /// Said, honestly and in character, when a turn cannot be answered.
    pub failure_line: String,
    /// Said once when a user sends faster than the companion answers.
    #[serde(default = "default_busy_line")]
    pub busy_line: String,
    /// Said instead of an answer while the user's or the service's spend budget is used up.
    #[serde(default = "default_budget_line")]
    pub budget_line: String,
    /// Knowledge-base collections this companion retrieves from.
    #[serde(default)]
    pub knowledge: Vec<String>,
    /// Model override for this companion.
    #[serde(default)]
    pub model: Option<String>,
    /// Guided flows this companion offers (ids of `flows/*.json`).
    #[serde(default)]
    pub flows: Vec<String>,
    /// Plain lines for follow-ups, sent when the model cannot write them.
    #[serde(default)]
    pub follow_ups: FollowUps,
    /// Says plainly that the companion is an AI, a computer program, not a human, and cannot feel
    /// human emotion: on the first message of the user's day and every few hours of a continuing
    /// interaction (docs/safety.md).
    #[serde(default = "default_disclosure_line")]
    pub disclosure_line: String,
    /// The companion's own answer to a user in crisis when the model cannot write one (it failed, the
    /// user is limited or over budget, a moderator paused the conversation): fixed and reviewed.
    #[serde(default = "default_crisis_line")]
    pub crisis_line: String,
    /// Rides on a minor's message after hours of continuing interaction.
    #[serde(default = "default_break_line")]
    pub break_line: String,
    /// Replaces a message the output check blocked.
    #[serde(default = "default_safe_line")]
    pub safe_line: String,
}

/// The plain sentence every character may say in its own voice instead.
pub(crate) const DISCLOSURE: &str = "Just so you know: I'm an AI, a computer program, not a human, and I can't feel human emotions.";

fn default_disclosure_line() -> String {
    DISCLOSURE.into()
}

fn default_crisis_line() -> String {
    "i'm really glad you told me, and i'm taking it seriously. i'm an AI, so please reach out to one of the people above or someone you trust right now. you don't have to deal with this alone."
        .into()
}

fn default_break_line() -> String {
    "we've been chatting for a while, time for a break? go ride, drink some water, and come back whenever.".into()
}

fn default_safe_line() -> String {
    "let's keep it about riding. what are you working on right now?".into()
}

fn default_busy_line() -> String {
    "you're sending messages faster than i can read them, give me a minute to catch up".into()
}

fn default_budget_line() -> String {
    "i've talked a lot today and need a break, so no real answer from me right now. message me again tomorrow?"
        .into()
}

/// Templated follow-up lines: `{spot}` is the spot's name, `{note}` the moderator's reason (a sentence
/// of its own, or nothing), `{text}` the reminder.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct FollowUps {
    pub spot_approved: String,
    pub spot_rejected: String,
    pub reminder: String,
}

impl Default for FollowUps {
    fn default() -> Self {
        Self {
            spot_approved: "good news: {spot} got approved and is live on TrickBook now!".into(),
            spot_rejected: "the moderators didn't approve {spot}.{note}".into(),
            reminder: "reminder: {text}".into(),
        }
    }
}

/// `template` with each `{name}` replaced by its value.
pub fn fill(template: &str, values: &[(&str, &str)]) -> String {
    values.iter().fold(template.to_owned(), |t, (name, value)| {
        t.replace(&format!("{{{name}}}"), value)
    })
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Style {
    #[serde(default)]
    pub all: Vec<String>,
    #[serde(default)]
    pub chat: Vec<String>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Example {
    pub user: String,
    pub assistant: String,
}

#[derive(Debug, thiserror::Error)]
pub enum CharacterError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{path} is not a valid character file: {source}")]
    Parse {
        path: String,
        source: serde_json::Error,
    },
    #[error("{path}: botUserId `{id}` is not a 24-hex ObjectId")]
    BadId { path: String, id: String },
    #[error("no character files in {0}")]
    Empty(String),
    #[error("character `{0}` has no botUserId and no bot user named `{1}` exists")]
    Unresolved(String, String),
    #[error("two characters share bot user {0}")]
    Duplicate(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// All characters, by bot user id.
#[derive(Clone, Debug, Default)]
pub struct Characters {
    by_bot: HashMap<ObjectId, Character>,
    unresolved: Vec<Character>,
}

impl Characters {
    /// Reads every `*.json` in `dir`.
    pub fn load(dir: &Path) -> Result<Self, CharacterError> {
        let io = |source| CharacterError::Io {
            path: dir.display().to_string(),
            source,
        };
        let mut paths: Vec<_> = std::fs::read_dir(dir)
            .map_err(io)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .collect();
        paths.sort();
        let mut out = Self::default();
        for path in &paths {
            let p = path.display().to_string();
            let text = std::fs::read_to_string(path).map_err(|source| CharacterError::Io {
                path: p.clone(),
                source,
            })?;
            let c: Character =
                serde_json::from_str(&text).map_err(|source| CharacterError::Parse {
                    path: p.clone(),
                    source,
                })?;
            out.add(c, &p)?;
        }
        if out.by_bot.is_empty() && out.unresolved.is_empty() {
            return Err(CharacterError::Empty(dir.display().to_string()));
        }
        Ok(out)
    }

    fn add(&mut self, c: Character, path: &str) -> Result<(), CharacterError> {
        match c.bot_user_id.clone() {
            Some(id) => {
                let oid = crate::bus::event::parse_object_id(&id).ok_or_else(|| {
                    CharacterError::BadId {
                        path: path.to_owned(),
                        id: id.clone(),
                    }
                })?;
                if self.by_bot.insert(oid, c).is_some() {
                    return Err(CharacterError::Duplicate(id));
                }
            }
            None => self.unresolved.push(c),
        }
        Ok(())
    }

    /// Finds the bot users of characters that only name a username.
    pub async fn resolve(&mut self, mongo: &Mongo) -> Result<(), CharacterError> {
        for mut c in std::mem::take(&mut self.unresolved) {
            let user = mongo
                .collection(USERS)
                .find_one(doc! { "username": &c.username, "isBot": true })
                .await
                .map_err(StoreError::from)?;
            let Some(id) = user.and_then(|u| u.get_object_id("_id").ok()) else {
                return Err(CharacterError::Unresolved(c.id.clone(), c.username.clone()));
            };
            c.bot_user_id = Some(id.to_hex());
            if self.by_bot.insert(id, c).is_some() {
                return Err(CharacterError::Duplicate(id.to_hex()));
            }
        }
        Ok(())
    }

    pub fn by_bot(&self, bot: &ObjectId) -> Option<&Character> {
        self.by_bot.get(bot)
    }

    /// By slug or username, case-insensitive (for the terminal commands).
    pub fn by_name(&self, name: &str) -> Option<(ObjectId, &Character)> {
        self.by_bot
            .iter()
            .find(|(_, c)| {
                c.id.eq_ignore_ascii_case(name)
                    || c.username.eq_ignore_ascii_case(name)
                    || c.name.eq_ignore_ascii_case(name)
            })
            .map(|(id, c)| (*id, c))
    }

    pub fn iter(&self) -> impl Iterator<Item = (&ObjectId, &Character)> {
        self.by_bot.iter()
    }

    /// The characters loaded, with a bot id or not yet resolved to one.
    pub fn count(&self) -> usize {
        self.by_bot.len() + self.unresolved.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_character_says_it_is_an_ai_and_none_claims_to_be_human() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../characters");
        let claims = regex::Regex::new(
            r"(?i)\b(i'?m|i am|im) (a |an )?(real )?(human|person|girl|boy|guy)\b|not an? (ai|bot)\b|crush|boyfriend|girlfriend",
        )
        .unwrap();
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let text = std::fs::read_to_string(&path).unwrap().to_lowercase();
            let found: Vec<&str> = claims.find_iter(&text).map(|m| m.as_str()).collect();
            assert!(found.is_empty(), "{}: {found:?}", path.display());
        }
        let chars = Characters::load(&dir).unwrap();
        for (_, c) in chars.iter() {
            let d = c.disclosure_line.to_lowercase();
            assert!(d.contains(" ai") && d.contains("not a"), "{}: {d}", c.id);
            assert!(d.contains("emotion"), "{}: {d}", c.id);
        }
    }

    #[test]
    fn shipped_characters_load_and_are_complete() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../characters");
        let chars = Characters::load(&dir).unwrap();
        assert_eq!(chars.count(), 5);
        for (_, c) in chars.iter() {
            assert!(!c.failure_line.is_empty(), "{} has a failure line", c.id);
            assert!(c.message_examples.len() >= 3, "{} has examples", c.id);
            assert!(!c.style.all.is_empty(), "{} has style rules", c.id);
        }
        let (id, kaori) = chars.by_name("kaori").unwrap();
        assert_eq!(id.to_hex(), "69c15e55c7ebe2c6884f1267");
        assert_eq!(kaori.sport, "snowboard");
        for (_, c) in chars.iter() {
            let f = &c.follow_ups;
            assert!(f.spot_approved.contains("{spot}"), "{}", c.id);
            assert!(f.spot_rejected.contains("{spot}"), "{}", c.id);
            assert!(f.spot_rejected.contains("{note}"), "{}", c.id);
            assert!(f.reminder.contains("{text}"), "{}", c.id);
        }
    }

    #[test]
    fn follow_up_templates_fill_every_placeholder() {
        let f = FollowUps::default();
        let line = fill(
            &f.spot_rejected,
            &[("spot", "Burnside"), ("note", " they said: no photos.")],
        );
        assert_eq!(
            line,
            "the moderators didn't approve Burnside. they said: no photos."
        );
    }
}
