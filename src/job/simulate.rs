//! `input.simulate`: the controls of the simulated provider, part of the message contract (a
//! body whose controls are wrong is poison whichever provider runs; only the simulated provider
//! acts on them).

use serde_json::{Map, Value};

use super::InvalidMessage;

/// The longest simulated latency (one hour).
pub(crate) const MAX_SIMULATED_LATENCY_MS: u64 = 3_600_000;
const SIMULATE_FIELDS: [&str; 8] = [
    "latency_ms",
    "outcome",
    "fail_times",
    "retrievable",
    "answer_bytes",
    "output",
    "bad_answer",
    "bad_times",
];
/// The largest simulated `output`, encoded.
const MAX_SIMULATED_OUTPUT_BYTES: usize = 64 * 1024;
/// The largest simulated answer padding.
pub(crate) const MAX_SIMULATED_ANSWER_BYTES: u64 = 2_000_000;

/// Simulated-provider controls read from `input.simulate`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Simulation {
    /// How long the simulated call takes.
    pub latency_ms: u64,
    /// What the call ends with once `fail_times` transient errors are spent.
    pub outcome: SimulatedOutcome,
    /// Transient errors returned before the outcome (attempts 1..=fail_times fail).
    pub fail_times: u32,
    /// Whether the provider can be asked about an attempt afterwards (default true).
    pub retrievable: bool,
    /// Padding added to the answer's output, to make large answers (default 0).
    pub answer_bytes: usize,
    /// What the model answers (a string as it is, any other value as its JSON text); absent,
    /// a deterministic text.
    pub output: Option<Value>,
    /// How the first `bad_times` attempts answer instead, if badly.
    pub bad_answer: Option<BadAnswer>,
    /// Attempts `1..=bad_times` answer badly (absent: every attempt).
    pub bad_times: u32,
}

/// A simulated answer that is not the one its job asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BadAnswer {
    /// The output cut in half, the model out of tokens (finish `length`).
    Truncated,
    /// A complete JSON answer that few schemas accept: `{"unexpected": true}`.
    Invalid,
}

impl Default for Simulation {
    fn default() -> Self {
        Simulation {
            latency_ms: 0,
            outcome: SimulatedOutcome::Ok,
            fail_times: 0,
            retrievable: true,
            answer_bytes: 0,
            output: None,
            bad_answer: None,
            bad_times: u32::MAX,
        }
    }
}

/// The end of a simulated call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum SimulatedOutcome {
    /// A deterministic answer.
    #[default]
    Ok,
    /// A transient error (rate limit, 5xx before acceptance).
    Transient,
    /// A permanent error (the request is rejected).
    Permanent,
    /// The call never returns.
    Hang,
    /// The provider is overloaded and refuses before any work (Anthropic's 529).
    Overloaded,
    /// The provider account's spend limit is reached: refused before any work, and waiting
    /// does not clear it (Anthropic's 429 `enforced_spend_limit_reached`).
    SpendLimit,
    /// The answer streams, then stops sending bytes: the call is hung.
    Stall,
}

/// Reads the simulated-provider controls of an input (absent: an immediate success).
///
/// The input was checked when its message was parsed ([`check_controls`]), so this cannot fail
/// on a job that came through [`super::parse_trigger`]; a hand-made input with bad controls falls
/// back to the defaults.
pub(crate) fn simulation_of(input: &Map<String, Value>) -> Simulation {
    parse_simulation(input.get("simulate")).unwrap_or_default()
}

/// Checks the controls in `input.simulate`: part of the message contract, applied to every body
/// parsed, so a job with bad controls is poison whichever provider runs.
pub(crate) fn check_controls(input: &Map<String, Value>) -> Result<(), InvalidMessage> {
    parse_simulation(input.get("simulate")).map(|_| ())
}

