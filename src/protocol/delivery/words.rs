//! What a [`Delivery`](super::Delivery) and its executor say to each other: the command it
//! gives, the observation that answers it, and what a call is charged.

use super::super::admission::Op;
use super::super::calling::{CallStep, Said};
use super::super::ending::{Closed, EndStep, Placed};
use crate::job::{BlobRef, JobItem, Millis, Usage};
use crate::ledger::{AttemptEnd, KeptInput, Write};
use crate::provider::Retrieval;

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

/// What a call used, each figure priced by the executor (`cost_micros`, where the price table
/// knows the model): what the provider said, if it said, and the estimate from the request's
/// size.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Used {
    /// What the provider said the call used.
    pub heard: Option<Usage>,
    /// The estimate from the request's size.
    pub estimate: Usage,
}

impl Used {
    /// The usage an attempt's end (`end`) records: none for an attempt given back (nothing
    /// ran), what was heard else the estimate for one whose outcome is unknown, else what was
    /// heard.
    pub fn recorded(&self, end: &AttemptEnd) -> Option<Usage> {
        match end {
            AttemptEnd::GivenBack { .. } => None,
            AttemptEnd::Unknown { .. } | AttemptEnd::Replay { .. } => {
                self.heard.or(Some(self.estimate).filter(|e| e.total() > 0))
            }
            _ => self.heard,
        }
    }
}

/// What the delivery asks the worker to do next; each is answered by the [`Observation`]
/// its documentation names.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Command {
    /// Take capacity for the call on the provider [`Delivery::lane`] names (the tenant's and
    /// the provider's pacing, the day's spend): [`Observation::Taken`] or
    /// [`Observation::NoCapacity`].
    Take,
    /// Release what was taken for a call that is not made here, then
    /// [`Observation::Carried`].
    Release,
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
    /// The next write leaves the job live in an item that keeps no input (a recovery claim,
    /// an end that lets another attempt come): how the job's input is kept, for a later
    /// trigger by id ([`Observation::Kept`]).
    KeepInput,
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
    Applied(JobItem),
    /// The write was refused; the item as the refusal showed it (`None`: there is none).
    Refused(Option<JobItem>),
    /// The write was sent and no answer came.
    Unanswered,
    /// The write failed before anything was written.
    WriteFailed,
    /// The item as a read found it.
    Read(Option<JobItem>),
    /// The read failed.
    ReadFailed,
    /// The answer the fenced owner stored, if one was found.
    Found(Option<BlobRef>),
    /// How the job's input is kept (`None`: the message does not carry it).
    Kept(Option<KeptInput>),
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
    /// The provider was asked to cancel the call upstream ([`CallStep::CancelUpstream`]).
    CancelledUpstream,
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
