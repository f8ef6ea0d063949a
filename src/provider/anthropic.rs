//! Anthropic's Messages API (`POST /v1/messages`), with `x-api-key` and `anthropic-version`.
//!
//! A message cannot be asked for again, so a call interrupted after it was sent is uncertain.
//! The contract's schema is sent in Anthropic's own form: structured output
//! (`output_config.format`), or for models without it a tool the model is made to call, whose
//! input is the answer. Errors are classified by what they prove about the work (the table in
//! `docs/providers.md`); reasons carry the status and Anthropic's error type, and its message
//! only for a refusal of the request's form (a path outside the conversation).

mod batch;
mod status;

use status::{classify, stop_finish};

use reqwest::Client;
use serde_json::{Map, Value, json};

use super::http::{ApiKey, Events, MAX_RESPONSE_BYTES, Streamed, code_text};
use super::keys::{KeyRotation, Secret};
use super::{Answer, Provider, ProviderError, ProviderRequest, dialect};
use crate::job::contract::{Contract, Finish};
use crate::job::{Millis, Usage};
use crate::vars::{ConfigError, Vars};

/// The API version every request names (`anthropic-version`).
pub(crate) const DEFAULT_VERSION: &str = "2023-06-01";

/// The answer's ceiling sent when neither the job nor the deployment sets one: the API needs
/// `max_tokens` on every request.
pub(crate) const DEFAULT_MAX_TOKENS: u64 = 4_096;

/// How the contract's schema is put to the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Structured {
    /// `output_config.format`: the answer's text follows the schema (constrained decoding).
    Format,
    /// A tool whose input schema is the contract's, which the model is made to call
    /// (`tool_choice`): for models without structured output. Its input is the answer.
    Tool,
}

/// How to reach Anthropic.
#[derive(Debug, Clone, PartialEq)]
pub struct AnthropicSettings {
    /// `ANTHROPIC_BASE_URL`, without the version (`https://api.anthropic.com`).
    pub base_url: String,
    /// `ANTHROPIC_VERSION`: the `anthropic-version` header.
    pub version: String,
    /// `ANTHROPIC_MODEL`: when set, the model of every call (otherwise the job's `input.model`).
    pub model: Option<String>,
    /// `ANTHROPIC_STRUCTURED_OUTPUT`: `format` (default) or `tool`.
    pub structured: Structured,
    /// `ANTHROPIC_CONNECT_TIMEOUT_MS`.
    pub connect_timeout_ms: Millis,
    /// `PROVIDER_STREAMING` (`on`, the default, or `off`): the answer streams, so a long
    /// generation survives idle-connection limits and its progress is evidence.
    pub stream: bool,
}

impl Default for AnthropicSettings {
    fn default() -> Self {
        AnthropicSettings {
            base_url: "https://api.anthropic.com".to_owned(),
            version: DEFAULT_VERSION.to_owned(),
            model: None,
            structured: Structured::Format,
            connect_timeout_ms: 5_000,
            stream: true,
        }
    }
}

impl AnthropicSettings {
    /// Reads the `ANTHROPIC_*` settings (the key is read by [`super::keys::KeySource`]).
    pub(crate) fn from_vars(vars: &Vars<'_>) -> Result<AnthropicSettings, ConfigError> {
        let d = AnthropicSettings::default();
        Ok(AnthropicSettings {
            base_url: super::base_url(vars, "ANTHROPIC_BASE_URL", d.base_url)?,
            version: vars.get("ANTHROPIC_VERSION").unwrap_or(d.version),
            model: vars.get("ANTHROPIC_MODEL"),
            structured: vars.choice(
                "ANTHROPIC_STRUCTURED_OUTPUT",
                Structured::Format,
                &[("format", Structured::Format), ("tool", Structured::Tool)],
            )?,
            connect_timeout_ms: vars.integer(
                "ANTHROPIC_CONNECT_TIMEOUT_MS",
                d.connect_timeout_ms,
                1,
                60_000,
            )?,
            stream: super::streaming(vars)?,
        })
    }
}

/// The Anthropic provider.
#[derive(Debug)]
pub struct AnthropicProvider {
    http: Client,
    settings: AnthropicSettings,
    key: ApiKey,
    /// What this environment knows of its batches.
    book: super::batch::Book,
}

