//! What the measured turns asked of PostgreSQL, per turn (docs/benchmark.md, "PostgreSQL's work per
//! turn"): statements and the top ones by time from `pg_stat_statements` (the local stack preloads it),
//! and transactions, rows written and WAL from the server's own counters of the run's database. Only the
//! run's database is counted: other databases on the server (a test run beside the bench) are not.
//!
//! A statement here is one execution the server saw (`BEGIN` and `COMMIT` included); a round trip is one
//! client request the server answered (a simple query, or an extended-protocol batch ending in `Sync`,
//! which is also how sqlx's pool checks a connection before handing it out), counted by [`super::pgwire`]
//! when the workers go through it.

use serde::Serialize;
use sqlx::{Connection, PgConnection, Row};

use super::BenchError;

/// How many statements the report lists.
const TOP: usize = 12;

/// PostgreSQL's work per measured turn.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct PgWork {
    /// Executions of statements, `BEGIN` and `COMMIT` included.
    pub statements_per_turn: f64,
    /// Of which transaction control (`BEGIN`, `COMMIT`, `ROLLBACK`, savepoints).
    pub transaction_control_per_turn: f64,
    /// Client requests the server answered (queries and `Sync`s), when counted.
    pub round_trips_per_turn: Option<f64>,
    /// Committed transactions (each statement outside `BEGIN` … `COMMIT` is one).
    pub commits_per_turn: f64,
    /// Rows inserted, updated and deleted in the run's database (the server's `tup_inserted`,
    /// `tup_updated` and `tup_deleted`): every row, also those a function or a `WITH` writes, which
    /// pg_stat_statements' `rows` does not count (it counts what a statement returns).
    pub rows_written_per_turn: f64,
    /// Rows returned or touched by the statements (pg_stat_statements' `rows`).
    pub rows_per_turn: f64,
    /// Write-ahead log written by the statements, bytes.
    pub wal_bytes_per_turn: f64,
    /// Execution time inside the server, ms (not the round trips).
    pub exec_ms_per_turn: f64,
    /// The statements with the most execution time.
    pub top: Vec<TopStatement>,
}

/// One normalised statement of [`PgWork::top`].
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct TopStatement {
    /// The statement with its parameters as `$n`, whitespace collapsed, cut at 160 characters.
    pub query: String,
    pub calls_per_turn: f64,
    pub rows_per_turn: f64,
    pub exec_ms_per_turn: f64,
    /// Share of all execution time.
    pub share: f64,
}

/// The server's counters of one database at a moment.
#[derive(Clone, Copy, Debug, Default)]
struct DbCounters {
    commits: i64,
    rows_written: i64,
}

/// How long a backend may keep its counters before it reports them to the statistics: at once after a
/// transaction at most once a second, and an idle one after 10 s (PostgreSQL's `PGSTAT_IDLE_INTERVAL`).
const STATS_FLUSH: std::time::Duration = std::time::Duration::from_secs(11);

/// Counts the run's database from [`Counter::start`] to [`Counter::finish`].
pub struct Counter {
    admin_url: String,
    database: String,
    before: DbCounters,
    /// False when pg_stat_statements is not loaded: only the database counters are reported.
    statements: bool,
}

