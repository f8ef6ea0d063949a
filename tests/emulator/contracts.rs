//! Output contracts end to end on the emulator: an answer is accepted only if it is the answer
//! its job's contract asks for, and one that is not is recorded on its attempt.

use std::sync::Arc;
use std::time::Duration;

use fenced_jobs::clock::SystemClock;
use fenced_jobs::job::contract::{Contracts, Finish};
use fenced_jobs::job::{AttemptOutcome, Failure, JobState, RecordOutcome};
use fenced_jobs::provider::SimulatedProvider;
use fenced_jobs::worker::processor::Processor;
use serde_json::{Value, json};

use crate::support::contracts::{built_in, invoice};
use crate::support::{self, deliver, emulator, fast_settings};

/// An extraction job whose simulated model answers `invoice()` except as `bad` says.
fn extraction(id: &str, contract: &str, max_attempts: u32, bad: Value) -> String {
    let mut simulate = json!({"output": invoice()});
    if let (Some(fields), Value::Object(bad)) = (simulate.as_object_mut(), bad) {
        fields.extend(bad);
    }
    json!({
        "job_id": id,
        "contract": contract,
        "max_attempts": max_attempts,
        "input": {"model": "sim-1", "prompt": "Extract the invoice.", "simulate": simulate},
    })
    .to_string()
}

