//! The crate's internals that the integration tests (`tests/it`) and the dev tooling (`companion-dev`)
//! reach, by the paths they have in the crate (`companion::testing::journal::State` is
//! `crate::journal::State`). Feature `testing`, which `companion-dev` turns on; the production binary is
//! built without it, so none of this is its API.

pub use crate::config::{self, Config};

pub mod startup {
    pub use crate::startup::App;
}
pub mod bus {
    pub use crate::bus::event::{Completion, DmEvent, GroupMessageEvent, InboundEvent};
    pub use crate::bus::{Bus, BusError, DLQ_REASON, signal_consumer_name};
    pub mod event {
        pub use crate::bus::event::{
            Attachment, EventLimits, InvalidEvent, parse_inbound, parse_object_id,
        };
    }
}
pub mod character {
    pub use crate::character::{CharacterError, Characters};
}
pub mod failure {
    pub use crate::failure::{Class, Classify};
}
pub mod fault {
    pub use crate::fault::{Pause, panic_at, pause_at};
}
pub mod flow {
    pub use crate::flow::Flows;
}
pub mod journal {
    pub use crate::journal::{Job, JobRecord, Journal, JournalError, NewJob, State};
}
pub mod llm {
    pub use crate::llm::CallBudget;
    pub use crate::llm::prices::CallUsage;
}
pub mod memory {
    pub use crate::memory::signals::MemorySignals;
    pub use crate::memory::store::{How, NewFact};
    pub use crate::memory::topic::Topic;
    pub use crate::memory::{Access, Memory};
    pub mod extract {
        pub use crate::memory::extract::{EXTRACT_MARKER, SUMMARY_MARKER};
    }
}
pub mod metrics {
    pub use crate::metrics::Metrics;
}
pub mod ops_http {
    pub use crate::ops_http::serve;
}
pub mod rag {
    pub use crate::rag::{EmbedConfig, EmbedError, Embedder, load_embedder, retrieve};
    pub mod chunk {
        pub use crate::rag::chunk::{ChunkConfig, chunk, count_tokens, untruncated};
    }
    pub mod embed {
        pub use crate::rag::embed::{DIM, MAX_TOKENS, cosine, load_tokenizer, normalize};
    }
    pub mod ingest {
        pub use crate::rag::ingest::{
            Article, IngestTotals, Ingested, chunk_article, ingest, ingest_article, read_articles,
        };
    }
    pub mod kb {
        pub use crate::rag::kb::{ArticleMeta, counts, replace_article, search};
    }
    pub mod query {
        pub use crate::rag::query::{needs_no_knowledge, normalize};
    }
}
pub mod safety {
    pub mod detect {
        pub use crate::safety::detect::{
            Decision, Layer, category, check_reply, check_reply_with, decide, decide_with,
        };
    }
    pub mod learned {
        pub use crate::safety::learned::{
            BUCKETS, DIM, Features, Header, INPUT, Model, OUTPUT, features, softmax,
        };
    }
    pub mod screen {
        pub use crate::safety::screen::{Blocked, check_output, screen};
    }
}
pub mod store {
    pub use crate::store::{Mongo, Pg, StoreError};
    pub mod mongo {
        pub use crate::store::mongo::{
            DM_CONVERSATIONS, DM_MESSAGES, SPOT_DRAFTS, SPOTS, TRICKLISTS, TRICKS, USERS, user_ref,
            user_ref_filter,
        };
    }
    pub mod pg {
        pub use crate::store::pg::MIGRATOR;
    }
    pub mod reminders {
        pub use crate::store::reminders::{Reminder, ReminderState};
    }
}
pub mod telemetry {
    #[cfg(feature = "otel")]
    pub mod otel {
        pub use crate::telemetry::otel::{ExportedSpan, decode_export};
    }
}
pub mod timing {
    pub use crate::timing::{Stage, scope, snapshot, stage};
}
pub mod tools {
    pub use crate::tools::{
        Call, Clock, ReminderBounds, ToolContext, ToolError, ToolRecord, ToolResult, ToolStores,
        Toolbox, call_key,
    };
}
pub mod takeover {
    pub use crate::takeover::{Action, job_id};
}
pub mod pipeline {
    pub use crate::pipeline::{Burst, FloodDecision, Outcome, PipelineError, Reply};
    pub mod tool_loop {
        pub use crate::pipeline::tool_loop::{LlmRecord, LoopOutput};
        use crate::{
            config::LlmConfig,
            llm::{CallBudget, ChatRequest, LlmClient, Message},
            metrics::Metrics,
            pipeline::{
                PipelineError,
                tool_loop::{LoopContext, LoopLimits, converse},
            },
            tools::{REGISTRY, ToolContext, Toolbox, offer::Offer},
        };

        /// What the tool-loop tests drive: the loop for `system` then `user` to `model` (100 tokens at
        /// most, temperature 0), every tool offered, no spend check, at most 3 tool rounds of 16 KB
        /// results each.
        pub async fn converse_with_every_tool(
            llm: &LlmConfig,
            toolbox: &Toolbox,
            tools: ToolContext<'_>,
            budget: &CallBudget,
            model: &str,
            system: &str,
            user: &str,
        ) -> Result<LoopOutput, PipelineError> {
            let metrics = std::sync::Arc::new(Metrics::default());
            let llm = LlmClient::new(llm, metrics.clone())?;
            let cx = LoopContext {
                slot: "",
                budget,
                spend: None,
                llm: &llm,
                registry: &REGISTRY,
                toolbox,
                offer: Offer::all(),
                limits: LoopLimits {
                    max_rounds: 3,
                    max_result_bytes: 16 * 1024,
                },
                metrics: &metrics,
                tools,
            };
            let request = ChatRequest {
                model: model.into(),
                messages: vec![Message::system(system), Message::user(user)],
                tools: REGISTRY.offered(Offer::all()),
                tool_choice: None,
                max_tokens: Some(100),
                temperature: Some(0.0),
            };
            converse(&cx, request).await
        }
    }
}
pub mod usage {
    pub use crate::journal::usage::summary;
}
pub mod worker {
    pub use crate::worker::WorkerError;
}
