//! The crisis screen's vector head (`companion_safety::learned::VectorHead`), trained by `safety-train`
//! beside the linear layer, on the same tuning lines' embeddings alone.
//!
//! It is meant for languages no rule and no tuning line covers, so it is measured as such: each
//! language of the tuning lines is left out in turn, a head is trained on the others and scores it.
//! The threshold is the lowest whose left-out false positives stay within the targets on the hard
//! negatives and on ordinary chat. Then the head is trained on every line.
//!
//! One hidden layer of rectified units over the standardised vector, softmax over the classes, mini-batch
//! Adam; classes weighted by the inverse square root of their frequency, as the linear layer's.
//!
//! Whether it also refers in a covered language, and from what score ([`choose_covered`]), is decided
//! out of fold with the rules and the linear layer: each line decided by the fold models that did not
//! see it, the most recall within the input layer's false-positive targets.
//! Deterministic for a given seed and input.

use std::collections::BTreeMap;

use crate::safety_train::Figures;
use companion_safety::{
    FirstCheck, check_reply_vector_with, decide_with, first_check_with, language,
    learned::{DIM, HIDDEN, Model, VectorHead, VectorHeader, VectorWeights, softmax},
};

/// One tuning line, as the head sees it.
pub struct Sample<'a> {
    pub text: &'a str,
    pub vector: &'a [f32],
    /// The class's index (`none` is 0).
    pub y: usize,
    pub lang: &'a str,
    /// A hard negative (not ordinary chat).
    pub hard: bool,
}

/// How to train.
#[derive(Clone, Debug)]
pub struct Settings {
    pub epochs: usize,
    pub seed: u64,
    /// Highest left-out false-positive rate on the hard negatives.
    pub hard_fp: f64,
    /// Highest left-out false-positive rate on ordinary chat.
    pub chat_fp: f64,
}

const BATCH: usize = 64;
const LEARNING_RATE: f32 = 0.002;
const L2: f32 = 1e-3;

/// Trains the head, chooses its threshold with each language left out, and says how it did.
pub fn train(
    samples: &[Sample],
    classes: &[&str],
    encoder: &str,
    trained_on: &str,
    s: &Settings,
) -> anyhow::Result<VectorHead> {
    anyhow::ensure!(
        samples.iter().all(|x| x.vector.len() == DIM),
        "every line needs its vector"
    );
    let mut langs: Vec<&str> = samples.iter().map(|x| x.lang).collect();
    langs.sort_unstable();
    langs.dedup();
    let mut left_out = vec![0f32; samples.len()];
    for (k, lang) in langs.iter().enumerate() {
        let train: Vec<&Sample> = samples.iter().filter(|x| x.lang != *lang).collect();
        let head = VectorHead::new(
            head(classes, 1.0, encoder, trained_on, ""),
            fit(&train, classes.len(), s, s.seed + k as u64),
        )?;
        for (i, x) in samples.iter().enumerate().filter(|(_, x)| x.lang == *lang) {
            left_out[i] = head.verdict(x.vector).1;
        }
    }
    let figures = |t: f32| {
        Figures::of(
            samples
                .iter()
                .zip(&left_out)
                .map(|(x, sc)| (x.y != 0, x.hard, *sc >= t)),
        )
    };
    for t in [0.9f32, 0.95, 0.97, 0.98, 0.99, 0.995] {
        let f = figures(t);
        println!(
            "  vector head, each language left out, at {t:.3}: recall {:.3}, hard-negative fp {:.3}, chat fp {:.4}",
            f.recall, f.hard_fp, f.chat_fp
        );
    }
    let threshold = (900..1000)
        .map(|t| t as f32 / 1000.0)
        .find(|t| {
            let f = figures(*t);
            f.hard_fp <= s.hard_fp && f.chat_fp <= s.chat_fp
        })
        .unwrap_or(0.999);
    let Figures {
        recall,
        hard_fp: hard,
        chat_fp: chat,
    } = figures(threshold);
    let mut by_lang: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
    for (x, sc) in samples.iter().zip(&left_out).filter(|(x, _)| x.y != 0) {
        let e = by_lang.entry(x.lang).or_default();
        *e = (e.0 + 1, e.1 + usize::from(*sc >= threshold));
    }
    let langs: Vec<String> = by_lang
        .iter()
        .map(|(l, (n, hit))| format!("{l} {:.3}", *hit as f64 / (*n).max(1) as f64))
        .collect();
    let note = format!(
        "vector head: {} lines; each language left out, at threshold {threshold:.3}: recall {recall:.3} ({}), hard-negative fp {hard:.3}, chat fp {chat:.4}",
        samples.len(),
        langs.join(", ")
    );
    println!("{note}");
    let all: Vec<&Sample> = samples.iter().collect();
    Ok(VectorHead::new(
        head(classes, threshold, encoder, trained_on, &note),
        fit(&all, classes.len(), s, s.seed),
    )?)
}

