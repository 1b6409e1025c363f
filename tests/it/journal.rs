//! The journal's covering step under two attempts of one job at once (a redelivery that arrives while
//! the first delivery still runs): both attempts end with the same record, and exactly the jobs that
//! record names are covered. If each attempt covered the followers it saw and then raced to record its
//! own list, the loser's extra followers would be left covered by a reply that never answered them (a
//! few events of the MongoDB outage test never answered).
//!
//! And the packed form of a statement's lazy receipts: one row written, every record read back; and the
//! opening a tombstone stops before its job's row exists.

use bson::oid::ObjectId;
use companion_dev::stub::{StubReply, always};
use companion_journal::names::{PACKED, key};
use companion_journal::{Finish, JournalError, NewJob, State, StepKind};
use serde_json::{Value, json};

use crate::env::*;

/// Steps of the pipeline's names, their records read as JSON (the journal stores what a kind gives it)
/// and packable as the pipeline's are.
mod step {
    use super::*;

    pub(super) const BURST: StepKind<Vec<String>> = StepKind::new("burst");
    pub(super) const LLM: StepKind<Value> = StepKind::new("llm");
    pub(super) const FLOW: StepKind<Value> = StepKind::new("flow");
    pub(super) const STORE_REPLY: StepKind<Value> = StepKind::new("store_reply").packed();
    pub(super) const HISTORY: StepKind<Value> = StepKind::new("history").packed();
    pub(super) const TOUCH: StepKind<Value> = StepKind::new("touch").packed();
    pub(super) const PUBLISH: StepKind<Value> = StepKind::new("publish").packed();
    pub(super) const AFTER_FLAG: StepKind<Value> = StepKind::new("after_flag").packed();
    pub(super) const FLOOD: StepKind<Value> = StepKind::new("flood").packed();
}

/// A DM turn's job for the user, companion and conversation `who`.
fn job<'a>(id: &'a str, seq: u64, who: &'a [String]) -> NewJob<'a> {
    NewJob {
        id,
        kind: "dm_turn",
        user: &who[0],
        bot: &who[1],
        conversation: &who[2],
        stream_seq: Some(seq),
        reads: Default::default(),
    }
}

#[tokio::test]
async fn two_attempts_covering_at_once_agree_and_cover_only_what_they_record() {
    let env = TestEnv::new(always(StubReply::text("unused"))).await;
    let journal = env.journal();
    let (user, bot, conversation) = (
        ObjectId::new().to_hex(),
        ObjectId::new().to_hex(),
        ObjectId::new().to_hex(),
    );
    let who = [user, bot, conversation];
    for round in 0..10 {
        let head_id = ObjectId::new().to_hex();
        let head = job(&head_id, 1, &who);
        let ids: Vec<String> = (0..6).map(|_| ObjectId::new().to_hex()).collect();
        let all: Vec<NewJob> = ids
            .iter()
            .enumerate()
            .map(|(i, id)| job(id, 2 + i as u64, &who))
            .collect();
        // The first attempt saw one follower in the stream, the second (later) all six.
        let (a, b) = (
            journal.open(&head).await.unwrap(),
            journal.open(&head).await.unwrap(),
        );
        let names = |n: usize| -> Vec<String> { ids[..n].to_vec() };
        let (ra, rb) = tokio::join!(
            a.covering(&step::BURST, "", &all[..1], names),
            b.covering(&step::BURST, "", &all, names),
        );
        let (ra, rb) = (ra.unwrap(), rb.unwrap());
        assert_eq!(ra, rb, "round {round}: both attempts go on with one burst");
        let mut covered = Vec::new();
        for id in &ids {
            let r = journal.get(id).await.unwrap();
            if r.is_some_and(|r| r.covered_by.as_deref() == Some(head_id.as_str())) {
                covered.push(id.clone());
            }
        }
        assert_eq!(
            covered, ra,
            "round {round}: covered exactly the followers the recorded burst answers"
        );
    }
    env.finish().await;
}

