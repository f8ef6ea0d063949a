//! Chat Completions: the request from the job, streamed or whole, and the answer read back.

use serde_json::{Map, Value, json};

use super::super::http::{Events, MAX_RESPONSE_BYTES, Streamed, code_text};
use super::super::keys::Secret;
use super::status::classify;
use super::{OpenAiProvider, answer, bound_answer, parameters, responses_format, with_key};
use crate::job::contract::{Contract, Finish};
use crate::provider::{Answer, ProviderError, ProviderRequest};

impl OpenAiProvider {
    pub(super) async fn chat(&self, req: &ProviderRequest<'_>) -> Result<Answer, ProviderError> {
        let mut body = self.chat_body(req);
        let json = if self.settings.stream {
            body.insert("stream".into(), json!(true));
            body.insert("stream_options".into(), json!({"include_usage": true}));
            let build = |key: Option<&Secret>| {
                with_key(self.post("/chat/completions", req).json(&body), key)
            };
            let response = self.key.stream(build, classify).await?;
            match Streamed::of(response, req.progress_rule(), classify).await? {
                Streamed::Events(events) => streamed_chat(events).await?,
                Streamed::Whole(json) => json,
            }
        } else {
            let (status, headers, json) = self
                .send(|| self.post("/chat/completions", req).json(&body))
                .await?;
            if !status.is_success() {
                return Err(classify(status, &headers, &json));
            }
            json
        };
        self.chat_answer(req, &json)
    }

    /// The Chat Completions request of `req`, whole (not streamed).
    pub(super) fn chat_body(&self, req: &ProviderRequest<'_>) -> Map<String, Value> {
        let mut body = Map::new();
        body.insert("model".into(), json!(self.model(req)));
        body.insert("messages".into(), Value::Array(messages(req.input)));
        if let Some(format) = chat_format(req.output) {
            body.insert("response_format".into(), format);
        }
        for (k, v) in parameters(req.input) {
            body.entry(k.clone()).or_insert_with(|| v.clone());
        }
        bound_answer(&mut body, req, "max_completion_tokens");
        body
    }

    /// The answer a Chat Completions object gives.
    pub(super) fn chat_answer(
        &self,
        req: &ProviderRequest<'_>,
        json: &Value,
    ) -> Result<Answer, ProviderError> {
        let choice = json.pointer("/choices/0/message");
        let finish = chat_finish(json.pointer("/choices/0/finish_reason"));
        match choice
            .and_then(|m| m.get("content"))
            .and_then(Value::as_str)
        {
            Some(text) => Ok(answer(req, self.model(req), text, json, None, finish)),
            None if choice.and_then(|m| m.get("refusal")).is_some() => {
                Err(ProviderError::Permanent {
                    reason: "the model refused".to_owned(),
                })
            }
            None => Err(ProviderError::Permanent {
                reason: "chat completion without message content".to_owned(),
            }),
        }
    }
}

/// The Chat Completions object a stream of chunks builds, whole: the deltas' content and
/// refusal joined, the last `finish_reason`, the model, and the usage of the last chunk
/// (`stream_options.include_usage`), once `[DONE]` came. A chunk carrying an error, or a stream
/// that ends before `[DONE]`, is uncertain: a part of an answer is never taken for one.
async fn streamed_chat(mut events: Events) -> Result<Value, ProviderError> {
    let cut = |what: &str| ProviderError::Uncertain {
        evidence: format!("{what} after the request was sent; it may have run"),
    };
    let (mut content, mut refusal) = (None::<String>, None::<String>);
    let (mut finish, mut model, mut usage) = (Value::Null, Value::Null, Value::Null);
    let mut tier = Value::Null;
    let mut size = 0usize;
    loop {
        let Some(event) = events.next().await? else {
            return Err(cut("the stream ended before the answer did"));
        };
        if event.data.trim() == "[DONE]" {
            break;
        }
        let chunk: Value = serde_json::from_str(&event.data).unwrap_or(Value::Null);
        if let Some(error) = chunk.get("error") {
            let code = error
                .get("code")
                .or_else(|| error.get("type"))
                .and_then(Value::as_str)
                .map(code_text)
                .unwrap_or_default();
            return Err(cut(&format!("stream error {code}")));
        }
        if let Some(m) = chunk.get("model").filter(|m| m.is_string()) {
            model = m.clone();
        }
        if let Some(u) = chunk.get("usage").filter(|u| u.is_object()) {
            usage = u.clone();
        }
        if let Some(t) = chunk.get("service_tier").filter(|t| t.is_string()) {
            tier = t.clone();
        }
        let Some(choice) = chunk.pointer("/choices/0") else {
            continue;
        };
        for (field, into) in [("content", &mut content), ("refusal", &mut refusal)] {
            if let Some(text) = choice
                .pointer(&format!("/delta/{field}"))
                .and_then(Value::as_str)
            {
                size += text.len();
                if size > MAX_RESPONSE_BYTES {
                    return Err(ProviderError::Permanent {
                        reason: format!("answer larger than {MAX_RESPONSE_BYTES} bytes"),
                    });
                }
                into.get_or_insert_with(String::new).push_str(text);
            }
        }
        if let Some(reason) = choice.get("finish_reason").filter(|r| !r.is_null()) {
            finish = reason.clone();
        }
    }
    let mut message = json!({"role": "assistant", "content": content});
    if let Some(refusal) = refusal {
        message["refusal"] = Value::from(refusal);
    }
    Ok(json!({
        "model": model,
        "choices": [{"index": 0, "finish_reason": finish, "message": message}],
        "usage": usage,
        "service_tier": tier,
    }))
}

/// The same format as Chat Completions' `response_format`: translated from the Responses
/// form, the schema and its name one level down, under `json_schema`.
fn chat_format(contract: &Contract) -> Option<Value> {
    let Value::Object(mut format) = responses_format(contract)? else {
        return None;
    };
    let kind = format.remove("type").unwrap_or(Value::Null);
    if format.is_empty() {
        return Some(json!({ "type": kind }));
    }
    Some(json!({ "type": kind, "json_schema": format }))
}

/// The job's conversation as Chat Completions messages.
fn messages(input: &Map<String, Value>) -> Vec<Value> {
    match (input.get("messages"), input.get("prompt")) {
        (Some(Value::Array(messages)), _) => messages.clone(),
        (_, Some(prompt)) => vec![json!({"role": "user", "content": prompt})],
        _ => Vec::new(),
    }
}

/// A Chat Completions `finish_reason` in the one vocabulary of finish reasons.
fn chat_finish(reason: Option<&Value>) -> Finish {
    match reason.and_then(Value::as_str) {
        Some("stop") => Finish::Stop,
        // vLLM's `abort`: the server stopped the generation (a client gone, a preemption).
        Some("length" | "abort") => Finish::Length,
        Some("content_filter") => Finish::ContentFilter,
        Some("tool_calls" | "function_call") => Finish::ToolUse,
        _ => Finish::Unknown,
    }
}
