//! The message contract: parsing and validating an SQS body into a job, and the input digest.
//!
//! Validation walks the JSON by hand rather than through a serde derive so that an error names the
//! field and the rule, never the value: a prompt must not reach the logs through an error message.

use serde_json::{Map, Value};

pub(crate) use super::digest::hex;
pub use super::digest::{canonical_json, input_digest};
pub use super::pointer::{PayloadPointer, parse_pointer};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

/// The largest body SQS and its Lambda trigger accept (1 MiB).
pub(crate) const MAX_BODY_BYTES: usize = 1_048_576;
/// The largest payload read through an Extended Client pointer: the job, input included, is held
/// in memory while it runs.
pub(crate) const MAX_PAYLOAD_BYTES: usize = 16 * 1_048_576;
/// The longest `job_id`.
pub(crate) const MAX_JOB_ID_LEN: usize = 128;
/// The longest `contract`.
pub(crate) const MAX_CONTRACT_LEN: usize = 64;
/// The largest `metadata` object, encoded.
pub(crate) const MAX_METADATA_BYTES: usize = 4_096;
/// The largest `max_attempts` a message may ask for.
pub(crate) const MAX_ATTEMPTS_LIMIT: u32 = 100;

const TOP_LEVEL_FIELDS: [&str; 9] = [
    "job_id",
    "input",
    "contract",
    "deadline_at",
    "max_attempts",
    "max_cost",
    "metadata",
    "tenant",
    "priority",
];

/// The longest `tenant` (an SQS message group id takes 128 characters).
pub(crate) const MAX_TENANT_LEN: usize = 64;

/// Why a body is not a valid job. Every variant is poison: retrying cannot fix it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, thiserror::Error)]
pub enum InvalidMessage {
    /// The record carried no body at all.
    #[error("record has no body")]
    MissingBody,
    /// The body is larger than SQS allows (or a payload larger than [`MAX_PAYLOAD_BYTES`]).
    #[error("body is {bytes} bytes, more than {limit}")]
    TooLarge {
        /// Size of the body.
        bytes: usize,
        /// The limit it breaks.
        limit: usize,
    },
    /// The body would take more memory parsed than a document may (many small values cost far
    /// more than their bytes; see [`super::cost`]).
    #[error("body would take {cost} bytes parsed, more than {limit}")]
    TooCostly {
        /// What the parsed document would take.
        cost: usize,
        /// The limit it breaks.
        limit: usize,
    },
    /// An Extended Client pointer whose object is not there (deleted, or never written).
    #[error("the payload the pointer names does not exist")]
    PayloadMissing,
    /// The body is not JSON (position only, never content).
    #[error("body is not JSON (line {line}, column {column})")]
    NotJson {
        /// Line of the first syntax error.
        line: usize,
        /// Column of the first syntax error.
        column: usize,
    },
    /// The body nests deeper than the parser follows (128 levels).
    #[error("body nests deeper than 128 levels (line {line}, column {column})")]
    TooDeep {
        /// Line where the limit was reached.
        line: usize,
        /// Column where the limit was reached.
        column: usize,
    },
    /// The body is JSON but not an object.
    #[error("body is not a JSON object")]
    NotObject,
    /// A top-level field outside the contract (a typo must not silently change a job).
    #[error("unknown field {0:?}")]
    UnknownField(String),
    /// A required field is absent.
    #[error("missing field `{0}`")]
    Missing(&'static str),
    /// A field has the wrong JSON type.
    #[error("field `{field}` must be {expected}")]
    WrongType {
        /// Dotted path of the field.
        field: &'static str,
        /// What the contract expects there.
        expected: &'static str,
    },
    /// A field has the right type but breaks a rule of the contract.
    #[error("field `{field}` is invalid: {rule}")]
    Invalid {
        /// Dotted path of the field.
        field: &'static str,
        /// The rule it breaks.
        rule: &'static str,
    },
    /// A trigger carrying only a `job_id` names a job the ledger does not hold.
    #[error("job_id-only trigger for a job the ledger does not hold")]
    UnknownJob,
    /// The job asks for something the deployment does not allow its producers (a model, a
    /// parameter, a bound; see [`super::policy::Policy`]), or comes from a sender it does not
    /// know.
    #[error("field `{field}` is not allowed: {rule}")]
    NotAllowed {
        /// Dotted path of the field (a parameter's name only when it is a short identifier).
        field: String,
        /// The setting it breaks.
        rule: &'static str,
    },
}

/// What a message asks for: a whole job, or (`{"job_id": ...}` alone) a job the ledger holds.
#[derive(Debug, Clone, PartialEq)]
#[expect(
    clippy::large_enum_variant,
    reason = "one trigger per record, most of them whole jobs: boxing would add an allocation each"
)]
pub enum Trigger {
    /// The message carries the job.
    Job(JobMessage),
    /// The message names a job whose input is in the ledger.
    Ref(String),
}

