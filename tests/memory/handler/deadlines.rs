//! Time: the attempt budget, the job's deadline, the invocation's safety margin, hung and
//! silent calls, and the heartbeat's late ticks.

use std::sync::Arc;

use fenced_jobs::clock::{Clock, SystemClock};
use fenced_jobs::job::{Failure, JobState, RecordOutcome};
use fenced_jobs::ledger::JobLedger;
use fenced_jobs::ledger::memory::{Fault, InMemoryLedger};
use fenced_jobs::provider::{Answer, Provider, ProviderError, ProviderRequest, SimulatedProvider};
use fenced_jobs::queue::RecordingVisibility;
use fenced_jobs::worker::Settings;
use fenced_jobs::worker::processor::Invocation;

use super::{event, faulty, handler, invocation, job, record, tight_settings};

#[tokio::test]
async fn transient_failures_stop_at_the_attempt_budget() {
    let ledger = Arc::new(InMemoryLedger::new());
    let h = handler(
        ledger.clone(),
        SimulatedProvider::new(),
        Settings::default(),
    );
    let body = r#"{"job_id":"never","contract":"c","max_attempts":2,"input":{"model":"m","prompt":"p","simulate":{"outcome":"transient"}}}"#;
    for n in 0..4 {
        h.handle_batch(
            &event(vec![record(Some(&format!("m{n}")), body)]),
            &invocation(),
        )
        .await;
    }
    let item = ledger.get("never").await.expect("get").expect("item");
    assert_eq!((item.state, item.attempts), (JobState::FailedTerminal, 2));
    assert_eq!(item.last_error.map(|e| e.kind), Some("budget".to_owned()));
    assert_eq!(h.processor().provider().executions(), 2);
}

#[tokio::test]
async fn a_job_past_its_deadline_expires_without_a_provider_call() {
    let ledger = Arc::new(InMemoryLedger::new());
    let h = handler(
        ledger.clone(),
        SimulatedProvider::new(),
        Settings::default(),
    );
    let body = r#"{"job_id":"late","contract":"c","deadline_at":"2020-01-01T00:00:00Z","input":{"model":"m","prompt":"p"}}"#;
    let report = h
        .handle_batch(&event(vec![record(Some("m1"), body)]), &invocation())
        .await;
    assert_eq!(
        report.records[0].outcome,
        RecordOutcome::Done(JobState::Expired)
    );
    assert_eq!(h.processor().provider().executions(), 0);
    assert_eq!(
        ledger.get("late").await.expect("get").map(|r| r.state),
        Some(JobState::Expired)
    );
}

#[tokio::test]
async fn a_hung_call_is_cut_off_and_recorded_as_uncertain_never_retried_blindly() {
    let ledger = Arc::new(InMemoryLedger::new());
    let settings = Settings {
        provider_timeout_ms: 200,
        ..Settings::default()
    };
    let h = handler(ledger.clone(), SimulatedProvider::new(), settings);
    let body = job(
        "stuck",
        r#","simulate":{"outcome":"hang","retrievable":false}"#,
    );
    let report = h
        .handle_batch(&event(vec![record(Some("m1"), &body)]), &invocation())
        .await;
    // The provider was not asked yet and has a reference for the call: a short backoff, and
    // the next delivery asks (the half-hour wait comes once it could not say).
    assert_eq!(
        report.records[0].outcome,
        RecordOutcome::Failed(Failure::AwaitingRecovery)
    );
    assert!(report.records[0].visibility_s.is_some_and(|s| s <= 5));
    let item = ledger.get("stuck").await.expect("get").expect("item");
    assert_eq!(item.state, JobState::Unknown);
    // What the call used is unknown: it is counted at its estimate, the input at four bytes a
    // token and the whole answer its ceiling allows, and marked as one.
    let usage = item.attempt_log[0].usage.expect("an estimate");
    assert!(usage.estimated, "{usage:?}");
    let input = fenced_jobs::job::parse_body(Some(&body))
        .expect("a job")
        .input_canonical;
    assert_eq!(usage.input, (input.len() as u64).div_ceil(4));
    assert_eq!(usage.output, 16_384);
    assert_eq!(
        item.last_error.map(|e| e.kind),
        Some("uncertain".to_owned())
    );

    // Another delivery waits for a decision: no second call.
    let again = h
        .handle_batch(&event(vec![record(Some("m2"), &body)]), &invocation())
        .await;
    assert_eq!(
        again.records[0].outcome,
        RecordOutcome::Failed(Failure::AwaitingDecision)
    );
    assert_eq!(h.processor().provider().executions(), 1);
}

