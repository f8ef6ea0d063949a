//! The webhook function: OpenAI says when a batch ended (`batch.completed`, `batch.failed`,
//! `batch.expired`, `batch.cancelled`), and each of its jobs' triggers is sent by id (a
//! completed batch's by the urgent queue where there is one, whatever the work queue holds), so
//! a worker looks at the batch in seconds instead of at its record's next poll.
//!
//! A delivery is acted on only when its signature is the endpoint's ([`signature`]), its
//! timestamp within five minutes, and its `webhook-id` not acted on before
//! ([`PushedLedger::was_acted_on`]; recorded once its triggers went). What it does changes no job: a trigger by id only
//! makes a worker read the job's item and go on from it, as any redelivery would, so a forged,
//! replayed or late webhook can at most cost a read. The looks at a running batch stay, as the
//! fallback.
//!
//! Other events are acknowledged and left alone. `response.*` among them: a background call
//! handed over by an invocation that ended is looked at again within the clock-skew margin,
//! and an item records no index from a response's id to its job.

pub mod signature;

use std::collections::HashMap;

use base64::Engine;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::job::{JobClass, Millis};
use crate::ledger::pushed::PushedLedger;
use crate::queue::triggers::{Outgoing, TriggerSender};
pub use signature::{Refused, TOLERANCE_S, WebhookSecret};

/// The events that say a batch ended: the batch's jobs are looked at.
const BATCH_ENDED: [&str; 4] = [
    "batch.completed",
    "batch.failed",
    "batch.expired",
    "batch.cancelled",
];

/// The most bytes of a delivery's body read: OpenAI's events are small (an id and a type).
pub const MAX_BODY_BYTES: usize = 64 * 1_024;

/// A request to the function's URL, as Lambda passes it (payload format 2.0; only what is read).
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
pub struct UrlRequest {
    /// The headers, their names lowercase (Lambda's function URLs send them so).
    #[serde(default)]
    pub headers: HashMap<String, String>,
    /// The body, as text or base64.
    #[serde(default)]
    pub body: Option<String>,
    /// Whether `body` is base64.
    #[serde(rename = "isBase64Encoded", default)]
    pub is_base64_encoded: bool,
    /// The request's context: its method.
    #[serde(rename = "requestContext", default)]
    pub request_context: Value,
}

/// The function's answer, as a function URL takes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UrlResponse {
    /// The HTTP status.
    #[serde(rename = "statusCode")]
    pub status_code: u16,
    /// `content-type`.
    pub headers: HashMap<String, String>,
    /// A JSON word on what was done; nothing of the body or the signature.
    pub body: String,
}

impl UrlRequest {
    /// A POST of `body` as the sender signs it under `secret`: the delivery `id` sent at `at_s`
    /// (Unix seconds), with the three Standard Webhooks headers. What tests, the fault
    /// simulation and local tools send.
    pub fn signed(secret: &WebhookSecret, id: &str, at_s: i64, body: &str) -> UrlRequest {
        let headers = [
            ("webhook-id", id.to_owned()),
            ("webhook-timestamp", at_s.to_string()),
            (
                "webhook-signature",
                signature::sign(secret, id, at_s, body.as_bytes()),
            ),
        ];
        UrlRequest {
            headers: headers
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v))
                .collect(),
            body: Some(body.to_owned()),
            is_base64_encoded: false,
            request_context: serde_json::json!({"http": {"method": "POST"}}),
        }
    }
}

/// What one delivery came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// The batch's jobs' triggers were sent (how many; 0 when no list of its jobs was kept).
    Triggered(usize),
    /// A signed event of another kind, acknowledged.
    Ignored,
    /// A delivery acted on before (a replay, or the same one sent twice): nothing sent.
    Replayed,
    /// Not the sender's, or not now: nothing read.
    Refused(Refused),
    /// Not a POST, or a body too large or not an event.
    Malformed(&'static str),
    /// The ledger or the queue failed: nothing is recorded as acted on, so the sender's retry
    /// is.
    Failed(String),
}

impl Answer {
    /// The HTTP answer: 2xx for what is done (or was already), 4xx for what no retry mends,
    /// 5xx for what one does (the sender retries with backoff).
    pub fn response(&self) -> UrlResponse {
        let (status_code, word) = match self {
            Answer::Triggered(_) => (200, "triggered"),
            Answer::Ignored => (200, "ignored"),
            Answer::Replayed => (200, "replayed"),
            Answer::Refused(_) => (401, "refused"),
            Answer::Malformed(_) => (400, "malformed"),
            Answer::Failed(_) => (500, "failed"),
        };
        UrlResponse {
            status_code,
            headers: HashMap::from([("content-type".to_owned(), "application/json".to_owned())]),
            body: serde_json::json!({ "status": word }).to_string(),
        }
    }
}

/// An event as OpenAI sends it: its type, and the id of what it is about.
#[derive(Debug, Deserialize)]
struct Event {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    data: EventData,
}

#[derive(Debug, Default, Deserialize)]
struct EventData {
    #[serde(default)]
    id: String,
}

