//! Why this file is long: it is one model, the protocol's every actor and fault in one state
//! machine, and splitting the actors apart would hide the interleavings it exists to show.
//!
//! The ledger protocol as a `stateright` model: one job item, a few workers, the reconciler and
//! an operator, with every fault as a nondeterministic choice. The item changes only through the
//! ledger's own pure transitions (`ledger::transitions`, the ones the in-memory ledger applies
//! and the property test proves equal to DynamoDB's), and each delivery is the worker's own
//! [`Delivery`], the processor's machine, fed the world's answer to each command it gives, as
//! the processor's executor feeds it: the sequence of a delivery is written once, in
//! `protocol`. What the model adds is the world: which request is answered, lost or failed,
//! what the pacer and the provider say and when time passes, the heartbeat's renewals, the
//! provider's truth and the ghost state the properties read.
//!
//! A [`Mutation`] changes one rule of the protocol, to show that a property bites.

use std::fmt::Write as _;

use fenced_jobs::job::artifact::{RESULTS_PREFIX, result_key};
use fenced_jobs::job::usage::Rate;
use fenced_jobs::job::{
    AttemptOutcome, BlobRef, Failure, JobItem, JobState, Millis, NewJob, RecordOutcome, Route,
};
use fenced_jobs::ledger::transitions::{
    apply_cancel, apply_claim, apply_create, apply_decide, apply_end, apply_record_ref,
    apply_recover, apply_renew, apply_settle,
};
use fenced_jobs::ledger::{
    AttemptEnd, CancelRequest, ClaimRequest, CreateRequest, DecideRequest, EndRequest, KeptInput,
    OperatorAction, RecordRefRequest, SettleFrom, SettleRequest, Write,
};
use fenced_jobs::protocol::ReplayPolicy;
use fenced_jobs::protocol::admission::{Facts, Op, Settle};
use fenced_jobs::protocol::calling::{Bound, CallFacts, CallStep, Said};
use fenced_jobs::protocol::delivery::{Command, Delivery, Lane, Observation};
use fenced_jobs::protocol::ending::{Closed, EndFacts, EndStep, EndWrite, Placed, attempt_end};
use fenced_jobs::protocol::owner::Owner;
use fenced_jobs::protocol::renewal::{RenewalTicks, Renewed, after_renewal};
use fenced_jobs::provider::batch;
use fenced_jobs::provider::openai::classify_status;
use fenced_jobs::provider::{Answer, ProviderError, Retrieval};
use stateright::{Model, Property};

/// Every change of the job's state the checks of this process explored without a mutation:
/// the state before (`[*]`: no item yet) and after, by their names.
static CHANGES: std::sync::Mutex<std::collections::BTreeSet<(&str, &str)>> =
    std::sync::Mutex::new(std::collections::BTreeSet::new());

/// Notes the change of the job's state from `before` to `after`, if any.
fn note_change(before: &State, after: &State) {
    let state = |s: &State| s.item.as_ref().map(|i| i.state);
    let (from, to) = (state(before), state(after));
    if let Some(to) = to
        && from != Some(to)
    {
        let from = from.map_or("[*]", JobState::as_str);
        let mut changes = CHANGES.lock().unwrap_or_else(|p| p.into_inner());
        changes.insert((from, to.as_str()));
    }
}

/// The changes of the job's state the checks of this process explored (see [`CHANGES`]).
pub fn state_changes() -> std::collections::BTreeSet<(&'static str, &'static str)> {
    CHANGES.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

/// The job every state is about.
pub const JOB: &str = "job";
const DIGEST: &str = "digest";
/// How the evidence of a recovery that found no reference to ask about ends.
const NO_REFERENCE: &str = "no reference was recorded";

/// The bounds of one check.
#[derive(Debug, Clone)]
pub struct Bounds {
    /// Workers (each runs one delivery at a time).
    pub workers: usize,
    /// Deliveries in all, each with its own owner id.
    pub deliveries: u8,
    /// The job's deadline, in ticks from 0.
    pub deadline: Millis,
    /// A claim's lease, in ticks.
    pub lease: Millis,
    /// The clock-skew margin, in ticks; each worker's clock is 0 or this far ahead.
    pub skew: Millis,
    /// The job's attempt budget.
    pub max_attempts: u32,
    /// No write may raise the epoch past this.
    pub max_epoch: u64,
    /// Tries at ending an attempt whose write fails (the processor's `END_TRIES`, smaller).
    pub finish_tries: u8,
    /// Provider kinds explored.
    pub upstreams: Vec<Upstream>,
    /// Replay policies explored.
    pub replay: Vec<ReplayPolicy>,
    /// Ledger requests that fail (applied or not) and crashes, in all, on one path.
    pub faults: u8,
    /// A later record of the job may follow a delivery in its batch.
    pub followers: bool,
    /// The pacer may have no capacity for a claim's call (otherwise it grants it at once).
    pub pacing: bool,
    /// An invocation may end a tick after its call leaves, cutting the call or its polling
    /// short (otherwise every invocation outlasts the job).
    pub short_invocations: bool,
    /// A retrieval may say nothing yet (a 401/403, an unreachable provider).
    pub silent_retrievals: bool,
    /// The model may answer with what the job's contract refuses (truncated, invalid), by the
    /// call or a retrieval.
    pub invalid_answers: bool,
    /// The job may cost one call at the most (`max_cost`): every attempt that ran costs one,
    /// at its estimate when its outcome is unknown, and the next call is estimated at one.
    pub spend_limit: bool,
    /// A second provider takes the job in the same delivery after a definite refusal (a
    /// transient failure, a throttle given back): the delivery claims again from the item its
    /// end left, once.
    pub fallback: bool,
    /// An operator may cancel the job at any moment (once).
    pub cancels: bool,
    /// The job's message may be lost for good (dead-lettered and dropped, its retention
    /// passed): from then on only the reconciler's triggers by id come (for a job whose item
    /// keeps its input and that a sparse index holds), and stray ones.
    pub lost_messages: bool,
    /// The job's message may be dead-lettered once, at any moment while its job has an item:
    /// the redrive policy moves it after receives that each wrote nothing (a crash loop). The
    /// reconciler's sweep sends it back while the job is neither terminal nor `unknown`; until
    /// then only triggers by id come, as for a lost message.
    pub dead_letters: bool,
    /// The provider's webhook says the line's batch ended, up to twice, at any moment once the
    /// item records the batch (before and after the job's end): each sends a trigger by id that
    /// an idle worker receives. As the worker does with webhooks, the record of a batch's
    /// reference keeps the input the trigger cannot carry.
    pub webhooks: bool,
    /// The rule changed, if any.
    pub mutation: Option<Mutation>,
}

impl Bounds {
    /// Two workers, three deliveries, two attempts, one fault per path.
    pub fn small() -> Bounds {
        Bounds {
            workers: 2,
            deliveries: 3,
            deadline: 5,
            lease: 2,
            skew: 1,
            max_attempts: 2,
            max_epoch: 4,
            finish_tries: 2,
            upstreams: vec![
                Upstream::Blind,
                Upstream::Keyed,
                Upstream::Background,
                Upstream::Batch,
            ],
            replay: vec![ReplayPolicy::Never, ReplayPolicy::Replay],
            faults: 1,
            followers: true,
            pacing: true,
            short_invocations: true,
            silent_retrievals: true,
            invalid_answers: false,
            spend_limit: false,
            fallback: true,
            cancels: false,
            lost_messages: false,
            dead_letters: false,
            webhooks: false,
            mutation: None,
        }
    }

    /// The bound `make test` checks: the smallest that still shows every property bite, with
    /// the providers that answer the submit ([`Bounds::background`] checks the other, and the
    /// later records of a batch).
    pub fn test() -> Bounds {
        Bounds {
            deliveries: 2,
            deadline: 4,
            upstreams: vec![Upstream::Blind, Upstream::Keyed],
            followers: false,
            pacing: false,
            short_invocations: false,
            silent_retrievals: false,
            fallback: false,
            ..Bounds::small()
        }
    }

    /// The test bound's second part, which `make test` also checks: the provider that runs
    /// calls in the background, without ledger faults, and a later record of the job in a
    /// batch (the model-check bound has all of them together).
    pub fn background() -> Bounds {
        Bounds {
            upstreams: vec![Upstream::Background, Upstream::Batch],
            faults: 0,
            followers: true,
            webhooks: true,
            ..Bounds::test()
        }
    }

    /// The test bound's third part, which `make test` also checks: the pacer's refusals,
    /// invocations that end before the job and answers the job's contract refuses, with a
    /// provider asked by the client's key and no ledger faults (retrievals that say nothing yet
    /// are the model-check bound's).
    pub fn world() -> Bounds {
        Bounds {
            upstreams: vec![Upstream::Keyed],
            faults: 0,
            pacing: true,
            short_invocations: true,
            invalid_answers: true,
            ..Bounds::test()
        }
    }

    /// The test bound's fifth part: a job that may cost one call, whose first answer its
    /// contract may refuse, so that the admission's spend check stops the second call.
    /// One worker: the limit holds over one job's sequence of attempts (a call refused before
    /// work costs nothing, so the job goes on to another); two workers' races are the
    /// conditional claim's, which the other parts check.
    pub fn spend() -> Bounds {
        Bounds {
            workers: 1,
            upstreams: vec![Upstream::Keyed],
            replay: vec![ReplayPolicy::Never],
            faults: 0,
            invalid_answers: true,
            spend_limit: true,
            fallback: true,
            ..Bounds::test()
        }
    }

    /// The test bound's sixth part: an operator's cancel at any moment, with the provider that
    /// runs calls in the background (cancelled upstream), an earlier deadline, a budget of one
    /// attempt, no ledger faults and one replay policy.
    pub fn cancel() -> Bounds {
        Bounds {
            deadline: 3,
            max_attempts: 1,
            upstreams: vec![Upstream::Background],
            replay: vec![ReplayPolicy::Never],
            faults: 0,
            cancels: true,
            ..Bounds::test()
        }
    }

    /// The test bound's seventh part: the job's message lost for good at any moment, one
    /// worker that may crash while it holds the job, one attempt, the provider nobody can ask.
    pub fn lost() -> Bounds {
        Bounds {
            workers: 1,
            deadline: 3,
            max_attempts: 1,
            upstreams: vec![Upstream::Blind],
            replay: vec![ReplayPolicy::Never],
            lost_messages: true,
            ..Bounds::test()
        }
    }

    /// The test bound's eighth part: the job's message dead-lettered at any moment (once) and
    /// swept back, the item keeping its input only where the worker does (never on a message
    /// SQS keeps, but for `unknown`); one worker that may crash while it holds the job, one
    /// attempt, the provider nobody can ask.
    pub fn dead() -> Bounds {
        Bounds {
            lost_messages: false,
            dead_letters: true,
            ..Bounds::lost()
        }
    }

    /// The bound `make model-check` checks for an operator's cancel: three deliveries, a later
    /// deadline, the providers that can be asked about a call and the batch provider, both
    /// replay policies, no ledger faults.
    pub fn full_cancel() -> Bounds {
        Bounds {
            deliveries: 3,
            deadline: 5,
            upstreams: vec![Upstream::Keyed, Upstream::Background, Upstream::Batch],
            faults: 0,
            followers: false,
            pacing: false,
            short_invocations: false,
            silent_retrievals: false,
            fallback: false,
            cancels: true,
            ..Bounds::small()
        }
    }

    /// The bound both `make test` and `make model-check` check for the pacer's re-send of a
    /// call the provider refused for its rate limit: a lease of four ticks, so that a wait of
    /// one still leaves the claim's lease (the one the calling machine holds) more than the
    /// skew margin and a tick to call in; one provider, one replay policy, no ledger faults.
    pub fn resend() -> Bounds {
        Bounds {
            deadline: 5,
            lease: 4,
            upstreams: vec![Upstream::Blind, Upstream::Flex],
            replay: vec![ReplayPolicy::Never],
            faults: 0,
            ..Bounds::test()
        }
    }

    /// The bound `make model-check` checks first (`--workers 3` widens it, at many times the
    /// cost): every provider, later records of a batch, one fault per path (the bucket's and a
    /// recovery's listing among them), retrievals that say nothing yet.
    pub fn full() -> Bounds {
        Bounds {
            pacing: false,
            short_invocations: false,
            ..Bounds::small()
        }
    }

    /// The bound `make model-check` checks second: the pacer's refusals, invocations that end
    /// before the job and answers the job's contract refuses, with the providers that can be
    /// asked about a call, no ledger faults and no later records of a batch.
    pub fn full_world() -> Bounds {
        Bounds {
            upstreams: vec![Upstream::Keyed, Upstream::Background],
            faults: 0,
            followers: false,
            invalid_answers: true,
            ..Bounds::small()
        }
    }

    /// The test bound, in its eight parts: `make model-check` checks them in the release build
    /// (with every mutation), and each names what it adds in its own constructor.
    pub fn test_parts() -> [Bounds; 8] {
        [
            Bounds::test(),
            Bounds::background(),
            Bounds::world(),
            Bounds::resend(),
            Bounds::spend(),
            Bounds::cancel(),
            Bounds::lost(),
            Bounds::dead(),
        ]
    }

    /// The quick bound, which `make test` checks in the debug build: each part of the test
    /// bound with one worker (a fault, a pause or a crash against a redelivery of the same
    /// worker), and the first part with two workers racing, without ledger faults, an earlier
    /// deadline, the client-keyed provider and one replay policy. Together they reach every
    /// example; the mutations' own bounds are the same in both.
    pub fn quick_parts() -> [Bounds; 9] {
        let races = Bounds {
            deadline: 3,
            faults: 0,
            upstreams: vec![Upstream::Keyed],
            replay: vec![ReplayPolicy::Never],
            ..Bounds::test()
        };
        let [test, background, world, resend, spend, cancel, lost, dead] =
            Bounds::test_parts().map(|part| Bounds { workers: 1, ..part });
        [
            races, test, background, world, resend, spend, cancel, lost, dead,
        ]
    }

    /// The full bound, which `make model-check-full` checks (2 h 6 min when last measured): every provider
    /// with a ledger fault per path, then the world, the re-send, the spend limit, a wider
    /// cancel, the lost message and the dead letter in parts of their own.
    pub fn full_parts() -> [Bounds; 7] {
        [
            Bounds::full(),
            Bounds::full_world(),
            Bounds::resend(),
            Bounds::spend(),
            Bounds::full_cancel(),
            Bounds::lost(),
            Bounds::dead(),
        ]
    }

    /// The bounds in one line.
    pub fn describe(&self) -> String {
        format!(
            "{} workers, {} deliveries, deadline {} ticks, lease {}, skew {}, budget {}, epochs up to {}, {} tries to end an attempt, {} fault(s) per path, providers {:?}{}{}{}{}{}{}{}{}{}{}{}",
            self.workers,
            self.deliveries,
            self.deadline,
            self.lease,
            self.skew,
            self.max_attempts,
            self.max_epoch,
            self.finish_tries,
            self.faults,
            self.upstreams,
            if self.followers {
                ", later records of a batch"
            } else {
                ""
            },
            if self.pacing {
                ", the pacer's refusals"
            } else {
                ""
            },
            if self.short_invocations {
                ", invocations that end before the job"
            } else {
                ""
            },
            if self.silent_retrievals {
                ", retrievals that say nothing yet"
            } else {
                ""
            },
            if self.invalid_answers {
                ", answers the contract refuses"
            } else {
                ""
            },
            if self.spend_limit {
                ", a spend limit of one call"
            } else {
                ""
            },
            if self.fallback {
                ", a second provider after a refusal"
            } else {
                ""
            },
            if self.cancels {
                ", an operator's cancel at any moment"
            } else {
                ""
            },
            if self.lost_messages {
                ", a message lost for good"
            } else {
                ""
            },
            if self.dead_letters {
                ", a message dead-lettered and swept back"
            } else {
                ""
            },
            if self.webhooks {
                ", a batch's webhook twice"
            } else {
                ""
            }
        )
    }

    /// The last instant: every clock sees the deadline passed by the margin.
    fn end_of_time(&self) -> Millis {
        self.deadline + 2 * self.skew + 1
    }
}

/// A rule of the protocol changed on purpose, each to show that one property bites.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mutation {
    /// The end of an attempt is not conditional on the owner's epoch (nor its attempt).
    FinishIgnoresEpoch,
    /// The reconciler's expiry does not spare terminal jobs.
    ExpiryIgnoresTerminal,
    /// An uncertain attempt is released to `retry_authorized` with no decision recorded.
    UncertainReleased,
    /// Neither the decision nor the claim's condition looks at the attempt budget.
    NoBudgetCheck,
    /// A record deferred to a live owner is acknowledged.
    AckDeferred,
    /// A claim whose write failed is taken as applied, without reading the item.
    UnconfirmedClaimCalls,
    /// A recovery claim does not check that the lease lapsed.
    RecoveryIgnoresLease,
    /// A worker sends its call without checking that its lease still holds (the processor's
    /// rule before it was found by this checker).
    CallAfterLeaseLapsed,
    /// A claim whose call is never sent ends its attempt as a definite failure, spending it
    /// (the processor's rule before it gave such an attempt back).
    NotSentSpendsAttempt,
    /// A refused answer's stored object is removed even while the job lives (the rule before
    /// the removal waited for the job to end without it).
    DiscardLiveAnswer,
    /// The write of a background call's reference is not conditional on the owner's epoch
    /// (nor its attempt).
    RecordIgnoresEpoch,
    /// A bare 429 (a gateway's, after the call ran) is taken for the provider's own refusal
    /// before any work, and its attempt given back.
    BareThrottleTrusted,
    /// A 408, or a body shaped like the provider's own without its headers (a gateway's, after
    /// the call ran), is taken for a refusal before any work, and the next attempt authorised.
    GatewayTimeoutTrusted,
    /// A recovery that finds no reference takes the lapsed attempt for a definite failure, as
    /// if its owner could not have sent the call.
    RecoveryAssumesNotSent,
    /// An answer whose put failed is accepted by reference all the same.
    PutFailureIgnored,
    /// An answer the job's contract refuses is accepted (the processor does not judge it).
    RefusedAnswerAccepted,
    /// The admission does not count the next call against the job's spend limit.
    SpendLimitIgnored,
    /// A call the provider refused before any work is charged as if it ran (the day's rule
    /// before a refusal gave its reservation back).
    RefusalCharged,
    /// The end of an attempt does not look at a cancel request: an answer is accepted after it.
    CancelIgnored,
    /// The reconciler finds a job past its deadline only in the sparse indexes, which a job on
    /// its first claim is not in (the rule before the due index).
    NoDueWalk,
    /// A first claim never lists its job in the due index, though SQS may drop its message.
    NoDueListing,
    /// The reconciler never sends a live job's dead letter back (the rule before the sweep).
    NoSweep,
}