impl Trigger {
    /// The job id either form names.
    pub fn job_id(&self) -> &str {
        match self {
            Trigger::Job(msg) => &msg.job_id,
            Trigger::Ref(job_id) => job_id,
        }
    }
}

/// Parses a message body as a trigger, as the worker and the producer accept it: `{"job_id":
/// ...}` alone names a job the ledger holds; anything else must be a whole job ([`parse_body`]).
pub fn parse_trigger(body: Option<&str>) -> Result<Trigger, InvalidMessage> {
    let text = body.ok_or(InvalidMessage::MissingBody)?;
    parse_trigger_text(text, MAX_BODY_BYTES)
}

/// A bare reference (a short `{"job_id": ...}` and nothing else) or a whole job, from text
/// parsed once.
fn parse_trigger_text(text: &str, limit: usize) -> Result<Trigger, InvalidMessage> {
    let fields = parse_object(text, limit)?;
    // Only a short body can be a bare reference.
    if text.len() <= 256
        && fields.len() == 1
        && let Some(id) = fields.get("job_id")
    {
        let Value::String(id) = id else {
            return Err(wrong_type("job_id", "a string"));
        };
        check_job_id(id)?;
        return Ok(Trigger::Ref(id.clone()));
    }
    job_from_fields(fields).map(Trigger::Job)
}

/// A job id's characters: `/` only between a producer's name and the producer's own id (see
/// [`super::scope`]).
fn job_id_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':' | '/')
}

/// Checks a job id: 1-128 characters from `A-Z a-z 0-9 _ - . :`, with at most one `/` between
/// a producer's name and its own id, and no part made only of dots (which paths and keys read
/// as the folder itself or its parent).
fn check_job_id(id: &str) -> Result<(), InvalidMessage> {
    check_identifier(id, "job_id", MAX_JOB_ID_LEN, job_id_char)?;
    let parts: Vec<&str> = id.split('/').collect();
    if parts.len() > 2 || parts.iter().any(|p| p.is_empty()) {
        return Err(InvalidMessage::Invalid {
            field: "job_id",
            rule: "at most one `/`, between a producer and its own id",
        });
    }
    if parts.iter().any(|p| p.chars().all(|c| c == '.')) {
        return Err(InvalidMessage::Invalid {
            field: "job_id",
            rule: "must not be made only of dots",
        });
    }
    Ok(())
}

