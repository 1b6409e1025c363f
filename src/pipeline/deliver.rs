//! Stage 8: a fixed companion message goes out, the one path of every message. First, unless the message
//! is owed whatever happens, whether a moderator paused the conversation or a message it answers was
//! deleted meanwhile (then nothing is written): read with the reply's record, whose statement also writes
//! the history rows (the user messages it answers, then its own) when it finds the way clear. Then the
//! dm_messages document, the history rows if not written yet, the conversation's last message, the
//! completion event (a message
//! private to one user, a referral in a group, skips the shared history and the preview). Every step is
//! keyed by the message's slot in its reply generation and safe to repeat; they are recorded with the
//! job's next record or its end, or at once when another message of the job follows. Once it is out, the
//! tombstones are read again: a deletion that committed after the turn's last check withdraws the
//! document and the completion (docs/memory.md, "While a turn runs").

use bson::oid::ObjectId;
use chrono::{DateTime, Utc};
use tracing::{debug, warn};

use super::{
    Burst, PipelineError, Reply,
    input::{Admitted, Answered, UserMessage},
};
use crate::parts::Parts;
use crate::{
    bus::{Bus, Completion, Trigger},
    journal::{
        Job, Ride, StepKind,
        names::key::{self, Slot},
    },
    metrics::Metric,
    store::{self, BeforeDelivery, DM_MESSAGES, Mongo, NewHistory, Pg, ReplyDoc},
    timing::{Stage, stage},
};

/// Delivering a message, step by step, each keyed by the message's reply key (a crisis referral's by
/// [`key::crisis`]): the dm_messages document (whether this attempt inserted it)…
pub(crate) const STORE_REPLY: StepKind<bool> = StepKind::new("store_reply")
    .packed()
    .says(|_| told("delivered: the message stored in dm_messages"));
/// …the history rows (keyed [`key::USER`]: the user's message kept in history without an answer of its
/// own)…
pub(crate) const HISTORY: StepKind<()> = StepKind::new("history").packed().says(|t| {
    told(match t.key == key::USER {
        true => "kept in history without an answer of its own",
        false => "delivered: history written",
    })
});
/// …the conversation's last message…
pub(crate) const TOUCH: StepKind<()> = StepKind::new("touch")
    .packed()
    .says(|_| told("delivered: the conversation's last message updated"));
/// …and the completion event (its stream sequence; none when recorded before it was kept).
pub const PUBLISH: StepKind<Option<u64>> = StepKind::new("publish")
    .packed()
    .says(|_| told("delivered: completion published"));
/// A message withdrawn after it went out: a deletion committed between the turn's last check and the
/// completion ([`Delivery::check_sent`]); whether the document and the completion were removed.
pub(crate) const WITHDRAW: StepKind<(bool, bool)> =
    StepKind::new("withdraw").says(|_| told("WITHDRAWN after it went out (deleted meanwhile)"));

/// A delivery step told: what it did, no fields.
fn told(says: &str) -> crate::journal::Telling {
    (says.to_owned(), serde_json::json!({}))
}

/// The writer of stage 8: what a message is written to and announced on.
#[derive(Clone)]
pub(crate) struct Delivery {
    /// The message's document and its conversation's last message.
    pub(crate) mongo: Mongo,
    /// History rows, and the tombstones read after a message is out.
    pub(crate) pg: Pg,
    /// The completion event (and its removal when a message is withdrawn).
    pub(crate) bus: Bus,
}

impl Delivery {
    /// Stage 8 from the shared handles.
    pub(crate) fn new(p: &Parts) -> Self {
        Self {
            mongo: p.mongo.clone(),
            pg: p.pg.clone(),
            bus: p.bus.clone(),
        }
    }
}

