//! The machine that ends one attempt with its owner's writes: it is told what the ledger and
//! the results bucket said, and answers with the next [`EndStep`].

use super::{THROTTLE_PAUSE_MS, acceptable_end, attempt_end, too_large};
use crate::job::contract::Finish;
use crate::job::decision::{Next, next_step};
use crate::job::{
    AttemptOutcome, BlobRef, Failure, JobItem, JobState, Millis, RecordOutcome, ResultBody,
};
use crate::ledger::transitions::shows_end;
use crate::ledger::{AttemptEnd, EndRequest, RenewRequest, Write};
use crate::protocol::ReplayPolicy;
use crate::protocol::owner::Owner;
use crate::provider::ProviderError;

/// What waiting for the provider came to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Waited {
    /// The attempt ends so, after the provider's requested wait, if any.
    Ended(AttemptEnd, Option<Millis>),
    /// The attempt ends so after the provider was asked about the call and could not say:
    /// nothing is gained by asking again soon.
    Asked(AttemptEnd),
    /// Still running upstream at the end of this invocation: the job is handed to the next
    /// delivery.
    Running,
    /// A line of a provider batch that has not ended: the job is handed over, and its record
    /// looks again after the batch poll interval.
    Batched,
    /// Ownership was lost while waiting.
    Lost,
}

impl From<(AttemptEnd, Option<Millis>)> for Waited {
    fn from((end, retry_after_ms): (AttemptEnd, Option<Millis>)) -> Self {
        Waited::Ended(end, retry_after_ms)
    }
}

/// Where an answer to be accepted was put.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Placed {
    /// In the item, as it came.
    Inline,
    /// In the results bucket: the acceptance references it.
    Stored(BlobRef),
    /// Nowhere it could go: the item cannot hold it and no bucket is set (why).
    TooLarge(String),
    /// The bucket failed and the item cannot hold it, but the provider keeps it under the
    /// attempt's reference: the job is handed over and the answer fetched again, not paid again.
    KeptByProvider,
    /// The bucket failed and nothing else keeps it.
    Unstored,
}

impl Placed {
    /// Where an answer goes when the bucket would not take it: the item, if it `fits`; else the
    /// provider's keeping, if a later owner can `fetch` it again by the attempt's reference;
    /// else nowhere.
    pub fn unstorable(fits: bool, fetch: bool) -> Placed {
        if fits {
            Placed::Inline
        } else if fetch {
            Placed::KeptByProvider
        } else {
            Placed::Unstored
        }
    }
}

/// What the machine knows of the owner's situation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EndFacts {
    /// The clock-skew margin.
    pub skew: Millis,
    /// A lease renewed between two tries runs this long.
    pub lease_ms: Millis,
    /// The end of the invocation less its margin (`Millis::MAX` without one).
    pub invocation_end: Millis,
    /// The provider can be asked about a call by its reference.
    pub can_retrieve: bool,
    /// The replay policy.
    pub replay: ReplayPolicy,
    /// Writes that may be tried at ending the attempt while they fail.
    pub tries: u32,
    /// Pause before the second try; doubled for each one after.
    pub first_pause_ms: Millis,
    /// How long a record whose batch runs waits before its next look.
    pub batch_poll_ms: Millis,
}

/// What the owner does next to end its attempt.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum EndStep {
    /// Put the answer ([`Ending::answer`]) where it belongs, then tell [`Ending::placed`].
    Place,
    /// After this pause, make the write [`Ending::write`] builds and tell
    /// [`Ending::answered`] (or [`Ending::rejected`]).
    Write {
        /// The pause before the write.
        pause_ms: Millis,
    },
    /// The delivery ends so.
    Done(Box<Closed>),
}

/// A write the owner makes to end its attempt.
#[derive(Debug, Clone, PartialEq)]
pub enum EndWrite {
    /// End the attempt (or, when only the deadline refused an answer, expire the job).
    End(EndRequest),
    /// Renew the lease before another try, or end it now to hand the job over.
    Renew(RenewRequest),
}

/// How the delivery ended.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Closed {
    /// The record's outcome.
    pub outcome: RecordOutcome,
    /// The last item seen.
    pub view: Option<JobItem>,
    /// A stored answer nobody accepts: the job is terminal without it, so its object goes.
    /// While the job lives it stays, as a recovery that fenced this owner may be accepting it.
    pub discard: Option<BlobRef>,
    /// The end was refused: the answer, if any, is not published.
    pub refused: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Phase {
    Place,
    End,
    Renew,
    Expire,
    HandOver,
    Done,
}

