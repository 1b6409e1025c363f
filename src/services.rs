//! The connected services a turn uses, built once per process.

use std::sync::Arc;

use crate::{
    bus::{Bus, BusError},
    character::{CharacterError, Characters},
    config::{Config, redact_url},
    llm::{LlmClient, LlmError},
    store::{Mongo, Pg, StoreError},
};

#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error(transparent)]
    Bus(#[from] BusError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Characters(#[from] CharacterError),
    #[error(transparent)]
    Llm(#[from] LlmError),
}

pub struct Services {
    pub config: Config,
    pub bus: Bus,
    pub mongo: Mongo,
    pub pg: Pg,
    pub llm: LlmClient,
    pub characters: Characters,
    /// Sentence embedder for knowledge retrieval; `None` when the model is not installed.
    pub embedder: Option<Arc<crate::rag::Embedder>>,
    /// Counters for `/metrics`.
    pub metrics: Arc<crate::ops::Metrics>,
    /// The per-user inbound flood limit.
    pub flood: crate::flood::FloodLimit,
}

impl Services {
    /// Connects to NATS, MongoDB and PostgreSQL and loads the characters.
    pub async fn connect(config: Config) -> Result<Arc<Self>, SetupError> {
        tracing::info!(
            nats = %redact_url(&config.nats_url),
            mongo = %redact_url(&config.atlas_uri),
            postgres = %redact_url(&config.postgres_url),
            llm = %config.llm_base_url,
            model = %config.openrouter_model,
            "connecting"
        );
        let (bus, mongo, pg) = tokio::try_join!(
            async { Bus::connect(&config).await.map_err(SetupError::from) },
            async { Mongo::connect(&config).await.map_err(SetupError::from) },
            async { Pg::connect(&config).await.map_err(SetupError::from) },
        )?;
        let mut characters = Characters::load(&config.characters_dir)?;
        characters.resolve(&mongo).await?;
        let metrics = Arc::new(crate::ops::Metrics::default());
        let llm = LlmClient::new(&config)?.with_metrics(metrics.clone());
        let embedder = crate::rag::load_embedder(&config);
        Ok(Arc::new(Self {
            flood: crate::flood::FloodLimit::new(config.user_turns_per_minute),
            metrics,
            config,
            bus,
            mongo,
            pg,
            llm,
            characters,
            embedder,
        }))
    }
}
