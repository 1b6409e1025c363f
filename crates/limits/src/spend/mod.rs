//! What the chat model may still cost: one user's budget and the whole service's, in tokens and in USD
//! over a rolling window (a day by default), checked before every paid call.
//!
//! The figures are the journal's own ([`spent`]): every answer of the model is an `llm`
//! step recorded with its usage and cost under the tally `spend:<user>` ([`tally`]), so what a retry
//! replays is never counted twice and no counter of its own can drift from the usage report. A user's
//! figure is read at each check (an index range over that user's calls in the window); the service's is
//! one aggregate over every call in the window, read at most every `refresh` per process, so it may lag
//! by that much.
//!
//! Two stages per budget: from `cheaper_at` of it, calls go to the cheaper model; at it, no call is made
//! (the turn answers with the character's budget line, a follow-up with its plain line) until the window
//! has rolled past enough of the spending. A call is checked before it is made, so the last one allowed
//! may pass the budget by its own size.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use tracing::{info, warn};

mod spent;

use crate::store::Pool;
use crate::{
    config::SpendConfig,
    journal::names,
    metrics::{Metric, Metrics},
    store::StoreError,
};
pub use spent::{SPENT_RIDE, Spent, spent, spent_ride_args};

/// Chat calls the budget changed, by scope and stage.
const BUDGET_CALLS: Metric = Metric::new(
    "companion_budget_calls_total",
    "Chat calls the spend budget changed, by scope (user, service) and stage (cheaper, stopped)",
);
/// The share of the service's budget spent in its window.
const SERVICE_BUDGET_RATIO: Metric = Metric::new(
    "companion_service_budget_ratio",
    "Share of the service's spend budget used in its window",
);
/// The service's spending in the budget's window.
const SERVICE_SPEND_USD: Metric = Metric::new(
    "companion_service_spend_usd",
    "The service's spending in USD in the budget's window",
);

/// The tally every model answer on behalf of `user` is recorded under.
pub fn tally(user: &str) -> String {
    names::tally::spend(user)
}

/// A budget: either bound 0 means none of that kind.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Budget {
    pub(crate) tokens: u64,
    pub(crate) usd: f64,
}

impl Budget {
    fn is_off(&self) -> bool {
        self.tokens == 0 && self.usd <= 0.0
    }

    /// The larger share of the budget `spent` uses (0 when there is no budget).
    pub(crate) fn share(&self, spent: Spent) -> f64 {
        let tokens = if self.tokens > 0 {
            spent.tokens as f64 / self.tokens as f64
        } else {
            0.0
        };
        let usd = if self.usd > 0.0 {
            spent.usd / self.usd
        } else {
            0.0
        };
        tokens.max(usd)
    }
}

/// Whose budget decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    User,
    Service,
}

impl Scope {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Scope::User => "user",
            Scope::Service => "service",
        }
    }
}

/// What the next paid call may be.
#[derive(Clone, Debug, PartialEq)]
pub enum Allowance {
    /// As usual.
    Full,
    /// Near a budget: with this (cheaper) model.
    Cheaper { model: String, scope: Scope },
    /// At a budget: no call.
    Stopped { scope: Scope },
}

/// The budgets, the window and the stages, from the configuration.
#[derive(Clone, Debug)]
pub struct SpendLimits {
    pub(crate) user: Budget,
    pub(crate) service: Budget,
    pub(crate) window: Duration,
    pub(crate) cheaper_at: f64,
    /// Empty: no cheaper stage.
    pub(crate) cheaper_model: String,
    pub(crate) refresh: Duration,
    /// Prompt tokens one turn may send over all its model calls (0: no cap).
    pub per_turn_prompt_tokens: u64,
}

impl SpendLimits {
    pub fn of(c: &SpendConfig) -> Self {
        Self {
            user: Budget {
                tokens: c.user_daily_tokens,
                usd: c.user_daily_usd,
            },
            service: Budget {
                tokens: c.service_daily_tokens,
                usd: c.service_daily_usd,
            },
            window: Duration::from_secs(c.budget_window_secs.max(1)),
            cheaper_at: c.budget_cheaper_at,
            cheaper_model: c.budget_model.trim().to_owned(),
            refresh: Duration::from_secs(c.service_spend_refresh_secs),
            per_turn_prompt_tokens: c.max_prompt_tokens_per_turn,
        }
    }

