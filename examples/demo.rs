//! The main job, end to end on the local emulator: a mix of jobs goes through the queue, the
//! local event source mapping drives the real handler, a summary shows how each job ended, and
//! the table's stream drives the dispatcher, whose completion events arrive through an
//! EventBridge bus.
//!
//! Run it with `make demo` (which starts the emulator and creates the resources).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fenced_jobs::blobs::s3::S3Blobs;
use fenced_jobs::clock::SystemClock;
use fenced_jobs::config::s3_client;
use fenced_jobs::events::aws::AwsSink;
use fenced_jobs::job::JobState;
use fenced_jobs::job::contract::Contracts;
use fenced_jobs::ledger::JobLedger;
use fenced_jobs::ledger::dynamodb::DynamoLedger;
use fenced_jobs::ops::dispatch::dispatch;
use fenced_jobs::protocol::routing::ModelMap;
use fenced_jobs::provider::SimulatedProvider;
use fenced_jobs::queue::{SqsDeadLetters, SqsVisibility};
use fenced_jobs::testing::event_source::LocalEventSource;
use fenced_jobs::testing::sdk_calls::counted_clients;
use fenced_jobs::testing::stream_source::LocalStreamSource;
use fenced_jobs::worker::Settings;
use fenced_jobs::worker::handler::BatchHandler;
use fenced_jobs::worker::processor::Processor;

/// The Extended Client payload the pointer job names.
const POINTER_KEY: &str = "payloads/demo-pointer.json";

