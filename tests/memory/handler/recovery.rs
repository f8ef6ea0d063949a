//! Leases and recovery: a lost lease cancels the call, a lapsed owner's call is asked about or
//! its stored answer accepted, the replay policy, and jobs that wait for a decision.

use std::sync::Arc;

use fenced_jobs::clock::{Clock, SystemClock};
use fenced_jobs::job::{AttemptOutcome, Failure, JobState, RecordOutcome};
use fenced_jobs::ledger::JobLedger;
use fenced_jobs::ledger::memory::{Fault, InMemoryLedger};
use fenced_jobs::provider::SimulatedProvider;
use fenced_jobs::queue::RecordingVisibility;
use fenced_jobs::worker::Settings;
use fenced_jobs::worker::handler::BatchHandler;
use fenced_jobs::worker::processor::Processor;

use super::{event, faulty, handler, invocation, job, lapsed_claim, record};

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
                input: None,
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
async fn a_replay_policy_records_its_decision_and_stays_within_the_budget() {
    use fenced_jobs::protocol::ReplayPolicy;
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

/// A job whose owner vanished on its first claim keeps no input in its item: a trigger by id
/// (an operator's, or a stray one) recovers nothing, asks nobody and calls nobody, where a
/// recovery would have built its request from no input; the job's own message then recovers it.
#[tokio::test]
async fn a_trigger_by_id_never_recovers_a_job_whose_item_kept_no_input() {
    let ledger = Arc::new(InMemoryLedger::new());
    let h = handler(
        ledger.clone(),
        SimulatedProvider::new(),
        Settings::default(),
    );
    let body = job("bare", "");
    lapsed_claim(&ledger, &body).await;
    let before = ledger.get("bare").await.expect("get").expect("item");
    assert!(!before.keeps_input());

    let trigger = r#"{"job_id":"bare"}"#;
    let report = h
        .handle_batch(&event(vec![record(Some("t"), trigger)]), &invocation())
        .await;
    assert!(
        matches!(
            report.records[0].outcome,
            RecordOutcome::Failed(Failure::Backoff { cause, .. }) if cause.contains("input with the job")
        ),
        "{:?}",
        report.records[0].outcome
    );
    assert_eq!(ledger.get("bare").await.expect("get"), Some(before));
    let provider = h.processor().provider();
    assert_eq!((provider.executions(), provider.retrievals()), (0, 0));

    let report = h
        .handle_batch(&event(vec![record(Some("m"), &body)]), &invocation())
        .await;
    assert_eq!(
        report.records[0].outcome,
        RecordOutcome::Done(JobState::Succeeded)
    );
    let item = ledger.get("bare").await.expect("get").expect("item");
    assert_eq!((item.owner_epoch, item.recoveries.len()), (2, 1));
    // The recovery kept no input: SQS keeps the message past the deadline, and it carries it.
    assert!(!item.keeps_input());
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
        replay: fenced_jobs::protocol::ReplayPolicy::Replay,
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
