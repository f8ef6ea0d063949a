//! Real-provider paths on the emulator: a background call that outlasts its Lambda invocations
//! (submit, record the reference, poll, hand over, resume polling on the next delivery), API
//! keys read from Secrets Manager and SSM, the fallback to a second provider, and deferrable
//! jobs through OpenAI's Batch API (one batch, recovery by listing, a failed line retried).
//!
//! Why this file is long: each test runs the worker against scripted provider servers and the
//! emulator, and one test binary links once; the batch server alone is a page.

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
            progress: None,
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

/// Two providers in order: Anthropic, whose server answers `first` to every message, then an
/// OpenAI-compatible server that answers every chat call. The first provider's model name is
/// the job's; the second maps it to its own.
async fn two_providers(
    aws: &common::Emulator,
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
        fenced_jobs::worker::routing::ModelMap::parse("OPENAI_MODELS", "claude-test=gpt-test")
            .expect("map");
    let processor = fenced_jobs::worker::Processor::new(
        aws.ledger(table),
        first,
        fenced_jobs::clock::SystemClock,
        common::fast_settings(),
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
/// attempt names the provider and model it went to. A 500 may have run the model: no other
/// provider is asked, and the job waits for a decision.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_before_work_falls_back_to_the_next_provider_and_an_uncertain_one_never_does() {
    let aws = emulator().await;
    let table = aws.table().await;
    let queue = aws.queue(30).await;
    let overloaded = Reply::json(
        529,
        json!({"type": "error", "error": {"type": "overloaded_error", "message": "x"}}),
    );
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
    let outcomes: Vec<_> = report
        .expect("report")
        .records
        .into_iter()
        .map(|r| r.outcome)
        .collect();
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

    // An uncertain 500: the job waits for a decision, and the second provider is never asked.
    let api_error = Reply::json(
        500,
        json!({"type": "error", "error": {"type": "api_error", "message": "x"}}),
    );
    let (handler, anthropic, openai) = two_providers(&aws, &table, api_error).await;
    aws.send(&queue, &claude_job("fallback-2", &deadline)).await;
    let (_, report) = deliver(&source, &handler).await;
    let outcomes: Vec<_> = report
        .expect("report")
        .records
        .into_iter()
        .map(|r| r.outcome)
        .collect();
    assert_eq!(outcomes, [RecordOutcome::Failed(Failure::AwaitingDecision)]);
    assert_eq!(anthropic.count("POST", "/v1/messages"), 1);
    assert_eq!(
        openai.requests().len(),
        0,
        "no second call after an uncertain one"
    );
    let item = aws
        .ledger(&table)
        .get("fallback-2")
        .await
        .expect("get")
        .expect("item");
    assert_eq!((item.state, item.attempts), (JobState::Unknown, 1));
}

/// An OpenAI Batch API server that keeps what it is sent: uploaded files, batches over them
/// (each completes `run_for` after its creation), output files with one line per input line
/// (a Chat Completions answer, or for a line of a first attempt whose prompt says `flaky` a
/// 500 with OpenAI's error object), and the list of batches.
async fn batch_server(run_for: Duration) -> HttpStub {
    let created = Arc::new(Mutex::new(Vec::<Instant>::new()));
    HttpStub::start(move |req, before| {
        let files: Vec<String> = before
            .iter()
            .filter(|r| r.method == "POST" && r.path == "/v1/files")
            .map(|r| {
                let start = r.body.find("application/jsonl\r\n\r\n").map_or(0, |i| i + 21);
                let end = r.body[start..].find("\r\n--batch-").map_or(start, |i| i + start);
                r.body[start..end].to_owned()
            })
            .collect();
        let batches: Vec<String> = before
            .iter()
            .filter(|r| r.method == "POST" && r.path == "/v1/batches")
            .map(|r| r.json()["input_file_id"].as_str().unwrap_or_default().to_owned())
            .collect();
        let mut created = created.lock().expect("created");
        let batch = |n: usize, created: &[Instant]| {
            let done = created.get(n).is_some_and(|t| t.elapsed() >= run_for);
            json!({"id": format!("batch_{}", n + 1), "status": if done { "completed" } else { "in_progress" },
                   "input_file_id": batches[n], "output_file_id": format!("out-{}", n + 1),
                   "created_at": fenced_jobs::clock::Clock::now_ms(&fenced_jobs::clock::SystemClock) / 1000,
                   "metadata": {"source": "fenced-jobs"}})
        };
        let path = req.path.as_str();
        match req.method.as_str() {
            "POST" if path == "/v1/files" => {
                Reply::json(200, json!({"id": format!("file-{}", files.len() + 1)}))
            }
            "POST" if path == "/v1/batches" => {
                created.push(Instant::now());
                Reply::json(200, json!({"id": format!("batch_{}", created.len()), "status": "validating"}))
            }
            "GET" if path.starts_with("/v1/batches?") => {
                let data: Vec<_> = (0..created.len()).rev().map(|n| batch(n, &created)).collect();
                Reply::json(200, json!({"data": data, "has_more": false}))
            }
            "GET" if path.starts_with("/v1/batches/batch_") => {
                let n: usize = path["/v1/batches/batch_".len()..].parse().unwrap_or(0);
                match n.checked_sub(1).filter(|n| *n < created.len()) {
                    Some(n) => Reply::json(200, batch(n, &created)),
                    None => Reply::json(404, json!({"error": {"code": "not_found"}})),
                }
            }
            "GET" if path.starts_with("/v1/files/file-") => {
                let n: usize = path["/v1/files/file-".len()..]
                    .trim_end_matches("/content")
                    .parse()
                    .unwrap_or(0);
                let text = n.checked_sub(1).and_then(|n| files.get(n)).cloned().unwrap_or_default();
                Reply::Json { status: 200, headers: vec![], body: text }
            }
            "GET" if path.starts_with("/v1/files/out-") => {
                let n: usize = path["/v1/files/out-".len()..]
                    .trim_end_matches("/content")
                    .parse()
                    .unwrap_or(0);
                let input = n
                    .checked_sub(1)
                    .and_then(|n| batches.get(n))
                    .and_then(|f| f.strip_prefix("file-")?.parse::<usize>().ok())
                    .and_then(|f| files.get(f - 1))
                    .cloned()
                    .unwrap_or_default();
                let mut out = String::new();
                for line in input.lines() {
                    let line: serde_json::Value = serde_json::from_str(line).unwrap_or_default();
                    let id = line["custom_id"].as_str().unwrap_or_default();
                    let prompt = line["body"]["messages"][0]["content"].as_str().unwrap_or_default();
                    let response = if prompt.contains("flaky") && id.contains("-a1-") {
                        json!({"status_code": 500, "body": {"error": {"code": "server_error"}}})
                    } else {
                        json!({"status_code": 200, "body": {"model": "gpt-test",
                            "choices": [{"message": {"content": format!("Summary of {prompt}")}, "finish_reason": "stop"}],
                            "usage": {"prompt_tokens": 1000, "completion_tokens": 200}}})
                    };
                    out.push_str(&json!({"custom_id": id, "response": response, "error": null}).to_string());
                    out.push('\n');
                }
                Reply::Json { status: 200, headers: vec![], body: out }
            }
            _ => Reply::json(404, json!({"error": {"code": "not_found"}})),
        }
    })
    .await
}

/// Settings for batch runs: a redelivery's look at a running batch a second apart.
fn batch_settings() -> fenced_jobs::worker::Settings {
    let mut settings = slow_settings(2, 600, 3_000);
    settings.deadline_margin_ms = 500;
    settings.max_concurrency = 64;
    settings.batching.poll_ms = 1_000;
    settings.batching.gather_ms = 2_000;
    settings
}

fn openai_batches(url: &str) -> AnyProvider {
    let settings = OpenAiSettings {
        stream: false,
        ..openai_settings(url)
    };
    AnyProvider::OpenAi(fenced_jobs::provider::OpenAiProvider::new(settings, None).expect("client"))
}

/// A deferrable job.
fn deferrable(id: &str, prompt: &str) -> String {
    format!(
        r#"{{"job_id":"{id}","contract":"summary.v1","input":{{"model":"gpt-4o-mini","prompt":"{prompt}","deferrable":true}}}}"#
    )
}

/// Delivers until the queue is empty or `limit` passes; returns the deliveries' outcomes.
async fn drain<P: Provider>(
    source: &fenced_jobs::testing::event_source::LocalEventSource,
    handler: &fenced_jobs::worker::handler::BatchHandler<
        fenced_jobs::ledger::dynamodb::DynamoLedger,
        P,
        fenced_jobs::clock::SystemClock,
        fenced_jobs::queue::SqsVisibility,
    >,
    jobs: usize,
    limit: Duration,
) -> Vec<RecordOutcome> {
    let mut outcomes = Vec::new();
    let mut deleted = 0;
    let started = Instant::now();
    while deleted < jobs && started.elapsed() < limit {
        let (poll, report) = deliver(source, handler).await;
        deleted += poll.deleted;
        if let Some(report) = report {
            outcomes.extend(report.records.into_iter().map(|r| r.outcome));
        }
        if poll.received == 0 {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    outcomes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_deferrable_jobs_go_as_one_batch_and_each_is_paid_once_at_batch_prices() {
    let aws = emulator().await;
    let table = aws.table().await;
    let queue = aws.queue_with_receives(2, 300).await;
    // A batch done by the time anyone looks: the first delivery still hands over.
    let server = batch_server(Duration::ZERO).await;
    let handler = aws.handler(&table, openai_batches(&server.url), batch_settings());
    let mut source = aws.source(&queue).await;
    source.batch_size = 50;
    source.function_timeout_ms = 10_000;
    for i in 0..50 {
        aws.send(
            &queue,
            &deferrable(&format!("night-{i}"), &format!("report {i}")),
        )
        .await;
    }
    let outcomes = drain(&source, &handler, 50, Duration::from_secs(60)).await;
    let first: Vec<_> = outcomes.iter().take(50).collect();
    assert!(
        first
            .iter()
            .all(|o| matches!(o, RecordOutcome::Failed(Failure::Deferred { .. }))),
        "handed over while the batch runs: {first:?}"
    );
    assert_eq!(server.count("POST", "/v1/batches"), 1, "one provider batch");
    assert_eq!(
        server.count("POST", "/v1/chat/completions"),
        0,
        "no direct call"
    );
    let uploaded = server
        .requests()
        .into_iter()
        .find(|r| r.path == "/v1/files")
        .expect("upload");
    assert_eq!(
        uploaded.body.matches("\"custom_id\"").count(),
        50,
        "one paid line each"
    );
    let prices = fenced_jobs::job::prices::PriceTable::built_in();
    for i in 0..50 {
        let item = aws.item(&table, &format!("night-{i}")).await;
        assert_eq!((item.state, item.attempts), (JobState::Succeeded, 1));
        let attempt = &item.attempt_log[0];
        assert!(
            attempt
                .provider_ref
                .as_deref()
                .is_some_and(|r| r.starts_with("batch:batch_1:")),
            "{:?}",
            attempt.provider_ref
        );
        let usage = attempt.usage.expect("usage");
        assert_eq!(
            usage.cost_micros,
            prices.cost_micros("gpt-4o-mini", &usage, true)
        );
        assert!(
            item.result
                .expect("result")
                .contains(&format!("Summary of report {i}"))
        );
    }
}

/// A provider whose first batch is created upstream and whose worker then stops: the
/// submission's answer never reaches the worker (it hangs until the invocation is over).
struct StopsAfterTheSubmit {
    inner: AnyProvider,
    stopped: std::sync::atomic::AtomicBool,
}

impl Provider for StopsAfterTheSubmit {
    async fn call(
        &self,
        req: &fenced_jobs::provider::ProviderRequest<'_>,
    ) -> Result<fenced_jobs::provider::Answer, fenced_jobs::provider::ProviderError> {
        self.inner.call(req).await
    }
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn batches(&self) -> bool {
        true
    }
    fn batch_line(
        &self,
        req: &fenced_jobs::provider::ProviderRequest<'_>,
        line: &str,
    ) -> Result<fenced_jobs::provider::BatchLine, fenced_jobs::provider::ProviderError> {
        self.inner.batch_line(req, line)
    }
    async fn submit_batch(
        &self,
        lines: &[fenced_jobs::provider::BatchLine],
    ) -> Result<String, fenced_jobs::provider::ProviderError> {
        let id = self.inner.submit_batch(lines).await?;
        if !self.stopped.swap(true, std::sync::atomic::Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        Ok(id)
    }
    fn can_retrieve(&self) -> bool {
        self.inner.can_retrieve()
    }
    async fn retrieve(
        &self,
        provider_ref: &str,
        started_at: i64,
        req: &fenced_jobs::provider::ProviderRequest<'_>,
    ) -> fenced_jobs::provider::Retrieval {
        self.inner.retrieve(provider_ref, started_at, req).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_stopped_after_the_submit_finds_its_batch_by_listing_and_sends_nothing_again() {
    let aws = emulator().await;
    let table = aws.table().await;
    let queue = aws.queue_with_receives(2, 300).await;
    let server = batch_server(Duration::from_secs(1)).await;
    let provider = StopsAfterTheSubmit {
        inner: openai_batches(&server.url),
        stopped: false.into(),
    };
    let handler = aws.handler(&table, provider, batch_settings());
    let mut source = aws.source(&queue).await;
    source.batch_size = 10;
    source.function_timeout_ms = 2_500;
    for i in 0..3 {
        aws.send(
            &queue,
            &deferrable(&format!("lost-{i}"), &format!("memo {i}")),
        )
        .await;
    }
    drain(&source, &handler, 3, Duration::from_secs(60)).await;
    assert_eq!(server.count("POST", "/v1/batches"), 1, "no second batch");
    assert!(server.count("GET", "/v1/batches?") >= 1, "found by listing");
    for i in 0..3 {
        let item = aws.item(&table, &format!("lost-{i}")).await;
        assert_eq!((item.state, item.attempts), (JobState::Succeeded, 1));
        assert!(!item.recoveries.is_empty(), "the stopped owner was fenced");
        assert!(
            item.result
                .expect("result")
                .contains(&format!("Summary of memo {i}"))
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_line_is_retried_in_a_later_batch() {
    let aws = emulator().await;
    let table = aws.table().await;
    let queue = aws.queue_with_receives(2, 300).await;
    let server = batch_server(Duration::from_secs(1)).await;
    let handler = aws.handler(&table, openai_batches(&server.url), batch_settings());
    let mut source = aws.source(&queue).await;
    source.batch_size = 10;
    source.function_timeout_ms = 10_000;
    aws.send(&queue, &deferrable("steady", "steady work")).await;
    aws.send(&queue, &deferrable("flaky", "flaky work")).await;
    drain(&source, &handler, 2, Duration::from_secs(60)).await;
    assert_eq!(
        server.count("POST", "/v1/batches"),
        2,
        "the retry went in a later batch"
    );
    let flaky = aws.item(&table, "flaky").await;
    assert_eq!((flaky.state, flaky.attempts), (JobState::Succeeded, 2));
    assert_eq!(
        flaky.attempt_log[0].outcome,
        fenced_jobs::job::AttemptOutcome::Transient
    );
    assert!(
        flaky.attempt_log[1]
            .provider_ref
            .as_deref()
            .is_some_and(|r| r.starts_with("batch:batch_2:"))
    );
    let steady = aws.item(&table, "steady").await;
    assert_eq!((steady.state, steady.attempts), (JobState::Succeeded, 1));
}
