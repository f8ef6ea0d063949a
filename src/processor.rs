//! One job delivery: claim or classify, call the provider, end the attempt, all through traits.
//!
//! The processor never writes unconditionally and never calls the provider without a claim made
//! in the same delivery. A refused write is answered by re-deciding from the item the refusal
//! returned.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::clock::Clock;
use crate::config::{ReplayPolicy, Settings};
use crate::heartbeat::Flights;
use crate::job::decision::{Expect, Next, SettleReason, next_step};
use crate::job::{
    Failure, InvalidMessage, JobMessage, JobRecord, JobState, Millis, NewJob, RecordOutcome,
    Trigger,
};
use crate::ledger::{
    AttemptEnd, ClaimRequest, FinishRequest, JobLedger, LedgerError, RecordRefRequest,
    RecoverRequest, RenewRequest, SettleFrom, SettleRequest, Write,
};
use crate::provider::{Provider, ProviderError, ProviderRequest, Retrieval, Submission};

/// Writes one delivery may make before it gives up on a contended job and backs off.
const MAX_ROUNDS: usize = 4;
/// Tries at recording a background call's reference before it is cancelled.
const RECORD_TRIES: usize = 3;
/// A call is not started with less time than this left before its bound.
const MIN_CALL_BUDGET_MS: Millis = 100;

/// The invocation a record is processed in.
#[derive(Debug, Clone)]
pub struct Invocation {
    /// Lambda request id (or the local driver's invocation id).
    pub id: String,
    /// When the invocation must have returned, if known.
    pub deadline: Option<Millis>,
}

/// What processing one record produced.
#[derive(Debug, Clone, PartialEq)]
pub struct Processed {
    /// The record's outcome.
    pub outcome: RecordOutcome,
    /// The last ledger item this delivery saw, for later records of the same job.
    pub view: Option<JobRecord>,
}

/// Runs deliveries against a ledger and a provider.
#[derive(Debug)]
pub struct Processor<L, P, C> {
    ledger: L,
    provider: P,
    clock: C,
    settings: Settings,
}

enum Action {
    Claim(Expect),
    SettleAbsent,
    Settle(JobState, u64, SettleReason),
    Recover(u64, JobState),
}

/// Where a record sits in its invocation: the heartbeat's view of the batch and its index.
#[derive(Debug, Clone, Copy)]
pub struct Slot<'a> {
    /// The invocation's flights.
    pub flights: &'a Flights,
    /// The record's index in the batch.
    pub index: usize,
}

impl<L: JobLedger, P: Provider, C: Clock> Processor<L, P, C> {
    /// A processor over these parts.
    pub fn new(ledger: L, provider: P, clock: C, settings: Settings) -> Self {
        Processor {
            ledger,
            provider,
            clock,
            settings,
        }
    }

    /// The ledger.
    pub fn ledger(&self) -> &L {
        &self.ledger
    }

    /// The provider.
    pub fn provider(&self) -> &P {
        &self.provider
    }

    /// The settings.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The clock.
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// Processes one delivery of `msg`. `owner_id` must be unique to this delivery.
    pub async fn process(
        &self,
        msg: &JobMessage,
        owner_id: &str,
        inv: &Invocation,
        slot: Slot<'_>,
    ) -> Processed {
        self.process_from(msg, None, owner_id, inv, slot).await
    }

    /// Processes one delivery of a trigger. A trigger that carries only a job id costs one
    /// consistent read, then goes on from the item it found; one for a job the ledger does not
    /// hold is poison.
    pub async fn process_trigger(
        &self,
        trigger: &Trigger,
        owner_id: &str,
        inv: &Invocation,
        slot: Slot<'_>,
    ) -> Processed {
        let job_id = match trigger {
            Trigger::Job(msg) => return self.process(msg, owner_id, inv, slot).await,
            Trigger::Ref(job_id) => job_id,
        };
        match self.ledger.get(job_id).await {
            Ok(Some(item)) => {
                let msg = JobMessage::from_record(&item);
                self.process_from(&msg, Some(item), owner_id, inv, slot)
                    .await
            }
            Ok(None) => failed(Failure::Poison(InvalidMessage::UnknownJob), None),
            Err(e) => ledger_failure(job_id, &e, None),
        }
    }