impl Mutation {
    /// Every mutation.
    pub const ALL: [Mutation; 22] = [
        Mutation::FinishIgnoresEpoch,
        Mutation::ExpiryIgnoresTerminal,
        Mutation::UncertainReleased,
        Mutation::NoBudgetCheck,
        Mutation::AckDeferred,
        Mutation::UnconfirmedClaimCalls,
        Mutation::RecoveryIgnoresLease,
        Mutation::CallAfterLeaseLapsed,
        Mutation::NotSentSpendsAttempt,
        Mutation::DiscardLiveAnswer,
        Mutation::RecordIgnoresEpoch,
        Mutation::BareThrottleTrusted,
        Mutation::GatewayTimeoutTrusted,
        Mutation::RecoveryAssumesNotSent,
        Mutation::PutFailureIgnored,
        Mutation::RefusedAnswerAccepted,
        Mutation::SpendLimitIgnored,
        Mutation::RefusalCharged,
        Mutation::CancelIgnored,
        Mutation::NoDueWalk,
        Mutation::NoDueListing,
        Mutation::NoSweep,
    ];

    /// The bound a mutation is checked in: the test bound, widened where the counterexample
    /// needs more (a lease that lapses well before the deadline, a third delivery), with no
    /// ledger faults, and only the provider and replay policy, where no more is needed, so
    /// that the search stays short.
    pub fn bounds(self) -> Bounds {
        let test = Bounds {
            mutation: Some(self),
            ..Bounds::test()
        };
        match self {
            Mutation::FinishIgnoresEpoch
            | Mutation::RecoveryIgnoresLease
            | Mutation::RecoveryAssumesNotSent => Bounds {
                deadline: 5,
                faults: 0,
                ..test
            },
            Mutation::DiscardLiveAnswer => Bounds {
                deadline: 5,
                faults: 0,
                upstreams: vec![Upstream::Blind],
                replay: vec![ReplayPolicy::Never],
                ..test
            },
            // One worker is enough: a redelivery of the same worker meets what it left.
            Mutation::ExpiryIgnoresTerminal
            | Mutation::UncertainReleased
            | Mutation::BareThrottleTrusted
            | Mutation::GatewayTimeoutTrusted => Bounds { workers: 1, ..test },
            Mutation::NotSentSpendsAttempt => Bounds { faults: 0, ..test },
            Mutation::CancelIgnored => Bounds {
                mutation: Some(self),
                upstreams: vec![Upstream::Blind],
                ..Bounds::cancel()
            },
            Mutation::SpendLimitIgnored | Mutation::RefusalCharged => Bounds {
                mutation: Some(self),
                ..Bounds::spend()
            },
            Mutation::NoDueWalk | Mutation::NoDueListing => Bounds {
                mutation: Some(self),
                ..Bounds::lost()
            },
            Mutation::NoSweep => Bounds {
                mutation: Some(self),
                ..Bounds::dead()
            },
            Mutation::RefusedAnswerAccepted => Bounds {
                faults: 0,
                upstreams: vec![Upstream::Keyed],
                invalid_answers: true,
                ..test
            },
            // A third delivery claims again after the replay policy authorised it.
            Mutation::RecordIgnoresEpoch => Bounds {
                mutation: Some(self),
                deliveries: 3,
                deadline: 5,
                upstreams: vec![Upstream::Background],
                replay: vec![ReplayPolicy::Replay],
                followers: false,
                ..Bounds::background()
            },
            // A third delivery claims again after the replay policy authorised it; a lapsed
            // owner's late call needs a second worker to have recovered the job, the budget
            // only the one.
            Mutation::NoBudgetCheck | Mutation::CallAfterLeaseLapsed => Bounds {
                workers: if self == Mutation::CallAfterLeaseLapsed {
                    2
                } else {
                    1
                },
                deliveries: 3,
                deadline: 5,
                faults: 0,
                upstreams: vec![Upstream::Keyed],
                replay: vec![ReplayPolicy::Replay],
                ..test
            },
            _ => test,
        }
    }

    /// What the mutation changes.
    pub fn describe(self) -> &'static str {
        match self {
            Mutation::FinishIgnoresEpoch => "the end of an attempt is not conditional on the epoch",
            Mutation::ExpiryIgnoresTerminal => "the expiry does not spare terminal jobs",
            Mutation::UncertainReleased => "an uncertain attempt is released with no decision",
            Mutation::NoBudgetCheck => "no attempt budget in the decision or the claim",
            Mutation::AckDeferred => "a deferred record is acknowledged",
            Mutation::UnconfirmedClaimCalls => "a claim whose write failed is taken as applied",
            Mutation::RecoveryIgnoresLease => "a recovery claim does not check the lease",
            Mutation::CallAfterLeaseLapsed => "a call is sent without checking the lease",
            Mutation::NotSentSpendsAttempt => "a call not sent spends its attempt",
            Mutation::DiscardLiveAnswer => "a refused stored answer is removed while the job lives",
            Mutation::RecordIgnoresEpoch => "a reference is recorded without the epoch's condition",
            Mutation::BareThrottleTrusted => "a gateway's bare 429 is taken for the provider's own",
            Mutation::GatewayTimeoutTrusted => "a gateway's 408 is taken for a refusal before work",
            Mutation::RecoveryAssumesNotSent => {
                "a recovery without a reference assumes no call left"
            }
            Mutation::PutFailureIgnored => "an answer whose put failed is accepted by reference",
            Mutation::RefusedAnswerAccepted => "an answer its contract refuses is accepted",
            Mutation::SpendLimitIgnored => "the next call is not counted against the spend limit",
            Mutation::RefusalCharged => "a call refused before any work is charged",
            Mutation::CancelIgnored => "the end of an attempt ignores a cancel request",
            Mutation::NoDueWalk => "the expiry reads only the sparse indexes",
            Mutation::NoDueListing => "a first claim never lists its job in the due index",
            Mutation::NoSweep => "a live job's dead letter is never sent back",
        }
    }

    /// The property the mutation is meant to break, if it breaks one.
    pub fn breaks(self) -> Option<&'static str> {
        Some(match self {
            Mutation::FinishIgnoresEpoch => STALE_WRITE,
            Mutation::ExpiryIgnoresTerminal => ONE_RESULT,
            Mutation::UncertainReleased => NO_SILENT_REPEAT,
            Mutation::NoBudgetCheck => BUDGET,
            Mutation::AckDeferred => ACK_TERMINAL,
            Mutation::UnconfirmedClaimCalls => ATTEMPT_RECORDED,
            Mutation::RecoveryIgnoresLease => LEASE_RESPECTED,
            Mutation::CallAfterLeaseLapsed => NO_SILENT_REPEAT,
            Mutation::NotSentSpendsAttempt => SPENT_BY_CALLS,
            Mutation::DiscardLiveAnswer => STORED_EXISTS,
            Mutation::RecordIgnoresEpoch => REFERENCE_NAMES_CALL,
            Mutation::BareThrottleTrusted => NO_SILENT_REPEAT,
            Mutation::GatewayTimeoutTrusted => NO_SILENT_REPEAT,
            Mutation::RecoveryAssumesNotSent => ENDS_AS_CALLED,
            Mutation::PutFailureIgnored => STORED_EXISTS,
            Mutation::RefusedAnswerAccepted => ENDS_AS_CALLED,
            Mutation::SpendLimitIgnored => SPEND_LIMIT,
            Mutation::RefusalCharged => SPENT_AS_RUN,
            Mutation::CancelIgnored => CANCEL_HOLDS,
            Mutation::NoDueWalk | Mutation::NoDueListing | Mutation::NoSweep => ENDS,
        })
    }
}

/// What really ran, whatever the ledger recorded: every call that may have run, under claims
/// of distinct attempts, costs one.
fn cost_of_calls(s: &State) -> u64 {
    let mut ran: Vec<(u32, u64)> = s
        .calls
        .iter()
        .filter(|c| !matches!(c.truth, Truth::NotRun | Truth::Refused))
        .map(|c| (c.attempt, c.epoch))
        .collect();
    ran.dedup();
    ran.len() as u64
}

/// Property names.
pub const ONE_RESULT: &str = "at most one accepted result, never changed";
/// A refused flex call sent again under the same claim.
pub const FLEX_MOVES_ON: &str =
    "a call on the flex path is sent once per claim: a 429 moves the job on, never re-sent on it";
/// A stale owner's write was applied.
pub const STALE_WRITE: &str = "no write of a stale epoch applied";
/// Attempts over the budget.
pub const BUDGET: &str = "attempts within the budget";
/// A second execution without a definite failure or a decision.
pub const NO_SILENT_REPEAT: &str =
    "an execution beyond the first only after a definite failure or a recorded decision";
/// A record acknowledged while its job was not terminal.
pub const ACK_TERMINAL: &str = "a record acknowledged only when its job is terminal";
/// A call sent with no attempt record of its own.
pub const ATTEMPT_RECORDED: &str = "every execution preceded by its attempt record";
/// A job failed for its budget with an attempt that no call spent.
pub const SPENT_BY_CALLS: &str =
    "failed_terminal for the budget only after max_attempts calls were sent or may have been";
/// An attempt whose end contradicts what its calls did.
pub const ENDS_AS_CALLED: &str = "an attempt ends as its calls did: answered by one that ran with an answer its contract takes, refused for one whose answer it refused, failed or given back only if none may have run";
/// An accepted answer that references a stored object whose object is gone.
pub const STORED_EXISTS: &str = "an accepted answer stored in the bucket is there";
/// A reference in the ledger that names another attempt's call, or a call never started.
pub const REFERENCE_NAMES_CALL: &str =
    "every reference the ledger holds names its own attempt's call, which the provider started";
/// What a job's attempts cost passed its limit.
pub const SPEND_LIMIT: &str = "what a job's attempts cost stays within its spend limit";
/// A live owner fenced before its lease lapsed.
pub const LEASE_RESPECTED: &str = "a running owner is fenced only once its lease lapsed";
/// A job charged for a call that ran nothing.
pub const SPENT_AS_RUN: &str = "a job is charged only for calls that may have run (an estimate only while one's outcome is unknown): one refused before any work costs nothing";
/// A job succeeded after an operator's cancel was written.
pub const CANCEL_HOLDS: &str = "a job never succeeds once its cancel is written";
/// A call left under a claim made after the cancel.
pub const NO_CALL_AFTER_CANCEL: &str =
    "no call leaves once the cancel is written, but one its owner had claimed before";
/// The liveness property.
pub const ENDS: &str = "every job ends terminal, or unknown with evidence";

/// What went wrong, recorded by the step that did it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Violation {
    /// A second, different accepted result, or a terminal item changed.
    ResultChanged,
    /// An owner write at an epoch below the item's was applied.
    StaleWrite,
    /// More attempts than the budget.
    OverBudget,
    /// A call sent while an earlier one may have run, with no decision recorded.
    SilentRepeat,
    /// A record acknowledged while the job was not terminal.
    AckedEarly,
    /// A call sent without its attempt in the item.
    UnrecordedCall,
    /// An answer accepted after the job's cancel was written.
    AcceptedAfterCancel,
    /// A call sent under a claim made after the job's cancel was written.
    CallAfterCancel,
    /// A running owner fenced while its lease still held.
    EarlyFence,
}

/// What the provider did with one call, as only the model knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Truth {
    /// Sent; whether it ran is not settled yet.
    InFlight,
    /// It ran and produced its answer.
    Ran,
    /// It did not run (a definite failure).
    NotRun,
    /// The provider refused it for its rate limit before any work (its own 429): it did not
    /// run, and its sender heard so.
    Refused,
    /// It ran and answered, and the job's contract refused the answer: a definite outcome.
    Invalid,
}

/// Where an owner's answer went, as the world lets it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Put {
    /// In the item.
    Inline,
    /// In the results bucket.
    Stored,
    /// Too large for the item, and the bucket's puts failed: no object.
    Failed,
    /// Too large for the item, and the put's answer was lost with the read after it: the
    /// object is there, and its owner does not know.
    Lost,
}

/// One call sent to the provider.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Call {
    /// The attempt it was sent for.
    pub attempt: u32,
    /// The sender's epoch.
    pub epoch: u64,
    /// What became of it.
    pub truth: Truth,
    /// Its answer could not be stored and was given up, the attempt ending as a transient
    /// failure that says so: a later call is a known repeat, not a silent one.
    pub dropped: bool,
}

/// Where one worker's delivery stands.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Pc {
    /// No delivery.
    Idle,
    /// A delivery, waiting for the world's answer to its command.
    Delivering(Box<Delivering>),
}

/// A delivery in progress: the processor's [`Delivery`], and what the world keeps beside it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Delivering {
    /// The delivery, as the processor runs it.
    pub delivery: Delivery,
    /// The command the world answers next.
    pub command: Command,
    /// While its call is out: the lease the heartbeat last wrote.
    pub lease_until: Millis,
    /// While its call is out: a renewal was refused, and the call is cancelled.
    pub lost: bool,
    /// While its call is out: the renewal's refusal showed an operator's cancel (`lost` is set
    /// too: the call stops).
    pub withdrawn: bool,
    /// While it looks for a lapsed owner's answer: the listing of the results bucket failed,
    /// so what that owner stored is not seen.
    pub unlisted: bool,
    /// The key of the answer it stored (kept only for the mutation that removes it).
    pub stored: Option<String>,
}

/// One worker.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Worker {
    /// Its delivery.
    pub pc: Pc,
    /// Its delivery came from a batch's webhook: a trigger by id.
    pub by_webhook: bool,
    /// Its delivery's owner id (unique per delivery).
    pub owner: u8,
    /// How far its clock runs ahead of the true time.
    pub offset: Millis,
    /// The item as its last delivery left it, for a later record of the job in that batch
    /// (`None`: no such record may follow).
    pub view: Option<Box<JobItem>>,
}

