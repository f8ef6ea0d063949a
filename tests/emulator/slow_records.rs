//! Slow records on the emulator: the heartbeat keeps them invisible and their leases alive,
//! a paused worker is fenced, the Lambda deadline is kept, and FIFO groups keep their order.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use fenced_jobs::config::SdkTimeouts;
use fenced_jobs::job::{AttemptOutcome, Failure, JobState, RecordOutcome};
use fenced_jobs::ledger::JobLedger;
use fenced_jobs::provider::{Answer, Provider, ProviderError, ProviderRequest, SimulatedProvider};

use crate::support::http::{HttpStub, Reply};
use crate::support::{self, deliver, emulator, job, slow_settings};

fn slow_job(id: &str, latency_ms: u64) -> String {
    job(
        id,
        "a long report",
        &format!(r#""simulate":{{"latency_ms":{latency_ms}}}"#),
    )
}

// On one thread, as the functions run: the heartbeat and the deadline share it with the records.
#[tokio::test(flavor = "current_thread")]
async fn a_record_outlasting_the_visibility_timeout_is_not_redelivered_while_it_runs_and_shows_its_bytes()
 {
    // GIVEN a queue with a 2 s visibility timeout and a call that takes 6 s
    let aws = emulator().await;
    let table = aws.table().await;
    let queue = aws.queue(2).await;
    let handler = aws.handler(
        &table,
        SimulatedProvider::new(),
        slow_settings(2, 600, 3_000),
    );
    let source = aws.source(&queue).await;
    aws.send(&queue, &slow_job("slow-1", 6_000)).await;

    // WHEN it runs while a second consumer keeps polling the queue
    let second_consumer = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let until = Instant::now() + Duration::from_millis(5_000);
        let mut received = 0;
        while Instant::now() < until {
            received += aws.peek(&queue.url, 1).await.len();
        }
        received
    };
    // AND jobctl watches it for a second, halfway through
    let watch = async {
        tokio::time::sleep(Duration::from_millis(3_500)).await;
        let args = [
            "watch",
            "slow-1",
            "--timeout",
            "1",
            "--output",
            "json",
            "--table",
        ];
        let args: Vec<String> = args
            .iter()
            .map(|a| a.to_string())
            .chain([table.clone()])
            .collect();
        tokio::task::spawn_blocking(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            crate::support::jobctl(&args, &[])
        })
        .await
        .expect("jobctl ran")
    };
    let ((poll, report), stolen, watched) =
        tokio::join!(deliver(&source, &handler), second_consumer, watch);

    // THEN the watch saw it running with the bytes its last renewal carried (decision 158)
    assert_eq!(watched.code, 5, "still running then: {}", watched.err);
    let line: serde_json::Value =
        serde_json::from_str(watched.out.lines().next().unwrap_or_default()).expect("json");
    assert_eq!(line["state"], "running", "{line}");
    assert!(line["lease_until"].is_string(), "{line}");
    let bytes = line["streamed_bytes"].as_u64().unwrap_or(0);
    assert!(bytes > 0, "a renewal carried the streamed bytes: {line}");
    // AND the second consumer never got it, and the job succeeded with one call
    assert_eq!(stolen, 0, "the record was redelivered during the call");
    assert_eq!((poll.received, poll.deleted), (1, 1));
    assert_eq!(handler.processor().provider().executions(), 1);
    let item = aws
        .ledger(&table)
        .get("slow-1")
        .await
        .expect("get")
        .expect("item");
    assert_eq!((item.state, item.owner_epoch), (JobState::Succeeded, 1));
    let progress = item
        .call_progress
        .expect("the owner's last word on its call");
    assert_eq!(progress.epoch, item.owner_epoch);
    assert!(progress.streamed_bytes >= bytes);
    let stats = report.expect("report").stats;
    assert!(stats.heartbeat_ticks >= 8, "{stats:?}");
    assert_eq!(stats.visibility_renewed, stats.heartbeat_ticks, "{stats:?}");
    // The 3 s lease is renewed when it would not outlast three more ticks (1.8 s and the skew
    // margin): every other tick or so, enough for a call twice its length.
    assert!(stats.lease_renewed >= 3, "{stats:?}");
    assert!(stats.lease_renewed < stats.heartbeat_ticks, "{stats:?}");
    assert_eq!(stats.ownership_lost, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_frozen_past_its_lease_that_nobody_took_over_goes_on_and_accepts() {
    // GIVEN a job whose call runs 2 s after the worker's freeze, and no other consumer
    let aws = emulator().await;
    let table = aws.table().await;
    let queue = aws.queue(2).await;
    aws.send(
        &queue,
        &job(
            "lapsed-1",
            "a long report",
            r#""simulate":{"latency_ms":2000}"#,
        ),
    )
    .await;

    // WHEN worker A claims it (lease 4 s), freezes for 7 s, then resumes
    let worker_a = support::spawn_frozen_worker(&table, &queue.url, Duration::from_millis(7_000));
    let (poll_a, report_a, a_calls) = worker_a.join().expect("worker A");

    // THEN its first renewal after the lapse goes on under the unchanged epoch, and its answer
    // is accepted: nobody took over, so nothing was lost
    assert_eq!(a_calls, 1);
    let report_a = report_a.expect("A's report");
    assert_eq!(
        report_a.records[0].outcome,
        RecordOutcome::Done(JobState::Succeeded)
    );
    assert_eq!(report_a.stats.ownership_lost, 0, "{:?}", report_a.stats);
    assert!(report_a.stats.lease_renewed >= 1, "{:?}", report_a.stats);
    assert_eq!(poll_a.deleted, 1);
    let item = aws
        .ledger(&table)
        .get("lapsed-1")
        .await
        .expect("get")
        .expect("item");
    assert_eq!((item.state, item.owner_epoch), (JobState::Succeeded, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_worker_is_deferred_to_then_fenced_and_cannot_accept_when_it_resumes() {
    let aws = emulator().await;
    let table = aws.table().await;
    let queue = aws.queue(2).await;
    // The provider cannot be asked about the call afterwards: its outcome stays unknown.
    aws.send(
        &queue,
        &job(
            "paused-1",
            "a long report",
            r#""simulate":{"retrievable":false}"#,
        ),
    )
    .await;

    // Worker A claims the job (lease 4 s), then freezes for 7 s: no heartbeat, no renewal.
    let worker_a = support::spawn_frozen_worker(&table, &queue.url, Duration::from_millis(7_000));
    tokio::time::sleep(Duration::from_millis(500)).await;

    // Worker B polls: the message comes back after 2 s, while A's lease still runs.
    let handler_b = aws.handler(
        &table,
        SimulatedProvider::new(),
        slow_settings(2, 600, 4_000),
    );
    let source_b = aws.source(&queue).await;
    let mut seen_by_b = Vec::new();
    let give_up = Instant::now() + Duration::from_secs(12);
    while Instant::now() < give_up {
        let (poll, report) = deliver(&source_b, &handler_b).await;
        if poll.received > 0 {
            let outcome = report.expect("report").records[0].outcome.clone();
            let done = outcome == RecordOutcome::Failed(Failure::AwaitingDecision);
            seen_by_b.push(outcome);
            if done {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(
        matches!(
            seen_by_b.first(),
            Some(RecordOutcome::Failed(Failure::Deferred { .. }))
        ),
        "B first defers to the live lease: {seen_by_b:?}"
    );
    assert_eq!(
        seen_by_b.last(),
        Some(&RecordOutcome::Failed(Failure::AwaitingDecision)),
        "after the lease lapses B fences A and records the attempt as uncertain: {seen_by_b:?}"
    );
    assert_eq!(
        handler_b.processor().provider().executions(),
        0,
        "B never calls the model"
    );

    // A resumes with its answer: refused, never published.
    let (poll_a, report_a, a_calls) = worker_a.join().expect("worker A");
    assert_eq!(a_calls, 1);
    assert_eq!(poll_a.deleted, 0);
    let a_outcome = &report_a.expect("A's report").records[0].outcome;
    assert_eq!(a_outcome, &RecordOutcome::Failed(Failure::AwaitingDecision));
    let item = aws
        .ledger(&table)
        .get("paused-1")
        .await
        .expect("get")
        .expect("item");
    assert_eq!((item.state, item.owner_epoch), (JobState::Unknown, 2));
    assert_eq!(item.result, None);
    assert_eq!(item.recoveries.len(), 1);
    assert_eq!(item.attempt_log[0].outcome, AttemptOutcome::Uncertain);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recovery_takes_the_paused_workers_answer_from_the_provider_without_a_new_call() {
    let aws = emulator().await;
    let table = aws.table().await;
    let queue = aws.queue(2).await;
    aws.send(&queue, &slow_job("retrieved-1", 0)).await;

    // A claims (recording the call's reference with the claim), then freezes for 7 s.
    let worker_a = support::spawn_frozen_worker(&table, &queue.url, Duration::from_millis(7_000));
    tokio::time::sleep(Duration::from_millis(500)).await;

    // B waits out A's lease, fences A and asks the provider: the call completed.
    let handler_b = aws.handler(
        &table,
        SimulatedProvider::new(),
        slow_settings(2, 600, 4_000),
    );
    let source_b = aws.source(&queue).await;
    let give_up = Instant::now() + Duration::from_secs(12);
    let mut acknowledged = false;
    let mut seen = Vec::new();
    while Instant::now() < give_up && !acknowledged {
        let (poll, report) = deliver(&source_b, &handler_b).await;
        seen.extend(report.map(|r| r.records[0].outcome.clone()));
        acknowledged = poll.deleted == 1;
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(
        acknowledged,
        "B acknowledged once the answer was retrieved: {seen:?}"
    );
    let item = aws
        .ledger(&table)
        .get("retrieved-1")
        .await
        .expect("get")
        .expect("item");
    assert_eq!(
        (item.state, item.owner_epoch, item.attempts),
        (JobState::Succeeded, 2, 1)
    );
    assert_eq!(item.attempt_log[0].outcome, AttemptOutcome::Succeeded);
    assert_eq!(
        item.attempt_log[0].provider_ref.as_deref(),
        Some("sim:retrieved-1/1@1")
    );
    assert_eq!(
        handler_b.processor().provider().executions(),
        0,
        "no second call"
    );
    assert!(handler_b.processor().provider().retrievals() >= 1);

    // A resumes: the job is terminal, so its record is a success; its own write was refused.
    let (_, report_a, a_calls) = worker_a.join().expect("worker A");
    assert_eq!(a_calls, 1);
    assert_eq!(
        report_a.expect("report").records[0].outcome,
        RecordOutcome::Done(JobState::Succeeded)
    );
    let after = aws
        .ledger(&table)
        .get("retrieved-1")
        .await
        .expect("get")
        .expect("item");
    assert_eq!(after, item, "A wrote nothing after the recovery");
}

// On one thread, as the functions run: the heartbeat and the deadline share it with the records.
#[tokio::test(flavor = "current_thread")]
async fn a_batch_outlasting_the_lambda_deadline_returns_in_time_with_cut_short_attempts_recorded() {
    let aws = emulator().await;
    let table = aws.table().await;
    let queue = aws.queue(30).await;
    let mut settings = slow_settings(30, 2_000, 10_000);
    settings.max_concurrency = 2;
    settings.deadline_margin_ms = 1_000;
    let handler = aws.handler(&table, SimulatedProvider::new(), settings);
    let mut source = aws.source(&queue).await;
    source.function_timeout_ms = 3_000;
    for id in ["late-1", "late-2", "late-3"] {
        aws.send(&queue, &slow_job(id, 20_000)).await;
    }

    let started = Instant::now();
    let (poll, report) = deliver(&source, &handler).await;
    let elapsed = started.elapsed();

    assert!(
        elapsed < Duration::from_millis(3_000),
        "returned after {elapsed:?}"
    );
    assert_eq!((poll.received, poll.failed, poll.deleted), (3, 3, 0));
    let report = report.expect("report");
    assert_eq!(report.stats.deadline_cutoffs, 2);
    let ledger = aws.ledger(&table);
    let mut unknown = 0;
    for id in ["late-1", "late-2", "late-3"] {
        // A record that never started (no call inside the safety margin) left no item.
        if let Some(item) = ledger.get(id).await.expect("get") {
            assert_eq!(item.state, JobState::Unknown);
            let error = item.last_error.expect("evidence");
            assert!(error.message.contains("Lambda deadline"), "{error:?}");
            unknown += 1;
        }
    }
    assert_eq!(unknown, 2);
    assert_eq!(handler.processor().provider().executions(), 2);
}

// On one thread, as the functions run: the heartbeat and the deadline share it with the records.
#[tokio::test(flavor = "current_thread")]
async fn one_heartbeat_tick_over_25_slow_records_makes_3_visibility_calls() {
    let aws = emulator().await;
    let table = aws.table().await;
    let queue = aws.queue(6).await;
    let mut settings = slow_settings(6, 2_000, 8_000);
    settings.max_concurrency = 25;
    let handler = aws.handler(&table, SimulatedProvider::new(), settings);
    let mut source = aws.source(&queue).await;
    source.batch_size = 25;
    for i in 0..25 {
        aws.send(&queue, &slow_job(&format!("many-{i}"), 7_000))
            .await;
    }
    aws.calls.reset();

    // Between the first tick (2 s) and the second (4 s), count what the first one sent.
    let observer = async {
        tokio::time::sleep(Duration::from_millis(3_000)).await;
        (
            aws.calls.get("sqs", "ChangeMessageVisibilityBatch"),
            aws.calls.get("dynamodb", "PutItem"),
            aws.calls.get("dynamodb", "UpdateItem"),
        )
    };
    let ((poll, report), (visibility_calls, claims, updates)) =
        tokio::join!(deliver(&source, &handler), observer);

    assert_eq!(poll.received, 25);
    assert_eq!(visibility_calls, 3, "25 handles in calls of at most 10");
    assert_eq!(claims, 25, "each new job claimed by one whole-item write");
    assert_eq!(updates, 25, "then one lease renewal each");
    assert_eq!(poll.deleted, 25);
    // A later tick may find some records already done: never more than that per tick.
    let stats = report.expect("report").stats;
    assert!(stats.heartbeat_ticks >= 2, "{stats:?}");
    assert!(
        stats.visibility_calls <= 3 * stats.heartbeat_ticks,
        "{stats:?}"
    );
    assert!(
        stats.lease_renewed <= 25 * stats.heartbeat_ticks,
        "{stats:?}"
    );
    assert_eq!(stats.lease_refused, 0, "{stats:?}");
}

/// Records the order of calls.
struct Ordered {
    inner: SimulatedProvider,
    calls: Mutex<Vec<String>>,
}

impl Provider for Ordered {
    async fn call(&self, req: &ProviderRequest<'_>) -> Result<Answer, ProviderError> {
        self.calls
            .lock()
            .expect("calls")
            .push(req.job_id.to_owned());
        self.inner.call(req).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifo_groups_run_in_order_and_stop_at_their_first_failure() {
    let aws = emulator().await;
    let table = aws.table().await;
    let queue = aws.fifo_queue(30).await;
    let provider = Ordered {
        inner: SimulatedProvider::new(),
        calls: Mutex::new(Vec::new()),
    };
    let handler = aws.handler(&table, provider, support::fast_settings());
    let source = aws.source(&queue).await;
    let mut ids = std::collections::HashMap::new();
    for (group, name, body) in [
        ("g1", "a1", slow_job("fifo-a1", 200)),
        ("g2", "b1", slow_job("fifo-b1", 100)),
        (
            "g1",
            "a2",
            job("fifo-a2", "fails", r#""simulate":{"outcome":"transient"}"#),
        ),
        ("g2", "b2", slow_job("fifo-b2", 0)),
        ("g1", "a3", slow_job("fifo-a3", 0)),
        ("g2", "b3", slow_job("fifo-b3", 0)),
    ] {
        ids.insert(name, aws.send_in_group(&queue, group, &body).await);
    }

    let (poll, report) = deliver(&source, &handler).await;
    assert_eq!(poll.received, 6);
    let report = report.expect("report");
    let mut failed = report.response.clone().expect("named failures");
    failed.sort();
    let mut expected = vec![ids["a2"].clone(), ids["a3"].clone()];
    expected.sort();
    assert_eq!(failed, expected);
    assert_eq!(
        report.outcome_of(&ids["a3"]),
        Some(&RecordOutcome::Failed(Failure::Skipped))
    );

    let calls = handler
        .processor()
        .provider()
        .calls
        .lock()
        .expect("calls")
        .clone();
    let order = |prefix: &str| -> Vec<&str> {
        calls
            .iter()
            .map(String::as_str)
            .filter(|c| c.starts_with(prefix))
            .collect()
    };
    assert_eq!(
        order("fifo-a"),
        ["fifo-a1", "fifo-a2"],
        "a3 is never processed"
    );
    assert_eq!(order("fifo-b"), ["fifo-b1", "fifo-b2", "fifo-b3"]);
    assert_eq!(aws.ledger(&table).get("fifo-a3").await.expect("get"), None);
    // The groups ran side by side: b1 started before a1 ended.
    let b1 = calls.iter().position(|c| c == "fifo-b1").expect("b1");
    let a2 = calls.iter().position(|c| c == "fifo-a2").expect("a2");
    assert!(b1 < a2, "{calls:?}");
}

/// A proxy in front of the emulator that answers every request whose `x-amz-target` or
/// `Action` names one of `stalled` only after a minute, and passes the others on.
async fn stalling_proxy(stalled: &'static [&'static str]) -> HttpStub {
    let upstream = std::env::var("AWS_ENDPOINT_URL").expect("emulator");
    HttpStub::start(move |req, _| {
        let target = req.header("x-amz-target").unwrap_or_default();
        let stall = stalled
            .iter()
            .any(|op| target.ends_with(op) || req.body.contains(&format!("Action={op}")));
        let forward = Reply::Forward(upstream.clone());
        if stall {
            Reply::Slow(Duration::from_secs(60), Box::new(forward))
        } else {
            forward
        }
    })
    .await
}

// On one thread, as the functions run: the heartbeat and the deadline share it with the records.
#[tokio::test(flavor = "current_thread")]
async fn stalled_ledger_and_visibility_calls_never_hold_the_response_past_the_deadline() {
    let aws = emulator().await;
    let table = aws.table().await;
    let timeouts = SdkTimeouts {
        connect_ms: 500,
        attempt_ms: 700,
        operation_ms: 1_500,
    };
    for (stalled, job_id) in [
        (&["PutItem", "UpdateItem"][..], "stall-ddb"),
        (&["ChangeMessageVisibilityBatch"][..], "stall-sqs"),
    ] {
        // GIVEN a worker whose ledger writes (or ChangeMessageVisibilityBatch calls) stall, with
        // 4 s per invocation
        let queue = aws.queue(2).await;
        aws.send(
            &queue,
            &job(job_id, "a report", r#""simulate":{"latency_ms":1500}"#),
        )
        .await;
        let proxy = stalling_proxy(stalled).await;
        let via = support::through(&proxy.url, timeouts).await;
        let mut settings = slow_settings(2, 600, 4_000);
        settings.deadline_margin_ms = 1_000;
        settings.min_background_call_ms = 100;
        let handler = via.handler(&table, SimulatedProvider::new(), settings);
        let mut source = aws.source(&queue).await;
        source.function_timeout_ms = 4_000;

        // WHEN it handles the job
        let started = Instant::now();
        let (poll, report) = deliver(&source, &handler).await;

        // THEN it answers before its deadline, whatever stalled
        assert_eq!(poll.received, 1, "{stalled:?}");
        assert!(
            started.elapsed() < Duration::from_millis(4_000),
            "{stalled:?}: {:?}",
            started.elapsed()
        );
        let report = report.expect("report");
        assert_eq!(report.records.len(), 1);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_the_table_refuses_fails_the_job_once_and_no_answer_is_referenced() {
    // GIVEN a proxy that refuses, as DynamoDB does, an UpdateItem that would make the item too
    // large (here, over 100 KB; the emulator would half-apply it)
    let aws = emulator().await;
    let table = aws.table().await;
    let queue = aws.queue(2).await;
    let upstream = std::env::var("AWS_ENDPOINT_URL").expect("emulator");
    let proxy = HttpStub::start(move |req, _| {
        let update = req.header("x-amz-target") == Some("DynamoDB_20120810.UpdateItem");
        if update && req.body.len() > 100_000 {
            Reply::json(
                400,
                serde_json::json!({
                    "__type": "com.amazonaws.dynamodb.v20120810#ValidationException",
                    "message": "Item size has exceeded the maximum allowed size"
                }),
            )
        } else {
            Reply::Forward(upstream.clone())
        }
    })
    .await;
    let via = support::through(&proxy.url, SdkTimeouts::default()).await;
    let handler = via.handler(&table, SimulatedProvider::new(), support::fast_settings());
    let source = aws.source(&queue).await;
    aws.send(
        &queue,
        &job(
            "big-answer",
            "a report",
            r#""simulate":{"answer_bytes":150000}"#,
        ),
    )
    .await;

    // WHEN the job is processed
    let (_, report) = deliver(&source, &handler).await;

    // THEN the refusal is final: the attempt ends failed_terminal with its reason, one call was
    // paid, and the item holds no answer
    assert_eq!(
        report.expect("report").records[0].outcome,
        RecordOutcome::Done(JobState::FailedTerminal)
    );
    assert_eq!(handler.processor().provider().executions(), 1);
    let item = aws
        .ledger(&table)
        .get("big-answer")
        .await
        .expect("get")
        .expect("item");
    assert_eq!(item.state, JobState::FailedTerminal);
    assert_eq!(item.result, None);
    assert_eq!(item.last_error.expect("error").kind, "too_large");
    let refused = proxy
        .requests()
        .iter()
        .filter(|r| r.body.len() > 100_000)
        .count();
    assert_eq!(
        refused, 1,
        "the oversized write was sent once, never retried"
    );
}