/// The end of one attempt, written by its owner.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Ending {
    facts: EndFacts,
    /// The item as the owner's claim or recovery left it.
    owner: JobItem,
    /// How the attempt ends (`None` for a hand-over).
    end: Option<AttemptEnd>,
    retry_after_ms: Option<Millis>,
    /// The provider was asked about the call and could not say.
    asked: bool,
    /// An answer that came within the skew margin of the deadline: it expires the job instead.
    late: bool,
    /// End-of-attempt writes made.
    tries: u32,
    /// The hand-over leaves an answer with the provider: the next delivery backs off.
    kept_by_provider: bool,
    /// The hand-over leaves a line in a running batch: the next look is a poll interval away.
    batched: bool,
    /// The item a refusal showed, once one did.
    seen: Option<JobItem>,
    /// The answer stored for an acceptance a cancel request refused: it goes once the job
    /// ends cancelled.
    withdrawn: Option<BlobRef>,
    phase: Phase,
}

impl Ending {
    /// The owner of `owner` heard `waited`: its first step.
    pub fn start(
        facts: EndFacts,
        owner: JobItem,
        waited: Waited,
        now: Millis,
    ) -> (Ending, EndStep) {
        let mut m = Ending {
            facts,
            owner,
            end: None,
            retry_after_ms: None,
            asked: false,
            late: false,
            tries: 0,
            kept_by_provider: false,
            batched: false,
            seen: None,
            withdrawn: None,
            phase: Phase::End,
        };
        let end = match waited {
            Waited::Ended(end, retry_after_ms) => {
                m.retry_after_ms = retry_after_ms;
                end
            }
            Waited::Asked(end) => {
                m.asked = true;
                end
            }
            Waited::Running => {
                m.phase = Phase::HandOver;
                return (m, EndStep::Write { pause_ms: 0 });
            }
            Waited::Batched => {
                m.phase = Phase::HandOver;
                m.batched = true;
                return (m, EndStep::Write { pause_ms: 0 });
            }
            Waited::Lost => {
                let view = Some(m.owner.clone());
                let step = m.done(backoff("ownership lost"), view, false);
                return (m, step);
            }
        };
        let answered = matches!(end, AttemptEnd::Succeeded { .. });
        let end = acceptable_end(end, m.owner.deadline_at, now, facts.skew);
        m.late = answered && end == AttemptEnd::Expired;
        let inline = matches!(
            end,
            AttemptEnd::Succeeded {
                result: ResultBody::Inline(_),
                ..
            }
        );
        m.end = Some(end);
        if inline {
            m.phase = Phase::Place;
            return (m, EndStep::Place);
        }
        (m, EndStep::Write { pause_ms: 0 })
    }

    /// The item as the owner's claim or recovery left it.
    pub fn owner(&self) -> &JobItem {
        &self.owner
    }

    /// The call still runs upstream: the owner hands the job to the next delivery.
    pub fn hands_over(&self) -> bool {
        self.phase == Phase::HandOver && !self.batched
    }

    /// The answer to place, at [`EndStep::Place`].
    pub fn answer(&self) -> Option<&str> {
        match &self.end {
            Some(AttemptEnd::Succeeded {
                result: ResultBody::Inline(body),
                ..
            }) if self.phase == Phase::Place => Some(body),
            _ => None,
        }
    }

    /// The stored answer this end would accept, if any.
    pub fn stored(&self) -> Option<&BlobRef> {
        match &self.end {
            Some(AttemptEnd::Succeeded {
                result: ResultBody::Stored(blob),
                ..
            }) => Some(blob),
            _ => None,
        }
    }

    /// The attempt ends with its outcome unknown (a call cut off, or one the replay policy
    /// lets go).
    pub fn uncertain(&self) -> bool {
        self.end
            .as_ref()
            .is_some_and(|e| e.attempt_outcome() == crate::job::AttemptOutcome::Uncertain)
    }

    /// An answer that came within the skew margin of the deadline: not accepted.
    pub fn late(&self) -> bool {
        self.late
    }

    /// Whether the write it asks for ends the attempt and leaves the job live, for another
    /// attempt or a decision (a renewal or a hand-over ends no attempt).
    pub fn leaves_live(&self) -> bool {
        match self.phase {
            Phase::Expire | Phase::Renew | Phase::HandOver => false,
            _ => self.end.as_ref().is_some_and(|e| !e.target().is_terminal()),
        }
    }

    /// Whether the write ends the attempt with an answer.
    pub fn accepting(&self) -> bool {
        self.phase == Phase::End && matches!(self.end, Some(AttemptEnd::Succeeded { .. }))
    }

