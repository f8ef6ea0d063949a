//! The provider's rate limit: a throttled attempt is given back (in memory and in DynamoDB,
//! through the SDK on the emulator, alike), the shared schedule item reserves in DynamoDB as its
//! pure function says, and a job refused by 429s again and again still has its whole budget.

mod common;

use common::{NoWatch, claim, new_job};

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use fenced_jobs::clock::{Clock, ManualClock};
use fenced_jobs::job::{
    AttemptOutcome, Expect, Failure, JobRecord, JobState, Millis, RecordOutcome, parse_body,
};
use fenced_jobs::ledger::memory::InMemoryLedger;
use fenced_jobs::ledger::schedule::{
    CallSchedule, Limits, MemorySchedule, Reservation, ReserveRequest,
};
use fenced_jobs::ledger::{EndRequest, JobLedger, Write};
use fenced_jobs::provider::{Answer, Provider, ProviderError, ProviderRequest};
use fenced_jobs::worker::ending::{attempt_end, not_sent_end};
use fenced_jobs::worker::processor::{Invocation, Processor};
use fenced_jobs::worker::{ReplayPolicy, Settings};

const T: i64 = 1_800_000_000_000;

/// The end the owner holding `claimed` writes after a 429, as the worker builds it.
fn throttled(claimed: &JobRecord, now: i64) -> EndRequest {
    let refusal = ProviderError::Throttled {
        retry_after_ms: None,
        reason: "HTTP 429 rate_limit_exceeded".into(),
    };
    let (end, _) = attempt_end(Err(refusal), claimed, now, ReplayPolicy::Never);
    EndRequest {
        job_id: claimed.job_id.clone(),
        epoch: claimed.owner_epoch,
        attempt: claimed.attempts,
        now,
        end,
        usage: None,
        input: None,
    }
}

fn line(w: &Write) -> String {
    match w {
        Write::Applied(r) => format!(
            "applied {} e{} a{} t{} n{} log{} back{}",
            r.state.as_str(),
            r.owner_epoch,
            r.attempts,
            r.throttles,
            r.not_sent,
            r.attempt_log.len(),
            r.given_back.len()
        ),
        Write::Refused(Some(r)) => format!("refused at {} e{}", r.state.as_str(), r.owner_epoch),
        Write::Refused(None) => "refused, no item".into(),
    }
}

fn applied(w: Write) -> JobRecord {
    match w {
        Write::Applied(r) => r,
        other => panic!("not applied: {other:?}"),
    }
}

