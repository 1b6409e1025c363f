//! `companion-dev safety-train`: trains the learned layer of the crisis screen and of the output check
//! (`crates/safety/src/learned.rs`) on the tuning lines of `tests/fixtures/safety/tuning/` (written apart from
//! the frozen sets; see its README), and writes `screen-input.bin` and `screen-output.bin`.
//!
//! Softmax regression by stochastic gradient descent (AdaGrad steps), every line seen twice: with its
//! MiniLM embedding and without it, so the model also decides when the embedder is not installed. The
//! threshold is chosen out of fold (5 folds) on the tuning lines alone: the lowest that keeps the hard
//! negatives' false positives at or under the target. Deterministic for a given seed and input.

use std::collections::BTreeMap;

use anyhow::Context;
use companion_core::config::EmbedSettings;
use companion_safety::{
    check_reply_with, decide_with,
    learned::{self, BUCKETS, DIM, Features, Header, Model},
};
use sha2::{Digest, Sha256};

use crate::frozen_eval::Line;

/// The lines read besides the tuning files, by default.
const EXTRA: [&str; 3] = [
    "tests/fixtures/safety/labelled.jsonl",
    "deploy/local/calibration/chat.txt",
    "deploy/local/calibration/multilingual.txt",
];

/// Ordinary companion text, as replies the output check must pass (`chat` of the output set): the
/// skateboarding knowledge, sentence by sentence, and the calibration chat lines. The snowboarding
/// knowledge is left out, to measure on (`ordinary_sport_text_the_output_layer_never_saw_passes`).
const REPLY_CHAT: [&str; 8] = [
    "deploy/local/knowledge/skateboarding/bearings-and-maintenance.md",
    "deploy/local/knowledge/skateboarding/choosing-a-setup.md",
    "deploy/local/knowledge/skateboarding/kickflip-tips.md",
    "deploy/local/knowledge/skateboarding/ollie-basics.md",
    "deploy/local/knowledge/skateboarding/pushing-and-stopping.md",
    "deploy/local/knowledge/skateboarding/skatepark-etiquette.md",
    "deploy/local/calibration/chat.txt",
    "deploy/local/calibration/multilingual.txt",
];

/// The classes of each model, `none` first.
const INPUT_CLASSES: [&str; 5] = ["none", "self_harm", "harm_others", "abuse", "grooming"];
const OUTPUT_CLASSES: [&str; 3] = ["none", "encouragement", "sexual"];
const WIDTH: usize = BUCKETS + DIM;

/// What to train with.
#[derive(Clone, Debug, clap::Args)]
pub struct TrainArgs {
    #[arg(long, default_value = "tests/fixtures/safety/tuning")]
    pub tuning_dir: std::path::PathBuf,
    /// Where the model files go.
    #[arg(long, default_value = "crates/safety/src")]
    pub out_dir: std::path::PathBuf,
    #[arg(long, default_value_t = 12)]
    pub epochs: usize,
    #[arg(long, default_value_t = 7)]
    pub seed: u64,
    /// Highest out-of-fold false-positive rate on the tuning set's hard negatives (user messages).
    #[arg(long, default_value_t = 0.03)]
    pub input_fp: f64,
    /// Highest out-of-fold false-positive rate of the combined decision on ordinary chat (user messages
    /// and companion text): a referral or a swapped reply in everyday talk is what users meet most.
    #[arg(long, default_value_t = 0.0075)]
    pub chat_fp: f64,
    /// Highest false-positive rate of the vector head on the hard negatives of a language it never saw
    /// (each tuning language left out in turn); its chat target is `--chat-fp`.
    #[arg(long, default_value_t = 0.01)]
    pub vector_fp: f64,
    /// Passes of the vector head over the tuning lines.
    #[arg(long, default_value_t = 8)]
    pub vector_epochs: usize,
    /// Highest out-of-fold false-positive rate on the tuning set's kind replies.
    #[arg(long, default_value_t = 0.01)]
    pub output_fp: f64,
    /// Highest false-positive rate of the reply head on the kind replies of a language it never saw.
    #[arg(long, default_value_t = 0.005)]
    pub output_vector_fp: f64,
    /// Highest share of ordinary replies in a covered language the reply head's gate may send to the
    /// encoder (out of fold; a reply in a language no rule covers always goes): each is one more encoder
    /// run in its turn. On the 29 November lines, 0.092 embedded bought recall 0.674 and 0.364 bought
    /// 0.703: four times the runs for 0.03.
    #[arg(long, default_value_t = 0.10)]
    pub reply_embed_rate: f64,
    /// Print the tuning negatives scored over the threshold out of fold (what the layer misreads).
    #[arg(long)]
    pub show: bool,
    /// More lines: JSON Lines with `text`, `lang`, `label` (and `kind`), or text files of ordinary chat
    /// (one message a line, `#` comments), taken as `none`.
    #[arg(long, default_values = EXTRA)]
    pub extra: Vec<std::path::PathBuf>,
    #[command(flatten)]
    pub embed: EmbedSettings,
}