/// The head's score for covered languages (`VectorHeader::covered`; none: never there): of the
/// candidates, the one whose combined decision (rules, linear layer and head, each line decided by the
/// fold models that did not see it; `fold` and `linear` are the linear layer's) has the most recall
/// while its false positives stay within `hard_fp` on the hard negatives and `s.chat_fp` on ordinary
/// chat; fewer false positives on a tie. Returns it and a note of its figures.
pub fn choose_covered(
    samples: &[Sample],
    fold: &[usize],
    linear: &[Model],
    head: &VectorHead,
    s: &Settings,
    hard_fp: f64,
) -> anyhow::Result<(Option<f32>, String)> {
    let mut heads = fold_heads(samples, fold, linear.len(), head, s, 100)?;
    let figures = |heads: &[VectorHead]| {
        Figures::of(samples.iter().zip(fold).map(|(x, k)| {
            let flagged = decide_with(
                Some(&linear[*k]),
                Some(&heads[*k]),
                x.text,
                Some(x.vector),
                None,
            );
            (x.y != 0, x.hard, flagged.is_some())
        }))
    };
    let mut best: Option<(Option<f32>, Figures)> = None;
    for covered in [
        None,
        Some(0.999),
        Some(0.998),
        Some(0.995),
        Some(0.99),
        Some(0.98),
        Some(0.95),
        Some(0.9),
    ] {
        for h in &mut heads {
            h.header.covered = covered;
        }
        let f = figures(&heads);
        println!(
            "  vector head in covered languages at {covered:?}, out of fold with the other layers: recall {:.3}, hard-negative fp {:.3}, chat fp {:.4}",
            f.recall, f.hard_fp, f.chat_fp
        );
        let within = f.hard_fp <= hard_fp && f.chat_fp <= s.chat_fp;
        if within && best.as_ref().is_none_or(|(_, b)| f.better_than(b)) {
            best = Some((covered, f));
        }
    }
    let (covered, f) = best.unwrap_or_default();
    let note = format!(
        "in covered languages {covered:?}, the decision out of fold: recall {:.3}, hard-negative fp {:.3}, chat fp {:.4}",
        f.recall, f.hard_fp, f.chat_fp
    );
    println!("{note}");
    Ok((covered, note))
}

/// The reply head's gate score (`VectorHeader::gate`) and its score in covered languages
/// (`VectorHeader::covered`), chosen together out of fold like [`choose_covered`]: each tuning reply
/// decided by the rules, the n-gram layer of its fold and, behind the gate, the head of its fold. Of the
/// pairs whose share of ordinary covered-language replies embedded stays within `embed_rate` (the encoder
/// run the gate exists to spare; a reply in a language no rule covers is always embedded) and whose
/// false positives stay within `hard_fp` on the kind replies and `s.chat_fp` on ordinary ones, the one
/// with the most recall; fewer false positives on a tie. Returns them and a note of their figures.
pub fn choose_gate(
    samples: &[Sample],
    fold: &[usize],
    linear: &[Model],
    head: &VectorHead,
    s: &Settings,
    hard_fp: f64,
    embed_rate: f64,
) -> anyhow::Result<(Option<f32>, Option<f32>, String)> {
    let mut heads = fold_heads(samples, fold, linear.len(), head, s, 200)?;
    let ordinary: Vec<bool> = samples
        .iter()
        .map(|x| x.y == 0 && !x.hard && language(x.text).is_some())
        .collect();
    let n_ordinary = ordinary.iter().filter(|o| **o).count().max(1);
    let mut best: Option<(Option<f32>, Option<f32>, Figures, f64)> = None;
    // Gate 2.0: never on the score alone (only an uncovered language or words of harm open it).
    for gate in [2.0f32, 0.9, 0.7, 0.5, 0.3, 0.2, 0.1, 0.05] {
        for covered in [0.999f32, 0.995, 0.99, 0.98, 0.95, 0.9, 0.8, 0.7, 0.5] {
            for h in &mut heads {
                h.header.gate = Some(gate);
                h.header.covered = Some(covered);
            }
            let mut embedded = 0usize;
            let f = Figures::of(samples.iter().zip(fold).zip(&ordinary).map(|((x, k), o)| {
                let (linear, head) = (&linear[*k], &heads[*k]);
                let flagged = match first_check_with(Some(linear), Some(head), x.text, false) {
                    FirstCheck::Blocked(_) => true,
                    FirstCheck::Passes => false,
                    FirstCheck::AskHead => {
                        embedded += usize::from(*o);
                        check_reply_vector_with(Some(head), x.text, x.vector).is_some()
                    }
                };
                (x.y != 0, x.hard, flagged)
            }));
            let rate = embedded as f64 / n_ordinary as f64;
            println!(
                "  reply head, gate {gate:.2}, covered {covered:.3}, out of fold with the other layers: recall {:.3}, kind-reply fp {:.3}, chat fp {:.4}, ordinary replies embedded {rate:.3}",
                f.recall, f.hard_fp, f.chat_fp
            );
            let within = f.hard_fp <= hard_fp && f.chat_fp <= s.chat_fp && rate <= embed_rate;
            if within && best.as_ref().is_none_or(|(.., b, _)| f.better_than(b)) {
                best = Some((Some(gate), Some(covered), f, rate));
            }
        }
    }
    let (gate, covered, f, rate) = best.unwrap_or_default();
    let note = format!(
        "gate {gate:?}, covered {covered:?}, the check out of fold: recall {:.3}, kind-reply fp {:.3}, chat fp {:.4}, ordinary replies embedded {rate:.3}",
        f.recall, f.hard_fp, f.chat_fp
    );
    println!("{note}");
    Ok((gate, covered, note))
}

