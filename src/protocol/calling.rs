//! The call of one attempt, as a machine with no I/O: whether the call may leave, how long it
//! may take, the re-send of a call the provider refused for its rate limit, the reference of a
//! call the provider runs in the background (recorded before the first poll), the polling, and
//! what the provider's word comes to for the attempt ([`Waited`], which the [`Ending`] records).
//! The processor carries its steps out; the protocol's model checker (`make model-check`) drives
//! the same machine.
//!
//! [`Ending`]: super::ending::Ending

use super::ReplayPolicy;
use super::ending::{
    THROTTLE_PAUSE_MS, Waited, attempt_end, lease_holds, not_sent_end, uncertain_end,
};
use crate::job::contract::Finish;
use crate::job::{BlobRef, JobItem, Millis, ResultBody};
use crate::ledger::{AttemptEnd, RecordRefRequest, Write};
use crate::protocol::owner::Owner;
use crate::provider::batch::is_batch_ref;
use crate::provider::{Answer, ProviderError, Retrieval};

/// The least time a call is started with, before its bound.
pub(crate) const MIN_CALL_BUDGET_MS: Millis = 100;
/// Tries at recording a background call's reference before it is cancelled.
pub(crate) const RECORD_TRIES: u32 = 3;
/// Retrievals answered 401/403 before a background attempt is recorded uncertain.
pub(crate) const MAX_DENIED_RETRIEVALS: u32 = 3;

/// What the machine knows of the invocation and the settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CallFacts {
    /// The clock-skew margin.
    pub skew: Millis,
    /// The longest a call may take.
    pub provider_timeout_ms: Millis,
    /// A call is not started with less time than this left before its bound
    /// ([`MIN_CALL_BUDGET_MS`] in the processor).
    pub min_call_ms: Millis,
    /// The end of the invocation less its margin (`Millis::MAX` without one).
    pub invocation_end: Millis,
    /// The latest moment a call may start in this invocation.
    pub latest_call_start: Millis,
    /// A heartbeat renews the lease while the call runs.
    pub renewed: bool,
    /// The pause between two retrievals.
    pub poll_ms: Millis,
    /// The longest wait after a 429 before the call is sent again under the same claim.
    pub horizon_ms: Millis,
    /// The replay policy.
    pub replay: ReplayPolicy,
}

/// What the provider said to the call, or what stopped it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Said {
    /// Its answer.
    Answered(Answer),
    /// It runs in the background under this reference.
    Started(String),
    /// It was never sent (why): a deferrable job's line that no batch holds.
    NotSent(String),
    /// A failure: definite, a refusal for the rate limit, or uncertain.
    Failed(ProviderError),
    /// No word within the call's budget.
    TimedOut,
    /// Stopped because ownership was lost (a renewal refused, or the lease about to lapse).
    Lost,
    /// Stopped because an operator cancelled the job (a renewal's refusal showed it): the
    /// call is withdrawn.
    Withdrawn,
}

/// What the owner does next with its call.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum CallStep {
    /// Send the request, waiting at most `budget_ms`, then tell [`Calling::submitted`].
    Submit {
        /// The call's budget.
        budget_ms: Millis,
    },
    /// The provider refused the call for its rate limit: tell the pacer, then
    /// [`Calling::paced`] with the pause the pacer now keeps.
    Throttled {
        /// The wait the provider asked for.
        retry_after_ms: Option<Millis>,
    },
    /// Wait until `at` for the pacer to let the refused call go again, then tell
    /// [`Calling::resent`] whether it may.
    Resend {
        /// The earliest the call goes again.
        at: Millis,
    },
    /// Record the background call's reference ([`Calling::record`]), then tell
    /// [`Calling::recorded`].
    Record,
    /// Ask the provider about the call ([`Calling::reference`]), waiting at most `wait_ms`,
    /// then tell [`Calling::retrieved`] (a retrieval that stalls is `Unreachable`).
    Retrieve {
        /// The longest wait for the answer.
        wait_ms: Millis,
    },
    /// Pause before asking again, then tell [`Calling::paused`].
    Pause {
        /// The pause.
        ms: Millis,
    },
    /// Ask the provider to cancel the call upstream (its answer would never be accepted), then
    /// tell [`Calling::cancelled_upstream`].
    CancelUpstream,
    /// The call came to this ([`Calling::lost`] at any step that waits: ownership lost).
    Done(Waited),
}

