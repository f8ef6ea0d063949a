//! fenced-jobs: an SQS-triggered AWS Lambda function that runs long jobs (LLM calls above all)
//! safely under at-least-once delivery, fenced by a DynamoDB job ledger.
//!
//! # Layout
//!
//! - [`job`]: pure logic, no I/O, no clock, no AWS types: the ledger record, its states, the
//!   message contract and digest, the decision for a delivery, record outcomes and visibility.
//! - [`batch`]: pure: which records a batch response names, and what makes a response invalid.
//! - [`ledger`]: the `JobLedger` trait, one conditional write per transition;
//!   [`ledger::dynamodb`] (DynamoDB) and [`ledger::memory`] (same contract, for tests).
//! - [`provider`]: the `Provider` trait for the model call: simulated, OpenAI-compatible and
//!   Bedrock providers.
//! - [`visibility`]: batched `ChangeMessageVisibility` for records that stay in the queue.
//! - [`processor`]: one delivery: claim or classify, call, end the attempt; traits only.
//! - [`handler`]: one `SqsEvent` to one `SqsBatchResponse`: grouping, concurrency, panics,
//!   visibility.
//! - [`event_source`]: a local event source mapping for the emulator (demo and tests).
//! - [`config`], [`clock`], [`sdk_calls`], [`logs`], [`metrics`]: configuration, injected time,
//!   request counting, JSON logs, embedded metrics.
//! - [`operator`]: reading and deciding about jobs; `bin/jobctl.rs` is its command line.
//! - [`producer`]: `submit`: ledger first (`ready`), then the triggers, then the enqueue.
//! - [`reconcile`]: re-sends lost triggers and expires jobs past their deadline, from the
//!   sparse indexes; `bin/reconciler.rs` is its scheduled Lambda function.
//! - `bin/worker.rs`: the Lambda entry point.
//!
//! # Data flow of one invocation
//!
//! parse each body (invalid: poison, ledger untouched) -> group records by job_id -> per job,
//! one conditional claim (refused: the old item says why: terminal, live owner, conflict,
//! unknown, out of time or budget) -> provider call bounded by the lease, the job deadline and
//! the invocation deadline -> one conditional write ending the attempt -> visibility for every
//! failure -> the batch response (successes are terminal jobs only).

pub mod batch;
pub mod clock;
pub mod config;
pub mod event_source;
pub mod handler;
pub mod heartbeat;
pub mod job;
pub mod ledger;
pub mod logs;
pub mod metrics;
pub mod operator;
pub mod processor;
pub mod producer;
pub mod provider;
pub mod reconcile;
pub mod sdk_calls;
pub mod visibility;
