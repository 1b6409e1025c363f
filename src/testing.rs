//! The crate's internals that the integration tests (`tests/it`) and the dev tooling (`companion-dev`)
//! reach, by the paths they have in the crate (`companion::testing::journal::State` is
//! `crate::journal::State`). Feature `testing`, which `companion-dev` turns on; the production binary is
//! built without it, so none of this is its API.

pub use crate::config::{self, Config};

pub mod app {
    pub use crate::app::Components;
}
pub mod bus {
    pub use crate::bus::event::{Completion, DmEvent, GroupMessageEvent, InboundEvent};
    pub use crate::bus::{Bus, BusError, DLQ_REASON};
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
pub mod ops {
    pub use crate::ops::serve;
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
            Article, Outcome, Report, chunk_article, ingest, ingest_article, read_articles,
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
    pub mod screen {
        pub use crate::safety::screen::screen;
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
        ReminderBounds, ToolContext, ToolError, ToolRecord, ToolResult, ToolStores, Toolbox,
        call_key,
    };
}
pub mod turn {
    pub use crate::turn::{Burst, FloodDecision, Outcome, Reply, TurnError};
    pub mod takeover {
        pub use crate::turn::takeover::{Action, job_id};
    }
    pub mod tool_loop {
        pub use crate::turn::tool_loop::{LlmRecord, LoopOutput, converse_with_every_tool};
    }
}
pub mod usage {
    pub use crate::journal::usage::summary;
}
pub mod worker {
    pub use crate::worker::WorkerError;
}
