//! The PostgreSQL pool (`companion_store::store::Pool`): a statement that ended well hands its connection
//! back without sqlx's `Sync` on release, and everything else is still checked: a failed statement, a
//! dropped transaction, a backend that died, the bounds.

use std::str::FromStr;
use std::time::Duration;

use companion_dev::bench::pgwire::PgWireCounter;
use companion_dev::stub::{StubReply, always};
use companion_store::store::{Pool, PoolSettings};
use sqlx::postgres::PgConnectOptions;

use crate::env::*;

/// A pool of at most `max` connections to the test's database, through a proxy that counts round trips;
/// idle connections are checked after `check_idle_after`.
async fn counted_pool(
    env: &TestEnv,
    max: u32,
    check_idle_after: Duration,
) -> (Pool, PgWireCounter) {
    let url = env.config.pg.url.clone();
    let upstream = {
        let o = PgConnectOptions::from_str(&url).unwrap();
        format!("{}:{}", o.get_host(), o.get_port())
    };
    let counter = PgWireCounter::start(upstream).await.unwrap();
    let pool = pool_at(&counter.url(&url), max, check_idle_after).await;
    (pool, counter)
}

/// A pool straight to the test's database (the proxy does not pass a server's hang-up on).
async fn direct_pool(env: &TestEnv, max: u32, check_idle_after: Duration) -> Pool {
    pool_at(&env.config.pg.url, max, check_idle_after).await
}

async fn pool_at(url: &str, max: u32, check_idle_after: Duration) -> Pool {
    let options = PgConnectOptions::from_str(url).unwrap();
    let mut settings = PoolSettings::new(max);
    settings.acquire_timeout = Duration::from_millis(500);
    settings.check_idle_after = check_idle_after;
    Pool::connect(options, settings).await.unwrap()
}

/// Longer than a test: no idle check interferes with what a test counts.
const MINUTE: Duration = Duration::from_secs(60);

async fn one(pool: &Pool) -> Result<i32, sqlx::Error> {
    sqlx::query_scalar("SELECT 1").fetch_one(pool).await
}

