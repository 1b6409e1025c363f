//! Stage 9: how a job ends. Answered (done, or limited with the busy line), memory told of the turn by a
//! recorded step; or without a message of its own: dropped with the reason, limited (the busy line was
//! said this minute), held (a moderator paused the conversation). The job's state is written with its
//! last records, and the group's and the follow-ups' counters are kept here.

use std::sync::Arc;

use tracing::{debug, info};

use super::{
    Burst, Outcome, PipelineError, Reply, Settled, deliver::Sent, gate::Plan, input::Admitted,
    outgoing::Clean,
};
use crate::{
    bus::Bus,
    group,
    journal::{Answered, Finish, Finished, Job, State, StepKind},
    memory::Memory,
    metrics::Metrics,
    proactive,
    timing::{Stage, stage},
};
use crate::{config::Config, parts::Parts};

/// After a DM's reply: memory's extraction signal (when enough messages wait) and its quiet-period
/// schedule, published. Keyed by the reply generation; lazy (recorded when the job settles, so a crash
/// before that publishes them again, which the stream's duplicate window absorbs).
pub(crate) const MEMORY_TRIGGER: StepKind<()> = StepKind::new("memory_trigger")
    .packed()
    .says(|_| ("memory told of the turn".into(), serde_json::json!({})));

/// Stage 9, with what an ending tells.
pub(crate) struct Endings {
    /// Told of an answered DM (its extraction signal), and scrubs a job deleted meanwhile.
    pub(crate) memory: Memory,
    /// Where memory's extraction signal goes.
    pub(crate) bus: Bus,
    pub(crate) metrics: Arc<Metrics>,
    /// How a follow-up's plain line reads once sent (the `sent_plain` outcome).
    pub(crate) clean: Clean,
}

impl Endings {
    /// Stage 9 from the shared handles.
    pub(crate) fn new(p: &Parts, c: &Config) -> Self {
        Self {
            memory: p.memory.clone(),
            bus: p.bus.clone(),
            metrics: p.metrics.clone(),
            clean: Clean::of(c),
        }
    }
}

/// How an answered job ends.
pub(crate) struct Ending<'p, 'a> {
    pub(crate) plan: &'p Plan<'a>,
    pub(crate) said: Vec<Reply>,
    pub(crate) burst: &'p Burst,
    /// `done`, `limited` (the busy line) or `failed` (a failure line).
    pub(crate) state: State,
    /// This attempt composed a message (the group's counters count it once).
    pub(crate) fresh: bool,
    /// Memory hears of the turn (not of a failure line).
    pub(crate) remember: bool,
    /// The last message is out with its check for a deletion owed: it rides with the settlement.
    pub(crate) owed: Option<Sent>,
}

/// How [`Endings::answered`] ended a job.
#[derive(Debug)]
pub(crate) enum Ended {
    Settled(Settled),
    /// A message the last one answered was deleted, or its user erased, once it was out: the job is
    /// still running, for the message to be withdrawn and the job to end as deleted.
    Deleted(Sent),
}

