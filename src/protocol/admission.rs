//! Which writes a delivery makes before its call, as a machine with no I/O: it is told what the
//! clock, the pacer and the ledger said, and answers with the next [`Step`]. The processor
//! carries the steps out; the protocol's model checker (`make model-check`) drives the same
//! machine through every interleaving it explores.

use crate::job::decision::{DeadlinePhase, Expect, Next, SettleReason, deadline_phase, next_step};
use crate::job::{Failure, InvalidMessage, JobItem, JobState, Millis, NewJob, RecordOutcome};
use crate::ledger::transitions::{shows_claim, shows_recovery};
use crate::ledger::{SettleFrom, SettleRequest};

/// Writes one delivery may make before it gives up on a contended job and backs off.
pub(crate) const MAX_ROUNDS: usize = 4;
/// Pauses before each read that looks for a claim or recovery whose answer was lost.
pub(crate) const READ_BACK_PAUSES_MS: [u64; 3] = [0, 100, 400];

/// A ledger write a delivery makes before any call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// Claim a new attempt expecting these values; on `first_sight` the write creates the item.
    Claim {
        /// What the claim expects to find.
        expect: Expect,
        /// Nothing read yet and nothing says the item exists.
        first_sight: bool,
    },
    /// End the job without a claim.
    Settle(Settle),
    /// Fence the owner seen in `state` at `epoch`, to look at the evidence of its attempt.
    Recover {
        /// The state seen.
        state: JobState,
        /// The epoch seen.
        epoch: u64,
    },
    /// Create the item `ready` and marked enqueued, if it does not exist: a job first seen while
    /// the pacer has no capacity for its call, so that its deadline is fixed and a lost message
    /// can be re-sent. Whatever it answers, the record then waits in the queue.
    Create,
}

impl Op {
    /// Whether the write, applied, leads to a provider call (a new attempt or a question).
    pub fn calls(&self) -> bool {
        matches!(self, Op::Claim { .. } | Op::Recover { .. })
    }
}

/// A job ended without a claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Settle {
    /// Created already terminal: first sight past its deadline, or with a first call that
    /// would cost more than its spend limit.
    Absent(SettleReason),
    /// Seen in `state` at `epoch`.
    Seen {
        /// The state seen.
        state: JobState,
        /// The epoch seen.
        epoch: u64,
        /// Why it ends.
        reason: SettleReason,
    },
}

impl Settle {
    /// The write, for `job` at `now`.
    pub fn request(self, job: &NewJob, now: Millis) -> SettleRequest {
        let (from, reason) = match self {
            Settle::Absent(reason) => (SettleFrom::Absent(Box::new(job.clone())), reason),
            Settle::Seen {
                state,
                epoch,
                reason,
            } => (SettleFrom::Seen { state, epoch }, reason),
        };
        SettleRequest {
            job_id: job.job_id.clone(),
            from,
            reason,
            now,
        }
    }
}

/// What the delivery does next.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Step {
    /// Take capacity for the call from the pacer before the claim that would start it
    /// ([`Admission::admitted`]; without capacity soon, the record waits in the queue).
    Admit,
    /// Make this write, then tell the machine what it did ([`Admission::applied`],
    /// [`Admission::seen`] for a refusal unless it shows [`Admission::ours`],
    /// [`Admission::unanswered`], [`Admission::failed`]).
    Write(Op),
    /// After this pause, read the item: was the claim or recovery whose answer was lost
    /// applied? ([`Admission::ours`] and [`Admission::applied`], [`Admission::seen`], or
    /// [`Admission::read_failed`].)
    ReadBack {
        /// The pause before the read.
        pause_ms: u64,
    },
    /// The delivery ends so.
    End(RecordOutcome),
}

/// What an applied write leads to.
#[derive(Debug, Clone, PartialEq)]
pub enum Applied {
    /// The claim holds: send the call.
    Call,
    /// The recovery claim holds: look at the evidence of the attempt of `seen_epoch`.
    Investigate {
        /// The epoch fenced.
        seen_epoch: u64,
    },
    /// The delivery ends so (a settle).
    End(RecordOutcome),
}

