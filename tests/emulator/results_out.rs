//! Results out, on the emulator: a job whose input arrives through an Extended Client pointer
//! and whose answer (1 MB) is stored in S3, announced by exactly one completion event through the
//! table's stream, the dispatcher and an EventBridge bus, and read back with `jobctl result`;
//! a refused acceptance leaves no reference and no object; a redelivered stream record yields
//! the same event.
//!
//! Why this file is long: each story needs its own emulator resources and stages (a bucket, a
//! bus with its queue, proxies that order two owners), and they share the helpers above.

use std::sync::Arc;
use std::time::Duration;

use aws_lambda_events::sqs::{SqsEvent, SqsMessage};
use aws_sdk_eventbridge::types::Target;
use fenced_jobs::blobs::s3::S3Blobs;
use fenced_jobs::clock::Clock;
use fenced_jobs::clock::SystemClock;
use fenced_jobs::config::SdkTimeouts;
use fenced_jobs::events::aws::AwsSink;
use fenced_jobs::job::JobState;
use fenced_jobs::job::artifact::sha256_hex;
use fenced_jobs::ops::dispatch::{StreamEvent, dispatch};
use fenced_jobs::provider::{Provider, SimulatedProvider};
use fenced_jobs::queue::SqsVisibility;
use fenced_jobs::testing::stream_source::LocalStreamSource;
use fenced_jobs::worker::handler::BatchHandler;
use fenced_jobs::worker::processor::Invocation;
use fenced_jobs::worker::processor::Processor;
use serde_json::{Value, json};

use crate::support::http::{Flag, HttpStub, Reply, Request};
use crate::support::{
    self, Emulator, Queue, TakenOverDuringTheCall, deliver, emulator, fast_settings, job,
};

pub(crate) type Worker<P> =
    BatchHandler<fenced_jobs::ledger::dynamodb::DynamoLedger, P, SystemClock, SqsVisibility>;

/// A worker on `table` that stores large answers in `bucket`.
fn worker<P: Provider>(aws: &Emulator, table: &str, bucket: &str, provider: P) -> Worker<P> {
    worker_with(aws, table, bucket, provider, fast_settings())
}

/// [`worker`] with `settings`.
pub(crate) fn worker_with<P: Provider>(
    aws: &Emulator,
    table: &str,
    bucket: &str,
    provider: P,
    settings: fenced_jobs::worker::Settings,
) -> Worker<P> {
    let blobs = S3Blobs::new(aws.s3.clone(), Some(bucket.to_owned()));
    BatchHandler::new(
        Processor::new(aws.ledger(table), provider, SystemClock, settings)
            .with_blobs(Arc::new(blobs)),
        SqsVisibility::new(aws.sqs.clone()),
    )
    .with_seed(7)
}

