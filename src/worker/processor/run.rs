//! Running a claimed attempt: the call within its budget, a background call followed by
//! polling (its reference recorded before the first poll), and what the provider's word means
//! for the attempt.

use std::time::Duration;

use tracing::Instrument;

use tokio_util::sync::CancellationToken;

use super::{
    AttemptWatch, Invocation, MAX_DENIED_RETRIEVALS, MIN_CALL_BUDGET_MS, Processed, Processor,
    RECORD_TRIES,
};
use crate::clock::Clock;
use crate::job::{JobMessage, JobRecord, Millis};
use crate::ledger::{AttemptEnd, JobLedger, RecordRefRequest, Write};
use crate::provider::{Provider, ProviderError, ProviderRequest, Retrieval, Submission};
use crate::worker::ending::{THROTTLE_PAUSE_MS, Waited, lease_holds, not_sent_end};

impl<L: JobLedger, P: Provider, C: Clock> Processor<L, P, C> {
    pub(super) async fn run_attempt(
        &self,
        msg: &JobMessage,
        claimed: JobRecord,
        inv: &Invocation,
        watch: &dyn AttemptWatch,
    ) -> Processed {
        let epoch = claimed.owner_epoch;
        tracing::Span::current().record("epoch", epoch);
        let started = self.clock.now_ms();
        let lost = watch.running(
            &msg.job_id,
            epoch,
            claimed.owner_until.unwrap_or(started),
            claimed.deadline_at,
        );
        let input = msg.input();
        let request = self.request(msg, &claimed, &input);
        // A call the provider refuses for its rate limit did not run: it is sent again under
        // the same claim after the wait the provider asked for, while that wait is short and
        // the claim's lease, the invocation and the deadline still leave room for the call.
        let (submitted, bound, budget) = loop {
            let now = self.clock.now_ms();
            let (budget, bound) = self.call_budget(&claimed, inv, now);
            let not_sent = if budget < MIN_CALL_BUDGET_MS || !self.has_time_for_call(inv, now) {
                Some("no time left to make the call")
            } else if !lease_holds(&claimed, now, self.settings.skew_ms) {
                // Our process stopped between the claim and the call for longer than the
                // lease: another delivery may have fenced us, made the attempt `unknown`, had a
                // retry authorised and sent its own call. Ours would be a second execution
                // nobody decided.
                Some("the lease lapsed before the call was sent")
            } else {
                None
            };
            if let Some(reason) = not_sent {
                // The call is not sent, so nothing ran: the attempt is given back with a write
                // on our epoch (refused if a rival raised it), and spends no budget.
                watch.call_ended();
                let end = not_sent_end(reason, &claimed, self.clock.now_ms());
                return self.close(claimed, Waited::Ended(end, None), inv).await;
            }
            let called = tokio::select! {
                // Ownership lost (renewal refused or about to lapse): stop here, the answer
                // could not be accepted anyway.
                _ = lost.cancelled() => Ok(Err(ProviderError::Uncertain {
                    evidence: "call cancelled after the lease could not be renewed; \
                               the request was sent and may have run"
                        .to_owned(),
                })),
                called = tokio::time::timeout(
                    Duration::from_millis(budget as u64),
                    self.provider.submit(&request).instrument(tracing::debug_span!(
                        "provider",
                        job_id = %msg.job_id,
                        epoch,
                        attempt = claimed.attempts
                    )),
                ) => called,
            };
            let retry_after_ms = match &called {
                Ok(Ok(_)) => {
                    self.pacer.answered();
                    break (called, bound, budget);
                }
                Ok(Err(ProviderError::Throttled { retry_after_ms, .. })) => *retry_after_ms,
                _ => break (called, bound, budget),
            };
            watch.throttled();
            let now = self.clock.now_ms();
            self.pacer.throttled(now, retry_after_ms);
            let Some(wait) = self.throttle_wait(&claimed, inv, now, retry_after_ms) else {
                break (called, bound, budget);
            };
            // Out of the calls in flight while it waits, and back only when the adaptive
            // limit the refusal lowered has room.
            let latest = self.latest_call_start(inv);
            let resend = self
                .pacer
                .resend(&self.clock, now.saturating_add(wait), latest);
            let resent = tokio::select! {
                _ = lost.cancelled() => false,
                resent = resend => resent,
            };
            if !resent {
                break (called, bound, budget);
            }
        };
        let waited = match submitted {
            Ok(Ok(Submission::Answered(answer))) => {
                Waited::from(self.end_of(Ok(answer), &claimed, self.clock.now_ms()))
            }
            Ok(Err(error)) => Waited::from(self.end_of(Err(error), &claimed, self.clock.now_ms())),
            Ok(Ok(Submission::Started(provider_ref))) => {
                self.follow_background(msg, &claimed, &request, provider_ref, inv, &lost)
                    .await
            }
            // The job's own deadline cut the call off: an answer could not be accepted anyway.
            Err(_) if bound == Bound::JobDeadline => Waited::Ended(AttemptEnd::Expired, None),
            Err(_) => {
                if bound == Bound::Invocation {
                    watch.deadline_cutoff();
                }
                let evidence = format!(
                    "cut off by the {} after {budget} ms; the request was sent and may have run",
                    bound.as_str()
                );
                Waited::Ended(
                    self.uncertain(evidence, &claimed, self.clock.now_ms()),
                    None,
                )
            }
        };
        watch.call_ended();
        let took = self.clock.now_ms() - started;
        watch.provider_latency(u64::try_from(took).unwrap_or(0));
        self.close(claimed, waited, inv).await
    }