/// What the machine knows of the job and the invocation before anything is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Facts {
    /// The job's deadline.
    pub deadline_at: Millis,
    /// The clock-skew margin.
    pub skew: Millis,
    /// The latest moment a call may start in this invocation.
    pub latest_call_start: Millis,
    /// The provider can be asked about a call by its reference.
    pub can_retrieve: bool,
    /// The message says the ledger holds the job already.
    pub in_ledger: bool,
    /// The next call's estimated cost, in micro-dollars (its input and its whole answer
    /// ceiling, at the model's prices; 0 when the model is not priced).
    pub next_call_micros: u64,
    /// The spend limit of a job not in the ledger yet (its message's, or the default).
    pub max_cost_micros: Option<u64>,
    /// The delivery carries the job's input: a trigger by id for a job whose item keeps none
    /// (`JobItem::keeps_input`) does not, and never claims or recovers.
    pub carries_input: bool,
}

/// Whether a call estimated at `next` would take a job that has spent `spent` past `max`.
fn overspends(spent: u64, next: u64, max: Option<u64>) -> bool {
    max.is_some_and(|max| spent.saturating_add(next) > max)
}

/// The pre-call part of one delivery.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Admission {
    facts: Facts,
    /// Decisions made from what the ledger showed.
    rounds: usize,
    /// Something of the item was seen.
    seen_any: bool,
    /// Capacity was taken for the call.
    admitted: bool,
    /// No capacity for the call: it comes back after this wait, and the delivery ends waiting.
    paced: Option<Millis>,
    /// Reads after a write whose answer was lost that failed too.
    failed_reads: usize,
    /// The write made or about to be made.
    op: Option<Op>,
}

impl Admission {
    /// What the machine knows of the job and the invocation.
    pub fn facts(&self) -> &Facts {
        &self.facts
    }

    /// A delivery's first step, from the message alone (`item`: the item already read, if any).
    pub fn start(
        facts: Facts,
        item: Option<&JobItem>,
        digest: &str,
        now: Millis,
    ) -> (Admission, Step) {
        let mut machine = Admission {
            facts,
            rounds: 0,
            seen_any: false,
            admitted: false,
            paced: None,
            failed_reads: 0,
            op: None,
        };
        let step = match deadline_phase(facts.deadline_at, now, facts.skew) {
            // Too close to the deadline to claim, not yet surely past it to expire.
            DeadlinePhase::Closing { remaining_ms } => {
                Step::End(RecordOutcome::Failed(Failure::Deferred { remaining_ms }))
            }
            _ if item.is_some() => machine.seen(item, digest, now),
            _ => {
                let op = machine.when_absent(now);
                machine.proceed(op, now)
            }
        };
        (machine, step)
    }

    /// The write last asked for.
    pub fn op(&self) -> Option<&Op> {
        self.op.as_ref()
    }

    /// Capacity for the call was taken (after [`Step::Admit`], whose claim is still to make).
    pub fn admitted(&mut self, now: Millis) -> Step {
        self.admitted = true;
        match self.op {
            Some(op) => self.proceed(op, now),
            None => self.failed(),
        }
    }

    /// The pacer has no capacity for the call within its horizon; it comes back after
    /// `wait_ms`. The ledger is left as it is, but for a job first seen, whose item is created
    /// to wait ([`Op::Create`]); then the record waits in the queue.
    pub fn no_capacity(&mut self, wait_ms: Millis) -> Step {
        self.paced = Some(wait_ms);
        match self.op {
            Some(Op::Claim {
                first_sight: true, ..
            }) => {
                self.op = Some(Op::Create);
                Step::Write(Op::Create)
            }
            _ => self.waits(),
        }
    }

    /// The write was applied and left `record`.
    pub fn applied(&self, record: &JobItem) -> Applied {
        match &self.op {
            Some(Op::Create) => Applied::End(self.waiting()),
            Some(Op::Recover { epoch, .. }) => Applied::Investigate { seen_epoch: *epoch },
            _ if record.state == JobState::Running => Applied::Call,
            _ => Applied::End(RecordOutcome::Done(record.state)),
        }
    }

