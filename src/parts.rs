//! The handles a worker's parts share: the connections, the loaded data (crisis lines, characters,
//! flows), the model client, the journal, memory, the spend guard and retrieval. [`Parts::connect`]
//! makes them once; each stage then builds itself from them and its configuration section
//! (`Gate::new(&parts, &config)`), so the wiring ([`crate::startup::App::build`]) reads as a list.

use std::sync::Arc;

use tracing::{info, warn};

use crate::{
    bus::{Bus, BusError},
    character::{CharacterError, Characters},
    config::{Config, redact_url},
    flow::Flows,
    journal::Journal,
    llm::{LlmClient, LlmError, Moderator},
    memory::Memory,
    metrics::Metrics,
    rag::{self, Embedder, Retriever},
    safety::Safety,
    spend::{self, SpendGuard},
    store::{Mongo, Pg, StoreError},
};

/// Why a worker's parts could not be built (the worker does not start).
#[derive(Debug, thiserror::Error)]
pub enum PartsError {
    #[error(transparent)]
    Bus(#[from] BusError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Characters(#[from] CharacterError),
    #[error(transparent)]
    Flows(#[from] crate::flow::FlowError),
    #[error(transparent)]
    Llm(#[from] LlmError),
    #[error("crisis lines: {0}")]
    CrisisLines(#[from] crate::safety::LinesError),
}

/// What every stage may be built from; cloning a handle shares it.
pub(crate) struct Parts {
    pub(crate) bus: Bus,
    pub(crate) mongo: Mongo,
    pub(crate) pg: Pg,
    /// The crisis lines, the screen, the age rules and the disclosure's rhythm.
    pub(crate) safety: Arc<Safety>,
    pub(crate) characters: Characters,
    pub(crate) flows: Arc<Flows>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) llm: LlmClient,
    /// The embedding model, when it loaded (without it the worker answers, with less: docs/ops).
    pub(crate) embedder: Option<Arc<Embedder>>,
    /// The moderation endpoint the crisis screen also asks, when one is configured.
    pub(crate) moderator: Option<Moderator>,
    /// Counting its steps into `metrics`.
    pub(crate) journal: Journal,
    pub(crate) memory: Memory,
    pub(crate) spend: Arc<SpendGuard>,
    pub(crate) retriever: Retriever,
}

impl Parts {
    /// Connects to NATS, MongoDB and PostgreSQL and loads the crisis lines, the characters, the flows and
    /// the embedding model. The crisis lines first: a worker that could not refer a user in crisis does
    /// not start.
    pub(crate) async fn connect(c: &Config) -> Result<Self, PartsError> {
        info!(
            nats = %redact_url(&c.nats.url),
            mongo = %redact_url(&c.mongo.uri),
            postgres = %redact_url(&c.pg.url),
            llm = %c.llm.base_url,
            model = %c.llm.model,
            "connecting"
        );
        let mut safety = Safety::load(&c.safety)?;
        let (bus, mongo, pg) = tokio::try_join!(
            async { Bus::connect(&c.nats).await.map_err(PartsError::from) },
            async { Mongo::connect(&c.mongo).await.map_err(PartsError::from) },
            async { Pg::connect(&c.pg).await.map_err(PartsError::from) },
        )?;
        let mut characters = Characters::load(&c.characters.dir)?;
        characters.resolve(&mongo).await?;
        let flows = Arc::new(Flows::load(
            &c.characters.flows_dir,
            &crate::tools::REGISTRY.names(),
        )?);
        flows.check_offers(
            characters
                .iter()
                .map(|(_, c)| (c.id.as_str(), c.flows.as_slice())),
        )?;
        let metrics = Arc::new(Metrics::default());
        safety.review_lines(chrono::Utc::now().date_naive(), &metrics);
        let embedder = rag::load_embedder(&c.embed);
        if let Some(e) = &embedder {
            metrics.register_histogram(&rag::EMBED_BATCH, e.batch_sizes());
            crate::reembed::check(&pg.pool, e.model(), &metrics).await;
        }
        safety.screen = safety
            .screen
            .reading(embedder.as_deref().map(|e| e.model()));
        Ok(Self {
            llm: LlmClient::new(&c.llm, metrics.clone())?,
            moderator: moderator(c),
            journal: Journal::new(pg.pool.clone()).counting(metrics.clone()),
            memory: Memory::new(pg.pool.clone(), embedder.clone(), c.memory.clone()),
            spend: Arc::new(SpendGuard::new(
                pg.pool.clone(),
                spend::SpendLimits::of(&c.spend),
                metrics.clone(),
            )),
            retriever: Retriever::new(pg.pool.clone(), embedder.clone(), &c.rag),
            safety: Arc::new(safety),
            bus,
            mongo,
            pg,
            characters,
            flows,
            metrics,
            embedder,
        })
    }
}

/// The moderation endpoint, when one is configured and usable; else the local layers screen alone.
fn moderator(c: &Config) -> Option<Moderator> {
    let moderator = Moderator::from_config(&c.safety).unwrap_or_else(|e| {
        warn!(error = %e, "the moderation endpoint cannot be used; the local layers screen alone");
        None
    });
    if moderator.is_some() {
        info!(model = %c.safety.moderation_model, "user messages are also screened by the moderation endpoint");
    }
    moderator
}
