//! What a delivery may do with a job, given the ledger's view of it.

use super::{JobItem, JobState, Millis};

/// The (epoch, attempts) a claim expects to find. `Expect::FRESH` also matches an absent item,
/// so a message that carries a new job is claimed with one write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Expect {
    /// The `owner_epoch` the item must hold.
    pub epoch: u64,
    /// The `attempts` the item must hold.
    pub attempts: u32,
}

impl Expect {
    /// An absent item, or one created `ready` by a producer and never claimed.
    pub const FRESH: Expect = Expect {
        epoch: 0,
        attempts: 0,
    };

    /// True when an absent item satisfies this expectation.
    pub(crate) fn allows_absent(self) -> bool {
        self == Expect::FRESH
    }
}

/// Why a job is settled without a claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SettleReason {
    /// The fixed deadline has passed.
    DeadlinePassed,
    /// Every attempt of the budget was used.
    BudgetSpent,
    /// The job's stored input is gone, or is not what its digest says: no call can be made.
    InputLost,
    /// The next call's estimated cost would take the job's spend past its `max_cost`.
    SpendLimit,
    /// The fixed deadline has passed, and the ledger never kept the job's input: it ran only on
    /// its first claim, and no delivery of its message (the input's only copy) came back.
    MessageLost,
}

impl SettleReason {
    /// The terminal state this reason leads to.
    pub fn target(self) -> JobState {
        match self {
            SettleReason::DeadlinePassed | SettleReason::MessageLost => JobState::Expired,
            SettleReason::BudgetSpent | SettleReason::InputLost | SettleReason::SpendLimit => {
                JobState::FailedTerminal
            }
        }
    }

    /// The `last_error.kind` recorded with it.
    pub fn kind(self) -> &'static str {
        match self {
            SettleReason::DeadlinePassed => "deadline",
            SettleReason::BudgetSpent => "budget",
            SettleReason::InputLost => "input_lost",
            SettleReason::SpendLimit => "spend",
            SettleReason::MessageLost => "message_lost",
        }
    }
}

/// The next step for a delivery of a job whose ledger item is `record`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// The message's input differs from the job's: never a new run.
    Conflict {
        /// The digest the ledger holds.
        ledger_digest: String,
    },
    /// The job is terminal: the delivery is done.
    Finished(JobState),
    /// A live owner holds the job; come back after its lease.
    Defer {
        /// Milliseconds until the lease (plus the skew margin) lapses.
        remaining_ms: Millis,
    },
    /// The owner's lease lapsed: only a recovery claim may look at the job now.
    AwaitRecovery,
    /// The job is `unknown`: it waits for retrieval or a recorded decision.
    AwaitDecision,
    /// Settle the job as terminal with one conditional write, without a claim.
    Settle(SettleReason),
    /// Claim the job, expecting these values.
    Claim(Expect),
}

/// Where `now` stands against a deadline, with the clock-skew margin on both sides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeadlinePhase {
    /// More than the margin ahead: claims and acceptances are allowed.
    Open,
    /// Within the margin on either side: no claim, no acceptance, no expiry by anyone but the
    /// owner ending its own attempt; wait this long for the deadline to be surely past.
    Closing {
        /// Until `deadline + skew`.
        remaining_ms: Millis,
    },
    /// More than the margin behind: every clock within the margin agrees it has passed.
    Passed,
}

/// The phase of `deadline_at` at `now`, for clocks up to `skew_ms` apart.
pub fn deadline_phase(deadline_at: Millis, now: Millis, skew_ms: Millis) -> DeadlinePhase {
    let expires_at = deadline_at.saturating_add(skew_ms);
    if now >= expires_at {
        DeadlinePhase::Passed
    } else if now.saturating_add(skew_ms) >= deadline_at {
        DeadlinePhase::Closing {
            remaining_ms: (expires_at - now).max(1),
        }
    } else {
        DeadlinePhase::Open
    }
}

