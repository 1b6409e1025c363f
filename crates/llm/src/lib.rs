//! The OpenAI-compatible chat API (OpenRouter by default): request and response types, the client, and
//! what a call costs ([`prices`]).
//!
//! A 200 can still be a failure: OpenRouter reports an upstream provider dropping mid-generation as an
//! `error` object in the body or as a choice with `finish_reason: "error"`; both are transient errors
//! here, like an answer with neither text nor tool calls, so no caller ever takes one for an answer.

mod moderation;
mod prices;
pub(crate) mod record;
mod trace;

use companion_core::{config, failure, genai, metrics};

use std::{
    borrow::Cow,
    num::NonZeroU32,
    sync::Arc,
    time::{Duration, Instant},
};

use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use reqwest::{StatusCode, header};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;
use tracing::Instrument as _;

use crate::{
    config::{ExposeSecret, LlmConfig, Secret},
    failure::{Class, Classify},
    metrics::{Metric, Metrics},
};
pub use moderation::{ModerationError, Moderator, Verdict};
pub use prices::{CallUsage, CostSource, PriceError, Prices};
pub use record::LlmRecord;

/// One chat message, as the API takes it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "lowercase")]
pub enum Message {
    System {
        content: String,
    },
    User {
        content: UserContent,
    },
    Assistant {
        #[serde(default)]
        content: Option<String>,
        #[serde(
            default,
            skip_serializing_if = "Vec::is_empty",
            deserialize_with = "null_as_empty"
        )]
        tool_calls: Vec<ToolCall>,
    },
    Tool {
        tool_call_id: String,
        content: String,
    },
}

impl Message {
    pub fn system(content: impl Into<String>) -> Self {
        Self::System {
            content: content.into(),
        }
    }
    pub fn user(content: impl Into<String>) -> Self {
        Self::User {
            content: UserContent::Text(content.into()),
        }
    }
    pub fn assistant(content: impl Into<String>) -> Self {
        Self::Assistant {
            content: Some(content.into()),
            tool_calls: Vec::new(),
        }
    }
}

