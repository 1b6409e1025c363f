use std::path::PathBuf;

use super::{fns, kinds, public, tokens, tree::SourceFile};

fn file(rel: &str, text: &str) -> SourceFile {
    SourceFile {
        rel: PathBuf::from(rel),
        module: "m".into(),
        ast: syn::parse_file(text).unwrap(),
        text: text.into(),
        test: false,
        testing: false,
        gated: false,
    }
}

/// Only `pub` counts, test modules never do, and the feature `testing` is told apart.
#[test]
fn public_declarations_are_exactly_pub_and_outside_tests() {
    let src = r#"
        pub fn a() {}
        pub(crate) fn b() {}
        pub struct S { pub x: u8, y: u8, pub(crate) z: u8 }
        pub struct T(pub u8, u8);
        impl S { pub fn m(&self) {} fn n() {} pub(crate) fn o() {} pub const C: u8 = 1; }
        impl Clone for S { fn clone(&self) -> Self { todo!() } }
        #[cfg(test)]
        mod tests { pub fn x() {} pub struct U { pub f: u8 } }
        #[cfg(feature = "testing")]
        pub mod t { pub fn y() {} }
        mod inner { pub use super::a; }
        macro_rules! gen { () => { pub fn g() {} } }
        gen!();
    "#;
    let p = public::count(&[file("crates/x/src/lib.rs", src)]);
    let items: Vec<(&str, usize)> = p.items.iter().map(|(k, n)| (k.as_str(), *n)).collect();
    let expected = [
        ("const", 1),
        ("fn", 2),
        ("mod", 1),
        ("struct", 2),
        ("use", 1),
    ];
    assert_eq!(items, expected, "{p:?}");
    assert_eq!(
        (p.methods, p.impl_consts_and_types, p.total, p.testing),
        (1, 1, 8, 2)
    );
    assert_eq!((p.fields, p.pub_mods, p.mods), (2, 1, 2));
    let mut test_file = file("crates/x/src/tests.rs", "pub fn z() {}");
    test_file.test = true;
    assert_eq!(public::count(&[test_file]).total, 0);
}

/// A `match`, `if let`, `let … else` and `matches!` on `Kind` count once each; building a `Kind`,
/// branching on another enum or in a test does not.
#[test]
fn branches_on_the_kind_are_counted_per_construct() {
    let src = r#"
        pub(crate) enum Kind { Dm(u8), Group { a: u8 }, FollowUp }
        fn f(k: Kind, o: Other) -> u8 {
            let made = Kind::Dm(1);
            let n = match k { Kind::Dm(_) => 1, Kind::Group { .. } => 2, Kind::FollowUp => 3 };
            if let Kind::Dm(x) = k { return x; }
            let Kind::Group { a } = k else { return 0 };
            let g = matches!(k, Kind::FollowUp);
            match o { Other::Dm => 0, _ => 1 }
        }
        #[cfg(test)]
        mod tests { fn t(k: Kind) -> bool { matches!(k, Kind::Dm(_)) } }
    "#;
    let census = kinds::count(&[file("src/pipeline/x.rs", src)], "src/pipeline");
    assert_eq!(census.variants, ["Dm", "Group", "FollowUp"]);
    assert_eq!(census.declared_at.as_deref(), Some("src/pipeline/x.rs:2"));
    let b = &census.files["src/pipeline/x.rs"];
    let got = (
        b.matches,
        b.lets,
        b.matches_macros,
        b.total,
        b.variant_paths,
    );
    assert_eq!(got, (1, 2, 1, 4, 6));
    assert_eq!((b.arms, b.branches), (3, 6));
    assert!(
        kinds::count(&[file("src/other.rs", src)], "src/pipeline")
            .files
            .is_empty()
    );
}

