//! Who answers a group message: the rules, as pure functions of the text, the group's companions and
//! what was said. The handling ([`super`]) fixes their answer in the journal once per message.
//!
//! 1. Companions the message names (`@kaori`, `Kaori`, `tony's`) answer, in the order first named.
//! 2. Otherwise a content-free acknowledgement ("lol", "ok", "nice", emoji only) gets no answer.
//! 3. Otherwise the companion whose profile fits the message best answers, unless it beats the
//!    conversation's last speaker by less than the margin: then the last speaker keeps the floor.
//! 4. A reply that names another companion of the group hands over to it; hand-overs and messages per
//!    user message are bounded ([`Bounds`]).

use std::collections::VecDeque;

use bson::oid::ObjectId;

use crate::character::Character;

/// A companion of the group.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Member<'a> {
    pub(crate) bot: ObjectId,
    pub(crate) character: &'a Character,
}

impl Member<'_> {
    /// The text a message is compared with to find the best fit.
    pub(crate) fn profile(&self) -> String {
        let c = self.character;
        format!(
            "{}, {}. {} Knows about: {}.",
            c.name,
            c.sport,
            c.bio,
            c.topics.join(", ")
        )
    }

    fn is_named_by(&self, word: &str) -> bool {
        let c = self.character;
        word == c.id.to_lowercase()
            || word == c.name.to_lowercase()
            || word == c.username.to_lowercase()
    }
}

/// Why these companions answer (the route's label in metrics and logs).
pub(crate) mod why {
    /// The message names them.
    pub(crate) const MENTION: &str = "mention";
    /// The best fit by profile.
    pub(crate) const FIT: &str = "fit";
    /// The last speaker kept the floor (no other fits clearly better).
    pub(crate) const FLOOR: &str = "floor";
    /// No way to compare (model not installed, nothing to compare): the last speaker, or the first.
    pub(crate) const DEFAULT: &str = "default";
    /// A content-free acknowledgement: nobody answers.
    pub(crate) const ACKNOWLEDGEMENT: &str = "acknowledgement";
}

/// The words of `text`, lowercased (letters, digits and `_`; `@` and punctuation split them).
fn words(text: &str) -> impl Iterator<Item = String> + '_ {
    text.split(|c: char| !(c.is_alphanumeric() || c == '_'))
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
}

