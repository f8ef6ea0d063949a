//! The delivery protocol, pure: what a delivery does from the item it reads to the write that
//! ends its attempt, as machines that take what the world said and say what to do next. The
//! worker carries their steps out against the ledger, the provider and the queue; the model
//! checker drives the same machines with the world's choices.
//!
//! - [`admission`]: the writes before the call (capacity, claim, settle or recover, the reads
//!   that look for a claim whose answer was lost);
//! - [`calling`]: the call of one attempt (its budget, a 429's re-send, a background call's
//!   reference and polling, the cancel) and a recovery's question to the provider;
//! - [`ending`]: how an attempt ends, from the provider's word, and the writes that record it;
//! - [`delivery`]: the three composed as one delivery, with the decisions between them (the
//!   provider a claim goes to, a look at a running batch, what a call is charged, the
//!   fallback);
//! - [`owner`]: every write an owner makes, each conditional on its epoch;
//! - [`renewal`]: the heartbeat's rules (a record's visibility, a lease renewal's answer);
//! - [`routing`]: which of the deployment's providers takes an attempt.

pub mod admission;
pub mod calling;
pub mod delivery;
pub mod ending;
pub mod owner;
pub mod renewal;
pub mod routing;

/// What happens to an attempt whose outcome is unknown (the call may have run).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ReplayPolicy {
    /// `never`: the job becomes `unknown` and waits for retrieval or an operator.
    #[default]
    Never,
    /// `replay`: possible duplicate inference and cost are accepted; the decision is recorded
    /// and another attempt authorised, within the same attempt budget and deadline.
    Replay,
}

/// The item a fresh claim of job `j` at `now` leaves, with a lease of 30 s (the machines' tests).
#[cfg(test)]
pub(crate) fn claimed_example(
    deadline_at: crate::job::Millis,
    now: crate::job::Millis,
    provider_ref: Option<String>,
) -> crate::job::JobItem {
    let req = crate::ledger::ClaimRequest {
        route: None,
        job: crate::job::NewJob::example("j", deadline_at),
        expect: crate::job::decision::Expect::FRESH,
        owner_id: "o".into(),
        now,
        lease_until: now + 30_000,
        provider_ref,
        first_sight: true,
        list_due: false,
    };
    crate::ledger::transitions::apply_claim(None, &req).expect("claimed")
}
