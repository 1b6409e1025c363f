//! A scripted OpenAI-compatible chat server: the offline model of the demo and the LLM of the tests.
//!
//! Serves `POST /v1/chat/completions`, records every request body, and answers from a [`Responder`].

use std::{
    collections::VecDeque,
    net::SocketAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use axum::{
    Json, Router,
    extract::State,
    http::{HeaderMap, HeaderValue, StatusCode},
    response::{IntoResponse, Response},
    routing::post,
};
use serde_json::{Value, json};

/// One scripted answer.
#[derive(Clone, Debug)]
pub enum StubReply {
    /// A final text answer.
    Text(String),
    /// Tool calls: `(name, raw arguments text)`; ids are generated.
    ToolCalls(Vec<(String, String)>),
    /// An HTTP error with a body and an optional `Retry-After` in seconds.
    Status {
        code: u16,
        body: String,
        retry_after: Option<u64>,
    },
    /// The inner reply after a delay.
    Delayed(Duration, Box<StubReply>),
    /// This JSON body with status 200, as it is (e.g. an error inside a 200, as OpenRouter sends).
    Raw(Value),
}

impl StubReply {
    pub fn text(s: impl Into<String>) -> Self {
        Self::Text(s.into())
    }
    pub fn tool(name: &str, args: Value) -> Self {
        Self::ToolCalls(vec![(name.to_owned(), args.to_string())])
    }
}

/// Chooses the answer to one request body.
pub type Responder = Arc<dyn Fn(&Value) -> StubReply + Send + Sync>;

#[derive(Clone)]
struct StubState {
    responder: Responder,
    requests: Arc<Mutex<Vec<Value>>>,
    record: bool,
    ids: Arc<AtomicU64>,
    /// `usage.cost` put in every answer, as OpenRouter reports it; `None` = no cost field.
    cost: Arc<Mutex<Option<f64>>>,
}

/// A running stub server; stops when dropped.
pub struct StubLlm {
    /// Use as `LLM_BASE_URL`.
    pub base_url: String,
    pub addr: SocketAddr,
    requests: Arc<Mutex<Vec<Value>>>,
    cost: Arc<Mutex<Option<f64>>>,
    task: tokio::task::JoinHandle<()>,
}

impl StubLlm {
    /// Starts on a free loopback port, recording requests.
    pub async fn start(responder: Responder) -> std::io::Result<Self> {
        Self::start_on(
            "127.0.0.1:0".parse().expect("loopback address"),
            responder,
            true,
        )
        .await
    }

    /// Starts on `addr`; `record` keeps every request body (tests) or none (long runs).
    pub async fn start_on(
        addr: SocketAddr,
        responder: Responder,
        record: bool,
    ) -> std::io::Result<Self> {
        let requests = Arc::new(Mutex::new(Vec::new()));
        let cost = Arc::new(Mutex::new(None));
        let state = StubState {
            responder,
            requests: requests.clone(),
            record,
            ids: Arc::new(AtomicU64::new(1)),
            cost: cost.clone(),
        };
        let app = Router::new()
            .route("/v1/chat/completions", post(complete))
            .route("/chat/completions", post(complete))
            .with_state(state);
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let task = tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                tracing::error!(error = %e, "stub LLM server stopped");
            }
        });
        Ok(Self {
            base_url: format!("http://{addr}/v1"),
            addr,
            requests,
            cost,
            task,
        })
    }

    /// From now on, every answer reports this `usage.cost` (USD), or none.
    pub fn report_cost(&self, usd: Option<f64>) {
        *self.cost.lock().expect("stub lock") = usd;
    }

    /// Every request body received so far, in order.
    pub fn requests(&self) -> Vec<Value> {
        self.requests.lock().expect("stub lock").clone()
    }

    /// Runs until the task ends (for the `stub-llm` command).
    pub async fn wait(mut self) {
        let _ = (&mut self.task).await;
    }
}

