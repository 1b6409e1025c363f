//! The limits on what the companions may cost and how fast they answer: the spend budgets checked
//! before each paid call (`spend`), read from the steps of the model's calls (`calls`), and the flood
//! limit across workers (`flood`).

pub mod calls;
pub mod flood;
pub mod spend;

use companion_core::{config, metrics};
use companion_journal as journal;
use companion_llm as llm;
use companion_store::store;

/// The journal steps this crate records, each told as `companion explain` tells it.
pub const STEPS: &[&dyn journal::Tell] = &[
    &calls::LLM,
    &calls::MODEL_FAILED,
    &flood::TURN,
    &flood::BUSY,
];
