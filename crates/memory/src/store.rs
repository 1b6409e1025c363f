//! Facts and the per-(user, companion) memory state in PostgreSQL. A fact is written with what it
//! replaces in one transaction: the older fact of a one-value topic, or a near-duplicate (the same words,
//! or an embedding this close) of a many-value one, whose sources it takes over; so a fact said twice is
//! kept once, and an update never leaves the old value beside the new. Updates go by when the user said
//! them (`said_at`), not by when they were learned: an extraction that reads an older message after a
//! newer "remember" does not bring the old value back. Writers of one (user, companion) take turns (an
//! advisory lock held to the end of the transaction), so this holds when a `remember` and an extraction
//! write at once.

use chrono::{DateTime, Utc};
use pgvector::Vector;
use serde::{Deserialize, Serialize};
use sqlx::{PgConnection, Row};

use super::{
    Memory, MemoryError, Topic,
    topic::{self, Named},
};
use crate::db::Pool;
use crate::{db::lock_history, rag::Embedding};

/// How a fact was learned.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum How {
    /// By the extraction job, from the conversation.
    Extracted,
    /// The user asked (`remember`).
    Remembered,
}

impl How {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            How::Extracted => "extracted",
            How::Remembered => "remembered",
        }
    }
}

/// One fact as kept.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Fact {
    pub(crate) id: String,
    pub topic: Topic,
    pub fact: String,
    /// The user messages (dm_messages ids) it was learned from.
    pub(crate) sources: Vec<String>,
    /// The companion that learned it (its bot id).
    pub(crate) learned_by: String,
    pub(crate) how: How,
    pub(crate) learned_at: DateTime<Utc>,
}

/// A fact to keep.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct NewFact {
    /// Derived from what writes it, so a retry writes the same row.
    pub id: String,
    pub topic: Topic,
    pub fact: String,
    pub sources: Vec<String>,
    pub how: How,
    /// When its newest source message was said: an older statement never replaces a newer value.
    pub said_at: DateTime<Utc>,
}

/// What keeping a fact did.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Kept {
    /// The facts it replaced, by id.
    pub replaced: Vec<String>,
    /// Not kept: the user said something newer about the same thing (a one-value topic).
    #[serde(default)]
    pub stale: bool,
}

fn fact_of(r: &sqlx::postgres::PgRow) -> Fact {
    Fact {
        id: r.get("id"),
        topic: Topic::parse(r.get::<&str, _>("topic")).unwrap_or(Topic::Other),
        fact: r.get("fact"),
        sources: r.get("sources"),
        learned_by: r.get("learned_by"),
        how: match r.get::<&str, _>("how") {
            "remembered" => How::Remembered,
            _ => How::Extracted,
        },
        learned_at: r.get("learned_at"),
    }
}

const FACT_COLUMNS: &str = "id, topic, fact, sources, learned_by, how, learned_at";

/// Waits until no other transaction writes the memory of (user, companion), and holds that until this
/// one ends: its facts (a `remember` and an extraction keeping one topic at once would otherwise each
/// find nothing to replace and both insert) and its cursors. The user's own lock comes first, the one a
/// `user_erased` takes ([`lock_history`]): an erasure then either committed before (and the answer is
/// [`Writer::Erased`]) or waits until this transaction ends (and deletes what it wrote). Taking them
/// again in one transaction is harmless.
pub(crate) async fn one_writer(
    tx: &mut PgConnection,
    user: &str,
    bot: &str,
) -> Result<Writer, MemoryError> {
    lock_history(tx, &[user], &[]).await?;
    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))")
        .bind(format!("memory:{user}:{bot}"))
        .execute(&mut *tx)
        .await?;
    let erased: bool = sqlx::query_scalar(concat!("SELECT ", crate::db::tombstoned!("$1", "$2")))
        .bind(user)
        .bind(&[] as &[String])
        .fetch_one(&mut *tx)
        .await?;
    Ok(match erased {
        true => Writer::Erased,
        false => Writer::Open,
    })
}

/// What [`one_writer`] found once it held the locks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub(crate) enum Writer {
    /// Memory of the user may be written.
    Open,
    /// The user is erased: nothing of theirs is written again.
    Erased,
}

