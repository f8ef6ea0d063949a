//! The worker's own dead-letter sends: a poison or conflicting message goes to the DLQ at once,
//! with its reason as message attributes, and is acknowledged only once the send succeeded. So
//! the redrive policy's `maxReceiveCount` can be high enough that a live job, handed over or
//! waiting for a decision many times, is never dead-lettered.

use std::fmt::Debug;

use futures::future::BoxFuture;

use super::triggers::SQS_MAX_BYTES;

/// The attribute that names why the worker dead-lettered a message (`poison`, `conflict`).
pub(crate) const REASON_ATTRIBUTE: &str = "fenced-jobs.reason";
/// The attribute with the classification (the rule a body broke, or both digests).
pub(crate) const DETAIL_ATTRIBUTE: &str = "fenced-jobs.detail";
/// The attribute with the job id, when the body named one (a redriven pointer whose payload is
/// gone still stands for its job).
pub const JOB_ID_ATTRIBUTE: &str = crate::job::pointer::NAMED_JOB_ATTRIBUTE;
/// The attribute with the original message id.
pub(crate) const SOURCE_ATTRIBUTE: &str = "fenced-jobs.source-message-id";
/// What the names of the attributes the worker writes begin with: a producer's message that
/// came with one keeps none of them in its dead letter, so that what a letter says about its
/// job is the worker's word alone.
pub(crate) const OWN_ATTRIBUTE_PREFIX: &str = "fenced-jobs.";
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
    /// they fit beside ours; none named like ours.
    pub attributes: Vec<(String, String)>,
}

impl DeadLetter {
    /// The attributes the DLQ message carries: ours first, then the original ones, as many as
    /// SQS takes (ten) and as fit beside the body within its 1 MiB. `None` when even the body
    /// and ours do not fit: the record is then left to the redrive policy, which moves the
    /// message as it is.
    pub fn all_attributes(&self) -> Option<Vec<(String, String)>> {
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
        let mut size = self.body.len() + out.iter().map(attribute_bytes).sum::<usize>();
        if size > SQS_MAX_BYTES {
            return None;
        }
        for attribute in &self.attributes {
            if attribute.0.starts_with(OWN_ATTRIBUTE_PREFIX) {
                continue;
            }
            if out.len() == MAX_ATTRIBUTES {
                break;
            }
            let bytes = attribute_bytes(attribute);
            if size + bytes <= SQS_MAX_BYTES && !out.iter().any(|(n, _)| *n == attribute.0) {
                size += bytes;
                out.push(attribute.clone());
            }
        }
        Some(out)
    }

    /// The letter as it can travel: itself when its body and the worker's attributes fit in
    /// one message; otherwise the worker's own smaller letter, whose body says how large the
    /// original was and its SHA-256 (a poison or conflicting body is no job, so nothing
    /// accepted is lost), with the reason, the detail, the job id and the message id as ever.
    /// The original is then left out rather than left to the redrive policy, which would move
    /// it without the worker's word on it.
    pub(crate) fn fitted(self) -> DeadLetter {
        if self.all_attributes().is_some() {
            return self;
        }
        let digest = crate::job::artifact::sha256_hex(self.body.as_bytes());
        let body = serde_json::json!({
            "fenced-jobs": "body not kept: no room beside the reason",
            "bytes": self.body.len(),
            "sha256": digest,
        });
        let mut detail = self.detail;
        // The detail is ours and short; bounded all the same, so the letter always fits.
        detail.truncate(detail.floor_char_boundary(4_096));
        DeadLetter {
            body: body.to_string(),
            detail,
            attributes: Vec::new(),
            ..self
        }
    }

    /// The bytes SQS counts for this letter: its body and the attributes it is sent with.
    pub fn size(&self) -> usize {
        let attributes = self.all_attributes().unwrap_or_default();
        self.body.len() + attributes.iter().map(attribute_bytes).sum::<usize>()
    }
}

