//! Large Extended Client payloads within the function's memory: the worker binary, with the
//! 128 MB a template function has, takes a batch of ten pointers to 8 MiB payloads on the
//! emulator, behind a scripted Lambda Runtime API, and its peak resident memory stays under
//! 128 MiB (under a 128 MiB cgroup limit as well, where this machine lets a test make one);
//! so does the worst batch it takes rather than refuses, and documents that cost more parsed
//! than it holds are dead-lettered with their reason.

use std::time::{Duration, Instant};

use fenced_jobs::clock::{Clock, SystemClock};
use fenced_jobs::job::cost::{MAX_DOCUMENT_COST, document_cost};
use serde_json::{Value, json};

use crate::support::http::{HttpStub, Reply};
use crate::support::{self, emulator};

const PAYLOAD_BYTES: usize = 8 * 1_048_576;

/// The peak resident set of a process, from `/proc`.
fn peak_rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Puts `pid` in a new memory cgroup limited to `bytes`, where the machine allows it (cgroup v1
/// or v2, writable); `false` where it does not.
fn limit_memory(pid: u32, bytes: u64) -> bool {
    let name = support::unique("fenced-jobs-mem");
    for (root, limit_file) in [
        ("/sys/fs/cgroup/memory", "memory.limit_in_bytes"),
        ("/sys/fs/cgroup", "memory.max"),
    ] {
        let dir = std::path::Path::new(root).join(&name);
        if std::fs::create_dir(&dir).is_ok()
            && std::fs::write(dir.join(limit_file), bytes.to_string()).is_ok()
            && std::fs::write(dir.join("cgroup.procs"), pid.to_string()).is_ok()
        {
            return true;
        }
        let _ = std::fs::remove_dir(&dir);
    }
    false
}

/// What one invocation of the worker binary, as a 128 MB function, answered for `event`, and
/// its peak resident memory; `dlq_url` set as its DLQ. Under a 128 MiB cgroup limit too where
/// the machine allows one (the third value says whether it did).
async fn invoke_worker(
    event: String,
    table: &str,
    results: &str,
    producer: &str,
    dlq_url: Option<&str>,
) -> (crate::support::http::Request, u64, bool) {
    // A Runtime API that hands out the event once, then holds the next request open (the
    // process stays up, so its peak memory can be read).
    let deadline = SystemClock.now_ms() + 120_000;
    let runtime = HttpStub::start(move |req, seen| {
        if req.method == "GET" && req.path.ends_with("/invocation/next") {
            let first = !seen.iter().any(|r| r.path.ends_with("/invocation/next"));
            if first {
                return Reply::Json {
                    status: 200,
                    headers: vec![
                        ("lambda-runtime-aws-request-id", "req-heavy".to_owned()),
                        ("lambda-runtime-deadline-ms", deadline.to_string()),
                        (
                            "lambda-runtime-invoked-function-arn",
                            "arn:aws:lambda:us-east-1:123456789012:function:worker".to_owned(),
                        ),
                    ],
                    body: event.clone(),
                };
            }
            return Reply::Slow(Duration::from_secs(3_600), Box::new(Reply::Drop));
        }
        Reply::json(202, json!({"status": "OK"}))
    })
    .await;
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_worker"));
    command
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env(
            "AWS_LAMBDA_RUNTIME_API",
            runtime.url.trim_start_matches("http://"),
        )
        .env("AWS_LAMBDA_FUNCTION_NAME", "worker")
        .env("AWS_LAMBDA_FUNCTION_VERSION", "1")
        .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "128")
        .env(
            "AWS_ENDPOINT_URL",
            std::env::var("AWS_ENDPOINT_URL").expect("emulator"),
        )
        .env("AWS_ACCESS_KEY_ID", "emulator")
        .env("AWS_SECRET_ACCESS_KEY", "emulator")
        .env("AWS_REGION", "us-east-1")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env("JOBS_TABLE", table)
        .env("RESULTS_BUCKET", results)
        .env("PAYLOAD_BUCKET", producer)
        .env("PROVIDER", "simulated")
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::null());
    if let Some(url) = dlq_url {
        command.env("DLQ_URL", url);
    }
    let mut worker = command.spawn().expect("the worker starts");
    let limited = limit_memory(worker.id(), 128 * 1_048_576);

    let started = Instant::now();
    let response = loop {
        if let Some(r) = runtime
            .requests()
            .into_iter()
            .find(|r| r.method == "POST" && r.path.contains("/response"))
        {
            break r;
        }
        if let Ok(Some(status)) = worker.try_wait() {
            panic!(
                "the worker exited before answering ({status}; under a cgroup limit: {limited})"
            );
        }
        assert!(started.elapsed() < Duration::from_secs(90), "no answer");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let peak = peak_rss_bytes(worker.id()).expect("peak memory");
    let _ = worker.kill();
    let _ = worker.wait();
    (response, peak, limited)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_pointers_to_8_mib_payloads_stay_within_a_128_mb_function() {
    // GIVEN ten jobs whose 8 MiB messages an Extended Client producer put in its bucket
    let aws = emulator().await;
    let table = aws.table().await;
    let queue = aws.queue(30).await;
    let results = aws.bucket().await;
    let producer = aws.bucket().await;
    let prompt = "w".repeat(PAYLOAD_BYTES);
    let mut records = Vec::new();
    for i in 0..10 {
        let body = json!({
            "job_id": format!("heavy-{i}"),
            "contract": "summary.v1",
            "input": {"model": "sim-1", "prompt": prompt},
        })
        .to_string();
        let key = format!("payloads/{i}");
        aws.s3
            .put_object()
            .bucket(&producer)
            .key(&key)
            .body(body.clone().into_bytes().into())
            .send()
            .await
            .expect("put payload");
        let pointer = json!([
            "software.amazon.payloadoffloading.PayloadS3Pointer",
            {"s3BucketName": producer, "s3Key": key}
        ]);
        records.push(json!({
            "messageId": format!("m{i}"),
            "receiptHandle": format!("h{i}"),
            "body": pointer.to_string(),
            "attributes": {"ApproximateReceiveCount": "1"},
            "messageAttributes": {
                "ExtendedPayloadSize": {"stringValue": body.len().to_string(), "dataType": "Number"}
            },
            "eventSource": "aws:sqs",
            "eventSourceARN": queue.arn,
        }));
    }
    let event = json!({ "Records": records }).to_string();
    // WHEN it handles the batch
    let (response, peak, limited) = invoke_worker(event, &table, &results, &producer, None).await;

    // THEN it answered, within the memory: some jobs ran, the rest wait for a later batch
    let failures: Value = serde_json::from_str(&response.body).expect("a batch response");
    let failed = failures["batchItemFailures"]
        .as_array()
        .expect("failures")
        .len();
    assert!(failed < 10, "no job ran: {failures}");
    assert!(
        peak < 128 * 1_048_576,
        "peak resident memory {} MiB (under a cgroup limit: {limited})",
        peak / 1_048_576
    );
    println!(
        "peak resident memory {:.1} MiB, {} of 10 records ran, under a cgroup limit: {limited}",
        peak as f64 / 1_048_576.0,
        10 - failed
    );
}

/// A valid body of 1 MiB whose input holds many small maps, `[{"a":0},...]`.
fn costly_body(job_id: &str, bytes: usize) -> String {
    let head = format!(
        r#"{{"job_id":"{job_id}","contract":"summary.v1","input":{{"model":"sim-1","prompt":"p","rows":["#
    );
    let n = (bytes - head.len() - 4) / 8;
    let mut body = head;
    body.push_str(&vec![r#"{"a":0}"#; n].join(","));
    body.push_str("]}}");
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn documents_that_cost_more_parsed_than_a_function_holds_are_dead_lettered_with_their_reason()
{
    // GIVEN five valid 1 MiB bodies whose inputs parse to about 90 MiB each, and a pointer to
    // an 8 MiB payload of the same shape that says it is 1 byte
    let aws = emulator().await;
    let table = aws.table().await;
    let queue = aws.queue(30).await;
    let results = aws.bucket().await;
    let producer = aws.bucket().await;
    let record = |i: usize, body: String, attributes: Value| {
        json!({
            "messageId": format!("m{i}"),
            "receiptHandle": format!("h{i}"),
            "body": body,
            "attributes": {"ApproximateReceiveCount": "1"},
            "messageAttributes": attributes,
            "eventSource": "aws:sqs",
            "eventSourceARN": queue.arn,
        })
    };
    let mut records: Vec<Value> = (0..5)
        .map(|i| record(i, costly_body(&format!("costly-{i}"), 1_048_000), json!({})))
        .collect();
    aws.s3
        .put_object()
        .bucket(&producer)
        .key("payloads/costly")
        .body(
            costly_body("costly-pointer", PAYLOAD_BYTES)
                .into_bytes()
                .into(),
        )
        .send()
        .await
        .expect("put payload");
    let pointer = json!([
        "software.amazon.payloadoffloading.PayloadS3Pointer",
        {"s3BucketName": producer, "s3Key": "payloads/costly"}
    ]);
    records.push(record(
        5,
        pointer.to_string(),
        json!({"ExtendedPayloadSize": {"stringValue": "1", "dataType": "Number"}}),
    ));
    let event = json!({ "Records": records }).to_string();

    // WHEN the worker, as a 128 MB function, handles the batch
    let (response, peak, limited) =
        invoke_worker(event, &table, &results, &producer, Some(&queue.dlq_url)).await;

    // THEN every record is acknowledged, each a DLQ letter saying what it would cost
    let failures: Value = serde_json::from_str(&response.body).expect("a batch response");
    assert_eq!(failures["batchItemFailures"], json!([]), "{failures}");
    let mut letters = Vec::new();
    for _ in 0..10 {
        let got = aws
            .sqs
            .receive_message()
            .queue_url(&queue.dlq_url)
            .max_number_of_messages(10)
            .message_attribute_names("All")
            .send()
            .await
            .expect("receive dlq");
        letters.extend(got.messages().iter().filter_map(|m| {
            m.message_attributes()?
                .get("fenced-jobs.detail")?
                .string_value()
                .map(str::to_owned)
        }));
        if letters.len() == 6 {
            break;
        }
    }
    assert_eq!(letters.len(), 6, "{letters:?}");
    assert!(
        letters
            .iter()
            .all(|d| d.contains("bytes parsed, more than")),
        "{letters:?}"
    );
    // AND the worker stayed within the function's memory
    assert!(
        peak < 128 * 1_048_576,
        "peak resident memory {} MiB (under a cgroup limit: {limited})",
        peak / 1_048_576
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_costliest_valid_documents_stay_within_a_128_mb_function() {
    // GIVEN ten valid plain bodies, each of small maps just under what a document may cost
    // parsed: the worst batch the worker takes rather than refuses
    let aws = emulator().await;
    let table = aws.table().await;
    let queue = aws.queue(30).await;
    let results = aws.bucket().await;
    let producer = aws.bucket().await;
    let mut bytes = 64 * 1024;
    let probe = |bytes| document_cost(&costly_body("probe", bytes));
    while probe(bytes * 2) < MAX_DOCUMENT_COST {
        bytes *= 2;
    }
    // The largest size under the limit, to within 4 KiB.
    let (mut low, mut high) = (bytes, bytes * 2);
    while high - low > 4096 {
        let mid = (low + high) / 2;
        if probe(mid) < MAX_DOCUMENT_COST {
            low = mid;
        } else {
            high = mid;
        }
    }
    let records: Vec<Value> = (0..10)
        .map(|i| {
            json!({
                "messageId": format!("m{i}"),
                "receiptHandle": format!("h{i}"),
                "body": costly_body(&format!("costly-{i}"), low),
                "attributes": {"ApproximateReceiveCount": "1"},
                "eventSource": "aws:sqs",
                "eventSourceARN": queue.arn,
            })
        })
        .collect();
    let event = json!({ "Records": records }).to_string();

    // WHEN it handles the batch
    let (response, peak, limited) =
        invoke_worker(event, &table, &results, &producer, Some(&queue.dlq_url)).await;

    // THEN it answered within the memory: none is poison, the first ran, and those past the
    // budget wait for a later batch
    let failures: Value = serde_json::from_str(&response.body).expect("a batch response");
    let failed = failures["batchItemFailures"]
        .as_array()
        .expect("failures")
        .len();
    assert!(failed < 10, "no job ran: {failures}");
    let letters = aws
        .sqs
        .receive_message()
        .queue_url(&queue.dlq_url)
        .max_number_of_messages(10)
        .send()
        .await
        .expect("receive dlq");
    assert!(
        letters.messages().is_empty(),
        "a valid body is never poison"
    );
    assert!(
        peak < 128 * 1_048_576,
        "peak resident memory {} MiB (under a cgroup limit: {limited})",
        peak / 1_048_576
    );
    println!(
        "peak resident memory {:.1} MiB, {} of 10 records ran, under a cgroup limit: {limited}",
        peak as f64 / 1_048_576.0,
        10 - failed
    );
}
