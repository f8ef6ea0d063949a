//! Real-provider paths on the emulator: a background call that outlasts its Lambda invocations
//! (submit, record the reference, poll, hand over, resume polling on the next delivery), and
//! API keys read from Secrets Manager and SSM.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::http::{HttpStub, Reply};
use common::{deliver, emulator, slow_settings};
use fenced_jobs::job::{Failure, JobState, RecordOutcome};
use fenced_jobs::ledger::JobLedger;
use fenced_jobs::provider::openai::{OpenAiApi, OpenAiSettings};
use fenced_jobs::provider::{AnyProvider, Provider};
use fenced_jobs::provider::{KeySource, ProviderConfig};
use serde_json::json;

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

fn openai_settings(url: &str) -> OpenAiSettings {
    OpenAiSettings {
        base_url: format!("{url}/v1"),
        api: OpenAiApi::Responses,
        connect_timeout_ms: 1_000,
        request_timeout_ms: 2_000,
        ..OpenAiSettings::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_background_call_outlasts_several_invocations_and_is_collected_once() {
    // GIVEN invocations that may run 2.5 s (0.5 s kept for the end) and a call that takes 8 s
    let aws = emulator().await;
    let table = aws.table().await;
    let queue = aws.queue(2).await;
    let server = long_running_server(Duration::from_secs(8)).await;
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
    aws.send(&queue, &common::job("long-1", "a long report", ""))
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
    aws.send(&queue, &common::job("long-2", "a longer report", ""))
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_key_is_read_from_secrets_manager_or_ssm_and_sent() {
    let aws = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .region(aws_config::Region::new("us-east-1"))
        .load()
        .await;
    let _ = emulator().await; // asserts the endpoint is local
    let secret_id = common::unique("openai-key");
    aws_sdk_secretsmanager::Client::new(&aws)
        .create_secret()
        .name(&secret_id)
        .secret_string(r#"{"api_key":"sk-from-secrets-manager"}"#)
        .send()
        .await
        .expect("create secret");
    let parameter = format!("/{}", common::unique("openai-key"));
    aws_sdk_ssm::Client::new(&aws)
        .put_parameter()
        .name(&parameter)
        .value("sk-from-ssm")
        .r#type(aws_sdk_ssm::types::ParameterType::SecureString)
        .send()
        .await
        .expect("put parameter");
    let server =
        HttpStub::start(|_, _| Reply::json(200, json!({"id": "resp_k", "status": "queued"}))).await;
    for (key, expected) in [
        (
            KeySource::SecretsManager(secret_id),
            "sk-from-secrets-manager",
        ),
        (KeySource::Parameter(parameter), "sk-from-ssm"),
    ] {
        let config = ProviderConfig::OpenAi {
            settings: openai_settings(&server.url),
            key,
        };
        let provider = AnyProvider::from_config(&config, &aws)
            .await
            .expect("provider");
        let input = json!({"model": "m", "prompt": "p"});
        let input = input.as_object().expect("object");
        let req = fenced_jobs::provider::ProviderRequest {
            job_id: "k",
            attempt: 1,
            epoch: 1,
            contract: "c",
            output: &fenced_jobs::job::contract::Contract::free_text("c"),
            input,
            input_json: "{}",
            max_output_tokens: 0,
            idempotency_key: "k/1".to_owned(),
        };
        provider.submit(&req).await.expect("submitted");
        let last = server.requests().pop().expect("request");
        assert_eq!(
            last.header("authorization"),
            Some(format!("Bearer {expected}").as_str())
        );
    }
    let missing = ProviderConfig::OpenAi {
        settings: openai_settings(&server.url),
        key: KeySource::Parameter("/no/such/parameter".to_owned()),
    };
    let err = AnyProvider::from_config(&missing, &aws)
        .await
        .expect_err("missing parameter");
    assert!(err.0.contains("/no/such/parameter"), "{err}");

    // A secret without the key field is a start-up error, not a run of 401s.
    let keyless = common::unique("openai-key");
    aws_sdk_secretsmanager::Client::new(&aws)
        .create_secret()
        .name(&keyless)
        .secret_string(r#"{"user":"someone"}"#)
        .send()
        .await
        .expect("create secret");
    let config = ProviderConfig::OpenAi {
        settings: openai_settings(&server.url),
        key: KeySource::SecretsManager(keyless.clone()),
    };
    let err = AnyProvider::from_config(&config, &aws)
        .await
        .expect_err("keyless secret");
    assert!(err.0.contains(&keyless), "{err}");
}