/// Where a fixed message goes and what it answers.
pub(crate) struct Address<'a> {
    pub(crate) conversation: ObjectId,
    /// The companion speaking.
    pub(crate) bot: ObjectId,
    /// The user it speaks to.
    pub(crate) user: ObjectId,
    pub(crate) answers: Answers,
    /// History rows of the user messages answered, stored before the message's own.
    pub(crate) user_rows: Vec<NewHistory<'a>>,
    /// Later messages of a burst the message answers too.
    pub(crate) covers: Vec<String>,
    /// The key of its delivery steps (`g<generation>`, or `g<generation>.<n>` in a group).
    pub(crate) key: String,
    /// More follows within the job (a referral, a group's message before the next companion's): its
    /// steps are recorded as soon as it is out, not with the job's next record, so that a crash from
    /// there on never sends it again.
    pub(crate) more: bool,
    /// Its history rows were written with its record ([`Delivery::before_ride`]): its history step has
    /// nothing left to write.
    pub(crate) written: bool,
}

/// What a message answers.
pub(crate) enum Answers {
    /// A DM (`inReplyTo`).
    Dm(ObjectId),
    /// A group message: it is one of its answers (`respondsTo`); its history rows go to the group's
    /// window.
    Group(ObjectId),
    /// A follow-up's news (`proactive: true` and the trigger in the completion).
    News(Trigger),
    /// The user message a crisis referral is for; `group` when it was a group's.
    Referral { message: ObjectId, group: bool },
}

impl Answers {
    fn in_reply_to(&self) -> Option<ObjectId> {
        match self {
            Self::Dm(id) => Some(*id),
            _ => None,
        }
    }

    fn responds_to(&self) -> Option<ObjectId> {
        match self {
            Self::Group(id) | Self::Referral { message: id, .. } => Some(*id),
            _ => None,
        }
    }

    fn trigger(&self) -> Option<&Trigger> {
        match self {
            Self::News(t) => Some(t),
            _ => None,
        }
    }

    /// A group conversation's message.
    fn group(&self) -> bool {
        match self {
            Self::Group(_) => true,
            Self::Referral { group, .. } => *group,
            _ => false,
        }
    }
}

impl Delivery {
    /// Delivers the message `said` of `slot`, unless (`how.check`) a moderator paused the conversation or
    /// a message it answers was deleted meanwhile: read when it is about to be written, so a pause holds
    /// on every worker at once and a deletion that came while the model answered stops it.
    pub(crate) async fn deliver(
        &self,
        job: &Job,
        a: &Admitted<'_>,
        slot: Slot,
        burst: &Burst,
        said: &Reply,
        how: How,
    ) -> Result<Delivered, PipelineError> {
        // Read with the reply's record when it was recorded just now ([`Delivery::before_ride`]).
        let ridden = job
            .carried()
            .take_ridden(&slot.reply(job.record.generation))
            .and_then(|v| store::before_delivery_of(&v));
        // Only a checked message has a ride; the crisis line writes its history after its document.
        let written = if how.check {
            let checked = match ridden {
                Some(checked) => checked,
                None => self.before(a, burst, said).await?,
            };
            // A deletion stops it; a pause, unless a check before (an earlier attempt's, with the
            // reply's record) found the way clear and wrote its history: that delivery goes on.
            if checked.deleted {
                return Ok(Delivered::Deleted);
            }
            if checked.paused && !checked.written {
                return Ok(Delivered::Paused);
            }
            checked.written
        } else {
            false
        };
        let answered = a.answered(burst);
        let key = slot.reply(job.record.generation);
        let mut out = self.address(a, key, burst, said, &answered, how.more)?;
        out.written = written;
        let delivered = self.write_reply(job, &out, said).await?;
        debug!(reply_id = %said.id, bot = %out.bot, key = %out.key, ?delivered, "message delivered");
        Ok(delivered)
    }