    async fn process_from(
        &self,
        msg: &JobMessage,
        mut start: Option<JobRecord>,
        owner_id: &str,
        inv: &Invocation,
        slot: Slot<'_>,
    ) -> Processed {
        let now = self.clock.now_ms();
        if let Some(left) = inv.deadline.map(|d| d - now) {
            if left <= self.settings.deadline_margin_ms {
                // Too close to the invocation's end to start anything: leave the job untouched.
                return failed(backoff("invocation deadline"), None);
            }
        }
        let job = self.new_job(msg, now);
        let mut action = if job.deadline_at <= now {
            Action::SettleAbsent
        } else {
            Action::Claim(Expect::FRESH)
        };
        let mut view = None;
        for _ in 0..MAX_ROUNDS {
            let now = self.clock.now_ms();
            let seen = match start.take() {
                // The caller already read the item: decide from it, no write yet.
                Some(seen) => seen,
                None => {
                    let written = match action {
                        Action::Claim(expect) => {
                            let req = ClaimRequest {
                                job: job.clone(),
                                expect,
                                owner_id: owner_id.to_owned(),
                                now,
                                lease_until: now + self.settings.lease_ms,
                                provider_ref: self
                                    .provider
                                    .reference(&job.job_id, expect.attempts + 1),
                            };
                            match self.ledger.claim(req).await {
                                // A retried claim whose first try was applied comes back refused with
                                // our own claim in it.
                                Ok(Write::Refused(Some(seen)))
                                    if seen.state == JobState::Running
                                        && seen.owner_epoch == expect.epoch + 1
                                        && seen.owner_id.as_deref() == Some(owner_id) =>
                                {
                                    Ok(Write::Applied(seen))
                                }
                                other => other,
                            }
                        }
                        Action::SettleAbsent => {
                            let req = SettleRequest {
                                job_id: job.job_id.clone(),
                                from: SettleFrom::Absent(job.clone()),
                                reason: SettleReason::DeadlinePassed,
                                now,
                            };
                            self.ledger.settle(req).await
                        }
                        Action::Settle(state, epoch, reason) => {
                            let req = SettleRequest {
                                job_id: job.job_id.clone(),
                                from: SettleFrom::Seen { state, epoch },
                                reason,
                                now,
                            };
                            self.ledger.settle(req).await
                        }
                        Action::Recover(seen_epoch, seen_state) => {
                            let reason = if seen_state == JobState::Unknown {
                                format!(
                                    "asking the provider about the unknown attempt of epoch {seen_epoch}"
                                )
                            } else {
                                format!("lease of epoch {seen_epoch} lapsed")
                            };
                            let req = RecoverRequest {
                                job_id: job.job_id.clone(),
                                seen_epoch,
                                owner_id: owner_id.to_owned(),
                                now,
                                lapsed_before: now - self.settings.skew_ms,
                                lease_until: now + self.settings.lease_ms,
                                reason,
                            };
                            match self.ledger.recover(req).await {
                                Ok(Write::Applied(fenced)) => {
                                    slot.flights.stats.recovery();
                                    return self
                                        .after_recovery(msg, fenced, seen_epoch, inv, slot)
                                        .await;
                                }
                                other => other,
                            }
                        }
                    };
                    match written {
                        Err(e) => return ledger_failure(&job.job_id, &e, view),
                        Ok(Write::Applied(record)) if record.state == JobState::Running => {
                            return self.run_attempt(msg, record, inv, slot).await;
                        }
                        Ok(Write::Applied(record)) => {
                            return Processed {
                                outcome: RecordOutcome::Done(record.state),
                                view: Some(record),
                            };
                        }
                        // No item where one was expected (removed by TTL, say): start again from absent.
                        Ok(Write::Refused(None)) => {
                            action = if job.deadline_at <= now {
                                Action::SettleAbsent
                            } else {
                                Action::Claim(Expect::FRESH)
                            };
                            continue;
                        }
                        Ok(Write::Refused(Some(seen))) => seen,
                    }
                }
            };
            match next_step(&seen, &msg.digest, now, self.settings.skew_ms) {
                Next::Claim(expect) => action = Action::Claim(expect),
                Next::Settle(reason) => {
                    action = Action::Settle(seen.state, seen.owner_epoch, reason)
                }
                // An expired lease authorises investigation only: fence, then look at the
                // evidence; never a new call.
                Next::AwaitRecovery => action = Action::Recover(seen.owner_epoch, seen.state),
                // An unknown attempt with a reference: ask the provider again, under a new epoch.
                Next::AwaitDecision if self.can_ask_about(&seen) => {
                    action = Action::Recover(seen.owner_epoch, seen.state)
                }
                next => {
                    return Processed {
                        outcome: outcome_of(next, &msg.digest),
                        view: Some(seen),
                    };
                }
            }
            view = Some(seen);
        }
        failed(backoff("contention"), view)
    }

