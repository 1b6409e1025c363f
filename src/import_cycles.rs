//! Import cycles among the source files of each crate: a file (`pipeline/gate.rs`, `pipeline/mod.rs` as `pipeline`) that
//! names another's items (`crate::a::b::X`, `super::b::{X, c::Y}`) depends on it. A file's ancestors
//! declare it and are not counted: a child may use its parent's items.
//!
//! Every crate of the workspace is read (`crates/*/src` and `src/`); each crate's files are a graph of
//! their own, since an import between crates cannot go round (Cargo refuses a cycle of crates).

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
};

type Module = Vec<String>;

/// Every path `text` names from `crate::` or `super::`, from the crate root, as far as it goes
/// (`super::{a::X, b}` is `…::a::X` and `…::b`); `here` is the file's module.
fn named_paths(text: &str, here: &[String]) -> Vec<Module> {
    let mut out = Vec::new();
    let bytes = text.as_bytes();
    for base in ["crate::", "super::"] {
        for (at, _) in text.match_indices(base) {
            let before = at.checked_sub(1).map(|i| bytes[i]);
            if before
                .is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'$' || b == b':')
            {
                continue;
            }
            let mut prefix: Module = match base {
                "crate::" => Vec::new(),
                _ => here[..here.len().saturating_sub(1)].to_vec(),
            };
            let mut rest = &text[at + base.len()..];
            while let Some(r) = rest.strip_prefix("super::") {
                prefix.pop();
                rest = r;
            }
            group(rest, prefix, &mut out);
        }
    }
    out
}

/// Reads `a::b::{c, d::e}` (from the start of `rest`) under `prefix` into `out`.
fn group(rest: &str, mut prefix: Module, out: &mut Vec<Module>) {
    let mut s = rest;
    loop {
        let ident: String = s
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if ident.is_empty() {
            break;
        }
        prefix.push(ident.clone());
        s = &s[ident.len()..];
        match s.strip_prefix("::") {
            Some(r) => s = r,
            None => break,
        }
    }
    if let Some(inner) = s.strip_prefix('{') {
        let mut depth = 0;
        let mut start = 0;
        for (i, c) in inner.char_indices() {
            match c {
                '{' => depth += 1,
                '}' if depth == 0 => {
                    group(inner[start..i].trim_start(), prefix.clone(), out);
                    break;
                }
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    group(inner[start..i].trim_start(), prefix.clone(), out);
                    start = i + 1;
                }
                _ => {}
            }
        }
    }
    out.push(prefix);
}

/// The source files by module (`lib.rs` is the root; `main.rs`, the binary, is left out).
fn modules(dir: &Path, at: Module, out: &mut BTreeMap<Module, String>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        let mut module = at.clone();
        if path.is_dir() {
            module.push(name);
            modules(&path, module, out);
            continue;
        }
        if path.extension().is_none_or(|e| e != "rs") || name == "main" && at.is_empty() {
            continue;
        }
        if name != "mod" && !(name == "lib" && at.is_empty()) {
            module.push(name);
        }
        let text = std::fs::read_to_string(&path).unwrap();
        // Code only: no unit tests, no comments (a doc link is not a dependency).
        let code = text.split("#[cfg(test)]\nmod tests").next().unwrap_or("");
        let code: Vec<&str> = code
            .lines()
            .map(|l| l.split("//").next().unwrap_or(""))
            .collect();
        out.insert(module, code.join("\n"));
    }
}

/// The file-level dependency graph of one crate's `src/`, its modules named after the crate
/// (`companion/pipeline/gate`, `companion-tools/tools/schema`).
fn crate_graph(name: &str, src: &Path) -> BTreeMap<Module, BTreeSet<Module>> {
    let mut files = BTreeMap::new();
    modules(src, Vec::new(), &mut files);
    let file_of = |path: &Module| {
        (1..=path.len())
            .rev()
            .map(|n| path[..n].to_vec())
            .find(|m| files.contains_key(m))
    };
    let named = |m: &Module| [vec![name.to_owned()], m.clone()].concat();
    files
        .iter()
        .map(|(module, code)| {
            let deps = named_paths(code, module)
                .iter()
                .filter_map(file_of)
                .filter(|d| !module.starts_with(d))
                .map(|d| named(&d))
                .collect();
            (named(module), deps)
        })
        .collect()
}