/// What SQS counts for one `String` attribute: its name, its data type and its value.
fn attribute_bytes((name, value): &(String, String)) -> usize {
    name.len() + "String".len() + value.len()
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
            // As SQS does: a message over 1 MiB, body and attributes, is refused.
            let mut sent = self.sent.lock().unwrap_or_else(|p| p.into_inner());
            letters
                .iter()
                .map(|letter| {
                    let fits = letter.all_attributes().is_some();
                    if fits {
                        sent.push(letter.clone());
                    }
                    fits
                })
                .collect()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::triggers::batches_by;

    fn letter(body_bytes: usize, original: Vec<(String, String)>) -> DeadLetter {
        DeadLetter {
            body: "x".repeat(body_bytes),
            reason: "poison",
            detail: "body is not JSON (line 1, column 1)".into(),
            job_id: None,
            message_id: Some("0b5c2d3e-5a2f-4a6e-9f43-1b2c3d4e5f60".into()),
            group_id: None,
            attributes: original,
        }
    }

    #[test]
    fn a_letter_counts_its_attributes_and_drops_the_originals_that_do_not_fit() {
        // A body SQS took with an attribute of 600 bytes beside it: with ours added, the
        // original no longer fits, and is dropped rather than the send refused.
        let original = vec![("trace".to_owned(), "t".repeat(600))];
        let near = letter(SQS_MAX_BYTES - 700, original.clone());
        let attributes = near.all_attributes().expect("the body and ours fit");
        assert!(
            attributes.iter().all(|(n, _)| n != "trace"),
            "{attributes:?}"
        );
        assert!(near.size() <= SQS_MAX_BYTES, "{}", near.size());
        // With room, the original is kept.
        let small = letter(1_000, original);
        assert!(
            small
                .all_attributes()
                .expect("fits")
                .iter()
                .any(|(n, _)| n == "trace")
        );
        assert!(small.size() > 1_600, "{}", small.size());
        // A body of the whole 1 MiB leaves no room for the reason: the worker sends a smaller
        // letter of its own, with the reason, the size and the digest of what it left out.
        let whole = letter(SQS_MAX_BYTES, vec![]);
        assert_eq!(whole.all_attributes(), None);
        let smaller = whole.clone().fitted();
        let attributes = smaller.all_attributes().expect("the smaller letter fits");
        assert!(attributes.contains(&(REASON_ATTRIBUTE.to_owned(), "poison".to_owned())));
        let said: serde_json::Value = serde_json::from_str(&smaller.body).expect("json");
        assert_eq!(said["bytes"], SQS_MAX_BYTES);
        assert_eq!(said["sha256"].as_str().map(str::len), Some(64));
        assert_eq!(smaller.message_id, whole.message_id);
        // One with room travels as it is.
        assert_eq!(letter(1_000, vec![]).fitted(), letter(1_000, vec![]));
    }

    #[test]
    fn a_letter_says_what_the_worker_says_of_its_job_and_nothing_a_producer_planted() {
        // A producer's message came with our attributes, naming another producer's job and
        // a reason of its own: its letter carries the worker's words only.
        let planted = vec![
            (JOB_ID_ATTRIBUTE.to_owned(), "billing/job-1".to_owned()),
            (REASON_ATTRIBUTE.to_owned(), "conflict".to_owned()),
            ("trace".to_owned(), "t-1".to_owned()),
        ];
        let mut unread = letter(100, planted.clone());
        let attributes = unread.all_attributes().expect("fits");
        assert!(
            attributes.iter().all(|(n, _)| n != JOB_ID_ATTRIBUTE),
            "{attributes:?}"
        );
        assert_eq!(
            attributes
                .iter()
                .filter(|(n, _)| n == REASON_ATTRIBUTE)
                .count(),
            1
        );
        assert!(attributes.contains(&(REASON_ATTRIBUTE.to_owned(), "poison".to_owned())));
        assert!(attributes.contains(&("trace".to_owned(), "t-1".to_owned())));
        // Where the worker read the job, the letter names it by the worker's whole id.
        unread.job_id = Some("search/job-1".into());
        let attributes = unread.all_attributes().expect("fits");
        let named: Vec<_> = attributes
            .iter()
            .filter(|(n, _)| n == JOB_ID_ATTRIBUTE)
            .collect();
        assert_eq!(
            named,
            [&(JOB_ID_ATTRIBUTE.to_owned(), "search/job-1".to_owned())]
        );
    }

    #[test]
    fn requests_are_split_by_what_sqs_counts_not_by_bodies() {
        // Ten letters of 100 KB bodies, each with 8 KB of original attributes: the bodies alone
        // would fit in one request; with their attributes they take two.
        let letters: Vec<DeadLetter> = (0..10)
            .map(|i| letter(100_000, vec![(format!("a{i}"), "v".repeat(8_000))]))
            .collect();
        assert_eq!(batches_by(&letters, |l| l.body.len()).len(), 1);
        let requests = batches_by(&letters, |l| l.size());
        assert_eq!(requests.len(), 2);
        for request in requests {
            let bytes: usize = request.iter().map(DeadLetter::size).sum();
            assert!(bytes <= SQS_MAX_BYTES, "{bytes}");
        }
    }

    #[tokio::test]
    async fn the_recording_queue_refuses_what_sqs_would() {
        let queue = RecordingDeadLetters::new();
        let taken = queue
            .send(&[letter(10, vec![]), letter(SQS_MAX_BYTES, vec![])])
            .await;
        assert_eq!(taken, [true, false]);
        assert_eq!(queue.sent().len(), 1);
    }
}
