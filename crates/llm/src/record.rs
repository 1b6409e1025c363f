//! The record of one answer of the model (the journal's `llm` step): the message, what the call used and
//! cost ([`CallUsage`]), and what was offered. The journal stores it as it is; the spend guard
//! (`companion_limits::spend`) and `companion usage` read its `usage` back with SQL, and `companion
//! explain` decodes it.

use serde::{Deserialize, Serialize};

use crate::{AssistantMessage, CallUsage, ChatRequest, ChatResponse, LlmClient, LlmError};

/// The `llm` step: one answer of the model and what that call used.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LlmRecord {
    pub message: AssistantMessage,
    pub usage: Option<CallUsage>,
    /// The companion the call spoke as, when its job has several (a group message); else the job's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bot: Option<String>,
    /// Whether the call offered tools (a request without them must end in text, and a tool call in its
    /// answer is not run).
    #[serde(default = "offered", rename = "tools")]
    pub offered_tools: bool,
    /// The tools offered, by name (none: recorded before they were kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offered: Option<Vec<String>>,
    /// Why the model stopped, as the provider said (`stop`, `tool_calls`, `length`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finish: Option<String>,
    /// How long the call took, retries and fallbacks included, in milliseconds (set by the caller
    /// that timed it; none: not timed, or recorded before it was kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ms: Option<u64>,
}

fn offered() -> bool {
    true
}

impl LlmRecord {
    /// The record of `response` to `request`: the first choice's message and the call's usage (priced
    /// for the model that answered, with the cacheable prefix), spoken as `bot`. A request without tools
    /// must end in text: an empty answer to one is an error, so the call is made again.
    pub fn answer(
        llm: &LlmClient,
        request: &ChatRequest,
        response: ChatResponse,
        bot: Option<String>,
    ) -> Result<Self, LlmError> {
        let offered_tools = !request.tools.is_empty();
        let model = response
            .model
            .clone()
            .unwrap_or_else(|| request.model.clone());
        let mut usage = llm
            .prices
            .call_usage(&model, &response.usage.clone().unwrap_or_default());
        usage.prefix_tokens = Some(request.prefix_tokens());
        if response.provider.as_deref() == Some(crate::SCRIPTED_PROVIDER) {
            usage.scripted = true;
            usage.cost_usd = None;
            usage.cost_source = crate::prices::CostSource::Unpriced;
        }
        let (message, finish) = response
            .choices
            .into_iter()
            .next()
            .map(|c| (c.message, c.finish_reason))
            .ok_or(LlmError::NoChoice)?;
        if !offered_tools
            && message
                .content
                .as_deref()
                .is_none_or(|c| c.trim().is_empty())
        {
            return Err(LlmError::EmptyAnswer);
        }
        Ok(Self {
            message,
            usage: Some(usage),
            bot,
            offered_tools,
            offered: Some(
                request
                    .tools
                    .iter()
                    .map(|t| t.function.name.clone())
                    .collect(),
            ),
            finish,
            ms: None,
        })
    }
}
