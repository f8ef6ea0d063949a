//! The batch handler: one `SqsEvent` in, one `SqsBatchResponse` out.
//!
//! Records are parsed first (a bad body is poison and never reaches the ledger), grouped by
//! job_id, and the groups run concurrently up to `max_concurrency`. Within a group the first
//! record goes through the ledger; later records of the same job decide from what it left, so a
//! batch makes at most one provider call per job. A panic fails only the record that raised it.
//! Failed records get their visibility set before the response is returned.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent, SqsMessage};
use futures::{StreamExt, stream};
use serde::Deserialize;

use tokio_util::sync::CancellationToken;

use super::batch::{self, UnnamedFailure};
use super::bodies::{Entry, attribute, read_bodies};
use super::heartbeat::{Delivered, Flights, Heartbeat};
use super::processor::{Invocation, Processor};
use super::within;
use crate::clock::Clock;
use crate::job::outcome::{Delivery, receive_floor};
use crate::job::{Failure, Millis, RecordOutcome, Trigger};
use crate::ledger::JobLedger;
use crate::provider::Provider;
use crate::queue::{
    DeadLetter, DeadLetterQueue, VisibilityChange, VisibilityControl, VisibilityReport,
};
pub use crate::report::{BatchReport, JobSummary, RecordReport};
use lanes::{Decided, lanes};

mod lanes;

/// Handles SQS batches.
#[derive(Debug)]
pub struct BatchHandler<L, P, C, V> {
    processor: Processor<L, P, C>,
    visibility: V,
    seed: Option<u64>,
    /// The queue's shorter visibility timeout was reported (once per execution environment).
    warned_visibility: std::sync::atomic::AtomicBool,
    /// Where poison and conflicts are sent at once (`DLQ_URL`); without it they wait for the
    /// redrive policy.
    dead_letters: Option<Arc<dyn DeadLetterQueue>>,
}

impl<L: JobLedger, P: Provider, C: Clock, V: VisibilityControl> BatchHandler<L, P, C, V> {
    /// A handler over a processor and a visibility control.
    pub fn new(processor: Processor<L, P, C>, visibility: V) -> Self {
        BatchHandler {
            processor,
            visibility,
            seed: None,
            warned_visibility: std::sync::atomic::AtomicBool::new(false),
            dead_letters: None,
        }
    }

    /// Sends poison and conflicting records to `queue` with their reason, acknowledging each
    /// once the queue took it.
    pub fn with_dead_letters(mut self, queue: Arc<dyn DeadLetterQueue>) -> Self {
        self.dead_letters = Some(queue);
        self
    }

    /// Fixes the jitter's random seed (tests).
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// The processor.
    pub fn processor(&self) -> &Processor<L, P, C> {
        &self.processor
    }

    /// The visibility control.
    pub fn visibility(&self) -> &V {
        &self.visibility
    }

    /// Handles a batch the way Lambda needs it: the response, or an error that fails the whole
    /// batch (only when a failed record has no message id).
    pub async fn handle(
        &self,
        event: SqsEvent,
        inv: Invocation,
    ) -> Result<SqsBatchResponse, UnnamedFailure> {
        self.handle_batch(&event, &inv).await.into_response()
    }

    /// Handles a batch and reports every record, in four phases: prepare (bodies, settings,
    /// the records in flight), run (the lanes, with the heartbeat), report (dead letters, each
    /// record's outcome and visibility) and respond (the final visibilities, the response).
    pub async fn handle_batch(&self, event: &SqsEvent, inv: &Invocation) -> BatchReport {
        let batch = self.prepare(event, inv).await;
        let outcomes = self.run(&batch, inv).await;
        let (records, changes) = self.report(&batch, outcomes, inv).await;
        self.respond(&batch, records, changes, inv).await
    }

