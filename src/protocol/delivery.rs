//! One delivery as one machine: the [`Admission`], the [`Calling`] (or a recovery's question)
//! and the [`Ending`], composed, with the decisions between them: the provider a claim goes
//! to and the reroute when an item names another, the look at a running batch before a
//! recovery, the answer a fenced owner stored, what the call's capacity and spend are charged,
//! and the fallback to the next provider after a definite refusal. It takes one
//! [`Observation`] at a time and answers with the next [`Command`]; the worker carries the
//! commands out, and the model checker drives the same machine with the world's choices.

use super::admission::{Admission, Applied, Facts, Op, Step};
use super::calling::{CallFacts, CallStep, Calling, Said};
use super::ending::{Closed, EndFacts, EndStep, Ending, Placed, Waited};
use super::routing;
use crate::job::{AttemptOutcome, BlobRef, Failure, JobRecord, JobState, Millis, RecordOutcome};
use crate::ledger::Write;
use crate::provider::Retrieval;
use crate::provider::batch::parse_ref;
use std::collections::VecDeque;

/// What a delivery knows of one provider of the deployment's list, for its job.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Lane {
    /// Its name, as attempts record it.
    pub name: String,
    /// It can run the job's model (the first provider of the list always can).
    pub serves: bool,
    /// What an admission routed to it knows.
    pub admission: Facts,
    /// What its calls know.
    pub call: CallFacts,
    /// What the ends of its attempts know.
    pub end: EndFacts,
}

/// What the capacity and spend a call took are charged once its attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Charge {
    /// What the provider said the call cost, else nothing: the call was never sent, or its
    /// attempt's end shows it ran nothing.
    Heard,
    /// What the provider said the call cost, else all the call reserved: the call went and
    /// may have run.
    HeardOrReserved,
}

/// What the delivery asks the worker to do next; each is answered by the [`Observation`]
/// its documentation names.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Command {
    /// Take capacity for the call on the provider [`Delivery::lane`] names (the tenant's and
    /// the provider's pacing, the day's spend): [`Observation::Taken`] or
    /// [`Observation::NoCapacity`].
    Take,
    /// Give back what was taken for a call that is not made here, then
    /// [`Observation::Carried`].
    GiveBack,
    /// Ask the provider whether the batch of the line the item shows ([`Delivery::view`])
    /// still runs: [`Observation::BatchRunning`].
    LookAtBatch,
    /// Make this write as [`Delivery::owner_id`]: [`Observation::Applied`],
    /// [`Observation::Refused`], [`Observation::Unanswered`] or [`Observation::WriteFailed`].
    Write(Op),
    /// After the pause, read the item: [`Observation::Read`] or [`Observation::ReadFailed`].
    ReadBack {
        /// The pause before the read.
        pause_ms: Millis,
    },
    /// The claim holds: the capacity taken goes to its call, then [`Observation::Carried`].
    Use,
    /// A recovery fenced the owner of the attempt it left: look in the results bucket for the
    /// answer that owner stored and never accepted ([`Observation::Found`]).
    LookForAnswer,
    /// A step of the call, as [`Calling`] names it (never `Done`); each is answered as the
    /// step says, through the call observations.
    Call(CallStep),
    /// A step of the attempt's end, as [`Ending`] names it (never `Done`):
    /// [`Observation::Placed`], [`Observation::Answered`] or [`Observation::Rejected`].
    End(EndStep),
    /// The attempt numbered `attempt` ended: its usage is counted and what its call took is
    /// charged so, then [`Observation::Carried`].
    Charge {
        /// The attempt.
        attempt: u32,
        /// What its call's capacity and spend are charged.
        charge: Charge,
    },
    /// The delivery ends so.
    Done(Box<Closed>),
}

