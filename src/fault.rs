//! Faults the integration tests inject (feature `testing` only, never in the production binary): a panic
//! when a chosen job starts a chosen journal step (`llm`), or is about to commit a transactional step's
//! record (`commit:crisis`), to show that the delivery's boundary settles it and that nothing is counted
//! or written twice.

use std::sync::Mutex;

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
pub(crate) fn at(job: &str, step: &str) {
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