/// The companions `text` names, in the order first named; none twice.
pub(crate) fn named(text: &str, members: &[Member<'_>]) -> Vec<ObjectId> {
    let mut out = Vec::new();
    for w in words(text) {
        if let Some(m) = members.iter().find(|m| m.is_named_by(&w))
            && !out.contains(&m.bot)
        {
            out.push(m.bot);
        }
    }
    out
}

/// Words that carry no question or news on their own.
const ACKNOWLEDGEMENTS: &[&str] = &[
    "lol", "lmao", "lmfao", "rofl", "ok", "okay", "k", "kk", "nice", "cool", "yes", "yeah", "yep",
    "yup", "ya", "ye", "no", "nah", "nope", "thanks", "thank", "you", "thx", "ty", "tysm", "sweet",
    "dope", "sick", "rad", "word", "bet", "true", "facts", "same", "wow", "damn", "omg", "yay",
    "gg", "hmm", "hm", "ah", "oh", "alright", "sure", "fr", "ikr", "w", "lit", "fire", "legit",
    "based", "great", "awesome", "love", "it", "that", "this", "so", "good", "haha", "hehe", "xd",
    "oof", "mood", "valid", "noted", "got", "gotcha",
];

/// Repeated letters squeezed (`lolll` → `lol`, `niceee` → `nice`).
fn squeeze(word: &str) -> String {
    let mut out = String::with_capacity(word.len());
    for c in word.chars() {
        if !out.ends_with(c) {
            out.push(c);
        }
    }
    out
}

/// Laughter: `haha`, `hahaha`, `hehe`, `ahah`.
fn is_laugh(word: &str) -> bool {
    word.len() >= 3 && word.contains('h') && word.chars().all(|c| matches!(c, 'h' | 'a' | 'e'))
}

/// A message with nothing to answer: no letters or digits at all (emoji, punctuation), or at most six
/// words that are all acknowledgements.
pub(crate) fn is_acknowledgement(text: &str) -> bool {
    let words: Vec<String> = words(text).collect();
    if words.is_empty() {
        return true;
    }
    words.len() <= 6
        && words.iter().all(|w| {
            let s = squeeze(w);
            ACKNOWLEDGEMENTS.contains(&w.as_str())
                || ACKNOWLEDGEMENTS.contains(&s.as_str())
                || is_laugh(&s)
        })
}

/// The best fit among `scores` (one per member), or the last speaker when the best one beats it by
/// less than `margin`.
pub(crate) fn best_fit(
    scores: &[(ObjectId, f32)],
    last_speaker: Option<ObjectId>,
    margin: f32,
) -> Option<(ObjectId, &'static str)> {
    let (best, top) =
        scores
            .iter()
            .copied()
            .fold(None, |acc: Option<(ObjectId, f32)>, (b, s)| match acc {
                Some((_, t)) if t >= s => acc,
                _ => Some((b, s)),
            })?;
    let floor = last_speaker.and_then(|l| scores.iter().find(|(b, _)| *b == l));
    Some(match floor {
        Some(&(last, score)) if last != best && top - score < margin => (last, why::FLOOR),
        _ => (best, why::FIT),
    })
}

/// The companion a reply of `speaker` hands over to: the first other member it names.
pub(crate) fn handover(reply: &str, speaker: ObjectId, members: &[Member<'_>]) -> Option<ObjectId> {
    named(reply, members).into_iter().find(|b| *b != speaker)
}

/// How far one user message may go.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Bounds {
    /// Hand-overs after the first answers.
    pub(crate) max_handovers: u32,
    /// Companion messages in all.
    pub(crate) max_messages: u32,
}

/// Who speaks next, from the route's speakers and the messages so far (each with the companion it
/// named, if any); `None` when nobody is left or a bound is reached. A hand-over goes to the back of
/// the queue unless that companion is queued already; each one accepted counts against the bound.
pub(crate) fn next_speaker(
    route: &[ObjectId],
    said: &[(ObjectId, Option<ObjectId>)],
    bounds: Bounds,
) -> Option<Next> {
    if said.len() >= bounds.max_messages as usize {
        return None;
    }
    let mut queue: VecDeque<(ObjectId, bool)> = route.iter().map(|b| (*b, false)).collect();
    let mut handovers = 0;
    for (_, tagged) in said {
        queue.pop_front();
        if let Some(t) = tagged
            && handovers < bounds.max_handovers
            && !queue.iter().any(|(b, _)| b == t)
        {
            queue.push_back((*t, true));
            handovers += 1;
        }
    }
    queue
        .pop_front()
        .map(|(bot, handed_over)| Next { bot, handed_over })
}

/// The next companion to speak.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Next {
    pub(crate) bot: ObjectId,
    /// It speaks because another companion named it.
    pub(crate) handed_over: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn character(id: &str, name: &str, username: &str) -> Character {
        serde_json::from_value(serde_json::json!({
            "id": id, "name": name, "username": username, "sport": "skateboard", "bio": "b",
            "failureLine": "f"
        }))
        .unwrap()
    }

    #[test]
    fn names_are_found_in_order_once_with_at_signs_and_possessives() {
        let (k, t, z) = (
            character("kaori", "Kaori", "kaori_ssx"),
            character("tony", "Tony", "tony_sk8"),
            character("zoe", "Zoe", "zoe_ski"),
        );
        let ids = [ObjectId::new(), ObjectId::new(), ObjectId::new()];
        let members = [
            Member {
                bot: ids[0],
                character: &k,
            },
            Member {
                bot: ids[1],
                character: &t,
            },
            Member {
                bot: ids[2],
                character: &z,
            },
        ];
        assert_eq!(
            named("@Tony and kaori's take? TONY!", &members),
            vec![ids[1], ids[0]]
        );
        assert_eq!(named("ask @zoe_ski", &members), vec![ids[2]]);
        assert!(named("tonya hawk", &members).is_empty());
        assert_eq!(
            handover("tony help me out here", ids[0], &members),
            Some(ids[1])
        );
        assert_eq!(handover("i'm kaori lol", ids[0], &members), None);
    }

    #[test]
    fn acknowledgements_are_content_free() {
        for t in [
            "lol",
            "LOLLL",
            "ok!",
            "nice 🔥",
            "🔥🔥",
            "haha ok",
            "thank you!",
            "...",
            "hahaha",
        ] {
            assert!(is_acknowledgement(t), "{t}");
        }
        for t in [
            "ok but how do i kickflip",
            "lol what board do you ride?",
            "nice, what about ollies",
            "help",
        ] {
            assert!(!is_acknowledgement(t), "{t}");
        }
    }

    #[test]
    fn the_best_fit_wins_unless_the_last_speaker_is_close() {
        let (a, b) = (ObjectId::new(), ObjectId::new());
        assert_eq!(
            best_fit(&[(a, 0.2), (b, 0.5)], None, 0.05),
            Some((b, why::FIT))
        );
        assert_eq!(
            best_fit(&[(a, 0.47), (b, 0.5)], Some(a), 0.05),
            Some((a, why::FLOOR))
        );
        assert_eq!(
            best_fit(&[(a, 0.3), (b, 0.5)], Some(a), 0.05),
            Some((b, why::FIT))
        );
        assert_eq!(best_fit(&[], Some(a), 0.05), None);
    }

    #[test]
    fn hand_overs_and_messages_are_bounded() {
        let (a, b, c) = (ObjectId::new(), ObjectId::new(), ObjectId::new());
        let bounds = Bounds {
            max_handovers: 2,
            max_messages: 3,
        };
        let next = |route: &[ObjectId], said: &[(ObjectId, Option<ObjectId>)]| {
            next_speaker(route, said, bounds).map(|n| (n.bot, n.handed_over))
        };
        assert_eq!(next(&[a], &[]), Some((a, false)));
        assert_eq!(next(&[a], &[(a, None)]), None);
        assert_eq!(next(&[a], &[(a, Some(b))]), Some((b, true)));
        // Endless tagging stops at the message bound.
        assert_eq!(next(&[a], &[(a, Some(b)), (b, Some(a))]), Some((a, true)));
        assert_eq!(
            next(&[a], &[(a, Some(b)), (b, Some(a)), (a, Some(b))]),
            None
        );
        // Two mentioned: both answer; a tag of the one queued adds nobody.
        assert_eq!(next(&[a, b], &[(a, Some(b))]), Some((b, false)));
        assert_eq!(next(&[a, b], &[(a, Some(b)), (b, None)]), None);
        // The hand-over bound, with room for more messages.
        let wide = Bounds {
            max_handovers: 1,
            max_messages: 9,
        };
        let said = [(a, Some(b)), (b, Some(c))];
        assert_eq!(next_speaker(&[a], &said, wide), None);
    }
}
