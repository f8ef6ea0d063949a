//! The requests, answers and settings of the provider tests, for both binaries: a job's request
//! under the free-text contract, what a Chat Completions answer looks like, and OpenAI's
//! settings for a scripted server.

use fenced_jobs::job::contract::Contract;
use fenced_jobs::provider::openai::{OpenAiApi, OpenAiSettings};
use fenced_jobs::provider::{Answer, ProviderRequest};
use serde_json::{Map, Value, json};

pub fn input(value: Value) -> Map<String, Value> {
    value.as_object().cloned().expect("object")
}

/// The contract of the requests: free text, as a job naming no contract file is held to.
pub static FREE_TEXT: std::sync::LazyLock<Contract> =
    std::sync::LazyLock::new(|| Contract::free_text("summary.v1"));

pub fn request<'a>(input: &'a Map<String, Value>, json: &'a str) -> ProviderRequest<'a> {
    ProviderRequest {
        job_id: "job-7",
        attempt: 2,
        epoch: 3,
        contract: "summary.v1",
        output: &FREE_TEXT,
        input,
        input_json: json,
        max_output_tokens: 0,
        idempotency_key: "job-7/2".to_owned(),
        progress: None,
    }
}

pub fn chat_answer(text: &str) -> Value {
    json!({
        "id": "chatcmpl-1", "object": "chat.completion", "model": "gpt-test",
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": text}}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 2}
    })
}

pub fn output_of(answer: &Answer) -> String {
    let body: Value = serde_json::from_str(&answer.body).expect("json body");
    body["output"].as_str().expect("output").to_owned()
}

/// OpenAI's Responses API at the scripted server `url`, with short timeouts.
pub fn openai_settings(url: &str) -> OpenAiSettings {
    OpenAiSettings {
        base_url: format!("{url}/v1"),
        api: OpenAiApi::Responses,
        connect_timeout_ms: 1_000,
        request_timeout_ms: 2_000,
        ..OpenAiSettings::default()
    }
}

/// What Anthropic's API refuses in a schema for constrained decoding (structured outputs'
/// `output_config.format.schema`, a tool's `input_schema`), with the words of its 400: its
/// documented JSON Schema limitations (docs.anthropic.com, "Structured outputs", "JSON Schema
/// limitations": no numerical constraints, no string length constraints, array constraints
/// other than `minItems` of 0 or 1, `additionalProperties` other than `false`), the message as
/// the API gives it ("output_format.schema: For 'integer' type, property 'minimum' is not
/// supported", as a client's report of the API's answer quotes it). Our own reading of the
/// vendor's rule, kept apart from the lowering it judges. `None`: taken.
pub fn anthropic_refuses(schema: &Value, at: &str) -> Option<String> {
    const BOUNDS: [(&str, &[&str]); 4] = [
        (
            "integer",
            &[
                "minimum",
                "maximum",
                "exclusiveMinimum",
                "exclusiveMaximum",
                "multipleOf",
            ],
        ),
        (
            "number",
            &[
                "minimum",
                "maximum",
                "exclusiveMinimum",
                "exclusiveMaximum",
                "multipleOf",
            ],
        ),
        ("string", &["minLength", "maxLength"]),
        ("array", &["maxItems", "uniqueItems", "contains"]),
    ];
    let Value::Object(node) = schema else {
        return None;
    };
    let kinds: Vec<&str> = match node.get("type") {
        Some(Value::String(kind)) => vec![kind.as_str()],
        Some(Value::Array(kinds)) => kinds.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    };
    for (kind, refused) in BOUNDS {
        if let Some(keyword) = refused.iter().find(|k| node.contains_key(**k))
            && kinds.contains(&kind)
        {
            return Some(format!(
                "{at}: For '{kind}' type, property '{keyword}' is not supported"
            ));
        }
    }
    if kinds.contains(&"array")
        && node
            .get("minItems")
            .and_then(Value::as_u64)
            .is_some_and(|m| m > 1)
    {
        return Some(format!(
            "{at}: minItems values other than 0 or 1 are not supported"
        ));
    }
    if kinds.contains(&"object") && node.get("additionalProperties") != Some(&Value::Bool(false)) {
        return Some(format!(
            "{at}: For 'object' type, 'additionalProperties' must be explicitly set to false"
        ));
    }
    let children = node
        .get("properties")
        .and_then(Value::as_object)
        .into_iter()
        .chain(node.get("$defs").and_then(Value::as_object))
        .flat_map(|m| m.values())
        .chain(node.get("items"))
        .chain(
            ["anyOf", "oneOf", "allOf"]
                .iter()
                .filter_map(|k| node.get(*k).and_then(Value::as_array))
                .flatten(),
        );
    children
        .into_iter()
        .find_map(|child| anthropic_refuses(child, at))
}

