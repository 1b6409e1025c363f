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

/// Chooses the answer to one request body, asynchronously (e.g. with the embedding model).
pub type AsyncResponder =
    Arc<dyn Fn(Value) -> futures::future::BoxFuture<'static, StubReply> + Send + Sync>;

/// A [`Responder`] as an [`AsyncResponder`].
pub fn asynchronous(responder: Responder) -> AsyncResponder {
    Arc::new(move |body| {
        let reply = responder(&body);
        Box::pin(async move { reply })
    })
}

#[derive(Clone)]
struct StubState {
    responder: AsyncResponder,
    requests: Arc<Mutex<Vec<Value>>>,
    record: bool,
    ids: Arc<AtomicU64>,
    /// `usage.cost` put in every answer, as OpenRouter reports it; `None` = no cost field.
    cost: Arc<Mutex<Option<f64>>>,
    /// `usage.prompt_tokens_details.cached_tokens` put in every answer; `None` = no details.
    cached: Arc<Mutex<Option<u64>>>,
    /// A provider's prompt cache, when simulated; wins over `cached`.
    cache: Arc<Mutex<Option<PromptCache>>>,
    /// Prompt and cached tokens of every answer so far.
    totals: Arc<Mutex<Totals>>,
    /// The `provider` every answer names (OpenRouter's field); `None`: no such field.
    provider: Arc<Mutex<Option<String>>>,
}

/// What the stub has answered: calls, prompt tokens and the prompt tokens its cache served.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    pub calls: u64,
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
}

/// A provider's automatic prompt cache as OpenAI documents it (others are alike): a request's longest
/// prefix seen before, in blocks of 128 tokens, is served from the cache once it is at least 1,024
/// tokens. Tokens are the stub's (a quarter of the bytes); the request is read as the provider puts it
/// in front of the model: the tools, then the messages. Kept for the life of the stub (a run is shorter
/// than a provider's cache lifetime under load).
#[derive(Debug, Default)]
struct PromptCache {
    seen: std::collections::HashSet<u64>,
}

impl PromptCache {
    const BLOCK_BYTES: usize = 128 * 4;
    const MIN_TOKENS: u64 = 1024;
    /// Bound on the prefixes kept.
    const MAX_SEEN: usize = 4_000_000;

    /// The cached tokens of a request whose text is `linear`; remembers its prefixes.
    fn serve(&mut self, linear: &[u8]) -> u64 {
        use std::hash::Hasher;
        let mut h = std::collections::hash_map::DefaultHasher::new();
        let mut hit_blocks = 0u64;
        let mut missed = false;
        for (i, block) in linear.chunks_exact(Self::BLOCK_BYTES).enumerate() {
            h.write(block);
            let key = h.finish();
            if !missed && self.seen.contains(&key) {
                hit_blocks = i as u64 + 1;
            } else {
                missed = true;
                if self.seen.len() < Self::MAX_SEEN {
                    self.seen.insert(key);
                }
            }
        }
        let tokens = hit_blocks * 128;
        if tokens >= Self::MIN_TOKENS {
            tokens
        } else {
            0
        }
    }
}

/// The request as the provider reads it: the tools, then each message.
fn linear(body: &Value) -> Vec<u8> {
    let mut out = body.get("tools").map(|t| t.to_string()).unwrap_or_default();
    for m in body["messages"].as_array().into_iter().flatten() {
        out.push_str(&m.to_string());
    }
    out.into_bytes()
}

/// A running stub server; stops when dropped.
pub struct StubLlm {
    /// Use as `LLM_BASE_URL`.
    pub base_url: String,
    pub addr: SocketAddr,
    requests: Arc<Mutex<Vec<Value>>>,
    cost: Arc<Mutex<Option<f64>>>,
    cached: Arc<Mutex<Option<u64>>>,
    cache: Arc<Mutex<Option<PromptCache>>>,
    totals: Arc<Mutex<Totals>>,
    provider: Arc<Mutex<Option<String>>>,
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
        Self::start_async(addr, asynchronous(responder), record).await
    }

    /// [`StubLlm::start_on`] with an asynchronous responder.
    pub async fn start_async(
        addr: SocketAddr,
        responder: AsyncResponder,
        record: bool,
    ) -> std::io::Result<Self> {
        let requests = Arc::new(Mutex::new(Vec::new()));
        let cost = Arc::new(Mutex::new(None));
        let cached = Arc::new(Mutex::new(None));
        let cache = Arc::new(Mutex::new(None));
        let totals = Arc::new(Mutex::new(Totals::default()));
        let provider = Arc::new(Mutex::new(None));
        let state = StubState {
            provider: provider.clone(),
            cache: cache.clone(),
            totals: totals.clone(),
            responder,
            requests: requests.clone(),
            record,
            ids: Arc::new(AtomicU64::new(1)),
            cost: cost.clone(),
            cached: cached.clone(),
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
            cached,
            cache,
            totals,
            provider,
            task,
        })
    }

    /// From now on, answers report the cached tokens of a simulated provider prompt cache
    /// ([`PromptCache`]), which starts empty.
    pub fn simulate_prompt_cache(&self) {
        *self.cache.lock().expect("stub lock") = Some(PromptCache::default());
    }

    /// What the stub has answered since the start or the last [`StubLlm::reset_totals`].
    pub fn totals(&self) -> Totals {
        *self.totals.lock().expect("stub lock")
    }

    pub fn reset_totals(&self) {
        *self.totals.lock().expect("stub lock") = Totals::default();
    }

    /// From now on, every answer reports this `usage.cost` (USD), or none.
    /// Names itself the scripted offline model in every answer (`provider`:
    /// [`companion_llm::SCRIPTED_PROVIDER`]): `companion explain` then says so, with no price.
    pub fn say_scripted(&self) {
        *self.provider.lock().expect("stub lock") = Some(companion_llm::SCRIPTED_PROVIDER.into());
    }

    pub fn report_cost(&self, usd: Option<f64>) {
        *self.cost.lock().expect("stub lock") = usd;
    }

    /// From now on, every answer says this many prompt tokens came from the provider's cache, or nothing.
    pub fn report_cached_tokens(&self, tokens: Option<u64>) {
        *self.cached.lock().expect("stub lock") = tokens;
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
    let mut reply = (state.responder)(body.clone()).await;
    while let StubReply::Delayed(d, inner) = reply {
        tokio::time::sleep(d).await;
        reply = *inner;
    }
    let model = body
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or("stub")
        .to_owned();
    // Prompt tokens as a provider counts them: the tool definitions are part of the prompt.
    let linear = linear(&body);
    let simulated = state
        .cache
        .lock()
        .expect("stub lock")
        .as_mut()
        .map(|c| c.serve(&linear));
    let prompt_chars = linear.len();
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
    let usage = usage(&state, prompt_chars, &message, simulated);
    let mut answer = json!({
        "id": format!("chatcmpl-stub-{n}"),
        "object": "chat.completion",
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": usage
    });
    if let Some(provider) = state.provider.lock().expect("stub lock").clone() {
        answer["provider"] = json!(provider);
    }
    Json(answer).into_response()
}