    /// Where the message `said` goes and what it answers (`answered`: the job's user messages it answers,
    /// [`Admitted::answered`]), its steps keyed `key`.
    fn address<'a>(
        &self,
        a: &'a Admitted<'_>,
        key: String,
        burst: &Burst,
        said: &Reply,
        answered: &'a [Answered],
        more: bool,
    ) -> Result<Address<'a>, PipelineError> {
        let bot = match &said.bot {
            Some(b) => ObjectId::parse_str(b).map_err(|_| PipelineError::BadReplyId(b.clone()))?,
            None => a.members[0].bot,
        };
        let answers = a.kind.answers();
        Ok(Address {
            conversation: a.ids.conversation_id,
            bot,
            user: a.ids.user_id,
            answers,
            user_rows: user_rows(a, answered, said.at),
            covers: burst.covers.iter().map(|c| c.message_id.clone()).collect(),
            key,
            more,
            written: false,
        })
    }

    /// The check before delivery as a read that rides with the reply's record, made from the reply: one
    /// round trip earlier than a read of its own, and after the model answered. When it finds the way
    /// clear, the reply's history (the user messages it answers, then its own) is written in that
    /// statement too, unless the reply is private to its user. A deletion or a pause that commits in
    /// that round trip is what the later checks catch anyway (the history write's filter under its locks
    /// and the read after delivery; the next turn's gate).
    pub(crate) fn before_ride(
        &self,
        job: &Job,
        a: &Admitted<'_>,
        slot: Slot,
        burst: &Burst,
        said: &Reply,
    ) -> Ride {
        let answered = a.answered(burst);
        let ids: Vec<String> = answered.iter().map(|m| m.message.clone()).collect();
        let key = slot.reply(job.record.generation);
        let history = match self.address(a, key, burst, said, &answered, false) {
            Ok(out) if !said.marks.is_private() => {
                let parties = Parties::of(&out);
                crate::store::history_arg(&history_rows(&out, said, &parties))
            }
            // Private to its user, or a reply id that does not read (the delivery says so).
            _ => None,
        };
        Ride {
            sql: store::BEFORE_DELIVERY_WRITING_ON_5.as_str(),
            arg: store::before_delivery_arg(&a.ids.conversation, &a.ids.user, &ids, history),
        }
    }

    /// Whether a moderator paused the conversation, whether a message the job answers was deleted (or
    /// its user erased), and whether the history of `said` is written already.
    async fn before(
        &self,
        a: &Admitted<'_>,
        burst: &Burst,
        said: &Reply,
    ) -> Result<BeforeDelivery, PipelineError> {
        let answered: Vec<String> = a.answered(burst).into_iter().map(|m| m.message).collect();
        let (conversation, user) = (&a.ids.conversation, &a.ids.user);
        Ok(self
            .pg
            .before_delivery(conversation, user, &answered, &said.id)
            .await?)
    }

    /// Delivers the crisis referral fixed for the user message `m`, said by the conversation's (first)
    /// companion; a referral is never withdrawn.
    pub(crate) async fn deliver_referral(
        &self,
        job: &Job,
        a: &Admitted<'_>,
        m: &UserMessage<'_>,
        reply: &Reply,
    ) -> Result<(), PipelineError> {
        let out = Address {
            conversation: a.ids.conversation_id,
            bot: a.members[0].bot,
            user: m.sender,
            answers: Answers::Referral {
                message: m.id,
                group: a.kind.shared(),
            },
            user_rows: Vec::new(),
            covers: Vec::new(),
            key: key::crisis(&m.id.to_hex()),
            more: true,
            written: false,
        };
        let _ = self.write_reply(job, &out, reply).await?;
        Ok(())
    }

    /// The user's message (and its burst) kept in history without an answer of its own (over the flood
    /// limit, a group message nobody answers, a paused conversation): for the next real answer to see.
    pub(crate) async fn keep_unanswered(
        &self,
        job: &Job,
        a: &Admitted<'_>,
        burst: &Burst,
    ) -> Result<(), PipelineError> {
        let answered = a.answered(burst);
        let rows = user_rows(a, &answered, Utc::now());
        job.step(&HISTORY, key::USER)
            .lazy()
            .run(async {
                self.pg.append_history(&rows).await?;
                Ok::<_, PipelineError>(())
            })
            .await
    }

    /// On a retry that holds the job (a moderator paused the conversation since an earlier attempt): the
    /// history of a reply that attempt recorded, and wrote with its record ([`Delivery::before_ride`]),
    /// but never delivered (it has no document) goes, so that history holds only what was said.
    pub(crate) async fn unsay_undelivered(
        &self,
        job: &Job,
        a: &Admitted<'_>,
    ) -> Result<(), PipelineError> {
        if job.record.attempts < 2 {
            return Ok(());
        }
        let generation = job.record.generation;
        let slots = std::iter::once(Slot::Only).chain((0..a.members.len()).map(Slot::Nth));
        let mut undelivered = Vec::new();
        for slot in slots {
            let Some(reply) = job.recorded(&super::REPLY, &slot.reply(generation)) else {
                continue;
            };
            let Ok(id) = ObjectId::parse_str(&reply.id) else {
                continue;
            };
            if self.mongo.by_id(DM_MESSAGES, id).await?.is_none() {
                undelivered.push(reply.id);
            }
        }
        if !undelivered.is_empty() {
            let removed = crate::store::unwrite_history(&self.pg, &undelivered).await?;
            warn!(removed, replies = ?undelivered, "held on a retry: replies recorded but never delivered leave history");
        }
        Ok(())
    }

    /// Writes a fixed message, every step keyed by `out.key` and safe to repeat.
    pub(crate) async fn write_reply(
        &self,
        job: &Job,
        out: &Address<'_>,
        reply: &Reply,
    ) -> Result<Delivered, PipelineError> {
        let generation = out.key.as_str();
        let reply_id = ObjectId::parse_str(&reply.id)
            .map_err(|_| PipelineError::BadReplyId(reply.id.clone()))?;
        stage(Stage::Writes, self.write(job, out, reply, reply_id)).await?;
        let completion = completion_of(out, reply);
        // `None` when recorded before the sequence was kept.
        let seq: Option<u64> = stage(
            Stage::Publish,
            job.step(&PUBLISH, generation)
                .lazy_unless(out.more)
                .run(async {
                    // A job run before may have had its publish stored without the ack coming back.
                    if job.record.attempts > 1 {
                        match self.bus.lookup().stored_completion(&completion).await {
                            Ok(Some(seq)) => {
                                debug!(seq, "the completion was stored by an earlier attempt; not published again");
                                return Ok(Some(seq));
                            }
                            Ok(None) => {}
                            Err(e) => {
                                warn!(error = %e, "cannot look the completion up; publishing it (the stream drops a copy)")
                            }
                        }
                    }
                    Ok::<_, PipelineError>(Some(self.bus.publish_completion(&completion).await?))
                }),
        )
        .await?;
        if reply.marks.safety.is_some() {
            // A referral is never withdrawn: it is owed whatever is deleted.
            return Ok(Delivered::Out);
        }
        let sent = Sent {
            user: out.user.to_hex(),
            answered: out.answered_ids(),
            reply_id,
            bot: out.bot,
            seq,
            key: out.key.clone(),
        };
        // The job's last message: the check rides with the job's settlement.
        if !out.more {
            return Ok(Delivered::Owed(sent));
        }
        self.check_sent(job, &sent).await
    }

    /// The message's writes, each a step keyed by its reply key: its document, then (unless it is private
    /// to its user) its history rows and the conversation's last message.
    async fn write(
        &self,
        job: &Job,
        out: &Address<'_>,
        reply: &Reply,
        reply_id: ObjectId,
    ) -> Result<(), PipelineError> {
        let generation = out.key.as_str();
        let parties = Parties::of(out);
        job.step(&STORE_REPLY, generation)
            .lazy()
            .run(async {
                let inserted = self
                    .mongo
                    .insert_reply(&reply_doc(job, out, reply, reply_id))
                    .await?;
                if !inserted {
                    debug!("reply document already present");
                }
                Ok::<_, PipelineError>(inserted)
            })
            .await?;
        if reply.marks.is_private() {
            // Only its user sees it: not in the shared history, not the conversation's preview.
            return Ok(());
        }
        job.step(&HISTORY, generation)
            .lazy()
            .run(async {
                if !out.written {
                    self.pg
                        .append_history(&history_rows(out, reply, &parties))
                        .await?;
                }
                Ok::<_, PipelineError>(())
            })
            .await?;
        job.step(&TOUCH, generation)
            .lazy()
            .run(async {
                self.mongo
                    .touch_conversation(out.conversation, &reply.content, reply.at)
                    .await?;
                Ok::<_, PipelineError>(())
            })
            .await?;
        Ok(())
    }

    /// Whether a message it answers was deleted, or its user erased, since the message was checked
    /// before it went out: read again once it is out (document and completion written). A deletion that
    /// committed after the last check is seen here and withdraws it; one that commits after this read
    /// came after the message was out, like any deletion of a message already answered (and an
    /// erasure's purge of the streams, which follows its commit, finds the completion).
    pub(crate) async fn check_sent(
        &self,
        job: &Job,
        sent: &Sent,
    ) -> Result<Delivered, PipelineError> {
        if !self.pg.tombstoned(&sent.user, &sent.answered).await? {
            return Ok(Delivered::Out);
        }
        self.withdraw(job, sent).await?;
        Ok(Delivered::Withdrawn)
    }

    /// Removes a message that is out (its document and its completion), because a message it answers
    /// was deleted, or its user erased, after the turn's last check before it went out.
    pub(crate) async fn withdraw(&self, job: &Job, sent: &Sent) -> Result<(), PipelineError> {
        let (document, completion) = job
            .step(&WITHDRAW, sent.key.as_str())
            .counts(&WITHDRAWN, &[])
            .run(async {
                let document = self.mongo.withdraw_reply(sent.reply_id, sent.bot).await?;
                let completion = match sent.seq {
                    Some(seq) => self.bus.erase().delete_outbound(seq).await? > 0,
                    None => false,
                };
                Ok::<_, PipelineError>((document, completion))
            })
            .await?;
        warn!(
            reply_id = %sent.reply_id,
            document,
            completion,
            "a deletion came while the message went out: its document and completion are withdrawn"
        );
        Ok(())
    }
}

