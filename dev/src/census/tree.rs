//! The module tree of a crate as the compiler walks it: from the root file (`lib.rs`, `main.rs`) through
//! every `mod foo;` to `foo.rs` or `foo/mod.rs` (or the file its `#[path]` names), keeping for each file
//! whether it is declared under `#[cfg(test)]` or `#[cfg(feature = "testing")]`. Also the `cfg`
//! predicates every count of the census skips or flags items by.

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
};

use anyhow::Context;
use syn::{
    Attribute, Expr, ExprLit, ImplItem, Item, Lit, Meta, MetaList, Token, punctuated::Punctuated,
};

/// One source file of a module tree, parsed.
pub struct SourceFile {
    /// The file's path relative to the checkout's root.
    pub rel: PathBuf,
    /// The module's name: the name its `mod` declares (a root file's: its stem, `lib` or `main`).
    pub module: String,
    /// The file's syntax.
    pub ast: syn::File,
    /// The file's text.
    pub text: String,
    /// Declared under `#[cfg(test)]` (on its `mod` or an enclosing one): a test module.
    pub test: bool,
    /// Declared under `#[cfg(feature = "testing")]` (on its `mod` or an enclosing one).
    pub testing: bool,
    /// Declared under a `cfg` that needs some feature (`testing`, `otel`, …).
    pub gated: bool,
}

/// How a module is declared: the `cfg`s on its `mod` and the enclosing ones.
#[derive(Clone, Copy, Default)]
struct Declared {
    /// Under `#[cfg(test)]`.
    test: bool,
    /// Under `#[cfg(feature = "testing")]`.
    testing: bool,
    /// Under a `cfg` that needs some feature.
    gated: bool,
}

impl Declared {
    /// Within this, under `attrs`.
    fn and(self, attrs: &[Attribute]) -> Declared {
        Declared {
            test: self.test || is_test(attrs),
            testing: self.testing || is_testing(attrs),
            gated: self.gated || is_gated(attrs),
        }
    }
}

/// What a file's `mod` declarations are resolved against.
struct Scope<'a> {
    /// The folder `mod foo;` looks in (the file's own, or `<stem>/` for a non-`mod.rs` file, plus any
    /// inline modules around the declaration).
    dir: PathBuf,
    /// The folder of the file itself (what `#[path]` is relative to).
    file_dir: &'a Path,
    /// Whether the declaration is inside an inline module.
    inline: bool,
    /// The `cfg`s around.
    declared: Declared,
}

/// Every file of the module trees rooted at `roots` (those that exist), each once.
pub fn walk(root: &Path, roots: &[PathBuf]) -> anyhow::Result<Vec<SourceFile>> {
    let mut walker = Walker {
        root,
        seen: BTreeSet::new(),
        files: Vec::new(),
    };
    for file in roots.iter().filter(|f| f.is_file()) {
        walker.load(file, None, false, Declared::default())?;
    }
    Ok(walker.files)
}

/// A walk through module trees.
struct Walker<'a> {
    /// The checkout's root (paths are given relative to it).
    root: &'a Path,
    /// The files loaded so far.
    seen: BTreeSet<PathBuf>,
    /// What the walk found, in the order loaded.
    files: Vec<SourceFile>,
}

impl Walker<'_> {
    /// Loads the file of the module `name` (`None`: a root file) and the files it declares.
    fn load(
        &mut self,
        path: &Path,
        name: Option<&str>,
        by_path: bool,
        declared: Declared,
    ) -> anyhow::Result<()> {
        if !self.seen.insert(path.to_owned()) {
            return Ok(());
        }
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let ast = syn::parse_file(&text).with_context(|| format!("parsing {}", path.display()))?;
        let stem = path
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or_default();
        let mod_rs = by_path || matches!(stem, "lib" | "main" | "mod");
        let file_dir = path.parent().unwrap_or(Path::new("")).to_owned();
        let module = name.unwrap_or(stem).to_owned();
        let at = Scope {
            dir: if mod_rs {
                file_dir.clone()
            } else {
                file_dir.join(stem)
            },
            file_dir: &file_dir,
            inline: false,
            declared,
        };
        let rel = path.strip_prefix(self.root).unwrap_or(path).to_owned();
        let items = ast.items.clone();
        self.files.push(SourceFile {
            rel,
            module,
            ast,
            text,
            test: declared.test,
            testing: declared.testing,
            gated: declared.gated,
        });
        self.declared(&items, &at)
    }

    /// Follows the `mod` declarations among `items`.
    fn declared(&mut self, items: &[Item], at: &Scope) -> anyhow::Result<()> {
        for item in items {
            let Item::Mod(m) = item else { continue };
            let declared = at.declared.and(&m.attrs);
            let name = m.ident.to_string();
            let path = path_attr(&m.attrs);
            if let Some((_, inner)) = &m.content {
                let dir = match &path {
                    Some(p) => at.dir.join(p),
                    None => at.dir.join(&name),
                };
                let inner_at = Scope {
                    dir,
                    file_dir: at.file_dir,
                    inline: true,
                    declared,
                };
                self.declared(inner, &inner_at)?;
                continue;
            }
            let by_path = path.is_some();
            let file = match path {
                Some(p) if at.inline => Some(at.dir.join(p)),
                Some(p) => Some(at.file_dir.join(p)),
                None => [
                    at.dir.join(format!("{name}.rs")),
                    at.dir.join(&name).join("mod.rs"),
                ]
                .into_iter()
                .find(|f| f.is_file()),
            };
            match file {
                Some(file) => self.load(&file, Some(&name), by_path, declared)?,
                None => eprintln!("census: no file for `mod {name};` in {}", at.dir.display()),
            }
        }
        Ok(())
    }
}