/// The completion's usage as a provider reports it (about four characters a token; the cost and
/// the cached tokens when set), counted in the totals too.
fn usage(state: &StubState, prompt_chars: usize, message: &Value, simulated: Option<u64>) -> Value {
    let completion_tokens = message.to_string().len() as u64 / 4;
    let prompt_tokens = prompt_chars as u64 / 4;
    let mut usage = json!({"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                           "total_tokens": prompt_tokens + completion_tokens});
    if let Some(cost) = *state.cost.lock().expect("stub lock") {
        usage["cost"] = json!(cost);
    }
    let cached = simulated.or(*state.cached.lock().expect("stub lock"));
    if let Some(cached) = cached {
        usage["prompt_tokens_details"] = json!({ "cached_tokens": cached.min(prompt_tokens) });
    }
    {
        let mut t = state.totals.lock().expect("stub lock");
        t.calls += 1;
        t.prompt_tokens += prompt_tokens;
        t.cached_tokens += cached.unwrap_or(0).min(prompt_tokens);
    }
    usage
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
        .and_then(text_of)
        .unwrap_or_default()
}

/// A message's text: its content, or the text parts of one with images.
fn text_of(m: &Value) -> Option<String> {
    match &m["content"] {
        Value::String(s) => Some(s.clone()),
        Value::Array(parts) => Some(
            parts
                .iter()
                .filter_map(|p| p["text"].as_str())
                .collect::<Vec<_>>()
                .join(" "),
        ),
        _ => None,
    }
}

/// Whether a request is a group chat's (the worker's group note is in the system prompt).
fn is_group(body: &Value) -> bool {
    body["messages"][0]["content"]
        .as_str()
        .is_some_and(|s| s.contains("## This is a group chat"))
}

/// In a group, where the person's newest message is: other companions' lines of this round come as user
/// messages too (`Tony: …`), after the person's message, which follows the turn's system message: the
/// person's message is the user message right after the last system message that one follows.
fn person_at(messages: &[Value]) -> Option<usize> {
    messages
        .windows(2)
        .rposition(|w| w[0]["role"] == "system" && w[1]["role"] == "user")
        .map(|i| i + 1)
}

/// The user's own words of the newest user message: in a group chat, without the `Name: ` the worker
/// puts before each person's line.
fn user_words(body: &Value) -> String {
    if !is_group(body) {
        return last_user_text(body);
    }
    let messages = body["messages"].as_array().cloned().unwrap_or_default();
    person_at(&messages)
        .and_then(|i| text_of(&messages[i]))
        .map(|text| {
            text.split_once(": ")
                .map_or(text.as_str(), |(_, w)| w)
                .to_owned()
        })
        .unwrap_or_default()
}

/// In a group, what the other companions already said for this message (their lines of this round, as
/// `Name: text`); empty in a DM.
fn said_this_round(body: &Value) -> Vec<String> {
    if !is_group(body) {
        return Vec::new();
    }
    let messages = body["messages"].as_array().cloned().unwrap_or_default();
    let Some(person) = person_at(&messages) else {
        return Vec::new();
    };
    messages[person + 1..]
        .iter()
        .filter(|m| m["role"] == "user")
        .filter_map(text_of)
        .collect()
}

/// Who answers a request: the companion's own sport, as its prompt tells it, and whether it speaks in a
/// group (where each companion speaks for its own sport).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Speaker {
    sport: Option<&'static str>,
    group: bool,
}

impl Speaker {
    fn of(body: &Value) -> Self {
        let system = body["messages"][0]["content"].as_str().unwrap_or("");
        Self {
            sport: sport_of_character(system),
            group: is_group(body),
        }
    }
}

/// The sport of the companion a system prompt describes: the one its character part (what comes before
/// the rules: who it is, its bio, what it knows a lot about) names most often; none on a tie. Words that
/// list sports ("a skate/snow/BMX app") are the app's, not the companion's, and do not count.
fn sport_of_character(system: &str) -> Option<&'static str> {
    let character = system
        .split_once("\nRules:")
        .map_or(system, |(c, _)| c)
        .split(' ')
        .filter(|w| !w.contains('/'))
        .collect::<Vec<_>>()
        .join(" ")
        .to_lowercase();
    let mut counts: Vec<(usize, &'static str)> = SPORTS
        .iter()
        .map(|(stem, sport)| (mentions(&character, stem).count(), *sport))
        .collect();
    counts.sort_by_key(|(n, _)| std::cmp::Reverse(*n));
    match counts.as_slice() {
        [(n, sport), (m, _), ..] if n > m => Some(*sport),
        _ => None,
    }
}

/// The place a maps link names, as Google and Apple put it in their links: the segment after
/// `/maps/place/` or `/maps/search/`, else the `name`, `q` or `query` parameter; never coordinates.
/// Short links (`maps.app.goo.gl/…`) name nothing until resolved, which needs the network.
fn place_name(link: &str) -> Option<String> {
    let url = url::Url::parse(link.trim()).ok()?;
    // `+` is a space in these links' names ("Hollow+Bowl"), as in a form.
    let decode = |s: &str| {
        url::form_urlencoded::parse(format!("n={}", s.replace('&', "%26")).as_bytes())
            .next()
            .map(|(_, v)| v.into_owned())
    };
    let segments: Vec<&str> = url
        .path_segments()
        .map(Iterator::collect)
        .unwrap_or_default();
    let in_path = segments
        .windows(2)
        .find(|w| w[0] == "place" || w[0] == "search")
        .and_then(|w| decode(w[1]));
    let in_query = || {
        ["name", "q", "query"].iter().find_map(|key| {
            url.query_pairs()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.into_owned())
        })
    };
    let name = in_path.or_else(in_query)?;
    let name = name.trim().trim_start_matches("loc:").trim();
    let coordinates = name
        .chars()
        .all(|c| c.is_ascii_digit() || matches!(c, ',' | '.' | '-' | '+' | ' '));
    (!coordinates && !name.starts_with('@')).then(|| name.chars().take(100).collect())
}

/// The first link in a message, without the punctuation after it.
fn link_in(text: &str) -> Option<&str> {
    text.split_whitespace()
        .find(|w| w.starts_with("http"))
        .map(|w| w.trim_end_matches([',', '.', '!', '?', ')', ';']))
}

/// The name the user gives a spot: the words after "called", up to the punctuation or a link.
fn called(text: &str) -> Option<String> {
    let (_, rest) = text.split_once("called ")?;
    let rest = rest.split(" http").next().unwrap_or(rest);
    let name = rest.split([',', '.', '!', '?', ';', ':']).next()?.trim();
    (!name.is_empty()).then(|| name.to_owned())
}

/// What kind of spot the user says it is.
fn spot_kind(lower: &str) -> Option<&'static str> {
    ["diy", "street", "skatepark"]
        .into_iter()
        .find(|k| lower.contains(k))
}

/// The offline demo model: recognisable scripted answers that show what the worker sent it.
pub fn demo() -> Responder {
    with_memory(Arc::new(|body| compose(body, demo_tool_call)))
}

/// `responder`, with the worker's memory requests (extraction, summaries) answered by rules.
pub fn with_memory(responder: Responder) -> Responder {
    Arc::new(move |body| match crate::memory_rules::answer(body) {
        Some(answer) => StubReply::Text(answer),
        None => responder(body),
    })
}

/// The demo's answer to `body`: a summary of tool results, the tool call `choose` picks for the user's
/// message (from its lower-case text, its text, the tools offered and who answers), or a text reply
/// that shows what the worker sent.
fn compose(
    body: &Value,
    choose: impl FnOnce(&str, &str, &[&str], Speaker) -> Option<StubReply>,
) -> StubReply {
    let speaker = Speaker::of(body);
    let said = said_this_round(body);
    let messages = body
        .get("messages")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let system_text = system_prompt(&messages);
    let system = system_text.as_str();
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
    if let Some(m) = spot_wizard_move(&messages, system, &offered) {
        return m;
    }
    if last["role"] == "tool" {
        // Searched by kind of spot (in a group): the sport the spots were searched for, as `spot_search`
        // chose it.
        let searched = sport_of(&user_words(body).to_lowercase()).or(speaker.sport);
        return StubReply::Text(summarise_tool_results(&messages, searched, &said));
    }
    if last["role"] == "system"
        && last["content"]
            .as_str()
            .is_some_and(|c| c.contains("## Safety first"))
    {
        // The worker flagged a crisis and sent the referral: a kind, short answer, no tricks, no tools.
        return StubReply::Text(format!(
            "[scripted {name}] i'm really glad you told me. please reach out to one of those lines or someone you trust right now, you don't have to handle this alone."
        ));
    }
    if last["role"] == "system" && messages.len() > 1 {
        // A follow-up: the note after the conversation says what happened; the companion tells the user.
        let note = last["content"].as_str().unwrap_or("");
        return StubReply::Text(format!("[scripted {name}] {}", follow_up_line(note)));
    }
    let text = user_words(body);
    let lower = text.to_lowercase();
    if let Some(handover) = hand_over(system, &lower) {
        return StubReply::Text(format!("[scripted {name}] {handover}"));
    }
    if let Some(call) = choose(&lower, &text, &offered, speaker) {
        return call;
    }
    shown_reply(&messages, system, &text, speaker, &said, &name)
}

