//! companion: the worker that gives TrickBook's AI companions their brain.
//!
//! A bot-bound DM arrives on NATS JetStream ([`bus`]); a [`turn`] loads history ([`store::pg`]) and the
//! user's data ([`store::mongo`]), asks the chat model ([`llm`]) in the voice of a [`character`], writes the
//! reply into `dm_messages` and publishes the completion.

pub mod bus;
pub mod character;
pub mod config;
pub mod flood;
pub mod llm;
pub mod ops;
pub mod order;
pub mod rag;
pub mod replay;
pub mod services;
pub mod store;
pub mod telemetry;
pub mod timing;
pub mod tools;
pub mod turn;
pub mod usage;
pub mod worker;

pub use config::Config;
pub use services::Services;
