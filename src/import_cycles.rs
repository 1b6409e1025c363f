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

use syn::visit::Visit;

type Module = Vec<String>;

/// Every path a file's code names from `crate::` or `super::`, from the crate root, as far as it goes
/// (`super::{a::X, b}` is `…::a::X` and `…::b`): in `use` trees, in paths, and in the tokens of macro
/// calls; `#[cfg(test)]` items left out. `here` is the file's module.
fn named_paths(text: &str, here: &[String]) -> Vec<Module> {
    let file = syn::parse_file(text).expect("a source file of the workspace parses");
    let mut named = Named {
        here,
        out: Vec::new(),
    };
    named.visit_file(&file);
    named.out
}

/// What [`named_paths`] collects while it walks a file.
struct Named<'a> {
    /// The file's module.
    here: &'a [String],
    out: Vec<Module>,
}

impl Named<'_> {
    /// Records `segments` when they start at `crate` or `super` (a leading `super` is the parent of the
    /// file's module); any other path is another crate's or a local name.
    fn push(&mut self, segments: &[String]) {
        let mut at: Module = match segments.first().map(String::as_str) {
            Some("crate") => Vec::new(),
            Some("super") => self.here[..self.here.len().saturating_sub(1)].to_vec(),
            _ => return,
        };
        for s in &segments[1..] {
            match s.as_str() {
                "super" => {
                    at.pop();
                }
                "self" => {}
                _ => at.push(s.clone()),
            }
        }
        self.out.push(at);
    }

    /// The paths of a `use` tree under `prefix`.
    fn use_tree(&mut self, tree: &syn::UseTree, mut prefix: Vec<String>) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(&p.tree, prefix);
            }
            syn::UseTree::Name(n) => self.push(&[prefix, vec![n.ident.to_string()]].concat()),
            syn::UseTree::Rename(r) => self.push(&[prefix, vec![r.ident.to_string()]].concat()),
            syn::UseTree::Glob(_) => self.push(&prefix),
            syn::UseTree::Group(g) => {
                for t in &g.items {
                    self.use_tree(t, prefix.clone());
                }
            }
        }
    }

    /// The `crate::…` and `super::…` paths among a macro call's tokens (`$crate::…` is not this crate's).
    fn tokens(&mut self, tokens: proc_macro2::TokenStream) {
        use proc_macro2::TokenTree;
        let trees: Vec<TokenTree> = tokens.into_iter().collect();
        let mut i = 0;
        while i < trees.len() {
            match &trees[i] {
                TokenTree::Group(g) => self.tokens(g.stream()),
                TokenTree::Ident(id) if id == "crate" || id == "super" => {
                    let dollar =
                        i > 0 && matches!(&trees[i - 1], TokenTree::Punct(p) if p.as_char() == '$');
                    let mut path = vec![id.to_string()];
                    while let (
                        Some(TokenTree::Punct(a)),
                        Some(TokenTree::Punct(b)),
                        Some(TokenTree::Ident(next)),
                    ) = (trees.get(i + 1), trees.get(i + 2), trees.get(i + 3))
                    {
                        if a.as_char() != ':' || b.as_char() != ':' {
                            break;
                        }
                        path.push(next.to_string());
                        i += 3;
                    }
                    if !dollar && path.len() > 1 {
                        self.push(&path);
                    }
                }
                _ => {}
            }
            i += 1;
        }
    }
}

/// Whether `attrs` hold `#[cfg(test)]`.
fn is_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg") && a.parse_args::<syn::Ident>().is_ok_and(|i| i == "test")
    })
}

impl<'ast> Visit<'ast> for Named<'_> {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        let attrs = match item {
            syn::Item::Mod(m) => &m.attrs,
            syn::Item::Fn(f) => &f.attrs,
            syn::Item::Impl(i) => &i.attrs,
            syn::Item::Use(u) => &u.attrs,
            _ => return syn::visit::visit_item(self, item),
        };
        if !is_test(attrs) {
            syn::visit::visit_item(self, item);
        }
    }

    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        self.use_tree(&u.tree, Vec::new());
    }

    fn visit_path(&mut self, p: &'ast syn::Path) {
        let segments: Vec<String> = p.segments.iter().map(|s| s.ident.to_string()).collect();
        self.push(&segments);
        syn::visit::visit_path(self, p);
    }

    fn visit_macro(&mut self, m: &'ast syn::Macro) {
        self.tokens(m.tokens.clone());
        syn::visit::visit_macro(self, m);
    }
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
        // Comments are not tokens: a doc link is not a dependency.
        out.insert(module, std::fs::read_to_string(&path).unwrap());
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
    let text = "use super::{Turns, deliver::Outgoing, input::{Admitted, Kind}};\n\
                fn f() { let x = crate::bus::event::clean(y); }\n\
                macro_rules! m { () => { $crate::no }; }\n\
                #[cfg(test)]\nmod tests { use crate::no_test; }";
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
