//! OpenAI's Batch API: the lines (Chat Completions requests, the one endpoint every
//! OpenAI-compatible server has) uploaded as one JSONL file, the batch created over it with a
//! 24-hour window, its status read, its output and error files read once it ended, and the
//! batches listed to find a line whose batch id was never recorded.

use std::sync::Arc;

use reqwest::StatusCode;
use reqwest::header::HeaderMap;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::status::{classify, retrieval_error};
use super::{OpenAiProvider, with_key};
use crate::job::{BatchCounts, Millis};
use crate::provider::batch::{
    BatchApi, BatchLine, Book, Results, Status, create_failed, never_ran,
};
use crate::provider::http::{code_text, read_lines};
use crate::provider::{ProviderError, ProviderRequest, Retrieval};

/// What this crate's batches carry in their metadata, so an operator can tell them apart.
const SOURCE: &str = "fenced-jobs";

impl OpenAiProvider {
    /// `req` as a line of a batch: a Chat Completions request, whole.
    pub(super) fn line(&self, req: &ProviderRequest<'_>, id: &str) -> BatchLine {
        let line = json!({
            "custom_id": id,
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": Value::Object(self.chat_body(req)),
        });
        BatchLine {
            id: id.to_owned(),
            body: line.to_string(),
        }
    }

    /// Uploads the lines as a `batch` file, then creates the batch over it. A failed upload
    /// created nothing that runs (transient); a create whose answer was lost may have created
    /// the batch (uncertain: its lines are found by listing).
    pub(super) async fn create_batch(&self, lines: &[BatchLine]) -> Result<String, ProviderError> {
        let mut jsonl = String::new();
        for line in lines {
            jsonl.push_str(&line.body);
            jsonl.push('\n');
        }
        let (content_type, body) = multipart(&jsonl);
        let upload = self
            .send(|| {
                self.http
                    .post(self.url("/files"))
                    .timeout(self.background_timeout())
                    .header("content-type", &content_type)
                    .body(body.clone())
            })
            .await
            .map_err(|e| ProviderError::Transient {
                retry_after_ms: None,
                reason: format!("batch file not uploaded: {}", e.kind()),
            })?;
        let file = match upload {
            (status, _, json) if status.is_success() => id_of(&json),
            (status, _, _) if matches!(status.as_u16(), 404 | 405) => {
                return Err(self.no_batch_api());
            }
            (status, headers, json) => return Err(refused(status, &headers, &json)),
        }
        .ok_or_else(|| ProviderError::Transient {
            retry_after_ms: None,
            reason: "batch file uploaded without a usable id".to_owned(),
        })?;
        let create = json!({
            "input_file_id": file,
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
            "metadata": self.batch_metadata(),
        });
        let (status, headers, json) = self
            .send(|| {
                self.http
                    .post(self.url("/batches"))
                    .timeout(self.background_timeout())
                    .json(&create)
            })
            .await?;
        if matches!(status.as_u16(), 404 | 405) {
            return Err(self.no_batch_api());
        }
        if !status.is_success() {
            let said = classify(status, &headers, &json);
            return Err(create_failed(status.as_u16(), said));
        }
        id_of(&json).ok_or_else(|| ProviderError::Uncertain {
            evidence: "batch created without a usable id".to_owned(),
        })
    }

    /// The metadata each batch is created with: this crate's name, and the deployment's when
    /// it has one.
    fn batch_metadata(&self) -> Value {
        let mut metadata = json!({"source": SOURCE});
        if !self.settings.deployment.is_empty() {
            metadata["deployment"] = json!(self.settings.deployment);
        }
        metadata
    }