/// Where the job's message is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Letter {
    /// In the work queue.
    InQueue,
    /// Moved to the DLQ by the redrive policy.
    Dead,
    /// Sent back by the reconciler's sweep (once moved, never again within the bound).
    SweptBack,
}

/// The whole system.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct State {
    /// True time.
    pub time: Millis,
    /// What the provider lets a caller know of its calls.
    pub upstream: Upstream,
    /// The replay policy.
    pub replay: ReplayPolicy,
    /// The job's ledger item.
    pub item: Option<JobItem>,
    /// Deliveries so far.
    pub deliveries: u8,
    /// Triggers the batch's webhook sent so far.
    pub webhooks: u8,
    /// Faults so far (failed ledger requests and crashes).
    pub faults: u8,
    /// The workers.
    pub workers: Vec<Worker>,
    /// Every call sent, in order.
    pub calls: Vec<Call>,
    /// The first result accepted.
    pub accepted: Option<String>,
    /// The keys of the answers stored in the results bucket.
    pub bucket: Vec<String>,
    /// A later record of a batch was acknowledged from the item its first record left.
    pub followed: bool,
    /// A record waited for its line's running batch, nothing written (marks the state right
    /// after, for its example only).
    pub batch_waited: bool,
    /// Second claims in one delivery, for a second provider after a refusal.
    pub hops: u8,
    /// The item's epoch once an operator's cancel was written (a request, or the end).
    pub cancel_epoch: Option<u64>,
    /// The job's message is lost for good.
    pub lost: bool,
    /// Where the job's message is: in the queue, in the DLQ, or swept back.
    pub letter: Letter,
    /// What went wrong.
    pub violations: Vec<Violation>,
}

/// What the provider lets a caller know of its calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Upstream {
    /// Nothing: a call's outcome is what its caller heard.
    Blind,
    /// A later owner can ask about a call by the reference the client gave it, which the claim
    /// records (an idempotency key).
    Keyed,
    /// The provider may run a call in the background under a reference it assigns after the
    /// submit (the OpenAI Responses API's background mode): the owner records it, then polls.
    Background,
    /// The provider's batch interface (a deferrable job): the claim records the line's pending
    /// reference, the submit says the batch that holds it, and the owner records that and
    /// hands the job over while the batch runs; a later delivery reads the line.
    Batch,
    /// A call nobody can ask about, on the flex path the worker chose at the claim (which
    /// records it): a 429 moves the job on, its attempt given back at once and never sent
    /// again on that path.
    Flex,
}

impl State {
    /// The job's own message is in the work queue: neither lost nor in the DLQ.
    fn queued(&self) -> bool {
        !self.lost && self.letter != Letter::Dead
    }

    /// A later owner can ask the provider about a call by its reference.
    fn retrievable(&self) -> bool {
        !matches!(self.upstream, Upstream::Blind | Upstream::Flex)
    }
}

/// The reference of the call of `attempt` at `epoch`: the client's key, or the one a
/// background provider assigns (the model's provider names its calls as the client does).
fn call_ref(attempt: u32, epoch: u64) -> String {
    format!("{JOB}/{attempt}@{epoch}")
}

/// The batch reference of the call of `attempt` at `epoch`: pending (as the claim records it),
/// or in the batch the submit named.
fn line_ref(attempt: u32, epoch: u64, pending: bool) -> String {
    let line = batch::line_id(JOB, attempt, epoch);
    if pending {
        batch::pending_ref(&line)
    } else {
        batch::batch_ref("batch_1", &line)
    }
}

/// A fault on a ledger request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fault {
    /// Answered.
    None,
    /// Applied, and the answer lost (a timeout after the write).
    Lost,
    /// Failed without being applied.
    Failed,
}

/// What the provider says to a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Word {
    /// The answer: it ran.
    Answer,
    /// A definite transient failure: it did not run.
    Transient,
    /// A definite permanent failure: it did not run.
    Permanent,
    /// Refused for the rate limit before any work (a 429): it did not run, and the attempt is
    /// given back.
    Throttled,
    /// Nothing that proves whether it ran: the model's provider answers a bare 429, as a
    /// retrying gateway does after forwarding (the provider client classifies it, as it does a
    /// dropped connection): it may have run.
    Uncertain,
    /// No word before the job's deadline, which bounds the call: it is cut off, and may have
    /// run.
    PastDeadline,
    /// No word before the invocation's end (less its margin), which bounds the call: it is cut
    /// off, and may have run.
    CutOff,
    /// Accepted to run in the background under the reference the provider assigns.
    Started,
    /// A batch's create whose answer was lost: the line may be in a batch, which the owner
    /// cannot name (it records the line's pending reference; listing finds the batch).
    StartedUnseen,
    /// No batch holds the line (the gathering gave up, or the batch was refused for now):
    /// nothing ran.
    NotSent,
    /// An answer the job's contract refuses (cut off, not JSON, invalid): it ran, and its
    /// outcome is known.
    Invalid,
}

/// What a later owner learns by asking about a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Retrieved {
    /// Completed with its answer.
    Completed,
    /// Failed definitely.
    Failed,
    /// Still running.
    Running,
    /// The provider does not know it.
    NotFound,
    /// The provider refused to say (401/403): nothing is known yet.
    Denied,
    /// The provider could not be reached, or the retrieval stalled: nothing is known yet.
    Unreachable,
    /// Completed with an answer the job's contract refuses.
    Invalid,
}

impl Retrieved {
    /// What a retrieval may find (the last two only where the bound lets retrievals say
    /// nothing).
    const ALL: [Retrieved; 6] = [
        Retrieved::Completed,
        Retrieved::Failed,
        Retrieved::Running,
        Retrieved::NotFound,
        Retrieved::Denied,
        Retrieved::Unreachable,
    ];
}

/// One event.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Action {
    /// Time passes (any worker may be paused through it).
    Tick,
    /// A copy of the job's message reaches an idle worker: the first delivery, a redelivery
    /// after a failure or a crash, a duplicate of one still in flight, or the reconciler's
    /// re-trigger (they differ only in when they come, and the model lets them come at any
    /// time).
    Deliver {
        /// The worker.
        worker: usize,
    },
    /// A later record of the same job in the batch of the worker's last delivery (a duplicate
    /// message, or the reconciler's re-trigger, received with it) decides from the item as that
    /// delivery left it, with no ledger or provider call.
    Follow {
        /// The worker.
        worker: usize,
    },
    /// The batch's webhook says it ended: an idle worker receives the trigger by id it sent.
    Webhook {
        /// The worker.
        worker: usize,
    },
    /// The pacer answers the worker's request for capacity: granted, or none within its
    /// horizon (the record then waits in the queue, its item created on a first sight).
    Admit {
        /// The worker.
        worker: usize,
        /// Capacity granted.
        granted: bool,
    },
    /// The worker's next ledger request, with its fault.
    Step {
        /// The worker.
        worker: usize,
        /// The fault.
        fault: Fault,
    },
    /// The worker sends its call (`false`: too little time is left, so it is not sent).
    Send {
        /// The worker.
        worker: usize,
        /// Sent.
        sent: bool,
        /// The invocation ends a tick after the call leaves (before the job's deadline, it
        /// bounds the call and the polling); otherwise it outlasts the job.
        short: bool,
    },
    /// The provider answers the worker's call.
    Answer {
        /// The worker.
        worker: usize,
        /// What it says.
        word: Word,
    },
    /// The pacer lets the call the provider refused go again (`false`: not in time).
    Resend {
        /// The worker.
        worker: usize,
        /// Sent again.
        resent: bool,
    },
    /// The worker's heartbeat renews its lease.
    Renew {
        /// The worker.
        worker: usize,
        /// The fault.
        fault: Fault,
    },
    /// The owner puts the answer it is about to accept: in the item, or stored in the results
    /// bucket first, or, too large for the item, not stored at all.
    Place {
        /// The worker.
        worker: usize,
        /// Where the answer went.
        put: Put,
    },
    /// A recovering worker asks about the lapsed attempt's call.
    Ask {
        /// The worker.
        worker: usize,
        /// What the provider says.
        said: Retrieved,
    },
    /// A recovering worker's listing of the results bucket fails: it does not see the answer
    /// the lapsed owner stored, and asks the provider as if nothing were stored.
    Unlisted {
        /// The worker.
        worker: usize,
    },
    /// The worker's process dies; its message comes back.
    Crash {
        /// The worker.
        worker: usize,
    },
    /// The reconciler expires the job past its deadline.
    Expire,
    /// An operator decides about an `unknown` job.
    Decide(OperatorAction),
    /// An operator cancels the job: at once if nobody runs it, else by a request its owner
    /// carries out.
    Cancel,
    /// The job's message is lost for good: dead-lettered and dropped, or its retention passed.
    Lose,
    /// The redrive policy moves the job's message to the DLQ.
    DeadLetter,
    /// The reconciler's sweep sends the job's dead letter back to the work queue.
    Sweep,
    /// The provider says whether the batch of the line a worker's recovery would fence still
    /// runs (only while the line's call may still be running can it say so).
    Batch {
        /// The worker.
        worker: usize,
        /// The batch still runs: the record waits, nothing written.
        running: bool,
    },
}

/// The protocol under `bounds`.
#[derive(Debug, Clone)]
pub struct Protocol {
    /// The bounds.
    pub bounds: Bounds,
}

impl Protocol {
    fn job(&self) -> NewJob {
        NewJob {
            class: Default::default(),
            job_id: JOB.to_owned(),
            input_digest: DIGEST.to_owned(),
            contract: "c".to_owned(),
            input: "{}".to_owned(),
            input_ref: None,
            metadata: None,
            deadline_at: self.bounds.deadline,
            max_attempts: self.bounds.max_attempts,
            max_cost_micros: self.bounds.spend_limit.then_some(1),
            expires_at: 0,
        }
    }

    /// What a retrieval may find in this bound.
    fn retrievals(&self) -> impl Iterator<Item = Retrieved> + use<> {
        let n = if self.bounds.silent_retrievals { 6 } else { 4 };
        let invalid = self.bounds.invalid_answers.then_some(Retrieved::Invalid);
        Retrieved::ALL[..n].iter().copied().chain(invalid)
    }

    fn mutated(&self, m: Mutation) -> bool {
        self.bounds.mutation == Some(m)
    }

