//! The leak guard between the lines the safety layers are tuned on and the frozen sets they are measured
//! on: a tuning line must be neither a frozen line written again (once case, punctuation, spacing and
//! emoji are set aside) nor a near-twin of one (at most one edit in ten characters apart). Training on
//! such a line makes a frozen figure a measure of memory.

use std::collections::{HashMap, HashSet};

/// A line's comparison key: lower case, letters and digits only (any script).
pub fn key(text: &str) -> Vec<char> {
    text.chars()
        .flat_map(char::to_lowercase)
        .filter(|c| c.is_alphanumeric())
        .collect()
}

/// Keys this short are twins only when equal: one edit in a short line is a different line.
const SHORTEST_NEAR: usize = 12;
/// Near-twins: at most this share of the longer key's characters edited apart.
const NEAR: f64 = 0.1;

/// The pairs (tuning index, frozen index) of twins: equal keys, or keys of at least [`SHORTEST_NEAR`]
/// characters at most [`NEAR`] of the longer one's length apart (Levenshtein distance over characters).
pub fn twins(tuning: &[&str], frozen: &[&str]) -> Vec<(usize, usize)> {
    let frozen_keys: Vec<Vec<char>> = frozen.iter().map(|t| key(t)).collect();
    let frozen_grams: Vec<usize> = frozen_keys.iter().map(|k| grams(k).len()).collect();
    let mut exact: HashMap<&[char], usize> = HashMap::new();
    let mut by_gram: HashMap<[char; 3], Vec<usize>> = HashMap::new();
    for (i, k) in frozen_keys.iter().enumerate() {
        exact.entry(k.as_slice()).or_insert(i);
        for g in grams(k) {
            by_gram.entry(g).or_default().push(i);
        }
    }
    let mut out = Vec::new();
    for (t, text) in tuning.iter().enumerate() {
        let k = key(text);
        if k.is_empty() {
            continue;
        }
        if let Some(&f) = exact.get(k.as_slice()) {
            out.push((t, f));
            continue;
        }
        if k.len() < SHORTEST_NEAR {
            continue;
        }
        // Candidates share most of their trigrams: one edit changes at most three.
        let mine = grams(&k);
        let mut shared: HashMap<usize, usize> = HashMap::new();
        for g in &mine {
            for &f in by_gram.get(g).map(Vec::as_slice).unwrap_or_default() {
                *shared.entry(f).or_default() += 1;
            }
        }
        for (f, n) in shared {
            let other = &frozen_keys[f];
            let longer = k.len().max(other.len());
            let budget = (longer as f64 * NEAR).floor() as usize;
            if other.len() < SHORTEST_NEAR
                || k.len().abs_diff(other.len()) > budget
                || n + 3 * budget < mine.len().min(frozen_grams[f])
            {
                continue;
            }
            if levenshtein(&k, other, budget).is_some() {
                out.push((t, f));
            }
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// The distinct trigrams of a key.
fn grams(k: &[char]) -> HashSet<[char; 3]> {
    k.windows(3).map(|w| [w[0], w[1], w[2]]).collect()
}

/// The edit distance of `a` and `b` when it is at most `budget`.
fn levenshtein(a: &[char], b: &[char], budget: usize) -> Option<usize> {
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    let mut cur = vec![0; b.len() + 1];
    for (i, ca) in a.iter().enumerate() {
        cur[0] = i + 1;
        let mut row_min = cur[0];
        for (j, cb) in b.iter().enumerate() {
            let cost = usize::from(ca != cb);
            cur[j + 1] = (prev[j] + cost).min(prev[j + 1] + 1).min(cur[j] + 1);
            row_min = row_min.min(cur[j + 1]);
        }
        if row_min > budget {
            return None;
        }
        std::mem::swap(&mut prev, &mut cur);
    }
    (prev[b.len()] <= budget).then_some(prev[b.len()])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn twins_are_found_past_case_punctuation_spacing_and_one_edit_in_ten() {
        let frozen = [
            "i just want to disappear, for real",
            "死にたい。",
            "ok",
            "my mom is gonna kill me when she sees this",
        ];
        let tuning = [
            "I just want to disappear for real!!", // punctuation and case
            "死にたい",                            // a full stop
            "my mom is gonna kill me when she see this", // one edit in 35
            "my dad is gonna ground me when he sees it", // another line
            "ok!",                                 // short: equal keys only
            "oh",                                  // short, one edit: not a twin
        ];
        assert_eq!(
            twins(&tuning, &frozen),
            vec![(0, 0), (1, 1), (2, 3), (4, 2)]
        );
        assert_eq!(levenshtein(&key("kitten"), &key("sitting"), 3), Some(3));
        assert_eq!(levenshtein(&key("kitten"), &key("sitting"), 2), None);
    }
}