/// Handles one request to the function's URL at `now` (ms): verified, then acted on once.
pub async fn handle<L: PushedLedger, T: TriggerSender>(
    request: &UrlRequest,
    secret: &WebhookSecret,
    ledger: &L,
    sender: &T,
    now: Millis,
) -> Answer {
    let method = request.request_context.pointer("/http/method");
    if method.and_then(Value::as_str).is_some_and(|m| m != "POST") {
        return Answer::Malformed("not a POST");
    }
    let body = match body_of(request) {
        Ok(body) => body,
        Err(why) => return Answer::Malformed(why),
    };
    let id = match signature::verify(secret, &request.headers, &body, now / 1_000) {
        Ok(id) => id,
        Err(refused) => return Answer::Refused(refused),
    };
    let Ok(event) = serde_json::from_slice::<Event>(&body) else {
        return Answer::Malformed("not an event");
    };
    if !BATCH_ENDED.contains(&event.kind.as_str()) || event.data.id.is_empty() {
        return Answer::Ignored;
    }
    // Acted on once its triggers went: a replay within its window is refused, and a delivery
    // cut off before the end (a timeout, a crash) is acted on by the sender's retry. Two
    // copies at once may both send: a trigger sent twice costs a read, nothing more.
    match ledger.was_acted_on(id, now).await {
        Ok(false) => {}
        Ok(true) => return Answer::Replayed,
        Err(e) => return Answer::Failed(format!("the delivery's record was not read: {e}")),
    }
    // A completed batch's answers wait, paid for: its triggers jump the work queue's backlog.
    // A batch that failed, expired or was cancelled leaves lines to run again, which go by the
    // jobs' own queues, as new work does (decision 169).
    let jump = event.kind == "batch.completed";
    let sent = match trigger_members(ledger, sender, &event.data.id, jump, id).await {
        Ok(sent) => sent,
        Err(why) => return Answer::Failed(why),
    };
    // Kept past the timestamp's tolerance either way: after that the timestamp refuses it.
    let until = now + 2 * TOLERANCE_S * 1_000;
    if let Err(e) = ledger.acted_on(id, now, until).await {
        // The triggers went: a retry sends them again, which is harmless.
        tracing::warn!(error = %e, "a delivery acted on was not recorded");
    }
    Answer::Triggered(sent)
}

/// Sends the trigger of each job of `batch` (deduplicated on a FIFO queue by the delivery), by
/// the urgent queue if `jump`: how many, or why not all went.
async fn trigger_members<L: PushedLedger, T: TriggerSender>(
    ledger: &L,
    sender: &T,
    batch: &str,
    jump: bool,
    delivery: &str,
) -> Result<usize, String> {
    let members = ledger
        .batch_members(batch)
        .await
        .map_err(|e| format!("the batch's jobs were not read: {e}"))?;
    if members.is_empty() {
        tracing::info!(%batch, "a batch ended whose jobs no list keeps");
        return Ok(0);
    }
    // Collecting an answer is a few reads and writes: by the urgent queue (where there is one),
    // whose own event source mapping receives it ahead of the work queue's backlog. The job
    // keeps its class: a trigger by id carries none.
    let triggers: Vec<Outgoing> = members
        .iter()
        .map(|m| {
            let class = JobClass {
                urgent: jump || m.class.urgent,
                ..m.class.clone()
            };
            Outgoing::by_id(&m.job_id).of_class(&class)
        })
        .collect();
    let suffix = format!("webhook-{delivery}");
    let sent = sender.send(&triggers, &suffix).await;
    let failed = sent.iter().filter(|(_, r)| r.is_err()).count();
    tracing::info!(%batch, jobs = triggers.len(), failed, "a batch ended: its jobs' triggers sent");
    match failed {
        0 => Ok(triggers.len()),
        n => Err(format!("{n} of {} triggers were not sent", triggers.len())),
    }
}

/// The endpoint's signing secret, from where the environment says (`OPENAI_WEBHOOK_SECRET`
/// itself, for local use; a Secrets Manager secret, `OPENAI_WEBHOOK_SECRET_ID`, holding it or
/// JSON with `webhook_secret`; or an SSM `SecureString`, `OPENAI_WEBHOOK_SECRET_PARAMETER`).
/// Errors name the source, never the value.
#[cfg(feature = "openai")]
pub async fn read_secret(
    lookup: &dyn Fn(&str) -> Option<String>,
    aws: &aws_config::SdkConfig,
) -> Result<WebhookSecret, String> {
    use crate::provider::keys::{KeySource, KeyVars, resolve};
    let names = KeyVars::OPENAI_WEBHOOK;
    let source =
        KeySource::from_vars(&crate::vars::Vars::new(lookup), names).map_err(|e| e.to_string())?;
    let Some(text) = resolve(&source, names.fields(), aws)
        .await
        .map_err(|e| e.0)?
    else {
        return Err(format!(
            "no webhook secret: set {} (or {})",
            names.secret, names.parameter
        ));
    };
    WebhookSecret::parse(text.expose())
}

/// The request's body, as its bytes, bounded by [`MAX_BODY_BYTES`].
fn body_of(request: &UrlRequest) -> Result<Vec<u8>, &'static str> {
    let text = request.body.as_deref().unwrap_or_default();
    let body = match request.is_base64_encoded {
        true => base64::engine::general_purpose::STANDARD
            .decode(text)
            .map_err(|_| "a body that is not base64")?,
        false => text.as_bytes().to_vec(),
    };
    match body.len() > MAX_BODY_BYTES {
        true => Err("a body too large"),
        false => Ok(body),
    }
}

#[cfg(test)]
mod tests;
