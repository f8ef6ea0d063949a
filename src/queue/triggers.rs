//! Triggers: the messages that make the worker look at a job. Which triggers share one
//! `SendMessageBatch` request, and the FIFO deduplication policy, are decided here once for
//! every sender.

use std::future::Future;

use serde_json::json;

/// SQS's limit on one message and on one `SendMessageBatch` request.
pub(crate) const SQS_MAX_BYTES: usize = 1_048_576;
/// Entries in one `SendMessageBatch` request.
pub(crate) const SEND_BATCH_LIMIT: usize = 10;

/// One trigger to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outgoing {
    /// The job it triggers.
    pub job_id: String,
    /// The message body.
    pub body: String,
    /// The job's item was created before this message was sent: the message carries
    /// [`IN_LEDGER_ATTRIBUTE`], so that the worker claims it in place on first sight.
    pub in_ledger: bool,
    /// The job's tenant (its message group on a standard queue) and priority (its queue).
    pub class: crate::job::JobClass,
}

/// The message attribute (`String`, `"true"`) of a whole-job message whose item the producer
/// created first.
pub const IN_LEDGER_ATTRIBUTE: &str = "JobInLedger";

impl Outgoing {
    /// A trigger that carries only the job id.
    pub fn by_id(job_id: &str) -> Outgoing {
        Outgoing {
            job_id: job_id.to_owned(),
            body: json!({ "job_id": job_id }).to_string(),
            in_ledger: true,
            class: crate::job::JobClass::default(),
        }
    }

    /// The trigger, for a job of `class`.
    pub(crate) fn of_class(mut self, class: &crate::job::JobClass) -> Outgoing {
        self.class = class.clone();
        self
    }
}

/// What became of one trigger: sent, or the reason it was not.
pub type Sent = (String, Result<(), String>);

/// Sends triggers to the work queue (an urgent job's to the urgent queue, when there is one).
///
/// Every trigger comes back with its result, in order: sent, or the reason it was not (an entry
/// the queue refused, or a request that failed as a whole). On a FIFO queue each job is its own
/// message group, deduplicated by [`dedup_id`] of the job id and `dedup_suffix`, so a repeat
/// with the same suffix within five minutes is dropped by the queue; on a standard queue a job
/// with a tenant is in its tenant's message group (SQS fair queues).
pub trait TriggerSender: Send + Sync {
    /// Sends `triggers`.
    fn send(
        &self,
        triggers: &[Outgoing],
        dedup_suffix: &str,
    ) -> impl Future<Output = Vec<Sent>> + Send;
}

/// Splits `triggers` into `SendMessageBatch` requests: ten entries at most, and never more
/// bytes than SQS takes in one request.
pub fn batches(triggers: &[Outgoing]) -> Vec<&[Outgoing]> {
    batches_by(triggers, |t| t.body.len())
}

/// Splits `items` into `SendMessageBatch` requests by the size of each body.
pub(crate) fn batches_by<T>(items: &[T], bytes_of: impl Fn(&T) -> usize) -> Vec<&[T]> {
    let mut batches = Vec::new();
    let mut start = 0;
    let mut bytes = 0;
    for (i, item) in items.iter().enumerate() {
        let size = bytes_of(item);
        if i - start == SEND_BATCH_LIMIT || (i > start && bytes + size > SQS_MAX_BYTES) {
            batches.push(&items[start..i]);
            start = i;
            bytes = 0;
        }
        bytes += size;
    }
    if start < items.len() {
        batches.push(&items[start..]);
    }
    batches
}

/// SQS's limit on a FIFO deduplication id.
pub(crate) const MAX_DEDUP_ID_LEN: usize = 128;

/// A FIFO deduplication id from the job id and a suffix: `job-suffix` when that fits in 128
/// characters; otherwise the start of the job id and a digest of both, so that two suffixes
/// never share an id, however long the job id.
pub(crate) fn dedup_id(job_id: &str, suffix: &str) -> String {
    let plain = format!("{job_id}-{suffix}");
    if plain.len() <= MAX_DEDUP_ID_LEN {
        return plain;
    }
    use sha2::{Digest, Sha256};
    let digest: String = Sha256::digest(plain.as_bytes())
        .iter()
        .take(16)
        .map(|b| format!("{b:02x}"))
        .collect();
    let keep = MAX_DEDUP_ID_LEN - 1 - digest.len();
    let start: String = job_id.chars().take(keep).collect();
    format!("{start}-{digest}")
}

/// Records the triggers it is asked to send, for tests.
#[cfg(any(test, feature = "test-support"))]
#[derive(Debug, Default)]
pub struct RecordingTriggers {
    sent: std::sync::Mutex<Vec<(Outgoing, String)>>,
}

#[cfg(any(test, feature = "test-support"))]
impl RecordingTriggers {
    /// An empty recorder.
    pub fn new() -> Self {
        Self::default()
    }

    /// Every trigger sent so far, with its deduplication suffix.
    pub fn sent(&self) -> Vec<(Outgoing, String)> {
        self.sent.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

#[cfg(any(test, feature = "test-support"))]
impl TriggerSender for RecordingTriggers {
    async fn send(&self, triggers: &[Outgoing], dedup_suffix: &str) -> Vec<Sent> {
        let mut sent = self.sent.lock().unwrap_or_else(|p| p.into_inner());
        triggers
            .iter()
            .map(|t| {
                sent.push((t.clone(), dedup_suffix.to_owned()));
                (t.job_id.clone(), Ok(()))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_hold_ten_entries_and_stay_under_the_request_limit() {
        let small: Vec<Outgoing> = (0..23).map(|i| Outgoing::by_id(&format!("j{i}"))).collect();
        let sizes: Vec<usize> = batches(&small).iter().map(|b| b.len()).collect();
        assert_eq!(sizes, vec![10, 10, 3]);
        let big = |id: &str| Outgoing {
            class: crate::job::JobClass::default(),
            job_id: id.to_owned(),
            body: "x".repeat(400_000),
            in_ledger: false,
        };
        let large = vec![big("a"), big("b"), big("c")];
        let sizes: Vec<usize> = batches(&large).iter().map(|b| b.len()).collect();
        assert_eq!(sizes, vec![2, 1]);
        assert!(batches(&[]).is_empty());
    }

    #[test]
    fn deduplication_ids_fit_fifo_limits_and_stay_unique() {
        assert_eq!(dedup_id("job", "epoch-2"), "job-epoch-2");
        let long = "j".repeat(128);
        let (a, b) = (dedup_id(&long, "epoch-2"), dedup_id(&long, "epoch-3"));
        assert!(a.len() <= MAX_DEDUP_ID_LEN && b.len() <= MAX_DEDUP_ID_LEN);
        assert_ne!(
            a, b,
            "a re-send under a new epoch must not be dropped as a duplicate"
        );
        assert_ne!(
            dedup_id(&"k".repeat(200), "s"),
            dedup_id(&"k".repeat(201), "s")
        );
    }
}
