//! The two places every message passes, whatever its path: every incoming user message, before any
//! limit or model call can skip it ([`Turns::incoming`]), and every outgoing companion message, before
//! it is fixed in the journal and written ([`Turns::outgoing`]). Checks that must hold for every
//! message stand here and nowhere else.

use bson::oid::ObjectId;
use tracing::debug;

use super::{Reply, Turns};
use crate::{bus::event::clean_text, tools::clip};

/// User messages seen by the incoming hook, by kind (`dm`, `group`).
pub const INCOMING: &str = "companion_user_messages_total";

/// A user's message as the incoming hook sees it.
pub struct UserMessage<'a> {
    /// `dm` or `group`.
    pub kind: &'static str,
    pub id: ObjectId,
    pub sender: ObjectId,
    pub text: &'a str,
    pub images: &'a [String],
}

impl Turns {
    /// Sees every user message a job takes in: a DM or a group message once its job is open, each later
    /// message of a burst as the burst is fixed. This runs before the flood limit, the spend budget, a
    /// burst's coverage or a group's routing can skip the message, so a limited, covered or unanswered
    /// message is seen all the same (and a retried attempt sees it again).
    pub(crate) fn incoming(&self, m: &UserMessage<'_>) {
        debug!(kind = m.kind, message = %m.id, sender = %m.sender, chars = m.text.chars().count(),
               images = m.images.len(), "user message in");
        self.metrics.inc(INCOMING, &format!("kind=\"{}\"", m.kind));
    }

    /// Sees every companion message before it is fixed and written, whoever wrote it (the model, or the
    /// character's busy, budget, failure or plain line): without control characters, trimmed, and at
    /// most `COMPANION_MAX_REPLY_CHARS` long.
    pub(crate) fn outgoing(&self, mut reply: Reply) -> Reply {
        reply.content = self.outgoing_text(&reply.content);
        reply
    }

    /// The text of a companion message as the outgoing hook lets it out.
    pub(crate) fn outgoing_text(&self, text: &str) -> String {
        clip(clean_text(text).trim(), self.config.max_reply_chars.max(1))
    }
}
