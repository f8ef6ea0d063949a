//! Output contracts: what answer a job asked for, and whether an answer is it.
//!
//! A contract names an output format (free text or JSON), a JSON Schema (2020-12) for JSON
//! outputs, and its policy: what an invalid or truncated answer becomes, and the largest answer
//! accepted. Contracts are files (`contracts/<id>.json`, see `docs/contracts.md`),
//! compiled once per execution environment into [`Contracts`]; a job names one by its
//! `contract` field. Judging an answer ([`Contract::judge`]) is pure: it reads the answer's
//! document and the provider's finish reason, and never logs the answer.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use serde_json::{Map, Value};

/// How many validation errors an invalid answer keeps.
pub(crate) const ERRORS_KEPT: usize = 5;
/// The longest validation error kept (a path and a keyword).
const ERROR_LEN: usize = 120;
/// The longest excerpt of an invalid answer kept on its attempt, as restricted evidence.
pub(crate) const EXCERPT_BYTES: usize = 256;
/// The largest contract file.
pub(crate) const MAX_CONTRACT_FILE_BYTES: usize = 256 * 1024;

/// Why a model stopped writing, in one vocabulary for every provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Finish {
    /// It finished its answer (OpenAI `stop`, Bedrock `end_turn` or `stop_sequence`).
    #[default]
    Stop,
    /// It ran out of output tokens: the answer is cut off (`length`, `max_tokens`, an
    /// `incomplete` response for `max_output_tokens`).
    Length,
    /// A content filter or guardrail stopped it: the answer is not the whole answer.
    ContentFilter,
    /// It asked for a tool instead of answering.
    ToolUse,
    /// The provider gave no reason, or one this build does not know.
    Unknown,
}

impl Finish {
    /// The name recorded on an attempt.
    pub fn as_str(self) -> &'static str {
        match self {
            Finish::Stop => "stop",
            Finish::Length => "length",
            Finish::ContentFilter => "content_filter",
            Finish::ToolUse => "tool_use",
            Finish::Unknown => "unknown",
        }
    }

    /// Reads a recorded name (an unknown one reads as [`Finish::Unknown`]).
    pub fn parse(s: &str) -> Finish {
        match s {
            "stop" => Finish::Stop,
            "length" => Finish::Length,
            "content_filter" => Finish::ContentFilter,
            "tool_use" => Finish::ToolUse,
            _ => Finish::Unknown,
        }
    }
}

/// What an answer must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Any text.
    Text,
    /// A JSON value (an object, when the schema says so), stored parsed.
    Json,
}

impl Format {
    /// Its name: `text` or `json` (as `gen_ai.output.type` names them).
    pub fn as_str(self) -> &'static str {
        match self {
            Format::Text => "text",
            Format::Json => "json",
        }
    }
}

/// What an answer that breaks its contract becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OnInvalid {
    /// Another attempt, within the job's budget and deadline (the default).
    Retry,
    /// `failed_terminal (invalid_output)` at once.
    Fail,
}

/// Where a job's contract comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Origin {
    /// A contract file of the registry.
    File,
    /// No file, in a lenient registry: any whole answer, as text.
    FreeText,
    /// No file, in a strict registry: no answer is accepted.
    Missing,
}

/// How an accepted answer is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accepted {
    /// As the model's text.
    Text,
    /// As the JSON value the text is (it parsed, and satisfies the schema if there is one).
    Json,
}

/// One output contract, compiled.
#[derive(Clone)]
pub struct Contract {
    id: String,
    origin: Origin,
    format: Format,
    schema: Option<Arc<Value>>,
    validator: Option<Arc<jsonschema::Validator>>,
    on_invalid: OnInvalid,
    max_answer_bytes: Option<usize>,
    accept_truncated: bool,
}

impl fmt::Debug for Contract {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Contract")
            .field("id", &self.id)
            .field("origin", &self.origin)
            .field("format", &self.format)
            .field("schema", &self.schema.is_some())
            .field("on_invalid", &self.on_invalid)
            .field("max_answer_bytes", &self.max_answer_bytes)
            .field("accept_truncated", &self.accept_truncated)
            .finish()
    }
}

/// A contract file that cannot be used: start-up stops on it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("contract {id:?}: {reason}")]
pub struct ContractError {
    /// The contract's id (its file name without `.json`).
    pub id: String,
    /// What is wrong.
    pub reason: String,
}

