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
use crate::store::TRICKS;

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
    const READS_ONLY: bool = true;
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
        let rank = |d: &Document| {
            let name = d.get_str("name").unwrap_or("").to_lowercase();
            if name == lower {
                0
            } else if name.contains(&lower) {
                1
            } else {
                2
            }
        };
        docs.sort_by_key(rank);
        docs.truncate(LIMIT as usize);
        let exact = docs.iter().take_while(|d| rank(d) == 0).count();
        // The best match in full (an exact name sorts first); the others by name, for the model to
        // search one of them by.
        let card = match (docs.len(), exact) {
            (1, _) | (_, 1) => docs.first().and_then(trick_card),
            _ => None,
        };
        let sport = docs.first().and_then(|d| str_field(d, "category"));
        let tricks: Vec<Value> = docs
            .first()
            .and_then(trick_summary)
            .into_iter()
            .chain(docs.iter().skip(1).map(|d| glimpse(d, sport.as_deref())))
            .collect();
        Ok(ToolOutput::with_card(
            json!({ "tricks": tricks, "count": tricks.len() }),
            card,
        ))
    }
}

/// Characters of a trick's description the model is given: what it answers a how-to from.
const DESCRIPTION: usize = 300;

/// The best match for the model. No deep link: the model refers to a trick by its `_id`
/// (`share_content`), and the card carries the link.
fn trick_summary(d: &Document) -> Option<Value> {
    let id = d.get_object_id("_id").ok()?;
    Some(json!({
        "_id": id.to_hex(),
        "name": str_field(d, "name"),
        "category": str_field(d, "category"),
        "difficulty": str_field(d, "difficulty"),
        "description": str_field(d, "description").map(|s| clip(&s, DESCRIPTION)),
    }))
}

/// A match after the best: its name and difficulty, and its sport when it is not the best match's.
fn glimpse(d: &Document, sport: Option<&str>) -> Value {
    let mut t = json!({ "name": str_field(d, "name"), "difficulty": str_field(d, "difficulty") });
    let category = str_field(d, "category");
    if category.as_deref() != sport {
        t["category"] = json!(category);
    }
    t
}

/// The `trick_card` of a trick.
pub(crate) fn trick_card(d: &Document) -> Option<Value> {
    let id = d.get_object_id("_id").ok()?;
    Some(json!({ "type": "trick_card", "data": {
        "_id": id.to_hex(), "name": str_field(d, "name"), "category": str_field(d, "category"),
        "difficulty": str_field(d, "difficulty"), "deepLink": deep_link("trick", id),
    } }))
}