/// The tuning files of `dir`, in name order.
fn tuning_files(dir: &std::path::Path) -> anyhow::Result<Vec<std::path::PathBuf>> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "jsonl"))
        .collect();
    files.sort();
    Ok(files)
}

/// The sha256 of everything a model is trained on, as its header records it.
fn digest(files: &[std::path::PathBuf], extra: &[std::path::PathBuf]) -> anyhow::Result<String> {
    let mut hasher = Sha256::new();
    for f in files.iter().chain(extra) {
        hasher.update(std::fs::read(f).with_context(|| format!("reading {}", f.display()))?);
    }
    Ok(hex(&hasher.finalize()))
}

/// A line of the labelled set.
#[derive(serde::Deserialize)]
struct Labelled {
    text: String,
    lang: String,
    label: String,
}

/// The lines of an extra file, as user messages.
fn read_extra(path: &std::path::Path) -> anyhow::Result<Vec<Line>> {
    if path.extension().is_some_and(|e| e == "jsonl") {
        return Ok(crate::jsonl::read::<Labelled>(path)?
            .into_iter()
            .map(|l| Line {
                set: "input".into(),
                kind: if l.label == "none" {
                    "other".into()
                } else {
                    l.label.clone()
                },
                lang: l.lang,
                label: l.label,
                text: l.text,
            })
            .collect());
    }
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| Line {
            set: "input".into(),
            lang: "xx".into(),
            label: "none".into(),
            kind: "chat".into(),
            text: l.to_owned(),
        })
        .collect())
}

/// The sentences of ordinary companion text (a Markdown page or chat lines) as kind replies (`chat`).
fn read_reply_chat(path: &std::path::Path) -> anyhow::Result<Vec<Line>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(sentences(&text)
        .map(|l| Line {
            set: "output".into(),
            lang: "xx".into(),
            label: "none".into(),
            kind: "chat".into(),
            text: l.to_owned(),
        })
        .collect())
}

/// The sentences of a text of more than three words, without headings and comments.
fn sentences(text: &str) -> impl Iterator<Item = &str> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#') && !l.starts_with("---"))
        .flat_map(|l| l.split(". "))
        .map(|l| l.trim_matches(|c: char| c == '-' || c == '*' || c.is_whitespace()))
        .filter(|l| l.split_whitespace().count() > 3)
}

/// One training example.
struct Example {
    text: String,
    x: Features,
    y: usize,
    /// Whether it counts as a hard negative for the threshold (not ordinary chat).
    hard: bool,
    lang: String,
}

