//! Deferrable jobs through a provider's batch interface, over the in-memory ledger: gathered
//! into one batch, handed over while it runs, read once it ended, priced at batch prices.

use std::sync::Arc;

use aws_lambda_events::event::sqs::{SqsEvent, SqsMessage};
use fenced_jobs::clock::{Clock, SystemClock};
use fenced_jobs::job::prices::PriceTable;
use fenced_jobs::job::{AttemptOutcome, Failure, JobState, RecordOutcome};
use fenced_jobs::ledger::JobLedger;
use fenced_jobs::ledger::memory::InMemoryLedger;
use fenced_jobs::provider::SimulatedProvider;
use fenced_jobs::queue::RecordingVisibility;
use fenced_jobs::worker::Settings;
use fenced_jobs::worker::handler::BatchHandler;
use fenced_jobs::worker::processor::{Invocation, Processor};
use fenced_jobs::worker::settings::Batching;

use crate::support::ARN;

type Handler<L> = BatchHandler<L, SimulatedProvider, SystemClock, RecordingVisibility>;

fn handler<L: JobLedger>(ledger: L, settings: Settings) -> Handler<L> {
    let provider = SimulatedProvider::new().with_batches();
    BatchHandler::new(
        Processor::new(ledger, provider, SystemClock, settings),
        RecordingVisibility::new(),
    )
    .with_seed(1)
}

fn settings() -> Settings {
    Settings {
        max_concurrency: 64,
        // A hand-over's lease is over at once: the next delivery may look.
        skew_ms: 0,
        batching: Batching {
            poll_ms: 120_000,
            ..Batching::default()
        },
        ..Settings::default()
    }
}

fn record(id: &str, body: &str, receives: u32) -> SqsMessage {
    let mut m = SqsMessage::default();
    m.message_id = Some(id.to_owned());
    m.receipt_handle = Some(format!("handle-{id}"));
    m.body = Some(body.to_owned());
    m.event_source_arn = Some(ARN.to_owned());
    m.attributes
        .insert("ApproximateReceiveCount".into(), receives.to_string());
    m.attributes.insert(
        "ApproximateFirstReceiveTimestamp".into(),
        SystemClock.now_ms().to_string(),
    );
    m
}

fn event(jobs: &[String], receives: u32) -> SqsEvent {
    let mut e = SqsEvent::default();
    e.records = jobs
        .iter()
        .enumerate()
        .map(|(i, body)| record(&format!("m{i}"), body, receives))
        .collect();
    e
}

/// Each a new invocation (a delivery's owner id names it).
fn invocation() -> Invocation {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(1);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    Invocation {
        id: format!("inv-{n}"),
        deadline: Some(SystemClock.now_ms() + 60_000),
    }
}

fn deferrable(id: &str, simulate: &str) -> String {
    format!(
        r#"{{"job_id":"{id}","contract":"c","input":{{"model":"gpt-4o-mini","prompt":"summarise","deferrable":true{simulate}}}}}"#
    )
}