/// Decides what a delivery carrying `digest` may do with `record` at `now`.
///
/// `skew_ms` is the margin for clocks that disagree, applied on every side: a receiver treats a
/// lease as lapsed only `skew_ms` after its recorded end (an owner whose clock runs behind is not
/// taken over early); a job is settled as past its deadline only `skew_ms` after it (no clock
/// that runs ahead expires a job early), and no attempt is claimed within `skew_ms` of it (an
/// answer then could not be accepted safely). Inside that window the delivery defers until it
/// ends.
pub fn next_step(record: &JobItem, digest: &str, now: Millis, skew_ms: Millis) -> Next {
    if record.input_digest != digest {
        return Next::Conflict {
            ledger_digest: record.input_digest.clone(),
        };
    }
    if record.state.is_terminal() {
        return Next::Finished(record.state);
    }
    let phase = deadline_phase(record.deadline_at, now, skew_ms);
    let deadline_passed = phase == DeadlinePhase::Passed;
    // Inside the margin: wait until the deadline is surely past.
    let closing = match phase {
        DeadlinePhase::Closing { remaining_ms } => Some(Next::Defer { remaining_ms }),
        _ => None,
    };
    match record.state {
        JobState::Running => {
            let lapses_at = record.owner_until.unwrap_or(0).saturating_add(skew_ms);
            if now < lapses_at {
                Next::Defer {
                    remaining_ms: lapses_at - now,
                }
            } else if deadline_passed {
                // Nobody can accept a result any more, and the settling write raises no epoch
                // but is conditional on the one seen, so a resumed owner is refused.
                Next::Settle(SettleReason::DeadlinePassed)
            } else if let Some(wait) = closing {
                wait
            } else {
                Next::AwaitRecovery
            }
        }
        JobState::Unknown if deadline_passed => Next::Settle(SettleReason::DeadlinePassed),
        JobState::Unknown => Next::AwaitDecision,
        _ if deadline_passed => Next::Settle(SettleReason::DeadlinePassed),
        _ => match closing {
            Some(wait) => wait,
            None if record.attempts >= record.max_attempts => {
                Next::Settle(SettleReason::BudgetSpent)
            }
            None => Next::Claim(Expect {
                epoch: record.owner_epoch,
                attempts: record.attempts,
            }),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::NewJob;

    const NOW: Millis = 1_000_000;

    fn record(state: JobState) -> JobItem {
        let mut r = NewJob::example("j", NOW + 60_000).into_record(state, NOW - 10_000);
        r.owner_epoch = 2;
        r.attempts = 1;
        r
    }

    #[test]
    fn a_different_digest_is_a_conflict_even_on_a_terminal_job() {
        let r = record(JobState::Succeeded);
        assert_eq!(
            next_step(&r, "other", NOW, 0),
            Next::Conflict {
                ledger_digest: "d".into()
            }
        );
    }

    #[test]
    fn terminal_jobs_are_finished() {
        for state in [
            JobState::Succeeded,
            JobState::FailedTerminal,
            JobState::Expired,
            JobState::Cancelled,
        ] {
            assert_eq!(
                next_step(&record(state), "d", NOW, 0),
                Next::Finished(state)
            );
        }
    }

    #[test]
    fn a_live_lease_defers_for_its_remaining_time_plus_skew() {
        let mut r = record(JobState::Running);
        r.owner_until = Some(NOW + 5_000);
        assert_eq!(
            next_step(&r, "d", NOW, 1_000),
            Next::Defer {
                remaining_ms: 6_000
            }
        );
        // Lapsed, even counting the skew: investigation only, never a claim.
        assert_eq!(next_step(&r, "d", NOW + 6_000, 1_000), Next::AwaitRecovery);
        r.deadline_at = NOW;
        assert_eq!(
            next_step(&r, "d", NOW + 6_000, 1_000),
            Next::Settle(SettleReason::DeadlinePassed)
        );
    }

    #[test]
    fn claimable_jobs_are_claimed_at_their_current_values_unless_out_of_time_or_budget() {
        let r = record(JobState::RetryAuthorized);
        assert_eq!(
            next_step(&r, "d", NOW, 0),
            Next::Claim(Expect {
                epoch: 2,
                attempts: 1
            })
        );
        let mut spent = r.clone();
        spent.attempts = 3;
        assert_eq!(
            next_step(&spent, "d", NOW, 0),
            Next::Settle(SettleReason::BudgetSpent)
        );
        assert_eq!(
            next_step(&r, "d", r.deadline_at, 0),
            Next::Settle(SettleReason::DeadlinePassed)
        );
    }

    #[test]
    fn the_skew_margin_applies_on_both_sides_of_the_deadline() {
        let r = record(JobState::Ready);
        let skew = 2_000;
        // Well before: claim. Within the margin before: no claim (an answer could not be
        // accepted safely). Within the margin after: no expiry yet. Past it: expire.
        assert!(matches!(
            next_step(&r, "d", r.deadline_at - skew - 1, skew),
            Next::Claim(_)
        ));
        assert_eq!(
            next_step(&r, "d", r.deadline_at - skew, skew),
            Next::Defer {
                remaining_ms: 2 * skew
            }
        );
        assert_eq!(
            next_step(&r, "d", r.deadline_at + skew - 1, skew),
            Next::Defer { remaining_ms: 1 }
        );
        assert_eq!(
            next_step(&r, "d", r.deadline_at + skew, skew),
            Next::Settle(SettleReason::DeadlinePassed)
        );
    }

    #[test]
    fn unknown_jobs_wait_for_a_decision() {
        let r = record(JobState::Unknown);
        assert_eq!(next_step(&r, "d", NOW, 0), Next::AwaitDecision);
        assert_eq!(
            next_step(&r, "d", r.deadline_at + 1, 0),
            Next::Settle(SettleReason::DeadlinePassed)
        );
    }
}
