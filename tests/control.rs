//! An operator in control, on the emulator: each kind of cancel (a `ready` job, an `unknown`
//! one, and a running background call, cancelled upstream), each through `operator::cancel`
//! and the worker's own deliveries.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::http::{HttpStub, Reply};
use common::{deliver, emulator, fast_settings, slow_settings};
use fenced_jobs::clock::{Clock, SystemClock};
use fenced_jobs::job::{AttemptOutcome, JobState, RecordOutcome};
use fenced_jobs::ledger::JobLedger;
use fenced_jobs::ops::operator::{self, Cancelled, OperatorError};
use fenced_jobs::ops::producer::{Intake, submit};
use fenced_jobs::provider::openai::{OpenAiApi, OpenAiSettings};
use fenced_jobs::provider::{AnyProvider, OpenAiProvider, SimulatedProvider};
use fenced_jobs::queue::SqsTriggers;
use serde_json::json;

async fn cancel<L: JobLedger>(ledger: &L, job_id: &str) -> Result<Cancelled, OperatorError> {
    let now = SystemClock.now_ms();
    operator::cancel(ledger, job_id, "alice", None, "submitted by mistake", now).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ready_job_is_cancelled_at_once_and_its_message_acknowledged_without_a_call() {
    // GIVEN a job submitted to the ledger and the queue, not yet delivered
    let aws = emulator().await;
    let table = aws.table().await;
    let queue = aws.queue(30).await;
    let ledger = aws.ledger(&table);
    let sender = SqsTriggers::new(aws.sqs.clone(), queue.url.clone());
    let line = common::job("mistake-1", "not wanted", "");
    let report = submit(
        &ledger,
        &sender,
        std::iter::once(Ok(line)),
        || SystemClock.now_ms(),
        &Intake::default(),
        |_| {},
    )
    .await;
    assert_eq!((report.created, report.sent), (1, 1), "{report:?}");

    // WHEN an operator cancels it, then the worker receives its message
    let cancelled = cancel(&ledger, "mistake-1").await.expect("cancel");
    let handler = aws.handler(&table, SimulatedProvider::new(), fast_settings());
    let source = aws.source(&queue).await;
    let (poll, report) = deliver(&source, &handler).await;

    // THEN the job is cancelled with one write, the record a success, and no call was made
    let Cancelled::Ended(record) = cancelled else {
        panic!("a ready job ends at once: {cancelled:?}");
    };
    assert_eq!(record.state, JobState::Cancelled);
    assert_eq!(record.owner_epoch, 1, "the cancel fences epoch 0");
    assert_eq!(record.decisions[0].action, "cancel");
    assert_eq!(record.decisions[0].by, "alice");
    let outcomes: Vec<_> = report.expect("report").records;
    assert_eq!(
        outcomes[0].outcome,
        RecordOutcome::Done(JobState::Cancelled)
    );
    assert_eq!(poll.deleted, 1);
    assert_eq!(handler.processor().provider().executions(), 0);
    // A second cancel says the job is terminal already, and writes nothing.
    let again = cancel(&ledger, "mistake-1").await;
    assert!(
        matches!(
            again,
            Err(OperatorError::Terminal {
                state: JobState::Cancelled,
                ..
            })
        ),
        "{again:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_job_is_cancelled_at_once_and_keeps_its_evidence() {
    // GIVEN a call cut off by its timeout: the attempt may have run, the job is `unknown`
    let aws = emulator().await;
    let table = aws.table().await;
    let queue = aws.queue(30).await;
    let mut settings = fast_settings();
    settings.provider_timeout_ms = 300;
    let handler = aws.handler(&table, SimulatedProvider::new(), settings);
    let source = aws.source(&queue).await;
    let hang = r#""simulate":{"outcome":"hang","retrievable":false}"#;
    aws.send(&queue, &common::job("doubt-1", "p", hang)).await;
    let (_, report) = deliver(&source, &handler).await;
    let ledger = aws.ledger(&table);
    let before = aws.item(&table, "doubt-1").await;
    assert_eq!(before.state, JobState::Unknown, "{report:?}");

    // WHEN an operator cancels it
    let cancelled = cancel(&ledger, "doubt-1").await.expect("cancel");

    // THEN it is cancelled, fencing the epoch, with the uncertain attempt's evidence kept
    let Cancelled::Ended(record) = cancelled else {
        panic!("an unknown job ends at once: {cancelled:?}");
    };
    assert_eq!(record.state, JobState::Cancelled);
    assert_eq!(record.owner_epoch, before.owner_epoch + 1);
    assert_eq!(record.attempt_log, before.attempt_log);
    assert_eq!(record.attempt_log[0].outcome, AttemptOutcome::Uncertain);
    let stored = aws.item(&table, "doubt-1").await;
    assert_eq!(stored.state, JobState::Cancelled);
    assert_eq!(
        stored.last_error.map(|e| e.kind),
        Some("cancelled".to_owned())
    );
}

/// A server whose one background call never ends by itself, and that records its cancel.
async fn endless_server() -> HttpStub {
    let cancelled = Arc::new(Mutex::new(false));
    HttpStub::start(move |req, _| {
        let mut cancelled = cancelled.lock().expect("cancelled");
        match (req.method.as_str(), req.path.as_str()) {
            ("POST", "/v1/responses") => {
                Reply::json(200, json!({"id": "resp_endless", "status": "queued"}))
            }
            ("POST", "/v1/responses/resp_endless/cancel") => {
                *cancelled = true;
                Reply::json(200, json!({"id": "resp_endless", "status": "cancelled"}))
            }
            ("GET", "/v1/responses/resp_endless") => {
                let status = if *cancelled {
                    "cancelled"
                } else {
                    "in_progress"
                };
                Reply::json(200, json!({"id": "resp_endless", "status": status}))
            }
            _ => Reply::json(404, json!({})),
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_background_call_is_cancelled_upstream_by_its_owner_at_its_next_renewal() {
    // GIVEN a background call its owner polls, its lease renewed every 200 ms
    let aws = emulator().await;
    let table = aws.table().await;
    let queue = aws.queue(30).await;
    let server = endless_server().await;
    let mut settings = slow_settings(30, 200, 1_000);
    settings.poll_ms = 100;
    let openai = OpenAiSettings {
        base_url: format!("{}/v1", server.url),
        api: OpenAiApi::Responses,
        connect_timeout_ms: 1_000,
        request_timeout_ms: 2_000,
        ..OpenAiSettings::default()
    };
    let provider = AnyProvider::OpenAi(OpenAiProvider::new(openai, None).expect("client"));
    let handler = aws.handler(&table, provider, settings);
    let mut source = aws.source(&queue).await;
    source.function_timeout_ms = 20_000;
    aws.send(&queue, &common::job("endless-1", "a report", ""))
        .await;
    let ledger = aws.ledger(&table);

    // WHEN an operator cancels it once its reference is recorded
    let operator = async {
        let started = Instant::now();
        loop {
            let item = ledger.get("endless-1").await.expect("get");
            if item.as_ref().and_then(|r| r.last_provider_ref()).is_some() {
                return cancel(&ledger, "endless-1").await;
            }
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "never recorded"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let started = Instant::now();
    let ((poll, report), cancelled) = tokio::join!(deliver(&source, &handler), operator);

    // THEN the request was recorded, the owner cancelled the call upstream and ended the
    // attempt cancelled in the same invocation, well before its timeout
    let Ok(Cancelled::Requested(requested)) = cancelled else {
        panic!("a running job is asked to stop: {cancelled:?}");
    };
    assert_eq!(requested.state, JobState::Running);
    assert!(requested.cancel_requested.is_some());
    let report = report.expect("report");
    assert_eq!(
        report.records[0].outcome,
        RecordOutcome::Done(JobState::Cancelled)
    );
    assert_eq!(poll.deleted, 1);
    assert!(started.elapsed() < Duration::from_secs(10));
    let creates = server
        .requests()
        .iter()
        .filter(|r| r.method == "POST" && r.path == "/v1/responses")
        .count();
    assert_eq!(creates, 1, "one model call");
    assert_eq!(
        server.count("POST", "/v1/responses/resp_endless/cancel"),
        1,
        "cancelled upstream"
    );
    let item = aws.item(&table, "endless-1").await;
    assert_eq!(item.state, JobState::Cancelled);
    assert_eq!(item.owner_epoch, 1, "its own owner ended it");
    assert_eq!(item.attempt_log[0].outcome, AttemptOutcome::Cancelled);
    assert_eq!(item.result, None);
}