/// What bounds a provider call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Bound {
    /// The configured timeout.
    ProviderTimeout,
    /// The job's deadline.
    JobDeadline,
    /// The invocation's deadline less its margin.
    Invocation,
    /// The lease less the skew margin, when no heartbeat renews it.
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

/// What a step that waits on the caller carries to the answer it gets.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Pending {
    /// Nothing: the other steps decide from the answer alone.
    Nothing,
    /// The 429, for [`Calling::paced`].
    Throttled(ProviderError),
    /// The 429, for [`Calling::resent`].
    Resend(ProviderError),
    /// Why the call is cancelled upstream, for [`Calling::cancelled_upstream`].
    CancelUpstream(WhyUpstream),
}

/// Why a call is being cancelled upstream: what the attempt comes to once it is.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum WhyUpstream {
    /// The reference could not be recorded (why).
    Unrecorded(&'static str),
    /// The job's deadline passed while the call ran.
    PastDeadline,
    /// An operator cancelled the job.
    Requested,
}

/// The call of one attempt, made by its owner.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Calling {
    facts: CallFacts,
    /// The item as the owner's claim or recovery left it.
    owner: JobItem,
    /// The background call's reference and when it started, once known.
    reference: Option<(String, Millis)>,
    /// What the evidence of an uncertain end starts with.
    evidence: String,
    /// The last call's budget and what bounded it.
    budget: (Millis, Bound),
    /// Tries at recording the reference.
    record_tries: u32,
    /// Retrievals refused (401/403).
    denied: u32,
    /// Polling stops then.
    until: Millis,
    /// The invocation's deadline cut the call off.
    cut_off: bool,
    pending: Pending,
}

impl Calling {
    /// The owner of a claimed attempt, about to send its call.
    pub fn start(facts: CallFacts, owner: JobItem, now: Millis) -> (Calling, CallStep) {
        let mut m = Calling::new(facts, owner, String::new());
        let step = m.submit(now);
        (m, step)
    }

    /// The owner of a recovery claim, about to look at the evidence the lapsed attempt left
    /// (`because`: why it was recovered; `stored`: the answer it stored and never accepted, if
    /// any). A stored answer is the outcome; otherwise the provider is asked about the call.
    /// Never a new call: without a reference, the attempt may have run. A job with a cancel
    /// request is not resumed: its background call is cancelled and the attempt ends
    /// `cancelled` (see [`Calling::withdrawn`]).
    pub fn resume(
        facts: CallFacts,
        owner: JobItem,
        because: &str,
        stored: Option<BlobRef>,
        now: Millis,
    ) -> (Calling, CallStep) {
        if owner.cancel_requested.is_some() {
            let reference = owner
                .attempt_log
                .last()
                .and_then(|a| a.provider_ref.clone().map(|r| (r, a.started_at)));
            let mut m = Calling::new(facts, owner, String::new());
            m.reference = reference;
            let step = m.withdrawn();
            return (m, step);
        }
        if let Some(blob) = stored {
            let mut m = Calling::new(facts, owner, String::new());
            // Its contract accepted it before it was stored; why the model stopped was not.
            let end = AttemptEnd::Succeeded {
                result: ResultBody::Stored(blob),
                finish: Finish::Unknown,
            };
            let step = m.done(Waited::Ended(end, None));
            return (m, step);
        }
        let evidence = format!("attempt {}, {because}", owner.attempts);
        let reference = owner
            .attempt_log
            .last()
            .and_then(|a| a.provider_ref.clone().map(|r| (r, a.started_at)));
        let mut m = Calling::new(facts, owner, evidence);
        let Some(reference) = reference else {
            let why = "the call may have run and no reference was recorded";
            let end = m.uncertain(why, now);
            let step = m.done(Waited::Ended(end, None));
            return (m, step);
        };
        m.reference = Some(reference);
        let step = m.poll(now);
        (m, step)
    }

    fn new(facts: CallFacts, owner: JobItem, evidence: String) -> Calling {
        Calling {
            facts,
            owner,
            reference: None,
            evidence,
            budget: (0, Bound::ProviderTimeout),
            record_tries: 0,
            denied: 0,
            until: Millis::MAX,
            cut_off: false,
            pending: Pending::Nothing,
        }
    }

    /// The item as the owner's claim or recovery left it.
    pub fn owner(&self) -> &JobItem {
        &self.owner
    }

