//! companion: the worker that gives TrickBook's AI companions their brain.
//!
//! A bot-bound DM arrives on NATS JetStream (`bus`); the one conversation pipeline (`pipeline`) loads
//! history (`store::pg`) and the user's data (`store::mongo`), asks the chat model (`llm`) in the
//! voice of a `character`, writes the reply into `dm_messages` and publishes the completion. A group
//! message (who answers: `group`) and a follow-up (what to say: `proactive`) take the same path.
//! Every side effect of a job is a step of its `journal`; the `worker` runs jobs and `settle`s
//! each delivery.
//!
//! Modules are layered (docs/development.md, Layout; checked by `layers_have_no_cycles` below): a module
//! imports only modules of lower layers.
//!
//! The public API is small (as in mini-redis): the settings ([`config`]), the worker ([`run_worker`]), the
//! telemetry the binary starts ([`init_telemetry`], [`run_main`]) and the operations commands
//! ([`commands`]). Everything else is private to the crate; the integration tests and the dev tooling
//! (`companion-dev`) reach what they need through `testing` (feature `testing`), never the production
//! binary.

// What is `pub` is reachable from the API or from `testing`; anything else is `pub(crate)` at most.
#![cfg_attr(feature = "testing", warn(unreachable_pub))]

mod bus;
mod character;
mod conversation_order;
mod crisis_report;
mod failure;
#[cfg(feature = "testing")]
mod fault;
mod flood;
mod flow;
mod group;
mod journal;
#[cfg(test)]
mod layout;
mod llm;
mod memory;
mod metrics;
mod ops_http;
mod pipeline;
mod proactive;
mod rag;
mod replay;
mod safety;
mod settle;
#[cfg(test)]
mod sizes;
mod spend;
mod startup;
mod store;
mod takeover;
mod telemetry;
mod timing;
mod tools;
mod usage;
mod worker;

pub mod commands;
pub mod config;
#[cfg(feature = "testing")]
pub mod testing;

pub use config::Config;
pub use startup::run_worker;
pub use telemetry::{Telemetry, init as init_telemetry, run_main};

/// The layers, lowest first: a module may import modules of lower layers only. A new module gets a
/// layer here; an import that goes sideways or up fails `layers_have_no_cycles`.
#[cfg(test)]
const LAYERS: &[&[&str]] = &[
    &["config", "failure", "fault", "metrics"],
    &["timing", "telemetry", "safety"],
    &["store", "bus", "llm"],
    &["journal", "character", "rag"],
    &["spend", "flow"],
    &["memory"],
    &["tools", "conversation_order", "flood"],
    &["group", "proactive"],
    &["pipeline"],
    &["takeover", "settle"],
    &["worker", "replay", "usage", "crisis_report"],
    &["ops_http"],
    &["startup"],
    &["commands"],
    &["testing", "sizes", "layout"],
];

#[cfg(test)]
mod layers {
    use std::{collections::BTreeSet, path::Path};

    /// The crate's top-level modules named after `crate::` in `text` (`crate::a::b`, `crate::{a, b::c}`).
    fn imports(text: &str) -> BTreeSet<String> {
        let mut out = BTreeSet::new();
        let bytes = text.as_bytes();
        for (at, _) in text.match_indices("crate::") {
            let rest = &text[at + "crate::".len()..];
            if rest.starts_with('{') {
                let mut depth = 0;
                let mut segment_start = true;
                for (i, c) in rest.char_indices() {
                    match c {
                        '{' => {
                            depth += 1;
                            segment_start = depth == 1;
                        }
                        '}' => {
                            depth -= 1;
                            if depth == 0 {
                                break;
                            }
                        }
                        ',' if depth == 1 => segment_start = true,
                        c if segment_start && depth == 1 && (c.is_alphabetic() || c == '_') => {
                            let ident: String = rest[i..]
                                .chars()
                                .take_while(|c| c.is_alphanumeric() || *c == '_')
                                .collect();
                            out.insert(ident);
                            segment_start = false;
                        }
                        _ => {}
                    }
                }
            } else {
                let ident: String = rest
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                // Not `$crate::` inside a macro, not a doc link to an item of the crate root.
                if at == 0 || bytes[at - 1] != b'$' {
                    out.insert(ident);
                }
            }
        }
        out
    }

    fn layer_of(module: &str) -> Option<usize> {
        super::LAYERS.iter().position(|l| l.contains(&module))
    }

    fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                rust_files(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }

    #[test]
    fn layers_have_no_cycles() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = Vec::new();
        rust_files(&src, &mut files);
        let mut wrong = Vec::new();
        for file in files {
            let rel = file.strip_prefix(&src).unwrap();
            let module = rel
                .components()
                .next()
                .unwrap()
                .as_os_str()
                .to_string_lossy()
                .trim_end_matches(".rs")
                .to_owned();
            if module == "lib" || module == "main" {
                continue;
            }
            let Some(own) = layer_of(&module) else {
                wrong.push(format!("{module} has no layer in LAYERS"));
                continue;
            };
            // Code only: a doc link to an upper layer (`[`crate::settle`]`) is not a dependency.
            let code: String = std::fs::read_to_string(&file)
                .unwrap()
                .lines()
                .map(|l| l.split("//").next().unwrap_or(""))
                .collect::<Vec<_>>()
                .join("\n");
            for import in imports(&code) {
                if import == module || matches!(import.as_str(), "Config") {
                    continue;
                }
                match layer_of(&import) {
                    Some(l) if l < own => {}
                    Some(_) => wrong.push(format!(
                        "{} imports {import}, which is not in a lower layer",
                        rel.display()
                    )),
                    None => wrong.push(format!("{} imports unknown {import}", rel.display())),
                }
            }
        }
        assert!(wrong.is_empty(), "layering broken:\n{}", wrong.join("\n"));
    }

    #[test]
    fn the_import_reader_sees_every_form() {
        let text = "use crate::{\n    bus::{Bus, event::x},\n    config::Config,\n};\nlet a = crate::timing::stage;\n";
        let got: Vec<String> = imports(text).into_iter().collect();
        assert_eq!(got, ["bus", "config", "timing"]);
    }
}
/// Import cycles among the source files of `src/`: a file (`pipeline/gate.rs`, `pipeline/mod.rs` as `pipeline`) that
/// names another's items (`crate::a::b::X`, `super::b::{X, c::Y}`) depends on it. A file's ancestors
/// declare it and are not counted: a child may use its parent's items.
#[cfg(test)]
mod files {
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
                if before.is_some_and(|b| {
                    b.is_ascii_alphanumeric() || b == b'_' || b == b'$' || b == b':'
                }) {
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

    /// The file-level dependency graph of `src/`.
    fn graph() -> BTreeMap<Module, BTreeSet<Module>> {
        let mut files = BTreeMap::new();
        modules(
            &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
            Vec::new(),
            &mut files,
        );
        let file_of = |path: &Module| {
            (1..=path.len())
                .rev()
                .map(|n| path[..n].to_vec())
                .find(|m| files.contains_key(m))
        };
        files
            .iter()
            .map(|(module, code)| {
                let deps = named_paths(code, module)
                    .iter()
                    .filter_map(file_of)
                    .filter(|d| !module.starts_with(d))
                    .collect();
                (module.clone(), deps)
            })
            .collect()
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
        let end = vec!["pipeline".to_owned(), "end".to_owned()];
        assert!(
            g[&end].contains(&vec!["pipeline".to_owned(), "outgoing".to_owned()]),
            "the graph sees `outgoing::Clean` in a nested `super::{{…}}`: {:?}",
            g[&end]
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
}