#[tokio::test]
async fn deferrable_jobs_of_one_invocation_go_as_one_batch_and_succeed_at_batch_prices() {
    let ledger = Arc::new(InMemoryLedger::new());
    let h = handler(ledger.clone(), settings());
    let jobs: Vec<String> = (0..50).map(|i| deferrable(&format!("d{i}"), "")).collect();
    let first = h.handle_batch(&event(&jobs, 1), &invocation()).await;
    assert_eq!(h.processor().provider().batch_sizes(), vec![50]);
    assert_eq!(first.stats.batch_lines, 50);
    // Handed over while the batch runs: each record looks again after the poll interval.
    for r in &first.records {
        assert!(
            matches!(r.outcome, RecordOutcome::Failed(Failure::Deferred { remaining_ms }) if remaining_ms == 120_000),
            "{:?}",
            r.outcome
        );
        assert!(
            r.visibility_s.is_some_and(|v| v >= 120),
            "{:?}",
            r.visibility_s
        );
    }
    let item = ledger.get("d7").await.expect("get").expect("item");
    assert_eq!(item.state, JobState::Running);
    let reference = item.last_provider_ref().expect("reference");
    assert!(reference.starts_with("batch:simbatch-1:"), "{reference}");

    let second = h.handle_batch(&event(&jobs, 2), &invocation()).await;
    assert_eq!(second.response, Ok(vec![]));
    // One paid request each, and no second batch.
    assert_eq!(h.processor().provider().executions(), 50);
    assert_eq!(h.processor().provider().batch_sizes(), vec![50]);
    let item = ledger.get("d7").await.expect("get").expect("item");
    assert_eq!(item.state, JobState::Succeeded);
    assert_eq!(item.attempts, 1);
    let usage = item.attempt_log[0].usage.expect("usage");
    let prices = PriceTable::built_in();
    let batch = prices.cost_micros("gpt-4o-mini", &usage, true);
    assert_eq!(usage.cost_micros, batch);
    assert!(batch < prices.cost_micros("gpt-4o-mini", &usage, false));
    // The completion event and `jobctl show --json` say which batch it went in.
    let event = fenced_jobs::events::CompletionEvent::of(&item).expect("announced");
    assert_eq!(event.detail["batch"]["id"], "simbatch-1");
    let shown = fenced_jobs::ops::operator::to_json(&item, false);
    assert_eq!(shown["attempt_log"][0]["batch"], "simbatch-1");
}

