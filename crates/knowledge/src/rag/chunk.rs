//! Splits an article into chunks the model reads whole: at most `max_tokens` tokens of the model's own
//! tokenizer (its start and end tokens included: MiniLM's `[CLS]` `[SEP]`, e5's `<s>` `</s>`), cut on
//! sentence boundaries where possible, each chunk starting with roughly `overlap` of the previous one.
//! The chunk keeps the article's exact text.

use super::{
    embed::{EmbedError, MAX_TOKENS},
    tokens::Tokens,
};

/// How to chunk.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ChunkConfig {
    /// Longest chunk in tokens including [CLS] and [SEP]; capped at the model's 256.
    pub max_tokens: usize,
    /// Share of a chunk repeated at the start of the next (0.0–0.5).
    pub overlap: f32,
}

impl Default for ChunkConfig {
    fn default() -> Self {
        Self {
            max_tokens: MAX_TOKENS,
            overlap: 0.15,
        }
    }
}

impl ChunkConfig {
    /// Tokens available for text (special tokens and `reserved` taken off).
    fn budget(&self, reserved: usize) -> usize {
        self.max_tokens
            .clamp(16, MAX_TOKENS)
            .saturating_sub(2 + reserved)
            .max(8)
    }

    fn overlap_tokens(&self, budget: usize) -> usize {
        ((budget as f32) * self.overlap.clamp(0.0, 0.5)).round() as usize
    }
}

/// A piece of text: byte range in the source and its token count (no special tokens).
#[derive(Clone, Copy, Debug)]
struct Piece {
    start: usize,
    end: usize,
    tokens: usize,
}

/// Byte ranges of sentences (and paragraphs) in `text`, whitespace trimmed.
pub(crate) fn sentences(text: &str) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let bytes = text.as_bytes();
    let mut start = 0;
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        let boundary = match b {
            b'\n' => bytes.get(i + 1) == Some(&b'\n') || is_block_start(&text[i + 1..]),
            b'.' | b'!' | b'?' => bytes.get(i + 1).is_none_or(|n| n.is_ascii_whitespace()),
            _ => false,
        };
        if boundary {
            push_trimmed(text, start, i + 1, &mut out);
            start = i + 1;
        }
        i += 1;
    }
    push_trimmed(text, start, text.len(), &mut out);
    out
}

/// A new line that starts a list item or heading ends the sentence before it.
fn is_block_start(rest: &str) -> bool {
    let t = rest.trim_start_matches([' ', '\t']);
    t.starts_with("- ") || t.starts_with("* ") || t.starts_with('#')
}

fn push_trimmed(text: &str, start: usize, end: usize, out: &mut Vec<(usize, usize)>) {
    let s = &text[start..end];
    let lead = s.len() - s.trim_start().len();
    let trail = s.len() - s.trim_end().len();
    if lead + trail < s.len() {
        out.push((start + lead, end - trail));
    }
}

/// Chunks `text`; `reserved` tokens per chunk are kept free (e.g. for a title prefix).
pub fn chunk(
    tokenizer: &Tokens,
    text: &str,
    cfg: ChunkConfig,
    reserved: usize,
) -> Result<Vec<String>, EmbedError> {
    let budget = cfg.budget(reserved);
    let overlap = cfg.overlap_tokens(budget);
    let mut pieces = Vec::new();
    for (s, e) in sentences(text) {
        let tokens = count_tokens(tokenizer, &text[s..e])?;
        if tokens <= budget {
            pieces.push(Piece {
                start: s,
                end: e,
                tokens,
            });
        } else {
            split_long(tokenizer, text, s, e, budget, overlap, &mut pieces)?;
        }
    }
    let mut chunks = Vec::new();
    let mut i = 0;
    while i < pieces.len() {
        let mut j = i;
        let mut used = 0;
        while j < pieces.len() && (j == i || used + pieces[j].tokens <= budget) {
            used += pieces[j].tokens;
            j += 1;
        }
        chunks.push(text[pieces[i].start..pieces[j - 1].end].to_owned());
        if j >= pieces.len() {
            break;
        }
        // Step back over whole sentences while they fit in the overlap, always moving forward.
        let mut k = j;
        let mut back = 0;
        while k > i + 1 && back + pieces[k - 1].tokens <= overlap {
            back += pieces[k - 1].tokens;
            k -= 1;
        }
        i = k;
    }
    Ok(chunks)
}

/// Tokens of `text` without special tokens.
pub fn count_tokens(tokenizer: &Tokens, text: &str) -> Result<usize, EmbedError> {
    Ok(tokenizer.count(text)?)
}

/// Cuts one over-long sentence into token windows (with overlap), on token offsets.
fn split_long(
    tokenizer: &Tokens,
    text: &str,
    s: usize,
    e: usize,
    budget: usize,
    overlap: usize,
    out: &mut Vec<Piece>,
) -> Result<(), EmbedError> {
    let offsets = tokenizer.starts(&text[s..e])?;
    let step = budget.saturating_sub(overlap).max(1);
    let mut first = 0;
    while first < offsets.len() {
        let last = (first + budget).min(offsets.len());
        let start = s + offsets[first];
        let end = if last == offsets.len() {
            e
        } else {
            s + offsets[last]
        };
        let (start, end) = (floor_char(text, start), floor_char(text, end));
        if end > start {
            out.push(Piece {
                start,
                end,
                tokens: last - first,
            });
        }
        if last == offsets.len() {
            break;
        }
        first += step;
    }
    Ok(())
}

fn floor_char(text: &str, mut i: usize) -> usize {
    while i > 0 && !text.is_char_boundary(i) {
        i -= 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sentences_split_on_stops_and_paragraphs() {
        let t = "First one. Second one!\n\nThird, with 3.5 numbers? Yes\n- item one\n- item two";
        let s: Vec<&str> = sentences(t).into_iter().map(|(a, b)| &t[a..b]).collect();
        assert_eq!(
            s,
            [
                "First one.",
                "Second one!",
                "Third, with 3.5 numbers?",
                "Yes",
                "- item one",
                "- item two"
            ]
        );
    }
}