impl Counter {
    /// Starts counting `database`: once the warm-up's counters have reached the statistics, reads the
    /// database's counters and resets pg_stat_statements (the whole server's: a bench run owns the local
    /// stack while it measures).
    pub async fn start(admin_url: &str, database: &str) -> Result<Self, BenchError> {
        tokio::time::sleep(STATS_FLUSH).await;
        let mut conn = connect(admin_url).await?;
        let before = db_counters(&mut conn, database).await?;
        let usable = match sqlx::query("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            .execute(&mut conn)
            .await
        {
            Ok(_) => sqlx::query("SELECT pg_stat_statements_reset()")
                .execute(&mut conn)
                .await
                .map(drop),
            Err(e) => Err(e),
        };
        // Either cause is possible: the library not preloaded, or a connection that may not reset it.
        if let Err(e) = &usable {
            eprintln!(
                "bench: pg_stat_statements cannot be used ({e}): statements are not counted. It needs the \
                 library preloaded (deploy/local/stack.sh loads it when it starts PostgreSQL: `stack.sh down \
                 postgres && stack.sh up`) and a superuser's connection (POSTGRES_ADMIN_URL, which \
                 `eval \"$(deploy/local/stack.sh env)\"` sets)"
            );
        }
        let statements = usable.is_ok();
        Ok(Self {
            admin_url: admin_url.to_owned(),
            database: database.to_owned(),
            before,
            statements,
        })
    }

    /// The work per turn of `turns` turns since [`Counter::start`]; `round_trips` as counted.
    pub async fn finish(
        &self,
        turns: usize,
        round_trips: Option<u64>,
    ) -> Result<PgWork, BenchError> {
        tokio::time::sleep(STATS_FLUSH).await;
        let mut conn = connect(&self.admin_url).await?;
        sqlx::query("SELECT pg_stat_clear_snapshot()")
            .execute(&mut conn)
            .await
            .map_err(|e| setup("clearing the statistics snapshot", e))?;
        let after = db_counters(&mut conn, &self.database).await?;
        let per = |x: f64| x / turns.max(1) as f64;
        let mut work = PgWork {
            commits_per_turn: per((after.commits - self.before.commits) as f64),
            rows_written_per_turn: per((after.rows_written - self.before.rows_written) as f64),
            round_trips_per_turn: round_trips.map(|n| per(n as f64)),
            ..PgWork::default()
        };
        if !self.statements {
            return Ok(work);
        }
        let rows = sqlx::query(
            "SELECT s.query, s.calls, s.rows, s.total_exec_time, s.wal_bytes::float8 AS wal \
             FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid \
             WHERE d.datname = $1 ORDER BY s.total_exec_time DESC",
        )
        .bind(&self.database)
        .fetch_all(&mut conn)
        .await
        .map_err(|e| setup("reading pg_stat_statements", e))?;
        let mut all = Vec::new();
        for r in &rows {
            let query: String = r.try_get("query").unwrap_or_default();
            let calls: i64 = r.try_get("calls").unwrap_or(0);
            let n: i64 = r.try_get("rows").unwrap_or(0);
            let ms: f64 = r.try_get("total_exec_time").unwrap_or(0.0);
            let wal: f64 = r.try_get("wal").unwrap_or(0.0);
            all.push((query, calls, n, ms, wal));
        }
        let total_ms: f64 = all.iter().map(|s| s.3).sum();
        work.statements_per_turn = per(all.iter().map(|s| s.1 as f64).sum());
        work.transaction_control_per_turn = per(all
            .iter()
            .filter(|s| is_transaction_control(&s.0))
            .map(|s| s.1 as f64)
            .sum());
        work.rows_per_turn = per(all.iter().map(|s| s.2 as f64).sum());
        work.exec_ms_per_turn = per(total_ms);
        work.wal_bytes_per_turn = per(all.iter().map(|s| s.4).sum());
        work.top = all
            .iter()
            .take(TOP)
            .map(|(q, calls, n, ms, _)| TopStatement {
                query: short(q),
                calls_per_turn: per(*calls as f64),
                rows_per_turn: per(*n as f64),
                exec_ms_per_turn: per(*ms),
                share: if total_ms > 0.0 { ms / total_ms } else { 0.0 },
            })
            .collect();
        Ok(work)
    }
}

async fn connect(url: &str) -> Result<PgConnection, BenchError> {
    PgConnection::connect(url)
        .await
        .map_err(|e| setup("connecting as PostgreSQL's admin", e))
}

fn setup(what: &str, e: sqlx::Error) -> BenchError {
    BenchError::Setup(format!("{what}: {e}"))
}

async fn db_counters(conn: &mut PgConnection, database: &str) -> Result<DbCounters, BenchError> {
    let row = sqlx::query(
        "SELECT xact_commit, tup_inserted + tup_updated + tup_deleted AS rows_written
         FROM pg_stat_database WHERE datname = $1",
    )
    .bind(database)
    .fetch_optional(conn)
    .await
    .map_err(|e| setup("reading pg_stat_database", e))?;
    Ok(row
        .map(|r| DbCounters {
            commits: r.try_get("xact_commit").unwrap_or(0),
            rows_written: r.try_get("rows_written").unwrap_or(0),
        })
        .unwrap_or_default())
}

/// `BEGIN`, `COMMIT`, `ROLLBACK`, `SAVEPOINT`, `RELEASE` (what pg_stat_statements records as utility
/// statements of a transaction).
fn is_transaction_control(query: &str) -> bool {
    let first = query
        .trim_start()
        .split(|c: char| !c.is_ascii_alphabetic())
        .next()
        .unwrap_or_default()
        .to_ascii_uppercase();
    matches!(
        first.as_str(),
        "BEGIN" | "COMMIT" | "ROLLBACK" | "SAVEPOINT" | "RELEASE" | "START" | "END"
    )
}

/// The statement on one line, at most 160 characters.
fn short(query: &str) -> String {
    let one_line = query.split_whitespace().collect::<Vec<_>>().join(" ");
    match one_line.char_indices().nth(160) {
        Some((i, _)) => format!("{}…", &one_line[..i]),
        None => one_line,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transaction_control_is_told_from_statements() {
        assert!(is_transaction_control("BEGIN"));
        assert!(is_transaction_control("commit"));
        assert!(is_transaction_control("  ROLLBACK TO SAVEPOINT s1"));
        assert!(!is_transaction_control("SELECT 1"));
        assert!(!is_transaction_control("INSERT INTO jobs VALUES ($1)"));
    }

    #[test]
    fn statements_are_shown_on_one_short_line() {
        assert_eq!(short("SELECT a,\n   b FROM t"), "SELECT a, b FROM t");
        let long = "x ".repeat(200);
        let s = short(&long);
        assert_eq!(s.chars().count(), 161);
        assert!(s.ends_with('…'));
    }
}
