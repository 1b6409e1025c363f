//! A spot draft's review reaches the user: TB-Backend (or the admin tool) publishes
//! `{ "draftId", "status": "approved" | "rejected", "spotId"?, "note"?, "reviewedAt" }` on
//! `<prefix>.signal.spot_draft.<draftId>` with `Nats-Msg-Id: <draftId>:<status>`, after storing the status
//! on the draft. The companion that made the draft tells the user in the DM thread it came from: an
//! approval with the spot's card, a rejection with the moderator's note.
//!
//! MongoDB is the truth: the draft must exist and be a companion's (`botId`, or `createdBy`/`submittedVia`
//! naming one), else the signal is dead-lettered; a status not stored yet is retried; a signal whose
//! status the draft no longer has (reviewed again since) is dropped as stale.

use bson::{Bson, Document, doc, oid::ObjectId};
use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::{Value, json};

use super::{Found, News, ProactiveError, SignalBody, Sources, Thread, invalid};
use crate::{
    bus::event::parse_object_id,
    character::{Character, fill},
    store::{SPOT_DRAFTS, SPOTS},
};

/// The trigger kind of a review's follow-up.
pub(crate) const KIND: &str = "spot_review";
/// Longest moderator's note passed on; a longer one is cut.
pub(crate) const NOTE_MAX: usize = 1000;

/// The signal's body.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct SpotReview {
    pub(crate) draft_id: String,
    pub(crate) status: Status,
    #[serde(default)]
    pub(crate) spot_id: Option<String>,
    /// The moderator's reason (a rejection's, mostly).
    #[serde(default)]
    pub(crate) note: Option<String>,
    pub(crate) reviewed_at: DateTime<Utc>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Status {
    Approved,
    Rejected,
}

impl SignalBody for SpotReview {
    const WHAT: &'static str = "spot review";
    const ID_FIELD: &'static str = "draftId";
    fn id(&self) -> &str {
        &self.draft_id
    }
}

impl Status {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Approved => "approved",
            Self::Rejected => "rejected",
        }
    }
}

/// Reads the review and the draft it is about, and says what to tell whom.
pub(super) async fn follow_up(
    t: Sources<'_>,
    review: SpotReview,
) -> Result<Found<'_>, ProactiveError> {
    let draft_id = parse_object_id(&review.draft_id)
        .ok_or_else(|| invalid(format!("draftId `{}` is not an ObjectId", review.draft_id)))?;
    tracing::debug!(draft = %draft_id, status = review.status.as_str(), reviewed_at = %review.reviewed_at, "spot review");
    let draft = t
        .mongo
        .by_id(SPOT_DRAFTS, draft_id)
        .await?
        .ok_or_else(|| invalid(format!("no spot draft {draft_id}")))?;
    let (bot, character) = companion_of(t, &draft)
        .ok_or_else(|| invalid(format!("spot draft {draft_id} was not made by a companion")))?;
    let user = id_field(&draft, "submittedBy")
        .ok_or_else(|| invalid(format!("spot draft {draft_id} has no submittedBy user")))?;
    let conversation = match id_field(&draft, "conversationId") {
        Some(c) => c,
        None => t
            .mongo
            .direct_conversation(user, bot)
            .await?
            .ok_or_else(|| {
                invalid(format!(
                    "spot draft {draft_id}: no conversation between its user and {}",
                    character.name
                ))
            })?,
    };
    let stored = draft.get_str("status").unwrap_or("");
    let stale = match stored {
        s if s == review.status.as_str() => None,
        "approved" | "rejected" => Some(format!(
            "the draft is {stored} now, not {}: a later review tells the user",
            review.status.as_str()
        )),
        _ => {
            return Err(ProactiveError::NotYet(format!(
                "spot draft {draft_id} is still `{stored}` in MongoDB; the review is not stored yet"
            )));
        }
    };
    let name = draft.get_str("name").unwrap_or("your spot").to_owned();
    let note = review
        .note
        .as_deref()
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .map(|n| n.chars().take(NOTE_MAX).collect::<String>());
    let (brief, plain, card) = news(t, &review, &draft, character, &name, note.as_deref()).await?;
    let id = format!("{draft_id}:{}", review.status.as_str());
    let thread: Thread = (user, bot, conversation, character);
    Ok((id, thread, News::new(brief, plain, card, stale)))
}