impl Drop for StubLlm {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn complete(State(state): State<StubState>, Json(body): Json<Value>) -> Response {
    if state.record {
        state.requests.lock().expect("stub lock").push(body.clone());
    }
    let mut reply = (state.responder)(&body);
    while let StubReply::Delayed(d, inner) = reply {
        tokio::time::sleep(d).await;
        reply = *inner;
    }
    let model = body
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or("stub")
        .to_owned();
    let prompt_chars: usize = body
        .get("messages")
        .map(|m| m.to_string().len())
        .unwrap_or(0);
    let n = state.ids.fetch_add(1, Ordering::Relaxed);
    let (message, finish) = match reply {
        StubReply::Text(text) => (json!({"role": "assistant", "content": text}), "stop"),
        StubReply::ToolCalls(calls) => {
            let calls: Vec<Value> = calls
                .into_iter()
                .enumerate()
                .map(|(i, (name, args))| {
                    json!({"id": format!("call_{n}_{i}"), "type": "function",
                           "function": {"name": name, "arguments": args}})
                })
                .collect();
            (
                json!({"role": "assistant", "content": null, "tool_calls": calls}),
                "tool_calls",
            )
        }
        StubReply::Status {
            code,
            body,
            retry_after,
        } => {
            let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            let mut headers = HeaderMap::new();
            if let Some(s) = retry_after {
                headers.insert("retry-after", HeaderValue::from(s));
            }
            return (status, headers, body).into_response();
        }
        StubReply::Raw(body) => return Json(body).into_response(),
        StubReply::Delayed(..) => unreachable!("delays are unwrapped above"),
    };
    let completion_tokens = message.to_string().len() as u64 / 4;
    let prompt_tokens = prompt_chars as u64 / 4;
    let mut usage = json!({"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                           "total_tokens": prompt_tokens + completion_tokens});
    if let Some(cost) = *state.cost.lock().expect("stub lock") {
        usage["cost"] = json!(cost);
    }
    Json(json!({
        "id": format!("chatcmpl-stub-{n}"),
        "object": "chat.completion",
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": usage
    }))
    .into_response()
}

/// Answers in order from a list, then with `fallback` for every later request.
pub fn scripted(replies: Vec<StubReply>, fallback: StubReply) -> Responder {
    let queue = Mutex::new(VecDeque::from(replies));
    Arc::new(move |_| {
        queue
            .lock()
            .expect("script lock")
            .pop_front()
            .unwrap_or_else(|| fallback.clone())
    })
}

/// Always the same answer.
pub fn always(reply: StubReply) -> Responder {
    Arc::new(move |_| reply.clone())
}

/// The last message of a request, and the text of the last user message.
pub fn last_user_text(body: &Value) -> String {
    let Some(messages) = body.get("messages").and_then(Value::as_array) else {
        return String::new();
    };
    messages
        .iter()
        .rev()
        .find(|m| m["role"] == "user")
        .map(|m| match &m["content"] {
            Value::String(s) => s.clone(),
            Value::Array(parts) => parts
                .iter()
                .filter_map(|p| p["text"].as_str())
                .collect::<Vec<_>>()
                .join(" "),
            _ => String::new(),
        })
        .unwrap_or_default()
}

/// The offline demo model: recognisable scripted answers that show what the worker sent it.
pub fn demo() -> Responder {
    Arc::new(demo_reply)
}

fn demo_reply(body: &Value) -> StubReply {
    let messages = body
        .get("messages")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let system = messages
        .first()
        .and_then(|m| m["content"].as_str())
        .unwrap_or("");
    let name = system
        .strip_prefix("You are ")
        .and_then(|s| s.split([' ', ',']).next())
        .unwrap_or("your companion")
        .to_owned();
    let offered: Vec<&str> = body
        .get("tools")
        .and_then(Value::as_array)
        .map(|t| {
            t.iter()
                .filter_map(|t| t["function"]["name"].as_str())
                .collect()
        })
        .unwrap_or_default();
    let last = messages.last().cloned().unwrap_or(Value::Null);
    if last["role"] == "tool" {
        return StubReply::Text(summarise_tool_results(&messages));
    }
    let text = last_user_text(body);
    let lower = text.to_lowercase();
    if let Some(call) = demo_tool_call(&lower, &text, &offered) {
        return call;
    }
    let history = messages.len().saturating_sub(2);
    let lists = section_items(system, "## Their tricklists");
    let lists = if lists.is_empty() {
        "no tricklists yet".to_owned()
    } else {
        format!("your lists: {}", lists.join("; "))
    };
    let knowledge = system
        .split_once("## Things you know")
        .map(|(_, rest)| {
            let titles: Vec<&str> = rest
                .lines()
                .filter_map(|l| l.strip_prefix("### "))
                .map(|t| t.split(" <").next().unwrap_or(t))
                .collect();
            format!(" i also read up on: {}.", titles.join("; "))
        })
        .unwrap_or_default();
    StubReply::Text(format!(
        "[scripted {name}] you said \"{}\". i remember {history} earlier messages and can see {lists}.{knowledge}",
        text.chars().take(80).collect::<String>()
    ))
}

fn demo_tool_call(lower: &str, text: &str, offered: &[&str]) -> Option<StubReply> {
    let has = |t: &str| offered.contains(&t);
    if (lower.contains("make") || lower.contains("create"))
        && lower.contains("list")
        && has("create_tricklist")
    {
        let tricks: Vec<String> = lower
            .split_once(" with ")
            .map(|(_, rest)| rest)
            .unwrap_or("")
            .split([',', '&'])
            .flat_map(|s| s.split(" and "))
            .map(|s| s.trim().trim_end_matches(['.', '!', '?']).to_owned())
            .filter(|s| !s.is_empty())
            .collect();
        let category = if lower.contains("snow") {
            "snowboard"
        } else {
            "skateboard"
        };
        let name = if lower.contains("park") {
            "Park List"
        } else {
            "New List"
        };
        return Some(StubReply::tool(
            "create_tricklist",
            json!({"name": name, "tricks": tricks, "category": category}),
        ));
    }
    if lower.contains("my list") || lower.contains("tricklist") || lower.contains("progress") {
        return has("get_user_tricklists")
            .then(|| StubReply::ToolCalls(vec![("get_user_tricklists".into(), String::new())]));
    }
    if (lower.contains("maps.app.goo.gl")
        || lower.contains("google.com/maps")
        || lower.contains("maps.apple.com"))
        && has("create_spot_draft")
    {
        let url = text
            .split_whitespace()
            .find(|w| w.starts_with("http"))
            .unwrap_or("");
        return Some(StubReply::tool(
            "create_spot_draft",
            json!({"name": "New Spot", "mapsUrl": url, "type": "street"}),
        ));
    }
    if (lower.contains("spot") || lower.contains("park")) && has("search_spots") {
        let query = lower
            .split_once(" in ")
            .map(|(_, c)| c.trim_end_matches(['?', '.', '!']).trim().to_owned());
        return Some(StubReply::tool(
            "search_spots",
            json!({"query": query.unwrap_or_else(|| "skatepark".into())}),
        ));
    }
    if (lower.contains("how do i") || lower.contains("trick")) && has("search_trickipedia") {
        let query = lower
            .rsplit_once(" a ")
            .or_else(|| lower.rsplit_once(" do "))
            .map(|(_, q)| q)
            .unwrap_or(lower);
        return Some(StubReply::tool(
            "search_trickipedia",
            json!({"query": query.trim_end_matches(['?', '.', '!']).trim()}),
        ));
    }
    None
}

fn summarise_tool_results(messages: &[Value]) -> String {
    let results: Vec<Value> = messages
        .iter()
        .rev()
        .take_while(|m| m["role"] == "tool")
        .filter_map(|m| {
            m["content"]
                .as_str()
                .and_then(|c| serde_json::from_str(c).ok())
        })
        .collect();
    let mut parts = Vec::new();
    for r in results.iter().rev() {
        if let Some(e) = r.get("error") {
            parts.push(format!("that didn't work ({e})"));
        } else if let Some(names) = names_of(r, "spots") {
            parts.push(format!("found these spots: {names}"));
        } else if let Some(names) = names_of(r, "tricks") {
            parts.push(format!("trickipedia has: {names}"));
        } else if let Some(names) = names_of(r, "tricklists") {
            parts.push(format!("your lists are: {names}"));
        } else if let Some(name) = r.get("name").and_then(Value::as_str) {
            parts.push(format!("done, \"{name}\" is saved"));
        } else {
            parts.push("done".to_owned());
        }
    }
    format!("[scripted] {}", parts.join("; "))
}

fn names_of(v: &Value, key: &str) -> Option<String> {
    let items = v.get(key)?.as_array()?;
    if items.is_empty() {
        return Some("nothing".into());
    }
    Some(
        items
            .iter()
            .filter_map(|i| i["name"].as_str())
            .collect::<Vec<_>>()
            .join(", "),
    )
}

/// The `- item` lines under a `## heading` of the system prompt.
fn section_items(system: &str, heading: &str) -> Vec<String> {
    let Some((_, rest)) = system.split_once(heading) else {
        return Vec::new();
    };
    rest.lines()
        .skip(1)
        .take_while(|l| !l.starts_with("## "))
        .filter_map(|l| l.strip_prefix("- "))
        .map(|l| l.split(':').next().unwrap_or(l).trim().to_owned())
        .collect()
}
