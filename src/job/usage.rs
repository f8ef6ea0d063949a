//! What a call used, in one vocabulary whatever the provider: the tokens each kind of price
//! applies to. Providers report usage in their own words (OpenAI's Chat Completions and
//! Responses, Bedrock's Converse); each is read into [`Usage`] here, and a call whose outcome is
//! unknown is counted at an estimate, marked as one.

use serde_json::Value;

/// The tokens one call used. `input` are the input tokens billed at the model's input price
/// (those neither read from nor written to a prompt cache); `cache_read` and `cache_write` are
/// billed at the cache's prices; `output` counts every token written, `reasoning` the part of
/// them the model spent thinking (already in `output`, shown apart).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, serde::Serialize)]
pub struct Usage {
    /// Input tokens at the input price.
    pub input: u64,
    /// Output tokens, reasoning included.
    pub output: u64,
    /// Input tokens read from the prompt cache.
    pub cache_read: u64,
    /// Input tokens written to the prompt cache.
    pub cache_write: u64,
    /// Of `output`, the reasoning tokens.
    pub reasoning: u64,
    /// Not reported by the provider: estimated (a call whose outcome is unknown).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub estimated: bool,
    /// What it cost, in micro-dollars, at the deployment's prices for the model (`None`: the
    /// price table does not price the model).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost_micros: Option<u64>,
    /// The tier the provider says it served the call at, when it said: it prices the call
    /// ([`Rate::served`]).
    #[serde(skip)]
    pub tier: Option<Rate>,
}

/// Bytes of input counted as one token in an estimate (the usual rule of thumb for English
/// text; exact counts come only from the provider).
pub(crate) const BYTES_PER_TOKEN: u64 = 4;

impl Usage {
    /// The usage an OpenAI `usage` object reports, from Chat Completions (`prompt_tokens`,
    /// `completion_tokens`, their `_details`) or the Responses API (`input_tokens`,
    /// `output_tokens`, their `_details`). OpenAI counts cached tokens inside the prompt's, and
    /// bills no cache writes. `None` when it reports nothing.
    pub fn from_openai(usage: &Value) -> Option<Usage> {
        let count = |path: &str| usage.pointer(path).and_then(Value::as_u64);
        let (prompt, completion, details, output_details) = match count("/input_tokens") {
            Some(input) => (
                input,
                count("/output_tokens"),
                "/input_tokens_details/cached_tokens",
                "/output_tokens_details/reasoning_tokens",
            ),
            None => (
                count("/prompt_tokens")?,
                count("/completion_tokens"),
                "/prompt_tokens_details/cached_tokens",
                "/completion_tokens_details/reasoning_tokens",
            ),
        };
        let cached = count(details).unwrap_or(0).min(prompt);
        Some(Usage {
            input: prompt - cached,
            output: completion.unwrap_or(0),
            cache_read: cached,
            cache_write: 0,
            reasoning: count(output_details).unwrap_or(0),
            estimated: false,
            cost_micros: None,
            tier: None,
        })
    }

    /// The usage Bedrock's Converse reports: its input tokens leave out the cache's, which it
    /// counts apart.
    pub fn from_bedrock(input: i32, output: i32, cache_read: i32, cache_write: i32) -> Usage {
        let count = |n: i32| u64::try_from(n).unwrap_or(0);
        Usage {
            input: count(input),
            output: count(output),
            cache_read: count(cache_read),
            cache_write: count(cache_write),
            reasoning: 0,
            estimated: false,
            cost_micros: None,
            tier: None,
        }
    }

    /// The usage an Anthropic `usage` object reports: its `input_tokens` leave out the cache's,
    /// which it counts apart (`cache_read_input_tokens`, `cache_creation_input_tokens`).
    /// `None` when it reports nothing.
    pub fn from_anthropic(usage: &Value) -> Option<Usage> {
        let count = |name: &str| usage.get(name).and_then(Value::as_u64);
        Some(Usage {
            input: count("input_tokens")?,
            output: count("output_tokens").unwrap_or(0),
            cache_read: count("cache_read_input_tokens").unwrap_or(0),
            cache_write: count("cache_creation_input_tokens").unwrap_or(0),
            reasoning: 0,
            estimated: false,
            cost_micros: None,
            tier: usage
                .get("service_tier")
                .and_then(Value::as_str)
                .and_then(Rate::reported),
        })
    }

    /// An estimate for a call whose outcome is unknown: its input at [`BYTES_PER_TOKEN`], and
    /// the whole answer its ceiling allowed (the most it can have cost).
    pub fn estimate(input_bytes: usize, output_ceiling: u64) -> Usage {
        Usage {
            input: (input_bytes as u64).div_ceil(BYTES_PER_TOKEN),
            output: output_ceiling,
            estimated: true,
            ..Usage::default()
        }
    }

    /// This usage and `other`, summed: estimated if either is, the cost of those priced.
    pub fn plus(&self, other: &Usage) -> Usage {
        Usage {
            input: self.input + other.input,
            output: self.output + other.output,
            cache_read: self.cache_read + other.cache_read,
            cache_write: self.cache_write + other.cache_write,
            reasoning: self.reasoning + other.reasoning,
            estimated: self.estimated || other.estimated,
            cost_micros: match (self.cost_micros, other.cost_micros) {
                (Some(a), Some(b)) => Some(a + b),
                (a, b) => a.or(b),
            },
            tier: self.tier.or(other.tier),
        }
    }

