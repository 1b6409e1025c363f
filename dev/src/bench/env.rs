//! The bench's own isolated run on the real local stack: a fresh PostgreSQL database (migrated), a fresh
//! MongoDB database, its own NATS subject and stream prefixes, and everything removed again at the end.

use std::time::Duration;

use sqlx::Connection;

use super::BenchError;
use companion::Config;
use companion_store::{
    bus::Bus,
    store::{Mongo, Pg},
};

/// Collections created up front so no insert creates one implicitly (SecantusDB and concurrent DDL).
pub const COLLECTIONS: &[&str] = &[
    "users",
    "dm_conversations",
    "dm_messages",
    "tricklists",
    "tricks",
    "ck_spots",
    "spot_drafts",
];

/// One bench run's databases and subjects.
pub struct RunEnv {
    /// Random tag naming the databases, subjects and streams of this run.
    pub tag: String,
    /// The configuration pointing at this run's databases and subjects (what the workers get).
    pub config: Config,
    /// Admin connection string used to create and drop the PostgreSQL database.
    admin_url: String,
    pub pg: Pg,
    pub mongo: Mongo,
    pub bus: Bus,
}

impl RunEnv {
    /// Creates the databases and streams of a new run from the base configuration. The PostgreSQL
    /// database is migrated by `worker` (`companion migrate`) when given, so that each build of a
    /// `--compare` runs on its own schema (its indexes, keys and functions are part of its cost);
    /// otherwise by this build's migrations.
    pub async fn create(
        base: &Config,
        worker: Option<&std::path::Path>,
    ) -> Result<Self, BenchError> {
        let tag = format!("{:012x}", fastrand::u64(..) >> 16);
        let mut config = base.clone();
        let db = format!("bench_{tag}");
        let admin_url = admin_url(&config.pg.url);
        let owner = pg_user(&config.pg.url).unwrap_or_else(|| "companion".into());
        let mut admin = sqlx::PgConnection::connect(&admin_url).await.map_err(|e| {
            BenchError::Setup(format!(
                "PostgreSQL admin connection to {}: {e}",
                companion_core::config::redact_url(&admin_url)
            ))
        })?;
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "CREATE DATABASE {db} OWNER {owner}"
        )))
        .execute(&mut admin)
        .await
        .map_err(|e| BenchError::Setup(format!("creating database {db}: {e}")))?;
        config.pg.url = replace_db(&config.pg.url, &db);
        config.mongo.uri = replace_db(&config.mongo.uri, &db);
        config.nats.subject_prefix = format!("bench{tag}.dm.bot");
        config.nats.stream_prefix = format!("BENCH{tag}");
        config.consumer.name = "bench-workers".into();
        let pg = Pg::connect(&config.pg).await?;
        match worker {
            Some(bin) => super::workers::run_once(bin, &["migrate".as_ref()], &config, &[]).await?,
            None => pg.migrate().await?,
        }
        let mongo = Mongo::connect(&config.mongo).await?;
        for name in COLLECTIONS {
            mongo
                .db
                .create_collection(*name)
                .await
                .map_err(companion_store::store::StoreError::from)?;
        }
        mongo.ensure_indexes().await?;
        let bus = Bus::connect(&config.nats).await?;
        bus.ensure_streams().await?;
        Ok(Self {
            tag,
            config,
            admin_url,
            pg,
            mongo,
            bus,
        })
    }

    /// The connection that creates and drops the run's database (a superuser on the local stack).
    pub fn admin_url(&self) -> &str {
        &self.admin_url
    }

    /// The run's PostgreSQL database.
    pub fn database(&self) -> String {
        format!("bench_{}", self.tag)
    }

    /// Removes the streams and both databases of this run.
    pub async fn destroy(self) {
        let db = self.database();
        remove_streams_and_database(&self.bus, &self.pg, &self.admin_url, &db).await;
        let _ = tokio::time::timeout(Duration::from_secs(30), self.mongo.db.drop()).await;
    }
}

/// Removes a run's streams and its PostgreSQL database `database` (best effort; MongoDB is the caller's).
pub async fn remove_streams_and_database(bus: &Bus, pg: &Pg, admin_url: &str, database: &str) {
    for s in [
        &bus.names.stream_in,
        &bus.names.stream_out,
        &bus.names.stream_dlq,
        &bus.names.stream_signal,
        &bus.names.stream_alert,
        &bus.names.stream_exhausted,
    ] {
        let _ = bus.js.delete_stream(s).await;
    }
    pg.pool.close().await;
    if let Ok(mut conn) = sqlx::PgConnection::connect(admin_url).await {
        let drop = format!("DROP DATABASE IF EXISTS {database} WITH (FORCE)");
        let _ = sqlx::query(sqlx::AssertSqlSafe(drop))
            .execute(&mut conn)
            .await;
    }
}

/// The connection that creates and drops databases: `POSTGRES_ADMIN_URL`, else `postgres_url` itself on
/// its server's maintenance database (`postgres`), so the run's databases are made where the workers
/// will look for them.
pub fn admin_url(postgres_url: &str) -> String {
    std::env::var("POSTGRES_ADMIN_URL")
        .ok()
        .filter(|u| !u.trim().is_empty())
        .unwrap_or_else(|| replace_db(postgres_url, "postgres"))
}

/// The user of a PostgreSQL URL (`postgres://user:pass@host/db`).
fn pg_user(url: &str) -> Option<String> {
    let rest = url.split_once("://")?.1;
    let (creds, _) = rest.rsplit_once('@')?;
    let user = creds.split(':').next()?;
    (!user.is_empty() && user.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
        .then(|| user.to_owned())
}

/// The URL with its database (path) replaced, query kept.
pub fn replace_db(url: &str, db: &str) -> String {
    let (base, query) = url
        .split_once('?')
        .map(|(b, q)| (b, Some(q)))
        .unwrap_or((url, None));
    let scheme_end = base.find("://").map(|i| i + 3).unwrap_or(0);
    let host_end = base[scheme_end..]
        .find('/')
        .map(|i| i + scheme_end)
        .unwrap_or(base.len());
    let mut out = format!("{}/{db}", &base[..host_end]);
    if let Some(q) = query {
        out.push('?');
        out.push_str(q);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_admin_connection_goes_to_the_server_of_postgres_url() {
        if std::env::var_os("POSTGRES_ADMIN_URL").is_none() {
            assert_eq!(
                admin_url("postgres://companion:pw@db:15432/companion?sslmode=require"),
                "postgres://companion:pw@db:15432/postgres?sslmode=require"
            );
        }
    }

    #[test]
    fn database_names_are_replaced_and_users_read() {
        assert_eq!(
            replace_db(
                "mongodb://127.0.0.1:27017/TrickList2?directConnection=true",
                "bench_x"
            ),
            "mongodb://127.0.0.1:27017/bench_x?directConnection=true"
        );
        assert_eq!(
            replace_db("postgres://a:b@h:5432/companion", "bench_x"),
            "postgres://a:b@h:5432/bench_x"
        );
        assert_eq!(
            replace_db("mongodb://127.0.0.1:27017", "d"),
            "mongodb://127.0.0.1:27017/d"
        );
        assert_eq!(
            pg_user("postgres://companion:pw@127.0.0.1/x").as_deref(),
            Some("companion")
        );
        assert_eq!(pg_user("postgres://127.0.0.1/x"), None);
    }
}