fn parse_simulation(value: Option<&Value>) -> Result<Simulation, InvalidMessage> {
    let Some(value) = value else {
        return Ok(Simulation::default());
    };
    let Value::Object(fields) = value else {
        return Err(InvalidMessage::wrong_type("input.simulate", "an object"));
    };
    if fields
        .keys()
        .any(|k| !SIMULATE_FIELDS.contains(&k.as_str()))
    {
        return Err(InvalidMessage::Invalid {
            field: "input.simulate",
            rule: "only latency_ms, outcome, fail_times, retrievable, answer_bytes, output, bad_answer and bad_times are allowed",
        });
    }
    let latency_ms = integer(
        fields.get("latency_ms"),
        MAX_SIMULATED_LATENCY_MS,
        "input.simulate.latency_ms",
        "must be an integer from 0 to 3600000",
    )?
    .unwrap_or(0);
    let outcome = parse_outcome(fields.get("outcome"))?;
    let fail_times = integer(
        fields.get("fail_times"),
        100,
        "input.simulate.fail_times",
        "must be an integer from 0 to 100",
    )?
    .unwrap_or(0) as u32;
    let answer_bytes = integer(
        fields.get("answer_bytes"),
        MAX_SIMULATED_ANSWER_BYTES,
        "input.simulate.answer_bytes",
        "must be an integer from 0 to 2000000",
    )?
    .unwrap_or(0) as usize;
    let retrievable = match fields.get("retrievable") {
        None => true,
        Some(Value::Bool(b)) => *b,
        Some(_) => {
            return Err(InvalidMessage::wrong_type(
                "input.simulate.retrievable",
                "a boolean",
            ));
        }
    };
    let output = match fields.get("output") {
        Some(v) if v.to_string().len() > MAX_SIMULATED_OUTPUT_BYTES => {
            return Err(InvalidMessage::Invalid {
                field: "input.simulate.output",
                rule: "must be at most 65536 bytes encoded",
            });
        }
        v => v.cloned(),
    };
    let bad_answer = parse_bad_answer(fields.get("bad_answer"))?;
    let bad_times = integer(
        fields.get("bad_times"),
        100,
        "input.simulate.bad_times",
        "must be an integer from 0 to 100",
    )?
    .map_or(u32::MAX, |n| n as u32);
    Ok(Simulation {
        latency_ms,
        outcome,
        fail_times,
        retrievable,
        answer_bytes,
        output,
        bad_answer,
        bad_times,
    })
}

/// The integer control `value`, if present: from 0 to `max`, else `field`'s `rule`.
fn integer(
    value: Option<&Value>,
    max: u64,
    field: &'static str,
    rule: &'static str,
) -> Result<Option<u64>, InvalidMessage> {
    value
        .map(|v| {
            v.as_u64()
                .filter(|n| *n <= max)
                .ok_or(InvalidMessage::Invalid { field, rule })
        })
        .transpose()
}

/// The control `bad_answer`: the answer the job's contract refuses, if any.
fn parse_bad_answer(value: Option<&Value>) -> Result<Option<BadAnswer>, InvalidMessage> {
    match value {
        None => Ok(None),
        Some(Value::String(s)) if s == "truncated" => Ok(Some(BadAnswer::Truncated)),
        Some(Value::String(s)) if s == "invalid" => Ok(Some(BadAnswer::Invalid)),
        Some(_) => Err(InvalidMessage::Invalid {
            field: "input.simulate.bad_answer",
            rule: "must be truncated or invalid",
        }),
    }
}

/// The control `outcome`: how the simulated call ends (`ok` when absent).
fn parse_outcome(value: Option<&Value>) -> Result<SimulatedOutcome, InvalidMessage> {
    Ok(match value {
        None => SimulatedOutcome::Ok,
        Some(Value::String(s)) => match s.as_str() {
            "ok" => SimulatedOutcome::Ok,
            "transient" => SimulatedOutcome::Transient,
            "permanent" => SimulatedOutcome::Permanent,
            "hang" => SimulatedOutcome::Hang,
            "overloaded" => SimulatedOutcome::Overloaded,
            "spend_limit" => SimulatedOutcome::SpendLimit,
            "stall" => SimulatedOutcome::Stall,
            _ => {
                return Err(InvalidMessage::Invalid {
                    field: "input.simulate.outcome",
                    rule: "must be ok, transient, permanent, hang, overloaded, spend_limit or stall",
                });
            }
        },
        Some(_) => {
            return Err(InvalidMessage::wrong_type(
                "input.simulate.outcome",
                "a string",
            ));
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::{parse_body, parse_trigger};

    #[test]
    fn simulation_controls_are_read_from_the_input() {
        let job = parse_body(Some(
            r#"{"job_id":"j","contract":"c","input":{"model":"m","prompt":"p","simulate":{"latency_ms":20,"outcome":"permanent","fail_times":2}}}"#,
        ))
        .expect("valid");
        assert_eq!(
            simulation_of(&job.input()),
            Simulation {
                latency_ms: 20,
                outcome: SimulatedOutcome::Permanent,
                fail_times: 2,
                ..Simulation::default()
            }
        );
    }

    #[test]
    fn bad_controls_are_poison_in_every_parser_of_the_contract() {
        let text = r#"{"job_id":"j","contract":"c","input":{"model":"m","prompt":"p","simulate":{"outcome":"boom"}}}"#;
        let invalid = InvalidMessage::Invalid {
            field: "input.simulate.outcome",
            rule: "must be ok, transient, permanent, hang, overloaded, spend_limit or stall",
        };
        assert_eq!(parse_trigger(Some(text)).map(|_| ()), Err(invalid.clone()));
        assert_eq!(parse_body(Some(text)).map(|_| ()), Err(invalid));
    }
}