#[tokio::test]
async fn no_work_starts_inside_the_invocation_safety_margin() {
    let ledger = Arc::new(InMemoryLedger::new());
    let h = handler(
        ledger.clone(),
        SimulatedProvider::new(),
        Settings::default(),
    );
    let nearly_over = Invocation {
        id: "inv".into(),
        deadline: Some(SystemClock.now_ms() + 1_000),
    };
    let report = h
        .handle_batch(
            &event(vec![record(Some("m1"), &job("later", ""))]),
            &nearly_over,
        )
        .await;
    assert!(matches!(
        report.records[0].outcome,
        RecordOutcome::Failed(Failure::Backoff { .. })
    ));
    assert_eq!(ledger.writes(), 0);
    assert_eq!(h.processor().provider().executions(), 0);
}

/// A provider that answers at once and cannot be asked about a call afterwards.
struct Synchronous(SimulatedProvider);

impl Provider for Synchronous {
    async fn call(&self, req: &ProviderRequest<'_>) -> Result<Answer, ProviderError> {
        self.0.call(req).await
    }
}

#[tokio::test]
async fn no_claim_is_made_without_time_for_the_call() {
    // GIVEN an invocation with 7 s left before its margin, and a synchronous provider whose
    // least useful call time is 20 s
    let ledger = Arc::new(InMemoryLedger::new());
    let h = handler(
        ledger.clone(),
        Synchronous(SimulatedProvider::new()),
        Settings::default(),
    );
    let short = Invocation {
        id: "inv".into(),
        deadline: Some(SystemClock.now_ms() + 12_000),
    };
    // WHEN a fresh job arrives
    let report = h
        .handle_batch(&event(vec![record(Some("m1"), &job("late", ""))]), &short)
        .await;
    // THEN it backs off with the ledger untouched and no call made: no uncertainty is made
    assert!(
        matches!(
            report.records[0].outcome,
            RecordOutcome::Failed(Failure::Backoff { .. })
        ),
        "{:?}",
        report.records[0].outcome
    );
    assert_eq!(ledger.writes(), 0);
    assert_eq!(h.processor().provider().0.executions(), 0);

    // AND with the same time left, a provider that can be asked later (and hand the job over)
    // claims and runs it
    let h = handler(
        ledger.clone(),
        SimulatedProvider::new(),
        Settings::default(),
    );
    let report = h
        .handle_batch(&event(vec![record(Some("m2"), &job("late", ""))]), &short)
        .await;
    assert_eq!(
        report.records[0].outcome,
        RecordOutcome::Done(JobState::Succeeded)
    );
}

/// A job whose deadline comes `due_ms` after now and whose simulated call takes `latency_ms`.
fn job_due_in(job_id: &str, due_ms: i64, latency_ms: u64) -> String {
    let deadline = fenced_jobs::job::message::format_rfc3339_ms(SystemClock.now_ms() + due_ms);
    format!(
        r#"{{"job_id":"{job_id}","contract":"c","deadline_at":"{deadline}","input":{{"model":"m","prompt":"p","simulate":{{"latency_ms":{latency_ms}}}}}}}"#
    )
}

#[tokio::test]
async fn a_call_cut_off_by_the_jobs_own_deadline_expires_the_job() {
    // GIVEN a job whose deadline comes 3 s after it arrives (past the 2 s skew margin, so it is
    // claimed) and whose call takes 10 s
    let ledger = Arc::new(InMemoryLedger::new());
    let h = handler(
        ledger.clone(),
        SimulatedProvider::new(),
        Settings::default(),
    );
    let body = job_due_in("short-lived", 3_000, 10_000);
    // WHEN it is processed
    let report = h
        .handle_batch(&event(vec![record(Some("m1"), &body)]), &invocation())
        .await;
    // THEN the call is cut off at the deadline and the job expires: an answer could never have
    // been accepted, so there is nothing uncertain to decide
    assert_eq!(
        report.records[0].outcome,
        RecordOutcome::Done(JobState::Expired)
    );
    let item = ledger.get("short-lived").await.expect("get").expect("item");
    assert_eq!(item.state, JobState::Expired);
    assert_eq!(h.processor().provider().executions(), 1);
}