/// The value of a `#[path = "…"]` attribute.
fn path_attr(attrs: &[Attribute]) -> Option<String> {
    attrs.iter().find_map(|a| match &a.meta {
        Meta::NameValue(nv) if nv.path.is_ident("path") => match &nv.value {
            Expr::Lit(ExprLit {
                lit: Lit::Str(s), ..
            }) => Some(s.value()),
            _ => None,
        },
        _ => None,
    })
}

/// Whether a `cfg` attribute among `attrs` holds only when `leaf` does (`all(…)` with such a leaf,
/// `any(…)` of nothing but such leaves; never under `not`).
fn cfg_requires(attrs: &[Attribute], leaf: &dyn Fn(&Meta) -> bool) -> bool {
    attrs
        .iter()
        .filter(|a| a.path().is_ident("cfg"))
        .filter_map(|a| a.parse_args::<Meta>().ok())
        .any(|m| requires(&m, leaf))
}

fn requires(meta: &Meta, leaf: &dyn Fn(&Meta) -> bool) -> bool {
    match meta {
        Meta::List(l) if l.path.is_ident("all") => nested(l).iter().any(|m| requires(m, leaf)),
        Meta::List(l) if l.path.is_ident("any") => {
            let n = nested(l);
            !n.is_empty() && n.iter().all(|m| requires(m, leaf))
        }
        Meta::List(l) if l.path.is_ident("not") => false,
        m => leaf(m),
    }
}

fn nested(l: &MetaList) -> Vec<Meta> {
    l.parse_args_with(Punctuated::<Meta, Token![,]>::parse_terminated)
        .map(|p| p.into_iter().collect())
        .unwrap_or_default()
}

/// `#[cfg(test)]` (or a `cfg` that implies it).
pub fn is_test(attrs: &[Attribute]) -> bool {
    cfg_requires(attrs, &|m| matches!(m, Meta::Path(p) if p.is_ident("test")))
}

/// `#[cfg(feature = "testing")]` (or a `cfg` that implies it).
pub fn is_testing(attrs: &[Attribute]) -> bool {
    cfg_requires(attrs, &|m| match m {
        Meta::NameValue(nv) if nv.path.is_ident("feature") => matches!(
            &nv.value,
            Expr::Lit(ExprLit { lit: Lit::Str(s), .. }) if s.value() == "testing"
        ),
        _ => false,
    })
}

/// A `cfg` that needs some feature.
fn is_gated(attrs: &[Attribute]) -> bool {
    cfg_requires(
        attrs,
        &|m| matches!(m, Meta::NameValue(nv) if nv.path.is_ident("feature")),
    )
}

/// An item's attributes.
pub fn item_attrs(item: &Item) -> &[Attribute] {
    match item {
        Item::Const(i) => &i.attrs,
        Item::Enum(i) => &i.attrs,
        Item::ExternCrate(i) => &i.attrs,
        Item::Fn(i) => &i.attrs,
        Item::ForeignMod(i) => &i.attrs,
        Item::Impl(i) => &i.attrs,
        Item::Macro(i) => &i.attrs,
        Item::Mod(i) => &i.attrs,
        Item::Static(i) => &i.attrs,
        Item::Struct(i) => &i.attrs,
        Item::Trait(i) => &i.attrs,
        Item::TraitAlias(i) => &i.attrs,
        Item::Type(i) => &i.attrs,
        Item::Union(i) => &i.attrs,
        Item::Use(i) => &i.attrs,
        _ => &[],
    }
}

/// An impl item's attributes.
pub fn impl_item_attrs(item: &ImplItem) -> &[Attribute] {
    match item {
        ImplItem::Const(i) => &i.attrs,
        ImplItem::Fn(i) => &i.attrs,
        ImplItem::Type(i) => &i.attrs,
        ImplItem::Macro(i) => &i.attrs,
        _ => &[],
    }
}

/// The crates' source folders (`crates/*/src`) under `root`, by crate folder name.
pub fn lower_crates(root: &Path) -> anyhow::Result<Vec<(String, PathBuf)>> {
    let dir = root.join("crates");
    let mut crates = Vec::new();
    for entry in std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        if path.join("src").is_dir() {
            let name = path
                .file_name()
                .and_then(|s| s.to_str())
                .unwrap_or_default();
            crates.push((name.to_owned(), path.join("src")));
        }
    }
    crates.sort();
    Ok(crates)
}

/// The root files of a crate's source folder: `lib.rs` and `main.rs`.
pub fn roots(src: &Path) -> Vec<PathBuf> {
    vec![src.join("lib.rs"), src.join("main.rs")]
}
