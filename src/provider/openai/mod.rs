//! An OpenAI-compatible HTTP provider: the Responses API in background mode, with plain Chat
//! Completions for servers that do not have it.
//!
//! In background mode the submit returns the response id at once; the processor records it in
//! the ledger (conditional on its epoch) before it polls `GET /responses/{id}`, so a later owner
//! can collect the same call instead of making a new one. Errors are classified by what they
//! say about the work: refused before acceptance (429, 5xx, a failed connect) is transient,
//! rejected (other 4xx) is permanent, and a request that was sent without an answer (timeout,
//! dropped connection) is uncertain. Reasons carry status codes and error codes, never the
//! provider's message text, which may quote the prompt.

use std::time::Duration;

use reqwest::{Client, StatusCode};
use serde_json::{Map, Value, json};

use super::dialect;
use super::http::{ApiKey, code_text, transport_kind};
use super::keys::{KeyRotation, Secret};
mod batch;
mod chat;
mod settings;
mod status;

pub use settings::{OpenAiApi, OpenAiSettings};

pub use status::classify_status;
use status::{classify, no_responses_api, retrieval_error};

use super::{Answer, Provider, ProviderError, ProviderRequest, Retrieval, Submission};
use crate::job::contract::{Contract, Finish};
use crate::job::{Millis, Usage};

/// The OpenAI-compatible provider.
#[derive(Debug)]
pub struct OpenAiProvider {
    http: Client,
    settings: OpenAiSettings,
    /// The key requests are sent with.
    key: ApiKey,
    /// The models this server was found to serve through Chat Completions only: a
    /// `POST /responses` for them answered 404 or 405 (not about the model), and Chat
    /// Completions then answered. One stray answer of a proxy switches nothing.
    chat_models: std::sync::Mutex<std::collections::HashSet<String>>,
    /// What this environment knows of its batches.
    book: super::batch::Book,
    /// The server was found to have no Batch API.
    no_batches: std::sync::atomic::AtomicBool,
}

impl OpenAiProvider {
    /// A provider for `settings`, authenticating with `key` when there is one.
    pub fn new(settings: OpenAiSettings, key: Option<Secret>) -> Result<Self, String> {
        let http = super::http::client(settings.connect_timeout_ms)?;
        Ok(OpenAiProvider {
            http,
            settings: OpenAiSettings {
                base_url: settings.base_url.trim_end_matches('/').to_owned(),
                ..settings
            },
            key: ApiKey::new(key),
            chat_models: std::sync::Mutex::default(),
            book: super::batch::Book::default(),
            no_batches: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Reads the key again from `rotation` after a 401 (see [`ApiKey`]).
    pub(crate) fn with_rotation(mut self, rotation: KeyRotation) -> Self {
        self.key.rotated_by(rotation);
        self
    }

    /// Sends the request `build` makes with the key, as a bearer token, and reads its answer.
    async fn send(
        &self,
        build: impl Fn() -> reqwest::RequestBuilder,
    ) -> Result<(StatusCode, reqwest::header::HeaderMap, Value), ProviderError> {
        self.key.send(|key| with_key(build(), key), classify).await
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.settings.base_url)
    }

    /// A POST to `path`, not yet authorised ([`OpenAiProvider::send`] adds the key).
    fn post(&self, path: &str, req: &ProviderRequest<'_>) -> reqwest::RequestBuilder {
        self.http
            .post(self.url(path))
            .header("Idempotency-Key", &req.idempotency_key)
    }

    fn model<'a>(&'a self, req: &'a ProviderRequest<'_>) -> &'a str {
        self.settings
            .model
            .as_deref()
            .or_else(|| req.input.get("model").and_then(Value::as_str))
            .unwrap_or_default()
    }

