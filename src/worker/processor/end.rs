//! Ending an attempt: the owner's writes the [`Ending`] machine asks for, carried out, with the
//! answer placed where it belongs first and a refused answer's stored object removed after.

use std::time::Duration;

use super::run::Spent;
use super::{Invocation, Link, Processor};
use crate::clock::Clock;
use crate::job::{JobMessage, Millis};
use crate::ledger::{JobLedger, KeptInput, LedgerError};
use crate::protocol::delivery::{Command, Delivery, Observation};
use crate::protocol::ending::{EndFacts, EndStep, EndWrite, Ending};
use crate::provider::Provider;

/// Tries at ending an attempt whose write fails, within the invocation and the job's deadline.
const END_TRIES: u32 = 5;
/// Pause before the second try; doubled for each one after.
const END_RETRY_PAUSE_MS: Millis = 100;

impl<L: JobLedger, P: Provider, C: Clock> Processor<L, P, C> {
    /// Carries out the steps that end the delivery `d`'s attempt, from `step`, until it leaves
    /// them: the answer placed, then the writes, each conditional on the owner's epoch (a
    /// refused end drops the answer unpublished). The end records what the call used
    /// (`spent`); a job left live keeps its input, for a trigger by id. Returns the delivery's
    /// next command.
    pub(super) async fn end(
        &self,
        d: &mut Delivery,
        mut step: EndStep,
        spent: &Spent,
        msg: &JobMessage,
        inv: &Invocation,
    ) -> Command {
        if d.ending().is_some_and(Ending::late) {
            tracing::warn!(job_id = %msg.job_id, "answer came within the skew margin of the deadline; not accepted");
        }
        // The input this end keeps, once found (a retried write keeps the same).
        let mut kept = None;
        loop {
            let Some(machine) = d.ending() else {
                return d.observe(Observation::Answered(None), self.clock.now_ms());
            };
            let (said, at) = match step {
                EndStep::Place => {
                    let body = machine.answer().unwrap_or_default();
                    let placed = self.place_result(machine.owner(), body, inv).await;
                    (Observation::Placed(placed), self.clock.now_ms())
                }
                EndStep::Write { pause_ms } => {
                    if pause_ms > 0 {
                        tokio::time::sleep(Duration::from_millis(pause_ms as u64)).await;
                    }
                    self.end_write(machine, spent, msg, &mut kept).await
                }
                // The delivery never asks for the end's close: it takes it over.
                EndStep::Done(_) => (Observation::Answered(None), self.clock.now_ms()),
            };
            match d.observe(said, at) {
                Command::End(next) => step = next,
                next => return next,
            }
        }
    }

    /// The write `machine` builds now, with the usage `spent` records and the input a live
    /// job keeps (`kept`, found once), and what it came to, as of when it left (a write that
    /// failed, as of its failure).
    async fn end_write(
        &self,
        machine: &Ending,
        spent: &Spent,
        msg: &JobMessage,
        kept: &mut Option<Option<KeptInput>>,
    ) -> (Observation, Millis) {
        let now = self.clock.now_ms();
        let answer = match machine.write(now) {
            EndWrite::End(mut req) => {
                req.usage = spent.recorded(&req.end, &self.settings.prices);
                if !req.end.target().is_terminal() && !machine.owner().keeps_input() {
                    if kept.is_none() {
                        *kept = Some(self.kept_input(msg).await);
                    }
                    req.input = kept.clone().flatten();
                }
                self.ledger.end_known(machine.owner(), req).await
            }
            EndWrite::Renew(req) => self.ledger.renew(req).await,
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