async fn story<L: JobLedger>(ledger: &L) -> Vec<String> {
    let job = new_job("throttled", "d", 1, T + 3_600_000);
    let mut log = Vec::new();
    let mut step = |w: Result<Write, _>| {
        let w = w.expect("ledger call");
        log.push(line(&w));
        w
    };
    let first = applied(step(
        ledger.claim(claim(&job, Expect::FRESH, "w1", T)).await,
    ));
    step(ledger.end(throttled(&first, T + 1)).await);
    // Given back twice over a budget of one: the job may still be claimed.
    let again = Expect {
        epoch: 1,
        attempts: 0,
    };
    let second = applied(step(ledger.claim(claim(&job, again, "w2", T + 2)).await));
    // A stale owner's throttle is refused like any stale write.
    step(ledger.end(throttled(&first, T + 3)).await);
    let given = applied(step(ledger.end(throttled(&second, T + 4)).await));
    // The attempts given back are kept apart, marked, in order.
    let kept: Vec<(u64, AttemptOutcome)> = given
        .given_back
        .iter()
        .map(|a| (a.epoch, a.outcome))
        .collect();
    assert_eq!(
        kept,
        [
            (1, AttemptOutcome::Throttled),
            (2, AttemptOutcome::Throttled)
        ]
    );
    let third = Expect {
        epoch: 2,
        attempts: 0,
    };
    let claimed = applied(step(ledger.claim(claim(&job, third, "w3", T + 5)).await));
    // A call that is never sent gives its attempt back too.
    let end = not_sent_end("no time left to make the call", &claimed, T + 6);
    step(
        ledger
            .end(EndRequest {
                job_id: claimed.job_id.clone(),
                epoch: claimed.owner_epoch,
                attempt: claimed.attempts,
                now: T + 6,
                end,
                usage: None,
                input: None,
            })
            .await,
    );
    log
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_throttled_attempt_is_given_back_alike_in_memory_and_in_dynamodb() {
    let memory = InMemoryLedger::new();
    let memory_log = story(&memory).await;
    let aws = common::emulator().await;
    let table = aws.table().await;
    let dynamo = aws.ledger(&table);
    let dynamo_log = story(&dynamo).await;
    assert_eq!(memory_log, dynamo_log);
    assert_eq!(
        memory_log,
        [
            "applied running e1 a1 t0 n0 log1 back0",
            "applied retry_authorized e1 a0 t1 n0 log0 back1",
            "applied running e2 a1 t1 n0 log1 back1",
            "refused at running e2",
            "applied retry_authorized e2 a0 t2 n0 log0 back2",
            "applied running e3 a1 t2 n0 log1 back2",
            "applied retry_authorized e3 a0 t2 n1 log0 back3",
        ]
    );
    let m = memory.get("throttled").await.expect("get").expect("item");
    let d = dynamo.get("throttled").await.expect("get").expect("item");
    assert_eq!(m, d);
    assert_eq!(
        d.last_error.as_ref().map(|e| e.kind.as_str()),
        Some("not_sent")
    );
}

fn reserve(now: Millis, requests: u64, tokens: u64) -> ReserveRequest {
    ReserveRequest {
        key: "openai".into(),
        limits: Limits {
            rpm: 600,
            tpm: 60_000,
        },
        requests,
        tokens,
        now,
        horizon_ms: 5_000,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_schedule_item_in_dynamodb_reserves_as_the_pure_function_does() {
    let aws = common::emulator().await;
    let table = aws.table().await;
    let dynamo = aws.ledger(&table);
    let memory = MemorySchedule::new();
    // Idle, busy, token-bound, past the horizon, and idle again a minute later.
    let steps = [
        reserve(T, 10, 500),
        reserve(T + 10, 10, 500),
        reserve(T + 20, 1, 3_000),
        reserve(T + 25, 1, 3_000),
        reserve(T + 30, 5, 0),
        reserve(T + 60_000, 2, 100),
    ];
    let mut got = Vec::new();
    for req in steps {
        let d = dynamo.reserve(req.clone()).await.expect("dynamodb");
        let m = memory.reserve(req).await.expect("memory");
        assert_eq!(d, m);
        got.push(d);
    }
    // A read without writing shows the same bookings.
    assert_eq!(
        dynamo.peek("openai").await.expect("dynamodb"),
        memory.peek("openai").await.expect("memory")
    );
    assert!(dynamo.peek("openai").await.expect("read").is_some());
    assert_eq!(dynamo.peek("nobody").await.expect("read"), None);
    assert_eq!(
        got,
        [
            Reservation::Granted { start: T },
            Reservation::Granted { start: T + 1_000 },
            Reservation::Granted { start: T + 2_000 },
            // Tokens bind: 3,000 tokens at 60,000 a minute are 3 s.
            Reservation::Granted { start: T + 4_000 },
            Reservation::Booked { until: T + 7_000 },
            Reservation::Granted { start: T + 60_000 },
        ]
    );
}

/// One clock for the test and the processor.
#[derive(Clone)]
struct SharedClock(Arc<ManualClock>);

impl Clock for SharedClock {
    fn now_ms(&self) -> Millis {
        self.0.now_ms()
    }
}

/// A provider at its rate limit for the first `refusals` calls, then answering.
struct Limited {
    refusals: u32,
    calls: AtomicU32,
}

impl Provider for Limited {
    async fn call(&self, req: &ProviderRequest<'_>) -> Result<Answer, ProviderError> {
        let n = self.calls.fetch_add(1, Ordering::Relaxed);
        if n < self.refusals {
            return Err(ProviderError::Throttled {
                retry_after_ms: Some(60_000),
                reason: "HTTP 429 rate_limit_exceeded".into(),
            });
        }
        Ok(Answer {
            body: format!(r#"{{"job":"{}"}}"#, req.job_id),
            provider_ref: None,
            finish: fenced_jobs::job::contract::Finish::Stop,
            usage: None,
        })
    }
}

#[tokio::test]
async fn a_job_refused_by_429s_more_often_than_its_budget_still_runs_and_counts_them() {
    let ledger = Arc::new(InMemoryLedger::new());
    let clock = SharedClock(Arc::new(ManualClock::at(T)));
    let provider = Limited {
        refusals: 3,
        calls: AtomicU32::new(0),
    };
    let processor = Processor::new(
        Arc::clone(&ledger),
        provider,
        clock.clone(),
        Settings::default(),
    );
    let msg = parse_body(Some(
        r#"{"job_id":"busy","contract":"summary.v1","max_attempts":1,"input":{"model":"m","prompt":"p"}}"#,
    ))
    .expect("valid");
    let inv = Invocation {
        id: "inv".into(),
        deadline: None,
    };
    let mut outcomes = Vec::new();
    for delivery in 0..4 {
        let processed = processor
            .process(&msg, &format!("w{delivery}"), &inv, &NoWatch)
            .await;
        outcomes.push(processed.outcome);
        // The wait the provider asked for (60 s, past the in-process horizon) passes.
        clock.0.advance(61_000);
    }
    // Given back, each refused delivery waits for capacity (the provider's Retry-After), not a
    // backoff that grows with the receives.
    let labels: Vec<&str> = outcomes.iter().map(RecordOutcome::label).collect();
    assert_eq!(labels, ["paced", "paced", "paced", "succeeded"]);
    assert_eq!(
        outcomes[0],
        RecordOutcome::Failed(Failure::Paced { wait_ms: 60_000 })
    );
    let item = ledger.get("busy").await.expect("get").expect("item");
    assert_eq!(item.state, JobState::Succeeded);
    assert_eq!(
        (item.attempts, item.max_attempts, item.throttles),
        (1, 1, 3)
    );
    assert!(matches!(
        processor
            .process(&msg, "late", &inv, &NoWatch)
            .await
            .outcome,
        RecordOutcome::Done(JobState::Succeeded)
    ));
    // The environment's adaptive limit was halved by each refusal and grew back by the answer.
    assert!(processor.pacer().limit() < 16.0);
}

/// A worker environment with its own pacer on the shared schedule in the table.
fn paced_handler(
    aws: &common::Emulator,
    table: &str,
    rpm: u64,
) -> fenced_jobs::worker::BatchHandler<
    fenced_jobs::ledger::dynamodb::DynamoLedger,
    fenced_jobs::provider::SimulatedProvider,
    fenced_jobs::clock::SystemClock,
    fenced_jobs::queue::SqsVisibility,
> {
    let mut settings = Settings::default();
    settings.visibility.paced_spread_s = 0;
    settings.pacing.limits = Limits { rpm, tpm: 0 };
    settings.pacing.horizon_ms = 1_000;
    let pacer = fenced_jobs::worker::pacing::Pacer::new(
        settings.pacing(),
        Some(Arc::new(aws.ledger(table)) as Arc<dyn CallSchedule>),
    );
    fenced_jobs::worker::BatchHandler::new(
        Processor::new(
            aws.ledger(table),
            fenced_jobs::provider::SimulatedProvider::new(),
            fenced_jobs::clock::SystemClock,
            settings,
        )
        .with_pacer(pacer),
        fenced_jobs::queue::SqsVisibility::new(aws.sqs.clone()),
    )
    .with_seed(7)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_environments_share_the_providers_limit_through_the_schedule_item() {
    let aws = common::emulator().await;
    let table = aws.table().await;
    let queue = aws.queue(30).await;
    let mut source = aws.source(&queue).await;
    source.batch_size = 10;
    // 120 requests a minute: a chunk of 10 books 5 s of the provider.
    let first = paced_handler(&aws, &table, 120);
    let second = paced_handler(&aws, &table, 120);
    for i in 0..10 {
        aws.send(&queue, &common::job(&format!("a-{i}"), "p", ""))
            .await;
    }
    let (poll, _) = common::deliver(&source, &first).await;
    assert_eq!((poll.received, poll.deleted), (10, 10));

    // The other environment finds the next 5 s booked, past its 1 s horizon: it defers its
    // records without claiming any (one refused reservation); each job, seen for the first
    // time, is created `ready` with its trigger marked as queued, so its deadline is fixed and
    // the reconciler can see it (one create each, and no claim).
    for i in 0..10 {
        aws.send(&queue, &common::job(&format!("b-{i}"), "p", ""))
            .await;
    }
    aws.calls.reset();
    let (poll, report) = common::deliver(&source, &second).await;
    assert_eq!((poll.received, poll.failed), (10, 10));
    let labels: Vec<&str> = report
        .expect("report")
        .records
        .iter()
        .map(|r| r.outcome.label())
        .collect();
    assert_eq!(labels, ["paced"; 10]);
    assert_eq!(aws.calls.get("dynamodb", "PutItem"), 10);
    assert_eq!(aws.calls.get("dynamodb", "UpdateItem"), 1);
    for i in 0..10 {
        let item = aws.item(&table, &format!("b-{i}")).await;
        assert_eq!((item.state, item.attempts), (JobState::Ready, 0), "b-{i}");
        assert!(item.enqueued_at.is_some(), "b-{i}");
    }

    // Once the booked time is within the horizon, they run, on one more reservation: each
    // redelivered record reads its item and claims it in place.
    tokio::time::sleep(std::time::Duration::from_millis(5_500)).await;
    aws.calls.reset();
    let (poll, _) = common::deliver(&source, &second).await;
    assert_eq!((poll.received, poll.deleted), (10, 10));
    assert_eq!(aws.calls.get("dynamodb", "PutItem"), 0);
    // (and the environment refused before reads the schedule item once before booking again)
    assert_eq!(aws.calls.get("dynamodb", "GetItem"), 11);
}

/// A provider refusing every call of its first round for its rate limit (a short
/// `Retry-After`), then answering slowly; it counts the calls running at once in each round.
struct Crowded {
    round_size: u32,
    calls: AtomicU32,
    running: AtomicU32,
    most_after_refusals: AtomicU32,
}

impl Provider for Crowded {
    async fn call(&self, req: &ProviderRequest<'_>) -> Result<Answer, ProviderError> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst);
        if n < self.round_size {
            // All of the first round are in flight together before they are refused.
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            return Err(ProviderError::Throttled {
                retry_after_ms: Some(200),
                reason: "HTTP 429 rate_limit_exceeded".into(),
            });
        }
        let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_after_refusals.fetch_max(now, Ordering::SeqCst);
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        self.running.fetch_sub(1, Ordering::SeqCst);
        Ok(Answer {
            body: format!(r#"{{"job":"{}"}}"#, req.job_id),
            provider_ref: None,
            finish: fenced_jobs::job::contract::Finish::Stop,
            usage: None,
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_sent_again_after_429s_keep_to_the_limit_the_429s_lowered() {
    // GIVEN a batch of ten records whose ten calls, sent together, are all refused for the
    // rate limit with a short Retry-After (so each is sent again under its claim)
    let provider = Crowded {
        round_size: 10,
        calls: AtomicU32::new(0),
        running: AtomicU32::new(0),
        most_after_refusals: AtomicU32::new(0),
    };
    let mut settings = Settings::default();
    settings.pacing.max_in_flight = 10;
    let pacer = fenced_jobs::worker::pacing::Pacer::new(settings.pacing(), None);
    let handler = fenced_jobs::worker::BatchHandler::new(
        Processor::new(
            Arc::new(InMemoryLedger::new()),
            provider,
            fenced_jobs::clock::SystemClock,
            settings,
        )
        .with_pacer(pacer),
        fenced_jobs::queue::RecordingVisibility::new(),
    );
    let records = (0..10)
        .map(|i| {
            let mut m = aws_lambda_events::sqs::SqsMessage::default();
            m.message_id = Some(format!("m{i}"));
            m.receipt_handle = Some(format!("h{i}"));
            m.body = Some(common::job(&format!("crowd-{i}"), "p", ""));
            m.event_source_arn = Some("arn:aws:sqs:us-east-1:123456789012:q".into());
            m
        })
        .collect();
    let mut event = aws_lambda_events::sqs::SqsEvent::default();
    event.records = records;
    let inv = Invocation {
        id: "inv".into(),
        deadline: Some(fenced_jobs::clock::SystemClock.now_ms() + 60_000),
    };
    // WHEN the batch runs
    let report = handler.handle_batch(&event, &inv).await;
    // THEN every job succeeded, and the calls sent again never ran more than five at once:
    // the limit the refusals halved holds for them, instead of all ten going again together
    assert!(
        report.records.iter().all(|r| r.outcome.is_success()),
        "{report:?}"
    );
    let provider = handler.processor().provider();
    assert_eq!(provider.calls.load(Ordering::SeqCst), 20);
    let most = provider.most_after_refusals.load(Ordering::SeqCst);
    assert!(
        (1..=5).contains(&most),
        "{most} calls at once after the refusals"
    );
}

/// Processes jobs of `tenant` until one is paced (at most `most`), on a clock that stands
/// still; returns how many were admitted first.
async fn admitted_before_paced(
    processor: &Processor<InMemoryLedger, fenced_jobs::provider::SimulatedProvider, ManualClock>,
    tenant: &str,
    most: usize,
) -> usize {
    let inv = Invocation {
        id: "tenants".into(),
        deadline: None,
    };
    for i in 0..most {
        let body = format!(
            r#"{{"job_id":"{tenant}-{i}","tenant":"{tenant}","contract":"c","input":{{"model":"m","prompt":"p"}}}}"#
        );
        let msg = fenced_jobs::job::parse_body(Some(&body)).expect("valid");
        let done = processor
            .process(&msg, &format!("w/{tenant}/{i}"), &inv, &NoWatch)
            .await;
        if matches!(done.outcome, RecordOutcome::Failed(Failure::Paced { .. })) {
            return i;
        }
    }
    most
}

#[tokio::test]
async fn a_tenant_capped_at_half_the_pace_leaves_the_other_half_to_another_tenant() {
    for (percent, other_runs) in [(50, true), (100, false)] {
        // GIVEN 1,200 requests a minute, a horizon of 0.2 s, and tenants capped at `percent`
        let mut settings = Settings::default();
        settings.pacing.limits = Limits { rpm: 1_200, tpm: 0 };
        settings.pacing.horizon_ms = 200;
        settings.pacing.chunk = 1;
        settings.tenant_pacing_percent = percent;
        let schedule: Arc<dyn CallSchedule> = Arc::new(MemorySchedule::new());
        let processor = Processor::new(
            InMemoryLedger::new(),
            fenced_jobs::provider::SimulatedProvider::new(),
            ManualClock::at(1_800_000_000_000),
            settings.clone(),
        )
        .with_pacer(fenced_jobs::worker::pacing::Pacer::new(
            settings.pacing(),
            Some(Arc::clone(&schedule)),
        ))
        .with_tenant_schedule(Arc::clone(&schedule));

        // WHEN one tenant's jobs run until the pace turns one away, then another's comes
        let bulk = admitted_before_paced(&processor, "bulk", 20).await;
        let other = admitted_before_paced(&processor, "other", 1).await;

        // THEN the capped tenant stopped at its share, and the other tenant's job ran; uncapped,
        // the first tenant took the whole horizon and the other waits behind it
        assert!(bulk < 20, "{percent} %: never paced");
        assert_eq!(other == 1, other_runs, "{percent} %: bulk ran {bulk}");
    }
}
