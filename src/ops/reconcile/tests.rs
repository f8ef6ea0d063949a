//! The reconciler's runs on the in-memory ledger: expiry, upstream cancels and the due walk.
use super::*;
use crate::job::{Expect, NewJob};
use crate::ledger::memory::InMemoryLedger;
use crate::ledger::{ClaimRequest, RecoverRequest};
use crate::queue::RecordingTriggers;

/// A provider with background calls that records what it is asked to cancel.
#[derive(Default)]
struct Cancels(std::sync::Mutex<Vec<String>>);

impl Provider for Cancels {
    async fn call(
        &self,
        _: &crate::provider::ProviderRequest<'_>,
    ) -> Result<crate::provider::Answer, crate::provider::ProviderError> {
        std::future::pending().await
    }
    fn can_retrieve(&self) -> bool {
        true
    }
    async fn cancel(&self, provider_ref: &str) {
        self.0
            .lock()
            .expect("cancels")
            .push(provider_ref.to_owned());
    }
}

const T: Millis = 1_800_000_000_000;

/// A job claimed two minutes before its deadline `T`, whose owner vanished, recovered by a
/// second owner a minute later, its lease ending at `lease_until`: a job the reconciler
/// watches (one on its first claim is its message's to bring back).
async fn running_job(
    ledger: &InMemoryLedger,
    job_id: &str,
    lease_until: Millis,
    provider_ref: Option<&str>,
) {
    let job = NewJob::example(job_id, T);
    let claim = ClaimRequest {
        job,
        expect: Expect::FRESH,
        owner_id: "w".into(),
        now: T - 120_000,
        lease_until: T - 90_000,
        provider_ref: provider_ref.map(str::to_owned),
        route: None,
        first_sight: false,
        list_due: false,
    };
    assert!(matches!(ledger.claim(claim).await, Ok(Write::Applied(_))));
    let recover = RecoverRequest {
        job_id: job_id.to_owned(),
        seen_epoch: 1,
        owner_id: "w2".into(),
        now: T - 60_000,
        lapsed_before: T - 62_000,
        lease_until,
        reason: "lease lapsed".into(),
        seen_recoveries: 0,
        input: None,
    };
    assert!(matches!(
        ledger.recover(recover).await,
        Ok(Write::Applied(_))
    ));
}

#[tokio::test]
async fn expiring_a_running_job_cancels_its_call_upstream() {
    // GIVEN a running job past its deadline whose attempt has a provider reference
    let ledger = InMemoryLedger::new();
    running_job(&ledger, "bg", T + 600_000, Some("resp_9")).await;
    let provider = Cancels::default();
    // WHEN the reconciler expires it
    let report = reconcile(
        &ledger,
        &RecordingTriggers::new(),
        &provider,
        T + 10_000,
        &ReconcileSettings::default(),
    )
    .await
    .expect("run");
    // THEN the call is cancelled upstream: its answer can never be accepted
    assert_eq!((report.expired, report.cancelled), (1, 1));
    assert_eq!(
        *provider.0.lock().expect("cancels"),
        vec!["resp_9".to_owned()]
    );
}

#[tokio::test]
async fn a_job_is_expired_only_past_its_deadline_and_the_skew_margin() {
    // GIVEN a running job whose deadline is T, and a reconciler with a 2 s margin
    let ledger = InMemoryLedger::new();
    running_job(&ledger, "j", T - 30_000, None).await;
    let settings = ReconcileSettings::default();
    let triggers = RecordingTriggers::new();
    // WHEN it runs 1 s after the deadline, then 2 s after
    let provider = crate::provider::SimulatedProvider::new();
    let early = reconcile(&ledger, &triggers, &provider, T + 1_000, &settings)
        .await
        .expect("run");
    let late = reconcile(&ledger, &triggers, &provider, T + 2_000, &settings)
        .await
        .expect("run");
    // THEN only the second run expires it: a clock ahead by the margin never expires early
    assert_eq!((early.expired, late.expired), (0, 1));
    let item = ledger.get("j").await.expect("get").expect("item");
    assert_eq!(item.state, JobState::Expired);
}

/// A job claimed once, two minutes before its deadline `T`, on a message SQS could drop (its
/// last receives), whose owner vanished and whose message was then dropped: its item keeps no
/// input, and only the due index holds it.
async fn lost_on_its_first_claim(ledger: &InMemoryLedger, job_id: &str, provider_ref: &str) {
    let claim = ClaimRequest {
        job: NewJob::example(job_id, T),
        expect: Expect::FRESH,
        owner_id: "w".into(),
        now: T - 120_000,
        lease_until: T - 90_000,
        provider_ref: Some(provider_ref.to_owned()),
        route: None,
        first_sight: true,
        list_due: true,
    };
    assert!(matches!(ledger.claim(claim).await, Ok(Write::Applied(_))));
}

