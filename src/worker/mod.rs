//! The worker: one `SqsEvent` in, one batch response out.
//!
//! - [`handler`]: the batch: grouping by job, concurrency, panics, final visibility (its
//!   bodies read and parsed by `bodies`, within the memory set aside for payloads);
//! - [`processor`]: one delivery: carries out the steps of the protocol's machines
//!   ([`crate::protocol`]) against the ledger, the provider and the pacer;
//! - [`heartbeat`]: keeps records invisible and leases renewed while calls run;
//! - [`batch`]: pure: which records the response names;
//! - [`pacing`]: the provider's limits: capacity shared in chunks, an adaptive limit;
//! - [`settings`]: the worker's own settings.

pub mod batch;
mod bodies;
mod gather;
pub mod handler;
pub mod heartbeat;
pub mod pacing;
pub mod processor;
pub mod settings;

pub use handler::BatchHandler;
pub use processor::{Invocation, Processor};
pub use settings::Settings;

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
