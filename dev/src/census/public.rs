//! The lower crates' public surface: the declarations written `pub` (exactly `pub`: not `pub(crate)`,
//! `pub(super)` or `pub(in …)`) outside test code, by kind, and how many of them exist only with the
//! feature `testing`. Items a macro generates are not in the source and do not count.

use std::collections::BTreeMap;

use serde::Serialize;
use syn::{Fields, ImplItem, Item, Visibility};

use super::tree::{SourceFile, impl_item_attrs, is_test, is_testing, item_attrs};

/// The `pub` declarations of one crate (or of all of them).
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct Public {
    /// `pub` items by kind: fn, struct, enum, trait, type, const, static, mod, use (and union, extern
    /// crate if any); a `pub const` or `pub type` inside an impl block is one too.
    pub items: BTreeMap<String, usize>,
    /// `pub fn`s inside impl blocks (a trait impl's methods are never written `pub`).
    pub methods: usize,
    /// Of `items`, the `pub const` and `pub type` inside impl blocks.
    pub impl_consts_and_types: usize,
    /// Items plus methods: the figure issue 65 quotes.
    pub total: usize,
    /// Of `total`, those under `#[cfg(feature = "testing")]` (on the item or an enclosing module or
    /// impl).
    pub testing: usize,
    /// `pub` fields of structs (named and tuple), outside test code.
    pub fields: usize,
    /// `pub mod` declarations (inline or file).
    pub pub_mods: usize,
    /// All `mod` declarations outside test code (inline or file, whatever their visibility).
    pub mods: usize,
}

impl Public {
    /// The `pub` items outside impls.
    pub fn item_count(&self) -> usize {
        self.items.values().sum()
    }

    /// Adds another count to this one.
    pub fn add(&mut self, other: &Public) {
        for (kind, n) in &other.items {
            *self.items.entry(kind.clone()).or_default() += n;
        }
        self.methods += other.methods;
        self.impl_consts_and_types += other.impl_consts_and_types;
        self.total += other.total;
        self.testing += other.testing;
        self.fields += other.fields;
        self.pub_mods += other.pub_mods;
        self.mods += other.mods;
    }
}

/// Counts the `pub` declarations of a crate's files (its test modules skipped).
pub fn count(files: &[SourceFile]) -> Public {
    let mut p = Public::default();
    for file in files.iter().filter(|f| !f.test) {
        p.items_of(&file.ast.items, file.testing);
    }
    p.total = p.item_count() + p.methods;
    p
}

impl Public {
    fn items_of(&mut self, items: &[Item], testing: bool) {
        for item in items {
            let attrs = item_attrs(item);
            if is_test(attrs) {
                continue;
            }
            let testing = testing || is_testing(attrs);
            if let Item::Impl(i) = item {
                self.impl_items(&i.items, testing);
                continue;
            }
            if let Item::Struct(s) = item {
                self.fields += pub_fields(&s.fields);
            }
            if let Item::Mod(m) = item {
                self.mods += 1;
                self.pub_mods += usize::from(is_pub(&m.vis));
                if let Some((_, inner)) = &m.content {
                    self.items_of(inner, testing);
                }
            }
            if let Some(kind) = pub_kind(item) {
                *self.items.entry(kind.to_owned()).or_default() += 1;
                self.testing += usize::from(testing);
            }
        }
    }

    fn impl_items(&mut self, items: &[ImplItem], testing: bool) {
        for item in items {
            let attrs = impl_item_attrs(item);
            if is_test(attrs) {
                continue;
            }
            let testing = testing || is_testing(attrs);
            match item {
                ImplItem::Fn(f) if is_pub(&f.vis) => {
                    self.methods += 1;
                    self.testing += usize::from(testing);
                }
                ImplItem::Const(c) if is_pub(&c.vis) => self.impl_item("const", testing),
                ImplItem::Type(t) if is_pub(&t.vis) => self.impl_item("type", testing),
                _ => {}
            }
        }
    }
}

impl Public {
    fn impl_item(&mut self, kind: &str, testing: bool) {
        *self.items.entry(kind.to_owned()).or_default() += 1;
        self.impl_consts_and_types += 1;
        self.testing += usize::from(testing);
    }
}

/// Exactly `pub`.
fn is_pub(vis: &Visibility) -> bool {
    matches!(vis, Visibility::Public(_))
}

fn pub_fields(fields: &Fields) -> usize {
    fields.iter().filter(|f| is_pub(&f.vis)).count()
}

/// The kind of an item written `pub`, if it is.
fn pub_kind(item: &Item) -> Option<&'static str> {
    let (vis, kind) = match item {
        Item::Fn(i) => (&i.vis, "fn"),
        Item::Struct(i) => (&i.vis, "struct"),
        Item::Enum(i) => (&i.vis, "enum"),
        Item::Trait(i) => (&i.vis, "trait"),
        Item::Type(i) => (&i.vis, "type"),
        Item::Const(i) => (&i.vis, "const"),
        Item::Static(i) => (&i.vis, "static"),
        Item::Mod(i) => (&i.vis, "mod"),
        Item::Use(i) => (&i.vis, "use"),
        Item::Union(i) => (&i.vis, "union"),
        Item::ExternCrate(i) => (&i.vis, "extern crate"),
        Item::TraitAlias(i) => (&i.vis, "trait alias"),
        _ => return None,
    };
    is_pub(vis).then_some(kind)
}
