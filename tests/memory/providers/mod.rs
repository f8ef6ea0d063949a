//! The HTTP providers against a scripted local server speaking each wire format: how every
//! answer is classified, background calls and their retrieval, the fallback to Chat
//! Completions, what a request carries, streams and batches, a module per behaviour. No test
//! reaches the internet.

mod answers;
mod background;
mod batches;
mod requests;
mod streams;

use fenced_jobs::provider::Secret;
use fenced_jobs::provider::anthropic::{AnthropicProvider, AnthropicSettings, Structured};
use fenced_jobs::provider::openai::{OpenAiApi, OpenAiProvider, OpenAiSettings};
use serde_json::{Value, json};

use crate::support::http::Reply;

fn openai(url: &str, api: OpenAiApi) -> OpenAiProvider {
    let settings = OpenAiSettings {
        base_url: format!("{url}/v1"),
        api,
        model: None,
        connect_timeout_ms: 1_000,
        request_timeout_ms: 1_000,
        stream: false,
        deployment: "prod".to_owned(),
        ..OpenAiSettings::default()
    };
    OpenAiProvider::new(settings, Some(Secret::new("sk-test-secret"))).expect("client")
}

fn anthropic(url: &str, structured: Structured) -> AnthropicProvider {
    let settings = AnthropicSettings {
        base_url: url.to_owned(),
        structured,
        connect_timeout_ms: 1_000,
        stream: false,
        ..AnthropicSettings::default()
    };
    AnthropicProvider::new(settings, Some(Secret::new("sk-ant-test-secret"))).expect("client")
}

fn message(content: Value, stop_reason: &str) -> Value {
    json!({
        "id": "msg_01", "type": "message", "role": "assistant", "model": "claude-test",
        "content": content, "stop_reason": stop_reason,
        "usage": {"input_tokens": 9, "output_tokens": 4, "cache_read_input_tokens": 100,
                  "cache_creation_input_tokens": 20, "service_tier": "standard"}
    })
}

/// An error in Anthropic's own word: its error object, with the headers its API sends with
/// every answer (API overview, "Response headers").
fn anthropic_error(status: u16, kind: &str) -> Reply {
    Reply::json(
        status,
        json!({"type": "error", "error": {"type": kind, "message": "Summarise this. failed"},
               "request_id": "req_01"}),
    )
    .with_header("request-id", "req_01")
    .with_header("anthropic-organization-id", "org-test")
}

/// An error in OpenAI's own word: `body`, with the headers its API sends with every answer
/// (API reference, "Debugging requests").
fn openai_error(status: u16, body: Value) -> Reply {
    Reply::json(status, body)
        .with_header("openai-processing-ms", "12")
        .with_header("openai-version", "2020-10-01")
        .with_header("x-request-id", "req_test")
}
