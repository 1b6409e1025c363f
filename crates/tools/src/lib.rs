//! What a companion does for a user and what it keeps: the tools the model calls (`tools`), the
//! multi-step flows (`flow`), the user's memory (`memory`), and the limits on spend (`spend`) and on
//! floods of messages (`flood`).

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
