//! An operator and tenants in control, on the emulator: each kind of cancel (a `ready` job, an
//! `unknown` one, and a running background call, cancelled upstream), an urgent job overtaking
//! a backlog through its own queue, and two tenants' jobs sent in their message groups.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fenced_jobs::clock::{Clock, SystemClock};
use fenced_jobs::job::{AttemptOutcome, JobState, RecordOutcome};
use fenced_jobs::ledger::JobLedger;
use fenced_jobs::ops::operator::{self, Cancelled, OperatorError};
use fenced_jobs::ops::producer::{Intake, submit};
use fenced_jobs::provider::openai::{OpenAiApi, OpenAiSettings};
use fenced_jobs::provider::{AnyProvider, OpenAiProvider, SimulatedProvider};
use fenced_jobs::queue::SqsTriggers;
use serde_json::json;

use crate::support::http::{HttpStub, Reply};
use crate::support::{self, deliver, emulator, fast_settings, slow_settings};

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
    let line = support::job("mistake-1", "not wanted", "");
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
    aws.send(&queue, &support::job("doubt-1", "p", hang)).await;
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
    aws.send(&queue, &support::job("endless-1", "a report", ""))
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

/// A table, a work queue and an urgent queue, and the producer's sender to them.
struct Queues {
    aws: support::Emulator,
    table: String,
    queue: support::Queue,
    urgent: support::Queue,
    ledger: fenced_jobs::ledger::dynamodb::DynamoLedger,
    sender: SqsTriggers,
}

async fn queues() -> Queues {
    let aws = emulator().await;
    let table = aws.table().await;
    let queue = aws.queue(30).await;
    let urgent = aws.queue(30).await;
    let ledger = aws.ledger(&table);
    let sender =
        SqsTriggers::new(aws.sqs.clone(), queue.url.clone()).with_urgent(Some(urgent.url.clone()));
    Queues {
        aws,
        table,
        queue,
        urgent,
        ledger,
        sender,
    }
}

/// Submits `lines` (JSONL) through the producer, to `sender`'s queues.
async fn submit_lines(
    ledger: &fenced_jobs::ledger::dynamodb::DynamoLedger,
    sender: &SqsTriggers,
    lines: Vec<String>,
) {
    let n = lines.len() as u64;
    let report = submit(
        ledger,
        sender,
        lines.into_iter().map(Ok),
        || SystemClock.now_ms(),
        &Intake::default(),
        |_| {},
    )
    .await;
    assert_eq!((report.created, report.sent), (n, n), "{report:?}");
}