    /// The outcome of a later record of the same job in the same batch, decided from what the
    /// first record left in the ledger, with no ledger or provider call.
    pub fn follow(&self, msg: &JobMessage, view: &JobRecord) -> RecordOutcome {
        let now = self.clock.now_ms();
        match next_step(view, &msg.digest, now, self.settings.skew_ms) {
            // One provider call per job and batch: a duplicate never claims.
            Next::Claim(_) | Next::Settle(_) => {
                RecordOutcome::Failed(backoff("duplicate in batch"))
            }
            next => outcome_of(next, &msg.digest),
        }
    }

    /// After a recovery claim fenced a lapsed owner, look at the evidence of the attempt it left.
    /// With a provider reference and a provider that can be asked, the provider's word decides
    /// (completed: accepted under the new epoch; definitely failed: retry or fail; still running:
    /// poll while this invocation allows, the lease renewed by the heartbeat, then hand the job
    /// to the next delivery). Otherwise the attempt may have run and the job becomes `unknown`
    /// (or, under the replay policy, `retry_authorized` with the decision recorded). Never a new
    /// call.
    async fn after_recovery(
        &self,
        msg: &JobMessage,
        fenced: JobRecord,
        lapsed_epoch: u64,
        inv: &Invocation,
        slot: Slot<'_>,
    ) -> Processed {
        let attempt = fenced.attempts;
        tracing::warn!(
            job_id = %msg.job_id,
            lapsed_epoch,
            epoch = fenced.owner_epoch,
            "recovered a job whose lease lapsed"
        );
        let recovered_because = fenced
            .recoveries
            .last()
            .map_or("recovered", |r| r.reason.as_str())
            .to_owned();
        let evidence = |why: &str| format!("attempt {attempt}, {recovered_because}: {why}");
        let reference = fenced
            .attempt_log
            .last()
            .and_then(|a| a.provider_ref.clone().map(|r| (r, a.started_at)));
        let now = self.clock.now_ms();
        let waited = match reference {
            None => {
                let why = "the call may have run and no reference was recorded";
                Waited::Ended(self.uncertain(evidence(why), &fenced, now), None)
            }
            Some((provider_ref, started_at)) => {
                let input = msg.input();
                let request = self.request(msg, &fenced, &input);
                let lost = slot.flights.running(
                    slot.index,
                    &msg.job_id,
                    fenced.owner_epoch,
                    fenced.owner_until.unwrap_or(now),
                    fenced.deadline_at,
                );
                let polled = self
                    .poll(&provider_ref, started_at, &request, &fenced, inv, &lost)
                    .await;
                slot.flights.call_ended(slot.index);
                self.conclude(polled, &provider_ref, &fenced, evidence)
                    .await
            }
        };
        let (end, retry_after_ms) = match waited {
            Waited::Ended(end, retry_after_ms) => (end, retry_after_ms),
            Waited::Handover => return self.hand_over(&msg.job_id, fenced).await,
            Waited::Lost => return failed(backoff("ownership lost"), Some(fenced)),
        };
        let req = FinishRequest {
            job_id: msg.job_id.clone(),
            epoch: fenced.owner_epoch,
            attempt,
            now: self.clock.now_ms(),
            end,
        };
        match self.ledger.finish(req).await {
            Ok(Write::Applied(record)) => settled(record, retry_after_ms),
            Ok(Write::Refused(seen)) => failed(backoff("refused"), seen),
            Err(e) => ledger_failure(&msg.job_id, &e, Some(fenced)),
        }
    }