    /// The answer was put so.
    pub fn placed(&mut self, placed: Placed, now: Millis) -> EndStep {
        let end = match placed {
            Placed::Inline => return self.end_write(),
            Placed::Stored(blob) => AttemptEnd::Succeeded {
                result: ResultBody::Stored(blob),
                finish: match self.end {
                    Some(AttemptEnd::Succeeded { finish, .. }) => finish,
                    _ => Finish::Unknown,
                },
            },
            Placed::TooLarge(why) => too_large(&why),
            Placed::KeptByProvider => {
                self.kept_by_provider = true;
                self.phase = Phase::HandOver;
                return EndStep::Write { pause_ms: 0 };
            }
            Placed::Unstored => {
                let failure = ProviderError::Transient {
                    retry_after_ms: None,
                    reason: "the answer could not be written to the results bucket".to_owned(),
                };
                attempt_end(Err(failure), &self.owner, now, self.facts.replay).0
            }
        };
        self.end = Some(end);
        self.end_write()
    }

    /// The write the current step makes, at `now`.
    pub fn write(&self, now: Millis) -> EndWrite {
        let owner = Owner::of(&self.owner);
        match self.phase {
            Phase::Expire => EndWrite::End(owner.end(AttemptEnd::Expired, now)),
            // Renewing our own lease needs no particular lease to be current.
            Phase::Renew => EndWrite::Renew(owner.renew(None, now, now + self.facts.lease_ms)),
            Phase::HandOver => EndWrite::Renew(owner.hand_over(now)),
            _ => {
                let end = self.end.clone().unwrap_or(AttemptEnd::Expired);
                EndWrite::End(owner.end(end, now))
            }
        }
    }

    /// What the write answered (`None`: it failed, applied or not).
    pub fn answered(&mut self, answer: Option<Write>, now: Millis) -> EndStep {
        let epoch = self.owner.owner_epoch;
        match (self.phase, answer) {
            (Phase::End, answer) => {
                self.tries += 1;
                let target = self.end.as_ref().map_or(JobState::Expired, |e| e.target());
                match answer {
                    Some(Write::Applied(record)) => self.ended(record),
                    // Our own write, applied on a try whose answer was lost.
                    Some(Write::Refused(Some(seen))) if shows_end(&seen, epoch, target) => {
                        self.ended(seen)
                    }
                    Some(Write::Refused(seen)) => self.refused(seen, now),
                    None => self.retry(now),
                }
            }
            (Phase::Renew, Some(Write::Refused(Some(seen))))
                if seen.owner_epoch != epoch || seen.state != JobState::Running =>
            {
                self.refused(Some(seen), now)
            }
            // A renewal that fails is no reason to stop trying.
            (Phase::Renew, _) => self.end_write(),
            (Phase::Expire, Some(Write::Applied(record))) => {
                let outcome = RecordOutcome::after_write(record.state, None);
                self.discarding(outcome, record, true)
            }
            (Phase::Expire, Some(Write::Refused(Some(seen)))) => {
                self.discarding(backoff("refused"), seen, true)
            }
            (Phase::Expire, Some(Write::Refused(None))) => {
                self.done(backoff("refused"), None, true)
            }
            (Phase::Expire, None) => {
                let view = self.seen.take();
                self.done(backoff("ledger"), view, true)
            }
            (Phase::HandOver, Some(Write::Applied(record))) => {
                let outcome = if self.kept_by_provider {
                    // The next delivery recovers the job and fetches the answer: a backoff,
                    // not the moment a hand-over of a running call waits, lets the bucket mend.
                    backoff("results bucket")
                } else if self.batched {
                    // The next look at the batch, never past the job's deadline.
                    let left = self.owner.deadline_at - record.owner_until.unwrap_or(0);
                    RecordOutcome::Failed(Failure::Deferred {
                        remaining_ms: self.facts.batch_poll_ms.min(left).max(self.facts.skew),
                    })
                } else {
                    RecordOutcome::Failed(Failure::Deferred {
                        remaining_ms: self.facts.skew,
                    })
                };
                self.done(outcome, Some(record), false)
            }
            (Phase::HandOver, Some(Write::Refused(seen))) => {
                self.done(backoff("refused"), seen, false)
            }
            (Phase::HandOver, None) => {
                let view = Some(self.owner.clone());
                self.done(backoff("ledger"), view, false)
            }
            (Phase::Place | Phase::Done, _) => {
                let view = Some(self.owner.clone());
                self.done(backoff("ledger"), view, false)
            }
        }
    }

    /// The table refused the item the end would leave (an answer too large after all): the
    /// attempt's end is recorded without the answer.
    pub fn rejected(&mut self, now: Millis) -> EndStep {
        if !self.accepting() {
            return self.answered(None, now);
        }
        self.tries += 1;
        self.end = Some(too_large("the ledger refused the item with the answer"));
        self.end_write()
    }

    fn end_write(&mut self) -> EndStep {
        self.phase = Phase::End;
        EndStep::Write { pause_ms: 0 }
    }