/// An answer that is not the one its job asked for: the call ran and its answer is known, so
/// this is a definite outcome, recorded on the attempt. Its [`fmt::Display`] names the finish
/// reason and the keywords broken, never the answer nor the paths into it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Rejected {
    /// Why the model stopped.
    pub finish: Finish,
    /// What is wrong: a truncation, a parse error's position, or each validation error as the
    /// answer's path and the keyword it breaks (`/total: type`); the first [`ERRORS_KEPT`].
    pub errors: Vec<String>,
    /// The answer's first bytes (at most [`EXCERPT_BYTES`]): restricted evidence, kept on the
    /// attempt and never logged.
    pub excerpt: String,
    /// The contract's policy says the job fails at once.
    pub terminal: bool,
}

impl fmt::Display for Rejected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kinds: Vec<&str> = self
            .errors
            .iter()
            .map(|e| e.rsplit(": ").next().unwrap_or(e))
            .collect();
        write!(
            f,
            "answer breaks its contract (finish {}): {}",
            self.finish.as_str(),
            kinds.join(", ")
        )
    }
}

impl Contract {
    /// The contract of a job whose contract id names no file, when the registry is lenient:
    /// any answer the model finished is accepted as its text; one cut off (`length`,
    /// `content_filter`) is not, as under a text contract file that does not accept truncation.
    pub fn free_text(id: &str) -> Contract {
        Contract {
            id: id.to_owned(),
            origin: Origin::FreeText,
            format: Format::Text,
            schema: None,
            validator: None,
            on_invalid: OnInvalid::Retry,
            max_answer_bytes: None,
            accept_truncated: false,
        }
    }

    /// The contract of a job whose contract id names no file of a strict registry (one removed
    /// while the job was live): no answer is accepted, and the job fails at its first.
    pub fn missing(id: &str) -> Contract {
        Contract {
            origin: Origin::Missing,
            on_invalid: OnInvalid::Fail,
            ..Contract::free_text(id)
        }
    }

    /// Compiles the contract file `text` of contract `id`.
    pub fn parse(id: &str, text: &str) -> Result<Contract, ContractError> {
        let fail = |reason: String| ContractError {
            id: id.to_owned(),
            reason,
        };
        if text.len() > MAX_CONTRACT_FILE_BYTES {
            return Err(fail(format!("larger than {MAX_CONTRACT_FILE_BYTES} bytes")));
        }
        let mut fields: Map<String, Value> = match serde_json::from_str(text) {
            Ok(Value::Object(fields)) => fields,
            Ok(_) => return Err(fail("not a JSON object".to_owned())),
            Err(e) => return Err(fail(format!("not JSON: {e}"))),
        };
        fields.remove("description");
        let schema = fields.remove("schema");
        let format = match fields.remove("format") {
            None if schema.is_some() => Format::Json,
            None => Format::Text,
            Some(Value::String(s)) if s == "json" => Format::Json,
            Some(Value::String(s)) if s == "text" => Format::Text,
            Some(_) => return Err(fail("format must be \"json\" or \"text\"".to_owned())),
        };
        if format == Format::Text && schema.is_some() {
            return Err(fail("a text contract has no schema".to_owned()));
        }
        let on_invalid = match fields.remove("on_invalid") {
            None => OnInvalid::Retry,
            Some(Value::String(s)) if s == "retry" => OnInvalid::Retry,
            Some(Value::String(s)) if s == "fail" => OnInvalid::Fail,
            Some(_) => return Err(fail("on_invalid must be \"retry\" or \"fail\"".to_owned())),
        };
        let max_answer_bytes = match fields.remove("max_answer_bytes") {
            None => None,
            Some(v) => Some(
                v.as_u64()
                    .filter(|n| (1..=16 * 1_048_576).contains(n))
                    .ok_or_else(|| {
                        fail("max_answer_bytes must be an integer from 1 to 16777216".to_owned())
                    })? as usize,
            ),
        };
        let accept_truncated = match fields.remove("accept_truncated") {
            None => false,
            Some(Value::Bool(b)) if format == Format::Text || !b => b,
            Some(Value::Bool(_)) => {
                return Err(fail(
                    "a JSON contract never accepts a truncated answer".to_owned(),
                ));
            }
            Some(_) => return Err(fail("accept_truncated must be a boolean".to_owned())),
        };
        if let Some(unknown) = fields.keys().next() {
            return Err(fail(format!(
                "unknown field {unknown:?} (known: format, schema, on_invalid, max_answer_bytes, accept_truncated, description)"
            )));
        }
        let validator = match &schema {
            None => None,
            Some(schema @ (Value::Object(_) | Value::Bool(_))) => Some(Arc::new(
                jsonschema::draft202012::new(schema)
                    .map_err(|e| fail(format!("schema does not compile: {e}")))?,
            )),
            Some(_) => return Err(fail("schema must be a JSON Schema object".to_owned())),
        };
        Ok(Contract {
            id: id.to_owned(),
            origin: Origin::File,
            format,
            schema: schema.map(Arc::new),
            validator,
            on_invalid,
            max_answer_bytes,
            accept_truncated,
        })
    }