    /// The batch's bodies read and parsed, the settings learnt from its queues, and each
    /// record in flight with the time SQS received it. The heartbeat keeps every record
    /// invisible while the bodies are read (a pointer's payload can take seconds, and a record
    /// that waits for the memory budget is held like the others).
    async fn prepare<'e>(&self, event: &'e SqsEvent, inv: &Invocation) -> Prepared<'e> {
        // The event source mapping received these records at most its batching window before.
        let entered = self.processor.clock().now_ms();
        let fifo = event.records.iter().any(|r| {
            r.event_source_arn
                .as_deref()
                .is_some_and(|arn| arn.ends_with(".fifo"))
        });
        let settings = self.learnt_settings(&event.records).await;
        let received_at: Vec<Millis> = event
            .records
            .iter()
            .map(|r| {
                let first = attribute(r, "ApproximateFirstReceiveTimestamp");
                receive_floor(entered, settings.batching_window_ms, first)
            })
            .collect();
        let flights = Flights::new(
            event
                .records
                .iter()
                .zip(&received_at)
                .map(|(r, &received_at)| Delivered {
                    queue_arn: r.event_source_arn.clone(),
                    receipt_handle: r.receipt_handle.clone(),
                    received_at,
                })
                .collect(),
            settings.queue_visibility_s,
        );
        let heartbeat = Heartbeat {
            flights: &flights,
            ledger: self.processor.ledger(),
            visibility: &self.visibility,
            clock: self.processor.clock(),
            settings: &settings,
        };
        let stop = CancellationToken::new();
        let read = async {
            let entries = read_bodies(&self.processor, event, inv).await;
            stop.cancel();
            entries
        };
        let (entries, ()) = tokio::join!(read, heartbeat.run(stop.clone()));
        Prepared {
            entries,
            fifo,
            settings,
            received_at,
            flights,
        }
    }

    /// Runs the lanes concurrently while the heartbeat keeps their records invisible and their
    /// leases renewed, until every lane is done or the backstop comes. Returns each record's
    /// outcome as its lane decided it (`None`: undecided at the backstop).
    async fn run(&self, batch: &Prepared<'_>, inv: &Invocation) -> Vec<Option<Decided>> {
        let Prepared {
            entries,
            fifo,
            settings,
            flights,
            ..
        } = batch;
        let clock = self.processor.clock();
        // Each record's outcome as its lane decides it, so that whatever was decided before the
        // backstop is reported even if the rest of the batch is abandoned.
        let decided: Mutex<Vec<Option<Decided>>> = Mutex::new(vec![None; entries.len()]);
        // The backstop: whatever stalls (a ledger call, a retrieval, a heartbeat tick), the
        // batch stops here, half the margin before the deadline, and the response still fits.
        let backstop = inv.deadline.map(|d| d - settings.deadline_margin_ms / 2);
        let stop = CancellationToken::new();
        let work = async {
            let lanes = lanes(entries, *fifo);
            // Counted until done: a batch of deferrable lines waits for those that may join.
            let counted = self.processor.lanes(lanes.len(), settings.max_concurrency);
            // Each lane on the heap from the start: its future is kilobytes, and the stream
            // would otherwise copy it into its own task.
            let lanes = stream::iter(lanes)
                .map(|lane| {
                    Box::pin(async {
                        let _running = counted.lane();
                        self.run_lane(lane, entries, inv, flights, *fifo, &decided)
                            .await
                    })
                })
                .buffer_unordered(settings.max_concurrency)
                .for_each(|()| async {});
            if within(clock, backstop, lanes).await.is_none() {
                tracing::warn!(invocation = %inv.id, "batch stopped at the backstop; undecided records back off");
            }
            stop.cancel();
        };
        let heartbeat = Heartbeat {
            flights,
            ledger: self.processor.ledger(),
            visibility: &self.visibility,
            clock,
            settings,
        };
        // The heartbeat finishes its tick in progress before the final visibilities are set,
        // unless that tick stalls past the backstop.
        tokio::join!(work, within(clock, backstop, heartbeat.run(stop.clone())));
        decided.into_inner().unwrap_or_else(|p| p.into_inner())
    }

    /// Sends the dead letters, then reports each record with the visibility its outcome asks
    /// for, gathered by queue for the final changes.
    async fn report<'e>(
        &self,
        batch: &Prepared<'e>,
        mut outcomes: Vec<Option<Decided>>,
        inv: &Invocation,
    ) -> (Vec<RecordReport>, Changes<'e>) {
        let clock = self.processor.clock();
        let last_call = inv
            .deadline
            .map(|d| d - batch.settings.deadline_margin_ms / 5);
        let sent = self.dead_letter(&batch.entries, &mut outcomes);
        if within(clock, last_call, sent).await.is_none() {
            tracing::warn!(invocation = %inv.id, "dead-letter sends cut short by the deadline");
        }
        let mut rng = self
            .seed
            .map_or_else(fastrand::Rng::new, fastrand::Rng::with_seed);
        let now = clock.now_ms();
        let mut records = Vec::with_capacity(batch.entries.len());
        let mut changes: Changes<'e> = HashMap::new();
        for (index, outcome) in outcomes.into_iter().enumerate() {
            // Undecided at the backstop: its job, if claimed, stays fenced under its lease.
            let (outcome, job) = outcome.unwrap_or((
                RecordOutcome::Failed(Failure::Backoff {
                    retry_after_ms: None,
                    cause: "not processed",
                }),
                None,
            ));
            let entry = &batch.entries[index];
            let change = match &outcome {
                RecordOutcome::Failed(failure) => {
                    batch.visibility(index, failure, job.as_ref(), now, &mut rng)
                }
                _ => None,
            };
            let mut visibility_s = None;
            if let (Some(seconds), Some(handle), Some(arn)) = (
                change,
                entry.record.receipt_handle.as_deref(),
                entry.record.event_source_arn.as_deref(),
            ) {
                changes.entry(arn).or_default().push(VisibilityChange {
                    receipt_handle: handle.to_owned(),
                    seconds,
                });
                visibility_s = Some(seconds);
            }
            let report = RecordReport {
                message_id: entry.record.message_id.clone(),
                job_id: entry.parsed.as_ref().ok().map(|m| m.job_id().to_owned()),
                outcome,
                visibility_s,
                job,
                renewals: batch.flights.renewals(index),
            };
            log_record(&report, entry, now);
            records.push(report);
        }
        (records, changes)
    }

    /// Makes the final visibility changes (bounded too: a record whose change does not land in
    /// time comes back when its current timeout ends) and builds the response.
    async fn respond(
        &self,
        batch: &Prepared<'_>,
        records: Vec<RecordReport>,
        changes: Changes<'_>,
        inv: &Invocation,
    ) -> BatchReport {
        let clock = self.processor.clock();
        let last_call = inv
            .deadline
            .map(|d| d - batch.settings.deadline_margin_ms / 5);
        let mut visibility = VisibilityReport::default();
        let changed = within(clock, last_call, async {
            for (arn, changes) in changes {
                visibility.add(&self.visibility.change(arn, changes).await);
            }
        })
        .await;
        if changed.is_none() {
            tracing::warn!(invocation = %inv.id, "final visibility changes cut short by the deadline");
        }
        let response = batch::failures(
            records
                .iter()
                .map(|r| (r.message_id.as_deref(), r.outcome.is_success())),
        );
        let stats = batch.flights.snapshot();
        let succeeded = records.iter().filter(|r| r.outcome.is_success()).count();
        match &response {
            Ok(failed) => tracing::info!(
                invocation = %inv.id,
                records = records.len(),
                succeeded,
                failed = failed.len(),
                final_visibility_calls = visibility.calls,
                final_visibility_changed = visibility.changed,
                final_visibility_refused = visibility.refused,
                final_visibility_uncertain = visibility.uncertain,
                heartbeat_ticks = stats.heartbeat_ticks,
                heartbeat_late = stats.heartbeat_late,
                visibility_renewal_calls = stats.visibility_calls,
                visibility_renewed = stats.visibility_renewed,
                visibility_renewal_refused = stats.visibility_refused,
                visibility_renewal_uncertain = stats.visibility_uncertain,
                lease_renewed = stats.lease_renewed,
                lease_renewal_refused = stats.lease_refused,
                lease_renewal_uncertain = stats.lease_uncertain,
                ownership_lost = stats.ownership_lost,
                deadline_cutoffs = stats.deadline_cutoffs,
                recoveries = stats.recoveries,
                "batch done"
            ),
            Err(e) => tracing::error!(invocation = %inv.id, error = %e, "failing the whole batch"),
        }
        BatchReport {
            records,
            visibility,
            stats,
            provider_latency_ms: batch.flights.stats.latencies(),
            by_provider: batch.flights.stats.by_provider(),
            usage_by_model: batch.flights.stats.usage_by_model(),
            response,
        }
    }

    /// Sends the poison and conflicting records to the dead-letter queue, if one is set, and
    /// marks those it took as dead-lettered (acknowledged). A record the queue did not take
    /// stays a failure with visibility 0, for the redrive policy.
    async fn dead_letter(&self, entries: &[Entry<'_>], outcomes: &mut [Option<Decided>]) {
        let Some(queue) = &self.dead_letters else {
            return;
        };
        let mut at = Vec::new();
        let mut letters = Vec::new();
        for (index, (entry, outcome)) in entries.iter().zip(outcomes.iter()).enumerate() {
            let Some((RecordOutcome::Failed(failure), _)) = outcome else {
                continue;
            };
            let (reason, detail) = match failure {
                Failure::Poison(invalid) => ("poison", invalid.to_string()),
                Failure::Conflict {
                    ledger_digest,
                    message_digest,
                } => (
                    "conflict",
                    format!("ledger digest {ledger_digest}, message digest {message_digest}"),
                ),
                _ => continue,
            };
            let record = entry.record;
            at.push(index);
            letters.push(
                DeadLetter {
                    body: record.body.clone().unwrap_or_default(),
                    reason,
                    detail,
                    job_id: entry.parsed.as_ref().ok().map(|t| t.job_id().to_owned()),
                    message_id: record.message_id.clone(),
                    group_id: record.attributes.get("MessageGroupId").cloned(),
                    attributes: record
                        .message_attributes
                        .iter()
                        .filter_map(|(name, a)| Some((name.clone(), a.string_value.clone()?)))
                        .collect(),
                }
                // A body that leaves no room for the reason goes as a smaller letter of ours,
                // never as it came (the redrive policy would move it without our word on it).
                .fitted(),
            );
        }
        if letters.is_empty() {
            return;
        }
        let sent = queue.send(&letters).await;
        for (index, taken) in at.into_iter().zip(sent) {
            if let Some((outcome, _)) = outcomes[index].as_mut().filter(|_| taken)
                && let RecordOutcome::Failed(failure) = outcome
            {
                *outcome = RecordOutcome::DeadLettered(failure.clone());
            }
        }
    }

    /// The settings for this batch: the configured ones, with the queue's real visibility
    /// timeout (learnt once per queue and environment) where it is shorter than the configured
    /// one, and the heartbeat quickened to a third of it, so that a record is never left to
    /// reappear because the configuration disagrees with the queue.
    async fn learnt_settings(&self, records: &[SqsMessage]) -> crate::worker::Settings {
        let mut settings = self.processor.settings().clone();
        let mut arns: Vec<&str> = records
            .iter()
            .filter_map(|r| r.event_source_arn.as_deref())
            .collect();
        arns.sort_unstable();
        arns.dedup();
        for arn in arns {
            let Some(real) = self.visibility.visibility_timeout_s(arn).await else {
                continue;
            };
            if real < settings.queue_visibility_s {
                let first = !self
                    .warned_visibility
                    .swap(true, std::sync::atomic::Ordering::Relaxed);
                if first {
                    tracing::warn!(
                        queue_visibility_s = real,
                        configured_s = settings.queue_visibility_s,
                        "the queue's visibility timeout is shorter than QUEUE_VISIBILITY_TIMEOUT_SECONDS; using the queue's"
                    );
                }
                settings.queue_visibility_s = real.max(1);
                if settings.heartbeat_ms > 0 {
                    settings.heartbeat_ms =
                        settings.heartbeat_ms.min(real.max(1) * 1000 / 3).max(100);
                }
            }
        }
        settings
    }
}