/// Plain text, or text and images.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum UserContent {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentPart {
    Text { text: String },
    ImageUrl { image_url: ImageUrl },
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ImageUrl {
    pub url: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    pub id: String,
    #[serde(rename = "type", default = "function_kind")]
    pub kind: String,
    pub function: FunctionCall,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FunctionCall {
    pub name: String,
    /// JSON text as the model wrote it (some servers send an object; it is re-encoded as text).
    #[serde(default, deserialize_with = "arguments_as_text")]
    pub arguments: String,
}

/// A tool offered to the model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolDef {
    #[serde(rename = "type")]
    pub kind: String,
    pub function: FunctionDef,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FunctionDef {
    pub name: String,
    pub description: String,
    /// Shared: the same schema goes with every offer that holds the tool.
    pub parameters: Arc<Value>,
}

#[derive(Clone, Debug, Serialize)]
pub struct ChatRequest {
    pub model: String,
    pub messages: Vec<Message>,
    /// Shared with the registry: the same definitions go out with every request.
    #[serde(skip_serializing_if = "no_tools")]
    pub tools: Arc<[ToolDef]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f32>,
}

impl ChatRequest {
    /// Estimated tokens (a quarter of the bytes) of what a provider can cache across users and turns:
    /// the tool definitions and the first system message.
    pub(crate) fn prefix_tokens(&self) -> u64 {
        let tools = serde_json::to_string(&*self.tools).map_or(0, |t| t.len());
        let system = match self.messages.first() {
            Some(Message::System { content }) => content.len(),
            _ => 0,
        };
        (tools + system).div_ceil(4) as u64
    }
}

fn no_tools(tools: &Arc<[ToolDef]>) -> bool {
    tools.is_empty()
}

/// What one turn may still spend on the chat API, whatever its tool loop, retries and fallback models
/// do: requests (each one sent is paid for or may be) and estimated prompt tokens.
#[derive(Debug)]
pub struct CallBudget {
    calls: std::sync::atomic::AtomicU32,
    prompt_tokens: std::sync::atomic::AtomicU64,
}

impl CallBudget {
    pub fn new(calls: u32, prompt_tokens: u64) -> Self {
        Self {
            calls: calls.into(),
            prompt_tokens: prompt_tokens.into(),
        }
    }

    pub fn calls_left(&self) -> u32 {
        self.calls.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Takes one request of `tokens` estimated prompt tokens, or says which ceiling it would pass.
    fn take(&self, tokens: u64) -> Result<(), LlmError> {
        use std::sync::atomic::Ordering::SeqCst;
        self.calls
            .fetch_update(SeqCst, SeqCst, |c| c.checked_sub(1))
            .map_err(|_| LlmError::OverBudget {
                what: "requests to the chat API",
            })?;
        self.prompt_tokens
            .fetch_update(SeqCst, SeqCst, |t| t.checked_sub(tokens))
            .map_err(|_| LlmError::OverBudget {
                what: "prompt tokens",
            })?;
        Ok(())
    }
}

/// The `provider` the project's scripted offline model (`companion-dev stub-llm`, the demo's) names in
/// its answers: not a model anyone pays for.
pub const SCRIPTED_PROVIDER: &str = "companion-scripted";

#[derive(Clone, Debug, Deserialize)]
pub struct ChatResponse {
    /// The server's id of the answer.
    #[serde(default)]
    pub id: Option<String>,
    #[serde(default)]
    pub model: Option<String>,
    /// Who served the answer, as OpenRouter names it; [`SCRIPTED_PROVIDER`] for the scripted model.
    #[serde(default)]
    pub provider: Option<String>,
    pub choices: Vec<Choice>,
    #[serde(default)]
    pub usage: Option<Usage>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct Choice {
    #[serde(default)]
    pub message: AssistantMessage,
    #[serde(default)]
    pub finish_reason: Option<String>,
    /// OpenRouter's error of a choice that ended in `finish_reason: "error"`.
    #[serde(default)]
    pub(crate) error: Option<Value>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
pub struct AssistantMessage {
    #[serde(default)]
    pub content: Option<String>,
    #[serde(default, deserialize_with = "null_as_empty")]
    pub tool_calls: Vec<ToolCall>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
pub struct Usage {
    #[serde(default)]
    pub(crate) prompt_tokens: u64,
    #[serde(default)]
    pub(crate) completion_tokens: u64,
    #[serde(default)]
    pub(crate) total_tokens: u64,
    /// OpenRouter reports the charge in credits (USD) when asked.
    #[serde(default)]
    pub(crate) cost: Option<f64>,
    /// How much of the prompt the provider served from its prompt cache (billed at a fraction).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) prompt_tokens_details: Option<PromptTokensDetails>,
}

/// `usage.prompt_tokens_details` of an OpenAI-compatible answer.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
pub(crate) struct PromptTokensDetails {
    #[serde(default)]
    pub(crate) cached_tokens: u64,
}

fn function_kind() -> String {
    "function".into()
}

fn null_as_empty<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Vec<T>, D::Error> {
    Ok(Option::<Vec<T>>::deserialize(d)?.unwrap_or_default())
}

fn arguments_as_text<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    Ok(match Value::deserialize(d)? {
        Value::String(s) => s,
        Value::Null => String::new(),
        other => other.to_string(),
    })
}

#[derive(Debug, thiserror::Error)]
pub enum LlmError {
    #[error("chat API timed out")]
    Timeout,
    #[error("cannot reach the chat API: {0}")]
    Connect(String),
    #[error("chat API rate limited the request")]
    RateLimited { retry_after: Option<Duration> },
    #[error("chat API server error {status}")]
    Server {
        status: u16,
        retry_after: Option<Duration>,
    },
    #[error("model `{model}` has no endpoint that supports tool use")]
    NoToolSupport { model: String },
    #[error("chat API rejected the request ({status}): {body}")]
    Rejected { status: u16, body: String },
    #[error("the chat request cannot be encoded: {0}")]
    Encode(String),
    #[error("chat API answered something that is not a chat completion: {0}")]
    Decode(String),
    #[error("chat API answered with no choices")]
    NoChoice,
    #[error("the model's answer failed upstream: {0}")]
    Upstream(String),
    #[error("the model answered with neither text nor tool calls")]
    EmptyAnswer,
    #[error("{0}")]
    Prices(#[from] PriceError),
    #[error("chat API response is larger than {max} bytes")]
    TooLarge { max: usize },
    #[error(
        "the turn reached its ceiling of {what} (COMPANION_MAX_LLM_CALLS_PER_TURN, COMPANION_MAX_PROMPT_TOKENS_PER_TURN)"
    )]
    OverBudget { what: &'static str },
}

/// One request to the chat API that failed: for the record of a turn (the model, the error, its class
/// and how long it took), never the request's text.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FailedCall {
    /// The model asked.
    pub model: String,
    /// The error, in words.
    pub error: String,
    /// Its class: `transient` (tried again) or `permanent`.
    pub class: String,
    /// How long the request took, in milliseconds.
    pub ms: u64,
}

impl FailedCall {
    /// The record of `e`, an answer to a request for `model` that took `took`.
    pub fn of(model: &str, e: &LlmError, took: Duration) -> Self {
        Self {
            model: model.to_owned(),
            error: e.to_string(),
            class: match e.is_transient() {
                true => "transient",
                false => "permanent",
            }
            .into(),
            ms: took.as_millis() as u64,
        }
    }
}

impl LlmError {
    /// The error as the requests counter's `status` label: the HTTP status, or what went wrong.
    fn status(&self) -> String {
        match self {
            LlmError::Timeout => "timeout".to_owned(),
            LlmError::Connect(_) => "unreachable".to_owned(),
            LlmError::RateLimited { .. } => "429".to_owned(),
            LlmError::Server { status, .. } | LlmError::Rejected { status, .. } => {
                status.to_string()
            }
            LlmError::NoToolSupport { .. } => "no_tool_support".to_owned(),
            LlmError::Encode(_) => "not_sent".to_owned(),
            LlmError::Decode(_) | LlmError::NoChoice | LlmError::Prices(_) => {
                "bad_response".to_owned()
            }
            LlmError::Upstream(_) => "upstream_error".to_owned(),
            LlmError::EmptyAnswer => "empty".to_owned(),
            LlmError::TooLarge { .. } => "too_large".to_owned(),
            LlmError::OverBudget { .. } => "over_budget".to_owned(),
        }
    }

    /// Worth trying again later (same request).
    pub(crate) fn is_transient(&self) -> bool {
        matches!(
            self,
            Self::Timeout
                | Self::Connect(_)
                | Self::RateLimited { .. }
                | Self::Server { .. }
                | Self::NoChoice
                | Self::Upstream(_)
                | Self::EmptyAnswer
        )
    }

    /// Another model may succeed where this one cannot (no tool support, unknown model, outage).
    fn try_another_model(&self) -> bool {
        matches!(
            self,
            Self::NoToolSupport { .. } | Self::Rejected { status: 404, .. }
        ) || self.is_transient()
    }
}

impl Classify for LlmError {
    /// Transient as [`LlmError::is_transient`] says; any other refusal (4xx, an answer that is not a
    /// completion, an oversized one) will be the same next time, and the user is told.
    fn class(&self) -> Class {
        if self.is_transient() {
            Class::Transient
        } else {
            Class::Permanent
        }
    }

    /// How long the server asked us to wait, if it did.
    fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::RateLimited { retry_after } | Self::Server { retry_after, .. } => *retry_after,
            _ => None,
        }
    }
}

/// A request's JSON body.
fn encode(request: &ChatRequest) -> Result<String, LlmError> {
    serde_json::to_string(request).map_err(|e| LlmError::Encode(e.to_string()))
}

/// Counter of 402 answers (no credits left), for the `CompanionOutOfCredits` alert.
/// Chat requests sent, by model and status.
const REQUESTS: Metric = Metric::new(
    "companion_llm_requests_total",
    "Chat requests sent, by model and status (ok, 429, 5xx, timeout, unreachable, ...)",
);
/// What the answered requests cost, by the model asked.
const COST_USD: Metric = Metric::new(
    "companion_llm_cost_usd_total",
    "What the answered chat requests cost in USD, by the model asked",
);
/// Answers the price table has no price for.
const UNPRICED: Metric = Metric::new(
    "companion_llm_unpriced_responses_total",
    "Chat answers whose model the price table has no price for, by the model asked",
);
/// Tokens of the answered requests.
const TOKENS: Metric = Metric::new(
    "companion_llm_tokens_total",
    "Tokens of the answered chat requests, by model and kind (prompt, completion)",
);
/// Requests sent again after a transient failure.
const RETRIES: Metric = Metric::new(
    "companion_llm_retries_total",
    "Chat requests sent again after a transient failure, by model",
);
const OUT_OF_CREDITS: Metric = Metric::new(
    "companion_llm_out_of_credits_total",
    "Counter of 402 answers (no credits left), for the `CompanionOutOfCredits` alert",
);

/// How a chat request is retried within a turn.
#[derive(Clone, Debug)]
pub(crate) struct RetryPolicy {
    pub(crate) max_retries: u32,
    pub(crate) base: Duration,
    /// Longest wait; a longer `Retry-After` ends the attempt so the turn goes back to the stream.
    pub(crate) max_wait: Duration,
}

impl RetryPolicy {
    /// Exponential backoff with ±20 % jitter, or the server's `Retry-After`.
    fn wait(&self, retry: u32, err: &LlmError) -> Option<Duration> {
        let wait = err.retry_after().unwrap_or_else(|| {
            failure::jittered(failure::backoff(self.base, retry, Duration::MAX))
        });
        (wait <= self.max_wait).then_some(wait)
    }
}

/// A client for one OpenAI-compatible base URL.
#[derive(Clone)]
pub struct LlmClient {
    http: reqwest::Client,
    url: String,
    /// `gen_ai.provider.name` of the chat spans and histograms.
    provider: &'static str,
    key: Secret,
    /// Tried in order after the request's own model.
    pub(crate) fallback_models: Vec<String>,
    pub(crate) retry: RetryPolicy,
    /// Process-wide cap on outbound requests.
    limiter: Arc<DefaultDirectRateLimiter>,
    /// Requests and tokens by model, for `/metrics`.
    metrics: Arc<Metrics>,
    /// Prices a response whose server reported no cost.
    pub prices: Prices,
    /// Largest response body read; a larger one is a bad response.
    pub(crate) max_response_bytes: usize,
}

impl LlmClient {
    pub fn new(config: &LlmConfig, metrics: Arc<Metrics>) -> Result<Self, LlmError> {
        // reqwest is built without a default crypto provider; ring is the one compiled in.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder()
            .timeout(config.timeout())
            .connect_timeout(Duration::from_secs(10))
            .pool_max_idle_per_host(64)
            .user_agent(concat!("companion/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| LlmError::Connect(e.to_string()))?;
        // Alerts look at increases: the counter exists (at 0) before the first 402.
        metrics.add(&OUT_OF_CREDITS, &[], 0);
        Ok(Self {
            http,
            url: format!("{}/chat/completions", config.base_url.trim_end_matches('/')),
            provider: trace::provider(&config.base_url),
            key: config.api_key.clone(),
            fallback_models: config
                .fallback_models
                .iter()
                .map(|m| m.trim().to_owned())
                .filter(|m| !m.is_empty())
                .collect(),
            retry: RetryPolicy {
                max_retries: config.max_retries,
                base: Duration::from_millis(config.retry_base_ms.max(1)),
                max_wait: Duration::from_secs(config.retry_max_secs),
            },
            limiter: Arc::new(RateLimiter::direct(Quota::per_second(
                NonZeroU32::new(config.requests_per_second.max(1))
                    .expect("at least one per second"),
            ))),
            metrics,
            prices: config.prices.parse()?,
            max_response_bytes: config.max_response_bytes.max(1024),
        })
    }

    /// Counts requests, outcomes, tokens and cost into the metrics, and records the answer (or the
    /// error) on the request's span.
    fn count(
        &self,
        model: &str,
        result: &Result<ChatResponse, LlmError>,
        span: &tracing::Span,
        took: Duration,
    ) {
        let m = &self.metrics;
        let status = match result {
            Ok(_) => "ok".to_owned(),
            Err(e) => e.status(),
        };
        m.inc(&REQUESTS, &[("model", model), ("status", &status)]);
        let answered = result
            .as_ref()
            .ok()
            .map(|r| r.model.as_deref().unwrap_or(model));
        let op = genai::Operation {
            name: "chat",
            provider: self.provider,
            request_model: model,
            response_model: answered,
            error: result.is_err().then_some(status.as_str()),
        };
        let tokens = result
            .as_ref()
            .ok()
            .and_then(|r| r.usage.as_ref())
            .map(|u| (u.prompt_tokens, u.completion_tokens));
        op.observe(m, took.as_secs_f64(), tokens);
        if result.is_err() {
            genai::failed(span, &status);
        }
        match result {
            Err(LlmError::Rejected { status: 402, body }) => {
                m.inc(&OUT_OF_CREDITS, &[]);
                tracing::error!(
                    model = %model, %body,
                    "the chat API has no credits left (402): every turn fails until credits are added"
                )
            }
            Err(LlmError::Rejected { status: 403, body }) => tracing::warn!(
                model = %model, reason = %body,
                "the chat API refused the request (403: moderation or guardrail); the user gets the failure line, not the reason"
            ),
            _ => {}
        }
        if let Ok(r) = result {
            self.count_answer(model, r, span);
        }
    }

    /// What an answer cost and used, into the metrics and onto its span.
    fn count_answer(&self, model: &str, r: &ChatResponse, span: &tracing::Span) {
        let m = &self.metrics;
        let usage = r.usage.clone().unwrap_or_default();
        let answered = r.model.as_deref().unwrap_or(model);
        let cost = self.prices.cost(answered, &usage);
        trace::answered(span, r, cost.usd);
        match cost.usd {
            Some(usd) => m.add_f64(&COST_USD, &[("model", model)], usd),
            None => m.inc(&UNPRICED, &[("model", model)]),
        }
        if let Some(u) = &r.usage {
            m.add(
                &TOKENS,
                &[("model", model), ("kind", "prompt")],
                u.prompt_tokens,
            );
            let completion = u.completion_tokens;
            m.add(
                &TOKENS,
                &[("model", model), ("kind", "completion")],
                completion,
            );
        }
    }

    /// The request with retries (timeouts, 429, 5xx; honouring `Retry-After`) and then each fallback model.
    pub async fn complete(&self, request: &ChatRequest) -> Result<ChatResponse, LlmError> {
        self.complete_within(request, None).await
    }

    /// [`LlmClient::complete`], every request sent (retries and fallbacks included) taken from `budget`
    /// with its prompt tokens estimated as a quarter of the request's JSON bytes.
    pub(crate) async fn complete_within(
        &self,
        request: &ChatRequest,
        budget: Option<&CallBudget>,
    ) -> Result<ChatResponse, LlmError> {
        self.complete_noting(request, budget, &mut Vec::new()).await
    }

    /// [`LlmClient::complete_within`], each request that failed (retried, fallen back from, or the last)
    /// pushed onto `failed`.
    pub async fn complete_noting(
        &self,
        request: &ChatRequest,
        budget: Option<&CallBudget>,
        failed: &mut Vec<FailedCall>,
    ) -> Result<ChatResponse, LlmError> {
        let mut models = vec![request.model.clone()];
        models.extend(
            self.fallback_models
                .iter()
                .filter(|m| **m != request.model)
                .cloned(),
        );
        let mut last = None;
        for (i, model) in models.iter().enumerate() {
            // Only a fallback model needs its own copy; hundreds of turns may be waiting on the first.
            let req = if *model == request.model {
                Cow::Borrowed(request)
            } else {
                let mut r = request.clone();
                r.model = model.clone();
                Cow::Owned(r)
            };
            let mut retry = 0;
            let err = loop {
                // Encoded for each attempt and handed over: nothing keeps a copy while the model thinks.
                let body = encode(&req)?;
                if let Some(b) = budget {
                    b.take((body.len() as u64).div_ceil(4))?;
                }
                self.limiter.until_ready().await;
                let span = trace::chat_span(self.provider, model, &req);
                let started = Instant::now();
                let result = self.send(model, body).instrument(span.clone()).await;
                self.count(model, &result, &span, started.elapsed());
                if let Err(e) = &result {
                    failed.push(FailedCall::of(model, e, started.elapsed()));
                }
                match result {
                    Ok(mut r) => {
                        // Usage is recorded under the model that answered; a server that does not say is
                        // taken to be the one asked.
                        r.model.get_or_insert_with(|| model.clone());
                        return Ok(r);
                    }
                    Err(e) if e.is_transient() && retry < self.retry.max_retries => {
                        match self.retry.wait(retry, &e) {
                            Some(wait) => {
                                self.metrics.inc(&RETRIES, &[("model", model)]);
                                tracing::warn!(model = %model, error = %e, retry_in_ms = wait.as_millis() as u64, "chat request failed; retrying");
                                tokio::time::sleep(wait).await;
                                retry += 1;
                            }
                            None => break e,
                        }
                    }
                    Err(e) => break e,
                }
            };
            let more = i + 1 < models.len();
            if more && err.try_another_model() {
                tracing::warn!(model = %model, error = %err, next = %models[i + 1], "falling back to the next model");
                last = Some(err);
                continue;
            }
            return Err(err);
        }
        Err(last.unwrap_or(LlmError::NoChoice))
    }

    /// One encoded request for `model`, no retries. The body goes as a one-shot stream (its length
    /// known, so no chunked encoding): reqwest keeps a copy of a reusable body for redirects and its own
    /// retries until the answer comes, and hundreds of requests may be waiting on a slow model.
    async fn send(&self, model: &str, body: String) -> Result<ChatResponse, LlmError> {
        let mut builder = self
            .http
            .post(&self.url)
            .header("HTTP-Referer", "https://trickbook.app")
            .header("X-Title", "TrickBook companions")
            .header(header::CONTENT_TYPE, "application/json")
            .body(reqwest::Body::wrap(body));
        if !self.key.expose_secret().is_empty() {
            builder = builder.bearer_auth(self.key.expose_secret());
        }
        let response = builder.send().await.map_err(|e| {
            if e.is_timeout() {
                LlmError::Timeout
            } else {
                LlmError::Connect(without_url(&e))
            }
        })?;
        let status = response.status();
        let retry_after = retry_after(response.headers());
        // Retryable statuses are decided before the body is read: an oversized error page stays retryable.
        if status == StatusCode::TOO_MANY_REQUESTS {
            return Err(LlmError::RateLimited { retry_after });
        }
        if status.is_server_error() || status == StatusCode::REQUEST_TIMEOUT {
            return Err(LlmError::Server {
                status: status.as_u16(),
                retry_after,
            });
        }
        let body = read_bounded(response, self.max_response_bytes).await?;
        let text = String::from_utf8_lossy(&body);
        if !status.is_success() {
            if status == StatusCode::NOT_FOUND && text.contains("support tool use") {
                return Err(LlmError::NoToolSupport {
                    model: model.to_owned(),
                });
            }
            return Err(LlmError::Rejected {
                status: status.as_u16(),
                body: text.chars().take(300).collect(),
            });
        }
        decode(&body, retry_after)
    }
}

/// A successful (200) answer's body as a response, or the error it holds: an error object (OpenRouter
/// answers so on an upstream failure), no choice, a choice that failed, or an empty answer.
fn decode(body: &[u8], retry_after: Option<Duration>) -> Result<ChatResponse, LlmError> {
    // OpenRouter can answer 200 with an error object (e.g. an upstream failure mid-stream).
    if let Ok(v) = serde_json::from_slice::<Value>(body)
        && let Some(err) = v.get("error")
    {
        let code = err.get("code").and_then(Value::as_u64).unwrap_or(500) as u16;
        return Err(if code == 429 {
            LlmError::RateLimited { retry_after }
        } else if code >= 500 {
            LlmError::Server {
                status: code,
                retry_after,
            }
        } else {
            LlmError::Rejected {
                status: code,
                body: err.to_string().chars().take(300).collect(),
            }
        });
    }
    let parsed: ChatResponse =
        serde_json::from_slice(body).map_err(|e| LlmError::Decode(e.to_string()))?;
    let Some(choice) = parsed.choices.first() else {
        return Err(LlmError::NoChoice);
    };
    if choice.finish_reason.as_deref() == Some("error") || choice.error.is_some() {
        let why = choice
            .error
            .as_ref()
            .map(|e| {
                e.get("message")
                    .and_then(Value::as_str)
                    .map(str::to_owned)
                    .unwrap_or_else(|| e.to_string())
            })
            .unwrap_or_else(|| "finish_reason \"error\"".into());
        return Err(LlmError::Upstream(why.chars().take(300).collect()));
    }
    let m = &choice.message;
    if m.tool_calls.is_empty() && m.content.as_deref().is_none_or(|c| c.trim().is_empty()) {
        return Err(LlmError::EmptyAnswer);
    }
    Ok(parsed)
}

/// The response body, refused past `max` bytes so a broken or hostile server cannot exhaust memory.
async fn read_bounded(mut response: reqwest::Response, max: usize) -> Result<Vec<u8>, LlmError> {
    let transport = |e: reqwest::Error| {
        if e.is_timeout() {
            LlmError::Timeout
        } else {
            LlmError::Connect(without_url(&e))
        }
    };
    if response.content_length().is_some_and(|n| n > max as u64) {
        return Err(LlmError::TooLarge { max });
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(transport)? {
        if body.len() + chunk.len() > max {
            return Err(LlmError::TooLarge { max });
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// reqwest errors print the URL; keep only the cause.
fn without_url(e: &reqwest::Error) -> String {
    let mut s = e.to_string();
    if let Some(url) = e.url() {
        s = s.replace(url.as_str(), "<chat api>");
    }
    s
}

fn retry_after(headers: &header::HeaderMap) -> Option<Duration> {
    let v = headers.get(header::RETRY_AFTER)?.to_str().ok()?.trim();
    v.parse::<f64>()
        .ok()
        .filter(|s| s.is_finite() && *s >= 0.0)
        .map(|s| Duration::from_secs_f64(s.min(3600.0)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_serialize_as_the_api_wants() {
        let m = Message::Assistant {
            content: None,
            tool_calls: vec![ToolCall {
                id: "c1".into(),
                kind: "function".into(),
                function: FunctionCall {
                    name: "search_spots".into(),
                    arguments: "{}".into(),
                },
            }],
        };
        let v = serde_json::to_value(&m).unwrap();
        assert_eq!(v["role"], "assistant");
        assert_eq!(v["tool_calls"][0]["function"]["name"], "search_spots");
        let u = Message::User {
            content: UserContent::Parts(vec![
                ContentPart::Text {
                    text: "look".into(),
                },
                ContentPart::ImageUrl {
                    image_url: ImageUrl {
                        url: "https://x/y.jpg".into(),
                    },
                },
            ]),
        };
        let v = serde_json::to_value(&u).unwrap();
        assert_eq!(v["content"][1]["type"], "image_url");
        assert_eq!(v["content"][1]["image_url"]["url"], "https://x/y.jpg");
    }

    #[test]
    fn responses_parse_leniently() {
        let r: ChatResponse = serde_json::from_value(serde_json::json!({
            "choices": [{"message": {"role": "assistant", "content": null, "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "x", "arguments": {"q": 1}}},
                {"id": "b", "function": {"name": "y", "arguments": ""}}
            ]}, "finish_reason": "tool_calls"}]
        }))
        .unwrap();
        let calls = &r.choices[0].message.tool_calls;
        assert_eq!(calls[0].function.arguments, "{\"q\":1}");
        assert_eq!(calls[1].function.arguments, "");
        let r: ChatResponse = serde_json::from_value(serde_json::json!({
            "choices": [{"message": {"content": "hi", "tool_calls": null}}]
        }))
        .unwrap();
        assert!(r.choices[0].message.tool_calls.is_empty());
    }
}
