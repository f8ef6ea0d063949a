//! What a job is billed in DynamoDB, by its documented rules (the in-memory ledger meters each
//! write as the DynamoDB ledger stores it), and where its input is kept: a job on the happy
//! path keeps none, so its item stays small whatever the prompt; a job that leaves it keeps it
//! for a trigger by id.

use std::sync::Arc;

use aws_lambda_events::event::sqs::{SqsEvent, SqsMessage};
use fenced_jobs::blobs::MemoryBlobs;
use fenced_jobs::clock::{Clock, SystemClock};
use fenced_jobs::job::{Expect, Failure, JobState, NewJob, RecordOutcome, parse_body};
use fenced_jobs::ledger::memory::InMemoryLedger;
use fenced_jobs::ledger::{ClaimRequest, JobLedger, Write};
use fenced_jobs::provider::SimulatedProvider;
use fenced_jobs::queue::RecordingVisibility;
use fenced_jobs::worker::Settings;
use fenced_jobs::worker::handler::BatchHandler;
use fenced_jobs::worker::processor::{Invocation, Processor};

type Handler =
    BatchHandler<Arc<InMemoryLedger>, SimulatedProvider, SystemClock, RecordingVisibility>;

fn handler(ledger: Arc<InMemoryLedger>, blobs: Arc<MemoryBlobs>) -> Handler {
    BatchHandler::new(
        Processor::new(
            ledger,
            SimulatedProvider::new(),
            SystemClock,
            Settings::default(),
        )
        .with_blobs(blobs),
        RecordingVisibility::new(),
    )
    .with_seed(1)
}

fn delivery(body: &str, receive_count: u32) -> SqsEvent {
    sent_at(body, receive_count, SystemClock.now_ms())
}

/// A delivery of a message SQS says it was sent at `sent`.
fn sent_at(body: &str, receive_count: u32, sent: i64) -> SqsEvent {
    let mut m = SqsMessage::default();
    m.message_id = Some(format!("m-{}", fastrand::u32(..)));
    m.receipt_handle = Some("handle".to_owned());
    m.body = Some(body.to_owned());
    m.event_source_arn = Some("arn:aws:sqs:us-east-1:123456789012:jobs".to_owned());
    let now = SystemClock.now_ms().to_string();
    m.attributes
        .insert("ApproximateReceiveCount".into(), receive_count.to_string());
    m.attributes
        .insert("SentTimestamp".into(), sent.to_string());
    m.attributes
        .insert("ApproximateFirstReceiveTimestamp".into(), now);
    let mut e = SqsEvent::default();
    e.records = vec![m];
    e
}

fn invocation() -> Invocation {
    Invocation {
        id: "inv".into(),
        deadline: Some(SystemClock.now_ms() + 60_000),
    }
}

/// A job whose prompt is `bytes` long, with `simulate` options.
fn job(id: &str, bytes: usize, simulate: &str) -> String {
    let prompt = "x".repeat(bytes);
    format!(
        r#"{{"job_id":"{id}","contract":"c","input":{{"model":"m","prompt":"{prompt}"{simulate}}}}}"#
    )
}

#[tokio::test]
async fn a_fresh_job_is_billed_two_small_writes_and_no_index_write_whatever_its_prompt() {
    for kib in [1, 10, 50] {
        // GIVEN a worker with a results bucket, on a ledger billed as DynamoDB bills
        let ledger = Arc::new(InMemoryLedger::metered());
        let blobs = Arc::new(MemoryBlobs::new("results"));
        let h = handler(ledger.clone(), blobs.clone());
        // WHEN a fresh job with a prompt of `kib` KiB runs and succeeds
        let report = h
            .handle_batch(&delivery(&job("j", kib * 1024, ""), 1), &invocation())
            .await;
        assert_eq!(report.response, Ok(vec![]), "{kib} KiB");
        // THEN it was billed a claim and an acceptance of at most 1 KB each, and nothing in
        // an index (its message, which SQS keeps past its deadline, would bring it back): the
        // item never held the prompt, and nothing went to S3
        let bill = ledger.bill().expect("metered");
        assert_eq!(
            (ledger.writes(), bill.table_units, bill.index_writes),
            (2, 2, 0),
            "{kib} KiB: {bill:?}"
        );
        assert!(bill.largest_item <= 1024, "{kib} KiB: {bill:?}");
        assert!(blobs.keys().is_empty(), "{:?}", blobs.keys());
        let item = ledger.get("j").await.expect("get").expect("item");
        assert_eq!(item.state, JobState::Succeeded);
        assert!(!item.keeps_input());
        assert!(!item.due_listed);
    }
}

