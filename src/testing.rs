//! What the integration tests (`tests/it`) and the dev tooling (`companion-dev`) reach inside the worker
//! crate, by the paths the items have in it (`companion::testing::pipeline::Outcome` is
//! `crate::pipeline::Outcome`). The lower layers are crates of their own: the tests use their public
//! APIs directly. Feature `testing`, which `companion-dev` turns on; the production binary is built
//! without it, so none of this is its API.

pub mod startup {
    pub use crate::startup::{App, Bound};
}
pub mod pipeline {
    pub use crate::pipeline::{Burst, FloodDecision, Outcome, PipelineError, Reply};
    pub mod tool_loop {
        pub use crate::pipeline::tool_loop::{
            LlmRecord, LoopContext, LoopLimits, LoopOutput, converse,
        };
    }
}
/// Step kinds the tests read or write as the pipeline does.
pub mod steps {
    pub use crate::pipeline::{FLOOD, REPLY, burst::BURST, deliver::PUBLISH};
}
pub mod takeover {
    pub use crate::takeover::{Action, job_id};
}
pub mod telemetry {
    #[cfg(feature = "otel")]
    pub mod otel {
        pub use crate::telemetry::otel::{ExportedSpan, decode_export};
    }
}
pub mod usage {
    pub use crate::usage::summary;
}
