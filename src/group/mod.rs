//! Group chats' one difference from a DM: who answers. A user's message to a conversation with several
//! companions is answered by the ones it is for ([`route`]); the conversation pipeline
//! ([`crate::pipeline`]) records the decision (step `route`) and lets each chosen companion speak in turn,
//! hand-overs included, like any companion message.

pub(crate) mod route;

use bson::oid::ObjectId;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tracing::info;

pub(crate) use route::{Bounds, Member, why};

use crate::{
    bus::GroupEvent,
    journal::{StepKind, Telling, Told},
    metrics::Metric,
    rag::Retriever,
    store::GroupLine,
    timing::{Stage, stage},
};

/// The kind of a group message's job.
pub(crate) const JOB_KIND: &str = "group";

/// Group messages handled, by route.
pub(crate) const MESSAGES: Metric = Metric::new(
    "companion_group_messages_total",
    "Group messages handled, by route",
);
/// Companion messages sent in groups.
pub(crate) const ANSWERS: Metric = Metric::new(
    "companion_group_answers_total",
    "Companion messages sent in groups",
);
/// Hand-overs from one companion to another.
pub(crate) const HANDOVERS: Metric = Metric::new(
    "companion_group_handovers_total",
    "Hand-overs from one companion to another",
);
/// Group messages no companion answered, by reason.
pub(crate) const SILENCES: Metric = Metric::new(
    "companion_group_silences_total",
    "Group messages no companion answered, by reason",
);

/// Why a group message gets no answer at all: a companion sent it (companions never answer each other
/// unprompted).
pub(crate) const COMPANION_SENDER: &str = "companion_sender";

/// Who answers a group message, and why. Keyed once.
pub(crate) const ROUTE: StepKind<Route> = StepKind::new("route").told(tell_route);

fn tell_route(t: &Told<'_>, r: &Route) -> Telling {
    let who: Vec<String> = r.speakers.iter().map(|b| t.name(b)).collect();
    let who = match who.is_empty() {
        true => "nobody".into(),
        false => who.join(", "),
    };
    (
        format!("route: {who} (why: {})", r.why),
        json!({ "speakers": r.speakers, "why": r.why }),
    )
}

/// The `route` step's record: who answers the message, in order, and why.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct Route {
    /// Bot user ids (hex) of the companions that answer first.
    pub(crate) speakers: Vec<String>,
    /// One of [`route::why`].
    pub(crate) why: String,
}

impl Route {
    /// The route's speakers that are still companions of the group.
    pub(crate) fn speakers_among(&self, members: &[Member<'_>]) -> Vec<ObjectId> {
        self.speakers
            .iter()
            .filter_map(|s| ObjectId::parse_str(s).ok())
            .filter(|b| members.iter().any(|m| m.bot == *b))
            .collect()
    }
}

/// The route of a message: the companions it names, nobody for an acknowledgement, else the best fit
/// (or the last speaker, when none fits clearly better). `margin` is how much better a fit must be to
/// take the floor from the last speaker.
pub(crate) async fn decide(
    retriever: &Retriever,
    event: &GroupEvent,
    members: &[Member<'_>],
    history: &[GroupLine],
    margin: f32,
) -> Route {
    let hex = |ids: &[ObjectId]| ids.iter().map(|b| b.to_hex()).collect::<Vec<_>>();
    let named = route::named(&event.content, members);
    if !named.is_empty() {
        return Route {
            speakers: hex(&named),
            why: why::MENTION.into(),
        };
    }
    if route::is_acknowledgement(&event.content) && event.images.is_empty() {
        return Route {
            speakers: Vec::new(),
            why: why::ACKNOWLEDGEMENT.into(),
        };
    }
    let last_speaker = history
        .iter()
        .rev()
        .find(|l| l.role == "assistant")
        .and_then(|l| ObjectId::parse_str(&l.bot_id).ok())
        .filter(|b| members.iter().any(|m| m.bot == *b));
    let profiles: Vec<String> = members.iter().map(Member::profile).collect();
    let scores = stage(
        Stage::Embed,
        retriever.similarities(&event.content, &profiles),
    )
    .await;
    let (bot, why) = match scores {
        Some(s) if members.len() > 1 => {
            let scored: Vec<(ObjectId, f32)> = members
                .iter()
                .map(|m| m.bot)
                .zip(s.iter().copied())
                .collect();
            info!(
                scores = %members
                    .iter()
                    .zip(&s)
                    .map(|(m, s)| format!("{} {s:.3}", m.character.id))
                    .collect::<Vec<_>>()
                    .join(", "),
                "fit of the group's companions"
            );
            route::best_fit(&scored, last_speaker, margin).unwrap_or((members[0].bot, why::DEFAULT))
        }
        _ => (last_speaker.unwrap_or(members[0].bot), why::DEFAULT),
    };
    Route {
        speakers: vec![bot.to_hex()],
        why: why.into(),
    }
}

/// A model writing `Kaori: hey` in a group (it sees others' lines that way) loses the prefix.
pub(crate) fn strip_own_name<'s>(text: &'s str, name: &str) -> &'s str {
    text.strip_prefix(name)
        .and_then(|t| t.strip_prefix(':'))
        .map(str::trim_start)
        .unwrap_or(text)
}