/// A validated job, as carried by one message.
#[derive(Debug, Clone, PartialEq)]
pub struct JobMessage {
    /// The application's job id.
    pub job_id: String,
    /// The output-contract version.
    pub contract: String,
    /// Canonical JSON of the job input (sorted keys, no whitespace): what the ledger stores and
    /// the digest covers. The parsed input is not kept: a large batch would hold every record's
    /// tree for the whole invocation; [`JobMessage::input`] rebuilds it for the call.
    pub input_canonical: String,
    /// SHA-256 (lowercase hex) over the contract and the canonical input.
    pub digest: String,
    /// Fixed deadline in Unix milliseconds, if the message sets one.
    pub deadline_at: Option<i64>,
    /// Attempt budget, if the message sets one.
    pub max_attempts: Option<u32>,
    /// Spend limit in micro-dollars (`max_cost` in USD), if the message sets one.
    pub max_cost_micros: Option<u64>,
    /// The producer's correlation data, canonical JSON; not part of the digest.
    pub metadata: Option<String>,
    /// `tenant` and `priority`; not part of the digest.
    pub class: super::JobClass,
    /// Where the input is stored when it is too large for the ledger item (`input_canonical`
    /// still holds it, for the call).
    pub input_ref: Option<super::BlobRef>,
    /// The ledger already holds the job's item: a producer created it before sending this
    /// message (which says so), or the message was made from the item. Its first claim is then
    /// made in place, not by creating the item.
    pub in_ledger: bool,
    /// SQS delivered this message before (its receive count is above 1), so an earlier
    /// delivery may have written the item: unless `in_ledger`, it is read before any write,
    /// which costs a read instead of a refused create carrying the whole item both ways.
    pub delivered_before: bool,
    /// SQS's `ApproximateReceiveCount` of this delivery (0 when it did not say).
    pub receive_count: u32,
    /// SQS's `SentTimestamp`: when the message was sent, if SQS said.
    pub sent_at: Option<super::Millis>,
}

/// Parses and validates one SQS body against the contract.
pub fn parse_body(body: Option<&str>) -> Result<JobMessage, InvalidMessage> {
    let body = body.ok_or(InvalidMessage::MissingBody)?;
    job_from_fields(parse_object(body, MAX_BODY_BYTES)?)
}

/// Parses the payload an Extended Client pointer named, like a body but with the payload limit.
pub(crate) fn parse_payload(payload: &str) -> Result<Trigger, InvalidMessage> {
    parse_trigger_text(payload, MAX_PAYLOAD_BYTES)
}

/// The top-level object of a body no longer than `limit`.
fn parse_object(body: &str, limit: usize) -> Result<Map<String, Value>, InvalidMessage> {
    if body.len() > limit {
        return Err(InvalidMessage::TooLarge {
            bytes: body.len(),
            limit,
        });
    }
    let cost = super::cost::document_cost(body);
    if cost > super::cost::MAX_DOCUMENT_COST {
        return Err(InvalidMessage::TooCostly {
            cost,
            limit: super::cost::MAX_DOCUMENT_COST,
        });
    }
    let value: Value = serde_json::from_str(body).map_err(|e| {
        let (line, column) = (e.line(), e.column());
        // serde_json has no category for its nesting limit; its message is the only sign.
        if e.to_string().starts_with("recursion limit exceeded") {
            InvalidMessage::TooDeep { line, column }
        } else {
            InvalidMessage::NotJson { line, column }
        }
    })?;
    let Value::Object(fields) = value else {
        return Err(InvalidMessage::NotObject);
    };
    Ok(fields)
}

