//! Reading answers out: one job's answer (`jobctl result`), and the jobs that finished since a
//! time as JSON lines (`jobctl export`), found by a scan of the table (an operator's command:
//! no worker or reconciler path scans).

use serde_json::{Value, json};

use crate::blobs::{BlobError, BlobStore, read_checked};
use crate::job::{JobItem, JobState, Millis};
use crate::ledger::{DueWalk, JobLedger, LedgerError, LedgerIndex};

/// Items a scan reads for one page.
pub(crate) const SCAN_PAGE: usize = 500;

pub use crate::job::artifact::MAX_RESULT_BYTES;

/// Why there is no answer to print.
#[derive(Debug, thiserror::Error)]
pub enum ResultError {
    /// No such job.
    #[error("no job {0:?}")]
    NotFound(String),
    /// The job has no accepted answer (yet, or ever).
    #[error("job {job_id:?} is {state}, with no accepted answer")]
    NoAnswer {
        /// The job.
        job_id: String,
        /// Its state.
        state: &'static str,
    },
    /// The ledger could not be read.
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    /// The stored answer could not be read, or is not what its reference names.
    #[error("the stored answer could not be read: {0}")]
    Store(#[from] BlobError),
    /// The answer is stored, and no store was given.
    #[error("the answer is stored in s3://{0}; no object store is configured")]
    NoStore(String),
}

/// The accepted answer of `job_id`: from the item, or from its object (checked against the
/// size and digest the acceptance recorded).
pub async fn result(
    ledger: &impl JobLedger,
    blobs: Option<&dyn BlobStore>,
    job_id: &str,
) -> Result<Vec<u8>, ResultError> {
    let job = ledger
        .get(job_id)
        .await?
        .ok_or_else(|| ResultError::NotFound(job_id.to_owned()))?;
    if let Some(text) = &job.result {
        return Ok(text.clone().into_bytes());
    }
    let Some(blob) = &job.result_ref else {
        return Err(ResultError::NoAnswer {
            job_id: job_id.to_owned(),
            state: job.state.as_str(),
        });
    };
    let store = blobs.ok_or_else(|| ResultError::NoStore(blob.bucket.clone()))?;
    Ok(read_checked(store, blob, MAX_RESULT_BYTES).await?)
}

/// What `export` wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExportReport {
    /// Finished jobs the scan found in the window.
    pub read: u64,
    /// Lines written.
    pub written: u64,
    /// Finished jobs skipped by the state filter.
    pub filtered: u64,
}

/// Writes one JSON line per job that finished from `since` to `now` (in `state`, when given):
/// job id, state, finish time, metadata, and the answer inline or its reference (or the error).
/// The whole table is scanned ([`LedgerIndex::finished`]); `progress` is called after each
/// page, with the last job id read.
pub async fn export<L: JobLedger + LedgerIndex>(
    ledger: &L,
    (since, now): (Millis, Millis),
    state: Option<JobState>,
    out: &mut impl std::io::Write,
    mut progress: impl FnMut(&ExportReport, &str),
) -> Result<ExportReport, ResultError> {
    let mut report = ExportReport::default();
    let mut after: Option<String> = None;
    loop {
        let (jobs, next) = ledger
            .finished((since, now), after.as_deref(), SCAN_PAGE)
            .await?;
        report.read += jobs.len() as u64;
        for job in jobs {
            if state.is_some_and(|s| s != job.state) {
                report.filtered += 1;
                continue;
            }
            writeln!(out, "{}", line(&job)).map_err(|e| LedgerError::Unavailable {
                operation: "write",
                code: e.to_string(),
            })?;
            report.written += 1;
        }
        progress(&report, next.as_deref().unwrap_or_default());
        match next {
            Some(next) => after = Some(next),
            None => return Ok(report),
        }
    }
}

/// One export line.
pub fn line(job: &JobItem) -> Value {
    let mut row = json!({
        "job_id": job.job_id,
        "state": job.state.as_str(),
        "finished_at": job.updated_at,
        "attempts": job.attempts,
        "metadata": job.metadata.as_deref().and_then(|m| serde_json::from_str::<Value>(m).ok()),
    });
    let fields = row.as_object_mut().expect("a json! object");
    fields.insert("tenant".into(), Value::String(job.account()));
    if let Some(usage) = job.usage() {
        fields.insert("usage".into(), json!(usage));
    }
    if let Some(blob) = &job.result_ref {
        fields.insert("result_ref".into(), blob.to_json());
    } else if let Some(result) = &job.result {
        let answer = serde_json::from_str::<Value>(result).unwrap_or(Value::String(result.clone()));
        fields.insert("result".into(), answer);
    } else if let Some(error) = &job.last_error {
        fields.insert(
            "error".into(),
            json!({ "kind": error.kind, "message": error.message }),
        );
    }
    row
}

