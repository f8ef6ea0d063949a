//! Bad input: each kind gets its documented outcome, and poison and conflicts are
//! dead-lettered with their reason.

use std::sync::Arc;

use fenced_jobs::clock::{Clock, SystemClock};
use fenced_jobs::job::{Failure, JobState, RecordOutcome};
use fenced_jobs::ledger::memory::InMemoryLedger;
use fenced_jobs::provider::SimulatedProvider;
use fenced_jobs::worker::Settings;

use super::{event, handler, invocation, job, record};

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

/// A poison body that leaves no room beside it for the worker's reason (SQS counts a message's
/// attributes with its body against 1 MiB) is dead-lettered as a smaller letter of the worker's
/// own, with the reason, its size and its digest, and acknowledged: never left to the redrive
/// policy, which would move it without the worker's word on it.
#[tokio::test]
async fn a_poison_body_with_no_room_for_the_reason_is_dead_lettered_as_a_smaller_letter() {
    use fenced_jobs::queue::RecordingDeadLetters;
    let letters = Arc::new(RecordingDeadLetters::new());
    let h = handler(
        Arc::new(InMemoryLedger::new()),
        SimulatedProvider::new(),
        Settings::default(),
    )
    .with_dead_letters(letters.clone());
    let body = format!("{{not json {}", "x".repeat(1_048_500));
    let report = h
        .handle_batch(&event(vec![record(Some("big"), &body)]), &invocation())
        .await;
    assert_eq!(report.records[0].outcome.label(), "poison");
    assert!(report.records[0].outcome.is_success(), "acknowledged");
    let sent = letters.sent();
    assert_eq!(sent.len(), 1);
    let said: serde_json::Value = serde_json::from_str(&sent[0].body).expect("our own JSON");
    assert_eq!(said["bytes"], body.len());
    assert_eq!(sent[0].reason, "poison");
    assert!(sent[0].detail.contains("not JSON"), "{}", sent[0].detail);
}
