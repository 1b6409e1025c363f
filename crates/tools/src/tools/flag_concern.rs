//! `flag_concern`: the reply model's own flag that the user may be in danger, the crisis screen's last
//! net (docs/safety.md). Offered with every set of tools. The tool loop never runs it and never asks the
//! model again after it: the turn sends the crisis referral first, then the model's own reply from the
//! same answer (when it passes the output check; otherwise the character's crisis line).

use companion_safety::Category;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;

use super::{Group, Tool, ToolContext, ToolError, ToolOutput, ToolStores};

pub const NAME: &str = "flag_concern";

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Args {
    /// self_harm: thoughts of suicide or hurting themselves; harm_others: about to hurt someone;
    /// abuse: hurt or threatened at home or by a carer; grooming: an adult pressuring them (pictures,
    /// meeting alone, secrets, gifts).
    pub concern: Category,
}

pub(crate) struct FlagConcern;

impl Tool for FlagConcern {
    const NAME: &'static str = NAME;
    const GROUPS: &'static [Group] = &[];
    type Args = Args;

    fn description() -> &'static str {
        "Call this, together with your caring reply, when the user may be in danger (suicide or \
         self-harm, about to hurt someone, abused, or an adult pressuring them): the app then shows them \
         people who can help, right away. Never for sport slang, games or jokes."
    }

    fn new(_: &ToolStores) -> Self {
        Self
    }

    async fn call(&self, _ctx: &ToolContext<'_>, args: Args) -> Result<ToolOutput, ToolError> {
        // The loop answers this call itself; run on its own it only acknowledges.
        Ok(ToolOutput::data(
            json!({ "flagged": args.concern.as_str() }),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The model is offered the screen's categories as a plain enum, and each reads back as one.
    #[test]
    fn the_concern_is_the_screen_s_category() {
        let schema = super::super::schema::parameters_for::<Args>();
        let names = schema["properties"]["concern"]["enum"]
            .as_array()
            .unwrap_or_else(|| panic!("{schema}"))
            .clone();
        assert_eq!(
            names,
            ["self_harm", "harm_others", "abuse", "grooming"].map(serde_json::Value::from)
        );
        for name in &names {
            let args: Args = serde_json::from_value(json!({ "concern": name })).unwrap();
            assert_eq!(args.concern.as_str(), name);
        }
    }
}