#[tokio::test]
async fn a_look_at_a_running_batch_writes_nothing_to_its_jobs_and_notes_its_counts_once() {
    let ledger = Arc::new(InMemoryLedger::new());
    let h = handler(ledger.clone(), settings());
    let jobs: Vec<String> = (0..3)
        .map(|i| deferrable(&format!("s{i}"), r#","simulate":{"latency_ms":600000}"#))
        .collect();
    h.handle_batch(&event(&jobs, 1), &invocation()).await;
    let writes = ledger.writes();
    let before = ledger.get("s0").await.expect("get");
    let second = h.handle_batch(&event(&jobs, 2), &invocation()).await;
    assert_eq!(
        ledger.writes(),
        writes + 1,
        "one note of the batch's counts for its three lines"
    );
    assert_eq!(
        ledger.get("s0").await.expect("get"),
        before,
        "the job is untouched"
    );
    assert_eq!(
        ledger.batch_counts("simbatch-1"),
        Some(fenced_jobs::job::BatchCounts {
            total: 3,
            completed: 0,
            failed: 0
        })
    );
    // The same counts again: nothing more is written.
    h.handle_batch(&event(&jobs, 3), &invocation()).await;
    assert_eq!(ledger.writes(), writes + 1);
    assert!(
        second
            .records
            .iter()
            .all(|r| matches!(r.outcome, RecordOutcome::Failed(Failure::Deferred { .. })))
    );
    let item = ledger.get("s0").await.expect("get").expect("item");
    assert_eq!((item.state, item.owner_epoch), (JobState::Running, 1));
}

#[tokio::test]
async fn a_failed_line_is_retried_in_a_later_batch() {
    let ledger = Arc::new(InMemoryLedger::new());
    let h = handler(ledger.clone(), settings());
    let jobs = vec![
        deferrable("ok", ""),
        deferrable("flaky", r#","simulate":{"fail_times":1}"#),
    ];
    h.handle_batch(&event(&jobs, 1), &invocation()).await;
    let second = h.handle_batch(&event(&jobs, 2), &invocation()).await;
    let flaky = ledger.get("flaky").await.expect("get").expect("item");
    assert_eq!(flaky.state, JobState::RetryAuthorized);
    assert_eq!(flaky.attempt_log[0].outcome, AttemptOutcome::Transient);
    assert!(second.records[0].outcome.is_success());
    // The retry is claimed and joins a batch of its own.
    h.handle_batch(&event(&jobs[1..], 3), &invocation()).await;
    h.handle_batch(&event(&jobs[1..], 4), &invocation()).await;
    assert_eq!(h.processor().provider().batch_sizes(), vec![2, 1]);
    let flaky = ledger.get("flaky").await.expect("get").expect("item");
    assert_eq!((flaky.state, flaky.attempts), (JobState::Succeeded, 2));
    assert!(
        flaky.attempt_log[1]
            .provider_ref
            .as_deref()
            .is_some_and(|r| r.starts_with("batch:simbatch-2:"))
    );
}

#[tokio::test]
async fn a_job_that_is_not_deferrable_is_called_as_usual() {
    let ledger = Arc::new(InMemoryLedger::new());
    let h = handler(ledger.clone(), settings());
    let body = r#"{"job_id":"now","contract":"c","input":{"model":"m","prompt":"p"}}"#.to_owned();
    let report = h.handle_batch(&event(&[body], 1), &invocation()).await;
    assert_eq!(report.response, Ok(vec![]));
    assert!(h.processor().provider().batch_sizes().is_empty());
}

#[tokio::test]
async fn the_reconciler_leaves_a_line_of_a_running_batch_to_its_record_for_hours() {
    use fenced_jobs::ledger::memory::{Fault, FaultyLedger};
    use fenced_jobs::ops::reconcile::{ReconcileSettings, reconcile};
    use fenced_jobs::queue::triggers::RecordingTriggers;
    let ledger = Arc::new(InMemoryLedger::new());
    // The batch's id is never recorded: the next delivery fences the owner and finds the
    // batch by listing, so the job runs on under a recovery (which the reconciler watches).
    let faulty = Arc::new(FaultyLedger::new(ledger.clone()));
    faulty.inject("record_ref", Fault::Fail, 3);
    let h = handler(faulty, settings());
    let jobs = vec![deferrable(
        "overnight",
        r#","simulate":{"latency_ms":3600000}"#,
    )];
    h.handle_batch(&event(&jobs, 1), &invocation()).await;
    h.handle_batch(&event(&jobs, 2), &invocation()).await;
    let item = ledger.get("overnight").await.expect("get").expect("item");
    assert_eq!((item.state, item.owner_epoch), (JobState::Running, 2));
    assert_eq!(h.processor().provider().batch_sizes(), vec![1]);
    let triggers = RecordingTriggers::default();
    let provider = SimulatedProvider::new();
    let walk = ReconcileSettings::default();
    let now = SystemClock.now_ms();
    // Ten minutes on, a running job's lapsed lease is due a re-send; a batch line's is not.
    let soon = reconcile(ledger.as_ref(), &triggers, &provider, now + 600_000, &walk)
        .await
        .expect("reconcile");
    assert_eq!(soon.resent, 0, "{soon:?}");
    // Past the stale wait (six hours) without a change, its record may have been lost.
    let later = now + walk.enqueue_stale_after_ms + 60_000;
    let late = reconcile(ledger.as_ref(), &triggers, &provider, later, &walk)
        .await
        .expect("reconcile");
    assert_eq!(late.resent, 1, "{late:?}");
}

/// `sim-1` priced on every path: a batch line cheapest, then flex, standard and priority.
fn every_path_priced() -> Arc<PriceTable> {
    let table = PriceTable::parse(
        r#"{"models": {"sim-1": {"input": 1.0, "output": 4.0, "batch_input": 0.5,
            "batch_output": 2.0, "flex_input": 0.6, "flex_output": 2.4,
            "priority_input": 2.0, "priority_output": 8.0}}}"#,
    )
    .expect("prices");
    Arc::new(table)
}

/// The batch tests' settings, the worker choosing among `paths` with every path priced.
fn choosing(paths: &str) -> Settings {
    let mut settings = settings();
    settings.batching.paths = fenced_jobs::job::path::Paths::parse(paths).expect("paths");
    settings.prices = every_path_priced();
    settings
}

