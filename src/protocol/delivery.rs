//! One delivery as one machine: the [`Admission`], the [`Calling`] (or a recovery's question)
//! and the [`Ending`], composed, with the decisions between them: the provider a claim goes
//! to and the reroute when an item names another, the look at a running batch before a
//! recovery, the answer a fenced owner stored, what the call's capacity and spend are charged,
//! and the fallback to the next provider after a definite refusal. It takes one
//! [`Observation`] at a time and answers with the next [`Command`]; the worker carries the
//! commands out, and the model checker drives the same machine with the world's choices.

use super::admission::{Admission, Applied, Facts, Op, Step};
use super::calling::{CallFacts, CallStep, Calling};
use super::ending::{Closed, EndFacts, EndStep, EndWrite, Ending};
use super::routing;
use crate::job::{AttemptOutcome, Failure, JobItem, JobState, Millis, RecordOutcome};
use crate::ledger::{KeptInput, RecoverRequest};
use crate::provider::batch::parse_ref;
mod words;

pub use words::{Charge, Command, Observation, Used};

use std::collections::VecDeque;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

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

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Phase {
    Admitting(Admission),
    /// Claimed (the item as the claim left it): the call starts once the capacity is used.
    Claimed(JobItem),
    /// Recovered (the item as the recovery claim left it): the evidence decides.
    Recovered(JobItem),
    Calling(Box<Calling>),
    Ending(Box<Ending>),
    /// The attempt ended so; once its call is charged, the delivery ends or falls back.
    Charged(Box<Closed>),
    Done,
}

/// What a delivery knows before anything is read, and keeps to its end.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Plan {
    /// Unique to the delivery; a fallback's claim adds `+hop`.
    owner_id: String,
    /// The message's input digest.
    digest: String,
    /// The deployment's providers, in order; never empty.
    lanes: Vec<Lane>,
}

/// Hashed by the owner id alone: the rest is the deployment's and the job's, the same in every
/// delivery one owner id could be told apart from (equal plans hash equal all the same).
impl Hash for Plan {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.owner_id.hash(state);
    }
}

