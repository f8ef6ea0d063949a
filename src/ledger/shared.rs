//! A ledger shared behind an [`Arc`](std::sync::Arc) is the ledger it shares.

use std::future::Future;

use super::{
    CancelRequest, ClaimRequest, CreateRequest, DecideRequest, EndRequest, EnqueuedRequest,
    JobLedger, LedgerError, RecordRefRequest, RecoverRequest, RenewRequest, SettleRequest, Write,
};
use crate::job::{JobItem, Millis};

impl<L: JobLedger> JobLedger for std::sync::Arc<L> {
    fn claim(&self, req: ClaimRequest) -> impl Future<Output = Result<Write, LedgerError>> + Send {
        (**self).claim(req)
    }

    fn end(&self, req: EndRequest) -> impl Future<Output = Result<Write, LedgerError>> + Send {
        (**self).end(req)
    }

    fn end_known(
        &self,
        known: &JobItem,
        req: EndRequest,
    ) -> impl Future<Output = Result<Write, LedgerError>> + Send {
        (**self).end_known(known, req)
    }

    fn settle(
        &self,
        req: SettleRequest,
    ) -> impl Future<Output = Result<Write, LedgerError>> + Send {
        (**self).settle(req)
    }

    fn recover(
        &self,
        req: RecoverRequest,
    ) -> impl Future<Output = Result<Write, LedgerError>> + Send {
        (**self).recover(req)
    }

    fn renew(&self, req: RenewRequest) -> impl Future<Output = Result<Write, LedgerError>> + Send {
        (**self).renew(req)
    }

    fn create(
        &self,
        req: CreateRequest,
    ) -> impl Future<Output = Result<Write, LedgerError>> + Send {
        (**self).create(req)
    }

    fn mark_enqueued(
        &self,
        req: EnqueuedRequest,
    ) -> impl Future<Output = Result<Write, LedgerError>> + Send {
        (**self).mark_enqueued(req)
    }

    fn record_ref(
        &self,
        req: RecordRefRequest,
    ) -> impl Future<Output = Result<Write, LedgerError>> + Send {
        (**self).record_ref(req)
    }

    fn decide(
        &self,
        req: DecideRequest,
    ) -> impl Future<Output = Result<Write, LedgerError>> + Send {
        (**self).decide(req)
    }

    fn cancel(
        &self,
        req: CancelRequest,
    ) -> impl Future<Output = Result<Write, LedgerError>> + Send {
        (**self).cancel(req)
    }

    fn get(
        &self,
        job_id: &str,
    ) -> impl Future<Output = Result<Option<JobItem>, LedgerError>> + Send {
        (**self).get(job_id)
    }

    fn note_batch(
        &self,
        batch_id: &str,
        counts: crate::job::BatchCounts,
        now: Millis,
    ) -> impl Future<Output = Result<(), LedgerError>> + Send {
        (**self).note_batch(batch_id, counts, now)
    }
    fn note_batch_members(
        &self,
        batch_id: &str,
        members: &[crate::job::BatchMember],
        now: Millis,
    ) -> impl Future<Output = Result<(), LedgerError>> + Send {
        (**self).note_batch_members(batch_id, members, now)
    }
}

impl<L: super::pushed::PushedLedger> super::pushed::PushedLedger for std::sync::Arc<L> {
    fn batch_members(
        &self,
        batch_id: &str,
    ) -> impl Future<Output = Result<Vec<crate::job::BatchMember>, LedgerError>> + Send {
        (**self).batch_members(batch_id)
    }
    fn was_acted_on(
        &self,
        id: &str,
        now: Millis,
    ) -> impl Future<Output = Result<bool, LedgerError>> + Send {
        (**self).was_acted_on(id, now)
    }
    fn acted_on(
        &self,
        id: &str,
        now: Millis,
        until: Millis,
    ) -> impl Future<Output = Result<(), LedgerError>> + Send {
        (**self).acted_on(id, now, until)
    }
}