/// A job of `sim-1` due `in_ms` from now, urgent or not.
fn due_in(id: &str, in_ms: i64, urgent: bool) -> String {
    let deadline = fenced_jobs::job::message::format_rfc3339_ms(SystemClock.now_ms() + in_ms);
    let priority = if urgent {
        r#","priority":"urgent""#
    } else {
        ""
    };
    format!(
        r#"{{"job_id":"{id}","contract":"c","deadline_at":"{deadline}"{priority},"input":{{"model":"sim-1","prompt":"summarise"}}}}"#
    )
}

#[tokio::test]
async fn each_job_takes_the_cheapest_path_that_ends_before_its_deadline_and_says_why() {
    // GIVEN a deployment that lets the worker choose every path
    let ledger = Arc::new(InMemoryLedger::new());
    let settings = choosing("batch,flex,standard,priority");
    let h = handler(ledger.clone(), settings);
    let hour = 3_600_000;
    let jobs = [
        due_in("two-days", 48 * hour, false),
        due_in("an-hour", hour, false),
        due_in("ten-minutes", hour / 6, false),
        due_in("urgent-now", 60_000, true),
    ];

    // WHEN they are delivered
    h.handle_batch(&event(&jobs, 1), &invocation()).await;

    // THEN each attempt took the cheapest path that ends in time, and recorded why
    use fenced_jobs::job::usage::Rate;
    for (id, path) in [
        ("two-days", Rate::Batch),
        ("an-hour", Rate::Flex),
        ("ten-minutes", Rate::Standard),
        ("urgent-now", Rate::Priority),
    ] {
        let item = ledger.get(id).await.expect("get").expect("item");
        let attempt = &item.attempt_log[0];
        let (chosen, why) = attempt
            .route
            .as_ref()
            .and_then(|r| r.path.clone())
            .expect("a path recorded");
        assert_eq!(chosen, path, "{id}: {why}");
        assert!(!why.is_empty());
        // A batch line is a batch line; the others are paid at their tier.
        assert_eq!(
            attempt
                .provider_ref
                .as_deref()
                .is_some_and(fenced_jobs::provider::batch::is_batch_ref),
            path == Rate::Batch,
            "{id}"
        );
        if path != Rate::Batch {
            assert_eq!(item.state, JobState::Succeeded, "{id}");
            let usage = attempt.usage.expect("usage");
            assert_eq!(
                usage.cost_micros,
                every_path_priced().cost_at("sim-1", &usage, path),
                "{id} paid at its path's prices"
            );
        }
    }
    // AND the batch path's line went in a batch, the others as calls
    assert_eq!(h.processor().provider().batch_sizes(), vec![1]);
    let two_days = ledger.get("two-days").await.expect("get").expect("item");
    assert_eq!(
        two_days.state,
        JobState::Running,
        "handed over while its batch runs"
    );
    // AND jobctl show says which path and why
    let item = ledger.get("an-hour").await.expect("get").expect("item");
    let shown = fenced_jobs::ops::operator::to_json(&item, false);
    assert_eq!(shown["attempt_log"][0]["path"]["name"], "flex");
}

