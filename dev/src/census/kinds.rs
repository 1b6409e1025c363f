//! Where `src/pipeline/` branches on the kind of message (the enum `Kind`: a DM, a group message, a
//! follow-up): each `match` with an arm naming a `Kind::` variant, each `if let` / `while let` /
//! `let … else` (any `let`) whose pattern names one, and each `matches!(…, Kind::…)`, outside
//! `#[cfg(test)]` code. Beside those constructs, the branches they make (every arm of such a `match`,
//! its `_` arm included, plus one per `let` and per `matches!`: the figure issue 65 quotes) and the
//! variant paths their patterns name.

use std::collections::BTreeMap;

use serde::Serialize;
use syn::{
    ExprLet, ExprMatch, ImplItem, Item, Local, Macro, Pat, Path,
    visit::{self, Visit},
};

use super::{
    tokens,
    tree::{SourceFile, impl_item_attrs, is_test, item_attrs},
};

/// The enum's name.
const KIND: &str = "Kind";

/// Branches on `Kind` in one file.
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct KindBranches {
    /// `match` expressions with an arm naming a variant.
    pub matches: usize,
    /// `let` patterns (`if let`, `while let`, `let … else`) naming a variant.
    pub lets: usize,
    /// `matches!` calls naming a variant.
    pub matches_macros: usize,
    /// The three above.
    pub total: usize,
    /// The arms of those `match` expressions (all of them, `_` included).
    pub arms: usize,
    /// `arms` + `lets` + `matches_macros`: each place the code goes one way per kind.
    pub branches: usize,
    /// Variant paths named by those patterns (a `match` with three such arms: three).
    pub variant_paths: usize,
}

/// Branches on `Kind` in the pipeline, per file.
#[derive(Clone, Debug, Default, Serialize)]
pub struct KindCensus {
    /// Where the enum is declared (`file:line`), if found.
    pub declared_at: Option<String>,
    /// Its variants (found in its declaration).
    pub variants: Vec<String>,
    /// Per file (relative path), only files with a branch.
    pub files: BTreeMap<String, KindBranches>,
    /// The sums over the files.
    pub total: KindBranches,
}

/// Counts the branches on `Kind` in the files under `dir` (a folder relative to the root).
pub fn count(files: &[SourceFile], dir: &str) -> KindCensus {
    let mut census = KindCensus::default();
    let in_dir: Vec<&SourceFile> = files
        .iter()
        .filter(|f| !f.test && f.rel.starts_with(dir))
        .collect();
    for file in &in_dir {
        for item in &file.ast.items {
            if let Item::Enum(e) = item
                && e.ident == KIND
                && census.declared_at.is_none()
            {
                let line = e.ident.span().start().line;
                census.declared_at = Some(format!("{}:{line}", file.rel.display()));
                census.variants = e.variants.iter().map(|v| v.ident.to_string()).collect();
            }
        }
    }
    for file in in_dir {
        let mut v = Branches {
            variants: &census.variants,
            found: KindBranches::default(),
        };
        v.visit_file(&file.ast);
        let found = v.found;
        if found.total > 0 {
            add(&mut census.total, &found);
            census.files.insert(file.rel.display().to_string(), found);
        }
    }
    census
}

fn add(to: &mut KindBranches, b: &KindBranches) {
    to.matches += b.matches;
    to.lets += b.lets;
    to.matches_macros += b.matches_macros;
    to.total += b.total;
    to.arms += b.arms;
    to.branches += b.branches;
    to.variant_paths += b.variant_paths;
}

/// Counts one file's branches.
struct Branches<'v> {
    /// `Kind`'s variants.
    variants: &'v [String],
    /// What the file has so far.
    found: KindBranches,
}

impl Branches<'_> {
    /// The variant paths a pattern names.
    fn named(&self, pat: &Pat) -> usize {
        let mut paths = VariantPaths {
            variants: self.variants,
            n: 0,
        };
        paths.visit_pat(pat);
        paths.n
    }
}

impl<'ast> Visit<'ast> for Branches<'_> {
    fn visit_item(&mut self, i: &'ast Item) {
        if !is_test(item_attrs(i)) {
            visit::visit_item(self, i);
        }
    }

    fn visit_impl_item(&mut self, i: &'ast ImplItem) {
        if !is_test(impl_item_attrs(i)) {
            visit::visit_impl_item(self, i);
        }
    }

    fn visit_expr_match(&mut self, m: &'ast ExprMatch) {
        let named: usize = m.arms.iter().map(|a| self.named(&a.pat)).sum();
        if named > 0 {
            self.found.matches += 1;
            self.found.total += 1;
            self.found.arms += m.arms.len();
            self.found.branches += m.arms.len();
            self.found.variant_paths += named;
        }
        visit::visit_expr_match(self, m);
    }

    fn visit_expr_let(&mut self, l: &'ast ExprLet) {
        self.let_pattern(&l.pat);
        visit::visit_expr_let(self, l);
    }

    fn visit_local(&mut self, l: &'ast Local) {
        self.let_pattern(&l.pat);
        visit::visit_local(self, l);
    }

    fn visit_macro(&mut self, m: &'ast Macro) {
        if m.path.segments.last().is_some_and(|s| s.ident == "matches") {
            let toks = tokens::flatten(m.tokens.clone());
            let named = tokens::variant_paths(&toks, KIND, self.variants);
            if named > 0 {
                self.found.matches_macros += 1;
                self.found.total += 1;
                self.found.branches += 1;
                self.found.variant_paths += named;
            }
        }
        visit::visit_macro(self, m);
    }
}

impl Branches<'_> {
    fn let_pattern(&mut self, pat: &Pat) {
        let named = self.named(pat);
        if named > 0 {
            self.found.lets += 1;
            self.found.total += 1;
            self.found.branches += 1;
            self.found.variant_paths += named;
        }
    }
}

/// Counts the paths `…Kind::Variant` in a pattern.
struct VariantPaths<'v> {
    /// `Kind`'s variants.
    variants: &'v [String],
    /// The paths found.
    n: usize,
}

impl<'ast> Visit<'ast> for VariantPaths<'_> {
    fn visit_path(&mut self, p: &'ast Path) {
        let s: Vec<String> = p.segments.iter().map(|s| s.ident.to_string()).collect();
        if let [.., ty, variant] = s.as_slice()
            && ty == KIND
            && (self.variants.is_empty() || self.variants.contains(variant))
        {
            self.n += 1;
        }
        visit::visit_path(self, p);
    }
}