impl Memory {
    /// Keeps `new` for (user, bot), in `tx`, replacing what it supersedes; at most `max_facts` kept (the
    /// oldest extracted ones go first). Writing the same fact (same id) again changes nothing.
    pub async fn keep(
        tx: &mut PgConnection,
        user: &str,
        bot: &str,
        new: &NewFact,
        embedding: Option<&Embedding>,
        max_facts: i64,
    ) -> Result<Kept, MemoryError> {
        if one_writer(tx, user, bot).await? == Writer::Erased {
            return Err(MemoryError::Erased);
        }
        let vector = embedding.map(|e| Vector::from(e.vector.clone()));
        let model = embedding.map(|e| e.model);
        // What "the same fact" is on the vector's encoder's scale.
        let duplicate = model
            .and_then(crate::rag::Encoder::named)
            .map_or(1.01, |e| e.scores.duplicate);
        // $1 user, $2 bot, $3 topic, $4 one-value topic, $5 fact, $6 its vector, $7 the duplicate
        // similarity, $8 its id, $9 when it was said, $10 the vector's model (only a stored vector of
        // the same model is compared).
        const SAME: &str =
            "(lower(fact) = lower($5) OR ($6::vector IS NOT NULL AND embedding IS NOT NULL
                             AND model = $10 AND 1 - (embedding <=> $6::vector) >= $7))";
        let with_fact = |sql: String| {
            sqlx::query(sqlx::AssertSqlSafe(sql))
                .bind(user)
                .bind(bot)
                .bind(new.topic.as_str())
                .bind(new.topic.single())
                .bind(&new.fact)
                .bind(&vector)
                .bind(f64::from(duplicate))
                .bind(&new.id)
                .bind(new.said_at)
                .bind(model)
        };
        // Kept already (the same write again), or a one-value topic the user has said something newer
        // about: that stays.
        let row = with_fact(format!(
            "SELECT EXISTS (SELECT 1 FROM memory_facts WHERE id = $8) AS kept,
                    $4 AND EXISTS (SELECT 1 FROM memory_facts
                        WHERE user_id = $1 AND bot_id = $2 AND topic = $3 AND said_at > $9
                          AND NOT {SAME}) AS newer"
        ))
        .fetch_one(&mut *tx)
        .await?;
        if row.get("kept") {
            return Ok(Kept::default());
        }
        if row.get("newer") {
            return Ok(Kept {
                replaced: Vec::new(),
                stale: true,
            });
        }
        // The same thing said again (its sources carry over), or the older value of a one-value topic.
        let replaced = with_fact(format!(
            "DELETE FROM memory_facts
             WHERE user_id = $1 AND bot_id = $2 AND topic = $3 AND ($4 OR {SAME})
               AND id <> $8 AND (said_at <= $9 OR {SAME})
             RETURNING id, sources, said_at, how, {SAME} AS same"
        ))
        .fetch_all(&mut *tx)
        .await?;
        let merged = merged(new, &replaced);
        insert(tx, user, bot, new, merged, &vector, model).await?;
        trim(tx, user, bot, max_facts).await?;
        Ok(Kept {
            replaced: replaced.iter().map(|r| r.get("id")).collect(),
            stale: false,
        })
    }

    /// Every fact kept for (user, bot), or for every companion of the user with `bot` `None`; newest
    /// first.
    pub async fn facts(&self, user: &str, bot: Option<&str>) -> Result<Vec<Fact>, MemoryError> {
        let sql = format!(
            "SELECT {FACT_COLUMNS} FROM memory_facts
             WHERE user_id = $1 AND ($2::text IS NULL OR bot_id = $2) ORDER BY learned_at DESC, id"
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(user)
            .bind(bot)
            .fetch_all(&self.pool)
            .await?;
        Ok(rows.iter().map(fact_of).collect())
    }

    /// Removes the facts of (user, bot) that `about` names and returns them: a topic named alone ("my
    /// stance", "my goals") removes every fact of that topic; otherwise the facts that hold every
    /// content word of it ("that I ride goofy" → "rides goofy"); failing those, the facts at least
    /// `similarity` close to its embedding, or the closest one if at least `floor` close. None may
    /// match: the caller says so.
    pub async fn forget(
        tx: &mut PgConnection,
        user: &str,
        bot: &str,
        about: &str,
        embedding: Option<&Embedding>,
        similarity: f32,
        floor: f32,
    ) -> Result<Vec<Fact>, MemoryError> {
        if one_writer(tx, user, bot).await? == Writer::Erased {
            return Ok(Vec::new());
        }
        let vector = embedding.map(|e| Vector::from(e.vector.clone()));
        // A fact embedded by another model is matched by its words only.
        let sql = format!(
            "SELECT {FACT_COLUMNS},
                    CASE WHEN $3::vector IS NULL OR embedding IS NULL OR model <> $4 THEN 0
                         ELSE 1 - (embedding <=> $3::vector) END AS score
             FROM memory_facts WHERE user_id = $1 AND bot_id = $2"
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(user)
            .bind(bot)
            .bind(&vector)
            .bind(embedding.map(|e| e.model))
            .fetch_all(&mut *tx)
            .await?;
        let scored: Vec<(Fact, f64)> = rows
            .iter()
            .map(|r| (fact_of(r), r.get::<f64, _>("score")))
            .collect();
        let doomed = chosen(about, &scored, f64::from(similarity), f64::from(floor));
        if doomed.is_empty() {
            return Ok(Vec::new());
        }
        let sql = format!(
            "DELETE FROM memory_facts WHERE user_id = $1 AND bot_id = $2 AND id = ANY($3)
             RETURNING {FACT_COLUMNS}"
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(user)
            .bind(bot)
            .bind(&doomed)
            .fetch_all(&mut *tx)
            .await?;
        Ok(rows.iter().map(fact_of).collect())
    }
}

/// Writes `new` for (user, bot) with what the facts it replaced carried over ([`Merged`]) and its
/// vector of `model`; a fact of the same id stays.
async fn insert(
    tx: &mut PgConnection,
    user: &str,
    bot: &str,
    new: &NewFact,
    Merged {
        sources,
        said_at,
        how,
    }: Merged,
    vector: &Option<Vector>,
    model: Option<&str>,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO memory_facts
            (id, user_id, bot_id, topic, fact, sources, learned_by, how, embedding, said_at, model)
         VALUES ($1, $2, $3, $4, $5, $6, $3, $7, $8, $9, coalesce($10, 'none'))
         ON CONFLICT (id) DO NOTHING",
    )
    .bind(&new.id)
    .bind(user)
    .bind(bot)
    .bind(new.topic.as_str())
    .bind(&new.fact)
    .bind(&sources)
    .bind(how.as_str())
    .bind(vector)
    .bind(said_at)
    .bind(model)
    .execute(&mut *tx)
    .await?;
    Ok(())
}

/// What a new fact carries over from the facts it replaces: their sources, the latest time said, and how
/// it was learned.
struct Merged {
    sources: Vec<String>,
    said_at: DateTime<Utc>,
    how: How,
}

/// The sources, time and how of a fact that replaces `replaced`: those it repeats (`same`) hand over
/// their sources and their latest time, and a fact the user asked to be remembered stays so.
fn merged(new: &NewFact, replaced: &[sqlx::postgres::PgRow]) -> Merged {
    let mut sources = new.sources.clone();
    let mut said_at = new.said_at;
    let mut how = new.how;
    for r in replaced {
        if r.get::<Option<bool>, _>("same").unwrap_or(false) {
            said_at = said_at.max(r.get("said_at"));
            // What the user asked to be remembered stays so when it is learned again.
            if r.get::<&str, _>("how") == How::Remembered.as_str() {
                how = How::Remembered;
            }
            for s in r.get::<Vec<String>, _>("sources") {
                if !sources.contains(&s) {
                    sources.push(s);
                }
            }
        }
    }
    Merged {
        sources,
        said_at,
        how,
    }
}

/// Keeps the newest `max_facts` of (user, bot), those the user asked to be remembered first.
async fn trim(
    tx: &mut PgConnection,
    user: &str,
    bot: &str,
    max_facts: i64,
) -> Result<(), MemoryError> {
    sqlx::query(
        "DELETE FROM memory_facts WHERE id IN (
            SELECT id FROM memory_facts WHERE user_id = $1 AND bot_id = $2
            ORDER BY (how = 'remembered') DESC, learned_at DESC OFFSET $3)",
    )
    .bind(user)
    .bind(bot)
    .bind(max_facts.max(1))
    .execute(&mut *tx)
    .await?;
    Ok(())
}

