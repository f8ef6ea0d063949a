//! The job ledger: one item per job, changed only by conditional writes.
//!
//! Every operation is one conditional write. A refused write returns the item as it stood (so the
//! caller re-decides without a second read), never an error, and no code path follows a refusal
//! with an unconditional write. [`memory::InMemoryLedger`] and [`dynamodb::DynamoLedger`] keep the
//! same contract; the conditions are spelled once per operation in each.

pub mod dynamodb;
mod index;
pub mod memory;
mod operator;
pub mod path_times;
pub mod pushed;
pub mod schedule;
mod shared;
pub mod spend;
pub mod transitions;

use std::future::Future;

pub use index::{DueWalk, IndexCursor, LedgerIndex};
pub use operator::{CancelRequest, DecideRequest, OperatorAction};

use crate::job::contract::{Finish, Rejected};
use crate::job::decision::{Expect, SettleReason};
use crate::job::{JobItem, JobState, Millis, NewJob, ResultBody};

/// The result of a conditional write.
#[derive(Debug, Clone, PartialEq)]
pub enum Write {
    /// The write was applied; the item as it now stands.
    Applied(JobItem),
    /// The condition did not hold; the item as it stood (`None`: there is no item).
    Refused(Option<JobItem>),
}

/// Claims a job for a new attempt.
///
/// Condition: the item is absent and `expect` is [`Expect::FRESH`], or the item is `ready` or
/// `retry_authorized` with exactly `expect`'s epoch and attempts, the same input digest, budget
/// left and the deadline ahead. Effect: `running`, epoch and attempts raised by one, the lease
/// set and the attempt appended to the log, all in the same write (and, when absent, the job
/// created from `job`).
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimRequest {
    /// The job as the message carries it.
    pub job: NewJob,
    /// What the claimant expects to find.
    pub expect: Expect,
    /// Who claims (unique per claim, so a lost response can be recognised).
    pub owner_id: String,
    /// The claimant's clock.
    pub now: Millis,
    /// End of the lease granted by the claim.
    pub lease_until: Millis,
    /// The reference the provider will know this attempt by, when the client assigns it (an
    /// idempotency key): recorded with the attempt, so a recovery can ask the provider.
    pub provider_ref: Option<String>,
    /// The provider of the deployment the attempt goes to, and the model it asks there:
    /// recorded with the attempt, so a recovery asks that provider and a fallback knows who
    /// refused.
    pub route: Option<crate::job::Route>,
    /// The claimant has read no item of this job and its message does not say one exists (a
    /// whole-job message's first write), so the item is most likely absent and a ledger may try
    /// to create it whole first. Condition and
    /// effect are the same either way; only the cost differs.
    pub first_sight: bool,
    /// The claim puts the job in the due index even on its first claim, and keeps its input from
    /// the second on: SQS may drop the message before the job's deadline (see
    /// `VisibilityPolicy::may_drop`), and then only the index shows the reconciler the job, and
    /// only the item's input lets a trigger by id run it. A first claim whose message SQS keeps
    /// leaves it out (and so does its acceptance): the message brings the job back if its owner
    /// dies, carrying the input.
    pub list_due: bool,
}

