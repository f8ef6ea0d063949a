//! Real-provider paths on the emulator: a background call that outlasts its Lambda invocations
//! (submit, record the reference, poll, hand over, resume polling on the next delivery), and the
//! fallback to a second provider.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fenced_jobs::job::{Failure, JobState, RecordOutcome};
use fenced_jobs::ledger::JobLedger;
use fenced_jobs::provider::AnyProvider;
use fenced_jobs::provider::openai::{OpenAiApi, OpenAiSettings};
use serde_json::json;

use crate::support::http::{HttpStub, Reply};
use crate::support::providers::openai_settings;
use crate::support::{self, deliver, emulator, slow_settings};

/// A server whose one background call takes `run_for` from its submit.
async fn long_running_server(run_for: Duration) -> HttpStub {
    let submitted = Arc::new(Mutex::new(None::<Instant>));
    HttpStub::start(move |req, _| {
        let mut at = submitted.lock().expect("submitted");
        match (req.method.as_str(), req.path.as_str()) {
            ("POST", "/v1/responses") => {
                *at = Some(Instant::now());
                Reply::json(200, json!({"id": "resp_long", "status": "queued"}))
            }
            ("GET", "/v1/responses/resp_long") if at.is_some_and(|t| t.elapsed() >= run_for) => {
                Reply::json(
                    200,
                    json!({"id": "resp_long", "status": "completed", "output": [{"type": "message",
                           "content": [{"type": "output_text", "text": "The long report."}]}]}),
                )
            }
            ("GET", "/v1/responses/resp_long") => {
                Reply::json(200, json!({"id": "resp_long", "status": "in_progress"}))
            }
            _ => Reply::json(404, json!({})),
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_background_call_outlasts_several_invocations_and_is_collected_once() {
    // GIVEN invocations that may run 2.5 s (0.5 s kept for the end) and a call that takes 12 s
    // (several invocations' worth even when a loaded machine loses one to a slow start)
    let aws = emulator().await;
    let table = aws.table().await;
    let queue = aws.queue(2).await;
    let server = long_running_server(Duration::from_secs(12)).await;
    let mut settings = slow_settings(2, 600, 3_000);
    settings.deadline_margin_ms = 500;
    settings.poll_ms = 250;
    let provider = AnyProvider::OpenAi(
        fenced_jobs::provider::OpenAiProvider::new(openai_settings(&server.url), None)
            .expect("client"),
    );
    let handler = aws.handler(&table, provider, settings);
    let mut source = aws.source(&queue).await;
    source.function_timeout_ms = 2_500;
    source.wait_seconds = 1;
    aws.send(&queue, &support::job("long-1", "a long report", ""))
        .await;

    // WHEN the queue is drained invocation after invocation
    let mut outcomes = Vec::new();
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(30) {
        let (poll, report) = deliver(&source, &handler).await;
        if let Some(report) = report {
            outcomes.extend(report.records.into_iter().map(|r| r.outcome));
        }
        if poll.deleted == 1 {
            break;
        }
    }

    // THEN it was handed from invocation to invocation and collected, with one submit
    assert_eq!(
        outcomes.last(),
        Some(&RecordOutcome::Done(JobState::Succeeded)),
        "{outcomes:?}"
    );
    let handovers = outcomes
        .iter()
        .filter(|o| matches!(o, RecordOutcome::Failed(Failure::Deferred { .. })))
        .count();
    assert!(handovers >= 2, "{outcomes:?}");
    assert_eq!(server.count("POST", "/v1/responses"), 1, "one model call");
    let item = aws
        .ledger(&table)
        .get("long-1")
        .await
        .expect("get")
        .expect("item");
    assert_eq!(item.attempts, 1);
    assert_eq!(
        item.owner_epoch as usize,
        1 + handovers,
        "each resume fenced the last owner"
    );
    assert_eq!(item.recoveries.len(), handovers);
    assert_eq!(
        item.attempt_log[0].provider_ref.as_deref(),
        Some("resp_long")
    );
    assert!(item.result.expect("result").contains("The long report."));
}

/// With the worker dead-lettering poison itself, the redrive policy's `maxReceiveCount` is
/// sized for live jobs: a call that needs more hand-overs than the old count of 5 ends
/// `succeeded` and never visits the DLQ.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_handed_over_more_often_than_five_receives_is_never_dead_lettered() {
    let aws = emulator().await;
    let table = aws.table().await;
    let queue = aws.queue_with_receives(2, 300).await;
    let server = long_running_server(Duration::from_secs(24)).await;
    let mut settings = slow_settings(2, 600, 3_000);
    settings.deadline_margin_ms = 500;
    settings.poll_ms = 250;
    let provider = AnyProvider::OpenAi(
        fenced_jobs::provider::OpenAiProvider::new(openai_settings(&server.url), None)
            .expect("client"),
    );
    let handler = aws
        .handler(&table, provider, settings)
        .with_dead_letters(Arc::new(fenced_jobs::queue::SqsDeadLetters::new(
            aws.sqs.clone(),
            queue.dlq_url.clone(),
        )));
    let mut source = aws.source(&queue).await;
    source.function_timeout_ms = 2_500;
    source.wait_seconds = 1;
    aws.send(&queue, &support::job("long-2", "a longer report", ""))
        .await;

    let mut deliveries = 0;
    let mut last = None;
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(60) {
        let (poll, report) = deliver(&source, &handler).await;
        deliveries += poll.received;
        last = report
            .and_then(|r| r.records.last().map(|r| r.outcome.clone()))
            .or(last);
        if poll.deleted == 1 {
            break;
        }
    }
    assert_eq!(last, Some(RecordOutcome::Done(JobState::Succeeded)));
    assert!(deliveries > 5, "only {deliveries} deliveries");
    assert!(
        aws.peek(&queue.dlq_url, 0).await.is_empty(),
        "nothing dead-lettered"
    );
    assert_eq!(server.count("POST", "/v1/responses"), 1, "one model call");
}

/// Two providers in order: Anthropic, whose server answers `first` to every message, then an
/// OpenAI-compatible server that answers every chat call. The first provider's model name is
/// the job's; the second maps it to its own.
async fn two_providers(
    aws: &support::Emulator,
    table: &str,
    first: Reply,
) -> (
    fenced_jobs::worker::BatchHandler<
        fenced_jobs::ledger::dynamodb::DynamoLedger,
        AnyProvider,
        fenced_jobs::clock::SystemClock,
        fenced_jobs::queue::SqsVisibility,
    >,
    HttpStub,
    HttpStub,
) {
    use fenced_jobs::provider::anthropic::{AnthropicProvider, AnthropicSettings};
    let anthropic = HttpStub::start(move |_, _| first.clone()).await;
    let openai = HttpStub::start(|_, _| {
        Reply::json(
            200,
            json!({"id": "chatcmpl-1", "model": "gpt-test", "choices": [{"index": 0,
                   "finish_reason": "stop", "message": {"role": "assistant",
                   "content": "From the second provider."}}],
                   "usage": {"prompt_tokens": 5, "completion_tokens": 4}}),
        )
    })
    .await;
    let settings = AnthropicSettings {
        base_url: anthropic.url.clone(),
        connect_timeout_ms: 1_000,
        ..AnthropicSettings::default()
    };
    let first = AnyProvider::Anthropic(AnthropicProvider::new(settings, None).expect("client"));
    let second = AnyProvider::OpenAi(
        fenced_jobs::provider::OpenAiProvider::new(
            OpenAiSettings {
                api: OpenAiApi::Chat,
                ..openai_settings(&openai.url)
            },
            None,
        )
        .expect("client"),
    );
    let models =
        fenced_jobs::protocol::routing::ModelMap::parse("OPENAI_MODELS", "claude-test=gpt-test")
            .expect("map");
    let processor = fenced_jobs::worker::Processor::new(
        aws.ledger(table),
        first,
        fenced_jobs::clock::SystemClock,
        support::fast_settings(),
    )
    .with_fallback(second, models);
    (aws.processor_handler(processor), anthropic, openai)
}

/// A job for `claude-test` with a budget of three attempts, due at `deadline` (RFC 3339).
fn claude_job(id: &str, deadline: &str) -> String {
    json!({"job_id": id, "contract": "summary.v1", "max_attempts": 3, "deadline_at": deadline,
           "input": {"model": "claude-test", "prompt": "Summarise this."}})
    .to_string()
}

/// A 529 is Anthropic refusing before any work: the next provider takes the job in the same
/// delivery, as its second attempt of the same budget, under the same deadline, and each
/// attempt names the provider and model it went to. A 500 may have run the model, and so may
/// whatever a gateway answered (Anthropic's body without its headers, a 408): no other
/// provider is asked, and the job waits for a decision.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_before_work_falls_back_to_the_next_provider_and_an_uncertain_one_never_does() {
    let aws = emulator().await;
    let table = aws.table().await;
    let queue = aws.queue(30).await;
    // Anthropic's own word: its error object with the header its API sends with every answer.
    let overloaded = Reply::json(
        529,
        json!({"type": "error", "error": {"type": "overloaded_error", "message": "x"}}),
    )
    .with_header("anthropic-organization-id", "org-test");
    let (handler, anthropic, openai) = two_providers(&aws, &table, overloaded).await;
    let source = aws.source(&queue).await;
    // Whole seconds: the deadline is kept to the millisecond.
    let due = time::OffsetDateTime::now_utc()
        .replace_nanosecond(0)
        .expect("date")
        + time::Duration::hours(1);
    let deadline = due
        .format(&time::format_description::well_known::Rfc3339)
        .expect("date");
    aws.send(&queue, &claude_job("fallback-1", &deadline)).await;

    let (_, report) = deliver(&source, &handler).await;
    let report = report.expect("report");
    // Each provider's call counted under its own name: Anthropic's refused for its load (not a
    // throttle), OpenAI's that answered.
    let providers: Vec<_> = report
        .by_provider
        .iter()
        .map(|p| (p.provider, p.calls, p.throttled))
        .collect();
    assert_eq!(providers, [("anthropic", 1, 0), ("openai", 1, 0)]);
    let outcomes: Vec<_> = report.records.into_iter().map(|r| r.outcome).collect();
    assert_eq!(outcomes, [RecordOutcome::Done(JobState::Succeeded)]);
    assert_eq!(anthropic.count("POST", "/v1/messages"), 1);
    assert_eq!(openai.count("POST", "/v1/chat/completions"), 1);
    assert_eq!(
        openai.requests()[0].json()["model"],
        "gpt-test",
        "the second provider's model for the job's"
    );
    let item = aws
        .ledger(&table)
        .get("fallback-1")
        .await
        .expect("get")
        .expect("item");
    assert_eq!(
        (item.attempts, item.max_attempts),
        (2, 3),
        "one budget for both"
    );
    assert_eq!(
        i128::from(item.deadline_at),
        due.unix_timestamp_nanos() / 1_000_000,
        "the deadline is the job's, kept"
    );
    let routes: Vec<_> = item
        .attempt_log
        .iter()
        .map(|a| {
            let r = a.route.as_ref().expect("route");
            (r.provider.as_str(), r.model.as_str(), a.outcome.as_str())
        })
        .collect();
    assert_eq!(
        routes,
        [
            ("anthropic", "claude-test", "transient"),
            ("openai", "gpt-test", "succeeded")
        ]
    );
    assert!(
        item.result
            .expect("result")
            .contains("From the second provider.")
    );

    // Anthropic's own 500 (it may have run), and a gateway's words: Anthropic's body without
    // its headers, and a 408 after the gateway gave up on its upstream. Each may have run the
    // model: the job waits for a decision, and the second provider is never asked.
    let uncertain = [
        Reply::json(
            500,
            json!({"type": "error", "error": {"type": "api_error", "message": "x"}}),
        )
        .with_header("anthropic-organization-id", "org-test"),
        Reply::json(
            529,
            json!({"type": "error", "error": {"type": "overloaded_error", "message": "x"}}),
        ),
        Reply::json(408, json!({"error": {"message": "Request timed out"}})),
    ];
    for (i, reply) in uncertain.into_iter().enumerate() {
        let id = format!("fallback-uncertain-{i}");
        let (queue, source) = {
            let queue = aws.queue(30).await;
            let source = aws.source(&queue).await;
            (queue, source)
        };
        let (handler, anthropic, openai) = two_providers(&aws, &table, reply.clone()).await;
        aws.send(&queue, &claude_job(&id, &deadline)).await;
        let (_, report) = deliver(&source, &handler).await;
        let outcomes: Vec<_> = report
            .expect("report")
            .records
            .into_iter()
            .map(|r| r.outcome)
            .collect();
        assert_eq!(
            outcomes,
            [RecordOutcome::Failed(Failure::AwaitingDecision)],
            "{reply:?}"
        );
        assert_eq!(anthropic.count("POST", "/v1/messages"), 1);
        assert_eq!(
            openai.requests().len(),
            0,
            "no second call after an uncertain one: {reply:?}"
        );
        let item = aws
            .ledger(&table)
            .get(&id)
            .await
            .expect("get")
            .expect("item");
        assert_eq!(
            (item.state, item.attempts),
            (JobState::Unknown, 1),
            "{reply:?}"
        );
    }
}