/// One head per fold, each trained on the lines of the other folds (seeded `s.seed + seed + k`), with
/// `head`'s header.
fn fold_heads(
    samples: &[Sample],
    fold: &[usize],
    folds: usize,
    head: &VectorHead,
    s: &Settings,
    seed: u64,
) -> anyhow::Result<Vec<VectorHead>> {
    anyhow::ensure!(fold.len() == samples.len(), "one fold per line");
    let mut heads = Vec::with_capacity(folds);
    for k in 0..folds {
        let train: Vec<&Sample> = samples
            .iter()
            .zip(fold)
            .filter(|(_, f)| **f != k)
            .map(|(x, _)| x)
            .collect();
        let w = fit(
            &train,
            head.header.classes.len(),
            s,
            s.seed + seed + k as u64,
        );
        heads.push(VectorHead::new(head.header.clone(), w)?);
    }
    Ok(heads)
}

fn head(
    classes: &[&str],
    threshold: f32,
    encoder: &str,
    trained_on: &str,
    note: &str,
) -> VectorHeader {
    VectorHeader {
        classes: classes.iter().map(|c| (*c).to_owned()).collect(),
        threshold,
        encoder: encoder.to_owned(),
        trained_on: trained_on.to_owned(),
        note: note.to_owned(),
        covered: None,
        gate: None,
    }
}

/// Adam's moments of one parameter vector.
struct Adam {
    m: Vec<f32>,
    v: Vec<f32>,
}

impl Adam {
    fn new(n: usize) -> Self {
        Self {
            m: vec![0.0; n],
            v: vec![0.0; n],
        }
    }

    fn step(&mut self, w: &mut [f32], g: &[f32], t: i32, l2: f32) {
        let (b1, b2) = (0.9f32, 0.999f32);
        let (c1, c2) = (1.0 - b1.powi(t), 1.0 - b2.powi(t));
        for (((w, g), m), v) in w.iter_mut().zip(g).zip(&mut self.m).zip(&mut self.v) {
            let g = g + l2 * *w;
            *m = b1 * *m + (1.0 - b1) * g;
            *v = b2 * *v + (1.0 - b2) * g * g;
            *w -= LEARNING_RATE * (*m / c1) / ((*v / c2).sqrt() + 1e-8);
        }
    }
}

