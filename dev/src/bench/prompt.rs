//! What the prompts of a run cost: tokens per chat request (an estimate with the embedding model's
//! WordPiece tokenizer; providers' tokenizers differ by tens of percent, the ratios between runs hold),
//! and the share of a request that is the same prefix as another user's request to the same companion.
//! Providers that cache prompts (OpenAI, Gemini, Anthropic through OpenRouter) bill such a prefix at a
//! fraction of the price. A request is read in the order providers put it in front of the model: the
//! tool definitions, then the messages.

use std::{
    path::Path,
    sync::{Arc, Mutex},
};

use serde::Serialize;
use serde_json::Value;

use super::dist::Dist;

/// Request bodies kept for the analysis, at most.
const KEEP: usize = 400;

/// The first chat requests of a run (each turn's first call), kept as the stub received them.
#[derive(Clone, Default)]
pub struct Sampler {
    bodies: Arc<Mutex<Vec<Value>>>,
}

impl Sampler {
    /// Keeps `body` if it is a turn's first call (no tool results after the user's message: those
    /// before it are earlier turns' in the history) and there is room; memory's requests are not turns.
    pub fn offer(&self, body: &Value) {
        let first_call = body["messages"].as_array().is_some_and(|m| {
            m.iter()
                .rev()
                .take_while(|m| m["role"] != "user")
                .all(|m| m["role"] != "tool")
        }) && !crate::memory_rules::is_memory_request(body);
        let mut bodies = self.bodies.lock().expect("sampler lock");
        if first_call && bodies.len() < KEEP {
            bodies.push(body.clone());
        }
    }

    pub fn clear(&self) {
        self.bodies.lock().expect("sampler lock").clear();
    }

    pub fn take(&self) -> Vec<Value> {
        std::mem::take(&mut *self.bodies.lock().expect("sampler lock"))
    }
}

/// What the prompts of a run's turns are billed as, from every answer of the stub model with its
/// simulated provider prompt cache ([`crate::stub::StubLlm::simulate_prompt_cache`]): tokens are the
/// stub's (a quarter of the request's bytes), all calls of a turn counted.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Billing {
    pub calls_per_turn: f64,
    pub prompt_tokens_per_turn: f64,
    /// Of those, served from the provider's cache.
    pub cached_tokens_per_turn: f64,
    /// Uncached + cached × `cached_price_ratio`: what the prompt costs, in uncached tokens.
    pub billed_equivalent_per_turn: f64,
    pub cached_price_ratio: f64,
}

impl Billing {
    pub fn of(t: crate::stub::Totals, turns: usize, cached_price_ratio: f64) -> Option<Self> {
        let per = |x: u64| x as f64 / turns as f64;
        (turns > 0 && t.calls > 0).then(|| Self {
            calls_per_turn: per(t.calls),
            prompt_tokens_per_turn: per(t.prompt_tokens),
            cached_tokens_per_turn: per(t.cached_tokens),
            billed_equivalent_per_turn: per(t.prompt_tokens - t.cached_tokens)
                + per(t.cached_tokens) * cached_price_ratio,
            cached_price_ratio,
        })
    }
}

/// Writes `bodies` as JSON lines to `path`.
pub fn save(bodies: &[Value], path: &Path) -> std::io::Result<()> {
    let mut out = String::new();
    for b in bodies {
        out.push_str(&b.to_string());
        out.push('\n');
    }
    std::fs::write(path, out)
}

/// The prompt figures of a run.
#[derive(Clone, Debug, Default, Serialize)]
pub struct PromptFigures {
    /// First calls of turns analysed.
    pub requests: usize,
    /// Estimated prompt tokens per first call.
    pub tokens: Dist,
    /// Estimated tokens of the longest prefix shared with the next analysed request of another user.
    pub shared_prefix_tokens: Dist,
    /// Mean of shared prefix / prompt tokens.
    pub shared_prefix_share: f64,
    /// Knowledge chunks in a first call's prompt, mean (what retrieval found for the turn's message).
    pub knowledge_chunks: f64,
}

