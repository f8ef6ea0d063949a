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
