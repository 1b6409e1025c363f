//! The integration tests: one binary, every test against the real local servers (NATS with
//! JetStream, PostgreSQL with pgvector, the MongoDB-wire server); only the chat model is scripted.
//! `env` is the one harness (`TestEnv`); `deploy/local/test.sh` starts the servers.

mod env;
mod servers;

mod alerts;
mod bench;
mod chat;
mod crash_loop;
mod demo_model;
mod durable_turns;
mod embed_bench;
mod embed_parity;
mod explain;
mod fanout;
mod flood;
mod flows;
mod groups;
mod hostile_events;
mod journal;
mod journal_migration;
mod limits;
mod llm_failures;
mod memory;
mod misconfigured;
mod nats_users;
mod ops;
mod order;
#[cfg(feature = "otel")]
mod otel;
mod outages;
mod panics;
mod pg_pool;
#[cfg(feature = "otel")]
mod phoenix;
mod proactive;
mod prompt_budget;
mod provision;
mod quota_processes;
mod rag_kb;
mod rag_turn;
mod regressions;
mod reminders;
mod replay;
mod safety;
mod shutdown;
mod spend;
mod takeover;
mod tb_backend_bridge;
mod tls;
mod tool_loop;
mod tools;
mod turn;
mod turn_timings;
mod usage;