#[tokio::test]
async fn a_flex_refusal_gives_the_attempt_back_and_the_next_claim_takes_another_path() {
    // GIVEN a job with an hour to go, the worker choosing among every path, and a provider
    // whose flex tier is full
    let ledger = Arc::new(InMemoryLedger::new());
    let settings = choosing("batch,flex,standard");
    let provider = SimulatedProvider::new().with_batches().flex_full();
    let h = BatchHandler::new(
        Processor::new(ledger.clone(), provider, SystemClock, settings),
        RecordingVisibility::new(),
    )
    .with_seed(1);
    let jobs = [due_in("flexed", 3_600_000, false)];

    // WHEN it is delivered, refused on flex, and delivered again
    let first = h.handle_batch(&event(&jobs, 1), &invocation()).await;
    assert!(
        matches!(first.records[0].outcome, RecordOutcome::Failed(_)),
        "{:?}",
        first.records[0].outcome
    );
    h.handle_batch(&event(&jobs, 2), &invocation()).await;

    // THEN the refusal spent no attempt, and the next claim went by the standard path
    use fenced_jobs::job::usage::Rate;
    let item = ledger.get("flexed").await.expect("get").expect("item");
    assert_eq!((item.state, item.throttles), (JobState::Succeeded, 1));
    let path = |a: &fenced_jobs::job::AttemptEntry| a.route.as_ref().and_then(|r| r.path.clone());
    assert_eq!(path(&item.given_back[0]).map(|p| p.0), Some(Rate::Flex));
    assert_eq!(
        item.attempt_log.last().and_then(path).map(|p| p.0),
        Some(Rate::Standard)
    );
    assert_eq!(
        h.processor().provider().executions(),
        2,
        "one refused, one answered"
    );
}

#[tokio::test]
async fn a_path_measured_faster_than_its_documented_bound_is_taken_for_shorter_deadlines() {
    // GIVEN the worker choosing between flex and standard, nothing measured yet
    use fenced_jobs::job::usage::Rate;
    let ledger = Arc::new(InMemoryLedger::new());
    let settings = choosing("flex");
    let h = handler(ledger.clone(), settings);
    let path_of = |item: &fenced_jobs::job::JobItem| fenced_jobs::job::path::of(item);
    let five_minutes = 300_000;

    // WHEN a job due in five minutes comes first, then eight due in an hour, then another
    // due in five minutes
    h.handle_batch(
        &event(&[due_in("early", five_minutes, false)], 1),
        &invocation(),
    )
    .await;
    let hourly: Vec<String> = (0..fenced_jobs::job::path::Times::ENOUGH)
        .map(|i| due_in(&format!("hourly-{i}"), 3_600_000, false))
        .collect();
    h.handle_batch(&event(&hourly, 1), &invocation()).await;
    h.handle_batch(
        &event(&[due_in("late", five_minutes, false)], 1),
        &invocation(),
    )
    .await;

    // THEN the first went standard (flex's documented 15 minutes do not fit), the hourly ones
    // flex, and the last flex too: flex answered at once eight times
    let item = |id: &'static str| {
        let ledger = ledger.clone();
        async move { ledger.get(id).await.expect("get").expect("item") }
    };
    assert_eq!(path_of(&item("early").await), Some(Rate::Standard));
    assert_eq!(path_of(&item("hourly-0").await), Some(Rate::Flex));
    let late = item("late").await;
    assert_eq!(path_of(&late), Some(Rate::Flex));
    assert_eq!(late.state, JobState::Succeeded);
}

