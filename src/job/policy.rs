//! What producers may ask of a deployment: which models, which parameters and how large, how
//! many attempts and how far away a deadline. Everything else in a job is forwarded as it comes,
//! so this is where a deployment keeps a producer from choosing the most expensive model,
//! unbounded answers, streaming (which ends every paid call uncertain) or the organisation's
//! shared provider resources (`tools`, stored `prompt`s, `previous_response_id`).

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use super::{InvalidMessage, JobMessage, Millis};

/// The parameters that set the answer's ceiling, in every spelling a provider reads.
pub const OUTPUT_CEILINGS: [&str; 4] = [
    "max_tokens",
    "max_completion_tokens",
    "max_output_tokens",
    "maxTokens",
];

/// `ALLOWED_PARAMETERS` when unset: sampling, stop sequences, seeds and reasoning effort, and
/// the answer's ceiling up to 16,384 tokens. Not `stream`, `n`, `tools`,
/// `tool_choice`, `prompt`, `previous_response_id`, `store`, `background`, `service_tier`,
/// `user` or `metadata`.
pub(crate) const DEFAULT_ALLOWED_PARAMETERS: &str = "temperature<=2,top_p<=1,topP<=1,top_k,\
    max_tokens<=16384,max_completion_tokens<=16384,max_output_tokens<=16384,maxTokens<=16384,\
    stop,stopSequences,seed,presence_penalty,frequency_penalty,reasoning_effort,reasoning";

/// The answer's ceiling a job's input asks for: the largest of [`OUTPUT_CEILINGS`] in its
/// `parameters`, 0 when it sets none.
pub fn output_ceiling(input: &Map<String, Value>) -> u64 {
    let Some(Value::Object(parameters)) = input.get("parameters") else {
        return 0;
    };
    OUTPUT_CEILINGS
        .iter()
        .filter_map(|k| parameters.get(*k).and_then(Value::as_u64))
        .max()
        .unwrap_or(0)
}

/// The models jobs may name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Models {
    /// `*`: any model the provider account reaches.
    Any,
    /// Only these.
    Only(Vec<String>),
}

/// What producers may ask for. See `docs/security.md`.
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    /// `ALLOWED_MODELS`.
    pub models: Models,
    /// `ALLOWED_PARAMETERS`: each allowed name, with the largest number it may carry where it
    /// has a bound; `None` allows every parameter (`*`).
    pub parameters: Option<BTreeMap<String, Option<f64>>>,
    /// `MAX_ATTEMPTS_LIMIT`: the largest `max_attempts` a message may ask for.
    pub max_attempts: u32,
    /// `MAX_DEADLINE_SECONDS`, in milliseconds: the furthest `deadline_at` from a job's first
    /// sight.
    pub max_deadline_ms: Millis,
}

impl Default for Policy {
    /// Any model; the built-in parameters; 10 attempts; deadlines up to 7 days.
    fn default() -> Self {
        Policy {
            models: Models::Any,
            parameters: Some(parse_parameters(DEFAULT_ALLOWED_PARAMETERS).unwrap_or_default()),
            max_attempts: 10,
            max_deadline_ms: 7 * 86_400_000,
        }
    }
}

impl Policy {
    /// The models of a comma-separated list (`*` for any).
    pub fn parse_models(list: &str) -> Result<Models, String> {
        let names: Vec<String> = list
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect();
        if names.iter().any(|n| n == "*") {
            return Ok(Models::Any);
        }
        if names.is_empty() {
            return Err("names no model".to_owned());
        }
        Ok(Models::Only(names))
    }

    /// The parameters of a comma-separated list of names, each with an optional bound
    /// (`temperature<=2,max_tokens<=4096,seed`), or `*` for any.
    pub(crate) fn parse_parameters(
        list: &str,
    ) -> Result<Option<BTreeMap<String, Option<f64>>>, String> {
        if list.split(',').any(|p| p.trim() == "*") {
            return Ok(None);
        }
        parse_parameters(list).map(Some)
    }

    /// The answer's ceiling sent with a job that sets none of [`OUTPUT_CEILINGS`]: the smallest
    /// bound `ALLOWED_PARAMETERS` gives any of them (16,384 by default), so that no job's
    /// answer is bounded only by the model; 0 when none has a bound (`*`).
    pub(crate) fn default_output_tokens(&self) -> u64 {
        let Some(allowed) = &self.parameters else {
            return 0;
        };
        OUTPUT_CEILINGS
            .iter()
            .filter_map(|name| allowed.get(*name).copied().flatten())
            .map(|bound| bound.max(0.0).floor() as u64)
            .min()
            .unwrap_or(0)
    }