#[tokio::test]
async fn a_first_claim_whose_message_sqs_may_drop_pays_for_its_entry_in_the_due_index() {
    let day = 86_400_000;
    let now = SystemClock.now_ms();
    // A delivery within the redrive policy's last tenth of receives (300 by default), and one
    // of a message whose retention (4 days by default) ends before its deadline's next 12
    // hours (the job is due in a day, the default: the message was sent four days ago).
    let cases = [
        ("last receives", sent_at(&job("j", 1024, ""), 290, now)),
        (
            "old message",
            sent_at(&job("j", 1024, ""), 1, now - 4 * day),
        ),
        ("kept", sent_at(&job("j", 1024, ""), 269, now - day)),
    ];
    for (case, event) in cases {
        // GIVEN a worker on a ledger billed as DynamoDB bills
        let ledger = Arc::new(InMemoryLedger::metered());
        let h = handler(ledger.clone(), Arc::new(MemoryBlobs::new("results")));
        // WHEN the job runs and succeeds on that delivery
        let report = h.handle_batch(&event, &invocation()).await;
        assert_eq!(report.response, Ok(vec![]), "{case}");
        // THEN its claim put it in the due index (one index write), where the reconciler
        // finds it if its owner dies and SQS drops the message; a message SQS keeps does not
        let item = ledger.get("j").await.expect("get").expect("item");
        let bill = ledger.bill().expect("metered");
        let listed = case != "kept";
        assert_eq!(item.due_listed, listed, "{case}");
        assert_eq!(bill.index_writes, u64::from(listed), "{case}: {bill:?}");
    }
}

/// A delivery of a message sent four days ago: SQS's default retention ends before the job's
/// deadline (a day, the default), so SQS may drop it.
fn old_delivery(body: &str) -> SqsEvent {
    sent_at(body, 1, SystemClock.now_ms() - 4 * 86_400_000)
}