    /// Asks the server to cancel a background response (best effort, logged).
    async fn cancel_request(&self, provider_ref: &str) {
        if !valid_response_id(provider_ref) {
            return;
        }
        let request = self
            .http
            .post(self.url(&format!("/responses/{provider_ref}/cancel")))
            .timeout(self.background_timeout());
        let sent = with_key(request, self.key.current().as_ref()).send().await;
        match sent {
            Ok(r) if r.status().is_success() => tracing::info!("background call cancelled"),
            Ok(r) => tracing::warn!(status = %r.status(), "cancel refused"),
            Err(e) => tracing::warn!(error = %transport_kind(&e), "cancel failed"),
        }
    }

    /// A response still `queued` past `OPENAI_QUEUED_TIMEOUT_SECONDS`: cancelled, then asked
    /// about again. Only a response the server says is `cancelled` (it never started) ends
    /// refused before work; one that started meanwhile is followed as any other, and one the
    /// server cannot be asked about now is asked about again later.
    async fn cancel_queued(&self, provider_ref: &str, req: &ProviderRequest<'_>) -> Retrieval {
        self.cancel_request(provider_ref).await;
        match self.get_response(provider_ref).await {
            Ok((status, _, json)) if status.is_success() => {
                match json.get("status").and_then(Value::as_str) {
                    Some("cancelled") => Retrieval::Failed(ProviderError::Transient {
                        retry_after_ms: None,
                        reason: format!(
                            "response still queued after {} s; cancelled",
                            self.settings.queued_timeout_ms / 1000
                        ),
                    }),
                    _ => self.response_status(req, &json),
                }
            }
            _ => Retrieval::Unreachable {
                retry_after_ms: None,
            },
        }
    }

    /// `GET /responses/{id}`, read.
    async fn get_response(
        &self,
        provider_ref: &str,
    ) -> Result<(StatusCode, reqwest::header::HeaderMap, Value), ProviderError> {
        self.send(|| {
            self.http
                .get(self.url(&format!("/responses/{provider_ref}")))
                .timeout(self.background_timeout())
        })
        .await
    }

    /// The Responses API request of `req` (in the foreground).
    fn responses_body(&self, req: &ProviderRequest<'_>) -> Map<String, Value> {
        let mut body = Map::new();
        body.insert("model".into(), json!(self.model(req)));
        body.insert("input".into(), responses_input(req.input));
        if let Some(format) = responses_format(req.output) {
            body.insert("text".into(), json!({ "format": format }));
        }
        for (k, v) in parameters(req.input) {
            let k = if k == "max_tokens" {
                "max_output_tokens"
            } else {
                k
            };
            body.entry(k.to_owned()).or_insert_with(|| v.clone());
        }
        bound_answer(&mut body, req, "max_output_tokens");
        body
    }

    /// Whether `model`'s calls go to Chat Completions.
    fn chat_only(&self, model: &str) -> bool {
        self.settings.api == OpenAiApi::Chat
            || self
                .chat_models
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .contains(model)
    }

    fn background_timeout(&self) -> Duration {
        Duration::from_millis(self.settings.request_timeout_ms as u64)
    }

    /// What a Responses API object says about its call.
    fn response_status(&self, req: &ProviderRequest<'_>, json: &Value) -> Retrieval {
        let id = response_id(json);
        match json.get("status").and_then(Value::as_str) {
            Some("completed") => match output_text(json) {
                Some(text) => Retrieval::Completed(answer(
                    req,
                    self.model(req),
                    &text,
                    json,
                    id.map(str::to_owned),
                    Finish::Stop,
                )),
                None => Retrieval::Failed(ProviderError::Permanent {
                    reason: "completed response without output text".to_owned(),
                }),
            },
            Some("queued" | "in_progress") => Retrieval::Running,
            Some("cancelled") => Retrieval::Failed(ProviderError::Transient {
                retry_after_ms: None,
                reason: "response cancelled".to_owned(),
            }),
            Some("incomplete") => {
                // The call ran and stopped early: its answer (perhaps empty) is the job's
                // contract's to judge, with the reason it stopped.
                let finish = match json
                    .pointer("/incomplete_details/reason")
                    .and_then(Value::as_str)
                {
                    Some("max_output_tokens") => Finish::Length,
                    Some("content_filter") => Finish::ContentFilter,
                    _ => Finish::Unknown,
                };
                let text = output_text(json).unwrap_or_default();
                let id = id.map(str::to_owned);
                Retrieval::Completed(answer(req, self.model(req), &text, json, id, finish))
            }
            Some("failed") => {
                let code = json
                    .pointer("/error/code")
                    .and_then(Value::as_str)
                    .unwrap_or("unspecified");
                let reason = format!("response failed: {}", code_text(code));
                Retrieval::Failed(if matches!(code, "server_error" | "rate_limit_exceeded") {
                    ProviderError::Transient {
                        retry_after_ms: None,
                        reason,
                    }
                } else {
                    ProviderError::Permanent { reason }
                })
            }
            _ => Retrieval::Failed(ProviderError::Uncertain {
                evidence: "response object without a known status".to_owned(),
            }),
        }
    }
}

