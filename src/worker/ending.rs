//! How an attempt ends: pure functions of the provider's word, the job and the clock, and the
//! machine ([`Ending`]) that records the end with the owner's writes, with no I/O. The processor
//! carries its steps out; the protocol's model checker (`make model-check`) drives the same
//! functions and the same machine through every interleaving it explores.

use super::settings::ReplayPolicy;
use crate::job::decision::{DeadlinePhase, Next, deadline_phase, next_step};
use crate::job::{
    AttemptOutcome, AttemptRecord, BlobRef, Failure, GIVEN_BACK_KEPT, JobRecord, JobState, Millis,
    RecordOutcome, ResultBody,
};
use crate::ledger::transitions::shows_end;
use crate::ledger::{AttemptEnd, FinishRequest, RenewRequest, Write};
use crate::provider::{Answer, ProviderError};

/// The wait after a 429 that named none.
pub const THROTTLE_PAUSE_MS: Millis = 1_000;

/// How the current attempt of `job` ends, from what the provider said (by the call or by a
/// retrieval), and the wait the provider asked for, if any. Where an answer is kept is decided
/// later, when the attempt's end is written.
pub fn attempt_end(
    result: Result<Answer, ProviderError>,
    job: &JobRecord,
    now: Millis,
    replay: ReplayPolicy,
) -> (AttemptEnd, Option<Millis>) {
    match result {
        Ok(answer) => (
            AttemptEnd::Succeeded {
                result: ResultBody::Inline(answer.body),
            },
            None,
        ),
        Err(ProviderError::Throttled {
            retry_after_ms,
            reason,
        }) => {
            // Refused for the rate limit before any work: the attempt is given back, whatever
            // the budget.
            let end = if now >= job.deadline_at {
                AttemptEnd::Expired
            } else {
                given_back(AttemptOutcome::Throttled, reason, job, now)
            };
            (end, retry_after_ms)
        }
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
            (uncertain_end(evidence, job, now, replay), None)
        }
    }
}

/// How an attempt whose call was never sent ends (no time was left for it, or the lease lapsed
/// before it left): nothing ran, so the attempt is given back, as after a throttle; past the
/// deadline the job expires.
pub fn not_sent_end(reason: &str, job: &JobRecord, now: Millis) -> AttemptEnd {
    if now >= job.deadline_at {
        return AttemptEnd::Expired;
    }
    given_back(AttemptOutcome::NotSent, reason.to_owned(), job, now)
}

/// The end that gives `job`'s current attempt back, marked `why`: its log entry joins the
/// given-back attempts the job keeps (the last [`GIVEN_BACK_KEPT`]).
fn given_back(why: AttemptOutcome, error: String, job: &JobRecord, now: Millis) -> AttemptEnd {
    let mut kept = job.given_back.clone();
    if let Some(attempt) = job.attempt_log.last() {
        kept.push(AttemptRecord {
            outcome: why,
            finished_at: Some(now),
            ..attempt.clone()
        });
    }
    let excess = kept.len().saturating_sub(GIVEN_BACK_KEPT);
    kept.drain(..excess);
    AttemptEnd::GivenBack {
        why,
        error,
        given_back: kept,
    }
}

/// How an attempt with an unknown outcome ends: `unknown`, waiting for a decision, unless the
/// replay policy accepts a possible duplicate call and the job has budget and time left, in
/// which case that decision is recorded and another attempt authorised. An attempt already
/// recorded uncertain (a job that was `unknown` before this delivery asked about it again) is
/// never replayed by the policy: it applies when the uncertainty arises, so turning it on does
/// not replay old `unknown` jobs.
pub fn uncertain_end(
    evidence: String,
    job: &JobRecord,
    now: Millis,
    replay: ReplayPolicy,
) -> AttemptEnd {
    let already_unknown = job
        .attempt_log
        .last()
        .is_some_and(|a| a.outcome == AttemptOutcome::Uncertain);
    let replays = replay == ReplayPolicy::Replay
        && !already_unknown
        && job.attempts < job.max_attempts
        && now < job.deadline_at;
    if replays {
        AttemptEnd::Replay {
            evidence,
            by: "replay-policy".to_owned(),
        }
    } else {
        AttemptEnd::Unknown { evidence }
    }
}

