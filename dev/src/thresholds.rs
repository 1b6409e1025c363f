//! `companion-dev thresholds`: every similarity threshold of the worker chosen on labelled lines for the
//! configured encoder, and measured on lines it was not chosen on (issue 61: e5's scores crowd into
//! 0.7–1.0 even for unrelated text, so MiniLM's numbers would pull every chunk and let `forget` erase
//! facts the user never named). Each set is split by the FNV-1a hash of a line's text: even → `tune`
//! (the threshold is chosen there), odd → `heldout` (the figures reported). A report: it succeeds
//! whatever the figures are.
//!
//! | threshold | positives | negatives | chosen as |
//! |---|---|---|---|
//! | knowledge (`COMPANION_RAG_THRESHOLD`) | a question and the best chunk of the article that answers it | an unrelated message and its best chunk | the most (TPR − FPR); the lowest cut with at most 10 % of unrelated messages above it is printed beside it (docs/knowledge.md says which e5 took, and why) |
//! | memory recall (`COMPANION_MEMORY_THRESHOLD`) | a message and the fact it needs | an unrelated message and its closest fact | the same as knowledge |
//! | `forget`'s match (`Scores::forget_match`) | a request to forget a fact and that fact | the request and every other fact | just above every negative |
//! | `forget`'s floor (`Scores::forget_floor`) | the same positives | an unrelated message and its closest fact | the most (TPR − FPR) |
//! | a fact said again (`Scores::duplicate`) | a fact and its rewording | a fact and a different fact of its topic | just above every negative |

use std::{collections::BTreeMap, fmt::Write, path::Path};

use anyhow::Context;
use companion_core::config::EmbedSettings;
use companion_knowledge::rag::{
    Article, ChunkConfig, Embedder, Role, chunk_article, cosine, read_articles,
};
use serde::Deserialize;

/// A line of `tests/fixtures/retrieval/questions.jsonl`: a `question` one demo article answers (its
/// `collection` and `key`), or an `unrelated` message.
#[derive(Clone, Debug, Deserialize)]
pub struct Question {
    pub lang: String,
    pub kind: String,
    pub collection: Option<String>,
    pub key: Option<String>,
    pub text: String,
}

/// A line of `tests/fixtures/memory/pairs.jsonl`.
#[derive(Clone, Debug, Deserialize)]
struct Pair {
    lang: String,
    kind: String,
    id: Option<String>,
    about: Option<String>,
    text: String,
}

/// FNV-1a over the text's bytes: even → tune, odd → held out.
pub fn tune(text: &str) -> bool {
    let mut h: u32 = 0x811C_9DC5;
    for b in text.bytes() {
        h = (h ^ u32::from(b)).wrapping_mul(0x0100_0193);
    }
    h.is_multiple_of(2)
}

/// Scored examples of one threshold: (score, positive, tune split, language).
type Scored = Vec<(f32, bool, bool, String)>;

/// The cut with the most (TPR − FPR) on the tune lines (ties: the higher cut).
fn youden(scored: &Scored) -> f32 {
    let mut cuts: Vec<f32> = scored.iter().filter(|s| s.2).map(|s| s.0).collect();
    cuts.sort_by(f32::total_cmp);
    let mut best = (f32::MIN, 0.0);
    for &c in &cuts {
        let (tpr, fpr) = rates(scored, c, true);
        if tpr - fpr >= best.0 {
            best = (tpr - fpr, c);
        }
    }
    best.1
}

/// The lowest cut (of 0.01 steps) with at most `fpr` of the tune negatives at or above it.
fn at_most(scored: &Scored, fpr: f32) -> f32 {
    (0..=100)
        .map(|c| c as f32 / 100.0)
        .find(|&c| rates(scored, c, true).1 <= fpr)
        .unwrap_or(1.0)
}

/// Just above every tune negative (rounded up to 0.01).
fn above_negatives(scored: &Scored) -> f32 {
    let max = scored
        .iter()
        .filter(|s| s.2 && !s.1)
        .map(|s| s.0)
        .fold(f32::MIN, f32::max);
    ((max * 100.0).floor() + 1.0) / 100.0
}

/// (true positive rate, false positive rate) at `cut` on the tune or the held-out lines.
fn rates(scored: &Scored, cut: f32, on_tune: bool) -> (f32, f32) {
    let of = |positive: bool| {
        let all: Vec<&(f32, bool, bool, String)> = scored
            .iter()
            .filter(|s| s.1 == positive && s.2 == on_tune)
            .collect();
        let above = all.iter().filter(|s| s.0 >= cut).count();
        above as f32 / all.len().max(1) as f32
    };
    (of(true), of(false))
}