/// (label, job_id, what the demo expects, body); the pointer names `bucket`.
fn jobs(bucket: &str) -> Vec<(&'static str, &'static str, &'static str, String)> {
    let job = |id: &str, prompt: &str, simulate: &str| {
        format!(
            r#"{{"job_id":"{id}","contract":"summary.v1","input":{{"model":"sim-1","messages":[{{"role":"user","content":"{prompt}"}}],"parameters":{{"temperature":0}},"simulate":{simulate}}},"metadata":{{"source":"demo"}}}}"#
        )
    };
    vec![
        (
            "normal",
            "demo-summary",
            "succeeded, 1 call",
            job(
                "demo-summary",
                "Summarise the quarterly report.",
                r#"{"latency_ms":300}"#,
            ),
        ),
        (
            "duplicate delivery (1/2)",
            "demo-extract",
            "succeeded, 1 call",
            job(
                "demo-extract",
                "Extract the parties.",
                r#"{"latency_ms":200}"#,
            ),
        ),
        (
            "duplicate delivery (2/2)",
            "demo-extract",
            "",
            job(
                "demo-extract",
                "Extract the parties.",
                r#"{"latency_ms":200}"#,
            ),
        ),
        (
            "transient, then success",
            "demo-eval",
            "succeeded, 3 calls",
            job("demo-eval", "Grade this answer.", r#"{"fail_times":2}"#),
        ),
        (
            "1st provider overloaded",
            "demo-fallback",
            "succeeded, 2 calls, 2 providers",
            r#"{"job_id":"demo-fallback","contract":"summary.v1","input":{"model":"sim-large","prompt":"Summarise the annual report."},"metadata":{"source":"demo"}}"#.to_owned(),
        ),
        (
            "invoice: invalid, then valid",
            "demo-invoice",
            "succeeded, 2 calls, 1st refused",
            invoice_job(),
        ),
        (
            "deferrable (batch, 1/3)",
            "demo-night-1",
            "succeeded, 1 batch line",
            night("demo-night-1", "Summarise Monday's tickets."),
        ),
        (
            "deferrable (batch, 2/3)",
            "demo-night-2",
            "succeeded, 1 batch line",
            night("demo-night-2", "Summarise Tuesday's tickets."),
        ),
        (
            "deferrable (batch, 3/3)",
            "demo-night-3",
            "succeeded, 1 batch line",
            night("demo-night-3", "Summarise Wednesday's tickets."),
        ),
        (
            "permanent failure",
            "demo-reject",
            "failed_terminal, 1 call",
            job(
                "demo-reject",
                "Unsupported request.",
                r#"{"outcome":"permanent"}"#,
            ),
        ),
        (
            "large answer (stored in S3)",
            "demo-report",
            "succeeded, answer in the bucket",
            job(
                "demo-report",
                "Write the full report.",
                r#"{"answer_bytes":300000}"#,
            ),
        ),
        (
            "Extended Client pointer",
            "demo-pointer",
            "succeeded, body read from S3",
            format!(
                r#"["software.amazon.payloadoffloading.PayloadS3Pointer",{{"s3BucketName":"{bucket}","s3Key":"{POINTER_KEY}"}}]"#
            ),
        ),
        (
            "conflict (same id, new input)",
            "demo-summary",
            "message to the DLQ, job unchanged",
            job("demo-summary", "A different document!", r#"{}"#),
        ),
        (
            "poison (not JSON)",
            "-",
            "message to the DLQ",
            "{this is not json".to_owned(),
        ),
        (
            "poison (bad job_id)",
            "-",
            "message to the DLQ",
            r#"{"job_id":"no spaces allowed","contract":"c","input":{"model":"m","prompt":"p"}}"#
                .to_owned(),
        ),
    ]
}

/// A deferrable summary: it waits for the provider's batch (a simulated batch that ends 1.5 s
/// after it was created) at the batch price.
fn night(id: &str, prompt: &str) -> String {
    format!(
        r#"{{"job_id":"{id}","contract":"summary.v1","input":{{"model":"sim-1","prompt":"{prompt}","deferrable":true,"simulate":{{"latency_ms":1500}}}},"metadata":{{"source":"demo"}}}}"#
    )
}

/// What the ledger says of the deferrable jobs: the batch each line went in, and how often its
/// record came back to look before the batch ended.
fn show_batches(records: &[fenced_jobs::job::JobItem], sizes: &[usize]) {
    println!(
        "Deferrable jobs: {} provider batch(es) of {sizes:?} line(s), at the batch price.",
        sizes.len()
    );
    for r in records {
        let a = r.attempt_log.last();
        println!(
            "{}: {} at attempt {}, its line {}; handed over while the batch ran, its answer read by the delivery that fenced the hand-over ({} recovery).",
            r.job_id,
            r.state,
            r.attempts,
            a.and_then(|a| a.provider_ref.as_deref()).unwrap_or("-"),
            r.recoveries.len(),
        );
    }
}

/// An extraction held to the built-in `invoice-extract@2` contract, whose simulated model
/// first answers with JSON its schema refuses.
fn invoice_job() -> String {
    let party = |name: &str| serde_json::json!({"name": name, "vat_id": null, "address": null, "country": "DE"});
    let invoice = serde_json::json!({
        "number": "INV-2026-0042", "issued": "2026-11-30", "due": "2026-12-30",
        "currency": "EUR", "seller": party("Acme GmbH"), "buyer": party("Globex AG"),
        "purchase_order": "PO-7", "subtotal": 200.0, "tax": 38.0, "total": 238.0,
        "lines": [{"description": "Widgets", "quantity": 4, "unit_price": 50.0,
                   "amount": 200.0, "tax_rate": 0.19, "sku": "W-1"}],
        "paid": false, "payment_terms": "30 days net", "notes": null
    });
    serde_json::json!({
        "job_id": "demo-invoice",
        "contract": "invoice-extract@2",
        "input": {
            "model": "sim-1",
            "prompt": "Extract the invoice's fields.",
            "simulate": {"output": invoice, "bad_answer": "invalid", "bad_times": 1}
        },
        "metadata": {"source": "demo"}
    })
    .to_string()
}

/// Where each attempt of the fallback job went, as its claim recorded it.
fn show_fallback(record: &fenced_jobs::job::JobItem) {
    for a in &record.attempt_log {
        let (provider, model) = a
            .route
            .as_ref()
            .map_or(("-", "-"), |r| (r.provider.as_str(), r.model.as_str()));
        let why = match &record.last_error {
            Some(e) if a.outcome == fenced_jobs::job::AttemptOutcome::Transient => {
                format!(": {}", e.message)
            }
            _ => String::new(),
        };
        println!(
            "demo-fallback, attempt {}: sent to {provider} ({model}), {}{why}",
            a.number,
            a.outcome.as_str()
        );
    }
}

/// What the ledger says of the invoice job: why its first answer was refused, and the
/// accepted answer's total, read from the output stored as JSON.
fn show_invoice(record: &fenced_jobs::job::JobItem) {
    for a in &record.attempt_log {
        if !a.errors.is_empty() {
            println!(
                "demo-invoice, attempt {}: {} (finish {}): {}",
                a.number,
                a.outcome.as_str(),
                a.finish.map_or("-", |f| f.as_str()),
                a.errors.join("; ")
            );
        }
    }
    let total = record
        .result
        .as_deref()
        .and_then(|r| serde_json::from_str::<serde_json::Value>(r).ok())
        .map(|r| r["output"]["total"].clone());
    if let Some(total) = total {
        println!(
            "demo-invoice, attempt {}: accepted; its output is stored as JSON (output.total = {total}).",
            record.attempts
        );
    }
}

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        eprintln!("{name} is not set: run `make demo`");
        std::process::exit(2)
    })
}

