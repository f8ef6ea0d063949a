//! The worker's own dead-letter sends: a poison or conflicting message goes to the DLQ at once,
//! with its reason as message attributes, and is acknowledged only once the send succeeded. So
//! the redrive policy's `maxReceiveCount` can be high enough that a live job, handed over or
//! waiting for a decision many times, is never dead-lettered.

use std::fmt::Debug;

use futures::future::BoxFuture;

/// The attribute that names why the worker dead-lettered a message (`poison`, `conflict`).
pub const REASON_ATTRIBUTE: &str = "fenced-jobs.reason";
/// The attribute with the classification (the rule a body broke, or both digests).
pub const DETAIL_ATTRIBUTE: &str = "fenced-jobs.detail";
/// The attribute with the job id, when the body named one.
pub const JOB_ID_ATTRIBUTE: &str = "fenced-jobs.job-id";
/// The attribute with the original message id.
pub const SOURCE_ATTRIBUTE: &str = "fenced-jobs.source-message-id";
/// SQS's limit on a message's attributes.
const MAX_ATTRIBUTES: usize = 10;

/// One message to dead-letter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter {
    /// The original body, unchanged (a redrive sends it back as it came).
    pub body: String,
    /// `poison` or `conflict`.
    pub reason: &'static str,
    /// The classification: never content of the body.
    pub detail: String,
    /// The job id, when the body named one.
    pub job_id: Option<String>,
    /// The original message id.
    pub message_id: Option<String>,
    /// The original message group (FIFO).
    pub group_id: Option<String>,
    /// The original string attributes (an Extended Client pointer's size, say), kept while
    /// they fit beside ours.
    pub attributes: Vec<(String, String)>,
}

impl DeadLetter {
    /// The attributes the DLQ message carries: ours first, then the original ones that fit.
    pub fn all_attributes(&self) -> Vec<(String, String)> {
        let mut out = vec![
            (REASON_ATTRIBUTE.to_owned(), self.reason.to_owned()),
            (DETAIL_ATTRIBUTE.to_owned(), self.detail.clone()),
        ];
        if let Some(id) = &self.job_id {
            out.push((JOB_ID_ATTRIBUTE.to_owned(), id.clone()));
        }
        if let Some(id) = &self.message_id {
            out.push((SOURCE_ATTRIBUTE.to_owned(), id.clone()));
        }
        for (name, value) in &self.attributes {
            if out.len() == MAX_ATTRIBUTES {
                break;
            }
            if !out.iter().any(|(n, _)| n == name) {
                out.push((name.clone(), value.clone()));
            }
        }
        out
    }
}

/// Where the worker sends dead letters. Answers, in order, whether each was sent.
pub trait DeadLetterQueue: Send + Sync + Debug {
    /// Sends `letters`; `true` for each the queue took.
    fn send<'a>(&'a self, letters: &'a [DeadLetter]) -> BoxFuture<'a, Vec<bool>>;
}

/// Records dead letters, for tests; can be told to refuse.
#[cfg(any(test, feature = "test-support"))]
#[derive(Debug, Default)]
pub struct RecordingDeadLetters {
    sent: std::sync::Mutex<Vec<DeadLetter>>,
    refuse: std::sync::atomic::AtomicBool,
}

#[cfg(any(test, feature = "test-support"))]
impl RecordingDeadLetters {
    /// An empty recorder.
    pub fn new() -> Self {
        Self::default()
    }

    /// Every letter taken so far.
    pub fn sent(&self) -> Vec<DeadLetter> {
        self.sent.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Refuses every letter from now on (`true`) or takes them again.
    pub fn refuse(&self, refuse: bool) {
        self.refuse
            .store(refuse, std::sync::atomic::Ordering::Relaxed);
    }
}

#[cfg(any(test, feature = "test-support"))]
impl DeadLetterQueue for RecordingDeadLetters {
    fn send<'a>(&'a self, letters: &'a [DeadLetter]) -> BoxFuture<'a, Vec<bool>> {
        Box::pin(async move {
            if self.refuse.load(std::sync::atomic::Ordering::Relaxed) {
                return vec![false; letters.len()];
            }
            let mut sent = self.sent.lock().unwrap_or_else(|p| p.into_inner());
            sent.extend(letters.iter().cloned());
            vec![true; letters.len()]
        })
    }
}