    /// Follows a call the provider runs in the background: records its reference (one write
    /// conditional on the epoch) before waiting, then polls for the answer. A reference that
    /// cannot be recorded is cancelled upstream: no later owner could collect it.
    async fn follow_background(
        &self,
        msg: &JobMessage,
        claimed: &JobRecord,
        request: &ProviderRequest<'_>,
        provider_ref: String,
        inv: &Invocation,
        lost: &CancellationToken,
    ) -> Waited {
        let attempt = claimed.attempts;
        // A retry of an applied write applies again (same epoch, same attempt), so a lost
        // response needs no special case.
        let mut tries = 0;
        let failed_because = loop {
            tries += 1;
            let req = RecordRefRequest {
                job_id: msg.job_id.clone(),
                epoch: claimed.owner_epoch,
                attempt,
                provider_ref: provider_ref.clone(),
                now: self.clock.now_ms(),
            };
            match self.ledger.record_ref(req).await {
                Ok(Write::Applied(_)) => break None,
                Ok(Write::Refused(_)) => {
                    break Some("ownership was lost before the reference was recorded");
                }
                Err(e) => {
                    tracing::warn!(job_id = %msg.job_id, error = %e, tries, "recording the reference failed");
                    if tries >= RECORD_TRIES {
                        break Some("the reference could not be recorded");
                    }
                }
            }
        };
        if let Some(why) = failed_because {
            self.cancel(&provider_ref, inv).await;
            let evidence = format!("attempt {attempt} was submitted; {why}; cancel requested");
            let now = self.clock.now_ms();
            return Waited::Ended(self.uncertain(evidence, claimed, now), None);
        }
        let polled = self
            .poll(
                &provider_ref,
                self.clock.now_ms(),
                request,
                claimed,
                inv,
                lost,
            )
            .await;
        let evidence = |why: &str| format!("attempt {attempt} ({provider_ref}): {why}");
        self.conclude(polled, &provider_ref, claimed, inv, evidence)
            .await
    }