/// What the world said to the last [`Command`].
#[derive(Debug, Clone, PartialEq)]
pub enum Observation {
    /// Capacity for the call was taken.
    Taken,
    /// No capacity for the call soon: it comes back after this wait.
    NoCapacity {
        /// The wait.
        wait_ms: Millis,
    },
    /// The command needs no answer and was carried out.
    Carried,
    /// Whether the line's batch still runs.
    BatchRunning(bool),
    /// The write was applied and left this item.
    Applied(JobRecord),
    /// The write was refused; the item as the refusal showed it (`None`: there is none).
    Refused(Option<JobRecord>),
    /// The write was sent and no answer came.
    Unanswered,
    /// The write failed before anything was written.
    WriteFailed,
    /// The item as a read found it.
    Read(Option<JobRecord>),
    /// The read failed.
    ReadFailed,
    /// The answer the fenced owner stored, if one was found.
    Found(Option<BlobRef>),
    /// What the provider said to the call ([`CallStep::Submit`]).
    Said(Said),
    /// The pacer keeps this pause after a refusal for its rate limit ([`CallStep::Throttled`]).
    Paced {
        /// The pause's end.
        paused_until: Millis,
    },
    /// Whether the pacer lets a refused call go again ([`CallStep::Resend`]).
    Resent(bool),
    /// The answer to the write of the call's reference ([`CallStep::Record`]; `None`: none).
    Recorded(Option<Write>),
    /// What the provider said of the call asked about ([`CallStep::Retrieve`]).
    Retrieved(Retrieval),
    /// The pause before asking again passed ([`CallStep::Pause`]).
    Paused,
    /// The provider was asked to cancel the call ([`CallStep::Cancel`]).
    Cancelled,
    /// Ownership was lost while the call waited.
    Lost,
    /// An operator cancelled the job while the call waited.
    Withdrawn,
    /// Where the answer was put ([`EndStep::Place`]).
    Placed(Placed),
    /// The answer to a write ending the attempt (`None`: none came).
    Answered(Option<Write>),
    /// The table refused the answer itself (too large after all).
    Rejected,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Phase {
    Admitting(Admission),
    /// Claimed (the item as the claim left it): the call starts once the capacity is used.
    Claimed(JobRecord),
    /// Recovered (the item as the recovery claim left it): the evidence decides.
    Recovered(JobRecord),
    Calling(Box<Calling>),
    Ending(Box<Ending>),
    /// The attempt ended so; once its call is charged, the delivery ends or falls back.
    Charged(Box<Closed>),
    Done,
}

/// One delivery of a job's record, from the item it read (if any) to the write that ends it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Delivery {
    /// Unique to the delivery; a fallback's claim adds `+hop`.
    owner_id: String,
    /// The message's input digest.
    digest: String,
    /// The deployment's providers, in order; never empty.
    lanes: Vec<Lane>,
    /// The provider the admission is routed to.
    routed: usize,
    /// Claims made for another provider after a definite refusal.
    hop: usize,
    /// The last item seen.
    view: Option<JobRecord>,
    /// The claim's call was sent.
    sent: bool,
    /// What the last call came to, and whether the invocation's deadline cut it off.
    called: Option<(Waited, bool)>,
    phase: Phase,
    /// The commands after the one that needs no answer, in order.
    queued: VecDeque<Command>,
}

impl Delivery {
    /// A delivery of the record whose message has `digest`, by `owner_id`, from the item already
    /// read (`item`, if any), and its first command.
    pub fn start(
        owner_id: String,
        digest: String,
        lanes: Vec<Lane>,
        item: Option<JobRecord>,
        now: Millis,
    ) -> (Delivery, Command) {
        let mut d = Delivery {
            owner_id,
            digest,
            lanes,
            routed: 0,
            hop: 0,
            view: None,
            sent: false,
            called: None,
            phase: Phase::Done,
            queued: VecDeque::new(),
        };
        let command = d.admit(item, now);
        (d, command)
    }

    /// The owner id its writes carry.
    pub fn owner_id(&self) -> String {
        match self.hop {
            0 => self.owner_id.clone(),
            hop => format!("{}+{hop}", self.owner_id),
        }
    }

    /// The index of the provider the delivery's claim or call goes to.
    pub fn lane(&self) -> usize {
        self.owner()
            .map_or(self.routed, |owner| self.lane_of(owner))
    }

    /// Claims made for another provider after a definite refusal.
    pub fn hop(&self) -> usize {
        self.hop
    }

    /// The last item seen.
    pub fn view(&self) -> Option<&JobRecord> {
        self.view.as_ref()
    }

    /// The admission, while the delivery is in it.
    pub fn admission(&self) -> Option<&Admission> {
        match &self.phase {
            Phase::Admitting(a) => Some(a),
            _ => None,
        }
    }

    /// The call, while the delivery is in it.
    pub fn calling(&self) -> Option<&Calling> {
        match &self.phase {
            Phase::Calling(c) => Some(c),
            _ => None,
        }
    }

