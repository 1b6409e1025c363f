//! A group message: routed to the companions that answer it (nobody, when a companion sent it), held
//! while paused; each companion's slot answered seeing the group's history, the message and the answers
//! before it, without memory or flows.

use std::collections::HashMap;

use bson::oid::ObjectId;
use chrono::Utc;
use tracing::{debug, info};

use crate::{
    bus::{DmEvent, GroupEvent},
    group::{self, Bounds, Member},
    journal::{Job, names::key},
    llm::Message,
    memory::{Access, Recall},
    pipeline::{
        PipelineError, Reply,
        compose::{Ask, Call, Composer, Instead, SlotView},
        gate::{Asked, Gate, GroupPlan, Passage, Plan},
        input::{Admitted, UserMessage},
        prompt::{self, PromptContext},
        reply::Recalled,
    },
    safety::Age,
    timing::{Stage, stage},
    tools::{Offer, Signals, offer_for_turn},
};

/// The group message as the incoming hook sees it.
pub(super) fn message(e: &GroupEvent) -> UserMessage<'_> {
    UserMessage {
        kind: "group",
        id: e.message_id,
        sender: e.sender_id,
        text: &e.content,
        images: &e.images,
    }
}

/// A group message: dropped when a companion sent it, held while paused, else the companions the
/// route picks (a journal step, so a replay picks the same), within the flood limit.
pub(super) async fn plan<'t>(
    gate: &'t Gate,
    job: &Job,
    a: &Admitted<'t>,
    event: &GroupEvent,
    paused: bool,
) -> Result<Asked<'t>, PipelineError> {
    if a.members.iter().any(|m| m.bot == event.sender_id) {
        return Ok(Asked::Decided(Passage::Drop {
            reason: group::COMPANION_SENDER.into(),
            keep: false,
        }));
    }
    // In a group, a user in crisis has the private referral; the group sees nothing of it.
    if paused {
        return Ok(Asked::Decided(Passage::Hold));
    }
    if a.age == Age::Under13 {
        return Ok(Asked::Under13 { crisis: false });
    }
    let history = gate
        .pg
        .group_history(&a.ids.conversation, gate.history_limit)
        .await?;
    let route = job
        .step(&group::ROUTE, key::ONCE)
        .run(async {
            let members = &a.members;
            let margin = gate.group.fit_margin;
            let route = group::decide(&gate.retriever, event, members, &history, margin).await;
            Ok::<_, PipelineError>(route)
        })
        .await?;
    let speakers: Vec<Member<'t>> = route
        .speakers_among(&a.members)
        .into_iter()
        .filter_map(|b| a.members.iter().find(|m| m.bot == b).copied())
        .collect();
    if speakers.is_empty() {
        return Ok(Asked::Decided(Passage::Drop {
            reason: route.why,
            keep: true,
        }));
    }
    let plan = Plan {
        speakers,
        busy: false,
        fixed: None,
        group: Some(GroupPlan {
            route,
            bounds: Bounds {
                max_handovers: gate.group.max_handovers,
                max_messages: gate.group.max_messages.max(1),
            },
            history,
            names: Default::default(),
        }),
        after_flag: false,
    };
    Ok(Asked::WithinFlood(plan))
}

