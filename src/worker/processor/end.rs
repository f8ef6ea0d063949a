//! Ending an attempt: the owner's writes the [`Ending`] machine asks for, carried out, with the
//! answer placed where it belongs first and a refused answer's stored object removed after.

use std::time::Duration;

use super::execute::Held;
use super::{Invocation, Link, Processor};
use crate::clock::Clock;
use crate::job::{CallProgress, JobMessage, Millis};
use crate::ledger::{JobLedger, LedgerError, RenewRequest};
use crate::protocol::delivery::{Command, Delivery, Observation};
use crate::protocol::ending::{EndFacts, EndStep, EndWrite, Ending};
use crate::provider::Provider;

/// Tries at ending an attempt whose write fails, within the invocation and the job's deadline.
const END_TRIES: u32 = 5;
/// Pause before the second try; doubled for each one after.
const END_RETRY_PAUSE_MS: Millis = 100;

impl<L: JobLedger, P: Provider, C: Clock> Processor<L, P, C> {
    /// Carries out the step `step` of the end of the delivery `d`'s attempt (see
    /// [`Processor::end_step`]), with what the call used priced for it first (a recovery's
    /// question made no call: what one would have used). Returns the delivery's next command.
    pub(super) async fn end(
        &self,
        d: &mut Delivery,
        held: &mut Held<'_>,
        step: EndStep,
        msg: &JobMessage,
        inv: &Invocation,
    ) -> Command {
        if held.spent.is_none() {
            let spent = self.estimated(msg, d);
            d.set_used(spent.priced(&self.settings.prices));
            held.spent = Some(spent);
        }
        if !held.late_said && d.ending().is_some_and(Ending::late) {
            held.late_said = true;
            tracing::warn!(job_id = %msg.job_id, "answer came within the skew margin of the deadline; not accepted");
        }
        let progress = held.spent.as_ref().and_then(|s| s.said);
        let (said, at) = self.end_step(d, step, inv, progress).await;
        d.observe(said, at)
    }

    /// Carries out one step of the end of the delivery `d`'s attempt: the answer placed, or a
    /// write, each conditional on the owner's epoch (a refused end drops the answer
    /// unpublished). Returns what it came to, as of when it left (a write that failed, as of
    /// its failure).
    async fn end_step(
        &self,
        d: &Delivery,
        step: EndStep,
        inv: &Invocation,
        progress: Option<CallProgress>,
    ) -> (Observation, Millis) {
        let Some(machine) = d.ending() else {
            return (Observation::Answered(None), self.clock.now_ms());
        };
        match step {
            EndStep::Place => {
                let body = machine.answer().unwrap_or_default();
                let placed = self.place_result(machine.owner(), body, inv).await;
                (Observation::Placed(placed), self.clock.now_ms())
            }
            EndStep::Write { pause_ms } => {
                if pause_ms > 0 {
                    tokio::time::sleep(Duration::from_millis(pause_ms as u64)).await;
                }
                self.end_write(d, machine, progress).await
            }
            // The delivery never asks for the end's close: it takes it over.
            EndStep::Done(_) => (Observation::Answered(None), self.clock.now_ms()),
        }
    }

    /// The write the delivery `d` builds now for its end (`machine`), and what it came to. A
    /// hand-over carries what the call had to show for itself (`progress`).
    async fn end_write(
        &self,
        d: &Delivery,
        machine: &Ending,
        progress: Option<CallProgress>,
    ) -> (Observation, Millis) {
        let now = self.clock.now_ms();
        let answer = match d.end_write(now) {
            Some(EndWrite::End(req)) => self.ledger.end_known(machine.owner(), req).await,
            Some(EndWrite::Renew(req)) => {
                let req = RenewRequest {
                    progress: progress.or(req.progress),
                    ..req
                };
                self.ledger.renew(req).await
            }
            None => return (Observation::Answered(None), now),
        };
        let job_id = &machine.owner().job_id;
        match answer {
            Ok(write) => (Observation::Answered(Some(write)), now),
            // The table refused the answer itself (too large after all).
            Err(LedgerError::Rejected { code, .. }) if machine.accepting() => {
                tracing::warn!(%job_id, code, "the answer could not be stored");
                (Observation::Rejected, now)
            }
            Err(e) => {
                tracing::warn!(%job_id, error = %e, "a write ending the attempt failed");
                (Observation::Answered(None), self.clock.now_ms())
            }
        }
    }

    /// What the owner knows when it ends its attempt.
    pub(super) fn end_facts(&self, inv: &Invocation, link: &Link<P>) -> EndFacts {
        let s = &self.settings;
        EndFacts {
            skew: s.skew_ms,
            lease_ms: s.lease_ms,
            invocation_end: inv
                .deadline
                .map_or(Millis::MAX, |d| d - s.deadline_margin_ms),
            can_retrieve: link.provider.can_retrieve(),
            replay: s.replay,
            tries: END_TRIES,
            first_pause_ms: END_RETRY_PAUSE_MS,
            batch_poll_ms: s.batching.poll_ms,
        }
    }
}