/// A validated job from a body's top-level fields.
fn job_from_fields(mut fields: Map<String, Value>) -> Result<JobMessage, InvalidMessage> {
    if let Some(unknown) = fields
        .keys()
        .find(|k| !TOP_LEVEL_FIELDS.contains(&k.as_str()))
    {
        return Err(InvalidMessage::UnknownField(field_name_for_logs(unknown)));
    }

    let job_id = take_string(&mut fields, "job_id")?;
    check_job_id(&job_id)?;
    let contract = take_string(&mut fields, "contract")?;
    check_identifier(&contract, "contract", MAX_CONTRACT_LEN, |c| {
        c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':' | '/' | '@' | '+')
    })?;
    let input = match fields.remove("input") {
        None => return Err(InvalidMessage::Missing("input")),
        Some(Value::Object(input)) => input,
        Some(_) => return Err(wrong_type("input", "an object")),
    };
    input::validate_input(&input)?;
    super::simulate::check_controls(&input)?;
    let deadline_at = match fields.remove("deadline_at") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(parse_rfc3339_ms(&s).ok_or(InvalidMessage::Invalid {
            field: "deadline_at",
            rule: "not an RFC 3339 date-time",
        })?),
        Some(_) => return Err(wrong_type("deadline_at", "an RFC 3339 string")),
    };
    let max_attempts = max_attempts(fields.remove("max_attempts"))?;
    let max_cost_micros = max_cost(fields.remove("max_cost"))?;
    let metadata = match fields.remove("metadata") {
        None | Some(Value::Null) => None,
        Some(Value::Object(m)) => {
            let encoded = canonical_json(&Value::Object(m));
            if encoded.len() > MAX_METADATA_BYTES {
                return Err(InvalidMessage::Invalid {
                    field: "metadata",
                    rule: "larger than 4096 bytes",
                });
            }
            Some(encoded)
        }
        Some(_) => return Err(wrong_type("metadata", "an object")),
    };

    let class = job_class(&mut fields)?;
    let input_canonical = canonical_json(&Value::Object(input));
    let digest = input_digest(&contract, &input_canonical);
    Ok(JobMessage {
        class,
        job_id,
        contract,
        input_canonical,
        digest,
        deadline_at,
        max_attempts,
        max_cost_micros,
        metadata,
        input_ref: None,
        in_ledger: false,
        delivered_before: false,
        receive_count: 0,
        sent_at: None,
    })
}

/// `tenant` (1 to 64 letters, digits and `_ - . : @`) and `priority` (`urgent` or `normal`).
fn job_class(fields: &mut Map<String, Value>) -> Result<super::JobClass, InvalidMessage> {
    let tenant = match fields.remove("tenant") {
        None | Some(Value::Null) => None,
        Some(Value::String(t)) => {
            check_identifier(&t, "tenant", MAX_TENANT_LEN, |c| {
                c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':' | '@')
            })?;
            Some(t)
        }
        Some(_) => return Err(wrong_type("tenant", "a string")),
    };
    let urgent = match fields.remove("priority") {
        None | Some(Value::Null) => false,
        Some(Value::String(p)) if p == "urgent" => true,
        Some(Value::String(p)) if p == "normal" => false,
        Some(_) => {
            return Err(InvalidMessage::Invalid {
                field: "priority",
                rule: "must be \"urgent\" or \"normal\"",
            });
        }
    };
    Ok(super::JobClass { tenant, urgent })
}

/// `max_attempts`: 1 to [`MAX_ATTEMPTS_LIMIT`], if given.
fn max_attempts(value: Option<Value>) -> Result<Option<u32>, InvalidMessage> {
    Ok(match value {
        None | Some(Value::Null) => None,
        Some(Value::Number(n)) => match n.as_u64() {
            Some(v @ 1..) if v <= u64::from(MAX_ATTEMPTS_LIMIT) => Some(v as u32),
            _ => {
                return Err(InvalidMessage::Invalid {
                    field: "max_attempts",
                    rule: "must be an integer from 1 to 100",
                });
            }
        },
        Some(_) => return Err(wrong_type("max_attempts", "an integer")),
    })
}

/// `max_cost`: a number of USD above 0, at most a million, in micro-dollars, if given.
fn max_cost(value: Option<Value>) -> Result<Option<u64>, InvalidMessage> {
    Ok(match value {
        None | Some(Value::Null) => None,
        Some(Value::Number(n)) => match n.as_f64().and_then(super::prices::limit_micros) {
            Some(micros) => Some(micros),
            None => {
                return Err(InvalidMessage::Invalid {
                    field: "max_cost",
                    rule: "must be a number of USD above 0, at most 1000000",
                });
            }
        },
        Some(_) => return Err(wrong_type("max_cost", "a number")),
    })
}

impl JobMessage {
    /// The job as the ledger holds it (for a trigger that carries only its id).
    pub fn from_record(record: &crate::job::JobItem) -> JobMessage {
        JobMessage {
            job_id: record.job_id.clone(),
            contract: record.contract.clone(),
            input_canonical: record.input.clone(),
            digest: record.input_digest.clone(),
            deadline_at: Some(record.deadline_at),
            max_attempts: Some(record.max_attempts),
            max_cost_micros: record.max_cost_micros,
            metadata: record.metadata.clone(),
            class: record.class.clone(),
            input_ref: record.input_ref.clone(),
            in_ledger: true,
            delivered_before: false,
            receive_count: 0,
            sent_at: None,
        }
    }