    /// Asks the provider about `provider_ref` until it answers, the job deadline or this
    /// invocation's end (less its margin) comes, or ownership is lost.
    pub(super) async fn poll(
        &self,
        provider_ref: &str,
        started_at: Millis,
        request: &ProviderRequest<'_>,
        owner: &JobRecord,
        inv: &Invocation,
        lost: &CancellationToken,
    ) -> Polled {
        let invocation_end = inv
            .deadline
            .map_or(Millis::MAX, |d| d - self.settings.deadline_margin_ms);
        let mut until = owner.deadline_at.min(invocation_end);
        if self.settings.heartbeat_ms <= 0 {
            // Nothing renews the lease: stop before it lapses and hand the job over.
            until = until.min(owner.owner_until.unwrap_or(Millis::MAX) - self.settings.skew_ms);
        }
        let mut denied = 0;
        loop {
            // A retrieval that stalls is bounded by the time left, like the wait between two.
            let left = (until - self.clock.now_ms()).max(1);
            let retrieved = tokio::select! {
                _ = lost.cancelled() => return Polled::Lost,
                r = tokio::time::timeout(
                    Duration::from_millis(left as u64),
                    self.provider.retrieve(provider_ref, started_at, request),
                ) => r.unwrap_or(Retrieval::Unreachable { retry_after_ms: None }),
            };
            let mut wait = self.settings.poll_ms;
            match retrieved {
                Retrieval::Completed(answer) => return Polled::Answer(Ok(answer)),
                Retrieval::Failed(error) => return Polled::Answer(Err(error)),
                Retrieval::NotFound => return Polled::NotFound,
                Retrieval::Unsupported => return Polled::Unsupported,
                Retrieval::Running => {}
                Retrieval::Unreachable { retry_after_ms } => {
                    wait = wait.max(retry_after_ms.unwrap_or(0));
                }
                Retrieval::Denied => {
                    denied += 1;
                    if denied >= MAX_DENIED_RETRIEVALS {
                        return Polled::Denied;
                    }
                }
            }
            let now = self.clock.now_ms();
            if now >= until {
                return Polled::TimeUp;
            }
            let pause = wait.min(until - now).max(1);
            tokio::select! {
                _ = lost.cancelled() => return Polled::Lost,
                _ = tokio::time::sleep(Duration::from_millis(pause as u64)) => {}
            }
        }
    }

    /// Asks the provider to cancel a background call, waiting at most until this invocation's
    /// margin: a cancel that stalls must not delay the batch response. A cancel not sent is
    /// harmless; the call's answer is never accepted.
    pub(super) async fn cancel(&self, provider_ref: &str, inv: &Invocation) {
        let left = inv.deadline.map_or(CANCEL_WAIT_MS, |d| {
            d - self.settings.deadline_margin_ms - self.clock.now_ms()
        });
        let wait = Duration::from_millis(left.clamp(1, CANCEL_WAIT_MS) as u64);
        if tokio::time::timeout(wait, self.provider.cancel(provider_ref))
            .await
            .is_err()
        {
            tracing::warn!("cancel request abandoned: no time left to wait for it");
        }
    }

    /// What a poll means for the attempt.
    pub(super) async fn conclude(
        &self,
        polled: Polled,
        provider_ref: &str,
        owner: &JobRecord,
        inv: &Invocation,
        evidence: impl Fn(&str) -> String,
    ) -> Waited {
        let now = self.clock.now_ms();
        match polled {
            Polled::Answer(result) => Waited::from(self.end_of(result, owner, now)),
            Polled::NotFound => {
                let why = "the provider does not know the call";
                Waited::Asked(self.uncertain(evidence(why), owner, now))
            }
            Polled::Unsupported => {
                let why = "the call may have run and the provider cannot be asked";
                Waited::Asked(self.uncertain(evidence(why), owner, now))
            }
            Polled::Denied => {
                let why = "the provider refused to say what became of the call (401/403)";
                Waited::Asked(self.uncertain(evidence(why), owner, now))
            }
            // The heartbeat could not keep the lease: whoever takes the job over finds the
            // reference and asks for the same call.
            Polled::Lost => Waited::Lost,
            Polled::TimeUp if now >= owner.deadline_at => {
                tracing::info!(job_id = %owner.job_id, "deadline passed while the call ran; cancelling it");
                self.cancel(provider_ref, inv).await;
                Waited::Ended(AttemptEnd::Expired, None)
            }
            Polled::TimeUp => {
                tracing::info!(job_id = %owner.job_id, "call still running upstream; handing it over to the next delivery");
                Waited::Running
            }
        }
    }