/// An event without a readable `Records` array: nothing in it can be named, so nothing may be
/// acknowledged, and the invocation fails (Lambda never sends such an event).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the event has no Records array")]
pub struct NoRecords;

/// An SQS event from its JSON, leniently: a record that does not deserialize as an SQS message
/// keeps its string fields (`messageId`, `receiptHandle`, `eventSourceARN`, `body`), so it can
/// still be classified and named; one bad record never fails the others.
pub fn event_from_json(value: &serde_json::Value) -> Result<SqsEvent, NoRecords> {
    let Some(serde_json::Value::Array(records)) = value.get("Records") else {
        return Err(NoRecords);
    };
    let mut event = SqsEvent::default();
    event.records = records
        .iter()
        .map(|r| SqsMessage::deserialize(r).unwrap_or_else(|_| salvage(r)))
        .collect();
    Ok(event)
}

fn salvage(record: &serde_json::Value) -> SqsMessage {
    let text = |key: &str| {
        record
            .get(key)
            .and_then(serde_json::Value::as_str)
            .map(str::to_owned)
    };
    let mut m = SqsMessage::default();
    m.message_id = text("messageId");
    m.receipt_handle = text("receiptHandle");
    m.event_source_arn = text("eventSourceARN");
    m.body = text("body");
    m
}