/// Everything on the queue now, with its system attributes, left there.
async fn everything_on(
    aws: &support::Emulator,
    queue_url: &str,
) -> Vec<aws_sdk_sqs::types::Message> {
    let mut all = Vec::new();
    loop {
        let got = aws
            .sqs
            .receive_message()
            .queue_url(queue_url)
            .max_number_of_messages(10)
            .visibility_timeout(30)
            .message_system_attribute_names(aws_sdk_sqs::types::MessageSystemAttributeName::All)
            .send()
            .await
            .expect("receive");
        if got.messages().is_empty() {
            return all;
        }
        all.extend(got.messages().iter().cloned());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_tenants_jobs_go_in_their_message_groups_and_an_urgent_one_to_the_urgent_queue() {
    // GIVEN a work queue and an urgent queue
    let Queues {
        aws,
        table,
        queue,
        urgent,
        ledger,
        sender,
    } = queues().await;

    // WHEN a burst of one tenant's jobs, a trickle of another's and an urgent job are submitted
    let mut lines: Vec<String> = (0..5)
        .map(|i| format!(r#"{{"job_id":"burst-{i}","tenant":"acme","contract":"summary.v1","input":{{"model":"sim-1","prompt":"p"}}}}"#))
        .collect();
    lines.push(r#"{"job_id":"trickle-0","tenant":"globex","contract":"summary.v1","input":{"model":"sim-1","prompt":"p"}}"#.to_owned());
    lines.push(r#"{"job_id":"now-0","tenant":"globex","priority":"urgent","contract":"summary.v1","input":{"model":"sim-1","prompt":"p"}}"#.to_owned());
    submit_lines(&ledger, &sender, lines).await;

    // THEN each message is in its tenant's group, the urgent one alone on the urgent queue
    let groups = |messages: &[aws_sdk_sqs::types::Message]| -> Vec<(String, String)> {
        let mut groups: Vec<(String, String)> = messages
            .iter()
            .map(|m| {
                let body: serde_json::Value =
                    serde_json::from_str(m.body().unwrap_or_default()).expect("json");
                let group = m
                    .attributes()
                    .and_then(|a| {
                        a.get(&aws_sdk_sqs::types::MessageSystemAttributeName::MessageGroupId)
                    })
                    .cloned()
                    .unwrap_or_default();
                (
                    body["job_id"].as_str().unwrap_or_default().to_owned(),
                    group,
                )
            })
            .collect();
        groups.sort();
        groups
    };
    let work = groups(&everything_on(&aws, &queue.url).await);
    let expected: Vec<(String, String)> = (0..5)
        .map(|i| (format!("burst-{i}"), "acme".to_owned()))
        .chain([("trickle-0".to_owned(), "globex".to_owned())])
        .collect();
    assert_eq!(work, expected);
    assert_eq!(
        groups(&everything_on(&aws, &urgent.url).await),
        [("now-0".to_owned(), "globex".to_owned())]
    );
    // AND the ledger keeps whose each job is, and how urgent
    let item = aws.item(&table, "now-0").await;
    assert_eq!(item.class.tenant.as_deref(), Some("globex"));
    assert!(item.class.urgent);
    assert!(!aws.item(&table, "burst-0").await.class.urgent);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_urgent_job_overtakes_a_backlog_through_its_own_queue() {
    // GIVEN a backlog of 20 jobs of 200 ms each on the work queue, one consumer each for it
    // and for the urgent queue (their event source mappings), and an urgent job sent last
    let Queues {
        aws,
        table,
        queue,
        urgent,
        ledger,
        sender,
    } = queues().await;
    let slow = r#""simulate":{"latency_ms":200}"#;
    let backlog: Vec<String> = (0..20)
        .map(|i| support::job(&format!("backlog-{i}"), "p", slow))
        .collect();
    submit_lines(&ledger, &sender, backlog).await;
    let urgent_job = r#"{"job_id":"urgent-0","priority":"urgent","contract":"summary.v1","input":{"model":"sim-1","prompt":"p","simulate":{"latency_ms":200}}}"#;
    submit_lines(&ledger, &sender, vec![urgent_job.to_owned()]).await;
    let handler = aws.handler(&table, SimulatedProvider::new(), fast_settings());
    let mut work_source = aws.source(&queue).await;
    work_source.batch_size = 1;
    let mut urgent_source = aws.source(&urgent).await;
    urgent_source.batch_size = 1;

    // WHEN both consumers run until the urgent job is done
    let backlog_done = || async {
        let mut done = 0;
        for i in 0..20 {
            if aws
                .item(&table, &format!("backlog-{i}"))
                .await
                .state
                .is_terminal()
            {
                done += 1;
            }
        }
        done
    };
    let work = async {
        for _ in 0..40 {
            if aws.item(&table, "urgent-0").await.state.is_terminal() {
                break;
            }
            deliver(&work_source, &handler).await;
        }
    };
    let started = Instant::now();
    let urgent_run = async {
        loop {
            let (_, report) = deliver(&urgent_source, &handler).await;
            if report.is_some_and(|r| r.records.iter().any(|r| r.outcome.is_success())) {
                return started.elapsed();
            }
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "urgent job never ran"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let (took, ()) = tokio::join!(urgent_run, work);

    // THEN it succeeded while most of the backlog still waited
    assert_eq!(
        aws.item(&table, "urgent-0").await.state,
        JobState::Succeeded
    );
    let done = backlog_done().await;
    assert!(done <= 5, "{done} of the backlog's 20 ran first ({took:?})");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_synchronous_call_is_dropped_and_its_attempt_ends_cancelled() {
    // GIVEN a call that never answers, its lease renewed every 200 ms
    let aws = emulator().await;
    let table = aws.table().await;
    let queue = aws.queue(30).await;
    let mut settings = slow_settings(30, 200, 1_000);
    settings.provider_timeout_ms = 15_000;
    let handler = aws.handler(&table, SimulatedProvider::new(), settings);
    let mut source = aws.source(&queue).await;
    source.function_timeout_ms = 20_000;
    let hang = r#""simulate":{"outcome":"hang"}"#;
    aws.send(&queue, &support::job("hung-1", "p", hang)).await;
    let ledger = aws.ledger(&table);

    // WHEN an operator cancels it once it runs
    let operator = async {
        let started = Instant::now();
        loop {
            let item = ledger.get("hung-1").await.expect("get");
            if item.is_some_and(|r| r.state == JobState::Running) {
                return cancel(&ledger, "hung-1").await;
            }
            assert!(started.elapsed() < Duration::from_secs(10), "never claimed");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let started = Instant::now();
    let ((_, report), cancelled) = tokio::join!(deliver(&source, &handler), operator);

    // THEN the owner dropped the call at its next renewal and ended the attempt cancelled,
    // long before the call's own timeout
    assert!(
        matches!(cancelled, Ok(Cancelled::Requested(_))),
        "{cancelled:?}"
    );
    assert_eq!(
        report.expect("report").records[0].outcome,
        RecordOutcome::Done(JobState::Cancelled)
    );
    assert!(started.elapsed() < Duration::from_secs(10));
    let item = aws.item(&table, "hung-1").await;
    assert_eq!(item.state, JobState::Cancelled);
    assert_eq!(item.attempt_log[0].outcome, AttemptOutcome::Cancelled);
    assert_eq!(item.decisions[0].action, "cancel");
}
