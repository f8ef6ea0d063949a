//! Operations around the worker: putting jobs in ([`producer`]), repairing what crashes leave
//! ([`reconcile`]), deciding about jobs by hand ([`operator`]), announcing how jobs ended
//! ([`dispatch`]) and announcing again what it gave up on ([`replay`]), reading results out
//! ([`results`]) into safe files ([`files`]), the day's spend ([`spend`]), the metric
//! documents of the functions ([`metrics`]) and the provider's webhooks that say a batch ended
//! ([`webhook`]).

pub mod dispatch;
pub mod files;
pub mod metrics;
pub mod operator;
pub mod producer;
pub mod reconcile;
pub mod replay;
pub mod results;
pub mod spend;
pub mod webhook;

/// Ledger calls in flight at once (the producer's and the reconciler's).
pub(crate) const CONCURRENCY: usize = 16;