/// A message that is out, with what its withdrawal needs, and the user messages it answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Sent {
    pub(crate) user: String,
    /// The user messages it answers (their ids), whose deletion withdraws it.
    pub(crate) answered: Vec<String>,
    reply_id: ObjectId,
    bot: ObjectId,
    /// Its completion's sequence in the outbound stream (none: recorded before sequences were kept).
    seq: Option<u64>,
    /// Its steps' key.
    key: String,
}

/// Counts messages withdrawn after they went out, because a deletion committed meanwhile.
pub(crate) const WITHDRAWN: Metric = Metric::new(
    "companion_replies_withdrawn_total",
    "Counts messages withdrawn after they went out, because a deletion committed meanwhile",
);

/// How a slot's message goes out.
#[derive(Clone, Copy, Debug)]
pub(crate) struct How {
    /// Read first whether a moderator paused the conversation or a message it answers was deleted.
    pub(crate) check: bool,
    /// Another message of the job follows it (see [`Address::more`]).
    pub(crate) more: bool,
}

/// What became of a message [`Delivery::deliver`] was given.
#[derive(Clone, Debug, PartialEq, Eq)]
#[must_use]
pub(crate) enum Delivered {
    /// It is out.
    Out,
    /// It is out, the job's last message: the check for a deletion since it was read is owed to the
    /// job's settlement ([`crate::journal::Job::finish_unless_deleted`]), which withdraws it
    /// ([`Delivery::withdraw`]) when one came.
    Owed(Sent),
    /// Not written: a moderator paused the conversation.
    Paused,
    /// Not written: a message it answers was deleted (or its user erased) meanwhile.
    Deleted,
    /// A message it answers was deleted, or its user erased, after the turn's last check: its document
    /// and completion were removed again, and the turn ends as if the deletion had come first.
    Withdrawn,
}

