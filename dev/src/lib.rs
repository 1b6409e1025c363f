//! companion-dev: the tooling around the worker that is not the worker. The scripted OpenAI-compatible
//! model ([`stub`]) of the tests and the offline demo, TB-Backend's side of the contract ([`backend`]),
//! the demo data ([`seed`]), the terminal chat ([`chat`]), the benchmark ([`bench`]) and the embedding
//! graphs' parity on held-out text ([`parity`]), the safety evaluations ([`safety_eval`], and
//! [`frozen_eval`] on the sets nobody tunes on), the environment a worker the bench or a test
//! starts is given ([`child_env`]), and the structural count of a checkout ([`census`]).
//!
//! The production library (`companion`) never imports this crate.

pub mod backend;
pub mod bench;
pub mod census;
pub mod chat;
pub mod child_env;
pub mod frozen_eval;
pub mod jsonl;
pub mod leak_guard;
pub mod memory_rules;
pub mod parity;
pub mod safety_eval;
pub mod safety_train;
pub mod seed;
pub mod stub;
pub mod thresholds;
pub mod vector_head;