    /// The contract's id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The output format.
    pub fn format(&self) -> Format {
        self.format
    }

    /// The JSON Schema a JSON answer must satisfy, as the contract file gives it: what a
    /// provider is asked to follow.
    pub fn schema(&self) -> Option<&Value> {
        self.schema.as_deref()
    }

    /// Whether the answer must be JSON (the provider is asked for JSON, following the schema
    /// when there is one).
    pub(crate) fn wants_json(&self) -> bool {
        self.format == Format::Json && self.origin == Origin::File
    }

    /// The contract's id as a schema name a provider takes (`[A-Za-z0-9_-]`, at most 64
    /// characters): `invoice-extract@2` is `invoice-extract_2`.
    pub(crate) fn schema_name(&self) -> String {
        self.id
            .chars()
            .take(64)
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                    c
                } else {
                    '_'
                }
            })
            .collect()
    }

    /// Whether every answer that finished for `finish` is accepted as it comes, unread: under
    /// a lenient registry's contract for an id it does not hold, any answer not cut off.
    pub(crate) fn takes_unread(&self, finish: Finish) -> bool {
        self.origin == Origin::FreeText && !self.cut_off(finish)
    }

    /// Whether an answer that finished for `finish` is not the whole answer this contract
    /// accepts: cut off by the output limit (unless a text contract accepts that) or by a
    /// content filter; or, for text, stopped for no reason the provider gave or this build
    /// knows (a stream that ended without one, Anthropic's `pause_turn`): nothing in a text
    /// shows it whole, where a JSON answer's parse and schema do.
    fn cut_off(&self, finish: Finish) -> bool {
        match finish {
            Finish::Length => !(self.format == Format::Text && self.accept_truncated),
            Finish::ContentFilter => true,
            Finish::Unknown => self.format == Format::Text,
            Finish::Stop | Finish::ToolUse => false,
        }
    }

    /// Judges the answer whose `output` (the model's text) finished for `finish`: accepted, as
    /// text or as the JSON it is, or refused, as not the answer the job asked for.
    pub fn judge(&self, output: &str, finish: Finish) -> Result<Accepted, Rejected> {
        let rejected = |errors: Vec<String>| self.rejected(errors, finish, output);
        match self.origin {
            Origin::File | Origin::FreeText => {}
            Origin::Missing => {
                return Err(rejected(vec![format!(
                    "no contract {:?} in the registry: contract",
                    self.id
                )]));
            }
        }
        if self.cut_off(finish) {
            return Err(rejected(vec![format!(
                "the answer is cut off: finish {}",
                finish.as_str()
            )]));
        }
        if let Some(max) = self.max_answer_bytes
            && output.len() > max
        {
            return Err(rejected(vec![format!(
                "the answer is {} bytes, more than {max}: max_answer_bytes",
                output.len()
            )]));
        }
        if self.format == Format::Text {
            return Ok(Accepted::Text);
        }
        let value: Value = match serde_json::from_str(output) {
            Ok(value) => value,
            Err(e) => {
                return Err(rejected(vec![format!(
                    "not JSON at line {} column {}: json",
                    e.line(),
                    e.column()
                )]));
            }
        };
        // The errors are collected only for an answer that fails (the fast check first).
        if let Some(validator) = self.validator.as_ref().filter(|v| !v.is_valid(&value)) {
            let errors: Vec<String> = validator
                .iter_errors(&value)
                .take(ERRORS_KEPT)
                .map(|e| described(&e))
                .collect();
            if !errors.is_empty() {
                return Err(rejected(errors));
            }
        }
        Ok(Accepted::Json)
    }

    /// The refusal of an answer (`output`, which finished for `finish`) for `errors`, under
    /// this contract's policy.
    pub fn rejected(&self, errors: Vec<String>, finish: Finish, output: &str) -> Rejected {
        Rejected {
            finish,
            errors,
            excerpt: excerpt(output),
            terminal: self.on_invalid == OnInvalid::Fail,
        }
    }
}

