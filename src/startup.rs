//! Wiring, at the top of the layers: [`App::build`] builds each part from its own configuration section,
//! hands the pipeline its narrow dependencies, and runs a worker with its operations endpoint.

use std::{net::SocketAddr, sync::Arc};

use tokio_util::sync::CancellationToken;

use crate::parts::{Parts, PartsError};
use tracing::{error, info};

use crate::{
    bus::Bus,
    config::{Config, ConsumerConfig, WorkerConfig},
    memory::MemorySignals,
    metrics::Metrics,
    ops_http::{self, Probe},
    outage::Outages,
    pipeline::Pipeline,
    rag::Embedder,
    replay::Replayer,
    store::{Mongo, Pg},
    takeover::Takeovers,
    worker::{Worker, WorkerError},
};

/// Why a worker could not be built or run.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error(transparent)]
    Parts(#[from] PartsError),
    #[error(transparent)]
    Worker(#[from] WorkerError),
}

/// Memory's extraction and deletion signals' handler. Extraction uses the cheaper model when one is set.
fn memory_signals(p: &Parts, c: &Config) -> MemorySignals {
    MemorySignals {
        memory: p.memory.clone(),
        journal: p.journal.clone(),
        llm: p.llm.clone(),
        bus: p.bus.clone(),
        characters: p.characters.clone(),
        model: [&c.memory.model, &c.spend.budget_model, &c.llm.model]
            .into_iter()
            .map(|m| m.trim())
            .find(|m| !m.is_empty())
            .unwrap_or_default()
            .to_owned(),
        history_limit: c.turn.history_limit,
        spend: p.spend.clone(),
    }
}

/// A worker's connected parts, built from the whole configuration by [`App::build`]: the one way a worker
/// is wired, by `companion worker`, `companion replay`, the integration tests and (through the binary) the
/// bench. Its handles are cheap to clone (connections and `Arc`s): a test keeps a clone to call the parts
/// directly while the app runs.
#[derive(Clone)]
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
#[derive(Clone)]
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
    /// the embedding model ([`Parts::connect`]), and builds the conversation pipeline and the signals'
    /// handlers, each part from the shared handles and its own configuration section.
    pub async fn build(c: &Config) -> Result<Self, SetupError> {
        let parts = Parts::connect(c).await?;
        let pipeline = Arc::new(Pipeline::new(&parts, c));
        let takeovers = Arc::new(Takeovers::new(&parts, c, pipeline.clone()));
        let memory_signals = Arc::new(memory_signals(&parts, c));
        let outages = Arc::new(Outages::new(
            parts.pg.clone(),
            parts.mongo.clone(),
            parts.bus.clone(),
            parts.metrics.clone(),
            c.worker.outage_max(),
        ));
        Ok(Self {
            bus: parts.bus,
            mongo: parts.mongo,
            pg: parts.pg,
            embedder: parts.embedder,
            metrics: parts.metrics,
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

    /// Binds the operations endpoint when configured: after this, the address it listens on is known
    /// (a configured port 0 becomes the port the system chose), and the app is ready to run.
    pub async fn bind(self) -> Bound {
        let ops = serve_ops(&self.own.worker.http_addr, &self).await;
        Bound { app: self, ops }
    }

    /// Serves the operations endpoint when configured and runs the worker until `shutdown` fires.
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), SetupError> {
        self.bind().await.run(shutdown).await
    }
}

/// An app whose operations endpoint is listening (when one is configured), not yet running its worker.
pub struct Bound {
    /// The parts being run.
    pub app: App,
    /// The operations endpoint's address and its server.
    ops: Option<(SocketAddr, tokio::task::JoinHandle<()>)>,
}

impl Bound {
    /// Where the operations endpoint listens, if it does (a test asks for port 0).
    #[cfg(feature = "testing")]
    pub fn ops_addr(&self) -> Option<SocketAddr> {
        self.ops.as_ref().map(|(addr, _)| *addr)
    }

    /// Runs the worker until `shutdown` fires, then stops the operations endpoint.
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), SetupError> {
        Ok(self.app.worker().serve(shutdown).await?)
    }
}

impl Drop for Bound {
    /// The endpoint serves only while its app is bound or running.
    fn drop(&mut self) {
        if let Some((_, task)) = self.ops.take() {
            task.abort();
        }
    }
}

/// `companion worker`: builds the app and runs it until `shutdown` fires.
pub async fn run_worker(config: Config, shutdown: CancellationToken) -> Result<(), SetupError> {
    App::build(&config).await?.run(shutdown).await
}

/// Serves the operations endpoint when configured; a failure to bind is logged, not fatal.
async fn serve_ops(addr: &str, app: &App) -> Option<(SocketAddr, tokio::task::JoinHandle<()>)> {
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
            Some((bound, task))
        }
        Err(e) => {
            error!(addr, error = %e, "cannot serve the health endpoint; continuing without it");
            None
        }
    }
}