#[tokio::test]
async fn a_job_lost_on_its_first_claim_is_found_at_its_deadline_and_ends_saying_so() {
    // GIVEN a job on its first claim whose owner and message are gone, in no sparse index
    let ledger = InMemoryLedger::new();
    lost_on_its_first_claim(&ledger, "lost", "resp_1").await;
    assert!(
        ledger
            .list(JobState::Running, 10)
            .await
            .expect("list")
            .is_empty()
    );
    let (provider, triggers) = (Cancels::default(), RecordingTriggers::new());
    let settings = ReconcileSettings::default();
    // WHEN the reconciler runs before its deadline, after it, and once more
    let mut runs = Vec::new();
    for now in [T - 10_000, T + 10_000, T + 20_000] {
        let run = reconcile(&ledger, &triggers, &provider, now, &settings).await;
        runs.push(run.expect("run"));
    }
    // THEN only the run after the deadline ends it, expired with `message_lost`, and its
    // call is cancelled upstream; nothing was sent (a trigger by id cannot run it)
    let ended: Vec<_> = runs.iter().map(|r| (r.expired, r.message_lost)).collect();
    assert_eq!(ended, [(0, 0), (1, 1), (0, 0)]);
    assert_eq!(runs[1].cancelled, 1);
    assert!(triggers.sent().is_empty());
    let item = ledger.get("lost").await.expect("get").expect("item");
    assert_eq!(item.state, JobState::Expired);
    let error = item.last_error.as_ref().expect("its reason");
    assert_eq!(error.kind, "message_lost");
    assert!(crate::events::CompletionEvent::of(&item).is_some());
    // AND each run reads the due index from where the last one stopped
    assert_eq!(
        runs.iter().map(|r| r.due_walked).collect::<Vec<_>>(),
        [0, 1, 0]
    );
}

#[tokio::test]
async fn a_job_whose_item_keeps_no_input_gets_no_trigger_it_cannot_use() {
    // GIVEN a job that failed once on a delivery that carried no input (an item from before
    // inputs were kept), untouched long enough for a re-send
    let ledger = InMemoryLedger::new();
    lost_on_its_first_claim(&ledger, "bare", "resp_2").await;
    let end = crate::ledger::EndRequest {
        job_id: "bare".into(),
        epoch: 1,
        attempt: 1,
        now: T - 100_000,
        end: crate::ledger::AttemptEnd::RetryAuthorized {
            error: "503".into(),
        },
        usage: None,
        input: None,
    };
    assert!(matches!(ledger.end(end).await, Ok(Write::Applied(_))));
    let settings = ReconcileSettings {
        retry_after_ms: 1_000,
        ..ReconcileSettings::default()
    };
    // WHEN the reconciler runs before its deadline
    let triggers = RecordingTriggers::new();
    let provider = crate::provider::SimulatedProvider::new();
    let run = reconcile(&ledger, &triggers, &provider, T - 10_000, &settings)
        .await
        .expect("run");
    // THEN nothing is sent: only its message can run it, or its deadline ends it
    assert_eq!((run.resent, triggers.sent().len()), (0, 0));
    let run = reconcile(&ledger, &triggers, &provider, T + 10_000, &settings)
        .await
        .expect("run");
    // (its message, which SQS keeps, may only not have come back: not `message_lost`)
    assert_eq!((run.expired, run.message_lost), (1, 0));
    let item = ledger.get("bare").await.expect("get").expect("item");
    let error = item.last_error.as_ref().expect("its reason");
    assert_ne!(error.kind, "message_lost");
}

#[tokio::test]
async fn a_recovered_job_past_its_deadline_is_not_said_to_have_lost_its_message() {
    // GIVEN a job recovered from a lapsed first owner (epoch 2, its first attempt still), its
    // item keeping no input, whose second owner vanished too
    let ledger = InMemoryLedger::new();
    lost_on_its_first_claim(&ledger, "again", "resp_3").await;
    let recover = crate::ledger::RecoverRequest {
        job_id: "again".into(),
        seen_epoch: 1,
        owner_id: "w2".into(),
        now: T - 60_000,
        lapsed_before: T - 60_000,
        lease_until: T - 30_000,
        reason: "lease lapsed".into(),
        seen_recoveries: 0,
        input: None,
    };
    assert!(matches!(
        ledger.recover(recover).await,
        Ok(Write::Applied(_))
    ));
    let item = ledger.get("again").await.expect("get").expect("item");
    assert_eq!((item.owner_epoch, item.attempts), (2, 1));
    // WHEN the reconciler runs after its deadline
    let (provider, triggers) = (Cancels::default(), RecordingTriggers::new());
    let settings = ReconcileSettings::default();
    let run = reconcile(&ledger, &triggers, &provider, T + 10_000, &settings).await;
    // THEN it expires, for its deadline, not as a lost message
    assert_eq!(
        (run.as_ref().map(|r| (r.expired, r.message_lost))).ok(),
        Some((1, 0))
    );
    let item = ledger.get("again").await.expect("get").expect("item");
    assert_ne!(item.last_error.expect("its reason").kind, "message_lost");
}

#[tokio::test]
async fn a_job_the_dlq_sweep_finds_past_its_deadline_expires_for_its_deadline() {
    // GIVEN a job on its first claim, in no index, whose letter the sweep found past its
    // deadline, and a finished one
    let ledger = InMemoryLedger::new();
    lost_on_its_first_claim(&ledger, "looping", "resp_4").await;
    let provider = Cancels::default();
    // WHEN the reconciler expires them, before the deadline passed by the skew and after
    let mut report = ReconcileReport::default();
    let ids = ["looping".to_owned(), "never-seen".to_owned()];
    expire_found(&ledger, &provider, &ids, (T + 1_000, 2_000), &mut report).await;
    let early = report.expired;
    expire_found(&ledger, &provider, &ids, (T + 3_000, 2_000), &mut report).await;
    // THEN only the second expires it, for its deadline (its message is in the DLQ, not
    // lost), and cancels its call upstream
    assert_eq!((early, report.expired, report.message_lost), (0, 1, 0));
    assert_eq!((report.cancelled, report.errors), (1, 0));
    let item = ledger.get("looping").await.expect("get").expect("item");
    assert_eq!(item.state, JobState::Expired);
    assert_eq!(item.last_error.expect("its reason").kind, "deadline");
}
