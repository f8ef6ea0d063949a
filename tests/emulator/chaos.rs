//! The fault-injection run at a small size on the emulator, through the real SDK: some hundreds
//! of jobs, several consumers at once, invocations that crash (no response) or stop the world
//! for longer than the lease, a provider with transient and permanent failures; the same
//! invariants, checked from the ledger.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use fenced_jobs::job::{AttemptOutcome, JobState};
use fenced_jobs::ledger::JobLedger;
use fenced_jobs::provider::SimulatedProvider;

use crate::support::{self, emulator, slow_settings};

const JOBS: usize = 200;
const CONSUMERS: usize = 4;

/// Runs `fut`, but stops polling it for `pause` after `after`: the whole invocation, heartbeat
/// included, is frozen, as in a stop-the-world pause of its worker.
async fn with_pause<F: Future>(fut: F, after: Duration, pause: Duration) -> F::Output {
    tokio::pin!(fut);
    tokio::select! {
        out = &mut fut => return out,
        _ = tokio::time::sleep(after) => {}
    }
    tokio::time::sleep(pause).await;
    fut.await
}

/// Whether every job is terminal, or `unknown` (waiting for an operator: its message stays
/// invisible for the awaiting-decision wait).
async fn settled(ledger: &fenced_jobs::ledger::dynamodb::DynamoLedger) -> bool {
    for i in 0..JOBS {
        let item = ledger.get(&format!("cx-{i:03}")).await.ok().flatten();
        if !item.is_some_and(|r| r.state.is_terminal() || r.state == JobState::Unknown) {
            return false;
        }
    }
    true
}