    async fn run_attempt(
        &self,
        msg: &JobMessage,
        claimed: JobRecord,
        inv: &Invocation,
        slot: Slot<'_>,
    ) -> Processed {
        let epoch = claimed.owner_epoch;
        let attempt = claimed.attempts;
        let started = self.clock.now_ms();
        let (budget, bound) = self.call_budget(&claimed, inv, started);
        let lost = slot.flights.running(
            slot.index,
            &msg.job_id,
            epoch,
            claimed.owner_until.unwrap_or(started),
            claimed.deadline_at,
        );
        let input = msg.input();
        let request = self.request(msg, &claimed, &input);
        let submitted = if budget < MIN_CALL_BUDGET_MS {
            // No time left to make the call: it is not sent, which is a definite failure of
            // this attempt, so another one may be authorised.
            Ok(Err(ProviderError::Transient {
                retry_after_ms: None,
                reason: "no time left to make the call".to_owned(),
            }))
        } else {
            tokio::select! {
                // Ownership lost (renewal refused or about to lapse): stop here, the answer
                // could not be accepted anyway.
                _ = lost.cancelled() => Ok(Err(ProviderError::Uncertain {
                    evidence: "call cancelled after the lease could not be renewed; \
                               the request was sent and may have run"
                        .to_owned(),
                })),
                called = tokio::time::timeout(
                    Duration::from_millis(budget as u64),
                    self.provider.submit(&request),
                ) => called,
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
            Err(_) => {
                if bound == Bound::Invocation {
                    slot.flights.stats.deadline_cutoff();
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
        slot.flights.call_ended(slot.index);
        let took = self.clock.now_ms() - started;
        slot.flights
            .stats
            .provider_latency(u64::try_from(took).unwrap_or(0));
        let (end, retry_after_ms) = match waited {
            Waited::Ended(end, retry_after_ms) => (end, retry_after_ms),
            Waited::Handover => return self.hand_over(&msg.job_id, claimed).await,
            Waited::Lost => return failed(backoff("ownership lost"), Some(claimed)),
        };
        let now = self.clock.now_ms();
        let accepting = matches!(end, AttemptEnd::Succeeded { .. });
        let target = end.target();
        let req = FinishRequest {
            job_id: msg.job_id.clone(),
            epoch,
            attempt,
            now,
            end,
        };
        let seen = match self.ledger.finish(req).await {
            Ok(Write::Applied(record)) => return settled(record, retry_after_ms),
            // Our own write, applied on a first try whose response was lost.
            Ok(Write::Refused(Some(seen))) if seen.owner_epoch == epoch && seen.state == target => {
                return settled(seen, retry_after_ms);
            }
            Ok(Write::Refused(seen)) => seen,
            Err(e) => return ledger_failure(&msg.job_id, &e, Some(claimed)),
        };
        // Refused: another owner took over, or the deadline passed. The answer is dropped here
        // and never published.
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
                Ok(Write::Applied(record)) => settled(record, None),
                Ok(Write::Refused(seen)) => failed(backoff("refused"), seen),
                Err(e) => ledger_failure(&msg.job_id, &e, Some(seen)),
            };
        }
        let outcome = match next_step(&seen, &msg.digest, now, self.settings.skew_ms) {
            Next::Claim(_) | Next::Settle(_) => RecordOutcome::Failed(backoff("refused")),
            next => outcome_of(next, &msg.digest),
        };
        Processed {
            outcome,
            view: Some(seen),
        }
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
            self.provider.cancel(&provider_ref).await;
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
        self.conclude(polled, &provider_ref, claimed, evidence)
            .await
    }

    /// Asks the provider about `provider_ref` until it answers, the job deadline or this
    /// invocation's end (less its margin) comes, or ownership is lost.
    async fn poll(
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
        loop {
            let retrieved = tokio::select! {
                _ = lost.cancelled() => return Polled::Lost,
                r = self.provider.retrieve(provider_ref, started_at, request) => r,
            };
            match retrieved {
                Retrieval::Completed(answer) => return Polled::Answer(Ok(answer)),
                Retrieval::Failed(error) => return Polled::Answer(Err(error)),
                Retrieval::NotFound => return Polled::NotFound,
                Retrieval::Unsupported => return Polled::Unsupported,
                Retrieval::Running => {}
            }
            let now = self.clock.now_ms();
            if now >= until {
                return Polled::TimeUp;
            }
            let pause = self.settings.poll_ms.min(until - now).max(1);
            tokio::select! {
                _ = lost.cancelled() => return Polled::Lost,
                _ = tokio::time::sleep(Duration::from_millis(pause as u64)) => {}
            }
        }
    }

    /// What a poll means for the attempt.
    async fn conclude(
        &self,
        polled: Polled,
        provider_ref: &str,
        owner: &JobRecord,
        evidence: impl Fn(&str) -> String,
    ) -> Waited {
        let now = self.clock.now_ms();
        match polled {
            Polled::Answer(result) => Waited::from(self.end_of(result, owner, now)),
            Polled::NotFound => {
                let why = "the provider does not know the call";
                Waited::Ended(self.uncertain(evidence(why), owner, now), None)
            }
            Polled::Unsupported => {
                let why = "the call may have run and the provider cannot be asked";
                Waited::Ended(self.uncertain(evidence(why), owner, now), None)
            }
            // The heartbeat could not keep the lease: whoever takes the job over finds the
            // reference and asks for the same call.
            Polled::Lost => Waited::Lost,
            Polled::TimeUp if now >= owner.deadline_at => {
                tracing::info!(job_id = %owner.job_id, "deadline passed while the call ran; cancelling it");
                self.provider.cancel(provider_ref).await;
                Waited::Ended(AttemptEnd::Expired, None)
            }
            Polled::TimeUp => Waited::Handover,
        }
    }

    /// Ends our lease now (the call still runs upstream under its recorded reference), so the
    /// next delivery takes the job over and resumes polling without waiting for a lapse.
    async fn hand_over(&self, job_id: &str, owner: JobRecord) -> Processed {
        let now = self.clock.now_ms();
        let req = RenewRequest {
            job_id: job_id.to_owned(),
            epoch: owner.owner_epoch,
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

    /// The provider request of the owner's current attempt.
    fn request<'a>(
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
            idempotency_key: format!("{}/{attempt}", msg.job_id),
        }
    }

    /// Whether the provider can be asked about the job's last attempt.
    fn can_ask_about(&self, job: &JobRecord) -> bool {
        self.provider.can_retrieve()
            && job
                .attempt_log
                .last()
                .is_some_and(|a| a.provider_ref.is_some())
    }

    /// How an attempt ends, from what the provider said (by the call or by a retrieval), and
    /// the wait the provider asked for, if any.
    fn end_of(
        &self,
        result: Result<crate::provider::Answer, ProviderError>,
        job: &JobRecord,
        now: Millis,
    ) -> (AttemptEnd, Option<Millis>) {
        match result {
            Ok(answer) => (
                AttemptEnd::Succeeded {
                    result: answer.body,
                },
                None,
            ),
            Err(ProviderError::Transient {
                retry_after_ms,
                reason,
            }) => {
                let end = if now >= job.deadline_at {
                    AttemptEnd::Expired
                } else if job.attempts >= job.max_attempts {
                    AttemptEnd::FailedTerminal {
                        kind: "budget",
                        error: format!("attempt budget spent; last error: {reason}"),
                    }
                } else {
                    AttemptEnd::RetryAuthorized { error: reason }
                };
                (end, retry_after_ms)
            }
            Err(ProviderError::Permanent { reason }) => (
                AttemptEnd::FailedTerminal {
                    kind: "permanent",
                    error: reason,
                },
                None,
            ),
            Err(ProviderError::Uncertain { evidence }) => {
                (self.uncertain(evidence, job, now), None)
            }
        }
    }

    /// How an attempt with an unknown outcome ends: `unknown`, waiting for a decision, unless the
    /// replay policy accepts a possible duplicate call and the job has budget and time left, in
    /// which case that decision is recorded and another attempt authorised.
    fn uncertain(&self, evidence: String, job: &JobRecord, now: Millis) -> AttemptEnd {
        let replay = self.settings.replay == ReplayPolicy::Replay
            && job.attempts < job.max_attempts
            && now < job.deadline_at;
        if replay {
            AttemptEnd::Replay {
                evidence,
                by: "replay-policy".to_owned(),
            }
        } else {
            AttemptEnd::Unknown { evidence }
        }
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
        if s.heartbeat_ms <= 0 {
            if let Some(until) = claimed.owner_until {
                cap(until - s.skew_ms - now, Bound::Lease);
            }
        }
        limit
    }

    fn new_job(&self, msg: &JobMessage, now: Millis) -> NewJob {
        new_job(msg, now, &self.settings)
    }
}

/// The job a message creates at `now`: the message's deadline and budget, or the defaults,
/// and a TTL of the deadline plus the retention.
pub fn new_job(msg: &JobMessage, now: Millis, settings: &Settings) -> NewJob {
    let deadline_at = msg
        .deadline_at
        .unwrap_or(now + settings.default_deadline_ms);
    NewJob {
        job_id: msg.job_id.clone(),
        input_digest: msg.digest.clone(),
        contract: msg.contract.clone(),
        input: msg.input_canonical.clone(),
        metadata: msg.metadata.clone(),
        deadline_at,
        max_attempts: msg.max_attempts.unwrap_or(settings.default_max_attempts),
        expires_at: deadline_at.max(now) / 1000 + settings.retention_days * 86_400,
    }
}

/// How waiting for a provider ended.
enum Waited {
    /// The attempt ends so, after the provider's requested wait, if any.
    Ended(AttemptEnd, Option<Millis>),
    /// Still running upstream at the end of this invocation: hand the job to the next delivery.
    Handover,
    /// Ownership was lost while waiting.
    Lost,
}

impl From<(AttemptEnd, Option<Millis>)> for Waited {
    fn from((end, retry_after_ms): (AttemptEnd, Option<Millis>)) -> Self {
        Waited::Ended(end, retry_after_ms)
    }
}

/// What polling a background call found.
enum Polled {
    /// The provider's answer or definite failure.
    Answer(Result<crate::provider::Answer, ProviderError>),
    /// The provider does not know the reference.
    NotFound,
    /// The provider cannot be asked.
    Unsupported,
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

/// Maps a decision that needs no write to the record's outcome.
fn outcome_of(next: Next, message_digest: &str) -> RecordOutcome {
    match next {
        Next::Finished(state) => RecordOutcome::Done(state),
        Next::Conflict { ledger_digest } => RecordOutcome::Failed(Failure::Conflict {
            ledger_digest,
            message_digest: message_digest.to_owned(),
        }),
        Next::Defer { remaining_ms } => RecordOutcome::Failed(Failure::Deferred { remaining_ms }),
        Next::AwaitDecision => RecordOutcome::Failed(Failure::AwaitingDecision),
        Next::AwaitRecovery => RecordOutcome::Failed(Failure::AwaitingRecovery),
        Next::Claim(_) | Next::Settle(_) => RecordOutcome::Failed(backoff("retry")),
    }
}

/// The outcome after our own write ended an attempt or settled the job.
fn settled(record: JobRecord, retry_after_ms: Option<Millis>) -> Processed {
    let outcome = match record.state {
        s if s.is_terminal() => RecordOutcome::Done(s),
        JobState::Unknown => RecordOutcome::Failed(Failure::AwaitingDecision),
        _ => RecordOutcome::Failed(Failure::Backoff {
            retry_after_ms,
            cause: "retry authorized",
        }),
    };
    Processed {
        outcome,
        view: Some(record),
    }
}

fn ledger_failure(job_id: &str, e: &LedgerError, view: Option<JobRecord>) -> Processed {
    tracing::warn!(job_id, error = %e, "ledger call failed");
    failed(backoff("ledger"), view)
}

fn backoff(cause: &'static str) -> Failure {
    Failure::Backoff {
        retry_after_ms: None,
        cause,
    }
}

fn failed(failure: Failure, view: Option<JobRecord>) -> Processed {
    Processed {
        outcome: RecordOutcome::Failed(failure),
        view,
    }
}
