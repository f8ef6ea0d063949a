//! One job delivery: claim or classify, call the provider, end the attempt, all through traits.
//!
//! The processor never writes unconditionally and never calls the provider without a claim made
//! in the same delivery. A refused write is answered by re-deciding from the item the refusal
//! returned.

use std::time::Duration;

use crate::clock::Clock;
use crate::config::{ReplayPolicy, Settings};
use crate::heartbeat::Flights;
use crate::job::decision::{Expect, Next, SettleReason, next_step};
use crate::job::{Failure, JobMessage, JobRecord, JobState, Millis, NewJob, RecordOutcome};
use crate::ledger::{
    AttemptEnd, ClaimRequest, FinishRequest, JobLedger, LedgerError, RecoverRequest, SettleFrom,
    SettleRequest, Write,
};
use crate::provider::{Provider, ProviderError, ProviderRequest, Retrieval};

/// Writes one delivery may make before it gives up on a contended job and backs off.
const MAX_ROUNDS: usize = 4;
/// Pause between two retrievals of a call that is still running.
const RETRIEVAL_POLL_MS: Millis = 1_000;
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
            let written = match action {
                Action::Claim(expect) => {
                    let req = ClaimRequest {
                        job: job.clone(),
                        expect,
                        owner_id: owner_id.to_owned(),
                        now,
                        lease_until: now + self.settings.lease_ms,
                        provider_ref: self.provider.reference(&job.job_id, expect.attempts + 1),
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
                            return self.after_recovery(msg, fenced, seen_epoch, inv).await;
                        }
                        other => other,
                    }
                }
            };
            let seen = match written {
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
    /// poll while this invocation and the new lease allow, then leave the job to the next
    /// delivery). Otherwise the attempt may have run and the job becomes `unknown` (or, under
    /// the replay policy, `retry_authorized` with the decision recorded). Never a new call.
    async fn after_recovery(
        &self,
        msg: &JobMessage,
        fenced: JobRecord,
        lapsed_epoch: u64,
        inv: &Invocation,
    ) -> Processed {
        let attempt = fenced.attempts;
        tracing::warn!(
            job_id = %msg.job_id,
            lapsed_epoch,
            epoch = fenced.owner_epoch,
            "recovered a job whose lease lapsed"
        );
        let input = msg.input();
        let request = ProviderRequest {
            job_id: &msg.job_id,
            attempt,
            epoch: fenced.owner_epoch,
            contract: &msg.contract,
            input: &input,
            input_json: &msg.input_canonical,
            idempotency_key: format!("{}/{attempt}", msg.job_id),
        };
        let recovered_because = fenced
            .recoveries
            .last()
            .map_or("recovered", |r| r.reason.as_str());
        let evidence = |why: &str| format!("attempt {attempt}, {recovered_because}: {why}");
        let reference = fenced
            .attempt_log
            .last()
            .and_then(|a| a.provider_ref.clone().map(|r| (r, a.started_at)));
        let (end, retry_after_ms) = loop {
            let now = self.clock.now_ms();
            let Some((provider_ref, started_at)) = &reference else {
                let why = "the call may have run and no reference was recorded";
                break (self.uncertain(evidence(why), &fenced, now), None);
            };
            match self
                .provider
                .retrieve(provider_ref, *started_at, &request)
                .await
            {
                Retrieval::Completed(answer) => break self.end_of(Ok(answer), &fenced, now),
                Retrieval::Failed(error) => break self.end_of(Err(error), &fenced, now),
                Retrieval::NotFound => {
                    let why = "the provider does not know the call";
                    break (self.uncertain(evidence(why), &fenced, now), None);
                }
                Retrieval::Unsupported => {
                    let why = "the call may have run and the provider cannot be asked";
                    break (self.uncertain(evidence(why), &fenced, now), None);
                }
                Retrieval::Running => {
                    let lease_end = fenced.owner_until.unwrap_or(now) - self.settings.skew_ms;
                    let invocation_end = inv
                        .deadline
                        .map_or(Millis::MAX, |d| d - self.settings.deadline_margin_ms);
                    if now + RETRIEVAL_POLL_MS >= lease_end.min(invocation_end) {
                        // Still running upstream: keep the job (our lease) for the next delivery.
                        let remaining_ms =
                            fenced.owner_until.unwrap_or(now) + self.settings.skew_ms - now;
                        return failed(Failure::Deferred { remaining_ms }, Some(fenced));
                    }
                    tokio::time::sleep(Duration::from_millis(RETRIEVAL_POLL_MS as u64)).await;
                }
            }
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
        let request = ProviderRequest {
            job_id: &msg.job_id,
            attempt,
            epoch,
            contract: &msg.contract,
            input: &input,
            input_json: &msg.input_canonical,
            idempotency_key: format!("{}/{attempt}", msg.job_id),
        };
        let called = if budget < MIN_CALL_BUDGET_MS {
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
                    self.provider.call(&request),
                ) => called,
            }
        };
        slot.flights.call_ended(slot.index);
        if called.is_err() && bound == Bound::Invocation {
            slot.flights.stats.deadline_cutoff();
        }
        let now = self.clock.now_ms();
        let (end, retry_after_ms) = match called {
            Ok(result) => self.end_of(result, &claimed, now),
            Err(_) => {
                let evidence = format!(
                    "cut off by the {} after {budget} ms; the request was sent and may have run",
                    bound.as_str()
                );
                (self.uncertain(evidence, &claimed, now), None)
            }
        };
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
        let deadline_at = msg
            .deadline_at
            .unwrap_or(now + self.settings.default_deadline_ms);
        NewJob {
            job_id: msg.job_id.clone(),
            input_digest: msg.digest.clone(),
            contract: msg.contract.clone(),
            input: msg.input_canonical.clone(),
            metadata: msg.metadata.clone(),
            deadline_at,
            max_attempts: msg
                .max_attempts
                .unwrap_or(self.settings.default_max_attempts),
            expires_at: deadline_at.max(now) / 1000 + self.settings.retention_days * 86_400,
        }
    }
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
