//! Ending an attempt: what the provider's word makes of it (through [`crate::worker::ending`]), the one
//! conditional write that records it, and the hand-over of a call still running upstream.

use std::time::Duration;

use super::payload::{Placed, too_large};
use super::{Invocation, Processed, Processor, backoff, failed, ledger_failure, settled};
use crate::clock::Clock;
use crate::job::decision::{Next, next_step};
use crate::job::{
    AttemptOutcome, Failure, JobMessage, JobRecord, JobState, Millis, RecordOutcome, ResultBody,
};
use crate::ledger::transitions::shows_end;
use crate::ledger::{AttemptEnd, FinishRequest, JobLedger, LedgerError, RenewRequest, Write};
use crate::provider::{Answer, Provider, ProviderError};
use crate::worker::ending::{acceptable_end, attempt_end, uncertain_end};

impl<L: JobLedger, P: Provider, C: Clock> Processor<L, P, C> {
    /// Ends the owner's attempt with one write conditional on its epoch. A refusal that shows
    /// our own write (applied on a try whose response was lost) counts as applied; an accepted
    /// answer refused only by the deadline expires the job; any other refusal drops the answer
    /// unpublished and re-decides from the item the refusal returned.
    ///
    /// A write that fails is tried again while this invocation and the job's deadline allow,
    /// the lease renewed before each try: a paid answer is not dropped for one ledger hiccup.
    /// An answer the item cannot hold ends the attempt `failed_terminal` instead.
    pub(super) async fn finish_attempt(
        &self,
        msg: &JobMessage,
        claimed: JobRecord,
        mut end: AttemptEnd,
        retry_after_ms: Option<Millis>,
        asked: bool,
        inv: &Invocation,
    ) -> Processed {
        let epoch = claimed.owner_epoch;
        let attempt = claimed.attempts;
        let now = self.clock.now_ms();
        let answered = matches!(end, AttemptEnd::Succeeded { .. });
        end = acceptable_end(end, claimed.deadline_at, now, self.settings.skew_ms);
        if answered && end == AttemptEnd::Expired {
            tracing::warn!(job_id = %msg.job_id, "answer came within the skew margin of the deadline; not accepted");
        }
        if let AttemptEnd::Succeeded {
            result: ResultBody::Inline(body),
        } = end
        {
            end = match self.place_result(&claimed, body, inv).await {
                Placed::End(placed) => placed,
                Placed::KeptByProvider => {
                    // The next delivery recovers the job and fetches the answer: a backoff,
                    // not the moment a hand-over of a running call waits, lets the bucket mend.
                    let handed = self.hand_over(&msg.job_id, claimed).await;
                    return match handed.outcome {
                        RecordOutcome::Failed(Failure::Deferred { .. }) => {
                            failed(backoff("results bucket"), handed.view)
                        }
                        _ => handed,
                    };
                }
            };
        }
        let mut tries = 0;
        let (seen, accepting, now) = loop {
            tries += 1;
            let now = self.clock.now_ms();
            let accepting = matches!(end, AttemptEnd::Succeeded { .. });
            let target = end.target();
            let req = FinishRequest {
                job_id: msg.job_id.clone(),
                epoch,
                attempt,
                now,
                end: end.clone(),
            };
            match self.ledger.finish_known(&claimed, req).await {
                Ok(Write::Applied(record)) => {
                    return self.waiting(ended(record, &end, retry_after_ms), asked);
                }
                // Our own write, applied on a first try whose response was lost.
                Ok(Write::Refused(Some(seen))) if shows_end(&seen, epoch, target) => {
                    return self.waiting(ended(seen, &end, retry_after_ms), asked);
                }
                Ok(Write::Refused(seen)) => break (seen, accepting, now),
                // The table refused the answer itself (too large after all): record the
                // attempt's end without it.
                Err(LedgerError::Rejected { code, .. }) if accepting => {
                    tracing::warn!(job_id = %msg.job_id, code, "the answer could not be stored");
                    end = too_large("the ledger refused the item with the answer");
                }
                Err(e) => {
                    let pause = FINISH_RETRY_PAUSE_MS << tries.min(6);
                    if !self.may_retry_finish(&claimed, inv, tries, pause) {
                        return ledger_failure(&msg.job_id, &e, Some(claimed));
                    }
                    tracing::warn!(job_id = %msg.job_id, error = %e, tries, "ending the attempt failed; trying again");
                    tokio::time::sleep(Duration::from_millis(pause as u64)).await;
                    if let Some(seen) = self.keep_lease(&msg.job_id, epoch).await {
                        break (Some(seen), accepting, self.clock.now_ms());
                    }
                }
            }
        };
        // Refused: another owner took over, or the deadline passed. The answer is dropped here
        // and never published; its object, if it was stored, is removed only once the job is
        // seen terminal without it (a recovery may be accepting it).
        tracing::warn!(
            job_id = %msg.job_id,
            epoch,
            current_epoch = seen.as_ref().map(|s| s.owner_epoch),
            current_state = seen.as_ref().map(|s| s.state.as_str()),
            accepting,
            "end of attempt refused; result not published"
        );
        let Some(seen) = seen else {
            return failed(backoff("job vanished"), None);
        };
        if accepting && seen.state == JobState::Running && seen.owner_epoch == epoch {
            // Still ours, so the deadline refused it: expire the job, again conditionally.
            let req = FinishRequest {
                job_id: msg.job_id.clone(),
                epoch,
                attempt,
                now,
                end: AttemptEnd::Expired,
            };
            return match self.ledger.finish(req).await {
                Ok(Write::Applied(record)) => {
                    self.discard(&end, &record).await;
                    settled(record, None)
                }
                Ok(Write::Refused(seen)) => {
                    if let Some(seen) = &seen {
                        self.discard(&end, seen).await;
                    }
                    failed(backoff("refused"), seen)
                }
                Err(e) => ledger_failure(&msg.job_id, &e, Some(seen)),
            };
        }
        self.discard(&end, &seen).await;
        let outcome = match next_step(&seen, &msg.digest, now, self.settings.skew_ms) {
            Next::Claim(_) | Next::Settle(_) => RecordOutcome::Failed(backoff("refused")),
            next => RecordOutcome::from_next(next, &msg.digest),
        };
        Processed {
            outcome,
            view: Some(seen),
        }
    }

