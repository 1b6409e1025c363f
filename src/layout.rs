//! `docs/development.md`'s layout against the workspace: every file and folder of `src/` and of each
//! crate's `crates/<crate>/src/` is named there, every crate of `crates/` too, and every name there (and
//! every top-level path) exists. A module or crate added, renamed or removed without its line fails here.
#![cfg(test)]

use std::{collections::BTreeSet, path::Path};

const DOC: &str = include_str!("../docs/development.md");

/// The layout's code block: the lines between the first fence after `## Layout` and the next.
fn layout_block() -> Vec<&'static str> {
    let after = DOC
        .split_once("## Layout")
        .expect("docs/development.md has a Layout section")
        .1;
    let mut fences = after.split("```");
    fences.next();
    let block = fences
        .next()
        .expect("the Layout section opens with a code block");
    block.lines().filter(|l| !l.trim().is_empty()).collect()
}

/// The names a line of the block gives in its first column (`timing.rs, telemetry.rs` names two); a
/// description's continuation line (indented past the names) gives none.
fn names(line: &str, indent: usize) -> Vec<&str> {
    let rest = &line[indent.min(line.len())..];
    if line.len() - line.trim_start().len() != indent || rest.starts_with(' ') {
        return Vec::new();
    }
    let column = rest.split("  ").next().unwrap_or_default();
    column
        .split(", ")
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .collect()
}

/// The entries of `dir` as the layout names them: `x.rs` for a file, `x/` for a folder.
fn entries(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{} is readable: {e}", dir.display()))
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let dir = e.file_type().ok()?.is_dir();
            (dir || name.ends_with(".rs")).then(|| if dir { format!("{name}/") } else { name })
        })
        .collect()
}

/// The lines under the line that names `name` at `indent`, up to the next line naming anything there.
fn section<'a>(lines: &[&'a str], name: &str, indent: usize) -> Vec<&'a str> {
    lines
        .iter()
        .skip_while(|l| names(l, indent) != [name])
        .skip(1)
        .take_while(|l| names(l, indent).is_empty())
        .copied()
        .collect()
}

/// What the docs list and what the tree has, for one folder; a line per difference.
fn compare(what: &str, listed: BTreeSet<String>, actual: BTreeSet<String>, out: &mut Vec<String>) {
    for m in actual.difference(&listed) {
        out.push(format!("{what}{m} is not in the docs"));
    }
    for s in listed.difference(&actual) {
        out.push(format!("the docs name {what}{s}, which does not exist"));
    }
}

#[test]
fn the_layout_in_the_docs_names_every_source_file_and_only_files_that_exist() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let block = layout_block();
    let mut wrong = Vec::new();
    let listed = |lines: &[&str], indent| -> BTreeSet<String> {
        lines
            .iter()
            .flat_map(|l| names(l, indent))
            .map(str::to_owned)
            .collect()
    };
    compare(
        "src/",
        listed(&section(&block, "src/", 0), 2),
        entries(&root.join("src")),
        &mut wrong,
    );
    let crates = section(&block, "crates/", 0);
    compare(
        "crates/",
        listed(&crates, 2),
        entries(&root.join("crates")),
        &mut wrong,
    );
    for krate in entries(&root.join("crates")) {
        compare(
            &format!("crates/{krate}src/"),
            listed(&section(&crates, &krate, 2), 4),
            entries(&root.join("crates").join(&krate).join("src")),
            &mut wrong,
        );
    }
    assert!(
        wrong.is_empty(),
        "docs/development.md's layout and the workspace disagree:\n{}",
        wrong.join("\n")
    );
    let top: Vec<&str> = block.iter().flat_map(|l| names(l, 0)).collect();
    assert!(top.contains(&"src/") && top.contains(&"crates/"), "{top:?}");
    for path in top.iter().filter(|p| !p.contains('…')) {
        assert!(
            root.join(path).exists(),
            "the layout names {path}, which does not exist"
        );
    }
}

#[test]
fn a_line_gives_its_first_column_and_a_continuation_gives_nothing() {
    assert_eq!(
        names("  timing.rs, telemetry.rs   per-turn timings", 2),
        ["timing.rs", "telemetry.rs"]
    );
    assert_eq!(
        names("  pipeline/             the one pipeline", 2),
        ["pipeline/"]
    );
    assert!(names("                        section; the worker", 2).is_empty());
    assert!(names("src/                    the library", 2).is_empty());
    assert_eq!(names("src/                    the library", 0), ["src/"]);
}
