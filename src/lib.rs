//! companion: the worker that gives TrickBook's AI companions their brain.
//!
//! A bot-bound DM arrives on NATS JetStream (`bus`); the one conversation pipeline (`pipeline`) loads
//! history (`store::pg`) and the user's data (`store::mongo`), asks the chat model (`llm`) in the
//! voice of a `character`, writes the reply into `dm_messages` and publishes the completion. A group
//! message (who answers: `group`) and a follow-up (what to say: `proactive`) take the same path.
//! Every side effect of a job is a step of its `journal`; the `worker` runs jobs and `settle`s
//! each delivery.
//!
//! The layers below the pipeline are crates of their own (`crates/`, docs/development.md, Layers), so
//! the compiler refuses an import that goes sideways or up; this crate holds the pipeline, the worker and
//! the operations around them, and names the lower layers' modules as its own (`crate::journal`).
//!
//! The public API is small (as in mini-redis): the settings ([`config`]), the worker ([`run_worker`]), the
//! telemetry the binary starts ([`init_telemetry`], [`run_main`]) and the operations commands
//! ([`commands`]). Everything else is private to the crate; the integration tests and the dev tooling
//! (`companion-dev`) reach what they need through `testing` (feature `testing`), never the production
//! binary.

// What is `pub` is reachable from the API or from `testing`; anything else is `pub(crate)` at most.
#![cfg_attr(feature = "testing", warn(unreachable_pub))]

mod crisis_report;
mod explain;
mod group;
#[cfg(test)]
mod import_cycles;
#[cfg(test)]
mod layout;
mod ops_http;
mod outage;
mod parts;
mod pipeline;
mod proactive;
mod reembed;
mod replay;
mod settle;
mod startup;
mod takeover;
mod telemetry;
mod usage;
mod worker;

pub mod commands;
#[cfg(feature = "testing")]
pub mod testing;

pub use companion_core::config::{self, Config};

// The lower layers (`crates/`), under the names the modules here use.
use companion_core::{failure, genai, metrics, timing};
use companion_flows as flow;
use companion_journal as journal;
use companion_knowledge::{character, rag};
use companion_limits::{calls, flood, spend};
use companion_llm as llm;
use companion_memory as memory;
use companion_safety as safety;
use companion_store::{bus, conversation_order, store};
use companion_tools::tools;
pub use startup::run_worker;
pub use telemetry::{Telemetry, init as init_telemetry, run_main};