    /// This usage, served at the tier a provider's answer names (`tier`, its own word).
    pub fn served_at(self, tier: Option<&Value>) -> Usage {
        Usage {
            tier: tier.and_then(Value::as_str).and_then(Rate::reported),
            ..self
        }
    }

    /// Every token, of every kind.
    pub fn total(&self) -> u64 {
        self.input + self.output + self.cache_read + self.cache_write
    }
}

/// The rate a call is paid at: its provider's service tier, or its batch interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Rate {
    /// The on-demand prices.
    #[default]
    Standard,
    /// A line of a provider batch.
    Batch,
    /// The flex tier (`service_tier: flex`: OpenAI, Bedrock).
    Flex,
    /// The priority tier (`service_tier: priority`: OpenAI, Bedrock).
    Priority,
}

impl Rate {
    /// The rate of a call of the job of `input`: a batch line's, else the tier its
    /// `parameters.service_tier` asks for (`flex`, `priority`; any other value, Anthropic's
    /// `auto` and `standard_only` among them, is on-demand).
    pub fn of(batch: bool, input: &serde_json::Map<String, Value>) -> Rate {
        if batch {
            return Rate::Batch;
        }
        let tier = input
            .get("parameters")
            .and_then(|p| p.get("service_tier"))
            .and_then(Value::as_str);
        match tier {
            Some("flex") => Rate::Flex,
            Some("priority") => Rate::Priority,
            _ => Rate::Standard,
        }
    }

    /// A tier as a provider names the one it served a call at, in its answer: OpenAI's
    /// `service_tier` (`default`, `flex`, `priority`; API reference, "The response object"),
    /// Anthropic's `usage.service_tier` (`standard`, `priority`, `batch`; Messages API
    /// reference), Bedrock's `serviceTier.type` (`default`, `flex`, `priority`, `reserved`;
    /// Converse API reference). `None` for a name priced by none of our rates (OpenAI's
    /// `scale`, Bedrock's `reserved`: paid ahead, by other units).
    pub fn reported(tier: &str) -> Option<Rate> {
        match tier {
            "default" | "standard" => Some(Rate::Standard),
            "flex" => Some(Rate::Flex),
            "priority" => Some(Rate::Priority),
            "batch" => Some(Rate::Batch),
            _ => None,
        }
    }

    /// The rate a call asked at `self` is paid at, once the provider said which tier served
    /// it: the tier it says (a `priority` call the provider served at `default` is priced at
    /// the standard rate, an `auto` call served at `priority` at the priority rate), else the
    /// one asked for. A batch line keeps the batch prices whatever its answer names.
    pub(crate) fn served(self, reported: Option<Rate>) -> Rate {
        match (self, reported) {
            (Rate::Batch, _) | (_, None) => self,
            (_, Some(tier)) => tier,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn chat_completions_and_responses_read_into_one_vocabulary() {
        let chat = json!({
            "prompt_tokens": 1_200, "completion_tokens": 300, "total_tokens": 1_500,
            "prompt_tokens_details": {"cached_tokens": 1_024},
            "completion_tokens_details": {"reasoning_tokens": 256}
        });
        let expected = Usage {
            input: 176,
            output: 300,
            cache_read: 1_024,
            cache_write: 0,
            reasoning: 256,
            estimated: false,
            cost_micros: None,
            tier: None,
        };
        assert_eq!(Usage::from_openai(&chat), Some(expected));
        let responses = json!({
            "input_tokens": 1_200, "output_tokens": 300, "total_tokens": 1_500,
            "input_tokens_details": {"cached_tokens": 1_024},
            "output_tokens_details": {"reasoning_tokens": 256}
        });
        assert_eq!(Usage::from_openai(&responses), Some(expected));
        // Without details: nothing cached, no reasoning; without counts: nothing reported.
        let plain = Usage::from_openai(&json!({"prompt_tokens": 5, "completion_tokens": 2}));
        assert_eq!(
            plain.map(|u| (u.input, u.output, u.total())),
            Some((5, 2, 7))
        );
        assert_eq!(Usage::from_openai(&Value::Null), None);
        assert_eq!(Usage::from_openai(&json!({"total_tokens": 9})), None);
    }

    #[test]
    fn bedrock_and_anthropic_count_the_cache_apart_and_an_estimate_says_so() {
        let u = Usage::from_bedrock(9, 1, 100, 20);
        assert_eq!(
            (u.input, u.output, u.cache_read, u.cache_write),
            (9, 1, 100, 20)
        );
        assert_eq!(Usage::from_bedrock(-1, 0, 0, 0).input, 0);
        // Anthropic counts the cache apart too, in its own names.
        let a = Usage::from_anthropic(&json!({
            "input_tokens": 9, "output_tokens": 1, "cache_read_input_tokens": 100,
            "cache_creation_input_tokens": 20, "service_tier": "standard"
        }));
        // ... and says which tier served the call.
        assert_eq!(
            a,
            Some(Usage {
                tier: Some(Rate::Standard),
                ..u
            })
        );
        assert_eq!(Usage::from_anthropic(&json!({"output_tokens": 1})), None);
        let guess = Usage::estimate(4_001, 16_384);
        assert_eq!(
            (guess.input, guess.output, guess.estimated),
            (1_001, 16_384, true)
        );
        assert_eq!(
            serde_json::to_value(guess).expect("json")["estimated"],
            true
        );
        assert!(
            serde_json::to_value(u)
                .expect("json")
                .get("estimated")
                .is_none()
        );
    }
}
