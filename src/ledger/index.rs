//! The ledger's sparse indexes, read by the reconciler, replays and `jobctl list`, and a
//! cursor to walk them.

use std::collections::HashSet;
use std::future::Future;

use super::LedgerError;
use crate::job::{JobState, Millis};

/// The ledger's sparse indexes: jobs that are not terminal, by state, by last change and by
/// deadline. The reconciler and `jobctl list` read through it, never by a scan.
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

    /// Jobs that became terminal on `day` (UTC, `YYYY-MM-DD`) at or after `since`, by that time
    /// and job id, after `cursor`, at most `limit`, with that time. The next page starts after
    /// the last one returned.
    fn finished(
        &self,
        day: &str,
        since: Millis,
        cursor: Option<&(String, Millis)>,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<(String, Millis)>, LedgerError>> + Send;

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
