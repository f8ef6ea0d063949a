//! Reading a batch's bodies: each parsed in order, an Amazon SQS Extended Client pointer's
//! payload read first, within the memory set aside for payloads and the batch's time bound.

use aws_lambda_events::event::sqs::{SqsEvent, SqsMessage};

use super::processor::{Invocation, Processor};
use super::settings::Settings;
use super::within;
use crate::blobs::body::{resolve_body, resolve_body_within};
use crate::clock::Clock;
use crate::job::cost::document_cost;
use crate::job::pointer::{NAMED_JOB_ATTRIBUTE, PayloadPointer};
use crate::job::scope::{Producers, Sender};
use crate::job::{Failure, InvalidMessage, Trigger};
use crate::ledger::JobLedger;
use crate::provider::Provider;
use crate::queue::IN_LEDGER_ATTRIBUTE;

/// A payload takes about this many times its size while its record is processed: the bytes
/// read and the parsed document while it is parsed; then, for the whole batch, the canonical
/// input, the message the stored input is recorded on, and the copy the input's upload sends.
const PAYLOAD_PEAK_FACTOR: usize = 4;

pub(super) struct Entry<'a> {
    pub(super) record: &'a SqsMessage,
    /// The trigger, or why the record fails without reaching the ledger (poison, or a pointer's
    /// payload that cannot be read now).
    pub(super) parsed: Result<Trigger, Failure>,
}

/// Each record's body, parsed, in order. An Extended Client pointer's payload is read first,
/// one at a time, while the payloads read so far and the one being read fit in the memory
/// set aside for them (`PAYLOAD_MEMORY_BYTES`, by default the function's less 48 MiB), by the
/// object's own size; every job, plain body or payload, counts what its document costs parsed
/// ([`document_cost`]). A record beyond that, or not reached by the backstop, backs off, for a
/// later batch. The first job is always taken, so that every batch makes progress.
pub(super) async fn read_bodies<'e, L, P, C>(
    processor: &Processor<L, P, C>,
    event: &'e SqsEvent,
    inv: &Invocation,
) -> Vec<Entry<'e>>
where
    L: JobLedger,
    P: Provider,
    C: Clock,
{
    let blobs = processor.blobs();
    let settings = processor.settings();
    let clock = processor.clock();
    let backstop = inv.deadline.map(|d| d - settings.deadline_margin_ms / 2);
    let mut entries: Vec<Entry<'e>> = Vec::with_capacity(event.records.len());
    let budget = settings.payload_memory_bytes;
    let backoff = |cause| Failure::Backoff {
        retry_after_ms: None,
        cause,
    };
    let mut held = 0_usize;
    let mut read_any = false;
    for record in &event.records {
        let body = record.body.as_deref();
        let pointer = body.and_then(crate::job::message::parse_pointer);
        let by_pointer = matches!(pointer, Some(Ok(_)));
        let sender = sender_of(settings, record, pointer.as_ref());
        let parsed = match (pointer, &sender) {
            (_, Err(refused)) => Err(refused.clone()),
            (Some(Ok(_)), _) => {
                // The room left for this payload's bytes and what they become, by the object's
                // own size (never the pointer's word for it).
                let room = if read_any {
                    budget.saturating_sub(held) / PAYLOAD_PEAK_FACTOR
                } else {
                    crate::job::message::MAX_PAYLOAD_BYTES
                };
                if room == 0 {
                    Err(backoff("payload memory"))
                } else {
                    match within(clock, backstop, resolve_body_within(blobs, body, room)).await {
                        Some(parsed) => parsed,
                        None => Err(backoff("payload not read in time")),
                    }
                }
            }
            _ => resolve_body(blobs, body).await,
        };
        let parsed = match parsed {
            Err(Failure::Poison(InvalidMessage::PayloadMissing)) => {
                named_job(record).ok_or(Failure::Poison(InvalidMessage::PayloadMissing))
            }
            parsed => parsed,
        };
        // Each job id in its producer's namespace.
        let mut parsed = match (parsed, sender) {
            (Ok(trigger), Ok(sender)) => scoped(&settings.producers, record, sender, trigger),
            (parsed, _) => parsed,
        };
        // Past the room left, the record waits for a later batch; the first job is taken.
        let holds = holds(&parsed);
        if holds > 0 && read_any && held.saturating_add(holds) > budget {
            parsed = Err(backoff("payload memory"));
        }
        if let Ok(Trigger::Job(msg)) = &mut parsed {
            held = held.saturating_add(holds);
            read_any = true;
            msg.in_ledger = in_ledger(record);
            let receives = attribute(record, "ApproximateReceiveCount").unwrap_or(0);
            msg.delivered_before = receives > 1;
            msg.receive_count = receives.clamp(0, i64::from(u32::MAX)) as u32;
            // A pointer's payload lives as long as its producer's lifecycle rule lets it, not
            // SQS's retention: taken as a message SQS may drop (no `SentTimestamp`), so the
            // item keeps the input once the job leaves its first claim.
            msg.sent_at = attribute(record, "SentTimestamp").filter(|_| !by_pointer);
        }
        entries.push(Entry { record, parsed });
    }
    entries
}