    /// The owner's item, once the call came to its end.
    pub fn into_owner(self) -> JobItem {
        self.owner
    }

    /// The background call's reference and when it started, once known.
    pub fn reference(&self) -> Option<(&str, Millis)> {
        self.reference.as_ref().map(|(r, at)| (r.as_str(), *at))
    }

    /// What the machine knows of the invocation and the settings.
    pub fn facts(&self) -> CallFacts {
        self.facts
    }

    /// What bounds the call last sent.
    pub fn bound(&self) -> Bound {
        self.budget.1
    }

    /// The invocation's deadline cut the call off.
    pub fn cut_off(&self) -> bool {
        self.cut_off
    }

    /// The call is a line of a provider batch.
    pub(crate) fn batched(&self) -> bool {
        self.reference
            .as_ref()
            .is_some_and(|(r, _)| is_batch_ref(r))
    }

    /// What the call was told, at `now`.
    pub fn submitted(&mut self, said: Said, now: Millis) -> CallStep {
        match said {
            Said::Answered(answer) => self.heard(Ok(answer), now),
            Said::Failed(ProviderError::Throttled {
                retry_after_ms,
                reason,
            }) => {
                let error = ProviderError::Throttled {
                    retry_after_ms,
                    reason,
                };
                // The flex path refused for its capacity: the attempt is given back at once,
                // never sent again on that path, and the next claim takes another.
                if crate::job::path::of(&self.owner) == Some(crate::job::usage::Rate::Flex) {
                    return self.heard(Err(error), now);
                }
                self.pending = Pending::Throttled(error);
                CallStep::Throttled { retry_after_ms }
            }
            Said::Failed(error) => self.heard(Err(error), now),
            Said::Started(reference) => {
                self.evidence = format!("attempt {} ({reference})", self.owner.attempts);
                self.reference = Some((reference, now));
                CallStep::Record
            }
            // Nothing ran: the attempt is given back, as for a call the time did not let go.
            Said::NotSent(why) => {
                let end = not_sent_end(&why, &self.owner, now);
                self.done(Waited::Ended(end, None))
            }
            // The job's own deadline cut the call off: an answer could not be accepted anyway.
            Said::TimedOut if self.budget.1 == Bound::JobDeadline => {
                self.done(Waited::Ended(AttemptEnd::Expired, None))
            }
            Said::TimedOut => {
                let (budget, bound) = self.budget;
                self.cut_off = bound == Bound::Invocation;
                let evidence = format!(
                    "cut off by the {} after {budget} ms; the request was sent and may have run",
                    bound.as_str()
                );
                let end = uncertain_end(evidence, &self.owner, now, self.facts.replay);
                self.done(Waited::Ended(end, None))
            }
            Said::Withdrawn => self.withdrawn(),
            Said::Lost => {
                let error = ProviderError::Uncertain {
                    evidence: "call cancelled after the lease could not be renewed; \
                               the request was sent and may have run"
                        .to_owned(),
                };
                self.heard(Err(error), now)
            }
        }
    }

    /// After a 429, the pacer pauses every call until `paused_until`. The call is sent again
    /// under the same claim after the wait the provider asked for (or the pause, if longer),
    /// if that wait is within the pacing horizon and the claim's lease, the invocation and the
    /// deadline leave room for the call after it; otherwise the attempt is given back.
    pub fn paced(&mut self, paused_until: Millis, now: Millis) -> CallStep {
        let Pending::Throttled(error) = std::mem::replace(&mut self.pending, Pending::Nothing)
        else {
            return self.done(Waited::Lost);
        };
        let ProviderError::Throttled { retry_after_ms, .. } = &error else {
            return self.heard(Err(error), now);
        };
        let wait = retry_after_ms
            .unwrap_or(THROTTLE_PAUSE_MS)
            .max(paused_until.saturating_sub(now))
            .max(1);
        let at = now.saturating_add(wait);
        let fits = wait <= self.facts.horizon_ms
            && lease_holds(&self.owner, at + self.facts.min_call_ms, self.facts.skew)
            && at <= self.facts.latest_call_start
            && at + self.facts.min_call_ms < self.owner.deadline_at;
        if !fits {
            return self.heard(Err(error), now);
        }
        self.pending = Pending::Resend(error);
        CallStep::Resend { at }
    }