/// The final visibility changes, by queue ARN.
type Changes<'e> = HashMap<&'e str, Vec<VisibilityChange>>;

/// A batch ready to run: its records' bodies, the settings learnt from its queues, and each
/// record in flight.
struct Prepared<'e> {
    entries: Vec<Entry<'e>>,
    fifo: bool,
    settings: crate::worker::Settings,
    /// When SQS received each record, at the latest.
    received_at: Vec<Millis>,
    flights: Flights,
}

impl Prepared<'_> {
    /// The visibility, in seconds, a failed record of this batch is given, if any: none for a
    /// record SQS refused an extension for (its delivery is over).
    fn visibility(
        &self,
        index: usize,
        failure: &Failure,
        job: Option<&JobSummary>,
        now: Millis,
        rng: &mut fastrand::Rng,
    ) -> Option<i32> {
        let visible_until = self.flights.visible_until(index)?;
        let entry = &self.entries[index];
        // The job's deadline: the item's, or the message's when no item was seen.
        let message_deadline = match &entry.parsed {
            Ok(Trigger::Job(msg)) => msg.deadline_at,
            _ => None,
        };
        let deadline_at = job.map(|j| j.deadline_at).or(message_deadline);
        let receive_count = attribute(entry.record, "ApproximateReceiveCount")
            .map_or(1, |n| n.clamp(1, i64::from(u32::MAX)) as u32);
        let delivery = Delivery::at(
            now,
            receive_count,
            self.received_at[index],
            visible_until,
            deadline_at,
        );
        self.settings
            .visibility
            .visibility_s(failure, delivery, rng)
    }
}