impl Address<'_> {
    /// The user messages this message answers.
    fn answered_ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = self
            .user_rows
            .iter()
            .map(|r| r.message_id.to_owned())
            .chain(self.covers.iter().cloned())
            .chain(
                self.answers
                    .in_reply_to()
                    .iter()
                    .chain(&self.answers.responds_to())
                    .map(|id| id.to_hex()),
            )
            .collect();
        ids.sort_unstable();
        ids.dedup();
        ids
    }
}

/// The reply's document in `dm_messages`.
fn reply_doc(job: &Job, out: &Address<'_>, reply: &Reply, reply_id: ObjectId) -> ReplyDoc {
    ReplyDoc {
        id: reply_id,
        conversation_id: out.conversation,
        sender_id: out.bot,
        in_reply_to: out.answers.in_reply_to(),
        responds_to: out.answers.responds_to(),
        trigger: out
            .answers
            .trigger()
            .map(|t| (t.kind.clone(), t.id.clone())),
        content: reply.content.clone(),
        rich_content: reply.rich_content.clone(),
        timestamp: reply.at,
        generation: job.record.generation,
        marks: reply.marks.clone(),
    }
}

/// The completion event TB-Backend fans out for the reply.
fn completion_of(out: &Address<'_>, reply: &Reply) -> Completion {
    Completion {
        message_id: reply.id.clone(),
        in_reply_to: (out.answers.in_reply_to())
            .or(out.answers.responds_to())
            .map(|id| id.to_hex()),
        responds_to: out.answers.responds_to().map(|id| id.to_hex()),
        conversation_id: out.conversation.to_hex(),
        sender_id: out.bot.to_hex(),
        content: reply.content.clone(),
        rich_content: reply.rich_content.clone(),
        created_at: reply.at,
        covers: out.covers.clone(),
        proactive: out.answers.trigger().is_some(),
        trigger: out.answers.trigger().cloned(),
        marks: reply.marks.clone(),
    }
}

