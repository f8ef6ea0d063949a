//! The heartbeat's rules, pure: how far a record's visibility is extended, and what the answer
//! to a lease renewal means (the heartbeat acts on them; the model checker explores them).

use crate::job::{JobState, Millis};
use crate::ledger::Write;

/// Retries of an uncertain renewal within one tick, while the remaining validity allows them.
pub(crate) const RENEWAL_RETRIES: u32 = 2;

/// The clocks a renewal's answer is read against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RenewalTicks {
    /// The worker's clock when the answer came.
    pub now: Millis,
    /// The clock-skew margin.
    pub skew_ms: Millis,
    /// The heartbeat's interval: the next renewal comes this much later.
    pub heartbeat_ms: Millis,
    /// The pause before the first retry of a failed renewal; doubled for each one after.
    pub first_pause_ms: Millis,
}

/// The seconds a heartbeat asks for a record at `now`: its visibility extended to the queue's
/// visibility timeout from now, but never past `cap` (12 hours from its receive, less the
/// margin: [`crate::job::outcome::receive_cap`]) nor the `deadline_at` of the job whose call it carries, and only
/// when that reaches past `visible_until`, what the record already has. `None`: no change.
pub fn extension_s(
    now: Millis,
    queue_visibility_s: i64,
    cap: Millis,
    visible_until: Millis,
    deadline_at: Option<Millis>,
) -> Option<i32> {
    let until = now
        .saturating_add(queue_visibility_s.saturating_mul(1000))
        .min(cap)
        .min(deadline_at.unwrap_or(Millis::MAX));
    if until <= visible_until {
        return None;
    }
    let seconds = (until - now) / 1000;
    (seconds >= 1).then_some(seconds.min(i64::from(i32::MAX)) as i32)
}

/// What one answer to a running call's lease renewal means.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Renewed {
    /// Applied: the lease runs to `until`.
    Extended {
        /// The lease's new end.
        until: Millis,
    },
    /// Refused with the job still ours under another lease: an earlier renewal of ours was
    /// applied and its answer lost. Renew again from `until`.
    Adopted {
        /// The lease as it stands.
        until: Millis,
    },
    /// Refused: ownership is lost, and the call is cancelled.
    Lost,
    /// Refused: the job is still ours, and an operator asked to cancel it. The call is
    /// stopped (and cancelled upstream where the provider can) and the attempt ends
    /// `cancelled`.
    Withdrawn,
    /// No answer: try again after `pause_ms`, which still leaves the lease holding.
    Retry {
        /// The pause before the next try.
        pause_ms: Millis,
    },
    /// No answer and no time for another try; `cancel`: the lease lapses (less the margin)
    /// before the next heartbeat, so the call is cancelled rather than left running unowned.
    Uncertain {
        /// Cancel the call.
        cancel: bool,
    },
}

/// What the answer to try `attempt` (from 0) at renewing the lease of a call of `epoch`, which
/// held until `lease_until`, means (`answer`: `None` when the request failed). The heartbeat
/// acts on it and the model checker explores it.
pub fn after_renewal(
    answer: Option<&Write>,
    epoch: u64,
    attempt: u32,
    lease_until: Millis,
    ticks: RenewalTicks,
) -> Renewed {
    match answer {
        Some(Write::Applied(record)) => Renewed::Extended {
            until: record.owner_until.unwrap_or(lease_until),
        },
        Some(Write::Refused(Some(seen)))
            if seen.state == JobState::Running
                && seen.owner_epoch == epoch
                && seen.cancel_requested.is_some() =>
        {
            Renewed::Withdrawn
        }
        Some(Write::Refused(Some(seen)))
            if seen.state == JobState::Running
                && seen.owner_epoch == epoch
                && attempt < RENEWAL_RETRIES =>
        {
            Renewed::Adopted {
                until: seen.owner_until.unwrap_or(lease_until),
            }
        }
        Some(Write::Refused(_)) => Renewed::Lost,
        None => {
            let pause_ms = ticks.first_pause_ms << attempt;
            if attempt < RENEWAL_RETRIES && ticks.now + pause_ms < lease_until - ticks.skew_ms {
                Renewed::Retry { pause_ms }
            } else {
                Renewed::Uncertain {
                    cancel: lease_until - ticks.skew_ms <= ticks.now + ticks.heartbeat_ms,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
