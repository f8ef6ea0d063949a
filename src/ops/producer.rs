//! The producer: jobs go into the ledger first (`ready`, conditional on absence), then their
//! triggers onto the queue, then the enqueue is recorded. A crash between the steps strands
//! nothing: a `ready` job without a recorded enqueue is re-sent by the reconciler (or by the
//! next `submit` of the same file).

use futures::stream::{self, StreamExt};

use super::CONCURRENCY;
use crate::blobs::BlobStore;
use crate::job::account::ProducerRules;
use crate::job::artifact::input_key;
use crate::job::parse_trigger;
use crate::job::{
    DEFAULT_INLINE_MAX_BYTES, INLINE_LIMIT_BYTES, InvalidMessage, JobDefaults, JobMessage,
    JobState, Millis, NewJob, Trigger,
};
use crate::ledger::{CreateRequest, EnqueuedRequest, JobLedger, LedgerError, Write};
use crate::queue::{Outgoing, TriggerSender};

/// A body up to this size travels whole (one 64 KiB billing chunk, and the worker needs no
/// read); a larger one travels as `{"job_id": ...}` and the worker reads the input from the
/// ledger.
pub(crate) const INLINE_BODY_MAX: usize = 65_536;

/// How `submit` takes jobs in: the defaults for what a line leaves out, and where an input too
/// large to keep inline is stored.
#[derive(Debug, Clone)]
pub struct Intake<'a> {
    /// Deadline, budget and retention of a job whose line does not set them.
    pub defaults: JobDefaults,
    /// The results bucket: an input above `inline_max_bytes` is stored there and the ledger
    /// keeps its reference and digest. `None`: inputs stay inline (up to the item's limit).
    pub blobs: Option<&'a dyn BlobStore>,
    /// `INLINE_MAX_BYTES`.
    pub inline_max_bytes: usize,
    /// What the worker holds each job to at its first sight (the producers' namespaces,
    /// labels and policy): a line it would refuse is refused here, before anything is written.
    pub rules: ProducerRules,
}

impl Default for Intake<'_> {
    fn default() -> Self {
        Intake {
            defaults: JobDefaults::default(),
            blobs: None,
            inline_max_bytes: DEFAULT_INLINE_MAX_BYTES,
            rules: ProducerRules::default(),
        }
    }
}

/// What `submit` did, line by line summed up.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct SubmitReport {
    /// Lines read (blank lines are skipped and not counted).
    pub lines: u64,
    /// Lines that are not valid jobs: (line number, reason).
    pub invalid: Vec<(u64, String)>,
    /// Jobs written to the ledger now.
    pub created: u64,
    /// Jobs the ledger already held with the same input (nothing written).
    pub already_present: u64,
    /// Lines whose job id the ledger holds with another input: (line number, job id).
    pub conflicts: Vec<(u64, String)>,
    /// Jobs not written because the ledger failed: (line number, reason).
    pub ledger_failed: Vec<(u64, String)>,
    /// Triggers sent.
    pub sent: u64,
    /// Triggers SQS did not take: (job id, reason). The reconciler re-sends them.
    pub send_failed: Vec<(String, String)>,
}

/// Reads jobs (one JSON object a line), writes each to the ledger as `ready` unless it is there,
/// sends a trigger for every job that is `ready` without a recorded enqueue, and records the
/// enqueues. `progress` is called after every chunk of lines.
pub async fn submit<L: JobLedger>(
    ledger: &L,
    sender: &impl TriggerSender,
    lines: impl Iterator<Item = std::io::Result<String>>,
    now: impl Fn() -> Millis,
    intake: &Intake<'_>,
    mut progress: impl FnMut(&SubmitReport),
) -> SubmitReport {
    let mut report = SubmitReport::default();
    let mut chunk: Vec<(u64, String)> = Vec::new();
    let mut number = 0u64;
    let mut lines = lines.peekable();
    while lines.peek().is_some() {
        chunk.clear();
        for line in lines.by_ref() {
            number += 1;
            match line {
                Ok(text) if text.trim().is_empty() => continue,
                Ok(text) => chunk.push((number, text)),
                Err(e) => report.invalid.push((number, format!("unreadable: {e}"))),
            }
            if chunk.len() == 100 {
                break;
            }
        }
        report.lines += chunk.len() as u64;
        submit_chunk(ledger, sender, &chunk, &now, intake, &mut report).await;
        progress(&report);
    }
    report
}

/// The message with its input stored when it is above the inline limit; without a store, an
/// input the item cannot hold is refused.
async fn store_input(intake: &Intake<'_>, msg: &JobMessage) -> Result<JobMessage, LedgerError> {
    let size = msg.input_canonical.len();
    if size <= intake.inline_max_bytes {
        return Ok(msg.clone());
    }
    match intake.blobs.filter(|b| b.bucket().is_some()) {
        Some(store) => {
            let key = input_key(&msg.job_id, &msg.digest);
            let blob = store
                .put(&key, msg.input_canonical.as_bytes())
                .await
                .map_err(|e| LedgerError::Unavailable {
                    operation: "store input",
                    code: e.to_string(),
                })?;
            Ok(JobMessage {
                input_ref: Some(blob),
                ..msg.clone()
            })
        }
        None if size <= INLINE_LIMIT_BYTES => Ok(msg.clone()),
        None => Err(LedgerError::Rejected {
            operation: "create",
            code: format!(
                "the input has {size} bytes; without a results bucket the limit is {INLINE_LIMIT_BYTES}"
            ),
        }),
    }
}