/// A statement's lazy receipts (of packable kinds, [`StepKind::packed`]) are one `packed` row, where a lazy step that is not
/// packable keeps its own; the job's next attempt finds each receipt recorded (so it does not redo it),
/// `job_records` and `companion explain`'s story list each, and a reopen that forgets one takes it out
/// of the pack. A packed row an erasure scrubbed reads as no record.
#[tokio::test]
async fn lazy_receipts_are_written_as_one_row_and_read_back_one_by_one() {
    let env = TestEnv::new(always(StubReply::text("unused"))).await;
    let journal = env.journal();
    let who: Vec<String> = (0..4).map(|_| ObjectId::new().to_hex()).collect();
    let new = NewJob {
        id: &who[0],
        kind: "dm_turn",
        user: &who[1],
        bot: &who[2],
        conversation: &who[3],
        stream_seq: Some(1),
        reads: Default::default(),
    };
    let receipts = [
        (step::STORE_REPLY, "g0"),
        (step::HISTORY, "g0"),
        (step::TOUCH, "g0"),
        (step::PUBLISH, "g0"),
        (step::AFTER_FLAG, key::ONCE),
        (step::FLOOD, key::ONCE),
    ];
    let first = journal.open(&new).await.unwrap();
    for (kind, key) in receipts {
        let name = kind.name;
        let out = first
            .step(&kind, key)
            .lazy()
            .run(async { Ok::<_, JournalError>(json!(format!("{name} done"))) })
            .await
            .unwrap();
        assert_eq!(out, json!(format!("{name} done")));
    }
    first
        .step(&step::FLOW, key::ONCE)
        .lazy()
        .run(async { Ok::<_, JournalError>(json!({"flow": null})) })
        .await
        .unwrap();
    assert!(first.finish(State::Done, Finish::default()).await.unwrap());

    let rows: Vec<(String, Value)> =
        sqlx::query_as("SELECT name, output FROM job_steps WHERE job = $1 ORDER BY name")
            .bind(&who[0])
            .fetch_all(&env.pg.pool)
            .await
            .unwrap();
    let names: Vec<&str> = rows.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, [step::FLOW.name, PACKED], "{rows:?}");
    assert_eq!(rows[1].1.as_array().map(Vec::len), Some(6), "{rows:?}");

    let again = journal.open(&new).await.unwrap();
    for (kind, key) in receipts {
        let name = kind.name;
        assert_eq!(
            again.recorded(&kind, key),
            Some(json!(format!("{name} done"))),
            "{name}"
        );
    }
    assert_eq!(
        again.recorded(&step::FLOW, key::ONCE),
        Some(json!({"flow": null}))
    );
    async fn listed(pool: &companion_store::store::Pool, job: &str) -> Vec<String> {
        sqlx::query_scalar(
            "SELECT name || ':' || key FROM job_records WHERE job = $1 ORDER BY name",
        )
        .bind(job)
        .fetch_all(pool)
        .await
        .unwrap()
    }
    assert_eq!(
        listed(&env.pg.pool, &who[0]).await,
        [
            "after_flag:",
            "flood:",
            "flow:",
            "history:g0",
            "publish:g0",
            "store_reply:g0",
            "touch:g0"
        ]
    );
    let story = companion_journal::story::story(&env.pg.pool, &who[0])
        .await
        .unwrap()
        .expect("the job's story");
    let mut told: Vec<&str> = story.steps.iter().map(|s| s.name.as_str()).collect();
    told.sort_unstable();
    assert_eq!(
        told,
        [
            "after_flag",
            "flood",
            "flow",
            "history",
            "publish",
            "store_reply",
            "touch"
        ]
    );

    // A replay's reopen forgets the flood decision, packed or not, and keeps the rest.
    journal.reopen(&who[0], &[step::FLOOD.name]).await.unwrap();
    let replayed = journal.open(&new).await.unwrap();
    assert_eq!(replayed.record.state, State::Running);
    assert_eq!(replayed.recorded(&step::FLOOD, key::ONCE), None);
    assert!(replayed.recorded(&step::AFTER_FLAG, key::ONCE).is_some());

    // A user's erasure scrubs every record of their jobs, a pack too: `SCRUB` (memory/erase.rs) leaves
    // `{"erased": true}` of an output with no `usage`, written here as it would.
    sqlx::query("UPDATE job_steps SET output = '{\"erased\": true}' WHERE job = $1")
        .bind(&who[0])
        .execute(&env.pg.pool)
        .await
        .unwrap();
    assert_eq!(listed(&env.pg.pool, &who[0]).await, ["flow:"]);
    let scrubbed = journal.open(&new).await.unwrap();
    assert_eq!(scrubbed.recorded(&step::PUBLISH, "g0"), None);
    env.finish().await;
}

