//! Stage 4: the checks inside the job, each decision a step of it, and who speaks (stage 6's plan).
//! A DM is held while a moderator pauses its conversation, answered once a day by a fixed line under
//! 13, and limited by the flood limit; a group message is routed to its companions first; a follow-up
//! is dropped when its news is stale, its user cannot be written to, a minor's quiet hours or the daily
//! cap stand in the way.

use bson::oid::ObjectId;
use chrono::{DateTime, Utc};
use serde_json::json;
use tracing::info;

use super::{
    FLOOD, Fixed, FloodDecision, HELD, PipelineError, Reply, UNDER_13,
    incoming::{CRISIS, Flagged},
    input::{self, Admitted, Kind},
};
use crate::{
    config::{FollowUpConfig, GroupConfig},
    flood::FloodLimit,
    group::{self, Bounds, Member, Route},
    journal::{
        Counted, Job, Journal, StepKind,
        names::key::{self, Slot},
    },
    proactive,
    rag::Retriever,
    safety::{Safety, age::Age, detect::Layer},
    store::{Pg, pg::GroupLine},
    timing::{Stage, stage},
};
use std::sync::Arc;

/// Whether the reply model flagged the user's message just before this one (within the referral window):
/// then this turn, too, is answered with the safety brief. Keyed once; lazy.
pub(crate) const AFTER_FLAG: StepKind<bool> =
    StepKind::new("after_flag").packed().told(|_, flagged| {
        let says = match flagged {
            true => "the model flagged the message before: answered with the safety brief",
            false => "no model flag on the message before",
        };
        (says.into(), json!({ "after_flag": flagged }))
    });
/// A follow-up's checks before anything is sent: stale news, a blocked or departed companion, the daily
/// cap. Why it was dropped, or nothing.
pub(crate) const GATE: StepKind<Option<String>> =
    StepKind::new("gate").told(|_, dropped| match dropped {
        Some(reason) => (
            format!("gate: dropped ({reason})"),
            json!({ "dropped": reason }),
        ),
        None => ("gate: passed".into(), json!({ "dropped": null })),
    });
/// The one line a user under 13 gets a day (tally [`crate::journal::names::tally::under_13`]).
pub(crate) const UNDER_13_LINE: StepKind<Counted> = StepKind::new("under_13").says(|_| {
    (
        "a user under 13: today's one line counted".into(),
        json!({}),
    )
});
/// A follow-up counted against the user's daily cap (tally [`crate::journal::names::tally::proactive`]).
pub(crate) const CAP: StepKind<Counted> = StepKind::new("cap")
    .says(|t| crate::flood::counted(t, "gate: counted against the daily follow-up cap"));

/// What the gate lets through, and what it stops.
pub(crate) enum Passage<'a> {
    /// Its messages are planned: the gate let it through (or over the flood limit, with the busy line).
    Go(Plan<'a>),
    /// Over the flood limit with the busy line already said this minute by job `by`: kept in history,
    /// no message.
    Limited { by: String },
    /// No message, on purpose; `keep`: the user's message is kept in history all the same.
    Drop { reason: String, keep: bool },
    /// A moderator paused the conversation: kept in history, held for the resume.
    Hold,
}

/// Who speaks, in order (stage 6).
pub(crate) struct Plan<'a> {
    /// The companions that speak first: the DM's or the follow-up's one, a group's routed ones.
    pub(crate) speakers: Vec<Member<'a>>,
    /// Over the flood limit: the first speaker says the busy line, and nobody after.
    pub(crate) busy: bool,
    /// The first speaker says this fixed line, and nobody after.
    pub(crate) fixed: Option<Fixed>,
    /// A group message's route and what its companions see; none for one message.
    pub(crate) group: Option<GroupPlan>,
    /// The reply model flagged a concern in the user's message just before this one: this one is
    /// answered with the safety brief.
    pub(crate) after_flag: bool,
}

/// What a group message's answers share.
pub(crate) struct GroupPlan {
    pub(crate) route: Route,
    pub(crate) bounds: Bounds,
    /// The group's history before the message.
    pub(crate) history: Vec<GroupLine>,
    /// Names of the group's people and companions by id (hex): read once, by the first companion who
    /// speaks now (none when every message was fixed by an earlier attempt).
    pub(crate) names: tokio::sync::OnceCell<std::collections::HashMap<String, String>>,
}