    /// An attempt that just became `unknown` with a reference the provider can be asked about,
    /// and that nobody asked about yet, waits a short, growing backoff: its next delivery asks.
    /// Once the provider was asked and could not say, the long wait for a decision applies.
    fn waiting(&self, processed: Processed, asked: bool) -> Processed {
        match (&processed.outcome, &processed.view) {
            (RecordOutcome::Failed(Failure::AwaitingDecision), Some(job))
                if !asked && self.can_ask_about(job) =>
            {
                Processed {
                    outcome: RecordOutcome::Failed(Failure::AwaitingRecovery),
                    view: processed.view,
                }
            }
            _ => processed,
        }
    }

    /// Whether a failed end-of-attempt write may be tried again after `pause`: a few times, and
    /// only while the job's deadline and this invocation (less its margin) leave room.
    fn may_retry_finish(
        &self,
        owner: &JobRecord,
        inv: &Invocation,
        tries: u32,
        pause: Millis,
    ) -> bool {
        let now = self.clock.now_ms();
        let invocation_end = inv
            .deadline
            .map_or(Millis::MAX, |d| d - self.settings.deadline_margin_ms);
        tries < FINISH_TRIES && now + pause < owner.deadline_at.min(invocation_end)
    }

    /// Renews our lease under our epoch before another try at ending the attempt (the heartbeat
    /// no longer renews it once the call ended). Returns the item when the job is no longer
    /// ours; a renewal that fails is no reason to stop trying.
    async fn keep_lease(&self, job_id: &str, epoch: u64) -> Option<JobRecord> {
        let now = self.clock.now_ms();
        let req = RenewRequest {
            job_id: job_id.to_owned(),
            epoch,
            expected_until: None,
            now,
            lease_until: now + self.settings.lease_ms,
        };
        match self.ledger.renew(req).await {
            Ok(Write::Refused(Some(seen)))
                if seen.owner_epoch != epoch || seen.state != JobState::Running =>
            {
                Some(seen)
            }
            _ => None,
        }
    }

    /// Ends our lease now (the call still runs upstream under its recorded reference), so the
    /// next delivery takes the job over and resumes polling without waiting for a lapse.
    pub(super) async fn hand_over(&self, job_id: &str, owner: JobRecord) -> Processed {
        let now = self.clock.now_ms();
        let req = RenewRequest {
            job_id: job_id.to_owned(),
            epoch: owner.owner_epoch,
            // Ending our own lease needs no particular lease to be current.
            expected_until: None,
            now,
            lease_until: now,
        };
        let view = match self.ledger.renew(req).await {
            Ok(Write::Applied(record)) => record,
            Ok(Write::Refused(seen)) => return failed(backoff("refused"), seen),
            Err(e) => return ledger_failure(job_id, &e, Some(owner)),
        };
        tracing::info!(
            job_id,
            epoch = view.owner_epoch,
            "call still running upstream; handed over to the next delivery"
        );
        let remaining_ms = self.settings.skew_ms;
        failed(Failure::Deferred { remaining_ms }, Some(view))
    }

    /// How an attempt ends, from what the provider said (see [`attempt_end`]).
    pub(super) fn end_of(
        &self,
        result: Result<Answer, ProviderError>,
        job: &JobRecord,
        now: Millis,
    ) -> (AttemptEnd, Option<Millis>) {
        attempt_end(result, job, now, self.settings.replay)
    }

    /// How an attempt with an unknown outcome ends (see [`uncertain_end`]).
    pub(super) fn uncertain(&self, evidence: String, job: &JobRecord, now: Millis) -> AttemptEnd {
        uncertain_end(evidence, job, now, self.settings.replay)
    }
}

/// The outcome after our own write ended the attempt so. An attempt given back after a 429
/// waits for the provider's capacity (its `Retry-After`), not for a backoff that grows with the
/// receives: its record may have been deferred many times for capacity already.
fn ended(record: JobRecord, end: &AttemptEnd, retry_after_ms: Option<Millis>) -> Processed {
    if let AttemptEnd::GivenBack {
        why: AttemptOutcome::Throttled,
        ..
    } = end
    {
        let wait_ms = retry_after_ms.unwrap_or(super::run::THROTTLE_PAUSE_MS);
        return failed(Failure::Paced { wait_ms }, Some(record));
    }
    settled(record, retry_after_ms)
}

/// Tries at ending an attempt whose write fails, within the invocation and the job's deadline.
const FINISH_TRIES: u32 = 5;
/// Pause before the second try; doubled for each one after.
const FINISH_RETRY_PAUSE_MS: Millis = 100;