/// Anthropic's 400 for a refused request, in its own error shape and headers.
pub fn anthropic_invalid(message: &str) -> crate::support::http::Reply {
    crate::support::http::Reply::json(
        400,
        json!({"type": "error", "error": {"type": "invalid_request_error", "message": message},
               "request_id": "req_01"}),
    )
    .with_header("request-id", "req_01")
    .with_header("anthropic-organization-id", "org-test")
}

/// OpenAI's published request bodies (openai/openai-openapi, as
/// `tests/fixtures/openai/requests.schema.json` names its commit and version), each entry
/// closed to the fields the document defines.
static OPENAI_REQUESTS: std::sync::LazyLock<Value> = std::sync::LazyLock::new(|| {
    serde_json::from_str(include_str!("../fixtures/openai/requests.schema.json"))
        .expect("the OpenAI request schema")
});

/// A validator of the entry `name` of [`OPENAI_REQUESTS`].
fn openai_entry(name: &str) -> jsonschema::Validator {
    let schema = json!({"$ref": format!("#/$defs/{name}"), "$defs": OPENAI_REQUESTS["$defs"]});
    jsonschema::draft202012::new(&schema).expect("the entry compiles")
}

static OPENAI_ENTRIES: std::sync::LazyLock<[(&str, jsonschema::Validator); 3]> =
    std::sync::LazyLock::new(|| {
        [
            ("/v1/responses", openai_entry("CreateResponse")),
            (
                "/v1/chat/completions",
                openai_entry("CreateChatCompletionRequest"),
            ),
            ("/v1/batches", openai_entry("CreateBatchRequest")),
        ]
    });

/// What the vendor whose endpoint `req` names refuses of it, as its API answers: OpenAI's
/// ([`openai_refuses`], [`openai_batch_file_refuses`]) or Anthropic's
/// ([`anthropic_request_refuses`]). `None`: taken, or no vendor's endpoint.
pub fn vendor_refuses(req: &crate::support::http::Request) -> Option<crate::support::http::Reply> {
    if req.method != "POST" {
        return None;
    }
    let path = req.path.split('?').next().unwrap_or_default();
    if path.ends_with("/v1/files") {
        return openai_batch_file_refuses(req);
    }
    if path.ends_with("/v1/messages") || path.ends_with("/v1/messages/batches") {
        return anthropic_request_refuses(path, &req.body);
    }
    openai_refuses(path, &req.body)
}

/// OpenAI's Batch API input file limits and rules (API reference, "Batch", "Create batch":
/// at most 50,000 requests and 200 MB a file; each line a JSON object with a `custom_id`
/// unique in the file, `method` `POST`, a `url` of one endpoint for every line, and a `body`
/// that endpoint takes). A file that breaks them is refused at upload here (the API may say
/// so when the batch is validated instead: the batch then fails with no line run).
pub fn openai_batch_file_refuses(
    req: &crate::support::http::Request,
) -> Option<crate::support::http::Reply> {
    const MAX_LINES: usize = 50_000;
    const MAX_BYTES: usize = 200 * 1_000_000;
    let boundary = req
        .header("content-type")?
        .split("boundary=")
        .nth(1)?
        .to_owned();
    let file = req
        .body
        .split(&format!("--{boundary}"))
        .find(|part| part.contains("name=\"file\""))?;
    if !req.body.contains("\r\n\r\nbatch\r\n") {
        return None;
    }
    let jsonl = file.split_once("\r\n\r\n")?.1.trim_end_matches("\r\n");
    let refuse = |why: String| Some(openai_invalid(&why, Some("file"), Some("invalid_file")));
    if jsonl.len() > MAX_BYTES {
        return refuse(format!("File is larger than {MAX_BYTES} bytes."));
    }
    let lines: Vec<&str> = jsonl.lines().filter(|l| !l.trim().is_empty()).collect();
    if lines.len() > MAX_LINES {
        return refuse(format!("Batch file has more than {MAX_LINES} requests."));
    }
    let (mut ids, mut urls) = (
        std::collections::HashSet::new(),
        std::collections::HashSet::new(),
    );
    for (n, line) in lines.iter().enumerate() {
        let Ok(line) = serde_json::from_str::<Value>(line) else {
            return refuse(format!("Line {} is not valid JSON.", n + 1));
        };
        let id = line
            .get("custom_id")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if id.is_empty() || !ids.insert(id.to_owned()) {
            return refuse(format!(
                "Line {}: custom_id is missing or not unique.",
                n + 1
            ));
        }
        let url = line.get("url").and_then(Value::as_str).unwrap_or_default();
        urls.insert(url.to_owned());
        if line.get("method").and_then(Value::as_str) != Some("POST") || urls.len() > 1 {
            return refuse(format!(
                "Line {}: every request must be a POST to one url.",
                n + 1
            ));
        }
        let body = line.get("body").map(Value::to_string).unwrap_or_default();
        if let Some(refused) = openai_refuses(url, &body) {
            return Some(refused);
        }
    }
    None
}

