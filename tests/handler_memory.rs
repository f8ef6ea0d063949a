//! The batch handler over the in-memory ledger: fast tests of batch behaviour (deduplication,
//! panics, missing ids, budgets, deadlines, hangs) without the emulator.
//!
//! Why this file is long: every test here drives the same handler over the same in-memory fakes,
//! and one test binary links once; split into several files it would link the crate and the SDK
//! once per file, which costs more build time on a small machine than the length costs a reader.

mod common;

use std::sync::Arc;

use aws_lambda_events::event::sqs::{SqsEvent, SqsMessage};
use fenced_jobs::clock::{Clock, SystemClock};
use fenced_jobs::job::{AttemptOutcome, Failure, JobState, RecordOutcome};
use fenced_jobs::ledger::JobLedger;
use fenced_jobs::ledger::memory::{Fault, FaultyLedger, InMemoryLedger};
use fenced_jobs::provider::{Answer, Provider, ProviderError, ProviderRequest, SimulatedProvider};
use fenced_jobs::queue::RecordingVisibility;
use fenced_jobs::worker::Settings;
use fenced_jobs::worker::handler::BatchHandler;
use fenced_jobs::worker::processor::{Invocation, Processor};

const ARN: &str = "arn:aws:sqs:us-east-1:123456789012:jobs";

type Handler<L, P> = BatchHandler<L, P, SystemClock, RecordingVisibility>;

fn handler<L: JobLedger, P: Provider>(ledger: L, provider: P, settings: Settings) -> Handler<L, P> {
    BatchHandler::new(
        Processor::new(ledger, provider, SystemClock, settings),
        RecordingVisibility::new(),
    )
    .with_seed(1)
}

/// [`handler`] over the simulated provider, storing answers and inputs in `blobs`.
/// The bucket the tests' Extended Client producers put payloads in.
const PAYLOAD_BUCKET: &str = "producer";

/// The default settings, with pointers to [`PAYLOAD_BUCKET`] taken.
fn reading_payloads() -> Settings {
    Settings {
        payload_bucket: Some(PAYLOAD_BUCKET.to_owned()),
        ..Settings::default()
    }
}

fn handler_with_blobs<L: JobLedger>(
    ledger: L,
    settings: Settings,
    blobs: Arc<fenced_jobs::blobs::MemoryBlobs>,
) -> Handler<L, SimulatedProvider> {
    BatchHandler::new(
        Processor::new(ledger, SimulatedProvider::new(), SystemClock, settings).with_blobs(blobs),
        RecordingVisibility::new(),
    )
}

fn record(id: Option<&str>, body: &str) -> SqsMessage {
    let mut m = SqsMessage::default();
    m.message_id = id.map(str::to_owned);
    m.receipt_handle = Some(format!("handle-{}", id.unwrap_or("none")));
    m.body = Some(body.to_owned());
    m.event_source_arn = Some(ARN.to_owned());
    m.attributes
        .insert("ApproximateReceiveCount".into(), "1".into());
    m.attributes.insert(
        "ApproximateFirstReceiveTimestamp".into(),
        SystemClock.now_ms().to_string(),
    );
    m
}

fn event(records: Vec<SqsMessage>) -> SqsEvent {
    let mut e = SqsEvent::default();
    e.records = records;
    e
}

fn invocation() -> Invocation {
    Invocation {
        id: "inv-1".into(),
        deadline: Some(SystemClock.now_ms() + 60_000),
    }
}

fn job(id: &str, extra_input: &str) -> String {
    format!(
        r#"{{"job_id":"{id}","contract":"c","input":{{"model":"m","prompt":"p"{extra_input}}}}}"#
    )
}

#[tokio::test]
async fn duplicates_in_one_batch_make_one_provider_call() {
    let ledger = Arc::new(InMemoryLedger::new());
    let h = handler(
        ledger.clone(),
        SimulatedProvider::new(),
        Settings::default(),
    );
    let body = job("dup", "");
    let report = h
        .handle_batch(
            &event(vec![
                record(Some("m1"), &body),
                record(Some("m2"), &body),
                record(Some("m3"), &body),
            ]),
            &invocation(),
        )
        .await;
    assert_eq!(h.processor().provider().executions(), 1);
    assert_eq!(report.response, Ok(vec![]));
    assert!(
        report
            .records
            .iter()
            .all(|r| r.outcome == RecordOutcome::Done(JobState::Succeeded))
    );
    // The duplicates cost no ledger call either: a claim and an acceptance in all.
    assert_eq!(ledger.writes(), 2);
}

