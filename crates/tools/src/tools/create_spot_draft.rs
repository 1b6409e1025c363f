//! `create_spot_draft`: submits a new spot for moderation into `spot_drafts` (never `ck_spots`). The
//! draft names the companion (`createdBy`, `botId`) and the DM thread (`conversationId`) it came from,
//! so the review's follow-up (the worker's `proactive`) reaches the user there, from that companion.

use bson::{Bson, doc};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;

use super::{
    Group, NAME_MAX, Tool, ToolContext, ToolError, ToolOutput, ToolStores, derived_id, guard_write,
    maps, search_spots::SpotType,
};
use crate::store::{SPOT_DRAFTS, is_duplicate_key};

/// Longest maps link accepted.
pub(crate) const URL_MAX: usize = 2048;
/// Longest place field (city, state, country).
pub(crate) const PLACE_MAX: usize = 100;
/// Longest description.
pub(crate) const DESCRIPTION_MAX: usize = 1000;

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct Args {
    #[schemars(length(min = 1, max = NAME_MAX), regex(pattern = r"\S"))]
    pub(crate) name: String,
    #[serde(rename = "type")]
    pub(crate) kind: SpotType,
    // Coordinates are read from it ([`maps::parse`]) unless latitude and longitude are given.
    /// Google or Apple Maps link, as shared.
    #[serde(default, rename = "mapsUrl")]
    #[schemars(length(min = 1, max = URL_MAX))]
    pub(crate) maps_url: Option<String>,
    #[serde(default)]
    #[schemars(range(min = -90.0, max = 90.0))]
    pub(crate) latitude: Option<f64>,
    #[serde(default)]
    #[schemars(range(min = -180.0, max = 180.0))]
    pub(crate) longitude: Option<f64>,
    #[serde(default)]
    #[schemars(length(min = 1, max = PLACE_MAX))]
    pub(crate) city: Option<String>,
    #[serde(default)]
    #[schemars(length(min = 1, max = PLACE_MAX))]
    pub(crate) state: Option<String>,
    #[serde(default)]
    #[schemars(length(min = 1, max = PLACE_MAX))]
    pub(crate) country: Option<String>,
    #[serde(default)]
    #[schemars(length(min = 1, max = DESCRIPTION_MAX))]
    pub(crate) description: Option<String>,
}

pub(crate) struct CreateSpotDraft {
    mongo: crate::store::Mongo,
    /// Things a user may create per rolling hour (the write quota).
    writes_per_hour: u32,
}

impl Tool for CreateSpotDraft {
    const NAME: &'static str = "create_spot_draft";
    const GROUPS: &'static [Group] = &[Group::Spots];
    type Args = Args;

    fn description() -> &'static str {
        "Submit a spot the user wants added; it is public only once a moderator approves it. Give latitude and longitude only without a maps link. Counts toward an hourly limit."
    }

    fn new(s: &ToolStores) -> Self {
        Self {
            mongo: s.mongo.clone(),
            writes_per_hour: s.writes_per_hour,
        }
    }

    async fn call(&self, ctx: &ToolContext<'_>, args: Args) -> Result<ToolOutput, ToolError> {
        let (coords, source, short_unresolved) = coordinates(&args)?;
        let id = derived_id(ctx.message_id, Self::NAME, &ctx.call.id);
        let coll = self.mongo.collection(SPOT_DRAFTS);
        let existing = coll.find_one(doc! { "_id": id }).await?;
        let name = args.name.trim().to_owned();
        let created = if existing.is_some() {
            false
        } else {
            guard_write(ctx, self.writes_per_hour, Self::NAME).await?;
            let opt = |s: &Option<String>| {
                s.as_deref()
                    .map(str::trim)
                    .map_or(Bson::Null, |v| Bson::String(v.to_owned()))
            };
            let draft = doc! {
                "_id": id,
                "name": &name,
                "type": args.kind.as_str(),
                "latitude": coords.map_or(Bson::Null, |c| Bson::Double(c.0)),
                "longitude": coords.map_or(Bson::Null, |c| Bson::Double(c.1)),
                "city": opt(&args.city),
                "state": opt(&args.state),
                "country": opt(&args.country),
                "description": opt(&args.description),
                "mapsUrl": opt(&args.maps_url),
                "coordinatesSource": source,
                "needsCoordinates": coords.is_none(),
                "shortLinkUnresolved": short_unresolved,
                "submittedBy": ctx.user.to_hex(),
                "submittedVia": ctx.character,
                "createdBy": ctx.character,
                "botId": ctx.bot.to_hex(),
                "conversationId": ctx.conversation.to_hex(),
                "status": "pending_approval",
                "createdAt": bson::DateTime::from_chrono(ctx.clock.now),
                "sourceMessageId": ctx.message_id,
                "toolCallId": &ctx.call.id,
            };
            match coll.insert_one(draft).await {
                Ok(_) => true,
                Err(e) if is_duplicate_key(&e) => false,
                Err(e) => return Err(e.into()),
            }
        };
        let data = json!({
            "_id": id.to_hex(),
            "name": name,
            "status": "pending_approval",
            "latitude": coords.map(|c| c.0),
            "longitude": coords.map(|c| c.1),
            "needsCoordinates": coords.is_none(),
            "note": if short_unresolved {
                Some("the short maps link could not be resolved, so the draft has no coordinates yet; a moderator will add them (or ask the user for the full link)")
            } else if coords.is_none() {
                Some("no coordinates were given; a moderator will need to locate the spot")
            } else { None },
            "created": created,
        });
        let card = json!({ "type": "spot_draft_confirmation", "data": {
            "_id": id.to_hex(), "name": data["name"], "city": args.city, "state": args.state,
            "status": "pending_approval",
        } });
        Ok(ToolOutput::with_card(data, Some(card)))
    }
}

/// Where a spot is: its coordinates (latitude, longitude) if known, where they came from (`manual`,
/// `maps_url`, `none`), and whether a short maps link could not be resolved.
type Located = (Option<(f64, f64)>, &'static str, bool);

/// Where the spot is: coordinates given (both or neither), else those of the maps link.
fn coordinates(args: &Args) -> Result<Located, ToolError> {
    let link = match args.maps_url.as_deref() {
        Some(u) => Some(maps::parse(u).map_err(|e| ToolError::invalid("mapsUrl", e.to_string()))?),
        None => None,
    };
    let manual = match (args.latitude, args.longitude) {
        (Some(lat), Some(lng)) => Some((lat, lng)),
        (None, None) => None,
        (Some(_), None) => {
            return Err(ToolError::invalid("longitude", "is required with latitude"));
        }
        (None, Some(_)) => {
            return Err(ToolError::invalid("latitude", "is required with longitude"));
        }
    };
    let (coords, source) = match (manual, link.as_ref().and_then(|l| l.coords)) {
        (Some(c), _) => (Some(c), "manual"),
        (None, Some(c)) => (Some(c), "maps_url"),
        (None, None) => (None, "none"),
    };
    let short_unresolved = link.as_ref().is_some_and(|l| l.short) && coords.is_none();
    Ok((coords, source, short_unresolved))
}
