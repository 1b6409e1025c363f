//! PostgreSQL: connecting ([`super::pool`] lends the connections) and the conversation history
//! (`bot_conversations`). The journal ([`crate::journal`]), the order floors
//! ([`crate::conversation_order`]) and the knowledge base ([`crate::rag`]) use the same pool.

use std::str::FromStr;
use std::time::Duration;

use serde_json::Value;
use sqlx::Row;

use super::pool::{Pool, PoolSettings};
use super::{StoreError, reminders::PendingReminder};
use crate::config::PgConfig;

/// Embedded so a deployed binary can migrate without the source tree.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations");

#[derive(Clone)]
pub struct Pg {
    pub pool: Pool,
}

/// One message of the history window.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HistoryMessage {
    pub role: String,
    pub content: String,
    /// Compact JSON log of the tool calls behind an assistant message, shown to the model next time.
    pub tool_calls: Option<String>,
    /// The message's id (dm_messages `_id`): a message kept before it is answered (held, limited) is
    /// not shown twice.
    pub message_id: String,
}

/// What a turn knows of its user and bot from PostgreSQL.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct History {
    /// The history window, oldest first.
    pub messages: Vec<HistoryMessage>,
    /// Reminders this bot promised the user, still pending.
    pub reminders: Vec<PendingReminder>,
    /// The window holds the whole conversation (fewer messages than the limit were stored).
    pub whole: bool,
    /// What the [`Rides`] read, in their order.
    pub rides: Vec<Value>,
}

/// Reads that ride with the history's statement ([`Pg::history`]) instead of statements of their own,
/// in its snapshot: each an SQL expression of type jsonb over `$1` (the user), `$2` (the bot), `$4`,
/// one jsonb object of the rides' arguments (each ride reads its own keys), and `$5`, a `real[]` (a
/// message's embedding: knowledge search), when one ride brought it. One ride may be a write
/// ([`Rides::push_write`]).
#[derive(Clone, Debug, Default)]
pub struct Rides {
    sql: Vec<String>,
    args: serde_json::Map<String, Value>,
    /// `$5`: a vector is bound as an array of floats, not as JSON text the server would parse.
    floats: Option<Vec<f32>>,
    /// A data-modifying statement run as the statement's CTE `w` (a journal record owed before the
    /// turn's next record): its commit is the read's.
    write: Option<String>,
}

impl Rides {
    /// Adds the ride `sql` with its arguments `args`; its value comes after those added before it.
    pub fn push(&mut self, sql: impl Into<String>, args: serde_json::Map<String, Value>) {
        self.sql.push(sql.into());
        self.args.extend(args);
    }

    /// A write that rides: `cte`, a data-modifying statement over `$4` (its keys in `args`) returning at
    /// most one row of one jsonb column `value`, runs with the read, in its statement and transaction;
    /// its ride's value is that `value` (null: no row). `false` (nothing added) when a write rides
    /// already.
    pub fn push_write(
        &mut self,
        cte: impl Into<String>,
        args: serde_json::Map<String, Value>,
    ) -> bool {
        if self.write.is_some() {
            return false;
        }
        self.write = Some(cte.into());
        self.push("(SELECT value FROM w)", args);
        true
    }

    /// [`Rides::push`] for a ride that also reads `$5`, `floats`; `false` (nothing added) when another
    /// ride took `$5` already.
    pub fn push_with_floats(
        &mut self,
        sql: impl Into<String>,
        args: serde_json::Map<String, Value>,
        floats: Vec<f32>,
    ) -> bool {
        if self.floats.is_some() {
            return false;
        }
        self.floats = Some(floats);
        self.push(sql, args);
        true
    }
}

