//! The reconciler's sweep of the DLQ (decision 163): the letters the redrive policy moved there
//! (a run of receives that each ended before writing the job, such as a crash loop) of jobs the
//! ledger holds live go back to the work queue, since the message may be all that runs its job.

use std::collections::HashSet;

use crate::job::scope::Producers;
use crate::job::{JobState, Millis};
use crate::ledger::JobLedger;
use crate::queue::QueueReader;
use crate::queue::reader::{RECEIVE_LIMIT, Received};

use super::OperatorError;
use super::dlq::{DlqEntry, DlqVerdict, attribute, judge_letter, send_back};

/// How long the sweep keeps each letter it read invisible: long enough to send a batch of them
/// back and delete them (a receipt handle is only good while its message is held), short enough
/// that an operator's `jobctl dlq inspect` soon sees the others again.
pub const SWEEP_HOLD_SECONDS: i32 = 30;

/// What one sweep did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sweep {
    /// Letters sent back to the work queue.
    pub moved: u64,
    /// Letters left for an operator.
    pub left: u64,
    /// Letters that could not be judged, sent back or deleted (tried again next run).
    pub failed: u64,
    /// Live jobs past their deadline (at `expired_by`) whose letters were left: the reconciler
    /// expires them, as it would have found them in the due index, were they listed.
    pub overdue: Vec<String>,
    /// When the oldest letter left was sent (`SentTimestamp`; the DLQ keeps a letter until its
    /// retention has passed since then). SQS leaves a letter received three times out of its
    /// own `ApproximateAgeOfOldestMessage`, which the sweep's receives would soon empty.
    pub oldest_left: Option<Millis>,
}

/// Reads up to `max` letters of the DLQ, ten at a time, each invisible for
/// [`SWEEP_HOLD_SECONDS`], until three receives in a row bring nothing new, and sends back to
/// the work queue those that the redrive policy moved (no `fenced-jobs.reason`, which the
/// worker's own letters carry) of jobs the ledger holds neither terminal nor `unknown`, due
/// after `expired_by`. The others stay for an operator: poison and conflicts, the letters of
/// finished jobs, of `unknown` ones (an operator's decision sends their trigger), of jobs not in
/// the ledger (a body that crashes the worker before any write would only come back), and
/// pointers (the sweep reads no payload). A letter that fails is counted and left; a receive
/// that fails is counted and ends the sweep with what it did so far.
pub async fn redrive_live<L: JobLedger>(
    ledger: &L,
    producers: &Producers,
    queue: &impl QueueReader,
    urls: (&str, &str),
    (max, expired_by): (usize, Millis),
) -> Sweep {
    let mut sweep = Sweep::default();
    let mut seen = HashSet::new();
    let (mut read, mut quiet) = (0, 0);
    while read < max && quiet < 3 {
        let asked = (max - read).min(RECEIVE_LIMIT);
        let received = match queue.receive(urls.0, asked, SWEEP_HOLD_SECONDS).await {
            Ok(received) => received,
            // What was swept so far stands; the rest waits for the next run.
            Err(e) => {
                tracing::warn!(error = %e, "the DLQ could not be read; the sweep stops here");
                sweep.failed += 1;
                break;
            }
        };
        // A letter whose hold ran out during this sweep is not judged twice.
        let fresh: Vec<Received> = received
            .into_iter()
            .filter(|m| {
                m.message_id
                    .as_ref()
                    .is_none_or(|id| seen.insert(id.clone()))
            })
            .collect();
        quiet = if fresh.is_empty() { quiet + 1 } else { 0 };
        read += fresh.len();
        for m in fresh {
            let sent_at = m.sent_at;
            match sweep_letter(ledger, producers, queue, urls, m, expired_by).await {
                Ok(Swept::Moved) => {
                    sweep.moved += 1;
                    continue;
                }
                Ok(Swept::Left) => {}
                Ok(Swept::Overdue(job_id)) => sweep.overdue.push(job_id),
                Err(e) => {
                    tracing::warn!(error = %e, "a dead letter could not be swept; next run");
                    sweep.failed += 1;
                }
            }
            sweep.left += 1;
            if let Some(at) = sent_at {
                sweep.oldest_left = Some(sweep.oldest_left.map_or(at, |o| o.min(at)));
            }
        }
    }
    sweep
}

/// What the sweep did with one letter.
enum Swept {
    /// Sent back to the work queue.
    Moved,
    /// Left for an operator.
    Left,
    /// Left: its live job, named here, is past its deadline.
    Overdue(String),
}

/// Judges one letter and sends it back if it is a live job's that the redrive policy moved.
async fn sweep_letter<L: JobLedger>(
    ledger: &L,
    producers: &Producers,
    queue: &impl QueueReader,
    urls: (&str, &str),
    m: Received,
    expired_by: Millis,
) -> Result<Swept, OperatorError> {
    let by_worker = attribute(&m, crate::queue::dead_letters::REASON_ATTRIBUTE).is_some();
    let judged = judge_letter(ledger, None, producers, &m).await?;
    let live = matches!(judged.verdict, DlqVerdict::Redrive(Some(s)) if s != JobState::Unknown);
    if by_worker || !live {
        return Ok(Swept::Left);
    }
    if judged.deadline_at.is_some_and(|at| at <= expired_by) {
        return Ok(Swept::Overdue(judged.job_id.unwrap_or_default()));
    }
    send_back(queue, urls, &DlqEntry::of(m, judged)).await?;
    Ok(Swept::Moved)
}
