//! `companion-dev safety-eval`: measures the crisis screen ([`companion_safety::screen`]) against the
//! labelled set (`tests/fixtures/safety/labelled.jsonl`, see its README) and prints, per language, its
//! recall, category accuracy, false-positive rate and time per message. It is a report: whatever the
//! figures, it succeeds.

use std::{
    collections::BTreeMap,
    path::Path,
    time::{Duration, Instant},
};

use companion_safety::screen;
use serde::Deserialize;

/// Which half of the labelled set to measure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Split {
    /// The half the rules may be tuned on.
    Tune,
    /// The half kept out of tuning: the honest figure.
    Heldout,
    /// Both halves.
    All,
}

impl Split {
    fn includes(self, split: &str) -> bool {
        match self {
            Split::Tune => split == "tune",
            Split::Heldout => split == "heldout",
            Split::All => true,
        }
    }
}

/// One line of the labelled set.
#[derive(Clone, Debug, Deserialize)]
pub struct Example {
    pub text: String,
    /// ISO 639-1 code: en, es, pt, fr, de, ja.
    pub lang: String,
    /// A category's snake_case name, or `none`.
    pub label: String,
    /// `tune` or `heldout`.
    pub split: String,
    /// `crisis`, `slang`, `everyday` or `hard_negative`.
    pub kind: String,
}

/// The figures of one language (or of all).
#[derive(Clone, Debug, Default)]
pub struct Figures {
    pub positives: usize,
    /// Positives flagged with any category.
    pub flagged: usize,
    /// Flagged positives given their own category.
    pub right_category: usize,
    pub negatives: usize,
    pub false_positives: usize,
    /// Time spent screening this language's messages on the warm (second) pass.
    pub time: Duration,
}

impl Figures {
    fn add(&mut self, other: &Figures) {
        self.positives += other.positives;
        self.flagged += other.flagged;
        self.right_category += other.right_category;
        self.negatives += other.negatives;
        self.false_positives += other.false_positives;
        self.time += other.time;
    }
}

/// Reads the labelled set, one JSON object a line.
pub fn load(path: &Path) -> anyhow::Result<Vec<Example>> {
    crate::jsonl::read(path)
}

/// Screens the examples of `split` and returns the figures per language, with the mean time per
/// message of the cold first pass (the screen's patterns compiled, its DFA caches still empty).
pub fn evaluate(examples: &[Example], split: Split) -> (BTreeMap<String, Figures>, Duration) {
    let chosen: Vec<&Example> = examples
        .iter()
        .filter(|e| split.includes(&e.split))
        .collect();
    let _ = screen("");
    let cold = Instant::now();
    for e in &chosen {
        std::hint::black_box(screen(&e.text));
    }
    let cold = cold.elapsed() / u32::try_from(chosen.len().max(1)).unwrap_or(u32::MAX);
    let mut figures: BTreeMap<String, Figures> = BTreeMap::new();
    for e in chosen {
        let start = Instant::now();
        let flag = std::hint::black_box(screen(&e.text));
        let f = figures.entry(e.lang.clone()).or_default();
        f.time += start.elapsed();
        if e.label == "none" {
            f.negatives += 1;
            f.false_positives += usize::from(flag.is_some());
        } else {
            f.positives += 1;
            if let Some(flag) = flag {
                f.flagged += 1;
                f.right_category += usize::from(flag.category.as_str() == e.label);
            }
        }
    }
    (figures, cold)
}

fn ratio(n: usize, d: usize) -> String {
    if d == 0 {
        "-".into()
    } else {
        format!("{:.3}", n as f64 / d as f64)
    }
}

fn row(lang: &str, f: &Figures) -> String {
    let messages = u32::try_from((f.positives + f.negatives).max(1)).unwrap_or(u32::MAX);
    format!(
        "{lang:<4} {:>4} {:>5} {:>7} {:>7} {:>4} {:>4} {:>8} {:>8.2}",
        f.positives,
        f.flagged,
        ratio(f.flagged, f.positives),
        ratio(f.right_category, f.flagged),
        f.negatives,
        f.false_positives,
        ratio(f.false_positives, f.negatives),
        (f.time / messages).as_secs_f64() * 1e6,
    )
}

/// Measures `file`'s `split` and prints the table.
pub fn report(file: &Path, split: Split) -> anyhow::Result<()> {
    let examples = load(file)?;
    let (figures, cold) = evaluate(&examples, split);
    println!("crisis screen on {} (split {split:?})", file.display());
    println!("recall = flagged (any category) / positives; cat_acc = right category / flagged;");
    println!("fp_rate = flagged negatives / negatives; us/msg = mean screen time, warm pass");
    println!("lang  pos  flag  recall cat_acc  neg   fp  fp_rate   us/msg");
    let mut all = Figures::default();
    for (lang, f) in &figures {
        println!("{}", row(lang, f));
        all.add(f);
    }
    println!("{}", row("all", &all));
    println!("cold first pass: {:.2} us/msg", cold.as_secs_f64() * 1e6);
    Ok(())
}
