//! Completion events: one for each transition of a job into a terminal state, and one when a job
//! becomes `unknown` (an operator has to act). The table's stream is the outbox: DynamoDB writes
//! the stream record in the same transition, and the dispatcher turns it into one event whose id
//! derives from the job id, the epoch and the state, so a consumer drops duplicates by id.
//!
//! Where events go is a [`EventSink`]: an EventBridge bus, an SNS topic or an SQS queue
//! ([`aws`]).

pub mod aws;

use std::future::Future;

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::job::{JobItem, JobState};

/// An answer larger than this is not carried in the event: the event names where it is.
pub(crate) const EVENT_INLINE_RESULT_BYTES: usize = 64 * 1024;

/// One completion event.
#[derive(Debug, Clone, PartialEq)]
pub struct CompletionEvent {
    /// Derived from job id, epoch and state: the same transition always has the same id.
    pub id: String,
    /// The job.
    pub job_id: String,
    /// The state it entered.
    pub state: JobState,
    /// The producer whose job it is (`billing` of `billing/job-1`), when producers are kept
    /// apart: on EventBridge a rule matches `detail.producer`; on SNS and SQS it is also the
    /// message attribute `producer`, which a subscription's filter policy reads.
    pub producer: Option<String>,
    /// The event's JSON document (never the prompt).
    pub detail: Value,
}

/// How the job's calls went, into the event's `fields`: the provider batch of its last
/// attempt, the path chosen for it and why, and what its attempts used and cost.
fn call_fields(job: &JobItem, fields: &mut serde_json::Map<String, Value>) {
    // The provider batch its last attempt went in, for a deferrable job.
    if let Some((batch, _)) = job
        .last_provider_ref()
        .and_then(crate::provider::batch::parse_ref)
    {
        // Its id, once recorded (a line found only by listing keeps its pending one).
        let batch = match batch {
            Some(id) => json!({ "id": id }),
            None => json!({ "pending": true }),
        };
        fields.insert("batch".into(), batch);
    }
    // The path the worker chose for its last attempt, and why.
    if let Some((rate, why)) = job
        .attempt_log
        .last()
        .and_then(|a| a.route.as_ref()?.path.as_ref())
    {
        fields.insert(
            "path".into(),
            json!({ "name": crate::job::path::name(*rate), "why": why }),
        );
    }
    // What the job's attempts used and cost, in the ledger's one vocabulary.
    if let Some(usage) = job.usage() {
        fields.insert("usage".into(), json!(usage));
    }
}

impl CompletionEvent {
    /// The event for `job` having entered its current state, if that state is announced
    /// (terminal, or `unknown`).
    pub fn of(job: &JobItem) -> Option<CompletionEvent> {
        if !announced(job.state) {
            return None;
        }
        let id = event_id(&job.job_id, job.owner_epoch, job.state);
        let mut detail = json!({
            "event_id": id,
            "job_id": job.job_id,
            "state": job.state.as_str(),
            "epoch": job.owner_epoch,
            "attempts": job.attempts,
            "at": job.updated_at,
            "metadata": job.metadata.as_deref().and_then(|m| serde_json::from_str::<Value>(m).ok()),
        });
        let fields = detail.as_object_mut().expect("a json! object");
        let producer = crate::job::scope::producer_of(&job.job_id).map(str::to_owned);
        if let Some(producer) = &producer {
            fields.insert("producer".into(), Value::String(producer.clone()));
        }
        // Whose and how urgent: a rule matches `detail.tenant` (the job's account, its
        // producer's and its tenant's names together) or `detail.priority`.
        fields.insert("tenant".into(), Value::String(job.account()));
        if job.class.urgent {
            fields.insert("priority".into(), Value::String("urgent".into()));
        }
        if let Some(blob) = &job.result_ref {
            fields.insert("result_ref".into(), blob.to_json());
        } else if let Some(result) = &job.result {
            match serde_json::from_str::<Value>(result) {
                Ok(answer) if result.len() <= EVENT_INLINE_RESULT_BYTES => {
                    fields.insert("result".into(), answer);
                }
                // Too large for an event: `jobctl result` reads it from the item.
                _ => {
                    fields.insert("result_in_ledger".into(), Value::Bool(true));
                }
            }
        }
        call_fields(job, fields);
        if job.state != JobState::Succeeded
            && let Some(error) = &job.last_error
        {
            fields.insert(
                "error".into(),
                json!({ "kind": error.kind, "message": error.message }),
            );
        }
        Some(CompletionEvent {
            id,
            job_id: job.job_id.clone(),
            state: job.state,
            producer,
            detail,
        })
    }

