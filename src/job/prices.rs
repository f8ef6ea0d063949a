//! What a call cost: a price table turns an attempt's [`Usage`] into micro-dollars. The table
//! is `prices/prices.json`, built in with the providers' list prices and the date they were
//! taken; a deployment adds models or overrides prices with a file of the same shape
//! (`PRICES_FILE`). Prices are read as micro-dollars per million tokens, so that costs add up
//! in integers.

use std::collections::BTreeMap;

use serde_json::Value;

use super::usage::Usage;

pub use super::usage::Rate;

/// The built-in table.
const BUILT_IN: &str = include_str!("../../prices/prices.json");

/// The largest spend limit anything takes, in USD.
pub(crate) const MAX_LIMIT_USD: f64 = 1_000_000.0;

/// A spend limit in USD (`max_cost`, `DEFAULT_MAX_COST`, `DAILY_SPEND_LIMIT`) in micro-dollars:
/// `None` unless above 0 and at most [`MAX_LIMIT_USD`].
pub(crate) fn limit_micros(usd: f64) -> Option<u64> {
    (usd > 0.0 && usd <= MAX_LIMIT_USD).then(|| ((usd * 1_000_000.0).round() as u64).max(1))
}

/// One model's prices, each in micro-dollars per million tokens (`2.50` USD is `2_500_000`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Price {
    /// Input tokens at the input price.
    pub input: u64,
    /// Output tokens.
    pub output: u64,
    /// Input tokens read from the prompt cache (the input price where the table gives none).
    pub cache_read: u64,
    /// Input tokens written to the prompt cache (the input price where the table gives none).
    pub cache_write: u64,
    /// Input tokens of a batch call (the input price where the table gives none).
    pub batch_input: u64,
    /// Output tokens of a batch call (the output price where the table gives none).
    pub batch_output: u64,
    /// Input and output tokens of a call on the flex tier (the batch prices where the table
    /// gives none: OpenAI prices Flex processing at its Batch API rates).
    pub flex: Option<(u64, u64)>,
    /// Input and output tokens of a call on the priority tier (`None`: the table does not
    /// price it, and such a call is unpriced).
    pub priority: Option<(u64, u64)>,
}

impl Price {
    /// What `usage` cost at these prices, in micro-dollars, rounded up; `batch` for a call made
    /// through the provider's batch interface.
    pub fn cost_micros(&self, usage: &Usage, batch: bool) -> u64 {
        let rate = if batch { Rate::Batch } else { Rate::Standard };
        self.cost_at(usage, rate).unwrap_or(u64::MAX)
    }

    /// What `usage` cost at `rate`, in micro-dollars, rounded up; `None` at a tier these
    /// prices do not cover (priority without its prices).
    pub fn cost_at(&self, usage: &Usage, rate: Rate) -> Option<u64> {
        let (input, output) = match rate {
            Rate::Standard => (self.input, self.output),
            Rate::Batch => (self.batch_input, self.batch_output),
            Rate::Flex => self.flex.unwrap_or((self.batch_input, self.batch_output)),
            Rate::Priority => self.priority?,
        };
        // Another rate moves the cache's prices as it moves the input's.
        let scaled = |price: u64| {
            let scaled = u128::from(price) * u128::from(input) / u128::from(self.input.max(1));
            u64::try_from(scaled).unwrap_or(price)
        };
        let (cache_read, cache_write) = (scaled(self.cache_read), scaled(self.cache_write));
        let nano = |tokens: u64, price: u64| u128::from(tokens) * u128::from(price);
        let total = nano(usage.input, input)
            + nano(usage.output, output)
            + nano(usage.cache_read, cache_read)
            + nano(usage.cache_write, cache_write);
        Some(u64::try_from(total.div_ceil(1_000_000)).unwrap_or(u64::MAX))
    }
}

/// The price table: models by the id a job names (or the provider is configured with).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PriceTable {
    /// When the built-in prices were taken (the file's `as_of`).
    pub as_of: String,
    models: BTreeMap<String, Price>,
}

impl Default for PriceTable {
    fn default() -> Self {
        PriceTable::built_in()
    }
}

impl PriceTable {
    /// The table built in from `prices/prices.json`.
    pub fn built_in() -> PriceTable {
        // The file is part of the build and checked by a test: it parses.
        PriceTable::parse(BUILT_IN).unwrap_or_else(|_| PriceTable {
            as_of: String::new(),
            models: BTreeMap::new(),
        })
    }

