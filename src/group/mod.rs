//! Group chats: a user's message to a conversation with several companions, answered by the ones it
//! is for ([`route`]), each in character and seeing the same group history, one at a time and in
//! order. One job of the journal per user message (kind `group`):
//!
//! | step | key | what it records |
//! |---|---|---|
//! | `route` | | who answers and why: the companions named, the best fit, the last speaker, or nobody |
//! | `flood` | | the flood decision, as for a DM (the busy line comes from the first companion routed) |
//! | `llm`, `tool`, `quota` | `<n>.`… | the n-th companion message's model answers and tool calls |
//! | `reply` | `g<generation>.<n>` | the n-th companion message: who, what, and whom it hands over to |
//! | `store_reply`, `history`, `touch`, `publish` | `g<generation>.<n>` | delivering it |
//!
//! Who speaks next is a function of the route and the recorded messages ([`route::next_speaker`]), so a
//! retry after a crash between two companions' messages sends the second and never the first again,
//! and hand-overs never exceed their bound however often the message is delivered. A message sent by a
//! companion is never answered: companions only speak for a user message, or when tagged by a
//! companion answering one.

pub mod route;

use std::collections::HashMap;

use bson::oid::ObjectId;
use chrono::Utc;
use serde::{Deserialize, Serialize};
use tracing::{debug, info};

use crate::{
    bus::{DmEvent, GroupEvent, Typing},
    journal::{Job, NewJob, State},
    llm::{LlmError, Message},
    store::{
        mongo::{GroupAdmission, UserData},
        pg::{GroupLine, NewHistory},
    },
    timing::{Stage, stage},
    turn::{
        Delivery, Outcome, Outgoing, Reply, Settled, TurnError, Turns, already_settled,
        generation_key,
        prompt::{self, PromptContext},
        within,
    },
};
use route::{Bounds, Member, why};

/// The kind of a group message's job.
pub const JOB_KIND: &str = "group";

/// Group messages handled, by route.
const MESSAGES: &str = "companion_group_messages_total";
/// Companion messages sent in groups.
const ANSWERS: &str = "companion_group_answers_total";
/// Hand-overs from one companion to another.
const HANDOVERS: &str = "companion_group_handovers_total";
/// Group messages no companion answered, by reason.
const SILENCES: &str = "companion_group_silences_total";

/// The `route` step: who answers the message, in order, and why.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Route {
    /// Bot user ids (hex) of the companions that answer first.
    pub speakers: Vec<String>,
    /// One of [`route::why`].
    pub why: String,
}

/// The `reply` step of a group: one companion's message.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GroupReply {
    /// The companion speaking (bot user id, hex).
    pub bot: String,
    pub reply: Reply,
    /// The companion its text names, which it hands over to (bounds permitting).
    pub tags: Option<String>,
    /// A budget line or a busy line: nobody speaks after it.
    #[serde(default)]
    pub last: bool,
}

/// A group message, admitted: the sender's data and the group's companions.
struct Admitted<'a> {
    user: UserData,
    members: Vec<Member<'a>>,
    /// Every participant, for display names.
    participants: Vec<ObjectId>,
}

/// Runs one validated group message to completion; the counterpart of [`Turns::run_delivered`].
pub async fn run(
    turns: &Turns,
    event: &GroupEvent,
    delivery: Option<&Delivery<'_>>,
) -> Result<Settled, TurnError> {
    let secs = turns.config.turn_timeout_secs.max(1);
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(secs);
    let work = async {
        let admitted = stage(Stage::Admit, admit(turns, event)).await?;
        let ids = Ids::of(event);
        let job = stage(
            Stage::Journal,
            turns.journal.open(&ids.job(delivery.map(|d| d.seq))),
        )
        .await?;
        if let Some(settled) = already_settled(&job) {
            info!(state = ?job.record.state, "group message already settled; acknowledging");
            return Ok(settled);
        }
        let result = answer(turns, &job, event, &ids, &admitted).await;
        job.keep_successes(result).await
    };
    within(deadline, secs, work).await
}

