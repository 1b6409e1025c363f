//! What the stub model answers during a run: a fixed latency per chat call and one of three scripts.

use std::{sync::Arc, time::Duration};

use serde_json::{Value, json};

use crate::stub::{Responder, StubReply};

/// The shape of every turn in a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Script {
    /// One chat call answered with text.
    Plain,
    /// One tool round (`search_trickipedia`), then text: two chat calls.
    Tool,
    /// Two tool rounds, the first with two parallel calls (`search_trickipedia`, `get_user_tricklists`),
    /// the second `search_spots`, then text: three chat calls.
    TwoTools,
}

impl Script {
    /// The answer to one request, by the tool rounds already in it.
    pub fn reply(self, body: &Value) -> StubReply {
        let rounds = tool_rounds_since_user(body);
        let call = |name: &str, args: Value| (name.to_owned(), args.to_string());
        match (self, rounds) {
            (Script::Tool, 0) => StubReply::ToolCalls(vec![call(
                "search_trickipedia",
                json!({"query": "kickflip"}),
            )]),
            (Script::TwoTools, 0) => StubReply::ToolCalls(vec![
                call("search_trickipedia", json!({"query": "grind"})),
                call("get_user_tricklists", json!({})),
            ]),
            (Script::TwoTools, 1) => {
                StubReply::ToolCalls(vec![call("search_spots", json!({"query": "skatepark"}))])
            }
            _ => StubReply::text(
                "omg yes, that one clicks once you commit!! keep your shoulders square and pop harder 🔥",
            ),
        }
    }
}

/// The stub's responder: the script's answer after `latency`; memory's extraction and summary
/// requests (the worker's own, a few per ten user messages) answered by rules, as in the demo.
pub fn responder(script: Script, latency: Duration) -> Responder {
    let answer = crate::stub::with_memory(Arc::new(move |body| script.reply(body)));
    Arc::new(move |body| {
        let reply = answer(body);
        if latency.is_zero() {
            reply
        } else {
            StubReply::Delayed(latency, Box::new(reply))
        }
    })
}

/// Assistant tool-call messages after the last user message: the rounds this turn has run.
fn tool_rounds_since_user(body: &Value) -> usize {
    let Some(messages) = body.get("messages").and_then(Value::as_array) else {
        return 0;
    };
    messages
        .iter()
        .rev()
        .take_while(|m| m["role"] != "user")
        .filter(|m| {
            m["role"] == "assistant" && m["tool_calls"].as_array().is_some_and(|c| !c.is_empty())
        })
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(r: &StubReply) -> Vec<String> {
        match r {
            StubReply::ToolCalls(c) => c.iter().map(|(n, _)| n.clone()).collect(),
            StubReply::Text(_) => vec!["text".into()],
            _ => vec!["other".into()],
        }
    }

    #[test]
    fn scripts_run_their_rounds_then_answer() {
        let past_round = json!({"role": "assistant", "content": null,
            "tool_calls": [{"id": "p", "type": "function", "function": {"name": "x", "arguments": "{}"}}]});
        let fresh = json!({"messages": [
            {"role": "system", "content": "s"},
            // A round of an earlier turn (history) does not count for this one.
            past_round.clone(),
            {"role": "tool", "tool_call_id": "p", "content": "{}"},
            {"role": "user", "content": "hi"},
        ]});
        let mut one = fresh.clone();
        one["messages"].as_array_mut().unwrap().extend([
            past_round.clone(),
            json!({"role": "tool", "tool_call_id": "p", "content": "{}"}),
        ]);
        let mut two = one.clone();
        two["messages"].as_array_mut().unwrap().extend([
            past_round,
            json!({"role": "tool", "tool_call_id": "p", "content": "{}"}),
        ]);
        assert_eq!(names(&Script::Plain.reply(&fresh)), ["text"]);
        assert_eq!(names(&Script::Tool.reply(&fresh)), ["search_trickipedia"]);
        assert_eq!(names(&Script::Tool.reply(&one)), ["text"]);
        assert_eq!(
            names(&Script::TwoTools.reply(&fresh)),
            ["search_trickipedia", "get_user_tricklists"]
        );
        assert_eq!(names(&Script::TwoTools.reply(&one)), ["search_spots"]);
        assert_eq!(names(&Script::TwoTools.reply(&two)), ["text"]);
    }
}