/// Waits until the pool has `n` idle connections (a check on release runs off the caller's path).
async fn idle(pool: &Pool, n: usize) {
    for _ in 0..200 {
        if pool.num_idle() == n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!(
        "the pool never had {n} idle connections: {}",
        pool.num_idle()
    );
}

#[tokio::test]
async fn a_statement_that_ended_well_costs_one_round_trip() {
    let env = TestEnv::new(always(StubReply::text("unused"))).await;
    let (pool, counter) = counted_pool(&env, 4, MINUTE).await;
    let series = || sqlx::query_scalar::<_, i32>("SELECT generate_series(1, 3)").fetch_all(&pool);
    // Prepared first (a statement's first run on a connection adds its Parse's round trip).
    one(&pool).await.unwrap();
    series().await.unwrap();
    counter.reset();
    for _ in 0..10 {
        assert_eq!(one(&pool).await.unwrap(), 1);
    }
    assert_eq!(series().await.unwrap(), [1, 2, 3]);
    // sqlx's pool adds a `Sync` on every release.
    assert_eq!(counter.round_trips(), 11, "one round trip a statement");
    assert_eq!(pool.num_idle(), 1, "one connection served them all");
    pool.close().await;
    env.finish().await;
}

#[tokio::test]
async fn a_failed_statement_s_connection_is_checked_before_it_is_reused() {
    let env = TestEnv::new(always(StubReply::text("unused"))).await;
    let (pool, counter) = counted_pool(&env, 1, MINUTE).await;
    one(&pool).await.unwrap();
    counter.reset();
    let err = sqlx::query("SELECT no_such_column FROM pg_class")
        .execute(&pool)
        .await
        .unwrap_err();
    assert!(matches!(err, sqlx::Error::Database(_)), "{err:?}");
    idle(&pool, 1).await;
    assert_eq!(
        counter.round_trips(),
        2,
        "the statement (its Parse fails) and the check"
    );
    assert_eq!(one(&pool).await.unwrap(), 1, "the connection still serves");
    pool.close().await;
    env.finish().await;
}

#[tokio::test]
async fn a_transaction_dropped_before_its_commit_is_rolled_back() {
    let env = TestEnv::new(always(StubReply::text("unused"))).await;
    let pool = direct_pool(&env, 1, MINUTE).await;
    sqlx::query("CREATE TABLE pool_probe (n int)")
        .execute(&pool)
        .await
        .unwrap();
    {
        let mut tx = pool.begin().await.unwrap();
        sqlx::query("INSERT INTO pool_probe VALUES (1)")
            .execute(&mut *tx)
            .await
            .unwrap();
    }
    let mut tx = pool.begin().await.unwrap();
    sqlx::query("INSERT INTO pool_probe VALUES (2)")
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let rows: Vec<i32> = sqlx::query_scalar("SELECT n FROM pool_probe ORDER BY n")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(
        rows,
        [2],
        "the dropped transaction's row is gone, the committed one stays"
    );
    // A SELECT in a transaction of its own has no transaction id; in one left open by an INSERT, it has.
    let xid: Option<String> = sqlx::query_scalar("SELECT pg_current_xact_id_if_assigned()::text")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(xid, None, "no transaction left open on the connection");
    pool.close().await;
    env.finish().await;
}

#[tokio::test]
async fn a_dead_backend_costs_at_most_one_statement_and_an_idle_one_none() {
    let env = TestEnv::new(always(StubReply::text("unused"))).await;
    // Ends the backend and waits until it is gone.
    let kill = |pid: i32| {
        let admin = env.pg.pool.clone();
        async move {
            let done: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
                .bind(pid)
                .fetch_one(&admin)
                .await
                .unwrap();
            assert!(done);
            for _ in 0..500 {
                let alive: bool = sqlx::query_scalar(
                    "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1)",
                )
                .bind(pid)
                .fetch_one(&admin)
                .await
                .unwrap();
                if !alive {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            panic!("backend {pid} did not end");
        }
    };
    let pid = |pool: &Pool| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, i32>("SELECT pg_backend_pid()")
                .fetch_one(&pool)
                .await
        }
    };
    // Killed between statements, with no idle check to catch it: that statement fails, and its
    // connection is checked and closed, so the next runs on a new one.
    let pool = direct_pool(&env, 1, MINUTE).await;
    let first = pid(&pool).await.unwrap();
    kill(first).await;
    assert!(one(&pool).await.is_err(), "the dead connection was used");
    let second = pid(&pool).await.unwrap();
    assert_ne!(first, second);
    pool.close().await;
    // Killed while idle longer than the check's threshold: nothing fails.
    let pool = direct_pool(&env, 1, Duration::from_millis(100)).await;
    let before = pid(&pool).await.unwrap();
    kill(before).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let after = pid(&pool)
        .await
        .expect("the idle check replaced the dead connection");
    assert_ne!(before, after);
    pool.close().await;
    env.finish().await;
}

#[tokio::test]
async fn a_caller_waits_at_most_the_acquire_timeout_for_a_connection() {
    let env = TestEnv::new(always(StubReply::text("unused"))).await;
    let pool = direct_pool(&env, 1, MINUTE).await;
    let held = pool.lease().await.unwrap();
    let err = one(&pool).await.unwrap_err();
    assert!(matches!(err, sqlx::Error::PoolTimedOut), "{err:?}");
    drop(held);
    assert_eq!(
        one(&pool).await.unwrap(),
        1,
        "served once the lease is back"
    );
    pool.close().await;
    assert!(matches!(
        one(&pool).await.unwrap_err(),
        sqlx::Error::PoolClosed
    ));
    env.finish().await;
}
