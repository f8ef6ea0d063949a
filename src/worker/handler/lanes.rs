//! The run phase's lanes: the records of one job (or one FIFO message group) in batch order,
//! each through the processor with a panic caught, later records of a job following the first.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::Mutex;

use futures::FutureExt;
use tracing::Instrument;

use super::BatchHandler;
use crate::clock::Clock;
use crate::job::{Failure, JobItem, JobMessage, RecordOutcome, Trigger};
use crate::ledger::JobLedger;
use crate::provider::Provider;
use crate::queue::VisibilityControl;
use crate::report::JobSummary;
use crate::worker::bodies::Entry;
use crate::worker::heartbeat::Flights;
use crate::worker::processor::{Invocation, Processed};

/// A record's outcome and job summary, as its lane decided it.
pub(super) type Decided = (RecordOutcome, Option<JobSummary>);

impl<L: JobLedger, P: Provider, C: Clock, V: VisibilityControl> BatchHandler<L, P, C, V> {
    /// Runs one lane in order: the records of one job (standard queue) or of one message group
    /// (FIFO). A record whose job an earlier record of the lane already went through the ledger
    /// for follows that record's view instead. On FIFO, after the first failure the rest of the
    /// lane is skipped.
    pub(super) async fn run_lane(
        &self,
        lane: Vec<usize>,
        entries: &[Entry<'_>],
        inv: &Invocation,
        flights: &Flights,
        fifo: bool,
        decided: &Mutex<Vec<Option<Decided>>>,
    ) {
        let mut views: Vec<JobItem> = Vec::new();
        let mut blocked = false;
        for index in lane {
            let entry = &entries[index];
            let outcome = match &entry.parsed {
                _ if blocked => RecordOutcome::Failed(Failure::Skipped),
                Err(failure) => RecordOutcome::Failed(failure.clone()),
                Ok(trigger) => match views.iter().find(|v| v.job_id == trigger.job_id()) {
                    Some(view) => match trigger {
                        Trigger::Job(msg) => self.processor.follow(msg, view),
                        Trigger::Ref(_) => {
                            self.processor.follow(&JobMessage::from_record(view), view)
                        }
                    },
                    None => {
                        let processed = self.process_one(trigger, entry, index, inv, flights).await;
                        views.extend(processed.view);
                        processed.outcome
                    }
                },
            };
            flights.done(index, outcome.is_success());
            blocked = fifo && !outcome.is_success();
            let job = entry
                .parsed
                .as_ref()
                .ok()
                .and_then(|t| views.iter().find(|v| v.job_id == t.job_id()))
                .map(JobSummary::of);
            decided.lock().unwrap_or_else(|p| p.into_inner())[index] = Some((outcome, job));
        }
    }

    /// One record through the ledger, with a panic caught and turned into a failure of that
    /// record alone.
    async fn process_one(
        &self,
        trigger: &Trigger,
        entry: &Entry<'_>,
        index: usize,
        inv: &Invocation,
        flights: &Flights,
    ) -> Processed {
        let owner_id = format!(
            "{}/{}",
            inv.id,
            entry
                .record
                .message_id
                .as_deref()
                .unwrap_or("no-message-id")
        );
        let watch = flights.slot(index);
        // Every line logged while this record is processed names its job and message.
        let span = tracing::info_span!(
            "record",
            job_id = trigger.job_id(),
            message_id = entry.record.message_id.as_deref(),
            epoch = tracing::field::Empty
        );
        let run = AssertUnwindSafe(
            self.processor
                .process_trigger(trigger, &owner_id, inv, &watch)
                .instrument(span),
        )
        .catch_unwind();
        match run.await {
            Ok(processed) => processed,
            Err(_) => {
                tracing::error!(job_id = trigger.job_id(), "record processing panicked");
                let failure = Failure::Backoff {
                    retry_after_ms: None,
                    cause: "panic",
                };
                Processed {
                    outcome: RecordOutcome::Failed(failure),
                    view: None,
                }
            }
        }
    }
}

/// Splits a batch into lanes that run concurrently, each in batch order. Standard queue: one
/// lane per job (poison records alone). FIFO: one lane per message group, poison included, since
/// a poison record is a failure that stops its group.
pub(super) fn lanes(entries: &[Entry<'_>], fifo: bool) -> Vec<Vec<usize>> {
    let mut lanes: Vec<Vec<usize>> = Vec::new();
    let mut lane_of: HashMap<&str, usize> = HashMap::new();
    for (index, entry) in entries.iter().enumerate() {
        let key = if fifo {
            entry
                .record
                .attributes
                .get("MessageGroupId")
                .map(String::as_str)
        } else {
            entry.parsed.as_ref().ok().map(Trigger::job_id)
        };
        match key {
            Some(key) => {
                let lane = *lane_of.entry(key).or_insert_with(|| {
                    lanes.push(Vec::new());
                    lanes.len() - 1
                });
                lanes[lane].push(index);
            }
            None => lanes.push(vec![index]),
        }
    }
    lanes
}