impl Endings {
    /// The job ends in `end.state`, answered; unless the check owed with its last message
    /// ([`Ending::owed`]) finds a deletion.
    pub(crate) async fn answered(
        &self,
        job: &Job,
        a: &Admitted<'_>,
        end: Ending<'_, '_>,
    ) -> Result<Ended, PipelineError> {
        let Some(last) = end.said.last() else {
            return Ok(Ended::Settled(
                self.dropped(job, a, "no companion left to speak").await?,
            ));
        };
        if a.kind.dm().is_some() && end.remember && self.memory.config.enabled {
            // Before the job settles, as a step: a crash after the reply publishes it on the retry.
            let waiting = a.memory().waiting + 1 + end.burst.covers.len() as i64;
            job.step(&MEMORY_TRIGGER, job.record.generation.to_string())
                .lazy()
                .run(async {
                    let (user, bot) = (&a.ids.user, &a.ids.bot);
                    self.memory
                        .after_turn(&self.bus, user, bot, job.id(), waiting)
                        .await
                })
                .await?;
        }
        let by = (end.state == State::Limited).then(|| job.id());
        let ending = Finish {
            by,
            reason: None,
            through: end.burst.last_seq(),
        };
        let answered = end.owed.as_ref().map(|sent| Answered {
            user: &sent.user,
            messages: &sent.answered,
        });
        let finish = job.finish_unless_deleted(end.state, ending, answered);
        match (stage(Stage::Writes, finish).await?, end.owed) {
            (Finished::Deleted, Some(sent)) => return Ok(Ended::Deleted(sent)),
            (Finished::Elsewhere, _) => debug!("the job was settled elsewhere meanwhile"),
            _ => {}
        }
        let reply_id = last.id.clone();
        info!(%reply_id, state = end.state.as_str(), messages = end.said.len(), generation = job.record.generation, "delivered");
        let outcome = match end.state {
            State::Limited => Outcome::Limited {
                reply_id: Some(reply_id),
            },
            _ => Outcome::Answered { reply_id },
        };
        if let Some(g) = &end.plan.group
            && end.fresh
        {
            self.metrics
                .inc(&group::MESSAGES, &[("route", &g.route.why)]);
            self.metrics
                .add(&group::ANSWERS, &[], end.said.len() as u64);
        }
        let plain = (a.kind.follow_up())
            .is_some_and(|f| last.content.ends_with(&self.clean.text(&f.plain)));
        self.count(a, &outcome, plain);
        Ok(Ended::Settled(Settled {
            outcome,
            through_seq: end.burst.last_seq(),
            floored: job.carried().floored(),
        }))
    }

    /// No message, on purpose: the job ends `dropped` with the reason.
    pub(crate) async fn dropped(
        &self,
        job: &Job,
        a: &Admitted<'_>,
        reason: &str,
    ) -> Result<Settled, PipelineError> {
        let ending = Finish {
            by: None,
            reason: Some(reason),
            through: None,
        };
        job.finish(State::Dropped, ending).await?;
        info!(reason, "no message for this job");
        if a.kind.shared() {
            self.metrics.inc(&group::SILENCES, &[("reason", reason)]);
        }
        let outcome = Outcome::Dropped {
            reason: reason.to_owned(),
        };
        self.count(a, &outcome, false);
        Ok(Settled {
            outcome,
            through_seq: None,
            floored: job.carried().floored(),
        })
    }

    /// What the steps of a job dropped because of a deletion recorded is scrubbed, after its last records
    /// are written (a deletion that committed before this read scrubbed what was recorded then).
    pub(crate) async fn scrub(&self, job: &Job) -> Result<(), PipelineError> {
        let scrubbed = self.memory.scrub_job(job.id()).await?;
        info!(
            scrubbed,
            "deleted while the model answered: nothing written"
        );
        Ok(())
    }

    /// Over the flood limit with the busy line already said this minute by job `by`.
    pub(crate) async fn limited(&self, job: &Job, by: &str) -> Result<Settled, PipelineError> {
        let ending = Finish {
            by: Some(by),
            reason: None,
            through: None,
        };
        job.finish(State::Limited, ending).await?;
        info!(answered_by = %by, "over the flood limit; the busy line already answered this minute");
        Ok(Settled {
            outcome: Outcome::Limited { reply_id: None },
            through_seq: None,
            floored: job.carried().floored(),
        })
    }

    /// A moderator paused the conversation: the job ends `held` for the resume to answer.
    pub(crate) async fn held(&self, job: &Job, burst: &Burst) -> Result<Settled, PipelineError> {
        let ending = Finish {
            by: None,
            reason: Some(super::HELD),
            through: burst.last_seq(),
        };
        job.finish(State::Held, ending).await?;
        info!("a moderator paused the conversation; the message is held");
        Ok(Settled {
            outcome: Outcome::Held,
            through_seq: burst.last_seq(),
            floored: job.carried().floored(),
        })
    }

    /// The follow-ups' counter (`companion_proactive_total{kind,outcome}`); answers to users are
    /// counted by the worker.
    pub(crate) fn count(&self, a: &Admitted<'_>, outcome: &Outcome, plain: bool) {
        if let Some(follow_up) = a.kind.follow_up() {
            let name = match outcome {
                Outcome::Answered { .. } if plain => "sent_plain",
                Outcome::Answered { .. } | Outcome::Limited { .. } => "sent",
                other => other.name(),
            };
            let labels = [("kind", follow_up.trigger.kind.as_str()), ("outcome", name)];
            self.metrics.inc(&proactive::PROACTIVE, &labels);
        }
    }
}