    fn faults(&self, state: &State) -> &'static [Fault] {
        if state.faults < self.bounds.faults {
            &[Fault::None, Fault::Lost, Fault::Failed]
        } else {
            &[Fault::None]
        }
    }

    /// The provider said whether the batch of the line the worker's recovery would fence still
    /// runs; `None` when the worker does not wait for it.
    fn batch(
        &self,
        next: &mut State,
        worker: usize,
        running: bool,
        note: &mut String,
    ) -> Option<()> {
        let delivering = Self::waiting(next, worker, |c| *c == Command::LookAtBatch)?;
        note.push_str(if running {
            "asks about the line's batch: it still runs"
        } else {
            "asks about the line's batch: it ended"
        });
        next.batch_waited = running;
        self.feed(
            next,
            worker,
            delivering,
            Observation::BatchRunning(running),
            note,
        );
        Some(())
    }

    /// The effect of `action` on `state`, with a line saying what happened, or `None` when the
    /// action does not apply (or would pass a bound).
    pub fn step(&self, state: &State, action: &Action) -> Option<(State, String)> {
        let mut next = state.clone();
        let mut note = String::new();
        // Marks the state right after an acknowledged later record, for its example only.
        next.followed = false;
        next.batch_waited = false;
        if let Action::Step { fault, .. } | Action::Renew { fault, .. } = *action
            && fault != Fault::None
        {
            next.faults += 1;
        }
        if let Action::Crash { .. }
        | Action::Unlisted { .. }
        | Action::Place {
            put: Put::Failed | Put::Lost,
            ..
        } = action
        {
            next.faults += 1;
        }
        let done = match *action {
            Action::Tick => {
                next.time += 1;
                note.push_str("time passes");
                true
            }
            Action::Deliver { worker } => {
                // Past the bound (fairness at the end of time) deliveries share one owner id:
                // past the deadline nobody claims, so the id is never written.
                if next.deliveries < self.bounds.deliveries {
                    next.deliveries += 1;
                    next.workers[worker].owner = next.deliveries;
                } else {
                    next.workers[worker].owner = 0;
                }
                note.push_str("receives the message");
                next.workers[worker].view = None;
                next.workers[worker].by_webhook = false;
                self.start(&mut next, worker, &mut note);
                true
            }
            Action::Webhook { worker } => self.webhook(&mut next, worker, &mut note),
            Action::Follow { worker } => {
                let view = next.workers[worker].view.take()?;
                next.deliveries += 1;
                next.workers[worker].owner = next.deliveries;
                let now = self.now(&next, worker);
                let outcome =
                    fenced_jobs::protocol::admission::follow(&view, DIGEST, now, self.bounds.skew);
                note.push_str("a later record of the batch follows the item as it was left");
                next.followed |= outcome.is_success();
                self.report(&mut next, worker, &outcome, &mut note);
                next.workers[worker].view = None;
                true
            }
            Action::Admit { worker, granted } => {
                let delivering = Self::waiting(&next, worker, |c| *c == Command::Take)?;
                let said = if granted {
                    note.push_str("gets capacity for its call");
                    Observation::Taken
                } else {
                    note.push_str("gets no capacity for its call in time");
                    Observation::NoCapacity { wait_ms: 1 }
                };
                self.feed(&mut next, worker, delivering, said, &mut note);
                true
            }
            Action::Step { worker, fault } => self.ledger_step(&mut next, worker, fault, &mut note),
            Action::Send {
                worker,
                sent,
                short,
            } => self.send(&mut next, worker, sent, short, &mut note),
            Action::Answer { worker, word } => self.answer(&mut next, worker, word, &mut note),
            Action::Renew { worker, fault } => self.renew(&mut next, worker, fault, &mut note),
            Action::Resend { worker, resent } => self.resend(&mut next, worker, resent, &mut note),
            Action::Ask { worker, said } => self.ask(&mut next, worker, said, &mut note),
            Action::Place { worker, put } => self.place(&mut next, worker, put, &mut note),
            Action::Unlisted { worker } => {
                let Pc::Delivering(d) = &mut next.workers[worker].pc else {
                    return None;
                };
                if d.command != Command::LookForAnswer {
                    return None;
                }
                d.unlisted = true;
                note.push_str("lists the results bucket: the request fails");
                true
            }
            Action::Crash { worker } => {
                next.workers[worker].pc = Pc::Idle;
                note.push_str("crashes; its message will come back");
                true
            }
            Action::Expire => {
                let req = SettleRequest {
                    job_id: JOB.to_owned(),
                    from: SettleFrom::PastDeadline,
                    reason: fenced_jobs::job::decision::SettleReason::DeadlinePassed,
                    now: next.time - self.bounds.skew,
                };
                let before = next.item.clone();
                let applied = if self.mutated(Mutation::ExpiryIgnoresTerminal) {
                    // As if the condition did not ask for a non-terminal item.
                    let mut unfenced = before.clone();
                    if let Some(r) = unfenced.as_mut() {
                        r.state = JobState::Ready;
                    }
                    apply_settle(unfenced.as_ref(), &req)
                } else {
                    apply_settle(before.as_ref(), &req)
                };
                match applied {
                    Some(after) => {
                        self.commit(&mut next, after, None);
                        note.push_str("expires the job past its deadline");
                        true
                    }
                    None => false,
                }
            }
            Action::Decide(action) => {
                let item = next.item.clone()?;
                let req = DecideRequest {
                    job_id: JOB.to_owned(),
                    epoch: item.owner_epoch,
                    action,
                    by: "operator".to_owned(),
                    caller: None,
                    reason: "decided".to_owned(),
                    now: next.time,
                };
                let after = apply_decide(Some(&item), &req)?;
                self.commit(&mut next, after, None);
                let _ = write!(note, "decides: {}", action.as_str());
                true
            }
            Action::Batch { worker, running } => {
                self.batch(&mut next, worker, running, &mut note)?;
                true
            }
            Action::Lose => {
                next.lost = true;
                note.push_str("the job's message is lost for good");
                true
            }
            Action::DeadLetter => {
                next.letter = Letter::Dead;
                note.push_str("the redrive policy moves the job's message to the DLQ");
                true
            }
            Action::Sweep => {
                next.letter = Letter::SweptBack;
                note.push_str("sends the job's dead letter back to the work queue");
                true
            }
            Action::Cancel => {
                let item = next.item.clone()?;
                let req = CancelRequest {
                    job_id: JOB.to_owned(),
                    seen: item.state,
                    epoch: item.owner_epoch,
                    by: "operator".to_owned(),
                    caller: None,
                    reason: "cancelled".to_owned(),
                    now: next.time,
                };
                let after = apply_cancel(Some(&item), &req)?;
                next.cancel_epoch = Some(after.owner_epoch);
                self.commit(&mut next, after, None);
                note.push_str(if req.immediate() {
                    "cancels the job"
                } else {
                    "asks the running job's owner to cancel it"
                });
                true
            }
        };
        if !done {
            return None;
        }
        let too_far = next
            .item
            .as_ref()
            .is_some_and(|r| r.owner_epoch > self.bounds.max_epoch);
        (!too_far).then_some((next, note))
    }

    /// Applies a write's result to the item, recording a changed result or a changed terminal
    /// item, and a stale owner's write (`epoch`: the epoch the writer acted on).
    fn commit(&self, next: &mut State, after: JobItem, epoch: Option<u64>) {
        let after = normalized(after);
        if let Some(before) = &next.item {
            if before.state.is_terminal() && *before != after {
                next.violations.push(Violation::ResultChanged);
            }
            if next.cancel_epoch.is_some()
                && after.state == JobState::Succeeded
                && before.state != JobState::Succeeded
            {
                next.violations.push(Violation::AcceptedAfterCancel);
            }
            if epoch.is_some_and(|e| e < before.owner_epoch) {
                next.violations.push(Violation::StaleWrite);
            }
            // A running item's epoch raised is a recovery: only once the owner's lease lapsed,
            // whatever the clocks (the owner wrote its lease by its own clock, at most the skew
            // ahead; the recovery compares by its own, less the skew).
            if before.state == JobState::Running
                && after.owner_epoch > before.owner_epoch
                && before.owner_until.is_some_and(|until| until > next.time)
            {
                next.violations.push(Violation::EarlyFence);
            }
        }
        if after.state == JobState::Succeeded {
            let result = after
                .result
                .clone()
                .or_else(|| after.result_ref.as_ref().map(|r| r.sha256.clone()))
                .unwrap_or_default();
            match &next.accepted {
                Some(first) if *first != result => next.violations.push(Violation::ResultChanged),
                Some(_) => {}
                None => next.accepted = Some(result),
            }
        }
        next.item = Some(after);
    }

    fn now(&self, state: &State, worker: usize) -> Millis {
        state.time + state.workers[worker].offset
    }

    /// A delivery starts: the processor's, from the message alone.
    /// The batch's webhook sends a trigger by id, which the idle `worker` receives.
    fn webhook(&self, next: &mut State, worker: usize, note: &mut String) -> bool {
        // Its own owner ids, past every delivery's.
        next.webhooks += 1;
        next.workers[worker].owner = 100 + next.webhooks;
        next.workers[worker].view = None;
        next.workers[worker].by_webhook = true;
        note.push_str("receives the trigger by id the batch's webhook sent");
        self.start(next, worker, note);
        true
    }

    fn start(&self, next: &mut State, worker: usize, note: &mut String) {
        let now = self.now(next, worker);
        let owner = format!("d{}", next.workers[worker].owner);
        let lanes = self.lanes(next, next.workers[worker].by_webhook);
        let (delivery, command) = Delivery::start(owner, DIGEST.to_owned(), lanes, None, now);
        let delivering = Delivering {
            delivery,
            command: Command::Take,
            lease_until: 0,
            lost: false,
            withdrawn: false,
            unlisted: false,
            stored: None,
        };
        self.drive(next, worker, delivering, command, note);
    }

    /// The deployment's providers, as a delivery knows them: one, or two when the bound lets
    /// the second take a job the first refused (the model's claims name no provider, so the
    /// first is always the one a job's attempt ran at, and the second takes it once).
    fn lanes(&self, state: &State, by_id: bool) -> Vec<Lane> {
        let lane = |name: &str| Lane {
            name: name.to_owned(),
            serves: true,
            admission: self.facts(state, by_id),
            call: self.call_facts(state),
            end: self.end_facts(state),
        };
        match self.bounds.fallback {
            true => vec![lane("first"), lane("second")],
            false => vec![lane("first")],
        }
    }

    /// What the admission knows before anything is read.
    fn facts(&self, next: &State, by_id: bool) -> Facts {
        Facts {
            deadline_at: self.bounds.deadline,
            skew: self.bounds.skew,
            // The time left for a call is the world's choice when it is sent (`Send`).
            latest_call_start: Millis::MAX,
            can_retrieve: next.retrievable(),
            in_ledger: false,
            // Under a spend limit, a call is estimated at the one it may cost.
            next_call_micros: u64::from(
                self.bounds.spend_limit && !self.mutated(Mutation::SpendLimitIgnored),
            ),
            max_cost_micros: self.bounds.spend_limit.then_some(1),
            // The job's own message carries the input; once it is lost, a trigger by id carries
            // what the item keeps.
            // A webhook's trigger is by id.
            carries_input: (next.queued() && !by_id)
                || next.item.as_ref().is_some_and(JobItem::keeps_input),
        }
    }

    /// What the processor knows when it ends an attempt.
    fn end_facts(&self, state: &State) -> EndFacts {
        EndFacts {
            skew: self.bounds.skew,
            lease_ms: self.bounds.lease,
            invocation_end: Millis::MAX,
            can_retrieve: state.retrievable(),
            replay: state.replay,
            tries: u32::from(self.bounds.finish_tries),
            // Any interleaving may fall in a pause: the world's choice, not a time.
            first_pause_ms: 0,
            batch_poll_ms: self.bounds.lease,
        }
    }

    /// Carries out the delivery's `command` and those after it as far as the world lets them
    /// go at once, then leaves the worker waiting for the world's answer to the next. At once:
    /// capacity when the bound has no pacing, what was taken released or charged, the pacer's pause after a 429
    /// (none beyond the provider's), the pause between two retrievals and a cancel (any
    /// interleaving may fall in them), and the delivery's end.
    fn drive(
        &self,
        next: &mut State,
        worker: usize,
        mut delivering: Delivering,
        mut command: Command,
        note: &mut String,
    ) {
        let now = self.now(next, worker);
        loop {
            let d = &mut delivering.delivery;
            let hop = d.hop();
            command = match command {
                Command::Take if !self.bounds.pacing => d.observe(Observation::Taken, now),
                Command::Release | Command::Charge { .. } => d.observe(Observation::Carried, now),
                // As the worker: the input its delivery carries (an admission that writes on
                // an item that keeps none has it), kept only where SQS may drop the message.
                Command::KeepInput => {
                    let unknown = matches!(
                        d.end_write(now),
                        Some(EndWrite::End(req)) if req.end.target() == JobState::Unknown
                    );
                    let input = (self.bounds.lost_messages || unknown)
                        .then(|| KeptInput::Inline(self.job().input));
                    d.observe(Observation::Kept(input), now)
                }
                Command::Call(CallStep::Throttled { .. }) => {
                    d.observe(Observation::Paced { paused_until: now }, now)
                }
                Command::Call(CallStep::Pause { .. }) => d.observe(Observation::Paused, now),
                Command::Call(CallStep::CancelUpstream) => {
                    note.push_str("; cancels the call upstream");
                    d.observe(Observation::CancelledUpstream, now)
                }
                Command::Done(closed) => {
                    self.closed(next, worker, &delivering, &closed, note);
                    return;
                }
                command => {
                    if let Command::Call(CallStep::Submit { .. }) = command {
                        // The call leaves (a first send, or a re-send after a 429).
                        let claimed = d.owner().cloned().expect("a call has its owner");
                        let owner = d.owner_id();
                        self.call_leaves(next, &owner, &claimed);
                    }
                    if !matches!(command, Command::Call(_)) {
                        // Nothing of a call is kept once it ended.
                        (delivering.lease_until, delivering.lost) = (0, false);
                        delivering.withdrawn = false;
                    }
                    if command != Command::LookForAnswer {
                        delivering.unlisted = false;
                    }
                    delivering.command = command;
                    next.workers[worker].pc = Pc::Delivering(Box::new(delivering));
                    return;
                }
            };
            if delivering.delivery.hop() != hop {
                note.push_str("; the next provider takes the job in the same delivery");
                next.hops += 1;
            }
        }
    }

    /// The delivery ended (`closed`): a refused answer's object removed as it says (or, under
    /// the mutation, a stored answer whose acceptance was refused), and the record reported.
    fn closed(
        &self,
        next: &mut State,
        worker: usize,
        delivering: &Delivering,
        closed: &Closed,
        note: &mut String,
    ) {
        let discard = match (&closed.discard, &delivering.stored) {
            (Some(blob), _) => Some(blob.key.clone()),
            (None, Some(key)) if closed.refused && self.mutated(Mutation::DiscardLiveAnswer) => {
                Some(key.clone())
            }
            _ => None,
        };
        if let Some(key) = discard {
            next.bucket.retain(|k| *k != key);
            note.push_str("; removes the refused answer's object");
        }
        self.report(next, worker, &closed.outcome, note);
    }

    /// The worker's delivery, if it waits for the world to answer `wanted`.
    fn waiting(next: &State, worker: usize, wanted: fn(&Command) -> bool) -> Option<Delivering> {
        match &next.workers[worker].pc {
            Pc::Delivering(d) if wanted(&d.command) => Some((**d).clone()),
            _ => None,
        }
    }

    /// Feeds `observation` to the worker's delivery at its clock's now, and drives it on.
    fn feed(
        &self,
        next: &mut State,
        worker: usize,
        mut delivering: Delivering,
        observation: Observation,
        note: &mut String,
    ) {
        let now = self.now(next, worker);
        let command = delivering.delivery.observe(observation, now);
        self.drive(next, worker, delivering, command, note);
    }

    /// What a refusal or a read showed, as the delivery is told it: under the mutation that
    /// skips the budget check, an item not its own claim shows no limit on attempts.
    fn seen(&self, d: &Delivery, seen: Option<JobItem>) -> Option<JobItem> {
        let owner = d.owner_id();
        seen.map(|mut seen| {
            let ours = d.admission().is_some_and(|a| a.ours(&seen, &owner));
            if !ours && self.mutated(Mutation::NoBudgetCheck) {
                seen.max_attempts = u32::MAX;
            }
            seen
        })
    }

    /// The delivery ends with `outcome`: acknowledged (deleted) or visible again.
    fn report(&self, next: &mut State, worker: usize, outcome: &RecordOutcome, note: &mut String) {
        let deferred = matches!(outcome, RecordOutcome::Failed(Failure::Deferred { .. }));
        let ack = outcome.is_success() || (deferred && self.mutated(Mutation::AckDeferred));
        if ack {
            if !next.item.as_ref().is_some_and(|r| r.state.is_terminal()) {
                next.violations.push(Violation::AckedEarly);
            }
            let _ = write!(note, "; record {}: acknowledged", outcome.label());
        } else {
            let _ = write!(note, "; record {}: back in the queue", outcome.label());
        }
        next.workers[worker].pc = Pc::Idle;
        // A later record of the job in this batch decides from the item as this one left it
        // (the processor's view is the item as last seen: no older view shows it terminal).
        if self.bounds.followers && next.deliveries < self.bounds.deliveries {
            next.workers[worker].view = next.item.clone().map(|r| Box::new(normalized(r)));
        }
        // With the deliveries used up, no later record comes: the views are forgotten, so
        // that states differing only there are explored once.
        if next.deliveries >= self.bounds.deliveries {
            for w in &mut next.workers {
                w.view = None;
            }
        }
    }

    /// A worker's next ledger request.
    fn ledger_step(
        &self,
        next: &mut State,
        worker: usize,
        fault: Fault,
        note: &mut String,
    ) -> bool {
        let Some(delivering) = Self::waiting(next, worker, |c| {
            matches!(
                c,
                Command::Write(_)
                    | Command::ReadBack { .. }
                    | Command::Call(CallStep::Record)
                    | Command::End(EndStep::Write { .. })
            )
        }) else {
            return false;
        };
        let now = self.now(next, worker);
        let d = &delivering.delivery;
        let observation = match &delivering.command {
            Command::Write(op) => {
                return self.write_op(next, worker, delivering.clone(), *op, fault, note);
            }
            Command::ReadBack { .. } if fault != Fault::None => {
                note.push_str("reads the item after a failed write: the read fails too");
                Observation::ReadFailed
            }
            Command::ReadBack { .. } => {
                let seen = next.item.clone();
                let ours = seen
                    .as_ref()
                    .is_some_and(|s| d.admission().is_some_and(|a| a.ours(s, &d.owner_id())));
                note.push_str(if ours {
                    "reads the item: its own write was applied"
                } else {
                    "reads the item: its write was not applied"
                });
                Observation::Read(self.seen(d, seen))
            }
            Command::Call(_) => {
                let Some(machine) = d.calling() else {
                    return false;
                };
                let mut req = machine.record(now);
                // With webhooks, the record of a batch's reference keeps the input (the
                // worker's executor decides it, as here).
                let announced =
                    batch::parse_ref(&req.provider_ref).is_some_and(|(b, _)| b.is_some());
                if self.bounds.webhooks && announced && !machine.owner().keeps_input() {
                    req.input = Some(KeptInput::Inline(self.job().input));
                }
                let _ = write!(note, "records the reference of attempt {}", req.attempt);
                let answer = self.write(next, |c| self.record_ref(c, &req), fault, Some(req.epoch));
                note.push_str(heard(&answer));
                Observation::Recorded(answer)
            }
            _ => match self.end_write(next, d, fault, now, note) {
                Some(observation) => observation,
                None => return false,
            },
        };
        self.feed(next, worker, delivering, observation, note);
        true
    }

    /// The write the worker's ending asks for, applied with its fault: what it heard.
    fn end_write(
        &self,
        next: &mut State,
        d: &Delivery,
        fault: Fault,
        now: Millis,
        note: &mut String,
    ) -> Option<Observation> {
        let epoch = Some(d.owner()?.owner_epoch);
        let answer = match d.end_write(now)? {
            EndWrite::End(req) => {
                let req = self.mutated_end(req, next.item.as_ref(), next.replay);
                let _ = write!(
                    note,
                    "ends attempt {} as {}",
                    req.attempt,
                    req.end.target().as_str()
                );
                let ran = next.calls.iter().any(|c| {
                    (c.attempt, Some(c.epoch)) == (req.attempt, epoch)
                        && !matches!(c.truth, Truth::NotRun | Truth::Refused)
                });
                self.write(next, |c| self.end(c, &req, ran), fault, epoch)
            }
            EndWrite::Renew(req) if req.lease_until == now => {
                note.push_str("ends its own lease: the call still runs upstream");
                self.write(next, |c| apply_renew(c, &req), fault, epoch)
            }
            EndWrite::Renew(req) => {
                note.push_str("renews its lease before trying again");
                self.write(next, |c| apply_renew(c, &req), fault, epoch)
            }
        };
        note.push_str(heard(&answer));
        Some(Observation::Answered(answer))
    }

    /// One conditional write with its fault: what the writer hears (`None`: the request
    /// failed, applied or not).
    fn write(
        &self,
        next: &mut State,
        apply: impl FnOnce(Option<&JobItem>) -> Option<JobItem>,
        fault: Fault,
        epoch: Option<u64>,
    ) -> Option<Write> {
        if fault == Fault::Failed {
            return None;
        }
        let heard = match apply(next.item.as_ref()).map(normalized) {
            Some(after) => {
                self.commit(next, after.clone(), epoch);
                Write::Applied(after)
            }
            None => Write::Refused(next.item.clone()),
        };
        (fault == Fault::None).then_some(heard)
    }

    /// The end `req` applied to `current`; `ran`: whether a call of the attempt may have run.
    fn end(&self, current: Option<&JobItem>, req: &EndRequest, ran: bool) -> Option<JobItem> {
        // As the processor records it: every attempt that may have run costs one (at its
        // estimate when its outcome is unknown); one given back, or whose call the provider
        // refused before any work, ran nothing and costs nothing.
        let priced;
        let charged = ran || self.mutated(Mutation::RefusalCharged);
        let req = if self.bounds.spend_limit
            && charged
            && !matches!(req.end, fenced_jobs::ledger::AttemptEnd::GivenBack { .. })
        {
            priced = EndRequest {
                usage: Some(fenced_jobs::job::Usage {
                    cost_micros: Some(1),
                    estimated: matches!(
                        req.end,
                        fenced_jobs::ledger::AttemptEnd::Unknown { .. }
                            | fenced_jobs::ledger::AttemptEnd::Replay { .. }
                    ),
                    ..fenced_jobs::job::Usage::default()
                }),
                ..req.clone()
            };
            &priced
        } else {
            req
        };
        if self.mutated(Mutation::CancelIgnored) && req.end != AttemptEnd::Cancelled {
            let mut unmarked = current.cloned();
            if let Some(c) = unmarked.as_mut() {
                c.cancel_requested = None;
            }
            return apply_end(unmarked.as_ref(), req);
        }
        if self.mutated(Mutation::FinishIgnoresEpoch) {
            let mut loose = req.clone();
            if let Some(c) = current {
                loose.epoch = c.owner_epoch;
                loose.attempt = c.attempts;
            }
            return apply_end(current, &loose);
        }
        apply_end(current, req)
    }

    fn record_ref(&self, current: Option<&JobItem>, req: &RecordRefRequest) -> Option<JobItem> {
        if self.mutated(Mutation::RecordIgnoresEpoch) {
            let mut loose = req.clone();
            if let Some(c) = current {
                loose.epoch = c.owner_epoch;
                loose.attempt = c.attempts;
            }
            return apply_record_ref(current, &loose);
        }
        apply_record_ref(current, req)
    }

    fn write_op(
        &self,
        next: &mut State,
        worker: usize,
        delivering: Delivering,
        op: Op,
        fault: Fault,
        note: &mut String,
    ) -> bool {
        let now = self.now(next, worker);
        let owner = delivering.delivery.owner_id();
        let job = self.job();
        let answer = match op {
            Op::Claim {
                expect,
                first_sight,
            } => {
                let req = ClaimRequest {
                    // The flex path's claim records it, as the worker's does.
                    route: (next.upstream == Upstream::Flex).then(|| Route {
                        provider: "p".to_owned(),
                        model: "m".to_owned(),
                        path: Some((Rate::Flex, "the cheapest that ends in time".to_owned())),
                    }),
                    job: job.clone(),
                    expect,
                    owner_id: owner.clone(),
                    now,
                    lease_until: now + self.bounds.lease,
                    provider_ref: match next.upstream {
                        Upstream::Keyed => Some(call_ref(expect.attempts + 1, expect.epoch + 1)),
                        Upstream::Batch => {
                            Some(line_ref(expect.attempts + 1, expect.epoch + 1, true))
                        }
                        _ => None,
                    },
                    first_sight,
                    // A world whose messages SQS may drop is one the worker knows it of (its
                    // redrive policy's last receives, its retention): its first claims list
                    // the job in the due index.
                    list_due: self.bounds.lost_messages && !self.mutated(Mutation::NoDueListing),
                };
                let _ = write!(note, "claims expecting epoch {}", expect.epoch);
                let unbounded = self.mutated(Mutation::NoBudgetCheck);
                let claim = |c: Option<&JobItem>| {
                    if unbounded && let Some(c) = c {
                        let mut loose = c.clone();
                        loose.max_attempts = u32::MAX;
                        return apply_claim(Some(&loose), &req).map(|mut r| {
                            r.max_attempts = c.max_attempts;
                            r
                        });
                    }
                    apply_claim(c, &req)
                };
                if self.mutated(Mutation::UnconfirmedClaimCalls) && fault != Fault::None {
                    // Taken as applied without looking: the worker goes on as the owner it
                    // meant to become.
                    let meant = claim(next.item.as_ref()).map(normalized);
                    let _ = self.write(next, claim, fault, Some(expect.epoch));
                    if let Some(meant) = meant {
                        note.push_str(": the request failed; taken as applied");
                        let applied = Observation::Applied(meant);
                        self.feed(next, worker, delivering, applied, note);
                        return true;
                    }
                    self.report(next, worker, &RecordOutcome::Failed(backoff()), note);
                    return true;
                }
                self.write(next, claim, fault, Some(expect.epoch))
            }
            Op::Settle(settle) => {
                let req = settle.request(&job, now);
                let epoch = match settle {
                    Settle::Absent(reason) => {
                        let _ = write!(note, "creates the job settled ({})", reason.kind());
                        None
                    }
                    Settle::Seen { epoch, reason, .. } => {
                        let _ = write!(note, "settles the job ({})", reason.kind());
                        Some(epoch)
                    }
                };
                self.write(next, |c| apply_settle(c, &req), fault, epoch)
            }
            Op::Create => {
                let req = CreateRequest {
                    job: job.clone(),
                    now,
                    enqueued: true,
                };
                note.push_str("creates the item to wait in");
                self.write(next, |c| apply_create(c, &req), fault, None)
            }
            Op::Recover { state, epoch } => {
                // The processor's own recovery claim, as its delivery builds it.
                let Some(mut req) = delivering.delivery.recovery(now) else {
                    return false;
                };
                if self.mutated(Mutation::RecoveryIgnoresLease) {
                    req.lapsed_before = Millis::MAX;
                }
                let _ = write!(
                    note,
                    "recovery claim on the {} job at epoch {epoch}",
                    state.as_str()
                );
                self.write(next, |c| apply_recover(c, &req), fault, Some(epoch))
            }
        };
        let observation = match answer {
            None => {
                note.push_str(": no answer");
                Observation::Unanswered
            }
            Some(Write::Applied(record)) => {
                note.push_str(": applied");
                Observation::Applied(record)
            }
            Some(Write::Refused(seen)) => {
                let d = &delivering.delivery;
                let ours = seen
                    .as_ref()
                    .is_some_and(|s| d.admission().is_some_and(|a| a.ours(s, &owner)));
                note.push_str(if ours {
                    ": refused, but the item shows its own claim"
                } else {
                    ": refused"
                });
                Observation::Refused(self.seen(d, seen))
            }
        };
        self.feed(next, worker, delivering, observation, note);
        true
    }

    fn send(
        &self,
        next: &mut State,
        worker: usize,
        sent: bool,
        short: bool,
        note: &mut String,
    ) -> bool {
        let Some(mut delivering) = Self::waiting(next, worker, |c| *c == Command::Use) else {
            return false;
        };
        let now = self.now(next, worker);
        let d = &mut delivering.delivery;
        let Some(claimed) = d.owner().cloned() else {
            return false;
        };
        // The world's choice: whether the invocation still has time for the call, and when it
        // ends.
        let facts = CallFacts {
            latest_call_start: if sent { Millis::MAX } else { Millis::MIN },
            invocation_end: if short { now + 1 } else { Millis::MAX },
            ..self.call_facts(next)
        };
        // As if the lease were never checked before the call leaves: the call starts as of a
        // moment the lease still held.
        let holds = claimed.owner_until.unwrap_or(now) - self.bounds.skew - 1;
        let at = match self.mutated(Mutation::CallAfterLeaseLapsed) {
            true => now.min(holds),
            false => now,
        };
        d.set_call_facts(facts);
        let command = d.observe(Observation::Carried, at);
        d.set_call_facts(self.call_facts(next));
        if let Command::Call(CallStep::Submit { .. }) = command {
            let _ = write!(note, "sends the call of attempt {}", claimed.attempts);
            delivering.lease_until = claimed.owner_until.unwrap_or(now);
        } else {
            note.push_str("does not send the call");
        }
        self.drive(next, worker, delivering, command, note);
        true
    }

    /// A call of `claimed`'s attempt leaves: the ghost records it, and what it must follow.
    fn call_leaves(&self, next: &mut State, owner: &str, claimed: &JobItem) {
        let (attempt, epoch) = (claimed.attempts, claimed.owner_epoch);
        let item = next.item.clone();
        let recorded = item.as_ref().is_some_and(|r| {
            r.attempt_log
                .iter()
                .any(|a| a.number == attempt && a.epoch == epoch && a.owner_id == owner)
        });
        if !recorded {
            next.violations.push(Violation::UnrecordedCall);
        }
        if next.cancel_epoch.is_some_and(|e| epoch > e) {
            next.violations.push(Violation::CallAfterCancel);
        }
        // Every earlier call that may have run must be settled by a definite failure the
        // ledger recorded for its attempt, or by a decision recorded at or after its epoch.
        let authorised = next.calls.iter().all(|c| {
            let Some(r) = item.as_ref() else {
                return false;
            };
            let definite = (c.truth == Truth::NotRun || c.dropped)
                && r.attempt_log.iter().any(|a| {
                    a.number == c.attempt
                        && a.epoch == c.epoch
                        && matches!(
                            a.outcome,
                            AttemptOutcome::Transient | AttemptOutcome::Permanent
                        )
                });
            // An answer its contract refused, recorded so on its attempt: its outcome is known.
            let refused_answer = c.truth == Truth::Invalid
                && r.attempt_log.iter().any(|a| {
                    a.number == c.attempt
                        && a.epoch == c.epoch
                        && a.outcome == AttemptOutcome::InvalidOutput
                });
            let decided = r.decisions.iter().any(|d| d.epoch >= c.epoch);
            // The provider's own refusal before any work, heard by its sender: no execution.
            let refused = c.truth == Truth::Refused;
            definite || refused_answer || decided || refused || given_back(c, r)
        });
        if !authorised {
            next.violations.push(Violation::SilentRepeat);
        }
        next.calls.push(Call {
            attempt,
            epoch,
            truth: Truth::InFlight,
            dropped: false,
        });
        // A call given back (refused for the rate limit, its attempt returned) spends nothing;
        // the calls of one attempt under one claim (a 429's re-send) spend it once.
        let mut spent: Vec<(u32, u64)> = next
            .calls
            .iter()
            .filter(|c| !item.as_ref().is_some_and(|r| given_back(c, r)))
            .map(|c| (c.attempt, c.epoch))
            .collect();
        spent.sort_unstable();
        spent.dedup();
        if spent.len() > self.bounds.max_attempts as usize
            || item.is_some_and(|r| r.attempts > r.max_attempts)
        {
            next.violations.push(Violation::OverBudget);
        }
    }

    /// The pacer's word on a call refused for the rate limit: it goes again under the same
    /// claim, if the machine still lets it leave, or its attempt is given back.
    fn resend(&self, next: &mut State, worker: usize, resent: bool, note: &mut String) -> bool {
        let Some(mut delivering) = Self::waiting(next, worker, |c| {
            matches!(c, Command::Call(CallStep::Resend { .. }))
        })
        .filter(|d| !d.lost && !d.withdrawn) else {
            return false;
        };
        let attempt = delivering.delivery.owner().map_or(0, |o| o.attempts);
        let now = self.now(next, worker);
        let command = delivering
            .delivery
            .observe(Observation::Resent(resent), now);
        if let Command::Call(CallStep::Submit { .. }) = command {
            let _ = write!(note, "sends the call of attempt {attempt} again");
        } else {
            note.push_str(if resent {
                "may not send the call again"
            } else {
                "gets no capacity in time to send the call again"
            });
        }
        self.drive(next, worker, delivering, command, note);
        true
    }

    /// What the processor knows when it calls: the world decides when the invocation's time
    /// runs out, the job's deadline bounds every call (no provider timeout is shorter), a
    /// heartbeat renews the lease, and a call refused for the rate limit may wait one tick for
    /// the pacer to send it again (the provider asks for one).
    fn call_facts(&self, state: &State) -> CallFacts {
        CallFacts {
            skew: self.bounds.skew,
            provider_timeout_ms: Millis::MAX,
            min_call_ms: 1,
            invocation_end: Millis::MAX,
            latest_call_start: Millis::MAX,
            renewed: true,
            poll_ms: 1,
            horizon_ms: 1,
            replay: state.replay,
        }
    }

    /// The end the owner writes, through the mutations that change how an attempt ends: one
    /// whose outcome is unknown released with no decision, a call never sent spending its
    /// attempt, a recovery that finds no reference assuming the call was never sent. They act
    /// on the write, as the owner's end would carry them (`current`: the item it ends).
    fn mutated_end(
        &self,
        req: EndRequest,
        current: Option<&JobItem>,
        replay: ReplayPolicy,
    ) -> EndRequest {
        let transient = |reason: String| {
            let error = ProviderError::Transient {
                retry_after_ms: None,
                reason,
            };
            current.map(|c| attempt_end(Err(error), c, req.now, replay).0)
        };
        let end = match &req.end {
            AttemptEnd::Unknown { evidence } | AttemptEnd::Replay { evidence, .. }
                if evidence.ends_with(NO_REFERENCE)
                    && self.mutated(Mutation::RecoveryAssumesNotSent) =>
            {
                transient("assumed never sent".to_owned())
            }
            AttemptEnd::Unknown { evidence } if self.mutated(Mutation::UncertainReleased) => {
                Some(AttemptEnd::RetryAuthorized {
                    error: evidence.clone(),
                })
            }
            AttemptEnd::GivenBack { error, why, .. }
                if *why == AttemptOutcome::NotSent
                    && self.mutated(Mutation::NotSentSpendsAttempt) =>
            {
                transient(error.clone())
            }
            _ => None,
        };
        match end {
            Some(end) => EndRequest { end, ..req },
            None => req,
        }
    }

    fn answer(&self, next: &mut State, worker: usize, word: Word, note: &mut String) -> bool {
        let Some(delivering) = Self::waiting(next, worker, |c| {
            matches!(
                c,
                Command::Call(
                    CallStep::Submit { .. } | CallStep::Retrieve { .. } | CallStep::Resend { .. }
                )
            )
        }) else {
            return false;
        };
        let (lost, withdrawn) = (delivering.lost, delivering.withdrawn);
        match delivering.command {
            Command::Call(CallStep::Submit { .. }) => {}
            Command::Call(CallStep::Retrieve { .. } | CallStep::Resend { .. }) if withdrawn => {
                note.push_str("stops waiting: the job's cancel was requested");
                self.feed(next, worker, delivering, Observation::Withdrawn, note);
                return true;
            }
            Command::Call(CallStep::Retrieve { .. }) if lost => {
                note.push_str("stops polling: ownership lost");
                self.feed(next, worker, delivering, Observation::Lost, note);
                return true;
            }
            Command::Call(CallStep::Resend { .. }) if lost => {
                note.push_str("stops waiting to send the call again: ownership lost");
                self.feed(next, worker, delivering, Observation::Resent(false), note);
                return true;
            }
            _ => return false,
        }
        let Some(claimed) = delivering.delivery.owner().cloned() else {
            return false;
        };
        let Some(call) = next
            .calls
            .iter_mut()
            .rev()
            .find(|c| c.attempt == claimed.attempts && c.epoch == claimed.owner_epoch)
        else {
            return false;
        };
        // The provider is consistent: once a retrieval said what became of the call, the
        // caller hears nothing that contradicts it.
        let consistent = !matches!(
            (call.truth, word),
            (Truth::NotRun, Word::Answer | Word::Invalid)
                | (
                    Truth::Ran,
                    Word::Transient
                        | Word::Permanent
                        | Word::Throttled
                        | Word::Invalid
                        | Word::NotSent
                )
                | (
                    Truth::Invalid,
                    Word::Answer
                        | Word::Transient
                        | Word::Permanent
                        | Word::Throttled
                        | Word::NotSent
                )
        );
        if !consistent && !lost {
            return false;
        }
        let said = if withdrawn {
            // The heartbeat stopped the call for the operator's cancel.
            Said::Withdrawn
        } else if lost {
            // The heartbeat cancelled the call: it was sent and may have run.
            Said::Lost
        } else {
            match word {
                Word::Answer => {
                    call.truth = Truth::Ran;
                    Said::Answered(Answer {
                        body: format!("answer of attempt {}", claimed.attempts),
                        provider_ref: None,
                        finish: fenced_jobs::job::contract::Finish::Stop,
                        usage: None,
                        model: None,
                        response_id: None,
                    })
                }
                Word::Transient => {
                    call.truth = Truth::NotRun;
                    Said::Failed(ProviderError::Transient {
                        retry_after_ms: None,
                        reason: "503".to_owned(),
                    })
                }
                Word::Permanent => {
                    call.truth = Truth::NotRun;
                    Said::Failed(ProviderError::Permanent {
                        reason: "400".to_owned(),
                    })
                }
                Word::Throttled => {
                    call.truth = Truth::Refused;
                    Said::Failed(ProviderError::Throttled {
                        retry_after_ms: Some(1),
                        reason: "HTTP 429 rate_limit_exceeded".to_owned(),
                    })
                }
                // The processor judges the answer before the machine hears it.
                Word::Invalid if self.mutated(Mutation::RefusedAnswerAccepted) => {
                    call.truth = Truth::Invalid;
                    Said::Answered(Answer {
                        body: format!("refused answer of attempt {}", claimed.attempts),
                        provider_ref: None,
                        finish: fenced_jobs::job::contract::Finish::Length,
                        usage: None,
                        model: None,
                        response_id: None,
                    })
                }
                Word::Invalid => {
                    call.truth = Truth::Invalid;
                    Said::Failed(ProviderError::InvalidOutput(refused()))
                }
                Word::PastDeadline | Word::CutOff => Said::TimedOut,
                Word::Started if next.upstream == Upstream::Batch => {
                    Said::Started(line_ref(claimed.attempts, claimed.owner_epoch, false))
                }
                Word::StartedUnseen => {
                    Said::Started(line_ref(claimed.attempts, claimed.owner_epoch, true))
                }
                Word::NotSent => {
                    call.truth = Truth::Refused;
                    Said::NotSent("no batch holds the line".to_owned())
                }
                Word::Started => Said::Started(call_ref(claimed.attempts, claimed.owner_epoch)),
                // A bare 429, as a retrying gateway answers after forwarding, through the provider
                // client's own classification: it proves nothing about the work.
                Word::Uncertain if self.mutated(Mutation::BareThrottleTrusted) => {
                    Said::Failed(ProviderError::Throttled {
                        retry_after_ms: None,
                        reason: "HTTP 429".to_owned(),
                    })
                }
                Word::Uncertain if self.mutated(Mutation::GatewayTimeoutTrusted) => {
                    Said::Failed(ProviderError::Transient {
                        retry_after_ms: None,
                        reason: "HTTP 408".to_owned(),
                    })
                }
                // A gateway's bare 429, or its 408 in the provider's error shape (attempts in
                // turn, so both go through the real table at no cost in states).
                Word::Uncertain if claimed.attempts % 2 == 0 => {
                    Said::Failed(classify_status(429, &serde_json::Value::Null))
                }
                Word::Uncertain => Said::Failed(classify_status(
                    408,
                    &serde_json::json!({"error": {"code": "timeout"}}),
                )),
            }
        };
        let _ = write!(
            note,
            "hears from the provider: {}",
            if lost { "(cancelled)" } else { word_name(word) }
        );
        self.feed(next, worker, delivering, Observation::Said(said), note);
        true
    }

    /// The owner puts its answer: kept in the item, or stored under its epoch first.
    fn place(&self, next: &mut State, worker: usize, put: Put, note: &mut String) -> bool {
        let Some(mut delivering) =
            Self::waiting(next, worker, |c| *c == Command::End(EndStep::Place))
        else {
            return false;
        };
        let Some(machine) = delivering.delivery.ending() else {
            return false;
        };
        let Some(body) = machine.answer().map(str::to_owned) else {
            return false;
        };
        let (attempt, epoch) = (machine.owner().attempts, machine.owner().owner_epoch);
        let referenced_at_claim = machine.owner().last_provider_ref().is_some();
        let key = result_key(JOB, epoch, &body);
        let blob = BlobRef {
            bucket: "results".to_owned(),
            key: key.clone(),
            size: body.len() as u64,
            sha256: body,
        };
        if put == Put::Stored && self.mutated(Mutation::DiscardLiveAnswer) {
            delivering.stored = Some(key.clone());
        }
        if matches!(put, Put::Stored | Put::Lost) && !next.bucket.contains(&key) {
            next.bucket.push(key);
            next.bucket.sort();
        }
        let placed = match put {
            Put::Inline => {
                note.push_str("keeps the answer in the item");
                Placed::Inline
            }
            Put::Stored => {
                note.push_str("stores the answer in the bucket");
                Placed::Stored(blob)
            }
            Put::Failed if self.mutated(Mutation::PutFailureIgnored) => {
                note.push_str("fails to store the answer, and references it all the same");
                Placed::Stored(blob)
            }
            Put::Failed | Put::Lost => {
                note.push_str(if put == Put::Lost {
                    "stores the answer without hearing so"
                } else {
                    "fails to store the answer"
                });
                // The processor's fallback: the provider keeps the answer under a recorded
                // reference of this attempt, or the answer is given up.
                let referenced = referenced_at_claim
                    || next.item.as_ref().is_some_and(|r| {
                        r.owner_epoch == epoch
                            && r.state == JobState::Running
                            && r.last_provider_ref().is_some()
                    });
                // Too large for the item (the world's `Inline` choice is the answer that fits).
                let placed = Placed::unstorable(false, next.retrievable() && referenced);
                if placed == Placed::Unstored {
                    note.push_str(": given up");
                    if let Some(call) = next
                        .calls
                        .iter_mut()
                        .rev()
                        .find(|c| c.attempt == attempt && c.epoch == epoch)
                    {
                        call.dropped = true;
                    }
                } else {
                    note.push_str(": left with the provider");
                }
                placed
            }
        };
        self.feed(next, worker, delivering, Observation::Placed(placed), note);
        true
    }

    /// The answer the lapsed attempt's owner stored, if any (the processor lists the epoch's
    /// prefix and checks the content against its key).
    fn stored_answer(state: &State, fenced: &JobItem) -> Option<BlobRef> {
        let epoch = fenced.attempt_log.last()?.epoch;
        let prefix = format!("{RESULTS_PREFIX}{JOB}/{epoch}/");
        let key = state.bucket.iter().find(|k| k.starts_with(&prefix))?;
        Some(BlobRef {
            bucket: "results".to_owned(),
            key: key.clone(),
            size: 0,
            sha256: key[prefix.len()..key.len() - ".json".len()].to_owned(),
        })
    }

    fn renew(&self, next: &mut State, worker: usize, fault: Fault, note: &mut String) -> bool {
        let Some(mut delivering) = Self::waiting(next, worker, |c| matches!(c, Command::Call(_)))
            .filter(|d| !d.lost && !d.withdrawn)
        else {
            return false;
        };
        let Some(epoch) = delivering.delivery.owner().map(|o| o.owner_epoch) else {
            return false;
        };
        let lease_until = delivering.lease_until;
        let now = self.now(next, worker);
        // As the heartbeat renews: through the owner, on its epoch and the lease it wrote.
        let req = Owner::at(JOB, epoch).renew(Some(lease_until), now, now + self.bounds.lease);
        if req.lease_until == lease_until {
            return false; // nothing to extend
        }
        let answer = self.write(next, |c| apply_renew(c, &req), fault, Some(req.epoch));
        // The heartbeat's reading of the answer; its retries are further `Renew` steps.
        let ticks = RenewalTicks {
            now,
            skew_ms: self.bounds.skew,
            heartbeat_ms: 1,
            first_pause_ms: 1,
        };
        let mut withdrawn = false;
        let (lease_until, lost) = match after_renewal(answer.as_ref(), epoch, 0, lease_until, ticks)
        {
            Renewed::Extended { until } => {
                note.push_str("renews its lease");
                (until, false)
            }
            Renewed::Adopted { until } => {
                note.push_str("renewal refused: adopts the lease it finds");
                (until, false)
            }
            Renewed::Lost => {
                note.push_str("renewal refused: ownership lost, the call is cancelled");
                (lease_until, true)
            }
            Renewed::Withdrawn => {
                note.push_str("renewal refused: the job's cancel was requested, the call stops");
                withdrawn = true;
                (lease_until, true)
            }
            Renewed::Retry { .. } => {
                note.push_str("renewal failed: tries again");
                (lease_until, false)
            }
            Renewed::Uncertain { cancel } => {
                note.push_str(if cancel {
                    "renewal failed: the lease lapses first, the call is cancelled"
                } else {
                    "renewal failed"
                });
                (lease_until, cancel)
            }
        };
        (delivering.lease_until, delivering.lost) = (lease_until, lost);
        delivering.withdrawn = withdrawn;
        next.workers[worker].pc = Pc::Delivering(Box::new(delivering));
        true
    }

    fn ask(&self, next: &mut State, worker: usize, said: Retrieved, note: &mut String) -> bool {
        if let Some(delivering) = Self::waiting(next, worker, |c| {
            matches!(c, Command::Call(CallStep::Retrieve { .. }))
        })
        .filter(|d| !d.lost)
        {
            return self.poll(next, worker, delivering, said, note);
        }
        let Some(mut delivering) = Self::waiting(next, worker, |c| *c == Command::LookForAnswer)
        else {
            return false;
        };
        let Some(fenced) = delivering.delivery.owner().cloned() else {
            return false;
        };
        let now = self.now(next, worker);
        // The invocation ends once the provider has been asked: a call still running is
        // handed over (the next delivery asks again), one past its deadline cancelled.
        let d = &mut delivering.delivery;
        d.set_call_facts(CallFacts {
            invocation_end: now,
            ..self.call_facts(next)
        });
        let stored = Self::stored_answer(next, &fenced).filter(|_| !delivering.unlisted);
        let found_stored = stored.is_some();
        let command = d.observe(Observation::Found(stored), now);
        d.set_call_facts(self.call_facts(next));
        let Command::Call(CallStep::Retrieve { .. }) = command else {
            // A cancel request, a stored answer, or nothing to ask about: one step, taken as the
            // `NotFound` choice.
            if said != Retrieved::NotFound {
                return false;
            }
            note.push_str(if fenced.cancel_requested.is_some() {
                "finds the job's cancel request"
            } else if found_stored {
                "finds the answer the lapsed owner stored"
            } else {
                "finds no reference to ask about: the call may have run"
            });
            self.drive(next, worker, delivering, command, note);
            return true;
        };
        let attempt = fenced.attempts;
        // The reference names the attempt and the epoch of the claim that started it: an
        // attempt given back and claimed again under the same number is another call.
        let claimed_at = fenced.attempt_log.last().map(|a| a.epoch);
        let Some(found) = Self::retrieval(next, attempt, claimed_at, said) else {
            return false;
        };
        let _ = write!(note, "asks the provider about attempt {attempt}: {said:?}");
        let command = delivering
            .delivery
            .observe(Observation::Retrieved(found), now);
        self.drive(next, worker, delivering, command, note);
        true
    }

    /// The owner of a background call polls it.
    fn poll(
        &self,
        next: &mut State,
        worker: usize,
        delivering: Delivering,
        said: Retrieved,
        note: &mut String,
    ) -> bool {
        let Some(owner) = delivering.delivery.owner() else {
            return false;
        };
        let (attempt, epoch) = (owner.attempts, owner.owner_epoch);
        let Some(found) = Self::retrieval(next, attempt, Some(epoch), said) else {
            return false;
        };
        let _ = write!(note, "polls the provider about attempt {attempt}: {said:?}");
        self.feed(
            next,
            worker,
            delivering,
            Observation::Retrieved(found),
            note,
        );
        true
    }

    /// What a retrieval of the call of `attempt` claimed at `claimed_at` may find, if the
    /// provider can say `said` (it follows from what became of the call); the call's truth then
    /// follows what was said.
    fn retrieval(
        next: &mut State,
        attempt: u32,
        claimed_at: Option<u64>,
        said: Retrieved,
    ) -> Option<Retrieval> {
        // The provider knows the last call sent under the reference (a 429's re-send reuses it).
        let call = next
            .calls
            .iter_mut()
            .rev()
            .find(|c| c.attempt == attempt && Some(c.epoch) == claimed_at);
        let possible = match call.as_ref().map(|c| c.truth) {
            // Whatever became of the call, the provider may not say.
            _ if matches!(said, Retrieved::Denied | Retrieved::Unreachable) => true,
            None | Some(Truth::Refused) => said == Retrieved::NotFound,
            Some(Truth::Ran) => said == Retrieved::Completed,
            Some(Truth::Invalid) => said == Retrieved::Invalid,
            Some(Truth::NotRun) => matches!(said, Retrieved::Failed | Retrieved::NotFound),
            Some(Truth::InFlight) => true,
        };
        if !possible {
            return None;
        }
        if let Some(call) = call {
            match said {
                Retrieved::Completed => call.truth = Truth::Ran,
                Retrieved::Invalid => call.truth = Truth::Invalid,
                Retrieved::Failed => call.truth = Truth::NotRun,
                _ => {}
            }
        }
        Some(match said {
            Retrieved::Completed => Retrieval::Completed(Answer {
                body: format!("answer of attempt {attempt}"),
                provider_ref: None,
                finish: fenced_jobs::job::contract::Finish::Stop,
                usage: None,
                model: None,
                response_id: None,
            }),
            Retrieved::Failed => Retrieval::Failed(ProviderError::Transient {
                retry_after_ms: None,
                reason: "failed upstream".to_owned(),
            }),
            Retrieved::Invalid => Retrieval::Failed(ProviderError::InvalidOutput(refused())),
            Retrieved::Running => Retrieval::Running,
            Retrieved::NotFound => Retrieval::NotFound,
            Retrieved::Denied => Retrieval::Denied,
            Retrieved::Unreachable => Retrieval::Unreachable {
                retry_after_ms: None,
            },
        })
    }

    /// What may happen to the idle `worker`: a copy of the job's message, a later record of its
    /// last batch, the batch's webhook.
    fn idle_actions(&self, state: &State, worker: usize, w: &Worker, actions: &mut Vec<Action>) {
        let b = &self.bounds;
        let open = state.item.as_ref().is_none_or(|r| !r.state.is_terminal());
        let idle = state.workers.iter().all(|w| w.pc == Pc::Idle);
        // Fairness: SQS keeps delivering a message nobody acknowledged, so at the
        // end of time an open job gets deliveries beyond the bound (each one ends
        // it, unless a fault from the fault bound stops it); and one delivery of a
        // terminal job shows it is acknowledged.
        // Once the message is lost, only triggers by id come: the reconciler's, for a
        // job a sparse index holds whose item keeps its input (fair: it re-sends
        // every run), and stray ones (within the bound).
        let resent = state.item.as_ref().is_some_and(|r| {
            r.keeps_input()
                && fenced_jobs::job::attention_key(r.state, r.owner_epoch, r.watched, JOB).is_some()
        });
        let fair = open && idle && state.time == b.end_of_time() && (state.queued() || resent);
        let late = !open && idle && state.queued();
        if (state.deliveries < b.deliveries && (open || late)) || fair {
            actions.push(Action::Deliver { worker });
        }
        if w.view.is_some() && state.deliveries < b.deliveries {
            actions.push(Action::Follow { worker });
        }
        if b.webhooks && state.webhooks < 2 && state.item.as_ref().is_some_and(in_batch) {
            actions.push(Action::Webhook { worker });
        }
    }

    /// What the world may answer a worker's delivery that waits on it (`d`).
    fn delivery_actions(
        &self,
        state: &State,
        worker: usize,
        d: &Delivering,
        actions: &mut Vec<Action>,
    ) {
        let b = &self.bounds;
        let ledger = |actions: &mut Vec<Action>, lost: bool| {
            for &fault in self.faults(state) {
                if lost || fault != Fault::Lost {
                    actions.push(Action::Step { worker, fault });
                }
            }
        };
        match &d.command {
            Command::Use => {
                for (sent, short) in [(true, false), (false, false), (true, true)] {
                    if !short || b.short_invocations {
                        actions.push(Action::Send {
                            worker,
                            sent,
                            short,
                        });
                    }
                }
            }
            // The record's write goes, whatever the heartbeat found meanwhile. The heartbeat's
            // renewal is not interleaved with it: both are conditional on the epoch alone as far
            // as the other is concerned (the record does not read or move the lease), so either
            // order leaves the same item.
            Command::Call(CallStep::Record) => ledger(actions, true),
            Command::Call(step) => self.call_actions(state, worker, d, step, actions),
            Command::LookForAnswer => self.recovery_actions(state, worker, d, actions),
            Command::End(EndStep::Place) => {
                actions.push(Action::Place {
                    worker,
                    put: Put::Inline,
                });
                actions.push(Action::Place {
                    worker,
                    put: Put::Stored,
                });
                // The bucket's failures are faults of the path's bound.
                if state.faults < b.faults {
                    for put in [Put::Failed, Put::Lost] {
                        actions.push(Action::Place { worker, put });
                    }
                }
            }
            Command::Take => {
                for granted in [true, false] {
                    actions.push(Action::Admit { worker, granted });
                }
            }
            Command::LookAtBatch => Self::batch_actions(state, worker, d, actions),
            // A read (after a write that failed) answers or fails: it applies nothing.
            Command::ReadBack { .. } => ledger(actions, false),
            _ => ledger(actions, true),
        }
    }

    /// What the world may answer a worker whose call waits on `step`: the provider's word, the
    /// pacer's, a retrieval's; and the heartbeat's renewals meanwhile.
    fn call_actions(
        &self,
        state: &State,
        worker: usize,
        d: &Delivering,
        step: &CallStep,
        actions: &mut Vec<Action>,
    ) {
        let w = &state.workers[worker];
        match step {
            // Ownership lost: the wait stops (a call's, as cancelled).
            _ if d.lost => actions.push(Action::Answer {
                worker,
                word: Word::Uncertain,
            }),
            CallStep::Submit { .. } => self.words(state, worker, &d.delivery, actions),
            CallStep::Resend { at } => {
                // Capacity comes back from `at`, or not before the call's time is up.
                actions.push(Action::Resend {
                    worker,
                    resent: false,
                });
                if state.time + w.offset >= *at {
                    actions.push(Action::Resend {
                        worker,
                        resent: true,
                    });
                }
            }
            _ => {
                for said in self.retrievals() {
                    actions.push(Action::Ask { worker, said });
                }
            }
        }
        if !d.lost {
            for &fault in self.faults(state) {
                actions.push(Action::Renew { worker, fault });
            }
        }
    }

    /// What a recovering worker may find: the lapsed owner's stored answer (unless the bucket's
    /// listing fails), or the provider's word on the lapsed call.
    fn recovery_actions(
        &self,
        state: &State,
        worker: usize,
        d: &Delivering,
        actions: &mut Vec<Action>,
    ) {
        let b = &self.bounds;
        let Some(fenced) = d.delivery.owner() else {
            return;
        };
        let reference = fenced.last_provider_ref().is_some();
        let stored = Self::stored_answer(state, fenced).is_some() && !d.unlisted;
        // The bucket's listing fails: a fault of the path's bound.
        if stored && state.faults < b.faults {
            actions.push(Action::Unlisted { worker });
        }
        if state.retrievable() && reference && !stored {
            for said in self.retrievals() {
                actions.push(Action::Ask { worker, said });
            }
        } else {
            // No reference: one step, taken as an `Ask` that finds nothing.
            actions.push(Action::Ask {
                worker,
                said: Retrieved::NotFound,
            });
        }
    }

    /// What the provider may say of the batch of the line a worker's recovery would fence.
    fn batch_actions(state: &State, worker: usize, d: &Delivering, actions: &mut Vec<Action>) {
        actions.push(Action::Batch {
            worker,
            running: false,
        });
        // The batch may still run only while the line's call may.
        let line = d.delivery.view().and_then(|v| v.attempt_log.last());
        let in_flight = line.is_some_and(|a| {
            state
                .calls
                .iter()
                .any(|c| (c.attempt, c.epoch, c.truth) == (a.number, a.epoch, Truth::InFlight))
        });
        if in_flight {
            actions.push(Action::Batch {
                worker,
                running: true,
            });
        }
    }

    /// What the provider may say to the call the worker sent.
    fn words(&self, state: &State, worker: usize, d: &Delivery, actions: &mut Vec<Action>) {
        // A background provider answers through a retrieval, never the submit; the others
        // never start a call in the background.
        let background = matches!(state.upstream, Upstream::Background | Upstream::Batch);
        let invalid = self.bounds.invalid_answers.then_some(Word::Invalid);
        for word in [
            Word::Answer,
            Word::Transient,
            Word::Permanent,
            Word::Throttled,
            Word::Uncertain,
            Word::Started,
        ]
        .into_iter()
        .chain(invalid)
        {
            let answers = !matches!(word, Word::Answer | Word::Started | Word::Invalid);
            if answers || (word == Word::Started) == background {
                actions.push(Action::Answer { worker, word });
            }
        }
        // A batch's own words: its create unseen, its line never sent.
        if state.upstream == Upstream::Batch {
            for word in [Word::StartedUnseen, Word::NotSent] {
                actions.push(Action::Answer { worker, word });
            }
        }
        let Some(machine) = d.calling() else {
            return;
        };
        let now = state.time + state.workers[worker].offset;
        if machine.bound() == Bound::JobDeadline && now >= self.bounds.deadline {
            actions.push(Action::Answer {
                worker,
                word: Word::PastDeadline,
            });
        }
        if machine.bound() == Bound::Invocation && now >= machine.facts().invocation_end {
            actions.push(Action::Answer {
                worker,
                word: Word::CutOff,
            });
        }
    }

    /// Prints the path as a timeline: one line per event, with the item after it.
    pub fn timeline(&self, path: &[(State, Option<Action>)]) -> String {
        let always: Vec<_> = self
            .properties()
            .into_iter()
            .filter(|p| p.expectation == stateright::Expectation::Always)
            .collect();
        let mut out = String::new();
        let first = &path[0].0;
        let _ = writeln!(
            out,
            "  provider {}, replay policy {:?}, clocks ahead by {:?}, item at start: {}",
            match first.upstream {
                Upstream::Blind => "not retrievable",
                Upstream::Keyed => "retrievable by the client's key",
                Upstream::Background => "running calls in the background",
                Upstream::Batch => "answering through a batch",
                Upstream::Flex => "on the flex path, not retrievable",
            },
            first.replay,
            first.workers.iter().map(|w| w.offset).collect::<Vec<_>>(),
            first.item.as_ref().map_or("none", |r| r.state.as_str()),
        );
        let _ = writeln!(
            out,
            "  {:>3}  {:<10} {:<17} {:>5} {:>8} {:>5}  what",
            "t", "who", "job state", "epoch", "attempts", "lease"
        );
        for window in path.windows(2) {
            let (state, action) = (&window[0].0, &window[0].1);
            let Some(action) = action else { continue };
            let Some((after, note)) = self.step(state, action) else {
                continue;
            };
            let who = match *action {
                Action::Tick => "clock".to_owned(),
                Action::Expire => "reconciler".to_owned(),
                Action::Decide(_) | Action::Cancel => "operator".to_owned(),
                Action::Lose | Action::DeadLetter => "queue".to_owned(),
                Action::Sweep => "reconciler".to_owned(),
                Action::Deliver { worker, .. }
                | Action::Follow { worker }
                | Action::Webhook { worker }
                | Action::Admit { worker, .. }
                | Action::Batch { worker, .. }
                | Action::Step { worker, .. }
                | Action::Send { worker, .. }
                | Action::Answer { worker, .. }
                | Action::Renew { worker, .. }
                | Action::Resend { worker, .. }
                | Action::Ask { worker, .. }
                | Action::Place { worker, .. }
                | Action::Unlisted { worker }
                | Action::Crash { worker } => {
                    let w = &after.workers[worker];
                    let owner = if matches!(
                        action,
                        Action::Deliver { .. } | Action::Follow { .. } | Action::Webhook { .. }
                    ) {
                        w.owner
                    } else {
                        state.workers[worker].owner
                    };
                    format!("w{worker} (d{owner})")
                }
            };
            let fault = match action {
                Action::Step {
                    fault: Fault::Lost, ..
                }
                | Action::Renew {
                    fault: Fault::Lost, ..
                } => " [applied, answer lost]",
                Action::Step {
                    fault: Fault::Failed,
                    ..
                }
                | Action::Renew {
                    fault: Fault::Failed,
                    ..
                } => " [request failed]",
                _ => "",
            };
            let (st, epoch, attempts, lease) = match &after.item {
                Some(r) => (
                    r.state.as_str().to_owned(),
                    r.owner_epoch.to_string(),
                    format!("{}/{}", r.attempts, r.max_attempts),
                    r.owner_until.map_or("-".to_owned(), |u| u.to_string()),
                ),
                None => ("(no item)".to_owned(), "-".into(), "-".into(), "-".into()),
            };
            let mut line = format!(
                "  {:>3}  {:<10} {:<17} {:>5} {:>8} {:>5}  {note}{fault}",
                after.time, who, st, epoch, attempts, lease
            );
            // The path ends where its own property fails; another may fail on the way.
            for p in &always {
                if (p.condition)(self, state) && !(p.condition)(self, &after) {
                    let _ = write!(line, "\n  {:>3}  VIOLATED: {}", "", p.name);
                }
            }
            let _ = writeln!(out, "{line}");
        }
        // A path that ends with nothing left to happen fails each liveness property its last
        // state does not meet.
        if let Some((last, _)) = path.last() {
            let mut next = Vec::new();
            self.actions(last, &mut next);
            let eventually = self
                .properties()
                .into_iter()
                .filter(|p| p.expectation == stateright::Expectation::Eventually);
            for p in eventually.filter(|p| next.is_empty() && !(p.condition)(self, last)) {
                let _ = writeln!(
                    out,
                    "  {:>3}  nothing more happens; VIOLATED: {}",
                    "", p.name
                );
            }
        }
        out
    }
}