    /// A failed end-of-attempt write is tried again after a growing pause, the lease renewed
    /// first (the heartbeat no longer renews it once the call ended), a few times and only
    /// while the job's deadline and the invocation leave room.
    fn retry(&mut self, now: Millis) -> EndStep {
        let pause_ms = self.facts.first_pause_ms << self.tries.min(6);
        let bound = self.owner.deadline_at.min(self.facts.invocation_end);
        if self.tries < self.facts.tries && now + pause_ms < bound {
            self.phase = Phase::Renew;
            return EndStep::Write { pause_ms };
        }
        let view = Some(self.owner.clone());
        self.done(backoff("ledger"), view, false)
    }

    /// Our own write ended the attempt and left `record`.
    fn ended(&mut self, record: JobItem) -> EndStep {
        let outcome = match &self.end {
            // An attempt given back after a 429 waits for the provider's capacity (its
            // `Retry-After`), not for a backoff that grows with the receives: its record may
            // have been deferred many times for capacity already.
            Some(AttemptEnd::GivenBack {
                why: AttemptOutcome::Throttled,
                ..
            }) => RecordOutcome::Failed(Failure::Paced {
                wait_ms: self.retry_after_ms.unwrap_or(THROTTLE_PAUSE_MS),
            }),
            // An attempt just made `unknown` with a reference the provider can be asked about,
            // that nobody asked about yet, waits a short, growing backoff: its next delivery
            // asks. Once the provider was asked and could not say, the long wait applies.
            _ if record.state == JobState::Unknown
                && !self.asked
                && self.facts.can_retrieve
                && record.last_provider_ref().is_some() =>
            {
                RecordOutcome::Failed(Failure::AwaitingRecovery)
            }
            _ => RecordOutcome::after_write(record.state, self.retry_after_ms),
        };
        let step = self.done(outcome, Some(record), false);
        match (step, self.withdrawn.take()) {
            (EndStep::Done(mut closed), Some(blob)) => {
                closed.discard = Some(blob);
                EndStep::Done(closed)
            }
            (step, _) => step,
        }
    }

    /// The end was refused: another owner took over, or the deadline passed. An answer refused
    /// by the deadline alone (the job still ours) expires the job; otherwise the item decides.
    fn refused(&mut self, seen: Option<JobItem>, now: Millis) -> EndStep {
        let Some(seen) = seen else {
            return self.done(backoff("job vanished"), None, true);
        };
        // Still ours, with an operator's cancel request: the attempt ends cancelled, whatever
        // it came to (an answer that came first included).
        let ours = seen.state == JobState::Running && seen.owner_epoch == self.owner.owner_epoch;
        if ours
            && seen.cancel_requested.is_some()
            && !self
                .end
                .as_ref()
                .is_some_and(AttemptEnd::allowed_after_cancel)
        {
            self.withdrawn = self.stored().cloned();
            self.seen = Some(seen);
            self.end = Some(AttemptEnd::Cancelled);
            return self.end_write();
        }
        let accepting = matches!(self.end, Some(AttemptEnd::Succeeded { .. }));
        if accepting
            && seen.state == JobState::Running
            && seen.owner_epoch == self.owner.owner_epoch
        {
            self.seen = Some(seen);
            self.phase = Phase::Expire;
            return EndStep::Write { pause_ms: 0 };
        }
        let outcome = match next_step(&seen, &self.owner.input_digest, now, self.facts.skew) {
            Next::Claim(_) | Next::Settle(_) => backoff("refused"),
            next => RecordOutcome::from_next(next, &self.owner.input_digest),
        };
        self.discarding(outcome, seen, true)
    }

    /// Ends with `seen` in view, discarding the stored answer if `seen` is terminal without it.
    fn discarding(&mut self, outcome: RecordOutcome, seen: JobItem, refused: bool) -> EndStep {
        let step = self.done(outcome, None, refused);
        let EndStep::Done(mut closed) = step else {
            return step;
        };
        if let Some(AttemptEnd::Succeeded {
            result: ResultBody::Stored(blob),
            ..
        }) = &self.end
        {
            let referenced = seen.result_ref.as_ref().is_some_and(|r| r.key == blob.key);
            if seen.state.is_terminal() && !referenced {
                closed.discard = Some(blob.clone());
            }
        }
        closed.view = Some(seen);
        EndStep::Done(closed)
    }

    fn done(&mut self, outcome: RecordOutcome, view: Option<JobItem>, refused: bool) -> EndStep {
        self.phase = Phase::Done;
        EndStep::Done(Box::new(Closed {
            outcome,
            view,
            discard: None,
            refused,
        }))
    }
}

fn backoff(cause: &'static str) -> RecordOutcome {
    RecordOutcome::Failed(Failure::Backoff {
        retry_after_ms: None,
        cause,
    })
}

#[cfg(test)]
mod tests;