/// The conversation exists and has the sender; its companions are the participants with a character.
async fn admit<'t>(turns: &'t Turns, event: &GroupEvent) -> Result<Admitted<'t>, TurnError> {
    match turns
        .mongo
        .admit_group(
            event.conversation_id,
            event.sender_id,
            prompt::PROMPT_TRICKLISTS,
        )
        .await?
    {
        GroupAdmission::Missing => Err(TurnError::MissingConversation(
            event.conversation_id.to_hex(),
        )),
        GroupAdmission::NotParticipant => {
            Err(TurnError::NotParticipant(event.conversation_id.to_hex()))
        }
        GroupAdmission::Admitted { user, participants } => {
            let members: Vec<Member<'t>> = participants
                .iter()
                .filter_map(|p| {
                    turns
                        .characters
                        .by_bot(p)
                        .map(|character| Member { bot: *p, character })
                })
                .collect();
            if members.is_empty() {
                return Err(TurnError::NoCompanion(event.conversation_id.to_hex()));
            }
            Ok(Admitted {
                user: *user,
                members,
                participants,
            })
        }
    }
}

async fn answer(
    turns: &Turns,
    job: &Job,
    event: &GroupEvent,
    ids: &Ids,
    admitted: &Admitted<'_>,
) -> Result<Settled, TurnError> {
    let members = &admitted.members;
    if members.iter().any(|m| m.bot == event.sender_id) {
        return silence(turns, job, ids, event, "companion_sender", false).await;
    }
    let history = turns
        .pg
        .group_history(&ids.conversation, turns.config.history_limit)
        .await?;
    let route = job
        .step("route", "")
        .run(decide_route(turns, event, members, &history))
        .await?;
    let speakers: Vec<ObjectId> = route
        .speakers
        .iter()
        .filter_map(|s| ObjectId::parse_str(s).ok())
        .filter(|b| members.iter().any(|m| m.bot == *b))
        .collect();
    let Some(first) = speakers.first().copied() else {
        return silence(turns, job, ids, event, &route.why, true).await;
    };
    let flood = job
        .step("flood", "")
        .lazy()
        .run(turns.decide_flood(job, &ids.sender, &first.to_hex()))
        .await?;
    if let Some(by) = flood.by.as_deref()
        && by != ids.message
    {
        write_user_row(turns, job, event, ids).await?;
        job.settle(State::Limited, Some(by)).await?;
        info!(answered_by = %by, "over the flood limit; the busy line already answered this minute");
        return Ok(Settled {
            outcome: Outcome::Limited { reply_id: None },
            through_seq: None,
        });
    }
    let busy = flood.by.is_some();
    let names = display_names(turns, admitted).await;
    let bounds = Bounds {
        max_handovers: turns.config.group_max_handovers,
        max_messages: turns.config.group_max_messages.max(1),
    };
    let generation = generation_key(job);
    let mut said: Vec<GroupReply> = Vec::new();
    let mut fresh = false;
    loop {
        let n = said.len();
        let key = format!("{generation}.{n}");
        let recorded = job.recorded::<GroupReply>("reply", &key);
        let next = match &recorded {
            Some(r) => ObjectId::parse_str(&r.bot).ok().map(|bot| route::Next {
                bot,
                handed_over: false,
            }),
            None if said.last().is_some_and(|r| r.last) => None,
            None => {
                let so_far: Vec<(ObjectId, Option<ObjectId>)> = said
                    .iter()
                    .filter_map(|r| {
                        let bot = ObjectId::parse_str(&r.bot).ok()?;
                        Some((
                            bot,
                            r.tags.as_deref().and_then(|t| ObjectId::parse_str(t).ok()),
                        ))
                    })
                    .collect();
                route::next_speaker(&speakers, &so_far, bounds)
            }
        };
        let Some(next) = next else { break };
        let Some(member) = members.iter().find(|m| m.bot == next.bot).copied() else {
            break;
        };
        let reply = match recorded {
            Some(r) => r,
            None => {
                // The messages before are recorded as delivered before another companion starts: a
                // crash from here on never sends them (or their completions) again.
                job.flush().await?;
                fresh = true;
                if next.handed_over {
                    turns.metrics.inc(HANDOVERS, "");
                    info!(to = %member.character.id, "handed over by the companion before");
                }
                let typing = Typing {
                    conversation_id: ids.conversation.clone(),
                    sender_id: member.bot.to_hex(),
                    typing: true,
                    at: Utc::now(),
                };
                if let Err(e) = stage(Stage::Publish, turns.bus.publish_typing(&typing)).await {
                    debug!(error = %e, "typing indicator not sent");
                }
                let speak = Speaker {
                    turns,
                    job,
                    event,
                    member,
                    admitted,
                    names: &names,
                    history: &history,
                    said: &said,
                    slot: n,
                };
                job.step("reply", &key)
                    .run(async {
                        if busy && n == 0 {
                            let line = member.character.busy_line.clone();
                            return Ok(GroupReply {
                                bot: member.bot.to_hex(),
                                reply: Reply::new(line, None, None),
                                tags: None,
                                last: true,
                            });
                        }
                        speak.respond().await
                    })
                    .await?
            }
        };
        deliver(turns, job, event, ids, &reply, &key).await?;
        said.push(reply);
    }
    let state = if busy { State::Limited } else { State::Done };
    let by = busy.then_some(ids.message.as_str());
    if !stage(Stage::Writes, job.settle(state, by)).await? {
        debug!("the group message was settled elsewhere meanwhile");
    }
    if fresh {
        turns
            .metrics
            .inc(MESSAGES, &format!("route=\"{}\"", route.why));
        turns.metrics.add(ANSWERS, "", said.len() as u64);
    }
    info!(
        route = %route.why,
        messages = said.len(),
        speakers = %said.iter().map(|r| r.bot.as_str()).collect::<Vec<_>>().join(","),
        "group message answered"
    );
    let reply_id = said.last().map(|r| r.reply.id.clone());
    Ok(Settled {
        outcome: match (busy, reply_id) {
            (true, reply_id) => Outcome::Limited { reply_id },
            (false, Some(reply_id)) => Outcome::Answered { reply_id },
            (false, None) => Outcome::Silent {
                reason: "no companion left to speak".into(),
            },
        },
        through_seq: None,
    })
}

