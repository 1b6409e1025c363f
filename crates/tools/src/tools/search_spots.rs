//! `search_spots`: finds spots in `ck_spots` by words in their name, city, state, country or description.

use bson::{Document, doc};
use futures::TryStreamExt;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{
    Group, QUERY_MAX, Tool, ToolContext, ToolError, ToolOutput, ToolStores, contains_ci, deep_link,
    num_field, str_field,
};
use crate::store::SPOTS;

/// Most spots returned by one search.
pub(crate) const LIMIT_MAX: u32 = 20;
/// Spots returned when the model names no limit.
pub(crate) const LIMIT_DEFAULT: u32 = 5;

// Kinds of spot in `ck_spots`. A plain comment: a doc comment here would become the `type` field's
// description in the tools' schemas.
#[derive(Clone, Copy, Debug, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub(crate) enum SpotType {
    Skatepark,
    Street,
    Diy,
    Snow,
    Mountain,
    Resort,
}

impl SpotType {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Skatepark => "skatepark",
            Self::Street => "street",
            Self::Diy => "diy",
            Self::Snow => "snow",
            Self::Mountain => "mountain",
            Self::Resort => "resort",
        }
    }
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct Args {
    // Looked for in the name, city, state, country and description, case-insensitively.
    /// Matched literally.
    #[schemars(length(min = 1, max = QUERY_MAX), regex(pattern = r"\S"))]
    pub(crate) query: String,
    #[serde(default, rename = "type")]
    pub(crate) kind: Option<SpotType>,
    /// Default 5.
    #[serde(default)]
    #[schemars(range(min = 1, max = LIMIT_MAX))]
    pub(crate) limit: Option<u32>,
}

pub(crate) struct SearchSpots {
    mongo: crate::store::Mongo,
}

impl Tool for SearchSpots {
    const NAME: &'static str = "search_spots";
    const GROUPS: &'static [Group] = &[Group::Spots];
    const READS_ONLY: bool = true;
    type Args = Args;

    fn description() -> &'static str {
        "Find spots by a word in their name or location, when the user asks about places to skate or ride. The app shows them as a list."
    }

    fn new(s: &ToolStores) -> Self {
        Self {
            mongo: s.mongo.clone(),
        }
    }

    async fn call(&self, _ctx: &ToolContext<'_>, args: Args) -> Result<ToolOutput, ToolError> {
        let q = args.query.trim();
        let mut filter = doc! { "$or": [
            { "name": contains_ci(q) },
            { "city": contains_ci(q) },
            { "state": contains_ci(q) },
            { "country": contains_ci(q) },
            { "description": contains_ci(q) },
        ] };
        if let Some(kind) = args.kind {
            filter.insert("type", kind.as_str());
        }
        let limit = args.limit.unwrap_or(LIMIT_DEFAULT).clamp(1, LIMIT_MAX);
        let docs: Vec<Document> = self
            .mongo
            .collection(SPOTS)
            .find(filter)
            .sort(doc! { "rating": -1, "_id": 1 })
            .limit(i64::from(limit))
            .projection(doc! { "name": 1, "type": 1, "city": 1, "state": 1, "country": 1, "rating": 1, "imageUrl": 1 })
            .await?
            .try_collect()
            .await?;
        let spots: Vec<Value> = docs.iter().filter_map(spot_summary).collect();
        let card = (!spots.is_empty()).then(|| json!({ "type": "spots_list", "data": spots }));
        Ok(ToolOutput::with_card(
            json!({ "spots": spots, "count": spots.len() }),
            card,
        ))
    }
}

/// A spot as the model and the app's cards see it.
pub(crate) fn spot_summary(d: &Document) -> Option<Value> {
    let id = d.get_object_id("_id").ok()?;
    Some(json!({
        "_id": id.to_hex(),
        "name": str_field(d, "name"),
        "type": str_field(d, "type"),
        "city": str_field(d, "city"),
        "state": str_field(d, "state"),
        "country": str_field(d, "country"),
        "rating": num_field(d, "rating"),
        "imageUrl": str_field(d, "imageUrl"),
        "deepLink": deep_link("spot", id),
    }))
}