/// A row to append to `bot_conversations`.
#[derive(Clone, Debug)]
pub struct NewHistory<'a> {
    pub user_id: &'a str,
    pub bot_id: &'a str,
    pub conversation_id: &'a str,
    pub role: &'a str,
    pub content: &'a str,
    pub message_id: &'a str,
    pub tool_calls: Option<&'a Value>,
    pub created_at: chrono::DateTime<chrono::Utc>,
    /// A row of a group conversation's window (not of the user's DM window with the bot).
    pub group_chat: bool,
    /// A companion message that told the user it is an AI (when the next must is read from these).
    pub ai_disclosure: bool,
}

/// One message of a group conversation's window: who said it, and what.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupLine {
    /// `user` or `assistant`.
    pub role: String,
    /// The user who sent it, or whom the companion answered.
    pub user_id: String,
    /// The companion that said it (for `assistant`).
    pub bot_id: String,
    pub message_id: String,
    pub content: String,
}

impl Pg {
    /// Connects the pool. When the first connection fails, the error names the server (user, host,
    /// port and database; never the password) and the cause: refused, authentication, a missing
    /// database, no answer.
    pub async fn connect(config: &PgConfig) -> Result<Self, StoreError> {
        let failed = |at: String, cause: String| StoreError::PgConnect { at, cause };
        let options = sqlx::postgres::PgConnectOptions::from_str(&config.url).map_err(|e| {
            failed(
                crate::config::redact_url(&config.url),
                super::describe_pg(&e),
            )
        })?;
        let at = format!(
            "{}@{}:{}/{}",
            options.get_username(),
            options.get_host(),
            options.get_port(),
            options.get_database().unwrap_or(options.get_username())
        );
        let options = options.options([(
            // Filtered HNSW scans (knowledge search) keep going until enough rows pass the filter
            // (pgvector ≥ 0.8); set once per connection rather than per search, which would cost a
            // transaction and two more round trips each time.
            "hnsw.iterative_scan",
            "relaxed_order",
        )]);
        let connected = tokio::time::timeout(
            Duration::from_secs(5),
            Pool::connect(options, PoolSettings::new(config.pool_size)),
        )
        .await;
        match connected {
            Ok(Ok(pool)) => Ok(Self { pool }),
            Ok(Err(e)) => Err(failed(at, super::describe_pg(&e))),
            Err(_) => Err(failed(at, "no answer within 5 s".to_owned())),
        }
    }

    pub async fn migrate(&self) -> Result<(), StoreError> {
        let mut lease = self.pool.lease().await?;
        MIGRATOR.run(&mut *lease).await?;
        Ok(())
    }