#[tokio::main]
async fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("error")),
        )
        .with_writer(std::io::stderr)
        .init();
    let endpoint = env("AWS_ENDPOINT_URL");
    if !endpoint.starts_with("http://127.0.0.1:") {
        eprintln!("the demo only runs against the local emulator, not {endpoint}");
        std::process::exit(2);
    }
    let (table, queue_url, dlq_url) = (env("JOBS_TABLE"), env("QUEUE_URL"), env("DLQ_URL"));
    let (bucket, bus, events_url) = (
        env("RESULTS_BUCKET"),
        env("EVENT_BUS_NAME"),
        env("EVENTS_QUEUE_URL"),
    );

    let aws = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
    let (ddb, sqs, calls) = counted_clients(&aws);
    // The demo's producer offloads its large body to the results bucket, under payloads/.
    let mut settings = Settings {
        payload_bucket: Some(bucket.clone()),
        ..Settings::default()
    };
    settings.visibility.backoff_base_s = 1;
    settings.visibility.backoff_cap_s = 2;
    // A deferrable job's record looks at its batch again a second after each look.
    settings.batching.poll_ms = 1_000;
    let ledger = DynamoLedger::new(ddb.clone(), &table);
    let s3 = s3_client(&aws);
    // Two providers in order: the first is overloaded for `sim-large` (it answers 529, as
    // Anthropic does), so a job for that model goes to the second, which runs it as `sim-1`.
    let backup = ModelMap::parse("SIMULATED_MODELS", "sim-large=sim-1").expect("model map");
    let handler = BatchHandler::new(
        Processor::new(
            ledger.clone(),
            SimulatedProvider::new()
                .overloaded_for("sim-large")
                .with_batches(),
            SystemClock,
            settings,
        )
        .with_fallback(SimulatedProvider::new().named("simulated-backup"), backup)
        .with_blobs(Arc::new(S3Blobs::new(s3.clone(), Some(bucket.clone()))))
        // The contracts built in from `contracts/`, as the worker loads them.
        .with_contracts(Arc::new(
            Contracts::with_built_in(&[], true).unwrap_or_else(|e| panic!("contracts: {e}")),
        )),
        SqsVisibility::new(sqs.clone()),
    )
    .with_dead_letters(Arc::new(SqsDeadLetters::new(sqs.clone(), dlq_url.clone())));
    let mut source = LocalEventSource::connect(sqs.clone(), &queue_url)
        .await
        .unwrap_or_else(|e| {
            eprintln!("cannot reach the queue: {e}");
            std::process::exit(1)
        });
    source.wait_seconds = 1;
    // Every message in one invocation, as an event source mapping with a batching window
    // would give them: the deferrable jobs go as one batch.
    source.batch_size = 20;

    // The producer's Extended Client put this body in the bucket and sent a pointer to it.
    let payload = r#"{"job_id":"demo-pointer","contract":"summary.v1","input":{"model":"sim-1","prompt":"A long contract, offloaded to S3."},"metadata":{"source":"demo"}}"#;
    s3.put_object()
        .bucket(&bucket)
        .key(POINTER_KEY)
        .body(payload.as_bytes().to_vec().into())
        .send()
        .await
        .unwrap_or_else(|e| panic!("put payload: {e}"));
    println!("Sending {} messages to {}", jobs(&bucket).len(), queue_url);
    for (label, _, _, body) in jobs(&bucket) {
        sqs.send_message()
            .queue_url(&queue_url)
            .message_body(body)
            .send()
            .await
            .unwrap_or_else(|e| panic!("send {label}: {e}"));
    }

    let started = Instant::now();
    let (mut batches, mut deleted, mut failed) = (0, 0, 0);
    loop {
        let poll = source
            .poll_once(|event, inv| handler.handle(event, inv))
            .await
            .unwrap_or_else(|e| panic!("poll: {e}"));
        if poll.received > 0 {
            batches += 1;
            deleted += poll.deleted;
            failed += poll.failed;
        }
        let (visible, in_flight) = source.depth().await.unwrap_or((1, 1));
        if visible == 0 && in_flight == 0 {
            break;
        }
        if started.elapsed() > Duration::from_secs(120) {
            println!("(stopping after 120 s with {visible} visible and {in_flight} in flight)");
            break;
        }
    }
    println!(
        "Queue drained in {:.1} s: {batches} batches, {deleted} records acknowledged, {failed} failures reported (and retried or sent to the DLQ).\n",
        started.elapsed().as_secs_f64()
    );

    let providers: Vec<_> = handler.processor().providers().collect();
    let calls_for =
        |job_id: &str| -> u32 { providers.iter().map(|p| p.executions_for(job_id)).sum() };
    println!(
        "{:<31} {:<14} {:<16} {:>8} {:>6} {:>6}  expected",
        "message", "job_id", "final state", "attempts", "epoch", "calls"
    );
    let mut shown = BTreeMap::new();
    for (label, job_id, expected, _) in jobs(&bucket) {
        let (state, attempts, epoch) = if job_id == "-" {
            ("(not a job)".to_owned(), String::new(), String::new())
        } else {
            match ledger.get(job_id).await {
                Ok(Some(r)) => (
                    r.state.to_string(),
                    r.attempts.to_string(),
                    r.owner_epoch.to_string(),
                ),
                Ok(None) => ("(absent)".to_owned(), String::new(), String::new()),
                Err(e) => (format!("error: {e}"), String::new(), String::new()),
            }
        };
        let calls = if job_id == "-" {
            String::new()
        } else {
            calls_for(job_id).to_string()
        };
        println!(
            "{label:<31} {job_id:<14} {state:<16} {attempts:>8} {epoch:>6} {calls:>6}  {expected}"
        );
        if job_id != "-" {
            shown.insert(job_id, state);
        }
    }

    if let Ok(Some(fallback)) = ledger.get("demo-fallback").await {
        println!();
        show_fallback(&fallback);
    }
    if let Ok(Some(invoice)) = ledger.get("demo-invoice").await {
        println!();
        show_invoice(&invoice);
    }
    let mut nights = Vec::new();
    for id in ["demo-night-1", "demo-night-2", "demo-night-3"] {
        if let Ok(Some(r)) = ledger.get(id).await {
            nights.push(r);
        }
    }
    println!();
    show_batches(&nights, &handler.processor().provider().batch_sizes());

    let dead = sqs
        .get_queue_attributes()
        .queue_url(&dlq_url)
        .attribute_names(aws_sdk_sqs::types::QueueAttributeName::ApproximateNumberOfMessages)
        .send()
        .await
        .ok()
        .and_then(|o| o.attributes().and_then(|a| a.values().next().cloned()))
        .unwrap_or_else(|| "?".to_owned());
    println!(
        "\nDead-letter queue: {dead} messages (the conflict and the two poison messages, sent there by the worker after one receive, with their reason)."
    );
    let executions: u64 = providers.iter().map(|p| p.executions()).sum();
    println!("Provider calls: {executions} in all.");
    let counts = calls.counts();
    let line = |service: &str| {
        counts
            .iter()
            .filter(|(k, _)| k.starts_with(service))
            .map(|(k, v)| format!("{} {v}", &k[service.len() + 1..]))
            .collect::<Vec<_>>()
            .join(", ")
    };
    println!(
        "DynamoDB requests: {} ({}).",
        calls.total("dynamodb"),
        line("dynamodb")
    );
    println!("SQS requests: {} ({}).", calls.total("sqs"), line("sqs"));

    show_events(&aws, &table, &bus, &events_url).await;
    // What `jobctl result demo-report` does: the answer from the bucket, checked against the
    // size and digest its acceptance recorded.
    let blobs = S3Blobs::new(s3.clone(), Some(bucket.clone()));
    match fenced_jobs::ops::results::result(&ledger, Some(&blobs), "demo-report").await {
        Ok(bytes) => println!(
            "\n`jobctl result demo-report`: {} bytes read back from the bucket, size and SHA-256 as accepted.",
            bytes.len()
        ),
        Err(e) => println!("\n`jobctl result demo-report` failed: {e}"),
    }

    let all_terminal = shown
        .values()
        .all(|s| s.parse::<JobState>().is_ok_and(JobState::is_terminal));
    if !all_terminal {
        eprintln!("some jobs did not reach a terminal state");
        std::process::exit(1);
    }
}