/// The item without what no decision reads (times of past events, messages, reasons), so that
/// states which differ only there are explored once.
fn normalized(mut r: JobItem) -> JobItem {
    r.created_at = 0;
    r.updated_at = 0;
    for a in r.attempt_log.iter_mut().chain(&mut r.given_back) {
        a.started_at = 0;
        a.finished_at = a.finished_at.map(|_| 0);
    }
    for d in &mut r.recoveries {
        d.at = 0;
        d.reason.clear();
    }
    for d in &mut r.decisions {
        d.at = 0;
        d.reason.clear();
    }
    if let Some(e) = r.last_error.as_mut() {
        e.at = 0;
        e.message.clear();
    }
    r
}

/// Whether every attempt's end in `r` agrees with what its calls did: a success had a call that
/// ran; a definite failure had calls, none of which may have run (but a refused one, or one
/// whose answer was given up); an attempt given back had no call that may have run.
fn attempts_match_calls(s: &State, r: &JobItem) -> bool {
    let calls = |a: &fenced_jobs::job::AttemptEntry| {
        let (number, epoch) = (a.number, a.epoch);
        s.calls
            .iter()
            .filter(move |c| c.attempt == number && c.epoch == epoch)
    };
    let ran =
        |c: &Call| matches!(c.truth, Truth::Ran | Truth::InFlight | Truth::Invalid) && !c.dropped;
    r.attempt_log.iter().all(|a| match a.outcome {
        AttemptOutcome::Succeeded => calls(a).any(|c| c.truth == Truth::Ran),
        AttemptOutcome::InvalidOutput => calls(a).any(|c| c.truth == Truth::Invalid),
        AttemptOutcome::Transient | AttemptOutcome::Permanent => {
            calls(a).next().is_some() && !calls(a).any(ran)
        }
        _ => true,
    }) && r.given_back.iter().all(|a| !calls(a).any(ran))
}