/// Quantiles of the positives' and the negatives' scores, for the record.
fn spread(scored: &Scored) -> String {
    let q = |positive: bool| {
        let mut v: Vec<f32> = scored
            .iter()
            .filter(|s| s.1 == positive)
            .map(|s| s.0)
            .collect();
        v.sort_by(f32::total_cmp);
        let at = |p: f32| {
            v.get(((v.len() as f32 - 1.0) * p).round() as usize)
                .copied()
                .unwrap_or(0.0)
        };
        format!(
            "{:.2} {:.2} {:.2} {:.2} {:.2}",
            at(0.0),
            at(0.1),
            at(0.5),
            at(0.9),
            at(1.0)
        )
    };
    format!(
        "positives min/p10/median/p90/max {}; negatives {}",
        q(true),
        q(false)
    )
}

/// One threshold's lines of the report.
fn report(out: &mut String, name: &str, scored: &Scored, cut: f32, how: &str) {
    let (tpr, fpr) = rates(scored, cut, true);
    let (htpr, hfpr) = rates(scored, cut, false);
    let _ = writeln!(
        out,
        "{name}: {cut:.2} ({how}); tune: {tpr:.3} of positives above, {fpr:.3} of negatives; \
         held out: {htpr:.3} above, {hfpr:.3} of negatives"
    );
    let mut by_lang: BTreeMap<&str, Scored> = BTreeMap::new();
    for s in scored {
        by_lang.entry(&s.3).or_default().push(s.clone());
    }
    let langs: Vec<String> = by_lang
        .iter()
        .map(|(l, s)| {
            let (t, f) = rates(s, cut, false);
            format!("{l} {t:.2}/{f:.2}")
        })
        .collect();
    let _ = writeln!(
        out,
        "  held out per language (above/negatives): {}",
        langs.join(", ")
    );
    let _ = writeln!(out, "  scores: {}", spread(scored));
}

/// The demo knowledge's chunks as ingest embeds them: (collection/key, vector).
async fn chunks(embedder: &Embedder, dir: &Path) -> anyhow::Result<Vec<(String, Vec<f32>)>> {
    let articles: Vec<Article> = read_articles(dir, None)?;
    let mut out = Vec::new();
    for a in &articles {
        let (_, inputs) = chunk_article(embedder, a, ChunkConfig::default())?;
        let refs: Vec<&str> = inputs.iter().map(String::as_str).collect();
        for v in embedder.embed(Role::Passage, &refs).await? {
            out.push((format!("{}/{}", a.collection, a.key), v));
        }
    }
    Ok(out)
}

/// Where the lines are.
pub struct Sources<'a> {
    pub questions: &'a Path,
    pub pairs: &'a Path,
    pub knowledge: &'a Path,
}

/// Chooses and measures every threshold for the configured encoder; the report.
pub async fn measure(embed: &EmbedSettings, at: &Sources<'_>) -> anyhow::Result<String> {
    let embedder = companion_knowledge::rag::load_embedder(embed)
        .context("the embedding model (deploy/local/models.sh)")?;
    let mut out = String::new();
    let _ = writeln!(out, "encoder: {}", embedder.model());
    knowledge(&mut out, &embedder, at).await?;
    memory(&mut out, &embedder, at.pairs).await?;
    // The candidates above are what the lines say; which one each threshold took, and why, is a
    // decision (docs/knowledge.md, "Thresholds"), shown here beside them.
    let _ = writeln!(
        out,
        "shipped for {}: {:?}",
        embedder.model(),
        embedder.encoder().scores
    );
    Ok(out)
}

/// The knowledge threshold chosen on the questions and the demo knowledge, written to `out`, with
/// how often the right article is among the top 3 chunks.
async fn knowledge(out: &mut String, embedder: &Embedder, at: &Sources<'_>) -> anyhow::Result<()> {
    // Knowledge: the best chunk of the right article against an unrelated message's best chunk; and
    // where the right article ranks.
    let questions: Vec<Question> = crate::jsonl::read(at.questions)?;
    let chunks = chunks(embedder, at.knowledge).await?;
    let texts: Vec<&str> = questions.iter().map(|q| q.text.as_str()).collect();
    let vectors = embedder.embed(Role::Query, &texts).await?;
    let mut rag = Scored::new();
    let mut top3: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
    for (q, v) in questions.iter().zip(&vectors) {
        let mut scored: Vec<(f32, &str)> = chunks
            .iter()
            .map(|(article, c)| (cosine(v, c), article.as_str()))
            .collect();
        scored.sort_by(|a, b| b.0.total_cmp(&a.0));
        let right = match (&q.collection, &q.key) {
            (Some(c), Some(k)) => Some(format!("{c}/{k}")),
            _ => None,
        };
        let split = tune(&q.text);
        match right {
            Some(right) => {
                let best = scored.iter().find(|s| s.1 == right).map_or(-1.0, |s| s.0);
                rag.push((best, true, split, q.lang.clone()));
                let cell = top3.entry(&q.lang).or_default();
                cell.1 += 1;
                cell.0 += usize::from(scored.iter().take(3).any(|s| s.1 == right));
            }
            None => rag.push((scored[0].0, false, split, q.lang.clone())),
        }
        debug_assert!(q.kind == "question" || q.kind == "unrelated");
    }
    let cut = at_most(&rag, 0.1);
    report(
        out,
        "knowledge (COMPANION_RAG_THRESHOLD)",
        &rag,
        cut,
        "the lowest with at most 10 % of unrelated messages above",
    );
    let alt = youden(&rag);
    report(out, "  or", &rag, alt, "the most TPR - FPR (recall first)");
    let ranks: Vec<String> = top3
        .iter()
        .map(|(l, (hit, all))| format!("{l} {hit}/{all}"))
        .collect();
    let _ = writeln!(
        out,
        "  right article among the top 3 chunks (every question): {}",
        ranks.join(", ")
    );
    Ok(())
}

