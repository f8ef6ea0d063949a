//! Publishing completion events again (`jobctl events replay`): for the stream batches the
//! dispatcher gave up on, which Lambda names in the dispatcher's failure queue, or for one job.
//!
//! A failure message names a stretch of the stream (shard, sequence numbers, and when its first
//! and last records arrived), not the jobs, and the stream keeps records for 24 hours only. So
//! the replay reads the ledger instead: every job that became terminal in that stretch of time
//! (found by a scan of the table) or is `unknown` since then (the attention index) is announced again.
//! Event ids derive from the job, its epoch and its state, so a consumer that saw an event drops
//! the copy; announcing a neighbour twice costs nothing else.

use serde_json::Value;

use crate::events::{CompletionEvent, EventSink, publish};
use crate::job::{JobItem, JobState, Millis};
use crate::ledger::{IndexCursor, JobLedger, LedgerError, LedgerIndex};
use crate::ops::results::SCAN_PAGE;
use crate::queue::reader::RECEIVE_LIMIT;
use crate::queue::{QueueError, QueueReader};

/// Added on both sides of a failed batch's arrival times: the item's `updated_at` is the
/// writer's clock, the arrival time the stream's.
pub(crate) const WINDOW_MARGIN_MS: Millis = 60_000;

/// Why a replay stopped.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// The ledger could not be read.
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    /// The events could not all be published.
    #[error("publishing failed: {0}")]
    Publish(String),
    /// A queue call failed.
    #[error("the failure queue: {0}")]
    Queue(#[from] QueueError),
}

/// The stretch of time a failure message of a stream event source mapping names
/// (`DDBStreamBatchInfo`: `approximateArrivalOfFirstRecord`, `approximateArrivalOfLastRecord`),
/// widened by [`WINDOW_MARGIN_MS`]; `None` for any other message.
pub(crate) fn failed_window(body: &str) -> Option<(Millis, Millis)> {
    let info = serde_json::from_str::<Value>(body).ok()?;
    let batch = info.get("DDBStreamBatchInfo")?;
    let at = |name: &str| {
        batch
            .get(name)?
            .as_str()
            .and_then(crate::job::message::parse_rfc3339_ms)
    };
    let (first, last) = (
        at("approximateArrivalOfFirstRecord")?,
        at("approximateArrivalOfLastRecord")?,
    );
    Some((
        first.min(last).saturating_sub(WINDOW_MARGIN_MS),
        first.max(last).saturating_add(WINDOW_MARGIN_MS),
    ))
}

/// The events of the jobs that entered an announced state from `from` to `to`: terminal jobs
/// that a scan of the table finds finished then ([`LedgerIndex::finished`]), and `unknown`
/// jobs last changed then. At most `max_jobs`.
#[cfg(test)]
pub(crate) async fn events_between<L: JobLedger + LedgerIndex>(
    ledger: &L,
    window: (Millis, Millis),
    max_jobs: usize,
) -> Result<Vec<CompletionEvent>, LedgerError> {
    let finished = finished_jobs(ledger, window, max_jobs).await?;
    events_in(ledger, window, &finished, max_jobs).await
}

