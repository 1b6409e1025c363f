//! `create_tricklist`: a new tricklist for the acting user, its tricks resolved against the trickipedia.
//!
//! Stored in the app's exact shape: `user` as a DBRef, `tricks: [{_id, checked: false}]`, `category`,
//! `isPublic: false`, `createdAt`, `createdBy: <character name>`, plus `sourceMessageId`/`toolCallId`.
//! The `_id` is derived from (event message, tool call), so a retried call returns the list it made.

use bson::{Bson, Document, doc, oid::ObjectId};
use futures::TryStreamExt;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{
    Group, NAME_MAX, Tool, ToolContext, ToolError, ToolOutput, ToolStores, deep_link, derived_id,
    guard_write, search_trickipedia::Category,
};
use crate::store::{TRICKLISTS, TRICKS, is_duplicate_key, user_ref};

/// Most tricks requested in one list.
pub(crate) const TRICKS_MAX: usize = 30;
/// Longest requested trick name.
pub(crate) const TRICK_NAME_MAX: usize = 60;
/// Upper bound on trickipedia entries loaded for matching.
const TRICKIPEDIA_MAX: i64 = 5000;

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct Args {
    #[schemars(length(min = 1, max = NAME_MAX), regex(pattern = r"\S"))]
    pub(crate) name: String,
    // Each is matched against the trickipedia ([`resolve_trick`]).
    #[schemars(length(min = 1, max = TRICKS_MAX), inner(length(min = 1, max = TRICK_NAME_MAX)))]
    pub(crate) tricks: Vec<String>,
    // Tricks of this sport are preferred when names repeat.
    /// Default skateboard.
    #[serde(default)]
    pub(crate) category: Option<Category>,
}

pub(crate) struct CreateTricklist {
    mongo: crate::store::Mongo,
    /// Things a user may create per rolling hour (the write quota).
    writes_per_hour: u32,
}

/// One trickipedia entry, for matching.
#[derive(Clone, Debug)]
pub(crate) struct TrickRef {
    pub(crate) id: ObjectId,
    pub(crate) name: String,
    pub(crate) category: Option<String>,
}

impl Tool for CreateTricklist {
    const NAME: &'static str = "create_tricklist";
    const GROUPS: &'static [Group] = &[Group::Lists];
    type Args = Args;

    fn description() -> &'static str {
        "Create a tricklist for the user from trickipedia tricks (names match forgivingly); tell the user which names did not match. Counts toward an hourly limit."
    }

    fn new(s: &ToolStores) -> Self {
        Self {
            mongo: s.mongo.clone(),
            writes_per_hour: s.writes_per_hour,
        }
    }

    async fn call(&self, ctx: &ToolContext<'_>, args: Args) -> Result<ToolOutput, ToolError> {
        let name = args.name.trim().to_owned();
        let category = args.category.unwrap_or(Category::Skateboard).as_str();
        let pedia = load_trickipedia(&self.mongo).await?;
        let mut matched: Vec<(String, &TrickRef)> = Vec::new();
        let mut unmatched: Vec<String> = Vec::new();
        for requested in &args.tricks {
            match resolve_trick(requested, &pedia, category) {
                Some(t) if !matched.iter().any(|(_, m)| m.id == t.id) => {
                    matched.push((requested.trim().to_owned(), t))
                }
                Some(_) => {}
                None => unmatched.push(requested.trim().to_owned()),
            }
        }
        if matched.is_empty() {
            return Err(ToolError::NotFound(format!(
                "none of the tricks were found in the trickipedia ({}); no list was created — search the trickipedia or ask the user",
                unmatched.join(", ")
            )));
        }
        let id = derived_id(ctx.message_id, Self::NAME, &ctx.call.id);
        let coll = self.mongo.collection(TRICKLISTS);
        let existing = coll.find_one(doc! { "_id": id }).await?;
        let created = if existing.is_some() {
            false
        } else {
            guard_write(ctx, self.writes_per_hour, Self::NAME).await?;
            let tricks: Vec<Bson> = matched
                .iter()
                .map(|(_, t)| Bson::Document(doc! { "_id": t.id, "checked": false }))
                .collect();
            let list = doc! {
                "_id": id,
                "name": &name,
                "user": user_ref(ctx.user),
                "tricks": tricks,
                "category": category,
                "isPublic": false,
                "createdAt": bson::DateTime::from_chrono(ctx.clock.now),
                "createdBy": ctx.character,
                "sourceMessageId": ctx.message_id,
                "toolCallId": &ctx.call.id,
            };
            match coll.insert_one(list).await {
                Ok(_) => true,
                Err(e) if is_duplicate_key(&e) => false,
                Err(e) => return Err(e.into()),
            }
        };
        let (name, trick_count) = if created {
            (name, matched.len())
        } else {
            // A retried call: describe the list that was stored the first time.
            let stored: Document = coll
                .find_one(doc! { "_id": id })
                .await?
                .ok_or_else(|| ToolError::NotFound("the list vanished".into()))?;
            (
                stored.get_str("name").unwrap_or(&name).to_owned(),
                stored.get_array("tricks").map(|a| a.len()).unwrap_or(0),
            )
        };
        let data = json!({
            "_id": id.to_hex(),
            "name": name,
            "category": category,
            "trickCount": trick_count,
            "matched": matched.iter().map(|(r, t)| json!({"requested": r, "trick": t.name})).collect::<Vec<_>>(),
            "unmatched": unmatched,
            "created": created,
        });
        let card = json!({ "type": "tricklist_card", "data": tricklist_card_data(id, &data["name"], trick_count, Some(category)) });
        Ok(ToolOutput::with_card(data, Some(card)))
    }
}

