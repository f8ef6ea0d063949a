//! Operations around the worker: putting jobs in ([`producer`]), repairing what crashes leave
//! ([`reconcile`]), deciding about jobs by hand ([`operator`]), and the metric documents of both
//! functions ([`metrics`]).

pub mod metrics;
pub mod operator;
pub mod producer;
pub mod reconcile;

/// Ledger calls in flight at once (the producer's and the reconciler's).
pub const CONCURRENCY: usize = 16;