/// Anthropic's rules for a Messages request or a Message Batch (API reference, "Create a
/// Message Batch": at most 100,000 requests and 256 MB a batch, each `custom_id` unique and
/// matching `^[a-zA-Z0-9_-]{1,64}$`), and in each request the schema limitations
/// [`anthropic_refuses`] reads, for structured outputs and every tool's input schema.
pub fn anthropic_request_refuses(path: &str, body: &str) -> Option<crate::support::http::Reply> {
    let body: Value = serde_json::from_str(body).ok()?;
    let params = |p: &Value| -> Option<String> {
        let format = p.pointer("/output_config/format/schema");
        let tools = p
            .get("tools")
            .and_then(Value::as_array)
            .into_iter()
            .flatten();
        format
            .and_then(|s| anthropic_refuses(s, "output_config.format.schema"))
            .or_else(|| {
                tools
                    .filter_map(|t| t.get("input_schema"))
                    .find_map(|s| anthropic_refuses(s, "tools.0.custom.input_schema"))
            })
    };
    if !path.ends_with("/batches") {
        return params(&body).map(|why| anthropic_invalid(&why));
    }
    let requests = body.get("requests").and_then(Value::as_array)?;
    if requests.len() > 100_000 || body.to_string().len() > 256 * 1_000_000 {
        return Some(anthropic_invalid(
            "requests: the batch exceeds 100,000 requests or 256 MB",
        ));
    }
    let mut ids = std::collections::HashSet::new();
    for (n, request) in requests.iter().enumerate() {
        let id = request
            .get("custom_id")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let valid = (1..=64).contains(&id.len())
            && id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if !valid || !ids.insert(id) {
            return Some(anthropic_invalid(&format!(
                "requests.{n}.custom_id: must be unique and match ^[a-zA-Z0-9_-]{{1,64}}$"
            )));
        }
        if let Some(why) = request.get("params").and_then(params) {
            return Some(anthropic_invalid(&format!("requests.{n}.params.{why}")));
        }
    }
    None
}

/// What OpenAI's API refuses of a POST of `body` to `path`, as its 400: a body its
/// published request schema refuses (a field it does not define, a value out of range, a
/// wrong type), or, with `strict: true`, a schema strict mode cannot take ([`openai_strict_refuses`]).
/// `None`: taken, or not a request to a known OpenAI endpoint.
pub fn openai_refuses(path: &str, body: &str) -> Option<crate::support::http::Reply> {
    let (_, validator) = OPENAI_ENTRIES
        .iter()
        .find(|(endpoint, _)| path.ends_with(endpoint))?;
    let Ok(body) = serde_json::from_str::<Value>(body) else {
        return Some(openai_invalid(
            "We could not parse the JSON body of your request.",
            None,
            None,
        ));
    };
    if let Some(error) = validator.iter_errors(&body).next() {
        let at = error.instance_path().to_string();
        let param = at.trim_start_matches('/').replace('/', ".");
        let message = format!("Invalid value at '{param}': {error}");
        return Some(openai_invalid(&message, Some(&param), None));
    }
    let (format, param, name) = if path.ends_with("/v1/chat/completions") {
        let f = body.pointer("/response_format/json_schema");
        (f, "response_format", f.and_then(|f| f.get("name")))
    } else {
        let f = body.pointer("/text/format");
        (f, "text.format.schema", f.and_then(|f| f.get("name")))
    };
    let format = format?;
    if format.get("strict") != Some(&Value::Bool(true)) {
        return None;
    }
    let name = name.and_then(Value::as_str).unwrap_or_default();
    let why = openai_strict_refuses(format.get("schema")?, &mut Vec::new(), true)?;
    Some(openai_invalid(
        &format!("Invalid schema for response_format '{name}': {why}"),
        Some(param),
        Some("invalid_json_schema"),
    ))
}

