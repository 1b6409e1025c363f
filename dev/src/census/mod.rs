//! `companion-dev census`: a structural count of a checkout of this workspace, so that a structure
//! refactor (issue 65) can say "before and after" with the same ruler. It reads the Rust source as syntax
//! (`syn`), walking each crate's module tree from its root file as the compiler does, and counts:
//!
//! - the lower crates' public declarations (`crates/*/src`): [`public`];
//! - the branches on the message's `Kind` in `src/pipeline/`: [`kinds`];
//! - the functions over 80 lines in `src/`, `crates/*/src` and `dev/src`: [`fns`];
//! - the integration tests' worker starters (`tests/`), by tokens: [`tokens`];
//! - `App::build`'s length and its `.clone()` calls, and the largest files.
//!
//! Code under `#[cfg(test)]` (an item, or a module declared so, and everything in it) is skipped
//! everywhere but in `tests/`.

pub mod fns;
pub mod kinds;
pub mod public;
mod report;
pub mod tokens;
pub mod tree;

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use anyhow::Context;
use serde::Serialize;

use fns::FnLength;
use kinds::KindCensus;
use public::Public;
use tree::SourceFile;

/// A function longer than this many lines is listed.
pub const LONG_FN: usize = 80;

/// The file whose length issue 65 follows.
const COMPOSE: &str = "src/pipeline/compose.rs";

/// `companion-dev census`'s arguments.
#[derive(clap::Args, Debug)]
pub struct CensusArgs {
    /// The root of a checkout of this workspace.
    #[arg(long, default_value = ".")]
    pub root: PathBuf,
    /// Print one JSON object instead of lines.
    #[arg(long)]
    pub json: bool,
}

/// The census of a checkout.
#[derive(Debug, Serialize)]
pub struct Census {
    /// The checkout counted.
    pub root: String,
    /// The lower crates' `pub` declarations, by crate folder name (`core`, `store`, …).
    pub crates: BTreeMap<String, Public>,
    /// The sums over the lower crates.
    pub crates_total: Public,
    /// Branches on the message's `Kind` in `src/pipeline/`.
    pub kind_branches: KindCensus,
    /// Functions over [`LONG_FN`] lines by place: `src`, `crates`, `dev`.
    pub long_fns: BTreeMap<String, Vec<FnLength>>,
    /// Call sites in `tests/` of each way a test starts a worker.
    pub test_starters: BTreeMap<String, usize>,
    /// The same, outside modules declared under a `cfg(feature = …)` (`otel`): what a plain
    /// `cargo test` builds.
    pub test_starters_ungated: BTreeMap<String, usize>,
    /// `App::build`, if found in `src/`.
    pub app_build: Option<AppBuild>,
    /// The longest files of `src/` and `crates/*/src` (lines), longest first.
    pub largest_files: Vec<(String, usize)>,
    /// Lines of `src/pipeline/compose.rs`, if present.
    pub compose_lines: Option<usize>,
}

/// `App::build`: the worker's one wiring.
#[derive(Debug, Serialize)]
pub struct AppBuild {
    /// Where it starts (`file:line`).
    pub at: String,
    /// Its lines, from the `fn` keyword to the closing brace.
    pub lines: usize,
    /// `.clone()` calls in it (in macros too).
    pub clones: usize,
}

/// Runs the census and prints it.
pub fn run(args: &CensusArgs) -> anyhow::Result<()> {
    let census = take(&args.root)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&census)?);
    } else {
        print!("{census}");
    }
    Ok(())
}

