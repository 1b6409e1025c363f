//! The optional moderation endpoint: an OpenAI-compatible `POST /moderations` (e.g. omni-moderation,
//! multilingual), asked about each user message beside the local layers of the crisis screen. What it
//! answers is its own categories; the crisis decision maps them (`safety::CrisisScreen::moderation`).

use std::{collections::BTreeMap, time::Duration};

use serde::Deserialize;
use serde_json::json;

use crate::config::{ExposeSecret, SafetyConfig, Secret};

/// Why the endpoint gave no answer; admission decides on the local layers then.
#[derive(Debug, thiserror::Error)]
pub enum ModerationError {
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[error("request failed: {0}")]
    Http(String),
    #[error("status {0}")]
    Status(u16),
    #[error("unreadable answer: {0}")]
    Body(String),
}

impl ModerationError {
    /// The metric label of the outcome.
    pub fn outcome(&self) -> &'static str {
        match self {
            ModerationError::Timeout(_) => "timeout",
            _ => "error",
        }
    }
}

/// What the endpoint said of one text: each category flagged or not, and its score.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct Verdict {
    pub categories: BTreeMap<String, bool>,
    #[serde(default)]
    pub(crate) category_scores: BTreeMap<String, f64>,
}

/// The client: one HTTP client, bounded by the timeout.
#[derive(Clone, Debug)]
pub struct Moderator {
    http: reqwest::Client,
    url: String,
    key: Secret,
    model: String,
    timeout: Duration,
}

impl Moderator {
    /// None when no endpoint is configured.
    pub fn from_config(c: &SafetyConfig) -> Result<Option<Self>, ModerationError> {
        let base = c.moderation_url.trim().trim_end_matches('/');
        if base.is_empty() {
            return Ok(None);
        }
        let timeout = Duration::from_millis(c.moderation_timeout_ms.max(1));
        Self::new(
            base,
            c.moderation_api_key.clone(),
            c.moderation_model.clone(),
            timeout,
        )
        .map(Some)
    }

    /// A client of the endpoint at `base` (`/moderations` appended unless there).
    pub fn new(
        base: &str,
        key: Secret,
        model: String,
        timeout: Duration,
    ) -> Result<Self, ModerationError> {
        let base = base.trim().trim_end_matches('/');
        // reqwest is built without a default crypto provider; ring is the one compiled in (the chat
        // client installs it too, but this client may be the first).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout)
            .user_agent(concat!("companion/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| ModerationError::Http(e.to_string()))?;
        let url = match base.ends_with("/moderations") {
            true => base.to_owned(),
            false => format!("{base}/moderations"),
        };
        Ok(Self {
            http,
            url,
            key,
            model,
            timeout,
        })
    }

    /// The endpoint's verdict on `text`, within the timeout.
    pub async fn moderate(&self, text: &str) -> Result<Verdict, ModerationError> {
        let mut request = self
            .http
            .post(&self.url)
            .json(&json!({ "model": self.model, "input": text }));
        if !self.key.expose_secret().is_empty() {
            request = request.bearer_auth(self.key.expose_secret());
        }
        let call = async {
            let response = request
                .send()
                .await
                .map_err(|e| ModerationError::Http(e.without_url().to_string()))?;
            let status = response.status();
            if !status.is_success() {
                return Err(ModerationError::Status(status.as_u16()));
            }
            #[derive(Deserialize)]
            struct Answer {
                results: Vec<Verdict>,
            }
            let answer: Answer = response
                .json()
                .await
                .map_err(|e| ModerationError::Body(e.without_url().to_string()))?;
            answer
                .results
                .into_iter()
                .next()
                .ok_or_else(|| ModerationError::Body("no result".into()))
        };
        match tokio::time::timeout(self.timeout, call).await {
            Ok(r) => r.map_err(|e| match e {
                ModerationError::Http(m) if m.contains("timed out") => {
                    ModerationError::Timeout(self.timeout)
                }
                e => e,
            }),
            Err(_) => Err(ModerationError::Timeout(self.timeout)),
        }
    }
}