#[tokio::test]
async fn with_webhooks_a_batchs_end_reaches_its_jobs_through_their_triggers_by_id() {
    use fenced_jobs::ledger::pushed::PushedLedger;
    use fenced_jobs::ops::webhook::{Answer, UrlRequest, WebhookSecret, handle};
    use fenced_jobs::queue::RecordingTriggers;
    // GIVEN a worker whose deployment takes the provider's webhooks
    let ledger = Arc::new(InMemoryLedger::new());
    let mut pushed = settings();
    pushed.batching.webhooks = true;
    pushed.batching.poll_ms = 3_600_000;
    let h = handler(ledger.clone(), pushed);
    let jobs: Vec<String> = (0..3).map(|i| deferrable(&format!("w{i}"), "")).collect();
    // WHEN its records go as one batch
    let first = h.handle_batch(&event(&jobs, 1), &invocation()).await;
    assert_eq!(h.processor().provider().batch_sizes(), vec![3]);
    let looks_after = |r: &fenced_jobs::report::RecordReport| r.visibility_s >= Some(3_600);
    assert!(first.records.iter().all(looks_after), "{:?}", first.records);
    // THEN the batch lists its jobs, for its webhook
    let members = ledger.batch_members("simbatch-1").await.expect("read");
    let mut listed: Vec<&str> = members.iter().map(|m| m.job_id.as_str()).collect();
    listed.sort_unstable();
    assert_eq!(listed, ["w0", "w1", "w2"]);

    // WHEN the provider's signed webhook says the batch completed
    let secret = WebhookSecret::parse("whsec_c2VjcmV0LWtleQ==").expect("secret");
    let now = SystemClock.now_ms();
    let body =
        r#"{"id":"evt_1","object":"event","type":"batch.completed","data":{"id":"simbatch-1"}}"#;
    let request = UrlRequest::signed(&secret, "msg_1", now / 1_000, body);
    let triggers = RecordingTriggers::new();
    let answer = handle(&request, &secret, ledger.as_ref(), &triggers, now).await;
    assert_eq!(answer, Answer::Triggered(3));
    // AND its triggers by id are delivered, long before the records' next look
    let by_id: Vec<String> = triggers.sent().into_iter().map(|(t, _)| t.body).collect();
    let collected = h.handle_batch(&event(&by_id, 1), &invocation()).await;
    // THEN each job succeeds from the batch's answer, paid once, and no batch is sent again
    assert_eq!(collected.response, Ok(vec![]), "{:?}", collected.records);
    for id in ["w0", "w1", "w2"] {
        let item = ledger.get(id).await.expect("get").expect("item");
        assert_eq!(
            (item.state, item.attempts),
            (JobState::Succeeded, 1),
            "{id}"
        );
    }
    assert_eq!(h.processor().provider().executions(), 3);
    assert_eq!(h.processor().provider().batch_sizes(), vec![3]);
    // AND the webhook sent again changes nothing; the records' own next look acknowledges them
    let replayed = handle(&request, &secret, ledger.as_ref(), &triggers, now + 1_000).await;
    assert_eq!(replayed, Answer::Replayed);
    assert_eq!(triggers.sent().len(), 3);
    let later = h.handle_batch(&event(&jobs, 2), &invocation()).await;
    assert_eq!(later.response, Ok(vec![]));
    assert_eq!(h.processor().provider().executions(), 3);
}

#[tokio::test]
async fn without_webhooks_no_batch_lists_its_jobs() {
    use fenced_jobs::ledger::pushed::PushedLedger;
    let ledger = Arc::new(InMemoryLedger::metered());
    let h = handler(ledger.clone(), settings());
    let jobs: Vec<String> = (0..3).map(|i| deferrable(&format!("n{i}"), "")).collect();
    h.handle_batch(&event(&jobs, 1), &invocation()).await;
    assert_eq!(h.processor().provider().batch_sizes(), vec![3]);
    let members = ledger.batch_members("simbatch-1").await.expect("read");
    assert!(members.is_empty(), "{members:?}");
}

#[tokio::test]
async fn a_path_another_environment_measured_is_taken_from_its_first_claim() {
    // GIVEN two execution environments choosing between flex and standard, sharing the times
    // they measure (at every claim here), and one of them has measured flex eight times
    use fenced_jobs::job::usage::Rate;
    use fenced_jobs::ledger::path_times::MemoryTimes;
    let ledger = Arc::new(InMemoryLedger::new());
    let times = Arc::new(MemoryTimes::new());
    let sharing = || {
        let mut settings = choosing("flex");
        settings.batching.share_times_ms = 0;
        let provider = SimulatedProvider::new().with_batches();
        let processor = Processor::new(ledger.clone(), provider, SystemClock, settings)
            .with_shared_times(times.clone());
        BatchHandler::new(processor, RecordingVisibility::new()).with_seed(1)
    };
    let (first, second) = (sharing(), sharing());
    let hourly: Vec<String> = (0..fenced_jobs::job::path::Times::ENOUGH)
        .map(|i| due_in(&format!("measured-{i}"), 3_600_000, false))
        .collect();
    first.handle_batch(&event(&hourly, 1), &invocation()).await;
    // (its next claim shares what it measured)
    let nudge = [due_in("nudge", 3_600_000, false)];
    first.handle_batch(&event(&nudge, 1), &invocation()).await;

    // WHEN the other environment, which measured nothing, claims a job due in five minutes
    let soon = [due_in("soon", 300_000, false)];
    second.handle_batch(&event(&soon, 1), &invocation()).await;

    // THEN it takes flex, as the first environment's times allow (its documented 15 minutes
    // would not fit), and the job succeeds
    let item = ledger.get("soon").await.expect("get").expect("item");
    assert_eq!(fenced_jobs::job::path::of(&item), Some(Rate::Flex));
    assert_eq!(item.state, JobState::Succeeded);
}

