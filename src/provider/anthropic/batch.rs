//! Anthropic's Message Batches: the lines (Messages requests, whole) created as one batch in
//! one request, its status read, its results read once it ended, and the batches listed to
//! find a line whose batch id was never recorded (an ended batch's results show its lines; a
//! batch still processing cannot say, so the look waits for it).

use std::sync::Arc;

use reqwest::RequestBuilder;
use serde_json::{Value, json};

use super::{AnthropicProvider, classify};
use crate::job::message::parse_rfc3339_ms;
use crate::job::{BatchCounts, Millis};
use crate::provider::batch::{
    BatchApi, BatchLine, Book, Results, Status, batch_id, create_failed, never_ran, valid_id,
};
use crate::provider::http::{code_text, read_lines};
use crate::provider::keys::Secret;
use crate::provider::{ProviderError, ProviderRequest, Retrieval};

/// The longest wait for one request about batches.
const REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

impl AnthropicProvider {
    /// `req` as a line of a batch: its Messages request, whole.
    pub(super) fn line(
        &self,
        req: &ProviderRequest<'_>,
        id: &str,
    ) -> Result<BatchLine, ProviderError> {
        let params = Value::Object(self.body(req)?);
        Ok(BatchLine {
            id: id.to_owned(),
            body: json!({"custom_id": id, "params": params}).to_string(),
        })
    }

    /// A request to `path` under the API, with the version header and the key.
    fn request(&self, method: reqwest::Method, path: &str, key: Option<&Secret>) -> RequestBuilder {
        let request = self
            .http
            .request(method, format!("{}{path}", self.settings.base_url))
            .timeout(REQUEST_TIMEOUT)
            .header("anthropic-version", &self.settings.version);
        match key {
            Some(key) => request.header("x-api-key", key.expose()),
            None => request,
        }
    }

    /// Creates the batch of `lines` in one request. A create whose answer was lost may have
    /// created it (uncertain: its lines are found by listing once it ended).
    pub(super) async fn create_batch(&self, lines: &[BatchLine]) -> Result<String, ProviderError> {
        let mut body = String::from(r#"{"requests":["#);
        for (i, line) in lines.iter().enumerate() {
            if i > 0 {
                body.push(',');
            }
            body.push_str(&line.body);
        }
        body.push_str("]}");
        let (status, headers, json) = self
            .key
            .send(
                |key| {
                    self.request(reqwest::Method::POST, "/v1/messages/batches", key)
                        .header("content-type", "application/json")
                        .body(body.clone())
                },
                classify,
            )
            .await?;
        if !status.is_success() {
            let said = classify(status, &headers, &json);
            return Err(create_failed(status.as_u16(), said));
        }
        batch_id(&json).ok_or_else(|| ProviderError::Uncertain {
            evidence: "batch created without a usable id".to_owned(),
        })
    }

    async fn get(&self, path: &str) -> Result<Value, Retrieval> {
        let sent = self
            .key
            .send(
                |key| self.request(reqwest::Method::GET, path, key),
                classify,
            )
            .await;
        match sent {
            Ok((status, _, json)) if status.is_success() => Ok(json),
            Ok((status, headers, _)) => Err(match status.as_u16() {
                401 | 403 => Retrieval::Denied,
                404 => Retrieval::NotFound,
                _ => Retrieval::Unreachable {
                    retry_after_ms: crate::provider::http::retry_after_ms(&headers),
                },
            }),
            Err(_) => Err(Retrieval::Unreachable {
                retry_after_ms: None,
            }),
        }
    }

    /// An ended batch's results, by line, within the budget ([`Results`]), `want`'s kept.
    async fn results(&self, batch_id: &str, want: &str) -> Option<Results> {
        let path = format!("/v1/messages/batches/{batch_id}/results");
        let key = self.key.current();
        let mut lines = Results::reading(want);
        let request = self.request(reqwest::Method::GET, &path, key.as_ref());
        let read = read_lines(request, |id, raw| lines.line(id, raw)).await;
        read.then(|| lines.done())
    }
}

impl BatchApi for AnthropicProvider {
    fn book(&self) -> &Book {
        &self.book
    }