fn log_record(report: &RecordReport, entry: &Entry<'_>, now: crate::job::Millis) {
    let message_id = report.message_id.as_deref().unwrap_or("");
    let job_id = report.job_id.as_deref().unwrap_or("");
    let delivery_count = entry
        .record
        .attributes
        .get("ApproximateReceiveCount")
        .map(String::as_str);
    match &report.outcome {
        RecordOutcome::Failed(Failure::Poison(reason))
        | RecordOutcome::DeadLettered(Failure::Poison(reason)) => tracing::warn!(
            message_id,
            delivery_count,
            reason = %reason,
            dead_lettered = report.outcome.is_success(),
            "poison record"
        ),
        RecordOutcome::Failed(Failure::Conflict {
            ledger_digest,
            message_digest,
        })
        | RecordOutcome::DeadLettered(Failure::Conflict {
            ledger_digest,
            message_digest,
        }) => tracing::warn!(
            message_id,
            job_id,
            delivery_count,
            ledger_digest = %ledger_digest,
            message_digest = %message_digest,
            dead_lettered = report.outcome.is_success(),
            "conflict: job_id reused with a different input"
        ),
        outcome => {
            let cause = match outcome {
                RecordOutcome::Failed(Failure::Backoff { cause, .. }) => Some(*cause),
                _ => None,
            };
            let job = report.job.as_ref();
            tracing::info!(
                message_id,
                job_id,
                delivery_count,
                epoch = job.map(|j| j.epoch),
                attempts = job.map(|j| j.attempts),
                deadline_left_ms = job.map(|j| j.deadline_at.saturating_sub(now)),
                renewal = report.renewals.label(),
                renewals = report.renewals.renewed,
                recovery_reason = job.and_then(|j| j.recovery.as_deref()),
                outcome = outcome.label(),
                cause,
                visibility_s = report.visibility_s,
                "record done"
            )
        }
    }
}