/// Whether `c` did not run and the ledger gave its attempt back: its entry (its attempt at its
/// epoch) moved from the log to the given-back attempts, which only the end of a throttled (or
/// never sent) attempt does.
fn given_back(c: &Call, r: &JobItem) -> bool {
    let of_call = |a: &fenced_jobs::job::AttemptEntry| a.number == c.attempt && a.epoch == c.epoch;
    matches!(c.truth, Truth::NotRun | Truth::Refused)
        && !r.attempt_log.iter().any(of_call)
        && r.given_back.iter().any(of_call)
}

/// Whether `r`, if it failed for its budget, was brought there by calls: every attempt in its
/// log was sent (a call at its number and epoch), or may have been (recorded uncertain, as a
/// recovery records a crash between the claim and the call).
fn spent_by_calls(r: &JobItem, calls: &[Call]) -> bool {
    let budget = r.state == JobState::FailedTerminal
        && r.last_error.as_ref().is_some_and(|e| e.kind == "budget");
    !budget
        || r.attempt_log.iter().all(|a| {
            a.outcome == AttemptOutcome::Uncertain
                || calls
                    .iter()
                    .any(|c| c.attempt == a.number && c.epoch == a.epoch)
        })
}

/// Whether every reference in `r`'s attempt log is the name of its own attempt's call (at its
/// number and epoch) and, where the provider assigned it, names a call that was started.
fn references_name_calls(s: &State, r: &JobItem) -> bool {
    r.attempt_log.iter().all(|a| {
        a.provider_ref.as_ref().is_none_or(|reference| {
            let named = match s.upstream {
                Upstream::Batch => {
                    *reference == line_ref(a.number, a.epoch, true)
                        || *reference == line_ref(a.number, a.epoch, false)
                }
                _ => *reference == call_ref(a.number, a.epoch),
            };
            named
                && (matches!(s.upstream, Upstream::Keyed | Upstream::Batch)
                    || s.calls
                        .iter()
                        .any(|c| c.attempt == a.number && c.epoch == a.epoch))
        })
    })
}