/// The system prompt the model reads, its parts joined.
fn system_prompt(messages: &[Value]) -> String {
    // The system prompt is sent in parts: a stable one first (for a provider's prompt cache), the part
    // of this turn (a flow in progress, the flows on offer…) after the history, before the user's
    // message. A system message after the last user message is a note (a follow-up's, the safety brief).
    let last_user = messages
        .iter()
        .rposition(|m| m["role"] == "user")
        .unwrap_or(messages.len());
    messages[..last_user]
        .iter()
        .filter(|m| m["role"] == "system")
        .filter_map(|m| m["content"].as_str())
        .collect::<Vec<_>>()
        .join("\n")
}

/// The text reply that shows what the worker sent: the user's words, how many earlier messages and
/// which tricklists the companion sees, the knowledge it read (in a group, less what another
/// companion already said).
fn shown_reply(
    messages: &[Value],
    system: &str,
    text: &str,
    speaker: Speaker,
    said: &[String],
    name: &str,
) -> StubReply {
    // Earlier messages of the conversation: the user's and the companion's own words, not the system
    // prompt, this message, tool calls or tool results.
    let history = messages
        .iter()
        .filter(|m| {
            m["role"] == "user"
                || (m["role"] == "assistant"
                    && m["content"].as_str().is_some_and(|c| !c.is_empty()))
        })
        .count()
        .saturating_sub(1);
    let mut lists = section_items(system, "## Their tricklists");
    // In a group each companion speaks for its own sport: the lists of that sport ("Winter Goals
    // (snowboard, 1/4)").
    let sport = speaker.sport.filter(|_| speaker.group);
    if let Some(sport) = sport {
        lists.retain(|l| l.contains(&format!("({sport},")));
    }
    let lists = match (lists.is_empty(), sport) {
        (true, None) => "no tricklists yet".to_owned(),
        (true, Some(sport)) => format!("no {sport} tricklists yet"),
        (false, None) => format!("your lists: {}", lists.join("; ")),
        (false, Some(sport)) => format!("your {sport} lists: {}", lists.join("; ")),
    };
    let knowledge = system
        .split_once("## Things you know")
        .map(|(_, rest)| {
            let titles: Vec<&str> = rest
                .lines()
                .filter_map(|l| l.strip_prefix("### "))
                .map(|t| t.split(" <").next().unwrap_or(t))
                .collect();
            format!("i also read up on: {}.", titles.join("; "))
        })
        .unwrap_or_default();
    let sentences = [
        format!(
            "you said \"{}\".",
            text.chars().take(80).collect::<String>()
        ),
        format!("i remember {history} earlier messages and can see {lists}."),
        knowledge,
    ];
    // In a group, what another companion already said for this message is not said again.
    let own: Vec<String> = sentences
        .into_iter()
        .filter(|s| !s.is_empty() && !said.iter().any(|line| line.contains(s.as_str())))
        .collect();
    if own.is_empty() {
        return StubReply::Text(format!(
            "[scripted {name}] nothing to add, that's what i'd say too"
        ));
    }
    StubReply::Text(format!("[scripted {name}] {}", own.join(" ")))
}

/// The offline model leading the spot wizard (`flows/spot_wizard.json`): it starts the flow when asked to
/// add a spot, records the link and the details the user gives, submits the draft and records its id,
/// and says each step's goal, as a real model would with the flow in its prompt.
///
/// Before the flow starts a turn is offered `start_flow` (the flows group) but not `set_flow_slots` (the
/// in-flow group): each move asks only for the tool it calls.
fn spot_wizard_move(messages: &[Value], system: &str, offered: &[&str]) -> Option<StubReply> {
    let has = |t: &str| offered.contains(&t);
    if !has("set_flow_slots") && !has("start_flow") {
        return None;
    }
    let last = messages.last()?;
    if last["role"] == "tool" {
        return spot_wizard_after_tool(messages, last, system, offered);
    }
    if last["role"] != "user" {
        return None;
    }
    spot_wizard_after_user(last, system, offered)
}

/// The spot wizard's move after a tool result (`last`): record the draft's id, submit the draft, or say
/// what the flow's step asks of the user.
fn spot_wizard_after_tool(
    messages: &[Value],
    last: &Value,
    system: &str,
    offered: &[&str],
) -> Option<StubReply> {
    let has = |t: &str| offered.contains(&t);
    let result: Value = serde_json::from_str(last["content"].as_str()?).ok()?;
    let called = messages
        .iter()
        .rev()
        .find(|m| m["role"] == "assistant")
        .and_then(|m| m["tool_calls"][0]["function"]["name"].as_str())
        .unwrap_or("");
    let in_wizard = system.contains("Guided flow in progress: Add a spot");
    if called == "create_spot_draft" && in_wizard && has("set_flow_slots") {
        let id = result["_id"].as_str()?;
        return Some(StubReply::tool(
            "set_flow_slots",
            json!({"slots": {"draft_id": id}}),
        ));
    }
    if result["flow"] != "spot_wizard" {
        return None;
    }
    let filled = &result["filled"];
    if result["step"] == "draft" && filled.get("draft_id").is_none() && has("create_spot_draft") {
        return Some(StubReply::tool(
            "create_spot_draft",
            json!({"name": filled["name"], "type": filled["spot_type"], "mapsUrl": filled["maps_url"],
                   "description": filled.get("features").cloned().unwrap_or(json!("added in the demo"))}),
        ));
    }
    // What the step asks of the user, said to the user (a real model reads the step's goal and
    // says it in its own words; the scripted one has a line per step).
    let spot = filled["name"].as_str().unwrap_or("your spot");
    let line = match result["step"].as_str().unwrap_or("") {
        "location" => "let's add it! drop me the google maps link to the spot 📍".to_owned(),
        "details" => {
            "got the link! what's the spot called, and is it a skatepark, a street spot or diy?"
                .to_owned()
        }
        "review" => {
            format!("sent \"{spot}\" to the moderators 🙌 i'll tell you as soon as they review it")
        }
        _ if result["status"] == "done" => "and that's your spot added, all done ✅".to_owned(),
        _ => "nice, on to the next bit!".to_owned(),
    };
    Some(StubReply::Text(format!("[scripted] {line}")))
}

/// The spot wizard's move after the user's message (`last`): start the flow when asked to add a spot,
/// else record the link or the details the flow's step asks for.
fn spot_wizard_after_user(last: &Value, system: &str, offered: &[&str]) -> Option<StubReply> {
    let has = |t: &str| offered.contains(&t);
    let text = last["content"].as_str().unwrap_or("");
    let lower = text.to_lowercase();
    let in_wizard = system.contains("Guided flow in progress: Add a spot");
    if !in_wizard {
        let wants = lower.contains("add a spot") || lower.contains("add a new spot");
        return (wants && has("start_flow"))
            .then(|| StubReply::tool("start_flow", json!({"flow": "spot_wizard"})));
    }
    if !has("set_flow_slots") {
        return None;
    }
    let step = |s: &str| system.contains(&format!("\"step\":\"{s}\""));
    if step("location")
        && let Some(url) = link_in(text)
    {
        return Some(StubReply::tool(
            "set_flow_slots",
            json!({"slots": {"maps_url": url}}),
        ));
    }
    if step("details") {
        // The name the user gives, else the one the link recorded at the first step names.
        let link =
            flow_state(system).and_then(|f| f["filled"]["maps_url"].as_str().and_then(place_name));
        let name = called(text).or(link).unwrap_or_else(|| "New Spot".into());
        let kind = spot_kind(&lower).unwrap_or("skatepark");
        return Some(StubReply::tool(
            "set_flow_slots",
            json!({"slots": {"name": name, "spot_type": kind, "features": text}}),
        ));
    }
    None
}

/// The guided flow in progress as the system prompt shows it (`{"flow": …, "step": …, "filled": …}`).
fn flow_state(system: &str) -> Option<Value> {
    let (_, rest) = system.split_once("## Guided flow in progress")?;
    rest.lines()
        .find(|l| l.starts_with('{'))
        .and_then(|l| serde_json::from_str(l).ok())
}