    /// The answer's ceiling a call for `input` is sent with: the job's, else
    /// [`Policy::default_output_tokens`] (0: none).
    pub fn output_tokens(&self, input: &Map<String, Value>) -> u64 {
        match output_ceiling(input) {
            0 => self.default_output_tokens(),
            asked => asked,
        }
    }

    /// Why this deployment refuses a job seen for the first time at `now`, if it does: a model,
    /// a parameter or a parameter's value it does not allow, more attempts or a later deadline
    /// than it allows. Errors name the field and the setting, never a value.
    pub fn refusal(&self, msg: &JobMessage, now: Millis) -> Option<InvalidMessage> {
        if msg.max_attempts.is_some_and(|n| n > self.max_attempts) {
            return Some(not_allowed("max_attempts", "more than MAX_ATTEMPTS_LIMIT"));
        }
        if msg
            .deadline_at
            .is_some_and(|at| at.saturating_sub(now) > self.max_deadline_ms)
        {
            return Some(not_allowed(
                "deadline_at",
                "further away than MAX_DEADLINE_SECONDS",
            ));
        }
        let input = msg.input_head();
        if let Models::Only(models) = &self.models {
            let model = input.model.as_ref().and_then(Value::as_str).unwrap_or("");
            if !models.iter().any(|m| m == model) {
                return Some(not_allowed("input.model", "not among ALLOWED_MODELS"));
            }
        }
        if let Some(Value::Object(parameters)) = &input.parameters {
            // A ceiling counts where it is read (the pacer, Bedrock) only as a whole number.
            for name in OUTPUT_CEILINGS {
                if parameters
                    .get(name)
                    .is_some_and(|v| v.as_u64().is_none_or(|n| n == 0))
                {
                    return Some(not_allowed(
                        &format!("input.parameters.{name}"),
                        "must be a whole number of tokens, 1 or more",
                    ));
                }
            }
        }
        let (Some(allowed), Some(Value::Object(parameters))) =
            (&self.parameters, &input.parameters)
        else {
            return None;
        };
        for (name, value) in parameters {
            let field = format!(
                "input.parameters.{}",
                super::message::field_name_for_logs(name)
            );
            match allowed.get(name) {
                None => {
                    return Some(InvalidMessage::NotAllowed {
                        field,
                        rule: "not among ALLOWED_PARAMETERS",
                    });
                }
                Some(Some(max)) if !value.as_f64().is_some_and(|v| v <= *max) => {
                    return Some(InvalidMessage::NotAllowed {
                        field,
                        rule: "must be a number within its bound in ALLOWED_PARAMETERS",
                    });
                }
                Some(_) => {}
            }
        }
        None
    }
}

fn not_allowed(field: &str, rule: &'static str) -> InvalidMessage {
    InvalidMessage::NotAllowed {
        field: field.to_owned(),
        rule,
    }
}

