//! The job states of the ledger and which of them are final.

use std::fmt;
use std::str::FromStr;

/// Where a job stands in the ledger. The names are the ones stored in DynamoDB.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum JobState {
    /// May start a first attempt; left only by a claim.
    Ready,
    /// An attempt is claimed at `owner_epoch` under a lease.
    Running,
    /// A provider call may have happened without a confirmed outcome; waits for a decision.
    Unknown,
    /// Another attempt is explicitly permitted; left by a claim.
    RetryAuthorized,
    /// Terminal: a result was accepted.
    Succeeded,
    /// Terminal: the job failed for good (permanent error or attempt budget spent).
    FailedTerminal,
    /// Terminal: the job's fixed deadline passed before a result was accepted.
    Expired,
    /// Terminal: an operator cancelled the job; no result is accepted after the cancel.
    Cancelled,
}

impl JobState {
    /// Every state, in the order of the state table of `docs/protocol.md`.
    pub const ALL: [JobState; 8] = [
        JobState::Ready,
        JobState::Running,
        JobState::Unknown,
        JobState::RetryAuthorized,
        JobState::Succeeded,
        JobState::FailedTerminal,
        JobState::Expired,
        JobState::Cancelled,
    ];

    /// The lowercase name stored in the `state` attribute.
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Ready => "ready",
            JobState::Running => "running",
            JobState::Unknown => "unknown",
            JobState::RetryAuthorized => "retry_authorized",
            JobState::Succeeded => "succeeded",
            JobState::FailedTerminal => "failed_terminal",
            JobState::Expired => "expired",
            JobState::Cancelled => "cancelled",
        }
    }

    /// The terminal states, each once.
    pub const TERMINAL: [JobState; 4] = [
        JobState::Succeeded,
        JobState::FailedTerminal,
        JobState::Expired,
        JobState::Cancelled,
    ];

    /// Terminal states are immutable: no write may leave them.
    pub fn is_terminal(self) -> bool {
        Self::TERMINAL.contains(&self)
    }

    /// States a claim may start an attempt from.
    pub(crate) fn is_claimable(self) -> bool {
        matches!(self, JobState::Ready | JobState::RetryAuthorized)
    }
}

impl fmt::Display for JobState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A stored `state` value that names no known state.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("unknown job state {0:?}")]
pub struct UnknownState(pub String);

impl FromStr for JobState {
    type Err = UnknownState;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        JobState::ALL
            .into_iter()
            .find(|state| state.as_str() == s)
            .ok_or_else(|| UnknownState(s.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_only_four_are_terminal() {
        for state in JobState::ALL {
            assert_eq!(state.as_str().parse::<JobState>(), Ok(state));
        }
        let terminal: Vec<_> = JobState::ALL
            .into_iter()
            .filter(|s| s.is_terminal())
            .collect();
        assert_eq!(
            terminal,
            [
                JobState::Succeeded,
                JobState::FailedTerminal,
                JobState::Expired,
                JobState::Cancelled
            ]
        );
        assert!("Running".parse::<JobState>().is_err());
    }
}