impl AnthropicProvider {
    /// A provider for `settings`, authenticating with `key` when there is one.
    pub fn new(settings: AnthropicSettings, key: Option<Secret>) -> Result<Self, String> {
        Ok(AnthropicProvider {
            http: super::http::client(settings.connect_timeout_ms)?,
            settings: AnthropicSettings {
                base_url: settings.base_url.trim_end_matches('/').to_owned(),
                ..settings
            },
            key: ApiKey::new(key),
            book: super::batch::Book::default(),
        })
    }

    /// Reads the key again after a 401 (see [`ApiKey`]).
    pub(crate) fn with_rotation(mut self, rotation: KeyRotation) -> Self {
        self.key.rotated_by(rotation);
        self
    }

    /// The request's body: the conversation, the answer's ceiling, the job's parameters in
    /// Anthropic's names, and the contract's schema in the form the settings choose.
    fn body(&self, req: &ProviderRequest<'_>) -> Result<Map<String, Value>, ProviderError> {
        let permanent = |reason: &str| ProviderError::Permanent {
            reason: reason.to_owned(),
        };
        let (system, messages) = conversation(req.input).map_err(permanent)?;
        let mut body = Map::new();
        body.insert("model".into(), json!(Provider::model(self, req.input)));
        body.insert("messages".into(), Value::Array(messages));
        if !system.is_empty() {
            body.insert("system".into(), Value::Array(system));
        }
        let ceiling = match crate::job::output_ceiling(req.input) {
            0 if req.max_output_tokens > 0 => req.max_output_tokens,
            0 => DEFAULT_MAX_TOKENS,
            own => own,
        };
        body.insert("max_tokens".into(), json!(ceiling));
        parameters(req.input, &mut body);
        // The schema in Anthropic's dialect; the whole of it judges the answer.
        match (
            self.settings.structured,
            schema(req.output).map(dialect::anthropic),
        ) {
            (_, None) => {}
            (Structured::Format, Some(schema)) => {
                let format = json!({"type": "json_schema", "schema": schema});
                body.insert("output_config".into(), json!({ "format": format }));
            }
            (Structured::Tool, Some(schema)) => {
                let name = req.output.schema_name();
                body.insert(
                    "tools".into(),
                    json!([{
                        "name": name,
                        "description": "Give the answer.",
                        "input_schema": schema,
                    }]),
                );
                body.insert("tool_choice".into(), json!({"type": "tool", "name": name}));
            }
        }
        Ok(body)
    }

    /// The answer a message gives: its text, or in tool mode the forced tool's input.
    fn answer(&self, req: &ProviderRequest<'_>, json: &Value) -> Result<Answer, ProviderError> {
        let blocks = json
            .get("content")
            .and_then(Value::as_array)
            .ok_or_else(|| ProviderError::Permanent {
                reason: "message without content".to_owned(),
            })?;
        let tool = (self.settings.structured == Structured::Tool && schema(req.output).is_some())
            .then(|| req.output.schema_name());
        let stop_reason = json.get("stop_reason").and_then(Value::as_str);
        let mut finish = stop_finish(stop_reason);
        let text = match &tool {
            Some(name) => {
                let input = blocks.iter().find(|b| {
                    b.get("type").and_then(Value::as_str) == Some("tool_use")
                        && b.get("name").and_then(Value::as_str) == Some(name)
                });
                if finish == Finish::ToolUse && input.is_some() {
                    // The model called the tool it was made to call: that is its answer.
                    finish = Finish::Stop;
                }
                input
                    .and_then(|b| b.get("input"))
                    .map(Value::to_string)
                    .unwrap_or_default()
            }
            None => blocks
                .iter()
                .filter(|b| b.get("type").and_then(Value::as_str) == Some("text"))
                .filter_map(|b| b.get("text").and_then(Value::as_str))
                .collect(),
        };
        let model = Provider::model(self, req.input);
        let usage = json.get("usage").cloned().unwrap_or(Value::Null);
        let body = json!({
            "contract": req.contract,
            "model": json.get("model").and_then(Value::as_str).unwrap_or(model),
            "output": text,
            "stop_reason": stop_reason,
            "usage": usage,
        });
        Ok(Answer {
            body: body.to_string(),
            provider_ref: None,
            finish,
            usage: Usage::from_anthropic(&usage),
            model: json.get("model").and_then(Value::as_str).map(str::to_owned),
            response_id: json
                .get("id")
                .and_then(Value::as_str)
                .filter(|id| super::batch::valid_id(id))
                .map(str::to_owned),
        })
    }
}