fn parse_parameters(list: &str) -> Result<BTreeMap<String, Option<f64>>, String> {
    let mut allowed = BTreeMap::new();
    for entry in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (name, max) = match entry.split_once("<=") {
            Some((name, max)) => {
                let max: f64 = max
                    .trim()
                    .parse()
                    .map_err(|_| format!("{entry:?}: the bound is not a number"))?;
                (name.trim(), Some(max))
            }
            None => (entry, None),
        };
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            return Err(format!("{entry:?}: not a parameter name"));
        }
        allowed.insert(name.to_owned(), max);
    }
    Ok(allowed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::parse_body;

    const NOW: Millis = 1_700_000_000_000;

    fn job(extra: &str, input: &str) -> JobMessage {
        parse_body(Some(&format!(
            r#"{{"job_id":"j","contract":"c","input":{{"model":"small","prompt":"p"{input}}}{extra}}}"#
        )))
        .expect("valid")
    }

    fn refused(policy: &Policy, msg: &JobMessage) -> Option<String> {
        policy.refusal(msg, NOW).map(|e| e.to_string())
    }

    #[test]
    fn the_default_allows_sampling_and_bounded_answers_but_not_streams_tools_or_many_answers() {
        let policy = Policy::default();
        let fine = job(
            "",
            r#","parameters":{"temperature":0.2,"max_tokens":4096,"seed":7,"stop":["\n"]}"#,
        );
        assert_eq!(refused(&policy, &fine), None);
        for (parameter, rule) in [
            (r#""stream":true"#, "not among ALLOWED_PARAMETERS"),
            (r#""n":5"#, "not among ALLOWED_PARAMETERS"),
            (r#""tools":[]"#, "not among ALLOWED_PARAMETERS"),
            (r#""prompt":{"id":"p"}"#, "not among ALLOWED_PARAMETERS"),
            (
                r#""previous_response_id":"r1""#,
                "not among ALLOWED_PARAMETERS",
            ),
            (
                r#""service_tier":"priority""#,
                "not among ALLOWED_PARAMETERS",
            ),
            (r#""max_tokens":1000000"#, "within its bound"),
            (r#""maxTokens":"lots""#, "whole number of tokens"),
            // A ceiling of 100.0 would be no ceiling where it is counted as a whole number.
            (r#""max_tokens":100.0"#, "whole number of tokens"),
            (r#""max_output_tokens":0"#, "whole number of tokens"),
        ] {
            let input = format!(r#","parameters":{{{parameter}}}"#);
            let why = refused(&policy, &job("", &input)).expect(parameter);
            assert!(why.contains(rule), "{parameter}: {why}");
            assert!(why.starts_with("field `input.parameters."), "{why}");
        }
    }

    #[test]
    fn models_attempts_and_deadlines_are_bounded_by_the_deployment() {
        let policy = Policy {
            models: Policy::parse_models("small, medium").expect("models"),
            max_attempts: 3,
            max_deadline_ms: 3_600_000,
            ..Policy::default()
        };
        assert_eq!(refused(&policy, &job(r#","max_attempts":3"#, "")), None);
        let large = job("", "").input_canonical.replace("small", "large");
        let mut other = job("", "");
        other.input_canonical = large;
        assert!(
            refused(&policy, &other)
                .expect("model")
                .contains("ALLOWED_MODELS")
        );
        assert!(
            refused(&policy, &job(r#","max_attempts":4"#, ""))
                .expect("attempts")
                .contains("MAX_ATTEMPTS_LIMIT")
        );
        let at = |ms: Millis| crate::job::message::format_rfc3339_ms(NOW + ms);
        let soon = job(&format!(r#","deadline_at":"{}""#, at(3_600_000)), "");
        assert_eq!(refused(&policy, &soon), None);
        let late = job(&format!(r#","deadline_at":"{}""#, at(3_601_000)), "");
        assert!(
            refused(&policy, &late)
                .expect("deadline")
                .contains("MAX_DEADLINE_SECONDS")
        );
        // `*` opens each list.
        let open = Policy {
            models: Policy::parse_models("*").expect("any"),
            parameters: Policy::parse_parameters("*").expect("any"),
            ..policy
        };
        assert_eq!(refused(&open, &other), None);
        assert_eq!(
            refused(&open, &job("", r#","parameters":{"stream":true}"#)),
            None
        );
    }

    #[test]
    fn lists_that_say_nothing_or_nonsense_are_refused() {
        assert!(Policy::parse_models(" , ").is_err());
        assert!(Policy::parse_parameters("max_tokens<=lots").is_err());
        assert!(Policy::parse_parameters("a b").is_err());
        let bounds = Policy::parse_parameters("max_tokens <= 512, seed").expect("parsed");
        assert_eq!(
            bounds.expect("listed").into_iter().collect::<Vec<_>>(),
            [
                ("max_tokens".to_owned(), Some(512.0)),
                ("seed".to_owned(), None)
            ]
        );
    }

    #[test]
    fn the_answers_ceiling_is_read_from_the_parameters_in_any_spelling() {
        let input =
            |text: &str| -> Map<String, Value> { serde_json::from_str(text).expect("json") };
        assert_eq!(
            output_ceiling(&input(r#"{"parameters":{"maxTokens":9}}"#)),
            9
        );
        assert_eq!(
            output_ceiling(&input(
                r#"{"parameters":{"max_tokens":9,"max_output_tokens":12}}"#
            )),
            12
        );
        assert_eq!(output_ceiling(&input(r#"{"max_tokens":9}"#)), 0);
    }

    #[test]
    fn a_job_that_sets_no_ceiling_is_sent_the_deployment_s_bound() {
        let input =
            |text: &str| -> Map<String, Value> { serde_json::from_str(text).expect("json") };
        let policy = Policy::default();
        assert_eq!(policy.default_output_tokens(), 16_384);
        assert_eq!(policy.output_tokens(&input(r#"{"prompt":"p"}"#)), 16_384);
        assert_eq!(
            policy.output_tokens(&input(r#"{"parameters":{"maxTokens":90}}"#)),
            90
        );
        // The smallest bound of any spelling; none where no spelling has one.
        let tight = Policy {
            parameters: Policy::parse_parameters("max_tokens<=8000,max_output_tokens<=512,seed")
                .expect("parsed"),
            ..Policy::default()
        };
        assert_eq!(tight.default_output_tokens(), 512);
        let unbounded = Policy {
            parameters: Policy::parse_parameters("max_tokens,seed").expect("parsed"),
            ..Policy::default()
        };
        assert_eq!(unbounded.default_output_tokens(), 0);
        let open = Policy {
            parameters: Policy::parse_parameters("*").expect("any"),
            ..Policy::default()
        };
        assert_eq!(open.default_output_tokens(), 0);
    }
}
