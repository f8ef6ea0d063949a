//! Setting the visibility of records that stay in the queue.

use std::future::Future;
#[cfg(any(test, feature = "test-support"))]
use std::sync::Mutex;

/// One record's new visibility timeout. The receipt handle is a capability for one delivery:
/// it is passed to SQS and never logged or stored.
#[derive(Clone, PartialEq, Eq)]
pub struct VisibilityChange {
    /// The delivery's receipt handle.
    pub receipt_handle: String,
    /// Seconds from now until the record becomes visible again.
    pub seconds: i32,
}

impl std::fmt::Debug for VisibilityChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VisibilityChange")
            .field("receipt", &fingerprint(&self.receipt_handle))
            .field("seconds", &self.seconds)
            .finish()
    }
}

/// What became of one requested change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeResult {
    /// SQS confirmed it.
    Changed,
    /// SQS refused it (for example `ReceiptHandleIsInvalid`: the delivery is over).
    Refused,
    /// No answer (the call failed or timed out): it may or may not have happened.
    Uncertain,
}

/// Per-change results of one [`VisibilityControl::change`], in the order of the request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChangeResults {
    /// API calls made.
    pub calls: u32,
    /// One result per requested change.
    pub results: Vec<ChangeResult>,
}

/// What a round of visibility changes achieved.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VisibilityReport {
    /// API calls made.
    pub calls: u32,
    /// Handles changed.
    pub changed: u32,
    /// Handles SQS refused (for example `ReceiptHandleIsInvalid`).
    pub refused: u32,
    /// Handles whose change failed without an answer (a call that errored).
    pub uncertain: u32,
}

impl VisibilityReport {
    /// Adds one call's results.
    pub(crate) fn add(&mut self, results: &ChangeResults) {
        self.calls += results.calls;
        for r in &results.results {
            match r {
                ChangeResult::Changed => self.changed += 1,
                ChangeResult::Refused => self.refused += 1,
                ChangeResult::Uncertain => self.uncertain += 1,
            }
        }
    }
}

/// Changes the visibility of records of one queue, batched. Failures are reported, not raised:
/// a record whose change failed keeps its current timeout and comes back when it ends.
pub trait VisibilityControl: Send + Sync {
    /// Applies `changes` on the queue named by `queue_arn`.
    fn change(
        &self,
        queue_arn: &str,
        changes: Vec<VisibilityChange>,
    ) -> impl Future<Output = ChangeResults> + Send;

    /// The queue's real visibility timeout in seconds, if it can be learnt (once per queue and
    /// execution environment); `None` leaves the configured one in force.
    fn visibility_timeout_s(&self, _queue_arn: &str) -> impl Future<Output = Option<i64>> + Send {
        async { None }
    }
}

/// A short, non-reversible fingerprint of a receipt handle, for correlation in logs.
pub(crate) fn fingerprint(receipt_handle: &str) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(receipt_handle.as_bytes());
    digest.iter().take(4).map(|b| format!("{b:02x}")).collect()
}

/// Records the changes it is asked for, for tests; refuses the handles it is told to.
#[cfg(any(test, feature = "test-support"))]
#[derive(Debug, Default)]
pub struct RecordingVisibility {
    changes: Mutex<Vec<(String, VisibilityChange)>>,
    refused: Mutex<Vec<String>>,
    timeout_s: Mutex<Option<i64>>,
}

#[cfg(any(test, feature = "test-support"))]
impl RecordingVisibility {
    /// An empty recorder.
    pub fn new() -> Self {
        Self::default()
    }

    /// From now on, refuses changes to this handle (as SQS does once a delivery is over).
    pub fn refuse(&self, receipt_handle: &str) {
        self.refused
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(receipt_handle.to_owned());
    }

    /// From now on, reports this as every queue's real visibility timeout.
    pub fn set_visibility_timeout(&self, seconds: i64) {
        *self.timeout_s.lock().unwrap_or_else(|p| p.into_inner()) = Some(seconds);
    }

    /// Every change so far, with its queue ARN.
    pub fn changes(&self) -> Vec<(String, VisibilityChange)> {
        self.changes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

#[cfg(any(test, feature = "test-support"))]
impl VisibilityControl for RecordingVisibility {
    async fn visibility_timeout_s(&self, _queue_arn: &str) -> Option<i64> {
        *self.timeout_s.lock().unwrap_or_else(|p| p.into_inner())
    }

    async fn change(&self, queue_arn: &str, changes: Vec<VisibilityChange>) -> ChangeResults {
        let refused = self
            .refused
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let results = changes
            .iter()
            .map(|c| {
                if refused.contains(&c.receipt_handle) {
                    ChangeResult::Refused
                } else {
                    ChangeResult::Changed
                }
            })
            .collect();
        let calls = changes.len().div_ceil(10) as u32;
        self.changes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(changes.into_iter().map(|c| (queue_arn.to_owned(), c)));
        ChangeResults { calls, results }
    }
}
