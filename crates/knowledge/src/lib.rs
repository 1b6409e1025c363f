//! What a companion knows: its character (`character`: voice, prompt, model settings) and the knowledge
//! base it recalls from (`rag`: chunking, the local embedder, pgvector retrieval).

pub mod character;
pub mod rag;

use companion_core::{config, genai, metrics, timing};
use companion_store::{bus, store};
