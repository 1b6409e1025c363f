//! What a model call costs: the price table (`LLM_PRICES`) that estimates a cost the server did not
//! report, and the [`Cost`] of one response.
//!
//! OpenRouter reports the charge of every response in `usage.cost` (its usage-accounting docs: the old
//! request option `usage: {include: true}` is deprecated and has no effect), so the worker sends nothing
//! extra and other OpenAI-compatible servers get a plain request. A response without `cost` is priced
//! from `LLM_PRICES`; a model missing there is `unpriced` (cost unknown).

use std::{collections::BTreeMap, str::FromStr};

use serde::{Deserialize, Serialize};

use super::Usage;

/// USD per million tokens of one model.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Price {
    pub(crate) prompt: f64,
    pub(crate) completion: f64,
}

/// Prices by model, from `LLM_PRICES` (`model=prompt:completion,…`, USD per million tokens).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Prices(BTreeMap<String, Price>);

#[derive(Debug, thiserror::Error)]
#[error("price `{entry}` is not `model=prompt:completion` (USD per million tokens, both ≥ 0)")]
pub struct PriceError {
    entry: String,
}

impl std::fmt::Display for Prices {
    /// The `LLM_PRICES` form, which `FromStr` reads back.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, (model, p)) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{model}={}:{}", p.prompt, p.completion)?;
        }
        Ok(())
    }
}

impl FromStr for Prices {
    type Err = PriceError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut out = BTreeMap::new();
        for entry in s.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let bad = || PriceError {
                entry: entry.to_owned(),
            };
            // Model names contain `:` (`…:free`), so the price is after the last `=`.
            let (model, price) = entry.rsplit_once('=').ok_or_else(bad)?;
            let (p, c) = price.split_once(':').ok_or_else(bad)?;
            let num = |v: &str| {
                v.trim()
                    .parse::<f64>()
                    .ok()
                    .filter(|x| x.is_finite() && *x >= 0.0)
            };
            let (Some(prompt), Some(completion)) = (num(p), num(c)) else {
                return Err(bad());
            };
            let model = model.trim();
            if model.is_empty() {
                return Err(bad());
            }
            out.insert(model.to_owned(), Price { prompt, completion });
        }
        Ok(Self(out))
    }
}

/// Where a call's cost comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CostSource {
    /// The server's `usage.cost`.
    Reported,
    /// Tokens × the price table.
    Estimated,
    /// Neither: the cost is unknown.
    Unpriced,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Cost {
    pub(crate) usd: Option<f64>,
    pub(crate) source: CostSource,
}

/// What one paid call used and cost, as the journal keeps it with the model's answer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CallUsage {
    /// The model that answered (the server's `model`, else the one asked).
    pub model: String,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    /// Prompt tokens served from the provider's prompt cache, when it says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_tokens: Option<u64>,
    /// Estimated tokens of the request's prefix that stays the same across users and turns (the tool
    /// definitions and the system prompt): what a provider can cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix_tokens: Option<u64>,
    /// USD; `None` when unpriced.
    pub cost_usd: Option<f64>,
    pub cost_source: CostSource,
    /// The scripted offline model answered ([`crate::SCRIPTED_PROVIDER`]): no real model, no price.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub scripted: bool,
}

impl Prices {
    /// The usage record of one response with `usage`, answered by `model`.
    pub(crate) fn call_usage(&self, model: &str, usage: &Usage) -> CallUsage {
        let cost = self.cost(model, usage);
        CallUsage {
            model: model.to_owned(),
            prompt_tokens: usage.prompt_tokens,
            completion_tokens: usage.completion_tokens,
            cached_tokens: usage
                .prompt_tokens_details
                .as_ref()
                .map(|d| d.cached_tokens),
            prefix_tokens: None,
            cost_usd: cost.usd,
            cost_source: cost.source,
            scripted: false,
        }
    }

    /// The cost of one response with `usage`, answered by `model`.
    pub(crate) fn cost(&self, model: &str, usage: &Usage) -> Cost {
        if let Some(c) = usage.cost.filter(|c| c.is_finite() && *c >= 0.0) {
            return Cost {
                usd: Some(c),
                source: CostSource::Reported,
            };
        }
        match self.0.get(model) {
            Some(p) => Cost {
                usd: Some(
                    (usage.prompt_tokens as f64 * p.prompt
                        + usage.completion_tokens as f64 * p.completion)
                        / 1e6,
                ),
                source: CostSource::Estimated,
            },
            None => Cost {
                usd: None,
                source: CostSource::Unpriced,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage(prompt: u64, completion: u64, cost: Option<f64>) -> Usage {
        Usage {
            prompt_tokens: prompt,
            completion_tokens: completion,
            total_tokens: prompt + completion,
            cost,
            prompt_tokens_details: None,
        }
    }

    #[test]
    fn prices_parse_and_price_calls() {
        let p: Prices = "google/gemini-2.0-flash-001=0.10:0.40, meta/llama:free=0:0"
            .parse()
            .unwrap();
        let c = p.cost(
            "google/gemini-2.0-flash-001",
            &usage(1_000_000, 500_000, None),
        );
        assert_eq!(c.source, CostSource::Estimated);
        assert!((c.usd.unwrap() - 0.30).abs() < 1e-12);
        assert_eq!(
            p.cost("meta/llama:free", &usage(10, 10, None)).usd,
            Some(0.0)
        );
        let reported = p.cost("google/gemini-2.0-flash-001", &usage(1, 1, Some(0.5)));
        assert_eq!(reported.source, CostSource::Reported);
        assert_eq!(reported.usd, Some(0.5));
        let unknown = p.cost("other/model", &usage(10, 10, None));
        assert_eq!(unknown.source, CostSource::Unpriced);
        assert_eq!(unknown.usd, None);
        assert_eq!("".parse::<Prices>().unwrap(), Prices::default());
        for bad in ["m", "m=1", "m=a:b", "=1:2", "m=-1:2", "m=1:NaN"] {
            assert!(bad.parse::<Prices>().is_err(), "{bad}");
        }
    }
}