    /// The stage of one budget at `share` of it.
    fn stage(&self, share: f64, scope: Scope) -> Allowance {
        if share >= 1.0 {
            Allowance::Stopped { scope }
        } else if share >= self.cheaper_at && !self.cheaper_model.is_empty() {
            Allowance::Cheaper {
                model: self.cheaper_model.clone(),
                scope,
            }
        } else {
            Allowance::Full
        }
    }

    /// The stricter of the user's and the service's stage.
    pub(crate) fn decide(&self, user: Spent, service: Spent) -> Allowance {
        let by_user = self.stage(self.user.share(user), Scope::User);
        let by_service = self.stage(self.service.share(service), Scope::Service);
        let rank = |a: &Allowance| match a {
            Allowance::Full => 0,
            Allowance::Cheaper { .. } => 1,
            Allowance::Stopped { .. } => 2,
        };
        if rank(&by_service) > rank(&by_user) {
            by_service
        } else {
            by_user
        }
    }
}

/// One tool loop's view of its user's spending (a DM turn has one loop, a group message one per
/// companion): read from the journal at the loop's first check (a DM's with its history, just before the
/// loop: [`SpendGuard::ride`]), then kept up to date with the loop's own calls, so that a loop of several
/// calls reads the journal once. Another turn of the same user spending
/// meanwhile is not seen until the next loop; a check has never been a reservation (two turns checked at
/// once both pass), so this moves no bound.
#[derive(Debug, Default)]
pub struct LoopSpend(std::sync::Mutex<Option<Spent>>);

impl LoopSpend {
    /// A loop whose user's spending was read already ([`SpendGuard::ride`]).
    pub fn knowing(spent: Option<Spent>) -> Self {
        Self(std::sync::Mutex::new(spent))
    }

    /// Counts a call this loop made (once its answer is in).
    pub fn add(&self, call: Spent) {
        if let Some(s) = self.0.lock().expect("spend lock").as_mut() {
            *s = *s + call;
        }
    }

    fn known(&self) -> Option<Spent> {
        *self.0.lock().expect("spend lock")
    }

    fn set(&self, spent: Spent) {
        *self.0.lock().expect("spend lock") = Some(spent);
    }
}

/// The check before each paid call, shared by a process's turns and follow-ups.
pub struct SpendGuard {
    pool: Pool,
    pub limits: SpendLimits,
    /// The service's figure and when it was read.
    service: tokio::sync::Mutex<Option<(Instant, Spent)>>,
    metrics: Arc<Metrics>,
}

impl SpendGuard {
    pub fn new(pool: Pool, limits: SpendLimits, metrics: Arc<Metrics>) -> Self {
        Self {
            pool,
            limits,
            service: tokio::sync::Mutex::new(None),
            metrics,
        }
    }

    /// The read of `user`'s spending as a ride of the history's statement (`store::Rides`; its
    /// value is [`Spent::ridden`]'s), when the user's budget is on: the loop then starts knowing it
    /// ([`LoopSpend::knowing`]) and does not read it at its first check.
    pub fn ride(
        &self,
        user: &str,
    ) -> Option<(&'static str, serde_json::Map<String, serde_json::Value>)> {
        (!self.limits.user.is_off()).then(|| {
            let args = spent_ride_args(&tally(user), self.limits.window.as_secs_f64());
            (SPENT_RIDE, args)
        })
    }

    /// What the next paid call on behalf of `user` may be; `so_far` is the calling loop's view of the
    /// user's spending (read here the first time).
    pub async fn check(&self, user: &str, so_far: &LoopSpend) -> Result<Allowance, StoreError> {
        let l = &self.limits;
        if l.user.is_off() && l.service.is_off() {
            return Ok(Allowance::Full);
        }
        let (user_spent, service_spent) = tokio::try_join!(
            async {
                if l.user.is_off() {
                    return Ok(Spent::default());
                }
                if let Some(known) = so_far.known() {
                    return Ok(known);
                }
                let spent = self.spent(Some(&tally(user))).await?;
                so_far.set(spent);
                Ok(spent)
            },
            self.service_spent(),
        )?;
        let allowance = l.decide(user_spent, service_spent);
        match &allowance {
            Allowance::Full => {}
            Allowance::Cheaper { model, scope } => {
                info!(scope = scope.label(), model = %model, spent_tokens = user_spent.tokens,
                      spent_usd = user_spent.usd, "near the budget: the cheaper model answers");
                let labels = [("scope", scope.label()), ("stage", "cheaper")];
                self.metrics.inc(&BUDGET_CALLS, &labels);
            }
            Allowance::Stopped { scope } => {
                warn!(
                    scope = scope.label(),
                    spent_tokens = user_spent.tokens,
                    spent_usd = user_spent.usd,
                    "at the budget: no call to the chat model"
                );
                let labels = [("scope", scope.label()), ("stage", "stopped")];
                self.metrics.inc(&BUDGET_CALLS, &labels);
            }
        }
        Ok(allowance)
    }

