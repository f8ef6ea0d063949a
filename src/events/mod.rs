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

use crate::job::{JobRecord, JobState};

/// An answer larger than this is not carried in the event: the event names where it is.
pub const EVENT_INLINE_RESULT_BYTES: usize = 64 * 1024;

/// One completion event.
#[derive(Debug, Clone, PartialEq)]
pub struct CompletionEvent {
    /// Derived from job id, epoch and state: the same transition always has the same id.
    pub id: String,
    /// The job.
    pub job_id: String,
    /// The state it entered.
    pub state: JobState,
    /// The event's JSON document (never the prompt).
    pub detail: Value,
}

impl CompletionEvent {
    /// The event for `job` having entered its current state, if that state is announced
    /// (terminal, or `unknown`).
    pub fn of(job: &JobRecord) -> Option<CompletionEvent> {
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
            detail,
        })
    }

    /// The detail type an EventBridge rule or a subscription filter matches on.
    pub fn detail_type(&self) -> &'static str {
        match self.state {
            JobState::Succeeded => "Job Succeeded",
            JobState::FailedTerminal => "Job Failed",
            JobState::Expired => "Job Expired",
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

/// Where completion events are published.
pub trait EventSink: Send + Sync {
    /// Publishes `events` in order. `Err(i)`: the events from `i` on may not have been
    /// published (those before were); the caller publishes them again later.
    fn publish(
        &self,
        events: &[CompletionEvent],
    ) -> impl Future<Output = Result<(), (usize, String)>> + Send;
}

/// Records published events, for tests; can be told to refuse.
#[cfg(any(test, feature = "test-support"))]
#[derive(Debug, Default)]
pub struct RecordingSink {
    published: std::sync::Mutex<Vec<CompletionEvent>>,
    refuse_after: std::sync::Mutex<Option<usize>>,
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

    /// Refuses every event once `n` more were published (`None`: never).
    pub fn refuse_after(&self, n: Option<usize>) {
        *self.refuse_after.lock().unwrap_or_else(|p| p.into_inner()) = n;
    }
}

#[cfg(any(test, feature = "test-support"))]
impl EventSink for RecordingSink {
    async fn publish(&self, events: &[CompletionEvent]) -> Result<(), (usize, String)> {
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
