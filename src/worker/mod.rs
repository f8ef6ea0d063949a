//! The worker: one `SqsEvent` in, one batch response out.
//!
//! - [`handler`]: the batch: grouping by job, concurrency, panics, final visibility (its
//!   bodies read and parsed by `bodies`, within the memory set aside for payloads);
//! - [`processor`]: one delivery: claim or classify, call, end the attempt;
//! - [`heartbeat`]: keeps records invisible and leases renewed while calls run;
//! - [`admission`]: pure: the writes a delivery makes before its call, as a machine;
//! - [`batch`]: pure: which records the response names;
//! - [`calling`]: pure: the call of one attempt and its polling, as a machine;
//! - [`ending`]: pure: how an attempt ends, from the provider's word, and the machine of the
//!   writes that record it;
//! - [`pacing`]: the provider's limits: capacity shared in chunks, an adaptive limit;
//! - [`routing`]: pure: which of the deployment's providers takes an attempt;
//! - [`settings`]: the worker's own settings.

pub mod admission;
pub mod batch;
mod bodies;
pub mod calling;
pub mod ending;
mod gather;
pub mod handler;
pub mod heartbeat;
pub mod pacing;
pub mod processor;
pub mod routing;
pub mod settings;

pub use handler::BatchHandler;
pub use processor::{Invocation, Processor};
pub use settings::{ReplayPolicy, Settings};

/// Runs `fut` until the instant `until` (by `clock`), if there is one; `None` when cut off.
async fn within<T>(
    clock: &impl crate::clock::Clock,
    until: Option<crate::job::Millis>,
    fut: impl std::future::Future<Output = T>,
) -> Option<T> {
    match until {
        None => Some(fut.await),
        Some(at) => {
            let left = u64::try_from(at - clock.now_ms()).unwrap_or(0);
            tokio::time::timeout(std::time::Duration::from_millis(left), fut)
                .await
                .ok()
        }
    }
}

/// The item a fresh claim of job `j` at `now` leaves, with a lease of 30 s (the machines' tests).
#[cfg(test)]
pub(crate) fn claimed_example(
    deadline_at: crate::job::Millis,
    now: crate::job::Millis,
    provider_ref: Option<String>,
) -> crate::job::JobRecord {
    let req = crate::ledger::ClaimRequest {
        route: None,
        job: crate::job::NewJob::example("j", deadline_at),
        expect: crate::job::decision::Expect::FRESH,
        owner_id: "o".into(),
        now,
        lease_until: now + 30_000,
        provider_ref,
        first_sight: true,
    };
    crate::ledger::transitions::apply_claim(None, &req).expect("claimed")
}