/// The ids of the facts `about` names among `scored` (each with its similarity to `about`); see
/// [`Memory::forget`].
fn chosen(about: &str, scored: &[(Fact, f64)], similarity: f64, floor: f64) -> Vec<String> {
    let ids = |keep: &dyn Fn(&(Fact, f64)) -> bool| -> Vec<String> {
        scored
            .iter()
            .filter(|f| keep(f))
            .map(|(f, _)| f.id.clone())
            .collect()
    };
    match topic::named(about) {
        Named::Topic(t) => ids(&|(f, _)| f.topic == t),
        Named::Words(words) => {
            let said = ids(&|(f, _)| {
                let has = topic::content_words(&f.fact);
                !words.is_empty() && words.iter().all(|w| has.contains(w))
            });
            if !said.is_empty() {
                return said;
            }
            let close = ids(&|(_, score)| *score >= similarity);
            if !close.is_empty() {
                return close;
            }
            scored
                .iter()
                .filter(|(_, score)| *score >= floor)
                .max_by(|a, b| a.1.total_cmp(&b.1))
                .map(|(f, _)| vec![f.id.clone()])
                .unwrap_or_default()
        }
    }
}

/// Every fact whose vector another model computed (or that has none: kept while no model was installed),
/// embedded again by `embedder`, `batch` facts at a time in id order. Each batch commits on its own and
/// an update never writes a fact that is gone (deleted or its user erased meanwhile), so a stopped run
/// is resumed by running it again. `progress` hears (facts done, facts to do). Returns the facts moved
/// over.
pub async fn reembed(
    pool: &Pool,
    embedder: &crate::rag::Embedder,
    batch: usize,
    mut progress: impl FnMut(u64, u64),
) -> Result<u64, MemoryError> {
    let model = embedder.model();
    let total: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM memory_facts WHERE embedding IS NULL OR model <> $1",
    )
    .bind(model)
    .fetch_one(pool)
    .await?;
    let (mut done, mut after) = (0u64, String::new());
    if total == 0 {
        return Ok(0);
    }
    loop {
        let rows = sqlx::query(
            "SELECT id, fact, (embedding IS NULL OR model <> $1) AS stale FROM memory_facts
                 WHERE id > $2 ORDER BY id LIMIT $3",
        )
        .bind(model)
        .bind(&after)
        .bind(batch.max(1) as i64)
        .fetch_all(pool)
        .await?;
        let Some(last) = rows.last() else {
            return Ok(done);
        };
        after = last.get("id");
        let stale: Vec<(String, String)> = rows
            .iter()
            .filter(|r| r.get::<bool, _>("stale"))
            .map(|r| (r.get("id"), r.get("fact")))
            .collect();
        if stale.is_empty() {
            continue;
        }
        let facts: Vec<&str> = stale.iter().map(|(_, f)| f.as_str()).collect();
        let vectors = embedder.embed(crate::rag::Role::Passage, &facts).await?;
        let ids: Vec<&str> = stale.iter().map(|(id, _)| id.as_str()).collect();
        let vectors: Vec<Vector> = vectors.into_iter().map(Vector::from).collect();
        done += sqlx::query(
            "UPDATE memory_facts f SET embedding = t.e, model = $3
                 FROM UNNEST($1::text[], $2::vector[]) AS t(id, e)
                 WHERE f.id = t.id AND (f.embedding IS NULL OR f.model <> $3)",
        )
        .bind(&ids)
        .bind(&vectors)
        .bind(model)
        .execute(pool)
        .await?
        .rows_affected();
        progress(done, total as u64);
    }
}

/// Facts whose vector a model other than `model` computed: recall leaves them out until they are
/// embedded again.
pub async fn stale_facts(pool: &Pool, model: &str) -> Result<i64, MemoryError> {
    Ok(sqlx::query_scalar(
        "SELECT count(*) FROM memory_facts WHERE embedding IS NOT NULL AND model <> $1",
    )
    .bind(model)
    .fetch_one(pool)
    .await?)
}
