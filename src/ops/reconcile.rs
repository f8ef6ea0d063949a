//! The reconciler: repairs what a crash or a lost message left behind, from the sparse indexes
//! only (no scan of the table).
//!
//! - Jobs past their deadline that are not terminal become `expired`, with a write conditional
//!   on the deadline having passed and the job not being terminal: whoever owns it is fenced,
//!   and a background call it may have left running upstream is cancelled. The sparse deadline
//!   index finds the watched ones; the due index, walked once from where the last run stopped,
//!   finds every other but a first claim whose message SQS keeps: a job on its first claim whose
//!   item keeps no input and whose message never came back ends `expired` with `message_lost`.
//! - `ready` jobs untouched for `ready_after` whose trigger was never recorded as sent (a
//!   producer that stopped between its ledger write and its send) or was sent longer ago than
//!   `enqueue_stale_after` (a lost message), and watched `retry_authorized` jobs untouched for
//!   `retry_after` and not re-sent since, get a new trigger carrying only their id, and the
//!   enqueue is recorded. So do watched `running` jobs untouched for `ready_after` (a heartbeat
//!   renews the lease, and with it the job's `updated_at`, every few seconds): their owner is
//!   gone and their message may be in the DLQ; the delivery that follows makes the recovery
//!   claim. A trigger too many is harmless: the ledger lets one claim win.
//! - `unknown` jobs are counted, for the alarm that asks an operator to decide; those whose last
//!   attempt has a provider reference and that nobody touched for `retry_after` get a trigger,
//!   so that a delivery asks the provider again even when their message was dead-lettered.
//!
//! The reconciler's binary also sweeps the DLQ (`ops::operator::redrive_live`): a live job's
//! letter the redrive policy moved goes back to the work queue.

use futures::stream::{self, StreamExt};

use super::CONCURRENCY;
use crate::job::decision::SettleReason;
use crate::job::{JobItem, JobState, Millis};
use crate::ledger::{
    EnqueuedRequest, IndexCursor, JobLedger, LedgerError, LedgerIndex, SettleFrom, SettleRequest,
    Write,
};
use std::time::Duration;

use crate::provider::Provider;
use crate::queue::{Outgoing, TriggerSender};
pub use crate::report::ReconcileReport;
use crate::vars::{ConfigError, Vars};

/// The longest wait for one cancel request.
const CANCEL_WAIT_MS: u64 = 5_000;

/// How eager the reconciler is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReconcileSettings {
    /// `RECONCILE_READY_AFTER_SECONDS`: a `ready` job this long without a change or an enqueue
    /// is re-sent (a producer that stopped between its ledger write and its send).
    pub ready_after_ms: Millis,
    /// `RECONCILE_RETRY_AFTER_SECONDS`: the same for `retry_authorized` (its message waits out a
    /// backoff of up to `BACKOFF_CAP_SECONDS`, so this must be longer).
    pub retry_after_ms: Millis,
    /// `RECONCILE_ENQUEUE_STALE_SECONDS`: a `ready` job whose trigger was sent this long ago is
    /// re-sent (long, so a backlog does not fill with duplicates; shorter than the queue's
    /// retention).
    pub enqueue_stale_after_ms: Millis,
    /// `RECONCILE_MAX_JOBS`: most jobs each step handles in one run.
    pub max_jobs: usize,
    /// `RECONCILE_MAX_EXAMINED`: most waiting jobs of one state read in one run while looking
    /// for those due (a backlog of jobs sent recently is walked past, not taken as the page).
    pub max_examined: usize,
    /// `CLOCK_SKEW_MS`: a job is expired only this long after its deadline, so that a clock
    /// running ahead never expires a job its owner may still finish.
    pub skew_ms: Millis,
    /// `RECONCILE_ORPHAN_WINDOW_SECONDS`: with a results bucket, the jobs that finished this
    /// recently are checked for stored answers no item references (longer than the schedule, so
    /// every finished job is looked at more than once).
    pub orphan_window_ms: Millis,
    /// `INLINE_MAX_BYTES`, as the worker has it: an answer kept inline above it was meant for
    /// the bucket, so its job may have left an object behind (a put that timed out but landed).
    pub inline_max_bytes: usize,
}

impl Default for ReconcileSettings {
    fn default() -> Self {
        ReconcileSettings {
            ready_after_ms: 300_000,
            retry_after_ms: 1_200_000,
            enqueue_stale_after_ms: 21_600_000,
            max_jobs: 1_000,
            max_examined: 10_000,
            skew_ms: 2_000,
            orphan_window_ms: 3_600_000,
            inline_max_bytes: crate::job::DEFAULT_INLINE_MAX_BYTES,
        }
    }
}