    /// Whether the pacer let the refused call go again (`false` also when ownership was lost
    /// meanwhile: the attempt is then given back, as nothing was sent).
    pub fn resent(&mut self, resent: bool, now: Millis) -> CallStep {
        let Pending::Resend(error) = std::mem::replace(&mut self.pending, Pending::Nothing) else {
            return self.done(Waited::Lost);
        };
        if resent {
            self.submit(now)
        } else {
            self.heard(Err(error), now)
        }
    }

    /// The write that records the background call's reference, at `now`. A retry of an
    /// applied write applies again (same epoch, same attempt), so a lost answer needs nothing.
    pub fn record(&self, now: Millis) -> RecordRefRequest {
        let reference = self.reference.as_ref().map(|(r, _)| r.clone());
        Owner::of(&self.owner).record_ref(reference.unwrap_or_default(), now)
    }

    /// What the write of the reference answered (`None`: it failed). A reference that cannot be
    /// recorded is cancelled upstream: no later owner could collect its answer.
    pub fn recorded(&mut self, answer: Option<Write>, now: Millis) -> CallStep {
        self.record_tries += 1;
        let why = match answer {
            // The batch's first lines come back in minutes at best: handed over at once.
            Some(Write::Applied(_)) if self.batched() => return self.done(Waited::Batched),
            Some(Write::Applied(_)) => return self.poll(now),
            // The claim recorded the line's pending reference: whoever owns the job finds its
            // batch by listing. A batch holds other jobs' lines, so it is never cancelled.
            Some(Write::Refused(_)) if self.batched() => return self.done(Waited::Lost),
            None if self.batched() && self.record_tries >= RECORD_TRIES => {
                return self.done(Waited::Batched);
            }
            Some(Write::Refused(_)) => "ownership was lost before the reference was recorded",
            None if self.record_tries < RECORD_TRIES => return CallStep::Record,
            None => "the reference could not be recorded",
        };
        self.pending = Pending::CancelUpstream(WhyUpstream::Unrecorded(why));
        CallStep::CancelUpstream
    }

    /// What a retrieval of the background call found.
    pub fn retrieved(&mut self, found: Retrieval, now: Millis) -> CallStep {
        let mut wait = self.facts.poll_ms;
        let why = match found {
            // A batch takes hours: the next look is a later delivery's.
            Retrieval::Running | Retrieval::Unreachable { .. } if self.batched() => {
                return self.done(Waited::Batched);
            }
            Retrieval::Completed(answer) => return self.heard(Ok(answer), now),
            Retrieval::Failed(error) => return self.heard(Err(error), now),
            Retrieval::NotFound => "the provider does not know the call",
            Retrieval::Unsupported => "the call may have run and the provider cannot be asked",
            Retrieval::Denied if self.denied + 1 >= MAX_DENIED_RETRIEVALS => {
                "the provider refused to say what became of the call (401/403)"
            }
            Retrieval::Denied => {
                self.denied += 1;
                return self.pause(wait, now);
            }
            Retrieval::Running => return self.pause(wait, now),
            Retrieval::Unreachable { retry_after_ms } => {
                wait = wait.max(retry_after_ms.unwrap_or(0));
                return self.pause(wait, now);
            }
        };
        let end = self.uncertain(why, now);
        self.done(Waited::Asked(end))
    }

    /// The pause between two retrievals is over.
    pub fn paused(&mut self, now: Millis) -> CallStep {
        self.retrieve(now)
    }

    /// The upstream cancel went (or was abandoned: a cancel not sent is harmless, the call's
    /// answer is never accepted).
    pub fn cancelled_upstream(&mut self, now: Millis) -> CallStep {
        let Pending::CancelUpstream(why) = std::mem::replace(&mut self.pending, Pending::Nothing)
        else {
            return self.done(Waited::Lost);
        };
        let end = match why {
            WhyUpstream::PastDeadline => AttemptEnd::Expired,
            WhyUpstream::Requested => AttemptEnd::Cancelled,
            WhyUpstream::Unrecorded(why) => {
                let evidence = format!(
                    "attempt {} was submitted; {why}; cancel requested",
                    self.owner.attempts
                );
                uncertain_end(evidence, &self.owner, now, self.facts.replay)
            }
        };
        self.done(Waited::Ended(end, None))
    }

    /// Ownership was lost while the machine waited (for a retrieval or a pause): whoever takes
    /// the job over finds the reference and asks for the same call.
    pub fn lost(&mut self) -> CallStep {
        self.done(Waited::Lost)
    }

