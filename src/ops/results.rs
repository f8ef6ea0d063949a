//! Reading answers out: one job's answer (`jobctl result`), and the jobs that finished since a
//! time as JSON lines (`jobctl export`), read day by day from the sparse finished index, never by
//! a scan of the table.

use futures::stream::{self, StreamExt};
use serde_json::{Value, json};

use super::CONCURRENCY;
use crate::blobs::{BlobError, BlobStore, read_checked};
use crate::job::{JobRecord, JobState, Millis, finished_day};
use crate::ledger::{JobLedger, LedgerError, LedgerIndex};

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
    /// Days read from the finished index.
    pub days: u64,
    /// Lines written.
    pub written: u64,
    /// Finished jobs skipped by the state filter.
    pub filtered: u64,
}

/// Writes one JSON line per job that finished from `since` to `now` (in `state`, when given):
/// job id, state, finish time, metadata, and the answer inline or its reference (or the error).
/// `progress` is called after each page.
pub async fn export<L: JobLedger + LedgerIndex>(
    ledger: &L,
    since: Millis,
    now: Millis,
    state: Option<JobState>,
    out: &mut impl std::io::Write,
    mut progress: impl FnMut(&ExportReport, &str),
) -> Result<ExportReport, ResultError> {
    const PAGE: usize = 200;
    let mut report = ExportReport::default();
    let mut day_start = since - since.rem_euclid(DAY_MS);
    while day_start <= now {
        let day = finished_day(day_start);
        report.days += 1;
        let mut cursor: Option<(String, Millis)> = None;
        loop {
            let page = ledger.finished(&day, since, cursor.as_ref(), PAGE).await?;
            let jobs: Vec<Result<Option<JobRecord>, LedgerError>> = stream::iter(&page)
                .map(|(id, _)| ledger.get(id))
                .buffered(CONCURRENCY)
                .collect()
                .await;
            for job in jobs {
                let Some(job) = job? else { continue };
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
            progress(&report, &day);
            cursor = page.last().cloned();
            if page.len() < PAGE {
                break;
            }
        }
        day_start += DAY_MS;
    }
    Ok(report)
}

const DAY_MS: Millis = 86_400_000;

/// One export line.
pub fn line(job: &JobRecord) -> Value {
    let mut row = json!({
        "job_id": job.job_id,
        "state": job.state.as_str(),
        "finished_at": job.updated_at,
        "attempts": job.attempts,
        "metadata": job.metadata.as_deref().and_then(|m| serde_json::from_str::<Value>(m).ok()),
    });
    let fields = row.as_object_mut().expect("a json! object");
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
/// crashed before its acceptance (or whose removal failed). Only jobs that finished from `since`
/// on are looked at (the finished index), and of those only the ones that could have left one:
/// any but a success accepted at the first epoch (one attempt, one object, the one referenced).
/// An object is removed only once its job is terminal, so an acceptance still in flight never
/// loses its answer. Returns how many were removed.
pub async fn sweep_orphans<L: JobLedger + LedgerIndex>(
    ledger: &L,
    blobs: &dyn BlobStore,
    since: Millis,
    now: Millis,
    max_jobs: usize,
) -> Result<u64, ResultError> {
    let mut removed = 0;
    let mut looked = 0;
    let mut day_start = since - since.rem_euclid(DAY_MS);
    while day_start <= now && looked < max_jobs {
        let day = finished_day(day_start);
        let mut cursor: Option<(String, Millis)> = None;
        loop {
            let page = ledger.finished(&day, since, cursor.as_ref(), 200).await?;
            looked += page.len();
            for (job_id, _) in &page {
                let Some(job) = ledger.get(job_id).await? else {
                    continue;
                };
                let clean = job.state == JobState::Succeeded && job.owner_epoch <= 1;
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
            cursor = page.last().cloned();
            if page.len() < 200 || looked >= max_jobs {
                break;
            }
        }
        day_start += DAY_MS;
    }
    Ok(removed)
}