impl ReconcileSettings {
    /// Reads the `RECONCILE_*` settings.
    pub(crate) fn from_vars(vars: &Vars<'_>) -> Result<ReconcileSettings, ConfigError> {
        let d = ReconcileSettings::default();
        // Each from a second to a year.
        let seconds = |name, default_ms| vars.seconds(name, default_ms, 1, 31_536_000);
        Ok(ReconcileSettings {
            ready_after_ms: seconds("RECONCILE_READY_AFTER_SECONDS", d.ready_after_ms)?,
            retry_after_ms: seconds("RECONCILE_RETRY_AFTER_SECONDS", d.retry_after_ms)?,
            enqueue_stale_after_ms: seconds(
                "RECONCILE_ENQUEUE_STALE_SECONDS",
                d.enqueue_stale_after_ms,
            )?,
            max_jobs: vars.integer("RECONCILE_MAX_JOBS", d.max_jobs as i64, 1, 100_000)? as usize,
            max_examined: vars.integer(
                "RECONCILE_MAX_EXAMINED",
                d.max_examined as i64,
                1,
                1_000_000,
            )? as usize,
            skew_ms: vars.integer("CLOCK_SKEW_MS", d.skew_ms, 0, 60_000)?,
            orphan_window_ms: seconds("RECONCILE_ORPHAN_WINDOW_SECONDS", d.orphan_window_ms)?,
            inline_max_bytes: vars.integer(
                "INLINE_MAX_BYTES",
                d.inline_max_bytes as i64,
                0,
                crate::job::INLINE_LIMIT_BYTES as i64,
            )? as usize,
        })
    }
}

/// One run at `now`.
pub async fn reconcile<L: JobLedger + LedgerIndex>(
    ledger: &L,
    sender: &impl TriggerSender,
    provider: &impl Provider,
    now: Millis,
    settings: &ReconcileSettings,
) -> Result<ReconcileReport, LedgerError> {
    let mut report = ReconcileReport::default();
    // The deadline as every clock within the margin sees it passed.
    let expiry_clock = now.saturating_sub(settings.skew_ms);
    settle_expired(
        ledger,
        provider,
        expiry_clock,
        settings.max_jobs,
        &mut report,
    )
    .await?;
    walk_due(ledger, provider, expiry_clock, settings, &mut report).await?;
    let mut due = Vec::new();
    for (state, after, enqueue_after) in [
        (
            JobState::Ready,
            settings.ready_after_ms,
            settings.enqueue_stale_after_ms,
        ),
        (
            JobState::RetryAuthorized,
            settings.retry_after_ms,
            settings.retry_after_ms,
        ),
        (
            JobState::Running,
            settings.ready_after_ms,
            settings.ready_after_ms,
        ),
        // An unknown job whose call the provider can be asked about: a new delivery asks, so a
        // dead-lettered message never strands a collectable answer.
        (
            JobState::Unknown,
            settings.retry_after_ms,
            settings.retry_after_ms,
        ),
    ] {
        let walked = due_in(
            ledger,
            state,
            after,
            enqueue_after,
            now,
            settings,
            &mut report,
        );
        due.extend(walked.await?);
    }
    resend(ledger, sender, &due, now, &mut report).await;
    report.unknown = ledger.count(JobState::Unknown).await?;
    Ok(report)
}

/// The jobs in `state` due for a new trigger: unchanged for `after`, their lease (if any)
/// lapsed as long, and no trigger sent for `enqueue_after`.
async fn due_in<L: JobLedger + LedgerIndex>(
    ledger: &L,
    state: JobState,
    after: Millis,
    enqueue_after: Millis,
    now: Millis,
    settings: &ReconcileSettings,
    report: &mut ReconcileReport,
) -> Result<Vec<Outgoing>, LedgerError> {
    let mut due = Vec::new();
    let is_due = |job: &JobItem| {
        // A line of a provider batch is handed over and its record looks at the batch without
        // writing, for up to a day: only a record lost that long is sent again (the stale
        // enqueue's wait, six hours by default).
        let batch = job
            .last_provider_ref()
            .is_some_and(crate::provider::batch::is_batch_ref);
        let (after, enqueue_after) = match batch && state == JobState::Running {
            true => (
                after.max(settings.enqueue_stale_after_ms),
                enqueue_after.max(settings.enqueue_stale_after_ms),
            ),
            false => (after, enqueue_after),
        };
        job.state == state
            && job.updated_at <= now - after
            && job.owner_until.is_none_or(|until| until <= now - after)
            && job.enqueued_at.is_none_or(|at| at <= now - enqueue_after)
            && (state != JobState::Unknown || job.last_provider_ref().is_some())
            // A trigger by id cannot run a job whose item keeps no input: only its own
            // message can, or its deadline ends it (`walk_due`).
            && job.keeps_input()
    };
    // The index knows when a job last changed, not when its trigger was last sent: walk on
    // past the jobs sent recently until a page of due ones is found or the walk's budget
    // is spent, so that a backlog waiting in the queue never hides a job whose message
    // was lost.
    let (mut cursor, mut examined, mut found) = (IndexCursor::default(), 0, 0);
    loop {
        let want = settings.max_jobs.min(settings.max_examined - examined);
        let keys = ledger
            .untouched_since(state, now - after, &cursor, want)
            .await?;
        cursor.advance(&keys);
        examined += keys.len();
        let items: Vec<_> = stream::iter(keys.iter().map(|(job_id, _)| job_id))
            .map(|job_id| async move { ledger.get(job_id).await })
            .buffer_unordered(CONCURRENCY)
            .collect()
            .await;
        for item in items {
            match item {
                Ok(Some(job)) if found < settings.max_jobs && is_due(&job) => {
                    due.push(Outgoing::by_id(&job.job_id).of_class(&job.class));
                    found += 1;
                }
                Ok(_) => {}
                Err(_) => report.errors += 1,
            }
        }
        if found >= settings.max_jobs || keys.len() < want {
            break;
        }
        if examined >= settings.max_examined {
            tracing::warn!(
                state = state.as_str(),
                examined,
                "the walk for due jobs stopped at RECONCILE_MAX_EXAMINED; it starts again next run"
            );
            report.walks_cut += 1;
            break;
        }
    }
    report.examined += examined as u64;
    Ok(due)
}

