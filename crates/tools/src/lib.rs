//! What a companion does for a user: the tools the model calls (`tools`), one file each, with their
//! schemas, the write quota and the call records. What the tools act on lives in the crates below:
//! memory (`companion-memory`), the guided flows (`companion-flows`), the limits (`companion-limits`).

pub mod tools;

use companion_core::{failure, timing};
use companion_flows as flow;
use companion_journal as journal;
use companion_knowledge::rag;
use companion_limits::flood;
use companion_llm as llm;
use companion_memory as memory;
use companion_safety as safety;
use companion_store::{bus, store};

/// The journal steps this crate records, each told as `companion explain` tells it; with the worker's
/// own and those of the crates below, the list a test holds to the names old journals hold.
pub const STEPS: &[&dyn journal::Tell] = &[
    &tools::TOOL,
    &tools::QUOTA,
    &tools::REMEMBER,
    &tools::REMEMBER_QUOTA,
    &tools::FORGET,
];
