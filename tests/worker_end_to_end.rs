//! The handler end to end on the emulator: real DynamoDB and SQS calls through the AWS SDK,
//! batches built and acknowledged by the local event source mapping.

mod common;

use std::sync::Arc;

use common::{emulator, fast_settings, job};
use fenced_jobs::job::{AttemptOutcome, Failure, JobState, RecordOutcome};
use fenced_jobs::ledger::{AttemptEnd, FinishRequest, JobLedger, RecoverRequest, Write};
use fenced_jobs::processor::Invocation;
use fenced_jobs::provider::{Answer, Provider, ProviderError, ProviderRequest, SimulatedProvider};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_job_succeeds_with_one_provider_call_and_two_ledger_writes() {
    // GIVEN a new job on the queue
    let aws = emulator().await;
    let table = aws.table().await;
    let queue = aws.queue(30).await;
    let handler = aws.handler(&table, SimulatedProvider::new(), fast_settings());
    let source = aws.source(&queue).await;
    aws.send(&queue, &job("happy-1", "summarise this", "")).await;
    aws.calls.reset();

    // WHEN the event source delivers it
    let report = source
        .poll_once(|event, inv| handler.handle(event, inv))
        .await
        .expect("poll");

    // THEN it is deleted, the job succeeded once, with a claim and an acceptance only
    assert_eq!((report.received, report.deleted, report.failed), (1, 1, 0));
    assert_eq!(handler.processor().provider().executions(), 1);
    assert_eq!(aws.calls.total("dynamodb"), 2, "{:?}", aws.calls.counts());
    assert_eq!(aws.calls.get("dynamodb", "UpdateItem"), 2);
    let record = aws.ledger(&table).get("happy-1").await.expect("get").expect("item");
    assert_eq!(record.state, JobState::Succeeded);
    assert_eq!((record.owner_epoch, record.attempts), (1, 1));
    assert_eq!(record.attempt_log.len(), 1);
    assert_eq!(record.attempt_log[0].outcome, AttemptOutcome::Succeeded);
    assert!(record.result.as_deref().is_some_and(|r| r.contains("simulated answer")));
    assert!(aws.peek(&queue.url, 0).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redelivered_finished_job_costs_one_ledger_call_and_no_provider_call() {
    let aws = emulator().await;
    let table = aws.table().await;
    let queue = aws.queue(30).await;
    let handler = aws.handler(&table, SimulatedProvider::new(), fast_settings());
    let source = aws.source(&queue).await;
    let body = job("again-1", "summarise this", "");
    aws.send(&queue, &body).await;
    source
        .poll_once(|event, inv| handler.handle(event, inv))
        .await
        .expect("first delivery");
    let before = aws.ledger(&table).get("again-1").await.expect("get");

    // GIVEN the same job delivered again (a producer retry, or SQS at-least-once)
    aws.send(&queue, &body).await;
    aws.calls.reset();
    let report = source
        .poll_once(|event, inv| handler.handle(event, inv))
        .await
        .expect("second delivery");

    // THEN it is acknowledged from the ledger alone
    assert_eq!((report.received, report.deleted), (1, 1));
    assert_eq!(handler.processor().provider().executions(), 1);
    assert_eq!(aws.calls.total("dynamodb"), 1, "{:?}", aws.calls.counts());
    assert_eq!(aws.ledger(&table).get("again-1").await.expect("get"), before);
}