/// Trains both models and writes them.
pub async fn train(args: &TrainArgs) -> anyhow::Result<()> {
    let files = tuning_files(&args.tuning_dir)?;
    let (lines, digest) = read_lines(args, &files)?;
    let embedder = companion_knowledge::rag::load_embedder(&args.embed)
        .context("the embedding model is needed to train (deploy/local/models.sh)")?;
    let texts: Vec<String> = lines.iter().map(|l| l.text.clone()).collect();
    let mut vectors = Vec::with_capacity(texts.len());
    for chunk in texts.chunks(64) {
        let refs: Vec<&str> = chunk.iter().map(|t| t.as_ref()).collect();
        vectors.extend(
            embedder
                .embed(companion_knowledge::rag::Role::Query, &refs)
                .await?,
        );
    }
    println!(
        "tuning lines: {} from {} files (sha256 {digest})",
        lines.len(),
        files.len()
    );
    for (set, classes, fp, file) in [
        (
            "input",
            &INPUT_CLASSES[..],
            args.input_fp,
            "screen-input.bin",
        ),
        (
            "output",
            &OUTPUT_CLASSES[..],
            args.output_fp,
            "screen-output.bin",
        ),
    ] {
        let (examples, line_vectors) = examples(set, classes, &lines, &vectors);
        let (mut model, folds) = fit_with_threshold(set, classes, &examples, fp, args, &digest)?;
        model.header.encoder = Some(embedder.model().to_owned());
        let path = args.out_dir.join(file);
        std::fs::write(&path, model.to_bytes())
            .with_context(|| format!("writing {}", path.display()))?;
        println!("wrote {} ({})", path.display(), model.header.note);
        let samples: Vec<crate::vector_head::Sample> = examples
            .iter()
            .zip(&line_vectors)
            .map(|(e, v)| crate::vector_head::Sample {
                text: &e.text,
                vector: v,
                y: e.y,
                lang: &e.lang,
                hard: e.hard,
            })
            .collect();
        train_vector_head(
            args,
            set,
            classes,
            &samples,
            embedder.model(),
            &model,
            &folds,
        )?;
    }
    Ok(())
}

/// The lines of `set` labelled with one of `classes`, as examples, each with its line's vector.
fn examples<'a>(
    set: &str,
    classes: &[&str],
    lines: &[Line],
    vectors: &'a [Vec<f32>],
) -> (Vec<Example>, Vec<&'a [f32]>) {
    lines
        .iter()
        .zip(vectors)
        .filter(|(l, _)| l.set == set)
        .filter_map(|(l, v)| {
            let y = classes.iter().position(|c| *c == l.label)?;
            // The worker embeds user messages, never replies (CrisisScreen::check_reply reads their
            // n-grams): each model learns from what it is given at work.
            let embedding = (set == "input").then_some(v.as_slice());
            let e = Example {
                text: l.text.clone(),
                x: learned::features(&l.text, embedding),
                y,
                hard: l.label == "none" && l.kind != "chat",
                lang: l.lang.clone(),
            };
            Some((e, v.as_slice()))
        })
        .unzip()
}

/// Every tuning line (the tuning files', `--extra`'s and the ordinary companion text's), and the
/// digest of the files they came from.
fn read_lines(
    args: &TrainArgs,
    files: &[std::path::PathBuf],
) -> anyhow::Result<(Vec<Line>, String)> {
    let mut lines: Vec<Line> = Vec::new();
    for f in files {
        lines.extend(crate::jsonl::read::<Line>(f)?);
    }
    // The project's own labelled set (written with the rules; never the frozen sets) and its everyday
    // chat lines (the embedder's calibration text): more positives, and what ordinary messages look like.
    for path in &args.extra {
        lines.extend(read_extra(path)?);
    }
    let reply_chat: Vec<std::path::PathBuf> = REPLY_CHAT.iter().map(Into::into).collect();
    for path in &reply_chat {
        lines.extend(read_reply_chat(path)?);
    }
    let extra: Vec<std::path::PathBuf> = args.extra.iter().chain(&reply_chat).cloned().collect();
    let digest = digest(files, &extra)?;
    Ok((lines, digest))
}