/// How an owner ends its attempt.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum AttemptEnd {
    /// Accept the answer (also conditional on the deadline being ahead).
    Succeeded {
        /// The answer: inline, or the object it was written to before this acceptance.
        result: ResultBody,
        /// Why the model stopped ([`Finish::Unknown`] for an answer a recovery collects from
        /// the bucket, which its contract accepted before it was stored).
        finish: Finish,
    },
    /// A definite transient failure with budget and time left: another attempt is permitted.
    RetryAuthorized {
        /// Classification of the failure.
        error: String,
    },
    /// A permanent failure, or a transient one with no budget left.
    FailedTerminal {
        /// `permanent` or `budget`.
        kind: &'static str,
        /// Classification of the failure.
        error: String,
    },
    /// The call may have run without a confirmed outcome: `unknown`, with the evidence.
    Unknown {
        /// What is known about the call.
        evidence: String,
    },
    /// The call's outcome is unknown, and the configured replay policy accepts a possible
    /// duplicate call: `retry_authorized`, with the decision recorded. Only with budget and time
    /// left (the caller checks; the next claim checks again).
    Replay {
        /// What is known about the call.
        evidence: String,
        /// Who decided (`replay-policy`).
        by: String,
    },
    /// Nothing ran, for sure: the provider refused the call for its rate limit before any work
    /// (`why` is [`AttemptOutcome::Throttled`]), or the call was never sent
    /// ([`AttemptOutcome::NotSent`]: no time was left for it, or the lease lapsed before it
    /// left). The attempt is given back: `attempts` lowered again, its log entry moved to
    /// `given_back` (marked with `why`), counted in `throttles` or `not_sent`, and the job
    /// `retry_authorized`. It spends no budget; the deadline bounds how long a job may be
    /// throttled. Built by [`crate::protocol::ending`] from the owner's record.
    ///
    /// [`AttemptOutcome::Throttled`]: crate::job::AttemptOutcome::Throttled
    /// [`AttemptOutcome::NotSent`]: crate::job::AttemptOutcome::NotSent
    GivenBack {
        /// `Throttled` or `NotSent`.
        why: crate::job::AttemptOutcome,
        /// The provider's refusal, or why the call was not sent.
        error: String,
        /// `given_back` as this end leaves it: the owner's, with this attempt added, the last
        /// [`crate::job::GIVEN_BACK_KEPT`] kept. (Only this owner writes it while it holds the
        /// epoch, so its record is the item's.)
        given_back: Vec<crate::job::AttemptEntry>,
    },
    /// The call answered, but not with the answer the job's contract asks for: another attempt
    /// is permitted, or, when the contract says so or no budget is left (`last`), the job fails
    /// for good (`invalid_output`). The evidence is recorded on the attempt.
    Invalid {
        /// What was wrong, and the answer's first bytes.
        rejected: Rejected,
        /// The job fails with this attempt.
        last: bool,
    },
    /// The deadline passed during the attempt.
    Expired,
    /// An operator cancelled the job while the attempt ran (`cancel_requested` is set): the
    /// call was stopped, and its answer, if one came, is not accepted. The only end besides
    /// [`AttemptEnd::Expired`] a job with a cancel request takes.
    Cancelled,
}

impl AttemptEnd {
    /// The state the job moves to.
    pub fn target(&self) -> JobState {
        match self {
            AttemptEnd::Succeeded { .. } => JobState::Succeeded,
            AttemptEnd::RetryAuthorized { .. } => JobState::RetryAuthorized,
            AttemptEnd::FailedTerminal { .. } => JobState::FailedTerminal,
            AttemptEnd::Unknown { .. } => JobState::Unknown,
            AttemptEnd::Replay { .. } | AttemptEnd::GivenBack { .. } => JobState::RetryAuthorized,
            AttemptEnd::Invalid { last: true, .. } => JobState::FailedTerminal,
            AttemptEnd::Invalid { last: false, .. } => JobState::RetryAuthorized,
            AttemptEnd::Expired => JobState::Expired,
            AttemptEnd::Cancelled => JobState::Cancelled,
        }
    }

    /// Whether a job with a cancel request may end its attempt so: only as cancelled, or as
    /// expired when its deadline passed first.
    pub(crate) fn allowed_after_cancel(&self) -> bool {
        matches!(self, AttemptEnd::Cancelled | AttemptEnd::Expired)
    }
}