/// The route of a message without one: the companions it names, nobody for an acknowledgement, else
/// the best fit (or the last speaker, when none fits clearly better).
async fn decide_route(
    turns: &Turns,
    event: &GroupEvent,
    members: &[Member<'_>],
    history: &[GroupLine],
) -> Result<Route, TurnError> {
    let hex = |ids: &[ObjectId]| ids.iter().map(|b| b.to_hex()).collect::<Vec<_>>();
    let named = route::named(&event.content, members);
    if !named.is_empty() {
        return Ok(Route {
            speakers: hex(&named),
            why: why::MENTION.into(),
        });
    }
    if route::is_acknowledgement(&event.content) && event.images.is_empty() {
        return Ok(Route {
            speakers: Vec::new(),
            why: why::ACKNOWLEDGEMENT.into(),
        });
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
        turns.retriever.similarities(&event.content, &profiles),
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
            route::best_fit(&scored, last_speaker, turns.config.group_fit_margin)
                .unwrap_or((members[0].bot, why::DEFAULT))
        }
        _ => (last_speaker.unwrap_or(members[0].bot), why::DEFAULT),
    };
    Ok(Route {
        speakers: vec![bot.to_hex()],
        why: why.into(),
    })
}

/// No companion answers: the message is kept in the group's history, and the job settles `dropped`
/// with the reason.
async fn silence(
    turns: &Turns,
    job: &Job,
    ids: &Ids,
    event: &GroupEvent,
    reason: &str,
    keep: bool,
) -> Result<Settled, TurnError> {
    if keep {
        write_user_row(turns, job, event, ids).await?;
    }
    turns.journal.note_error(&ids.message, reason).await?;
    job.settle(State::Dropped, None).await?;
    turns.metrics.inc(
        SILENCES,
        &format!("reason=\"{}\"", crate::metrics::label(reason)),
    );
    info!(reason, "no companion answers this group message");
    Ok(Settled {
        outcome: Outcome::Silent {
            reason: reason.to_owned(),
        },
        through_seq: None,
    })
}

/// The user's message in the group's history (for a message no companion answers now).
async fn write_user_row(
    turns: &Turns,
    job: &Job,
    event: &GroupEvent,
    ids: &Ids,
) -> Result<(), TurnError> {
    job.step("history", "user")
        .lazy()
        .run(async {
            turns
                .pg
                .append_history(&[ids.user_row(event, Utc::now())])
                .await
                .map_err(TurnError::from)
        })
        .await
}

/// Names of the group's people and companions by id (hex), for the history the model reads.
async fn display_names(turns: &Turns, admitted: &Admitted<'_>) -> HashMap<String, String> {
    let mut names: HashMap<String, String> = admitted
        .members
        .iter()
        .map(|m| (m.bot.to_hex(), m.character.name.clone()))
        .collect();
    let people: Vec<ObjectId> = admitted
        .participants
        .iter()
        .filter(|p| !names.contains_key(&p.to_hex()))
        .copied()
        .collect();
    match turns.mongo.display_names(&people).await {
        Ok(found) => names.extend(found.into_iter().map(|(id, n)| (id.to_hex(), n))),
        Err(e) => debug!(error = %e, "participants' names not read; the history says `someone`"),
    }
    names
}

