//! The two databases: MongoDB holds the app's data (users, DMs, tricklists, spots, tricks),
//! PostgreSQL the companion's own (history, the journal, the knowledge base).

/// The SQL condition "a tombstone stops this": the user (parameter `$u`) erased, or one of the messages
/// (text array parameter `$m`) deleted. One text for every reader of the tombstones (admission's probe,
/// the reads before and after delivery, memory's writers), so that they can never disagree. Two probes
/// of the primary key `(kind, id)`, not one scan with `OR`: that is a bitmap scan of four plan nodes, and
/// a DM turn reads it in three statements (its opening, the reply's record, the settlement).
#[macro_export]
#[doc(hidden)]
macro_rules! __tombstoned {
    ($u:literal, $m:literal) => {
        concat!(
            "(EXISTS (SELECT 1 FROM tombstones WHERE kind = 'user' AND id = ",
            $u,
            ") OR EXISTS (SELECT 1 FROM tombstones WHERE kind = 'message' AND id = ANY(",
            $m,
            ")))"
        )
    };
}
pub use crate::__tombstoned as tombstoned;

mod mongo;
mod pg;
mod pool;
mod reminders;
mod safety;

pub use mongo::{
    DM_MESSAGES, Membership, Mongo, ReplyDoc, SPOT_DRAFTS, SPOTS, TRICKLISTS, TRICKS, TrickEntry,
    Tricklist, USERS, UserData, UserProfile, is_duplicate_key, tricklist_of, user_ref,
    user_ref_filter,
};
pub use pg::{
    GroupLine, History, HistoryMessage, NewHistory, Pg, Rides, history_arg, lock_history,
    unwrite_history,
};
pub use pool::{Lease, Pool, PoolSettings, Tx};
pub use reminders::{KIND as REMINDER_KIND, PendingReminder, Reminder, ReminderState};
pub use safety::{
    BEFORE_DELIVERY_WRITING_ON_5, BeforeDelivery, Between, CrisisMonth, Seen, Takeover,
    before_delivery_arg, before_delivery_of, paused_sql,
};

// For the tests and the dev tooling: the conversations collection TB-Backend owns, the migrations run
// on a database of their own, and a pool with settings of their own.
#[cfg(any(test, feature = "testing"))]
pub use {mongo::DM_CONVERSATIONS, pg::MIGRATOR};

use crate::failure::{Class, Classify};

/// A failure of either database. The message includes the driver's (it is not repeated as a source, so
/// a chain of causes prints it once).
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("MongoDB: {0}")]
    Mongo(mongodb::error::Error),
    #[error("PostgreSQL: {}", describe_pg(.0))]
    Pg(sqlx::Error),
    /// The first connection failed: where to (no password) and the driver's cause.
    #[error("cannot connect to PostgreSQL at {at}: {cause}")]
    PgConnect { at: String, cause: String },
    #[error("PostgreSQL migration: {0}")]
    Migrate(sqlx::migrate::MigrateError),
}

impl From<mongodb::error::Error> for StoreError {
    fn from(e: mongodb::error::Error) -> Self {
        Self::Mongo(e)
    }
}

impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> Self {
        Self::Pg(e)
    }
}

impl From<sqlx::migrate::MigrateError> for StoreError {
    fn from(e: sqlx::migrate::MigrateError) -> Self {
        Self::Migrate(e)
    }
}

/// By cause: data the server refuses (PostgreSQL SQLSTATE classes 22 and 23, MongoDB document
/// validation, values that do not encode) fails the same way every time; an unreachable, slow or
/// restarting server, or anything unknown, may pass on the next delivery.
impl Classify for StoreError {
    fn class(&self) -> Class {
        match self {
            Self::Pg(e) => pg_class(e),
            Self::Mongo(e) => mongo_class(e),
            Self::Migrate(_) | Self::PgConnect { .. } => Class::Transient,
        }
    }
}

/// A PostgreSQL error as people read it: the server's message and SQLSTATE (not the line of the server's
/// source file it came from), an I/O error's cause, the rest as the driver says it.
pub(crate) fn describe_pg(e: &sqlx::Error) -> String {
    use sqlx::Error as E;
    match e {
        E::Database(db) => match db.code() {
            Some(code) => format!("{} (SQLSTATE {code})", db.message()),
            None => db.message().to_owned(),
        },
        E::Io(io) => io.to_string(),
        E::Tls(tls) => format!("TLS: {tls}"),
        E::Configuration(c) => format!("the URL is not usable: {c}"),
        other => other.to_string(),
    }
}

fn pg_class(e: &sqlx::Error) -> Class {
    use sqlx::Error as E;
    match e {
        E::Database(db) => match db.code() {
            Some(code) if code.starts_with("22") || code.starts_with("23") => Class::Permanent,
            _ => Class::Transient,
        },
        E::Encode(_)
        | E::Decode(_)
        | E::ColumnDecode { .. }
        | E::TypeNotFound { .. }
        | E::ColumnNotFound(_)
        | E::ColumnIndexOutOfBounds { .. }
        | E::RowNotFound => Class::Permanent,
        _ => Class::Transient,
    }
}

/// MongoDB server codes of data the server refuses: BadValue, FailedToParse, TypeMismatch,
/// InvalidLength, DocumentValidationFailure, InvalidBSON, ImmutableField, DuplicateKey.
const MONGO_DATA_CODES: &[i32] = &[2, 9, 14, 16, 121, 22, 66, 11000];

fn mongo_class(e: &mongodb::error::Error) -> Class {
    use mongodb::error::{ErrorKind, WriteFailure};
    if e.contains_label("RetryableWriteError") || e.contains_label("TransientTransactionError") {
        return Class::Transient;
    }
    match &*e.kind {
        ErrorKind::BsonSerialization(_)
        | ErrorKind::BsonDeserialization(_)
        | ErrorKind::InvalidArgument { .. } => Class::Permanent,
        ErrorKind::Write(WriteFailure::WriteError(w)) if MONGO_DATA_CODES.contains(&w.code) => {
            Class::Permanent
        }
        ErrorKind::Command(c) if MONGO_DATA_CODES.contains(&c.code) => Class::Permanent,
        _ => Class::Transient,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_trouble_is_transient_and_bad_data_is_permanent() {
        let down = StoreError::Pg(sqlx::Error::PoolTimedOut);
        assert_eq!(down.class(), Class::Transient);
        let io = StoreError::Pg(sqlx::Error::Io(std::io::Error::other("reset")));
        assert_eq!(io.class(), Class::Transient);
        assert_eq!(
            StoreError::Pg(sqlx::Error::RowNotFound).class(),
            Class::Permanent
        );
        let bad_arg = StoreError::Mongo(mongodb::error::Error::custom("x"));
        assert_eq!(bad_arg.class(), Class::Transient);
    }
}