/// The terminal jobs a scan of the table finds finished from `from` to `to`, at most `max_jobs`.
async fn finished_jobs<L: LedgerIndex>(
    ledger: &L,
    window: (Millis, Millis),
    max_jobs: usize,
) -> Result<Vec<JobItem>, LedgerError> {
    let mut found = Vec::new();
    let mut after: Option<String> = None;
    while found.len() < max_jobs {
        let (jobs, next) = ledger.finished(window, after.as_deref(), SCAN_PAGE).await?;
        found.extend(jobs);
        match next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    Ok(found)
}

/// The events of the jobs of `finished` that ended from `from` to `to`, and of the `unknown`
/// jobs last changed then. At most `max_jobs`.
async fn events_in<L: JobLedger + LedgerIndex>(
    ledger: &L,
    (from, to): (Millis, Millis),
    finished: &[JobItem],
    max_jobs: usize,
) -> Result<Vec<CompletionEvent>, LedgerError> {
    let mut events: Vec<CompletionEvent> = finished
        .iter()
        .filter(|job| (from..=to).contains(&job.updated_at))
        .filter_map(CompletionEvent::of)
        .collect();
    // From `from` in the index itself: unknown jobs older than that never take the page.
    let since = IndexCursor {
        at: from,
        ..IndexCursor::default()
    };
    let unknown = ledger
        .untouched_since(JobState::Unknown, to.saturating_add(1), &since, max_jobs)
        .await?;
    for (id, _) in unknown {
        if let Some(job) = ledger.get(&id).await?
            && let Some(event) = CompletionEvent::of(&job)
        {
            events.push(event);
        }
    }
    events.truncate(max_jobs);
    Ok(events)
}

/// The event of one job as it stands, if its state is announced.
pub async fn event_of_job<L: JobLedger>(
    ledger: &L,
    job_id: &str,
) -> Result<Option<CompletionEvent>, LedgerError> {
    Ok(ledger
        .get(job_id)
        .await?
        .and_then(|job| CompletionEvent::of(&job)))
}

/// What a replay of the failure queue did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplayReport {
    /// Failure messages read.
    pub messages: usize,
    /// Of those, the ones that name no stream batch (left in the queue).
    pub unreadable: usize,
    /// Events published (or, in a dry run, that would be).
    pub events: usize,
    /// Messages deleted once their events were published.
    pub deleted: usize,
}

/// Replays the batches named in the dispatcher's failure queue: for each message (at most
/// `max`), the events of its stretch of time are published, then the message is deleted. With
/// `dry_run`, nothing is published or deleted. A message that names no batch stays.
pub async fn replay_failures<L: JobLedger + LedgerIndex>(
    ledger: &L,
    sink: &impl EventSink,
    queue: &impl QueueReader,
    queue_url: &str,
    max: usize,
    dry_run: bool,
) -> Result<ReplayReport, ReplayError> {
    let mut report = ReplayReport::default();
    let mut seen = std::collections::HashSet::new();
    // Kept invisible while its events are published, so two replays do not overlap.
    let hold_s = if dry_run { 0 } else { 300 };
    while report.messages < max {
        let received = queue
            .receive(
                queue_url,
                (max - report.messages).min(RECEIVE_LIMIT),
                hold_s,
            )
            .await?;
        let mut fresh = 0;
        let mut named = Vec::new();
        for m in received {
            let handle = m.receipt_handle.as_str();
            // A message left in the queue comes back; it is looked at once. One without an id
            // (SQS always gives one) is never taken for another.
            if m.message_id
                .as_ref()
                .is_some_and(|id| !seen.insert(id.clone()))
            {
                release(queue, queue_url, handle, dry_run).await;
                continue;
            }
            fresh += 1;
            report.messages += 1;
            let Some(window) = failed_window(&m.body) else {
                report.unreadable += 1;
                release(queue, queue_url, handle, dry_run).await;
                continue;
            };
            named.push((m, window));
        }
        // One scan of the table for the stretches of all the messages received together.
        let union = named
            .iter()
            .map(|(_, w)| *w)
            .reduce(|a, b| (a.0.min(b.0), a.1.max(b.1)));
        let finished = match union {
            Some(union) => finished_jobs(ledger, union, 10_000 * named.len()).await?,
            None => Vec::new(),
        };
        for (m, window) in &named {
            let handle = m.receipt_handle.as_str();
            let events = events_in(ledger, *window, &finished, 10_000).await?;
            report.events += events.len();
            if dry_run {
                continue;
            }
            publish(sink, &events)
                .await
                .map_err(|(_, why)| ReplayError::Publish(why))?;
            queue.delete(queue_url, handle).await?;
            report.deleted += 1;
        }
        // Nothing new, or a dry run (whose messages stay visible): every message was seen.
        if fresh == 0 || dry_run {
            break;
        }
    }
    Ok(report)
}