/// The end an owner may write at `now`: an answer that comes within the clock-skew margin of the
/// deadline is not accepted (a clock behind by the margin could accept it after the deadline),
/// and the attempt expires instead. Any other end is written as it is.
pub fn acceptable_end(
    end: AttemptEnd,
    deadline_at: Millis,
    now: Millis,
    skew_ms: Millis,
) -> AttemptEnd {
    let open = deadline_phase(deadline_at, now, skew_ms) == DeadlinePhase::Open;
    if matches!(end, AttemptEnd::Succeeded { .. }) && !open {
        AttemptEnd::Expired
    } else {
        end
    }
}

/// Whether the claimant's lease still holds at `now` by more than the clock-skew margin: the
/// last check before a call leaves, which nothing in the ledger can fence once it has.
pub fn lease_holds(claimed: &JobRecord, now: Millis, skew_ms: Millis) -> bool {
    claimed
        .owner_until
        .is_some_and(|until| now.saturating_add(skew_ms) < until)
}

/// An attempt whose answer cannot be kept: the same call would give it again, so it is
/// terminal, with the reason recorded.
pub fn too_large(why: &str) -> AttemptEnd {
    AttemptEnd::FailedTerminal {
        kind: "too_large",
        error: why.to_owned(),
    }
}

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
}

/// What the owner does next to end its attempt.
#[derive(Debug, Clone, PartialEq)]
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
    Finish(FinishRequest),
    /// Renew the lease before another try, or end it now to hand the job over.
    Renew(RenewRequest),
}