impl Provider for AnthropicProvider {
    fn name(&self) -> &'static str {
        "anthropic"
    }

    fn server_address(&self) -> Option<&str> {
        super::host_of(&self.settings.base_url)
    }

    fn fixed_model(&self) -> Option<&str> {
        self.settings.model.as_deref()
    }

    fn can_retrieve(&self) -> bool {
        // Only a batch's lines can be asked about; a message cannot.
        false
    }

    fn batches(&self) -> bool {
        true
    }

    fn batch_line(
        &self,
        req: &ProviderRequest<'_>,
        line: &str,
    ) -> Result<super::BatchLine, ProviderError> {
        self.line(req, line)
    }

    async fn submit_batch(&self, lines: &[super::BatchLine]) -> Result<String, ProviderError> {
        self.create_batch(lines).await
    }

    async fn retrieve(
        &self,
        provider_ref: &str,
        started_at: Millis,
        req: &ProviderRequest<'_>,
    ) -> super::Retrieval {
        if super::batch::is_batch_ref(provider_ref) {
            return super::batch::retrieve_line(self, provider_ref, started_at, req).await;
        }
        super::Retrieval::Unsupported
    }

    async fn call(&self, req: &ProviderRequest<'_>) -> Result<Answer, ProviderError> {
        let mut body = self.body(req)?;
        if self.settings.stream {
            body.insert("stream".into(), json!(true));
        }
        let url = format!("{}/v1/messages", self.settings.base_url);
        let build = |key: Option<&Secret>| {
            let request = self
                .http
                .post(&url)
                .header("anthropic-version", &self.settings.version)
                .json(&body);
            match key {
                Some(key) => request.header("x-api-key", key.expose()),
                None => request,
            }
        };
        if !self.settings.stream {
            let (status, headers, json) = self.key.send(build, classify).await?;
            if !status.is_success() {
                return Err(classify(status, &headers, &json));
            }
            return self.answer(req, &json);
        }
        let response = self.key.stream(build, classify).await?;
        let message = match Streamed::of(response, req.progress_rule(), classify).await? {
            Streamed::Events(events) => streamed_message(events).await?,
            Streamed::Whole(json) => json,
        };
        self.answer(req, &message)
    }
}

/// The message a stream of Messages events builds, whole: the `message_start`'s model and
/// usage, its content blocks with their deltas (text, a tool's input JSON), the `stop_reason`
/// and usage of its `message_delta`, once `message_stop` came. An `error` event, a delta for a
/// block never started, or a stream that ends before `message_stop` is uncertain: the model was
/// running, and a part of an answer is never taken for one. An answer past
/// [`MAX_RESPONSE_BYTES`] could never be stored: permanent.
async fn streamed_message(mut events: Events) -> Result<Value, ProviderError> {
    let mut message = Building::default();
    loop {
        let Some(event) = events.next().await? else {
            return Err(cut("the stream ended before the answer did"));
        };
        let data: Value = serde_json::from_str(&event.data).unwrap_or(Value::Null);
        let kind = data
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or(&event.name);
        if message.fold(kind, &data)? {
            return Ok(message.into_value());
        }
    }
}

/// A stream cut short by `what`: the model was running.
fn cut(what: &str) -> ProviderError {
    ProviderError::Uncertain {
        evidence: format!("{what} after the request was sent; it may have run"),
    }
}

/// A message as its stream builds it.
#[derive(Default)]
struct Building {
    head: Map<String, Value>,
    usage: Map<String, Value>,
    blocks: Vec<Block>,
    stop_reason: Value,
    /// The bytes of text and tool input so far.
    size: usize,
}