/// What OpenAI's strict mode refuses in a schema, in the words of its 400 ("In
/// context=('properties', 'n'), 'minimum' is not permitted."): its docs' "Supported schemas"
/// (as of 2025-08) and the messages its API gives (quoted in client projects' reports): a root
/// that is not an object, an object without `additionalProperties: false`, a property left out
/// of `required`, a keyword outside the subset, keywords beside a `$ref`. Our own reading of
/// the vendor's rule, kept apart from the lowering it judges.
pub fn openai_strict_refuses(
    schema: &Value,
    context: &mut Vec<String>,
    root: bool,
) -> Option<String> {
    const SUPPORTED: [&str; 24] = [
        "type",
        "properties",
        "required",
        "additionalProperties",
        "items",
        "anyOf",
        "enum",
        "const",
        "$defs",
        "$ref",
        "description",
        "title",
        "pattern",
        "format",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "multipleOf",
        "minItems",
        "maxItems",
        "$schema",
        "definitions",
        "default",
    ];
    let Value::Object(node) = schema else {
        return None;
    };
    let at = || {
        let inner: Vec<String> = context.iter().map(|c| format!("'{c}'")).collect();
        let tuple = match inner.len() {
            1 => format!("({},)", inner[0]),
            _ => format!("({})", inner.join(", ")),
        };
        format!("In context={tuple}")
    };
    if root
        && (node.get("type").and_then(Value::as_str) != Some("object")
            || node.contains_key("anyOf"))
    {
        return Some(format!(
            "{}, schema must be a JSON Schema of 'type: \"object\"', got 'type: \"{}\"'.",
            at(),
            node.get("type").and_then(Value::as_str).unwrap_or("None")
        ));
    }
    if node.contains_key("$ref") && node.len() > 1 {
        let others: Vec<&str> = node
            .keys()
            .filter(|k| *k != "$ref")
            .map(String::as_str)
            .collect();
        return Some(format!(
            "{}, $ref cannot have keywords {{'{}'}}.",
            at(),
            others.join("', '")
        ));
    }
    if let Some(keyword) = node.keys().find(|k| !SUPPORTED.contains(&k.as_str())) {
        return Some(format!("{}, '{keyword}' is not permitted.", at()));
    }
    if let Some(Value::Object(properties)) = node.get("properties") {
        if node.get("additionalProperties") != Some(&Value::Bool(false)) {
            return Some(format!(
                "{}, 'additionalProperties' is required to be supplied and to be false.",
                at()
            ));
        }
        let required: Vec<&str> = node
            .get("required")
            .and_then(Value::as_array)
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        if let Some(missing) = properties.keys().find(|k| !required.contains(&k.as_str())) {
            return Some(format!(
                "{}, 'required' is required to be supplied and to be an array including every key in properties. Missing '{missing}'.",
                at()
            ));
        }
    }
    let mut children: Vec<(Vec<String>, &Value)> = Vec::new();
    for group in ["properties", "$defs"] {
        if let Some(Value::Object(map)) = node.get(group) {
            children.extend(
                map.iter()
                    .map(|(k, v)| (vec![group.to_owned(), k.clone()], v)),
            );
        }
    }
    if let Some(items) = node.get("items") {
        children.push((vec!["items".to_owned()], items));
    }
    if let Some(Value::Array(any)) = node.get("anyOf") {
        children.extend(
            any.iter()
                .enumerate()
                .map(|(i, v)| (vec!["anyOf".to_owned(), i.to_string()], v)),
        );
    }
    for (step, child) in children {
        let depth = context.len();
        context.extend(step);
        let found = openai_strict_refuses(child, context, false);
        context.truncate(depth);
        if found.is_some() {
            return found;
        }
    }
    None
}

/// OpenAI's 400 for a refused request, in its own error shape and headers.
pub fn openai_invalid(
    message: &str,
    param: Option<&str>,
    code: Option<&str>,
) -> crate::support::http::Reply {
    crate::support::http::Reply::json(
        400,
        json!({"error": {"message": message, "type": "invalid_request_error",
                         "param": param, "code": code}}),
    )
    .with_header("openai-processing-ms", "4")
    .with_header("openai-version", "2020-10-01")
    .with_header("x-request-id", "req_invalid")
}