/// Drives the dispatcher from the table's stream, as Lambda would, and prints the completion
/// events that arrive through the bus (a rule sends them to a queue).
async fn show_events(aws: &aws_config::SdkConfig, table: &str, bus: &str, events_url: &str) {
    let ddb = aws_sdk_dynamodb::Client::new(aws);
    let streams = aws_sdk_dynamodbstreams::Client::new(aws);
    let mut stream = LocalStreamSource::connect(&ddb, streams, table)
        .await
        .unwrap_or_else(|e| panic!("stream: {e}"));
    let sink = AwsSink::EventBridge {
        client: aws_sdk_eventbridge::Client::new(aws),
        bus: bus.to_owned(),
    };
    let sink = &sink;
    let (delivered, _) = stream
        .poll_once(|e| async move { dispatch(&e, sink).await.response() })
        .await
        .unwrap_or_else(|e| panic!("stream poll: {e}"));
    let sqs = aws_sdk_sqs::Client::new(aws);
    let mut events = Vec::new();
    loop {
        let received = sqs
            .receive_message()
            .queue_url(events_url)
            .max_number_of_messages(10)
            .wait_time_seconds(1)
            .send()
            .await
            .unwrap_or_else(|e| panic!("receive events: {e}"));
        if received.messages().is_empty() {
            break;
        }
        for m in received.messages() {
            let envelope: serde_json::Value =
                serde_json::from_str(m.body().unwrap_or("{}")).unwrap_or_default();
            events.push(envelope);
            let _ = sqs
                .delete_message()
                .queue_url(events_url)
                .set_receipt_handle(m.receipt_handle().map(str::to_owned))
                .send()
                .await;
        }
    }
    println!(
        "\nCompletion events: {} stream records read, {} events on the bus (one per job that ended):",
        delivered.records.len(),
        events.len()
    );
    println!(
        "{:<14} {:<16} {:<17} {:<34} answer",
        "job_id", "state", "detail-type", "event id"
    );
    for e in &events {
        let d = &e["detail"];
        let answer = if let Some(r) = d.get("result_ref") {
            format!(
                "s3://{}/{} ({} bytes)",
                r["bucket"].as_str().unwrap_or(""),
                r["key"].as_str().unwrap_or(""),
                r["size"]
            )
        } else if let Some(r) = d.get("result") {
            format!("inline ({} bytes)", r.to_string().len())
        } else {
            d["error"]["kind"]
                .as_str()
                .map_or_else(String::new, |k| format!("error: {k}"))
        };
        println!(
            "{:<14} {:<16} {:<17} {:<34} {answer}",
            d["job_id"].as_str().unwrap_or(""),
            d["state"].as_str().unwrap_or(""),
            e["detail-type"].as_str().unwrap_or(""),
            d["event_id"].as_str().unwrap_or(""),
        );
    }
}
