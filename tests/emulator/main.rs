//! The tests on the local AWS emulator (moto, `AWS_ENDPOINT_URL`; `make test` starts it, or
//! `scripts/with-emulator.sh cargo test --test emulator`), in one binary: real DynamoDB, SQS, S3,
//! EventBridge and SSM calls through the AWS SDK, and the functions' binaries against them.

#[path = "../support/mod.rs"]
mod support;

mod batches;
mod chaos;
mod contracts;
mod control;
mod drill;
mod iam;
mod invoke;
mod jobctl_cli;
mod ledger_contract;
mod ledger_properties;
mod long_jobs;
mod operator;
mod pacing;
mod payload_memory;
mod producer;
mod producer_guide;
mod provider_keys;
mod results_out;
mod second_dynamodb;
mod slow_records;
mod spend;
mod spend_days;
mod worker_end_to_end;