    /// Whether the service's budget still allows a call made for no user (memory's extraction), which
    /// counts against the service budget only.
    pub async fn service_allows(&self) -> Result<bool, StoreError> {
        let service = self.service_spent().await?;
        Ok(!matches!(
            self.limits.decide(Spent::default(), service),
            Allowance::Stopped { .. }
        ))
    }

    /// The service's spending in the window, read again when older than `refresh`; its share of the
    /// service budget is the gauge `companion_service_budget_ratio`.
    async fn service_spent(&self) -> Result<Spent, StoreError> {
        if self.limits.service.is_off() {
            return Ok(Spent::default());
        }
        let mut cached = self.service.lock().await;
        if let Some((at, spent)) = *cached
            && at.elapsed() < self.limits.refresh
        {
            return Ok(spent);
        }
        let spent = self.spent(None).await?;
        *cached = Some((Instant::now(), spent));
        let share = self.limits.service.share(spent);
        self.metrics.set_gauge(&SERVICE_BUDGET_RATIO, &[], share);
        self.metrics.set_gauge(&SERVICE_SPEND_USD, &[], spent.usd);
        Ok(spent)
    }

    /// Tokens and USD of the model answers in the window: under `tally`, or all of them.
    async fn spent(&self, tally: Option<&str>) -> Result<Spent, StoreError> {
        Ok(spent(&self.pool, tally, self.limits.window.as_secs_f64()).await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> SpendLimits {
        SpendLimits {
            user: Budget {
                tokens: 1000,
                usd: 0.10,
            },
            service: Budget {
                tokens: 0,
                usd: 10.0,
            },
            window: Duration::from_secs(60),
            cheaper_at: 0.8,
            cheaper_model: "cheap/model".into(),
            refresh: Duration::ZERO,
            per_turn_prompt_tokens: 0,
        }
    }

    fn spent(tokens: u64, usd: f64) -> Spent {
        Spent { tokens, usd }
    }

    #[test]
    fn each_budget_has_two_stages_and_the_stricter_one_decides() {
        let l = limits();
        let none = Spent::default();
        assert_eq!(l.decide(spent(799, 0.079), none), Allowance::Full);
        let cheaper = Allowance::Cheaper {
            model: "cheap/model".into(),
            scope: Scope::User,
        };
        assert_eq!(l.decide(spent(800, 0.0), none), cheaper, "tokens alone");
        assert_eq!(l.decide(spent(0, 0.085), none), cheaper, "USD alone");
        assert_eq!(
            l.decide(spent(1000, 0.0), none),
            Allowance::Stopped { scope: Scope::User }
        );
        // The service at its cap stops a user who is under theirs; near it, a user at theirs is still
        // stopped by their own.
        assert_eq!(
            l.decide(none, spent(5_000_000, 10.0)),
            Allowance::Stopped {
                scope: Scope::Service
            }
        );
        assert_eq!(
            l.decide(spent(0, 0.5), spent(0, 9.0)),
            Allowance::Stopped { scope: Scope::User }
        );
        // A service token count means nothing without a token cap.
        assert_eq!(l.decide(none, spent(u64::MAX, 0.0)), Allowance::Full);
    }

    #[test]
    fn without_a_cheaper_model_the_first_stage_is_skipped() {
        let l = SpendLimits {
            cheaper_model: String::new(),
            ..limits()
        };
        assert_eq!(l.decide(spent(999, 0.0), Spent::default()), Allowance::Full);
        assert_eq!(
            l.decide(spent(1000, 0.0), Spent::default()),
            Allowance::Stopped { scope: Scope::User }
        );
    }
}