    /// The detail type an EventBridge rule or a subscription filter matches on.
    pub(crate) fn detail_type(&self) -> &'static str {
        match self.state {
            JobState::Succeeded => "Job Succeeded",
            JobState::FailedTerminal => "Job Failed",
            JobState::Expired => "Job Expired",
            JobState::Cancelled => "Job Cancelled",
            _ => "Job Needs Decision",
        }
    }
}

/// Whether entering `state` is announced.
pub fn announced(state: JobState) -> bool {
    state.is_terminal() || state == JobState::Unknown
}

/// The id of the event for `job_id` entering `state` at `epoch`: 32 hex characters.
pub fn event_id(job_id: &str, epoch: u64, state: JobState) -> String {
    let mut hasher = Sha256::new();
    hasher.update(b"fenced-jobs/event/v1\0");
    hasher.update(job_id.as_bytes());
    hasher.update(format!("\0{epoch}\0{}", state.as_str()).as_bytes());
    crate::job::message::hex(&hasher.finalize()[..16])
}

impl CompletionEvent {
    /// The event without its inline answer, which `jobctl result` reads from the item instead:
    /// for an event too large for one request of its target.
    pub(crate) fn without_result(&self) -> CompletionEvent {
        let mut slim = self.clone();
        if let Some(fields) = slim.detail.as_object_mut()
            && fields.remove("result").is_some()
        {
            fields.insert("result_in_ledger".into(), Value::Bool(true));
        }
        slim
    }
}

/// The services completion events go to, and what one request to them may carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// EventBridge `PutEvents`.
    EventBridge,
    /// SNS `PublishBatch`.
    Sns,
    /// SQS `SendMessageBatch`.
    Sqs,
}

/// Entries in one request: the limit of all three APIs.
pub(crate) const MAX_REQUEST_ENTRIES: usize = 10;

/// The `source` of every event on an EventBridge bus.
pub const EVENT_SOURCE: &str = "fenced-jobs";

impl Target {
    /// The most bytes one request may carry: 256 KiB for `PutEvents` (all entries) and
    /// `PublishBatch` (all messages with their attributes), 1 MiB for `SendMessageBatch`.
    pub(crate) fn max_request_bytes(self) -> usize {
        match self {
            Target::EventBridge | Target::Sns => 256 * 1024,
            Target::Sqs => 1024 * 1024,
        }
    }

    /// The bytes `event` counts for in a request, as the service counts them: for EventBridge,
    /// the UTF-8 bytes of the source, the detail type, the detail and each resource (a time
    /// would add 14; none is set); for SNS, the message and each attribute's name, type and
    /// value (the `state` and `producer` attributes); for SQS, the body and the `producer`
    /// attribute.
    pub(crate) fn entry_bytes(self, event: &CompletionEvent) -> usize {
        let detail = event.detail.to_string().len();
        let producer = event
            .producer
            .as_ref()
            .map_or(0, |p| "producer".len() + "String".len() + p.len());
        match self {
            Target::EventBridge => {
                EVENT_SOURCE.len() + event.detail_type().len() + detail + event.job_id.len()
            }
            Target::Sns => {
                detail + "state".len() + "String".len() + event.state.as_str().len() + producer
            }
            Target::Sqs => detail + producer,
        }
    }
}

/// The requests `events` go in, in order, each as many as fit by entries and bytes. An event
/// too large for a request of its own must be made smaller first ([`publish`] does).
pub fn requests(events: &[CompletionEvent], target: Target) -> Vec<std::ops::Range<usize>> {
    let limit = target.max_request_bytes();
    let mut out = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (i, event) in events.iter().enumerate() {
        let size = target.entry_bytes(event);
        if i > start && (i - start == MAX_REQUEST_ENTRIES || bytes + size > limit) {
            out.push(start..i);
            (start, bytes) = (i, 0);
        }
        bytes += size;
    }
    if start < events.len() {
        out.push(start..events.len());
    }
    out
}

/// Where completion events are published.
pub trait EventSink: Send + Sync {
    /// The service behind the sink, whose request limits apply.
    fn target(&self) -> Target;

    /// Sends one request: at most [`MAX_REQUEST_ENTRIES`] events within the target's
    /// [`Target::max_request_bytes`]. `Err(i)`: the events from `i` on may not have been
    /// published (those before were).
    fn send(
        &self,
        events: &[CompletionEvent],
    ) -> impl Future<Output = Result<(), (usize, String)>> + Send;
}

