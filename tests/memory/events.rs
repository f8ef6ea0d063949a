//! The sample events in `events/` are real `SqsEvent`s that the handler accepts, and their
//! documented outcomes hold.

use std::sync::Arc;

use aws_lambda_events::event::sqs::SqsEvent;
use fenced_jobs::clock::{Clock, SystemClock};
use fenced_jobs::job::parse_body;
use fenced_jobs::ledger::memory::InMemoryLedger;
use fenced_jobs::provider::SimulatedProvider;
use fenced_jobs::queue::RecordingVisibility;
use fenced_jobs::worker::Settings;
use fenced_jobs::worker::handler::BatchHandler;
use fenced_jobs::worker::processor::{Invocation, Processor};

async fn run(path: &str) -> (Vec<String>, u64) {
    let text = std::fs::read_to_string(path).expect("event file");
    let event: SqsEvent = serde_json::from_str(&text).expect("an SqsEvent");
    let handler = BatchHandler::new(
        Processor::new(
            Arc::new(InMemoryLedger::new()),
            SimulatedProvider::new(),
            SystemClock,
            Settings::default(),
        ),
        RecordingVisibility::new(),
    );
    let inv = Invocation {
        id: "events-test".into(),
        deadline: Some(SystemClock.now_ms() + 60_000),
    };
    let response = handler.handle(event, inv).await.expect("response");
    let failures = response
        .batch_item_failures
        .into_iter()
        .map(|f| f.item_identifier)
        .collect();
    (failures, handler.processor().provider().executions())
}

#[test]
fn the_documented_message_is_valid() {
    let text = std::fs::read_to_string("events/job.json").expect("job.json");
    let job = parse_body(Some(&text)).expect("valid job");
    assert_eq!(job.job_id, "summary-2026-11-29-0001");
    assert!(job.metadata.is_some());
}

#[tokio::test]
async fn one_job_succeeds() {
    assert_eq!(run("events/sqs-one-job.json").await, (vec![], 1));
}

#[tokio::test]
async fn the_mixed_batch_fails_the_transient_and_the_poison_records_only() {
    let (failures, calls) = run("events/sqs-mixed-batch.json").await;
    assert_eq!(
        failures,
        [
            "6d1c8a3e-0002-4f4e-9b8e-000000000003",
            "6d1c8a3e-0002-4f4e-9b8e-000000000005",
            "6d1c8a3e-0002-4f4e-9b8e-000000000006",
        ]
    );
    // extract (once for two records), eval, reject.
    assert_eq!(calls, 3);
}

#[tokio::test]
async fn a_duplicate_in_one_batch_makes_one_call_and_both_records_succeed() {
    assert_eq!(run("events/sqs-duplicate.json").await, (vec![], 1));
}

#[tokio::test]
async fn poison_records_fail_alone_and_the_good_record_succeeds() {
    let (failures, calls) = run("events/sqs-poison.json").await;
    assert_eq!(
        failures,
        [
            "7a2e0c41-0004-4b1d-8c55-000000000001",
            "7a2e0c41-0004-4b1d-8c55-000000000002",
            "7a2e0c41-0004-4b1d-8c55-000000000003",
        ]
    );
    assert_eq!(calls, 1);
}

#[tokio::test]
async fn a_fifo_group_stops_at_its_first_failure_and_other_groups_go_on() {
    let (failures, calls) = run("events/sqs-fifo-batch.json").await;
    // tenant-a: the first succeeds, the second fails (transient), the third is skipped;
    // tenant-b goes on.
    assert_eq!(
        failures,
        [
            "7a2e0c41-0005-4b1d-8c55-000000000002",
            "7a2e0c41-0005-4b1d-8c55-000000000003",
        ]
    );
    assert_eq!(calls, 3);
}

/// The sample stream event (Lambda's shape, with the fields the dispatcher does not read) gives
/// one completion event: the transition to `succeeded`; the TTL removal is skipped.
#[tokio::test]
async fn the_sample_stream_event_announces_its_one_transition() {
    use fenced_jobs::events::RecordingSink;
    use fenced_jobs::ops::dispatch::{StreamEvent, dispatch};
    let text = std::fs::read_to_string("events/dynamodb-stream.json").expect("event file");
    let event: StreamEvent = serde_json::from_str(&text).expect("a stream event");
    let sink = RecordingSink::new();
    let report = dispatch(&event, &sink).await;
    assert_eq!((report.published, report.skipped), (1, 1));
    let published = sink.published();
    let detail = &published[0].detail;
    assert_eq!(detail["job_id"], "sample-1");
    assert_eq!(detail["result_ref"]["size"], 300128);
    assert_eq!(detail["metadata"]["order"], "o-1");
    assert_eq!(
        serde_json::to_value(report.response()).expect("json"),
        serde_json::json!({"batchItemFailures": []})
    );
}
