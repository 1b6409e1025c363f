//! What the safety protocol keeps in PostgreSQL: a moderator's takeover of a conversation (the latest
//! `at` wins), when a companion last told a user it is an AI, and the yearly crisis counts (no user ids).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::{PgConnection, Row};

use super::{Pg, StoreError};

/// A conversation's takeover state, as the latest signal set it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Takeover {
    pub conversation_id: String,
    pub paused: bool,
    /// The moderator's id.
    pub by: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// On resume: answer the latest held message.
    pub catch_up: bool,
    /// When the moderator acted (the signal's `at`): the latest wins.
    pub at: DateTime<Utc>,
    /// When the current (or last) pause began.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused_at: Option<DateTime<Utc>>,
}

/// Whose companion messages a disclosure is counted over.
#[derive(Clone, Copy, Debug)]
pub enum Between<'a> {
    /// A user's DM with a companion.
    Dm { user: &'a str, bot: &'a str },
    /// A companion in a group conversation.
    Group { conversation: &'a str, bot: &'a str },
}

/// What the disclosure rule reads: the last disclosure and the interaction's messages since.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Seen {
    pub last_disclosure: Option<DateTime<Utc>>,
    /// Times of the interaction's messages (both sides; a group: everyone's) since `since`, newest
    /// first.
    pub activity: Vec<DateTime<Utc>>,
}

/// Most message times read to find where a continuing interaction began.
const ACTIVITY_ROWS: i64 = 400;

/// What the disclosure rule reads of a DM (`$1` the user, `$2` the bot) as two SQL expressions: the last
/// disclosure, and the message times since `since` (an SQL expression), newest first.
fn dm_seen(since: &str) -> (&'static str, String) {
    (
        "(SELECT max(created_at) FROM bot_conversations
          WHERE user_id = $1 AND bot_id = $2 AND ai_disclosure AND NOT group_chat)",
        format!(
            "ARRAY(SELECT created_at FROM bot_conversations
                   WHERE user_id = $1 AND bot_id = $2 AND NOT group_chat AND created_at > {since}
                   ORDER BY created_at DESC, id DESC LIMIT {ACTIVITY_ROWS})"
        ),
    )
}

impl Seen {
    /// [`Pg::disclosures`]'s read of a DM as a ride of the history's statement
    /// ([`super::pg::Rides`]: `$1` the user, `$2` the bot), since `since`; [`Seen::ridden`] reads its value.
    pub fn dm_ride(since: DateTime<Utc>) -> (String, serde_json::Map<String, serde_json::Value>) {
        let (last, activity) = dm_seen("($4::jsonb ->> 'disclosure_since')::timestamptz");
        let sql = format!("jsonb_build_object('last', {last}, 'activity', to_jsonb({activity}))");
        let mut args = serde_json::Map::new();
        args.insert("disclosure_since".into(), since.to_rfc3339().into());
        (sql, args)
    }

    /// What [`Seen::dm_ride`] read; none when the value is not its shape.
    pub fn ridden(value: serde_json::Value) -> Option<Seen> {
        #[derive(Deserialize)]
        struct Ridden {
            last: Option<DateTime<Utc>>,
            activity: Vec<DateTime<Utc>>,
        }
        let r: Ridden = serde_json::from_value(value).ok()?;
        Some(Seen {
            last_disclosure: r.last,
            activity: r.activity,
        })
    }
}

/// Whether a moderator has paused the conversation `conversation` (an SQL expression), as an SQL boolean:
/// for a statement that reads it along with other work ([`Pg::paused`] reads it alone).
pub fn paused_sql(conversation: &str) -> String {
    format!(
        "coalesce((SELECT paused FROM takeovers WHERE conversation_id = {conversation}), false)"
    )
}

/// What the check before a reply goes out found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BeforeDelivery {
    /// A moderator paused the conversation.
    pub paused: bool,
    /// A message the reply answers was deleted, or its user erased.
    pub deleted: bool,
    /// The reply's history rows are written: a check before found the way clear and wrote them with
    /// the reply's record ([`BEFORE_DELIVERY_WRITING_ON_5`]), or the history write after it ran. The
    /// delivery that check decided goes on; a deletion since is the check after delivery's.
    pub written: bool,
}

