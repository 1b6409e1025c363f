//! Faults the integration tests inject (feature `testing` only, never in the production binary): a panic
//! when a chosen job starts a chosen journal step (`llm`), or is about to commit a transactional step's
//! record (`commit:crisis`), to show that the delivery's boundary settles it and that nothing is counted
//! or written twice; and a pause at such a point (or inside the history write, `history:locked`), to let a
//! test commit something else in the window between a writer's check and its commit.

use std::sync::{Arc, Mutex, OnceLock};

use tokio::sync::Notify;

/// A panic armed for the jobs whose id contains `job`, at step `step`, for `times` more hits.
struct Armed {
    job: String,
    step: String,
    times: u32,
}

static ARMED: Mutex<Vec<Armed>> = Mutex::new(Vec::new());

/// Panics the next `times` times a job whose id contains `job` starts step `step` (tests run in one
/// process: the job's id, random per test, keeps a fault to its test).
pub fn panic_at(job: &str, step: &str, times: u32) {
    ARMED.lock().expect("fault lock").push(Armed {
        job: job.to_owned(),
        step: step.to_owned(),
        times,
    });
}

/// A step is starting: panics if a fault is armed for it.
pub fn at(job: &str, step: &str) {
    let hit = {
        let mut armed = ARMED.lock().expect("fault lock");
        armed
            .iter_mut()
            .find(|a| a.times > 0 && a.step == step && job.contains(&a.job))
            .map(|a| a.times -= 1)
            .is_some()
    };
    if hit {
        panic!("a fault injected at step {step} of job {job}");
    }
}

/// A pause armed for the first work whose scope (a job id, or the user messages of a history write) contains
/// `scope`, at `point`.
struct ArmedPause {
    scope: String,
    point: String,
    pause: Pause,
}

static PAUSES: Mutex<Vec<ArmedPause>> = Mutex::new(Vec::new());

/// The test's side of a pause: [`Pause::reached`] waits until the paused work is held at its point,
/// [`Pause::release`] lets it go on.
#[derive(Clone, Default)]
pub struct Pause {
    reached: Arc<Notify>,
    released: Arc<Notify>,
}

impl Pause {
    /// Waits until the work is held at its point.
    pub async fn reached(&self) {
        self.reached.notified().await;
    }

    /// Lets the held work go on (or lets it pass without holding, if it has not arrived yet).
    pub fn release(&self) {
        self.released.notify_one();
    }
}

/// Holds the first work whose scope contains `scope` when it reaches `point`, until the test releases
/// it. Points: a journal step starting (its name, `store_reply`), and `history:locked` (a history write
/// holding its locks, its rows inserted, before its commit; scope: the ids of the user messages it writes).
pub fn pause_at(scope: &str, point: &str) -> Pause {
    let pause = Pause::default();
    PAUSES.lock().expect("fault lock").push(ArmedPause {
        scope: scope.to_owned(),
        point: point.to_owned(),
        pause: pause.clone(),
    });
    pause
}

/// For a worker process a test spawns (and then kills): `COMPANION_TEST_HOLD=<scope>@<point>` holds for
/// good every work of that scope reaching that point.
static HOLD: OnceLock<Option<(String, String)>> = OnceLock::new();

fn held_for_good(scope: &str, point: &str) -> bool {
    let hold = HOLD.get_or_init(|| {
        let v = std::env::var("COMPANION_TEST_HOLD").ok()?;
        let (scope, point) = v.split_once('@')?;
        Some((scope.to_owned(), point.to_owned()))
    });
    matches!(hold, Some((s, p)) if p == point && scope.contains(s.as_str()))
}

/// Whether work of `scope` would be held at `point`: for code whose fast path has no place to hold (one
/// statement doing what a held path does in several), so that it takes the held path only then.
pub fn armed(scope: &str, point: &str) -> bool {
    held_for_good(scope, point)
        || PAUSES
            .lock()
            .expect("fault lock")
            .iter()
            .any(|a| a.point == point && scope.contains(&a.scope))
}

/// Work of `scope` reached `point`: held there if a pause is armed for it (once), or for good if the
/// process was started to hold it.
pub async fn reached(scope: &str, point: &str) {
    if held_for_good(scope, point) {
        tracing::warn!(scope, point, "held for good (COMPANION_TEST_HOLD)");
        std::future::pending::<()>().await;
    }
    let hit = {
        let mut armed = PAUSES.lock().expect("fault lock");
        armed
            .iter()
            .position(|a| a.point == point && scope.contains(&a.scope))
            .map(|i| armed.swap_remove(i).pause)
    };
    if let Some(pause) = hit {
        tracing::info!(scope, point, "held by a test's pause");
        pause.reached.notify_one();
        pause.released.notified().await;
    }
}