/// The file-level dependency graph of every crate of the workspace but the dev tooling.
fn graph() -> BTreeMap<Module, BTreeSet<Module>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut g = crate_graph("companion", &root.join("src"));
    for entry in std::fs::read_dir(root.join("crates")).unwrap() {
        let dir = entry.unwrap().path();
        let name = format!("companion-{}", dir.file_name().unwrap().to_string_lossy());
        g.extend(crate_graph(&name, &dir.join("src")));
    }
    g
}

/// The strongly connected components of more than one file (Tarjan).
fn cycles(g: &BTreeMap<Module, BTreeSet<Module>>) -> Vec<Vec<String>> {
    struct State<'a> {
        g: &'a BTreeMap<Module, BTreeSet<Module>>,
        index: BTreeMap<&'a Module, (usize, usize)>,
        stack: Vec<&'a Module>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a Module) {
        let n = s.index.len();
        s.index.insert(v, (n, n));
        s.stack.push(v);
        for w in s.g.get(v).into_iter().flatten() {
            let Some((w, _)) = s.g.get_key_value(w) else {
                continue;
            };
            match s.index.get(w).copied() {
                None => {
                    visit(s, w);
                    let low = s.index[w].1.min(s.index[v].1);
                    s.index.get_mut(v).unwrap().1 = low;
                }
                Some((wi, _)) if s.stack.contains(&w) => {
                    let low = wi.min(s.index[v].1);
                    s.index.get_mut(v).unwrap().1 = low;
                }
                _ => {}
            }
        }
        let (i, low) = s.index[v];
        if i == low {
            let at = s.stack.iter().rposition(|m| *m == v).unwrap();
            let component: Vec<String> = s.stack.drain(at..).map(|m| m.join("/")).collect();
            if component.len() > 1 {
                s.out.push(component);
            }
        }
    }
    let mut s = State {
        g,
        index: BTreeMap::new(),
        stack: Vec::new(),
        out: Vec::new(),
    };
    for v in g.keys() {
        if !s.index.contains_key(v) {
            visit(&mut s, v);
        }
    }
    s.out
}

#[test]
fn source_files_have_no_import_cycles() {
    let g = graph();
    assert!(g.len() > 80, "every source file read: {}", g.len());
    let m = |s: &str| s.split('/').map(str::to_owned).collect::<Module>();
    assert!(
        g[&m("companion/pipeline/end")].contains(&m("companion/pipeline/outgoing")),
        "the graph sees `outgoing::Clean` in a nested `super::{{…}}`: {:?}",
        g[&m("companion/pipeline/end")]
    );
    assert_eq!(
        cycles(&g),
        Vec::<Vec<String>>::new(),
        "import cycles among files"
    );
}

#[test]
fn the_path_reader_sees_every_form_and_a_cycle() {
    let here = vec!["turn".to_owned(), "hooks".to_owned()];
    let text = "use super::{Turns, deliver::Outgoing, input::{Admitted, Kind}};\nlet x = crate::bus::event::clean(y);\nlet z = $crate::no;";
    let got: BTreeSet<String> = named_paths(text, &here)
        .iter()
        .map(|p| p.join("::"))
        .collect();
    for p in [
        "turn::Turns",
        "turn::deliver::Outgoing",
        "turn::input::Kind",
        "bus::event::clean",
    ] {
        assert!(got.contains(p), "{p} in {got:?}");
    }
    assert!(!got.iter().any(|p| p.contains("no")), "{got:?}");
    let m = |s: &str| s.split('/').map(str::to_owned).collect::<Module>();
    let g: BTreeMap<Module, BTreeSet<Module>> = [
        (m("a/x"), [m("a/y")].into()),
        (m("a/y"), [m("a/z")].into()),
        (m("a/z"), [m("a/x")].into()),
        (m("b"), [m("a/x")].into()),
    ]
    .into();
    assert_eq!(cycles(&g), [["a/x", "a/y", "a/z"]]);
}
