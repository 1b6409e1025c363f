//! Long-term memory: what a companion keeps about its user beyond the history window, with the user in
//! control (docs/memory.md).
//!
//! - **Facts** ([`Fact`]): short statements about the user (level, stance, home spot, goals, injuries,
//!   gear, likes, fears), each with its source messages, the companion that learned it, when, and its
//!   embedding. Learned off the reply path by the extraction job ([`extract`]) or at once when the user
//!   asks (`remember`); a fact about the same thing replaces the older one ([`store`]).
//! - **Recall** ([`recall`]): the pinned facts and those nearest the message, and the rolling summary of
//!   the conversation before the window, within their token caps.
//! - **Privacy by construction**: a fact is keyed by (user, companion) and only ever read for that
//!   user's DM with that companion; nothing is learned from a group chat or from a message the crisis
//!   screen flags.
//! - **Deletion that sticks** ([`erase`]): deleting a message, clearing memory, erasing a user, each with
//!   a tombstone checked at admission, at extraction and in `replay`.

mod erase;
mod extract;
mod recall;
mod show;
mod signals;
mod store;
mod topic;

use std::sync::Arc;

// The crate's API, curated: the modules are private.
pub use erase::{MEMORY_CLEARED, MESSAGE_DELETED, MemoryCheck, PROBE_GUARD, USER_ERASED};
pub use extract::{EXTRACT_MARKER, SUMMARY_MARKER, fact_id, flagged};
pub use recall::Recall;
pub use show::report;
pub use signals::MemorySignals;
pub use store::{Fact, How, Kept, NewFact, reembed, stale_facts};
pub use topic::{Topic, one_topic_each};

use companion_core::{config, failure};
use companion_journal as journal;
use companion_knowledge::{character, rag};
use companion_limits::{calls, spend};
use companion_llm as llm;
use companion_safety as safety;
use companion_store::{bus, store as db};

use crate::db::Pool;
use crate::{
    config::MemoryConfig,
    db::StoreError,
    failure::{Class, Classify},
    journal::JournalError,
    llm::LlmError,
    rag::{EmbedError, Embedder, Embedding, Encoder, Role, Scores},
};

/// Longest fact, in characters.
pub const FACT_MAX: usize = 300;

/// The signal kind that runs a user's extraction with one companion: `<prefix>.signal.memory.<user>.<bot>`.
pub const KIND: &str = "memory";

#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    /// The signal names nothing memory can act on: dead-lettered.
    #[error("invalid memory signal: {0}")]
    Invalid(String),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Journal(#[from] JournalError),
    #[error(transparent)]
    Llm(#[from] LlmError),
    #[error("embedding: {0}")]
    Embed(#[from] EmbedError),
    #[error(transparent)]
    Bus(#[from] crate::bus::BusError),
    /// The service's spend budget is used up: extraction waits (the signal is tried again later).
    #[error("the service's spend budget is used up; memory extraction waits")]
    Budget,
    /// The user was erased while this ran: nothing of theirs is written.
    #[error("the user is erased")]
    Erased,
}

/// The journal steps this crate records, each told as `companion explain` tells it.
pub const STEPS: &[&dyn journal::Tell] = &[
    &extract::MEMORY_BATCH,
    &extract::MEMORY_FACTS,
    &extract::MEMORY_SUMMARY,
    &erase::ERASE,
    &erase::ERASE_STREAMS,
    &erase::REBUILD,
];

impl From<sqlx::Error> for MemoryError {
    fn from(e: sqlx::Error) -> Self {
        Self::Store(StoreError::Pg(e))
    }
}

impl Classify for MemoryError {
    fn class(&self) -> Class {
        match self {
            Self::Invalid(_) => Class::Reject,
            Self::Store(e) => e.class(),
            Self::Journal(e) => e.class(),
            Self::Llm(e) => e.class(),
            // The model runs in this process: a failure is a bug or a missing file, not a passing fault.
            Self::Embed(_) => Class::Transient,
            Self::Bus(e) => e.class(),
            Self::Budget => Class::Transient,
            Self::Erased => Class::Reject,
        }
    }
}

/// Memory's store and settings, shared by the turns, the tools and the extraction job.
#[derive(Clone)]
pub struct Memory {
    pub(crate) pool: Pool,
    /// Embeds facts (and `forget`'s words); `None` when the model is not installed: facts are kept and
    /// pinned ones recalled, without similarity.
    pub(crate) embedder: Option<Arc<Embedder>>,
    pub config: MemoryConfig,
}

impl Memory {
    pub fn new(pool: Pool, embedder: Option<Arc<Embedder>>, config: MemoryConfig) -> Self {
        Self {
            pool,
            embedder,
            config,
        }
    }

    /// The embedding of `text` read as `role` (a fact is a passage, the words that name one a query), or
    /// `None` without a model.
    pub async fn embed(&self, role: Role, text: &str) -> Result<Option<Embedding>, MemoryError> {
        match &self.embedder {
            Some(e) => Ok(Some(Embedding {
                vector: e.embed_one(role, text).await?,
                model: e.model(),
            })),
            None => Ok(None),
        }
    }

    /// The model whose vectors recall compares (none: no model installed).
    pub(crate) fn model(&self) -> Option<&'static str> {
        self.embedder.as_ref().map(|e| e.model())
    }

    /// What its encoder's similarities mean (MiniLM's without a model: nothing is compared then).
    pub fn scores(&self) -> Scores {
        Encoder::of(self.embedder.as_deref()).scores
    }

    /// The lowest similarity of a recalled fact: the configured one, else the encoder's.
    pub(crate) fn recall_threshold(&self) -> f32 {
        self.config.threshold.unwrap_or(self.scores().recall)
    }
}

/// Where a tool call stands with memory: a DM keeps it; a group chat never does.
#[derive(Clone, Copy)]
pub enum Access<'a> {
    Dm(&'a Memory),
    /// A group chat with other people: nothing is remembered from it.
    Group,
    /// Memory is turned off (`COMPANION_MEMORY=false`).
    Off,
}