/// What a job holds while its record is processed: its input rebuilt for the call, by what the
/// document costs parsed, and the copies of its bytes.
fn holds(parsed: &Result<Trigger, Failure>) -> usize {
    let Ok(Trigger::Job(msg)) = parsed else {
        return 0;
    };
    let copies = msg.input_canonical.len() * (PAYLOAD_PEAK_FACTOR - 1);
    document_cost(&msg.input_canonical).saturating_add(copies)
}

/// The record's sender as the deployment knows it (SQS's `SenderId`), or why the record is
/// refused unread: a sender it does not list, or a pointer to a bucket other than
/// `PAYLOAD_BUCKET` or to a key outside the sender's prefix.
fn sender_of<'p>(
    settings: &'p Settings,
    record: &SqsMessage,
    pointer: Option<&Result<PayloadPointer, InvalidMessage>>,
) -> Result<Sender<'p>, Failure> {
    let producers = &settings.producers;
    let sender = producers
        .sender(record.attributes.get("SenderId").map(String::as_str))
        .map_err(Failure::Poison)?;
    let refused = |field: &str, rule| {
        Err(Failure::Poison(InvalidMessage::NotAllowed {
            field: field.to_owned(),
            rule,
        }))
    };
    match pointer {
        Some(Ok(p)) if settings.payload_bucket.as_deref() != Some(p.bucket.as_str()) => refused(
            "s3BucketName",
            "not the bucket this deployment reads payloads from (PAYLOAD_BUCKET)",
        ),
        Some(Ok(p)) if !producers.may_read(sender, &p.key, named(record)) => refused(
            "s3Key",
            "outside the producer's prefix (PRODUCERS), or a key the worker keeps its own under",
        ),
        _ => Ok(sender),
    }
}

/// The trigger with its job's whole id: the producer's namespace and the id the message gave
/// (or, for a trusted sender, the whole id its `fenced-jobs.job-id` attribute names).
fn scoped(
    producers: &Producers,
    record: &SqsMessage,
    sender: Sender<'_>,
    trigger: Trigger,
) -> Result<Trigger, Failure> {
    let whole = |id: &str| {
        producers
            .job_id(sender, id, named(record))
            .map_err(Failure::Poison)
    };
    Ok(match trigger {
        Trigger::Job(mut msg) => {
            msg.job_id = whole(&msg.job_id)?;
            Trigger::Job(msg)
        }
        Trigger::Ref(id) => Trigger::Ref(whole(&id)?),
    })
}

/// The whole id a message's `fenced-jobs.job-id` attribute names (believed on a trusted
/// sender's message only).
fn named(record: &SqsMessage) -> Option<&str> {
    record
        .message_attributes
        .get(NAMED_JOB_ATTRIBUTE)
        .and_then(|a| a.string_value.as_deref())
}

/// The job a pointer's message names: a pointer whose payload is gone then goes on from the
/// job's item (which holds its input) instead of being poison, and is poison only when the
/// ledger has no such job.
fn named_job(record: &SqsMessage) -> Option<Trigger> {
    crate::job::pointer::named_job(named(record))
}

/// Whether the producer marked the message's job as already in the ledger (it created the
/// item before sending).
fn in_ledger(record: &SqsMessage) -> bool {
    record
        .message_attributes
        .get(IN_LEDGER_ATTRIBUTE)
        .and_then(|a| a.string_value.as_deref())
        == Some("true")
}

/// A numeric attribute of the record (`ApproximateReceiveCount`, say), if it has one.
pub(super) fn attribute(record: &SqsMessage, name: &str) -> Option<i64> {
    record.attributes.get(name).and_then(|v| v.parse().ok())
}