/// Sends the due jobs' triggers and records each one sent.
async fn resend<L: JobLedger>(
    ledger: &L,
    sender: &impl TriggerSender,
    due: &[Outgoing],
    now: Millis,
    report: &mut ReconcileReport,
) {
    let suffix = format!("reconcile-{}", now / 60_000);
    let mut sent = Vec::new();
    for (job_id, result) in sender.send(due, &suffix).await {
        match result {
            Ok(()) => sent.push(job_id),
            Err(reason) => {
                tracing::warn!(job_id, reason, "re-send failed");
                report.send_failed += 1;
            }
        }
    }
    report.resent = sent.len() as u64;
    let recorded: Vec<_> = stream::iter(sent)
        .map(|job_id| async move { ledger.mark_enqueued(EnqueuedRequest { job_id, now }).await })
        .buffer_unordered(CONCURRENCY)
        .collect()
        .await;
    report.errors += recorded.iter().filter(|r| r.is_err()).count() as u64;
}

/// Settles the jobs past their deadline and not terminal as `expired`, walking the due index.
async fn settle_expired<L: JobLedger + LedgerIndex>(
    ledger: &L,
    provider: &impl Provider,
    now: Millis,
    max_jobs: usize,
    report: &mut ReconcileReport,
) -> Result<(), LedgerError> {
    for state in [
        JobState::Ready,
        JobState::RetryAuthorized,
        JobState::Running,
        JobState::Unknown,
    ] {
        let keys = ledger.past_deadline(state, now, max_jobs).await?;
        let written: Vec<_> = stream::iter(keys)
            .map(|(job_id, _)| async move {
                let req = SettleRequest {
                    job_id,
                    from: SettleFrom::PastDeadline,
                    reason: SettleReason::DeadlinePassed,
                    now,
                };
                ledger.settle(req).await
            })
            .buffer_unordered(CONCURRENCY)
            .collect()
            .await;
        for w in written {
            match w {
                Ok(Write::Applied(job)) => {
                    report.expired += 1;
                    cancel_upstream(provider, state, &job, report).await;
                }
                Ok(Write::Refused(_)) => report.expire_refused += 1,
                Err(_) => report.errors += 1,
            }
        }
    }
    Ok(())
}

/// After a job that was in `state` expired: a call that may still run upstream is cancelled
/// (its answer can never be accepted now, and the provider would go on charging for it), by
/// the provider that ran the attempt, which alone knows its reference.
async fn cancel_upstream(
    provider: &impl Provider,
    state: JobState,
    job: &JobItem,
    report: &mut ReconcileReport,
) {
    let running = matches!(state, JobState::Running | JobState::Unknown);
    let ran = job
        .attempt_log
        .last()
        .and_then(|a| a.route.as_ref())
        .is_none_or(|r| r.provider == provider.name());
    if let Some(r) = job.last_provider_ref()
        && running
        && ran
        && provider.can_retrieve()
    {
        let wait = Duration::from_millis(CANCEL_WAIT_MS);
        if tokio::time::timeout(wait, provider.cancel(r)).await.is_ok() {
            report.cancelled += 1;
        }
    }
}

/// How far back the first walk of the due index starts.
const FIRST_WALK_MS: Millis = 86_400_000;