/// The owner at `epoch` ends attempt `attempt`.
///
/// Condition: `running` at exactly `epoch`, with `attempt` the job's current attempt (and, to
/// accept a result, the deadline ahead); with no cancel request unless the end is
/// [`AttemptEnd::allowed_after_cancel`], and [`AttemptEnd::Cancelled`] only with one. The lease is deliberately not part of the condition: see `docs/protocol.md`, "Accepting after a
/// lapsed lease".
#[derive(Debug, Clone, PartialEq)]
pub struct EndRequest {
    /// Job id.
    pub job_id: String,
    /// The owner's epoch.
    pub epoch: u64,
    /// The attempt number being ended.
    pub attempt: u32,
    /// The owner's clock.
    pub now: Millis,
    /// How it ends.
    pub end: AttemptEnd,
    /// What the call used, recorded on the attempt's entry (not on an attempt given back).
    pub usage: Option<crate::job::Usage>,
    /// The job's input, kept by an end that leaves the job live when its item keeps none
    /// ([`crate::job::JobItem::keeps_input`]): a job that failed, ended unknown or gave its
    /// attempt back may be triggered by id, and that delivery reads its input from the item.
    pub input: Option<KeptInput>,
}

/// An input an end of attempt keeps: in the item, or the reference of the object it was
/// stored in first (above `INLINE_MAX_BYTES`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum KeptInput {
    /// Canonical input JSON, in the item.
    Inline(String),
    /// Where it was stored.
    Stored(Box<crate::job::BlobRef>),
}

/// What a settling write expects to find.
#[derive(Debug, Clone, PartialEq)]
pub enum SettleFrom {
    /// No item: it is created already terminal (a message that arrives after its deadline).
    Absent(Box<NewJob>),
    /// Any item that is not terminal and whose deadline is at or before `now`, whoever owns
    /// it (the reconciler's expiry: the deadline is the fence).
    PastDeadline,
    /// The item in `state` at `epoch`.
    Seen {
        /// The state seen.
        state: JobState,
        /// The epoch seen.
        epoch: u64,
    },
}

/// Settles a job that cannot run any more as terminal, without a claim.
///
/// Condition: the item is as `from` says, and not terminal. Effect: the reason's terminal state.
#[derive(Debug, Clone, PartialEq)]
pub struct SettleRequest {
    /// Job id.
    pub job_id: String,
    /// What the writer saw.
    pub from: SettleFrom,
    /// Why.
    pub reason: SettleReason,
    /// The writer's clock.
    pub now: Millis,
}

/// Fences a lapsed owner, or takes an `unknown` job back to ask the provider about it: raises
/// the epoch without starting an attempt.
///
/// Condition: at `seen_epoch`, either `running` with `owner_until <= lapsed_before`, or
/// `unknown`. Effect: `running`, epoch + 1, the new owner and lease, and a recovery record.
#[derive(Debug, Clone, PartialEq)]
pub struct RecoverRequest {
    /// Job id.
    pub job_id: String,
    /// The epoch seen.
    pub seen_epoch: u64,
    /// The recovering owner.
    pub owner_id: String,
    /// The recoverer's clock.
    pub now: Millis,
    /// Leases that ended at or before this instant count as lapsed (now minus the skew margin).
    pub lapsed_before: Millis,
    /// End of the recoverer's lease.
    pub lease_until: Millis,
    /// Why the recovery happened.
    pub reason: String,
    /// How many recoveries the item the recoverer saw holds (only a recovery writes them, and
    /// it raises the epoch it expects): once it holds [`crate::job::RECOVERIES_KEPT`], this one
    /// is counted in `recoveries_dropped` instead of listed.
    pub seen_recoveries: usize,
    /// The job's input, kept by a recovery when the item keeps none (a job recovered on its
    /// second delivery may be triggered by id later, and that delivery reads its input from
    /// the item, as after an end that leaves the job live).
    pub input: Option<KeptInput>,
}

