//! Ending an attempt: the owner's writes the [`Ending`] machine asks for, carried out, with the
//! answer placed where it belongs first and a refused answer's stored object removed after.

use std::time::Duration;

use super::{Invocation, Processed, Processor};
use crate::clock::Clock;
use crate::job::{JobMessage, JobRecord, Millis};
use crate::ledger::{JobLedger, LedgerError};
use crate::protocol::ending::{Closed, EndFacts, EndStep, EndWrite, Ending, Waited};
use crate::provider::Provider;

/// Tries at ending an attempt whose write fails, within the invocation and the job's deadline.
const END_TRIES: u32 = 5;
/// Pause before the second try; doubled for each one after.
const END_RETRY_PAUSE_MS: Millis = 100;

impl<L: JobLedger, P: Provider, C: Clock> Processor<L, P, C> {
    /// Ends the attempt of `owner` after what waiting for the provider came to: the steps of its
    /// [`Ending`], carried out. Every write is conditional on the owner's epoch; a refused end
    /// drops the answer unpublished.
    pub(super) async fn end_attempt(
        &self,
        owner: JobRecord,
        waited: Waited,
        spent: super::run::Spent,
        msg: &JobMessage,
        inv: &Invocation,
    ) -> Processed {
        let facts = self.end_facts(inv, &owner);
        let (mut machine, mut step) = Ending::start(facts, owner, waited, self.clock.now_ms());
        if machine.late() {
            tracing::warn!(job_id = %machine.owner().job_id, "answer came within the skew margin of the deadline; not accepted");
        }
        // The input this end keeps, once found (a retried write keeps the same).
        let mut kept = None;
        loop {
            step = match step {
                EndStep::Place => {
                    let body = machine.answer().unwrap_or_default();
                    let placed = self.place_result(machine.owner(), body, inv).await;
                    machine.placed(placed, self.clock.now_ms())
                }
                EndStep::Write { pause_ms } => {
                    if pause_ms > 0 {
                        tokio::time::sleep(Duration::from_millis(pause_ms as u64)).await;
                    }
                    let now = self.clock.now_ms();
                    let answer = match machine.write(now) {
                        EndWrite::End(mut req) => {
                            req.usage = spent.recorded(&req.end, &self.settings.prices);
                            // A job left live keeps its input, for a trigger by id.
                            if !req.end.target().is_terminal() && !machine.owner().keeps_input() {
                                if kept.is_none() {
                                    kept = Some(self.kept_input(msg).await);
                                }
                                req.input = kept.clone().flatten();
                            }
                            self.ledger.end_known(machine.owner(), req).await
                        }
                        EndWrite::Renew(req) => self.ledger.renew(req).await,
                    };
                    let job_id = &machine.owner().job_id;
                    match answer {
                        Ok(write) => machine.answered(Some(write), now),
                        // The table refused the answer itself (too large after all).
                        Err(LedgerError::Rejected { code, .. }) if machine.accepting() => {
                            tracing::warn!(%job_id, code, "the answer could not be stored");
                            machine.rejected(now)
                        }
                        Err(e) => {
                            tracing::warn!(%job_id, error = %e, "a write ending the attempt failed");
                            machine.answered(None, self.clock.now_ms())
                        }
                    }
                }
                EndStep::Done(closed) => return self.ended(machine.owner(), *closed).await,
            }
        }
    }

    /// What the owner knows when it ends its attempt.
    fn end_facts(&self, inv: &Invocation, owner: &JobRecord) -> EndFacts {
        let s = &self.settings;
        EndFacts {
            skew: s.skew_ms,
            lease_ms: s.lease_ms,
            invocation_end: inv
                .deadline
                .map_or(Millis::MAX, |d| d - s.deadline_margin_ms),
            can_retrieve: self.link_of(owner).provider.can_retrieve(),
            replay: s.replay,
            tries: END_TRIES,
            first_pause_ms: END_RETRY_PAUSE_MS,
            batch_poll_ms: s.batching.poll_ms,
        }
    }

    /// The delivery's end: a refusal said, a refused answer's object removed once nobody can
    /// accept it (what nobody accepts otherwise is the orphan sweep's, or the lifecycle rule's).
    async fn ended(&self, owner: &JobRecord, closed: Closed) -> Processed {
        if closed.refused {
            tracing::warn!(
                job_id = %owner.job_id,
                epoch = owner.owner_epoch,
                current_epoch = closed.view.as_ref().map(|s| s.owner_epoch),
                current_state = closed.view.as_ref().map(|s| s.state.as_str()),
                "end of attempt refused; result not published"
            );
        }
        if let Some(blob) = &closed.discard
            && let Some(store) = self.blobs()
            && let Err(e) = store.delete(&blob.key).await
        {
            tracing::warn!(error = %e, "removing a refused answer's object failed");
        }
        Processed {
            outcome: closed.outcome,
            view: closed.view,
        }
    }
}
