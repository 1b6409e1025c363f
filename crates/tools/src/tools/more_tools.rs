//! `more_tools`: a turn is offered only the tools its messages call for ([`super::offer`]); when the model
//! needs a group it was not offered, it asks for it here and the next round offers it. So every tool stays
//! reachable on every turn, at the cost of one round when the offer guessed wrong.

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;

use super::{Group, REGISTRY, Tool, ToolContext, ToolError, ToolOutput, ToolStores};

pub const NAME: &str = "more_tools";

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct Args {
    pub(crate) group: Group,
}

pub(crate) struct MoreTools;

impl Tool for MoreTools {
    const NAME: &'static str = NAME;
    const GROUPS: &'static [Group] = &[];
    const READS_ONLY: bool = true;
    type Args = Args;

    fn description() -> &'static str {
        "Get tools you were not given: tricks (trickipedia, the user's tricklists, cards), lists (make a \
         tricklist, check off a landed trick), spots (find, add), reminders (set, cancel), flows (guided \
         plans), in_flow (a running flow)."
    }

    fn new(_: &ToolStores) -> Self {
        Self
    }

    async fn call(&self, _ctx: &ToolContext<'_>, args: Args) -> Result<ToolOutput, ToolError> {
        Ok(ToolOutput::data(json!({
            "group": args.group,
            "tools": REGISTRY.names_in(args.group),
        })))
    }
}
