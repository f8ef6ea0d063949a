//! An in-memory ledger with the same conditional-write contract as DynamoDB, for fast tests.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use super::dynamodb::billing::{item_bytes, write_cost};
use super::dynamodb::encode;
use super::transitions::{
    apply_cancel, apply_claim, apply_create, apply_decide, apply_end, apply_mark_enqueued,
    apply_record_ref, apply_recover, apply_renew, apply_settle,
};
use super::{
    CancelRequest, ClaimRequest, CreateRequest, DecideRequest, EndRequest, EnqueuedRequest,
    IndexCursor, JobLedger, LedgerError, LedgerIndex, RecordRefRequest, RecoverRequest,
    RenewRequest, SettleRequest, Write,
};
use crate::job::{JobItem, JobState, MAX_ITEM_BYTES, Millis, attention_key};

/// The ledger in a map. Each operation checks its condition and applies its effect under one
/// lock, which is what a single-item conditional write does in DynamoDB.
#[derive(Debug, Default)]
pub struct InMemoryLedger {
    // A std mutex: the critical sections are short and never cross an await.
    items: Mutex<HashMap<String, JobItem>>,
    writes: AtomicU64,
    /// How far the reconciler has walked the due index.
    walked: Mutex<Option<Millis>>,
    /// What the writes would be billed in DynamoDB, when metered.
    bill: Option<Mutex<Bill>>,
    /// The request counts noted for each running provider batch.
    batches: Mutex<HashMap<String, crate::job::BatchCounts>>,
    /// Each provider batch's jobs, as its creator listed them.
    members: Mutex<HashMap<String, Vec<crate::job::BatchMember>>>,
    /// The webhook deliveries acted on, each until when it is kept.
    deliveries: Mutex<HashMap<String, Millis>>,
}

/// What the writes of a metered ledger would be billed in DynamoDB, by its rules
/// ([`write_cost`]): each write's item encoded as the DynamoDB ledger stores it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Bill {
    /// Write request units of the table writes.
    pub table_units: u64,
    /// Writes to the indexes.
    pub index_writes: u64,
    /// The largest item written, in bytes.
    pub largest_item: usize,
}

impl InMemoryLedger {
    /// An empty ledger.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty ledger that keeps what its writes would be billed in DynamoDB (each write
    /// encodes its items: for benchmarks of the bill, not of CPU).
    pub fn metered() -> Self {
        InMemoryLedger {
            bill: Some(Mutex::new(Bill::default())),
            ..Self::default()
        }
    }