fn processor(
    aws: &support::Emulator,
    table: &str,
    contracts: Contracts,
) -> Processor<fenced_jobs::ledger::dynamodb::DynamoLedger, SimulatedProvider, SystemClock> {
    Processor::new(
        aws.ledger(table),
        SimulatedProvider::new(),
        SystemClock,
        fast_settings(),
    )
    .with_contracts(Arc::new(contracts))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_answer_then_a_valid_one_succeeds_with_two_attempts_and_the_first_ones_errors() {
    // GIVEN an extraction job whose first answer breaks its schema
    let aws = emulator().await;
    let table = aws.table().await;
    let queue = aws.queue(30).await;
    let handler = aws.processor_handler(processor(&aws, &table, built_in(false)));
    let source = aws.source(&queue).await;
    let bad_once = json!({"bad_answer": "invalid", "bad_times": 1});
    let body = extraction("inv-1", "invoice-extract@2", 3, bad_once);
    aws.send(&queue, &body).await;

    // WHEN it is delivered, and delivered again once its backoff has passed
    let (_, first) = deliver(&source, &handler).await;
    let first = first.expect("a batch");
    assert!(
        matches!(
            first.records[0].outcome,
            RecordOutcome::Failed(Failure::Backoff { .. })
        ),
        "{first:?}"
    );
    let record = aws.item(&table, "inv-1").await;
    assert_eq!(record.state, JobState::RetryAuthorized);
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    deliver(&source, &handler).await;

    // THEN the second answer is accepted, stored as JSON, and the first attempt says why it
    // was refused, by path and keyword
    let record = aws.item(&table, "inv-1").await;
    assert_eq!(record.state, JobState::Succeeded);
    assert_eq!(record.attempts, 2);
    assert_eq!(handler.processor().provider().executions_for("inv-1"), 2);
    let [refused, accepted] = &record.attempt_log[..] else {
        panic!("two attempts: {:?}", record.attempt_log);
    };
    assert_eq!(refused.outcome, AttemptOutcome::InvalidOutput);
    assert_eq!(refused.finish, Some(Finish::Stop));
    // The first errors are kept (five), each a path and a keyword.
    assert_eq!(refused.errors.len(), 5, "{:?}", refused.errors);
    assert_eq!(refused.errors[0], "/: required number");
    assert_eq!(refused.excerpt.as_deref(), Some(r#"{"unexpected": true}"#));
    assert_eq!(accepted.outcome, AttemptOutcome::Succeeded);
    assert_eq!(accepted.finish, Some(Finish::Stop));
    // Each attempt records what the provider said it used, the refused one too, in the
    // ledger's one vocabulary.
    let input = fenced_jobs::job::parse_body(Some(&body))
        .expect("a job")
        .input_canonical;
    let input_tokens = (input.len() as u64).div_ceil(4);
    for (attempt, answer) in [(refused, r#"{"unexpected": true}"#.len()), (accepted, 0)] {
        let usage = attempt.usage.expect("usage reported");
        assert!(!usage.estimated);
        assert_eq!(usage.input, input_tokens, "{usage:?}");
        assert!(usage.output > 0, "{usage:?}");
        if answer > 0 {
            assert_eq!(usage.output, (answer as u64).div_ceil(4));
        }
        // Priced at the built-in table's sim-1 prices: $1 a million in, $4 out.
        assert_eq!(usage.cost_micros, Some(usage.input + 4 * usage.output));
    }
    let result: Value = serde_json::from_str(record.result.as_deref().expect("inline result"))
        .expect("the result is JSON");
    assert_eq!(result["output"], invoice(), "the output is stored parsed");
    assert!(aws.peek(&queue.url, 0).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_truncated_json_answer_never_succeeds_and_the_last_one_fails_the_job() {
    // GIVEN an extraction job whose every answer is cut off by the token limit
    let aws = emulator().await;
    let table = aws.table().await;
    let queue = aws.queue(30).await;
    let handler = aws.processor_handler(processor(&aws, &table, built_in(false)));
    let source = aws.source(&queue).await;
    let truncated = json!({"bad_answer": "truncated"});
    aws.send(
        &queue,
        &extraction("inv-2", "invoice-extract@2", 2, truncated),
    )
    .await;

    // WHEN it is delivered until its budget is spent
    deliver(&source, &handler).await;
    assert_eq!(
        aws.item(&table, "inv-2").await.state,
        JobState::RetryAuthorized
    );
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let (_, last) = deliver(&source, &handler).await;

    // THEN no truncated answer was accepted: the job fails for its output, both attempts
    // recorded with the finish reason, and its record is acknowledged
    let record = aws.item(&table, "inv-2").await;
    assert_eq!(record.state, JobState::FailedTerminal);
    assert_eq!(record.result, None);
    assert_eq!(
        record.last_error.as_ref().map(|e| e.kind.as_str()),
        Some("invalid_output")
    );
    for attempt in &record.attempt_log {
        assert_eq!(attempt.outcome, AttemptOutcome::InvalidOutput);
        assert_eq!(attempt.finish, Some(Finish::Length));
        assert_eq!(attempt.errors, ["the answer is cut off: finish length"]);
    }
    assert_eq!(record.attempt_log.len(), 2);
    assert_eq!(
        last.expect("a batch").records[0].outcome,
        RecordOutcome::Done(JobState::FailedTerminal)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_contract_that_fails_at_once_spends_one_attempt_and_a_strict_registry_refuses_unknown_contracts()
 {
    // GIVEN a contract whose invalid answers fail the job at once, in a strict registry
    let aws = emulator().await;
    let table = aws.table().await;
    let queue = aws.queue(30).await;
    let strict = Contracts::compile(
        [(
            "verdict@1",
            r#"{"schema": {"type": "object", "required": ["pass"]}, "on_invalid": "fail"}"#,
        )],
        true,
    )
    .expect("compiles");
    let handler = aws.processor_handler(processor(&aws, &table, strict));
    let source = aws.source(&queue).await;
    let invalid = json!({"bad_answer": "invalid"});
    aws.send(&queue, &extraction("v-1", "verdict@1", 3, invalid))
        .await;
    aws.send(&queue, &extraction("s-1", "summary.v1", 3, json!({})))
        .await;

    // WHEN both are delivered
    let (_, report) = deliver(&source, &handler).await;

    // THEN the first fails with one attempt, and the second is poison, never in the ledger
    let record = aws.item(&table, "v-1").await;
    assert_eq!(record.state, JobState::FailedTerminal);
    assert_eq!(record.attempts, 1);
    let records = report.expect("a batch").records;
    let poison = records.iter().find(|r| r.job_id.as_deref() == Some("s-1"));
    assert!(
        poison.is_some_and(|r| matches!(r.outcome, RecordOutcome::Failed(Failure::Poison(_)))),
        "{records:?}"
    );
    assert_eq!(aws.item_count(&table).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_stops_at_its_spend_limit_before_a_call_that_would_pass_it() {
    // GIVEN an extraction job whose first answer breaks its schema, with an answer ceiling of
    // 1,000 tokens and a spend limit that holds one call at the most it can cost (its input at
    // four bytes a token and 1,000 tokens out, at sim-1's $1 and $4 a million) and 30
    // micro-dollars more: less than the first call will have cost
    let aws = emulator().await;
    let table = aws.table().await;
    let queue = aws.queue(30).await;
    let handler = aws.processor_handler(processor(&aws, &table, built_in(false)));
    let source = aws.source(&queue).await;
    let body = |max_cost: f64| {
        let mut job: Value = serde_json::from_str(&extraction(
            "capped-1",
            "invoice-extract@2",
            3,
            json!({"bad_answer": "invalid", "bad_times": 1}),
        ))
        .expect("json");
        job["input"]["parameters"] = json!({"max_tokens": 1_000});
        job["max_cost"] = json!(max_cost);
        job.to_string()
    };
    let input = fenced_jobs::job::parse_body(Some(&body(1.0)))
        .expect("valid")
        .input_canonical;
    let most = (input.len() as u64).div_ceil(4) + 4 * 1_000;
    aws.send(&queue, &body((most + 30) as f64 / 1_000_000.0))
        .await;

    // WHEN it is delivered, and delivered again once its backoff has passed
    deliver(&source, &handler).await;
    let record = aws.item(&table, "capped-1").await;
    assert_eq!(record.state, JobState::RetryAuthorized);
    let spent = record
        .usage()
        .and_then(|u| u.cost_micros)
        .expect("the first call priced");
    assert!(spent > 30, "{spent}");
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    deliver(&source, &handler).await;

    // THEN the second call is never made: the job ends failed for its spend, with one call
    let record = aws.item(&table, "capped-1").await;
    assert_eq!(record.state, JobState::FailedTerminal);
    assert_eq!(record.attempts, 1);
    assert_eq!(handler.processor().provider().executions_for("capped-1"), 1);
    let error = record.last_error.expect("why");
    assert_eq!(error.kind, "spend");
    assert_eq!(record.max_cost_micros, Some(most + 30));
    assert!(aws.peek(&queue.url, 0).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_attempt_that_heard_an_answer_records_what_it_used() {
    // GIVEN a worker without a results bucket, and a job whose answer no item can hold
    let aws = emulator().await;
    let table = aws.table().await;
    let queue = aws.queue(30).await;
    let handler = aws.processor_handler(processor(&aws, &table, built_in(false)));
    let source = aws.source(&queue).await;
    let body = json!({
        "job_id": "huge-1",
        "contract": "summary.v1",
        "input": {"model": "sim-1", "prompt": "Write it all.", "simulate": {"answer_bytes": 450_000}},
    });
    aws.send(&queue, &body.to_string()).await;

    // WHEN it is delivered
    deliver(&source, &handler).await;

    // THEN the job fails for good, and its attempt records what the call used and cost: the
    // answer was heard and paid for, though it could not be kept
    let record = aws.item(&table, "huge-1").await;
    assert_eq!(record.state, JobState::FailedTerminal);
    assert_eq!(
        record.last_error.as_ref().map(|e| e.kind.as_str()),
        Some("too_large")
    );
    let usage = record.attempt_log[0].usage.expect("usage recorded");
    assert!(!usage.estimated);
    assert!(usage.output > 450_000 / 4, "{usage:?}");
    assert_eq!(usage.cost_micros, Some(usage.input + 4 * usage.output));
}