    /// A table from the text of a prices file (`{"as_of", "models": {id: {"input", "output",
    /// "cache_read", "cache_write", "batch_input", "batch_output"}}}`, USD per million tokens).
    pub fn parse(text: &str) -> Result<PriceTable, String> {
        let file: Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
        let Some(models) = file.get("models").and_then(Value::as_object) else {
            return Err("no `models` object".to_owned());
        };
        let mut table = BTreeMap::new();
        for (id, prices) in models {
            table.insert(id.clone(), price_of(id, prices)?);
        }
        Ok(PriceTable {
            as_of: file
                .get("as_of")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
            models: table,
        })
    }

    /// This table with `other`'s models added over its own (a deployment's file over the
    /// built-in table); `other`'s date where it gives one.
    pub fn with(mut self, other: PriceTable) -> PriceTable {
        self.models.extend(other.models);
        if !other.as_of.is_empty() {
            self.as_of = other.as_of;
        }
        self
    }

    /// The prices of `model`: its own entry, else the entry of the model a Bedrock
    /// cross-Region inference profile names (`us.anthropic...` is `anthropic...`), else the
    /// entry it is a dated snapshot of: the entry, a hyphen and a date, OpenAI's
    /// (`gpt-4.1-mini-2025-04-14` is `gpt-4.1-mini`) or Anthropic's (`claude-haiku-4-5-20251001`
    /// is `claude-haiku-4-5`). Any other suffix names another model (`o3-pro` is not `o3`,
    /// `gpt-5-mini` not `gpt-5`), priced only by its own entry.
    pub fn price(&self, model: &str) -> Option<&Price> {
        if let Some(price) = self.models.get(model) {
            return Some(price);
        }
        if let Some((region, rest)) = model.split_once('.')
            && (2..=7).contains(&region.len())
            && region.chars().all(|c| c.is_ascii_lowercase() || c == '-')
            && let Some(price) = self.models.get(rest)
        {
            return Some(price);
        }
        dated_base(model).and_then(|base| self.models.get(base))
    }

    /// What `usage` of `model` cost, in micro-dollars; `None` for a model the table does not
    /// price.
    pub fn cost_micros(&self, model: &str, usage: &Usage, batch: bool) -> Option<u64> {
        self.price(model).map(|p| p.cost_micros(usage, batch))
    }

    /// What `usage` of `model` cost at `rate`, in micro-dollars; `None` for a model, or a tier
    /// of it, the table does not price.
    pub fn cost_at(&self, model: &str, usage: &Usage, rate: Rate) -> Option<u64> {
        self.price(model)?.cost_at(usage, rate)
    }
}

/// The model a dated snapshot's id names: `model` less a final `-YYYYMMDD` (Anthropic's
/// snapshots) or `-YYYY-MM-DD` (OpenAI's); `None` for any other id.
fn dated_base(model: &str) -> Option<&str> {
    let digits = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_digit());
    let (base, last) = model.rsplit_once('-')?;
    if digits(last, 8) {
        return Some(base);
    }
    let (base, month) = base.rsplit_once('-')?;
    let (base, year) = base.rsplit_once('-')?;
    (digits(year, 4) && digits(month, 2) && digits(last, 2)).then_some(base)
}