/// The owner at `epoch` extends (or ends) its lease.
///
/// Condition: `running` at exactly `epoch` and, when `expected_until` is given (a heartbeat's
/// renewal), with exactly the lease the owner last wrote and no cancel request: a refusal that
/// shows one tells the owner to stop its call. Effect: `owner_until` set.
///
/// A lapsed lease that nobody took over is renewed: a takeover raises the epoch first, so an
/// unchanged epoch means the job is still the owner's, and renewing saves the call it runs. A
/// lease that changed under the same epoch (the owner's own hand-over ended it) is not
/// extended, so a renewal in flight cannot undo a hand-over.
#[derive(Debug, Clone, PartialEq)]
pub struct RenewRequest {
    /// Job id.
    pub job_id: String,
    /// The owner's epoch.
    pub epoch: u64,
    /// The lease the owner last wrote (the heartbeat's renewals); `None` for the owner's own
    /// end of its lease (a hand-over), which needs no lease to be current.
    pub expected_until: Option<Millis>,
    /// The owner's clock.
    pub now: Millis,
    /// The new end of the lease.
    pub lease_until: Millis,
    /// What the owner says of its call, carried by the same write (`None`: nothing new).
    pub progress: Option<crate::job::CallProgress>,
}

/// Creates a job, `ready`, before its trigger is sent (the producer's outbox).
///
/// Condition: no item. Effect: the job at epoch 0 with no attempts. A refusal returns the item
/// there, whose digest tells an idempotent repeat from a conflict.
#[derive(Debug, Clone, PartialEq)]
pub struct CreateRequest {
    /// The job.
    pub job: NewJob,
    /// The producer's clock.
    pub now: Millis,
    /// Its trigger is in the queue already (the worker creates the item of a message it must
    /// defer): `enqueued_at` is set to `now`, so the reconciler does not send another soon.
    pub enqueued: bool,
}

/// Records that a trigger for a job was sent.
///
/// Condition: not terminal (`ready`, `retry_authorized`, `running` or `unknown`). Effect:
/// `enqueued_at` set (and nothing else, so the job's place in the attention index does not
/// move).
#[derive(Debug, Clone, PartialEq)]
pub struct EnqueuedRequest {
    /// Job id.
    pub job_id: String,
    /// When the trigger was sent.
    pub now: Millis,
}

/// The owner at `epoch` records the reference a provider assigned to its attempt (a background
/// call's id), before it waits for the answer, so that a later owner can ask for it.
///
/// Condition: `running` at exactly `epoch`, on attempt `attempt`. Effect: the attempt's
/// `provider_ref` set. The lease is not part of the condition: a fenced owner is refused by the
/// epoch, and an owner whose lease lapsed unnoticed still holds the only copy of the reference.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordRefRequest {
    /// Job id.
    pub job_id: String,
    /// The owner's epoch.
    pub epoch: u64,
    /// The attempt the reference belongs to.
    pub attempt: u32,
    /// The provider's reference.
    pub provider_ref: String,
    /// The owner's clock.
    pub now: Millis,
    /// The job's input, kept by the same write where the item keeps none: a line of a batch
    /// whose end a webhook announces is collected by a trigger by id, which carries no input.
    pub input: Option<KeptInput>,
}

/// A ledger failure that is not a refused condition. The caller backs off.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LedgerError {
    /// The table refused the request rate.
    #[error("ledger throttled during {operation}")]
    Throttled {
        /// The operation.
        operation: &'static str,
    },
    /// The request failed or its outcome is unknown (timeout, network, service error).
    #[error("ledger unavailable during {operation}: {code}")]
    Unavailable {
        /// The operation.
        operation: &'static str,
        /// The service's error code, or the kind of transport failure.
        code: String,
    },
    /// The table refused the request itself (`ValidationException`, such as an item over
    /// 400 KB): the same request will never succeed, so it is never retried.
    #[error("ledger refused the request during {operation}: {code}")]
    Rejected {
        /// The operation.
        operation: &'static str,
        /// The service's error code.
        code: String,
    },
    /// The stored item cannot be decoded.
    #[error("ledger item {job_id} is malformed: {detail}")]
    Corrupt {
        /// Job id.
        job_id: String,
        /// What is wrong.
        detail: String,
    },
}

