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