    /// The request failed before anything was written.
    pub fn failed(&self) -> Step {
        if self.paced.is_some() {
            return self.waits();
        }
        Step::End(backoff("ledger"))
    }

    /// The end of a delivery that got no capacity for its call.
    fn waits(&self) -> Step {
        Step::End(self.waiting())
    }

    fn waiting(&self) -> RecordOutcome {
        RecordOutcome::Failed(Failure::Paced {
            wait_ms: self.paced.unwrap_or(0),
        })
    }

    /// The write was sent and no answer came: it may have been applied. A claim applied and not
    /// recognised would leave the job `running` with no call, for a recovery to find
    /// uncertain, so the item is read while the reads go unanswered; a settle is left to the
    /// next delivery.
    pub fn unanswered(&mut self) -> Step {
        match self.op {
            Some(Op::Claim { .. } | Op::Recover { .. }) => {
                self.failed_reads = 0;
                Step::ReadBack {
                    pause_ms: READ_BACK_PAUSES_MS[0],
                }
            }
            _ => self.failed(),
        }
    }

    /// The read after an unanswered write failed too. After the last, the job is left to its
    /// lease and the recovery.
    pub fn read_failed(&mut self) -> Step {
        self.failed_reads += 1;
        match READ_BACK_PAUSES_MS.get(self.failed_reads) {
            Some(&pause_ms) => Step::ReadBack { pause_ms },
            None => self.failed(),
        }
    }

    /// Whether the delivery ended without knowing if its last write was applied: the write
    /// and every read after it went unanswered.
    pub(crate) fn unconfirmed(&self) -> bool {
        self.failed_reads >= READ_BACK_PAUSES_MS.len()
    }

    /// Whether `seen` shows this delivery's own claim or recovery applied (`owner_id` is
    /// unique to the delivery): a retry refused by its first try, or a read after a lost answer.
    pub fn ours(&self, seen: &JobItem, owner_id: &str) -> bool {
        match self.op {
            Some(Op::Claim { expect, .. }) => shows_claim(seen, expect, owner_id),
            Some(Op::Recover { epoch, .. }) => shows_recovery(seen, epoch, owner_id),
            _ => false,
        }
    }

    /// The item as a refusal (or a read) showed it; `None`: there is no item.
    pub fn seen(&mut self, seen: Option<&JobItem>, digest: &str, now: Millis) -> Step {
        if self.paced.is_some() {
            // The item to wait in exists already: the record waits all the same.
            return self.waits();
        }
        self.rounds += 1;
        let op = match seen {
            // No item where one was expected (removed by TTL, say): start again from absent.
            None => self.when_absent(now),
            Some(seen) => {
                self.seen_any = true;
                match next_step(seen, digest, now, self.facts.skew) {
                    // No call that would take the job past its spend limit: it ends, as when
                    // its attempts are spent.
                    Next::Claim(_)
                        if overspends(
                            seen.usage().and_then(|u| u.cost_micros).unwrap_or(0),
                            self.facts.next_call_micros,
                            seen.max_cost_micros,
                        ) =>
                    {
                        Op::Settle(Settle::Seen {
                            state: seen.state,
                            epoch: seen.owner_epoch,
                            reason: SettleReason::SpendLimit,
                        })
                    }
                    Next::Claim(expect) => Op::Claim {
                        expect,
                        first_sight: false,
                    },
                    Next::Settle(reason) => Op::Settle(Settle::Seen {
                        state: seen.state,
                        epoch: seen.owner_epoch,
                        reason,
                    }),
                    // An expired lease authorises investigation only: fence, then look at the
                    // evidence; never a new call.
                    Next::AwaitRecovery => Op::Recover {
                        state: seen.state,
                        epoch: seen.owner_epoch,
                    },
                    // An unknown attempt with a reference: ask the provider again, under a new
                    // epoch.
                    // (A line of a batch can always be asked about, whoever its provider.)
                    Next::AwaitDecision
                        if seen.last_provider_ref().is_some_and(|r| {
                            self.facts.can_retrieve || crate::provider::batch::is_batch_ref(r)
                        }) =>
                    {
                        Op::Recover {
                            state: seen.state,
                            epoch: seen.owner_epoch,
                        }
                    }
                    next => return Step::End(RecordOutcome::from_next(next, digest)),
                }
            }
        };
        if self.rounds >= MAX_ROUNDS {
            return Step::End(backoff("contention"));
        }
        self.proceed(op, now)
    }