/// Leaves a message in the queue as it was found, visible, for whoever reads it next (a
/// release that fails leaves it to its hold, which ends on its own).
async fn release(queue: &impl QueueReader, queue_url: &str, handle: &str, dry_run: bool) {
    if !dry_run && let Err(e) = queue.release(queue_url, handle).await {
        tracing::warn!(error = %e, "a failure message stays held until its visibility ends");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::RecordingSink;
    use crate::ledger::AttemptEnd;
    use crate::ledger::memory::{InMemoryLedger, ended_at, succeeded_at};

    #[test]
    fn a_stream_failure_message_names_its_stretch_of_time() {
        // As Lambda writes it for a stream event source mapping's on-failure destination.
        let body = r#"{"requestContext":{"condition":"RetryAttemptsExhausted"},"version":"1.0",
            "timestamp":"2026-11-30T10:00:09Z","DDBStreamBatchInfo":{"shardId":"shardId-1",
            "startSequenceNumber":"100","endSequenceNumber":"120",
            "approximateArrivalOfFirstRecord":"2026-11-30T09:58:00Z",
            "approximateArrivalOfLastRecord":"2026-11-30T09:59:00Z","batchSize":20,
            "streamArn":"arn:aws:dynamodb:us-east-1:123456789012:table/jobs/stream/x"}}"#;
        let first = crate::job::message::parse_rfc3339_ms("2026-11-30T09:58:00Z").expect("time");
        assert_eq!(
            failed_window(body),
            Some((first - WINDOW_MARGIN_MS, first + 60_000 + WINDOW_MARGIN_MS))
        );
        assert_eq!(failed_window(r#"{"job_id":"x"}"#), None);
        assert_eq!(failed_window("not json"), None);
    }

    #[tokio::test]
    async fn the_jobs_that_finished_in_the_stretch_are_announced_again() {
        // GIVEN jobs that finished before, during and after a failed batch's stretch of time
        let ledger = InMemoryLedger::new();
        let t = 1_796_000_000_000;
        succeeded_at(&ledger, "before", r#"{"ok":true}"#, t - 600_000).await;
        succeeded_at(&ledger, "during", r#"{"ok":true}"#, t).await;
        succeeded_at(&ledger, "after", r#"{"ok":true}"#, t + 600_000).await;
        // WHEN the stretch is replayed
        let events = events_between(&ledger, (t - 60_000, t + 60_000), 100)
            .await
            .expect("read");
        let sink = RecordingSink::new();
        publish(&sink, &events).await.expect("published");
        // THEN only the job of the stretch is announced, with the id the dispatcher gave it
        let published = sink.published();
        assert_eq!(published.len(), 1);
        assert_eq!(published[0].job_id, "during");
        let job = ledger.get("during").await.expect("get").expect("item");
        assert_eq!(
            published[0].id,
            CompletionEvent::of(&job).expect("event").id
        );
    }

    #[tokio::test]
    async fn unknown_jobs_older_than_the_stretch_never_take_its_page() {
        // GIVEN five jobs left unknown before a failed batch's stretch and one during it
        let ledger = InMemoryLedger::new();
        let t = 1_796_000_000_000;
        let unknown = || AttemptEnd::Unknown {
            evidence: "timeout".into(),
        };
        for i in 0..5 {
            ended_at(&ledger, &format!("old-{i}"), unknown(), t - 600_000).await;
        }
        ended_at(&ledger, "during", unknown(), t).await;
        // WHEN the stretch is replayed three jobs at a time
        let events = events_between(&ledger, (t - 60_000, t + 60_000), 3)
            .await
            .expect("read");
        // THEN the job of the stretch is announced
        let ids: Vec<_> = events.iter().map(|e| e.job_id.as_str()).collect();
        assert_eq!(ids, ["during"]);
    }
}
