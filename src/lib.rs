//! fenced-jobs: an SQS-triggered AWS Lambda function that runs long jobs (LLM calls above all)
//! safely under at-least-once delivery, fenced by a DynamoDB job ledger.
//!
//! # Layout
//!
//! Read it as floors; a module imports only from the floors below it (checked by
//! `scripts/check_layout.py` in `make test`):
//!
//! 1. [`job`]: pure logic, no I/O, no clock, no AWS types: the ledger item, its states, the
//!    message contract and digest, the decision for a delivery, record outcomes and visibility,
//!    output contracts (which answer a job asked for, and judging one).
//!    Beside it, [`clock`] (injected time) and [`vars`] (reading settings from the environment).
//! 2. [`ledger`]: the `JobLedger` trait (one conditional write per transition) and the
//!    `LedgerIndex` trait (the sparse indexes), in DynamoDB ([`ledger::dynamodb`]) and in memory
//!    ([`ledger::memory`], same contract). [`provider`]: the `Provider` trait for the model call
//!    (simulated, OpenAI-compatible, Bedrock) and its keys. [`queue`]: the visibility of records
//!    and the sending of triggers, on SQS. [`blobs`]: objects in S3 (large answers and inputs,
//!    Extended Client payloads). [`events`]: completion events and where they are published.
//!    [`report`]: what a run did, as plain data. [`telemetry`]: the functions' spans through
//!    OpenTelemetry, provider calls as GenAI spans.
//! 3. [`protocol`]: the delivery protocol, pure: the machines of a delivery (admission, calling,
//!    ending), the heartbeat's rules and the routing, which the worker carries out and the
//!    model checker drives.
//! 4. [`worker`]: the batch handler, the processor (one delivery), the heartbeat, the batch
//!    response and the worker's settings. [`ops`]: the producer, the reconciler, operator
//!    decisions, the dispatcher of completion events and the metric documents.
//! 5. [`config`] assembles each binary's configuration; [`logs`] sets up logging and tracing;
//!    `testing` (feature `test-support`) holds the local event source and the request counter;
//!    `bin/worker.rs`, `bin/reconciler.rs`, `bin/dispatcher.rs` and `bin/jobctl.rs` are the
//!    entry points.
//!
//! # Data flow of one invocation
//!
//! parse each body (invalid: poison, ledger untouched) -> group records by job_id -> per job,
//! one conditional claim (refused: the old item says why: terminal, live owner, conflict,
//! unknown, out of time or budget) -> provider call bounded by the lease, the job deadline and
//! the invocation deadline -> one conditional write ending the attempt -> visibility for every
//! failure -> the batch response (successes are terminal jobs only).

// The library's surface: a `pub` item is reachable from the crate root, or it is `pub(crate)`.
#![warn(unreachable_pub)]

pub mod blobs;
pub mod clock;
pub mod config;
pub mod events;
pub mod job;
pub mod ledger;
pub mod logs;
pub mod ops;
pub mod protocol;
pub mod provider;
pub mod queue;
pub mod report;
pub mod telemetry;
#[cfg(feature = "test-support")]
pub mod testing;
pub mod vars;
pub mod worker;