/// Trains the vector head of a set on its samples, chooses where it decides (the input's covered
/// languages; the output's gate too) with the out-of-fold models, and writes it.
fn train_vector_head(
    args: &TrainArgs,
    set: &str,
    classes: &[&str],
    samples: &[crate::vector_head::Sample],
    encoder: &str,
    model: &Model,
    folds: &Folds,
) -> anyhow::Result<()> {
    let settings = crate::vector_head::Settings {
        epochs: args.vector_epochs,
        seed: args.seed,
        hard_fp: match set {
            "input" => args.vector_fp,
            _ => args.output_vector_fp,
        },
        chat_fp: args.chat_fp,
    };
    let mut head = crate::vector_head::train(
        samples,
        classes,
        encoder,
        &model.header.trained_on,
        &settings,
    )?;
    let (file, note) = match set {
        "input" => {
            let (covered, note) = crate::vector_head::choose_covered(
                samples,
                &folds.fold,
                &folds.models,
                &head,
                &settings,
                args.input_fp,
            )?;
            head.header.covered = covered;
            ("screen-input-vector.bin", note)
        }
        _ => {
            let (gate, covered, note) = crate::vector_head::choose_gate(
                samples,
                &folds.fold,
                &folds.models,
                &head,
                &settings,
                args.output_fp,
                args.reply_embed_rate,
            )?;
            (head.header.gate, head.header.covered) = (gate, covered);
            ("screen-output-vector.bin", note)
        }
    };
    head.header.note = format!("{}; {note}", head.header.note);
    let path = args.out_dir.join(file);
    std::fs::write(&path, head.to_bytes())
        .with_context(|| format!("writing {}", path.display()))?;
    println!("wrote {}", path.display());
    Ok(())
}

/// Out-of-fold scores choose the threshold; then the model is trained on every line.
fn fit_with_threshold(
    set: &str,
    classes: &[&str],
    examples: &[Example],
    fp_target: f64,
    args: &TrainArgs,
    digest: &str,
) -> anyhow::Result<(Model, Folds)> {
    anyhow::ensure!(!examples.is_empty(), "no {set} tuning lines");
    let (fold, oof, mut folds) = out_of_fold(classes, examples, args, digest);
    let (threshold, note) = choose_threshold(set, examples, &oof, fp_target, args);
    for m in &mut folds {
        m.header.threshold = threshold;
    }
    let mut oof = Oof {
        examples,
        fold: &fold,
        models: folds,
    };
    let policy = oof.choose(set, fp_target, args.chat_fp);
    let mut models = oof.models;
    for m in &mut models {
        m.header.threshold = policy.threshold.unwrap_or(threshold);
        m.header.veto = policy.veto;
        m.header.context_free = policy
            .context_free
            .iter()
            .map(|c| (*c).to_owned())
            .collect();
    }
    let all: Vec<&Example> = examples.iter().collect();
    let (w, b) = fit(classes.len(), &all, args.epochs, args.seed);
    let mut header = header(
        classes,
        threshold,
        digest,
        &format!("{note}; {}", policy.note),
    );
    header.threshold = policy.threshold.unwrap_or(threshold);
    header.veto = policy.veto;
    header.context_free = policy
        .context_free
        .iter()
        .map(|c| (*c).to_owned())
        .collect();
    Ok((Model::quantise(header, &w, b), Folds { fold, models }))
}

