//! `set_flow_slots`: records what the user told the companion for the current step of their flow,
//! validated against the step's slots (the same checks as tool arguments), and moves the flow on when
//! the step is complete.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::collections::HashMap;

use super::{Group, Tool, ToolContext, ToolError, ToolOutput, ToolStores, schema::ArgsSchema};
use crate::flow::{
    self,
    state::{self, Applied, status},
};

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct Args {
    // As the step's `slots` describe them; validated against the step's schema.
    /// Values by slot name.
    pub(crate) slots: Map<String, Value>,
}

pub(crate) struct SetFlowSlots {
    /// Every guided flow there is.
    flows: std::sync::Arc<crate::flow::Flows>,
    /// Each step's slot schema by flow and step, compiled once (why, when it does not compile).
    slots: HashMap<String, HashMap<String, Result<ArgsSchema, String>>>,
}

/// Why a slot update is refused.
#[derive(Serialize, Deserialize)]
enum Refusal {
    NoFlow,
    Waiting(String),
    Invalid { field: String, message: String },
}

impl Tool for SetFlowSlots {
    const NAME: &'static str = "set_flow_slots";
    const GROUPS: &'static [Group] = &[Group::InFlow];
    type Args = Args;

    fn description() -> &'static str {
        "Record values for the current flow step: only what the user said or a tool returned, never invented."
    }

    fn new(s: &ToolStores) -> Self {
        let slots = s
            .flows
            .all()
            .map(|f| {
                let steps = f.steps.iter();
                let compiled =
                    steps.map(|(id, step)| (id.clone(), ArgsSchema::compile(step.schema())));
                (f.id.clone(), compiled.collect())
            })
            .collect();
        Self {
            flows: s.flows.clone(),
            slots,
        }
    }

    async fn call(&self, ctx: &ToolContext<'_>, args: Args) -> Result<ToolOutput, ToolError> {
        let (user, bot) = (ctx.user.to_hex(), ctx.bot.to_hex());
        let applied = state::change(ctx.job, &ctx.call.key, &user, &bot, |current| {
            let Some(c) = current.filter(|c| status::is_open(&c.status)) else {
                return Err(Refusal::NoFlow);
            };
            let Some(def) = self.flows.get(&c.flow) else {
                return Err(Refusal::NoFlow);
            };
            if c.status == status::WAITING {
                return Err(Refusal::Waiting(c.waiting_for.clone().unwrap_or_default()));
            }
            let compiled = self.slots.get(&c.flow).and_then(|s| s.get(&c.step));
            let slots =
                compiled
                    .ok_or(Refusal::NoFlow)?
                    .as_ref()
                    .map_err(|why| Refusal::Invalid {
                        field: "slots".into(),
                        message: format!("this step's slots cannot be checked ({why})"),
                    })?;
            let value = Value::Object(args.slots.clone());
            if let Err(v) = slots.validate(&value) {
                return Err(Refusal::Invalid {
                    field: format!("slots.{}", v.field),
                    message: v.message,
                });
            }
            let mut s = c.clone();
            s.status = status::ACTIVE.into();
            s.slots.extend(args.slots.clone());
            Ok(Some(flow::advance(def, s)))
        })
        .await?;
        match applied {
            Applied::Changed(Some(s)) | Applied::Unchanged(Some(s)) => {
                match self.flows.get(&s.flow) {
                    Some(def) => Ok(ToolOutput::data(flow::view(def, &s))),
                    None => Err(ToolError::NotFound(format!("no flow `{}`", s.flow))),
                }
            }
            Applied::Changed(None)
            | Applied::Unchanged(None)
            | Applied::Refused(Refusal::NoFlow) => Err(ToolError::NotFound(
                "the user is not in a flow with you; start one with start_flow".into(),
            )),
            Applied::Refused(Refusal::Waiting(what)) => Err(ToolError::Forbidden(format!(
                "the flow is waiting for {what}; nothing to fill until it comes"
            ))),
            Applied::Refused(Refusal::Invalid { field, message }) => {
                Err(ToolError::InvalidArgs { field, message })
            }
        }
    }
}