    /// The provider request of the owner's current attempt.
    pub(super) fn request<'a>(
        &self,
        msg: &'a JobMessage,
        owner: &JobRecord,
        input: &'a serde_json::Map<String, serde_json::Value>,
    ) -> ProviderRequest<'a> {
        let attempt = owner.attempts;
        ProviderRequest {
            job_id: &msg.job_id,
            attempt,
            epoch: owner.owner_epoch,
            contract: &msg.contract,
            input,
            input_json: &msg.input_canonical,
            // Stable for the re-sends of this claim; a claim of the same number after a
            // give-back is another request.
            idempotency_key: format!("{}/{attempt}@{}", msg.job_id, owner.owner_epoch),
        }
    }

    /// The wait before a throttled call is sent again under the same claim: the provider's
    /// `Retry-After` (or the environment's pause, if longer), if it is within the pacing
    /// horizon and the claim's lease, the invocation and the deadline leave room for the call
    /// after it. `None`: the attempt is given back instead, and the record waits in the queue.
    fn throttle_wait(
        &self,
        claimed: &JobRecord,
        inv: &Invocation,
        now: Millis,
        retry_after_ms: Option<Millis>,
    ) -> Option<Millis> {
        let wait = retry_after_ms
            .unwrap_or(THROTTLE_PAUSE_MS)
            .max(self.pacer.paused_until().saturating_sub(now))
            .max(1);
        let at = now.saturating_add(wait);
        let fits = wait <= self.pacer.settings().horizon_ms
            && lease_holds(claimed, at + MIN_CALL_BUDGET_MS, self.settings.skew_ms)
            && self.has_time_for_call(inv, at)
            && at + MIN_CALL_BUDGET_MS < claimed.deadline_at;
        fits.then_some(wait)
    }

    /// How long the provider call may take, and what bounds it: the configured timeout, the job
    /// deadline, the invocation deadline less its margin (so the final write, the visibility
    /// changes and the response still fit) and, when no heartbeat renews it, the lease less the
    /// skew margin.
    fn call_budget(&self, claimed: &JobRecord, inv: &Invocation, now: Millis) -> (Millis, Bound) {
        let s = &self.settings;
        let mut limit = (s.provider_timeout_ms, Bound::ProviderTimeout);
        let mut cap = |ms: Millis, bound: Bound| {
            if ms < limit.0 {
                limit = (ms, bound);
            }
        };
        cap(claimed.deadline_at - now, Bound::JobDeadline);
        if let Some(deadline) = inv.deadline {
            cap(deadline - s.deadline_margin_ms - now, Bound::Invocation);
        }
        if s.heartbeat_ms <= 0
            && let Some(until) = claimed.owner_until
        {
            cap(until - s.skew_ms - now, Bound::Lease);
        }
        limit
    }
}

/// The longest wait for a cancel request, however much time the invocation has.
const CANCEL_WAIT_MS: Millis = 5_000;

/// What polling a background call found.
pub(super) enum Polled {
    /// The provider's answer or definite failure.
    Answer(Result<crate::provider::Answer, ProviderError>),
    /// The provider does not know the reference.
    NotFound,
    /// The provider cannot be asked.
    Unsupported,
    /// The provider refused to answer, again and again.
    Denied,
    /// Still running when time ran out.
    TimeUp,
    /// Ownership lost while polling.
    Lost,
}

/// What bounds a provider call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Bound {
    ProviderTimeout,
    JobDeadline,
    Invocation,
    Lease,
}

impl Bound {
    fn as_str(self) -> &'static str {
        match self {
            Bound::ProviderTimeout => "provider timeout",
            Bound::JobDeadline => "job deadline",
            Bound::Invocation => "Lambda deadline",
            Bound::Lease => "lease",
        }
    }
}