#[tokio::test]
async fn without_shared_times_an_environment_keeps_to_the_documented_bound() {
    use fenced_jobs::job::usage::Rate;
    let ledger = Arc::new(InMemoryLedger::new());
    let (first, second) = (
        handler(ledger.clone(), choosing("flex")),
        handler(ledger.clone(), choosing("flex")),
    );
    let hourly: Vec<String> = (0..fenced_jobs::job::path::Times::ENOUGH)
        .map(|i| due_in(&format!("alone-{i}"), 3_600_000, false))
        .collect();
    first.handle_batch(&event(&hourly, 1), &invocation()).await;
    let soon = [due_in("alone-soon", 300_000, false)];
    second.handle_batch(&event(&soon, 1), &invocation()).await;
    let item = ledger.get("alone-soon").await.expect("get").expect("item");
    assert_eq!(fenced_jobs::job::path::of(&item), Some(Rate::Standard));
}

#[tokio::test]
async fn a_flex_call_cut_off_counts_the_time_it_ran_so_a_job_due_sooner_goes_standard() {
    // GIVEN the worker choosing between flex and standard, calls cut off after a second, flex
    // having answered eight calls at once
    use fenced_jobs::job::usage::Rate;
    let ledger = Arc::new(InMemoryLedger::new());
    let mut settings = choosing("flex");
    settings.provider_timeout_ms = 1_000;
    settings.deadline_margin_ms = 0;
    let h = handler(ledger.clone(), settings);
    let hourly: Vec<String> = (0..fenced_jobs::job::path::Times::ENOUGH)
        .map(|i| due_in(&format!("quick-{i}"), 3_600_000, false))
        .collect();
    h.handle_batch(&event(&hourly, 1), &invocation()).await;
    let path_of = |item: &fenced_jobs::job::JobItem| fenced_jobs::job::path::of(item);
    let quick = ledger.get("quick-0").await.expect("get").expect("item");
    assert_eq!(path_of(&quick), Some(Rate::Flex));

    // WHEN a flex call hangs until it is cut off, its outcome unknown
    let hung = due_in("hung", 3_600_000, false).replace(
        r#""prompt":"summarise""#,
        r#""prompt":"summarise","simulate":{"outcome":"hang","retrievable":false}"#,
    );
    h.handle_batch(&event(&[hung], 1), &invocation()).await;
    let item = ledger.get("hung").await.expect("get").expect("item");
    assert_eq!(path_of(&item), Some(Rate::Flex));
    assert_eq!(item.attempt_log[0].outcome, AttemptOutcome::Uncertain);

    // THEN a job due in 1.8 s goes standard: flex's slowest (the second it ran) and a standard
    // call after it do not fit, though every flex answer came at once
    h.handle_batch(&event(&[due_in("soon", 1_800, false)], 1), &invocation())
        .await;
    let soon = ledger.get("soon").await.expect("get").expect("item");
    assert_eq!(
        path_of(&soon),
        Some(Rate::Standard),
        "{:?}",
        soon.attempt_log
    );
}
