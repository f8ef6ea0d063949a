//! The writes a delivery makes before its call, as the admission asks for them: the claim
//! (with the route of its attempt), a settle, a create, a recovery claim.

use super::Processor;
use crate::clock::Clock;
use crate::job::decision::Expect;
use crate::job::usage::Rate;
use crate::job::{JobItem, JobMessage, NewJob, Route};
use crate::ledger::{ClaimRequest, CreateRequest, JobLedger, LedgerError, RecoverRequest, Write};
use crate::protocol::admission::Op;
use crate::provider::{Provider, batch};

/// What a claim asks for.
#[derive(Debug, Clone, Copy)]
struct Claim<'a> {
    job: &'a NewJob,
    expect: Expect,
    owner_id: &'a str,
    /// Nothing read yet and nothing says the item exists: the write creates it.
    first_sight: bool,
    /// The provider (its index in the list) the admission took capacity and spend for: the
    /// attempt goes there.
    route: usize,
    /// The item last seen, if any.
    seen: Option<&'a JobItem>,
}

impl<L: JobLedger, P: Provider, C: Clock> Processor<L, P, C> {
    /// One write before the call, as the admission asked for it; `view` is the item last seen,
    /// `route` the provider the admission chose for a claim, `recovery` the recovery claim the
    /// delivery built for [`Op::Recover`].
    pub(super) async fn write_op(
        &self,
        msg: &JobMessage,
        (job, op): (&NewJob, &Op),
        (owner_id, route): (&str, usize),
        view: Option<&JobItem>,
        recovery: Option<RecoverRequest>,
    ) -> Result<Write, (LedgerError, bool)> {
        let now = self.clock.now_ms();
        // A write that keeps the input stores it first when it is large: a creation, and a
        // claim after the first where SQS may drop the message.
        let keeps = match *op {
            Op::Claim { expect, .. } => expect.epoch > 0 && self.may_drop(msg, job),
            Op::Create => true,
            _ => false,
        };
        let stored = match keeps {
            true => self.kept_job(msg, job, view).await,
            false => None,
        };
        let job = stored.as_ref().unwrap_or(job);
        match *op {
            Op::Claim {
                expect,
                first_sight,
            } => {
                let claim = Claim {
                    job,
                    expect,
                    owner_id,
                    first_sight,
                    route,
                    seen: view,
                };
                self.claim(msg, claim).await
            }
            Op::Settle(settle) => {
                let req = settle.request(job, now);
                self.ledger.settle(req).await.map_err(|e| (e, true))
            }
            Op::Create => {
                let req = CreateRequest {
                    job: job.clone(),
                    now,
                    enqueued: true,
                };
                self.ledger.create(req).await.map_err(|e| (e, true))
            }
            Op::Recover { .. } => {
                // Nothing seen to recover from: the delivery decides again from the view.
                let Some(req) = recovery else {
                    return Ok(Write::Refused(view.cloned()));
                };
                self.ledger.recover(req).await.map_err(|e| (e, true))
            }
        }
    }

    /// The claim: one conditional write, recognised if its answer was lost. A first sight of a
    /// message SQS delivered before reads first: the item most likely exists (often finished),
    /// and the item read decides as a refused create's would, without the whole item carried
    /// both ways; only an absent item is then created.
    async fn claim(
        &self,
        msg: &JobMessage,
        claim: Claim<'_>,
    ) -> Result<Write, (LedgerError, bool)> {
        let Claim {
            job,
            expect,
            owner_id,
            first_sight,
            route,
            seen,
        } = claim;
        if first_sight
            && msg.delivered_before
            && let Some(item) = self.ledger.get(&job.job_id).await.map_err(|e| (e, false))?
        {
            // Nothing written: the item as it stands.
            return Ok(Write::Refused(Some(item)));
        }
        let link = &self.links[route];
        let input = self.routed_input(link, msg);
        // The path, where the deployment lets the worker choose one; else the job's own ask.
        if self.settings.batching.paths.any() {
            let model = link.provider.model(&input);
            self.share_path_times(link.provider.name(), model).await;
        }
        // After the share's requests: the claim's times and lease start now.
        let now = self.clock.now_ms();
        let path = self.choose_path((link, &input), (msg, job), seen, now);
        let batched = match &path {
            Some(choice) => choice.rate == Rate::Batch,
            None => self.batched(link, &input),
        };
        let route = Route {
            provider: link.provider.name().to_owned(),
            model: link.provider.model(&input).to_owned(),
            path: path.map(|c| (c.rate, c.why)),
        };
        let (attempt, epoch) = (expect.attempts + 1, expect.epoch + 1);
        // A line of a batch: its pending reference, found again by listing if the batch's id
        // is never recorded.
        let provider_ref = if batched {
            Some(batch::pending_ref(&batch::scoped_line_id(
                &self.settings.idempotency_prefix,
                &job.job_id,
                &msg.digest,
                attempt,
                epoch,
            )))
        } else {
            link.provider.reference(&job.job_id, attempt, epoch)
        };
        let req = ClaimRequest {
            job: job.clone(),
            expect,
            owner_id: owner_id.to_owned(),
            now,
            lease_until: now + self.settings.lease_ms,
            provider_ref,
            route: Some(route),
            first_sight,
            // (An item that keeps its input already keeps it, listed and watched.)
            list_due: self.may_drop(msg, job) || seen.is_some_and(JobItem::keeps_input),
        };
        self.ledger.claim(req).await.map_err(|e| (e, true))
    }

    /// Whether SQS may drop `msg` before `job` can end (`VisibilityPolicy::may_drop`, by the
    /// message's deadline, which is never earlier than the item's): then a claim lists the job
    /// in the due index and a write that leaves it live keeps its input, so that the
    /// reconciler can find it and trigger it by id.
    pub(super) fn may_drop(&self, msg: &JobMessage, job: &NewJob) -> bool {
        self.settings
            .visibility
            .may_drop(msg.receive_count, msg.sent_at, job.deadline_at)
    }
}