/// Writes one companion message of the group (every step keyed by its slot, safe to repeat).
async fn deliver(
    turns: &Turns,
    job: &Job,
    event: &GroupEvent,
    ids: &Ids,
    reply: &GroupReply,
    key: &str,
) -> Result<(), TurnError> {
    let bot =
        ObjectId::parse_str(&reply.bot).map_err(|_| TurnError::BadReplyId(reply.bot.clone()))?;
    let out = Outgoing {
        conversation: event.conversation_id,
        bot,
        user: event.sender_id,
        in_reply_to: None,
        user_rows: vec![ids.user_row(event, reply.reply.at)],
        covers: Vec::new(),
        trigger: None,
        responds_to: Some(event.message_id),
        group: true,
        key: key.to_owned(),
    };
    turns.write_reply(job, &out, &reply.reply).await?;
    info!(reply_id = %reply.reply.id, bot = %reply.bot, %key, "group message delivered");
    Ok(())
}

/// One companion about to speak, with what it sees.
struct Speaker<'a> {
    turns: &'a Turns,
    job: &'a Job,
    event: &'a GroupEvent,
    member: Member<'a>,
    admitted: &'a Admitted<'a>,
    names: &'a HashMap<String, String>,
    history: &'a [GroupLine],
    /// The messages already sent for this user message.
    said: &'a [GroupReply],
    slot: usize,
}

impl Speaker<'_> {
    fn name_of(&self, id: &str) -> String {
        self.names
            .get(id)
            .cloned()
            .unwrap_or_else(|| "someone".into())
    }

    /// Another's words as the model reads them: `Name: text`.
    fn line(&self, id: &str, text: &str) -> Message {
        Message::user(format!("{}: {text}", self.name_of(id)))
    }

    /// The model's answer as this companion, seeing the group's history, the message and the answers
    /// before it.
    async fn respond(&self) -> Result<GroupReply, TurnError> {
        let (t, c, me) = (self.turns, self.member.character, self.member.bot);
        let event = self.event.to_bot(me);
        let (tricklists, knowledge) = tokio::join!(
            stage(
                Stage::Context,
                t.mongo.resolve_tricklists(&self.admitted.user.tricklists)
            ),
            t.retriever.for_turn(&c.knowledge, &self.event.content),
        );
        let tricklists = tricklists?;
        let mut system = prompt::system_prompt(&PromptContext {
            character: c,
            profile: self.admitted.user.profile.as_ref(),
            tricklists: &tricklists,
            knowledge: &knowledge,
            reminders: &[],
            now: Utc::now(),
            tools_enabled: true,
            flow: "",
        });
        system.push_str(&self.group_note());
        let mine = me.to_hex();
        let this_message: Vec<&str> = self.said.iter().map(|r| r.reply.id.as_str()).collect();
        let mut messages = vec![Message::system(system)];
        for l in self.history {
            if l.message_id == self.event.message_id.to_hex()
                || this_message.contains(&l.message_id.as_str())
            {
                continue;
            }
            messages.push(match (l.role.as_str(), l.bot_id == mine) {
                ("assistant", true) => Message::assistant(l.content.clone()),
                ("assistant", false) => self.line(&l.bot_id, &l.content),
                _ => self.line(&l.user_id, &l.content),
            });
        }
        let sender = self.name_of(&event.sender_id.to_hex());
        let named = DmEvent {
            content: format!("{sender}: {}", event.content),
            ..event.clone()
        };
        messages.push(prompt::user_message(&named));
        for r in self.said {
            messages.push(if r.bot == mine {
                Message::assistant(r.reply.content.clone())
            } else {
                self.line(&r.bot, &r.reply.content)
            });
        }
        let answer = t
            .converse(
                self.job,
                &format!("{}.", self.slot),
                c,
                &event,
                &self.admitted.user,
                messages,
            )
            .await?;
        let mut reply = answer.reply;
        if answer.budget_stopped {
            return Ok(GroupReply {
                bot: mine,
                reply,
                tags: None,
                last: true,
            });
        }
        reply.content = strip_own_name(&reply.content, &c.name).to_owned();
        if reply.content.is_empty() {
            return Err(LlmError::EmptyAnswer.into());
        }
        let tags = route::handover(&reply.content, me, &self.admitted.members).map(|b| b.to_hex());
        Ok(GroupReply {
            bot: mine,
            reply,
            tags,
            last: false,
        })
    }

    /// What the companion is told about the group.
    fn group_note(&self) -> String {
        let me = self.member.character;
        let others: Vec<String> = self
            .admitted
            .members
            .iter()
            .filter(|m| m.bot != self.member.bot)
            .map(|m| format!("{} ({})", m.character.name, m.character.sport))
            .collect();
        let people: Vec<String> = self
            .admitted
            .participants
            .iter()
            .filter(|p| !self.admitted.members.iter().any(|m| m.bot == **p))
            .map(|p| self.name_of(&p.to_hex()))
            .collect();
        format!(
            "\n## This is a group chat\nThis conversation is a group chat in TrickBook, not a DM. In it: {} \
             and the companions {}. Messages from others start with the speaker's name and a colon. You \
             are {}: write one short message as yourself only, without a name prefix, and never speak \
             for the others. Your tools act for {} only. If another companion of the group knows this \
             better, you may hand over by naming them in your message; do it only when they would really \
             help, and never just to be polite.\n",
            people.join(", "),
            others.join(", "),
            me.name,
            self.name_of(&self.event.sender_id.to_hex()),
        )
    }
}