impl Building {
    /// Folds the event of type `kind` whose document is `data` into the message; whether it
    /// was the last (`message_stop`).
    fn fold(&mut self, kind: &str, data: &Value) -> Result<bool, ProviderError> {
        match kind {
            "message_start" => {
                for field in ["id", "model"] {
                    if let Some(v) = data.pointer(&format!("/message/{field}")) {
                        self.head.insert(field.to_owned(), v.clone());
                    }
                }
                if let Some(Value::Object(u)) = data.pointer("/message/usage") {
                    self.usage.extend(u.clone());
                }
            }
            "content_block_start" => {
                let block = data.get("content_block");
                let text = |field| block.and_then(|b| b.get(field)).and_then(Value::as_str);
                self.blocks.push(Block {
                    kind: text("type").unwrap_or_default().to_owned(),
                    name: text("name").map(str::to_owned),
                    text: text("text").unwrap_or_default().to_owned(),
                    input: String::new(),
                });
            }
            "content_block_delta" => self.delta(data)?,
            "message_delta" => {
                if let Some(reason) = data.pointer("/delta/stop_reason") {
                    self.stop_reason = reason.clone();
                }
                if let Some(Value::Object(u)) = data.get("usage") {
                    self.usage.extend(u.clone());
                }
            }
            "message_stop" => return Ok(true),
            "error" => {
                let code = data
                    .pointer("/error/type")
                    .and_then(Value::as_str)
                    .map(code_text)
                    .unwrap_or_default();
                return Err(cut(&format!("stream error {code}")));
            }
            _ => {}
        }
        Ok(false)
    }

    /// A `content_block_delta`: more text, or more of a tool's input JSON, for its block.
    fn delta(&mut self, data: &Value) -> Result<(), ProviderError> {
        let index = data.get("index").and_then(Value::as_u64).unwrap_or(0) as usize;
        let Some(block) = self.blocks.get_mut(index) else {
            return Err(cut("a delta for a block never started"));
        };
        let delta = data.get("delta");
        let part = |field| delta.and_then(|d| d.get(field)).and_then(Value::as_str);
        let more = match delta.and_then(|d| d.get("type")).and_then(Value::as_str) {
            Some("text_delta") => part("text").map(|t| (&mut block.text, t)),
            Some("input_json_delta") => part("partial_json").map(|t| (&mut block.input, t)),
            _ => None,
        };
        if let Some((into, text)) = more {
            self.size += text.len();
            if self.size > MAX_RESPONSE_BYTES {
                return Err(ProviderError::Permanent {
                    reason: format!("answer larger than {MAX_RESPONSE_BYTES} bytes"),
                });
            }
            into.push_str(text);
        }
        Ok(())
    }

    /// The message as the Messages API answers it unstreamed.
    fn into_value(self) -> Value {
        let mut message = self.head;
        let content: Vec<Value> = self.blocks.into_iter().map(Block::into_value).collect();
        message.insert("content".to_owned(), Value::Array(content));
        message.insert("stop_reason".to_owned(), self.stop_reason);
        message.insert("usage".to_owned(), Value::Object(self.usage));
        Value::Object(message)
    }
}

/// A content block as its stream builds it.
struct Block {
    kind: String,
    name: Option<String>,
    text: String,
    /// A tool's input, as the JSON text its deltas give.
    input: String,
}

impl Block {
    /// The block as the whole message would hold it: a tool's input parsed (what cannot be
    /// parsed stays text, for the contract to refuse).
    fn into_value(self) -> Value {
        let mut block = json!({"type": self.kind});
        match self.kind.as_str() {
            "tool_use" => {
                block["name"] = json!(self.name);
                // No deltas: the input the block started with, which is empty.
                block["input"] = match self.input.as_str() {
                    "" => json!({}),
                    text => serde_json::from_str(text).unwrap_or_else(|_| Value::from(text)),
                };
            }
            _ => block["text"] = Value::from(self.text),
        }
        block
    }
}

/// The contract's schema, when the answer must be JSON following one.
fn schema(contract: &Contract) -> Option<&Value> {
    contract.schema().filter(|_| contract.wants_json())
}