/// A turn's opening carries the memory probe as its guard: a tombstone stops the job before its row
/// exists (and an existing job's attempts stay as they were); otherwise the job opens with the probe's
/// row beside it.
#[tokio::test]
async fn a_guarded_opening_writes_no_job_for_a_tombstoned_message_and_returns_the_probe() {
    use companion_journal::{Guard, Opened};
    let env = TestEnv::new(always(StubReply::text("unused"))).await;
    let journal = env.journal();
    let ids: Vec<String> = (0..5).map(|_| ObjectId::new().to_hex()).collect();
    let [user, bot, _, message, later] = &ids[..] else {
        unreachable!()
    };
    let messages = [message.clone()];
    let guard = Guard {
        sql: companion_memory::PROBE_GUARD,
        user,
        bot,
        messages: &messages,
    };
    let job_row = |id: String| {
        let pool = env.pg.pool.clone();
        async move {
            sqlx::query_scalar::<_, i32>("SELECT attempts FROM jobs WHERE id = $1")
                .bind(id)
                .fetch_optional(&pool)
                .await
                .unwrap()
        }
    };
    let tombstone = |kind: &'static str, id: String| {
        let pool = env.pg.pool.clone();
        async move {
            sqlx::query("INSERT INTO tombstones (kind, id) VALUES ($1, $2)")
                .bind(kind)
                .bind(id)
                .execute(&pool)
                .await
                .unwrap();
        }
    };
    // Stopped, and no job row for it.
    let stopped_without_a_row = async |id: &str, guard: &Guard<'_>| {
        let opened = journal.open_unless(&job(id, 1, &ids), guard).await.unwrap();
        matches!(opened, Opened::Stopped(_)) && job_row(id.to_owned()).await.is_none()
    };
    let job_id = format!("dm:{message}");
    // Nothing deleted: the job opens, and the probe's row comes with it.
    match journal
        .open_unless(&job(&job_id, 1, &ids), &guard)
        .await
        .unwrap()
    {
        Opened::Job(job, probe) => {
            assert_eq!(job.record.attempts, 1);
            assert_eq!(
                probe,
                json!({"gone": false, "remembers": false, "waiting": 0})
            );
        }
        Opened::Stopped(probe) => panic!("stopped: {probe}"),
    }
    tombstone("message", message.clone()).await;
    // Deleted since: a redelivery is stopped, and its job is not counted another attempt.
    match journal
        .open_unless(&job(&job_id, 1, &ids), &guard)
        .await
        .unwrap()
    {
        Opened::Stopped(probe) => assert_eq!(probe["gone"], json!(true)),
        Opened::Job(..) => panic!("a deleted message's job opened"),
    }
    assert_eq!(job_row(job_id.clone()).await, Some(1));
    // Deleted before its first delivery: no job row at all.
    let later_id = format!("dm:{later}");
    let both = [later.clone(), message.clone()];
    let guard = Guard {
        messages: &both,
        ..guard
    };
    assert!(stopped_without_a_row(&later_id, &guard).await);
    // An erased user stops any message of theirs.
    tombstone("user", user.clone()).await;
    let fresh = [ObjectId::new().to_hex()];
    let guard = Guard {
        messages: &fresh,
        ..guard
    };
    assert!(stopped_without_a_row(&later_id, &guard).await);
}