/// The ledger's operations. Implementations must keep the conditions documented on each request.
pub trait JobLedger: Send + Sync {
    /// See [`ClaimRequest`].
    fn claim(&self, req: ClaimRequest) -> impl Future<Output = Result<Write, LedgerError>> + Send;
    /// See [`EndRequest`].
    fn end(&self, req: EndRequest) -> impl Future<Output = Result<Write, LedgerError>> + Send;
    /// [`JobLedger::end`] by an owner that holds `known`, the record its claim or recovery
    /// left. When the write accepts an answer, the record it returns is `known` with the end
    /// applied ([`transitions::known_after_end`]), not the item as stored, so that a ledger
    /// need not send the item back: fields that only writes of other kinds change (the lease's
    /// end after renewals, `enqueued_at`, a provider reference recorded since the claim) are as
    /// `known` has them. Refusals are as [`JobLedger::end`]'s.
    fn end_known(
        &self,
        known: &JobItem,
        req: EndRequest,
    ) -> impl Future<Output = Result<Write, LedgerError>> + Send {
        let rebuilt = transitions::known_after_end(known, &req);
        async move {
            match self.end(req).await? {
                Write::Applied(stored) => Ok(Write::Applied(rebuilt.unwrap_or(stored))),
                refused => Ok(refused),
            }
        }
    }
    /// See [`SettleRequest`].
    fn settle(&self, req: SettleRequest)
    -> impl Future<Output = Result<Write, LedgerError>> + Send;
    /// See [`RecoverRequest`].
    fn recover(
        &self,
        req: RecoverRequest,
    ) -> impl Future<Output = Result<Write, LedgerError>> + Send;
    /// See [`RenewRequest`].
    fn renew(&self, req: RenewRequest) -> impl Future<Output = Result<Write, LedgerError>> + Send;
    /// See [`CreateRequest`].
    fn create(&self, req: CreateRequest)
    -> impl Future<Output = Result<Write, LedgerError>> + Send;
    /// See [`EnqueuedRequest`].
    fn mark_enqueued(
        &self,
        req: EnqueuedRequest,
    ) -> impl Future<Output = Result<Write, LedgerError>> + Send;
    /// See [`RecordRefRequest`].
    fn record_ref(
        &self,
        req: RecordRefRequest,
    ) -> impl Future<Output = Result<Write, LedgerError>> + Send;
    /// See [`DecideRequest`].
    fn decide(&self, req: DecideRequest)
    -> impl Future<Output = Result<Write, LedgerError>> + Send;
    /// See [`CancelRequest`].
    fn cancel(&self, req: CancelRequest)
    -> impl Future<Output = Result<Write, LedgerError>> + Send;
    /// A strongly consistent read.
    fn get(
        &self,
        job_id: &str,
    ) -> impl Future<Output = Result<Option<JobItem>, LedgerError>> + Send;
    /// Keeps the request counts a look at the running batch `batch_id` read at `now`, on the
    /// batch's own item (one for all its jobs), for `jobctl watch`. Shown, never relied on: a
    /// ledger may keep none.
    fn note_batch(
        &self,
        batch_id: &str,
        counts: crate::job::BatchCounts,
        now: Millis,
    ) -> impl Future<Output = Result<(), LedgerError>> + Send {
        let _ = (batch_id, counts, now);
        async { Ok(()) }
    }
    /// Keeps the jobs whose lines the provider batch `batch_id` holds, created at `now`, so
    /// that a webhook that says the batch ended can send each job's trigger
    /// ([`pushed::PushedLedger::batch_members`]). Relied on only to be early: a job a lost list
    /// leaves out is still found by its record's next look at the batch. No default: a
    /// wrapper that forgot to pass it on would keep no list, silently.
    fn note_batch_members(
        &self,
        batch_id: &str,
        members: &[crate::job::BatchMember],
        now: Millis,
    ) -> impl Future<Output = Result<(), LedgerError>> + Send;
}