/// What one companion of a group asks the model, seeing the group's history, the message and the
/// answers before it: no memory, and the tools for its sender (none for a user in crisis).
pub(super) async fn ask<'c>(
    composer: &'c Composer,
    t: &SlotView<'_, '_>,
    group_event: &GroupEvent,
    participants: &[ObjectId],
) -> Result<Ask<'c>, PipelineError> {
    let (a, c, me) = (t.admitted, t.speaker.character, t.speaker.bot);
    if t.handed_over {
        composer.metrics.inc(&group::HANDOVERS, &[]);
        info!(to = %c.id, "handed over by the companion before");
    }
    let event = group_event.to_bot(me);
    let g = t
        .plan
        .group
        .as_ref()
        .expect("a group message has its group plan");
    let (tricklists, knowledge, names) = Box::pin(async {
        tokio::join!(
            stage(
                Stage::Context,
                composer.mongo.resolve_tricklists(&a.user.tricklists)
            ),
            composer.retriever.for_turn(&c.knowledge, &event.content),
            g.names
                .get_or_init(|| display_names(composer, &a.members, participants)),
        )
    })
    .await;
    let name_of = |id: &str| names.get(id).cloned().unwrap_or_else(|| "someone".into());
    let prompt = group_prompt(
        composer,
        t,
        &tricklists?,
        &knowledge,
        participants,
        &name_of,
    );
    let recalled = Recalled::of(&knowledge, &Recall::default());
    drop(knowledge);
    let offer = match composer.settings.prompt.tools_by_turn {
        false => Offer::all(),
        true => group_offer(&event.content, t.said),
    };
    let messages = messages(composer, t, prompt, &event, &name_of, offer);
    Ok(Ask {
        call: Call {
            event,
            messages,
            tools: super::tools_for(t.crisis),
            offer,
            spent: None,
            memory: Access::Group,
        },
        recalled: Some(recalled),
        seen: None,
        instead: Instead::Error,
    })
}

/// The request's messages as companion `t.speaker` reads the group: the system prompt, the earlier lines
/// that fit, the knowledge and the turn's note, the message (with its sender's name) and the answers
/// before it this round; the group's safety brief last for a user in crisis.
fn messages(
    composer: &Composer,
    t: &SlotView<'_, '_>,
    mut prompt: prompt::Prompt,
    event: &DmEvent,
    name_of: &dyn Fn(&str) -> String,
    offer: Offer,
) -> Vec<Message> {
    let (a, me) = (t.admitted, t.speaker.bot);
    let g = t
        .plan
        .group
        .as_ref()
        .expect("a group message has its group plan");
    let line = |id: &str, text: &str| Message::user(format!("{}: {text}", name_of(id)));
    let mine = me.to_hex();
    let this_message: Vec<&str> = t.said.iter().map(|s| s.id.as_str()).collect();
    let head = event.message_id.to_hex();
    let named = DmEvent {
        content: format!("{}: {}", name_of(&a.ids.user), event.content),
        ..event.clone()
    };
    let tools = super::tools_for(t.crisis);
    let said_tokens: usize = t.said.iter().map(|s| prompt::tokens(&s.content)).sum();
    let fixed = tools.offered_tokens(offer) + prompt::tokens(&named.content) + said_tokens;
    let (knowledge, history_cap) = prompt.room(&composer.settings.prompt, fixed);
    let earlier: Vec<_> = g
        .history
        .iter()
        .filter(|l| l.message_id != head && !this_message.contains(&l.message_id.as_str()))
        .collect();
    let earlier = prompt::recent(&earlier, history_cap, |l| l.content.len() + 8);
    let mut messages = vec![Message::system(std::mem::take(&mut prompt.system))];
    messages.extend(earlier.iter().map(|l| as_read_by(l, &mine, &line)));
    messages.push(Message::system(format!("{knowledge}{}", prompt.turn)));
    messages.push(prompt::user_message(&named));
    messages.extend(t.said.iter().map(|s| {
        let bot = s.bot.as_deref().unwrap_or_default();
        match bot == mine {
            true => Message::assistant(s.content.clone()),
            false => line(bot, &for_the_others(s, &a.members)),
        }
    }));
    if t.crisis {
        messages.push(Message::system(prompt::GROUP_SAFETY_BRIEF.to_owned()));
    }
    messages
}