    /// The server has no Batch API (a 404 or 405 for its files or batches): deferrable jobs are
    /// called directly from now on, and these lines were not sent.
    fn no_batch_api(&self) -> ProviderError {
        if !self
            .no_batches
            .swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            tracing::warn!("no Batch API on this server; deferrable jobs are called directly");
        }
        ProviderError::Transient {
            retry_after_ms: None,
            reason: "no Batch API on this server".to_owned(),
        }
    }

    /// `GET` of `path`, read as JSON; what a retrieval answers when it cannot be read.
    async fn get(&self, path: &str) -> Result<Value, Retrieval> {
        match self
            .send(|| {
                self.http
                    .get(self.url(path))
                    .timeout(self.background_timeout())
            })
            .await
        {
            Ok((status, _, json)) if status.is_success() => Ok(json),
            Ok((status, headers, _)) => Err(retrieval_error(status, &headers)),
            Err(_) => Err(Retrieval::Unreachable {
                retry_after_ms: None,
            }),
        }
    }

    /// A file's lines, each given to `each` as it arrives (see [`read_lines`]); `false` if
    /// it could not be read whole now.
    async fn file_lines(&self, file: &str, each: impl FnMut(String, &str)) -> bool {
        let request = self
            .http
            .get(self.url(&format!("/files/{file}/content")))
            .timeout(self.background_timeout());
        read_lines(with_key(request, self.key.current().as_ref()), each).await
    }
}

impl BatchApi for OpenAiProvider {
    fn book(&self) -> &Book {
        &self.book
    }

    async fn status(&self, batch_id: &str, want: &str) -> Result<Status, Retrieval> {
        if !super::valid_response_id(batch_id) {
            return Err(Retrieval::Denied);
        }
        let batch = self.get(&format!("/batches/{batch_id}")).await?;
        match batch.get("status").and_then(Value::as_str) {
            Some("completed" | "expired" | "cancelled") => {
                let mut results = Results::reading(want);
                for field in ["output_file_id", "error_file_id"] {
                    let Some(file) = batch.get(field).and_then(Value::as_str) else {
                        continue;
                    };
                    if !super::valid_response_id(file) {
                        continue;
                    }
                    let read = self.file_lines(file, |id, raw| results.line(id, raw)).await;
                    if !read {
                        return Err(Retrieval::Unreachable {
                            retry_after_ms: None,
                        });
                    }
                }
                Ok(Status::Ended(Arc::new(results.done())))
            }
            Some("failed") => {
                let code = batch
                    .pointer("/errors/data/0/code")
                    .and_then(Value::as_str)
                    .unwrap_or("unspecified");
                Ok(Status::Failed(code_text(code)))
            }
            Some(_) => Ok(Status::Running(counts(&batch))),
            None => Err(Retrieval::Unreachable {
                retry_after_ms: None,
            }),
        }
    }

    fn list_path(&self, after: Option<&str>) -> String {
        match after {
            Some(last) => format!("/batches?limit=100&after={last}"),
            None => "/batches?limit=100".to_owned(),
        }
    }

    async fn get_json(&self, path: &str) -> Result<Value, Retrieval> {
        self.get(path).await
    }

    fn created_ms(&self, batch: &Value) -> Option<Millis> {
        let created = batch.get("created_at").and_then(Value::as_i64)?;
        Some(created.saturating_mul(1000))
    }

    /// Ours carry this crate's `metadata.source`, and this deployment's `metadata.deployment`
    /// (a batch without one was made before deployments were named, and may hold a line of
    /// ours still; another deployment's lines never have our ids).
    fn ours(&self, batch: &Value) -> bool {
        let deployment = batch
            .pointer("/metadata/deployment")
            .and_then(Value::as_str);
        batch.pointer("/metadata/source").and_then(Value::as_str) == Some(SOURCE)
            && deployment.is_none_or(|d| d == self.settings.deployment)
    }

    async fn holds(&self, batch_id: &str, line: &str) -> Option<bool> {
        let batch = self.get(&format!("/batches/{batch_id}")).await.ok()?;
        let file = batch
            .get("input_file_id")
            .and_then(Value::as_str)
            .filter(|f| super::valid_response_id(f))?;
        // Only whether it holds the line: nothing of the file is kept.
        let mut held = false;
        let read = self.file_lines(file, |id, _| held |= id == line).await;
        read.then_some(held)
    }

