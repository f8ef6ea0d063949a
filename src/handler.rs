//! The batch handler: one `SqsEvent` in, one `SqsBatchResponse` out.
//!
//! Records are parsed first (a bad body is poison and never reaches the ledger), grouped by
//! job_id, and the groups run concurrently up to `max_concurrency`. Within a group the first
//! record goes through the ledger; later records of the same job decide from what it left, so a
//! batch makes at most one provider call per job. A panic fails only the record that raised it.
//! Failed records get their visibility set before the response is returned.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;

use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent, SqsMessage};
use futures::{FutureExt, StreamExt, stream};

use crate::batch::{self, UnnamedFailure};
use crate::clock::Clock;
use crate::job::outcome::Delivery;
use crate::job::{Failure, JobMessage, RecordOutcome, parse_body};
use crate::ledger::JobLedger;
use crate::processor::{Invocation, Processed, Processor};
use crate::provider::Provider;
use crate::visibility::{VisibilityChange, VisibilityControl, VisibilityReport};

/// Handles SQS batches.
#[derive(Debug)]
pub struct BatchHandler<L, P, C, V> {
    processor: Processor<L, P, C>,
    visibility: V,
    seed: Option<u64>,
}

/// One record's outcome, as the handler reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordReport {
    /// The record's message id, if it had one.
    pub message_id: Option<String>,
    /// The job id, when the body was valid.
    pub job_id: Option<String>,
    /// What happened.
    pub outcome: RecordOutcome,
    /// The visibility timeout set, for a failure that could be given one.
    pub visibility_s: Option<i32>,
}

/// Everything one batch produced.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchReport {
    /// One entry per record, in batch order.
    pub records: Vec<RecordReport>,
    /// The visibility changes made.
    pub visibility: VisibilityReport,
    /// The response, or the reason the whole batch must fail.
    pub response: Result<Vec<String>, UnnamedFailure>,
}

impl BatchReport {
    /// The response Lambda gets, or the error that fails the whole batch.
    pub fn into_response(self) -> Result<SqsBatchResponse, UnnamedFailure> {
        let mut response = SqsBatchResponse::default();
        response.set_failures(self.response?);
        Ok(response)
    }

    /// The outcome of the record with this message id.
    pub fn outcome_of(&self, message_id: &str) -> Option<&RecordOutcome> {
        self.records
            .iter()
            .find(|r| r.message_id.as_deref() == Some(message_id))
            .map(|r| &r.outcome)
    }
}

struct Entry<'a> {
    record: &'a SqsMessage,
    parsed: Result<JobMessage, crate::job::InvalidMessage>,
}