/// A model writing `Kaori: hey` in a group (it sees others' lines that way) loses the prefix.
fn strip_own_name<'s>(text: &'s str, name: &str) -> &'s str {
    text.strip_prefix(name)
        .and_then(|t| t.strip_prefix(':'))
        .map(str::trim_start)
        .unwrap_or(text)
}

/// Hex forms of a group message's ids, as the stores key them, and its history text.
struct Ids {
    message: String,
    conversation: String,
    sender: String,
    text: String,
}

impl Ids {
    fn of(e: &GroupEvent) -> Self {
        Self {
            message: e.message_id.to_hex(),
            conversation: e.conversation_id.to_hex(),
            sender: e.sender_id.to_hex(),
            text: prompt::history_text(&e.to_bot(e.sender_id)),
        }
    }

    fn job(&self, stream_seq: Option<u64>) -> NewJob<'_> {
        NewJob {
            id: &self.message,
            kind: JOB_KIND,
            user: &self.sender,
            // Several companions speak in one job: `companion usage` shows its calls as `group`.
            bot: JOB_KIND,
            conversation: &self.conversation,
            stream_seq,
        }
    }

    /// The user's message as a row of the group's history, sorted before the first answer.
    fn user_row(&self, event: &GroupEvent, answer_at: chrono::DateTime<Utc>) -> NewHistory<'_> {
        NewHistory {
            user_id: &self.sender,
            bot_id: "",
            conversation_id: &self.conversation,
            role: "user",
            content: &self.text,
            message_id: &self.message,
            tool_calls: None,
            created_at: event
                .sent_at
                .min(answer_at - chrono::Duration::microseconds(1)),
            group_chat: true,
        }
    }
}

/// The failure line for a group message that cannot be answered: from the first companion routed (or
/// the group's first), once, unless a companion already answered it.
pub async fn answer_with_failure(
    turns: &Turns,
    event: &GroupEvent,
    reason: &str,
) -> Result<Settled, TurnError> {
    let admitted = admit(turns, event).await?;
    let ids = Ids::of(event);
    let job = turns.journal.open(&ids.job(None)).await?;
    if let Some(settled) = already_settled(&job) {
        info!(state = ?job.record.state, "group message settled after all; no failure line");
        return Ok(settled);
    }
    turns.journal.note_error(&ids.message, reason).await?;
    let generation = generation_key(&job);
    let result = async {
        let mut n = 0;
        let mut last = None;
        while let Some(r) = job.recorded::<GroupReply>("reply", &format!("{generation}.{n}")) {
            // Answers fixed before the failure are delivered, not replaced by the line.
            deliver(turns, &job, event, &ids, &r, &format!("{generation}.{n}")).await?;
            last = Some(r.reply.id);
            n += 1;
        }
        if last.is_none() {
            let first = job
                .recorded::<Route>("route", "")
                .and_then(|r| r.speakers.first().and_then(|s| ObjectId::parse_str(s).ok()))
                .and_then(|b| admitted.members.iter().find(|m| m.bot == b).copied())
                .unwrap_or(admitted.members[0]);
            let key = format!("{generation}.0");
            let reply = job
                .step("reply", &key)
                .run(async {
                    Ok::<_, TurnError>(GroupReply {
                        bot: first.bot.to_hex(),
                        reply: Reply::new(first.character.failure_line.clone(), None, None),
                        tags: None,
                        last: true,
                    })
                })
                .await?;
            deliver(turns, &job, event, &ids, &reply, &key).await?;
            last = Some(reply.reply.id);
        }
        job.settle(State::Failed, None).await?;
        Ok(Settled {
            outcome: Outcome::Answered {
                reply_id: last.unwrap_or_default(),
            },
            through_seq: None,
        })
    }
    .await;
    job.keep_successes(result).await
}