/// Walks the due index from where the last run stopped to `clock` (the deadline every clock
/// sees passed): every job found not terminal is expired, `message_lost` when it is on its first
/// claim and its item keeps no input. The walk records how far it came; one cut short (a failed write, or
/// `RECONCILE_MAX_EXAMINED`) goes on from there next run, so each job is read about once.
async fn walk_due<L: JobLedger + LedgerIndex>(
    ledger: &L,
    provider: &impl Provider,
    clock: Millis,
    settings: &ReconcileSettings,
    report: &mut ReconcileReport,
) -> Result<(), LedgerError> {
    const PAGE: usize = 200;
    let from = match ledger.due_walked().await? {
        Some(at) => at + 1,
        None => clock - FIRST_WALK_MS,
    };
    if from > clock {
        return Ok(());
    }
    let mut walk = crate::ledger::DueWalk::new(from, clock);
    // Every deadline up to `done` is handled.
    let mut done = clock;
    let mut examined = 0;
    while let Some(page) = walk.next(ledger, PAGE).await? {
        examined += page.len();
        report.due_walked += page.len() as u64;
        let items: Vec<_> = stream::iter(&page)
            .map(|(job_id, _)| ledger.get(job_id))
            .buffered(CONCURRENCY)
            .collect()
            .await;
        let mut stopped = None;
        for ((_, deadline), item) in page.iter().zip(items) {
            let handled = match item {
                Ok(Some(job)) if !job.state.is_terminal() => {
                    let reason = due_reason(&job);
                    settle_found_expired(ledger, provider, (job, reason), clock, report).await
                }
                Ok(_) => true,
                Err(_) => false,
            };
            if !handled {
                report.errors += 1;
                stopped = Some(*deadline);
                break;
            }
        }
        let last = page.last().map_or(clock, |(_, at)| *at);
        if let Some(deadline) = stopped {
            done = deadline - 1;
            break;
        }
        if examined >= settings.max_examined {
            // Jobs sharing the last deadline may go on past the page: from it, next run (unless
            // the whole walk was that one millisecond).
            done = if last > from { last - 1 } else { last };
            tracing::warn!(
                examined,
                "the walk of the due index stopped at RECONCILE_MAX_EXAMINED; it goes on next run"
            );
            report.walks_cut += 1;
            break;
        }
    }
    if done >= from {
        ledger.walked_due_to(done).await?;
    }
    Ok(())
}

/// Expires `job_ids`, found outside the indexes (the DLQ's sweep: a live job's letter past its
/// deadline), as the due walk would: each still past its deadline (by the skew) and not
/// terminal, for its deadline (its message is in the DLQ, not lost).
pub async fn expire_found<L: JobLedger>(
    ledger: &L,
    provider: &impl Provider,
    job_ids: &[String],
    (now, skew_ms): (Millis, Millis),
    report: &mut ReconcileReport,
) {
    let clock = now.saturating_sub(skew_ms);
    for job_id in job_ids {
        let handled = match ledger.get(job_id).await {
            Ok(Some(job)) if !job.state.is_terminal() && job.deadline_at <= clock => {
                let reason = SettleReason::DeadlinePassed;
                settle_found_expired(ledger, provider, (job, reason), clock, report).await
            }
            Ok(_) => true,
            Err(_) => false,
        };
        report.errors += u64::from(!handled);
    }
}

/// Why the due walk ends `job`, found past its deadline. A job on its first claim whose item
/// keeps no input depended on its message alone, which did not bring it back before its
/// deadline. Any other that keeps none waits for a message SQS keeps (decision 161), which may
/// only not have come back yet.
fn due_reason(job: &JobItem) -> SettleReason {
    let first_claim = job.state == JobState::Running && job.owner_epoch <= 1;
    match !job.keeps_input() && first_claim {
        true => SettleReason::MessageLost,
        false => SettleReason::DeadlinePassed,
    }
}

/// Settles one job found past its deadline and not terminal as `expired` for `reason`; `false`
/// when the write failed (the due walk stops there, to go on from it next run).
async fn settle_found_expired<L: JobLedger>(
    ledger: &L,
    provider: &impl Provider,
    (job, reason): (JobItem, SettleReason),
    now: Millis,
    report: &mut ReconcileReport,
) -> bool {
    let req = SettleRequest {
        job_id: job.job_id.clone(),
        from: SettleFrom::PastDeadline,
        reason,
        now,
    };
    match ledger.settle(req).await {
        Ok(Write::Applied(ended)) => {
            report.expired += 1;
            if reason == SettleReason::MessageLost {
                tracing::warn!(job_id = %job.job_id, "expired with its message lost: its item keeps no input and its message did not come back by its deadline");
                report.message_lost += 1;
            }
            cancel_upstream(provider, job.state, &ended, report).await;
            true
        }
        Ok(Write::Refused(_)) => {
            report.expire_refused += 1;
            true
        }
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests;