/// Counts the checkout at `root`.
pub fn take(root: &Path) -> anyhow::Result<Census> {
    anyhow::ensure!(
        root.join("Cargo.toml").is_file(),
        "{} is not the root of a checkout (no Cargo.toml)",
        root.display()
    );
    let mut crates = BTreeMap::new();
    let mut crates_total = Public::default();
    let mut lower_files = Vec::new();
    for (name, src) in tree::lower_crates(root)? {
        let files = tree::walk(root, &tree::roots(&src))?;
        let p = public::count(&files);
        crates_total.add(&p);
        crates.insert(name, p);
        lower_files.extend(files);
    }
    let worker = tree::walk(root, &tree::roots(&root.join("src")))?;
    let dev = tree::walk(root, &tree::roots(&root.join("dev/src")))?;
    let tests = tree::walk(root, &test_roots(root)?)?;
    let mut long_fns = BTreeMap::new();
    for (place, files) in [("src", &worker), ("crates", &lower_files), ("dev", &dev)] {
        long_fns.insert(place.to_owned(), fns::over(&fns::lengths(files), LONG_FN));
    }
    let production: Vec<&SourceFile> = worker.iter().chain(&lower_files).collect();
    Ok(Census {
        root: root.canonicalize()?.display().to_string(),
        crates,
        crates_total,
        kind_branches: kinds::count(&worker, "src/pipeline"),
        long_fns,
        test_starters: test_starters(tests.iter()),
        test_starters_ungated: test_starters(tests.iter().filter(|f| !f.gated)),
        app_build: app_build(&worker),
        largest_files: largest(&production, 10),
        compose_lines: production
            .iter()
            .find(|f| f.rel == Path::new(COMPOSE))
            .map(|f| f.text.lines().count()),
    })
}

/// The integration tests' roots: `tests/*.rs` and `tests/*/main.rs`.
fn test_roots(root: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let dir = root.join("tests");
    let mut roots = Vec::new();
    if dir.is_dir() {
        for entry in
            std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))?
        {
            let path = entry?.path();
            if path.extension().is_some_and(|e| e == "rs") {
                roots.push(path);
            } else if path.join("main.rs").is_file() {
                roots.push(path.join("main.rs"));
            }
        }
    }
    roots.sort();
    Ok(roots)
}

/// Call sites of the ways a test starts a worker or builds its parts: the three starters and the bare
/// `.app()` issue 65 found, the one starter that replaced them (`spawn_app`, with its `spawn_app_process`
/// variant), and `App::build` called directly.
fn test_starters<'a>(files: impl Iterator<Item = &'a SourceFile>) -> BTreeMap<String, usize> {
    let mut n = BTreeMap::new();
    for file in files {
        let toks = tokens::of_text(&file.text);
        let counts = [
            ("start_worker", tokens::calls(&toks, "start_worker")),
            (
                "InProcessWorker::start",
                tokens::path_calls(&toks, "InProcessWorker", "start"),
            ),
            (
                "spawn_worker_process",
                tokens::calls(&toks, "spawn_worker_process"),
            ),
            (".app()", tokens::bare_method_calls(&toks, "app")),
            ("spawn_app", tokens::calls(&toks, "spawn_app")),
            (
                "spawn_app_process",
                tokens::calls(&toks, "spawn_app_process"),
            ),
            ("App::build", tokens::path_calls(&toks, "App", "build")),
        ];
        for (name, c) in counts {
            *n.entry(name.to_owned()).or_default() += c;
        }
    }
    n
}

/// The ways a test starts a worker, as [`test_starters`] names them.
const STARTERS: [&str; 7] = [
    "start_worker",
    "InProcessWorker::start",
    "spawn_worker_process",
    ".app()",
    "spawn_app",
    "spawn_app_process",
    "App::build",
];

/// `App::build` in the worker's files: its length and `.clone()` calls.
fn app_build(files: &[SourceFile]) -> Option<AppBuild> {
    let f = fns::lengths(files)
        .into_iter()
        .find(|f| f.name == "App::build")?;
    let text = &files.iter().find(|s| s.rel == Path::new(&f.file))?.text;
    let body: Vec<&str> = text.lines().skip(f.line - 1).take(f.lines).collect();
    let toks = tokens::of_text(&body.join("\n"));
    Some(AppBuild {
        at: format!("{}:{}", f.file, f.line),
        lines: f.lines,
        clones: tokens::bare_method_calls(&toks, "clone"),
    })
}

/// The `n` longest files among `files`, test modules left out.
fn largest(files: &[&SourceFile], n: usize) -> Vec<(String, usize)> {
    let mut sizes: Vec<(String, usize)> = files
        .iter()
        .filter(|f| !f.test)
        .map(|f| (f.rel.display().to_string(), f.text.lines().count()))
        .collect();
    sizes.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    sizes.truncate(n);
    sizes
}

#[cfg(test)]
mod tests;
