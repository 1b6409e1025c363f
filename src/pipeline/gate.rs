//! Stage 4: the checks inside the job, each decision a step of it, and who speaks (stage 6's plan). Each
//! kind makes its checks (`kind/`) from the ones here: whether the conversation is paused, the under-13
//! line, the flood limit; then a user message learns whether the reply model flagged the one before.

use bson::oid::ObjectId;
use chrono::{DateTime, Utc};
use serde_json::json;
use tracing::info;

use super::{
    FLOOD, Fixed, FloodDecision, PipelineError, Reply, UNDER_13,
    incoming::{CRISIS, Flagged},
    input::Admitted,
};
use crate::{config::Config, parts::Parts};
use crate::{
    config::{FollowUpConfig, GroupConfig},
    flood::FloodLimit,
    group::{self, Bounds, Member, Route},
    journal::{
        Counted, Job, Journal, StepKind,
        names::key::{self, Slot},
    },
    rag::Retriever,
    safety::{Layer, Safety},
    store::{GroupLine, Pg},
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
/// The one line a user under 13 gets a day (tally [`crate::journal::names::tally::under_13`]).
pub(crate) const UNDER_13_LINE: StepKind<Counted> = StepKind::new("under_13").says(|_| {
    (
        "a user under 13: today's one line counted".into(),
        json!({}),
    )
});
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

/// What a kind's checks ask of the gate ([`super::kind::plan`]): what they decided themselves, the
/// under-13 line, or a plan held to the flood limit.
pub(crate) enum Asked<'a> {
    Decided(Passage<'a>),
    /// A user under 13; `crisis`: the kind gives a user in crisis the crisis line instead.
    Under13 {
        crisis: bool,
    },
    WithinFlood(Plan<'a>),
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
        let group = a.kind.shared().then(|| GroupPlan {
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
    /// Stage 4 from the shared handles (`turn`: the flood limit and the history a route reads; `group`;
    /// `follow_ups`: the daily cap).
    pub(crate) fn new(p: &Parts, c: &Config) -> Self {
        Self {
            pg: p.pg.clone(),
            journal: p.journal.clone(),
            flood: FloodLimit::new(c.turn.user_turns_per_minute),
            retriever: p.retriever.clone(),
            group: c.group.clone(),
            safety: p.safety.clone(),
            follow_ups: c.follow_ups.clone(),
            history_limit: c.turn.history_limit,
        }
    }
}

impl Gate {
    /// Stage 4: whether a moderator paused the conversation, then the kind's checks (`checks`, given the
    /// gate and that; [`super::kind::plan`]) and what they ask of the gate; a user message that goes ahead
    /// (not itself in crisis) learns whether the reply model flagged the one before.
    pub(crate) async fn pass<'t, K, F>(
        &'t self,
        job: &Job,
        a: &Admitted<'t>,
        crisis: bool,
        checks: K,
    ) -> Result<Passage<'t>, PipelineError>
    where
        K: FnOnce(&'t Gate, bool) -> F,
        F: Future<Output = Result<Asked<'t>, PipelineError>>,
    {
        let paused = self.paused(job, a).await?;
        let passage = match checks(self, paused).await? {
            Asked::Decided(passage) => passage,
            Asked::Under13 { crisis } => self.under_13_gate(job, a, crisis).await?,
            Asked::WithinFlood(plan) => self.flood_gate(job, a, plan).await?,
        };
        match passage {
            Passage::Go(mut plan) if !crisis && a.message().is_some() => {
                plan.after_flag = self.after_model_flag(job).await?;
                Ok(Passage::Go(plan))
            }
            passage => Ok(passage),
        }
    }

    /// Whether a moderator has paused the job's conversation (read with the job's opening when it could
    /// be).
    async fn paused(&self, job: &Job, a: &Admitted<'_>) -> Result<bool, PipelineError> {
        match job.carried().paused() {
            Some(paused) => Ok(paused),
            None => Ok(self.pg.paused(&a.ids.conversation).await?),
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
}