/// Five models, each trained without one fold of the examples: which fold each example was left out
/// of, its score from the model that did not see it, and the models.
fn out_of_fold(
    classes: &[&str],
    examples: &[Example],
    args: &TrainArgs,
    digest: &str,
) -> (Vec<usize>, Vec<f32>, Vec<Model>) {
    const FOLDS: usize = 5;
    let mut rng = fastrand::Rng::with_seed(args.seed);
    let mut fold: Vec<usize> = (0..examples.len()).map(|i| i % FOLDS).collect();
    rng.shuffle(&mut fold);
    let mut oof = vec![0f32; examples.len()];
    let mut folds = Vec::with_capacity(FOLDS);
    for k in 0..FOLDS {
        let train: Vec<&Example> = examples
            .iter()
            .zip(&fold)
            .filter(|(_, f)| **f != k)
            .map(|(e, _)| e)
            .collect();
        let (w, b) = fit(classes.len(), &train, args.epochs, args.seed + k as u64);
        let m = Model::quantise(header(classes, 1.0, digest, ""), &w, b);
        for (i, e) in examples.iter().enumerate().filter(|(i, _)| fold[*i] == k) {
            oof[i] = m.verdict(&e.x).1;
        }
        folds.push(m);
    }
    (fold, oof, folds)
}

/// The lowest threshold whose out-of-fold false positives meet `fp_target` (on ordinary chat, a
/// quarter of it), printing the figures at a few thresholds; and the note of the chosen one.
fn choose_threshold(
    set: &str,
    examples: &[Example],
    oof: &[f32],
    fp_target: f64,
    args: &TrainArgs,
) -> (f32, String) {
    let threshold = (1..100)
        .map(|t| t as f32 / 100.0)
        .find(|t| {
            fp_rate(examples, oof, *t) <= fp_target && chat_fp(examples, oof, *t) <= fp_target / 4.0
        })
        .unwrap_or(0.99);
    let recall = |t: f32, lang: Option<&str>| {
        let pos: Vec<usize> = (0..examples.len())
            .filter(|i| examples[*i].y != 0 && lang.is_none_or(|l| examples[*i].lang == l))
            .collect();
        pos.iter().filter(|i| oof[**i] >= t).count() as f64 / pos.len().max(1) as f64
    };
    for t in [0.3f32, 0.5, 0.7, 0.8, 0.9, 0.95] {
        println!(
            "  {set} out of fold at {t:.2}: recall {:.3}, hard-negative fp {:.3}, chat fp {:.3}",
            recall(t, None),
            fp_rate(examples, oof, t),
            chat_fp(examples, oof, t)
        );
    }
    if args.show {
        for (i, e) in examples.iter().enumerate() {
            if e.y == 0 && oof[i] >= threshold {
                println!("  fp {:.2} {} {}", oof[i], e.lang, e.text);
            }
        }
    }
    let mut by_lang = BTreeMap::new();
    for e in examples {
        by_lang
            .entry(e.lang.clone())
            .or_insert_with(|| recall(threshold, Some(&e.lang)));
    }
    let langs: Vec<String> = by_lang.iter().map(|(l, r)| format!("{l} {r:.3}")).collect();
    let note = format!(
        "{set}: {} lines; out of fold at threshold {threshold:.2}: recall {:.3} ({}), hard-negative fp {:.3}, chat fp {:.4}",
        examples.len(),
        recall(threshold, None),
        langs.join(", "),
        fp_rate(examples, oof, threshold),
        chat_fp(examples, oof, threshold)
    );
    println!("{note}");
    (threshold, note)
}

/// The out-of-fold models of the chosen policy and which fold each tuning line was left out of: what the
/// vector head's choice for covered languages is decided with.
struct Folds {
    fold: Vec<usize>,
    models: Vec<Model>,
}

/// The layers' combined decision, out of fold: each tuning line decided by the rules and the model that
/// did not see it.
struct Oof<'a> {
    examples: &'a [Example],
    fold: &'a [usize],
    models: Vec<Model>,
}

/// What the trainer chose for the combined decision, and why.
struct Policy {
    threshold: Option<f32>,
    veto: Option<f32>,
    context_free: &'static [&'static str],
    note: String,
}

/// A decision's figures on the tuning lines: recall, hard-negative and chat false positives.
#[derive(Clone, Copy, Debug, Default)]
pub struct Figures {
    pub recall: f64,
    pub hard_fp: f64,
    pub chat_fp: f64,
}

