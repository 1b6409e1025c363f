//! JSON Lines files of the dev tooling's data sets (the labelled and frozen safety sets, the held-out
//! embedding texts): one object a line, blank lines skipped, a bad line named by its number.

use std::path::Path;

use anyhow::Context;
use serde::de::DeserializeOwned;

/// Every non-blank line of `path`, parsed.
pub fn read<T: DeserializeOwned>(path: &Path) -> anyhow::Result<Vec<T>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    text.lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(i, line)| {
            serde_json::from_str(line).with_context(|| format!("{}:{}", path.display(), i + 1))
        })
        .collect()
}