impl<'a> Plan<'a> {
    pub(crate) fn one(speaker: Member<'a>, busy: bool) -> Self {
        Self {
            speakers: vec![speaker],
            busy,
            fixed: None,
            group: None,
            after_flag: false,
        }
    }

    pub(crate) fn fixed(speaker: Member<'a>, line: Fixed) -> Self {
        Self {
            fixed: Some(line),
            ..Self::one(speaker, false)
        }
    }

    /// The plan of a job whose attempts failed: its first speaker (the route's, when one was recorded)
    /// says one message.
    pub(crate) fn after_failure(a: &Admitted<'a>, route: Option<Route>, busy: bool) -> Self {
        let first = route
            .as_ref()
            .and_then(|r| r.speakers_among(&a.members).first().copied())
            .and_then(|b| a.members.iter().find(|m| m.bot == b).copied())
            .unwrap_or(a.members[0]);
        let group = matches!(a.kind, Kind::Group { .. }).then(|| GroupPlan {
            route: route.unwrap_or_default(),
            bounds: Bounds {
                max_handovers: 0,
                max_messages: 1,
            },
            history: Vec::new(),
            names: Default::default(),
        });
        Self {
            group,
            ..Self::one(first, busy)
        }
    }

    pub(crate) fn slot(&self, n: usize) -> Slot {
        match self.group {
            Some(_) => Slot::Nth(n),
            None => Slot::Only,
        }
    }