/// A `create_tricklist` call of `category` for a message like "make me a park list with kickflip, 50-50
/// and boardslide"; `known` are trick names the message mentions, used when it lists none after "with".
fn create_list_call(lower: &str, known: &[String], category: &str) -> StubReply {
    let mut tricks: Vec<String> = lower
        .split_once(" with ")
        .map(|(_, rest)| rest)
        .unwrap_or("")
        .split([',', '&'])
        .flat_map(|s| s.split(" and "))
        .map(|s| s.trim().trim_end_matches(['.', '!', '?']).to_owned())
        .filter(|s| !s.is_empty())
        .collect();
    if tricks.is_empty() {
        tricks = known.to_vec();
    }
    if tricks.is_empty() {
        // Nothing named and nothing known: the first steps of any skater.
        tricks = ["Ollie", "Pop Shove-it", "Frontside 180"]
            .map(String::from)
            .to_vec();
    }
    let name = if lower.contains("park") {
        "Park List"
    } else if lower.contains("beginner") {
        "Beginner Tricks"
    } else {
        "New List"
    };
    StubReply::tool(
        "create_tricklist",
        json!({"name": name, "tricks": tricks, "category": category}),
    )
}

/// A map link in the message, if any.
fn maps_link(lower: &str) -> bool {
    lower.contains("maps.app.goo.gl")
        || lower.contains("google.com/maps")
        || lower.contains("maps.google.")
        || lower.contains("maps.apple.com")
}

/// How far ahead the offline model sets a reminder (the demo's worker accepts 5 s).
const DEMO_REMINDER_SECS: i64 = 10;

fn demo_tool_call(
    lower: &str,
    text: &str,
    offered: &[&str],
    speaker: Speaker,
) -> Option<StubReply> {
    let has = |t: &str| offered.contains(&t);
    if lower.starts_with("remember") && has("remember") {
        let fact = crate::memory_rules::facts_in(text)
            .into_iter()
            .next()
            .map(|(_, f)| f)
            .unwrap_or_else(|| {
                let rest = lower
                    .trim_start_matches("remember")
                    .trim_start_matches([',', ':', ' ']);
                rest.trim_start_matches("that ").to_owned()
            });
        return Some(StubReply::tool("remember", json!({ "fact": fact })));
    }
    if lower.starts_with("forget") && has("forget") {
        let about = lower
            .trim_start_matches("forget")
            .trim_start_matches([',', ':', ' '])
            .trim_start_matches("that ")
            .trim_start_matches("about ")
            .trim_end_matches(['.', '!', '?']);
        let about = if about.is_empty() { "that" } else { about };
        return Some(StubReply::tool("forget", json!({ "about": about })));
    }
    if lower.contains("remind me")
        && has("schedule_reminder")
        && let Some((what, after)) = reminder_of(lower)
    {
        let at = chrono::Utc::now() + after;
        return Some(StubReply::tool(
            "schedule_reminder",
            json!({"text": what, "at": at.to_rfc3339()}),
        ));
    }
    if (lower.contains("make") || lower.contains("create"))
        && lower.contains("list")
        && has("create_tricklist")
    {
        let category = sport_of(lower).unwrap_or("skateboard");
        return Some(create_list_call(lower, &[], category));
    }
    if lower.contains("my list") || lower.contains("tricklist") || lower.contains("progress") {
        return has("get_user_tricklists")
            .then(|| StubReply::ToolCalls(vec![("get_user_tricklists".into(), String::new())]));
    }
    if maps_link(lower) && has("create_spot_draft") {
        let url = link_in(text).unwrap_or("");
        // The name the user gives, else the one the link names.
        let name = called(text)
            .or_else(|| place_name(url))
            .unwrap_or_else(|| "New Spot".into());
        let kind = spot_kind(lower).unwrap_or("street");
        return Some(StubReply::tool(
            "create_spot_draft",
            json!({"name": name, "mapsUrl": url, "type": kind}),
        ));
    }
    if (lower.contains("spot") || lower.contains("park")) && has("search_spots") {
        return spot_search(place_in(lower), lower, speaker);
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

/// The place a message asks about: the words after "in", "near" or "around", up to the punctuation.
fn place_in(lower: &str) -> Option<String> {
    let (_, rest) = [" near ", " in ", " around "]
        .iter()
        .find_map(|w| lower.split_once(w))?;
    let place = rest
        .split(['?', '.', '!', ','])
        .next()
        .unwrap_or("")
        .trim()
        .trim_start_matches("the ");
    (!place.is_empty()).then(|| place.to_owned())
}

/// What a reminder request asks for and how far ahead: "remind me to wax my board in 2 minutes", "remind
/// me in 2 minutes to wax my board", "remind me to wax my board" (the demo's few seconds).
fn reminder_of(lower: &str) -> Option<(String, chrono::Duration)> {
    let (_, rest) = lower.split_once("remind me")?;
    let rest = rest.trim_end_matches(['?', '.', '!']).trim();
    let (lead, what) = match rest.strip_prefix("in ") {
        Some(r) => {
            let (when, what) = r.split_once(" to ")?;
            (Some(when), what)
        }
        None => {
            let r = rest.strip_prefix("to ")?;
            match r.rsplit_once(" in ") {
                Some((what, when)) if lead_of(when).is_some() => (Some(when), what),
                _ => (None, r),
            }
        }
    };
    let after = lead
        .and_then(lead_of)
        .unwrap_or(chrono::Duration::seconds(DEMO_REMINDER_SECS));
    let what = what.trim();
    (!what.is_empty()).then(|| (what.to_owned(), after))
}

/// "2 minutes", "an hour", "a few seconds", "30 secs" as a duration.
fn lead_of(when: &str) -> Option<chrono::Duration> {
    let mut words = when.split_whitespace();
    let n = match words.next()? {
        "a" | "an" | "one" => 1,
        "a few" | "few" => 5,
        "two" => 2,
        "five" => 5,
        "ten" => 10,
        w => w.parse::<i64>().ok()?,
    };
    let unit = words.find(|w| *w != "few")?;
    match unit.trim_end_matches('s') {
        "sec" | "second" => Some(chrono::Duration::seconds(n.max(DEMO_REMINDER_SECS))),
        "min" | "minute" => Some(chrono::Duration::minutes(n)),
        "hour" | "hr" => Some(chrono::Duration::hours(n)),
        _ => None,
    }
}

/// The sports a message talks about, by the word stems people use, the last named last.
const SPORTS: &[(&str, &str)] = &[
    ("skat", "skateboard"),
    ("snowboard", "snowboard"),
    ("bmx", "bmx"),
    ("ski", "ski"),
    ("surf", "surf"),
];

/// Where a lower-case text names a sport by its stem.
fn mentions<'a>(lower: &'a str, stem: &'a str) -> impl Iterator<Item = usize> + 'a {
    lower
        .match_indices(stem)
        .map(|(i, _)| i)
        // "ski" inside "skill" or "skin" is not skiing.
        .filter(move |i| stem != "ski" || !lower[i + 3..].starts_with(['l', 'n']))
}

/// The sport a message is about: the one it names last ("a snowboarder getting into skating": skating).
fn sport_of(lower: &str) -> Option<&'static str> {
    SPORTS
        .iter()
        .filter_map(|(stem, sport)| mentions(lower, stem).last().map(|i| (i, *sport)))
        .max_by_key(|(i, _)| *i)
        .map(|(_, sport)| sport)
}

/// The kinds of spot (`ck_spots.type`) where a sport is ridden; none for a sport the map has no spots
/// of (surf).
fn spot_kinds(sport: &str) -> &'static [&'static str] {
    match sport {
        "skateboard" | "bmx" => &["skatepark", "street", "diy"],
        "snowboard" | "ski" => &["snow", "mountain", "resort"],
        _ => &[],
    }
}

/// The spot search for a question about places: where it asks (`place`, else a sport's kind of park).
/// In a group each companion tells of its own sport's spots (the sport the message names, else its
/// own): one search per kind of spot of that sport, and none when the map has no spots of it.
fn spot_search(place: Option<String>, lower: &str, speaker: Speaker) -> Option<StubReply> {
    let sport = sport_of(lower).or(speaker.sport);
    let Some(sport) = sport.filter(|_| speaker.group) else {
        let query = place.unwrap_or_else(|| "skatepark".into());
        return Some(StubReply::tool("search_spots", json!({ "query": query })));
    };
    let query = place.unwrap_or_else(|| {
        match sport {
            "snowboard" | "ski" => "terrain park",
            _ => "skatepark",
        }
        .into()
    });
    let calls: Vec<(String, String)> = spot_kinds(sport)
        .iter()
        .map(|kind| {
            let args = json!({"query": query, "type": kind});
            ("search_spots".to_owned(), args.to_string())
        })
        .collect();
    (!calls.is_empty()).then_some(StubReply::ToolCalls(calls))
}