    /// The attempt's end, while the delivery is in it.
    pub fn ending(&self) -> Option<&Ending> {
        match &self.phase {
            Phase::Ending(e) => Some(e),
            _ => None,
        }
    }

    /// The owner's item, once a claim or recovery of this delivery holds.
    pub fn owner(&self) -> Option<&JobRecord> {
        match &self.phase {
            Phase::Claimed(r) | Phase::Recovered(r) => Some(r),
            Phase::Calling(c) => Some(c.owner()),
            Phase::Ending(e) => Some(e.owner()),
            Phase::Admitting(_) | Phase::Charged(_) | Phase::Done => None,
        }
    }

    /// The claim's call was sent.
    pub fn sent(&self) -> bool {
        self.sent
    }

    /// What the last call came to, and whether the invocation's deadline cut it off, once it
    /// ended.
    pub fn called(&self) -> Option<&(Waited, bool)> {
        self.called.as_ref()
    }

    /// What the world said to the last command, at `now`: the next command.
    pub fn observe(&mut self, observation: Observation, now: Millis) -> Command {
        if matches!(observation, Observation::Carried)
            && let Some(queued) = self.queued.pop_front()
        {
            return queued;
        }
        match std::mem::replace(&mut self.phase, Phase::Done) {
            Phase::Admitting(a) => self.admitting(a, observation, now),
            Phase::Claimed(claimed) => {
                let facts = self.lanes[self.lane_of(&claimed)].call;
                let (machine, step) = Calling::start(facts, claimed, now);
                self.sent = matches!(step, CallStep::Submit { .. });
                self.call(machine, step, now)
            }
            Phase::Recovered(fenced) => {
                let Observation::Found(stored) = observation else {
                    return self.unexpected(Phase::Recovered(fenced));
                };
                let because = fenced
                    .recoveries
                    .last()
                    .map_or("recovered", |r| r.reason.as_str())
                    .to_owned();
                let facts = self.lanes[self.lane_of(&fenced)].call;
                let (machine, step) = Calling::resume(facts, fenced, &because, stored, now);
                self.call(machine, step, now)
            }
            Phase::Calling(mut machine) => {
                let step = match observation {
                    Observation::Said(said) => machine.submitted(said, now),
                    Observation::Paced { paused_until } => machine.paced(paused_until, now),
                    Observation::Resent(resent) => machine.resent(resent, now),
                    Observation::Recorded(answer) => machine.recorded(answer, now),
                    Observation::Retrieved(found) => machine.retrieved(found, now),
                    Observation::Paused => machine.paused(now),
                    Observation::Cancelled => machine.cancelled(now),
                    Observation::Lost => machine.lost(),
                    Observation::Withdrawn => machine.withdrawn(),
                    _ => return self.unexpected(Phase::Calling(machine)),
                };
                self.call(*machine, step, now)
            }
            Phase::Ending(mut machine) => {
                let step = match observation {
                    Observation::Placed(placed) => machine.placed(placed, now),
                    Observation::Answered(answer) => machine.answered(answer, now),
                    Observation::Rejected => machine.rejected(now),
                    _ => return self.unexpected(Phase::Ending(machine)),
                };
                self.end(*machine, step)
            }
            Phase::Charged(closed) => self.closed(*closed, now),
            Phase::Done => self.unexpected(Phase::Done),
        }
    }

    /// An observation the command did not ask for: the delivery backs off, the phase kept for
    /// whoever looks.
    fn unexpected(&mut self, phase: Phase) -> Command {
        self.phase = phase;
        self.done(backoff("unexpected observation"), false)
    }

    /// A new admission from `item` (the item already read, if any), unless the invocation is
    /// too close to its end to start anything.
    fn admit(&mut self, item: Option<JobRecord>, now: Millis) -> Command {
        if now >= self.lanes[0].call.invocation_end {
            // Too close to the invocation's end to start anything: the job is left untouched.
            self.view = None;
            return self.done(backoff("invocation deadline"), false);
        }
        self.route(item, now)
    }

    /// An admission routed to the provider `item` names for the next attempt (the first
    /// without one).
    fn route(&mut self, item: Option<JobRecord>, now: Millis) -> Command {
        self.routed = self.next_lane(item.as_ref());
        let facts = self.lanes[self.routed].admission;
        let (machine, step) = Admission::start(facts, item.as_ref(), &self.digest, now);
        self.view = item.or(self.view.take());
        self.admission_step(machine, step)
    }