impl Figures {
    /// The figures of lines given as (a crisis, a hard negative, flagged).
    pub fn of(lines: impl Iterator<Item = (bool, bool, bool)>) -> Self {
        let (mut pos, mut hit, mut hard, mut hard_fp, mut chat, mut chat_fp) = (0, 0, 0, 0, 0, 0);
        for (positive, is_hard, flagged) in lines {
            let f = usize::from(flagged);
            match (positive, is_hard) {
                (true, _) => (pos, hit) = (pos + 1, hit + f),
                (false, true) => (hard, hard_fp) = (hard + 1, hard_fp + f),
                (false, false) => (chat, chat_fp) = (chat + 1, chat_fp + f),
            }
        }
        let share = |a: usize, b: usize| a as f64 / b.max(1) as f64;
        Figures {
            recall: share(hit, pos),
            hard_fp: share(hard_fp, hard),
            chat_fp: share(chat_fp, chat),
        }
    }

    /// More recall, or as much with fewer false positives.
    pub fn better_than(&self, other: &Figures) -> bool {
        self.recall > other.recall
            || (self.recall == other.recall
                && self.hard_fp + self.chat_fp < other.hard_fp + other.chat_fp)
    }
}

impl Oof<'_> {
    /// The figures of `flagged` (given the line and the model that did not see it).
    fn figures(&self, flagged: impl Fn(&Example, &Model) -> bool) -> Figures {
        Figures::of(
            self.examples
                .iter()
                .zip(self.fold)
                .map(|(e, k)| (e.y != 0, e.hard, flagged(e, &self.models[*k]))),
        )
    }

    /// The threshold, and the veto of a sure rule (input) or whether the layer blocks on its own
    /// (output), under which the combined decision has the most recall while its false positives stay
    /// within `fp_target` on the hard negatives and `chat_fp` on ordinary chat; fewer false positives on
    /// a tie.
    fn choose(&mut self, set: &str, fp_target: f64, chat_fp: f64) -> Policy {
        let vetoes: &[Option<f32>] = if set == "input" {
            &[
                None,
                Some(0.02),
                Some(0.05),
                Some(0.1),
                Some(0.2),
                Some(0.3),
                Some(0.5),
            ]
        } else {
            &[None]
        };
        let context_free: &[&[&str]] = if set == "input" {
            &[&[]]
        } else {
            &[
                &[],
                &["encouragement"],
                &["sexual"],
                &["encouragement", "sexual"],
            ]
        };
        let mut best: Option<(Figures, f32, Option<f32>, &'static [&'static str])> = None;
        for t in (50..98).map(|t| t as f32 / 100.0) {
            for veto in vetoes {
                for free in context_free {
                    for m in &mut self.models {
                        m.header.threshold = t;
                        m.header.veto = *veto;
                        m.header.context_free = free.iter().map(|c| (*c).to_owned()).collect();
                    }
                    let f = self.figures(|e, m| match set {
                        "input" => {
                            decide_with(Some(m), None, &e.text, e.x.embedding.as_deref(), None)
                                .is_some()
                        }
                        _ => check_reply_with(Some(m), &e.text).is_some(),
                    });
                    let within = f.hard_fp <= fp_target && f.chat_fp <= chat_fp;
                    let better = best.as_ref().is_none_or(|(b, ..)| f.better_than(b));
                    if within && better {
                        best = Some((f, t, *veto, *free));
                    }
                }
            }
        }
        let Some((f, threshold, veto, context_free)) = best else {
            return Policy {
                threshold: None,
                veto: None,
                context_free: &[],
                note: "no combined setting within the false-positive target".into(),
            };
        };
        let note = format!(
            "{set} decision (rules and this layer) out of fold at threshold {threshold:.2}, veto {veto:?}, context_free {context_free:?}: recall {:.3}, hard-negative fp {:.3}, chat fp {:.4}",
            f.recall, f.hard_fp, f.chat_fp
        );
        println!("  {note}");
        Policy {
            threshold: Some(threshold),
            veto,
            context_free,
            note,
        }
    }
}