impl Provider for OpenAiProvider {
    fn name(&self) -> &'static str {
        "openai"
    }

    fn server_address(&self) -> Option<&str> {
        super::host_of(&self.settings.base_url)
    }

    fn fixed_model(&self) -> Option<&str> {
        self.settings.model.as_deref()
    }

    async fn call(&self, req: &ProviderRequest<'_>) -> Result<Answer, ProviderError> {
        match self.submit(req).await? {
            Submission::Answered(answer) => Ok(answer),
            Submission::Started(_) => Err(ProviderError::Uncertain {
                evidence: "background call started without a caller to follow it".to_owned(),
            }),
        }
    }

    async fn submit(&self, req: &ProviderRequest<'_>) -> Result<Submission, ProviderError> {
        if self.chat_only(self.model(req)) {
            return self.chat(req).await.map(Submission::Answered);
        }
        let mut body = self.responses_body(req);
        body.insert("background".into(), json!(true));
        body.insert("store".into(), json!(true));
        let (status, headers, json) = self
            .send(|| {
                self.post("/responses", req)
                    .timeout(self.background_timeout())
                    .json(&body)
            })
            .await?;
        if no_responses_api(status, &json) {
            // Nothing reached a model: the same attempt goes to Chat Completions, and once that
            // answers, the model's calls go there from now on.
            let answered = self.chat(req).await?;
            let model = self.model(req).to_owned();
            let mut chat = self.chat_models.lock().unwrap_or_else(|p| p.into_inner());
            if chat.insert(model) {
                tracing::warn!(%status, "no Responses API for this model on this server; using Chat Completions");
            }
            return Ok(Submission::Answered(answered));
        }
        if !status.is_success() {
            return Err(classify(status, &headers, &json));
        }
        match (self.response_status(req, &json), response_id(&json)) {
            (Retrieval::Running, Some(id)) => Ok(Submission::Started(id.to_owned())),
            (Retrieval::Completed(answer), _) => Ok(Submission::Answered(answer)),
            (Retrieval::Failed(error), _) => Err(error),
            _ => Err(ProviderError::Uncertain {
                evidence: "background submit answered without a usable response id".to_owned(),
            }),
        }
    }

    /// Background calls can be asked about; once a model is found to be served by Chat
    /// Completions only, the process's calls are not counted on it (a call that cannot be asked
    /// about needs the longer time before the invocation's end).
    fn can_retrieve(&self) -> bool {
        self.settings.api == OpenAiApi::Responses
            && self
                .chat_models
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .is_empty()
    }

    /// `service_tier`: `flex` and `priority` (API reference, "Create a model response").
    fn tiers(&self) -> &'static [crate::job::usage::Rate] {
        &[
            crate::job::usage::Rate::Flex,
            crate::job::usage::Rate::Priority,
        ]
    }

    fn batches(&self) -> bool {
        self.settings.batches && !self.no_batches.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn batch_line(
        &self,
        req: &ProviderRequest<'_>,
        line: &str,
    ) -> Result<super::BatchLine, ProviderError> {
        Ok(self.line(req, line))
    }

    async fn submit_batch(&self, lines: &[super::BatchLine]) -> Result<String, ProviderError> {
        self.create_batch(lines).await
    }

    async fn retrieve(
        &self,
        provider_ref: &str,
        started_at: Millis,
        req: &ProviderRequest<'_>,
    ) -> Retrieval {
        if super::batch::is_batch_ref(provider_ref) {
            return super::batch::retrieve_line(self, provider_ref, started_at, req).await;
        }
        if !valid_response_id(provider_ref) {
            // Not an id this provider gave (it records only ids it checked): nothing can be
            // learnt of the call, and nothing may be concluded from that.
            return Retrieval::Denied;
        }
        match self.get_response(provider_ref).await {
            Ok((status, _, json)) if status.is_success() => {
                let queued = json.get("status").and_then(Value::as_str) == Some("queued");
                let waited = crate::clock::Clock::now_ms(&crate::clock::SystemClock) - started_at;
                if queued && waited > self.settings.queued_timeout_ms {
                    return self.cancel_queued(provider_ref, req).await;
                }
                self.response_status(req, &json)
            }
            Ok((status, headers, _)) => retrieval_error(status, &headers),
            Err(e) => {
                // Nothing was learnt about the call: ask again at the next poll.
                tracing::warn!(error = %e, "retrieval failed; asking again");
                Retrieval::Unreachable {
                    retry_after_ms: None,
                }
            }
        }
    }

    async fn cancel(&self, provider_ref: &str) {
        self.cancel_request(provider_ref).await;
    }
}