/// In a group chat, a question about another companion's sport is handed over to them by name (the
/// worker then lets them answer), as a real model is told it may.
fn hand_over(system: &str, lower: &str) -> Option<String> {
    let (_, note) = system.split_once("## This is a group chat")?;
    let others = note
        .split_once("and the companions ")?
        .1
        .split(". ")
        .next()?;
    let sport = sport_of(lower)?;
    let (who, _) = others
        .split(", ")
        .filter_map(|o| o.split_once(" ("))
        .find(|(_, s)| s.trim_end_matches(')').starts_with(sport))?;
    Some(format!(
        "ooh that's {who}'s thing, not mine! {}, help them out?",
        who.to_lowercase()
    ))
}

/// What a follow-up's note says happened, told to the user: a spot review or a due reminder, and the
/// guided flow it moved on.
fn follow_up_line(note: &str) -> String {
    let quoted = |after: &str| -> Option<String> {
        let (_, rest) = note.split_once(after)?;
        Some(rest.split('"').next()?.to_owned())
    };
    let mut line = if let Some(spot) = quoted("moderators approved the spot \"") {
        format!("yo, your spot \"{spot}\" got approved!! 🎉 it's live on TrickBook now")
    } else if let Some(spot) = quoted("did not approve the spot \"") {
        let said = quoted("The moderator's note: \"")
            .map(|n| format!(" (they said: \"{n}\")"))
            .unwrap_or_default();
        format!(
            "hey, the mods didn't approve \"{spot}\" this time{said}. want me to fix it up and send it again?"
        )
    } else if let Some(what) = quoted("You promised to remind the user of this, for ").and(
        note.split_once(": \"")
            .and_then(|(_, r)| r.split('"').next())
            .map(str::to_owned),
    ) {
        format!("⏰ hey! you asked me to remind you: {what}")
    } else {
        "following up on something for you!".to_owned()
    };
    if let Some(flow) = quoted("moves on the guided flow \"") {
        if note.contains("\"status\":\"done\"") {
            line.push_str(&format!(" and that wraps up \"{flow}\" ✅"));
        } else {
            line.push_str(&format!(" (that's the next step of \"{flow}\" done)"));
        }
    }
    line
}

/// What the tool results of this turn gave, told to the user. Spot searches (one per kind of spot, in a
/// group) are told as one list: of `sport` when the searches were by kind, and without the spots another
/// companion already named for this message (`said`).
fn summarise_tool_results(messages: &[Value], sport: Option<&str>, said: &[String]) -> String {
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
    let searches: Vec<Value> = messages
        .iter()
        .rev()
        .filter_map(|m| m["tool_calls"].as_array())
        .flatten()
        .filter(|c| c["function"]["name"] == "search_spots")
        .filter_map(|c| serde_json::from_str::<Value>(c["function"]["arguments"].as_str()?).ok())
        .collect();
    // Where the user asked for spots: the query of the last search.
    let asked_where = searches
        .first()
        .and_then(|a| a["query"].as_str().map(str::to_lowercase))
        .filter(|q| q != "skatepark" && q != "terrain park");
    // Searched by kind of spot: that sport's spots.
    let kind = match sport {
        Some(sport) if searches.first().is_some_and(|a| a.get("type").is_some()) => {
            format!("{sport} ")
        }
        _ => String::new(),
    };
    let mut spots: Vec<Value> = Vec::new();
    let mut spots_at = None;
    let mut parts = Vec::new();
    for r in results.iter().rev() {
        if let Some(e) = r.get("error") {
            parts.push(format!("that didn't work ({e})"));
        } else if let Some(found) = r.get("spots").and_then(Value::as_array) {
            spots_at.get_or_insert(parts.len());
            for s in found {
                if !spots.iter().any(|k| k["name"] == s["name"]) {
                    spots.push(s.clone());
                }
            }
        } else if r["status"] == "pending_approval" {
            let name = r["name"].as_str().unwrap_or("your spot");
            parts.push(format!(
                "sent \"{name}\" to the moderators for review; i'll tell you when they do"
            ));
        } else if let Some(names) = names_of(r, "tricks") {
            parts.push(format!("trickipedia has: {names}"));
        } else if let Some(names) = names_of(r, "tricklists") {
            parts.push(format!("your lists are: {names}"));
        } else if let Some(what) = r
            .get("reminderId")
            .and(r.get("text"))
            .and_then(Value::as_str)
        {
            parts.push(format!("deal! i'll remind you: {what} ⏰"));
        } else if let Some(fact) = r.get("remembered").and_then(Value::as_str) {
            parts.push(format!("got it, i'll remember that: {fact} 🧠"));
        } else if let Some(gone) = r.get("forgotten").and_then(Value::as_array) {
            let gone: Vec<&str> = gone.iter().filter_map(Value::as_str).collect();
            parts.push(match gone.is_empty() {
                true => "i didn't have anything like that saved".to_owned(),
                false => format!("forgotten: {}", gone.join(", ")),
            });
        } else if let Some(name) = r.get("name").and_then(Value::as_str) {
            parts.push(format!("done, \"{name}\" is saved"));
        } else {
            parts.push("done".to_owned());
        }
    }
    if let Some(at) = spots_at {
        parts.insert(at, spots_line(&spots, asked_where.as_deref(), &kind, said));
    }
    format!("[scripted] {}", parts.join("; "))
}

/// Spots found, told to the user: `kind` is "" or the sport searched ("snowboard "); spots another
/// companion already named for this message (`said`) are not named again.
fn spots_line(spots: &[Value], asked_where: Option<&str>, kind: &str, said: &[String]) -> String {
    let named_by = |s: &Value| {
        let name = s["name"].as_str().unwrap_or("").to_lowercase();
        said.iter()
            .find(|line| !name.is_empty() && line.to_lowercase().contains(&name))
    };
    let new: Vec<&Value> = spots.iter().filter(|s| named_by(s).is_none()).collect();
    if new.is_empty()
        && let Some(line) = spots.iter().find_map(named_by)
    {
        let who = line.split_once(": ").map_or("they", |(who, _)| who);
        return format!("{who} already named the {kind}spots i know there 🙌");
    }
    let names = names_of(&json!({ "spots": new }), "spots").unwrap_or_default();
    let there = |s: &&Value| {
        let city = s["city"].as_str().unwrap_or("").to_lowercase();
        asked_where.is_some_and(|w| !city.is_empty() && w.contains(&city))
    };
    match asked_where {
        Some(w) if new.is_empty() => format!(
            "i don't know any {kind}spots in {w} yet, sorry! want me to look somewhere else?"
        ),
        Some(w) if !new.iter().any(there) => {
            format!("i don't know any {kind}spots in {w} yet, sorry! the closest i have: {names}")
        }
        _ => format!("found these {kind}spots: {names}"),
    }
}

fn names_of(v: &Value, key: &str) -> Option<String> {
    let items = v.get(key)?.as_array()?;
    if items.is_empty() {
        return Some("nothing".into());
    }
    let mut names: Vec<&str> = Vec::new();
    for name in items.iter().filter_map(|i| i["name"].as_str()) {
        // The same name in two sports (a skate and a snowboard boardslide) is said once.
        if !names.contains(&name) {
            names.push(name);
        }
    }
    Some(names.join(", "))
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

/// What a user's message asks for, as the embedding-backed demo model reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Intent {
    CreateList,
    MyLists,
    Spots,
    TrickHelp,
    Chat,
}

