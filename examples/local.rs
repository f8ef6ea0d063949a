//! The worker and the dispatcher running continuously against the local emulator, so that jobs
//! submitted with `jobctl submit` (in another terminal) are processed and their completion
//! events printed as they come. Stop it with Ctrl-C.
//!
//! Run it with `make local` (which starts the emulator, creates the resources and writes their
//! settings to `.emulator/local.env` for `jobctl`).

use std::sync::Arc;
use std::time::Duration;

use fenced_jobs::blobs::s3::S3Blobs;
use fenced_jobs::clock::SystemClock;
use fenced_jobs::config::s3_client;
use fenced_jobs::events::{CompletionEvent, EventSink, Target};
use fenced_jobs::job::contract::Contracts;
use fenced_jobs::ledger::dynamodb::DynamoLedger;
use fenced_jobs::ops::dispatch::dispatch;
use fenced_jobs::provider::SimulatedProvider;
use fenced_jobs::queue::{SqsDeadLetters, SqsVisibility};
use fenced_jobs::testing::event_source::LocalEventSource;
use fenced_jobs::testing::stream_source::LocalStreamSource;
use fenced_jobs::worker::Settings;
use fenced_jobs::worker::handler::BatchHandler;
use fenced_jobs::worker::processor::Processor;

/// Prints each completion event as the dispatcher would publish it.
struct Printed;

impl EventSink for Printed {
    fn target(&self) -> Target {
        Target::Sqs
    }

    async fn send(&self, events: &[CompletionEvent]) -> Result<(), (usize, String)> {
        for e in events {
            let d = &e.detail;
            let answer = match (d.get("result_ref"), d.get("result"), d.get("error")) {
                (Some(r), _, _) => {
                    format!("stored ({} bytes): jobctl result {}", r["size"], e.job_id)
                }
                (_, Some(_), _) => format!("inline: jobctl result {}", e.job_id),
                (_, _, Some(err)) => format!("{}: {}", err["kind"], err["message"]),
                _ => String::new(),
            };
            println!("event  {:<24} {:<16} {answer}", e.job_id, e.state.as_str());
        }
        Ok(())
    }
}

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        eprintln!("{name} is not set: run `make local`");
        std::process::exit(2)
    })
}

#[tokio::main]
async fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let endpoint = env("AWS_ENDPOINT_URL");
    if !endpoint.starts_with("http://127.0.0.1:") {
        eprintln!("`make local` only runs against the local emulator, not {endpoint}");
        std::process::exit(2);
    }
    let (table, queue_url, dlq_url, bucket) = (
        env("JOBS_TABLE"),
        env("QUEUE_URL"),
        env("DLQ_URL"),
        env("RESULTS_BUCKET"),
    );
    let aws = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
    let ddb = aws_sdk_dynamodb::Client::new(&aws);
    let sqs = aws_sdk_sqs::Client::new(&aws);
    let mut settings = Settings::default();
    settings.visibility.backoff_base_s = 1;
    settings.visibility.backoff_cap_s = 5;
    let handler = BatchHandler::new(
        Processor::new(
            DynamoLedger::new(ddb.clone(), &table),
            SimulatedProvider::new(),
            SystemClock,
            settings,
        )
        .with_blobs(Arc::new(S3Blobs::new(s3_client(&aws), Some(bucket))))
        .with_contracts(Arc::new(
            Contracts::with_built_in(&[], true).unwrap_or_else(|e| panic!("contracts: {e}")),
        )),
        SqsVisibility::new(sqs.clone()),
    )
    .with_dead_letters(Arc::new(SqsDeadLetters::new(sqs.clone(), dlq_url)));
    let mut source = LocalEventSource::connect(sqs, &queue_url)
        .await
        .unwrap_or_else(|e| {
            eprintln!("cannot reach the queue: {e}");
            std::process::exit(1)
        });
    source.wait_seconds = 1;
    let streams = aws_sdk_dynamodbstreams::Client::new(&aws);
    let mut stream = LocalStreamSource::connect(&ddb, streams, &table)
        .await
        .unwrap_or_else(|e| panic!("stream: {e}"));
    println!("worker and dispatcher running on {queue_url}; Ctrl-C stops them");
    loop {
        let poll = source
            .poll_once(|event, inv| handler.handle(event, inv))
            .await
            .unwrap_or_else(|e| panic!("poll: {e}"));
        if poll.received > 0 {
            println!(
                "batch  {} record(s): {} acknowledged, {} to come back",
                poll.received,
                poll.deleted,
                poll.received - poll.deleted
            );
        }
        let sink = &Printed;
        stream
            .poll_once(|e| async move { dispatch(&e, sink).await.response() })
            .await
            .unwrap_or_else(|e| panic!("stream poll: {e}"));
        if poll.received == 0 {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}
