//! Deferrable jobs through OpenAI's Batch API on the emulator: fifty jobs go as one batch and
//! each is paid once at batch prices, a worker stopped after the submit finds its batch by
//! listing, and a failed line is retried in a later batch.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fenced_jobs::job::{Failure, JobState, RecordOutcome};
use fenced_jobs::provider::openai::OpenAiSettings;
use fenced_jobs::provider::{AnyProvider, Provider};
use serde_json::json;

use crate::support::http::{HttpStub, Reply};
use crate::support::providers::openai_settings;
use crate::support::{deliver, emulator, slow_settings};

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
            // OpenAI's request counts: the lines of its input file, all answered once it is done.
            let total = batches[n]
                .strip_prefix("file-")
                .and_then(|f| files.get(f.parse::<usize>().ok()? - 1))
                .map_or(0, |text| text.lines().count());
            json!({"id": format!("batch_{}", n + 1), "status": if done { "completed" } else { "in_progress" },
                   "input_file_id": batches[n], "output_file_id": format!("out-{}", n + 1),
                   "created_at": fenced_jobs::clock::Clock::now_ms(&fenced_jobs::clock::SystemClock) / 1000,
                   "metadata": {"source": "fenced-jobs"},
                   "request_counts": {"total": total, "completed": if done { total } else { 0 }, "failed": 0}})
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_look_at_a_running_batch_leaves_its_request_counts_for_jobctl_watch() {
    // GIVEN two deferrable jobs in a batch that runs for a minute
    let aws = emulator().await;
    let table = aws.table().await;
    let queue = aws.queue_with_receives(2, 300).await;
    let server = batch_server(Duration::from_secs(60)).await;
    let handler = aws.handler(&table, openai_batches(&server.url), batch_settings());
    let mut source = aws.source(&queue).await;
    source.batch_size = 10;
    source.function_timeout_ms = 10_000;
    aws.send(&queue, &deferrable("counted", "counted work"))
        .await;
    aws.send(&queue, &deferrable("other", "other work")).await;

    // WHEN its jobs are delivered until one of them has looked at the running batch
    let started = Instant::now();
    let mut looked = false;
    while !looked && started.elapsed() < Duration::from_secs(30) {
        let (poll, _) = deliver(&source, &handler).await;
        if poll.received == 0 {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        looked = server.count("GET", "/v1/batches/batch_1") > 0;
    }
    assert!(looked, "a redelivery looked at the batch");

    // THEN the look noted the provider's counts on the batch's own item, not on the jobs'
    let item = aws.item(&table, "counted").await;
    assert_eq!(item.state, JobState::Running);
    assert_eq!(item.call_progress, None, "a look writes nothing to the job");
    let noted = aws
        .ledger(&table)
        .batch_counts("batch_1")
        .await
        .expect("read")
        .map(|(counts, _)| counts);
    assert_eq!(
        noted,
        Some(fenced_jobs::job::BatchCounts {
            total: 2,
            completed: 0,
            failed: 0
        })
    );
    // AND jobctl watch shows them while the job runs
    let watched = crate::support::jobctl(
        &[
            "watch",
            "counted",
            "--timeout",
            "1",
            "--output",
            "json",
            "--table",
            &table,
        ],
        &[],
    );
    assert_eq!(watched.code, 5, "still running: {}", watched.err);
    let line: serde_json::Value =
        serde_json::from_str(watched.out.lines().next().unwrap_or_default()).expect("json");
    assert_eq!(
        line["batch"],
        json!({"total": 2, "completed": 0, "failed": 0}),
        "{line}"
    );
    let text = crate::support::jobctl(
        &["watch", "counted", "--timeout", "1", "--table", &table],
        &[],
    );
    assert!(
        text.out.contains("batch 0 of 2 done, 0 failed"),
        "{}",
        text.out
    );
}