    async fn status(&self, batch_id: &str, want: &str) -> Result<Status, Retrieval> {
        if !valid_id(batch_id) {
            return Err(Retrieval::Denied);
        }
        let batch = self
            .get(&format!("/v1/messages/batches/{batch_id}"))
            .await?;
        match batch.get("processing_status").and_then(Value::as_str) {
            Some("ended") => {
                let results = self
                    .results(batch_id, want)
                    .await
                    .ok_or(Retrieval::Unreachable {
                        retry_after_ms: None,
                    })?;
                Ok(Status::Ended(Arc::new(results)))
            }
            Some(_) => Ok(Status::Running(counts(&batch))),
            None => Err(Retrieval::Unreachable {
                retry_after_ms: None,
            }),
        }
    }

    fn list_path(&self, after: Option<&str>) -> String {
        match after {
            Some(last) => format!("/v1/messages/batches?limit=100&after_id={last}"),
            None => "/v1/messages/batches?limit=100".to_owned(),
        }
    }

    async fn get_json(&self, path: &str) -> Result<Value, Retrieval> {
        self.get(path).await
    }

    fn created_ms(&self, batch: &Value) -> Option<Millis> {
        batch
            .get("created_at")
            .and_then(Value::as_str)
            .and_then(parse_rfc3339_ms)
    }

    async fn holds(&self, batch_id: &str, line: &str) -> Option<bool> {
        // An ended batch never changes: its results are read once per environment.
        if let Some(Status::Ended(results)) = self.book.status(batch_id, Millis::MAX)
            && let Some(held) = results.holds(line)
        {
            return Some(held);
        }
        match self.status(batch_id, line).await.ok()? {
            Status::Ended(results) => {
                self.book.keep(
                    batch_id,
                    crate::clock::Clock::now_ms(&crate::clock::SystemClock),
                    Status::Ended(results.clone()),
                );
                results.holds(line)
            }
            // Its lines show only once it ended.
            Status::Running(_) | Status::Failed(_) => None,
        }
    }

    fn line_result(&self, raw: &str, req: &ProviderRequest<'_>) -> Retrieval {
        let line: Value = serde_json::from_str(raw).unwrap_or_default();
        let result = line.get("result").cloned().unwrap_or_default();
        match result.get("type").and_then(Value::as_str) {
            Some("succeeded") => {
                let message = result.get("message").cloned().unwrap_or_default();
                match self.answer(req, &message) {
                    Ok(answer) => Retrieval::Completed(answer),
                    Err(error) => Retrieval::Failed(error),
                }
            }
            Some("errored") => {
                let kind = result
                    .pointer("/error/error/type")
                    .and_then(Value::as_str)
                    .unwrap_or("unspecified");
                let reason = format!("batch line failed: {}", code_text(kind));
                Retrieval::Failed(match kind {
                    "invalid_request_error" | "not_found_error" | "request_too_large" => {
                        ProviderError::Permanent { reason }
                    }
                    _ => ProviderError::Transient {
                        retry_after_ms: None,
                        reason,
                    },
                })
            }
            // Never run: the batch was cancelled or ran out of its 24 hours first.
            Some(kind @ ("canceled" | "expired")) => {
                Retrieval::Failed(never_ran(format!("batch line {kind} before it ran")))
            }
            _ => Retrieval::Failed(ProviderError::Uncertain {
                evidence: "batch line without a known result".to_owned(),
            }),
        }
    }
}

/// A running batch's `request_counts` (`processing`, `succeeded`, `errored`, `canceled`,
/// `expired`; Anthropic's Message Batches API) in the common form.
fn counts(batch: &Value) -> Option<BatchCounts> {
    let counts = batch.get("request_counts")?;
    let count = |name: &str| counts.get(name).and_then(Value::as_u64);
    let (processing, succeeded) = (count("processing")?, count("succeeded")?);
    let failed = ["errored", "canceled", "expired"]
        .iter()
        .filter_map(|name| count(name))
        .sum::<u64>();
    Some(BatchCounts {
        total: processing + succeeded + failed,
        completed: succeeded,
        failed,
    })
}
