//! What a run did, as plain data: one invocation of the worker ([`BatchReport`]) and one run of
//! the reconciler ([`ReconcileReport`]). The worker and the reconciler fill them in; logs,
//! metrics and tests read them.

use aws_lambda_events::event::sqs::SqsBatchResponse;

use crate::job::{JobItem, Millis, RecordOutcome};
use crate::queue::VisibilityReport;

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
    /// The job as the ledger last showed it to this record, if it got that far.
    pub job: Option<JobSummary>,
    /// The lease renewals made for this record's call.
    pub renewals: Renewals,
}

/// What the ledger said about a record's job, for its log line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobSummary {
    /// The owner epoch.
    pub epoch: u64,
    /// Attempts so far.
    pub attempts: u32,
    /// The job's deadline, Unix ms.
    pub deadline_at: Millis,
    /// Why the job was last taken over, if it ever was.
    pub recovery: Option<String>,
}

impl JobSummary {
    /// The summary of `record`.
    pub fn of(record: &JobItem) -> Self {
        JobSummary {
            epoch: record.owner_epoch,
            attempts: record.attempts,
            deadline_at: record.deadline_at,
            recovery: record.recoveries.last().map(|r| r.reason.clone()),
        }
    }
}

/// Everything one batch produced.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchReport {
    /// One entry per record, in batch order.
    pub records: Vec<RecordReport>,
    /// The final visibility changes made for failed records.
    pub visibility: VisibilityReport,
    /// The heartbeat's and the processor's counts.
    pub stats: StatsSnapshot,
    /// Provider call latencies in milliseconds (at most 100).
    pub provider_latency_ms: Vec<u64>,
    /// Each provider's calls, latencies and throttles, by its name.
    pub by_provider: Vec<ProviderFigures>,
    /// What the attempts ended in this batch used and cost, summed by the provider and the
    /// model that ran them.
    pub usage_by_model: Vec<ModelUsage>,
    /// The response, or the reason the whole batch must fail.
    pub response: Result<Vec<String>, UnnamedFailure>,
}

/// One provider's calls in a batch (a job may fall back from one provider to another).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ProviderFigures {
    /// The provider's name (`gen_ai.provider.name`: `openai`, `anthropic`, `aws.bedrock`).
    pub provider: &'static str,
    /// Its calls that went.
    pub calls: u64,
    /// Their latencies in milliseconds (at most 100).
    pub latency_ms: Vec<u64>,
    /// Its refusals for its rate limit or quota.
    pub throttled: u64,
}

/// What the attempts of one model at one provider used and cost.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelUsage {
    /// The provider that ran them.
    pub provider: &'static str,
    /// The model that ran them.
    pub model: String,
    /// Their sum.
    pub usage: crate::job::Usage,
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

/// The counts of one invocation: the heartbeat's renewals and the processor's events.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// Heartbeat ticks.
    pub heartbeat_ticks: u64,
    /// Heartbeat ticks (of either kind) that started more than half an interval late.
    pub heartbeat_late: u64,
    /// `ChangeMessageVisibilityBatch` calls made by the heartbeat.
    pub visibility_calls: u64,
    /// Handles whose visibility was extended.
    pub visibility_renewed: u64,
    /// Handles SQS refused to extend.
    pub visibility_refused: u64,
    /// Handles whose extension is uncertain after its retries.
    pub visibility_uncertain: u64,
    /// Leases renewed.
    pub lease_renewed: u64,
    /// Lease renewals refused (epoch superseded or lease lapsed).
    pub lease_refused: u64,
    /// Lease renewals uncertain after their retries.
    pub lease_uncertain: u64,
    /// Records whose provider call was cancelled because ownership was lost or about to be.
    pub ownership_lost: u64,
    /// Provider calls cut short by the Lambda deadline.
    pub deadline_cutoffs: u64,
    /// Recovery claims made on jobs whose owner let its lease lapse.
    pub recoveries: u64,
    /// Provider calls refused for the provider's rate limit or quota.
    pub provider_throttled: u64,
    /// Records that wait for the next day: the deployment's `DAILY_SPEND_LIMIT` is reached.
    pub spend_deferred: u64,
    /// New jobs naming a contract the registry does not hold, taken as free text
    /// (`CONTRACTS_STRICT=false`).
    pub uncontracted: u64,
    /// Deferrable jobs' lines submitted in provider batches.
    pub batch_lines: u64,
    /// Records that looked at their running batch and wait, nothing written.
    pub batch_waits: u64,
}

/// The lease renewals of one record, for its log line.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Renewals {
    /// Renewals applied.
    pub renewed: u32,
    /// Renewals refused (ownership lost).
    pub refused: u32,
    /// Renewals whose outcome stayed unknown after their retries.
    pub uncertain: u32,
}

impl Renewals {
    /// The outcome to log: the worst that happened, or `none`.
    pub fn label(self) -> &'static str {
        if self.refused > 0 {
            "refused"
        } else if self.uncertain > 0 {
            "uncertain"
        } else if self.renewed > 0 {
            "renewed"
        } else {
            "none"
        }
    }
}

/// A failed record has no message id, so only a whole-batch failure keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("record {index} failed and has no messageId; failing the whole batch")]
pub struct UnnamedFailure {
    /// Position of the record in the batch.
    pub index: usize,
}

/// What one run did.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct ReconcileReport {
    /// Jobs moved to `expired`.
    pub expired: u64,
    /// Of those, jobs the due index found on their first claim with their message gone
    /// (`message_lost`): no other index holds them.
    pub message_lost: u64,
    /// Jobs past their deadline read from the due index.
    pub due_walked: u64,
    /// Background calls of expired jobs whose cancel was sent upstream.
    pub cancelled: u64,
    /// Expiries refused (the job changed since the index was read).
    pub expire_refused: u64,
    /// Waiting jobs looked at for a re-send.
    pub examined: u64,
    /// Walks for due jobs that stopped at `RECONCILE_MAX_EXAMINED` with more left to read.
    pub walks_cut: u64,
    /// Triggers re-sent.
    pub resent: u64,
    /// Triggers SQS did not take (tried again next run).
    pub send_failed: u64,
    /// Dead letters of live jobs, moved there by the redrive policy, sent back to the work
    /// queue (see `ops::operator::redrive_live`).
    pub redriven: u64,
    /// Dead letters the sweep read and left for an operator.
    pub dead_letters_left: u64,
    /// How long ago the oldest of them was sent, in seconds (`None`: none left, or no sweep).
    pub dead_letter_age_s: Option<u64>,
    /// Jobs in `unknown`, waiting for an operator.
    pub unknown: u64,
    /// Ledger calls that failed (tried again next run).
    pub errors: u64,
    /// Stored answers no item references, removed (see `ops::results::sweep_orphans`).
    pub orphans_removed: u64,
    /// What today will have cost once the queued jobs ran, in percent of the daily limit
    /// (`None`: no limit, or nothing charged today to go by; see `ops::spend::forecast`).
    pub spend_forecast_percent: Option<u64>,
}
