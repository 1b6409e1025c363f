//! Wiring, at the top of the layers: [`App::build`] builds each part from its own configuration section,
//! hands the pipeline its narrow dependencies, and runs a worker with its operations endpoint.

use std::{net::SocketAddr, sync::Arc};

use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::{
    bus::{Bus, BusError},
    character::{CharacterError, Characters},
    config::{Config, ConsumerConfig, WorkerConfig, redact_url},
    flood::FloodLimit,
    journal::Journal,
    llm::{LlmClient, LlmError},
    memory::signals::MemorySignals,
    metrics::Metrics,
    ops_http::{self, Probe},
    outage::Outages,
    pipeline::{
        Pipeline,
        burst::TakeIn,
        compose::{ComposeSettings, Composer, Talk},
        deliver::Delivery,
        end::Endings,
        gate::Gate,
        incoming::Incoming,
        input::Admission,
        outgoing::{Clean, Outgoing},
        tool_loop::LoopLimits,
    },
    rag::{self, Embedder, Retriever},
    replay::Replayer,
    spend::{self, SpendGuard},
    store::{Mongo, Pg, StoreError},
    takeover::Takeovers,
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

/// A worker's connected parts, built from the whole configuration by [`App::build`]: the one way a worker
/// is wired, by `companion worker`, `companion replay`, the integration tests and (through the binary) the
/// bench.
pub struct App {
    pub bus: Bus,
    pub mongo: Mongo,
    pub pg: Pg,
    pub embedder: Option<Arc<Embedder>>,
    pub metrics: Arc<Metrics>,
    pub pipeline: Arc<Pipeline>,
    takeovers: Arc<Takeovers>,
    /// Memory's extraction and deletion signals.
    pub memory_signals: Arc<MemorySignals>,
    /// The worker's own parts.
    own: Own,
}

/// What only the worker loop and its operations endpoint use.
struct Own {
    /// Its bounds and where its operations endpoint listens.
    worker: WorkerConfig,
    /// Its durable consumer.
    consumer: ConsumerConfig,
    /// The outage being waited out, shared by the loop and the endpoint.
    outages: Arc<Outages>,
}

impl App {
    /// Connects to NATS, MongoDB and PostgreSQL, loads the crisis lines, the characters, the flows and
    /// the embedding model, and builds the conversation pipeline.
    pub async fn build(c: &Config) -> Result<Self, SetupError> {
        info!(
            nats = %redact_url(&c.nats.url),
            mongo = %redact_url(&c.mongo.uri),
            postgres = %redact_url(&c.pg.url),
            llm = %c.llm.base_url,
            model = %c.llm.model,
            "connecting"
        );
        // The crisis lines first: a worker that could not refer a user in crisis does not start.
        let mut safety = crate::safety::Safety::load(&c.safety)?;
        let (bus, mongo, pg) = tokio::try_join!(
            async { Bus::connect(&c.nats).await.map_err(SetupError::from) },
            async { Mongo::connect(&c.mongo).await.map_err(SetupError::from) },
            async { Pg::connect(&c.pg).await.map_err(SetupError::from) },
        )?;
        let mut characters = Characters::load(&c.characters.dir)?;
        characters.resolve(&mongo).await?;
        let flows = Arc::new(crate::flow::Flows::load(
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
        let llm = LlmClient::new(&c.llm, metrics.clone())?;
        let embedder = rag::load_embedder(&c.embed);
        if let Some(e) = &embedder {
            metrics.register_histogram(&rag::EMBED_BATCH, e.batch_sizes());
        }
        let moderator = crate::llm::moderation::Moderator::from_config(&c.safety)
            .unwrap_or_else(|e| {
                warn!(error = %e, "the moderation endpoint cannot be used; the local layers screen alone");
                None
            });
        if moderator.is_some() {
            info!(model = %c.safety.moderation_model, "user messages are also screened by the moderation endpoint");
        }
        let journal = Journal::new(pg.pool.clone()).counting(metrics.clone());
        let memory =
            crate::memory::Memory::new(pg.pool.clone(), embedder.clone(), c.memory.clone());
        let spend = Arc::new(SpendGuard::new(
            pg.pool.clone(),
            spend::SpendLimits::of(&c.spend),
            metrics.clone(),
        ));
        let memory_signals = Arc::new(MemorySignals {
            memory: memory.clone(),
            journal: journal.clone(),
            llm: llm.clone(),
            bus: bus.clone(),
            characters: characters.clone(),
            // The cheaper model when one is set.
            model: [&c.memory.model, &c.spend.budget_model, &c.llm.model]
                .into_iter()
                .map(|m| m.trim())
                .find(|m| !m.is_empty())
                .unwrap_or_default()
                .to_owned(),
            history_limit: c.turn.history_limit,
            spend: spend.clone(),
        });
        safety.screen = safety
            .screen
            .reading(embedder.as_deref().map(|e| e.model()));
        let safety = Arc::new(safety);
        if let Some(e) = &embedder {
            crate::reembed::check(&pg.pool, e.model(), &metrics).await;
        }
        let retriever = Retriever::new(pg.pool.clone(), embedder.clone(), &c.rag);
        let limits = crate::bus::event::EventLimits::of(&c.turn);
        let clean = Clean {
            max_chars: c.turn.max_reply_chars,
        };
        let tools = Arc::new(crate::tools::Toolbox::new(&crate::tools::ToolStores {
            mongo: mongo.clone(),
            pg: pg.clone(),
            bus: bus.clone(),
            flows: flows.clone(),
            reminders: crate::tools::ReminderBounds {
                min_lead: std::time::Duration::from_secs(c.turn.reminder_min_lead_secs),
            },
            writes_per_hour: c.turn.writes_per_hour,
        }));
        let pipeline = Arc::new(Pipeline {
            journal: journal.clone(),
            admission: Admission {
                characters: characters.clone(),
                mongo: mongo.clone(),
                pg: pg.clone(),
                names: bus.names.clone(),
                safety: safety.clone(),
                limits,
                memory: memory.clone(),
            },
            incoming: Incoming {
                retriever: retriever.clone(),
                moderator: moderator.clone(),
                safety: safety.clone(),
                pg: pg.clone(),
                bus: bus.clone(),
                metrics: metrics.clone(),
            },
            gate: Gate {
                pg: pg.clone(),
                journal: journal.clone(),
                flood: FloodLimit::new(c.turn.user_turns_per_minute),
                retriever: retriever.clone(),
                group: c.group.clone(),
                safety: safety.clone(),
                follow_ups: c.follow_ups.clone(),
                history_limit: c.turn.history_limit,
            },
            take_in: TakeIn {
                pg: pg.clone(),
                names: bus.names.clone(),
                limits,
                burst_max: c.turn.burst_max,
                flows: flows.clone(),
            },
            composer: Composer {
                pg: pg.clone(),
                mongo: mongo.clone(),
                retriever: retriever.clone(),
                memory: memory.clone(),
                flows: flows.clone(),
                bus: bus.clone(),
                talk: Talk {
                    llm: llm.clone(),
                    tools,
                    spend: spend.clone(),
                    limits: LoopLimits {
                        max_rounds: c.turn.max_tool_rounds,
                        max_result_bytes: c.turn.max_tool_result_bytes,
                    },
                    max_calls: c.turn.max_llm_calls_per_turn,
                    model: c.llm.model.clone(),
                    max_tokens: c.llm.max_tokens,
                    temperature: c.llm.temperature,
                },
                settings: ComposeSettings {
                    history_limit: c.turn.history_limit,
                    prompt: c.prompt.clone(),
                    flow_idle_days: c.flow.idle_days,
                    under_13_line: c.safety.under_13_line.clone(),
                    minor_quiet: (c.safety.minor_quiet_start, c.safety.minor_quiet_end),
                    clean,
                    screen: safety.screen,
                    disclosure_lookback: c.safety.ai_disclosure.then(|| {
                        let rhythm = safety.rhythm();
                        rhythm.every + rhythm.every + rhythm.gap
                    }),
                },
                metrics: metrics.clone(),
            },
            outgoing: Outgoing {
                clean,
                retriever: retriever.clone(),
                safety: safety.clone(),
                pg: pg.clone(),
                journal: journal.clone(),
                metrics: metrics.clone(),
            },
            delivery: Delivery {
                mongo: mongo.clone(),
                pg: pg.clone(),
                bus: bus.clone(),
            },
            end: Endings {
                memory: memory.clone(),
                bus: bus.clone(),
                metrics: metrics.clone(),
                clean,
            },
            timeout_secs: c.turn.turn_timeout_secs,
        });
        let takeovers = Arc::new(Takeovers {
            journal,
            pg: pg.clone(),
            mongo: mongo.clone(),
            bus: bus.clone(),
            max_event_bytes: c.turn.max_event_bytes,
            pipeline: pipeline.clone(),
        });
        let outages = Arc::new(Outages::new(
            pg.clone(),
            mongo.clone(),
            bus.clone(),
            metrics.clone(),
            c.worker.outage_max(),
        ));
        Ok(Self {
            bus,
            mongo,
            pg,
            embedder,
            metrics,
            pipeline,
            takeovers,
            memory_signals,
            own: Own {
                worker: c.worker.clone(),
                consumer: c.consumer.clone(),
                outages,
            },
        })
    }

    /// A worker over these parts.
    pub fn worker(&self) -> Worker {
        Worker {
            bus: self.bus.clone(),
            mongo: self.mongo.clone(),
            pg: self.pg.clone(),
            pipeline: self.pipeline.clone(),
            takeovers: self.takeovers.clone(),
            memory_signals: self.memory_signals.clone(),
            metrics: self.metrics.clone(),
            outages: self.own.outages.clone(),
            config: self.own.worker.clone(),
            consumer: self.own.consumer.clone(),
        }
    }

    /// What the operations endpoint looks at.
    pub fn probe(&self) -> Probe {
        Probe::new(
            self.bus.clone(),
            self.mongo.clone(),
            self.pg.clone(),
            self.embedder.clone(),
            self.metrics.clone(),
            self.own.outages.clone(),
            self.own.consumer.name.clone(),
        )
    }

    /// What `companion replay` runs on.
    pub(crate) fn replayer(&self) -> Replayer {
        Replayer {
            bus: self.bus.clone(),
            memory: self.memory_signals.memory.clone(),
            pipeline: self.pipeline.clone(),
        }
    }

    /// Serves the operations endpoint when configured and runs the worker until `shutdown` fires.
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), SetupError> {
        let ops = serve_ops(&self.own.worker.http_addr, &self).await;
        let result = self.worker().serve(shutdown).await;
        if let Some(task) = ops {
            task.abort();
        }
        Ok(result?)
    }
}

/// `companion worker`: builds the app and runs it until `shutdown` fires.
pub async fn run_worker(config: Config, shutdown: CancellationToken) -> Result<(), SetupError> {
    App::build(&config).await?.run(shutdown).await
}

/// Serves the operations endpoint when configured; a failure to bind is logged, not fatal.
async fn serve_ops(addr: &str, app: &App) -> Option<tokio::task::JoinHandle<()>> {
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
    let probe = Arc::new(app.probe());
    match ops_http::serve(parsed, probe).await {
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
