//! Wiring, at the top of the layers: builds each component from its own configuration section, hands the
//! turn its narrow dependencies, and runs a worker with its operations endpoint.

use std::{net::SocketAddr, sync::Arc};

use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::{
    bus::{Bus, BusError},
    character::{CharacterError, Characters},
    config::{
        CharactersConfig, Config, EmbedSettings, LlmConfig, MongoConfig, NatsConfig, PgConfig,
        RagConfig, TurnConfig, redact_url,
    },
    flood::FloodLimit,
    journal::Journal,
    llm::{LlmClient, LlmError},
    metrics::Metrics,
    ops::{self, Probe},
    rag::{self, Embedder, Retriever},
    replay::Replayer,
    spend::{self, SpendGuard},
    store::{Mongo, Pg, StoreError},
    turn::Turns,
    worker::{Worker, WorkerError},
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
    Flows(#[from] crate::flow::FlowError),
    #[error(transparent)]
    Llm(#[from] LlmError),
    #[error(transparent)]
    Worker(#[from] WorkerError),
    #[error("crisis lines: {0}")]
    CrisisLines(#[from] crate::safety::lines::LinesError),
}

/// The sections a turn is built from.
#[derive(Clone, Copy)]
pub struct TurnSections<'a> {
    pub nats: &'a NatsConfig,
    pub mongo: &'a MongoConfig,
    pub pg: &'a PgConfig,
    pub llm: &'a LlmConfig,
    pub characters: &'a CharactersConfig,
    pub turn: &'a TurnConfig,
    pub spend: &'a crate::config::SpendConfig,
    pub group: &'a crate::config::GroupConfig,
    pub flow: &'a crate::config::FlowConfig,
    pub follow_ups: &'a crate::config::FollowUpConfig,
    pub safety: &'a crate::config::SafetyConfig,
    pub prompt: &'a crate::config::PromptConfig,
    pub embed: &'a EmbedSettings,
    pub rag: &'a RagConfig,
    pub memory: &'a crate::config::MemoryConfig,
}

impl<'a> From<&'a Config> for TurnSections<'a> {
    fn from(c: &'a Config) -> Self {
        Self {
            nats: &c.nats,
            mongo: &c.mongo,
            pg: &c.pg,
            llm: &c.llm,
            characters: &c.characters,
            turn: &c.turn,
            spend: &c.spend,
            group: &c.group,
            flow: &c.flow,
            follow_ups: &c.follow_ups,
            safety: &c.safety,
            prompt: &c.prompt,
            embed: &c.embed,
            rag: &c.rag,
            memory: &c.memory,
        }
    }
}

/// The connected components.
pub struct Components {
    pub bus: Bus,
    pub mongo: Mongo,
    pub pg: Pg,
    pub embedder: Option<Arc<Embedder>>,
    pub metrics: Arc<Metrics>,
    pub turns: Arc<Turns>,
}

impl Components {
    /// Connects to NATS, MongoDB and PostgreSQL, loads the characters and the embedding model.
    pub async fn connect(s: TurnSections<'_>) -> Result<Self, SetupError> {
        info!(
            nats = %redact_url(&s.nats.url),
            mongo = %redact_url(&s.mongo.uri),
            postgres = %redact_url(&s.pg.url),
            llm = %s.llm.base_url,
            model = %s.llm.model,
            "connecting"
        );
        // The crisis lines first: a worker that could not refer a user in crisis does not start.
        let safety = crate::safety::Safety::load(s.safety)?;
        let (bus, mongo, pg) = tokio::try_join!(
            async { Bus::connect(s.nats).await.map_err(SetupError::from) },
            async { Mongo::connect(s.mongo).await.map_err(SetupError::from) },
            async { Pg::connect(s.pg).await.map_err(SetupError::from) },
        )?;
        let mut characters = Characters::load(&s.characters.dir)?;
        characters.resolve(&mongo).await?;
        let flows = Arc::new(crate::flow::Flows::load(
            &s.characters.flows_dir,
            &crate::tools::REGISTRY.names(),
        )?);
        flows.check_offers(
            characters
                .iter()
                .map(|(_, c)| (c.id.as_str(), c.flows.as_slice())),
        )?;
        let metrics = Arc::new(Metrics::default());
        safety.review_lines(chrono::Utc::now().date_naive(), &metrics);
        let llm = LlmClient::new(s.llm, metrics.clone())?;
        let embedder = rag::load_embedder(s.embed);
        let moderator = crate::llm::moderation::Moderator::from_config(s.safety)
            .unwrap_or_else(|e| {
                warn!(error = %e, "the moderation endpoint cannot be used; the local layers screen alone");
                None
            });
        if moderator.is_some() {
            info!(model = %s.safety.moderation_model, "user messages are also screened by the moderation endpoint");
        }
        let turns = Arc::new(Turns {
            journal: Journal::new(pg.pool.clone()).counting(metrics.clone()),
            pg: pg.clone(),
            mongo: mongo.clone(),
            bus: bus.clone(),
            llm,
            characters,
            tools: Arc::new(crate::tools::Toolbox::new(&crate::tools::ToolStores {
                mongo: mongo.clone(),
                pg: pg.clone(),
                bus: bus.clone(),
                flows: flows.clone(),
                reminders: crate::tools::ReminderBounds {
                    min_lead: std::time::Duration::from_secs(s.turn.reminder_min_lead_secs),
                },
                writes_per_hour: s.turn.writes_per_hour,
            })),
            flows,
            retriever: Retriever::new(pg.pool.clone(), embedder.clone(), s.rag),
            flood: FloodLimit::new(s.turn.user_turns_per_minute),
            spend: SpendGuard::new(
                pg.pool.clone(),
                spend::SpendLimits::of(s.spend),
                metrics.clone(),
            ),
            config: s.turn.clone(),
            group: s.group.clone(),
            flow: s.flow.clone(),
            follow_ups: s.follow_ups.clone(),
            safety,
            moderator,
            prompt: s.prompt.clone(),
            memory: crate::memory::Memory::new(pg.pool.clone(), embedder.clone(), s.memory.clone()),
            memory_model: [&s.memory.model, &s.spend.budget_model, &s.llm.model]
                .into_iter()
                .map(|m| m.trim())
                .find(|m| !m.is_empty())
                .unwrap_or_default()
                .to_owned(),
            metrics: metrics.clone(),
        });
        Ok(Self {
            bus,
            mongo,
            pg,
            embedder,
            metrics,
            turns,
        })
    }

    /// A worker over these components.
    pub fn worker(&self, config: &Config) -> Worker {
        Worker {
            bus: self.bus.clone(),
            turns: self.turns.clone(),
            metrics: self.metrics.clone(),
            config: config.worker.clone(),
            consumer: config.consumer.clone(),
        }
    }

    /// What the operations endpoint looks at.
    pub fn probe(&self, consumer: &str) -> Probe {
        Probe::new(
            self.bus.clone(),
            self.mongo.clone(),
            self.pg.clone(),
            self.embedder.clone(),
            self.metrics.clone(),
            consumer.to_owned(),
        )
    }

    /// What `companion replay` runs on.
    pub(crate) fn replayer(&self) -> Replayer {
        Replayer {
            bus: self.bus.clone(),
            turns: self.turns.clone(),
        }
    }
}

/// `companion worker`: connects, serves the operations endpoint when configured, and runs until
/// `shutdown` fires.
pub async fn run_worker(config: Config, shutdown: CancellationToken) -> Result<(), SetupError> {
    let components = Components::connect((&config).into()).await?;
    let ops = serve_ops(&config.worker.http_addr, &components, &config).await;
    let result = components.worker(&config).serve(shutdown).await;
    if let Some(task) = ops {
        task.abort();
    }
    Ok(result?)
}

/// Serves the operations endpoint when configured; a failure to bind is logged, not fatal.
async fn serve_ops(
    addr: &str,
    components: &Components,
    config: &Config,
) -> Option<tokio::task::JoinHandle<()>> {
    let addr = addr.trim();
    if addr.is_empty() {
        return None;
    }
    let parsed: SocketAddr = match addr.parse() {
        Ok(a) => a,
        Err(e) => {
            error!(addr, error = %e, "COMPANION_HTTP_ADDR is not an address; no health endpoint");
            return None;
        }
    };
    let probe = Arc::new(components.probe(&config.consumer.name));
    match ops::serve(parsed, probe).await {
        Ok((bound, task)) => {
            info!(addr = %bound, "health and metrics endpoint listening");
            Some(task)
        }
        Err(e) => {
            error!(addr, error = %e, "cannot serve the health endpoint; continuing without it");
            None
        }
    }
}
