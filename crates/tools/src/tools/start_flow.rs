//! `start_flow`: the user wants to go through one of the flows this companion offers (plan a season,
//! add a spot, coach a trick). Starting the flow they paused resumes it where they were; another flow
//! is refused while one is open (leave it first).

use schemars::JsonSchema;
use serde::Deserialize;

use super::{Group, Tool, ToolContext, ToolError, ToolOutput, ToolStores};
use crate::flow::{
    self,
    state::{self, Applied, FlowState, status},
};

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct Args {
    /// An id offered in your context.
    #[schemars(length(min = 1, max = 64))]
    pub(crate) flow: String,
}

pub(crate) struct StartFlow {
    /// Every guided flow there is.
    flows: std::sync::Arc<crate::flow::Flows>,
}

impl Tool for StartFlow {
    const NAME: &'static str = "start_flow";
    const GROUPS: &'static [Group] = &[Group::Flows];
    type Args = Args;

    fn description() -> &'static str {
        "Start or resume a guided flow you offer, when the user asks for or agrees to it. Fill its slots with set_flow_slots."
    }

    fn new(s: &ToolStores) -> Self {
        Self {
            flows: s.flows.clone(),
        }
    }

    async fn call(&self, ctx: &ToolContext<'_>, args: Args) -> Result<ToolOutput, ToolError> {
        let id = args.flow.trim();
        let def = match self.flows.get(id) {
            Some(d) if ctx.offered_flows.iter().any(|f| f == id) => d,
            _ => {
                return Err(ToolError::invalid(
                    "flow",
                    format!(
                        "no flow `{id}` here; offered: {}",
                        ctx.offered_flows.join(", ")
                    ),
                ));
            }
        };
        let applied = state::change(
            ctx.job,
            &ctx.call.key,
            &ctx.user.to_hex(),
            &ctx.bot.to_hex(),
            |current| match current {
                Some(c) if status::is_open(&c.status) && c.flow != def.id => Err(format!(
                    "the user is in the flow `{}` ({}); finish it or leave it (leave_flow) first",
                    c.flow, c.status
                )),
                Some(c) if status::is_open(&c.status) => {
                    // The same flow: resume it where it was.
                    let mut s = c.clone();
                    if s.status == status::PAUSED {
                        s.status = status::ACTIVE.into();
                    }
                    Ok(Some(flow::advance(def, s)))
                }
                _ => Ok(Some(flow::advance(
                    def,
                    FlowState {
                        flow: def.id.clone(),
                        step: def.start.clone(),
                        slots: Default::default(),
                        status: status::ACTIVE.into(),
                        waiting_for: None,
                        updated_at: ctx.clock.now,
                    },
                ))),
            },
        )
        .await?;
        match applied {
            Applied::Changed(Some(s)) | Applied::Unchanged(Some(s)) => {
                Ok(ToolOutput::data(flow::view(def, &s)))
            }
            Applied::Changed(None) | Applied::Unchanged(None) => {
                Err(ToolError::NotFound("the flow could not be started".into()))
            }
            Applied::Refused(why) => Err(ToolError::Forbidden(why)),
        }
    }
}