#[tokio::test]
async fn a_duplicate_of_a_job_that_must_retry_does_not_claim_again_in_the_same_batch() {
    let ledger = Arc::new(InMemoryLedger::new());
    let h = handler(
        ledger.clone(),
        SimulatedProvider::new(),
        Settings::default(),
    );
    let body = job("flaky", r#","simulate":{"fail_times":1}"#);
    let report = h
        .handle_batch(
            &event(vec![record(Some("m1"), &body), record(Some("m2"), &body)]),
            &invocation(),
        )
        .await;
    assert_eq!(h.processor().provider().executions(), 1);
    assert_eq!(report.response, Ok(vec!["m1".to_owned(), "m2".to_owned()]));
    let item = ledger.get("flaky").await.expect("get").expect("item");
    assert_eq!((item.state, item.attempts), (JobState::RetryAuthorized, 1));

    // Next delivery: the retry is authorised and succeeds.
    let report = h
        .handle_batch(&event(vec![record(Some("m3"), &body)]), &invocation())
        .await;
    assert_eq!(report.response, Ok(vec![]));
    assert_eq!(h.processor().provider().executions(), 2);
}

struct PanicsOn(&'static str, SimulatedProvider);

impl Provider for PanicsOn {
    async fn call(&self, req: &ProviderRequest<'_>) -> Result<Answer, ProviderError> {
        assert_ne!(req.job_id, self.0, "provider bug");
        self.1.call(req).await
    }
}

#[tokio::test]
async fn a_panic_fails_only_its_own_record() {
    let ledger = Arc::new(InMemoryLedger::new());
    let h = handler(
        ledger.clone(),
        PanicsOn("boom", SimulatedProvider::new()),
        Settings::default(),
    );
    let report = h
        .handle_batch(
            &event(vec![
                record(Some("m1"), &job("fine-1", "")),
                record(Some("m2"), &job("boom", "")),
                record(Some("m3"), &job("fine-2", "")),
            ]),
            &invocation(),
        )
        .await;
    assert_eq!(report.response, Ok(vec!["m2".to_owned()]));
    assert!(matches!(
        report.records[1].outcome,
        RecordOutcome::Failed(Failure::Backoff { cause: "panic", .. })
    ));
    assert_eq!(
        ledger.get("fine-2").await.expect("get").map(|r| r.state),
        Some(JobState::Succeeded)
    );
}

#[tokio::test]
async fn a_failed_record_without_a_message_id_fails_the_whole_batch() {
    let ledger = Arc::new(InMemoryLedger::new());
    let h = handler(ledger, SimulatedProvider::new(), Settings::default());
    // A successful record without an id is fine: it is simply not reported.
    let ok = h
        .handle(
            event(vec![
                record(None, &job("fine", "")),
                record(Some("m2"), "garbage"),
            ]),
            invocation(),
        )
        .await;
    let ok = ok.expect("response");
    assert_eq!(ok.batch_item_failures.len(), 1);
    assert_eq!(ok.batch_item_failures[0].item_identifier, "m2");
    // A failed one cannot be named, and an empty identifier is never produced.
    let unnamed = h
        .handle(
            event(vec![
                record(Some("m1"), &job("x", "")),
                record(Some(""), "garbage"),
            ]),
            invocation(),
        )
        .await;
    assert!(unnamed.is_err());
}

#[tokio::test]
async fn every_failure_gets_its_visibility_and_successes_get_none() {
    let ledger = Arc::new(InMemoryLedger::new());
    let h = handler(ledger, SimulatedProvider::new(), Settings::default());
    let report = h
        .handle_batch(
            &event(vec![
                record(Some("poison"), "{}"),
                record(Some("ok"), &job("ok", "")),
                record(
                    Some("perm"),
                    &job("perm", r#","simulate":{"outcome":"permanent"}"#),
                ),
                record(
                    Some("flaky"),
                    &job("flaky", r#","simulate":{"outcome":"transient"}"#),
                ),
            ]),
            &invocation(),
        )
        .await;
    let changes = h.visibility().changes();
    let seconds: Vec<(String, i32)> = changes
        .iter()
        .map(|(arn, c)| {
            (c.receipt_handle.clone(), {
                assert_eq!(arn, ARN);
                c.seconds
            })
        })
        .collect();
    assert_eq!(seconds.len(), 2, "{seconds:?}");
    assert_eq!(seconds[0], ("handle-poison".to_owned(), 0));
    assert_eq!(seconds[1].0, "handle-flaky");
    assert!((0..=5).contains(&seconds[1].1));
    assert_eq!(
        report.response,
        Ok(vec!["poison".to_owned(), "flaky".to_owned()])
    );
}

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

#[tokio::test]
async fn losing_the_lease_cancels_the_call_and_its_answer_is_never_published() {
    use fenced_jobs::ledger::{AttemptEnd, EndRequest, RecoverRequest, Write};
    let ledger = Arc::new(InMemoryLedger::new());
    let settings = Settings {
        heartbeat_ms: 200,
        lease_ms: 1_000,
        skew_ms: 100,
        ..Settings::default()
    };
    let h = handler(ledger.clone(), SimulatedProvider::new(), settings);
    let body = job("taken", r#","simulate":{"latency_ms":5000}"#);

    // A rival whose clock is ahead fences the owner 300 ms into its call and commits its answer.
    let rival = async {
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        let later = SystemClock.now_ms() + 600_000;
        let fenced = ledger
            .recover(RecoverRequest {
                job_id: "taken".into(),
                seen_epoch: 1,
                owner_id: "rival".into(),
                now: later,
                lapsed_before: later - 100,
                lease_until: later + 60_000,
                reason: "test".into(),
                seen_recoveries: 0,
            })
            .await
            .expect("recover");
        assert!(matches!(fenced, Write::Applied(_)), "{fenced:?}");
        let accepted = ledger
            .end(EndRequest {
                job_id: "taken".into(),
                epoch: 2,
                attempt: 1,
                now: later,
                end: AttemptEnd::Succeeded {
                    result: "\"rival\"".into(),
                    finish: fenced_jobs::job::contract::Finish::Stop,
                },
                usage: None,
                input: None,
            })
            .await
            .expect("finish");
        assert!(matches!(accepted, Write::Applied(_)));
    };
    let started = std::time::Instant::now();
    let (batch, inv) = (event(vec![record(Some("m1"), &body)]), invocation());
    let (report, ()) = tokio::join!(h.handle_batch(&batch, &inv), rival);

    // The next renewal is refused, the 5 s call is cancelled, and the job is terminal anyway.
    assert!(
        started.elapsed() < std::time::Duration::from_millis(2_000),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(report.stats.lease_refused, 1, "{:?}", report.stats);
    assert_eq!(report.stats.ownership_lost, 1);
    assert_eq!(
        report.records[0].outcome,
        RecordOutcome::Done(JobState::Succeeded)
    );
    let item = ledger.get("taken").await.expect("get").expect("item");
    assert_eq!(item.result.as_deref(), Some("\"rival\""));
}

#[tokio::test]
async fn a_refused_visibility_extension_stops_extending_that_record_only() {
    let ledger = Arc::new(InMemoryLedger::new());
    let settings = Settings {
        heartbeat_ms: 100,
        lease_ms: 1_000,
        skew_ms: 100,
        ..Settings::default()
    };
    let h = handler(ledger, SimulatedProvider::new(), settings);
    h.visibility().refuse("handle-gone");
    let slow = |id: &str| job(id, r#","simulate":{"latency_ms":550}"#);
    let report = h
        .handle_batch(
            &event(vec![
                record(Some("gone"), &slow("a")),
                record(Some("kept"), &slow("b")),
            ]),
            &invocation(),
        )
        .await;
    let extended = |handle: &str| {
        h.visibility()
            .changes()
            .iter()
            .filter(|(_, c)| c.receipt_handle == handle)
            .count()
    };
    assert_eq!(
        extended("handle-gone"),
        1,
        "one refused attempt, then no more"
    );
    assert!(extended("handle-kept") >= 4);
    assert_eq!(report.stats.visibility_refused, 1);
    assert_eq!(report.response, Ok(vec![]));
}

#[tokio::test]
async fn a_replay_policy_records_its_decision_and_stays_within_the_budget() {
    use fenced_jobs::worker::ReplayPolicy;
    let ledger = Arc::new(InMemoryLedger::new());
    let settings = Settings {
        provider_timeout_ms: 100,
        replay: ReplayPolicy::Replay,
        ..Settings::default()
    };
    let h = handler(ledger.clone(), SimulatedProvider::new(), settings);
    let body = r#"{"job_id":"again","contract":"c","max_attempts":2,"input":{"model":"m","prompt":"p","simulate":{"outcome":"hang"}}}"#;

    // Attempt 1 is cut off: its outcome is unknown, and the policy authorises attempt 2.
    let first = h
        .handle_batch(&event(vec![record(Some("m1"), body)]), &invocation())
        .await;
    assert!(matches!(
        first.records[0].outcome,
        RecordOutcome::Failed(Failure::Backoff { .. })
    ));
    let item = ledger.get("again").await.expect("get").expect("item");
    assert_eq!((item.state, item.attempts), (JobState::RetryAuthorized, 1));
    assert_eq!(item.decisions.len(), 1);
    assert_eq!(item.decisions[0].by, "replay-policy");

    // Attempt 2 is cut off too, with no budget left: unknown; the provider will be asked
    // about it on the next delivery, soon.
    let second = h
        .handle_batch(&event(vec![record(Some("m2"), body)]), &invocation())
        .await;
    assert_eq!(
        second.records[0].outcome,
        RecordOutcome::Failed(Failure::AwaitingRecovery)
    );
    let item = ledger.get("again").await.expect("get").expect("item");
    assert_eq!((item.state, item.attempts), (JobState::Unknown, 2));
    assert_eq!(item.decisions.len(), 1);
    assert_eq!(h.processor().provider().executions(), 2);
}

/// A job claimed by a worker that vanished a minute ago, with its call's reference recorded.
async fn lapsed_claim(ledger: &InMemoryLedger, body: &str) {
    use fenced_jobs::job::{Expect, NewJob};
    use fenced_jobs::ledger::ClaimRequest;
    let msg = fenced_jobs::job::parse_body(Some(body)).expect("valid");
    let then = SystemClock.now_ms() - 120_000;
    let job = NewJob {
        class: Default::default(),
        job_id: msg.job_id.clone(),
        input_digest: msg.digest.clone(),
        contract: msg.contract.clone(),
        input: msg.input_canonical.clone(),
        input_ref: None,
        metadata: None,
        deadline_at: then + 3_600_000,
        max_attempts: 3,
        max_cost_micros: None,
        expires_at: 0,
    };
    let claimed = ledger
        .claim(ClaimRequest {
            job,
            expect: Expect::FRESH,
            owner_id: "vanished".into(),
            now: then,
            lease_until: then + 60_000,
            provider_ref: Some(format!("sim:{}/1", msg.job_id)),
            route: None,
            first_sight: false,
        })
        .await
        .expect("claim");
    assert!(matches!(claimed, fenced_jobs::ledger::Write::Applied(_)));
}

#[tokio::test]
async fn a_recovery_asks_the_provider_and_its_answer_decides_without_a_new_call() {
    let ledger = Arc::new(InMemoryLedger::new());
    let h = handler(
        ledger.clone(),
        SimulatedProvider::new(),
        Settings::default(),
    );
    let cases = [
        ("done", "", RecordOutcome::Done(JobState::Succeeded)),
        (
            "rejected",
            r#","simulate":{"outcome":"permanent"}"#,
            RecordOutcome::Done(JobState::FailedTerminal),
        ),
        (
            "forgotten",
            r#","simulate":{"retrievable":false}"#,
            RecordOutcome::Failed(Failure::AwaitingDecision),
        ),
    ];
    for (id, simulate, expected) in cases {
        let body = job(id, simulate);
        lapsed_claim(&ledger, &body).await;
        let report = h
            .handle_batch(&event(vec![record(Some(id), &body)]), &invocation())
            .await;
        assert_eq!(report.records[0].outcome, expected, "{id}");
        let item = ledger.get(id).await.expect("get").expect("item");
        assert_eq!(
            (item.owner_epoch, item.attempts, item.recoveries.len()),
            (2, 1, 1),
            "{id}"
        );
    }
    let done = ledger.get("done").await.expect("get").expect("item");
    assert!(done.result.is_some());
    // The lapsed attempt is counted as the provider's answer says, or at its estimate when the
    // provider has forgotten it.
    let heard = done.attempt_log[0].usage.expect("heard");
    assert!(!heard.estimated && heard.output > 0, "{heard:?}");
    let forgotten = ledger.get("forgotten").await.expect("get").expect("item");
    let guessed = forgotten.attempt_log[0].usage.expect("estimated");
    assert!(guessed.estimated, "{guessed:?}");
    assert_eq!(guessed.output, 16_384);
    assert_eq!(
        h.processor().provider().executions(),
        0,
        "answers came from retrieval"
    );
    assert_eq!(h.processor().provider().retrievals(), 3);
}

/// A trigger for a job whose input is stored reads the object only when it will call: behind
/// a live owner it defers without touching the store (here one that fails every call).
#[tokio::test]
async fn a_stored_input_is_read_only_when_the_delivery_will_call() {
    use fenced_jobs::blobs::MemoryBlobs;
    use fenced_jobs::job::{BlobRef, Expect, NewJob};
    use fenced_jobs::ledger::ClaimRequest;
    let ledger = Arc::new(InMemoryLedger::new());
    let blobs = Arc::new(MemoryBlobs::new("results"));
    blobs.fail(true);
    let h = BatchHandler::new(
        Processor::new(
            ledger.clone(),
            SimulatedProvider::new(),
            SystemClock,
            Settings::default(),
        )
        .with_blobs(blobs),
        RecordingVisibility::new(),
    )
    .with_seed(1);
    let now = SystemClock.now_ms();
    let job = NewJob {
        class: Default::default(),
        job_id: "stored-in".into(),
        input_digest: "d".into(),
        contract: "c".into(),
        input: String::new(),
        input_ref: Some(BlobRef {
            bucket: "results".into(),
            key: "inputs/stored-in/d.json".into(),
            size: 10,
            sha256: "e".repeat(64),
        }),
        metadata: None,
        deadline_at: now + 3_600_000,
        max_attempts: 3,
        max_cost_micros: None,
        expires_at: 0,
    };
    let claimed = ledger
        .claim(ClaimRequest {
            job,
            expect: Expect::FRESH,
            owner_id: "live-owner".into(),
            now,
            lease_until: now + 60_000,
            provider_ref: None,
            route: None,
            first_sight: false,
        })
        .await
        .expect("claim");
    assert!(matches!(claimed, fenced_jobs::ledger::Write::Applied(_)));
    let report = h
        .handle_batch(
            &event(vec![record(Some("t"), r#"{"job_id":"stored-in"}"#)]),
            &invocation(),
        )
        .await;
    assert_eq!(
        report.records[0].outcome.label(),
        "deferred",
        "{:?}",
        report.records[0].outcome
    );
}

/// An owner that stored its answer and vanished before accepting it: the recovery accepts that
/// answer, asks nobody and calls nobody; a stored object whose content is not what its key names
/// is not evidence.
#[tokio::test]
async fn a_recovery_accepts_the_answer_a_lapsed_owner_stored() {
    use fenced_jobs::blobs::MemoryBlobs;
    use fenced_jobs::job::artifact::{result_key, sha256_hex};
    let ledger = Arc::new(InMemoryLedger::new());
    let blobs = Arc::new(MemoryBlobs::new("results"));
    let h = BatchHandler::new(
        Processor::new(
            ledger.clone(),
            SimulatedProvider::new(),
            SystemClock,
            Settings::default(),
        )
        .with_blobs(blobs.clone()),
        RecordingVisibility::new(),
    )
    .with_seed(1);
    // Not retrievable: without the stored answer the job would become unknown.
    let body = job("stored", r#","simulate":{"retrievable":false}"#);
    lapsed_claim(&ledger, &body).await;
    let answer = br#"{"output":"kept"}"#;
    let key = result_key("stored", 1, &sha256_hex(answer));
    blobs.insert("results", &key, answer);
    let forged = job("forged", r#","simulate":{"retrievable":false}"#);
    lapsed_claim(&ledger, &forged).await;
    blobs.insert(
        "results",
        &result_key("forged", 1, &sha256_hex(b"other")),
        answer,
    );

    let report = h
        .handle_batch(
            &event(vec![record(Some("s"), &body), record(Some("f"), &forged)]),
            &invocation(),
        )
        .await;
    assert_eq!(
        report.records[0].outcome,
        RecordOutcome::Done(JobState::Succeeded)
    );
    let item = ledger.get("stored").await.expect("get").expect("item");
    assert_eq!(item.owner_epoch, 2);
    assert_eq!(item.result_ref.map(|b| b.key), Some(key));
    // The forged object is ignored: the provider is asked, cannot say, and the job waits for a
    // decision.
    assert_eq!(
        report.records[1].outcome,
        RecordOutcome::Failed(Failure::AwaitingDecision)
    );
    assert_eq!(h.processor().provider().executions(), 0);
}

#[tokio::test]
async fn a_recovered_call_still_running_is_polled_then_kept_for_the_next_delivery() {
    let ledger = Arc::new(InMemoryLedger::new());
    let h = handler(
        ledger.clone(),
        SimulatedProvider::new(),
        Settings::default(),
    );
    let body = job("long", r#","simulate":{"outcome":"hang"}"#);
    lapsed_claim(&ledger, &body).await;
    // An invocation with about two seconds of usable time.
    let short = Invocation {
        id: "inv".into(),
        deadline: Some(SystemClock.now_ms() + 7_000),
    };
    let report = h
        .handle_batch(&event(vec![record(Some("m1"), &body)]), &short)
        .await;
    assert!(matches!(
        report.records[0].outcome,
        RecordOutcome::Failed(Failure::Deferred { .. })
    ));
    assert_eq!(report.stats.recoveries, 1);
    let item = ledger.get("long").await.expect("get").expect("item");
    assert_eq!(
        (item.state, item.owner_epoch),
        (JobState::Running, 2),
        "held for the next delivery"
    );
    assert!(
        h.processor().provider().retrievals() >= 2,
        "polled while time allowed"
    );
    assert_eq!(h.processor().provider().executions(), 0);
}

#[tokio::test]
async fn a_call_cut_off_but_completed_upstream_is_retrieved_on_the_next_delivery() {
    let ledger = Arc::new(InMemoryLedger::new());
    let settings = Settings {
        provider_timeout_ms: 100,
        ..Settings::default()
    };
    let h = handler(ledger.clone(), SimulatedProvider::new(), settings);
    let body = job("late-answer", r#","simulate":{"latency_ms":400}"#);

    let first = h
        .handle_batch(&event(vec![record(Some("m1"), &body)]), &invocation())
        .await;
    assert_eq!(
        first.records[0].outcome,
        RecordOutcome::Failed(Failure::AwaitingRecovery)
    );
    tokio::time::sleep(std::time::Duration::from_millis(450)).await;

    // The next delivery takes the unknown job back (epoch raised) and asks the provider.
    let second = h
        .handle_batch(&event(vec![record(Some("m2"), &body)]), &invocation())
        .await;
    assert_eq!(
        second.records[0].outcome,
        RecordOutcome::Done(JobState::Succeeded)
    );
    let item = ledger.get("late-answer").await.expect("get").expect("item");
    assert_eq!((item.owner_epoch, item.attempts), (2, 1));
    assert!(
        item.recoveries[0].reason.contains("unknown attempt"),
        "{:?}",
        item.recoveries
    );
    assert_eq!(
        h.processor().provider().executions(),
        1,
        "the answer came from retrieval"
    );
    assert_eq!(h.processor().provider().retrievals(), 1);
}

/// A server with the Responses API whose one background call completes on poll `n`; cancels
/// are accepted. The route can look at the ledger when it is first polled.
async fn background_server(
    n: usize,
    on_first_poll: impl Fn() + Send + Sync + 'static,
) -> common::http::HttpStub {
    use common::http::Reply;
    use serde_json::json;
    common::http::HttpStub::start(move |req, before| {
        let polls = before.iter().filter(|r| r.method == "GET").count();
        match (req.method.as_str(), req.path.as_str()) {
            ("POST", "/v1/responses") => {
                Reply::json(200, json!({"id": "resp_1", "status": "queued"}))
            }
            ("POST", "/v1/responses/resp_1/cancel") => {
                Reply::json(200, json!({"id": "resp_1", "status": "cancelled"}))
            }
            ("GET", _) if polls + 1 < n => {
                if polls == 0 {
                    on_first_poll();
                }
                Reply::json(200, json!({"id": "resp_1", "status": "in_progress"}))
            }
            ("GET", _) => Reply::json(
                200,
                json!({"id": "resp_1", "status": "completed", "output": [{"type": "message",
                       "content": [{"type": "output_text", "text": "Summary."}]}]}),
            ),
            _ => Reply::json(404, json!({})),
        }
    })
    .await
}

fn openai(url: &str) -> fenced_jobs::provider::OpenAiProvider {
    use fenced_jobs::provider::openai::{OpenAiApi, OpenAiSettings};
    let settings = OpenAiSettings {
        base_url: format!("{url}/v1"),
        api: OpenAiApi::Responses,
        connect_timeout_ms: 1_000,
        request_timeout_ms: 2_000,
        ..OpenAiSettings::default()
    };
    fenced_jobs::provider::OpenAiProvider::new(settings, None).expect("client")
}

fn polling_settings() -> Settings {
    Settings {
        poll_ms: 50,
        ..Settings::default()
    }
}

#[tokio::test]
async fn a_background_call_is_recorded_before_it_is_polled_and_accepted_when_it_completes() {
    let ledger = Arc::new(InMemoryLedger::new());
    let recorded_at_first_poll = Arc::new(std::sync::Mutex::new(None));
    let (l, seen) = (ledger.clone(), recorded_at_first_poll.clone());
    let server = background_server(3, move || {
        let item = futures::executor::block_on(l.get("bg")).expect("get");
        *seen.lock().expect("seen") =
            item.and_then(|i| i.attempt_log.last().and_then(|a| a.provider_ref.clone()));
    })
    .await;
    let h = handler(ledger.clone(), openai(&server.url), polling_settings());
    let report = h
        .handle_batch(
            &event(vec![record(Some("m1"), &job("bg", ""))]),
            &invocation(),
        )
        .await;
    assert_eq!(
        report.records[0].outcome,
        RecordOutcome::Done(JobState::Succeeded)
    );
    assert_eq!(
        recorded_at_first_poll.lock().expect("seen").as_deref(),
        Some("resp_1"),
        "the reference was in the ledger before the first poll"
    );
    assert_eq!(server.count("POST", "/v1/responses"), 1);
    assert_eq!(server.count("GET", "/v1/responses/resp_1"), 3);
    let item = ledger.get("bg").await.expect("get").expect("item");
    assert_eq!((item.owner_epoch, item.attempts), (1, 1));
    assert!(item.result.expect("result").contains("Summary."));
}

/// Takes the job over (a recovery claim) just before the owner records its reference, as a
/// receiver would after the owner's lease lapsed unnoticed.
struct TakenOverBeforeRecording(Arc<InMemoryLedger>);

impl JobLedger for TakenOverBeforeRecording {
    async fn create(
        &self,
        req: fenced_jobs::ledger::CreateRequest,
    ) -> Result<fenced_jobs::ledger::Write, fenced_jobs::ledger::LedgerError> {
        self.0.create(req).await
    }
    async fn mark_enqueued(
        &self,
        req: fenced_jobs::ledger::EnqueuedRequest,
    ) -> Result<fenced_jobs::ledger::Write, fenced_jobs::ledger::LedgerError> {
        self.0.mark_enqueued(req).await
    }
    async fn claim(
        &self,
        req: fenced_jobs::ledger::ClaimRequest,
    ) -> Result<fenced_jobs::ledger::Write, fenced_jobs::ledger::LedgerError> {
        self.0.claim(req).await
    }
    async fn end(
        &self,
        req: fenced_jobs::ledger::EndRequest,
    ) -> Result<fenced_jobs::ledger::Write, fenced_jobs::ledger::LedgerError> {
        self.0.end(req).await
    }
    async fn settle(
        &self,
        req: fenced_jobs::ledger::SettleRequest,
    ) -> Result<fenced_jobs::ledger::Write, fenced_jobs::ledger::LedgerError> {
        self.0.settle(req).await
    }
    async fn recover(
        &self,
        req: fenced_jobs::ledger::RecoverRequest,
    ) -> Result<fenced_jobs::ledger::Write, fenced_jobs::ledger::LedgerError> {
        self.0.recover(req).await
    }
    async fn renew(
        &self,
        req: fenced_jobs::ledger::RenewRequest,
    ) -> Result<fenced_jobs::ledger::Write, fenced_jobs::ledger::LedgerError> {
        self.0.renew(req).await
    }
    async fn record_ref(
        &self,
        req: fenced_jobs::ledger::RecordRefRequest,
    ) -> Result<fenced_jobs::ledger::Write, fenced_jobs::ledger::LedgerError> {
        let now = SystemClock.now_ms();
        let takeover = fenced_jobs::ledger::RecoverRequest {
            job_id: req.job_id.clone(),
            seen_epoch: req.epoch,
            owner_id: "other-receiver".into(),
            now,
            lapsed_before: now + 3_600_000,
            lease_until: now + 60_000,
            reason: "lease lapsed".into(),
            seen_recoveries: 0,
        };
        self.0.recover(takeover).await?;
        self.0.record_ref(req).await
    }
    async fn decide(
        &self,
        req: fenced_jobs::ledger::DecideRequest,
    ) -> Result<fenced_jobs::ledger::Write, fenced_jobs::ledger::LedgerError> {
        self.0.decide(req).await
    }
    async fn cancel(
        &self,
        req: fenced_jobs::ledger::CancelRequest,
    ) -> Result<fenced_jobs::ledger::Write, fenced_jobs::ledger::LedgerError> {
        self.0.cancel(req).await
    }
    async fn get(
        &self,
        job_id: &str,
    ) -> Result<Option<fenced_jobs::job::JobRecord>, fenced_jobs::ledger::LedgerError> {
        self.0.get(job_id).await
    }
}

#[tokio::test]
async fn a_background_call_whose_reference_cannot_be_recorded_is_cancelled() {
    let inner = Arc::new(InMemoryLedger::new());
    let server = background_server(1, || {}).await;
    let h = handler(
        TakenOverBeforeRecording(inner.clone()),
        openai(&server.url),
        polling_settings(),
    );
    let report = h
        .handle_batch(
            &event(vec![record(Some("m1"), &job("lost", ""))]),
            &invocation(),
        )
        .await;
    // The new owner's lease is live: this delivery defers to it.
    assert!(
        matches!(
            report.records[0].outcome,
            RecordOutcome::Failed(Failure::Deferred { .. })
        ),
        "{:?}",
        report.records[0].outcome
    );
    assert_eq!(server.count("POST", "/v1/responses/resp_1/cancel"), 1);
    assert_eq!(
        server.count("GET", "/v1/responses/resp_1"),
        0,
        "never polled"
    );
    let item = inner.get("lost").await.expect("get").expect("item");
    assert_eq!((item.state, item.owner_epoch), (JobState::Running, 2));
    assert_eq!(item.attempt_log[0].provider_ref, None);
}

#[tokio::test]
async fn a_background_call_still_running_at_the_job_deadline_is_cancelled_and_expired() {
    let ledger = Arc::new(InMemoryLedger::new());
    let server = background_server(usize::MAX, || {}).await;
    let h = handler(ledger.clone(), openai(&server.url), polling_settings());
    let deadline = fenced_jobs::job::message::format_rfc3339_ms(SystemClock.now_ms() + 3_000);
    let body = format!(
        r#"{{"job_id":"late","contract":"c","deadline_at":"{deadline}","input":{{"model":"m","prompt":"p"}}}}"#
    );
    let report = h
        .handle_batch(&event(vec![record(Some("m1"), &body)]), &invocation())
        .await;
    assert_eq!(
        report.records[0].outcome,
        RecordOutcome::Done(JobState::Expired)
    );
    assert_eq!(server.count("POST", "/v1/responses/resp_1/cancel"), 1);
    assert!(server.count("GET", "/v1/responses/resp_1") >= 5);
}

/// The README's table of bad inputs, row by row: each gets its classified outcome, the good
/// record beside it still succeeds, and nothing fails the whole batch.
#[tokio::test]
async fn every_kind_of_bad_input_gets_its_documented_outcome() {
    let past = fenced_jobs::job::message::format_rfc3339_ms(SystemClock.now_ms() - 60_000);
    let body = |extra: &str| {
        format!(r#"{{"job_id":"j-ok","contract":"c","input":{{"model":"m","prompt":"p"}}{extra}}}"#)
    };
    let rows: Vec<(&str, String, &str)> = vec![
        ("malformed JSON", r#"{"job_id":"x","#.into(), "poison"),
        (
            "wrong type",
            r#"{"job_id":"x","contract":"c","input":"text"}"#.into(),
            "poison",
        ),
        (
            "missing field",
            r#"{"job_id":"x","input":{"model":"m","prompt":"p"}}"#.into(),
            "poison",
        ),
        (
            "oversized body",
            format!(r#"{{"pad":"{}"}}"#, "x".repeat(1_048_577)),
            "poison",
        ),
        (
            "oversized job_id",
            format!(
                r#"{{"job_id":"{}","contract":"c","input":{{"model":"m","prompt":"p"}}}}"#,
                "x".repeat(129)
            ),
            "poison",
        ),
        (
            "oversized metadata",
            body(&format!(r#","metadata":{{"k":"{}"}}"#, "x".repeat(5_000))),
            "poison",
        ),
        (
            "invalid UTF-8 escape",
            r#"{"job_id":"x\udc00","contract":"c","input":{"model":"m","prompt":"p"}}"#.into(),
            "poison",
        ),
        (
            "control character in job_id",
            r#"{"job_id":"x\u0001y","contract":"c","input":{"model":"m","prompt":"p"}}"#.into(),
            "poison",
        ),
        (
            "huge attempt budget",
            body(r#","max_attempts":1000000"#),
            "poison",
        ),
        (
            "nested past the parser's depth limit",
            format!(
                r#"{{"job_id":"x","contract":"c","input":{{"model":"m","prompt":"p","deep":{}{}}}}}"#,
                "[".repeat(300),
                "]".repeat(300)
            ),
            "poison",
        ),
        (
            "deadline in the past",
            format!(
                r#"{{"job_id":"j-late","contract":"c","deadline_at":"{past}","input":{{"model":"m","prompt":"p"}}}}"#
            ),
            "expired",
        ),
        (
            "job_id alone, unknown job",
            r#"{"job_id":"nobody"}"#.into(),
            "poison",
        ),
    ];
    let ledger = Arc::new(InMemoryLedger::new());
    let h = handler(
        ledger.clone(),
        SimulatedProvider::new(),
        Settings::default(),
    );
    let mut records = vec![record(Some("good"), &body(""))];
    for (i, (_, text, _)) in rows.iter().enumerate() {
        records.push(record(Some(&format!("bad-{i}")), text));
    }
    let report = h.handle_batch(&event(records), &invocation()).await;
    assert_eq!(
        report.records[0].outcome,
        RecordOutcome::Done(JobState::Succeeded)
    );
    for (i, (name, _, expected)) in rows.iter().enumerate() {
        let r = &report.records[i + 1];
        assert_eq!(r.outcome.label(), *expected, "{name}: {:?}", r.outcome);
        if *expected == "poison" {
            assert_eq!(r.visibility_s, Some(0), "{name}: straight to the DLQ");
        }
    }
    assert!(
        report.response.is_ok(),
        "no bad record fails the whole batch"
    );
    assert_eq!(h.processor().provider().executions(), 1);

    // A conflicting digest: same job_id, another input.
    let conflict = h
        .handle_batch(
            &event(vec![record(
                Some("c1"),
                r#"{"job_id":"j-ok","contract":"c","input":{"model":"m","prompt":"other"}}"#,
            )]),
            &invocation(),
        )
        .await;
    assert_eq!(conflict.records[0].outcome.label(), "conflict");
    assert_eq!(conflict.records[0].visibility_s, Some(0));
}

/// Payloads outside the body: an Extended Client pointer is followed, a missing or malformed one
/// is poison, a store that cannot be reached is a backoff, and an answer above the inline limit
/// is stored and referenced, or without a bucket kept inline when the item can hold it.
#[tokio::test]
async fn pointers_and_stored_answers_get_their_documented_outcomes() {
    use fenced_jobs::blobs::MemoryBlobs;
    let class = "software.amazon.payloadoffloading.PayloadS3Pointer";
    let pointer =
        |key: &str| format!(r#"["{class}",{{"s3BucketName":"producer","s3Key":"{key}"}}]"#);
    let blobs = Arc::new(MemoryBlobs::new("results"));
    blobs.insert("producer", "p/ok", job("j-ptr", "").as_bytes());
    blobs.insert("producer", "p/bad", b"{not json");
    // What the worker keeps is never a job's input, whoever names it.
    blobs.insert(
        "producer",
        "results/j/1/ab.json",
        job("j-theirs", "").as_bytes(),
    );
    blobs.insert("other", "p/ok", job("j-other", "").as_bytes());
    blobs.insert("producer", "p/../p/ok", job("j-dots", "").as_bytes());
    let ledger = Arc::new(InMemoryLedger::new());
    let h = BatchHandler::new(
        Processor::new(
            ledger.clone(),
            SimulatedProvider::new(),
            SystemClock,
            reading_payloads(),
        )
        .with_blobs(blobs.clone()),
        RecordingVisibility::new(),
    )
    .with_seed(1);
    let rows = [
        ("pointer", pointer("p/ok"), "succeeded"),
        ("pointer to nothing", pointer("p/gone"), "poison"),
        ("pointer to a bad body", pointer("p/bad"), "poison"),
        (
            "pointer of the wrong shape",
            format!(r#"["{class}",{{"s3Key":"k"}}]"#),
            "poison",
        ),
        (
            "pointer to another bucket",
            format!(r#"["{class}",{{"s3BucketName":"other","s3Key":"p/ok"}}]"#),
            "poison",
        ),
        (
            "pointer to a stored answer",
            pointer("results/j/1/ab.json"),
            "poison",
        ),
        ("pointer with a dot segment", pointer("p/../p/ok"), "poison"),
        (
            "large answer",
            job("j-large", r#","simulate":{"answer_bytes":100000}"#),
            "succeeded",
        ),
    ];
    let records = rows
        .iter()
        .enumerate()
        .map(|(i, (_, body, _))| record(Some(&format!("m{i}")), body))
        .collect();
    let report = h.handle_batch(&event(records), &invocation()).await;
    for (r, (name, _, expected)) in report.records.iter().zip(&rows) {
        assert_eq!(r.outcome.label(), *expected, "{name}: {:?}", r.outcome);
    }
    for unread in ["j-theirs", "j-other", "j-dots"] {
        assert!(ledger.get(unread).await.expect("get").is_none(), "{unread}");
    }
    let large = ledger.get("j-large").await.expect("get").expect("item");
    let blob = large.result_ref.expect("stored");
    assert_eq!(large.result, None);
    assert_eq!(blobs.keys(), vec![blob.key.clone()]);
    let ptr = ledger.get("j-ptr").await.expect("get").expect("item");
    assert_eq!(
        ptr.input_digest,
        fenced_jobs::job::parse_body(Some(&job("j-ptr", "")))
            .expect("valid")
            .digest
    );

    // The store unreachable: the pointer's record backs off; nothing is poisoned.
    blobs.fail(true);
    let report = h
        .handle_batch(
            &event(vec![record(Some("again"), &pointer("p/ok"))]),
            &invocation(),
        )
        .await;
    assert_eq!(report.records[0].outcome.label(), "backoff");
    // An answer too large for the item, with the bucket refusing it, from a provider that
    // keeps it under the attempt's reference: not paid for again. The job is handed over (it
    // stays running, its lease ended) and the record backs off.
    let huge = job("j-huge", r#","simulate":{"answer_bytes":450000}"#);
    let before = h.processor().provider().executions();
    let report = h
        .handle_batch(&event(vec![record(Some("huge"), &huge)]), &invocation())
        .await;
    assert_eq!(report.records[0].outcome.label(), "backoff");
    let item = ledger.get("j-huge").await.expect("get").expect("item");
    assert_eq!((item.state, item.attempts), (JobState::Running, 1));
    assert_eq!(h.processor().provider().executions(), before + 1);
    // Once the bucket works again, the next delivery (after the ended lease's skew margin)
    // fetches the answer from the provider and stores it: one execution in all.
    blobs.fail(false);
    tokio::time::sleep(std::time::Duration::from_millis(2_100)).await;
    let report = h
        .handle_batch(&event(vec![record(Some("huge-2"), &huge)]), &invocation())
        .await;
    assert_eq!(report.records[0].outcome.label(), "succeeded");
    let item = ledger.get("j-huge").await.expect("get").expect("item");
    assert!(item.result_ref.is_some(), "{item:?}");
    assert_eq!(
        h.processor().provider().executions(),
        before + 1,
        "paid once"
    );
    blobs.fail(true);

    // Without a bucket, a large answer the item can hold stays inline.
    let plain = handler(
        Arc::new(InMemoryLedger::new()),
        SimulatedProvider::new(),
        reading_payloads(),
    );
    let report = plain
        .handle_batch(
            &event(vec![record(
                Some("l"),
                &job("j-inline", r#","simulate":{"answer_bytes":100000}"#),
            )]),
            &invocation(),
        )
        .await;
    assert_eq!(report.records[0].outcome.label(), "succeeded");
    let kept = plain
        .processor()
        .ledger()
        .get("j-inline")
        .await
        .expect("get")
        .expect("item");
    assert!(kept.result.expect("inline").len() > 100_000);
}

/// With a dead-letter queue, poison and conflicts are sent there with their reason and
/// acknowledged; a queue that refuses leaves them failures at visibility 0, as without one.
#[tokio::test]
async fn poison_and_conflicts_are_dead_lettered_with_their_reason_and_acknowledged() {
    use fenced_jobs::queue::RecordingDeadLetters;
    let letters = Arc::new(RecordingDeadLetters::new());
    let ledger = Arc::new(InMemoryLedger::new());
    let h = handler(
        ledger.clone(),
        SimulatedProvider::new(),
        Settings::default(),
    )
    .with_dead_letters(letters.clone());
    let mut conflicting = record(Some("c"), &job("dl", r#","other":1"#));
    let mut trace = aws_lambda_events::event::sqs::SqsMessageAttribute::default();
    trace.string_value = Some("t-1".into());
    trace.data_type = Some("String".into());
    conflicting.message_attributes.insert("trace".into(), trace);
    let first = h
        .handle_batch(
            &event(vec![record(Some("ok"), &job("dl", ""))]),
            &invocation(),
        )
        .await;
    assert!(first.records[0].outcome.is_success());
    let report = h
        .handle_batch(
            &event(vec![
                record(Some("p"), "{not json"),
                conflicting,
                record(Some("d"), &job("dl", "")),
            ]),
            &invocation(),
        )
        .await;
    let labels: Vec<&str> = report.records.iter().map(|r| r.outcome.label()).collect();
    assert_eq!(labels, ["poison", "conflict", "succeeded"]);
    assert!(report.records.iter().all(|r| r.outcome.is_success()));
    assert_eq!(
        report.records[0].visibility_s, None,
        "acknowledged, not made visible"
    );
    let failures = report.response.as_ref().expect("a response");
    assert!(failures.is_empty(), "{failures:?}");
    let sent = letters.sent();
    assert_eq!(sent.len(), 2);
    assert_eq!(
        (sent[0].reason, sent[0].body.as_str()),
        ("poison", "{not json")
    );
    assert!(sent[0].detail.contains("not JSON"), "{}", sent[0].detail);
    assert_eq!(
        (sent[1].reason, sent[1].job_id.as_deref()),
        ("conflict", Some("dl"))
    );
    assert!(
        sent[1]
            .all_attributes()
            .expect("fits")
            .contains(&("trace".into(), "t-1".into()))
    );

    letters.refuse(true);
    let refused = h
        .handle_batch(&event(vec![record(Some("p2"), "{not json")]), &invocation())
        .await;
    assert_eq!(
        refused.records[0].outcome,
        RecordOutcome::Failed(Failure::Poison(fenced_jobs::job::InvalidMessage::NotJson {
            line: 1,
            column: 2
        }))
    );
    assert_eq!(refused.records[0].visibility_s, Some(0));
}

#[test]
fn events_are_read_leniently_record_by_record_and_never_without_records() {
    use fenced_jobs::worker::handler::event_from_json;
    use serde_json::json;
    assert!(event_from_json(&json!({})).is_err(), "no Records");
    assert!(event_from_json(&json!({"Records": null})).is_err());
    assert!(event_from_json(&json!([1, 2])).is_err());
    let event = event_from_json(&json!({"Records": [
        {"messageId": "m1", "receiptHandle": "h1", "body": "{}", "attributes": 5},
        {"messageId": 7, "body": "x"},
        {"messageId": "m3", "receiptHandle": "h3", "body": "{}", "attributes": {}}
    ]}))
    .expect("records");
    assert_eq!(event.records.len(), 3);
    assert_eq!(event.records[0].message_id.as_deref(), Some("m1"));
    assert_eq!(event.records[0].receipt_handle.as_deref(), Some("h1"));
    assert_eq!(event.records[1].message_id, None);
    assert_eq!(event.records[2].message_id.as_deref(), Some("m3"));
}

#[tokio::test]
async fn a_failed_record_without_a_receipt_handle_is_still_named() {
    let ledger = Arc::new(InMemoryLedger::new());
    let h = handler(ledger, SimulatedProvider::new(), Settings::default());
    let mut r = record(Some("no-handle"), "{bad");
    r.receipt_handle = None;
    let report = h.handle_batch(&event(vec![r]), &invocation()).await;
    assert_eq!(report.response, Ok(vec!["no-handle".to_owned()]));
    assert_eq!(
        report.records[0].visibility_s, None,
        "no handle: no visibility change"
    );
}

#[tokio::test]
async fn a_record_that_succeeded_early_stays_invisible_while_its_batch_runs_on() {
    let ledger = Arc::new(InMemoryLedger::new());
    let settings = Settings {
        queue_visibility_s: 2,
        heartbeat_ms: 300,
        lease_ms: 3_000,
        skew_ms: 200,
        ..Settings::default()
    };
    settings.validate().expect("valid");
    let h = handler(ledger, SimulatedProvider::new(), settings);
    let report = h
        .handle_batch(
            &event(vec![
                record(Some("fast"), &job("fast", "")),
                record(
                    Some("slow"),
                    &job("slow", r#","simulate":{"latency_ms":1500}"#),
                ),
            ]),
            &invocation(),
        )
        .await;
    assert_eq!(report.response, Ok(vec![]));
    let fast_extensions = h
        .visibility()
        .changes()
        .iter()
        .filter(|(_, c)| c.receipt_handle == "handle-fast")
        .count();
    assert!(
        fast_extensions >= 3,
        "the finished record was left to reappear: {fast_extensions} extensions"
    );
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
async fn an_answer_too_large_for_the_item_fails_the_job_once_and_is_never_retried() {
    // GIVEN a job whose answer is about 450 KB, more than a DynamoDB item holds
    let ledger = Arc::new(InMemoryLedger::new());
    let h = handler(
        ledger.clone(),
        SimulatedProvider::new(),
        Settings::default(),
    );
    let body = job("huge", r#","simulate":{"answer_bytes":450000}"#);
    // WHEN it is processed, and delivered again
    let first = h
        .handle_batch(&event(vec![record(Some("m1"), &body)]), &invocation())
        .await;
    let again = h
        .handle_batch(&event(vec![record(Some("m2"), &body)]), &invocation())
        .await;
    // THEN the attempt ends failed_terminal with the reason, one call paid, nothing looping
    for report in [&first, &again] {
        assert_eq!(
            report.records[0].outcome,
            RecordOutcome::Done(JobState::FailedTerminal)
        );
    }
    assert_eq!(h.processor().provider().executions(), 1);
    let item = ledger.get("huge").await.expect("get").expect("item");
    assert_eq!(item.result, None);
    let error = item.last_error.expect("error");
    assert_eq!(error.kind, "too_large");
    assert!(error.message.contains("bytes"), "{}", error.message);
}

fn faulty(operation: &'static str, fault: Fault, times: u32) -> FaultyLedger<InMemoryLedger> {
    let ledger = FaultyLedger::new(InMemoryLedger::new());
    ledger.inject(operation, fault, times);
    ledger
}

#[tokio::test]
async fn a_paid_answer_survives_failing_acceptance_writes() {
    // GIVEN a ledger whose first two end-of-attempt writes fail
    let ledger = faulty("end", Fault::Fail, 2);
    let h = handler(ledger, SimulatedProvider::new(), Settings::default());
    // WHEN a job is processed
    let report = h
        .handle_batch(
            &event(vec![record(Some("m1"), &job("paid", ""))]),
            &invocation(),
        )
        .await;
    // THEN the acceptance is tried again within the invocation and lands: one call, succeeded
    assert_eq!(
        report.records[0].outcome,
        RecordOutcome::Done(JobState::Succeeded)
    );
    assert_eq!(h.processor().provider().executions(), 1);
}

fn tight_settings() -> Settings {
    Settings {
        deadline_margin_ms: 1_000,
        min_background_call_ms: 100,
        poll_ms: 100,
        ..Settings::default()
    }
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

/// A provider that starts background calls and whose retrievals never answer.
struct HangingRetrieval;

impl Provider for HangingRetrieval {
    async fn call(&self, _: &ProviderRequest<'_>) -> Result<Answer, ProviderError> {
        std::future::pending().await
    }
    async fn submit(
        &self,
        _: &ProviderRequest<'_>,
    ) -> Result<fenced_jobs::provider::Submission, ProviderError> {
        Ok(fenced_jobs::provider::Submission::Started("resp-1".into()))
    }
    fn can_retrieve(&self) -> bool {
        true
    }
    async fn retrieve(
        &self,
        _: &str,
        _: i64,
        _: &ProviderRequest<'_>,
    ) -> fenced_jobs::provider::Retrieval {
        std::future::pending().await
    }
}

#[tokio::test]
async fn a_retrieval_that_hangs_is_bounded_and_the_job_handed_over_in_time() {
    // GIVEN a background call whose retrievals never answer, and 3 s left in the invocation
    let ledger = Arc::new(InMemoryLedger::new());
    let h = handler(ledger.clone(), HangingRetrieval, tight_settings());
    let inv = Invocation {
        id: "inv".into(),
        deadline: Some(SystemClock.now_ms() + 3_000),
    };
    // WHEN it is processed
    let started = std::time::Instant::now();
    let report = h
        .handle_batch(&event(vec![record(Some("m1"), &job("polled", ""))]), &inv)
        .await;
    // THEN the retrieval is abandoned at the invocation's margin and the job handed over (its
    // reference recorded, its lease ended) before the deadline
    assert!(started.elapsed() < std::time::Duration::from_millis(3_000));
    assert!(
        matches!(
            report.records[0].outcome,
            RecordOutcome::Failed(Failure::Deferred { .. })
        ),
        "{:?}",
        report.records[0].outcome
    );
    let item = ledger.get("polled").await.expect("get").expect("item");
    assert_eq!(item.state, JobState::Running);
    assert_eq!(item.attempt_log[0].provider_ref.as_deref(), Some("resp-1"));
}

#[tokio::test]
async fn a_claim_whose_answer_was_lost_is_recognised_and_its_call_made_once() {
    // GIVEN a ledger that applies the first claim and loses its answer
    let ledger = Arc::new(faulty("claim", Fault::LoseAnswer, 1));
    let h = handler(
        ledger.clone(),
        SimulatedProvider::new(),
        Settings::default(),
    );
    // WHEN a job is processed
    let report = h
        .handle_batch(
            &event(vec![record(Some("m1"), &job("lost-claim", ""))]),
            &invocation(),
        )
        .await;
    // THEN the worker reads its own claim back and goes on: one call, succeeded, no job left
    // running without a call (which would later turn unknown)
    assert_eq!(
        report.records[0].outcome,
        RecordOutcome::Done(JobState::Succeeded)
    );
    assert_eq!(h.processor().provider().executions(), 1);
    let item = ledger
        .inner
        .get("lost-claim")
        .await
        .expect("get")
        .expect("item");
    assert_eq!((item.owner_epoch, item.attempts), (1, 1));
}

#[tokio::test]
async fn a_recovery_claim_whose_answer_was_lost_is_recognised_not_deferred_to() {
    // GIVEN a job whose owner's lease lapsed, and a ledger that applies the next recovery claim
    // and loses its answer
    let ledger = Arc::new(faulty("recover", Fault::LoseAnswer, 1));
    let body = job("lost-recovery", "");
    lapsed_claim(&ledger.inner, &body).await;
    let h = handler(
        ledger.clone(),
        SimulatedProvider::new(),
        Settings::default(),
    );
    // WHEN it is delivered
    let report = h
        .handle_batch(&event(vec![record(Some("m1"), &body)]), &invocation())
        .await;
    // THEN the worker recognises its own recovery claim (no deferral to itself for a whole
    // lease) and collects the answer from the provider without a new call
    assert_eq!(
        report.records[0].outcome,
        RecordOutcome::Done(JobState::Succeeded),
        "{:?}",
        report.records[0].outcome
    );
    assert_eq!(report.stats.recoveries, 1);
    assert_eq!(h.processor().provider().executions(), 0);
}

#[tokio::test]
async fn extreme_event_timestamps_are_classified_not_a_panic() {
    // GIVEN records whose ApproximateFirstReceiveTimestamp is at either end of the integers
    let ledger = Arc::new(InMemoryLedger::new());
    let h = handler(ledger, SimulatedProvider::new(), Settings::default());
    let mut records = Vec::new();
    for (id, stamp) in [("max", i64::MAX), ("min", i64::MIN)] {
        let mut r = record(Some(id), &job(&format!("stamp-{id}"), ""));
        r.attributes
            .insert("ApproximateFirstReceiveTimestamp".into(), stamp.to_string());
        records.push(r);
    }
    // WHEN the batch is handled (in a debug build, where overflow panics)
    let report = h.handle_batch(&event(records), &invocation()).await;
    // THEN each record gets an outcome
    assert_eq!(report.records.len(), 2);
    assert!(report.response.is_ok());
}

#[tokio::test]
async fn turning_on_the_replay_policy_does_not_replay_jobs_already_unknown() {
    // GIVEN a job that became unknown before the replay policy was turned on, and a provider
    // that does not know its call
    let ledger = Arc::new(InMemoryLedger::new());
    let body = job("old-unknown", r#","simulate":{"retrievable":false}"#);
    lapsed_claim(&ledger, &body).await;
    let ended = ledger
        .end(fenced_jobs::ledger::EndRequest {
            job_id: "old-unknown".into(),
            epoch: 1,
            attempt: 1,
            now: SystemClock.now_ms(),
            end: fenced_jobs::ledger::AttemptEnd::Unknown {
                evidence: "cut off".into(),
            },
            usage: None,
            input: None,
        })
        .await
        .expect("finish");
    assert!(matches!(ended, fenced_jobs::ledger::Write::Applied(_)));
    let settings = Settings {
        replay: fenced_jobs::worker::ReplayPolicy::Replay,
        ..Settings::default()
    };
    let h = handler(ledger.clone(), SimulatedProvider::new(), settings);
    // WHEN it is delivered again
    let report = h
        .handle_batch(&event(vec![record(Some("m1"), &body)]), &invocation())
        .await;
    // THEN it is asked about and stays unknown: no replay, no new call
    assert_eq!(
        report.records[0].outcome,
        RecordOutcome::Failed(Failure::AwaitingDecision)
    );
    let item = ledger.get("old-unknown").await.expect("get").expect("item");
    assert_eq!(item.state, JobState::Unknown);
    assert!(item.decisions.is_empty());
    assert_eq!(h.processor().provider().executions(), 0);
}

#[tokio::test]
async fn the_queues_real_visibility_timeout_wins_over_a_longer_configured_one() {
    // GIVEN a worker configured for a 30 s visibility timeout (heartbeat every 10 s) on a queue
    // whose real timeout is 3 s, and a call that takes 2.5 s
    let ledger = Arc::new(InMemoryLedger::new());
    let h = handler(ledger, SimulatedProvider::new(), Settings::default());
    h.visibility().set_visibility_timeout(3);
    let body = job("short-queue", r#","simulate":{"latency_ms":2500}"#);
    // WHEN it runs
    let report = h
        .handle_batch(&event(vec![record(Some("m1"), &body)]), &invocation())
        .await;
    // THEN the heartbeat keeps the record invisible by the queue's clock: it ticks within the
    // real timeout and never asks for more than it
    assert_eq!(
        report.records[0].outcome,
        RecordOutcome::Done(JobState::Succeeded)
    );
    assert!(report.stats.heartbeat_ticks >= 1, "{:?}", report.stats);
    let changes = h.visibility().changes();
    assert!(!changes.is_empty());
    assert!(changes.iter().all(|(_, c)| c.seconds <= 3), "{changes:?}");
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
async fn an_attempt_cut_off_with_an_askable_reference_waits_briefly_then_is_collected() {
    // GIVEN an invocation with 2 s of usable time and a call that takes 3 s, from a provider
    // that can be asked about it afterwards
    let ledger = Arc::new(InMemoryLedger::new());
    let h = handler(
        ledger.clone(),
        SimulatedProvider::new(),
        Settings::default(),
    );
    let body = job("cut-short", r#","simulate":{"latency_ms":3000}"#);
    let short = Invocation {
        id: "inv-1".into(),
        deadline: Some(SystemClock.now_ms() + 7_000),
    };
    // WHEN the call is cut off by the invocation's deadline
    let first = h
        .handle_batch(&event(vec![record(Some("m1"), &body)]), &short)
        .await;
    // THEN the job is unknown, but its record comes back after a short backoff (its next
    // delivery asks the provider), not after the half-hour wait for an operator
    assert_eq!(
        first.records[0].outcome,
        RecordOutcome::Failed(Failure::AwaitingRecovery)
    );
    assert!(first.records[0].visibility_s.is_some_and(|s| s <= 5));
    // AND the next delivery collects the answer without a new call
    tokio::time::sleep(std::time::Duration::from_millis(1_200)).await;
    let second = h
        .handle_batch(&event(vec![record(Some("m1"), &body)]), &invocation())
        .await;
    assert_eq!(
        second.records[0].outcome,
        RecordOutcome::Done(JobState::Succeeded)
    );
    assert_eq!(h.processor().provider().executions(), 1);
}

#[tokio::test]
async fn a_worker_paused_past_its_lease_between_claim_and_call_does_not_send_the_call() {
    // GIVEN a ledger that applies the claim, after which the worker's process stops for longer
    // than its lease (found by the model checker: a rival could meanwhile fence it, have the
    // attempt decided and send its own call)
    let settings = Settings {
        lease_ms: 300,
        skew_ms: 50,
        ..Settings::default()
    };
    let ledger = Arc::new(faulty("claim", Fault::Pause(400), 1));
    let h = handler(ledger.clone(), SimulatedProvider::new(), settings);
    // WHEN the job is processed
    let report = h
        .handle_batch(
            &event(vec![record(Some("m1"), &job("paused-claim", ""))]),
            &invocation(),
        )
        .await;
    // THEN no call leaves; the attempt is given back on the worker's own epoch (nothing ran),
    // so a later delivery may claim again without a decision, and with the whole budget
    assert_eq!(h.processor().provider().executions(), 0);
    assert!(
        matches!(
            report.records[0].outcome,
            RecordOutcome::Failed(Failure::Backoff { .. })
        ),
        "{:?}",
        report.records[0].outcome
    );
    let item = ledger
        .inner
        .get("paused-claim")
        .await
        .expect("get")
        .expect("item");
    assert_eq!(item.state, JobState::RetryAuthorized);
    assert_eq!((item.attempts, item.not_sent), (0, 1));
    assert!(item.attempt_log.is_empty());
    assert_eq!(item.given_back[0].outcome, AttemptOutcome::NotSent);
    assert_eq!(
        item.last_error.as_ref().map(|e| e.message.as_str()),
        Some("the lease lapsed before the call was sent")
    );
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

#[tokio::test]
async fn a_job_awaiting_a_decision_for_thirteen_hours_keeps_its_long_wait_on_a_new_receive() {
    // GIVEN an unknown job whose message was first received 13 hours ago and is received again
    // now, for the 40th time (each receive starts a new 12 hours of visibility)
    let ledger = Arc::new(InMemoryLedger::new());
    let body = job("waits-long", r#","simulate":{"retrievable":false}"#);
    lapsed_claim(&ledger, &body).await;
    let ended = ledger
        .end(fenced_jobs::ledger::EndRequest {
            job_id: "waits-long".into(),
            epoch: 1,
            attempt: 1,
            now: SystemClock.now_ms(),
            end: fenced_jobs::ledger::AttemptEnd::Unknown {
                evidence: "cut off".into(),
            },
            usage: None,
            input: None,
        })
        .await
        .expect("finish");
    assert!(matches!(ended, fenced_jobs::ledger::Write::Applied(_)));
    let h = handler(ledger, SimulatedProvider::new(), Settings::default());
    let mut r = record(Some("m1"), &body);
    let thirteen_hours_ago = SystemClock.now_ms() - 13 * 3_600_000;
    r.attributes.insert(
        "ApproximateFirstReceiveTimestamp".into(),
        thirteen_hours_ago.to_string(),
    );
    r.attributes
        .insert("ApproximateReceiveCount".into(), "40".into());
    // WHEN it is handled
    let report = h.handle_batch(&event(vec![r]), &invocation()).await;
    // THEN it waits the long wait for a decision again, instead of 0 (which looped it into the
    // DLQ within minutes)
    assert_eq!(
        report.records[0].outcome,
        RecordOutcome::Failed(Failure::AwaitingDecision)
    );
    let wait = Settings::default().visibility.awaiting_decision_s as i32;
    assert_eq!(report.records[0].visibility_s, Some(wait));
    assert_eq!(
        h.visibility().changes().last().map(|(_, c)| c.seconds),
        Some(wait)
    );
}

/// A results bucket whose reads of the producer's bucket never answer.
#[derive(Debug)]
struct HangingReads(fenced_jobs::blobs::MemoryBlobs);

impl fenced_jobs::blobs::BlobStore for HangingReads {
    fn bucket(&self) -> Option<&str> {
        self.0.bucket()
    }
    fn put<'a>(
        &'a self,
        key: &'a str,
        body: &'a [u8],
    ) -> futures::future::BoxFuture<
        'a,
        Result<fenced_jobs::job::BlobRef, fenced_jobs::blobs::BlobError>,
    > {
        self.0.put(key, body)
    }
    fn get<'a>(
        &'a self,
        bucket: &'a str,
        key: &'a str,
        limit: usize,
    ) -> futures::future::BoxFuture<'a, Result<Vec<u8>, fenced_jobs::blobs::BlobError>> {
        if bucket == "producer" {
            return Box::pin(std::future::pending());
        }
        self.0.get(bucket, key, limit)
    }
    fn delete<'a>(
        &'a self,
        key: &'a str,
    ) -> futures::future::BoxFuture<'a, Result<(), fenced_jobs::blobs::BlobError>> {
        self.0.delete(key)
    }
    fn list<'a>(
        &'a self,
        prefix: &'a str,
        limit: usize,
    ) -> futures::future::BoxFuture<'a, Result<Vec<String>, fenced_jobs::blobs::BlobError>> {
        self.0.list(prefix, limit)
    }
}

fn pointer_record(id: &str, key: &str, size: Option<usize>) -> SqsMessage {
    let class = "software.amazon.payloadoffloading.PayloadS3Pointer";
    let body = format!(r#"["{class}",{{"s3BucketName":"producer","s3Key":"{key}"}}]"#);
    let mut r = record(Some(id), &body);
    if let Some(size) = size {
        let mut attribute = aws_lambda_events::sqs::SqsMessageAttribute::default();
        attribute.string_value = Some(size.to_string());
        attribute.data_type = Some("Number".into());
        r.message_attributes
            .insert("ExtendedPayloadSize".into(), attribute);
    }
    r
}

#[tokio::test]
async fn payloads_are_read_one_at_a_time_within_the_memory_set_aside_for_them() {
    use fenced_jobs::blobs::MemoryBlobs;
    // GIVEN four Extended Client pointers to payloads of about 1 MiB each, and 9 MiB set aside
    // for payloads (each takes about four times its size while its record is processed)
    let blobs = Arc::new(MemoryBlobs::new("results"));
    let prompt = "p".repeat(1_000_000);
    for i in 0..4 {
        let payload = job(&format!("big-{i}"), &format!(r#","text":"{prompt}""#));
        blobs.insert("producer", &format!("k{i}"), payload.as_bytes());
    }
    let ledger = Arc::new(InMemoryLedger::new());
    let settings = Settings {
        payload_memory_bytes: 9 * 1_048_576,
        ..reading_payloads()
    };
    let h = handler_with_blobs(ledger.clone(), settings, blobs);
    let records = (0..4)
        .map(|i| pointer_record(&format!("m{i}"), &format!("k{i}"), Some(1_000_100)))
        .collect();
    // WHEN the batch is handled
    let report = h.handle_batch(&event(records), &invocation()).await;
    // THEN the payloads that fit are read and run, and the others back off unread, for a later
    // batch (never poison, never a job written)
    let labels: Vec<&str> = report.records.iter().map(|r| r.outcome.label()).collect();
    assert_eq!(labels, ["succeeded", "succeeded", "backoff", "backoff"]);
    assert!(ledger.get("big-2").await.expect("get").is_none());
    assert!(ledger.get("big-3").await.expect("get").is_none());
}

#[tokio::test]
async fn a_payload_read_that_never_answers_does_not_hold_the_batch_past_its_deadline() {
    // GIVEN a pointer whose payload read never answers, beside an ordinary job, and an
    // invocation with three seconds left
    let blobs = Arc::new(HangingReads(fenced_jobs::blobs::MemoryBlobs::new(
        "results",
    )));
    let ledger = Arc::new(InMemoryLedger::new());
    let settings = Settings {
        deadline_margin_ms: 1_000,
        ..reading_payloads()
    };
    let h = BatchHandler::new(
        Processor::new(ledger, SimulatedProvider::new(), SystemClock, settings).with_blobs(blobs),
        RecordingVisibility::new(),
    );
    let short = Invocation {
        id: "inv-short".into(),
        deadline: Some(SystemClock.now_ms() + 3_000),
    };
    let records = vec![
        pointer_record("m0", "k0", None),
        record(Some("m1"), &job("plain", "")),
    ];
    // WHEN the batch is handled
    let started = std::time::Instant::now();
    let report = h.handle_batch(&event(records), &short).await;
    // THEN it answers before the deadline, the stuck record backing off
    assert!(started.elapsed() < std::time::Duration::from_millis(3_000));
    assert_eq!(report.records[0].outcome.label(), "backoff");
    assert!(report.response.is_ok());
}

/// A live job whose input went missing is never poison (its message is its only trigger): a
/// stored input that is gone or altered ends the job `failed_terminal` (`input_lost`) with no
/// call, and an Extended Client pointer whose payload is gone goes on from the job its message
/// names in `fenced-jobs.job-id`; without that attribute, or naming no job, it is poison.
#[tokio::test]
async fn a_live_job_whose_input_is_gone_is_never_poison() {
    use fenced_jobs::blobs::MemoryBlobs;
    use fenced_jobs::job::{BlobRef, JobDefaults, NewJob};
    use fenced_jobs::ledger::CreateRequest;
    let ledger = Arc::new(InMemoryLedger::new());
    let blobs = Arc::new(MemoryBlobs::new("results"));
    blobs.insert("results", "inputs/altered/d.json", b"{\"other\":1}");
    let h = BatchHandler::new(
        Processor::new(
            ledger.clone(),
            SimulatedProvider::new(),
            SystemClock,
            reading_payloads(),
        )
        .with_blobs(blobs.clone()),
        RecordingVisibility::new(),
    )
    .with_seed(1);
    let now = SystemClock.now_ms();
    let ready = |job: NewJob| CreateRequest {
        job,
        now,
        enqueued: true,
    };
    // GIVEN two ready jobs whose stored inputs are gone and altered
    for (id, key) in [
        ("gone", "inputs/gone/d.json"),
        ("altered", "inputs/altered/d.json"),
    ] {
        let job = NewJob {
            class: Default::default(),
            job_id: id.into(),
            input_digest: "d".into(),
            contract: "c".into(),
            input: String::new(),
            input_ref: Some(BlobRef {
                bucket: "results".into(),
                key: key.into(),
                size: 11,
                sha256: "e".repeat(64),
            }),
            metadata: None,
            deadline_at: now + 3_600_000,
            max_attempts: 3,
            max_cost_micros: None,
            expires_at: 0,
        };
        ledger.create(ready(job)).await.expect("create");
    }
    // AND a ready job first read from a pointer whose payload the producer's bucket dropped
    let msg = fenced_jobs::job::parse_body(Some(&job("from-ptr", ""))).expect("valid");
    let defaults = JobDefaults::default();
    ledger
        .create(ready(NewJob::from_message(&msg, now, &defaults)))
        .await
        .expect("create");
    let named = |id: &str, job_id: Option<&str>| {
        let mut r = pointer_record(id, "p/dropped", None);
        if let Some(job_id) = job_id {
            let mut attribute = aws_lambda_events::sqs::SqsMessageAttribute::default();
            attribute.string_value = Some(job_id.into());
            attribute.data_type = Some("String".into());
            r.message_attributes
                .insert("fenced-jobs.job-id".into(), attribute);
        }
        r
    };
    // WHEN their messages are delivered
    let report = h
        .handle_batch(
            &event(vec![
                record(Some("m-gone"), r#"{"job_id":"gone"}"#),
                record(Some("m-altered"), r#"{"job_id":"altered"}"#),
                named("m-ptr", Some("from-ptr")),
                named("m-anon", None),
                named("m-none", Some("no-such-job")),
            ]),
            &invocation(),
        )
        .await;
    // THEN the jobs with a lost input end failed_terminal, with no call, and are acknowledged
    let labels: Vec<&str> = report.records.iter().map(|r| r.outcome.label()).collect();
    assert_eq!(
        labels,
        [
            "failed_terminal",
            "failed_terminal",
            "succeeded",
            "poison",
            "poison"
        ]
    );
    for id in ["gone", "altered"] {
        let item = ledger.get(id).await.expect("get").expect("item");
        let error = item.last_error.expect("an error");
        assert_eq!((item.attempts, error.kind.as_str()), (0, "input_lost"));
    }
    // AND the pointer's job ran from its item, once
    assert_eq!(h.processor().provider().executions(), 1);
}

/// A job whose deadline is further away than the results bucket keeps what is stored for it
/// (`RESULTS_RETENTION_DAYS` less the item's `RETENTION_DAYS`) is refused at its first sight;
/// one within it runs, and a job already in the ledger is not judged again.
#[tokio::test]
async fn a_deadline_beyond_what_the_results_bucket_keeps_is_refused_at_first_sight() {
    use fenced_jobs::blobs::MemoryBlobs;
    use fenced_jobs::job::message::format_rfc3339_ms;
    let ledger = Arc::new(InMemoryLedger::new());
    // GIVEN a bucket that keeps objects 90 days and items kept 30 days after their deadline
    // (and producers allowed deadlines up to 100 days)
    let settings = Settings {
        results_retention_days: 90,
        policy: fenced_jobs::job::policy::Policy {
            max_deadline_ms: 100 * 86_400_000,
            ..Default::default()
        },
        ..Settings::default()
    };
    let h = BatchHandler::new(
        Processor::new(
            ledger.clone(),
            SimulatedProvider::new(),
            SystemClock,
            settings,
        )
        .with_blobs(Arc::new(MemoryBlobs::new("results"))),
        RecordingVisibility::new(),
    )
    .with_seed(1);
    let day = 86_400_000;
    let due = |id: &str, days: i64| {
        let at = format_rfc3339_ms(SystemClock.now_ms() + days * day);
        format!(
            r#"{{"job_id":"{id}","contract":"c","deadline_at":"{at}","input":{{"model":"m","prompt":"p"}}}}"#
        )
    };
    // WHEN jobs due in 70 and in 50 days arrive
    let report = h
        .handle_batch(
            &event(vec![
                record(Some("far"), &due("far", 70)),
                record(Some("near"), &due("near", 50)),
            ]),
            &invocation(),
        )
        .await;
    // THEN the first is poison, named by its rule, and never reaches the ledger
    let labels: Vec<&str> = report.records.iter().map(|r| r.outcome.label()).collect();
    assert_eq!(labels, ["poison", "succeeded"]);
    assert!(ledger.get("far").await.expect("get").is_none());
    // AND a message whose producer created the item first is not judged again
    let in_ledger = |id: &str| {
        let mut r = record(Some(id), &due(id, 70));
        let mut attribute = aws_lambda_events::sqs::SqsMessageAttribute::default();
        attribute.string_value = Some("true".into());
        attribute.data_type = Some("String".into());
        r.message_attributes.insert("JobInLedger".into(), attribute);
        r
    };
    let msg = fenced_jobs::job::parse_body(Some(&due("far-2", 70))).expect("valid");
    let now = SystemClock.now_ms();
    let created = fenced_jobs::job::NewJob::from_message(&msg, now, &Default::default());
    ledger
        .create(fenced_jobs::ledger::CreateRequest {
            job: created,
            now,
            enqueued: true,
        })
        .await
        .expect("create");
    let report = h
        .handle_batch(&event(vec![in_ledger("far-2")]), &invocation())
        .await;
    assert_ne!(report.records[0].outcome.label(), "poison");
    // BUT the attribute alone, for a job the ledger does not hold, carries none past the rule
    let report = h
        .handle_batch(&event(vec![in_ledger("far-3")]), &invocation())
        .await;
    assert_eq!(report.records[0].outcome.label(), "poison");
    assert!(ledger.get("far-3").await.expect("get").is_none());
}

/// A job whose deadline is further away than the redrive count's receives carry it
/// (`MAX_RECEIVE_COUNT`) is refused at its first sight, with its reason: SQS could dead-letter
/// its message while it lives. One within reach runs.
#[tokio::test]
async fn a_deadline_beyond_what_the_redrive_count_carries_is_refused_at_first_sight() {
    use fenced_jobs::job::message::format_rfc3339_ms;
    let ledger = Arc::new(InMemoryLedger::new());
    // GIVEN a queue that dead-letters at 20 receives: 8 waits of about 12 hours, 4 days
    let mut settings = Settings::default();
    settings.visibility.max_receive_count = 20;
    let h = BatchHandler::new(
        Processor::new(
            ledger.clone(),
            SimulatedProvider::new(),
            SystemClock,
            settings,
        ),
        RecordingVisibility::new(),
    )
    .with_seed(1);
    let hour = 3_600_000;
    let due = |id: &str, hours: i64| {
        let at = format_rfc3339_ms(SystemClock.now_ms() + hours * hour);
        format!(
            r#"{{"job_id":"{id}","contract":"c","deadline_at":"{at}","input":{{"model":"m","prompt":"p"}}}}"#
        )
    };
    // WHEN jobs due in 100 and in 90 hours arrive
    let report = h
        .handle_batch(
            &event(vec![
                record(Some("far"), &due("far", 100)),
                record(Some("near"), &due("near", 90)),
            ]),
            &invocation(),
        )
        .await;
    // THEN the first is poison, named by its rule, and never reaches the ledger; the second runs
    let labels: Vec<&str> = report.records.iter().map(|r| r.outcome.label()).collect();
    assert_eq!(labels, ["poison", "succeeded"]);
    let RecordOutcome::Failed(Failure::Poison(reason)) = &report.records[0].outcome else {
        panic!("{:?}", report.records[0].outcome);
    };
    assert!(reason.to_string().contains("MAX_RECEIVE_COUNT"), "{reason}");
    assert!(ledger.get("far").await.expect("get").is_none());
    // AND delivered again (its dead letter could not be sent), it is refused again, its item
    // still unwritten; a redelivery of a job the ledger holds is not judged
    let again = |id: &str, hours: i64| {
        let mut r = record(Some(id), &due(id, hours));
        r.attributes
            .insert("ApproximateReceiveCount".into(), "2".into());
        r
    };
    let report = h
        .handle_batch(
            &event(vec![again("far", 100), again("near", 100)]),
            &invocation(),
        )
        .await;
    let labels: Vec<&str> = report.records.iter().map(|r| r.outcome.label()).collect();
    assert_eq!(labels, ["poison", "succeeded"]);
    assert!(ledger.get("far").await.expect("get").is_none());
}

/// Queue calls that stall (the visibility call hangs for seconds) never hold up the lease
/// renewals: the heartbeat renews leases on its own schedule.
#[tokio::test]
async fn a_stalled_visibility_call_does_not_hold_up_the_lease_renewals() {
    use fenced_jobs::queue::{ChangeResults, VisibilityChange, VisibilityControl};
    struct Stalling(RecordingVisibility);
    impl VisibilityControl for Stalling {
        async fn visibility_timeout_s(&self, queue_arn: &str) -> Option<i64> {
            self.0.visibility_timeout_s(queue_arn).await
        }
        async fn change(&self, queue_arn: &str, changes: Vec<VisibilityChange>) -> ChangeResults {
            tokio::time::sleep(std::time::Duration::from_secs(5)).await;
            self.0.change(queue_arn, changes).await
        }
    }
    // GIVEN a 2 s lease renewed when it has under 0.9 s left (three 300 ms ticks), and a call
    // of 4 s
    let settings = Settings {
        lease_ms: 2_000,
        heartbeat_ms: 300,
        skew_ms: 0,
        queue_visibility_s: 30,
        ..Settings::default()
    };
    let ledger = Arc::new(InMemoryLedger::new());
    let h = BatchHandler::new(
        Processor::new(
            ledger.clone(),
            SimulatedProvider::new(),
            SystemClock,
            settings,
        ),
        Stalling(RecordingVisibility::new()),
    )
    .with_seed(1);
    let body = job("stalled-queue", r#","simulate":{"latency_ms":4000}"#);
    // WHEN the first visibility extension stalls past the end of the call
    let report = h
        .handle_batch(&event(vec![record(Some("m"), &body)]), &invocation())
        .await;
    // THEN the lease was renewed all along, and the job succeeded
    assert_eq!(report.records[0].outcome.label(), "succeeded");
    assert!(report.stats.lease_renewed >= 2, "{:?}", report.stats);
}

/// A claim applied whose answer and first read-back were both lost: the worker reads again,
/// finds its own claim and makes the call, instead of leaving a `running` job with no call for
/// a recovery to find uncertain.
#[tokio::test]
async fn a_claim_whose_answer_and_read_back_were_lost_is_read_again_and_runs() {
    // GIVEN a ledger that applies the claim and loses its answer, and fails the read after it
    let ledger = faulty("claim", Fault::LoseAnswer, 1);
    ledger.inject("get", Fault::Fail, 1);
    let h = handler(ledger, SimulatedProvider::new(), Settings::default());
    // WHEN a job is delivered
    let report = h
        .handle_batch(
            &event(vec![record(Some("m1"), &job("lost-claim", ""))]),
            &invocation(),
        )
        .await;
    // THEN the next read recognises the claim, and the job runs once, in this delivery
    assert_eq!(report.records[0].outcome.label(), "succeeded");
    assert_eq!(h.processor().provider().executions(), 1);
    let item = h
        .processor()
        .ledger()
        .inner
        .get("lost-claim")
        .await
        .expect("get")
        .expect("item");
    assert_eq!((item.owner_epoch, item.attempts), (1, 1));
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

/// A record as the principal `sender` sent it (SQS's `SenderId`, which the sender cannot choose).
fn sent_by(sender: &str, id: &str, body: &str) -> SqsMessage {
    let mut r = record(Some(id), body);
    r.attributes.insert("SenderId".into(), sender.into());
    r
}

/// With `PRODUCERS`, each producer's job ids live in its own namespace, known from the principal
/// SQS says sent the message: the same id from two producers is two jobs (not a conflict that
/// dead-letters the second), a producer cannot trigger or read another's job, an unknown sender
/// is refused, and the reconciler's role names jobs by their whole id.
#[tokio::test]
async fn producers_are_kept_apart_by_the_sender_sqs_names() {
    use fenced_jobs::blobs::MemoryBlobs;
    use fenced_jobs::job::scope::Producers;
    let ledger = Arc::new(InMemoryLedger::new());
    let blobs = Arc::new(MemoryBlobs::new("results"));
    blobs.insert("producer", "search/p1", job("from-pointer", "").as_bytes());
    let settings = Settings {
        producers: Producers::parse("billing=AROABILLING,search=AROASEARCH", "AROARECONCILER")
            .expect("producers"),
        ..reading_payloads()
    };
    let h = handler_with_blobs(ledger.clone(), settings, blobs).with_seed(1);
    let labels = |report: &fenced_jobs::report::BatchReport| -> Vec<&'static str> {
        report.records.iter().map(|r| r.outcome.label()).collect()
    };
    // WHEN two producers send the same job id with different inputs, and a stranger sends one
    let billing = job("job-1", r#","text":"billing's""#);
    let search = job("job-1", r#","text":"search's""#);
    let report = h
        .handle_batch(
            &event(vec![
                sent_by("AROABILLING:run-1", "m1", &billing),
                sent_by("AROASEARCH:run-7", "m2", &search),
                sent_by("AROASTRANGER:x", "m3", &job("job-2", "")),
            ]),
            &invocation(),
        )
        .await;
    // THEN each producer's job runs in its own namespace, and the stranger's is refused unwritten
    assert_eq!(labels(&report), ["succeeded", "succeeded", "poison"]);
    for id in ["billing/job-1", "search/job-1"] {
        let item = ledger.get(id).await.expect("get").expect(id);
        assert_eq!(item.state, JobState::Succeeded);
    }
    assert!(ledger.get("job-1").await.expect("get").is_none());
    assert!(ledger.get("job-2").await.expect("get").is_none());
    // AND a producer reaches neither another's job by its whole id nor another's payloads,
    // while its own trigger and the reconciler's whole-id trigger find their jobs
    let pointer = |key: &str| {
        let class = "software.amazon.payloadoffloading.PayloadS3Pointer";
        format!(r#"["{class}",{{"s3BucketName":"producer","s3Key":"{key}"}}]"#)
    };
    let report = h
        .handle_batch(
            &event(vec![
                sent_by("AROASEARCH:run-7", "m4", r#"{"job_id":"billing/job-1"}"#),
                sent_by("AROABILLING:run-1", "m5", &pointer("search/p1")),
                sent_by("AROASEARCH:run-7", "m6", r#"{"job_id":"job-1"}"#),
                sent_by("AROARECONCILER:r", "m7", r#"{"job_id":"billing/job-1"}"#),
                sent_by("AROASEARCH:run-7", "m8", &pointer("search/p1")),
            ]),
            &invocation(),
        )
        .await;
    assert_eq!(
        labels(&report),
        ["poison", "poison", "succeeded", "succeeded", "succeeded"]
    );
    assert!(
        ledger
            .get("search/from-pointer")
            .await
            .expect("get")
            .is_some()
    );
    assert!(
        ledger
            .get("billing/from-pointer")
            .await
            .expect("get")
            .is_none()
    );
}

/// What a producer may ask for is the deployment's to say: a model, a parameter or a bound it
/// does not allow is refused at the job's first sight, before any write or call, and named.
#[tokio::test]
async fn a_job_asking_for_what_the_deployment_does_not_allow_is_refused_unwritten() {
    use fenced_jobs::job::policy::Policy;
    let ledger = Arc::new(InMemoryLedger::new());
    let settings = Settings {
        policy: Policy {
            models: Policy::parse_models("m").expect("models"),
            ..Policy::default()
        },
        ..Settings::default()
    };
    let h = handler(ledger.clone(), SimulatedProvider::new(), settings);
    let other_model = job("big-model", "").replace(r#""model":"m""#, r#""model":"m-large""#);
    let report = h
        .handle_batch(
            &event(vec![
                record(
                    Some("m1"),
                    &job("fine", r#","parameters":{"max_tokens":512}"#),
                ),
                record(Some("m2"), &other_model),
                record(
                    Some("m3"),
                    &job("stream", r#","parameters":{"stream":true}"#),
                ),
                record(
                    Some("m4"),
                    &job("huge", r#","parameters":{"max_tokens":1000000}"#),
                ),
                record(
                    Some("m5"),
                    &job("many", "")
                        .replace(r#""contract":"c""#, r#""contract":"c","max_attempts":50"#),
                ),
            ]),
            &invocation(),
        )
        .await;
    let labels: Vec<&str> = report.records.iter().map(|r| r.outcome.label()).collect();
    assert_eq!(
        labels,
        ["succeeded", "poison", "poison", "poison", "poison"]
    );
    let reasons: Vec<String> = report.records[1..]
        .iter()
        .map(|r| match &r.outcome {
            RecordOutcome::Failed(Failure::Poison(why)) => why.to_string(),
            other => panic!("{other:?}"),
        })
        .collect();
    assert!(reasons[0].contains("ALLOWED_MODELS"), "{reasons:?}");
    assert!(
        reasons[1].contains("input.parameters.stream"),
        "{reasons:?}"
    );
    assert!(reasons[2].contains("within its bound"), "{reasons:?}");
    assert!(reasons[3].contains("MAX_ATTEMPTS_LIMIT"), "{reasons:?}");
    for id in ["big-model", "stream", "huge", "many"] {
        assert!(ledger.get(id).await.expect("get").is_none(), "{id}");
    }
    assert_eq!(h.processor().provider().executions(), 1);
}

#[tokio::test]
async fn a_batch_reports_what_its_calls_used_and_cost_by_model() {
    // GIVEN two jobs of sim-1 (priced at $1 and $4 a million) and one of a model the price
    // table does not know
    let ledger = Arc::new(InMemoryLedger::new());
    let h = handler(
        ledger.clone(),
        SimulatedProvider::new(),
        Settings::default(),
    );
    let of = |id: &str, model: &str| {
        format!(r#"{{"job_id":"{id}","contract":"c","input":{{"model":"{model}","prompt":"p"}}}}"#)
    };
    let records = vec![
        record(Some("m1"), &of("u-1", "sim-1")),
        record(Some("m2"), &of("u-2", "sim-1")),
        record(Some("m3"), &of("u-3", "unpriced-1")),
    ];
    // WHEN the batch is handled
    let report = h.handle_batch(&event(records), &invocation()).await;
    // THEN each model's sum is what its jobs' attempts recorded
    let recorded = |id: &str| {
        let ledger = ledger.clone();
        let id = id.to_owned();
        async move {
            ledger
                .get(&id)
                .await
                .expect("get")
                .and_then(|r| r.usage())
                .expect("usage")
        }
    };
    let sim = recorded("u-1").await.plus(&recorded("u-2").await);
    assert!(sim.cost_micros.is_some_and(|c| c > 0), "{sim:?}");
    let unpriced = recorded("u-3").await;
    assert_eq!(unpriced.cost_micros, None);
    let models: Vec<&str> = report
        .usage_by_model
        .iter()
        .map(|(m, _)| m.as_str())
        .collect();
    assert_eq!(
        models,
        ["sim-1", "unpriced-1"],
        "{:?}",
        report.usage_by_model
    );
    assert_eq!(report.usage_by_model[0].1, sim);
    assert_eq!(report.usage_by_model[1].1, unpriced);
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
