//! The census as lines of text, one figure (or one row of a table) per line.

use std::fmt::{self, Display, Formatter};

use super::{Census, LONG_FN, STARTERS, kinds::KindBranches, public::Public};

impl Display for Census {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        writeln!(f, "census of {}", self.root)?;
        self.public(f)?;
        self.kinds(f)?;
        self.long_fns(f)?;
        self.starters(f)?;
        match &self.app_build {
            Some(b) => writeln!(
                f,
                "App::build ({}): {} lines, {} .clone() calls",
                b.at, b.lines, b.clones
            )?,
            None => writeln!(f, "App::build: not found in src/")?,
        }
        match self.compose_lines {
            Some(n) => writeln!(f, "src/pipeline/compose.rs: {n} lines")?,
            None => writeln!(f, "src/pipeline/compose.rs: none")?,
        }
        writeln!(f, "largest files of src/ and crates/*/src (lines):")?;
        for (file, n) in &self.largest_files {
            writeln!(f, "  {n:>5}  {file}")?;
        }
        Ok(())
    }
}

impl Census {
    fn public(&self, f: &mut Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "lower crates (crates/*/src), declarations written `pub` outside test code:"
        )?;
        for (name, p) in &self.crates {
            writeln!(f, "  {name:<10} {}", public_line(p))?;
        }
        let t = &self.crates_total;
        writeln!(f, "  {:<10} {}", "all", public_line(t))?;
        writeln!(
            f,
            "public declarations {} = {} items + {} methods; {} under feature testing; {} pub fields; \
             {} of {} mod are pub mod; of the items, {} pub const/type in impls",
            t.total,
            t.item_count(),
            t.methods,
            t.testing,
            t.fields,
            t.pub_mods,
            t.mods,
            t.impl_consts_and_types
        )
    }

    fn kinds(&self, f: &mut Formatter<'_>) -> fmt::Result {
        let k = &self.kind_branches;
        writeln!(
            f,
            "branches on Kind in src/pipeline/ (enum at {}: {}): {} in {} files ({} constructs: {})",
            k.declared_at.as_deref().unwrap_or("not found"),
            k.variants.join(", "),
            k.total.branches,
            k.files.len(),
            k.total.total,
            kind_line(&k.total)
        )?;
        for (file, b) in &k.files {
            writeln!(f, "  {:>3}  {file} ({})", b.branches, kind_line(b))?;
        }
        Ok(())
    }

    fn starters(&self, f: &mut Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "test starters in tests/, call sites (in brackets: outside modules behind a feature, as `otel`):"
        )?;
        for name in STARTERS {
            let all = self.test_starters.get(name).copied().unwrap_or(0);
            let plain = self.test_starters_ungated.get(name).copied().unwrap_or(0);
            writeln!(f, "  {all:>3} ({plain:>3})  {name}")?;
        }
        Ok(())
    }

    fn long_fns(&self, f: &mut Formatter<'_>) -> fmt::Result {
        let n = |place: &str| self.long_fns.get(place).map_or(0, Vec::len);
        writeln!(
            f,
            "functions over {LONG_FN} lines: {} in production code (src {}, crates {}), {} in dev",
            n("src") + n("crates"),
            n("src"),
            n("crates"),
            n("dev")
        )?;
        for place in ["src", "crates", "dev"] {
            for l in self.long_fns.get(place).into_iter().flatten() {
                writeln!(f, "  {:>4}  {}  {}:{}", l.lines, l.name, l.file, l.line)?;
            }
        }
        Ok(())
    }
}

fn public_line(p: &Public) -> String {
    let kinds: Vec<String> = p.items.iter().map(|(k, n)| format!("{k} {n}")).collect();
    format!(
        "total {:>3} = items {:>3} + methods {:>3}; testing {:>2}; fields {:>3}; pub mod {}/{}  ({})",
        p.total,
        p.item_count(),
        p.methods,
        p.testing,
        p.fields,
        p.pub_mods,
        p.mods,
        kinds.join(", ")
    )
}

fn kind_line(b: &KindBranches) -> String {
    format!(
        "match {} with {} arms, let {}, matches! {}; variant paths named {}",
        b.matches, b.arms, b.lets, b.matches_macros, b.variant_paths
    )
}