#[tokio::test]
async fn a_stalled_ledger_write_cannot_hold_the_response_past_the_deadline() {
    // GIVEN a ledger whose acceptance write never answers, and 2 s left in the invocation
    let ledger = Arc::new(faulty("end", Fault::Stall, u32::MAX));
    let h = handler(ledger.clone(), SimulatedProvider::new(), tight_settings());
    let inv = Invocation {
        id: "inv".into(),
        deadline: Some(SystemClock.now_ms() + 2_000),
    };
    // WHEN a job is processed
    let started = std::time::Instant::now();
    let report = h
        .handle_batch(&event(vec![record(Some("m1"), &job("stuck", ""))]), &inv)
        .await;
    // THEN the response comes before the deadline, the record backs off, and its job stays
    // fenced under its claim
    assert!(started.elapsed() < std::time::Duration::from_millis(2_000));
    assert!(
        matches!(
            report.records[0].outcome,
            RecordOutcome::Failed(Failure::Backoff { .. })
        ),
        "{:?}",
        report.records[0].outcome
    );
    let item = ledger.inner.get("stuck").await.expect("get").expect("item");
    assert_eq!((item.state, item.owner_epoch), (JobState::Running, 1));
}

#[tokio::test]
async fn an_answer_within_the_skew_margin_of_the_deadline_is_not_accepted() {
    // GIVEN a job whose deadline comes 3 s after it arrives, a 2 s skew margin, and a call
    // that answers after 1.5 s, inside the margin
    let ledger = Arc::new(InMemoryLedger::new());
    let h = handler(
        ledger.clone(),
        SimulatedProvider::new(),
        Settings::default(),
    );
    let body = job_due_in("near-deadline", 3_000, 1_500);
    // WHEN it is processed
    let report = h
        .handle_batch(&event(vec![record(Some("m1"), &body)]), &invocation())
        .await;
    // THEN the answer is not accepted (a clock behind by the margin could accept it after the
    // deadline): the job expires
    assert_eq!(
        report.records[0].outcome,
        RecordOutcome::Done(JobState::Expired)
    );
    let item = ledger
        .get("near-deadline")
        .await
        .expect("get")
        .expect("item");
    assert_eq!(item.result, None);
}

#[tokio::test]
async fn a_claim_answered_too_late_for_its_call_spends_no_attempt() {
    // GIVEN a job with a budget of one attempt, and a claim that is answered (a slow write)
    // after the latest moment this invocation could still start a call
    let ledger = Arc::new(faulty("claim", Fault::Pause(1_500), 1));
    let settings = Settings {
        min_call_ms: 1_000,
        min_background_call_ms: 1_000,
        deadline_margin_ms: 1_000,
        ..Settings::default()
    };
    let h = handler(ledger.clone(), SimulatedProvider::new(), settings);
    let short = Invocation {
        id: "inv-short".into(),
        deadline: Some(SystemClock.now_ms() + 3_000),
    };
    let body = r#"{"job_id":"late-claim","contract":"c","max_attempts":1,"input":{"model":"m","prompt":"p"}}"#.to_owned();
    // WHEN it is processed
    let report = h
        .handle_batch(&event(vec![record(Some("m1"), &body)]), &short)
        .await;
    // THEN no call was made, and the job is not `failed_terminal` for a budget no call spent:
    // the attempt was given back, and the next delivery may claim it
    assert_eq!(h.processor().provider().executions(), 0);
    let item = ledger
        .inner
        .get("late-claim")
        .await
        .expect("get")
        .expect("item");
    assert_eq!(
        item.state,
        JobState::RetryAuthorized,
        "{:?}",
        report.records[0]
    );
    assert_eq!((item.attempts, item.max_attempts, item.not_sent), (0, 1, 1));
    assert_eq!(
        item.last_error.as_ref().map(|e| e.message.as_str()),
        Some("no time left to make the call")
    );
    // AND the next delivery runs the job with its one attempt
    let report = h
        .handle_batch(&event(vec![record(Some("m2"), &body)]), &invocation())
        .await;
    assert_eq!(
        report.records[0].outcome,
        RecordOutcome::Done(JobState::Succeeded)
    );
    assert_eq!(h.processor().provider().executions(), 1);
}

// One thread, as the worker runs: a synchronous step holds the heartbeat too.
#[tokio::test(flavor = "current_thread")]
async fn a_tick_held_up_by_a_synchronous_step_is_counted_late() {
    let flights = fenced_jobs::worker::heartbeat::Flights::new(Vec::new(), 30);
    let (ledger, visibility) = (InMemoryLedger::new(), RecordingVisibility::new());
    let settings = Settings {
        heartbeat_ms: 50,
        ..Settings::default()
    };
    let heartbeat = fenced_jobs::worker::heartbeat::Heartbeat {
        flights: &flights,
        ledger: &ledger,
        visibility: &visibility,
        clock: &SystemClock,
        settings: &settings,
    };
    let stop = tokio_util::sync::CancellationToken::new();
    let work = async {
        tokio::time::sleep(std::time::Duration::from_millis(120)).await;
        assert_eq!(flights.snapshot().heartbeat_late, 0, "on time so far");
        // A step that holds the thread for four intervals.
        std::thread::sleep(std::time::Duration::from_millis(200));
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        stop.cancel();
    };
    tokio::join!(work, heartbeat.run(stop.clone()));
    let stats = flights.snapshot();
    assert!(stats.heartbeat_late >= 1, "{stats:?}");
    assert!(stats.heartbeat_ticks >= 2, "{stats:?}");
}

