//! The worker: one `SqsEvent` in, one batch response out.
//!
//! - [`handler`]: the batch: parsing, grouping by job, concurrency, panics, final visibility;
//! - [`processor`]: one delivery: claim or classify, call, end the attempt;
//! - [`heartbeat`]: keeps records invisible and leases renewed while calls run;
//! - [`batch`]: pure: which records the response names;
//! - [`ending`]: pure: how an attempt ends, from the provider's word;
//! - [`pacing`]: the provider's limits: capacity shared in chunks, an adaptive limit;
//! - [`settings`]: the worker's own settings.

pub mod batch;
pub mod ending;
pub mod handler;
pub mod heartbeat;
pub mod pacing;
pub mod processor;
pub mod settings;

pub use handler::BatchHandler;
pub use processor::{Invocation, Processor};
pub use settings::{ReplayPolicy, Settings};