    /// Who speaks after `said`, and whether another companion's message handed over to them; none when
    /// the plan is done.
    pub(crate) fn next(
        &self,
        said: &[Reply],
        members: &[Member<'a>],
    ) -> Option<(Member<'a>, bool)> {
        if said.last().is_some_and(|s| s.last) {
            return None;
        }
        let Some(g) = &self.group else {
            return said.is_empty().then(|| (self.speakers[0], false));
        };
        let hex = |s: Option<&str>| s.and_then(|b| ObjectId::parse_str(b).ok());
        let so_far: Vec<(ObjectId, Option<ObjectId>)> = said
            .iter()
            .filter_map(|s| Some((hex(s.bot.as_deref())?, hex(s.tags.as_deref()))))
            .collect();
        let route: Vec<ObjectId> = self.speakers.iter().map(|m| m.bot).collect();
        let next = group::route::next_speaker(&route, &so_far, g.bounds)?;
        let member = members.iter().find(|m| m.bot == next.bot).copied()?;
        Some((member, next.handed_over))
    }
}

/// Stage 4, with what its checks read.
pub(crate) struct Gate {
    /// Whether a moderator paused the conversation, and a group's history for its route.
    pub(crate) pg: Pg,
    /// The flood limit's tally, and earlier jobs' crisis records (the reply model's flag on the message
    /// before).
    pub(crate) journal: Journal,
    pub(crate) flood: FloodLimit,
    /// A group message's route compares it with each companion's profile.
    pub(crate) retriever: Retriever,
    /// Who answers in a group chat and how far companions talk among themselves.
    pub(crate) group: GroupConfig,
    /// A minor's quiet hours.
    pub(crate) safety: Arc<Safety>,
    /// The daily cap of follow-ups no user message triggered.
    pub(crate) follow_ups: FollowUpConfig,
    /// Rows of a group's history read for its route.
    pub(crate) history_limit: i64,
}

impl Gate {
    /// Stage 4: the checks inside the job, each decision a step of it. A user message that goes ahead
    /// (not itself in crisis) learns whether the reply model flagged the one before.
    pub(crate) async fn pass<'t>(
        &'t self,
        job: &Job,
        a: &Admitted<'t>,
        crisis: bool,
    ) -> Result<Passage<'t>, PipelineError> {
        match self.check(job, a, crisis).await? {
            Passage::Go(mut plan) if !crisis && a.message().is_some() => {
                plan.after_flag = self.after_model_flag(job).await?;
                Ok(Passage::Go(plan))
            }
            passage => Ok(passage),
        }
    }

    /// Whether the reply model flagged a concern in the user's message just before this job's (and
    /// within the referral window). Its turn had the referral and the model's own reply, written
    /// before the brief could shape it; the next turn is answered with the safety brief.
    async fn after_model_flag(&self, job: &Job) -> Result<bool, PipelineError> {
        job.step(&AFTER_FLAG, key::ONCE)
            .lazy()
            .run(async {
                let before = match job.carried().previous() {
                    // Read when the job opened ([`Gate::flag_read`]).
                    Some(before) => before.to_vec(),
                    None => {
                        let (name, since) = self.flag_read();
                        self.journal.previous_steps(job.id(), name, since).await?
                    }
                };
                Ok::<_, PipelineError>(before.into_iter().any(|v| {
                    serde_json::from_value::<Flagged>(v).is_ok_and(|f| f.layer == Layer::Model)
                }))
            })
            .await
    }

    /// What [`Gate::after_model_flag`] reads of the job before: its crisis records within the referral
    /// window ([`Reads::previous`](companion_journal::Reads::previous), read with the opening).
    pub(crate) fn flag_read(&self) -> (&'static str, DateTime<Utc>) {
        let window =
            chrono::Duration::seconds(self.safety.config.crisis_referral_window_secs.max(1) as i64);
        (CRISIS.name, Utc::now() - window)
    }

    /// The checks, each decision a step of the job, and who speaks.
    async fn check<'t>(
        &'t self,
        job: &Job,
        a: &Admitted<'t>,
        crisis: bool,
    ) -> Result<Passage<'t>, PipelineError> {
        let paused = match job.carried().paused() {
            Some(paused) => paused,
            None => self.pg.paused(&a.ids.conversation).await?,
        };
        match &a.kind {
            Kind::Dm(_) => {
                let first = a.members[0];
                if paused {
                    return Ok(match crisis {
                        true => Passage::Go(Plan::fixed(first, Fixed::Crisis)),
                        false => Passage::Hold,
                    });
                }
                if a.age == Age::Under13 {
                    return self.under_13_gate(job, a, crisis).await;
                }
                self.flood_gate(job, a, Plan::one(first, false)).await
            }
            Kind::Group { event, .. } => self.group_gate(job, a, event, paused).await,
            Kind::FollowUp { follow_up, access } => {
                // The `gate` step: why the follow-up is dropped, or nothing (it is sent).
                let dropped = job
                    .step(&GATE, key::ONCE)
                    .lazy()
                    .run(self.follow_up_gate(job, a, follow_up, *access, paused))
                    .await?;
                Ok(match dropped {
                    Some(reason) => Passage::Drop {
                        reason,
                        keep: false,
                    },
                    None => Passage::Go(Plan::one(a.members[0], false)),
                })
            }
        }
    }

    /// A group message: dropped when a companion sent it, held while paused, else the companions the
    /// route picks (a journal step, so a replay picks the same), within the flood limit.
    async fn group_gate<'t>(
        &'t self,
        job: &Job,
        a: &Admitted<'t>,
        event: &crate::bus::GroupEvent,
        paused: bool,
    ) -> Result<Passage<'t>, PipelineError> {
        if a.members.iter().any(|m| m.bot == event.sender_id) {
            return Ok(Passage::Drop {
                reason: group::COMPANION_SENDER.into(),
                keep: false,
            });
        }
        // In a group, a user in crisis has the private referral; the group sees nothing of it.
        if paused {
            return Ok(Passage::Hold);
        }
        if a.age == Age::Under13 {
            return self.under_13_gate(job, a, false).await;
        }
        let history = self
            .pg
            .group_history(&a.ids.conversation, self.history_limit)
            .await?;
        let route = job
            .step(&group::ROUTE, key::ONCE)
            .run(async {
                let members = &a.members;
                let margin = self.group.fit_margin;
                let route = group::decide(&self.retriever, event, members, &history, margin).await;
                Ok::<_, PipelineError>(route)
            })
            .await?;
        let speakers: Vec<Member<'t>> = route
            .speakers_among(&a.members)
            .into_iter()
            .filter_map(|b| a.members.iter().find(|m| m.bot == b).copied())
            .collect();
        if speakers.is_empty() {
            return Ok(Passage::Drop {
                reason: route.why,
                keep: true,
            });
        }
        let plan = Plan {
            speakers,
            busy: false,
            fixed: None,
            group: Some(GroupPlan {
                route,
                bounds: Bounds {
                    max_handovers: self.group.max_handovers,
                    max_messages: self.group.max_messages.max(1),
                },
                history,
                names: Default::default(),
            }),
            after_flag: false,
        };
        self.flood_gate(job, a, plan).await
    }

    /// A user under 13: the one fixed line a day (a counted step, tally `under_13:<user>`), else no
    /// answer; a user in crisis gets the character's crisis line after the referral. No model call.
    async fn under_13_gate<'t>(
        &self,
        job: &Job,
        a: &Admitted<'t>,
        crisis: bool,
    ) -> Result<Passage<'t>, PipelineError> {
        let first = a.members[0];
        if crisis {
            return Ok(Passage::Go(Plan::fixed(first, Fixed::Crisis)));
        }
        let day = std::time::Duration::from_secs(24 * 3600);
        let tally = crate::journal::names::tally::under_13(&a.ids.user);
        let counted = job
            .counted(&UNDER_13_LINE, key::ONCE, &tally, 1, day, Utc::now())
            .await?;
        Ok(match counted {
            crate::journal::Admission::Exceeded { .. } => Passage::Drop {
                reason: UNDER_13.into(),
                keep: true,
            },
            _ => Passage::Go(Plan::fixed(first, Fixed::Under13)),
        })
    }

    /// The flood decision (the `flood` step) for a plan whose first speaker would say the busy line.
    async fn flood_gate<'t>(
        &self,
        job: &Job,
        a: &Admitted<'_>,
        mut plan: Plan<'t>,
    ) -> Result<Passage<'t>, PipelineError> {
        let busy_by = plan.speakers[0].bot.to_hex();
        let flood = job
            .step(&FLOOD, key::ONCE)
            .lazy()
            .run(self.decide_flood(job, &a.ids.user, &busy_by))
            .await?;
        Ok(match flood.by {
            None => Passage::Go(plan),
            Some(by) if by == job.id() => {
                info!("over the flood limit; answering with the busy line");
                plan.busy = true;
                Passage::Go(plan)
            }
            Some(by) => Passage::Limited { by },
        })
    }

    /// The flood decision of a job that has none recorded (`bot` is the companion that would say the
    /// busy line). Only a first attempt takes from the allowance: a retried or replayed job was admitted
    /// already.
    async fn decide_flood(
        &self,
        job: &Job,
        sender: &str,
        bot: &str,
    ) -> Result<FloodDecision, PipelineError> {
        if job.record.attempts > 1 {
            return Ok(FloodDecision::default());
        }
        let by = stage(
            Stage::Limits,
            self.flood.decide(&self.journal, job, sender, bot),
        )
        .await?;
        Ok(FloodDecision { by })
    }

    /// A follow-up's checks: the news is still news, the user can still be written to, and the daily cap
    /// has room (a counted step, tally `proactive:<user>`). Why it is dropped, or nothing.
    async fn follow_up_gate(
        &self,
        job: &Job,
        a: &Admitted<'_>,
        f: &proactive::FollowUp<'_>,
        access: input::Reach,
        paused: bool,
    ) -> Result<Option<String>, PipelineError> {
        let drop = |why: &str| Ok(Some(why.to_owned()));
        if let Some(stale) = &f.stale {
            return drop(stale);
        }
        if let Some(why) = access.refusal() {
            return drop(why);
        }
        if paused {
            return drop(HELD);
        }
        if a.age == Age::Under13 {
            return drop(UNDER_13);
        }
        let tz = a.user.profile.as_ref().and_then(|p| p.time_zone.as_deref());
        let local = crate::safety::age::local(Utc::now(), tz);
        if a.age.is_minor() && self.safety.quiet(local.time()) {
            let c = &self.safety.config;
            return drop(&format!(
                "quiet hours for a minor ({}–{} local; it is {})",
                c.minor_quiet_start.format("%H:%M"),
                c.minor_quiet_end.format("%H:%M"),
                local.format("%H:%M")
            ));
        }
        let cap = self.follow_ups.daily_cap;
        let counted = job
            .counted(
                &CAP,
                key::ONCE,
                &crate::journal::names::tally::proactive(&a.ids.user),
                cap,
                std::time::Duration::from_secs(24 * 3600),
                Utc::now(),
            )
            .await?;
        if let crate::journal::Admission::Exceeded { .. } = counted {
            return drop(&format!("the user's daily cap of {cap} proactive messages"));
        }
        Ok(None)
    }
}
