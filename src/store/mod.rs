//! The two databases: MongoDB holds the app's data (users, DMs, tricklists, spots, tricks),
//! PostgreSQL the companion's own (history, turn journal, knowledge base).

pub mod mongo;
pub mod pg;

pub use mongo::Mongo;
pub use pg::Pg;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("MongoDB: {0}")]
    Mongo(#[from] mongodb::error::Error),
    #[error("PostgreSQL: {0}")]
    Pg(#[from] sqlx::Error),
    #[error("PostgreSQL migration: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
}
