//! `share_content`: a spot, tricklist or trick as a card, if this user may see it.
//!
//! Any spot or trick is visible; a tricklist only when it is the user's own or public. Anything else is
//! answered exactly like a missing id, so private lists do not leak their existence.

use bson::{Bson, doc, oid::ObjectId};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{
    Group, Tool, ToolContext, ToolError, ToolOutput, ToolStores,
    create_tricklist::tricklist_card_data, search_spots::spot_summary,
    search_trickipedia::trick_card,
};
use crate::store::{SPOTS, TRICKLISTS, TRICKS};

#[derive(Clone, Copy, Debug, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub(crate) enum ContentType {
    Spot,
    Tricklist,
    Trick,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct Args {
    #[serde(rename = "type")]
    pub(crate) kind: ContentType,
    /// From an earlier tool result.
    #[schemars(regex(pattern = r"^[0-9a-fA-F]{24}$"))]
    pub(crate) id: String,
}

pub(crate) struct ShareContent {
    mongo: crate::store::Mongo,
}

impl Tool for ShareContent {
    const NAME: &'static str = "share_content";
    const GROUPS: &'static [Group] = &[Group::Tricks, Group::Spots];
    const READS_ONLY: bool = true;
    type Args = Args;

    fn description() -> &'static str {
        "Show a spot, tricklist or trick as a card in the chat. Only the user's own or public tricklists."
    }

    fn new(s: &ToolStores) -> Self {
        Self {
            mongo: s.mongo.clone(),
        }
    }

    async fn call(&self, ctx: &ToolContext<'_>, args: Args) -> Result<ToolOutput, ToolError> {
        let id = ObjectId::parse_str(&args.id)
            .map_err(|_| ToolError::invalid("id", "is not an ObjectId"))?;
        let missing = |what: &str| {
            ToolError::NotFound(format!(
                "no {what} with id {} that this user can see",
                args.id
            ))
        };
        let card = match args.kind {
            ContentType::Spot => {
                let d = self
                    .mongo
                    .collection(SPOTS)
                    .find_one(doc! { "_id": id })
                    .await?
                    .ok_or_else(|| missing("spot"))?;
                let s = spot_summary(&d).ok_or_else(|| missing("spot"))?;
                json!({ "type": "spot_card", "data": s })
            }
            ContentType::Trick => {
                let d = self
                    .mongo
                    .collection(TRICKS)
                    .find_one(doc! { "_id": id })
                    .await?
                    .ok_or_else(|| missing("trick"))?;
                trick_card(&d).ok_or_else(|| missing("trick"))?
            }
            ContentType::Tricklist => {
                let d = self
                    .mongo
                    .collection(TRICKLISTS)
                    .find_one(doc! { "_id": id })
                    .await?
                    .ok_or_else(|| missing("tricklist"))?;
                let own = owner_of(d.get("user")) == Some(ctx.user);
                if !own && !d.get_bool("isPublic").unwrap_or(false) {
                    return Err(missing("tricklist"));
                }
                let n = d.get_array("tricks").map(|a| a.len()).unwrap_or(0);
                let name = Value::String(d.get_str("name").unwrap_or("(unnamed)").to_owned());
                json!({ "type": "tricklist_card", "data": tricklist_card_data(id, &name, n, d.get_str("category").ok()) })
            }
        };
        let data = json!({ "shared": true, "type": card["type"], "name": card["data"]["name"], "_id": args.id });
        Ok(ToolOutput::with_card(data, Some(card)))
    }
}

/// The user a tricklist's `user` field refers to: a DBRef, a plain ObjectId or its hex string.
pub(crate) fn owner_of(user: Option<&Bson>) -> Option<ObjectId> {
    match user? {
        Bson::Document(d) => d.get_object_id("$id").ok(),
        Bson::ObjectId(o) => Some(*o),
        Bson::String(s) => ObjectId::parse_str(s).ok(),
        _ => None,
    }
}