/// One model's entry, in USD per million tokens, read as micro-dollars per million tokens.
fn price_of(id: &str, prices: &Value) -> Result<Price, String> {
    let field = |name: &str| -> Result<Option<u64>, String> {
        match prices.get(name) {
            None => Ok(None),
            Some(v) => match v.as_f64() {
                Some(usd) if (0.0..1_000_000.0).contains(&usd) => {
                    Ok(Some((usd * 1_000_000.0).round() as u64))
                }
                _ => Err(format!(
                    "{id:?}: `{name}` is not a price in USD per million tokens"
                )),
            },
        }
    };
    let (Some(input), Some(output)) = (field("input")?, field("output")?) else {
        return Err(format!("{id:?}: `input` and `output` are required"));
    };
    // A tier's prices come as a pair, `<tier>_input` and `<tier>_output`, or not at all.
    let tier = |name: &str| -> Result<Option<(u64, u64)>, String> {
        match (
            field(&format!("{name}_input"))?,
            field(&format!("{name}_output"))?,
        ) {
            (Some(i), Some(o)) => Ok(Some((i, o))),
            (None, None) => Ok(None),
            _ => Err(format!(
                "{id:?}: `{name}_input` and `{name}_output` come together"
            )),
        }
    };
    Ok(Price {
        input,
        output,
        cache_read: field("cache_read")?.unwrap_or(input),
        cache_write: field("cache_write")?.unwrap_or(input),
        batch_input: field("batch_input")?.unwrap_or(input),
        batch_output: field("batch_output")?.unwrap_or(output),
        flex: tier("flex")?,
        priority: tier("priority")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage(input: u64, output: u64, cache_read: u64, cache_write: u64) -> Usage {
        Usage {
            input,
            output,
            cache_read,
            cache_write,
            ..Usage::default()
        }
    }

    #[test]
    fn anthropics_own_model_ids_are_priced_as_on_bedrock() {
        let table = PriceTable::built_in();
        let usage = Usage {
            input: 1_000_000,
            output: 1_000_000,
            ..Usage::default()
        };
        let bedrock = table.cost_micros("anthropic.claude-haiku-4-5-20251001-v1:0", &usage, false);
        assert_eq!(
            table.cost_micros("claude-haiku-4-5-20251001", &usage, false),
            bedrock
        );
        assert_eq!(
            table.cost_micros("claude-haiku-4-5", &usage, false),
            Some(6_000_000)
        );
        // The longest id that is a prefix decides: Sonnet 4.5 is not Sonnet 4.
        assert!(table.price("claude-sonnet-4-5-20250929").is_some());
    }

    #[test]
    fn the_built_in_table_parses_and_prices_the_models_the_providers_name() {
        let table = PriceTable::parse(BUILT_IN).expect("the built-in table parses");
        assert_eq!(table, PriceTable::built_in());
        assert!(!table.as_of.is_empty());
        for model in [
            "gpt-4.1-mini",
            "gpt-4o",
            "anthropic.claude-sonnet-4-20250514-v1:0",
        ] {
            assert!(table.price(model).is_some(), "{model}");
        }
        // 1,000 tokens in and 500 out of gpt-4.1 ($2 and $8 a million): $0.006.
        assert_eq!(
            table.cost_micros("gpt-4.1", &usage(1_000, 500, 0, 0), false),
            Some(6_000)
        );
        // Half that through the batch interface, the cache's tokens too.
        assert_eq!(
            table.cost_micros("gpt-4.1", &usage(1_000, 500, 0, 0), true),
            Some(3_000)
        );
        let cached = usage(0, 0, 1_000_000, 0);
        let direct = table
            .cost_micros("gpt-4.1", &cached, false)
            .expect("priced");
        assert_eq!(
            table.cost_micros("gpt-4.1", &cached, true),
            Some(direct / 2)
        );
    }

    #[test]
    fn a_service_tier_is_priced_at_its_own_rows_flex_else_at_batch_prices() {
        let table = PriceTable::parse(
            r#"{"models": {
                "m": {"input": 2.0, "output": 8.0, "cache_read": 0.5, "batch_input": 1.0,
                      "batch_output": 4.0, "priority_input": 3.5, "priority_output": 14.0},
                "n": {"input": 2.0, "output": 8.0, "flex_input": 0.9, "flex_output": 3.6}
            }}"#,
        )
        .expect("parses");
        let used = usage(1_000, 500, 0, 0);
        assert_eq!(table.cost_at("m", &used, Rate::Standard), Some(6_000));
        assert_eq!(
            table.cost_at("m", &used, Rate::Priority),
            Some(3_500 + 7_000)
        );
        // Flex without rows of its own is paid at the batch prices (OpenAI's rule).
        assert_eq!(table.cost_at("m", &used, Rate::Flex), Some(3_000));
        assert_eq!(table.cost_at("n", &used, Rate::Flex), Some(900 + 1_800));
        // Priority without its prices is not priced; a cache read moves with the input's rate.
        assert_eq!(table.cost_at("n", &used, Rate::Priority), None);
        let cached = usage(0, 0, 1_000_000, 0);
        assert_eq!(table.cost_at("m", &cached, Rate::Priority), Some(875_000));
        // A tier's prices come in pairs.
        let half = r#"{"models": {"m": {"input": 1, "output": 1, "priority_input": 2}}}"#;
        assert!(PriceTable::parse(half).is_err());
        // The tier a job's parameters ask for; a batch line is a batch line.
        let input = |tier: &str| {
            serde_json::json!({"parameters": {"service_tier": tier}})
                .as_object()
                .cloned()
                .expect("object")
        };
        assert_eq!(Rate::of(false, &input("priority")), Rate::Priority);
        assert_eq!(Rate::of(false, &input("flex")), Rate::Flex);
        assert_eq!(Rate::of(false, &input("auto")), Rate::Standard);
        assert_eq!(Rate::of(true, &input("priority")), Rate::Batch);
    }

    #[test]
    fn cache_reads_and_writes_are_priced_apart_and_fractions_round_up() {
        let table = PriceTable::built_in();
        // Claude Sonnet 4 on Bedrock: $3 in, $15 out, $0.30 cache read, $3.75 cache write.
        let sonnet = "anthropic.claude-sonnet-4-20250514-v1:0";
        let cost = table.cost_micros(sonnet, &usage(100, 10, 10_000, 1_000), false);
        assert_eq!(cost, Some(300 + 150 + 3_000 + 3_750));
        // 7 tokens of nova-micro input ($0.035 a million) is a fraction of a micro-dollar:
        // counted as one.
        assert_eq!(
            table.cost_micros("amazon.nova-micro-v1:0", &usage(7, 0, 0, 0), false),
            Some(1)
        );
        assert_eq!(
            table.cost_micros("gpt-4.1", &Usage::default(), false),
            Some(0)
        );
    }

    #[test]
    fn profiles_and_dated_versions_find_their_model_and_unknown_ones_none() {
        let table = PriceTable::built_in();
        let base = table.price("anthropic.claude-sonnet-4-20250514-v1:0");
        assert_eq!(
            table.price("us.anthropic.claude-sonnet-4-20250514-v1:0"),
            base
        );
        assert_eq!(
            table.price("global.anthropic.claude-sonnet-4-20250514-v1:0"),
            base
        );
        assert_eq!(
            table.price("gpt-4.1-mini-2025-04-14"),
            table.price("gpt-4.1-mini")
        );
        assert_eq!(
            table.price("claude-3-5-haiku-20241022"),
            table.price("claude-3-5-haiku")
        );
        assert_ne!(table.price("gpt-4.1-mini"), table.price("gpt-4.1"));
        assert_eq!(table.price("gpt-4.1x"), None);
        // Another suffix is another model, however alike its name: `o3-pro` costs about ten
        // times `o3`, and a snapshot of a model the table lacks is not its base's.
        for other in [
            "o3-pro",
            "gpt-5-pro",
            "gpt-4o-audio-preview",
            "o3-deep-research-2025-06-26",
            "gpt-4.1-2025",
            "claude-sonnet-4-5-latest",
            "gpt-4.1-mini-2025-4-14",
        ] {
            assert_eq!(table.price(other), None, "{other}");
        }
        assert_eq!(
            table.cost_micros("a-model-nobody-priced", &Usage::default(), false),
            None
        );
    }

    #[test]
    fn a_deployment_s_file_overrides_and_adds_and_a_bad_one_is_refused() {
        let own = PriceTable::parse(
            r#"{"as_of": "2026-12-01", "models": {
                "gpt-4.1": {"input": 1.0, "output": 4.0},
                "in-house-7b": {"input": 0.01, "output": 0.02}}}"#,
        )
        .expect("parses");
        let table = PriceTable::built_in().with(own);
        assert_eq!(table.as_of, "2026-12-01");
        let gpt = table.price("gpt-4.1").expect("priced");
        assert_eq!(
            (gpt.input, gpt.output, gpt.cache_read),
            (1_000_000, 4_000_000, 1_000_000)
        );
        assert_eq!(gpt.batch_output, 4_000_000);
        assert!(table.price("in-house-7b").is_some());
        assert!(table.price("gpt-4o").is_some(), "the others stay");
        for bad in [
            "[]",
            r#"{"models": {"m": {"input": 1.0}}}"#,
            r#"{"models": {"m": {"input": -1.0, "output": 1.0}}}"#,
            r#"{"models": {"m": {"input": "1", "output": 1.0}}}"#,
        ] {
            assert!(PriceTable::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_tier_an_answer_names_prices_the_call_over_the_one_asked_for() {
        // Served below what was asked, or above it: the answer's word prices the call.
        assert_eq!(
            Rate::Priority.served(Rate::reported("default")),
            Rate::Standard
        );
        assert_eq!(
            Rate::Standard.served(Rate::reported("priority")),
            Rate::Priority
        );
        assert_eq!(Rate::Flex.served(Rate::reported("flex")), Rate::Flex);
        // Anthropic's words.
        assert_eq!(
            Rate::Priority.served(Rate::reported("standard")),
            Rate::Standard
        );
        // Nothing said, or a tier no rate prices: the tier asked for.
        assert_eq!(Rate::Priority.served(None), Rate::Priority);
        assert_eq!(Rate::Flex.served(Rate::reported("scale")), Rate::Flex);
        // A batch line stays at the batch prices.
        assert_eq!(Rate::Batch.served(Rate::reported("default")), Rate::Batch);
        let anthropic = serde_json::json!({"input_tokens": 10, "output_tokens": 2,
                                           "service_tier": "priority"});
        assert_eq!(
            Usage::from_anthropic(&anthropic).and_then(|u| u.tier),
            Some(Rate::Priority)
        );
    }
}
