//! The provider's rate limit on the emulator: a throttled attempt is given back (in memory and in
//! DynamoDB, through the SDK, alike), the shared schedule item reserves in DynamoDB as its pure
//! function says, and two environments share the provider's limit through it.

use std::sync::Arc;

use fenced_jobs::job::{AttemptOutcome, Expect, JobItem, JobState, Millis};
use fenced_jobs::ledger::memory::InMemoryLedger;
use fenced_jobs::ledger::schedule::{
    CallSchedule, Limits, MemorySchedule, Reservation, ReserveRequest,
};
use fenced_jobs::ledger::{EndRequest, JobLedger, Write};
use fenced_jobs::protocol::ReplayPolicy;
use fenced_jobs::protocol::ending::{attempt_end, not_sent_end};
use fenced_jobs::provider::ProviderError;
use fenced_jobs::worker::Settings;
use fenced_jobs::worker::processor::Processor;

use crate::support::{self, T, claim, new_job};

/// The end the owner holding `claimed` writes after a 429, as the worker builds it.
fn throttled(claimed: &JobItem, now: i64) -> EndRequest {
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

fn applied(w: Write) -> JobItem {
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
    let aws = support::emulator().await;
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
    let aws = support::emulator().await;
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

/// A worker environment with its own pacer on the shared schedule in the table.
fn paced_handler(
    aws: &support::Emulator,
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
    let aws = support::emulator().await;
    let table = aws.table().await;
    let queue = aws.queue(30).await;
    let mut source = aws.source(&queue).await;
    source.batch_size = 10;
    // 120 requests a minute: a chunk of 10 books 5 s of the provider.
    let first = paced_handler(&aws, &table, 120);
    let second = paced_handler(&aws, &table, 120);
    for i in 0..10 {
        aws.send(&queue, &support::job(&format!("a-{i}"), "p", ""))
            .await;
    }
    let (poll, _) = support::deliver(&source, &first).await;
    assert_eq!((poll.received, poll.deleted), (10, 10));

    // The other environment finds the next 5 s booked, past its 1 s horizon: it defers its
    // records without claiming any (one refused reservation); each job, seen for the first
    // time, is created `ready` with its trigger marked as queued, so its deadline is fixed and
    // the reconciler can see it (one create each, and no claim).
    for i in 0..10 {
        aws.send(&queue, &support::job(&format!("b-{i}"), "p", ""))
            .await;
    }
    aws.calls.reset();
    let (poll, report) = support::deliver(&source, &second).await;
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
    let (poll, _) = support::deliver(&source, &second).await;
    assert_eq!((poll.received, poll.deleted), (10, 10));
    assert_eq!(aws.calls.get("dynamodb", "PutItem"), 0);
    // (and the environment refused before reads the schedule item once before booking again)
    assert_eq!(aws.calls.get("dynamodb", "GetItem"), 11);
}

/// One environment's share of a scripted OpenAI server at its rate limit: the moments its
/// requests arrived, each held `HELD` before its answer.
#[derive(Default)]
struct Arrivals(std::sync::Mutex<Vec<(char, std::time::Instant, bool)>>);

const HELD: std::time::Duration = std::time::Duration::from_millis(150);

impl Arrivals {
    /// The rounds of refusals of environment `env`: refused arrivals closer than 900 ms apart
    /// are one round (a `Retry-After` of a second lies between rounds), each with the most of
    /// its requests the server held at once.
    fn rounds(&self, env: char) -> Vec<usize> {
        let at: Vec<std::time::Instant> = {
            let all = self.0.lock().expect("arrivals");
            all.iter()
                .filter(|(e, _, refused)| *e == env && *refused)
                .map(|(_, t, _)| *t)
                .collect()
        };
        let mut rounds: Vec<Vec<std::time::Instant>> = Vec::new();
        for t in at {
            match rounds.last_mut() {
                Some(round)
                    if t - *round.last().expect("one") < std::time::Duration::from_millis(900) =>
                {
                    round.push(t)
                }
                _ => rounds.push(vec![t]),
            }
        }
        rounds
            .iter()
            .map(|round| {
                round
                    .iter()
                    .map(|t| {
                        round
                            .iter()
                            .filter(|u| **u <= *t && *t - **u < HELD)
                            .count()
                    })
                    .max()
                    .unwrap_or(0)
            })
            .collect()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_adaptive_limit_halves_the_calls_in_flight_at_each_round_of_429s() {
    // GIVEN two environments (each its own pacer, ten calls in flight at most) in front of one
    // OpenAI server that answers every call for 6.5 s with a 429 in OpenAI's own word and
    // `Retry-After: 1`, each answer held 150 ms, then answers them (four rounds of refusals
    // take about 4.2 s; the rest is room for a loaded machine, whose later rounds hold one)
    let aws = support::emulator().await;
    let table = aws.table().await;
    let arrivals = Arc::new(Arrivals::default());
    let seen = Arc::clone(&arrivals);
    let started = std::time::Instant::now();
    let server = crate::support::http::HttpStub::start(move |req, _| {
        use crate::support::http::Reply;
        let env = req.path.chars().nth(1).unwrap_or('?');
        let refused = started.elapsed() < std::time::Duration::from_millis(6_500);
        seen.0
            .lock()
            .expect("arrivals")
            .push((env, std::time::Instant::now(), refused));
        let reply = if refused {
            Reply::json(
                429,
                serde_json::json!({"error": {"type": "requests", "code": "rate_limit_exceeded",
                    "message": "Rate limit reached for requests", "param": null}}),
            )
            .with_header("retry-after", "1")
            .with_header("openai-processing-ms", "3")
            .with_header("openai-version", "2020-10-01")
            .with_header("x-request-id", "req_429")
        } else {
            Reply::json(200, crate::support::providers::chat_answer("A summary."))
        };
        Reply::Slow(HELD, Box::new(reply))
    })
    .await;
    let environment = |env: &str| {
        let mut settings = support::fast_settings();
        settings.pacing.max_in_flight = 10;
        let provider = fenced_jobs::provider::AnyProvider::OpenAi(
            fenced_jobs::provider::OpenAiProvider::new(
                fenced_jobs::provider::openai::OpenAiSettings {
                    base_url: format!("{}/{env}/v1", server.url),
                    api: fenced_jobs::provider::openai::OpenAiApi::Chat,
                    ..crate::support::providers::openai_settings(&server.url)
                },
                None,
            )
            .expect("client"),
        );
        aws.handler(&table, provider, settings)
    };
    let (a, b) = (environment("a"), environment("b"));
    let (queue_a, queue_b) = (aws.queue(30).await, aws.queue(30).await);
    let (mut source_a, mut source_b) = (aws.source(&queue_a).await, aws.source(&queue_b).await);
    source_a.batch_size = 10;
    source_b.batch_size = 10;
    for i in 0..10 {
        aws.send(&queue_a, &support::job(&format!("crowd-a-{i}"), "p", ""))
            .await;
        aws.send(&queue_b, &support::job(&format!("crowd-b-{i}"), "p", ""))
            .await;
    }

    // WHEN each environment takes its batch of ten at once
    let ((poll_a, _), (poll_b, _)) = tokio::join!(
        support::deliver(&source_a, &a),
        support::deliver(&source_b, &b)
    );

    // THEN every job ended in that invocation, and at each round of refusals each
    // environment held at most half its calls of the round before in flight (10, 5, 2, 1):
    // the limit the docs describe, counted where the calls arrive
    assert_eq!((poll_a.received, poll_a.deleted), (10, 10));
    assert_eq!((poll_b.received, poll_b.deleted), (10, 10));
    for env in ['a', 'b'] {
        let rounds = arrivals.rounds(env);
        assert!(rounds.len() >= 4, "{env}: {rounds:?}");
        assert_eq!(rounds[0], 10, "{env}: {rounds:?}");
        for pair in rounds.windows(2) {
            assert!(pair[1] <= (pair[0] / 2).max(1), "{env}: {rounds:?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn path_times_are_shared_through_one_item_that_keeps_each_paths_last_times() {
    use fenced_jobs::ledger::path_times::{SharedTimes, Taken};
    let aws = crate::support::emulator().await;
    let table = aws.table().await;
    let (one, other) = (aws.ledger(&table), aws.ledger(&table));
    let key = fenced_jobs::ledger::path_times::key("openai", "gpt-5");
    // GIVEN nothing shared yet: a read alone writes nothing and finds nothing
    let none: Taken = Default::default();
    let read = one.merge(&key, &none, 1_000).await.expect("read");
    assert_eq!(read, none);
    let stored = aws.ledger(&table).get("#paths#openai#gpt-5").await;
    assert!(stored.expect("get").is_none(), "a read alone wrote an item");
    // WHEN one environment adds flex times, and another adds its own and a batch's
    let flex: Taken = [vec![], vec![900, 1_100], vec![], vec![]];
    let first = one.merge(&key, &flex, 2_000).await.expect("first add");
    assert_eq!(first, flex);
    let more: Taken = [vec![3_600_000], vec![1_000], vec![], vec![]];
    let both = other.merge(&key, &more, 3_000).await.expect("second add");
    // THEN each path keeps both environments' times, oldest first, and a read sees them all
    assert_eq!(
        both,
        [vec![3_600_000], vec![900, 1_100, 1_000], vec![], vec![]]
    );
    assert_eq!(one.merge(&key, &none, 4_000).await.expect("read"), both);
    // AND past the kept number only each path's last ones stay
    let many: Taken = [vec![], (0..40).collect(), vec![], vec![]];
    let kept = one.merge(&key, &many, 5_000).await.expect("many");
    let last: Vec<Millis> = (8..40).collect();
    assert_eq!(kept[1], last);
    // AND two adds racing from the same version: both land (the loser reads again)
    let a: Taken = [vec![1], vec![], vec![], vec![]];
    let b: Taken = [vec![2], vec![], vec![], vec![]];
    let (ra, rb) = futures::join!(one.merge(&key, &a, 6_000), other.merge(&key, &b, 6_000));
    let (ra, rb) = (ra.expect("a"), rb.expect("b"));
    let after = one.merge(&key, &none, 7_000).await.expect("read");
    assert!(
        after[0].ends_with(&[1, 2]) || after[0].ends_with(&[2, 1]),
        "{after:?} {ra:?} {rb:?}"
    );
}