/// A streamed call that marks its progress `marks` times, `every` apart, then answers; or,
/// with `answers: false`, goes silent and never returns, ignoring the progress rule (a call
/// its provider cannot cancel).
struct Streams {
    marks: u32,
    every: std::time::Duration,
    answers: bool,
}

impl Provider for Streams {
    async fn call(&self, req: &ProviderRequest<'_>) -> Result<Answer, ProviderError> {
        let progress = req.progress.clone().expect("a progress rule");
        for _ in 0..self.marks {
            progress.mark();
            tokio::time::sleep(self.every).await;
        }
        if !self.answers {
            std::future::pending::<()>().await;
        }
        Ok(Answer {
            body: r#"{"contract":"summary.v1","output":"streamed"}"#.to_owned(),
            provider_ref: None,
            finish: fenced_jobs::job::contract::Finish::Stop,
            usage: None,
            model: None,
            response_id: None,
        })
    }
}

/// The progress rule: a streamed call that goes silent ends uncertain within the progress
/// timeout; one that its provider cannot cancel keeps a healthy heartbeat from renewing its
/// lease, and is cancelled before the lease lapses; one that shows progress keeps its lease.
#[tokio::test]
async fn a_call_without_progress_is_hung_and_its_lease_is_not_renewed() {
    let settings = Settings {
        heartbeat_ms: 200,
        lease_ms: 3_000,
        skew_ms: 100,
        progress_timeout_ms: 500,
        ..Settings::default()
    };
    // The simulated stream that stops: uncertain, once the timeout has passed.
    let ledger = Arc::new(InMemoryLedger::new());
    let h = handler(ledger.clone(), SimulatedProvider::new(), settings.clone());
    let body = job(
        "stalls",
        r#","simulate":{"outcome":"stall","retrievable":false}"#,
    );
    let started = std::time::Instant::now();
    let report = h
        .handle_batch(&event(vec![record(Some("m1"), &body)]), &invocation())
        .await;
    assert!(started.elapsed() < std::time::Duration::from_millis(2_000));
    let item = ledger.get("stalls").await.expect("get").expect("item");
    assert_eq!(item.state, JobState::Unknown, "{:?}", report.records[0]);
    let evidence = item.last_error.expect("error").message;
    assert!(evidence.contains("no bytes for"), "{evidence}");

    // A silent call nobody cancels: no renewal after it went silent, cancelled before its
    // lease lapses, the lease left as the claim set it.
    let ledger = Arc::new(InMemoryLedger::new());
    let silent = Streams {
        marks: 1,
        every: std::time::Duration::from_millis(10),
        answers: false,
    };
    let h = handler(ledger.clone(), silent, settings.clone());
    let started = SystemClock.now_ms();
    let report = h
        .handle_batch(
            &event(vec![record(Some("m1"), &job("silent", ""))]),
            &invocation(),
        )
        .await;
    assert_eq!(report.stats.lease_renewed, 0, "{:?}", report.stats);
    assert_eq!(report.stats.ownership_lost, 1, "{:?}", report.stats);
    assert!(SystemClock.now_ms() - started < 4_000);
    let item = ledger.get("silent").await.expect("get").expect("item");
    assert!(item.owner_until.expect("lease") <= started + 3_100);
    assert_ne!(
        report.records[0].outcome,
        RecordOutcome::Done(JobState::Succeeded)
    );

    // A call that keeps streaming keeps its lease for as long as it runs.
    let ledger = Arc::new(InMemoryLedger::new());
    let streaming = Streams {
        marks: 40,
        every: std::time::Duration::from_millis(100),
        answers: true,
    };
    let h = handler(ledger.clone(), streaming, settings);
    let report = h
        .handle_batch(
            &event(vec![record(Some("m1"), &job("streaming", ""))]),
            &invocation(),
        )
        .await;
    assert!(report.stats.lease_renewed >= 1, "{:?}", report.stats);
    assert_eq!(
        report.records[0].outcome,
        RecordOutcome::Done(JobState::Succeeded)
    );
}
