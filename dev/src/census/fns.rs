//! The length of every function (free, method, a trait's provided method, one nested in another; not
//! closures) outside `#[cfg(test)]` code: from the line of its `fn` keyword to the line of its closing
//! brace, both included (attributes and doc comments above it are not counted).

use serde::Serialize;
use syn::{
    Block, ImplItem, ImplItemFn, Item, ItemFn, ItemImpl, ItemMod, ItemTrait, Signature,
    TraitItemFn, Type,
    visit::{self, Visit},
};

use super::tree::{SourceFile, impl_item_attrs, is_test, item_attrs};

/// One function.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct FnLength {
    /// The file, relative to the root.
    pub file: String,
    /// The line of its `fn` keyword.
    pub line: usize,
    /// `Type::name` for a method (or `Trait::name`), `module::name` for a free function.
    pub name: String,
    /// Lines from the `fn` keyword to the closing brace, both included.
    pub lines: usize,
}

/// Every function of the files (their test modules skipped), in file order.
pub fn lengths(files: &[SourceFile]) -> Vec<FnLength> {
    let mut out = Vec::new();
    for file in files.iter().filter(|f| !f.test) {
        let mut v = Lengths {
            file: file.rel.display().to_string(),
            scope: vec![file.module.clone()],
            out: &mut out,
        };
        v.visit_file(&file.ast);
    }
    out
}

/// The functions over `max` lines, longest first.
pub fn over(fns: &[FnLength], max: usize) -> Vec<FnLength> {
    let mut long: Vec<FnLength> = fns.iter().filter(|f| f.lines > max).cloned().collect();
    long.sort_by(|a, b| b.lines.cmp(&a.lines).then(a.file.cmp(&b.file)));
    long
}

/// Measures the functions of one file.
struct Lengths<'o> {
    /// The file, relative to the root.
    file: String,
    /// The module, then the impl's type or the trait a function is in.
    scope: Vec<String>,
    /// Where each function goes.
    out: &'o mut Vec<FnLength>,
}

impl Lengths<'_> {
    fn record(&mut self, sig: &Signature, block: &Block) {
        let first = sig.fn_token.span.start().line;
        let last = block.brace_token.span.close().end().line;
        let owner = self.scope.last().map(String::as_str).unwrap_or_default();
        self.out.push(FnLength {
            file: self.file.clone(),
            line: first,
            name: format!("{owner}::{}", sig.ident),
            lines: last + 1 - first,
        });
    }

    fn within(&mut self, name: String, f: impl FnOnce(&mut Self)) {
        self.scope.push(name);
        f(self);
        self.scope.pop();
    }
}

/// The last identifier of a type's path (`App` for `App<'a>` or `crate::App`).
fn type_name(ty: &Type) -> String {
    match ty {
        Type::Path(p) => p
            .path
            .segments
            .last()
            .map(|s| s.ident.to_string())
            .unwrap_or_default(),
        Type::Reference(r) => type_name(&r.elem),
        _ => "_".to_owned(),
    }
}

impl<'ast> Visit<'ast> for Lengths<'_> {
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

    fn visit_item_mod(&mut self, m: &'ast ItemMod) {
        self.within(m.ident.to_string(), |v| visit::visit_item_mod(v, m));
    }

    fn visit_item_impl(&mut self, i: &'ast ItemImpl) {
        self.within(type_name(&i.self_ty), |v| visit::visit_item_impl(v, i));
    }

    fn visit_item_trait(&mut self, t: &'ast ItemTrait) {
        self.within(t.ident.to_string(), |v| visit::visit_item_trait(v, t));
    }

    fn visit_item_fn(&mut self, f: &'ast ItemFn) {
        self.record(&f.sig, &f.block);
        visit::visit_item_fn(self, f);
    }

    fn visit_impl_item_fn(&mut self, f: &'ast ImplItemFn) {
        self.record(&f.sig, &f.block);
        visit::visit_impl_item_fn(self, f);
    }

    fn visit_trait_item_fn(&mut self, f: &'ast TraitItemFn) {
        if let Some(block) = &f.default {
            self.record(&f.sig, block);
        }
        visit::visit_trait_item_fn(self, f);
    }
}