/// What a writer heard of its write.
fn heard(answer: &Option<Write>) -> &'static str {
    match answer {
        Some(Write::Applied(_)) => ": applied",
        Some(Write::Refused(_)) => ": refused",
        None => ": no answer",
    }
}

fn word_name(word: Word) -> &'static str {
    match word {
        Word::Answer => "an answer",
        Word::Transient => "a transient failure",
        Word::Permanent => "a permanent failure",
        Word::Throttled => "a 429",
        Word::Uncertain => "nothing certain (a gateway's bare 429)",
        Word::PastDeadline => "nothing before the deadline",
        Word::CutOff => "nothing before the invocation's end",
        Word::Started => "started in the background",
        Word::StartedUnseen => "a batch whose create went unseen",
        Word::NotSent => "not sent: no batch holds the line",
        Word::Invalid => "an answer its contract refuses",
    }
}

/// The refusal of an answer cut off by the model's token limit, as a contract words it.
fn refused() -> fenced_jobs::job::contract::Rejected {
    fenced_jobs::job::contract::Rejected {
        finish: fenced_jobs::job::contract::Finish::Length,
        errors: vec!["the answer is cut off: finish length".to_owned()],
        excerpt: String::new(),
        terminal: false,
    }
}

fn backoff() -> Failure {
    Failure::Backoff {
        retry_after_ms: None,
        cause: "model",
    }
}