/// The response id an answer gives, when it is one this crate will put in a URL, the ledger, an
/// event or an operator's terminal: 1-128 characters from `A-Z a-z 0-9 _ -` (OpenAI's are
/// `resp_` and hex). Anything else from the server is not used.
fn response_id(json: &Value) -> Option<&str> {
    json.get("id")
        .and_then(Value::as_str)
        .filter(|id| valid_response_id(id))
}

/// Whether `id` is a response, batch or file id this crate uses: the one rule for every
/// provider id ([`super::batch::valid_id`]).
fn valid_response_id(id: &str) -> bool {
    super::batch::valid_id(id)
}

/// The parameters other providers take and OpenAI's APIs refuse: a job written for Anthropic or
/// Bedrock that falls back here is sent without them rather than refused (a 400, permanent).
const OTHER_PROVIDERS_PARAMETERS: [&str; 9] = [
    "top_k",
    "topP",
    "maxTokens",
    "stopSequences",
    "stop_sequences",
    "thinking",
    "cache_control",
    "additionalModelRequestFields",
    "additional_model_request_fields",
];

/// The job's `parameters`, less the output format of either API (`text`, `response_format`:
/// the format comes from the job's contract, in each API's own form, never from parameters) and
/// other providers' own ([`OTHER_PROVIDERS_PARAMETERS`]).
fn parameters(input: &Map<String, Value>) -> impl Iterator<Item = (&String, &Value)> {
    input
        .get("parameters")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .filter(|(k, _)| !matches!(k.as_str(), "text" | "response_format"))
        .filter(|(k, _)| !OTHER_PROVIDERS_PARAMETERS.contains(&k.as_str()))
}

/// The contract's output format as the Responses API's `text.format`: its JSON Schema in
/// OpenAI's strict dialect (`strict: false` when strict mode cannot take it: see
/// [`dialect::openai_not_strict`]), or any JSON object when the contract has no schema;
/// nothing for text.
fn responses_format(contract: &Contract) -> Option<Value> {
    if !contract.wants_json() {
        return None;
    }
    Some(match contract.schema() {
        Some(schema) => {
            let schema = dialect::openai(schema);
            let strict = dialect::openai_not_strict(&schema).is_none();
            json!({
                "type": "json_schema",
                "name": contract.schema_name(),
                "schema": schema,
                "strict": strict,
            })
        }
        None => json!({"type": "json_object"}),
    })
}