/// Example messages of each intent; a message takes the intent of the example it is closest to.
const INTENT_EXAMPLES: &[(Intent, &str)] = &[
    (
        Intent::CreateList,
        "make me a tricklist with kickflip, ollie and heelflip",
    ),
    (Intent::CreateList, "create a new list of tricks for me"),
    (
        Intent::CreateList,
        "can you start a park list for me with 50-50 and boardslide",
    ),
    (
        Intent::CreateList,
        "add a list of the tricks I want to learn this summer",
    ),
    (Intent::MyLists, "what's on my tricklists right now?"),
    (Intent::MyLists, "show me my lists"),
    (Intent::MyLists, "how am I doing on my trick progress?"),
    (Intent::MyLists, "which tricks have I already landed?"),
    (Intent::Spots, "any good skateparks in Portland?"),
    (Intent::Spots, "where can I skate around here?"),
    (Intent::Spots, "find me a spot to ride in the city"),
    (
        Intent::Spots,
        "is there a good mountain to snowboard near me?",
    ),
    (Intent::TrickHelp, "how do I ollie?"),
    (
        Intent::TrickHelp,
        "what's a good first trick on a skateboard?",
    ),
    (Intent::TrickHelp, "tips for landing a kickflip"),
    (Intent::TrickHelp, "teach me how to do a pop shove-it"),
    (Intent::TrickHelp, "which trick should I learn next?"),
    (Intent::Chat, "hey! how often should i wax my snowboard?"),
    (
        Intent::Chat,
        "what should I wear for a cold day on the mountain?",
    ),
    (Intent::Chat, "thanks, you're the best"),
    (Intent::Chat, "how was your day?"),
    (Intent::Chat, "what's your favourite board?"),
];

/// Below this similarity to every example, the keyword rules decide; on the encoder's own scale (e5's
/// similarities crowd into 0.7–1.0).
fn intent_floor(encoder: &str) -> f32 {
    match encoder {
        "all-MiniLM-L6-v2" => 0.35,
        _ => 0.85,
    }
}

/// A trick of the demo's trickipedia, embedded.
struct KnownTrick {
    name: String,
    category: String,
    beginner: bool,
    embedding: Vec<f32>,
}

/// The offline demo model with the embedding model at hand: it reads a newcomer's own phrasing ("how do
/// I ollie?", "what's a good first trick on a skateboard?") by the closest example message, and picks
/// the trick or city a tool call names from the demo data. Still scripted, and says so.
pub struct DemoModel {
    embedder: Arc<companion_knowledge::rag::Embedder>,
    intents: Vec<(Intent, Vec<f32>)>,
    tricks: Vec<KnownTrick>,
    cities: Vec<String>,
}

impl DemoModel {
    /// Embeds the example messages and the trickipedia of the seed data (`tricks.json`, `ck_spots.json`).
    pub async fn load(
        embedder: Arc<companion_knowledge::rag::Embedder>,
        seed_dir: &std::path::Path,
    ) -> Result<Self, String> {
        let read = |file: &str| -> Result<Vec<bson::Document>, String> {
            crate::seed::read_documents(&seed_dir.join(file)).map_err(|e| e.to_string())
        };
        let tricks = read("tricks.json")?;
        let spots = read("ck_spots.json")?;
        let texts: Vec<String> = INTENT_EXAMPLES
            .iter()
            .map(|(_, t)| (*t).to_owned())
            .chain(tricks.iter().map(|t| {
                format!(
                    "{}: {} ({} {})",
                    t.get_str("name").unwrap_or(""),
                    t.get_str("description").unwrap_or(""),
                    t.get_str("difficulty").unwrap_or(""),
                    t.get_str("category").unwrap_or("")
                )
            }))
            .collect();
        let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
        let mut vectors = embedder
            .embed(companion_knowledge::rag::Role::Query, &refs)
            .await
            .map_err(|e| e.to_string())?;
        let trick_vectors = vectors.split_off(INTENT_EXAMPLES.len());
        let intents = INTENT_EXAMPLES
            .iter()
            .map(|(i, _)| *i)
            .zip(vectors)
            .collect();
        let tricks = tricks
            .iter()
            .zip(trick_vectors)
            .filter_map(|(t, embedding)| {
                Some(KnownTrick {
                    name: t.get_str("name").ok()?.to_owned(),
                    category: t.get_str("category").unwrap_or("").to_owned(),
                    beginner: t.get_str("difficulty").is_ok_and(|d| d == "beginner"),
                    embedding,
                })
            })
            .collect();
        let mut cities: Vec<String> = spots
            .iter()
            .filter_map(|s| s.get_str("city").ok().map(str::to_owned))
            .collect();
        cities.sort();
        cities.dedup();
        Ok(Self {
            embedder,
            intents,
            tricks,
            cities,
        })
    }

    /// The intent of a message, with its similarity to the closest example.
    pub fn intent_of(&self, v: &[f32]) -> (Intent, f32) {
        self.intents
            .iter()
            .map(|(i, e)| (*i, companion_knowledge::rag::cosine(v, e)))
            .fold((Intent::Chat, f32::MIN), |best, x| {
                if x.1 > best.1 { x } else { best }
            })
    }

    /// Trick names the message mentions, longest first ("50-50 Grind" before "50-50").
    fn mentioned_tricks(&self, lower: &str) -> Vec<String> {
        let squash = |s: &str| s.to_lowercase().replace(['-', ' '], "");
        let text = squash(lower);
        let mut found: Vec<&KnownTrick> = self
            .tricks
            .iter()
            .filter(|t| text.contains(&squash(&t.name)))
            .collect();
        found.sort_by_key(|t| std::cmp::Reverse(t.name.len()));
        found.into_iter().map(|t| t.name.clone()).collect()
    }

