//! One batch: duplicates make one call, a panic or a failure is its record's alone, each
//! failure gets its visibility, lenient reading of events, and what the batch reports.

use std::sync::Arc;

use fenced_jobs::job::{Failure, JobState, RecordOutcome};
use fenced_jobs::ledger::JobLedger;
use fenced_jobs::ledger::memory::InMemoryLedger;
use fenced_jobs::provider::{Answer, Provider, ProviderError, ProviderRequest, SimulatedProvider};
use fenced_jobs::worker::Settings;

use super::{event, handler, invocation, job, record};
use crate::support::ARN;

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
        .map(|u| u.model.as_str())
        .collect();
    assert_eq!(
        models,
        ["sim-1", "unpriced-1"],
        "{:?}",
        report.usage_by_model
    );
    assert_eq!(report.usage_by_model[0].usage, sim);
    assert_eq!(report.usage_by_model[1].usage, unpriced);
    assert!(
        report
            .usage_by_model
            .iter()
            .all(|u| u.provider == "simulated")
    );
    let calls: Vec<_> = report
        .by_provider
        .iter()
        .map(|p| (p.provider, p.calls))
        .collect();
    assert_eq!(calls, [("simulated", 3)], "{:?}", report.by_provider);
}