/// One run of the reconciler, as its schedule would run it, with short thresholds: watched
/// jobs re-sent by id, and live jobs' dead letters (moved there after too many receives) sent
/// back. The triggers and letters it sent.
async fn reconcile_once(
    aws: &support::Emulator,
    ledger: &fenced_jobs::ledger::dynamodb::DynamoLedger,
    queue: &support::Queue,
) -> u64 {
    let now = fenced_jobs::clock::Clock::now_ms(&fenced_jobs::clock::SystemClock);
    let quick = fenced_jobs::ops::reconcile::ReconcileSettings {
        ready_after_ms: 4_000,
        retry_after_ms: 4_000,
        ..Default::default()
    };
    let report = fenced_jobs::ops::reconcile::reconcile(
        ledger,
        &fenced_jobs::queue::SqsTriggers::new(aws.sqs.clone(), &queue.url),
        &SimulatedProvider::new(),
        now,
        &quick,
    )
    .await
    .expect("reconcile");
    let reader = fenced_jobs::queue::SqsReader::new(aws.sqs.clone());
    let urls = (queue.dlq_url.as_str(), queue.url.as_str());
    let anyone = fenced_jobs::job::scope::Producers::default();
    let swept =
        fenced_jobs::ops::operator::redrive_live(ledger, &anyone, &reader, urls, (1_000, now))
            .await;
    assert_eq!(swept.failed, 0, "{swept:?}");
    report.resent + swept.moved
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundreds_of_jobs_under_crashes_and_pauses_keep_every_invariant() {
    let aws = emulator().await;
    let table = aws.table().await;
    let queue = aws.queue(2).await;
    let mut rng = fastrand::Rng::with_seed(7);
    let mut bodies = Vec::new();
    for i in 0..JOBS {
        let simulate = match rng.u8(0..10) {
            0 => r#","fail_times":1"#.to_owned(),
            1 => r#","outcome":"permanent""#.to_owned(),
            _ => String::new(),
        };
        bodies.push(support::job(
            &format!("cx-{i:03}"),
            "p",
            &format!(
                r#""simulate":{{"latency_ms":{}{simulate}}}"#,
                rng.u32(0..1_500)
            ),
        ));
    }
    for chunk in bodies.chunks(10) {
        let entries = chunk
            .iter()
            .enumerate()
            .map(|(i, b)| {
                aws_sdk_sqs::types::SendMessageBatchRequestEntry::builder()
                    .id(i.to_string())
                    .message_body(b)
                    .build()
                    .expect("entry")
            })
            .collect();
        aws.sqs
            .send_message_batch()
            .queue_url(&queue.url)
            .set_entries(Some(entries))
            .send()
            .await
            .expect("send");
    }

    let crashes = AtomicU64::new(0);
    let pauses = AtomicU64::new(0);
    let acked_early = AtomicU64::new(0);
    let resent = AtomicU64::new(0);
    let started = Instant::now();
    let consumers = (0..CONSUMERS).map(|c| {
        let handler = aws.handler(
            &table,
            SimulatedProvider::new(),
            slow_settings(2, 600, 3_000),
        );
        let ledger = aws.ledger(&table);
        let (crashes, pauses, acked_early, resent) = (&crashes, &pauses, &acked_early, &resent);
        let aws = &aws;
        let queue = &queue;
        async move {
            let mut source = aws.source(queue).await;
            source.wait_seconds = 1;
            let mut rng = fastrand::Rng::with_seed(100 + c as u64);
            let mut executions = 0;
            while started.elapsed() < Duration::from_secs(150) {
                let roll = rng.u8(0..100);
                let after = Duration::from_millis(rng.u64(0..1_200));
                let handler = &handler;
                let ledger = &ledger;
                let poll = source
                    .poll_once(|event, inv| async move {
                        let run = handler.handle_batch(&event, &inv);
                        let report = match roll {
                            // The process vanishes: no response, nothing deleted.
                            0..10 => {
                                crashes.fetch_add(1, Ordering::Relaxed);
                                match tokio::time::timeout(after, run).await {
                                    Ok(report) => report,
                                    Err(_) => return Err("crashed".to_owned()),
                                }
                            }
                            // Stopped for longer than the lease (3 s) plus the skew margin.
                            10..20 => {
                                pauses.fetch_add(1, Ordering::Relaxed);
                                with_pause(run, after, Duration::from_millis(4_000)).await
                            }
                            _ => run.await,
                        };
                        // No message acknowledged unless its job is terminal.
                        for (record, r) in event.records.iter().zip(&report.records) {
                            if r.outcome.is_success() {
                                let job_id = r.job_id.clone().unwrap_or_default();
                                let item = ledger.get(&job_id).await.ok().flatten();
                                if !item.is_some_and(|i| i.state.is_terminal()) {
                                    acked_early.fetch_add(1, Ordering::Relaxed);
                                    eprintln!("acknowledged early: {:?}", record.message_id);
                                }
                            }
                        }
                        report.into_response().map_err(|e| e.to_string())
                    })
                    .await
                    .expect("poll");
                executions = handler.processor().provider().executions();
                if poll.received == 0 {
                    if settled(ledger).await {
                        break;
                    }
                    // The reconciler, as its schedule would run it, with short thresholds: it
                    // re-sends watched jobs by id, and sends live jobs' dead letters (moved
                    // there after too many receives) back.
                    if c == 0 {
                        resent
                            .fetch_add(reconcile_once(aws, ledger, queue).await, Ordering::Relaxed);
                    }
                }
            }
            executions
        }
    });
    let executions: u64 = futures::future::join_all(consumers).await.into_iter().sum();

    // Every job terminal, or unknown with its evidence; attempts within budget; a second
    // attempt only after a definite failure or a recorded decision; executions no more than
    // attempts.
    let ledger = aws.ledger(&table);
    let mut attempts_total = 0u64;
    let mut states = std::collections::BTreeMap::new();
    for i in 0..JOBS {
        let id = format!("cx-{i:03}");
        let item = ledger
            .get(&id)
            .await
            .expect("get")
            .expect("job in the ledger");
        *states.entry(item.state.as_str()).or_insert(0) += 1;
        assert!(
            item.state.is_terminal()
                || (item.state == JobState::Unknown && item.last_error.is_some()),
            "{id} ended {} after {:?}: {item:#?}",
            item.state,
            started.elapsed()
        );
        assert!(item.attempts <= item.max_attempts, "{id} over budget");
        assert_eq!(
            item.result.is_some(),
            item.state == JobState::Succeeded,
            "{id}"
        );
        for pair in item.attempt_log.windows(2) {
            let definite = matches!(
                pair[0].outcome,
                AttemptOutcome::Transient | AttemptOutcome::Permanent
            );
            assert!(
                definite || !item.decisions.is_empty(),
                "{id}: attempt {} followed an attempt ending {}",
                pair[1].number,
                pair[0].outcome.as_str()
            );
        }
        attempts_total += u64::from(item.attempts);
    }
    assert_eq!(acked_early.load(Ordering::Relaxed), 0);
    assert!(
        executions <= attempts_total,
        "{executions} executions, {attempts_total} attempts"
    );
    assert!(crashes.load(Ordering::Relaxed) > 0 && pauses.load(Ordering::Relaxed) > 0);
    assert!(
        states.get("succeeded").copied().unwrap_or(0) > JOBS / 2,
        "{states:?}"
    );
    eprintln!(
        "{JOBS} jobs, {CONSUMERS} consumers, {} crashes, {} pauses, {} re-sent, {executions} executions, {attempts_total} attempts, {states:?}, {:.1} s",
        crashes.load(Ordering::Relaxed),
        pauses.load(Ordering::Relaxed),
        resent.load(Ordering::Relaxed),
        started.elapsed().as_secs_f64()
    );
}