/// The ids of the parties of a message's address, as its history rows hold them.
struct Parties {
    user: String,
    bot: String,
    conversation: String,
}

impl Parties {
    fn of(out: &Address<'_>) -> Self {
        Self {
            user: out.user.to_hex(),
            bot: out.bot.to_hex(),
            conversation: out.conversation.to_hex(),
        }
    }
}

/// The history rows of message `reply` at `out`: the user messages it answers, then its own.
fn history_rows<'a>(
    out: &Address<'a>,
    reply: &'a Reply,
    parties: &'a Parties,
) -> Vec<NewHistory<'a>> {
    let mut rows = out.user_rows.clone();
    rows.push(NewHistory {
        user_id: &parties.user,
        bot_id: &parties.bot,
        conversation_id: &parties.conversation,
        role: "assistant",
        content: &reply.content,
        message_id: &reply.id,
        tool_calls: reply.tool_log.as_ref(),
        created_at: reply.at,
        group_chat: out.answers.group(),
        ai_disclosure: reply.marks.ai_disclosure,
    });
    rows
}

/// The history rows of the user messages answered at `answer_at`: each sorts before the answer even when
/// the client's clock is off.
fn user_rows<'a>(
    a: &'a Admitted<'_>,
    answered: &'a [Answered],
    answer_at: DateTime<Utc>,
) -> Vec<NewHistory<'a>> {
    answered
        .iter()
        .map(|m| NewHistory {
            user_id: &a.ids.user,
            bot_id: &a.ids.bot,
            conversation_id: &a.ids.conversation,
            role: "user",
            content: &m.text,
            message_id: &m.message,
            tool_calls: None,
            created_at: m.sent_at.min(answer_at - chrono::Duration::microseconds(1)),
            group_chat: a.kind.shared(),
            ai_disclosure: false,
        })
        .collect()
}
