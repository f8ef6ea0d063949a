//! The producer guide's examples (`examples/producers`: Python with boto3, TypeScript with the
//! AWS SDK for JavaScript v3) run against the emulator, as a producer's team would run them:
//! each sends a small job, one whose answer is too large for an event, and one too large for
//! the queue (an Extended Client pointer); the worker runs them, the dispatcher announces them
//! on an SQS queue, and the same language's consumer reads the events and fetches each answer:
//! from the event, from the ledger item, and from the results bucket (checked against the
//! SHA-256 the ledger recorded). So the guide's code cannot rot.

use std::process::{Command, Stdio};

use fenced_jobs::blobs::s3::S3Blobs;
use fenced_jobs::events::aws::AwsSink;
use fenced_jobs::job::artifact::sha256_hex;
use fenced_jobs::provider::SimulatedProvider;
use serde_json::{Value, json};

use crate::results_out::worker_with;
use crate::support::{announce, deliver, emulator, fast_settings};

/// One language's producer and consumer: how each is run, from the repository's root.
struct Language {
    name: &'static str,
    send: Vec<String>,
    consume: Vec<String>,
}

fn languages() -> [Language; 2] {
    let root = env!("CARGO_MANIFEST_DIR");
    let python = format!("{root}/.venv/bin/python");
    let py = format!("{root}/examples/producers/python");
    let ts = format!("{root}/examples/producers/typescript/dist");
    [
        Language {
            name: "python",
            send: vec![python.clone(), format!("{py}/send_job.py")],
            consume: vec![python, format!("{py}/consume_events.py"), "3".into()],
        },
        Language {
            name: "typescript",
            send: vec!["node".into(), format!("{ts}/send-job.js")],
            consume: vec!["node".into(), format!("{ts}/consume-events.js"), "3".into()],
        },
    ]
}

/// Runs `command` with `env` (and the emulator's settings) and `stdin`: its standard output.
fn run(command: &[String], env: &[(&str, &str)], stdin: &str) -> String {
    use std::io::Write;
    let mut child = Command::new(&command[0])
        .args(&command[1..])
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "{command:?}: {e} (make test installs them: scripts/emulator.sh install-producers)"
            )
        });
    let mut input = child.stdin.take().expect("stdin");
    // A child that stopped early says why on its standard error, read below.
    let _ = input.write_all(stdin.as_bytes());
    drop(input);
    let out = child.wait_with_output().expect("it runs");
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    assert!(out.status.success(), "{command:?}: {}", text(&out.stderr));
    text(&out.stdout)
}

/// The jobs each language sends: an answer small enough for its event, one too large for the
/// event but not for the ledger item, and a body too large for the queue with an answer for
/// the results bucket.
fn jobs(language: &str) -> Vec<Value> {
    let job = |id: &str, prompt: String, answer_bytes: u64| {
        json!({"job_id": format!("{language}-{id}"), "contract": "summary.v1",
               "input": {"model": "sim-1", "prompt": prompt,
                         "simulate": {"answer_bytes": answer_bytes}}})
    };
    vec![
        job("small", "Summarise this.".into(), 0),
        job("ledger", "Summarise that.".into(), 80_000),
        job("pointer", "x".repeat(300_000), 200_000),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_guides_producers_send_jobs_and_read_their_answers_in_python_and_typescript() {
    let aws = emulator().await;
    for language in languages() {
        // GIVEN a deployment that reads payloads from the producer's bucket and keeps answers
        // up to 100 KB in the ledger item, larger ones in the results bucket
        let table = aws.table().await;
        let queue = aws.queue(30).await;
        let events = aws.queue(30).await;
        let (results, payloads) = (aws.bucket().await, aws.bucket().await);
        let settings = fenced_jobs::worker::Settings {
            payload_bucket: Some(payloads.clone()),
            inline_max_bytes: 100_000,
            ..fast_settings()
        };
        let handler = worker_with(&aws, &table, &results, SimulatedProvider::new(), settings);
        // boto3 takes its Region from AWS_DEFAULT_REGION (the JavaScript SDK from AWS_REGION).
        let region = std::env::var("AWS_REGION").unwrap_or_else(|_| "us-east-1".into());
        let env = [
            ("AWS_DEFAULT_REGION", region.as_str()),
            ("QUEUE_URL", queue.url.as_str()),
            ("PAYLOAD_BUCKET", payloads.as_str()),
            ("EVENT_QUEUE_URL", events.url.as_str()),
            ("JOBS_TABLE", table.as_str()),
        ];

        // WHEN the language's producer sends the jobs
        let lines: Vec<String> = jobs(language.name).iter().map(Value::to_string).collect();
        let sent = run(&language.send, &env, &(lines.join("\n") + "\n"));
        assert_eq!(sent.lines().count(), 3, "{}: {sent}", language.name);
        let stored = aws.s3.list_objects_v2().bucket(&payloads).send().await;
        let stored = stored.expect("list").key_count().unwrap_or_default();
        assert_eq!(
            stored, 1,
            "{}: the large body went through S3",
            language.name
        );
        // AND the worker runs them, and the dispatcher announces them on the event queue
        let mut done = 0;
        while done < 3 {
            let (poll, _) = deliver(&aws.source(&queue).await, &handler).await;
            assert!(poll.received > 0, "{}: {done} of 3 ran", language.name);
            done += poll.deleted;
        }
        let sink = AwsSink::Sqs {
            client: aws.sqs.clone(),
            queue_url: events.url.clone(),
        };
        announce(&aws.ddb, aws.streams.clone(), &table, &sink).await;

        // THEN the language's consumer reads each event and each answer, from wherever it is
        let read = run(&language.consume, &env, "");
        let mut seen: Vec<(String, String, String)> = read
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).expect("a JSON line"))
            .map(|v| {
                let field = |k: &str| v[k].as_str().expect(k).to_owned();
                (field("job_id"), field("state"), field("answer_sha256"))
            })
            .collect();
        seen.sort();
        let blobs = S3Blobs::new(aws.s3.clone(), Some(results.clone()));
        let ledger = aws.ledger(&table);
        let mut expected = Vec::new();
        for job in jobs(language.name) {
            let id = job["job_id"].as_str().expect("id").to_owned();
            let stored = fenced_jobs::ops::results::result(&ledger, Some(&blobs), &id)
                .await
                .expect("an answer");
            let answer: Value = serde_json::from_slice(&stored).expect("a document");
            let output = answer["output"].as_str().expect("text").to_owned();
            expected.push((id, "succeeded".to_owned(), sha256_hex(output.as_bytes())));
        }
        expected.sort();
        assert_eq!(seen, expected, "{}", language.name);
        let item = aws
            .item(&table, &format!("{}-pointer", language.name))
            .await;
        assert!(
            item.result_ref.is_some(),
            "the large answer is in the bucket"
        );
        let ledger_only = aws.item(&table, &format!("{}-ledger", language.name)).await;
        assert!(ledger_only.result.is_some() && ledger_only.result_ref.is_none());
    }
}
