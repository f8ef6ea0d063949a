//! What operators write: a decision about an `unknown` job, and a cancel.

use crate::job::{JobState, Millis};

/// What an operator decides about a job that is `unknown`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OperatorAction {
    /// Accept a possible duplicate call: `retry_authorized`.
    AuthorizeRetry,
    /// Give the job up: `failed_terminal`.
    Fail,
}

impl OperatorAction {
    /// The state the job moves to.
    pub fn target(self) -> JobState {
        match self {
            OperatorAction::AuthorizeRetry => JobState::RetryAuthorized,
            OperatorAction::Fail => JobState::FailedTerminal,
        }
    }

    /// The `action` recorded in the decision.
    pub fn as_str(self) -> &'static str {
        match self {
            OperatorAction::AuthorizeRetry => "authorize_retry",
            OperatorAction::Fail => "fail",
        }
    }
}

/// An operator's decision about an `unknown` job.
///
/// Condition: `unknown` at exactly `epoch`. Effect: epoch + 1 (fencing anything still holding
/// the old epoch), the action's state, and the decision recorded with who, why and when.
#[derive(Debug, Clone, PartialEq)]
pub struct DecideRequest {
    /// Job id.
    pub job_id: String,
    /// The epoch the operator saw.
    pub epoch: u64,
    /// What is decided.
    pub action: OperatorAction,
    /// The operator's identity, as they gave it.
    pub by: String,
    /// The principal AWS authenticated for the operator (`sts:GetCallerIdentity`).
    pub caller: Option<String>,
    /// Why.
    pub reason: String,
    /// The operator's clock.
    pub now: Millis,
}

impl DecideRequest {
    /// The decision recorded on the job.
    pub fn decision(&self) -> crate::job::DecisionRecord {
        crate::job::DecisionRecord {
            epoch: self.epoch + 1,
            action: self.action.as_str().to_owned(),
            by: self.by.clone(),
            caller: self.caller.clone(),
            reason: self.reason.clone(),
            at: self.now,
        }
    }
}

/// An operator cancels a job.
///
/// Condition: not terminal, in `seen` at exactly `epoch`; when `seen` is `running`, with no
/// cancel request yet. Effect, from `ready`, `retry_authorized` or `unknown`: `cancelled`, the
/// epoch raised (fencing anything that holds the old one) and the decision recorded. From
/// `running`: `cancel_requested` set and the decision recorded, the epoch and the lease left to
/// the owner, who learns it at its next renewal or end and ends the attempt `cancelled`.
#[derive(Debug, Clone, PartialEq)]
pub struct CancelRequest {
    /// Job id.
    pub job_id: String,
    /// The state the operator saw.
    pub seen: JobState,
    /// The epoch the operator saw.
    pub epoch: u64,
    /// The operator's identity, as they gave it.
    pub by: String,
    /// The principal AWS authenticated for the operator.
    pub caller: Option<String>,
    /// Why.
    pub reason: String,
    /// The operator's clock.
    pub now: Millis,
}

impl CancelRequest {
    /// Whether the write ends the job at once (anything but a running job).
    pub fn immediate(&self) -> bool {
        self.seen != JobState::Running
    }

    /// The decision recorded on the job.
    pub fn decision(&self) -> crate::job::DecisionRecord {
        crate::job::DecisionRecord {
            epoch: self.epoch + u64::from(self.immediate()),
            action: "cancel".to_owned(),
            by: self.by.clone(),
            caller: self.caller.clone(),
            reason: self.reason.clone(),
            at: self.now,
        }
    }

    /// The `last_error` an immediate cancel records.
    pub fn error(&self) -> crate::job::ErrorRecord {
        crate::job::ErrorRecord {
            kind: "cancelled".to_owned(),
            message: format!("cancelled by {}", self.by),
            at: self.now,
        }
    }
}
