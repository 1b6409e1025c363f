//! What a DM turn recalls: the pinned facts (name, level, stance, home spot), the facts nearest the
//! message by the vector the turn already computed for knowledge retrieval (no second model run), and the
//! rolling summary; one round trip. The prompt puts the pinned facts and the summary before the history
//! (they change seldom, so a provider's prompt cache keeps them) and the related facts after it.

use std::fmt::Write;

use pgvector::Vector;
use sqlx::Row;

use super::{Memory, MemoryError, Topic};

/// One recalled fact.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Recalled {
    /// Its `memory_facts.id`.
    pub(crate) id: String,
    pub(crate) topic: Topic,
    pub(crate) fact: String,
    /// Cosine similarity to the message (related facts only).
    pub(crate) score: Option<f32>,
}

/// What a turn recalls.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Recall {
    pub(crate) pinned: Vec<Recalled>,
    /// Best first, each at least the threshold close to the message.
    pub(crate) related: Vec<Recalled>,
    pub(crate) summary: String,
}

impl Recall {
    /// The facts recalled, by id, with their similarity to the message (none for a pinned fact).
    pub fn ids(&self) -> impl Iterator<Item = (&str, Option<f32>)> {
        self.pinned
            .iter()
            .chain(&self.related)
            .map(|f| (f.id.as_str(), f.score))
    }

    /// The pinned facts, for the stable part of the prompt; empty when there are none.
    pub fn pinned_block(&self) -> String {
        if self.pinned.is_empty() {
            return String::new();
        }
        let mut p = String::from(
            "## What you remember about them (from your earlier chats; they can ask you to forget)\n",
        );
        lines(&mut p, &self.pinned);
        p
    }

    /// The facts related to this message, for after the history; empty when none is.
    pub fn related_block(&self) -> String {
        if self.related.is_empty() {
            return String::new();
        }
        let mut p = String::from("## You also remember (related to their message)\n");
        lines(&mut p, &self.related);
        p
    }

    /// The summary of the conversation before the history window; empty when there is none.
    pub fn summary_block(&self) -> String {
        match self.summary.trim() {
            "" => String::new(),
            s => format!("## Earlier in your chats (summary)\n{s}\n"),
        }
    }
}

fn lines(p: &mut String, facts: &[Recalled]) {
    for f in facts {
        let _ = writeln!(p, "- {}: {}", f.topic.label(), f.fact.trim());
    }
}

impl Memory {
    /// The recall of (user, bot) for a message whose vector is `query` (none: pinned facts and the
    /// summary only).
    pub async fn recall(
        &self,
        user: &str,
        bot: &str,
        query: Option<&[f32]>,
    ) -> Result<Recall, MemoryError> {
        let pinned: Vec<&str> = Topic::ALL
            .into_iter()
            .filter(|t| t.pinned())
            .map(Topic::as_str)
            .collect();
        let rows = sqlx::query(
            "(SELECT 'p' AS part, id, topic, fact, NULL::real AS score, learned_at FROM memory_facts
              WHERE user_id = $1 AND bot_id = $2 AND topic = ANY($3))
             UNION ALL
             (SELECT 'r', id, topic, fact, (1 - (embedding <=> $4::vector))::real, learned_at FROM memory_facts
              WHERE $4::vector IS NOT NULL AND user_id = $1 AND bot_id = $2
                AND NOT (topic = ANY($3)) AND embedding IS NOT NULL AND model = $6
              ORDER BY embedding <=> $4::vector LIMIT $5)
             UNION ALL
             (SELECT 's', '', '', summary, NULL, updated_at FROM memory_state
              WHERE user_id = $1 AND bot_id = $2)",
        )
        .bind(user)
        .bind(bot)
        .bind(&pinned)
        .bind(query.map(|q| Vector::from(q.to_vec())))
        .bind(self.config.top_k.max(0))
        .bind(self.model())
        .fetch_all(&self.pool)
        .await?;
        let mut recall = Recall::default();
        for r in rows {
            let topic = Topic::parse(r.get::<&str, _>("topic")).unwrap_or(Topic::Other);
            let (id, fact): (String, String) = (r.get("id"), r.get("fact"));
            let score: Option<f32> = r.get("score");
            match r.get::<&str, _>("part") {
                "p" => recall.pinned.push(Recalled {
                    id,
                    topic,
                    fact,
                    score: None,
                }),
                "r" if score.is_some_and(|s| s >= self.recall_threshold()) => {
                    recall.related.push(Recalled {
                        id,
                        topic,
                        fact,
                        score,
                    })
                }
                "s" => recall.summary = fact,
                _ => {}
            }
        }
        recall.pinned.sort_by_key(|f| f.topic as u8);
        recall
            .related
            .sort_by(|a, b| b.score.unwrap_or(0.0).total_cmp(&a.score.unwrap_or(0.0)));
        Ok(recall)
    }
}