    /// What the writes so far would be billed, when metered.
    pub fn bill(&self) -> Option<Bill> {
        let bill = self.bill.as_ref()?;
        Some(*bill.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// The request counts last noted for the provider batch `batch_id`.
    pub fn batch_counts(&self, batch_id: &str) -> Option<crate::job::BatchCounts> {
        let batches = self.batches.lock().unwrap_or_else(|p| p.into_inner());
        batches.get(batch_id).copied()
    }

    /// Conditional writes attempted so far (applied or refused).
    pub fn writes(&self) -> u64 {
        self.writes.load(Ordering::Relaxed)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, JobItem>> {
        // A panic while holding the lock cannot leave an item half-written (every effect is
        // built on a clone and inserted whole), so a poisoned lock is still consistent.
        self.items.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// One conditional write: `apply` gives the new item, or `None` when the condition fails.
    /// An item that would pass DynamoDB's size limit is refused as DynamoDB refuses it
    /// (`ValidationException`), with nothing applied.
    fn write(
        &self,
        operation: &'static str,
        job_id: &str,
        apply: impl FnOnce(Option<&JobItem>) -> Option<JobItem>,
    ) -> Result<Write, LedgerError> {
        self.writes.fetch_add(1, Ordering::Relaxed);
        let mut items = self.lock();
        let current = items.get(job_id);
        let next = apply(current);
        if let Some(bill) = &self.bill {
            let before = current.map(encode);
            let after = next.as_ref().map(encode).or_else(|| before.clone());
            let cost = write_cost(before.as_ref(), after.as_ref());
            let mut bill = bill.lock().unwrap_or_else(|p| p.into_inner());
            bill.table_units += cost.table;
            bill.index_writes += cost.index;
            let size = after.as_ref().map(item_bytes).unwrap_or(0);
            bill.largest_item = bill.largest_item.max(size);
        }
        match next {
            Some(next) if next.item_bytes() > MAX_ITEM_BYTES => Err(LedgerError::Rejected {
                operation,
                code: "ValidationException".to_owned(),
            }),
            Some(next) => {
                items.insert(job_id.to_owned(), next.clone());
                Ok(Write::Applied(next))
            }
            None => Ok(Write::Refused(current.cloned())),
        }
    }
}

/// The sparse indexes as DynamoDB keeps them: terminal jobs, and jobs running on their first
/// claim, are in none of the attention index's.
impl LedgerIndex for InMemoryLedger {
    async fn untouched_since(
        &self,
        state: JobState,
        before: Millis,
        after: &IndexCursor,
        limit: usize,
    ) -> Result<Vec<(String, Millis)>, LedgerError> {
        Ok(self.indexed(state, limit, |job| {
            (job.updated_at < before && after.admits(&job.job_id, job.updated_at))
                .then_some(job.updated_at)
        }))
    }

    async fn past_deadline(
        &self,
        state: JobState,
        now: Millis,
        limit: usize,
    ) -> Result<Vec<(String, Millis)>, LedgerError> {
        Ok(self.indexed(state, limit, |job| {
            (job.deadline_at <= now).then_some(job.deadline_at)
        }))
    }

    async fn count(&self, state: JobState) -> Result<u64, LedgerError> {
        Ok(self.indexed(state, usize::MAX, |_| Some(0)).len() as u64)
    }

    async fn due(
        &self,
        day: &str,
        (from, to): (Millis, Millis),
        cursor: Option<&(String, Millis)>,
        limit: usize,
    ) -> Result<Vec<(String, Millis)>, LedgerError> {
        let mut found: Vec<(String, Millis)> = self
            .lock()
            .values()
            .filter(|job| {
                job.due_listed
                    && (from..=to).contains(&job.deadline_at)
                    && crate::job::utc_day(job.deadline_at) == day
            })
            .map(|job| (job.job_id.clone(), job.deadline_at))
            .collect();
        found.sort_by(|a, b| (a.1, &a.0).cmp(&(b.1, &b.0)));
        Ok(found
            .into_iter()
            .filter(|(id, at)| cursor.is_none_or(|(cid, cat)| (at, id) > (cat, cid)))
            .take(limit)
            .collect())
    }

    async fn due_walked(&self) -> Result<Option<Millis>, LedgerError> {
        Ok(*self.walked.lock().unwrap_or_else(|p| p.into_inner()))
    }

    async fn finished(
        &self,
        (from, to): (Millis, Millis),
        after: Option<&str>,
        limit: usize,
    ) -> Result<(Vec<JobItem>, Option<String>), LedgerError> {
        let items = self.lock();
        let mut ids: Vec<&String> = items
            .keys()
            .filter(|id| after.is_none_or(|a| id.as_str() > a))
            .collect();
        ids.sort();
        let read = &ids[..ids.len().min(limit.max(1))];
        let next = (read.len() < ids.len()).then(|| read.last().map(|id| (*id).clone()));
        let found = read
            .iter()
            .filter_map(|id| items.get(*id))
            .filter(|job| job.state.is_terminal() && (from..=to).contains(&job.updated_at))
            .cloned()
            .collect();
        Ok((found, next.flatten()))
    }

    async fn walked_due_to(&self, to: Millis) -> Result<(), LedgerError> {
        let mut walked = self.walked.lock().unwrap_or_else(|p| p.into_inner());
        *walked = Some(walked.map_or(to, |at| at.max(to)));
        Ok(())
    }
}

impl InMemoryLedger {
    /// Non-terminal jobs in `state` for which `key` gives a sort key, smallest first, at most
    /// `limit`.
    fn indexed(
        &self,
        state: JobState,
        limit: usize,
        key: impl Fn(&JobItem) -> Option<Millis>,
    ) -> Vec<(String, Millis)> {
        if state.is_terminal() {
            return Vec::new();
        }
        let mut found: Vec<(String, Millis)> = self
            .lock()
            .values()
            .filter(|job| {
                job.state == state
                    && attention_key(job.state, job.owner_epoch, job.watched, &job.job_id).is_some()
            })
            .filter_map(|job| key(job).map(|at| (job.job_id.clone(), at)))
            .collect();
        found.sort_by(|a, b| a.1.cmp(&b.1).then_with(|| a.0.cmp(&b.0)));
        found.truncate(limit);
        found
    }
}

impl super::pushed::PushedLedger for InMemoryLedger {
    async fn batch_members(
        &self,
        batch_id: &str,
    ) -> Result<Vec<crate::job::BatchMember>, LedgerError> {
        let kept = self.members.lock().unwrap_or_else(|p| p.into_inner());
        Ok(kept.get(batch_id).cloned().unwrap_or_default())
    }

    async fn was_acted_on(&self, id: &str, now: Millis) -> Result<bool, LedgerError> {
        let seen = self.deliveries.lock().unwrap_or_else(|p| p.into_inner());
        // Kept past its time reads as absent: the TTL deletes late.
        Ok(seen.get(id).is_some_and(|kept| *kept >= now))
    }

    async fn acted_on(&self, id: &str, _now: Millis, until: Millis) -> Result<(), LedgerError> {
        self.writes.fetch_add(1, Ordering::Relaxed);
        let mut seen = self.deliveries.lock().unwrap_or_else(|p| p.into_inner());
        seen.insert(id.to_owned(), until);
        Ok(())
    }
}

impl JobLedger for InMemoryLedger {
    async fn claim(&self, req: ClaimRequest) -> Result<Write, LedgerError> {
        self.write("claim", &req.job.job_id, |c| apply_claim(c, &req))
    }

    async fn end(&self, req: EndRequest) -> Result<Write, LedgerError> {
        self.write("end", &req.job_id, |c| apply_end(c, &req))
    }

    async fn settle(&self, req: SettleRequest) -> Result<Write, LedgerError> {
        self.write("settle", &req.job_id, |c| apply_settle(c, &req))
    }

    async fn recover(&self, req: RecoverRequest) -> Result<Write, LedgerError> {
        self.write("recover", &req.job_id, |c| apply_recover(c, &req))
    }

    async fn renew(&self, req: RenewRequest) -> Result<Write, LedgerError> {
        self.write("renew", &req.job_id, |c| apply_renew(c, &req))
    }

    async fn create(&self, req: CreateRequest) -> Result<Write, LedgerError> {
        self.write("create", &req.job.job_id, |c| apply_create(c, &req))
    }

    async fn mark_enqueued(&self, req: EnqueuedRequest) -> Result<Write, LedgerError> {
        self.write("mark_enqueued", &req.job_id, |c| {
            apply_mark_enqueued(c, &req)
        })
    }

    async fn record_ref(&self, req: RecordRefRequest) -> Result<Write, LedgerError> {
        self.write("record_ref", &req.job_id, |c| apply_record_ref(c, &req))
    }

    async fn decide(&self, req: DecideRequest) -> Result<Write, LedgerError> {
        self.write("decide", &req.job_id, |c| apply_decide(c, &req))
    }

    async fn cancel(&self, req: CancelRequest) -> Result<Write, LedgerError> {
        self.write("cancel", &req.job_id, |c| apply_cancel(c, &req))
    }

    async fn get(&self, job_id: &str) -> Result<Option<JobItem>, LedgerError> {
        Ok(self.lock().get(job_id).cloned())
    }

    async fn note_batch(
        &self,
        batch_id: &str,
        counts: crate::job::BatchCounts,
        _now: Millis,
    ) -> Result<(), LedgerError> {
        self.writes.fetch_add(1, Ordering::Relaxed);
        if let Some(bill) = &self.bill {
            // A small item of its own: one write unit, no index.
            bill.lock().unwrap_or_else(|p| p.into_inner()).table_units += 1;
        }
        let mut batches = self.batches.lock().unwrap_or_else(|p| p.into_inner());
        batches.insert(batch_id.to_owned(), counts);
        Ok(())
    }

    async fn note_batch_members(
        &self,
        batch_id: &str,
        members: &[crate::job::BatchMember],
        _now: Millis,
    ) -> Result<(), LedgerError> {
        for part in members.chunks(super::pushed::MEMBERS_PER_ITEM) {
            self.writes.fetch_add(1, Ordering::Relaxed);
            if let Some(bill) = &self.bill {
                // Each member's id, tenant and the list's own bytes, and the key: whole KB.
                let bytes: usize = part
                    .iter()
                    .map(|m| m.job_id.len() + m.class.tenant.as_ref().map_or(0, String::len) + 16)
                    .sum::<usize>()
                    + batch_id.len()
                    + 64;
                bill.lock().unwrap_or_else(|p| p.into_inner()).table_units +=
                    bytes.div_ceil(1_024) as u64;
            }
        }
        let mut kept = self.members.lock().unwrap_or_else(|p| p.into_inner());
        kept.insert(batch_id.to_owned(), members.to_vec());
        Ok(())
    }
}

/// What a [`FaultyLedger`] does to an operation.
#[cfg(any(test, feature = "test-support"))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Applied, then failed as a timeout would: the answer is lost.
    LoseAnswer,
    /// Failed without being applied.
    Fail,
    /// Never answered, and never applied.
    Stall,
    /// Applied and answered, but the caller's process stops for this many milliseconds before
    /// it reads the answer (a freeze between a write and what follows it).
    Pause(Millis),
}

/// A ledger behind a faulty connection, for tests: chosen operations lose their answers, fail
/// or stall, a set number of times each.
#[cfg(any(test, feature = "test-support"))]
#[derive(Debug, Default)]
pub struct FaultyLedger<L> {
    /// The ledger that applies the writes.
    pub inner: L,
    faults: Mutex<HashMap<&'static str, (Fault, u32)>>,
}

#[cfg(any(test, feature = "test-support"))]
impl<L: JobLedger> FaultyLedger<L> {
    /// `inner`, with no fault yet.
    pub fn new(inner: L) -> Self {
        FaultyLedger {
            inner,
            faults: Mutex::new(HashMap::new()),
        }
    }

    /// The next `times` calls of `operation` (`claim`, `end`, `decide`, ...) meet `fault`.
    pub fn inject(&self, operation: &'static str, fault: Fault, times: u32) {
        self.faults
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(operation, (fault, times));
    }

    fn take(&self, operation: &'static str) -> Option<Fault> {
        let mut faults = self.faults.lock().unwrap_or_else(|p| p.into_inner());
        match faults.get_mut(operation) {
            Some((fault, n)) if *n > 0 => {
                *n -= 1;
                Some(*fault)
            }
            _ => None,
        }
    }

    async fn call(
        &self,
        operation: &'static str,
        write: impl std::future::Future<Output = Result<Write, LedgerError>>,
    ) -> Result<Write, LedgerError> {
        let lost = || LedgerError::Unavailable {
            operation,
            code: "timeout".to_owned(),
        };
        match self.take(operation) {
            None => write.await,
            Some(Fault::LoseAnswer) => write.await.and_then(|_| Err(lost())),
            Some(Fault::Fail) => Err(lost()),
            Some(Fault::Stall) => std::future::pending().await,
            Some(Fault::Pause(ms)) => {
                let answer = write.await;
                tokio::time::sleep(std::time::Duration::from_millis(ms.max(0) as u64)).await;
                answer
            }
        }
    }
}

#[cfg(any(test, feature = "test-support"))]
impl<L: JobLedger> JobLedger for FaultyLedger<L> {
    async fn claim(&self, req: ClaimRequest) -> Result<Write, LedgerError> {
        self.call("claim", self.inner.claim(req)).await
    }
    async fn end(&self, req: EndRequest) -> Result<Write, LedgerError> {
        self.call("end", self.inner.end(req)).await
    }
    async fn settle(&self, req: SettleRequest) -> Result<Write, LedgerError> {
        self.call("settle", self.inner.settle(req)).await
    }
    async fn recover(&self, req: RecoverRequest) -> Result<Write, LedgerError> {
        self.call("recover", self.inner.recover(req)).await
    }
    async fn renew(&self, req: RenewRequest) -> Result<Write, LedgerError> {
        self.call("renew", self.inner.renew(req)).await
    }
    async fn create(&self, req: CreateRequest) -> Result<Write, LedgerError> {
        self.call("create", self.inner.create(req)).await
    }
    async fn mark_enqueued(&self, req: EnqueuedRequest) -> Result<Write, LedgerError> {
        self.call("mark_enqueued", self.inner.mark_enqueued(req))
            .await
    }
    async fn record_ref(&self, req: RecordRefRequest) -> Result<Write, LedgerError> {
        self.call("record_ref", self.inner.record_ref(req)).await
    }
    async fn decide(&self, req: DecideRequest) -> Result<Write, LedgerError> {
        self.call("decide", self.inner.decide(req)).await
    }
    async fn cancel(&self, req: CancelRequest) -> Result<Write, LedgerError> {
        self.call("cancel", self.inner.cancel(req)).await
    }
    async fn get(&self, job_id: &str) -> Result<Option<JobItem>, LedgerError> {
        match self.take("get") {
            None | Some(Fault::Pause(_)) => self.inner.get(job_id).await,
            Some(Fault::Stall) => std::future::pending().await,
            Some(Fault::LoseAnswer | Fault::Fail) => Err(LedgerError::Unavailable {
                operation: "get",
                code: "timeout".to_owned(),
            }),
        }
    }
    async fn note_batch(
        &self,
        batch_id: &str,
        counts: crate::job::BatchCounts,
        now: Millis,
    ) -> Result<(), LedgerError> {
        self.inner.note_batch(batch_id, counts, now).await
    }
    async fn note_batch_members(
        &self,
        batch_id: &str,
        members: &[crate::job::BatchMember],
        now: Millis,
    ) -> Result<(), LedgerError> {
        self.inner.note_batch_members(batch_id, members, now).await
    }
}

#[cfg(test)]
/// A job claimed a second before `at` and accepted with `answer` (inline) at `at`, due an hour
/// later, for tests.
#[cfg(any(test, feature = "test-support"))]
pub(crate) async fn succeeded_at(ledger: &impl JobLedger, job_id: &str, answer: &str, at: Millis) {
    let end = super::AttemptEnd::Succeeded {
        result: answer.into(),
        finish: crate::job::contract::Finish::Stop,
    };
    ended_at(ledger, job_id, end, at).await;
}

#[cfg(test)]
/// A job claimed a second before `at` whose first attempt ended with `end` at `at`, due an hour
/// later, for tests.
#[cfg(any(test, feature = "test-support"))]
pub(crate) async fn ended_at(
    ledger: &impl JobLedger,
    job_id: &str,
    end: super::AttemptEnd,
    at: Millis,
) {
    ended_as(ledger, job_id, end, at, false).await;
}

/// [`ended_at`], its first claim listed in the due index when `list_due`.
#[cfg(test)]
pub(crate) async fn ended_as(
    ledger: &impl JobLedger,
    job_id: &str,
    end: super::AttemptEnd,
    at: Millis,
    list_due: bool,
) {
    let job = crate::job::NewJob::example(job_id, at + 3_600_000);
    let claim = super::ClaimRequest {
        job,
        expect: crate::job::Expect::FRESH,
        owner_id: "w".into(),
        now: at - 1_000,
        lease_until: at + 60_000,
        provider_ref: None,
        route: None,
        first_sight: true,
        list_due,
    };
    assert!(matches!(ledger.claim(claim).await, Ok(Write::Applied(_))));
    let end = super::EndRequest {
        job_id: job_id.into(),
        epoch: 1,
        attempt: 1,
        now: at,
        end,
        usage: None,
        input: None,
    };
    assert!(matches!(ledger.end(end).await, Ok(Write::Applied(_))));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::NewJob;

    #[tokio::test]
    async fn a_walk_through_the_index_returns_every_job_once_across_a_shared_millisecond() {
        // GIVEN seven ready jobs written in the same millisecond and one a millisecond later
        let ledger = InMemoryLedger::new();
        let job = |id: &str| NewJob::example(id, 10_000);
        for (id, at) in [
            ("a", 5),
            ("b", 5),
            ("c", 5),
            ("d", 5),
            ("e", 5),
            ("f", 5),
            ("g", 5),
        ]
        .into_iter()
        .chain([("h", 6)])
        {
            let req = CreateRequest {
                job: job(id),
                now: at,
                enqueued: false,
            };
            assert!(matches!(ledger.create(req).await, Ok(Write::Applied(_))));
        }
        // WHEN it is walked in pages of three
        let (mut cursor, mut seen) = (IndexCursor::default(), Vec::new());
        loop {
            let page = ledger
                .untouched_since(JobState::Ready, 7, &cursor, 3)
                .await
                .expect("page");
            cursor.advance(&page);
            seen.extend(page.iter().map(|(id, _)| id.clone()));
            if page.len() < 3 {
                break;
            }
        }
        // THEN each job comes once, oldest first
        assert_eq!(seen, ["a", "b", "c", "d", "e", "f", "g", "h"]);
    }
}