/// The system prompt of a companion's slot in a group: who it is, the sender's tricklists, the
/// knowledge, and who is in the group; no memory (a group never reads a DM's) and no flows.
fn group_prompt(
    composer: &Composer,
    t: &SlotView<'_, '_>,
    tricklists: &[crate::store::Tricklist],
    knowledge: &[crate::rag::KnowledgeSnippet],
    participants: &[ObjectId],
    name_of: &dyn Fn(&str) -> String,
) -> prompt::Prompt {
    let a = t.admitted;
    let mut prompt = prompt::system_prompt(&PromptContext {
        character: t.speaker.character,
        profile: a.user.profile.as_ref(),
        tricklists,
        knowledge,
        reminders: &[],
        now: Utc::now(),
        tools_enabled: true,
        flow: "",
        memory: &Recall::default(),
        budget: &composer.settings.prompt,
    });
    let note = group_note(t.speaker, &a.members, participants, name_of, &a.ids.user);
    prompt.system.push_str(&note);
    prompt
}

/// Names of the group's people and companions by id (hex), for the history the model reads.
async fn display_names(
    composer: &Composer,
    members: &[Member<'_>],
    participants: &[ObjectId],
) -> HashMap<String, String> {
    let mut names: HashMap<String, String> = members
        .iter()
        .map(|m| (m.bot.to_hex(), m.character.name.clone()))
        .collect();
    let people: Vec<ObjectId> = participants
        .iter()
        .filter(|p| !names.contains_key(&p.to_hex()))
        .copied()
        .collect();
    match composer.mongo.display_names(&people).await {
        Ok(found) => names.extend(found.into_iter().map(|(id, n)| (id.to_hex(), n))),
        Err(e) => {
            debug!(error = %e, "participants' names not read; the history says `someone`")
        }
    }
    names
}

/// What a companion is told about the group.
fn group_note(
    me: Member<'_>,
    members: &[Member<'_>],
    participants: &[ObjectId],
    name_of: &dyn Fn(&str) -> String,
    sender: &str,
) -> String {
    let others: Vec<String> = members
        .iter()
        .filter(|m| m.bot != me.bot)
        .map(|m| format!("{} ({})", m.character.name, m.character.sport))
        .collect();
    let people: Vec<String> = participants
        .iter()
        .filter(|p| !members.iter().any(|m| m.bot == **p))
        .map(|p| name_of(&p.to_hex()))
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
        me.character.name,
        name_of(sender),
    )
}

/// Another companion's message of this round as the next speaker reads it: without the AI disclosure and
/// the break reminder it carries for the user, which the next companion would otherwise answer as if the
/// user had said them.
fn for_the_others(s: &Reply, members: &[Member<'_>]) -> String {
    let content = s.content.as_str();
    let Some(m) = members
        .iter()
        .find(|m| s.bot.as_deref() == Some(m.bot.to_hex().as_str()))
    else {
        return content.to_owned();
    };
    let mut text = content;
    if s.marks.ai_disclosure {
        text = text
            .strip_prefix(m.character.disclosure_line.trim())
            .unwrap_or(text);
    }
    if s.marks.break_reminder {
        text = text
            .trim_end()
            .strip_suffix(m.character.break_line.trim())
            .unwrap_or(text);
    }
    text.trim().to_owned()
}

/// The tools a companion's slot in a group is offered: what the message and the lines said to it
/// so far call for.
fn group_offer(text: &str, said: &[Reply]) -> Offer {
    offer_for_turn(&Signals {
        texts: std::iter::once(text)
            .chain(said.iter().map(|s| s.content.as_str()))
            .collect(),
        ..Default::default()
    })
}

/// An earlier line of a group as the companion `mine` reads it: its own as its, a moderator's marked,
/// everyone else's with their name (`line`).
fn as_read_by(
    l: &crate::store::GroupLine,
    mine: &str,
    line: &impl Fn(&str, &str) -> Message,
) -> Message {
    match (l.role.as_str(), l.bot_id == mine) {
        ("assistant", true) => Message::assistant(l.content.clone()),
        ("assistant", false) => line(&l.bot_id, &l.content),
        (prompt::MODERATOR, _) => {
            Message::user(format!("{}: {}", prompt::MODERATOR_LABEL, l.content))
        }
        _ => line(&l.user_id, &l.content),
    }
}