/// [`Pg::before_delivery`]'s read as one SQL expression of type jsonb, `[paused, deleted, written]`,
/// taking its inputs from the jsonb parameter `$5` ([`before_delivery_arg`]), for the statement that
/// records the reply (a `journal::Ride`); and, when the way is clear, the reply's history written in that
/// statement too ([`super::pg::HISTORY_FROM_5`]): only when `$5` carries `history` and this attempt's
/// record is the one the statement stored (the journal's `ins`, with the step's name and key in `$3`,
/// `$4`). The write takes the history locks and reads the tombstones again after them, so a deletion
/// that committed since this statement's snapshot still keeps its rows out. (`OFFSET 0` keeps `c` a
/// subquery of its own: pulled up, each of its reads would run once per mention.)
pub static BEFORE_DELIVERY_WRITING_ON_5: std::sync::LazyLock<String> = std::sync::LazyLock::new(
    || {
        format!(
            "(SELECT jsonb_build_array(c.paused, c.deleted,
                 CASE WHEN NOT c.paused AND NOT c.deleted AND $5::jsonb ? 'history'
                           AND EXISTS (SELECT 1 FROM ins WHERE ins.name = $3 AND ins.key = $4)
                      THEN (SELECT true FROM (SELECT {}) AS written)
                      ELSE false END)
              FROM (SELECT coalesce((SELECT paused FROM takeovers
                                     WHERE conversation_id = $5::jsonb->>'conversation'), false) AS paused,
                           {} AS deleted
                    OFFSET 0) c)",
            super::pg::HISTORY_FROM_5,
            super::tombstoned!(
                "($5::jsonb->>'user')",
                "ARRAY(SELECT jsonb_array_elements_text($5::jsonb->'messages'))"
            ),
        )
    },
);

/// The input of [`BEFORE_DELIVERY_WRITING_ON_5`]: `history` is [`super::pg::history_arg`]'s (none:
/// nothing is written).
pub fn before_delivery_arg(
    conversation: &str,
    user: &str,
    messages: &[String],
    history: Option<serde_json::Value>,
) -> serde_json::Value {
    let mut arg =
        serde_json::json!({ "conversation": conversation, "user": user, "messages": messages });
    if let Some(h) = history {
        arg["history"] = h;
    }
    arg
}

/// What [`BEFORE_DELIVERY_WRITING_ON_5`] read.
pub fn before_delivery_of(read: &serde_json::Value) -> Option<BeforeDelivery> {
    Some(BeforeDelivery {
        paused: read.get(0)?.as_bool()?,
        deleted: read.get(1)?.as_bool()?,
        written: read.get(2)?.as_bool()?,
    })
}