/// Publishes `events` in order through `sink`, in requests that fit its target's limits; an
/// event too large for a request of its own goes without its inline answer. `Err(i)`: the
/// events from `i` on may not have been published (those before were); the caller publishes
/// them again later.
pub async fn publish(
    sink: &impl EventSink,
    events: &[CompletionEvent],
) -> Result<(), (usize, String)> {
    let target = sink.target();
    let fitted: Vec<CompletionEvent> = events
        .iter()
        .map(|e| {
            if target.entry_bytes(e) > target.max_request_bytes() {
                e.without_result()
            } else {
                e.clone()
            }
        })
        .collect();
    for range in requests(&fitted, target) {
        let start = range.start;
        sink.send(&fitted[range])
            .await
            .map_err(|(i, why)| (start + i, why))?;
    }
    Ok(())
}

/// Records published events, for tests; can be told to refuse. It refuses a whole request, as
/// the service does, when it holds more than ten events or more bytes than its target allows
/// (counted here as the services document it, apart from [`Target::entry_bytes`]).
#[cfg(any(test, feature = "test-support"))]
#[derive(Debug, Default)]
pub struct RecordingSink {
    published: std::sync::Mutex<Vec<CompletionEvent>>,
    refuse_after: std::sync::Mutex<Option<usize>>,
    requests: std::sync::Mutex<Vec<usize>>,
    target: Option<Target>,
}

#[cfg(any(test, feature = "test-support"))]
impl RecordingSink {
    /// An empty recorder.
    pub fn new() -> Self {
        Self::default()
    }

    /// Every event published so far.
    pub fn published(&self) -> Vec<CompletionEvent> {
        self.published
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// An empty recorder standing for `target`, with its limits.
    pub fn of(target: Target) -> Self {
        RecordingSink {
            target: Some(target),
            ..Self::default()
        }
    }

    #[cfg(test)]
    /// Refuses every event once `n` more were published (`None`: never).
    pub(crate) fn refuse_after(&self, n: Option<usize>) {
        *self.refuse_after.lock().unwrap_or_else(|p| p.into_inner()) = n;
    }

    /// The number of events of each request sent so far.
    pub fn requests(&self) -> Vec<usize> {
        self.requests
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

#[cfg(any(test, feature = "test-support"))]
impl EventSink for RecordingSink {
    fn target(&self) -> Target {
        self.target.unwrap_or(Target::EventBridge)
    }

    async fn send(&self, events: &[CompletionEvent]) -> Result<(), (usize, String)> {
        self.requests
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(events.len());
        if let Some(target) = self.target {
            let bytes: usize = events
                .iter()
                .map(|e| {
                    let body = serde_json::to_vec(&e.detail).map_or(0, |b| b.len());
                    match target {
                        Target::EventBridge => {
                            "fenced-jobs".len() + e.detail_type().len() + body + e.job_id.len()
                        }
                        Target::Sns => body + 11 + e.state.as_str().len(),
                        Target::Sqs => body,
                    }
                })
                .sum();
            let limit = match target {
                Target::Sqs => 1_048_576,
                _ => 262_144,
            };
            if events.len() > 10 || bytes > limit {
                return Err((
                    0,
                    format!("request refused: {} events, {bytes} bytes", events.len()),
                ));
            }
        }
        let mut budget = self.refuse_after.lock().unwrap_or_else(|p| p.into_inner());
        let mut published = self.published.lock().unwrap_or_else(|p| p.into_inner());
        for (i, event) in events.iter().enumerate() {
            match budget.as_mut() {
                Some(0) => return Err((i, "refused".to_owned())),
                Some(n) => *n -= 1,
                None => {}
            }
            published.push(event.clone());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cancelled_job_is_announced_as_cancelled_with_who_cancelled_it() {
        let mut job = crate::protocol::claimed_example(10_000, 1_000, None);
        job.state = JobState::Cancelled;
        job.last_error = Some(crate::job::ErrorRecord {
            kind: "cancelled".into(),
            message: "cancelled by alice".into(),
            at: 2_000,
        });
        let event = CompletionEvent::of(&job).expect("announced");
        assert_eq!(event.detail_type(), "Job Cancelled");
        assert_eq!(event.detail["state"], "cancelled");
        assert_eq!(event.detail["error"]["kind"], "cancelled");
        assert_eq!(event.detail["error"]["message"], "cancelled by alice");
    }
}