/// The `data` of a `tricklist_card`.
pub(crate) fn tricklist_card_data(
    id: ObjectId,
    name: &Value,
    trick_count: usize,
    category: Option<&str>,
) -> Value {
    json!({
        "_id": id.to_hex(),
        "name": name,
        "trickCount": trick_count,
        "category": category,
        "deepLink": deep_link("tricklist", id),
    })
}

async fn load_trickipedia(mongo: &crate::store::Mongo) -> Result<Vec<TrickRef>, ToolError> {
    let docs: Vec<Document> = mongo
        .collection(TRICKS)
        .find(doc! {})
        .projection(doc! { "name": 1, "category": 1 })
        .limit(TRICKIPEDIA_MAX)
        .await?
        .try_collect()
        .await?;
    Ok(docs
        .into_iter()
        .filter_map(|d| {
            Some(TrickRef {
                id: d.get_object_id("_id").ok()?,
                name: d.get_str("name").ok()?.to_owned(),
                category: d.get_str("category").ok().map(str::to_owned),
            })
        })
        .collect())
}

/// Letters and digits only, lowercase: "50-50 Grind" → "5050grind", "Kick flip" → "kickflip".
fn squash(s: &str) -> String {
    s.chars()
        .filter(|c| c.is_alphanumeric())
        .flat_map(char::to_lowercase)
        .collect()
}

/// Finds the trick a requested name means: case-insensitive exact name first, then the same letters and
/// digits ("kick flip"), then a name starting with them ("50-50" → "50-50 Grind", shortest wins), then a
/// plural. Entries of `category` win over others at every step.
pub(crate) fn resolve_trick<'a>(
    requested: &str,
    pedia: &'a [TrickRef],
    category: &str,
) -> Option<&'a TrickRef> {
    let wanted = requested.trim().to_lowercase();
    let sq = squash(&wanted);
    if sq.is_empty() {
        return None;
    }
    let pick = |pred: &dyn Fn(&TrickRef) -> bool| -> Option<&'a TrickRef> {
        let mut c: Vec<&TrickRef> = pedia.iter().filter(|t| pred(t)).collect();
        c.sort_by_key(|t| (t.category.as_deref() != Some(category), t.name.len()));
        c.first().copied()
    };
    pick(&|t| t.name.to_lowercase() == wanted)
        .or_else(|| pick(&|t| squash(&t.name) == sq))
        .or_else(|| {
            (sq.chars().count() >= 2)
                .then(|| pick(&|t| squash(&t.name).starts_with(&sq)))
                .flatten()
        })
        .or_else(|| {
            sq.strip_suffix('s')
                .filter(|s| s.len() >= 3)
                .and_then(|s| pick(&|t| squash(&t.name) == s))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pedia() -> Vec<TrickRef> {
        [
            ("Kickflip", "skateboard"),
            ("Varial Kickflip", "skateboard"),
            ("50-50 Grind", "skateboard"),
            ("5-0 Grind", "skateboard"),
            ("Boardslide", "snowboard"),
            ("Boardslide", "skateboard"),
            ("Ollie", "skateboard"),
        ]
        .into_iter()
        .map(|(n, c)| TrickRef {
            id: ObjectId::new(),
            name: n.into(),
            category: Some(c.into()),
        })
        .collect()
    }

    #[test]
    fn forgiving_matches() {
        let p = pedia();
        let name = |q: &str| resolve_trick(q, &p, "skateboard").map(|t| t.name.clone());
        assert_eq!(name("kickflip").as_deref(), Some("Kickflip"));
        assert_eq!(name("Kick Flip").as_deref(), Some("Kickflip"));
        assert_eq!(name("50-50").as_deref(), Some("50-50 Grind"));
        assert_eq!(name("5-0").as_deref(), Some("5-0 Grind"));
        assert_eq!(name("ollies").as_deref(), Some("Ollie"));
        assert_eq!(name("hardflip"), None);
        assert_eq!(name(".*"), None);
        let b = resolve_trick("boardslide", &p, "skateboard").unwrap();
        assert_eq!(b.category.as_deref(), Some("skateboard"));
        let b = resolve_trick("boardslide", &p, "snowboard").unwrap();
        assert_eq!(b.category.as_deref(), Some("snowboard"));
    }
}