fn header(classes: &[&str], threshold: f32, digest: &str, note: &str) -> Header {
    Header {
        classes: classes.iter().map(|c| (*c).to_owned()).collect(),
        threshold,
        trained_on: format!("tests/fixtures/safety/tuning sha256 {digest}"),
        note: note.to_owned(),
        veto: None,
        context_free: Vec::new(),
        encoder: None,
    }
}

/// The share of ordinary negatives (chat, not hard) scored at or above `t`.
fn chat_fp(examples: &[Example], scores: &[f32], t: f32) -> f64 {
    let chat: Vec<usize> = (0..examples.len())
        .filter(|i| examples[*i].y == 0 && !examples[*i].hard)
        .collect();
    chat.iter().filter(|i| scores[**i] >= t).count() as f64 / chat.len().max(1) as f64
}

/// The share of hard negatives scored at or above `t`.
fn fp_rate(examples: &[Example], scores: &[f32], t: f32) -> f64 {
    let hard: Vec<usize> = (0..examples.len()).filter(|i| examples[*i].hard).collect();
    hard.iter().filter(|i| scores[**i] >= t).count() as f64 / hard.len().max(1) as f64
}

/// Softmax regression: weights (one row per class) and biases. Every example is seen with and without
/// its embedding; classes are weighted by the inverse square root of their frequency.
fn fit(
    classes: usize,
    examples: &[&Example],
    epochs: usize,
    seed: u64,
) -> (Vec<Vec<f32>>, Vec<f32>) {
    let mut w = vec![vec![0f32; WIDTH]; classes];
    let mut g2 = vec![vec![1e-6f32; WIDTH]; classes];
    let mut b = vec![0f32; classes];
    let mut b2 = vec![1e-6f32; classes];
    let class_weight = class_weights(examples.iter().map(|e| e.y), classes);
    let (lr, l2) = (0.4f32, 1e-5f32);
    let mut order: Vec<(usize, bool)> = (0..examples.len())
        .flat_map(|i| [(i, true), (i, false)])
        .collect();
    let mut rng = fastrand::Rng::with_seed(seed);
    for _ in 0..epochs {
        rng.shuffle(&mut order);
        for &(i, with_embedding) in &order {
            let e = examples[i];
            let emb = e.x.embedding.as_deref().filter(|_| with_embedding);
            let z: Vec<f32> = (0..classes)
                .map(|c| {
                    let row = &w[c];
                    let mut s: f32 =
                        e.x.buckets.iter().map(|k| row[*k as usize]).sum::<f32>() * e.x.weight;
                    if let Some(v) = emb {
                        s += row[BUCKETS..]
                            .iter()
                            .zip(v)
                            .map(|(a, b)| a * b)
                            .sum::<f32>();
                    }
                    s + b[c]
                })
                .collect();
            let p = learned::softmax(&z);
            let cw = class_weight[e.y];
            for c in 0..classes {
                let grad = cw * (p[c] - f32::from(u8::from(c == e.y)));
                let step = |w: &mut f32, g2: &mut f32, g: f32| {
                    let g = g + l2 * *w;
                    *g2 += g * g;
                    *w -= lr * g / g2.sqrt();
                };
                for k in &e.x.buckets {
                    let k = *k as usize;
                    step(&mut w[c][k], &mut g2[c][k], grad * e.x.weight);
                }
                if let Some(v) = emb {
                    for (j, x) in v.iter().enumerate() {
                        step(&mut w[c][BUCKETS + j], &mut g2[c][BUCKETS + j], grad * x);
                    }
                }
                step(&mut b[c], &mut b2[c], grad);
            }
        }
    }
    (w, b)
}