async fn submit_chunk<L: JobLedger>(
    ledger: &L,
    sender: &impl TriggerSender,
    chunk: &[(u64, String)],
    now: &impl Fn() -> Millis,
    intake: &Intake<'_>,
    report: &mut SubmitReport,
) {
    let jobs = parse_chunk(chunk, &intake.rules, now(), report);
    let created: Vec<_> = stream::iter(&jobs)
        .map(|(number, text, msg)| async move {
            let at = now();
            let written = match store_input(intake, msg).await {
                Ok(msg) => {
                    let req = CreateRequest {
                        job: NewJob::from_message(&msg, at, &intake.defaults),
                        now: at,
                        enqueued: false,
                    };
                    ledger.create(req).await
                }
                Err(e) => Err(e),
            };
            (*number, *text, msg, written)
        })
        .buffered(CONCURRENCY)
        .collect()
        .await;
    let outgoing: Vec<Outgoing> = created
        .into_iter()
        .filter_map(|(number, text, msg, written)| to_send(number, text, msg, written, report))
        .collect();
    let sent_at = now();
    let results = sender.send(&outgoing, "submit").await;
    let mut sent = Vec::new();
    for (job_id, result) in results {
        match result {
            Ok(()) => sent.push(job_id),
            Err(reason) => report.send_failed.push((job_id, reason)),
        }
    }
    report.sent += sent.len() as u64;
    // The enqueue is recorded after the send; a failure here only means the reconciler may
    // send one more trigger, which the ledger makes harmless.
    stream::iter(sent)
        .for_each_concurrent(CONCURRENCY, |job_id| async move {
            let req = EnqueuedRequest {
                job_id,
                now: sent_at,
            };
            if let Err(e) = ledger.mark_enqueued(req).await {
                tracing::warn!(error = %e, "enqueue not recorded");
            }
        })
        .await;
}

/// The chunk's lines parsed: the jobs to write, each with its line number and text; the rest
/// counted in `report`. A job repeated within the chunk is judged against its first line here,
/// so that the concurrent writes never race each other.
fn parse_chunk<'c>(
    chunk: &'c [(u64, String)],
    rules: &ProducerRules,
    now: Millis,
    report: &mut SubmitReport,
) -> Vec<(u64, &'c str, JobMessage)> {
    let mut jobs = Vec::new();
    let mut first: std::collections::HashMap<String, String> = std::collections::HashMap::new();
    for (number, text) in chunk {
        match parse_trigger(Some(text)).and_then(|t| admitted(t, rules, now)) {
            Ok(Trigger::Job(msg)) => match first.get(&msg.job_id) {
                Some(digest) if *digest == msg.digest => report.already_present += 1,
                Some(_) => report.conflicts.push((*number, msg.job_id.clone())),
                None => {
                    first.insert(msg.job_id.clone(), msg.digest.clone());
                    jobs.push((*number, text.as_str(), msg));
                }
            },
            Ok(Trigger::Ref(_)) => report
                .invalid
                .push((*number, "a job_id alone is a trigger, not a job".to_owned())),
            Err(invalid) => report.invalid.push((*number, invalid.to_string())),
        }
    }
    jobs
}

/// `trigger` as the worker would take it from an operator: its job id whole (never an unknown
/// producer's), and a job the producer rules refuse at first sight refused with their reason.
fn admitted(
    trigger: Trigger,
    rules: &ProducerRules,
    now: Millis,
) -> Result<Trigger, InvalidMessage> {
    let Trigger::Job(mut msg) = trigger else {
        return Ok(trigger);
    };
    msg.job_id = rules.operators_job_id(&msg.job_id)?;
    match rules.refusal(&msg, now) {
        Some(refused) => Err(refused),
        None => Ok(Trigger::Job(msg)),
    }
}

/// The trigger to send for a job whose item was written so (counted in `report`), if any: an
/// item created now, or one an earlier submit wrote and stopped before sending.
fn to_send(
    number: u64,
    text: &str,
    msg: &JobMessage,
    written: Result<Write, LedgerError>,
    report: &mut SubmitReport,
) -> Option<Outgoing> {
    let send = match written {
        Ok(Write::Applied(_)) => {
            report.created += 1;
            true
        }
        Ok(Write::Refused(Some(seen))) if seen.input_digest == msg.digest => {
            report.already_present += 1;
            seen.state == JobState::Ready && seen.enqueued_at.is_none()
        }
        Ok(Write::Refused(Some(_))) => {
            report.conflicts.push((number, msg.job_id.clone()));
            false
        }
        Ok(Write::Refused(None)) => {
            report
                .ledger_failed
                .push((number, "refused with no item".to_owned()));
            false
        }
        Err(e) => {
            report.ledger_failed.push((number, e.to_string()));
            false
        }
    };
    send.then(|| {
        if text.len() <= INLINE_BODY_MAX {
            Outgoing {
                job_id: msg.job_id.clone(),
                body: text.to_owned(),
                in_ledger: true,
                class: msg.class.clone(),
            }
        } else {
            Outgoing::by_id(&msg.job_id).of_class(&msg.class)
        }
    })
}