    /// The sport the named tricks are tricks of: the one most of them belong to, `own` on a tie ("Kickflip,
    /// 50-50 and Boardslide": skateboard; "Boardslide" alone, asked of a snowboarder: snowboard).
    fn sport_of_tricks(&self, names: &[String], own: Option<&'static str>) -> Option<&'static str> {
        SPORTS
            .iter()
            .map(|(_, sport)| {
                let n = self
                    .tricks
                    .iter()
                    .filter(|t| t.category == *sport && names.contains(&t.name))
                    .count();
                (n, own == Some(*sport), *sport)
            })
            .filter(|(n, ..)| *n > 0)
            .max_by_key(|(n, mine, _)| (*n, *mine))
            .map(|(.., sport)| sport)
    }

    /// The trick a question is about and its sport: one it names (of the sport the message names, else
    /// the sport of that trick, the speaker's `own` first), else the closest of the sport the message
    /// names or else the speaker's own (a beginner one when it asks for a first or easy trick).
    fn trick_for(
        &self,
        lower: &str,
        v: &[f32],
        own: Option<&'static str>,
    ) -> Option<(String, Option<&'static str>)> {
        let named = sport_of(lower);
        if let Some(name) = self.mentioned_tricks(lower).into_iter().next() {
            let sport = named.or_else(|| self.sport_of_tricks(std::slice::from_ref(&name), own));
            return Some((name, sport));
        }
        let sport = named.or(own);
        let easy = ["first", "begin", "easy", "start", "simple"]
            .iter()
            .any(|w| lower.contains(w));
        self.tricks
            .iter()
            .filter(|t| sport.is_none_or(|s| t.category == s) && (!easy || t.beginner))
            .map(|t| (t, companion_knowledge::rag::cosine(v, &t.embedding)))
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .map(|(t, _)| (t.name.clone(), sport))
    }

    /// The tool call for a user's message, if it asks for one.
    async fn choose(&self, text: &str, offered: &[String], speaker: Speaker) -> Option<StubReply> {
        let lower = text.to_lowercase();
        let offered: Vec<&str> = offered.iter().map(String::as_str).collect();
        let has = |t: &str| offered.contains(&t);
        if maps_link(&lower)
            || lower.contains("remind me")
            || lower.starts_with("remember")
            || lower.starts_with("forget")
        {
            return demo_tool_call(&lower, text, &offered, speaker);
        }
        let v = self
            .embedder
            .embed_one(companion_knowledge::rag::Role::Query, text)
            .await
            .ok()?;
        let (intent, score) = self.intent_of(&v);
        if score < intent_floor(self.embedder.model()) {
            return demo_tool_call(&lower, text, &offered, speaker);
        }
        match intent {
            Intent::CreateList if has("create_tricklist") => {
                let mut tricks = self.mentioned_tricks(&lower);
                // The sport the message names, else that of the tricks it names, else the speaker's.
                let sport = sport_of(&lower)
                    .or_else(|| self.sport_of_tricks(&tricks, speaker.sport))
                    .or(speaker.sport)
                    .unwrap_or("skateboard");
                if tricks.is_empty() {
                    // "a list of 3 beginner tricks": that many of the trickipedia's beginner tricks.
                    let n = lower
                        .split_whitespace()
                        .find_map(|w| w.parse::<usize>().ok())
                        .unwrap_or(3)
                        .clamp(1, 10);
                    tricks = self
                        .tricks
                        .iter()
                        .filter(|t| t.beginner && t.category == sport)
                        .take(n)
                        .map(|t| t.name.clone())
                        .collect();
                }
                Some(create_list_call(&lower, &tricks, sport))
            }
            Intent::MyLists if has("get_user_tricklists") => Some(StubReply::ToolCalls(vec![(
                "get_user_tricklists".into(),
                String::new(),
            )])),
            Intent::Spots if has("search_spots") => {
                let city = self
                    .cities
                    .iter()
                    .find(|c| lower.contains(&c.to_lowercase()))
                    .cloned()
                    .or_else(|| place_in(&lower));
                spot_search(city, &lower, speaker)
            }
            Intent::TrickHelp if has("search_trickipedia") => {
                let (name, sport) = self.trick_for(&lower, &v, speaker.sport)?;
                let mut args = json!({"query": name});
                if let Some(sport) = sport {
                    args["category"] = json!(sport);
                }
                Some(StubReply::tool("search_trickipedia", args))
            }
            _ => None,
        }
    }

    /// The model as a stub server's responder.
    pub fn responder(self: Arc<Self>) -> AsyncResponder {
        Arc::new(move |body: Value| {
            let model = self.clone();
            Box::pin(async move {
                if let Some(answer) = crate::memory_rules::answer(&body) {
                    return StubReply::Text(answer);
                }
                let last = body["messages"]
                    .as_array()
                    .and_then(|m| m.last())
                    .cloned()
                    .unwrap_or_default();
                let choice = if last["role"] == "tool" {
                    None
                } else {
                    let offered: Vec<String> = body["tools"]
                        .as_array()
                        .map(|t| {
                            t.iter()
                                .filter_map(|t| t["function"]["name"].as_str().map(str::to_owned))
                                .collect()
                        })
                        .unwrap_or_default();
                    model
                        .choose(&user_words(&body), &offered, Speaker::of(&body))
                        .await
                };
                compose(&body, |_, _, _, _| choice)
            })
        })
    }
}

/// A scripted OpenAI-compatible moderation endpoint (`POST /v1/moderations`) for tests: a text containing
/// one of the `flags` words is flagged in that word's categories; with `hang`, it never answers.
pub struct StubModeration {
    pub base_url: String,
    asked: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

/// The categories an omni-moderation answer carries.
const MODERATION_CATEGORIES: [&str; 13] = [
    "harassment",
    "harassment/threatening",
    "hate",
    "hate/threatening",
    "illicit",
    "illicit/violent",
    "self-harm",
    "self-harm/intent",
    "self-harm/instructions",
    "sexual",
    "sexual/minors",
    "violence",
    "violence/graphic",
];

impl StubModeration {
    /// Starts on a free loopback port.
    pub async fn start(
        flags: Vec<(&'static str, Vec<&'static str>)>,
        hang: bool,
    ) -> std::io::Result<Self> {
        let asked = Arc::new(AtomicU64::new(0));
        let counter = asked.clone();
        let flags = Arc::new(flags);
        let answer = move |Json(body): Json<Value>| {
            let (flags, counter) = (flags.clone(), counter.clone());
            async move {
                counter.fetch_add(1, Ordering::SeqCst);
                if hang {
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                }
                let text = body["input"].as_str().unwrap_or_default().to_lowercase();
                let on: Vec<&str> = flags
                    .iter()
                    .filter(|(word, _)| text.contains(word))
                    .flat_map(|(_, categories)| categories.iter().copied())
                    .collect();
                let categories: serde_json::Map<String, Value> = MODERATION_CATEGORIES
                    .iter()
                    .map(|c| ((*c).to_owned(), Value::Bool(on.contains(c))))
                    .collect();
                let scores: serde_json::Map<String, Value> = MODERATION_CATEGORIES
                    .iter()
                    .map(|c| {
                        (
                            (*c).to_owned(),
                            json!(if on.contains(c) { 0.9 } else { 0.01 }),
                        )
                    })
                    .collect();
                Json(json!({
                    "id": "modr-stub",
                    "model": body["model"],
                    "results": [{
                        "flagged": !on.is_empty(),
                        "categories": categories,
                        "category_scores": scores,
                    }],
                }))
            }
        };
        let app = Router::new()
            .route("/v1/moderations", post(answer.clone()))
            .route("/moderations", post(answer));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(Self {
            base_url: format!("http://{addr}/v1"),
            asked,
            task,
        })
    }

    /// How many texts it was asked about.
    pub fn asked(&self) -> u64 {
        self.asked.load(Ordering::SeqCst)
    }
}

impl Drop for StubModeration {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn the_prompt_cache_serves_the_longest_prefix_seen_in_blocks_from_1024_tokens() {
        let mut cache = PromptCache::default();
        let shared = vec![b'a'; 600 * 4];
        let short = [shared.clone(), vec![b'x'; 400]].concat();
        assert_eq!(cache.serve(&short), 0, "nothing seen yet");
        assert_eq!(
            cache.serve(&short),
            0,
            "a prefix under 1,024 tokens is not cached"
        );
        let long = [vec![b'b'; 1100 * 4], vec![b'y'; 300 * 4]].concat();
        assert_eq!(cache.serve(&long), 0);
        let other = [vec![b'b'; 1100 * 4], vec![b'z'; 300 * 4]].concat();
        assert_eq!(
            cache.serve(&other),
            1024,
            "the shared 1,100 tokens, in whole blocks"
        );
        assert_eq!(
            cache.serve(&other),
            1280,
            "all of a request seen before, in whole blocks"
        );
    }

    use super::*;

    #[test]
    fn reminders_are_read_with_their_lead_time() {
        let (what, after) = reminder_of("remind me in 2 minutes to wax my board").unwrap();
        assert_eq!(
            (what.as_str(), after),
            ("wax my board", chrono::Duration::minutes(2))
        );
        let (what, after) = reminder_of("remind me to wax my board in an hour!").unwrap();
        assert_eq!(
            (what.as_str(), after),
            ("wax my board", chrono::Duration::hours(1))
        );
        let (what, after) = reminder_of("remind me to wax my board in a few seconds").unwrap();
        assert_eq!(what, "wax my board");
        assert_eq!(after, chrono::Duration::seconds(DEMO_REMINDER_SECS));
        let (what, _) = reminder_of("remind me to check in with the crew").unwrap();
        assert_eq!(what, "check in with the crew");
        assert!(reminder_of("remind me").is_none());
    }

    #[test]
    fn the_sport_asked_about_is_the_last_named_and_a_group_hands_it_over() {
        let q = "i'm a snowboarder trying to get into skating, any tips?";
        assert_eq!(sport_of(q), Some("skateboard"));
        assert_eq!(sport_of("best skis for powder?"), Some("ski"));
        assert_eq!(sport_of("any skill tips?"), None);
        let system = "You are Kaori\n## This is a group chat\nThis conversation is a group chat in \
                      TrickBook, not a DM. In it: Jess and the companions Tony (skateboard). Messages…";
        let line = hand_over(system, q).unwrap();
        assert!(line.contains("Tony") && line.contains("tony,"), "{line}");
        assert_eq!(
            hand_over(system, "which board for powder snowboarding?"),
            None
        );
        assert_eq!(hand_over("You are Kaori (a DM)", q), None);
    }

    /// A request as the worker sends it: the companion's system prompt, the user's message, the tools.
    fn request(system: &str, user: &str, tools: &[&str]) -> Value {
        let tools: Vec<Value> = tools
            .iter()
            .map(|t| json!({"type": "function", "function": {"name": t}}))
            .collect();
        json!({"messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
               "tools": tools})
    }

    /// The one tool call of an answer: its name and arguments.
    fn call_of(reply: StubReply) -> (String, Value) {
        match reply {
            StubReply::ToolCalls(calls) if calls.len() == 1 => {
                let (name, args) = calls.into_iter().next().unwrap();
                (name, serde_json::from_str(&args).unwrap())
            }
            other => panic!("one tool call: {other:?}"),
        }
    }

    const KAORI: &str = "You are Kaori 🏔️, an AI companion in TrickBook, a skate/snow/BMX app, chatting with \
        one user in its DMs. Japanese snowboarder from SSX Tricky.\nRules:\n- Stay in character.";