    /// Whether the ledger may hold this job already: its producer says so (`JobInLedger`), or
    /// SQS delivered the message before.
    pub fn may_be_in_ledger(&self) -> bool {
        self.in_ledger || self.delivered_before
    }

    /// Whether the message carries the job's input: one built from an item that keeps none
    /// ([`JobItem::keeps_input`](crate::job::JobItem::keeps_input)) does not.
    pub fn keeps_input(&self) -> bool {
        !self.input_canonical.is_empty() || self.input_ref.is_some()
    }

    /// The job input as an object, parsed again from its canonical JSON (which this crate wrote
    /// from an object, so it parses; anything else reads as an empty object).
    pub fn input(&self) -> Map<String, Value> {
        serde_json::from_str(&self.input_canonical).unwrap_or_default()
    }

    /// The input's model and parameters alone: what a deployment's policy judges, read without
    /// building the rest of the input (its messages are skipped, not copied).
    pub fn input_head(&self) -> InputHead {
        serde_json::from_str(&self.input_canonical).unwrap_or_default()
    }
}

/// The fields of a job's input a policy judges ([`JobMessage::input_head`]).
#[derive(Debug, Default, serde::Deserialize)]
pub struct InputHead {
    /// `input.model`, as sent.
    #[serde(default)]
    pub model: Option<Value>,
    /// `input.parameters`, as sent.
    #[serde(default)]
    pub parameters: Option<Value>,
}

/// Parses an RFC 3339 date-time to Unix milliseconds.
pub fn parse_rfc3339_ms(s: &str) -> Option<i64> {
    let at = OffsetDateTime::parse(s, &Rfc3339).ok()?;
    i64::try_from(at.unix_timestamp_nanos() / 1_000_000).ok()
}

/// Formats Unix milliseconds as RFC 3339 (UTC), for people.
pub fn format_rfc3339_ms(ms: i64) -> String {
    OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .ok()
        .and_then(|t| t.format(&Rfc3339).ok())
        .unwrap_or_else(|| format!("{ms}ms"))
}

fn take_string(
    fields: &mut Map<String, Value>,
    field: &'static str,
) -> Result<String, InvalidMessage> {
    match fields.remove(field) {
        None => Err(InvalidMessage::Missing(field)),
        Some(Value::String(s)) => Ok(s),
        Some(_) => Err(wrong_type(field, "a string")),
    }
}

fn check_identifier(
    value: &str,
    field: &'static str,
    max_len: usize,
    allowed: impl Fn(char) -> bool,
) -> Result<(), InvalidMessage> {
    if value.is_empty() || value.len() > max_len {
        return Err(InvalidMessage::Invalid {
            field,
            rule: "length out of range",
        });
    }
    if !value.chars().all(allowed) {
        return Err(InvalidMessage::Invalid {
            field,
            rule: "character outside the allowed set",
        });
    }
    Ok(())
}

fn wrong_type(field: &'static str, expected: &'static str) -> InvalidMessage {
    InvalidMessage::wrong_type(field, expected)
}

impl InvalidMessage {
    /// A field of the wrong JSON type.
    pub(crate) fn wrong_type(field: &'static str, expected: &'static str) -> InvalidMessage {
        InvalidMessage::WrongType { field, expected }
    }
}

/// An unknown field's name as an error may show it: a short identifier as it is; anything else
/// (long, or with characters an identifier has not, which may be text from the job) only by
/// its length.
pub(crate) fn field_name_for_logs(name: &str) -> String {
    let identifier = name.len() <= 40
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
    if identifier {
        name.to_owned()
    } else {
        format!("<{} bytes, not shown>", name.len())
    }
}

mod input;

#[cfg(test)]
mod tests;
