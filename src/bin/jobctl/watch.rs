//! `jobctl watch`: a job followed until it is terminal, with what its running call shows.

use fenced_jobs::clock::{Clock, SystemClock};
use fenced_jobs::job::message::format_rfc3339_ms;
use fenced_jobs::job::{BatchCounts, JobState};
use fenced_jobs::ledger::dynamodb::DynamoLedger;
use fenced_jobs::ops::operator::OperatorError;

use super::{AWS_ERROR, REFUSED, TIMED_OUT};
use crate::output::Out;

/// Follows a job until it is terminal: one consistent read every `interval_s` seconds, a line
/// for each change of state, epoch or attempts.
pub(crate) async fn watch(
    ledger: &DynamoLedger,
    job_id: &str,
    interval_s: u64,
    timeout_s: u64,
    out: &Out,
) -> Result<(), OperatorError> {
    use fenced_jobs::ledger::JobLedger;
    let started = std::time::Instant::now();
    let mut last = None;
    loop {
        let job = match ledger.get(job_id).await {
            Ok(Some(job)) => job,
            Ok(None) => return Err(OperatorError::NotFound(job_id.to_owned())),
            Err(e) => {
                eprintln!("jobctl: {e}");
                std::process::exit(AWS_ERROR);
            }
        };
        let batch = batch_of(ledger, &job).await;
        let now = (
            job.state,
            job.owner_epoch,
            job.attempts,
            job.owner_until,
            job.call_progress,
            batch,
        );
        if last != Some(now) {
            last = Some(now);
            watched(&job, batch, started.elapsed().as_secs(), out);
        }
        if job.state.is_terminal() {
            if job.state != JobState::Succeeded {
                std::process::exit(REFUSED);
            }
            return Ok(());
        }
        if timeout_s > 0 && started.elapsed().as_secs() >= timeout_s {
            eprintln!(
                "jobctl: {job_id} is still {} after {timeout_s} s",
                job.state.as_str()
            );
            std::process::exit(TIMED_OUT);
        }
        tokio::time::sleep(std::time::Duration::from_secs(interval_s.max(1))).await;
    }
}

/// The request counts last noted for the provider batch a running job's attempt is a line of.
async fn batch_of(ledger: &DynamoLedger, job: &fenced_jobs::job::JobItem) -> Option<BatchCounts> {
    if job.state != JobState::Running {
        return None;
    }
    let (batch, _) = fenced_jobs::provider::batch::parse_ref(job.last_provider_ref()?)?;
    ledger
        .batch_counts(batch?)
        .await
        .ok()?
        .map(|(counts, _)| counts)
}

/// One line of `watch`: the job as it stands (with its batch's counts, if it runs in one),
/// `elapsed_s` since the watch began.
fn watched(job: &fenced_jobs::job::JobItem, batch: Option<BatchCounts>, elapsed_s: u64, out: &Out) {
    let at = format_rfc3339_ms(SystemClock.now_ms());
    let lease = job
        .owner_until
        .filter(|_| job.state == JobState::Running)
        .map(format_rfc3339_ms);
    // What the current owner last said of its call, with its last renewal (a hand-over or a
    // renewal wrote it); an earlier owner's is not this call's.
    let progress = job
        .call_progress
        .filter(|p| job.state == JobState::Running && p.epoch == job.owner_epoch);
    let mut doc = serde_json::json!({"at": at, "elapsed_s": elapsed_s, "job_id": job.job_id,
        "state": job.state.as_str(), "epoch": job.owner_epoch, "attempts": job.attempts,
        "lease_until": lease, "updated_at": format_rfc3339_ms(job.updated_at)});
    if let Some(p) = progress {
        doc["streamed_bytes"] = p.streamed_bytes.into();
    }
    if let Some(b) = batch {
        doc["batch"] = serde_json::json!({"total": b.total, "completed": b.completed,
            "failed": b.failed});
    }
    out.emit(doc, || {
        let mut text = format!(
            "{at}  +{elapsed_s}s  {}  {:<16} epoch {:<3} attempts {} of {}",
            job.job_id,
            job.state.as_str(),
            job.owner_epoch,
            job.attempts,
            job.max_attempts
        );
        if let Some(lease) = &lease {
            text += &format!(
                "  lease until {lease} (renewed {})",
                format_rfc3339_ms(job.updated_at)
            );
        }
        if let Some(p) = progress.filter(|p| p.streamed_bytes > 0) {
            text += &format!("  streamed {} bytes", p.streamed_bytes);
        }
        if let Some(b) = batch {
            text += &format!(
                "  batch {} of {} done, {} failed",
                b.completed, b.total, b.failed
            );
        }
        text
    });
}