/// A validation error as its path into the answer and the keyword it breaks (the property a
/// `required` names comes from the schema, not the answer).
fn described(e: &jsonschema::ValidationError<'_>) -> String {
    let path = e.instance_path().to_string();
    let path = if path.is_empty() {
        "/".to_owned()
    } else {
        path
    };
    let keyword = match e.kind() {
        jsonschema::error::ValidationErrorKind::Required { property } => {
            format!("required {}", property.as_str().unwrap_or("?"))
        }
        kind => kind.keyword().to_owned(),
    };
    let mut text = format!("{path}: {keyword}");
    truncate(&mut text, ERROR_LEN);
    text
}

/// The first [`EXCERPT_BYTES`] of `output`, cut at a character boundary.
fn excerpt(output: &str) -> String {
    let mut text = output.to_owned();
    truncate(&mut text, EXCERPT_BYTES);
    text
}

fn truncate(text: &mut String, max: usize) {
    if text.len() > max {
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
}

include!(concat!(env!("OUT_DIR"), "/contracts.rs"));

/// The contracts of a deployment, by id.
#[derive(Debug, Clone, Default)]
pub struct Contracts {
    by_id: BTreeMap<String, Contract>,
    strict: bool,
}

/// A job names a contract a strict registry does not hold.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("no contract {0:?} in the registry")]
pub(crate) struct UnknownContract(pub String);

impl Contracts {
    /// A registry of `contracts`; a `strict` one refuses a job whose contract it does not hold,
    /// a lenient one takes it as free text ([`Contract::free_text`]).
    pub fn new(contracts: impl IntoIterator<Item = Contract>, strict: bool) -> Contracts {
        Contracts {
            by_id: contracts.into_iter().map(|c| (c.id.clone(), c)).collect(),
            strict,
        }
    }

    /// Compiles every `(id, file text)` pair; the first that does not compile is the error.
    pub fn compile<'a>(
        files: impl IntoIterator<Item = (&'a str, &'a str)>,
        strict: bool,
    ) -> Result<Contracts, ContractError> {
        let contracts = files
            .into_iter()
            .map(|(id, text)| Contract::parse(id, text))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Contracts::new(contracts, strict))
    }

    /// The contracts built in from `contracts/`, and over them `files` (`(id, file text)`; a
    /// file replaces a built-in contract of the same id).
    pub fn with_built_in(
        files: &[(String, String)],
        strict: bool,
    ) -> Result<Contracts, ContractError> {
        let mut texts: BTreeMap<&str, &str> = BUILT_IN_CONTRACTS.iter().copied().collect();
        texts.extend(files.iter().map(|(id, text)| (id.as_str(), text.as_str())));
        Contracts::compile(texts, strict)
    }

    /// How many contracts the registry holds.
    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    /// Whether the registry holds none.
    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    /// Every contract the registry holds, by id.
    pub fn iter(&self) -> impl Iterator<Item = &Contract> {
        self.by_id.values()
    }

    /// Whether a job naming a contract the registry lacks is refused.
    pub fn strict(&self) -> bool {
        self.strict
    }

    /// Whether a new job naming `id` may be taken, and whether the registry holds its
    /// contract: a strict registry refuses one it does not hold (poison, before anything is
    /// written); a lenient one takes it (`Ok(false)`) as free text.
    pub(crate) fn admits(&self, id: &str) -> Result<bool, UnknownContract> {
        let held = self.by_id.contains_key(id);
        if self.strict && !held {
            return Err(UnknownContract(id.to_owned()));
        }
        Ok(held)
    }

    /// The contract a job naming `id` is held to: its file's, or, for an id the registry does
    /// not hold, free text ([`Contract::free_text`]) in a lenient registry and no answer at all
    /// ([`Contract::missing`]) in a strict one.
    pub fn for_job(&self, id: &str) -> Contract {
        match self.by_id.get(id) {
            Some(contract) => contract.clone(),
            None if self.strict => Contract::missing(id),
            None => Contract::free_text(id),
        }
    }
}

#[cfg(test)]
mod tests;
