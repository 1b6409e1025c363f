//! What a turn's message costs the embedder: nothing when it carries no content to look up (an
//! acknowledgement, a laugh, an emoji), a cache hit when the same text was embedded lately, a model run
//! otherwise.
//!
//! The cache key is the text lower-cased with its whitespace collapsed: the model's tokenizer is uncased
//! and splits on whitespace, so every text with that key has the same embedding (with the int8 graph, up
//! to the quantisation of the batch it ran in: cosine >= 0.995 either way). The skip rule
//! is deliberately narrow: a message is skipped only when none of its words is a content word (two or
//! more letters, not in [`NO_CONTENT`]); any sport term, name or question word keeps it. The test
//! `a_skipped_message_would_have_retrieved_nothing` checks on the real knowledge base that what is
//! skipped would have found no chunk above the threshold anyway.

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, Mutex},
};

/// Words that carry nothing to retrieve (acknowledgements, laughter, greetings, fillers, pronouns),
/// lower-case. A message made only of these (and emoji, punctuation, digits) is not embedded.
pub(crate) const NO_CONTENT: &[&str] = &[
    "ok", "okay", "okey", "k", "kk", "yes", "yeah", "yea", "yep", "yup", "ya", "no", "nope", "nah",
    "sure", "cool", "nice", "great", "awesome", "sweet", "dope", "sick", "rad", "lit", "fire",
    "thanks", "thank", "thx", "ty", "tysm", "cheers", "you", "u", "so", "much", "a", "lot", "lol",
    "lmao", "rofl", "haha", "hahaha", "hehe", "xd", "omg", "wow", "woah", "whoa", "yay", "hi",
    "hey", "hello", "yo", "sup", "bye", "cya", "later", "gn", "gm", "good", "night", "morning",
    "np", "problem", "alright", "right", "true", "fr", "bet", "word", "same", "agreed", "got",
    "it", "gotcha", "makes", "sense", "i", "see", "oh", "ah", "hmm", "hm", "mhm", "uh", "um",
    "and", "too", "very", "really", "man", "bro", "dude", "girl", "love", "this", "that", "will",
    "do", "did", "me", "my", "ill", "i'll", "im", "i'm", "am", "is", "perfect", "pls", "please",
    "yess", "yesss", "nooo", "ahh", "ohh", "what", "ever", "for", "the", "to", "sounds", "sound",
    "like", "plan", "fun", "glad", "hear", "happy", "we", "go", "let's", "lets",
];

/// The cache key: lower-case, whitespace collapsed (the tokenizer sees no difference).
pub fn normalize(text: &str) -> String {
    text.split_whitespace()
        .map(str::to_lowercase)
        .collect::<Vec<_>>()
        .join(" ")
}

/// True when the message has no content word worth a knowledge lookup.
pub fn needs_no_knowledge(normalized: &str) -> bool {
    normalized
        .split(|c: char| !(c.is_alphanumeric() || c == '\''))
        .filter(|w| w.chars().filter(|c| c.is_alphanumeric()).count() >= 2)
        .all(|w| NO_CONTENT.contains(&w))
}

/// How a turn got its query vector.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Lookup {
    /// No content word: no embedding, no search.
    Skipped,
    /// The same text's vector was in the cache.
    Cached,
    /// The model ran.
    Embedded,
}

impl Lookup {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Skipped => "skipped",
            Self::Cached => "cached",
            Self::Embedded => "embedded",
        }
    }
}

/// A bounded least-recently-used map from normalised text to its vector, shared by all turns.
pub(crate) struct VectorCache {
    inner: Mutex<Lru>,
    capacity: usize,
}

#[derive(Default)]
struct Lru {
    tick: u64,
    entries: HashMap<String, (Arc<Vec<f32>>, u64)>,
    /// Last use → key, oldest first.
    by_use: BTreeMap<u64, String>,
}

impl VectorCache {
    /// A cache of at most `capacity` vectors (0 turns it off).
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            inner: Mutex::new(Lru::default()),
            capacity,
        }
    }

    pub(crate) fn get(&self, key: &str) -> Option<Arc<Vec<f32>>> {
        if self.capacity == 0 {
            return None;
        }
        let mut lru = self.inner.lock().expect("vector cache lock");
        lru.tick += 1;
        let tick = lru.tick;
        let (vector, used) = lru.entries.get_mut(key)?;
        let (vector, old) = (vector.clone(), std::mem::replace(used, tick));
        lru.by_use.remove(&old);
        lru.by_use.insert(tick, key.to_owned());
        Some(vector)
    }

    pub(crate) fn put(&self, key: String, vector: Arc<Vec<f32>>) {
        if self.capacity == 0 {
            return;
        }
        let mut lru = self.inner.lock().expect("vector cache lock");
        lru.tick += 1;
        let tick = lru.tick;
        if let Some((_, old)) = lru.entries.insert(key.clone(), (vector, tick)) {
            lru.by_use.remove(&old);
        }
        lru.by_use.insert(tick, key);
        while lru.entries.len() > self.capacity {
            let Some((_, oldest)) = lru.by_use.pop_first() else {
                break;
            };
            lru.entries.remove(&oldest);
        }
    }
}

#[cfg(test)]
impl VectorCache {
    fn len(&self) -> usize {
        self.inner.lock().expect("vector cache lock").entries.len()
    }

    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_messages_without_a_content_word_are_skipped() {
        for text in [
            "ok thanks!",
            "lol 😂😂",
            "Thank you so much!!",
            "haha yeah",
            "🔥🔥🔥",
            "k",
            "got it, makes sense",
            "cool cool cool",
        ] {
            assert!(needs_no_knowledge(&normalize(text)), "{text:?} is skipped");
        }
        for text in [
            "kickflip?",
            "how do I ollie?",
            "thanks! what about wax for cold days?",
            "ok so where can I skate in Madrid",
            "MACBA",
            "50-50",
            "yes, the heelflip",
        ] {
            assert!(
                !needs_no_knowledge(&normalize(text)),
                "{text:?} is embedded"
            );
        }
    }

    #[test]
    fn texts_the_tokenizer_cannot_tell_apart_share_a_key() {
        assert_eq!(
            normalize("  How do I\tOLLIE? "),
            normalize("how do i ollie?")
        );
        assert_ne!(normalize("how do i ollie?"), normalize("how do i ollie"));
    }

    #[test]
    fn the_cache_keeps_the_most_recently_used() {
        let cache = VectorCache::new(2);
        let v = |x: f32| Arc::new(vec![x]);
        cache.put("a".into(), v(1.0));
        cache.put("b".into(), v(2.0));
        assert_eq!(cache.get("a").unwrap()[0], 1.0); // a is now newer than b
        cache.put("c".into(), v(3.0));
        assert!(cache.get("b").is_none(), "the least recently used went");
        assert_eq!(cache.get("a").unwrap()[0], 1.0);
        assert_eq!(cache.get("c").unwrap()[0], 3.0);
        assert_eq!(cache.len(), 2);
        cache.put("c".into(), v(4.0));
        assert_eq!(cache.get("c").unwrap()[0], 4.0);
        assert_eq!(cache.len(), 2);
        let off = VectorCache::new(0);
        off.put("a".into(), v(1.0));
        assert!(off.get("a").is_none() && off.is_empty());
    }
}