/// How the delivery ended.
#[derive(Debug, Clone, PartialEq)]
pub struct Closed {
    /// The record's outcome.
    pub outcome: RecordOutcome,
    /// The last item seen.
    pub view: Option<JobRecord>,
    /// A stored answer nobody accepts: the job is terminal without it, so its object goes.
    /// While the job lives it stays, as a recovery that fenced this owner may be accepting it.
    pub discard: Option<BlobRef>,
    /// The end was refused: the answer, if any, is not published.
    pub refused: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Phase {
    Place,
    Finish,
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
    owner: JobRecord,
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
    /// The item a refusal showed, once one did.
    seen: Option<JobRecord>,
    phase: Phase,
}

impl Ending {
    /// The owner of `owner` heard `waited`: its first step.
    pub fn start(
        facts: EndFacts,
        owner: JobRecord,
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
            seen: None,
            phase: Phase::Finish,
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
                result: ResultBody::Inline(_)
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
    pub fn owner(&self) -> &JobRecord {
        &self.owner
    }

    /// The answer to place, at [`EndStep::Place`].
    pub fn answer(&self) -> Option<&str> {
        match &self.end {
            Some(AttemptEnd::Succeeded {
                result: ResultBody::Inline(body),
            }) if self.phase == Phase::Place => Some(body),
            _ => None,
        }
    }

    /// An answer that came within the skew margin of the deadline: not accepted.
    pub fn late(&self) -> bool {
        self.late
    }

    /// Whether the write ends the attempt with an answer.
    pub fn accepting(&self) -> bool {
        self.phase == Phase::Finish && matches!(self.end, Some(AttemptEnd::Succeeded { .. }))
    }

    /// The answer was put so.
    pub fn placed(&mut self, placed: Placed, now: Millis) -> EndStep {
        let end = match placed {
            Placed::Inline => return self.finish(),
            Placed::Stored(blob) => AttemptEnd::Succeeded {
                result: ResultBody::Stored(blob),
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
        self.finish()
    }

    /// The write the current step makes, at `now`.
    pub fn write(&self, now: Millis) -> EndWrite {
        let (epoch, attempt) = (self.owner.owner_epoch, self.owner.attempts);
        let finish = |end: AttemptEnd| {
            EndWrite::Finish(FinishRequest {
                job_id: self.owner.job_id.clone(),
                epoch,
                attempt,
                now,
                end,
            })
        };
        let renew = |lease_until: Millis| {
            EndWrite::Renew(RenewRequest {
                job_id: self.owner.job_id.clone(),
                epoch,
                // Renewing or ending our own lease needs no particular lease to be current.
                expected_until: None,
                now,
                lease_until,
            })
        };
        match self.phase {
            Phase::Expire => finish(AttemptEnd::Expired),
            Phase::Renew => renew(now + self.facts.lease_ms),
            Phase::HandOver => renew(now),
            _ => finish(self.end.clone().unwrap_or(AttemptEnd::Expired)),
        }
    }

    /// What the write answered (`None`: it failed, applied or not).
    pub fn answered(&mut self, answer: Option<Write>, now: Millis) -> EndStep {
        let epoch = self.owner.owner_epoch;
        match (self.phase, answer) {
            (Phase::Finish, answer) => {
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
            (Phase::Renew, _) => self.finish(),
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
        self.finish()
    }

    fn finish(&mut self) -> EndStep {
        self.phase = Phase::Finish;
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
    fn ended(&mut self, record: JobRecord) -> EndStep {
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
        self.done(outcome, Some(record), false)
    }

    /// The end was refused: another owner took over, or the deadline passed. An answer refused
    /// by the deadline alone (the job still ours) expires the job; otherwise the item decides.
    fn refused(&mut self, seen: Option<JobRecord>, now: Millis) -> EndStep {
        let Some(seen) = seen else {
            return self.done(backoff("job vanished"), None, true);
        };
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
    fn discarding(&mut self, outcome: RecordOutcome, seen: JobRecord, refused: bool) -> EndStep {
        let step = self.done(outcome, None, refused);
        let EndStep::Done(mut closed) = step else {
            return step;
        };
        if let Some(AttemptEnd::Succeeded {
            result: ResultBody::Stored(blob),
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

    fn done(&mut self, outcome: RecordOutcome, view: Option<JobRecord>, refused: bool) -> EndStep {
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
mod tests {
    use super::*;
    use crate::job::NewJob;
    use crate::job::decision::Expect;
    use crate::ledger::ClaimRequest;
    use crate::ledger::transitions::{apply_claim, apply_finish, apply_renew};

    const NOW: Millis = 1_000_000;
    const DEADLINE: Millis = NOW + 600_000;

    fn facts() -> EndFacts {
        EndFacts {
            skew: 2_000,
            lease_ms: 30_000,
            invocation_end: NOW + 60_000,
            can_retrieve: true,
            replay: ReplayPolicy::Never,
            tries: 3,
            first_pause_ms: 100,
        }
    }

    /// The item as a claim at `NOW` leaves it (with a reference when `reference`).
    fn claimed(reference: bool) -> JobRecord {
        let req = ClaimRequest {
            job: NewJob::example("j", DEADLINE),
            expect: Expect::FRESH,
            owner_id: "o".into(),
            now: NOW,
            lease_until: NOW + 30_000,
            provider_ref: reference.then(|| "j/1@1".to_owned()),
            first_sight: true,
        };
        apply_claim(None, &req).expect("claimed")
    }

    /// The ledger's answer to `write` on `item`, as the transitions give it.
    fn apply(item: &JobRecord, write: EndWrite) -> Write {
        let after = match &write {
            EndWrite::Finish(req) => apply_finish(Some(item), req),
            EndWrite::Renew(req) => apply_renew(Some(item), req),
        };
        after.map_or_else(|| Write::Refused(Some(item.clone())), Write::Applied)
    }

    fn answer(body: &str) -> Waited {
        Waited::Ended(
            AttemptEnd::Succeeded {
                result: ResultBody::Inline(body.into()),
            },
            None,
        )
    }

    fn done(step: EndStep) -> Closed {
        match step {
            EndStep::Done(closed) => *closed,
            other => panic!("not done: {other:?}"),
        }
    }

    #[test]
    fn an_answer_is_placed_then_accepted_by_one_write_on_the_owners_epoch() {
        let owner = claimed(false);
        let (mut m, step) = Ending::start(facts(), owner.clone(), answer("42"), NOW);
        assert_eq!(step, EndStep::Place);
        assert_eq!(m.answer(), Some("42"));
        assert_eq!(
            m.placed(Placed::Inline, NOW),
            EndStep::Write { pause_ms: 0 }
        );
        let EndWrite::Finish(req) = m.write(NOW) else {
            panic!("a finish");
        };
        assert_eq!((req.epoch, req.attempt), (1, 1));
        let closed = done(m.answered(Some(apply(&owner, EndWrite::Finish(req))), NOW));
        assert_eq!(closed.outcome, RecordOutcome::Done(JobState::Succeeded));
        assert!(!closed.refused);
    }

    #[test]
    fn an_answer_refused_by_the_deadline_alone_expires_the_job_on_the_owners_epoch() {
        let owner = claimed(false);
        let (mut m, _) = Ending::start(facts(), owner.clone(), answer("42"), NOW);
        m.placed(Placed::Inline, NOW);
        // The write reaches the table after the deadline: refused, the job still ours.
        let late = DEADLINE + 1;
        let step = m.answered(Some(apply(&owner, m.write(late))), late);
        assert_eq!(step, EndStep::Write { pause_ms: 0 });
        let EndWrite::Finish(req) = m.write(late) else {
            panic!("a finish");
        };
        assert_eq!(req.end, AttemptEnd::Expired);
        let closed = done(m.answered(Some(apply(&owner, EndWrite::Finish(req))), late));
        assert_eq!(closed.outcome, RecordOutcome::Done(JobState::Expired));
        assert!(closed.refused);
    }

    #[test]
    fn a_failed_end_is_tried_again_after_renewing_the_lease_with_growing_pauses_then_backs_off() {
        let owner = claimed(false);
        let waited = Waited::Ended(
            AttemptEnd::RetryAuthorized {
                error: "503".into(),
            },
            None,
        );
        let (mut m, _) = Ending::start(facts(), owner.clone(), waited, NOW);
        assert_eq!(m.answered(None, NOW), EndStep::Write { pause_ms: 200 });
        assert!(matches!(m.write(NOW), EndWrite::Renew(r) if r.lease_until == NOW + 30_000));
        assert_eq!(m.answered(None, NOW), EndStep::Write { pause_ms: 0 });
        assert_eq!(m.answered(None, NOW), EndStep::Write { pause_ms: 400 });
        m.answered(None, NOW);
        // The third failed write spends the tries: the record backs off, the owner in view.
        let closed = done(m.answered(None, NOW));
        assert_eq!(closed.outcome, backoff("ledger"));
        assert_eq!(closed.view, Some(owner));
    }

    #[test]
    fn no_try_is_made_whose_pause_would_pass_the_invocations_end() {
        let short = EndFacts {
            invocation_end: NOW + 150,
            ..facts()
        };
        let waited = Waited::Ended(AttemptEnd::Expired, None);
        let (mut m, _) = Ending::start(short, claimed(false), waited, NOW);
        assert_eq!(done(m.answered(None, NOW)).outcome, backoff("ledger"));
    }

    #[test]
    fn a_refusal_showing_the_owners_own_end_counts_as_applied() {
        let owner = claimed(false);
        let (mut m, _) = Ending::start(facts(), owner.clone(), answer("42"), NOW);
        m.placed(Placed::Inline, NOW);
        let Write::Applied(after) = apply(&owner, m.write(NOW)) else {
            panic!("applied");
        };
        // The first try was applied and its answer lost; the retry is refused by it.
        let closed = done(m.answered(Some(Write::Refused(Some(after))), NOW));
        assert_eq!(closed.outcome, RecordOutcome::Done(JobState::Succeeded));
    }

    #[test]
    fn a_refused_stored_answer_is_discarded_only_once_the_job_is_terminal_without_it() {
        let owner = claimed(false);
        let blob = BlobRef {
            bucket: "b".into(),
            key: "results/j/1/x".into(),
            size: 2,
            sha256: "x".into(),
        };
        let stored = Waited::Ended(
            AttemptEnd::Succeeded {
                result: ResultBody::Stored(blob.clone()),
            },
            None,
        );
        let mut rival = owner.clone();
        rival.owner_epoch = 2;
        let (mut m, step) = Ending::start(facts(), owner.clone(), stored.clone(), NOW);
        assert_eq!(step, EndStep::Write { pause_ms: 0 });
        // A recovery fenced us and is still at work: it may be accepting this very object.
        let closed = done(m.answered(Some(Write::Refused(Some(rival.clone()))), NOW));
        assert_eq!(closed.discard, None);
        rival.state = JobState::FailedTerminal;
        let (mut m, _) = Ending::start(facts(), owner, stored, NOW);
        let closed = done(m.answered(Some(Write::Refused(Some(rival))), NOW));
        assert_eq!(closed.discard, Some(blob));
        assert!(closed.refused);
    }

    #[test]
    fn an_attempt_given_back_after_a_429_waits_for_the_providers_capacity() {
        let owner = claimed(false);
        let end = AttemptEnd::GivenBack {
            why: AttemptOutcome::Throttled,
            error: "429".into(),
            given_back: Vec::new(),
        };
        let (mut m, _) =
            Ending::start(facts(), owner.clone(), Waited::Ended(end, Some(7_000)), NOW);
        let closed = done(m.answered(Some(apply(&owner, m.write(NOW))), NOW));
        assert_eq!(
            closed.outcome,
            RecordOutcome::Failed(Failure::Paced { wait_ms: 7_000 })
        );
    }

    #[test]
    fn an_unknown_attempt_not_yet_asked_about_waits_for_its_recovery_once_asked_for_a_decision() {
        let owner = claimed(true);
        let unknown = || AttemptEnd::Unknown {
            evidence: "dropped".into(),
        };
        let (mut m, _) = Ending::start(facts(), owner.clone(), Waited::Ended(unknown(), None), NOW);
        let closed = done(m.answered(Some(apply(&owner, m.write(NOW))), NOW));
        assert_eq!(
            closed.outcome,
            RecordOutcome::Failed(Failure::AwaitingRecovery)
        );
        let (mut m, _) = Ending::start(facts(), owner.clone(), Waited::Asked(unknown()), NOW);
        let closed = done(m.answered(Some(apply(&owner, m.write(NOW))), NOW));
        assert_eq!(
            closed.outcome,
            RecordOutcome::Failed(Failure::AwaitingDecision)
        );
    }

    #[test]
    fn an_answer_the_bucket_could_not_take_is_left_with_the_provider_and_the_job_handed_over() {
        let owner = claimed(true);
        let (mut m, _) = Ending::start(facts(), owner.clone(), answer("big"), NOW);
        assert_eq!(
            m.placed(Placed::KeptByProvider, NOW),
            EndStep::Write { pause_ms: 0 }
        );
        let EndWrite::Renew(req) = m.write(NOW) else {
            panic!("a renewal");
        };
        assert_eq!(req.lease_until, NOW);
        let closed = done(m.answered(Some(apply(&owner, EndWrite::Renew(req))), NOW));
        assert_eq!(closed.outcome, backoff("results bucket"));
        // A call still running upstream is handed over to be taken at once.
        let (mut m, _) = Ending::start(facts(), owner.clone(), Waited::Running, NOW);
        let closed = done(m.answered(Some(apply(&owner, m.write(NOW))), NOW));
        assert_eq!(
            closed.outcome,
            RecordOutcome::Failed(Failure::Deferred {
                remaining_ms: 2_000
            })
        );
    }

    #[test]
    fn an_answer_within_the_skew_margin_of_the_deadline_is_not_accepted() {
        let (m, step) = Ending::start(facts(), claimed(false), answer("42"), DEADLINE - 1_000);
        assert!(m.late());
        assert_eq!(step, EndStep::Write { pause_ms: 0 });
        assert!(matches!(
            m.write(DEADLINE - 1_000),
            EndWrite::Finish(FinishRequest {
                end: AttemptEnd::Expired,
                ..
            })
        ));
    }
}
