//! x
pub mod batch;
pub mod clock;
pub mod config;
pub mod event_source;
pub mod handler;
pub mod job;
pub mod ledger;
pub mod processor;
pub mod provider;
pub mod sdk_calls;
pub mod visibility;