/// Carries what `job` owes by a history read (as the compose stage does): the write's value, and how
/// the record ended.
async fn carried(
    env: &TestEnv,
    who: &[String],
    job: &companion_journal::Job,
) -> (Value, Result<(), JournalError>) {
    use companion_journal::OWED_WRITE;
    use companion_store::store::Rides;
    let owed = job.owing().expect("owed");
    let mut rides = Rides::default();
    assert!(rides.push_write(OWED_WRITE, owed.args()));
    assert!(
        !rides.push_write(OWED_WRITE, Default::default()),
        "one write a statement"
    );
    let history = env.pg.history(&who[0], &who[1], 5, &rides).await.unwrap();
    assert_eq!(history.rides.len(), 1, "{:?}", history.rides);
    let value = history.rides[0].clone();
    (value.clone(), owed.ridden(Some(value)).await)
}

/// Two attempts of the job `head`: the first has run a burst with nothing to cover (its record owed).
async fn owing_and_another(
    journal: &companion_journal::Journal,
    head: &NewJob<'_>,
) -> (companion_journal::Job, companion_journal::Job) {
    let (owing, other) = (
        journal.open(head).await.unwrap(),
        journal.open(head).await.unwrap(),
    );
    let none: Vec<String> = owing
        .covering(&step::BURST, key::ONCE, &[], |_| Vec::new())
        .await
        .unwrap();
    assert!(none.is_empty());
    (owing, other)
}