/// One delivery of a job's record, from the item it read (if any) to the write that ends it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Delivery {
    /// What it knows before anything is read: shared by its copies (a model checker keeps
    /// many).
    plan: Arc<Plan>,
    /// The provider the admission is routed to.
    routed: usize,
    /// Claims made for another provider after a definite refusal.
    hop: usize,
    /// The last item seen.
    view: Option<JobItem>,
    /// The claim's call was sent.
    sent: bool,
    /// What the call used, as the executor priced it.
    used: Used,
    /// How the job's input is kept, once asked ([`Command::KeepInput`]).
    kept: Option<Option<KeptInput>>,
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
        item: Option<JobItem>,
        now: Millis,
    ) -> (Delivery, Command) {
        let mut d = Delivery {
            plan: Arc::new(Plan {
                owner_id,
                digest,
                lanes,
            }),
            routed: 0,
            hop: 0,
            view: None,
            sent: false,
            used: Used::default(),
            kept: None,
            phase: Phase::Done,
            queued: VecDeque::new(),
        };
        let command = d.admit(item, now);
        (d, command)
    }

    /// The owner id its writes carry.
    pub fn owner_id(&self) -> String {
        match self.hop {
            0 => self.plan.owner_id.clone(),
            hop => format!("{}+{hop}", self.plan.owner_id),
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

    /// The last item seen, but while a claim or recovery of this delivery holds (its item is
    /// [`Delivery::owner`]).
    pub fn view(&self) -> Option<&JobItem> {
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
    pub fn owner(&self) -> Option<&JobItem> {
        match &self.phase {
            Phase::Claimed(r) | Phase::Recovered(r) => Some(r),
            Phase::Calling(c) => Some(c.owner()),
            Phase::Ending(e) => Some(e.owner()),
            Phase::Admitting(_) | Phase::Charged(_) | Phase::Done => None,
        }
    }

    /// The recovery claim its [`Command::Write`] of [`Op::Recover`] asks for, made at `now`: it
    /// fences the owner seen only once that owner's lease lapsed by this delivery's clock less
    /// the skew margin, holds a lease of its own, and keeps the job's input when the item keeps
    /// none.
    pub fn recovery(&self, now: Millis) -> Option<RecoverRequest> {
        let Some(Op::Recover { state, epoch }) = self.admission()?.op().copied() else {
            return None;
        };
        let seen = self.view.as_ref()?;
        let lane = &self.plan.lanes[self.routed];
        let reason = match state {
            JobState::Unknown => {
                format!("asking the provider about the unknown attempt of epoch {epoch}")
            }
            _ => format!("lease of epoch {epoch} lapsed"),
        };
        Some(RecoverRequest {
            job_id: seen.job_id.clone(),
            seen_epoch: epoch,
            owner_id: self.owner_id(),
            now,
            lapsed_before: now - lane.admission.skew,
            lease_until: now + lane.end.lease_ms,
            reason,
            seen_recoveries: seen.recoveries.len(),
            input: self.kept_input(seen),
        })
    }

    /// The write the attempt's end asks for at [`EndStep::Write`], made at `now`, whole: what
    /// the call used ([`Used::recorded`]) and, for an end that leaves the job live, the job's
    /// input when the owner's item keeps none.
    pub fn end_write(&self, now: Millis) -> Option<EndWrite> {
        let machine = self.ending()?;
        let mut write = machine.write(now);
        if let EndWrite::End(req) = &mut write {
            req.usage = self.used.recorded(&req.end);
            if machine.leaves_live() {
                req.input = self.kept_input(machine.owner());
            }
        }
        Some(write)
    }

    /// What the call used, as the executor priced it.
    pub fn used(&self) -> Used {
        self.used
    }

    /// What the call used, as the executor priced it, for the end's write and the charge.
    pub fn set_used(&mut self, used: Used) {
        self.used = used;
    }

    /// The job's input, as kept, for a write on `item`: the item's own when it keeps one (the
    /// write leaves it as it is, and the job watched), else the input this delivery kept.
    fn kept_input(&self, item: &JobItem) -> Option<KeptInput> {
        match (item.input.is_empty(), &item.input_ref) {
            (false, _) => Some(KeptInput::Inline(item.input.clone())),
            (true, Some(blob)) => Some(KeptInput::Stored(Box::new(blob.clone()))),
            (true, None) => self.kept.clone().flatten(),
        }
    }

    /// `command`, once the job's input is kept when the write it asks for needs it (`needs`)
    /// and none is kept yet (the worker keeps it only for some writes: decision 161).
    fn keeping_input(&mut self, needs: bool, command: Command) -> Command {
        match needs && !matches!(self.kept, Some(Some(_))) {
            true => self.then(Command::KeepInput, command),
            false => command,
        }
    }

    /// The claim's call was sent.
    pub fn sent(&self) -> bool {
        self.sent
    }

    /// What the calls of the delivery's provider know from now on (the model checker lets the
    /// world say how much time the invocation has when a call starts).
    pub fn set_call_facts(&mut self, facts: CallFacts) {
        let lane = self.lane();
        Arc::make_mut(&mut self.plan).lanes[lane].call = facts;
    }

    /// What the world said to the last command, at `now`: the next command.
    pub fn observe(&mut self, observation: Observation, now: Millis) -> Command {
        if let Observation::Kept(input) = &observation {
            self.kept = Some(input.clone());
        }
        if matches!(observation, Observation::Carried | Observation::Kept(_))
            && let Some(queued) = self.queued.pop_front()
        {
            return queued;
        }
        match std::mem::replace(&mut self.phase, Phase::Done) {
            Phase::Admitting(a) => self.admitting(a, observation, now),
            Phase::Claimed(claimed) => {
                let facts = self.plan.lanes[self.lane_of(&claimed)].call;
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
                let facts = self.plan.lanes[self.lane_of(&fenced)].call;
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
                    Observation::CancelledUpstream => machine.cancelled_upstream(now),
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
    fn admit(&mut self, item: Option<JobItem>, now: Millis) -> Command {
        if now >= self.plan.lanes[0].call.invocation_end {
            // Too close to the invocation's end to start anything: the job is left untouched.
            self.view = None;
            return self.done(backoff("invocation deadline"), false);
        }
        self.route(item, now)
    }

    /// An admission routed to the provider `item` names for the next attempt (the first
    /// without one).
    fn route(&mut self, item: Option<JobItem>, now: Millis) -> Command {
        self.routed = self.next_lane(item.as_ref());
        let facts = self.plan.lanes[self.routed].admission;
        let (machine, step) = Admission::start(facts, item.as_ref(), &self.plan.digest, now);
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
                    return self.write(op);
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
    /// item routes the claim elsewhere (what was taken released first), else by the machine.
    fn seen(&mut self, mut a: Admission, seen: Option<JobItem>, now: Millis) -> Command {
        let rerouted = seen.as_ref().map(|s| self.next_lane(Some(s)));
        if rerouted.is_some_and(|r| r != self.routed) {
            let next = self.route(seen, now);
            return self.then(Command::Release, next);
        }
        let step = a.seen(seen.as_ref(), &self.plan.digest, now);
        self.view = seen.or(self.view.take());
        self.admission_step(a, step)
    }

    fn admission_step(&mut self, a: Admission, step: Step) -> Command {
        let command = match step {
            Step::Admit => Command::Take,
            Step::Write(op) if self.batch_to_look_at(&op) => Command::LookAtBatch,
            Step::Write(op) => self.write(op),
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
    fn applied(&mut self, a: Admission, record: JobItem) -> Command {
        match a.applied(&record) {
            // The owner's item is the view until the attempt's end says otherwise.
            Applied::Call => {
                self.view = None;
                self.phase = Phase::Claimed(record);
                Command::Use
            }
            // No call under these writes: what was taken is released.
            Applied::Investigate { .. } => {
                self.view = None;
                self.phase = Phase::Recovered(record);
                self.then(Command::Release, Command::LookForAnswer)
            }
            Applied::End(outcome) => {
                self.view = Some(record);
                self.phase = Phase::Admitting(a);
                self.done(outcome, true)
            }
        }
    }

    /// The write `op`, the job's input kept first for a recovery of an item that keeps none.
    fn write(&mut self, op: Op) -> Command {
        let recovers = matches!(op, Op::Recover { .. })
            && !self.view.as_ref().is_some_and(JobItem::keeps_input);
        self.keeping_input(recovers, Command::Write(op))
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
        let lane = &self.plan.lanes[self.routed];
        let left = self
            .view
            .as_ref()
            .map_or(Millis::MAX, |v| v.deadline_at - now);
        lane.end.batch_poll_ms.min(left).max(lane.admission.skew)
    }

    fn call(&mut self, machine: Calling, step: CallStep, now: Millis) -> Command {
        match step {
            CallStep::Done(waited) => {
                let owner = machine.into_owner();
                let facts = self.plan.lanes[self.lane_of(&owner)].end;
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
            let needs = matches!(step, EndStep::Write { .. })
                && machine.leaves_live()
                && !machine.owner().keeps_input();
            self.phase = Phase::Ending(Box::new(machine));
            return self.keeping_input(needs, Command::End(step));
        };
        let (attempt, epoch) = (machine.owner().attempts, machine.owner().owner_epoch);
        // A recovery's question reserved nothing (what its admission took was released).
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
                self.sent = false;
                self.admit(Some(view), now)
            }
            None => Command::Done(Box::new(closed)),
        }
    }

    /// Whether the job, as this delivery's end left it (`job`), goes on at once with another
    /// provider: its latest attempt is this delivery's own claim, refused definitely, and the
    /// next attempt is another provider's (once per other provider at most).
    fn falls_back(&self, job: &JobItem) -> bool {
        self.hop + 1 < self.plan.lanes.len()
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

    /// The delivery ends with `outcome`; what was taken for a call is released first
    /// (`release`).
    fn done(&mut self, outcome: RecordOutcome, release: bool) -> Command {
        let closed = Closed {
            outcome,
            view: self.view.clone(),
            discard: None,
            refused: false,
        };
        let done = Command::Done(Box::new(closed));
        match release {
            true => self.then(Command::Release, done),
            false => done,
        }
    }

    /// The provider that takes the next attempt, as `view` shows the job.
    fn next_lane(&self, view: Option<&JobItem>) -> usize {
        routing::next_serving(
            view,
            self.plan.lanes.len(),
            |i| &self.plan.lanes[i].name,
            |i| self.plan.lanes[i].serves,
        )
    }

    /// The provider of `job`'s current attempt.
    fn lane_of(&self, job: &JobItem) -> usize {
        routing::index_named(routing::latest(job), self.plan.lanes.len(), |i| {
            &self.plan.lanes[i].name
        })
    }
}

/// Whether `job` shows the attempt claimed at `epoch` ended with nothing run: refused before
/// any work by the provider's own word (a definite failure, a rate limit given back) or never
/// sent. Such a call costs nothing, whatever it reserved.
fn ran_nothing(job: &JobItem, epoch: u64) -> bool {
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