impl Model for Protocol {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let b = &self.bounds;
        let mut states = Vec::new();
        // Each worker's clock is exactly on time or ahead by the margin; the first is on time.
        let offsets: Vec<Vec<Millis>> = (0..1u32 << (b.workers - 1))
            .map(|mask| {
                (0..b.workers)
                    .map(|w| {
                        if w > 0 && mask & (1 << (w - 1)) != 0 {
                            b.skew
                        } else {
                            0
                        }
                    })
                    .collect()
            })
            .collect();
        for &upstream in &b.upstreams {
            for &replay in &b.replay {
                for offsets in &offsets {
                    // The producer created the item first (`jobctl submit`), or it did not.
                    for created in [false, true] {
                        states.push(State {
                            time: 0,
                            upstream,
                            replay,
                            // As the producer's create leaves it.
                            item: created
                                .then(|| {
                                    let req = fenced_jobs::ledger::CreateRequest {
                                        job: self.job(),
                                        now: 0,
                                        enqueued: true,
                                    };
                                    apply_create(None, &req)
                                })
                                .flatten(),
                            deliveries: 0,
                            webhooks: 0,
                            faults: 0,
                            workers: offsets
                                .iter()
                                .map(|&offset| Worker {
                                    pc: Pc::Idle,
                                    by_webhook: false,
                                    owner: 0,
                                    offset,
                                    view: None,
                                })
                                .collect(),
                            calls: Vec::new(),
                            accepted: None,
                            bucket: Vec::new(),
                            followed: false,
                            batch_waited: false,
                            hops: 0,
                            cancel_epoch: None,
                            lost: false,
                            letter: Letter::InQueue,
                            violations: Vec::new(),
                        });
                    }
                }
            }
        }
        states
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        let b = &self.bounds;
        if state.time < b.end_of_time() {
            actions.push(Action::Tick);
        }
        for (worker, w) in state.workers.iter().enumerate() {
            match &w.pc {
                Pc::Idle => {
                    self.idle_actions(state, worker, w, actions);
                    continue;
                }
                Pc::Delivering(d) => self.delivery_actions(state, worker, d, actions),
            }
            // A crash matters only while the worker holds the job: before its first write it
            // is a delivery that did nothing, and between writes it is what a failed write
            // followed by a back-off already is.
            let holds = matches!(&w.pc, Pc::Delivering(d) if d.delivery.owner().is_some());
            if holds && state.faults < b.faults {
                actions.push(Action::Crash { worker });
            }
        }
        if let Some(item) = &state.item {
            let terminal = item.state.is_terminal();
            let past = item.deadline_at <= state.time - b.skew;
            // The due index holds every job its writes listed; the sparse ones, all but a
            // first claim's.
            let listed = item.due_listed && !self.mutated(Mutation::NoDueWalk);
            let found = listed
                || fenced_jobs::job::attention_key(item.state, item.owner_epoch, item.watched, JOB)
                    .is_some();
            if past && found && (!terminal || self.mutated(Mutation::ExpiryIgnoresTerminal)) {
                actions.push(Action::Expire);
            }
            if b.lost_messages && !state.lost && !terminal {
                actions.push(Action::Lose);
            }
            // A letter of a job never claimed (no item) waits for an operator's redrive.
            if b.dead_letters && state.letter == Letter::InQueue && !terminal {
                actions.push(Action::DeadLetter);
            }
            let sweeps =
                !terminal && item.state != JobState::Unknown && !self.mutated(Mutation::NoSweep);
            if state.letter == Letter::Dead && sweeps {
                actions.push(Action::Sweep);
            }
            if item.state == JobState::Unknown {
                actions.push(Action::Decide(OperatorAction::AuthorizeRetry));
                actions.push(Action::Decide(OperatorAction::Fail));
            }
            if b.cancels && state.cancel_epoch.is_none() && !terminal {
                actions.push(Action::Cancel);
            }
        }
    }

    fn next_state(&self, state: &State, action: Action) -> Option<State> {
        let next = self.step(state, &action).map(|(next, _)| next)?;
        if self.bounds.mutation.is_none() {
            note_change(state, &next);
        }
        Some(next)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        fn holds(state: &State, v: Violation) -> bool {
            !state.violations.contains(&v)
        }
        vec![
            Property::always(ONE_RESULT, |_, s| holds(s, Violation::ResultChanged)),
            Property::always(STALE_WRITE, |_, s| holds(s, Violation::StaleWrite)),
            Property::always(LEASE_RESPECTED, |_, s| holds(s, Violation::EarlyFence)),
            Property::always(FLEX_MOVES_ON, |_, s: &State| {
                s.upstream != Upstream::Flex
                    || s.calls.iter().enumerate().all(|(i, c)| {
                        !s.calls[i + 1..]
                            .iter()
                            .any(|d| d.attempt == c.attempt && d.epoch == c.epoch)
                    })
            }),
            Property::always(BUDGET, |_, s| {
                holds(s, Violation::OverBudget)
                    && s.item.as_ref().is_none_or(|r| r.attempts <= r.max_attempts)
            }),
            Property::always(NO_SILENT_REPEAT, |_, s| holds(s, Violation::SilentRepeat)),
            Property::always(ACK_TERMINAL, |_, s| holds(s, Violation::AckedEarly)),
            Property::always(ATTEMPT_RECORDED, |_, s| holds(s, Violation::UnrecordedCall)),
            Property::always(CANCEL_HOLDS, |_, s| {
                holds(s, Violation::AcceptedAfterCancel)
            }),
            Property::always(NO_CALL_AFTER_CANCEL, |_, s| {
                holds(s, Violation::CallAfterCancel)
            }),
            Property::always(SPENT_BY_CALLS, |_, s: &State| {
                s.item.as_ref().is_none_or(|r| spent_by_calls(r, &s.calls))
            }),
            Property::always(STORED_EXISTS, |_, s: &State| {
                s.item
                    .as_ref()
                    .and_then(|r| r.result_ref.as_ref())
                    .is_none_or(|r| s.bucket.contains(&r.key))
            }),
            Property::always(ENDS_AS_CALLED, |_, s: &State| {
                s.item.as_ref().is_none_or(|r| attempts_match_calls(s, r))
            }),
            Property::always(REFERENCE_NAMES_CALL, |_, s: &State| {
                s.item.as_ref().is_none_or(|r| references_name_calls(s, r))
            }),
            Property::always(SPEND_LIMIT, |_, s: &State| {
                s.item.as_ref().is_none_or(|r| {
                    let spent = r.usage().and_then(|u| u.cost_micros).unwrap_or(0);
                    r.max_cost_micros
                        .is_none_or(|max| spent <= max && cost_of_calls(s) <= max)
                })
            }),
            // An estimate stands for an attempt whose outcome is unknown until its end is
            // written again; what was heard or settled is held to the calls that ran.
            Property::always(SPENT_AS_RUN, |_, s: &State| {
                s.item.as_ref().is_none_or(|r| {
                    let settled: u64 = r
                        .attempt_log
                        .iter()
                        .filter_map(|a| a.usage)
                        .filter(|u| !u.estimated)
                        .filter_map(|u| u.cost_micros)
                        .sum();
                    settled <= cost_of_calls(s)
                })
            }),
            Property::eventually(ENDS, |_, s: &State| {
                s.item.as_ref().is_some_and(|r| {
                    r.state.is_terminal()
                        || (r.state == JobState::Unknown
                            && r.last_error.as_ref().is_some_and(|e| e.kind == "uncertain"))
                })
            }),
            // Reachability: the model is not vacuous.
            Property::sometimes(
                "a job whose message was dead-lettered is swept back and succeeds",
                |_, s: &State| {
                    s.letter == Letter::SweptBack
                        && s.item
                            .as_ref()
                            .is_some_and(|r| r.state == JobState::Succeeded)
                },
            ),
            Property::sometimes(
                "a later record of a batch is acknowledged from the item its first left",
                |_, s: &State| s.followed,
            ),
            Property::sometimes(
                "a batch's webhook sends a trigger by id, and its delivery accepts the answer",
                |_, s: &State| {
                    s.webhooks > 0
                        && s.item.as_ref().is_some_and(|r| {
                            r.state == JobState::Succeeded
                                && r.owner_id.as_deref().is_some_and(|o| o.starts_with("d10"))
                        })
                },
            ),
            Property::sometimes(
                "a record waits for its line's running batch, nothing written",
                |_, s: &State| s.batch_waited,
            ),
            Property::sometimes(
                "an answer its contract refuses is followed by one it takes",
                |_, s: &State| {
                    s.item.as_ref().is_some_and(|r| {
                        r.state == JobState::Succeeded
                            && r.attempt_log
                                .iter()
                                .any(|a| a.outcome == AttemptOutcome::InvalidOutput)
                    })
                },
            ),
            Property::sometimes(
                "a second provider takes a refused job in the same delivery, and it succeeds",
                |_, s: &State| {
                    s.hops > 0
                        && s.item
                            .as_ref()
                            .is_some_and(|r| r.state == JobState::Succeeded)
                },
            ),
            Property::sometimes(
                "a line of a batch is handed over, and a later delivery accepts its answer",
                |_, s: &State| {
                    s.upstream == Upstream::Batch
                        && s.item.as_ref().is_some_and(|r| {
                            r.state == JobState::Succeeded && !r.recoveries.is_empty()
                        })
                },
            ),
            Property::sometimes(
                "a line whose batch went unseen is found again, and its answer accepted",
                |_, s: &State| {
                    s.upstream == Upstream::Batch
                        && s.item.as_ref().is_some_and(|r| {
                            r.state == JobState::Succeeded
                                && r.attempt_log.last().is_some_and(|a| {
                                    a.provider_ref.as_deref().is_some_and(|p| {
                                        batch::parse_ref(p).is_some_and(|(b, _)| b.is_none())
                                    })
                                })
                        })
                },
            ),
            Property::sometimes(
                "a running job's cancel stops its call, and its owner ends it cancelled",
                |_, s: &State| {
                    s.item.as_ref().is_some_and(|r| {
                        r.state == JobState::Cancelled
                            && r.attempt_log
                                .last()
                                .is_some_and(|a| a.outcome == AttemptOutcome::Cancelled)
                    })
                },
            ),
            Property::sometimes(
                "a job whose item kept no input and whose message was lost is expired",
                |_, s: &State| {
                    s.lost
                        && s.item
                            .as_ref()
                            .is_some_and(|r| r.state == JobState::Expired && !r.keeps_input())
                },
            ),
            Property::sometimes("a job is cancelled before any call", |_, s: &State| {
                s.calls.is_empty()
                    && s.item
                        .as_ref()
                        .is_some_and(|r| r.state == JobState::Cancelled)
            }),
            Property::sometimes("an answer is accepted", |_, s: &State| {
                s.item
                    .as_ref()
                    .is_some_and(|r| r.state == JobState::Succeeded)
            }),
            Property::sometimes(
                "the flex path's 429 gives its attempt back at once, never re-sent, and the job succeeds",
                |_, s: &State| {
                    s.upstream == Upstream::Flex
                        && s.item.as_ref().is_some_and(|r| {
                            r.state == JobState::Succeeded
                                && r.throttles > 0
                                && s.calls.len() == r.throttles as usize + 1
                        })
                },
            ),
            Property::sometimes(
                "a 429's attempt is given back and the job still succeeds",
                |_, s: &State| {
                    s.item
                        .as_ref()
                        .is_some_and(|r| r.state == JobState::Succeeded && r.throttles > 0)
                },
            ),
            Property::sometimes(
                "a first sight with no capacity waits in the item it created, and the job still succeeds",
                |_, s: &State| {
                    s.item
                        .as_ref()
                        .is_some_and(|r| r.state == JobState::Succeeded && r.enqueued_at.is_some())
                },
            ),
            Property::sometimes("a second call after a recorded decision", |_, s: &State| {
                s.calls.len() >= 2 && s.item.as_ref().is_some_and(|r| !r.decisions.is_empty())
            }),
            Property::sometimes(
                "a recovery accepts the answer a lapsed owner stored",
                |_, s: &State| {
                    s.item
                        .as_ref()
                        .is_some_and(|r| r.result_ref.is_some() && !r.recoveries.is_empty())
                },
            ),
            Property::sometimes(
                "a 429 is sent again under the same claim and the job succeeds",
                |_, s: &State| {
                    let resent = s.calls.windows(2).any(|w| {
                        w[0].truth == Truth::Refused
                            && (w[1].attempt, w[1].epoch) == (w[0].attempt, w[0].epoch)
                    });
                    resent
                        && s.item
                            .as_ref()
                            .is_some_and(|r| r.state == JobState::Succeeded)
                },
            ),
            Property::sometimes(
                "a background call is polled to its answer and accepted",
                |_, s: &State| {
                    s.upstream == Upstream::Background
                        && s.item.as_ref().is_some_and(|r| {
                            r.state == JobState::Succeeded && r.last_provider_ref().is_some()
                        })
                },
            ),
            Property::sometimes(
                "a recovery collects a background call by the reference its lapsed owner recorded",
                |_, s: &State| {
                    s.upstream == Upstream::Background
                        && s.item.as_ref().is_some_and(|r| {
                            r.state == JobState::Succeeded
                                && r.attempts == 1
                                && !r.recoveries.is_empty()
                                && r.result.is_some()
                                && r.last_provider_ref().is_some()
                        })
                },
            ),
            Property::sometimes(
                "a job its spend limit stops before a second call",
                |_, s: &State| {
                    s.item.as_ref().is_some_and(|r| {
                        r.state == JobState::FailedTerminal
                            && r.last_error.as_ref().is_some_and(|e| e.kind == "spend")
                    })
                },
            ),
            Property::sometimes(
                "a lapsed owner is fenced and the job still succeeds",
                |_, s: &State| {
                    s.item
                        .as_ref()
                        .is_some_and(|r| r.state == JobState::Succeeded && !r.recoveries.is_empty())
                },
            ),
        ]
    }
}

/// What one check found.
#[derive(Debug)]
pub struct Report {
    /// States generated, repeats included.
    pub states: usize,
    /// Distinct states.
    pub unique: usize,
    /// The longest path explored.
    pub depth: usize,
    /// Seconds it took.
    pub seconds: f64,
    /// Each property and its verdict.
    pub verdicts: Vec<(&'static str, Verdict)>,
    /// The timeline of the first counterexample found, if any.
    pub counterexample: Option<String>,
}

/// A property's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// No counterexample in the bound.
    Holds,
    /// A counterexample was found.
    Violated,
    /// An example was found (a `sometimes` property).
    Reached,
    /// No example was found (a `sometimes` property).
    Unreached,
}

impl Report {
    /// The properties with a counterexample.
    pub fn violated(&self) -> Vec<&'static str> {
        self.verdicts
            .iter()
            .filter(|(_, v)| *v == Verdict::Violated)
            .map(|(n, _)| *n)
            .collect()
    }
}

/// Checks the protocol under `bounds`: depth first over every state, or breadth first until
/// the first counterexample (`first_failure`, which also makes that counterexample a shortest
/// one).
pub fn check(bounds: &Bounds, threads: usize, first_failure: bool) -> Report {
    let model = Protocol {
        bounds: bounds.clone(),
    };
    // A mutation's check runs until it breaks the property it is meant to break (a stale
    // write, say, may come first on the way), and shows that property's counterexample.
    let meant = bounds.mutation.and_then(Mutation::breaks);
    explore(model, threads, first_failure, meant)
}

/// Checks `model` on `threads`: depth first over every state, or breadth first until the
/// `meant` property (or any) fails first (`first_failure`).
pub fn explore<M>(
    model: M,
    threads: usize,
    first_failure: bool,
    meant: Option<&'static str>,
) -> Report
where
    M: Timeline + Clone + Send + Sync + 'static,
    M::State: std::hash::Hash + std::fmt::Debug + Send + Sync,
    M::Action: std::fmt::Debug + Send + Sync,
{
    use stateright::{Checker, HasDiscoveries};
    let started = std::time::Instant::now();
    let builder = model.clone().checker().threads(threads);
    if first_failure {
        let until = match meant {
            Some(property) => HasDiscoveries::AnyOf([property].into()),
            None => HasDiscoveries::AnyFailures,
        };
        let checker = builder.finish_when(until).spawn_bfs().join();
        conclude(&model, &checker, started, meant)
    } else {
        conclude(&model, &builder.spawn_dfs().join(), started, meant)
    }
}

/// A model whose paths can be printed as a timeline.
pub trait Timeline: Model<State: Clone + PartialEq, Action: Clone + PartialEq> {
    /// The path as a timeline, one line per event.
    fn timeline(&self, path: &[(Self::State, Option<Self::Action>)]) -> String;
}

impl Timeline for Protocol {
    fn timeline(&self, path: &[(State, Option<Action>)]) -> String {
        Protocol::timeline(self, path)
    }
}

/// What a check of `model` found, from its `checker`, started at `started`; the counterexample
/// shown is the `meant` property's, if it was broken.
pub fn conclude<M: Timeline>(
    model: &M,
    checker: &impl stateright::Checker<M>,
    started: std::time::Instant,
    meant: Option<&str>,
) -> Report {
    use stateright::Expectation;
    let mut counterexample = None;
    let mut properties = model.properties();
    // The counterexample shown is the meant property's, if it was broken.
    properties.sort_by_key(|p| Some(p.name) != meant);
    let verdicts = properties
        .iter()
        .map(|p| {
            let found = checker.discovery(p.name);
            let verdict = match (&p.expectation, found) {
                (Expectation::Sometimes, Some(_)) => Verdict::Reached,
                (Expectation::Sometimes, None) => Verdict::Unreached,
                (_, None) => Verdict::Holds,
                (_, Some(path)) => {
                    if counterexample.is_none() {
                        counterexample = Some(format!(
                            "  counterexample to \"{}\":\n{}",
                            p.name,
                            model.timeline(&path.into_vec())
                        ));
                    }
                    Verdict::Violated
                }
            };
            (p.name, verdict)
        })
        .collect();
    Report {
        states: checker.state_count(),
        unique: checker.unique_state_count(),
        depth: checker.max_depth(),
        seconds: started.elapsed().as_secs_f64(),
        verdicts,
        counterexample,
    }
}

/// Whether `item` records a line of a batch the provider named: one its webhook announces.
fn in_batch(item: &JobItem) -> bool {
    item.attempt_log.iter().any(|a| {
        a.provider_ref
            .as_deref()
            .and_then(batch::parse_ref)
            .is_some_and(|(b, _)| b.is_some())
    })
}