#[tokio::test]
async fn a_failed_job_keeps_its_input_only_where_sqs_may_drop_its_message() {
    // GIVEN a job whose first attempt fails with a transient error, on a message SQS keeps
    let ledger = Arc::new(InMemoryLedger::metered());
    let h = handler(ledger.clone(), Arc::new(MemoryBlobs::new("results")));
    let body = job("kept", 1024, r#","simulate":{"fail_times":1}"#);
    let first = h.handle_batch(&delivery(&body, 1), &invocation()).await;
    assert_eq!(first.response.as_ref().map(Vec::len), Ok(1));
    // THEN the end that leaves it live keeps no input (the message carries it), and the item
    // stays under 1 KB
    let item = ledger.get("kept").await.expect("get").expect("item");
    assert_eq!(item.state, JobState::RetryAuthorized);
    assert!(!item.keeps_input());
    assert!(ledger.bill().expect("metered").largest_item <= 1024);
    // AND the message, delivered again, runs the second attempt
    let again = h.handle_batch(&delivery(&body, 2), &invocation()).await;
    assert_eq!(again.response, Ok(vec![]));
    let item = ledger.get("kept").await.expect("get").expect("item");
    assert_eq!((item.state, item.attempts), (JobState::Succeeded, 2));
    assert!(!item.keeps_input());

    // GIVEN the same on a message SQS may drop before the deadline
    let body = job("flaky", 100, r#","simulate":{"fail_times":1}"#);
    let first = h.handle_batch(&old_delivery(&body), &invocation()).await;
    assert_eq!(first.response.as_ref().map(Vec::len), Ok(1));
    // THEN the end keeps the input, as the message has it
    let item = ledger.get("flaky").await.expect("get").expect("item");
    assert_eq!(item.state, JobState::RetryAuthorized);
    let canonical = parse_body(Some(&body)).expect("a job").input_canonical;
    assert_eq!(item.input, canonical);
    // AND a trigger by id (the reconciler's) runs the second attempt from the item alone
    let again = h
        .handle_batch(&delivery(r#"{"job_id":"flaky"}"#, 1), &invocation())
        .await;
    assert_eq!(again.response, Ok(vec![]));
    let item = ledger.get("flaky").await.expect("get").expect("item");
    assert_eq!((item.state, item.attempts), (JobState::Succeeded, 2));
    assert_eq!(h.processor().provider().executions(), 4);
}

#[tokio::test]
async fn a_large_input_is_kept_by_reference_once_stored_and_read_back_by_a_trigger_by_id() {
    // GIVEN a job with a 10 KiB prompt (above INLINE_MAX_BYTES) whose first attempt fails, on
    // a message SQS may drop
    let ledger = Arc::new(InMemoryLedger::new());
    let blobs = Arc::new(MemoryBlobs::new("results"));
    let h = handler(ledger.clone(), blobs.clone());
    let body = job("large", 10 * 1024, r#","simulate":{"fail_times":1}"#);
    h.handle_batch(&old_delivery(&body), &invocation()).await;
    // THEN the end that leaves it live stores the input and keeps only its reference
    let item = ledger.get("large").await.expect("get").expect("item");
    assert_eq!(item.state, JobState::RetryAuthorized);
    assert!(item.input.is_empty());
    let stored = item.input_ref.clone().expect("a reference");
    assert_eq!(blobs.keys(), vec![stored.key.clone()]);
    // AND a trigger by id reads it back and runs the job; the redelivered message stores
    // nothing again
    let again = h
        .handle_batch(&delivery(r#"{"job_id":"large"}"#, 1), &invocation())
        .await;
    assert_eq!(again.response, Ok(vec![]));
    let done = ledger.get("large").await.expect("get").expect("item");
    assert_eq!(
        (done.state, done.input_ref),
        (JobState::Succeeded, Some(stored))
    );
    assert_eq!(blobs.keys().len(), 1);
}

#[tokio::test]
async fn a_trigger_by_id_for_a_job_that_kept_no_input_waits_for_the_jobs_message() {
    // GIVEN a job whose owner vanished on its first claim, so its item keeps no input
    let ledger = Arc::new(InMemoryLedger::new());
    let h = handler(ledger.clone(), Arc::new(MemoryBlobs::new("results")));
    let body = job("orphan", 100, "");
    let msg = parse_body(Some(&body)).expect("a job");
    let now = SystemClock.now_ms();
    let claim = ClaimRequest {
        job: NewJob::from_message(&msg, now - 60_000, &Settings::default().job_defaults),
        expect: Expect::FRESH,
        owner_id: "gone".into(),
        now: now - 60_000,
        lease_until: now - 30_000,
        provider_ref: None,
        route: None,
        first_sight: true,
        list_due: false,
    };
    assert!(matches!(ledger.claim(claim).await, Ok(Write::Applied(_))));
    let before = ledger.get("orphan").await.expect("get").expect("item");
    // WHEN a trigger by id arrives (an operator's, or a stray one)
    let trigger = h
        .handle_batch(&delivery(r#"{"job_id":"orphan"}"#, 1), &invocation())
        .await;
    // THEN it recovers nothing, asks nobody and calls nobody: it backs off, the item as it was
    // (a recovery would have built its request from no input)
    assert!(
        matches!(
            trigger.records[0].outcome,
            RecordOutcome::Failed(Failure::Backoff { .. })
        ),
        "{:?}",
        trigger.records[0].outcome
    );
    let provider = h.processor().provider();
    assert_eq!((provider.executions(), provider.retrievals()), (0, 0));
    assert_eq!(ledger.get("orphan").await.expect("get"), Some(before));
    // AND the job's own message, when it comes back, recovers it and asks the provider about
    // the lapsed attempt instead of calling again; the attempt it cannot find is left unknown,
    // with the input kept for the operator's decision to run it by id
    let own = h.handle_batch(&delivery(&body, 2), &invocation()).await;
    let done = ledger.get("orphan").await.expect("get").expect("item");
    assert_eq!(done.owner_epoch, 2, "{:?}", own.records[0].outcome);
    assert_eq!(done.state, JobState::Unknown);
    assert_eq!(done.input, msg.input_canonical);
}