/// An EventBridge bus whose rule sends every event of ours to a new queue.
async fn bus_to_queue(aws: &Emulator) -> (String, Queue) {
    let queue = aws.queue(30).await;
    let bus = support::unique("bus");
    aws.events
        .create_event_bus()
        .name(&bus)
        .send()
        .await
        .expect("bus");
    aws.events
        .put_rule()
        .name("completions")
        .event_bus_name(&bus)
        .event_pattern(r#"{"source":["fenced-jobs"]}"#)
        .send()
        .await
        .expect("rule");
    aws.events
        .put_targets()
        .rule("completions")
        .event_bus_name(&bus)
        .targets(
            Target::builder()
                .id("queue")
                .arn(&queue.arn)
                .build()
                .expect("target"),
        )
        .send()
        .await
        .expect("targets");
    (bus, queue)
}

/// Every event that reached `queue`, as the `detail` documents, in order.
async fn received(aws: &Emulator, queue: &Queue) -> Vec<Value> {
    let mut details = Vec::new();
    loop {
        let messages = aws.peek(&queue.url, 1).await;
        if messages.is_empty() {
            return details;
        }
        for m in &messages {
            let envelope: Value = serde_json::from_str(m.body().expect("body")).expect("json");
            assert_eq!(envelope["source"], "fenced-jobs");
            details.push(envelope["detail"].clone());
            aws.sqs
                .delete_message()
                .queue_url(&queue.url)
                .receipt_handle(m.receipt_handle().expect("handle"))
                .send()
                .await
                .expect("delete");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pointer_job_with_a_1_mb_answer_is_announced_once_and_read_back_with_jobctl() {
    let aws = emulator().await;
    let table = aws.table().await;
    let queue = aws.queue(30).await;
    let results = aws.bucket().await;
    let producer_bucket = aws.bucket().await;
    let (bus, events) = bus_to_queue(&aws).await;

    // The producer's Extended Client put the body in its bucket and sent a pointer.
    let body = json!({
        "job_id": "big-1",
        "contract": "summary.v1",
        "input": {"model": "sim-1", "prompt": "secret prompt text", "simulate": {"answer_bytes": 1_000_000}},
        "metadata": {"order": "o-17"},
    })
    .to_string();
    aws.s3
        .put_object()
        .bucket(&producer_bucket)
        .key("payloads/7f1e")
        .body(body.clone().into_bytes().into())
        .send()
        .await
        .expect("put payload");
    let pointer = json!([
        "software.amazon.payloadoffloading.PayloadS3Pointer",
        {"s3BucketName": producer_bucket, "s3Key": "payloads/7f1e"}
    ])
    .to_string();
    aws.send(&queue, &pointer).await;

    let settings = fenced_jobs::worker::Settings {
        payload_bucket: Some(producer_bucket.clone()),
        ..fast_settings()
    };
    let handler = worker_with(&aws, &table, &results, SimulatedProvider::new(), settings);
    let source = aws.source(&queue).await;
    let (poll, _) = deliver(&source, &handler).await;
    assert_eq!((poll.received, poll.deleted), (1, 1));

    // The answer is in the bucket; the item holds only its reference.
    let item = aws.item(&table, "big-1").await;
    assert_eq!(item.state, JobState::Succeeded);
    assert_eq!(item.result, None);
    let blob = item.result_ref.clone().expect("a reference");
    assert!(blob.size > 1_000_000, "{blob:?}");
    assert_eq!(blob.bucket, results);
    assert!(blob.key.starts_with("results/big-1/1/"), "{}", blob.key);
    // The digest covers the payload's content, not the pointer.
    let from_payload = fenced_jobs::job::parse_body(Some(&body)).expect("valid");
    assert_eq!(item.input_digest, from_payload.digest);

    // The stream, the dispatcher, the bus: exactly one event, pointing at the right bytes.
    let sink = AwsSink::EventBridge {
        client: aws.events.clone(),
        bus: bus.clone(),
    };
    let mut stream = LocalStreamSource::connect(&aws.ddb, aws.streams.clone(), &table)
        .await
        .expect("stream");
    let (delivered, response) = stream
        .poll_once(|e| async move { dispatch(&e, &sink).await.response() })
        .await
        .expect("stream poll");
    assert!(response.batch_item_failures.is_empty(), "{response:?}");
    let details = received(&aws, &events).await;
    let ours: Vec<&Value> = details.iter().filter(|d| d["job_id"] == "big-1").collect();
    assert_eq!(ours.len(), 1, "{details:?}");
    let event = ours[0];
    assert_eq!(event["state"], "succeeded");
    assert_eq!(event["metadata"]["order"], "o-17");
    assert_eq!(event["result_ref"]["key"], blob.key.as_str());
    assert_eq!(event["result_ref"]["sha256"], blob.sha256.as_str());
    assert!(!event.to_string().contains("secret prompt"), "{event}");
    let object = aws
        .s3
        .get_object()
        .bucket(&results)
        .key(event["result_ref"]["key"].as_str().expect("key"))
        .send()
        .await
        .expect("object")
        .body
        .collect()
        .await
        .expect("bytes")
        .into_bytes();
    assert_eq!(sha256_hex(&object), blob.sha256);

    // `jobctl result` prints those bytes.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_jobctl"))
        .args(["result", "big-1"])
        .env("JOBS_TABLE", &table)
        .env("RESULTS_BUCKET", &results)
        .output()
        .expect("jobctl runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed = out.stdout.strip_suffix(b"\n").expect("a trailing newline");
    assert_eq!(sha256_hex(printed), blob.sha256);
    // Into a file: its owner's only, never over another file unless asked, never through a link.
    let dir = std::env::temp_dir().join(support::unique("jobctl-out"));
    std::fs::create_dir_all(&dir).expect("folder");
    let file = dir.join("answer.json");
    let to_file = |extra: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_jobctl"))
            .args([
                "result",
                "big-1",
                "--out-file",
                file.to_str().expect("path"),
            ])
            .args(extra)
            .env("JOBS_TABLE", &table)
            .env("RESULTS_BUCKET", &results)
            .output()
            .expect("jobctl runs")
    };
    assert!(to_file(&[]).status.success());
    assert_eq!(
        sha256_hex(&std::fs::read(&file).expect("written")),
        blob.sha256
    );
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&file).expect("meta").permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }
    let again = to_file(&[]);
    assert_eq!(again.status.code(), Some(2), "exists: refused");
    assert!(String::from_utf8_lossy(&again.stderr).contains("--force"));
    assert!(to_file(&["--force"]).status.success());
    std::fs::remove_file(&file).expect("remove");
    let victim = dir.join("victim");
    std::fs::write(&victim, "precious").expect("victim");
    std::os::unix::fs::symlink(&victim, &file).expect("link");
    assert!(!to_file(&["--force"]).status.success());
    assert_eq!(std::fs::read_to_string(&victim).expect("read"), "precious");
    std::fs::remove_dir_all(&dir).expect("clean");
    // An object someone changed is not printed, and says so with its own exit status.
    aws.s3
        .put_object()
        .bucket(&results)
        .key(&blob.key)
        .body(b"{\"output\":\"tampered\"}".to_vec().into())
        .send()
        .await
        .expect("overwrite");
    let tampered = std::process::Command::new(env!("CARGO_BIN_EXE_jobctl"))
        .args(["result", "big-1"])
        .env("JOBS_TABLE", &table)
        .env("RESULTS_BUCKET", &results)
        .output()
        .expect("jobctl runs");
    assert_eq!(
        tampered.status.code(),
        Some(4),
        "{}",
        String::from_utf8_lossy(&tampered.stderr)
    );
    assert!(tampered.stdout.is_empty());

    // The same stream records delivered again: the same event, with the same id.
    let sink = AwsSink::EventBridge {
        client: aws.events.clone(),
        bus,
    };
    let again = dispatch(&delivered, &sink).await;
    assert_eq!(again.failed_at, None);
    let repeated = received(&aws, &events).await;
    let ours_again: Vec<&Value> = repeated.iter().filter(|d| d["job_id"] == "big-1").collect();
    assert_eq!(ours_again, vec![event]);
    // Nothing new in the stream was announced twice.
    let (_, response) = stream
        .poll_once(|e: StreamEvent| async move {
            assert!(e.records.is_empty(), "{} new records", e.records.len());
            Default::default()
        })
        .await
        .expect("stream poll");
    assert!(response.batch_item_failures.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_acceptance_leaves_no_reference_and_no_object() {
    let aws = emulator().await;
    let table = aws.table().await;
    let queue = aws.queue(30).await;
    let results = aws.bucket().await;
    // While the call runs, a rival fences this worker and accepts its own answer.
    let provider = TakenOverDuringTheCall {
        inner: SimulatedProvider::new(),
        rival: aws.ledger(&table),
    };
    let handler = worker(&aws, &table, &results, provider);
    aws.send(
        &queue,
        &job(
            "stale-big",
            "contested",
            r#""simulate":{"answer_bytes":200000}"#,
        ),
    )
    .await;
    let source = aws.source(&queue).await;
    let (poll, _) = deliver(&source, &handler).await;
    assert_eq!((poll.received, poll.deleted), (1, 1));

    let item = aws.item(&table, "stale-big").await;
    assert_eq!(item.state, JobState::Succeeded);
    assert_eq!(item.owner_id.as_deref(), Some("rival"));
    assert_eq!(item.result.as_deref(), Some(r#"{"output":"rival answer"}"#));
    assert_eq!(item.result_ref, None);
    // The stale owner wrote its answer before it tried to accept it, and removed it when the
    // acceptance was refused.
    let listed = aws
        .s3
        .list_objects_v2()
        .bucket(&results)
        .prefix("results/stale-big/")
        .send()
        .await
        .expect("list");
    assert_eq!(listed.key_count(), Some(0), "{:?}", listed.contents());
}

/// One record of `queue` with this body, delivered for the `receives`-th time.
fn delivery(queue: &Queue, id: &str, body: &str, receives: u32) -> SqsEvent {
    let mut m = SqsMessage::default();
    m.message_id = Some(id.to_owned());
    m.receipt_handle = Some(format!("handle-{id}"));
    m.body = Some(body.to_owned());
    m.event_source_arn = Some(queue.arn.clone());
    m.attributes
        .insert("ApproximateReceiveCount".into(), receives.to_string());
    let mut e = SqsEvent::default();
    e.records = vec![m];
    e
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_fenced_by_a_recovery_leaves_the_stored_answer_the_recovery_accepts() {
    // GIVEN owner A, whose one-second lease lapses during its 1.5 s call (its heartbeat does not
    // tick), and owner B, a second delivery of the same job, each through its own proxy in
    // front of the emulator. The proxies order the race: A's acceptance reaches DynamoDB only
    // once B's recovery (which fences A) has read A's stored answer, and B's acceptance only
    // once A has removed that object (or 1.5 s later, if A leaves it).
    let aws = emulator().await;
    let table = aws.table().await;
    let queue = aws.queue(30).await;
    let results = aws.bucket().await;
    let upstream = std::env::var("AWS_ENDPOINT_URL").expect("emulator");
    let (a_accepting, b_read, a_deleted) = (Flag::default(), Flag::default(), Flag::default());
    let update = |req: &Request| req.header("x-amz-target") == Some("DynamoDB_20120810.UpdateItem");
    let proxy_a = HttpStub::start({
        let (upstream, a_accepting, b_read, a_deleted) = (
            upstream.clone(),
            a_accepting.clone(),
            b_read.clone(),
            a_deleted.clone(),
        );
        move |req, _| {
            let forward = Reply::Forward(upstream.clone());
            if update(req) {
                // A's only UpdateItem: its claim was the first sight's PutItem, and its
                // heartbeat renews nothing.
                a_accepting.raise();
                return Reply::When(
                    b_read.condition(),
                    Duration::from_secs(20),
                    Box::new(forward),
                );
            }
            if req.method == "DELETE" {
                a_deleted.raise();
            }
            forward
        }
    })
    .await;
    let proxy_b = HttpStub::start({
        let (upstream, b_read, a_deleted) = (upstream.clone(), b_read.clone(), a_deleted.clone());
        move |req, _| {
            let forward = Reply::Forward(upstream.clone());
            if req.method == "GET"
                && req.path.contains("/results/")
                && !req.path.contains("list-type")
            {
                b_read.raise();
            }
            if update(req) && b_read.is_up() {
                let wait = Duration::from_millis(1_500);
                return Reply::When(a_deleted.condition(), wait, Box::new(forward));
            }
            forward
        }
    })
    .await;
    let timeouts = SdkTimeouts {
        connect_ms: 1_000,
        attempt_ms: 10_000,
        operation_ms: 30_000,
    };
    let (via_a, via_b) = (
        support::through(&proxy_a.url, timeouts).await,
        support::through(&proxy_b.url, timeouts).await,
    );
    let mut settings = fast_settings();
    settings.lease_ms = 1_000;
    settings.heartbeat_ms = 60_000;
    settings.skew_ms = 100;
    let a = worker_with(
        &via_a,
        &table,
        &results,
        SimulatedProvider::new(),
        settings.clone(),
    );
    let b = worker_with(&via_b, &table, &results, SimulatedProvider::new(), settings);
    let body = job(
        "contested-big",
        "contested",
        r#""simulate":{"answer_bytes":200000,"latency_ms":1500,"retrievable":false}"#,
    );
    let inv = || Invocation {
        id: support::unique("inv"),
        deadline: Some(SystemClock.now_ms() + 60_000),
    };

    // WHEN A runs its call, and B is delivered once A has stored its answer and asks to accept it
    let (a_event, a_inv) = (delivery(&queue, "a", &body, 1), inv());
    let a_run = a.handle_batch(&a_event, &a_inv);
    let b_run = async {
        while !a_accepting.is_up() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        b.handle_batch(&delivery(&queue, "b", &body, 2), &inv())
            .await
    };
    let (_, b_report) = tokio::join!(a_run, b_run);

    // THEN B's recovery accepted A's answer, and the object it references is there: A, refused
    // while the job was still live, left it alone.
    assert_eq!(
        b_report.records[0].outcome,
        fenced_jobs::job::RecordOutcome::Done(JobState::Succeeded)
    );
    let item = aws.item(&table, "contested-big").await;
    assert_eq!((item.state, item.owner_epoch), (JobState::Succeeded, 2));
    let reference = item.result_ref.expect("a stored answer");
    assert!(
        reference.key.starts_with("results/contested-big/1/"),
        "{reference:?}"
    );
    let store = S3Blobs::new(aws.s3.clone(), Some(results.clone()));
    let bytes = fenced_jobs::blobs::read_checked(&store, &reference, 1 << 20)
        .await
        .expect("the accepted answer is stored");
    assert_eq!(bytes.len(), reference.size as usize);
    assert!(!a_deleted.is_up(), "the fenced owner removed an object");
    assert_eq!(a.processor().provider().executions(), 1);
    assert_eq!(
        b.processor().provider().executions(),
        0,
        "B paid for nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_input_is_stored_by_submit_and_read_back_by_the_worker() {
    let aws = emulator().await;
    let table = aws.table().await;
    let queue = aws.queue(30).await;
    let results = aws.bucket().await;
    let prompt = "x".repeat(300_000);
    let line = job("big-input", &prompt, "");
    let file = std::env::temp_dir().join(support::unique("jobs") + ".jsonl");
    std::fs::write(&file, format!("{line}\n")).expect("write jobs");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_jobctl"))
        .arg("submit")
        .arg(&file)
        .env("JOBS_TABLE", &table)
        .env("RESULTS_BUCKET", &results)
        .env("QUEUE_URL", &queue.url)
        .output()
        .expect("jobctl runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let item = aws.item(&table, "big-input").await;
    assert_eq!(item.input, "");
    let stored = item.input_ref.clone().expect("the input is stored");
    assert!(stored.size > 300_000);

    let handler = worker(&aws, &table, &results, SimulatedProvider::new());
    let source = aws.source(&queue).await;
    let (poll, _) = deliver(&source, &handler).await;
    assert_eq!((poll.received, poll.deleted), (1, 1));
    let item = aws.item(&table, "big-input").await;
    assert_eq!(item.state, JobState::Succeeded);
    // The call saw the whole input: the simulated answer counts it, at four bytes a token.
    let answer: Value =
        serde_json::from_str(item.result.as_deref().expect("inline")).expect("json");
    assert!(answer["usage"]["input_tokens"].as_u64().expect("count") > 75_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sns_and_fifo_sqs_sinks_carry_the_same_event_routed_by_producer_and_fifo_drops_the_repeat()
{
    let aws = emulator().await;
    let table = aws.table().await;
    let queue = aws.queue(30).await;
    let results = aws.bucket().await;
    aws.send(&queue, &job("small-1", "short", "")).await;
    // Producers kept apart: the emulator's one sender (SenderId) is the producer `billing`.
    let settings = fenced_jobs::worker::Settings {
        producers: fenced_jobs::job::scope::Producers::parse(
            &format!("billing={}", support::EMULATOR_SENDER),
            "",
        )
        .expect("producers"),
        ..fast_settings()
    };
    let handler = worker_with(&aws, &table, &results, SimulatedProvider::new(), settings);
    let (poll, _) = deliver(&aws.source(&queue).await, &handler).await;
    assert_eq!(poll.deleted, 1);
    let mut stream = LocalStreamSource::connect(&aws.ddb, aws.streams.clone(), &table)
        .await
        .expect("stream");
    let (delivered, _) = stream
        .poll_once(|_| async { Default::default() })
        .await
        .expect("read");

    // FIFO queue: the event id is the deduplication id, so a second delivery is dropped.
    let fifo = aws.fifo_queue(30).await;
    let sink = AwsSink::Sqs {
        client: aws.sqs.clone(),
        queue_url: fifo.url.clone(),
    };
    assert_eq!(dispatch(&delivered, &sink).await.failed_at, None);
    assert_eq!(dispatch(&delivered, &sink).await.failed_at, None);
    let on_queue = aws.peek(&fifo.url, 1).await;
    assert_eq!(on_queue.len(), 1);
    let from_queue: Value = serde_json::from_str(on_queue[0].body().expect("body")).expect("json");
    assert_eq!(from_queue["job_id"], "billing/small-1");
    assert_eq!(from_queue["producer"], "billing");
    let attribute = on_queue[0]
        .message_attributes()
        .and_then(|a| a.get("producer"))
        .and_then(|a| a.string_value());
    assert_eq!(attribute, Some("billing"));
    assert_eq!(from_queue["state"], "succeeded");
    assert_eq!(from_queue["result"]["contract"], "summary.v1");

    // SNS topic with a queue subscribed: the same document.
    let sns = aws_sdk_sns::Client::new(&aws.config);
    let topic = sns
        .create_topic()
        .name(support::unique("done"))
        .send()
        .await
        .expect("topic")
        .topic_arn()
        .expect("arn")
        .to_owned();
    // Each producer's consumer subscribes with a filter on the `producer` attribute.
    let subscriber = aws.queue(30).await;
    let other_producer = aws.queue(30).await;
    for (queue, producer) in [(&subscriber, "billing"), (&other_producer, "search")] {
        sns.subscribe()
            .topic_arn(&topic)
            .protocol("sqs")
            .endpoint(&queue.arn)
            .attributes("RawMessageDelivery", "true")
            .attributes(
                "FilterPolicy",
                json!({ "producer": [producer] }).to_string(),
            )
            .send()
            .await
            .expect("subscribe");
    }
    let sink = AwsSink::Sns {
        client: sns,
        topic_arn: topic,
    };
    assert_eq!(dispatch(&delivered, &sink).await.failed_at, None);
    let on_topic = aws.peek(&subscriber.url, 1).await;
    assert_eq!(on_topic.len(), 1);
    let from_topic: Value = serde_json::from_str(on_topic[0].body().expect("body")).expect("json");
    assert_eq!(from_topic, from_queue);
    assert!(aws.peek(&other_producer.url, 0).await.is_empty());
}

/// The principal id the emulator gives every message's `SenderId`.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobctl_export_writes_the_finished_jobs_a_scan_finds() {
    let aws = emulator().await;
    let table = aws.table().await;
    let queue = aws.queue(30).await;
    let results = aws.bucket().await;
    aws.send(&queue, &job("exp-ok", "fine", "")).await;
    aws.send(
        &queue,
        &job("exp-big", "large", r#""simulate":{"answer_bytes":100000}"#),
    )
    .await;
    aws.send(
        &queue,
        &job(
            "exp-bad",
            "refused",
            r#""simulate":{"outcome":"permanent"}"#,
        ),
    )
    .await;
    aws.send(
        &queue,
        &job("exp-waiting", "stays", r#""simulate":{"fail_times":1}"#),
    )
    .await;
    let handler = worker(&aws, &table, &results, SimulatedProvider::new());
    let (poll, _) = deliver(&aws.source(&queue).await, &handler).await;
    assert_eq!(poll.received, 4);

    let export = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_jobctl"))
            .arg("export")
            .args(args)
            .env("JOBS_TABLE", &table)
            .output()
            .expect("jobctl runs");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut lines: Vec<Value> = String::from_utf8(out.stdout)
            .expect("utf-8")
            .lines()
            .map(|l| serde_json::from_str(l).expect("a JSON line"))
            .collect();
        lines.sort_by_key(|l| l["job_id"].as_str().unwrap_or("").to_owned());
        lines
    };
    let all = export(&[]);
    let ids: Vec<&str> = all.iter().filter_map(|l| l["job_id"].as_str()).collect();
    // The job waiting out its backoff is not finished, so not exported.
    assert_eq!(ids, ["exp-bad", "exp-big", "exp-ok"]);
    assert_eq!(all[0]["error"]["kind"], "permanent");
    assert!(
        all[1]["result_ref"]["key"]
            .as_str()
            .expect("key")
            .starts_with("results/exp-big/")
    );
    assert_eq!(all[2]["result"]["contract"], "summary.v1");

    let succeeded = export(&["--state", "succeeded"]);
    assert_eq!(succeeded.len(), 2);
    let later = export(&["--since", "2999-01-01T00:00:00Z"]);
    assert!(later.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobctl_events_replay_announces_the_jobs_of_a_batch_the_dispatcher_gave_up_on() {
    // GIVEN a job that succeeded, and in the dispatcher's failure queue the message Lambda
    // writes for a stream batch whose records arrived around then (no event was published)
    let aws = emulator().await;
    let table = aws.table().await;
    let queue = aws.queue(30).await;
    let results = aws.bucket().await;
    let (bus, events) = bus_to_queue(&aws).await;
    aws.send(&queue, &job("lost-event", "a report", "")).await;
    let handler = worker(&aws, &table, &results, SimulatedProvider::new());
    let (poll, _) = deliver(&aws.source(&queue).await, &handler).await;
    assert_eq!(poll.deleted, 1);
    let item = aws.item(&table, "lost-event").await;
    let arrival = fenced_jobs::job::message::format_rfc3339_ms(item.updated_at);
    let failures = aws.queue(30).await;
    let message = json!({
        "requestContext": {"condition": "RetryAttemptsExhausted"},
        "version": "1.0",
        "DDBStreamBatchInfo": {
            "shardId": "shardId-1", "startSequenceNumber": "1", "endSequenceNumber": "2",
            "approximateArrivalOfFirstRecord": arrival,
            "approximateArrivalOfLastRecord": arrival,
            "batchSize": 2, "streamArn": "arn:aws:dynamodb:us-east-1:123456789012:table/t/stream/s"
        }
    });
    aws.send(&failures, &message.to_string()).await;
    aws.send(&failures, r#"{"something":"else"}"#).await;
    let jobctl = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_jobctl"))
            .args(["events", "replay", "--json"])
            .args(args)
            .env("JOBS_TABLE", &table)
            .env("EVENT_BUS_NAME", &bus)
            .env("DISPATCH_FAILURE_QUEUE_URL", &failures.url)
            .output()
            .expect("jobctl runs")
    };
    // WHEN it is replayed, first as a dry run
    let dry = jobctl(&["--dry-run"]);
    assert!(
        dry.status.success(),
        "{}",
        String::from_utf8_lossy(&dry.stderr)
    );
    assert!(
        received(&aws, &events).await.is_empty(),
        "a dry run published"
    );
    let out = jobctl(&[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).expect("json report");
    // THEN the job's event is published with the dispatcher's id, the batch's message is
    // deleted, and the message that names no batch stays
    assert_eq!(
        (report["events"].as_u64(), report["deleted"].as_u64()),
        (Some(1), Some(1)),
        "{report}"
    );
    assert_eq!(report["unreadable"], 1);
    let details = received(&aws, &events).await;
    assert_eq!(details.len(), 1, "{details:?}");
    assert_eq!(details[0]["job_id"], "lost-event");
    let expected = fenced_jobs::events::CompletionEvent::of(&item).expect("announced");
    assert_eq!(details[0]["event_id"], expected.id.as_str());
    let left = aws.peek(&failures.url, 1).await;
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].body(), Some(r#"{"something":"else"}"#));
}