    pub async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    /// The last `limit` messages between this user and this bot, oldest first, and the reminders the bot
    /// promised the user that are still pending (soonest first): one round trip for both, which also
    /// carries `rides` (their values in [`History::rides`]).
    pub async fn history(
        &self,
        user_id: &str,
        bot_id: &str,
        limit: i64,
        rides: &Rides,
    ) -> Result<History, StoreError> {
        // The rides' values, in one row of its own after the history and the reminders.
        let ridden = match rides.sql.is_empty() {
            true => String::new(),
            false => format!(
                "UNION ALL SELECT 2, NULL, (jsonb_build_array({}))::text, NULL, NULL, NULL, NULL, 0, NULL",
                rides.sql.join(", ")
            ),
        };
        let with = match &rides.write {
            Some(cte) => format!("WITH w AS ({cte}) "),
            None => String::new(),
        };
        let sql = format!(
            "{with}SELECT part, role, content, tool_calls, reminder_id, fire_at, message_id FROM (
                SELECT 0 AS part, role, content, tool_calls, NULL::text AS reminder_id,
                       NULL::timestamptz AS fire_at, created_at, id, message_id FROM (
                    SELECT role, content, tool_calls::text AS tool_calls, created_at, id, message_id
                    FROM bot_conversations WHERE user_id = $1 AND bot_id = $2 AND NOT group_chat
                    ORDER BY created_at DESC, id DESC LIMIT $3) w
                UNION ALL
                SELECT 1, 'reminder', r.text, NULL, r.id, r.fire_at, r.fire_at, 0, r.id
                FROM reminders r
                WHERE r.user_id = $1 AND r.bot_id = $2 AND {}
                {ridden}
             ) x ORDER BY part, created_at, id",
            super::reminders::PENDING
        );
        let query = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(user_id)
            .bind(bot_id)
            .bind(limit);
        let query = match rides.sql.is_empty() {
            true => query,
            false => query.bind(Value::Object(rides.args.clone())),
        };
        let query = match &rides.floats {
            Some(floats) => query.bind(floats),
            None => query,
        };
        let rows = query.fetch_all(&self.pool).await?;
        let mut out = History::default();
        for r in rows {
            match r.get::<i32, _>("part") {
                0 => out.messages.push(HistoryMessage {
                    role: r.get("role"),
                    content: r.get("content"),
                    tool_calls: r.get("tool_calls"),
                    message_id: r.get("message_id"),
                }),
                1 => out.reminders.push(PendingReminder {
                    id: r.get("reminder_id"),
                    text: r.get("content"),
                    fire_at: r.get("fire_at"),
                }),
                _ => match serde_json::from_str(r.get::<&str, _>("content"))
                    .map_err(|e| sqlx::Error::Decode(Box::new(e)))?
                {
                    Value::Array(values) => out.rides = values,
                    other => out.rides = vec![other],
                },
            }
        }
        out.whole = (out.messages.len() as i64) < limit;
        Ok(out)
    }

    /// The history's text of the messages `ids` (dm_messages ids), by id; a message not in the history
    /// (never kept, or deleted) is left out.
    pub async fn texts(
        &self,
        ids: &[String],
    ) -> Result<std::collections::HashMap<String, String>, StoreError> {
        let rows: Vec<(String, String)> = sqlx::query_as(
            "SELECT message_id, content FROM bot_conversations WHERE message_id = ANY($1)",
        )
        .bind(ids)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.into_iter().collect())
    }

    /// The last `limit` messages of the group conversation, oldest first.
    pub async fn group_history(
        &self,
        conversation_id: &str,
        limit: i64,
    ) -> Result<Vec<GroupLine>, StoreError> {
        let rows = sqlx::query(
            "SELECT role, user_id, bot_id, message_id, content FROM (
                SELECT role, user_id, bot_id, message_id, content, created_at, id
                FROM bot_conversations WHERE conversation_id = $1 AND group_chat
                ORDER BY created_at DESC, id DESC LIMIT $2) w
             ORDER BY created_at, id",
        )
        .bind(conversation_id)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(|r| GroupLine {
                role: r.get("role"),
                user_id: r.get("user_id"),
                bot_id: r.get("bot_id"),
                message_id: r.get("message_id"),
                content: r.get("content"),
            })
            .collect())
    }

    /// Appends messages; a message already recorded is left as it is. Nothing of a deleted message or
    /// an erased user is written: under the locks a deletion takes ([`lock_history`]), a user row whose
    /// message has a tombstone is left out, and so are the companion's rows answering it, and every row
    /// of a user with one. Whichever commits first, the deletion or this write, nothing of it remains.
    pub async fn append_history(&self, rows: &[NewHistory<'_>]) -> Result<(), StoreError> {
        if rows.is_empty() {
            return Ok(());
        }
        // One statement: the function takes the locks, then inserts in a snapshot taken after them
        // (migrations/20261130020000_history_rows.sql).
        let query = sqlx::query("SELECT append_history($1::jsonb)").bind(history_rows(rows));
        #[cfg(feature = "testing")]
        {
            // A test that holds the write with its locks taken and its rows inserted, before its
            // commit, gets the same function inside a transaction it can hold open.
            let scope = said(rows).join(",");
            if crate::fault::armed(&scope, "history:locked") {
                let mut tx = self.pool.begin().await?;
                query.execute(&mut *tx).await?;
                crate::fault::reached(&scope, "history:locked").await;
                tx.commit().await?;
                return Ok(());
            }
        }
        query.execute(&self.pool).await?;
        Ok(())
    }
}