/// The knowledge chunks a request's prompt carries: the `### ` entries of its "Things you know" block.
fn knowledge_chunks(body: &Value) -> usize {
    body["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| m["content"].as_str())
        .filter_map(|c| c.split_once("## Things you know").map(|(_, rest)| rest))
        .map(|rest| {
            rest.lines()
                .skip(1)
                .take_while(|l| !l.starts_with("## "))
                .filter(|l| l.starts_with("### "))
                .count()
        })
        .sum()
}

/// The request as text in the order the model reads it.
fn linear(body: &Value) -> String {
    let mut out = body["tools"].to_string();
    for m in body["messages"].as_array().into_iter().flatten() {
        out.push('\n');
        out.push_str(m["role"].as_str().unwrap_or(""));
        out.push_str(": ");
        match &m["content"] {
            Value::String(s) => out.push_str(s),
            Value::Null => {}
            other => out.push_str(&other.to_string()),
        }
        if let Some(calls) = m.get("tool_calls") {
            out.push_str(&calls.to_string());
        }
    }
    out
}

/// Who the request is for: the user section of its system prompt.
fn user_of(body: &Value) -> String {
    let system = body["messages"][0]["content"].as_str().unwrap_or("");
    system
        .split_once("## The user")
        .map(|(_, rest)| rest.lines().take(2).collect::<Vec<_>>().join("\n"))
        .unwrap_or_default()
}

/// Analyses the sampled requests with the tokenizer at `tokenizer` (`tokenizer.json`).
pub fn analyse(bodies: &[Value], tokenizer: &Path) -> Option<PromptFigures> {
    if bodies.is_empty() {
        return None;
    }
    use companion_knowledge::rag::{TokenizerKind as Kind, Tokens};
    let t = Tokens::load(Kind::TokenizerJson, tokenizer).ok()?;
    let count = |s: &str| t.count(s).unwrap_or(0) as f64;
    let texts: Vec<(String, String)> = bodies.iter().map(|b| (linear(b), user_of(b))).collect();
    let tokens: Vec<f64> = texts.iter().map(|(s, _)| count(s)).collect();
    let mut shared = Vec::new();
    let mut shares = Vec::new();
    for (i, (text, user)) in texts.iter().enumerate() {
        let Some((other, _)) = texts[i + 1..].iter().find(|(_, u)| u != user) else {
            continue;
        };
        let common: usize = text
            .char_indices()
            .zip(other.chars())
            .take_while(|((_, a), b)| a == b)
            .last()
            .map(|((at, c), _)| at + c.len_utf8())
            .unwrap_or(0);
        let prefix = count(&text[..common]);
        shared.push(prefix);
        shares.push(prefix / tokens[i].max(1.0));
    }
    Some(PromptFigures {
        requests: bodies.len(),
        tokens: Dist::of(&tokens),
        shared_prefix_tokens: Dist::of(&shared),
        shared_prefix_share: if shares.is_empty() {
            0.0
        } else {
            shares.iter().sum::<f64>() / shares.len() as f64
        },
        knowledge_chunks: bodies.iter().map(knowledge_chunks).sum::<usize>() as f64
            / bodies.len() as f64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_knowledge_chunks_of_a_prompt_are_counted() {
        let body = json!({"messages": [
            {"role": "system", "content": "You are Kaori.\n## The user\nName: Jess\n### not knowledge\n"},
            {"role": "system", "content": "## Things you know (from Kaori's reading; use if relevant)\n### Ollie basics\npop.\n### Kickflip tips <https://x>\nflick.\n## Flow\n### not knowledge\n"},
            {"role": "user", "content": "how do i ollie"},
        ]});
        assert_eq!(knowledge_chunks(&body), 2);
        assert_eq!(knowledge_chunks(&json!({"messages": []})), 0);
    }

    #[test]
    fn the_shared_prefix_is_measured_between_different_users() {
        let body = |user: &str, text: &str| {
            json!({"tools": [{"name": "t"}], "messages": [
                {"role": "system", "content": format!("You are Kaori.\n## The user\nName: {user}\n")},
                {"role": "user", "content": text},
            ]})
        };
        let s = Sampler::default();
        s.offer(&body("Jess", "hi"));
        s.offer(&body("Jess", "again"));
        s.offer(&body("Sam", "hi"));
        s.offer(&json!({"messages": [{"role": "tool", "content": "{}"}]}));
        // An earlier turn's tool round in the history does not make a first call a second one.
        let mut with_past_round = body("Jess", "and now?");
        with_past_round["messages"].as_array_mut().unwrap().insert(
            1,
            json!({"role": "tool", "tool_call_id": "past_0_0", "content": "{}"}),
        );
        s.offer(&with_past_round);
        let memory = format!("{}\n", companion_memory::EXTRACT_MARKER);
        s.offer(&json!({"messages": [
            {"role": "system", "content": memory},
            {"role": "user", "content": "1. i ride goofy"},
        ]}));
        let bodies = s.take();
        assert_eq!(bodies.len(), 4, "only turns' first calls are kept");
        let texts: Vec<String> = bodies.iter().map(linear).collect();
        assert!(texts[0].starts_with("[{\"name\":\"t\"}]\nsystem: You are Kaori."));
        assert_eq!(user_of(&bodies[0]), user_of(&bodies[1]));
        assert_ne!(user_of(&bodies[0]), user_of(&bodies[2]));
    }
}