    /// An operator cancelled the job: no call starts any more, a background call is cancelled
    /// upstream (a batch line is not: its batch holds other jobs' lines), and the attempt ends
    /// `cancelled`.
    pub fn withdrawn(&mut self) -> CallStep {
        self.pending = Pending::Nothing;
        if self.reference.is_some() && !self.batched() {
            self.pending = Pending::CancelUpstream(WhyUpstream::Requested);
            return CallStep::CancelUpstream;
        }
        self.done(Waited::Ended(AttemptEnd::Cancelled, None))
    }

    /// The call leaves if its budget, the invocation and the lease leave room; otherwise it is
    /// not sent, nothing ran, and the attempt is given back.
    fn submit(&mut self, now: Millis) -> CallStep {
        self.budget = self.budget(now);
        let not_sent =
            if self.budget.0 < self.facts.min_call_ms || now > self.facts.latest_call_start {
                Some("no time left to make the call")
            } else if !lease_holds(&self.owner, now, self.facts.skew) {
                // Our process stopped between the claim and the call for longer than the lease:
                // another delivery may have fenced us, made the attempt `unknown`, had a retry
                // authorised and sent its own call. Ours would be a second execution nobody decided.
                Some("the lease lapsed before the call was sent")
            } else {
                None
            };
        if let Some(reason) = not_sent {
            let end = not_sent_end(reason, &self.owner, now);
            return self.done(Waited::Ended(end, None));
        }
        CallStep::Submit {
            budget_ms: self.budget.0,
        }
    }

    /// How long the call may take, and what bounds it: the configured timeout, the job
    /// deadline, the invocation deadline less its margin (so the final write, the visibility
    /// changes and the response still fit) and, when no heartbeat renews it, the lease less the
    /// skew margin.
    fn budget(&self, now: Millis) -> (Millis, Bound) {
        let mut limit = (self.facts.provider_timeout_ms, Bound::ProviderTimeout);
        let mut cap = |ms: Millis, bound: Bound| {
            if ms < limit.0 {
                limit = (ms, bound);
            }
        };
        cap(
            self.owner.deadline_at.saturating_sub(now),
            Bound::JobDeadline,
        );
        cap(
            self.facts.invocation_end.saturating_sub(now),
            Bound::Invocation,
        );
        if !self.facts.renewed
            && let Some(until) = self.owner.owner_until
        {
            cap(until - self.facts.skew - now, Bound::Lease);
        }
        limit
    }

    /// Polling starts: until the job's deadline or the invocation's end, and, with nothing to
    /// renew the lease, until just before it lapses (the job is then handed over).
    fn poll(&mut self, now: Millis) -> CallStep {
        let mut until = self.owner.deadline_at.min(self.facts.invocation_end);
        if !self.facts.renewed {
            until = until.min(self.owner.owner_until.unwrap_or(Millis::MAX) - self.facts.skew);
        }
        self.until = until;
        self.retrieve(now)
    }

    fn retrieve(&mut self, now: Millis) -> CallStep {
        // A retrieval that stalls is bounded by the time left, like the wait between two.
        CallStep::Retrieve {
            wait_ms: (self.until - now).max(1),
        }
    }

    /// Still running, or the provider could not say yet: ask again after `wait`, unless time
    /// is up: past the deadline the call is cancelled and the job expires; otherwise it is
    /// handed to the next delivery.
    fn pause(&mut self, wait: Millis, now: Millis) -> CallStep {
        if now >= self.until {
            if now >= self.owner.deadline_at {
                self.pending = Pending::CancelUpstream(WhyUpstream::PastDeadline);
                return CallStep::CancelUpstream;
            }
            return self.done(Waited::Running);
        }
        CallStep::Pause {
            ms: wait.min(self.until - now).max(1),
        }
    }

    /// What the provider's word (by the call or a retrieval) comes to.
    fn heard(&mut self, result: Result<Answer, ProviderError>, now: Millis) -> CallStep {
        let waited = Waited::from(attempt_end(result, &self.owner, now, self.facts.replay));
        self.done(waited)
    }

    fn uncertain(&self, why: &str, now: Millis) -> AttemptEnd {
        let evidence = format!("{}: {why}", self.evidence);
        uncertain_end(evidence, &self.owner, now, self.facts.replay)
    }

    fn done(&mut self, waited: Waited) -> CallStep {
        CallStep::Done(waited)
    }
}

#[cfg(test)]
mod tests;
