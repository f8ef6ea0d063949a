//! The ledger's indexes, read by the reconciler, replays, exports and `jobctl list`, and
//! cursors to walk them.

use std::collections::HashSet;
use std::future::Future;

use super::LedgerError;
use crate::job::{JobItem, JobState, Millis};

/// The ledger's indexes: jobs that are not terminal, by state, by last change and by deadline
/// (sparse), and jobs by their deadline (the due index: all but a first claim whose message
/// SQS keeps, and its acceptance). The reconciler and `jobctl list` read through it, never by a
/// scan; an operator's export and replay scan the table ([`LedgerIndex::finished`]).
pub trait LedgerIndex: Send + Sync {
    /// Jobs in `state` last changed before `before` that `after` admits, oldest first, at most
    /// `limit`, with when each last changed. Walk on with [`IndexCursor::advance`].
    fn untouched_since(
        &self,
        state: JobState,
        before: Millis,
        after: &IndexCursor,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<(String, Millis)>, LedgerError>> + Send;

    /// Jobs in `state` whose deadline is at or before `now`, earliest first, at most `limit`,
    /// with their deadlines.
    fn past_deadline(
        &self,
        state: JobState,
        now: Millis,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<(String, Millis)>, LedgerError>> + Send;

    /// Jobs due on `day` (UTC, `YYYY-MM-DD`, their deadline's day) whose deadline is from
    /// `from` to `to`, in any state, by deadline and job id, after `cursor`, at most `limit`,
    /// with their deadlines. Every job is in it from its first write until its item expires: its
    /// key never changes, so a job enters it once and no later write touches it.
    fn due(
        &self,
        day: &str,
        range: (Millis, Millis),
        cursor: Option<&(String, Millis)>,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<(String, Millis)>, LedgerError>> + Send;

    /// The deadline up to which the reconciler has walked the due index (`None`: never).
    fn due_walked(&self) -> impl Future<Output = Result<Option<Millis>, LedgerError>> + Send;

    /// Records that the reconciler has walked the due index up to `to`; a record further on
    /// is kept.
    fn walked_due_to(&self, to: Millis) -> impl Future<Output = Result<(), LedgerError>> + Send;

    /// The terminal jobs whose last write was from `from` to `to`, read by a scan of the whole
    /// table: at most `limit` items are read for a page, after the job `after` (`None`: from
    /// the start), and the page says where the next one starts (`None`: the scan is over). An
    /// operator's export or replay reads so; the worker and the reconciler never do.
    fn finished(
        &self,
        range: (Millis, Millis),
        after: Option<&str>,
        limit: usize,
    ) -> impl Future<Output = Result<(Vec<JobItem>, Option<String>), LedgerError>> + Send;

    /// How many jobs are in `state` (no items are read).
    fn count(&self, state: JobState) -> impl Future<Output = Result<u64, LedgerError>> + Send;

    /// Jobs in `state` (not terminal), oldest update first, at most `limit`.
    fn list(
        &self,
        state: JobState,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<(String, Millis)>, LedgerError>> + Send {
        async move {
            let from_the_start = IndexCursor::default();
            self.untouched_since(state, Millis::MAX, &from_the_start, limit)
                .await
        }
    }
}

/// How far a walk through an index has come: it goes on at `at` (many jobs can share a
/// millisecond), past the jobs it already returned there.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IndexCursor {
    /// The latest time returned so far.
    pub at: Millis,
    /// The jobs returned at exactly `at`.
    pub returned_at: HashSet<String>,
}

impl IndexCursor {
    /// Whether the walk has yet to return `job_id`, found at `at`.
    pub(crate) fn admits(&self, job_id: &str, at: Millis) -> bool {
        at > self.at || (at == self.at && !self.returned_at.contains(job_id))
    }

    /// Moves past `page` (oldest first, as the index returns it).
    pub fn advance(&mut self, page: &[(String, Millis)]) {
        for (job_id, at) in page {
            if *at > self.at {
                self.at = *at;
                self.returned_at.clear();
            }
            if *at == self.at {
                self.returned_at.insert(job_id.clone());
            }
        }
    }
}

/// A walk through the due index, day by day, of the jobs whose deadline is from `from` to
/// `to`, in deadline order.
#[derive(Debug, Clone)]
pub struct DueWalk {
    range: (Millis, Millis),
    day_start: Millis,
    cursor: Option<(String, Millis)>,
}

const DAY_MS: Millis = 86_400_000;

impl DueWalk {
    /// A walk of the deadlines from `from` to `to`.
    pub fn new(from: Millis, to: Millis) -> Self {
        DueWalk {
            range: (from, to),
            day_start: from - from.rem_euclid(DAY_MS),
            cursor: None,
        }
    }

    /// The next page, at most `limit` jobs (fewer where a day ends), or `None` once the walk is
    /// over. A day with no due job costs one query.
    pub async fn next<L: LedgerIndex>(
        &mut self,
        ledger: &L,
        limit: usize,
    ) -> Result<Option<Vec<(String, Millis)>>, LedgerError> {
        while self.day_start <= self.range.1 {
            let day = crate::job::utc_day(self.day_start);
            let page = ledger
                .due(&day, self.range, self.cursor.as_ref(), limit)
                .await?;
            if page.len() < limit {
                self.day_start += DAY_MS;
                self.cursor = None;
            } else {
                self.cursor = page.last().cloned();
            }
            if !page.is_empty() {
                return Ok(Some(page));
            }
        }
        Ok(None)
    }
}