    #[test]
    fn a_spot_shared_by_its_link_is_named_by_the_link_or_the_user() {
        let model = demo();
        let name_of = |text: &str| {
            let (tool, args) = call_of(model(&request(KAORI, text, &["create_spot_draft"])));
            assert_eq!(tool, "create_spot_draft");
            args["name"].as_str().unwrap().to_owned()
        };
        let link = "https://www.google.com/maps/place/Hollow+Bowl/@45.5,-122.6,17z";
        assert_eq!(
            name_of(&format!("can you add this spot? {link}")),
            "Hollow Bowl"
        );
        assert_eq!(
            name_of("add https://www.google.com/maps/search/Caf%C3%A9+Ledges/@51.5,-0.12,17z pls"),
            "Café Ledges"
        );
        assert_eq!(
            name_of("add this https://maps.apple.com/place?coordinate=34.0,-118.4&name=Venice+Pit"),
            "Venice Pit"
        );
        assert_eq!(
            name_of(&format!("add this spot, it's called The Pit {link}")),
            "The Pit",
            "the user's own name wins"
        );
        // A link that names no place (coordinates only, a short link): the placeholder.
        assert_eq!(
            name_of("add https://www.google.com/maps/@45.5,-122.6,17z"),
            "New Spot"
        );
        assert_eq!(name_of("add https://maps.app.goo.gl/AbCdEf123"), "New Spot");
        assert_eq!(
            name_of("add https://maps.google.com/?q=39.9,-75.177"),
            "New Spot"
        );
    }

    #[test]
    fn the_spot_wizard_names_the_spot_by_its_link_when_the_user_gives_no_name() {
        let model = demo();
        let flow = |filled: Value| {
            format!(
                "{KAORI}\n## Guided flow in progress: Add a spot to TrickBook\n{}\nWork towards the step's goal.",
                json!({"flow": "spot_wizard", "status": "active", "step": "details", "filled": filled})
            )
        };
        let link =
            json!({"maps_url": "https://www.google.com/maps/place/Hollow+Bowl/@45.5,-122.6,17z"});
        let (tool, args) = call_of(model(&request(
            &flow(link.clone()),
            "it's a diy spot with a deep bowl",
            &["set_flow_slots"],
        )));
        assert_eq!(tool, "set_flow_slots");
        assert_eq!(args["slots"]["name"], "Hollow Bowl");
        assert_eq!(args["slots"]["spot_type"], "diy");
        let (_, args) = call_of(model(&request(
            &flow(link),
            "it's called Deep End, a skatepark",
            &["set_flow_slots"],
        )));
        assert_eq!(args["slots"]["name"], "Deep End");
    }

    /// A group's request as the worker sends it to `system`'s companion: the person's message, then what
    /// the companions before it said for that message (`Name: text`), then `after`.
    fn group_request(
        system: &str,
        others: &str,
        person: &str,
        said: &[&str],
        after: &[Value],
    ) -> Value {
        let note = format!(
            "\n## This is a group chat\nThis conversation is a group chat in TrickBook, not a DM. In it: \
             Jess Rivera and the companions {others}. Messages from others start with the speaker's name \
             and a colon.\n"
        );
        let lists = "\n## Their tricklists (✓ landed)\n- Winter Goals (snowboard, 1/4): Backside 180 ✓, Nose \
                     Press\n- Park Essentials (skateboard, 3/5): Ollie ✓, Drop In\n";
        let mut messages = vec![
            json!({"role": "system", "content": format!("{system}{lists}{note}")}),
            json!({"role": "system", "content": "Now: Saturday 28 November 2026, 17:05 UTC\n"}),
            json!({"role": "user", "content": format!("Jess Rivera: {person}")}),
        ];
        messages.extend(said.iter().map(|l| json!({"role": "user", "content": l})));
        messages.extend(after.iter().cloned());
        json!({"messages": messages, "tools": [{"type": "function", "function": {"name": "search_spots"}}]})
    }

    fn text(reply: StubReply) -> String {
        match reply {
            StubReply::Text(t) => t,
            other => panic!("a text answer: {other:?}"),
        }
    }

    const MAX: &str = "You are Max 🚲, an AI companion in TrickBook, a skate/snow/BMX app, chatting with one \
        user in its DMs. Freestyle BMX rider and part-time bike mechanic.\nYou know a lot about: BMX, park \
        riding, skateparks.\nRules:\n- Stay in character.";

    #[test]
    fn in_a_group_a_companion_searches_the_spots_of_its_own_sport() {
        let body = group_request(
            KAORI,
            "Tony (skateboard)",
            "kaori and tony: any parks in portland?",
            &[],
            &[],
        );
        let StubReply::ToolCalls(calls) = demo()(&body) else {
            panic!("spot searches")
        };
        let kinds: Vec<Value> = calls
            .iter()
            .map(|(name, args)| {
                assert_eq!(name, "search_spots");
                let args: Value = serde_json::from_str(args).unwrap();
                assert_eq!(args["query"], "portland");
                args["type"].clone()
            })
            .collect();
        assert_eq!(kinds, [json!("snow"), json!("mountain"), json!("resort")]);
        // In a DM, a search of everything, as before.
        let dm = request(KAORI, "any parks in portland?", &["search_spots"]);
        let (_, args) = call_of(demo()(&dm));
        assert_eq!(args, json!({"query": "portland"}));
    }

    #[test]
    fn in_a_group_a_companion_does_not_repeat_the_spots_named_before_it() {
        let tony = "Tony: [scripted] found these skateboard spots: Burnside Skatepark";
        let spot = |name: &str, city: &str| json!({"name": name, "type": "diy", "city": city});
        let searched = |spots: Vec<Value>| {
            vec![
                json!({"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
                       "function": {"name": "search_spots", "arguments": "{\"query\":\"Portland\",\"type\":\"diy\"}"}}]}),
                json!({"role": "tool", "tool_call_id": "c1", "content": json!({"spots": spots}).to_string()}),
            ]
        };
        let asked = "max and tony: any parks in portland?";
        let only_burnside = searched(vec![spot("Burnside Skatepark", "Portland")]);
        let body = group_request(MAX, "Tony (skateboard)", asked, &[tony], &only_burnside);
        assert_eq!(
            text(demo()(&body)),
            "[scripted] Tony already named the bmx spots i know there 🙌"
        );
        let more = searched(vec![
            spot("Burnside Skatepark", "Portland"),
            spot("Gabriel Park DIY", "Portland"),
        ]);
        let body = group_request(MAX, "Tony (skateboard)", asked, &[tony], &more);
        assert_eq!(
            text(demo()(&body)),
            "[scripted] found these bmx spots: Gabriel Park DIY"
        );
    }

    #[test]
    fn in_a_group_a_companion_speaks_of_its_own_sport_and_does_not_echo_the_one_before() {
        let asked = "kaori and tony: how was your day?";
        let tony = "Tony: [scripted Tony] you said \"kaori and tony: how was your day?\". i remember 0 earlier \
                    messages and can see your skateboard lists: Park Essentials (skateboard, 3/5).";
        let body = group_request(KAORI, "Tony (skateboard)", asked, &[tony], &[]);
        assert_eq!(
            text(demo()(&body)),
            "[scripted Kaori] i remember 1 earlier messages and can see your snowboard lists: Winter Goals \
             (snowboard, 1/4)."
        );
    }

    #[test]
    fn follow_ups_tell_the_user_in_character_not_the_brief() {
        let approved = "[Not a reply: you are following up on your own.] The TrickBook moderators approved \
            the spot \"Hollow Bowl\" that you submitted for the user on November 25. It is live…";
        assert_eq!(
            follow_up_line(approved),
            "yo, your spot \"Hollow Bowl\" got approved!! 🎉 it's live on TrickBook now"
        );
        let due = "[Not a reply: you are following up on your own.] You promised to remind the user of \
            this, for Wednesday 25 November 04:24 UTC: \"wax my board\". That time is now. Write…\nThis \
            also moves on the guided flow \"Learn a trick\" you lead the user through; it stands now: \
            {\"status\":\"active\"}.";
        let line = follow_up_line(due);
        assert!(
            line.starts_with("⏰ hey! you asked me to remind you: wax my board"),
            "{line}"
        );
        assert!(
            line.contains("Learn a trick") && !line.contains("You promised"),
            "{line}"
        );
    }
}
