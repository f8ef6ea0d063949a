//! How an attempt ends: pure functions of the provider's word, the job and the clock, and the
//! machine ([`Ending`], in [`machine`]) that records the end with the owner's writes, with no
//! I/O. The processor carries its steps out; the protocol's model checker (`make model-check`)
//! drives the same functions and the same machine through every interleaving it explores.

mod machine;

pub use machine::{Closed, EndFacts, EndStep, EndWrite, Ending, Placed, Waited};

use super::ReplayPolicy;
use crate::job::decision::{DeadlinePhase, deadline_phase};
use crate::job::{AttemptEntry, AttemptOutcome, GIVEN_BACK_KEPT, JobItem, Millis, ResultBody};
use crate::ledger::AttemptEnd;
use crate::provider::{Answer, ProviderError};

/// The wait after a 429 that named none.
pub(crate) const THROTTLE_PAUSE_MS: Millis = 1_000;

/// How the current attempt of `job` ends, from what the provider said (by the call or by a
/// retrieval), and the wait the provider asked for, if any. Where an answer is kept is decided
/// later, when the attempt's end is written.
pub fn attempt_end(
    result: Result<Answer, ProviderError>,
    job: &JobItem,
    now: Millis,
    replay: ReplayPolicy,
) -> (AttemptEnd, Option<Millis>) {
    match result {
        Ok(answer) => (
            AttemptEnd::Succeeded {
                result: ResultBody::Inline(answer.body),
                finish: answer.finish,
            },
            None,
        ),
        Err(ProviderError::InvalidOutput(rejected)) => {
            // The call ran and its answer is known: a definite outcome, which spends the
            // attempt. The job fails with it if its contract says so or no budget is left.
            let end = if now >= job.deadline_at {
                AttemptEnd::Expired
            } else {
                let last = rejected.terminal || job.attempts >= job.max_attempts;
                AttemptEnd::Invalid { rejected, last }
            };
            (end, None)
        }
        Err(ProviderError::Throttled {
            retry_after_ms,
            reason,
        }) => {
            // Refused for the rate limit before any work: the attempt is given back, whatever
            // the budget.
            let end = if now >= job.deadline_at {
                AttemptEnd::Expired
            } else {
                given_back(AttemptOutcome::Throttled, reason, job, now)
            };
            (end, retry_after_ms)
        }
        Err(ProviderError::Transient {
            retry_after_ms,
            reason,
        }) => {
            let end = if now >= job.deadline_at {
                AttemptEnd::Expired
            } else if job.attempts >= job.max_attempts {
                AttemptEnd::FailedTerminal {
                    kind: "budget",
                    error: format!("attempt budget spent; last error: {reason}"),
                }
            } else {
                AttemptEnd::RetryAuthorized { error: reason }
            };
            (end, retry_after_ms)
        }
        Err(ProviderError::Permanent { reason }) => (
            AttemptEnd::FailedTerminal {
                kind: "permanent",
                error: reason,
            },
            None,
        ),
        Err(ProviderError::Uncertain { evidence }) => {
            (uncertain_end(evidence, job, now, replay), None)
        }
    }
}

/// How an attempt whose call was never sent ends (no time was left for it, or the lease lapsed
/// before it left): nothing ran, so the attempt is given back, as after a throttle; past the
/// deadline the job expires.
pub fn not_sent_end(reason: &str, job: &JobItem, now: Millis) -> AttemptEnd {
    if now >= job.deadline_at {
        return AttemptEnd::Expired;
    }
    given_back(AttemptOutcome::NotSent, reason.to_owned(), job, now)
}

/// The end that gives `job`'s current attempt back, marked `why`: its log entry joins the
/// given-back attempts the job keeps (the last [`GIVEN_BACK_KEPT`]).
fn given_back(why: AttemptOutcome, error: String, job: &JobItem, now: Millis) -> AttemptEnd {
    let mut kept = job.given_back.clone();
    if let Some(attempt) = job.attempt_log.last() {
        kept.push(AttemptEntry {
            outcome: why,
            finished_at: Some(now),
            ..attempt.clone()
        });
    }
    let excess = kept.len().saturating_sub(GIVEN_BACK_KEPT);
    kept.drain(..excess);
    AttemptEnd::GivenBack {
        why,
        error,
        given_back: kept,
    }
}

/// How an attempt with an unknown outcome ends: `unknown`, waiting for a decision, unless the
/// replay policy accepts a possible duplicate call and the job has budget and time left, in
/// which case that decision is recorded and another attempt authorised. An attempt already
/// recorded uncertain (a job that was `unknown` before this delivery asked about it again) is
/// never replayed by the policy: it applies when the uncertainty arises, so turning it on does
/// not replay old `unknown` jobs.
pub(crate) fn uncertain_end(
    evidence: String,
    job: &JobItem,
    now: Millis,
    replay: ReplayPolicy,
) -> AttemptEnd {
    let already_unknown = job
        .attempt_log
        .last()
        .is_some_and(|a| a.outcome == AttemptOutcome::Uncertain);
    let replays = replay == ReplayPolicy::Replay
        && !already_unknown
        && job.attempts < job.max_attempts
        && now < job.deadline_at;
    if replays {
        AttemptEnd::Replay {
            evidence,
            by: "replay-policy".to_owned(),
        }
    } else {
        AttemptEnd::Unknown { evidence }
    }
}

/// The end an owner may write at `now`: an answer that comes within the clock-skew margin of the
/// deadline is not accepted (a clock behind by the margin could accept it after the deadline),
/// and the attempt expires instead. Any other end is written as it is.
pub(crate) fn acceptable_end(
    end: AttemptEnd,
    deadline_at: Millis,
    now: Millis,
    skew_ms: Millis,
) -> AttemptEnd {
    let open = deadline_phase(deadline_at, now, skew_ms) == DeadlinePhase::Open;
    if matches!(end, AttemptEnd::Succeeded { .. }) && !open {
        AttemptEnd::Expired
    } else {
        end
    }
}

/// Whether the claimant's lease still holds at `now` by more than the clock-skew margin: the
/// last check before a call leaves, which nothing in the ledger can fence once it has.
pub(crate) fn lease_holds(claimed: &JobItem, now: Millis, skew_ms: Millis) -> bool {
    claimed
        .owner_until
        .is_some_and(|until| now.saturating_add(skew_ms) < until)
}

/// An attempt whose answer cannot be kept: the same call would give it again, so it is
/// terminal, with the reason recorded.
pub fn too_large(why: &str) -> AttemptEnd {
    AttemptEnd::FailedTerminal {
        kind: "too_large",
        error: why.to_owned(),
    }
}