    fn admitting(&mut self, mut a: Admission, observation: Observation, now: Millis) -> Command {
        let step = match observation {
            Observation::Taken => a.admitted(now),
            Observation::NoCapacity { wait_ms } => a.no_capacity(wait_ms),
            Observation::BatchRunning(true) => {
                let remaining_ms = self.batch_wait(now);
                self.phase = Phase::Admitting(a);
                return self.done(
                    RecordOutcome::Failed(Failure::Deferred { remaining_ms }),
                    true,
                );
            }
            Observation::BatchRunning(false) => match a.op().copied() {
                Some(op) => {
                    self.phase = Phase::Admitting(a);
                    return Command::Write(op);
                }
                None => a.failed(),
            },
            Observation::Applied(record) => return self.applied(a, record),
            Observation::Refused(seen) | Observation::Read(seen) => {
                if let Some(ours) = seen.as_ref().filter(|s| a.ours(s, &self.owner_id())) {
                    return self.applied(a, ours.clone());
                }
                return self.seen(a, seen, now);
            }
            Observation::Unanswered => a.unanswered(),
            Observation::WriteFailed => a.failed(),
            Observation::ReadFailed => a.read_failed(),
            _ => return self.unexpected(Phase::Admitting(a)),
        };
        self.admission_step(a, step)
    }

    /// What a refusal or a read showed (`seen`): decided afresh for another provider when the
    /// item routes the claim elsewhere (what was taken given back first), else by the machine.
    fn seen(&mut self, mut a: Admission, seen: Option<JobRecord>, now: Millis) -> Command {
        let rerouted = seen.as_ref().map(|s| self.next_lane(Some(s)));
        if rerouted.is_some_and(|r| r != self.routed) {
            let next = self.route(seen, now);
            return self.then(Command::GiveBack, next);
        }
        let step = a.seen(seen.as_ref(), &self.digest, now);
        self.view = seen.or(self.view.take());
        self.admission_step(a, step)
    }

    fn admission_step(&mut self, a: Admission, step: Step) -> Command {
        let command = match step {
            Step::Admit => Command::Take,
            Step::Write(op) if self.batch_to_look_at(&op) => Command::LookAtBatch,
            Step::Write(op) => Command::Write(op),
            Step::ReadBack { pause_ms } => Command::ReadBack {
                pause_ms: pause_ms as Millis,
            },
            Step::End(outcome) => {
                self.phase = Phase::Admitting(a);
                return self.done(outcome, true);
            }
        };
        self.phase = Phase::Admitting(a);
        command
    }

    /// Our own write applied, leaving `record`.
    fn applied(&mut self, a: Admission, record: JobRecord) -> Command {
        self.view = Some(record.clone());
        match a.applied(&record) {
            Applied::Call => {
                self.phase = Phase::Claimed(record);
                Command::Use
            }
            // No call under these writes: what was taken is given back.
            Applied::Investigate { .. } => {
                self.phase = Phase::Recovered(record);
                self.then(Command::GiveBack, Command::LookForAnswer)
            }
            Applied::End(outcome) => {
                self.phase = Phase::Admitting(a);
                self.done(outcome, true)
            }
        }
    }

    /// Whether the recovery `op` asks for is of a line whose batch id the item records (and no
    /// cancel request ends the job at once): the provider is asked whether the batch runs
    /// before anything is written.
    fn batch_to_look_at(&self, op: &Op) -> bool {
        let (Op::Recover { .. }, Some(seen)) = (op, &self.view) else {
            return false;
        };
        seen.cancel_requested.is_none()
            && seen
                .attempt_log
                .last()
                .and_then(|a| a.provider_ref.as_deref())
                .and_then(parse_ref)
                .is_some_and(|(batch, _)| batch.is_some())
    }

    /// How long a record whose line's batch runs waits before its next look: the batch poll
    /// interval, within the job's deadline, never under the skew margin.
    fn batch_wait(&self, now: Millis) -> Millis {
        let lane = &self.lanes[self.routed];
        let left = self
            .view
            .as_ref()
            .map_or(Millis::MAX, |v| v.deadline_at - now);
        lane.end.batch_poll_ms.min(left).max(lane.admission.skew)
    }

