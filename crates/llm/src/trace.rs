//! A chat call as a GenAI `chat {model}` span ([`companion_core::genai`]): what was asked (model, limits,
//! the tools offered), what came back (model, finish reasons, tokens, cost), and, only where the job
//! allows content on spans, the messages in the conventions' JSON form (`gen_ai.system_instructions`,
//! `gen_ai.input.messages`, `gen_ai.output.messages`).

use companion_core::genai::{self, ChatAnswer};
use serde_json::{Value, json};
use tracing::Span;

use crate::{ChatRequest, ChatResponse, ContentPart, Message, ToolCall, UserContent};

/// The provider a chat API base URL names, as `gen_ai.provider.name` says it: OpenRouter's own name, else
/// `openai` (the API it speaks).
pub(crate) fn provider(base_url: &str) -> &'static str {
    if base_url.contains("openrouter.ai") {
        "openrouter"
    } else {
        "openai"
    }
}

/// The span of one request of `request` sent to `model`.
pub(crate) fn chat_span(provider: &str, model: &str, request: &ChatRequest) -> Span {
    let span = genai::chat(provider, model, request.max_tokens, request.temperature);
    if span.is_disabled() {
        return span;
    }
    if !request.tools.is_empty() {
        let names: Vec<&str> = request
            .tools
            .iter()
            .map(|t| t.function.name.as_str())
            .collect();
        span.record("companion.tools_offered", names.join(",").as_str());
    }
    if genai::content_allowed() {
        let (system, input) = input_messages(&request.messages);
        if !system.is_empty() {
            span.record(
                "gen_ai.system_instructions",
                Value::Array(system).to_string(),
            );
        }
        span.record("gen_ai.input.messages", Value::Array(input).to_string());
    }
    span
}

/// Records `response` (priced at `cost_usd`) on the span of its request.
pub(crate) fn answered(span: &Span, response: &ChatResponse, cost_usd: Option<f64>) {
    if span.is_disabled() {
        return;
    }
    let usage = response.usage.as_ref();
    let reasons: Vec<&str> = response
        .choices
        .iter()
        .map(|c| c.finish_reason.as_deref().unwrap_or(""))
        .collect();
    genai::answered(
        span,
        &ChatAnswer {
            response_model: response.model.as_deref(),
            response_id: response.id.as_deref(),
            finish_reasons: reasons,
            input_tokens: usage.map(|u| u.prompt_tokens),
            output_tokens: usage.map(|u| u.completion_tokens),
            cached_tokens: usage
                .and_then(|u| u.prompt_tokens_details.as_ref())
                .map(|d| d.cached_tokens),
            cost_usd,
        },
    );
    if genai::content_allowed() {
        let out: Vec<Value> = response
            .choices
            .iter()
            .map(|c| {
                let m = &c.message;
                json!({
                    "role": "assistant",
                    "parts": parts(m.content.as_deref(), &m.tool_calls),
                    "finish_reason": c.finish_reason.as_deref().unwrap_or(""),
                })
            })
            .collect();
        span.record("gen_ai.output.messages", Value::Array(out).to_string());
    }
}

/// The system messages as instruction parts, and the others as input messages.
fn input_messages(messages: &[Message]) -> (Vec<Value>, Vec<Value>) {
    let (mut system, mut input) = (Vec::new(), Vec::new());
    for m in messages {
        match m {
            Message::System { content } => system.push(text(content)),
            Message::User { content } => {
                let parts: Vec<Value> = match content {
                    UserContent::Text(t) => vec![text(t)],
                    UserContent::Parts(ps) => ps
                        .iter()
                        .map(|p| match p {
                            ContentPart::Text { text: t } => text(t),
                            // An image's address may itself be personal; only its presence is told.
                            ContentPart::ImageUrl { .. } => {
                                json!({"type": "uri", "modality": "image"})
                            }
                        })
                        .collect(),
                };
                input.push(json!({"role": "user", "parts": parts}));
            }
            Message::Assistant {
                content,
                tool_calls,
            } => input.push(json!({
                "role": "assistant",
                "parts": parts(content.as_deref(), tool_calls),
            })),
            Message::Tool {
                tool_call_id,
                content,
            } => input.push(json!({
                "role": "tool",
                "parts": [{"type": "tool_call_response", "id": tool_call_id, "response": content}],
            })),
        }
    }
    (system, input)
}

fn text(t: &str) -> Value {
    json!({"type": "text", "content": t})
}

/// An assistant message's text and tool calls as parts.
fn parts(content: Option<&str>, calls: &[ToolCall]) -> Vec<Value> {
    let mut parts: Vec<Value> = content
        .filter(|c| !c.is_empty())
        .map(text)
        .into_iter()
        .collect();
    parts.extend(calls.iter().map(|c| {
        let arguments = serde_json::from_str::<Value>(&c.function.arguments)
            .unwrap_or_else(|_| Value::String(c.function.arguments.clone()));
        json!({"type": "tool_call", "id": c.id, "name": c.function.name, "arguments": arguments})
    }));
    parts
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::FunctionCall;

    #[test]
    fn messages_take_the_conventions_json_form() {
        let call = ToolCall {
            id: "c1".into(),
            kind: "function".into(),
            function: FunctionCall {
                name: "get_tricklist".into(),
                arguments: r#"{"limit":3}"#.into(),
            },
        };
        let (system, input) = input_messages(&[
            Message::system("be kind"),
            Message::user("hi"),
            Message::Assistant {
                content: None,
                tool_calls: vec![call],
            },
            Message::Tool {
                tool_call_id: "c1".into(),
                content: "[]".into(),
            },
        ]);
        assert_eq!(system, vec![json!({"type": "text", "content": "be kind"})]);
        assert_eq!(
            Value::Array(input),
            json!([
                {"role": "user", "parts": [{"type": "text", "content": "hi"}]},
                {"role": "assistant", "parts": [{"type": "tool_call", "id": "c1", "name": "get_tricklist", "arguments": {"limit": 3}}]},
                {"role": "tool", "parts": [{"type": "tool_call_response", "id": "c1", "response": "[]"}]},
            ])
        );
    }

    #[test]
    fn the_provider_is_told_by_the_base_url() {
        assert_eq!(provider("https://openrouter.ai/api/v1"), "openrouter");
        assert_eq!(provider("http://127.0.0.1:9000/v1"), "openai");
    }
}