/// A burst with nothing to cover owes its record (`Step::run_owed`, issue 64): the history's read carries
/// it (`store::Rides::push_write`), or the attempt's next record writes it first. Against another
/// attempt that covered a follower meanwhile, the owing attempt ends (`Raced`, transient) at that read or
/// at that next record, having written nothing of its own; when the owed record is there first, the
/// covering attempt covers nothing.
#[tokio::test]
async fn an_owed_burst_rides_with_the_history_read_and_loses_to_an_attempt_that_covered_first() {
    use companion_core::failure::{Class, Classify};
    let env = TestEnv::new(always(StubReply::text("unused"))).await;
    let journal = env.journal();
    let who: Vec<String> = (0..3).map(|_| ObjectId::new().to_hex()).collect();
    let ids: Vec<String> = (0..8).map(|_| ObjectId::new().to_hex()).collect();
    let none = |_: usize| -> Vec<String> { Vec::new() };
    let pool = &env.pg.pool;
    let steps = |id: String| async move {
        let rows: Vec<(String, Value)> =
            sqlx::query_as("SELECT name, output FROM job_records WHERE job = $1 ORDER BY name")
                .bind(id)
                .fetch_all(pool)
                .await
                .unwrap();
        rows
    };
    // Carried by the read: nothing written before it, the record after it.
    let a = journal.open(&job(&ids[0], 1, &who)).await.unwrap();
    let out: Vec<String> = a
        .covering(&step::BURST, key::ONCE, &[], none)
        .await
        .unwrap();
    assert!(out.is_empty());
    assert!(steps(ids[0].clone()).await.is_empty(), "owed, not written");
    let (written, paid) = carried(&env, &who, &a).await;
    assert_eq!(written, json!([]));
    paid.unwrap();
    assert_eq!(
        steps(ids[0].clone()).await,
        [(step::BURST.name.to_owned(), json!([]))]
    );
    assert!(a.owing().is_none(), "paid");

    // Written first by the attempt's next record when no read carried it.
    let b = journal.open(&job(&ids[1], 1, &who)).await.unwrap();
    let _: Vec<String> = b
        .covering(&step::BURST, key::ONCE, &[], none)
        .await
        .unwrap();
    b.step(&step::LLM, "0")
        .run(async { Ok::<_, JournalError>(json!("an answer")) })
        .await
        .unwrap();
    let names: Vec<String> = steps(ids[1].clone())
        .await
        .into_iter()
        .map(|r| r.0)
        .collect();
    assert_eq!(names, [step::BURST.name, step::LLM.name]);

    // Another attempt covered a follower first: the owing attempt ends at its read, and at its next
    // record, with nothing of its own written.
    for (round, at_read) in [(2usize, true), (4, false)] {
        let follower = [job(&ids[round + 1], 2, &who)];
        let (owing, covering) = owing_and_another(&journal, &job(&ids[round], 1, &who)).await;
        let names = |n: usize| -> Vec<String> { ids[round + 1..round + 1 + n].to_vec() };
        let covered = covering
            .covering(&step::BURST, key::ONCE, &follower, names)
            .await
            .unwrap();
        assert_eq!(covered, [ids[round + 1].clone()]);
        let err = match at_read {
            true => carried(&env, &who, &owing).await.1,
            false => owing
                .step(&step::LLM, "0")
                .run(async { Ok::<_, JournalError>(json!("an answer")) })
                .await
                .map(|_: Value| ()),
        }
        .expect_err("the owing attempt ends");
        assert!(matches!(err, JournalError::Raced { .. }), "{err}");
        assert_eq!(err.class(), Class::Transient);
        assert_eq!(
            steps(ids[round].clone()).await,
            [(step::BURST.name.to_owned(), json!([ids[round + 1]]))],
            "round {round}: only the covering attempt's record"
        );
        let f = journal.get(&ids[round + 1]).await.unwrap().unwrap();
        assert_eq!(f.covered_by.as_deref(), Some(ids[round].as_str()));
    }

    // The owed record first: an attempt that would cover adopts it and covers nothing.
    let follower = [job(&ids[7], 2, &who)];
    let (owing, covering) = owing_and_another(&journal, &job(&ids[6], 1, &who)).await;
    carried(&env, &who, &owing).await.1.unwrap();
    let names = |n: usize| -> Vec<String> { ids[7..7 + n].to_vec() };
    let adopted = covering
        .covering(&step::BURST, key::ONCE, &follower, names)
        .await
        .unwrap();
    assert!(adopted.is_empty(), "{adopted:?}");
    assert!(journal.get(&ids[7]).await.unwrap().is_none(), "not covered");

    // An owed record committing while the covering attempt's insert waits on it (held open here in a
    // transaction, where the history's statement commits within milliseconds): the covering attempt
    // undoes its covering and adopts it.
    let ids: Vec<String> = (0..2).map(|_| ObjectId::new().to_hex()).collect();
    let head = job(&ids[0], 1, &who);
    journal.open(&head).await.unwrap();
    let mut owed = env.pg.pool.begin().await.unwrap();
    sqlx::query("INSERT INTO job_steps (job, name, key, output) VALUES ($1, $2, $3, '[]')")
        .bind(&ids[0])
        .bind(step::BURST.name)
        .bind(key::ONCE)
        .execute(&mut *owed)
        .await
        .unwrap();
    let covering = journal.open(&head).await.unwrap();
    let follower = [job(&ids[1], 2, &who)];
    let names = |n: usize| -> Vec<String> { ids[1..1 + n].to_vec() };
    // Committed only once the covering attempt's insert is seen waiting on it.
    let (adopted, ()) = tokio::join!(
        covering.covering(&step::BURST, key::ONCE, &follower, names),
        async {
            let seen = eventually(std::time::Duration::from_secs(10), || async {
                let waiting: i64 = sqlx::query_scalar(
                    "SELECT count(*) FROM pg_stat_activity
                     WHERE datname = current_database() AND wait_event_type = 'Lock'",
                )
                .fetch_one(&env.pg.pool)
                .await
                .unwrap();
                waiting > 0
            })
            .await;
            assert!(
                seen,
                "the covering attempt's insert waits on the open record"
            );
            owed.commit().await.unwrap();
        }
    );
    assert_eq!(adopted.unwrap(), Vec::<String>::new());
    assert!(journal.get(&ids[1]).await.unwrap().is_none(), "not covered");
    env.finish().await;
}
