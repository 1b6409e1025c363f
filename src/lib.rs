//! companion: the worker that gives TrickBook's AI companions their brain.
//!
//! A bot-bound DM arrives on NATS JetStream (`bus`); the one conversation pipeline (`turn`) loads
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

mod app;
mod bus;
mod character;
mod failure;
#[cfg(feature = "testing")]
mod fault;
mod flood;
mod flow;
mod group;
mod journal;
mod llm;
mod memory;
mod metrics;
mod ops;
mod order;
mod proactive;
mod rag;
mod replay;
mod report;
mod safety;
mod settle;
mod spend;
mod store;
mod telemetry;
mod timing;
mod tools;
mod turn;
mod usage;
mod worker;

pub mod commands;
pub mod config;
#[cfg(feature = "testing")]
pub mod testing;

pub use app::{TurnSections, run_worker};
pub use config::Config;
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
    &["tools", "order", "flood"],
    &["group", "proactive"],
    &["turn"],
    &["settle"],
    &["worker", "replay", "usage", "report"],
    &["ops"],
    &["app"],
    &["commands"],
    &["testing"],
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