/// The job's parameters in Anthropic's names: `temperature` (at most 1 here), `top_p`,
/// `top_k`, stop sequences in any spelling, and, where the deployment allows them,
/// `service_tier`, `thinking`, `metadata` and `cache_control`. Others (`seed`, penalties,
/// reasoning effort) have no counterpart and are left out.
fn parameters(input: &Map<String, Value>, body: &mut Map<String, Value>) {
    let Some(Value::Object(p)) = input.get("parameters") else {
        return;
    };
    if let Some(t) = p.get("temperature").and_then(Value::as_f64) {
        body.insert("temperature".into(), json!(t.clamp(0.0, 1.0)));
    }
    for name in [
        "top_p",
        "top_k",
        "service_tier",
        "thinking",
        "metadata",
        "cache_control",
    ] {
        if let Some(v) = p.get(name) {
            body.insert(name.into(), v.clone());
        }
    }
    let stop = ["stop_sequences", "stop", "stopSequences"]
        .iter()
        .find_map(|n| p.get(*n));
    match stop {
        Some(Value::String(s)) => {
            body.insert("stop_sequences".into(), json!([s]));
        }
        Some(list @ Value::Array(_)) => {
            body.insert("stop_sequences".into(), list.clone());
        }
        _ => {}
    }
}

/// The job's conversation as Anthropic's `system` blocks and `messages`: system and developer
/// messages become system blocks; content parts are carried in Anthropic's form, their
/// `cache_control` with them.
fn conversation(input: &Map<String, Value>) -> Result<(Vec<Value>, Vec<Value>), &'static str> {
    if let Some(Value::String(prompt)) = input.get("prompt") {
        return Ok((Vec::new(), vec![json!({"role": "user", "content": prompt})]));
    }
    let Some(Value::Array(entries)) = input.get("messages") else {
        return Err("no prompt or messages");
    };
    let mut system = Vec::new();
    let mut messages = Vec::new();
    for entry in entries {
        let role = entry.get("role").and_then(Value::as_str);
        let content = match entry.get("content") {
            Some(Value::String(text)) if matches!(role, Some("system" | "developer")) => {
                vec![json!({"type": "text", "text": text})]
            }
            Some(text @ Value::String(_)) => {
                messages.push(json!({"role": role, "content": text}));
                continue;
            }
            Some(Value::Array(parts)) => parts.iter().map(part).collect::<Result<_, _>>()?,
            _ => return Err("message without content"),
        };
        match role {
            Some("system" | "developer") => system.extend(content),
            Some("user" | "assistant") => {
                messages.push(json!({"role": role, "content": content}));
            }
            _ => return Err("message role must be system, user or assistant"),
        }
    }
    Ok((system, messages))
}

/// One content part in Anthropic's form: text (OpenAI's `input_text` and `output_text` too),
/// an image by `image_url` (a `data:` URL or a link), or Anthropic's own `image` and `document`
/// parts as they are.
fn part(p: &Value) -> Result<Value, &'static str> {
    let mut out = match p.get("type").and_then(Value::as_str) {
        Some("text" | "input_text" | "output_text") => match p.get("text") {
            Some(Value::String(t)) => json!({"type": "text", "text": t}),
            _ => return Err("text part without text"),
        },
        Some("image_url") => {
            let url = p
                .pointer("/image_url/url")
                .or_else(|| p.get("image_url"))
                .and_then(Value::as_str)
                .ok_or("image part without a URL")?;
            json!({"type": "image", "source": image_source(url)?})
        }
        Some("image" | "document") if p.get("source").is_some_and(Value::is_object) => {
            json!({"type": p["type"], "source": p["source"]})
        }
        _ => return Err("a content part this provider does not take"),
    };
    if let Some(cache) = p.get("cache_control") {
        out["cache_control"] = cache.clone();
    }
    Ok(out)
}

/// An image URL as Anthropic's `source`: base64 data from a `data:` URL, else the link.
fn image_source(url: &str) -> Result<Value, &'static str> {
    let Some(data) = url.strip_prefix("data:") else {
        return Ok(json!({"type": "url", "url": url}));
    };
    let (media_type, data) = data
        .split_once(";base64,")
        .ok_or("an image data URL must be base64")?;
    Ok(json!({"type": "base64", "media_type": media_type, "data": data}))
}

#[cfg(test)]
mod tests;