    fn call(&mut self, machine: Calling, step: CallStep, now: Millis) -> Command {
        match step {
            CallStep::Done(waited) => {
                self.called = Some((waited.clone(), machine.cut_off()));
                let owner = machine.into_owner();
                let facts = self.lanes[self.lane_of(&owner)].end;
                let (machine, step) = Ending::start(facts, owner, waited, now);
                self.end(machine, step)
            }
            step => {
                self.phase = Phase::Calling(Box::new(machine));
                Command::Call(step)
            }
        }
    }

    fn end(&mut self, machine: Ending, step: EndStep) -> Command {
        let EndStep::Done(closed) = step else {
            self.phase = Phase::Ending(Box::new(machine));
            return Command::End(step);
        };
        let (attempt, epoch) = (machine.owner().attempts, machine.owner().owner_epoch);
        // A recovery's question reserved nothing (what its admission took was given back).
        let ran = !closed.view.as_ref().is_some_and(|v| ran_nothing(v, epoch));
        let charge = match self.sent && ran {
            true => Charge::HeardOrReserved,
            false => Charge::Heard,
        };
        self.view = closed.view.clone();
        self.phase = Phase::Charged(closed);
        Command::Charge { attempt, charge }
    }

    /// The attempt's end closed so, its call charged: the delivery ends, or the next provider
    /// takes the job in the same delivery.
    fn closed(&mut self, closed: Closed, now: Millis) -> Command {
        match closed.view.clone().filter(|v| self.falls_back(v)) {
            Some(view) => {
                self.hop += 1;
                (self.sent, self.called) = (false, None);
                self.admit(Some(view), now)
            }
            None => Command::Done(Box::new(closed)),
        }
    }

    /// Whether the job, as this delivery's end left it (`job`), goes on at once with another
    /// provider: its latest attempt is this delivery's own claim, refused definitely, and the
    /// next attempt is another provider's (once per other provider at most).
    fn falls_back(&self, job: &JobRecord) -> bool {
        self.hop + 1 < self.lanes.len()
            && job.state == JobState::RetryAuthorized
            && routing::latest(job).is_some_and(|a| a.owner_id == self.owner_id())
            && routing::last_refused(job)
            && self.next_lane(Some(job)) != self.lane_of(job)
    }

    /// `first`, with `next` (and what `next` queued) kept for the [`Observation::Carried`]
    /// that answers it.
    fn then(&mut self, first: Command, next: Command) -> Command {
        self.queued.push_front(next);
        first
    }

    /// The delivery ends with `outcome`; what was taken for a call is given back first
    /// (`give_back`).
    fn done(&mut self, outcome: RecordOutcome, give_back: bool) -> Command {
        let closed = Closed {
            outcome,
            view: self.view.clone(),
            discard: None,
            refused: false,
        };
        let done = Command::Done(Box::new(closed));
        match give_back {
            true => self.then(Command::GiveBack, done),
            false => done,
        }
    }

    /// The provider that takes the next attempt, as `view` shows the job.
    fn next_lane(&self, view: Option<&JobRecord>) -> usize {
        routing::next_serving(
            view,
            self.lanes.len(),
            |i| &self.lanes[i].name,
            |i| self.lanes[i].serves,
        )
    }

    /// The provider of `job`'s current attempt.
    fn lane_of(&self, job: &JobRecord) -> usize {
        routing::index_named(routing::latest(job), self.lanes.len(), |i| {
            &self.lanes[i].name
        })
    }
}

/// Whether `job` shows the attempt claimed at `epoch` ended with nothing run: refused before
/// any work by the provider's own word (a definite failure, a rate limit given back) or never
/// sent. Such a call costs nothing, whatever it reserved.
fn ran_nothing(job: &JobRecord, epoch: u64) -> bool {
    use AttemptOutcome as O;
    job.attempt_log.iter().chain(&job.given_back).any(|a| {
        a.epoch == epoch
            && matches!(
                a.outcome,
                O::Transient | O::Permanent | O::Throttled | O::NotSent
            )
    })
}

fn backoff(cause: &'static str) -> RecordOutcome {
    RecordOutcome::Failed(Failure::Backoff {
        retry_after_ms: None,
        cause,
    })
}

#[cfg(test)]
mod tests;
