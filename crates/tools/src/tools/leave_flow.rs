//! `leave_flow`: the user wants to stop their flow, for now (`pause`: they can pick it up later with
//! `start_flow`) or for good.

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;

use super::{Group, Tool, ToolContext, ToolError, ToolOutput, ToolStores};
use crate::flow::state::{self, Applied, status};

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct Args {
    // False drops the flow.
    /// Keep progress to resume later.
    #[serde(default)]
    pub(crate) pause: bool,
}

pub(crate) struct LeaveFlow;

impl Tool for LeaveFlow {
    const NAME: &'static str = "leave_flow";
    const GROUPS: &'static [Group] = &[Group::InFlow];
    type Args = Args;

    fn description() -> &'static str {
        "Stop the user's flow when they want to stop, pause or do something else."
    }

    fn new(_: &ToolStores) -> Self {
        Self
    }

    async fn call(&self, ctx: &ToolContext<'_>, args: Args) -> Result<ToolOutput, ToolError> {
        let applied = state::change(
            ctx.job,
            &ctx.call.key,
            &ctx.user.to_hex(),
            &ctx.bot.to_hex(),
            |current| match current.filter(|c| status::is_open(&c.status)) {
                None => Err(()),
                Some(c) => {
                    let mut s = c.clone();
                    s.status = if args.pause {
                        status::PAUSED
                    } else {
                        status::LEFT
                    }
                    .into();
                    if !args.pause {
                        s.waiting_for = None;
                    }
                    Ok(Some(s))
                }
            },
        )
        .await?;
        match applied {
            Applied::Changed(Some(s)) => Ok(ToolOutput::data(
                json!({ "flow": s.flow, "status": s.status, "step": s.step }),
            )),
            _ => Err(ToolError::NotFound(
                "the user is not in a flow with you".into(),
            )),
        }
    }
}