/// The memory lines' scores, one set per threshold.
struct MemoryScores {
    recall: Scored,
    similar: Scored,
    closest: Scored,
    duplicate: Scored,
}

/// The memory thresholds (recall, forget's match and floor, a fact said again) chosen on the pairs
/// at `pairs`, written to `out`.
async fn memory(out: &mut String, embedder: &Embedder, pairs: &Path) -> anyhow::Result<()> {
    // Memory: facts are passages; messages and forget requests are queries.
    let pairs: Vec<Pair> =
        crate::jsonl::read(pairs).with_context(|| format!("reading {}", pairs.display()))?;
    let MemoryScores {
        recall,
        similar,
        closest,
        duplicate,
    } = memory_scores(embedder, &pairs).await?;
    let cut = at_most(&recall, 0.1);
    report(
        out,
        "memory recall (COMPANION_MEMORY_THRESHOLD)",
        &recall,
        cut,
        "the lowest with at most 10 % of unrelated messages above",
    );
    let alt = youden(&recall);
    report(
        out,
        "  or",
        &recall,
        alt,
        "the most TPR - FPR (recall first)",
    );
    let cut = above_negatives(&similar);
    report(
        out,
        "forget's match (Scores::forget_match)",
        &similar,
        cut,
        "above every other fact",
    );
    let cut = youden(&closest);
    report(
        out,
        "forget's floor (Scores::forget_floor)",
        &closest,
        cut,
        "most TPR - FPR",
    );
    let cut = above_negatives(&duplicate);
    report(
        out,
        "a fact said again (Scores::duplicate)",
        &duplicate,
        cut,
        "above every different fact",
    );
    Ok(())
}

/// Scores every message, forget request and restated fact of `pairs` against the facts of its
/// language.
async fn memory_scores(embedder: &Embedder, pairs: &[Pair]) -> anyhow::Result<MemoryScores> {
    let facts: Vec<&Pair> = pairs.iter().filter(|p| p.kind == "fact").collect();
    let fact_texts: Vec<&str> = facts.iter().map(|f| f.text.as_str()).collect();
    let fact_vectors = embedder.embed(Role::Passage, &fact_texts).await?;
    let fact_of = |id: &str| facts.iter().position(|f| f.id.as_deref() == Some(id));
    let mut recall = Scored::new();
    let mut similar = Scored::new();
    let mut closest = Scored::new();
    let mut duplicate = Scored::new();
    for p in pairs {
        if p.kind == "fact" {
            continue;
        }
        let split = tune(&p.text);
        let role = match p.kind.as_str() {
            "duplicate" | "near" => Role::Passage,
            _ => Role::Query,
        };
        let v = embedder.embed_one(role, &p.text).await?;
        let own: Vec<(usize, f32)> = facts
            .iter()
            .enumerate()
            .filter(|(_, f)| f.lang == p.lang)
            .map(|(i, _)| (i, cosine(&v, &fact_vectors[i])))
            .collect();
        let about = p.about.as_deref().and_then(fact_of);
        let score_of = |i: usize| own.iter().find(|(j, _)| *j == i).map_or(-1.0, |s| s.1);
        let best_other = |but: Option<usize>| {
            own.iter()
                .filter(|(j, _)| Some(*j) != but)
                .map(|s| s.1)
                .fold(f32::MIN, f32::max)
        };
        let lang = p.lang.clone();
        match (p.kind.as_str(), about) {
            ("related", Some(i)) => recall.push((score_of(i), true, split, lang)),
            ("unrelated", _) => {
                recall.push((best_other(None), false, split, lang.clone()));
                closest.push((best_other(None), false, split, lang));
            }
            ("forget", Some(i)) => {
                similar.push((score_of(i), true, split, lang.clone()));
                closest.push((score_of(i), true, split, lang.clone()));
                for (j, s) in &own {
                    if *j != i {
                        similar.push((*s, false, split, lang.clone()));
                    }
                }
            }
            ("duplicate", Some(i)) => duplicate.push((score_of(i), true, split, lang)),
            ("near", Some(i)) => duplicate.push((score_of(i), false, split, lang)),
            _ => {}
        }
    }
    Ok(MemoryScores {
        recall,
        similar,
        closest,
        duplicate,
    })
}