    /// The write to make when no item is known.
    fn when_absent(&self, now: Millis) -> Op {
        match deadline_phase(self.facts.deadline_at, now, self.facts.skew) {
            DeadlinePhase::Passed => Op::Settle(Settle::Absent(SettleReason::DeadlinePassed)),
            _ if overspends(0, self.facts.next_call_micros, self.facts.max_cost_micros) => {
                Op::Settle(Settle::Absent(SettleReason::SpendLimit))
            }
            _ => Op::Claim {
                expect: Expect::FRESH,
                first_sight: !self.seen_any && !self.facts.in_ledger,
            },
        }
    }

    /// `op`, once there is time and capacity for the call it would start.
    fn proceed(&mut self, op: Op, now: Millis) -> Step {
        let claims = matches!(op, Op::Claim { .. });
        let calls = op.calls();
        self.op = Some(op);
        if calls && now > self.facts.latest_call_start {
            // A claim now would send a call only to cut it off, making the job `unknown`:
            // leave the ledger untouched and let a later delivery claim it.
            return Step::End(backoff("too little time left for a call"));
        }
        if calls && !self.facts.carries_input {
            // A trigger by id whose item keeps no input: a claim or a recovery built from it
            // would send (or price) a request without the input. The job's own message carries
            // it and claims or recovers the job; this one waits, or the deadline ends the job.
            return Step::End(backoff("input with the job's message"));
        }
        if claims && !self.admitted {
            return Step::Admit;
        }
        Step::Write(op)
    }
}

/// A live job whose stored input is gone or altered (a lifecycle rule shorter than the job, an
/// object overwritten), as `item` shows it at `now`: the settle that ends it `failed_terminal`
/// (`input_lost`) when it would be claimed now, as no call can be made; none while an owner or
/// a recovery still holds it (the record backs off, for that owner or the deadline to end it).
pub fn input_lost(item: &JobItem, now: Millis, skew: Millis) -> Option<SettleRequest> {
    let Next::Claim(_) = next_step(item, &item.input_digest, now, skew) else {
        return None;
    };
    Some(SettleRequest {
        job_id: item.job_id.clone(),
        from: SettleFrom::Seen {
            state: item.state,
            epoch: item.owner_epoch,
        },
        reason: SettleReason::InputLost,
        now,
    })
}

/// A job the deployment's rules refuse at first sight, for `invalid`, and what a read of its
/// item found (`read`): taken only when its message says the ledger may hold it
/// ([`JobMessage::may_be_in_ledger`]), `Ok(found)`, or `Err(())` when the read failed. Poison
/// with no read; with one, an item the ledger holds is never judged again (`None`: admitted),
/// an absent one is poison, and a failed read backs off, so the attribute cannot carry a new
/// job past the rules.
///
/// [`JobMessage::may_be_in_ledger`]: crate::job::JobMessage::may_be_in_ledger
pub fn refused_at_first_sight(
    invalid: InvalidMessage,
    read: Option<Result<bool, ()>>,
) -> Option<Failure> {
    match read {
        Some(Ok(true)) => None,
        Some(Err(())) => Some(Failure::Backoff {
            retry_after_ms: None,
            cause: "ledger",
        }),
        Some(Ok(false)) | None => Some(Failure::Poison(invalid)),
    }
}

/// The outcome of a later record of the same job in one batch, from `view`, the item as the
/// batch's first record of the job left it: one call per job and batch, so a record that would
/// claim or settle backs off instead, and the rest follows the view (acknowledged only when it
/// shows the job terminal, which no later write can undo).
pub fn follow(view: &JobItem, digest: &str, now: Millis, skew: Millis) -> RecordOutcome {
    match next_step(view, digest, now, skew) {
        Next::Claim(_) | Next::Settle(_) => backoff("duplicate in batch"),
        next => RecordOutcome::from_next(next, digest),
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
