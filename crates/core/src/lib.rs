//! What every layer of the companion worker shares: the settings (`config`), how a failure is classed
//! (`failure`), the metrics registry (`metrics`), the turn's stage timing (`timing`) and its spans in the
//! OpenTelemetry GenAI vocabulary (`genai`); with feature
//! `testing`, the fault points the integration tests strike (`fault`).

pub mod config;
pub mod failure;
#[cfg(feature = "testing")]
pub mod fault;
pub mod genai;
pub mod metrics;
pub mod timing;
