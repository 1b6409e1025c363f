//! `search_trickipedia`: tricks whose name or description contains the query, optionally of one sport.

use bson::{Document, doc};
use futures::TryStreamExt;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{
    Group, QUERY_MAX, Tool, ToolContext, ToolError, ToolOutput, ToolStores, clip, contains_ci,
    deep_link, str_field,
};
use crate::store::mongo::TRICKS;

/// Most tricks returned.
pub(crate) const LIMIT: i64 = 10;

// Sports of the trickipedia. A plain comment: a doc comment here would become the `category` field's
// description in the tools' schemas.
#[derive(Clone, Copy, Debug, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Category {
    Skateboard,
    Snowboard,
    Bmx,
    Ski,
    Surf,
}

impl Category {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Skateboard => "skateboard",
            Self::Snowboard => "snowboard",
            Self::Bmx => "bmx",
            Self::Ski => "ski",
            Self::Surf => "surf",
        }
    }
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct Args {
    // Looked for in trick names and descriptions, case-insensitively.
    /// Matched literally.
    #[schemars(length(min = 1, max = QUERY_MAX), regex(pattern = r"\S"))]
    pub(crate) query: String,
    #[serde(default)]
    pub(crate) category: Option<Category>,
}

pub(crate) struct SearchTrickipedia {
    mongo: crate::store::Mongo,
}

impl Tool for SearchTrickipedia {
    const NAME: &'static str = "search_trickipedia";
    const GROUPS: &'static [Group] = &[Group::Tricks];
    type Args = Args;

    fn description() -> &'static str {
        "Look up tricks by name or keyword, for how-tos, difficulty or ideas."
    }

    fn new(s: &ToolStores) -> Self {
        Self {
            mongo: s.mongo.clone(),
        }
    }

    async fn call(&self, _ctx: &ToolContext<'_>, args: Args) -> Result<ToolOutput, ToolError> {
        let q = args.query.trim();
        let mut filter =
            doc! { "$or": [ { "name": contains_ci(q) }, { "description": contains_ci(q) } ] };
        if let Some(c) = args.category {
            filter.insert("category", c.as_str());
        }
        let mut docs: Vec<Document> = self
            .mongo
            .collection(TRICKS)
            .find(filter)
            .sort(doc! { "name": 1, "_id": 1 })
            .limit(LIMIT * 3)
            .projection(doc! { "name": 1, "category": 1, "difficulty": 1, "description": 1 })
            .await?
            .try_collect()
            .await?;
        // Best first: exact name, then name contains the query, then description only.
        let lower = q.to_lowercase();
        docs.sort_by_key(|d| {
            let name = d.get_str("name").unwrap_or("").to_lowercase();
            if name == lower {
                0
            } else if name.contains(&lower) {
                1
            } else {
                2
            }
        });
        docs.truncate(LIMIT as usize);
        let tricks: Vec<Value> = docs.iter().filter_map(trick_summary).collect();
        let exact: Vec<&Value> = tricks
            .iter()
            .filter(|t| {
                t["name"]
                    .as_str()
                    .is_some_and(|n| n.to_lowercase() == lower)
            })
            .collect();
        let card = match (tricks.len(), exact.len()) {
            (1, _) => Some(trick_card(&tricks[0])),
            (_, 1) => Some(trick_card(exact[0])),
            _ => None,
        };
        Ok(ToolOutput::with_card(
            json!({ "tricks": tricks, "count": tricks.len() }),
            card,
        ))
    }
}

/// A trick for the model.
pub(crate) fn trick_summary(d: &Document) -> Option<Value> {
    let id = d.get_object_id("_id").ok()?;
    Some(json!({
        "_id": id.to_hex(),
        "name": str_field(d, "name"),
        "category": str_field(d, "category"),
        "difficulty": str_field(d, "difficulty"),
        "description": str_field(d, "description").map(|s| clip(&s, 300)),
        "deepLink": deep_link("trick", id),
    }))
}

/// The `trick_card` of a trick summary.
pub(crate) fn trick_card(t: &Value) -> Value {
    json!({ "type": "trick_card", "data": {
        "_id": t["_id"], "name": t["name"], "category": t["category"],
        "difficulty": t["difficulty"], "deepLink": t["deepLink"],
    } })
}