/// `builder` with `key` as its bearer token, when there is one.
fn with_key(builder: reqwest::RequestBuilder, key: Option<&Secret>) -> reqwest::RequestBuilder {
    match key {
        Some(key) => builder.bearer_auth(key.expose()),
        None => builder,
    }
}

/// Sends a job that sets no ceiling on its answer with the deployment's (`name`: the API's
/// spelling).
fn bound_answer(body: &mut Map<String, Value>, req: &ProviderRequest<'_>, name: &str) {
    if req.max_output_tokens > 0 && crate::job::output_ceiling(req.input) == 0 {
        body.insert(name.into(), json!(req.max_output_tokens));
    }
}

/// The job's conversation as Responses API input (a prompt is sent as plain text).
fn responses_input(input: &Map<String, Value>) -> Value {
    match (input.get("messages"), input.get("prompt")) {
        (Some(messages @ Value::Array(_)), _) => messages.clone(),
        (_, Some(prompt)) => prompt.clone(),
        _ => Value::Null,
    }
}

/// The text of a Responses API object: every `output_text` part of every message, in order.
fn output_text(json: &Value) -> Option<String> {
    let mut text = None::<String>;
    for item in json.get("output")?.as_array()? {
        for part in item
            .get("content")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if part.get("type").and_then(Value::as_str) == Some("output_text")
                && let Some(t) = part.get("text").and_then(Value::as_str)
            {
                text.get_or_insert_with(String::new).push_str(t);
            }
        }
    }
    text
}

/// The answer recorded in the ledger: the same shape for every provider.
fn answer(
    req: &ProviderRequest<'_>,
    model: &str,
    text: &str,
    json: &Value,
    provider_ref: Option<String>,
    finish: Finish,
) -> Answer {
    let body = json!({
        "contract": req.contract,
        "model": json.get("model").and_then(Value::as_str).unwrap_or(model),
        "output": text,
        "usage": json.get("usage").cloned().unwrap_or(Value::Null),
    });
    Answer {
        body: body.to_string(),
        provider_ref,
        finish,
        usage: json
            .get("usage")
            .and_then(Usage::from_openai)
            .map(|u| u.served_at(json.get("service_tier"))),
        model: json.get("model").and_then(Value::as_str).map(str::to_owned),
        response_id: response_id(json).map(str::to_owned),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::StatusCode;

    #[test]
    fn other_providers_parameters_are_left_out() {
        let input = json!({"parameters": {"temperature": 0.2, "top_k": 40, "stopSequences": ["x"],
                                          "response_format": {}, "seed": 7}});
        let sent: Vec<&str> = parameters(input.as_object().expect("object"))
            .map(|(k, _)| k.as_str())
            .collect();
        assert_eq!(sent, ["seed", "temperature"]);
    }

    #[test]
    fn only_a_missing_api_falls_back_to_chat() {
        assert!(no_responses_api(StatusCode::NOT_FOUND, &Value::Null));
        assert!(no_responses_api(
            StatusCode::METHOD_NOT_ALLOWED,
            &Value::Null
        ));
        let unknown_model = json!({"error": {"code": "model_not_found"}});
        assert!(!no_responses_api(StatusCode::NOT_FOUND, &unknown_model));
        assert!(!no_responses_api(StatusCode::BAD_REQUEST, &Value::Null));
    }

    #[test]
    fn output_text_joins_every_text_part_and_codes_are_sanitised() {
        let json = json!({"output": [
            {"type": "reasoning", "summary": []},
            {"type": "message", "content": [
                {"type": "output_text", "text": "Hello, "},
                {"type": "output_text", "text": "world"}
            ]}
        ]});
        assert_eq!(output_text(&json).as_deref(), Some("Hello, world"));
        assert_eq!(output_text(&json!({"output": []})), None);
        assert_eq!(code_text("bad code: <script>"), "badcodescript");
    }
}
