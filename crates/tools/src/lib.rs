//! What a companion does for a user and what it keeps: the tools the model calls (`tools`), the
//! multi-step flows (`flow`), the user's memory (`memory`), and the limits on spend (`spend`) and on
//! floods of messages (`flood`).

pub mod calls;
pub mod flood;
pub mod flow;
pub mod memory;
pub mod spend;
pub mod tools;

use companion_core::{config, failure, metrics, timing};
use companion_journal as journal;
use companion_knowledge::{character, rag};
use companion_llm as llm;
use companion_safety as safety;
use companion_store::{bus, store};

/// The journal steps this crate records, each told as `companion explain` tells it; with the worker's
/// own, the list a test holds to the names old journals hold.
pub const STEPS: &[&dyn journal::Tell] = &[
    &calls::LLM,
    &calls::MODEL_FAILED,
    &tools::TOOL,
    &tools::QUOTA,
    &tools::REMEMBER,
    &tools::REMEMBER_QUOTA,
    &tools::FORGET,
    &flood::TURN,
    &flood::BUSY,
    &flow::state::FLOW_CHANGE,
    &memory::extract::MEMORY_BATCH,
    &memory::extract::MEMORY_FACTS,
    &memory::extract::MEMORY_SUMMARY,
    &memory::erase::ERASE,
    &memory::erase::ERASE_STREAMS,
    &memory::erase::REBUILD,
];