/// Removes the objects no item references: answers written by an owner that was fenced or
/// crashed before its acceptance (or whose removal failed), or by a put that timed out but
/// landed. Only jobs whose deadline passed from `since` to `now` are looked at (the due index:
/// every job is terminal once its deadline has passed, and the reconciler expires the others
/// first), and of those only the ones that could have left one: any but a success accepted at
/// the first epoch with its answer stored, or inline and no larger than `inline_max_bytes` (one
/// attempt, and no object but the one referenced). An object is removed only once its job is
/// terminal, so an acceptance still in flight never loses its answer. Returns how many were
/// removed.
pub async fn sweep_orphans<L: JobLedger + LedgerIndex>(
    ledger: &L,
    blobs: &dyn BlobStore,
    since: Millis,
    now: Millis,
    limits: (usize, usize),
) -> Result<u64, ResultError> {
    let (max_jobs, inline_max_bytes) = limits;
    let mut removed = 0;
    let mut looked = 0;
    let mut walk = DueWalk::new(since, now);
    while looked < max_jobs
        && let Some(page) = walk.next(ledger, 200).await?
    {
        looked += page.len();
        for (job_id, _) in &page {
            let Some(job) = ledger.get(job_id).await? else {
                continue;
            };
            let kept_small = job.result_ref.is_some()
                || job
                    .result
                    .as_ref()
                    .is_some_and(|r| r.len() <= inline_max_bytes);
            let clean = job.state == JobState::Succeeded && job.owner_epoch <= 1 && kept_small;
            if clean || !job.state.is_terminal() {
                continue;
            }
            let prefix = format!("{}{job_id}/", crate::job::artifact::RESULTS_PREFIX);
            for key in blobs.list(&prefix, 1_000).await? {
                let kept = job.result_ref.as_ref().is_some_and(|r| r.key == key);
                if !kept {
                    blobs.delete(&key).await?;
                    removed += 1;
                }
            }
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blobs::MemoryBlobs;
    use crate::ledger::AttemptEnd;
    use crate::ledger::memory::{InMemoryLedger, ended_as, succeeded_at};

    const T: Millis = 1_796_000_000_000;

    #[tokio::test]
    async fn the_sweep_removes_the_object_of_a_put_that_landed_though_the_answer_was_kept_inline() {
        // GIVEN a job in the due index that succeeded at its first epoch with an answer above
        // the inline limit kept in the item (its puts seemed to fail), and the object one of
        // them left
        let ledger = InMemoryLedger::new();
        let blobs = MemoryBlobs::new("results");
        let big = format!(r#"{{"output":"{}"}}"#, "a".repeat(70_000));
        let accept = |answer: &str| AttemptEnd::Succeeded {
            result: answer.into(),
            finish: crate::job::contract::Finish::Stop,
        };
        ended_as(&ledger, "landed", accept(&big), T, true).await;
        blobs.insert("results", "results/landed/1/abc.json", big.as_bytes());
        // and the same job on a first claim whose message SQS kept, so not in the index: its
        // object is left to the bucket's lifecycle rule
        ended_as(&ledger, "unlisted", accept(&big), T, false).await;
        blobs.insert("results", "results/unlisted/1/abc.json", big.as_bytes());
        // and a job whose small inline answer could never have been stored
        succeeded_at(&ledger, "small", r#"{"output":"ok"}"#, T).await;
        blobs.insert("results", "results/small/1/def.json", b"{}");
        // WHEN the sweep runs after their deadline (an hour after they ended)
        let limits = (100, crate::job::DEFAULT_INLINE_MAX_BYTES);
        let due = T + 3_600_000;
        let removed = sweep_orphans(&ledger, &blobs, due - 60_000, due + 60_000, limits)
            .await
            .expect("sweep");
        // THEN the first job's orphan is gone; the others are not even listed
        assert_eq!(removed, 1);
        assert_eq!(
            blobs.keys(),
            vec![
                "results/small/1/def.json".to_owned(),
                "results/unlisted/1/abc.json".to_owned()
            ]
        );
    }
}