/// A function's length runs from its `fn` line to its closing brace; test functions are left out.
#[test]
fn functions_are_measured_from_fn_to_closing_brace() {
    let src = "/// doc\n#[inline]\npub fn a() {\n    let x = 1;\n}\nstruct App;\nimpl App {\n    fn build(\n    ) {\n    }\n}\n#[cfg(test)]\nfn t() {\n}\n";
    let got: Vec<(String, usize, usize)> = fns::lengths(&[file("src/m.rs", src)])
        .into_iter()
        .map(|f| (f.name, f.line, f.lines))
        .collect();
    assert_eq!(got, [("m::a".into(), 3, 3), ("App::build".into(), 8, 3)]);
}

/// Calls are counted by name, definitions and comments are not.
#[test]
fn starter_calls_are_counted_by_tokens() {
    let toks = tokens::of_text(
        "// start_worker()\nasync fn start_worker() {} fn t() { env.start_worker().await; \
         start_worker(); InProcessWorker::start(x); assert!(spawn_worker_process(&[]).ok()); \
         let a = env.app().await; env.app(1); let s = \"x.app()\"; a.clone(); }",
    );
    assert_eq!(tokens::calls(&toks, "start_worker"), 2);
    assert_eq!(tokens::path_calls(&toks, "InProcessWorker", "start"), 1);
    assert_eq!(tokens::calls(&toks, "spawn_worker_process"), 1);
    assert_eq!(tokens::bare_method_calls(&toks, "app"), 1);
    assert_eq!(tokens::bare_method_calls(&toks, "clone"), 1);
}

/// The walk follows `mod` declarations (`foo.rs`, `foo/mod.rs`, a nested `a/b.rs`, `#[path]`) and
/// marks the files declared under `#[cfg(test)]` or a feature.
#[test]
fn the_module_tree_is_walked_from_the_root_file() {
    let root = std::env::temp_dir().join(format!("census-walk-{}", std::process::id()));
    let src = root.join("src");
    std::fs::create_dir_all(src.join("a")).unwrap();
    std::fs::create_dir_all(src.join("d")).unwrap();
    let files = [
        (
            "lib.rs",
            "pub mod a; pub mod d; #[cfg(test)] mod t; \
             #[cfg(feature = \"testing\")] pub mod f; #[path = \"elsewhere.rs\"] mod p;",
        ),
        ("a.rs", "pub mod b;"),
        ("a/b.rs", ""),
        ("d/mod.rs", ""),
        ("t.rs", ""),
        ("f.rs", ""),
        ("elsewhere.rs", ""),
        ("orphan.rs", ""),
    ];
    for (name, text) in files {
        std::fs::write(src.join(name), text).unwrap();
    }
    let walked = super::tree::walk(&root, &super::tree::roots(&src)).unwrap();
    std::fs::remove_dir_all(&root).unwrap();
    let got: Vec<(String, &str, bool, bool)> = walked
        .iter()
        .map(|f| {
            (
                f.rel.display().to_string(),
                f.module.as_str(),
                f.test,
                f.testing,
            )
        })
        .collect();
    let expected = [
        ("src/lib.rs".to_owned(), "lib", false, false),
        ("src/a.rs".to_owned(), "a", false, false),
        ("src/a/b.rs".to_owned(), "b", false, false),
        ("src/d/mod.rs".to_owned(), "d", false, false),
        ("src/t.rs".to_owned(), "t", true, false),
        ("src/f.rs".to_owned(), "f", false, true),
        ("src/elsewhere.rs".to_owned(), "p", false, false),
    ];
    assert_eq!(got, expected);
    assert!(walked[5].gated && !walked[4].gated);
}

/// Issue 65 brought every function of production code and of the dev tooling to at most 80 lines; this
/// keeps it so, on this checkout: a function that grows past it fails here, named with file and line.
#[test]
fn no_function_of_this_workspace_is_over_80_lines() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("dev/ sits in the workspace");
    let census = super::take(root).expect("the census of this checkout");
    let long: Vec<_> = census.long_fns.values().flatten().collect();
    assert!(
        long.is_empty(),
        "functions over {} lines (split each where its story has parts): {long:#?}",
        super::LONG_FN
    );
}