impl Pg {
    /// The conversation's takeover state; none when no moderator ever took it over.
    pub(crate) async fn takeover(
        &self,
        conversation: &str,
    ) -> Result<Option<Takeover>, StoreError> {
        let row = sqlx::query(
            "SELECT conversation_id, paused, by_whom, reason, catch_up, at, paused_at
             FROM takeovers WHERE conversation_id = $1",
        )
        .bind(conversation)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.map(|r| Takeover {
            conversation_id: r.get("conversation_id"),
            paused: r.get("paused"),
            by: r.get("by_whom"),
            reason: r.get("reason"),
            catch_up: r.get("catch_up"),
            at: r.get("at"),
            paused_at: r.get("paused_at"),
        }))
    }

    /// Read when a message is about to be delivered, in one statement: whether a moderator has paused
    /// the conversation, whether a tombstone now stops it (one of `messages` deleted, or `user` erased,
    /// while the turn waited on the model), and whether the history of `reply` is already written (an
    /// earlier attempt's check found the way clear).
    pub async fn before_delivery(
        &self,
        conversation: &str,
        user: &str,
        messages: &[String],
        reply: &str,
    ) -> Result<BeforeDelivery, StoreError> {
        let (paused, deleted, written) = sqlx::query_as(concat!(
            "SELECT coalesce((SELECT paused FROM takeovers WHERE conversation_id = $1), false), ",
            super::tombstoned!("$2", "$3"),
            ", EXISTS (SELECT 1 FROM bot_conversations WHERE message_id = $4)"
        ))
        .bind(conversation)
        .bind(user)
        .bind(messages)
        .bind(reply)
        .fetch_one(&self.pool)
        .await?;
        Ok(BeforeDelivery {
            paused,
            deleted,
            written,
        })
    }

    /// Whether `user` is erased or one of `messages` deleted: read again once a message is out (document
    /// and completion written). A deletion that committed after [`Pg::before_delivery`] is seen here; one
    /// that commits after this read came after the message was out, like any deletion of a message
    /// already answered (and an erasure's purge of the streams, which follows its commit, finds the
    /// completion).
    pub async fn tombstoned(&self, user: &str, messages: &[String]) -> Result<bool, StoreError> {
        Ok(
            sqlx::query_scalar(concat!("SELECT ", super::tombstoned!("$1", "$2")))
                .bind(user)
                .bind(messages)
                .fetch_one(&self.pool)
                .await?,
        )
    }

    /// The position in `messages` of the first one deleted (a tombstone), if any.
    pub async fn first_deleted(&self, messages: &[String]) -> Result<Option<usize>, StoreError> {
        let gone: Vec<String> =
            sqlx::query_scalar("SELECT id FROM tombstones WHERE kind = 'message' AND id = ANY($1)")
                .bind(messages)
                .fetch_all(&self.pool)
                .await?;
        Ok(messages.iter().position(|m| gone.contains(m)))
    }

    /// Whether a moderator has paused the conversation now.
    pub async fn paused(&self, conversation: &str) -> Result<bool, StoreError> {
        Ok(self.takeover(conversation).await?.is_some_and(|t| t.paused))
    }

    /// Sets the takeover state unless a later signal set it already; the state now when it changed.
    pub async fn apply_takeover(
        tx: &mut PgConnection,
        t: &Takeover,
    ) -> Result<Option<Takeover>, StoreError> {
        let row = sqlx::query(
            "INSERT INTO takeovers (conversation_id, paused, by_whom, reason, catch_up, at, paused_at)
             VALUES ($1, $2, $3, $4, $5, $6, CASE WHEN $2 THEN $6 END)
             ON CONFLICT (conversation_id) DO UPDATE SET
                 paused = excluded.paused, by_whom = excluded.by_whom, reason = excluded.reason,
                 catch_up = excluded.catch_up, at = excluded.at, updated_at = now(),
                 paused_at = CASE WHEN excluded.paused AND NOT takeovers.paused THEN excluded.at
                                  ELSE takeovers.paused_at END
             WHERE takeovers.at < excluded.at
             RETURNING paused_at",
        )
        .bind(&t.conversation_id)
        .bind(t.paused)
        .bind(&t.by)
        .bind(&t.reason)
        .bind(t.catch_up)
        .bind(t.at)
        .fetch_optional(&mut *tx)
        .await?;
        Ok(row.map(|r| Takeover {
            paused_at: r.get("paused_at"),
            ..t.clone()
        }))
    }

    /// The last disclosure of `between` and the interaction's message times since `since`.
    pub async fn disclosures(
        &self,
        between: Between<'_>,
        since: DateTime<Utc>,
    ) -> Result<Seen, StoreError> {
        // One statement for both (the last disclosure, the recent activity): one round trip.
        let row = match between {
            Between::Dm { user, bot } => {
                let (last, activity) = dm_seen("$3");
                let sql = format!("SELECT {last} AS last_disclosure, {activity} AS activity");
                sqlx::query(sqlx::AssertSqlSafe(sql))
                    .bind(user)
                    .bind(bot)
                    .bind(since)
                    .fetch_one(&self.pool)
                    .await?
            }
            Between::Group { conversation, bot } => {
                sqlx::query(
                    "SELECT (SELECT max(created_at) FROM bot_conversations
                             WHERE conversation_id = $1 AND bot_id = $2 AND ai_disclosure AND group_chat)
                                AS last_disclosure,
                            ARRAY(SELECT created_at FROM bot_conversations
                                  WHERE conversation_id = $1 AND group_chat AND created_at > $3
                                  ORDER BY created_at DESC, id DESC LIMIT $4) AS activity",
                )
                .bind(conversation)
                .bind(bot)
                .bind(since)
                .bind(ACTIVITY_ROWS)
                .fetch_one(&self.pool)
                .await?
            }
        };
        let (last_disclosure, activity) = (row.get("last_disclosure"), row.get("activity"));
        Ok(Seen {
            last_disclosure,
            activity,
        })
    }

    /// Records one flagged message for the yearly report, in the transaction of the step that flagged
    /// it.
    pub async fn log_crisis(
        tx: &mut PgConnection,
        at: DateTime<Utc>,
        category: &str,
        lang: &str,
        referred: bool,
        kind: &str,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO crisis_log (at, category, lang, referred, kind) VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(at)
        .bind(category)
        .bind(lang)
        .bind(referred)
        .bind(kind)
        .execute(&mut *tx)
        .await?;
        Ok(())
    }

    /// The year's flagged messages and referrals by month (1–12) and category.
    pub async fn crisis_year(&self, year: i32) -> Result<Vec<CrisisMonth>, StoreError> {
        let rows = sqlx::query(
            "SELECT extract(month FROM at AT TIME ZONE 'UTC')::int AS month, category,
                    count(*) AS flagged, count(*) FILTER (WHERE referred) AS referred
             FROM crisis_log WHERE extract(year FROM at AT TIME ZONE 'UTC')::int = $1
             GROUP BY 1, 2 ORDER BY 1, 2",
        )
        .bind(year)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .iter()
            .map(|r| CrisisMonth {
                month: r.get::<i32, _>("month") as u32,
                category: r.get("category"),
                flagged: r.get("flagged"),
                referred: r.get("referred"),
            })
            .collect())
    }
}

/// One row of the yearly crisis report.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CrisisMonth {
    pub month: u32,
    pub category: String,
    pub flagged: i64,
    pub referred: i64,
}