impl AttemptEnd {
    /// The outcome recorded on the attempt.
    pub(crate) fn attempt_outcome(&self) -> crate::job::AttemptOutcome {
        use crate::job::AttemptOutcome;
        match self {
            AttemptEnd::Succeeded { .. } => AttemptOutcome::Succeeded,
            AttemptEnd::RetryAuthorized { .. } => AttemptOutcome::Transient,
            AttemptEnd::GivenBack { why, .. } => *why,
            AttemptEnd::FailedTerminal {
                kind: "permanent", ..
            } => AttemptOutcome::Permanent,
            AttemptEnd::FailedTerminal { .. } => AttemptOutcome::Transient,
            AttemptEnd::Unknown { .. } | AttemptEnd::Replay { .. } => AttemptOutcome::Uncertain,
            AttemptEnd::Invalid { .. } => AttemptOutcome::InvalidOutput,
            AttemptEnd::Expired => AttemptOutcome::Expired,
            AttemptEnd::Cancelled => AttemptOutcome::Cancelled,
        }
    }

    /// The `last_error` recorded on the job, if the end is a failure.
    pub fn error(&self, at: Millis) -> Option<crate::job::ErrorRecord> {
        let (kind, message) = match self {
            AttemptEnd::Succeeded { .. } => return None,
            AttemptEnd::RetryAuthorized { error } => ("transient", error.clone()),
            AttemptEnd::GivenBack { why, error, .. } => (why.as_str(), error.clone()),
            AttemptEnd::FailedTerminal { kind, error } => (*kind, error.clone()),
            AttemptEnd::Unknown { evidence } | AttemptEnd::Replay { evidence, .. } => {
                ("uncertain", evidence.clone())
            }
            AttemptEnd::Invalid { rejected, .. } => ("invalid_output", rejected.to_string()),
            AttemptEnd::Expired => ("deadline", "deadline passed during the attempt".to_owned()),
            AttemptEnd::Cancelled => (
                "cancelled",
                "cancelled by an operator while the attempt ran".to_owned(),
            ),
        };
        Some(crate::job::ErrorRecord {
            kind: kind.to_owned(),
            message,
            at,
        })
    }
}

impl EndRequest {
    /// The decision this end records, if it is one.
    pub fn decision(&self) -> Option<crate::job::DecisionRecord> {
        match &self.end {
            AttemptEnd::Replay { by, .. } => Some(crate::job::DecisionRecord {
                epoch: self.epoch,
                action: "replay".to_owned(),
                by: by.clone(),
                caller: None,
                reason: format!(
                    "attempt {} may have run; the replay policy accepts a possible duplicate call",
                    self.attempt
                ),
                at: self.now,
            }),
            _ => None,
        }
    }
}

impl SettleRequest {
    /// The `last_error` a settling write records.
    pub fn error(&self) -> crate::job::ErrorRecord {
        let message = match self.reason {
            SettleReason::DeadlinePassed => "deadline passed before a result was accepted",
            SettleReason::BudgetSpent => "attempt budget spent",
            SettleReason::SpendLimit => {
                "the next call's estimated cost would take the job past its max_cost"
            }
            SettleReason::InputLost => {
                "the stored input is gone or does not match the job's digest"
            }
            SettleReason::MessageLost => {
                "deadline passed before a result was accepted; the ledger never kept the input, and \
                 no delivery of the job's message came back after its first claim (lost or \
                 dead-lettered)"
            }
        };
        crate::job::ErrorRecord {
            kind: self.reason.kind().to_owned(),
            message: message.to_owned(),
            at: self.now,
        }
    }
}
