//! `get_user_tricklists`: the acting user's own tricklists with trick names and landed state.

use bson::{Document, doc};
use futures::TryStreamExt;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{Group, NAME_MAX, Tool, ToolContext, ToolError, ToolOutput, ToolStores, contains_ci};
use crate::store::{TRICKLISTS, Tricklist, tricklist_of, user_ref_filter};

/// Most lists returned.
pub(crate) const LISTS_MAX: i64 = 20;

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct Args {
    /// Filter: text in the list's name.
    #[serde(default, rename = "listName")]
    #[schemars(length(min = 1, max = NAME_MAX))]
    pub(crate) list_name: Option<String>,
}

pub(crate) struct GetUserTricklists {
    mongo: crate::store::Mongo,
}

impl Tool for GetUserTricklists {
    const NAME: &'static str = "get_user_tricklists";
    const GROUPS: &'static [Group] = &[Group::Tricks];
    const READS_ONLY: bool = true;
    type Args = Args;

    fn description() -> &'static str {
        "Get the user's own tricklists: each trick and whether they landed it (checked). Use for their lists or progress."
    }

    fn new(s: &ToolStores) -> Self {
        Self {
            mongo: s.mongo.clone(),
        }
    }

    async fn call(&self, ctx: &ToolContext<'_>, args: Args) -> Result<ToolOutput, ToolError> {
        let mut filter = user_ref_filter("user", ctx.user);
        if let Some(name) = args
            .list_name
            .as_deref()
            .map(str::trim)
            .filter(|n| !n.is_empty())
        {
            filter = doc! { "$and": [filter, { "name": contains_ci(name) }] };
        }
        let docs: Vec<Document> = self
            .mongo
            .collection(TRICKLISTS)
            .find(filter)
            .sort(doc! { "createdAt": -1, "_id": -1 })
            .limit(LISTS_MAX)
            .await?
            .try_collect()
            .await?;
        let lists: Vec<_> = docs.iter().filter_map(tricklist_of).collect();
        let lists = self.mongo.resolve_tricklists(&lists).await?;
        let out: Vec<Value> = lists.iter().map(list_json).collect();
        Ok(ToolOutput::data(
            json!({ "tricklists": out, "count": out.len() }),
        ))
    }
}

/// A resolved tricklist for the model.
pub(crate) fn list_json(l: &Tricklist) -> Value {
    let landed = l.tricks.iter().filter(|t| t.checked).count();
    json!({
        "_id": l.id.to_hex(),
        "name": l.name,
        "category": l.category,
        "isPublic": l.is_public,
        "createdBy": l.created_by,
        "trickCount": l.tricks.len(),
        "landed": landed,
        "tricks": l.tricks.iter().map(|t| json!({
            "name": t.name.as_deref().unwrap_or("(removed trick)"),
            "checked": t.checked,
        })).collect::<Vec<_>>(),
    })
}
