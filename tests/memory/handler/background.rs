//! Background calls: recorded before they are polled, retrieved on a later delivery, cancelled
//! when their reference cannot be recorded or their job's deadline passes, and bounded
//! retrievals.

use std::sync::Arc;

use fenced_jobs::clock::{Clock, SystemClock};
use fenced_jobs::job::{Failure, JobState, RecordOutcome};
use fenced_jobs::ledger::JobLedger;
use fenced_jobs::ledger::memory::InMemoryLedger;
use fenced_jobs::provider::{Answer, Provider, ProviderError, ProviderRequest, SimulatedProvider};
use fenced_jobs::worker::Settings;
use fenced_jobs::worker::processor::Invocation;

use super::{event, handler, invocation, job, lapsed_claim, record, tight_settings};
use crate::support;

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
) -> support::http::HttpStub {
    use serde_json::json;
    use support::http::Reply;
    support::http::HttpStub::start(move |req, before| {
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
            input: None,
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
    ) -> Result<Option<fenced_jobs::job::JobItem>, fenced_jobs::ledger::LedgerError> {
        self.0.get(job_id).await
    }
    async fn note_batch_members(
        &self,
        batch_id: &str,
        members: &[fenced_jobs::job::BatchMember],
        now: fenced_jobs::job::Millis,
    ) -> Result<(), fenced_jobs::ledger::LedgerError> {
        self.0.note_batch_members(batch_id, members, now).await
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