/// Each class's weight in training: the inverse square root of its frequency, relative to the most
/// frequent class, so a rare crisis category is not drowned by `none`.
pub fn class_weights(labels: impl Iterator<Item = usize>, classes: usize) -> Vec<f32> {
    let mut count = vec![0usize; classes];
    for y in labels {
        count[y] += 1;
    }
    let most = *count.iter().max().unwrap_or(&1) as f32;
    count
        .iter()
        .map(|c| (most / (*c).max(1) as f32).sqrt())
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use super::*;

    /// The compiled-in models were trained on the committed tuning lines: a line changed without
    /// retraining (`companion-dev safety-train`) fails here.
    #[test]
    fn the_models_were_trained_on_the_committed_lines() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let files = tuning_files(&root.join("tests/fixtures/safety/tuning")).unwrap();
        let extra: Vec<PathBuf> = EXTRA
            .iter()
            .chain(&REPLY_CHAT)
            .map(|p| root.join(p))
            .collect();
        let want = format!(
            "tests/fixtures/safety/tuning sha256 {}",
            digest(&files, &extra).unwrap()
        );
        for model in [learned::INPUT.as_ref(), learned::OUTPUT.as_ref()] {
            assert_eq!(model.expect("the model loads").header.trained_on, want);
        }
        for head in [learned::VECTOR.as_ref(), learned::OUTPUT_VECTOR.as_ref()] {
            assert_eq!(head.expect("the vector head loads").header.trained_on, want);
        }
    }

    /// Training on a line of the frozen sets would make their figures a measure of memory: no tuning
    /// line (or extra line) is a frozen one (of any set) written again, past case, punctuation,
    /// spacing and emoji, nor a near-twin of one (`crate::leak_guard`). Says how many, never which.
    #[test]
    fn no_tuning_line_is_a_frozen_line_or_its_near_twin() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut frozen = Vec::new();
        for set in ["frozen", "frozen-v2", "frozen-v3", "frozen-v4", "frozen-v5"] {
            for f in ["input.jsonl", "output.jsonl"] {
                let path = root.join("tests/fixtures/safety").join(set).join(f);
                if path.exists() {
                    frozen.extend(crate::jsonl::read::<Line>(&path).unwrap());
                }
            }
        }
        let mut tuning = Vec::new();
        for f in tuning_files(&root.join("tests/fixtures/safety/tuning")).unwrap() {
            tuning.extend(crate::jsonl::read::<Line>(&f).unwrap());
        }
        for p in EXTRA {
            tuning.extend(read_extra(&root.join(p)).unwrap());
        }
        assert!(tuning.len() > 6000, "{}", tuning.len());
        let frozen: Vec<&str> = frozen.iter().map(|l| l.text.as_str()).collect();
        let texts: Vec<&str> = tuning.iter().map(|l| l.text.as_str()).collect();
        let twins = crate::leak_guard::twins(&texts, &frozen);
        assert_eq!(
            twins.len(),
            0,
            "tuning lines that are frozen lines or their near-twins"
        );
    }

    /// Ordinary sport text nobody trained on (the snowboarding knowledge, sentence by sentence) passes
    /// the output check, which the learned layer now joins on its own.
    #[test]
    fn ordinary_sport_text_the_output_layer_never_saw_passes() {
        let screen = companion_safety::CrisisScreen::new(true);
        let root =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/local/knowledge/snowboarding");
        let mut texts = Vec::new();
        for entry in std::fs::read_dir(root).unwrap() {
            texts.push(std::fs::read_to_string(entry.unwrap().path()).unwrap());
        }
        let lines: Vec<&str> = texts.iter().flat_map(|t| sentences(t)).collect();
        let blocked: Vec<&str> = lines
            .iter()
            .copied()
            .filter(|l| screen.check_reply(l).is_some())
            .collect();
        println!("{} of {} blocked: {blocked:?}", blocked.len(), lines.len());
        assert!(lines.len() > 60, "{}", lines.len());
        assert!(
            blocked.is_empty(),
            "{} of {} blocked: {blocked:?}",
            blocked.len(),
            lines.len()
        );
    }
}