/// Removes the history rows of the companion messages `messages`: replies an earlier attempt recorded,
/// and wrote with their records, that never went out (a job held on its retry).
pub async fn unwrite_history(pg: &Pg, messages: &[String]) -> Result<u64, StoreError> {
    Ok(sqlx::query(
        "DELETE FROM bot_conversations WHERE message_id = ANY($1) AND role = 'assistant'",
    )
    .bind(messages)
    .execute(&pg.pool)
    .await?
    .rows_affected())
}

/// Takes, in `conn`'s transaction, the advisory locks that serialise a history write with the deletions
/// of what it writes: one per user (a `user_erased` takes it) and one per user message (a
/// `message_deleted` takes it).
pub async fn lock_history(
    conn: &mut sqlx::PgConnection,
    users: &[&str],
    messages: &[&str],
) -> Result<(), sqlx::Error> {
    // One statement takes them all, in the order given (one round trip, however many).
    sqlx::query(
        "SELECT pg_advisory_xact_lock(hashtextextended(k, 0))
         FROM (SELECT k FROM unnest($1::text[]) WITH ORDINALITY AS l(k, i) ORDER BY i) ordered",
    )
    .bind(history_locks(users, messages))
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// [`Pg::append_history`]'s call over the rows in `$5 -> 'history'` ([`history_arg`]): an SQL
/// expression (of type void) for a statement that carries the write
/// ([`super::safety::BEFORE_DELIVERY_WRITING_ON_5`]). The same function: its locks, then its insert in a
/// snapshot taken after them.
pub(crate) const HISTORY_FROM_5: &str = "append_history($5::jsonb -> 'history')";

/// The input of [`HISTORY_FROM_5`]: [`history_rows`]. None when there is nothing to write, and in the
/// tests when the write is to be held on its own (`history:locked`, which only the write of its own can
/// hold).
pub fn history_arg(rows: &[NewHistory<'_>]) -> Option<Value> {
    if rows.is_empty() {
        return None;
    }
    #[cfg(feature = "testing")]
    if crate::fault::armed(&said(rows).join(","), "history:locked") {
        return None;
    }
    Some(history_rows(rows))
}

/// The ids of the user messages among `rows`: what the companion rows answer.
fn said<'a>(rows: &[NewHistory<'a>]) -> Vec<&'a str> {
    rows.iter()
        .filter(|r| r.role == "user")
        .map(|r| r.message_id)
        .collect()
}

/// The argument of `append_history(jsonb)` (migrations/20261130020000_history_rows.sql): the locks, the
/// user messages the companion rows answer, and the rows (times to the microsecond, as the driver would
/// bind them).
fn history_rows(rows: &[NewHistory<'_>]) -> Value {
    let said = said(rows);
    let users: Vec<&str> = rows.iter().map(|r| r.user_id).collect();
    let rows: Vec<Value> = rows
        .iter()
        .map(|r| {
            serde_json::json!({
                "user_id": r.user_id,
                "bot_id": r.bot_id,
                "conversation_id": r.conversation_id,
                "role": r.role,
                "content": r.content,
                "message_id": r.message_id,
                "tool_calls": r.tool_calls,
                "created_at": r.created_at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
                "group_chat": r.group_chat,
                "ai_disclosure": r.ai_disclosure,
            })
        })
        .collect();
    serde_json::json!({ "locks": history_locks(&users, &said), "said": said, "rows": rows })
}

/// The keys of [`lock_history`]: users first, each in order, so two writers never wait on each other
/// crosswise.
fn history_locks(users: &[&str], messages: &[&str]) -> Vec<String> {
    let mut users: Vec<String> = users.iter().map(|u| format!("history:user:{u}")).collect();
    users.sort();
    users.dedup();
    let mut messages: Vec<String> = messages
        .iter()
        .map(|m| format!("history:message:{m}"))
        .collect();
    messages.sort();
    messages.dedup();
    users.extend(messages);
    users
}
