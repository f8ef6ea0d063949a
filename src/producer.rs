//! The producer: jobs go into the ledger first (`ready`, conditional on absence), then their
//! triggers onto the queue, then the enqueue is recorded. A crash between the steps strands
//! nothing: a `ready` job without a recorded enqueue is re-sent by the reconciler (or by the
//! next `submit` of the same file).

use futures::stream::{self, StreamExt};
use serde_json::json;

use crate::config::Settings;
use crate::job::{JobState, Millis, Trigger, parse_trigger};
use crate::ledger::{CreateRequest, EnqueuedRequest, JobLedger, Write};
use crate::processor::new_job;

/// SQS's limit on one message and on one `SendMessageBatch` request.
const SQS_MAX_BYTES: usize = 262_144;
/// A body up to this size travels whole (one 64 KiB billing chunk, and the worker needs no
/// read); a larger one travels as `{"job_id": ...}` and the worker reads the input from the
/// ledger.
pub const INLINE_BODY_MAX: usize = 65_536;
/// Ledger calls in flight at once (the producer's and the reconciler's).
pub const CONCURRENCY: usize = 16;

/// One trigger to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outgoing {
    /// The job it triggers.
    pub job_id: String,
    /// The message body.
    pub body: String,
}

impl Outgoing {
    /// A trigger that carries only the job id.
    pub fn by_id(job_id: &str) -> Outgoing {
        Outgoing {
            job_id: job_id.to_owned(),
            body: json!({ "job_id": job_id }).to_string(),
        }
    }
}

/// Sends triggers with `SendMessageBatch`: ten a request, and never more than SQS takes in one
/// request. Every entry SQS reports as failed (and every entry of a request that failed as a
/// whole) comes back with its reason; the others were sent. On a FIFO queue each job is its own
/// message group, deduplicated by job id and `dedup_suffix`.
pub async fn send_triggers(
    sqs: &aws_sdk_sqs::Client,
    queue_url: &str,
    triggers: &[Outgoing],
    dedup_suffix: &str,
) -> Vec<(String, Result<(), String>)> {
    use aws_sdk_sqs::types::SendMessageBatchRequestEntry;
    let fifo = queue_url.ends_with(".fifo");
    let mut batches: Vec<&[Outgoing]> = Vec::new();
    let mut start = 0;
    let mut bytes = 0;
    for (i, t) in triggers.iter().enumerate() {
        if i - start == 10 || bytes + t.body.len() > SQS_MAX_BYTES {
            batches.push(&triggers[start..i]);
            start = i;
            bytes = 0;
        }
        bytes += t.body.len();
    }
    if start < triggers.len() {
        batches.push(&triggers[start..]);
    }
    let mut results = Vec::with_capacity(triggers.len());
    for batch in batches {
        let entries: Vec<SendMessageBatchRequestEntry> = batch
            .iter()
            .enumerate()
            .filter_map(|(i, t)| {
                let mut entry = SendMessageBatchRequestEntry::builder()
                    .id(i.to_string())
                    .message_body(&t.body);
                if fifo {
                    entry = entry
                        .message_group_id(&t.job_id)
                        .message_deduplication_id(dedup_id(&t.job_id, dedup_suffix));
                }
                entry.build().ok()
            })
            .collect();
        match sqs
            .send_message_batch()
            .queue_url(queue_url)
            .set_entries(Some(entries))
            .send()
            .await
        {
            Ok(out) => {
                let failed: std::collections::HashMap<&str, String> = out
                    .failed()
                    .iter()
                    .map(|f| (f.id(), f.code().to_owned()))
                    .collect();
                for (i, t) in batch.iter().enumerate() {
                    let result = match failed.get(i.to_string().as_str()) {
                        Some(code) => Err(code.clone()),
                        None => Ok(()),
                    };
                    results.push((t.job_id.clone(), result));
                }
            }
            Err(e) => {
                let reason = aws_sdk_sqs::error::DisplayErrorContext(&e).to_string();
                results.extend(
                    batch
                        .iter()
                        .map(|t| (t.job_id.clone(), Err(reason.clone()))),
                );
            }
        }
    }
    results
}

/// A FIFO deduplication id (at most 128 characters, from the job id and a suffix).
fn dedup_id(job_id: &str, suffix: &str) -> String {
    let mut id = format!("{job_id}-{suffix}");
    id.truncate(128);
    id
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
    sqs: &aws_sdk_sqs::Client,
    queue_url: &str,
    lines: impl Iterator<Item = std::io::Result<String>>,
    now: impl Fn() -> Millis,
    settings: &Settings,
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
        submit_chunk(ledger, sqs, queue_url, &chunk, &now, settings, &mut report).await;
        progress(&report);
    }
    report
}

async fn submit_chunk<L: JobLedger>(
    ledger: &L,
    sqs: &aws_sdk_sqs::Client,
    queue_url: &str,
    chunk: &[(u64, String)],
    now: &impl Fn() -> Millis,
    settings: &Settings,
    report: &mut SubmitReport,
) {
    let mut jobs = Vec::new();
    // A job repeated within the chunk is judged against its first line here, so that the
    // concurrent writes below never race each other.
    let mut first: std::collections::HashMap<String, String> = std::collections::HashMap::new();
    for (number, text) in chunk {
        match parse_trigger(Some(text)) {
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
    let created: Vec<_> = stream::iter(&jobs)
        .map(|(number, text, msg)| async move {
            let at = now();
            let req = CreateRequest {
                job: new_job(msg, at, settings),
                now: at,
            };
            (*number, *text, msg, ledger.create(req).await)
        })
        .buffered(CONCURRENCY)
        .collect()
        .await;
    let mut outgoing = Vec::new();
    for (number, text, msg, written) in created {
        let send = match written {
            Ok(Write::Applied(_)) => {
                report.created += 1;
                true
            }
            Ok(Write::Refused(Some(seen))) if seen.input_digest == msg.digest => {
                report.already_present += 1;
                // An earlier submit that stopped before sending: send now.
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
        if send {
            outgoing.push(if text.len() <= INLINE_BODY_MAX {
                Outgoing {
                    job_id: msg.job_id.clone(),
                    body: text.to_owned(),
                }
            } else {
                Outgoing::by_id(&msg.job_id)
            });
        }
    }
    let sent_at = now();
    let results = send_triggers(sqs, queue_url, &outgoing, "submit").await;
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
