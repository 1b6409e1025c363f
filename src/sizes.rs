//! The size of the crate's types: no struct of `src/` has more than [`MAX_FIELDS`] fields and no type more
//! than [`MAX_METHODS`] inherent methods, except configuration (`config.rs`), command-line arguments
//! and serialized documents (a serde, clap or sqlx derive), and the types [`WAIVED`] names with why.
//! A type that grows past that has taken on a second concern: give it its own type.
#![cfg(test)]

use std::{collections::BTreeMap, path::Path};

const MAX_FIELDS: usize = 10;
const MAX_METHODS: usize = 20;

/// Types over a bound on purpose, with the reason.
const WAIVED: &[(&str, &str)] = &[
    (
        "ReplyDoc",
        "the dm_messages document, field for field (written with `doc!`, not a derive)",
    ),
    (
        "SummaryRow",
        "one row of `companion usage`, column for column",
    ),
    (
        "CrisisLine",
        "a crisis line as crisis.json describes it, with its evidence (parsed from the serde `Entry`)",
    ),
];

/// Derives that make a type a serialized document or command-line arguments.
const DOCUMENT_DERIVES: &[&str] = &[
    "Serialize",
    "Deserialize",
    "Parser",
    "Args",
    "Subcommand",
    "FromRow",
];

#[derive(Debug, Default)]
struct Sizes {
    /// Fields by struct, with the file; `None` for an exempt struct.
    fields: BTreeMap<String, Vec<(String, Option<usize>)>>,
    /// Inherent methods by type name, over all its `impl` blocks.
    methods: BTreeMap<String, usize>,
}

/// The identifier at the start of `s`.
fn ident(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

/// `s` without a leading `pub`, `pub(crate)`, `pub(super)`.
fn unscoped(s: &str) -> &str {
    let Some(rest) = s.strip_prefix("pub") else {
        return s;
    };
    match rest.strip_prefix('(') {
        Some(r) => r.split_once(')').map_or(rest, |(_, r)| r).trim_start(),
        None => rest.trim_start(),
    }
}

/// `impl<…> Path<…> {` → `Path`'s last segment; none for a trait's impl.
fn impl_type(line: &str) -> Option<&str> {
    let rest = line.strip_prefix("impl")?;
    if !(rest.starts_with('<') || rest.starts_with(' ')) || !line.ends_with('{') {
        return None;
    }
    let mut depth = 0;
    let mut start = 0;
    for (i, c) in rest.char_indices() {
        match c {
            '<' => depth += 1,
            '>' => depth -= 1,
            c if depth == 0 && !c.is_whitespace() => {
                start = i;
                break;
            }
            _ => {}
        }
    }
    let ty = &rest[start..];
    if ty.contains(" for ") {
        return None;
    }
    let path = ty.split(['<', ' ', '{']).next()?;
    path.rsplit("::").next()
}

/// Reads one file's code (its unit tests left out).
fn read(file: &str, text: &str, out: &mut Sizes) {
    let code = text.split("#[cfg(test)]\nmod tests").next().unwrap_or("");
    let lines: Vec<&str> = code.lines().collect();
    for (n, raw) in lines.iter().enumerate() {
        let line = raw.trim();
        if let Some(rest) = unscoped(line).strip_prefix("struct ")
            && line.ends_with('{')
        {
            let name = ident(rest).to_owned();
            let attrs: String = lines[..n]
                .iter()
                .rev()
                .map(|l| l.trim())
                .take_while(|l| l.starts_with("#[") || l.starts_with("///") || l.ends_with(')'))
                .collect();
            let exempt = file == "config.rs" || DOCUMENT_DERIVES.iter().any(|d| attrs.contains(d));
            let count = block(&lines[n + 1..], |l| {
                let l = unscoped(l);
                !l.starts_with("//") && !l.starts_with('#') && {
                    let id = ident(l);
                    !id.is_empty() && l[id.len()..].starts_with(':')
                }
            });
            out.fields
                .entry(name)
                .or_default()
                .push((file.to_owned(), (!exempt).then_some(count)));
        } else if let Some(ty) = impl_type(line) {
            let count = block(&lines[n + 1..], |l| {
                let l = unscoped(l);
                let l = l.strip_prefix("const ").unwrap_or(l);
                let l = l.strip_prefix("async ").unwrap_or(l);
                l.starts_with("fn ")
            });
            *out.methods.entry(ty.to_owned()).or_default() += count;
        }
    }
}

/// The lines of the block that starts after an opening brace, at its own depth, that `counts`.
fn block(lines: &[&str], counts: impl Fn(&str) -> bool) -> usize {
    let mut depth = 1i32;
    let mut n = 0;
    for raw in lines {
        let line = raw.trim();
        let code = line.split("//").next().unwrap_or("");
        if depth == 1 && counts(line) {
            n += 1;
        }
        depth += code.matches('{').count() as i32 - code.matches('}').count() as i32;
        if depth <= 0 {
            break;
        }
    }
    n
}

fn rust_files(dir: &Path, root: &Path, out: &mut Vec<(String, String)>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, root, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let rel = path.strip_prefix(root).unwrap().display().to_string();
            out.push((rel, std::fs::read_to_string(&path).unwrap()));
        }
    }
}

fn sizes() -> Sizes {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    rust_files(&root.join("src"), root, &mut files);
    rust_files(&root.join("crates"), root, &mut files);
    let mut sizes = Sizes::default();
    for (file, text) in &files {
        read(file, text, &mut sizes);
    }
    sizes
}

#[test]
fn no_type_has_more_than_ten_fields_or_twenty_methods() {
    let s = sizes();
    assert!(
        s.fields.len() > 100,
        "every struct read: {}",
        s.fields.len()
    );
    let waived = |name: &str| WAIVED.iter().any(|(w, _)| *w == name);
    let mut over = Vec::new();
    for (name, found) in &s.fields {
        for (file, n) in found {
            if let Some(n) = n.filter(|n| *n > MAX_FIELDS)
                && !waived(name)
            {
                over.push(format!("{file}: {name} has {n} fields"));
            }
        }
    }
    for (name, n) in &s.methods {
        if *n > MAX_METHODS && !waived(name) {
            over.push(format!("{name} has {n} methods"));
        }
    }
    assert!(over.is_empty(), "types too large:\n{}", over.join("\n"));
    for (name, _) in WAIVED {
        assert!(
            s.fields.contains_key(*name) || s.methods.contains_key(*name),
            "{name} is waived but does not exist"
        );
    }
}

#[test]
fn the_reader_counts_fields_and_methods_and_knows_a_document() {
    let text = "\
/// A thing.
#[derive(Clone)]
pub(crate) struct Thing<'a> {
    /// Why.
    pub(crate) a: u32,
    b: HashMap<String, Vec<u8>>,
    pub c: Option<Inner<'a>>,
}

#[derive(Serialize)]
struct Doc {
    a: u32,
    b: u32,
}

impl<'a> Thing<'a> {
    pub(crate) fn new() -> Self {
        let x = Self { a: 1 };
        x
    }
    async fn go(&self) {}
    pub(crate) const fn n() -> usize { 1 }
}

impl Display for Thing<'_> {
    fn fmt(&self) {}
}

impl other::Thing<'_> {
    fn more(&self) {}
}
";
    let mut s = Sizes::default();
    read("x.rs", text, &mut s);
    assert_eq!(s.fields["Thing"], [("x.rs".to_owned(), Some(3))]);
    assert_eq!(s.fields["Doc"], [("x.rs".to_owned(), None)]);
    assert_eq!(s.methods["Thing"], 4);
}
