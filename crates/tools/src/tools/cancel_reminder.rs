//! `cancel_reminder`: the user changed their mind. The pending reminder's row becomes `cancelled`; its schedule
//! still fires, and the follow-up finds it cancelled and sends nothing (the worker may not purge the
//! signal stream), so a cancelled reminder never reaches the user.

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;

use super::{Group, Tool, ToolContext, ToolError, ToolOutput, ToolStores};
use crate::store::ReminderState;

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct Args {
    /// From schedule_reminder or your context's pending reminders.
    #[serde(rename = "reminderId")]
    #[schemars(length(min = 1, max = 64))]
    pub(crate) reminder_id: String,
}

pub(crate) struct CancelReminder {
    /// The service's database.
    pg: crate::store::Pg,
}

impl Tool for CancelReminder {
    const NAME: &'static str = "cancel_reminder";
    const GROUPS: &'static [Group] = &[Group::Reminders];
    type Args = Args;

    fn description() -> &'static str {
        "Cancel a pending reminder the user no longer wants."
    }

    fn new(s: &ToolStores) -> Self {
        Self { pg: s.pg.clone() }
    }

    async fn call(&self, ctx: &ToolContext<'_>, args: Args) -> Result<ToolOutput, ToolError> {
        let id = args.reminder_id.trim();
        let user = ctx.user.to_hex();
        let cancelled = self.pg.cancel_reminder(id, &user).await?;
        if cancelled {
            return Ok(ToolOutput::data(
                json!({ "reminderId": id, "cancelled": true }),
            ));
        }
        // Cancelled by an earlier attempt of this call, or not the user's / not pending.
        match self.pg.reminder(id).await? {
            Some(r) if r.user_id == user && r.state == ReminderState::Cancelled => Ok(
                ToolOutput::data(json!({ "reminderId": id, "cancelled": true })),
            ),
            Some(r) if r.user_id == user => Err(ToolError::NotFound(format!(
                "reminder {id} is not pending any more (it is {})",
                r.state.as_str()
            ))),
            _ => Err(ToolError::NotFound(format!(
                "the user has no reminder {id}"
            ))),
        }
    }
}