    fn line_result(&self, raw: &str, req: &ProviderRequest<'_>) -> Retrieval {
        let line: Value = serde_json::from_str(raw).unwrap_or_default();
        if let Some(response) = line.get("response").filter(|r| r.is_object()) {
            let code = response
                .get("status_code")
                .and_then(Value::as_u64)
                .and_then(|c| u16::try_from(c).ok())
                .and_then(|c| StatusCode::from_u16(c).ok());
            let body = response.get("body").cloned().unwrap_or_default();
            return match code {
                Some(code) if code.is_success() => match self.chat_answer(req, &body) {
                    Ok(answer) => Retrieval::Completed(answer),
                    Err(error) => Retrieval::Failed(error),
                },
                // A line's outcome is final: what a call's status would leave uncertain (a
                // gateway's, a bare 5xx) is the line's failure here, as is a 429 inside a batch.
                Some(code) => Retrieval::Failed(match classify(code, &HeaderMap::new(), &body) {
                    ProviderError::Permanent { reason } => ProviderError::Permanent { reason },
                    ProviderError::Transient { reason, .. }
                    | ProviderError::Throttled { reason, .. }
                    | ProviderError::Uncertain { evidence: reason } => ProviderError::Transient {
                        retry_after_ms: None,
                        reason: format!("batch line failed: {reason}"),
                    },
                    invalid @ ProviderError::InvalidOutput(_) => invalid,
                }),
                None => Retrieval::Failed(ProviderError::Transient {
                    retry_after_ms: None,
                    reason: "batch line without a status".to_owned(),
                }),
            };
        }
        let code = line
            .pointer("/error/code")
            .and_then(Value::as_str)
            .unwrap_or("unspecified");
        let reason = format!("batch line failed: {}", code_text(code));
        Retrieval::Failed(match code {
            // Never run: the batch ran out of time or was cancelled first.
            "batch_expired" | "batch_cancelled" => never_ran(reason),
            _ => ProviderError::Permanent { reason },
        })
    }
}

/// A refused upload or create: transient or permanent as its status says, but never
/// uncertain (nothing that runs was created).
fn refused(status: StatusCode, headers: &HeaderMap, json: &Value) -> ProviderError {
    match classify(status, headers, json) {
        ProviderError::Uncertain { evidence } => ProviderError::Transient {
            retry_after_ms: None,
            reason: evidence,
        },
        other => other,
    }
}

fn id_of(json: &Value) -> Option<String> {
    json.get("id")
        .and_then(Value::as_str)
        .filter(|id| super::valid_response_id(id))
        .map(str::to_owned)
}

/// A `multipart/form-data` body of the `purpose` and the `file`, and its content type; the
/// boundary is made of the content's digest, so the content cannot hold it.
fn multipart(jsonl: &str) -> (String, Vec<u8>) {
    let digest = Sha256::digest(jsonl.as_bytes());
    let boundary: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
    let boundary = format!("batch-{boundary}");
    let mut body = Vec::with_capacity(jsonl.len() + 400);
    body.extend_from_slice(
        format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n\
             --{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"batch.jsonl\"\r\n\
             Content-Type: application/jsonl\r\n\r\n"
        )
        .as_bytes(),
    );
    body.extend_from_slice(jsonl.as_bytes());
    body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    (format!("multipart/form-data; boundary={boundary}"), body)
}

/// A running batch's `request_counts` (`total`, `completed`, `failed`; OpenAI's Batch
/// object).
fn counts(batch: &Value) -> Option<BatchCounts> {
    let counts = batch.get("request_counts")?;
    let count = |name: &str| counts.get(name).and_then(Value::as_u64);
    Some(BatchCounts {
        total: count("total")?,
        completed: count("completed")?,
        failed: count("failed")?,
    })
}
