//! Helpers for the tool tests: a fresh PostgreSQL database and a fresh, seeded MongoDB database per test,
//! on the real local servers (only the LLM is ever stubbed).

use bson::oid::ObjectId;
use chrono::Utc;
use companion::{
    store::{Mongo, Pg, pg::MIGRATOR},
    tools::ToolContext,
};
use sqlx::postgres::PgPoolOptions;

pub const JESS: &str = "6650f1a2b3c4d5e6f7a8b9c0";
pub const SAM: &str = "6650f1a2b3c4d5e6f7a8b9c1";
pub const KAORI: &str = "69c15e55c7ebe2c6884f1267";
pub const JESS_KAORI_CONVERSATION: &str = "6650f1a2b3c4d5e6f7a8c001";

pub fn oid(s: &str) -> ObjectId {
    ObjectId::parse_str(s).unwrap()
}

fn admin_url() -> String {
    crate::env::admin_url()
}

/// The configured MongoDB server (`ATLAS_URI`, as `deploy/local/stack.sh env` sets it).
pub fn mongo_url() -> String {
    let config = companion::Config::from_env().expect("configuration from the environment");
    crate::env::replace_db(&config.atlas_uri, "")
}

pub fn unique_name() -> String {
    format!("t_{:016x}", fastrand::u64(..))
}

/// A new PostgreSQL database owned by `companion`, migrated; returns its URL.
pub async fn fresh_pg_url() -> String {
    let name = unique_name();
    let admin = PgPoolOptions::new()
        .max_connections(1)
        .connect(&admin_url())
        .await
        .expect("admin connection");
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "CREATE DATABASE {name} OWNER companion"
    )))
    .execute(&admin)
    .await
    .expect("create database");
    admin.close().await;
    let config = companion::Config::from_env().expect("configuration from the environment");
    let url = crate::env::replace_db(&config.postgres_url, &name);
    let pg = pg_at(&url).await;
    MIGRATOR.run(&pg.pool).await.expect("migrate");
    pg.pool.close().await;
    url
}

pub async fn pg_at(url: &str) -> Pg {
    Pg {
        pool: PgPoolOptions::new()
            .max_connections(8)
            .connect(url)
            .await
            .expect("pg connect"),
    }
}

/// A new MongoDB database seeded with the demo data; returns its name.
pub async fn fresh_mongo_db() -> String {
    let name = unique_name();
    let mongo = mongo_at(&name).await;
    crate::env::prepare_mongo(&mongo).await;
    name
}

/// A separate client (its own connection pool) on database `name`.
pub async fn mongo_at(name: &str) -> Mongo {
    let client = mongodb::Client::with_uri_str(mongo_url())
        .await
        .expect("mongo client");
    Mongo {
        db: client.database(name),
    }
}

pub struct Fixture {
    pub pg: Pg,
    pub pg_url: String,
    pub mongo: Mongo,
    pub mongo_db: String,
}

impl Fixture {
    pub async fn new() -> Self {
        let (pg_url, mongo_db) = tokio::join!(fresh_pg_url(), fresh_mongo_db());
        Self {
            pg: pg_at(&pg_url).await,
            pg_url,
            mongo: mongo_at(&mongo_db).await,
            mongo_db,
        }
    }

    /// A tool context acting for `user`, answering as Kaori, for a fresh event message.
    pub fn ctx(&self, user: &str) -> ToolContext {
        ToolContext {
            user: oid(user),
            bot: oid(KAORI),
            character: "Kaori".into(),
            message_id: ObjectId::new(),
            tool_call_id: format!("call_{}", fastrand::u32(..)),
            mongo: self.mongo.clone(),
            pg: self.pg.clone(),
            now: Utc::now(),
            writes_per_hour: 5,
        }
    }

    /// Drops the Mongo database (PG databases are left for inspection; they are tiny).
    pub async fn cleanup(self) {
        crate::env::drop_mongo(&self.mongo).await;
    }
}