/// What the companion is briefed with, its plain line should the model fail, and the card, for a
/// review: the approved spot's card, or the moderator's note passed on.
async fn news(
    t: Sources<'_>,
    review: &SpotReview,
    draft: &Document,
    character: &Character,
    name: &str,
    note: Option<&str>,
) -> Result<(String, String, Option<Value>), ProactiveError> {
    Ok(match review.status {
        Status::Approved => {
            let spot = id_field(draft, "spotId")
                .or_else(|| review.spot_id.as_deref().and_then(parse_object_id));
            let card = match spot {
                Some(id) => Some(spot_card(t, id, draft).await?),
                None => {
                    tracing::warn!("approved spot draft names no spotId; the message has no card");
                    None
                }
            };
            let brief = format!(
                "[Not a reply: you are following up on your own.] The TrickBook moderators approved the spot \
                 \"{name}\" that you submitted for the user{}. It is live on TrickBook now, and the app shows \
                 its card under your message. Write the user one short DM, in character, telling them the \
                 good news.",
                when(draft)
            );
            let plain = fill(&character.follow_ups.spot_approved, &[("spot", name)]);
            (brief, plain, card)
        }
        Status::Rejected => {
            let said = note
                .map(|n| format!(" The moderator's note: \"{n}\"."))
                .unwrap_or_else(|| " The moderator left no note.".to_owned());
            let brief = format!(
                "[Not a reply: you are following up on your own.] The TrickBook moderators did not approve \
                 the spot \"{name}\" that you submitted for the user{}.{said} Write the user one short DM, \
                 in character and kindly, telling them, passing on the note if there is one, and offering \
                 to fix the draft and submit it again.",
                when(draft)
            );
            let note_part = note
                .map(|n| format!(" Moderator's note: {n}"))
                .unwrap_or_default();
            let plain = fill(
                &character.follow_ups.spot_rejected,
                &[("spot", name), ("note", &note_part)],
            );
            (brief, plain, None)
        }
    })
}

/// The companion that made the draft: its bot id, or the character its `createdBy`/`submittedVia` names.
fn companion_of<'t>(
    t: Sources<'t>,
    draft: &Document,
) -> Option<(ObjectId, &'t crate::character::Character)> {
    if let Some(bot) = id_field(draft, "botId") {
        return t.characters.by_bot(&bot).map(|c| (bot, c));
    }
    ["createdBy", "submittedVia"]
        .iter()
        .filter_map(|f| draft.get_str(f).ok())
        .find_map(|name| t.characters.by_name(name))
}

/// An id stored as an ObjectId or as its hex.
fn id_field(d: &Document, field: &str) -> Option<ObjectId> {
    match d.get(field)? {
        Bson::ObjectId(id) => Some(*id),
        Bson::String(s) => parse_object_id(s),
        _ => None,
    }
}

/// " on <date>" of the draft's creation, when known.
fn when(draft: &Document) -> String {
    draft
        .get_datetime("createdAt")
        .map(|d| format!(" on {}", d.to_chrono().format("%B %-d")))
        .unwrap_or_default()
}

/// The `spot_card` of the approved spot (`ck_spots`), or of the draft's fields if the spot cannot be read.
async fn spot_card(
    t: Sources<'_>,
    id: ObjectId,
    draft: &Document,
) -> Result<Value, ProactiveError> {
    let spot = t.mongo.by_id(SPOTS, id).await?;
    let from = spot.as_ref().unwrap_or(draft);
    let text = |f: &str| from.get_str(f).ok().map(str::to_owned);
    let rating = from.get("rating").and_then(|r| match r {
        Bson::Double(x) => Some(json!(x)),
        Bson::Int32(x) => Some(json!(x)),
        Bson::Int64(x) => Some(json!(x)),
        _ => None,
    });
    Ok(json!({ "type": "spot_card", "data": {
        "_id": id.to_hex(),
        "name": text("name"),
        "city": text("city"),
        "state": text("state"),
        "rating": rating,
        "imageUrl": text("imageUrl"),
        "deepLink": format!("trickbook://spot/{}", id.to_hex()),
    } }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_review_reads_with_and_without_its_optional_fields() {
        let r: SpotReview = serde_json::from_str(
            r#"{"draftId":"6650f1a2b3c4d5e6f7a8c001","status":"approved","spotId":"6650f1a2b3c4d5e6f7a8c002","reviewedAt":"2026-11-23T10:00:00Z","extra":1}"#,
        )
        .unwrap();
        assert_eq!(r.status, Status::Approved);
        assert_eq!(r.spot_id.as_deref(), Some("6650f1a2b3c4d5e6f7a8c002"));
        let r: SpotReview = serde_json::from_str(
            r#"{"draftId":"6650f1a2b3c4d5e6f7a8c001","status":"rejected","note":"blurry","reviewedAt":"2026-11-23T10:00:00Z"}"#,
        )
        .unwrap();
        assert_eq!(
            (r.status, r.note.as_deref()),
            (Status::Rejected, Some("blurry"))
        );
        for bad in [
            r#"{"draftId":"x","status":"maybe","reviewedAt":"2026-11-23T10:00:00Z"}"#,
            r#"{"draftId":"6650f1a2b3c4d5e6f7a8c001","status":"approved"}"#,
        ] {
            assert!(serde_json::from_str::<SpotReview>(bad).is_err(), "{bad}");
        }
    }
}
