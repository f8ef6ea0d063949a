//! After a recovery claim: the evidence the lapsed owner left decides, never a new call.

use super::{AttemptWatch, Invocation, Processed, Processor};
use crate::clock::Clock;
use crate::job::{JobMessage, JobRecord};
use crate::ledger::JobLedger;
use crate::protocol::calling::{CallStep, Calling};
use crate::provider::Provider;

impl<L: JobLedger, P: Provider, C: Clock> Processor<L, P, C> {
    /// After a recovery claim fenced a lapsed owner, look at the evidence of the attempt it left.
    /// An answer it stored in the results bucket and never accepted is accepted now. With a
    /// provider reference, the provider's word decides (completed: accepted under the new
    /// epoch; definitely failed: retry or fail; still running: poll while this invocation
    /// allows, the lease renewed by the heartbeat, then hand the job to the next delivery).
    /// Otherwise the attempt may have run and the job becomes `unknown` (or, under the replay
    /// policy, `retry_authorized` with the decision recorded). Never a new call.
    pub(super) async fn after_recovery(
        &self,
        msg: &JobMessage,
        fenced: JobRecord,
        lapsed_epoch: u64,
        inv: &Invocation,
        watch: &dyn AttemptWatch,
    ) -> Processed {
        tracing::warn!(
            job_id = %msg.job_id,
            lapsed_epoch,
            epoch = fenced.owner_epoch,
            "recovered a job whose lease lapsed"
        );
        // The lapsed owner stored its answer and could not accept it: that is the outcome.
        let stored = self.stored_answer(&fenced).await;
        if stored.is_some() {
            tracing::info!(job_id = %msg.job_id, lapsed_epoch, "the lapsed owner's stored answer is accepted");
        }
        let because = fenced
            .recoveries
            .last()
            .map_or("recovered", |r| r.reason.as_str())
            .to_owned();
        let now = self.clock.now_ms();
        let attempt = fenced.attempts;
        let facts = self.call_facts(inv, self.link_of(&fenced));
        let (machine, step) = Calling::resume(facts, fenced, &because, stored, now);
        let (owner, waited, spent) = match step {
            // Nothing to ask: the lapsed attempt is counted at its estimate if it ends unknown.
            CallStep::Done(waited) => {
                let owner = machine.into_owner();
                let spent = self.estimated(msg, &owner);
                (owner, waited, spent)
            }
            step => self.call(msg, machine, step, inv, watch).await,
        };
        let model = spent.model.clone();
        let processed = self.end_attempt(owner, waited, spent, msg, inv).await;
        super::run::count_usage(&processed, attempt, &model, watch);
        processed
    }

    /// Whether the provider of the job's last attempt can be asked about it (a line of a batch
    /// always can).
    pub(super) fn can_ask_about(&self, job: &JobRecord) -> bool {
        job.last_provider_ref().is_some_and(|r| {
            self.link_of(job).provider.can_retrieve() || crate::provider::batch::is_batch_ref(r)
        })
    }
}