impl<L: JobLedger, P: Provider, C: Clock, V: VisibilityControl> BatchHandler<L, P, C, V> {
    /// A handler over a processor and a visibility control.
    pub fn new(processor: Processor<L, P, C>, visibility: V) -> Self {
        BatchHandler {
            processor,
            visibility,
            seed: None,
        }
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

    /// Handles a batch and reports every record.
    pub async fn handle_batch(&self, event: &SqsEvent, inv: &Invocation) -> BatchReport {
        let entries: Vec<Entry<'_>> = event
            .records
            .iter()
            .map(|record| Entry {
                record,
                parsed: parse_body(record.body.as_deref()),
            })
            .collect();

        let mut groups: Vec<Vec<usize>> = Vec::new();
        let mut group_of: HashMap<&str, usize> = HashMap::new();
        for (index, entry) in entries.iter().enumerate() {
            if let Ok(msg) = &entry.parsed {
                let g = *group_of.entry(msg.job_id.as_str()).or_insert_with(|| {
                    groups.push(Vec::new());
                    groups.len() - 1
                });
                groups[g].push(index);
            }
        }

        let mut outcomes: Vec<Option<RecordOutcome>> = entries
            .iter()
            .map(|e| {
                e.parsed
                    .as_ref()
                    .err()
                    .map(|err| RecordOutcome::Failed(Failure::Poison(err.clone())))
            })
            .collect();
        let concurrency = self.processor.settings().max_concurrency;
        let finished: Vec<Vec<(usize, RecordOutcome)>> = stream::iter(groups)
            .map(|group| self.run_group(group, &entries, inv))
            .buffer_unordered(concurrency)
            .collect()
            .await;
        for (index, outcome) in finished.into_iter().flatten() {
            outcomes[index] = Some(outcome);
        }

        let mut rng = self
            .seed
            .map_or_else(fastrand::Rng::new, fastrand::Rng::with_seed);
        let now = self.processor.clock().now_ms();
        let mut records = Vec::with_capacity(entries.len());
        let mut changes: HashMap<&str, Vec<VisibilityChange>> = HashMap::new();
        for (entry, outcome) in entries.iter().zip(outcomes) {
            let outcome = outcome.unwrap_or(RecordOutcome::Failed(Failure::Backoff {
                retry_after_ms: None,
                cause: "not processed",
            }));
            let mut visibility_s = None;
            if let RecordOutcome::Failed(failure) = &outcome {
                let seconds = self.processor.settings().visibility.visibility_s(
                    failure,
                    delivery_of(entry.record, now),
                    &mut rng,
                );
                if let (Some(handle), Some(arn)) = (
                    entry.record.receipt_handle.as_deref(),
                    entry.record.event_source_arn.as_deref(),
                ) {
                    changes.entry(arn).or_default().push(VisibilityChange {
                        receipt_handle: handle.to_owned(),
                        seconds,
                    });
                    visibility_s = Some(seconds);
                }
            }
            let report = RecordReport {
                message_id: entry.record.message_id.clone(),
                job_id: entry.parsed.as_ref().ok().map(|m| m.job_id.clone()),
                outcome,
                visibility_s,
            };
            log_record(&report, entry);
            records.push(report);
        }

        let mut visibility = VisibilityReport::default();
        for (arn, changes) in changes {
            let r = self.visibility.change(arn, changes).await;
            visibility.calls += r.calls;
            visibility.changed += r.changed;
            visibility.refused += r.refused;
            visibility.uncertain += r.uncertain;
        }

        let response = batch::failures(
            records
                .iter()
                .map(|r| (r.message_id.as_deref(), r.outcome.is_success())),
        );
        let succeeded = records.iter().filter(|r| r.outcome.is_success()).count();
        match &response {
            Ok(failed) => tracing::info!(
                invocation = %inv.id,
                records = records.len(),
                succeeded,
                failed = failed.len(),
                visibility_calls = visibility.calls,
                visibility_changed = visibility.changed,
                visibility_refused = visibility.refused,
                visibility_uncertain = visibility.uncertain,
                "batch done"
            ),
            Err(e) => tracing::error!(invocation = %inv.id, error = %e, "failing the whole batch"),
        }
        BatchReport {
            records,
            visibility,
            response,
        }
    }

    /// Runs the records of one job in order. The first goes through the ledger; the others
    /// follow its view, or go through the ledger themselves if it left none.
    async fn run_group(
        &self,
        group: Vec<usize>,
        entries: &[Entry<'_>],
        inv: &Invocation,
    ) -> Vec<(usize, RecordOutcome)> {
        let mut view = None;
        let mut out = Vec::with_capacity(group.len());
        for index in group {
            let entry = &entries[index];
            let Ok(msg) = &entry.parsed else { continue };
            if let Some(seen) = &view {
                out.push((index, self.processor.follow(msg, seen)));
                continue;
            }
            let owner_id = format!(
                "{}/{}",
                inv.id,
                entry
                    .record
                    .message_id
                    .as_deref()
                    .unwrap_or("no-message-id")
            );
            let run = AssertUnwindSafe(self.processor.process(msg, &owner_id, inv)).catch_unwind();
            match run.await {
                Ok(Processed {
                    outcome,
                    view: seen,
                }) => {
                    view = seen;
                    out.push((index, outcome));
                }
                Err(_) => {
                    tracing::error!(job_id = %msg.job_id, "record processing panicked");
                    out.push((
                        index,
                        RecordOutcome::Failed(Failure::Backoff {
                            retry_after_ms: None,
                            cause: "panic",
                        }),
                    ));
                }
            }
        }
        out
    }
}

fn delivery_of(record: &SqsMessage, now: i64) -> Delivery {
    let attr = |name: &str| {
        record
            .attributes
            .get(name)
            .and_then(|v| v.parse::<i64>().ok())
    };
    Delivery {
        receive_count: attr("ApproximateReceiveCount")
            .map_or(1, |n| n.clamp(1, i64::from(u32::MAX)) as u32),
        since_first_receive_s: attr("ApproximateFirstReceiveTimestamp")
            .map(|t| (now - t).max(0) / 1000),
    }
}

fn log_record(report: &RecordReport, entry: &Entry<'_>) {
    let message_id = report.message_id.as_deref().unwrap_or("");
    let job_id = report.job_id.as_deref().unwrap_or("");
    let receive_count = entry
        .record
        .attributes
        .get("ApproximateReceiveCount")
        .map(String::as_str);
    match &report.outcome {
        RecordOutcome::Failed(Failure::Poison(reason)) => {
            tracing::warn!(message_id, receive_count, reason = %reason, "poison record")
        }
        RecordOutcome::Failed(Failure::Conflict {
            ledger_digest,
            message_digest,
        }) => tracing::warn!(
            message_id,
            job_id,
            ledger_digest = %ledger_digest,
            message_digest = %message_digest,
            "conflict: job_id reused with a different input"
        ),
        outcome => tracing::info!(
            message_id,
            job_id,
            receive_count,
            outcome = outcome.label(),
            visibility_s = report.visibility_s,
            "record done"
        ),
    }
}