/// Fits one head's weights on `samples`.
fn fit(samples: &[&Sample], classes: usize, s: &Settings, seed: u64) -> VectorWeights {
    let (mean, inv_sd, z) = standardised(samples);
    let class_weight = crate::safety_train::class_weights(samples.iter().map(|x| x.y), classes);
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut uniform = |n: usize, fan_in: usize| -> Vec<f32> {
        let a = (3.0 / fan_in as f32).sqrt();
        (0..n).map(|_| (rng.f32() * 2.0 - 1.0) * a).collect()
    };
    let mut w = VectorWeights {
        w1: uniform(DIM * HIDDEN, DIM),
        b1: vec![0.0; HIDDEN],
        w2: uniform(HIDDEN * classes, HIDDEN),
        b2: vec![0.0; classes],
        mean,
        inv_sd,
    };
    let mut adam = [
        Adam::new(DIM * HIDDEN),
        Adam::new(HIDDEN),
        Adam::new(HIDDEN * classes),
        Adam::new(classes),
    ];
    let mut order: Vec<usize> = (0..samples.len()).collect();
    let mut shuffle = fastrand::Rng::with_seed(seed ^ 0x5eed);
    let mut t = 0;
    for _ in 0..s.epochs {
        shuffle.shuffle(&mut order);
        for batch in order.chunks(BATCH) {
            let mut g = Gradients::zero(classes);
            let mut weight = 0f32;
            for &i in batch {
                let y = samples[i].y;
                let cw = class_weight[y];
                weight += cw;
                backprop(&w, &z[i], y, cw, classes, &mut g);
            }
            let scale = 1.0 / weight.max(1e-6);
            for g in [&mut g.w1, &mut g.b1, &mut g.w2, &mut g.b2] {
                g.iter_mut().for_each(|v| *v *= scale);
            }
            t += 1;
            adam[0].step(&mut w.w1, &g.w1, t, L2);
            adam[1].step(&mut w.b1, &g.b1, t, 0.0);
            adam[2].step(&mut w.w2, &g.w2, t, L2);
            adam[3].step(&mut w.b2, &g.b2, t, 0.0);
        }
    }
    w
}

/// The samples' vectors standardised: each dimension's mean, the inverse of its standard deviation,
/// and every vector less the mean, times that inverse.
fn standardised(samples: &[&Sample]) -> (Vec<f32>, Vec<f32>, Vec<Vec<f32>>) {
    let n = samples.len().max(1) as f32;
    let mut mean = vec![0f32; DIM];
    for x in samples {
        for (m, v) in mean.iter_mut().zip(x.vector) {
            *m += v / n;
        }
    }
    let mut var = vec![0f32; DIM];
    for x in samples {
        for ((a, v), m) in var.iter_mut().zip(x.vector).zip(&mean) {
            *a += (v - m) * (v - m) / n;
        }
    }
    let inv_sd: Vec<f32> = var.iter().map(|v| 1.0 / (v.sqrt() + 1e-6)).collect();
    let z: Vec<Vec<f32>> = samples
        .iter()
        .map(|x| {
            x.vector
                .iter()
                .zip(&mean)
                .zip(&inv_sd)
                .map(|((v, m), i)| (v - m) * i)
                .collect()
        })
        .collect();
    (mean, inv_sd, z)
}

/// A batch's gradients of the weights, summed over its samples.
struct Gradients {
    w1: Vec<f32>,
    b1: Vec<f32>,
    w2: Vec<f32>,
    b2: Vec<f32>,
}

impl Gradients {
    fn zero(classes: usize) -> Self {
        Gradients {
            w1: vec![0f32; DIM * HIDDEN],
            b1: vec![0f32; HIDDEN],
            w2: vec![0f32; HIDDEN * classes],
            b2: vec![0f32; classes],
        }
    }
}

/// Adds one sample's gradients (standardised vector `zi`, class `y`, weighed `cw`) to `g`: the
/// forward pass through the hidden layer, then back.
fn backprop(w: &VectorWeights, zi: &[f32], y: usize, cw: f32, classes: usize, g: &mut Gradients) {
    let mut h = w.b1.clone();
    for (d, zd) in zi.iter().enumerate() {
        for (hj, wj) in h.iter_mut().zip(&w.w1[d * HIDDEN..(d + 1) * HIDDEN]) {
            *hj += zd * wj;
        }
    }
    h.iter_mut().for_each(|v| *v = v.max(0.0));
    let mut logits = w.b2.clone();
    for (j, hj) in h.iter().enumerate() {
        for (l, wj) in logits.iter_mut().zip(&w.w2[j * classes..(j + 1) * classes]) {
            *l += hj * wj;
        }
    }
    let p = softmax(&logits);
    let gl: Vec<f32> = (0..classes)
        .map(|c| cw * (p[c] - f32::from(u8::from(c == y))))
        .collect();
    let mut gh = vec![0f32; HIDDEN];
    for (j, hj) in h.iter().enumerate() {
        let row = &w.w2[j * classes..(j + 1) * classes];
        for (c, gc) in gl.iter().enumerate() {
            g.w2[j * classes + c] += hj * gc;
        }
        if *hj > 0.0 {
            gh[j] = row.iter().zip(&gl).map(|(a, b)| a * b).sum();
        }
    }
    for (b, gc) in g.b2.iter_mut().zip(&gl) {
        *b += gc;
    }
    for (d, zd) in zi.iter().enumerate() {
        for (a, ghj) in g.w1[d * HIDDEN..(d + 1) * HIDDEN].iter_mut().zip(&gh) {
            *a += zd * ghj;
        }
    }
    for (b, ghj) in g.b1.iter_mut().zip(&gh) {
        *b += ghj;
    }
}
