//! Counting by tokens, where the syntax tree does not reach (a macro's arguments are only tokens) or
//! where tokens are simpler: calls named by an identifier, `.clone()`, `Kind::Variant` paths. Comments
//! are not tokens and string literals are one token each, so neither counts.

use proc_macro2::{Delimiter, TokenStream, TokenTree};

/// A token, with groups flattened into an opening, their tokens, and a closing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Tok {
    /// An identifier or keyword.
    Ident(String),
    /// A punctuation character (`::` is two).
    Punct(char),
    /// A group's opening: its delimiter and whether the group is empty.
    Open(Delimiter, bool),
    /// A group's closing.
    Close,
    /// A literal.
    Lit,
}

/// The tokens of a stream, groups flattened.
pub fn flatten(stream: TokenStream) -> Vec<Tok> {
    let mut out = Vec::new();
    push(stream, &mut out);
    out
}

fn push(stream: TokenStream, out: &mut Vec<Tok>) {
    for tree in stream {
        match tree {
            TokenTree::Ident(i) => out.push(Tok::Ident(i.to_string())),
            TokenTree::Punct(p) => out.push(Tok::Punct(p.as_char())),
            TokenTree::Literal(_) => out.push(Tok::Lit),
            TokenTree::Group(g) => {
                out.push(Tok::Open(g.delimiter(), g.stream().is_empty()));
                push(g.stream(), out);
                out.push(Tok::Close);
            }
        }
    }
}

/// The tokens of a source text (empty if it does not tokenize).
pub fn of_text(text: &str) -> Vec<Tok> {
    text.parse::<TokenStream>().map(flatten).unwrap_or_default()
}

fn ident(t: &Tok, name: &str) -> bool {
    matches!(t, Tok::Ident(i) if i == name)
}

fn parens(t: &Tok) -> bool {
    matches!(t, Tok::Open(Delimiter::Parenthesis, _))
}

/// Calls of a function or method named `name` (`name(…)`, `x.name(…)`, `a::name(…)`), not its
/// definition (`fn name(`).
pub fn calls(toks: &[Tok], name: &str) -> usize {
    (0..toks.len().saturating_sub(1))
        .filter(|&i| ident(&toks[i], name) && parens(&toks[i + 1]))
        .filter(|&i| i == 0 || !ident(&toks[i - 1], "fn"))
        .count()
}

/// Calls of the path `ty::name(…)`.
pub fn path_calls(toks: &[Tok], ty: &str, name: &str) -> usize {
    toks.windows(5)
        .filter(|w| {
            ident(&w[0], ty)
                && w[1] == Tok::Punct(':')
                && w[2] == Tok::Punct(':')
                && ident(&w[3], name)
                && parens(&w[4])
        })
        .count()
}

/// Method calls `.name()` without arguments.
pub fn bare_method_calls(toks: &[Tok], name: &str) -> usize {
    toks.windows(3)
        .filter(|w| {
            w[0] == Tok::Punct('.')
                && ident(&w[1], name)
                && w[2] == Tok::Open(Delimiter::Parenthesis, true)
        })
        .count()
}

/// Paths `ty::V` where `V` is one of `variants` (any variant when `variants` is empty).
pub fn variant_paths(toks: &[Tok], ty: &str, variants: &[String]) -> usize {
    toks.windows(4)
        .filter(|w| {
            ident(&w[0], ty)
                && w[1] == Tok::Punct(':')
                && w[2] == Tok::Punct(':')
                && match &w[3] {
                    Tok::Ident(v) => variants.is_empty() || variants.contains(v),
                    _ => false,
                }
        })
        .count()
}
