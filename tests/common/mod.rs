//! Shared test helpers: the embedding model at its configured paths, and a fresh PostgreSQL database
//! per test (so tests run in parallel).
#![allow(dead_code)]

use std::{path::PathBuf, sync::Arc, time::Duration};

use companion::rag::{EmbedConfig, Embedder};
use sqlx::{Connection, PgConnection, PgPool, postgres::PgPoolOptions};

/// The model files as configured (`COMPANION_MODEL_DIR`, `ORT_DYLIB_PATH`), else `<repo>/.local/models`.
pub fn embed_config() -> EmbedConfig {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let local = std::env::var_os("COMPANION_LOCAL_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join(".local"));
    let model_dir = std::env::var_os("COMPANION_MODEL_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| local.join("models"));
    let ort_dylib_path = std::env::var_os("ORT_DYLIB_PATH")
        .map(PathBuf::from)
        .unwrap_or_else(|| model_dir.join("libonnxruntime.so.1.31.1"));
    EmbedConfig {
        model_dir,
        ort_dylib_path,
        threads: 2,
        max_batch: 32,
        window: Duration::from_millis(5),
    }
}

/// Loads the embedder; fails (never skips) with a clear message when the files are missing.
pub fn embedder_with(cfg: &EmbedConfig) -> Arc<Embedder> {
    if let Some(missing) = cfg.missing_file() {
        panic!(
            "the embedding model is not installed: {} is missing. Run deploy/local/models.sh \
             (or set COMPANION_MODEL_DIR / ORT_DYLIB_PATH).",
            missing.display()
        );
    }
    Embedder::load(cfg).expect("loading the embedder")
}

pub fn embedder() -> Arc<Embedder> {
    embedder_with(&embed_config())
}

pub fn admin_url() -> String {
    std::env::var("POSTGRES_ADMIN_URL")
        .unwrap_or_else(|_| "postgres://postgres:postgres@127.0.0.1:5432/postgres".into())
}

/// A fresh database `t_<random>` owned by `companion`, migrated.
pub struct TestDb {
    pub name: String,
    pub url: String,
    pub pool: PgPool,
}

impl TestDb {
    pub async fn new() -> Self {
        let name = format!("t_{:016x}", fastrand::u64(..));
        let admin = admin_url();
        let mut conn = PgConnection::connect(&admin)
            .await
            .expect("connecting to PostgreSQL as admin (is deploy/local/stack.sh up?)");
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "CREATE DATABASE {name} OWNER companion"
        )))
        .execute(&mut conn)
        .await
        .expect("creating the test database");
        let base = std::env::var("POSTGRES_URL")
            .unwrap_or_else(|_| "postgres://companion:companion@127.0.0.1:5432/companion".into());
        let url = match base.rsplit_once('/') {
            Some((head, _)) => format!("{head}/{name}"),
            None => base,
        };
        let pool = PgPoolOptions::new()
            .max_connections(4)
            .connect(&url)
            .await
            .expect("connecting to the test database");
        companion::store::pg::MIGRATOR
            .run(&pool)
            .await
            .expect("migrating the test database");
        Self { name, url, pool }
    }

    pub async fn drop(self) {
        self.pool.close().await;
        if let Ok(mut conn) = PgConnection::connect(&admin_url()).await {
            let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                self.name
            )))
            .execute(&mut conn)
            .await;
        }
    }
}
