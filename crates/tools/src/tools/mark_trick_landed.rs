//! `mark_trick_landed`: the user says they landed a trick; it is checked off (`checked: true`) on their
//! tricklist that has it. The only change a tool makes to existing data, and only to that flag on the
//! user's own list; checking a checked trick again changes nothing.

use bson::{Bson, doc};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;

use super::{Group, NAME_MAX, Tool, ToolContext, ToolError, ToolOutput, ToolStores};
use crate::store::{TRICKLISTS, user_ref_filter};

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct Args {
    // The name as on the list; case, spaces and dashes do not matter ([`key`]).
    #[schemars(length(min = 1, max = NAME_MAX))]
    pub(crate) trick: String,
    /// Only when the trick is on several lists.
    #[serde(default, rename = "tricklistId")]
    #[schemars(regex(pattern = r"^[0-9a-fA-F]{24}$"))]
    pub(crate) tricklist_id: Option<String>,
}

pub(crate) struct MarkTrickLanded {
    mongo: crate::store::Mongo,
}

/// Lowercase letters and digits only: "Kick-flip" and "kickflip" are the same trick.
fn key(name: &str) -> String {
    name.chars()
        .filter(|c| c.is_alphanumeric())
        .flat_map(char::to_lowercase)
        .collect()
}

impl Tool for MarkTrickLanded {
    const NAME: &'static str = "mark_trick_landed";
    const GROUPS: &'static [Group] = &[Group::Lists];
    type Args = Args;

    fn description() -> &'static str {
        "Check off a trick the user says they landed on their tricklist."
    }

    fn new(s: &ToolStores) -> Self {
        Self {
            mongo: s.mongo.clone(),
        }
    }

    async fn call(&self, ctx: &ToolContext<'_>, args: Args) -> Result<ToolOutput, ToolError> {
        let wanted = key(&args.trick);
        let list_id = args
            .tricklist_id
            .as_deref()
            .and_then(|s| bson::oid::ObjectId::parse_str(s).ok());
        let lists = self.mongo.user_tricklists(ctx.user, 50).await?;
        let found: Vec<_> = lists
            .iter()
            .filter(|l| list_id.is_none_or(|id| id == l.id))
            .filter_map(|l| {
                let t = l
                    .tricks
                    .iter()
                    .find(|t| t.name.as_deref().is_some_and(|n| key(n) == wanted))?;
                Some((l, t))
            })
            .collect();
        let (list, trick) = match found.as_slice() {
            [] => {
                return Err(ToolError::NotFound(format!(
                    "no tricklist of the user has `{}`",
                    args.trick.trim()
                )));
            }
            [one] => *one,
            many => {
                return Err(ToolError::invalid(
                    "tricklistId",
                    format!(
                        "`{}` is on several lists ({}); give the tricklistId",
                        args.trick.trim(),
                        many.iter()
                            .map(|(l, _)| format!("{} {}", l.id.to_hex(), l.name))
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                ));
            }
        };
        if !trick.checked {
            let coll = self.mongo.collection(TRICKLISTS);
            let filter = doc! { "$and": [ { "_id": list.id }, user_ref_filter("user", ctx.user) ] };
            if let Some(stored) = coll.find_one(filter.clone()).await? {
                let tricks: Vec<Bson> = stored
                    .get_array("tricks")
                    .map(|a| a.to_vec())
                    .unwrap_or_default()
                    .into_iter()
                    .map(|t| match t {
                        Bson::Document(mut d) if d.get_object_id("_id").ok() == Some(trick.id) => {
                            d.insert("checked", true);
                            Bson::Document(d)
                        }
                        other => other,
                    })
                    .collect();
                coll.update_one(filter, doc! { "$set": { "tricks": tricks } })
                    .await?;
            }
        }
        let landed = list
            .tricks
            .iter()
            .filter(|t| t.checked || t.id == trick.id)
            .count();
        Ok(ToolOutput::data(json!({
            "_id": list.id.to_hex(),
            "name": list.name,
            "trick": trick.name,
            "checked": true,
            "landed": landed,
            "of": list.tricks.len(),
        })))
    }
}
