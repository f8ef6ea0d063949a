//! The operator's path on the emulator: an `unknown` job is re-run only after a recorded
//! decision, and `jobctl` shows the record.
//!
//! Why this file is long: each operator command (decide, show, list, the DLQ's inspection and
//! redrive, the command line itself) is a story on its own emulator queues and items.

use fenced_jobs::clock::{Clock, SystemClock};
use fenced_jobs::job::scope::Producers;
use fenced_jobs::job::{Failure, JobState, RecordOutcome};
use fenced_jobs::ledger::{JobLedger, LedgerIndex, OperatorAction};
use fenced_jobs::ops::operator::{self, OperatorError};
use fenced_jobs::provider::SimulatedProvider;
use fenced_jobs::queue::{QueueError, SqsReader, SqsTriggers};

use crate::support::{self, deliver, emulator, fast_settings, job};

/// A job whose only attempt was cut off: `unknown`.
async fn unknown_job(aws: &support::Emulator, table: &str, queue: &support::Queue, id: &str) {
    let mut settings = fast_settings();
    settings.provider_timeout_ms = 200;
    let handler = aws.handler(table, SimulatedProvider::new(), settings);
    let source = aws.source(queue).await;
    aws.send(
        queue,
        &job(
            id,
            "slow",
            r#""simulate":{"latency_ms":1000,"retrievable":false}"#,
        ),
    )
    .await;
    let (_, report) = deliver(&source, &handler).await;
    let outcome = &report.expect("report").records[0].outcome;
    // Cut off, not yet asked about: a short backoff before a delivery asks the provider.
    assert_eq!(outcome, &RecordOutcome::Failed(Failure::AwaitingRecovery));
    let item = aws.ledger(table).get(id).await.expect("get").expect("item");
    assert_eq!(item.state, JobState::Unknown);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_job_runs_again_only_after_an_operator_authorises_it() {
    let aws = emulator().await;
    let table = aws.table().await;
    let queue = aws.queue(30).await;
    unknown_job(&aws, &table, &queue, "op-retry").await;
    let ledger = aws.ledger(&table);

    // Another delivery without a decision does not call the model. (It asks the provider again,
    // under a new epoch, and the provider does not know the call: still unknown.)
    let patient = aws.handler(&table, SimulatedProvider::new(), fast_settings());
    let source = aws.source(&queue).await;
    aws.send(
        &queue,
        &job(
            "op-retry",
            "slow",
            r#""simulate":{"latency_ms":1000,"retrievable":false}"#,
        ),
    )
    .await;
    let (_, report) = deliver(&source, &patient).await;
    assert_eq!(
        report.expect("report").records[0].outcome,
        RecordOutcome::Failed(Failure::AwaitingDecision)
    );
    assert_eq!(patient.processor().provider().executions(), 0);

    // The operator authorises a retry: the epoch rises, the decision is recorded, a trigger is sent.
    let now = SystemClock.now_ms();
    let decided = operator::decide(
        &ledger,
        "op-retry",
        OperatorAction::AuthorizeRetry,
        "alice",
        None,
        "no completion upstream",
        now,
    )
    .await
    .expect("decide");
    assert_eq!(
        (decided.state, decided.owner_epoch),
        (JobState::RetryAuthorized, 3)
    );
    assert_eq!(decided.decisions.len(), 1);
    assert_eq!(
        (
            decided.decisions[0].by.as_str(),
            decided.decisions[0].action.as_str()
        ),
        ("alice", "authorize_retry")
    );
    operator::send_trigger(&SqsTriggers::new(aws.sqs.clone(), &queue.url), &decided)
        .await
        .expect("trigger");
    // Deciding again is refused: the job is no longer unknown.
    let again = operator::decide(
        &ledger,
        "op-retry",
        OperatorAction::Fail,
        "bob",
        None,
        "late",
        now,
    )
    .await;
    assert!(matches!(
        again,
        Err(OperatorError::NotUnknown {
            state: JobState::RetryAuthorized,
            ..
        })
    ));

    // The trigger runs attempt 2 within the same budget.
    let (poll, _) = deliver(&source, &patient).await;
    assert_eq!((poll.received, poll.deleted), (1, 1));
    let done = ledger.get("op-retry").await.expect("get").expect("item");
    assert_eq!(
        (done.state, done.attempts, done.owner_epoch),
        (JobState::Succeeded, 2, 4)
    );
    assert_eq!(patient.processor().provider().executions(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_decision_is_terminal_and_jobctl_shows_it() {
    let aws = emulator().await;
    let table = aws.table().await;
    let queue = aws.queue(30).await;
    unknown_job(&aws, &table, &queue, "op-fail").await;
    let ledger = aws.ledger(&table);
    // The operator decides with jobctl: the name they give, and who AWS says they are.
    let decided = std::process::Command::new(env!("CARGO_BIN_EXE_jobctl"))
        .args(["--table", &table, "fail", "op-fail", "--yes"])
        .args([
            "--reason",
            "duplicate cost not acceptable",
            "--operator",
            "alice",
        ])
        .output()
        .expect("jobctl runs");
    assert!(
        decided.status.success(),
        "{}",
        String::from_utf8_lossy(&decided.stderr)
    );
    let failed = ledger.get("op-fail").await.expect("get").expect("item");
    assert_eq!(failed.state, JobState::FailedTerminal);
    assert_eq!(failed.decisions[0].by, "alice");
    let caller = failed.decisions[0].caller.as_deref().expect("the caller");
    assert!(caller.starts_with("arn:aws:"), "{caller}");

    // A later delivery is acknowledged without a call.
    let handler = aws.handler(&table, SimulatedProvider::new(), fast_settings());
    let source = aws.source(&queue).await;
    aws.send(
        &queue,
        &job(
            "op-fail",
            "slow",
            r#""simulate":{"latency_ms":1000,"retrievable":false}"#,
        ),
    )
    .await;
    let (poll, _) = deliver(&source, &handler).await;
    assert_eq!(poll.deleted, 1);
    assert_eq!(handler.processor().provider().executions(), 0);

    // The operator's command line shows the record and the decision.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_jobctl"))
        .args(["--table", &table, "--json", "show", "op-fail"])
        .output()
        .expect("jobctl runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let shown: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(shown["state"], "failed_terminal");
    assert_eq!(shown["decisions"][0]["action"], "fail");
    assert_eq!(shown["decisions"][0]["caller"], caller);
    assert_eq!(shown["attempt_log"][0]["outcome"], "uncertain");
    let text = std::process::Command::new(env!("CARGO_BIN_EXE_jobctl"))
        .args(["--table", &table, "show", "op-fail"])
        .output()
        .expect("jobctl runs");
    assert!(String::from_utf8_lossy(&text.stdout).contains("failed_terminal"));
    let missing = std::process::Command::new(env!("CARGO_BIN_EXE_jobctl"))
        .args([
            "--table",
            &table,
            "fail",
            "no-such-job",
            "--reason",
            "x",
            "--yes",
        ])
        .output()
        .expect("jobctl runs");
    assert_eq!(missing.status.code(), Some(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobctl_lists_jobs_by_state_from_the_sparse_index() {
    let aws = emulator().await;
    let table = aws.table().await;
    let queue = aws.queue(30).await;
    unknown_job(&aws, &table, &queue, "list-unknown-1").await;
    unknown_job(&aws, &table, &queue, "list-unknown-2").await;
    // A finished job leaves the index.
    let handler = aws.handler(&table, SimulatedProvider::new(), fast_settings());
    let source = aws.source(&queue).await;
    aws.send(&queue, &job("list-done", "quick", "")).await;
    deliver(&source, &handler).await;

    let ledger = aws.ledger(&table);
    let unknown = ledger.list(JobState::Unknown, 10).await.expect("list");
    let ids: Vec<&str> = unknown.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(ids, ["list-unknown-1", "list-unknown-2"], "oldest first");
    assert!(
        ledger
            .list(JobState::Running, 10)
            .await
            .expect("list")
            .is_empty()
    );

    // A decision moves a job to another state in the index.
    let now = SystemClock.now_ms();
    operator::decide(
        &ledger,
        "list-unknown-1",
        OperatorAction::AuthorizeRetry,
        "alice",
        None,
        "retry",
        now,
    )
    .await
    .expect("decide");
    let retry = ledger
        .list(JobState::RetryAuthorized, 10)
        .await
        .expect("list");
    assert_eq!(retry.len(), 1);
    assert_eq!(
        ledger
            .list(JobState::Unknown, 10)
            .await
            .expect("list")
            .len(),
        1
    );

    let out = std::process::Command::new(env!("CARGO_BIN_EXE_jobctl"))
        .args(["--table", &table, "--json", "list", "--state", "unknown"])
        .output()
        .expect("jobctl runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(rows[0]["job_id"], "list-unknown-2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dlq_inspect_pairs_messages_with_ledger_states_and_redrive_moves_only_live_jobs() {
    let aws = emulator().await;
    let table = aws.table().await;
    let queue = aws.queue(30).await;
    unknown_job(&aws, &table, &queue, "dlq-unknown").await;
    let handler = aws.handler(&table, SimulatedProvider::new(), fast_settings());
    let source = aws.source(&queue).await;
    aws.send(&queue, &job("dlq-done", "quick", "")).await;
    deliver(&source, &handler).await;
    // Dead letters, as the redrive policy would leave them.
    let dlq = support::Queue {
        url: queue.dlq_url.clone(),
        arn: String::new(),
        dlq_url: String::new(),
    };
    for body in [
        job(
            "dlq-unknown",
            "slow",
            r#""simulate":{"latency_ms":1000,"retrievable":false}"#,
        ),
        job("dlq-done", "quick", ""),
        job("dlq-done", "changed", ""),
        job("dlq-new", "never seen", ""),
        "{broken".to_owned(),
    ] {
        aws.send(&dlq, &body).await;
    }

    let ledger = aws.ledger(&table);
    let entries = operator::dlq_inspect(
        &ledger,
        None,
        &worker_believed(),
        &SqsReader::new(aws.sqs.clone()),
        &queue.dlq_url,
        10,
        2,
    )
    .await
    .expect("inspect");
    let mut verdicts: Vec<String> = entries.iter().map(|e| e.verdict.label()).collect();
    verdicts.sort();
    assert_eq!(verdicts.len(), 5);
    assert!(
        verdicts.iter().any(|v| v == "redrive (unknown)"),
        "{verdicts:?}"
    );
    assert!(
        verdicts.iter().any(|v| v == "redrive (not in the ledger)"),
        "{verdicts:?}"
    );
    assert!(
        verdicts
            .iter()
            .any(|v| v == "terminal (succeeded): nothing to redrive"),
        "{verdicts:?}"
    );
    assert!(verdicts.iter().any(|v| v == "conflict"), "{verdicts:?}");
    assert!(
        verdicts.iter().any(|v| v.starts_with("poison")),
        "{verdicts:?}"
    );

    // Redrive moves the two live ones; the other three stay in the DLQ.
    let moved = operator::dlq_redrive(
        &SqsReader::new(aws.sqs.clone()),
        &queue.dlq_url,
        &queue.url,
        &entries,
    )
    .await
    .expect("redrive");
    assert_eq!(moved, 2);
    tokio::time::sleep(std::time::Duration::from_millis(2_200)).await;
    assert_eq!(aws.peek(&queue.dlq_url, 0).await.len(), 3);
    // (The unknown job's own message may be back too: it was cut off without being asked
    // about, so it waits only a short backoff.)
    let requeued: std::collections::BTreeSet<String> = aws
        .peek(&queue.url, 0)
        .await
        .iter()
        .filter_map(|m| m.body())
        .filter_map(|b| {
            ["dlq-new", "dlq-unknown", "dlq-done"]
                .into_iter()
                .find(|id| b.contains(id))
                .map(str::to_owned)
        })
        .collect();
    assert_eq!(
        requeued,
        ["dlq-new", "dlq-unknown"].map(str::to_owned).into(),
        "{requeued:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dlq_redrive_works_on_fifo_queues() {
    // GIVEN a dead letter in a FIFO queue's DLQ, for a job the ledger does not hold yet
    let aws = emulator().await;
    let table = aws.table().await;
    let queue = aws.fifo_queue(30).await;
    aws.sqs
        .send_message()
        .queue_url(&queue.dlq_url)
        .message_group_id("fifo-dead")
        .message_deduplication_id("dead-1")
        .message_body(job("fifo-dead", "never seen", ""))
        .send()
        .await
        .expect("dead letter");
    let ledger = aws.ledger(&table);
    let entries = operator::dlq_inspect(
        &ledger,
        None,
        &worker_believed(),
        &SqsReader::new(aws.sqs.clone()),
        &queue.dlq_url,
        10,
        2,
    )
    .await
    .expect("inspect");
    assert_eq!(entries.len(), 1);
    // WHEN it is redriven
    let moved = operator::dlq_redrive(
        &SqsReader::new(aws.sqs.clone()),
        &queue.dlq_url,
        &queue.url,
        &entries,
    )
    .await
    .expect("redrive");
    // THEN it is back in the work queue, in its job's message group
    assert_eq!(moved, 1);
    let requeued = aws.peek(&queue.url, 0).await;
    assert_eq!(requeued.len(), 1);
    assert!(requeued[0].body().is_some_and(|b| b.contains("fifo-dead")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dlq_that_is_not_there_is_a_typed_queue_error() {
    // GIVEN a queue URL that names no queue
    let aws = emulator().await;
    let table = aws.table().await;
    let queue = aws.queue(30).await;
    let gone = format!("{}-gone", queue.dlq_url);
    // WHEN an operator inspects it
    let reader = SqsReader::new(aws.sqs.clone());
    let inspected = operator::dlq_inspect(
        &aws.ledger(&table),
        None,
        &worker_believed(),
        &reader,
        &gone,
        10,
        0,
    )
    .await;
    // THEN SQS's answer is classified, not passed on as text
    assert!(
        matches!(
            &inspected,
            Err(OperatorError::Queue(QueueError::NoSuchQueue(url))) if *url == gone
        ),
        "{inspected:?}"
    );
}

/// `jobctl` with the AWS CLI's habits: options after the subcommand, `--endpoint-url` and
/// `--region`, documented exit codes, confirmation for `fail`, completions, `watch`, and a DLQ
/// inspection or dry run that leaves the messages visible.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobctl_behaves_like_an_aws_command_line() {
    let aws = emulator().await;
    let table = aws.table().await;
    let queue = aws.queue(30).await;
    let endpoint = std::env::var("AWS_ENDPOINT_URL").expect("emulator");
    let jobctl = |args: &[&str], endpoint_url: &str| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_jobctl"))
            .args(args)
            .args([
                "--table",
                &table,
                "--endpoint-url",
                endpoint_url,
                "--region",
                "us-east-1",
            ])
            .env_remove("AWS_ENDPOINT_URL")
            .env_remove("JOBS_TABLE")
            .stdin(std::process::Stdio::null())
            .output()
            .expect("jobctl runs");
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let handler = aws.handler(&table, SimulatedProvider::new(), fast_settings());
    let source = aws.source(&queue).await;
    aws.send(&queue, &job("cli-ok", "fine", "")).await;
    aws.send(
        &queue,
        &job("cli-bad", "no", r#""simulate":{"outcome":"permanent"}"#),
    )
    .await;
    deliver(&source, &handler).await;

    let (code, out, _) = jobctl(&["list", "--state", "ready"], &endpoint);
    assert_eq!(code, 0, "options after the subcommand");
    assert!(out.starts_with("job_id"), "{out}");
    assert_eq!(jobctl(&["show", "nobody"], &endpoint).0, 1, "refused");
    assert_eq!(jobctl(&["show"], &endpoint).0, 2, "usage");
    assert_eq!(
        jobctl(&["show", "cli-ok"], "http://127.0.0.1:9").0,
        3,
        "AWS error"
    );
    let (code, _, err) = jobctl(&["fail", "cli-ok", "--reason", "r"], &endpoint);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--yes"), "{err}");
    let (code, out, _) = jobctl(&["watch", "cli-ok"], &endpoint);
    assert_eq!(code, 0);
    assert!(out.contains("succeeded"), "{out}");
    assert_eq!(jobctl(&["watch", "cli-bad"], &endpoint).0, 1);
    let (code, out, _) = jobctl(&["completions", "bash"], &endpoint);
    assert_eq!(code, 0);
    assert!(out.contains("jobctl"), "a completion script");

    // The DLQ: inspected and dry-run, its message stays there, visible.
    let dlq = support::Queue {
        url: queue.dlq_url.clone(),
        arn: String::new(),
        dlq_url: String::new(),
    };
    aws.send(&dlq, &job("cli-new", "never seen", "")).await;
    let (code, out, _) = jobctl(&["dlq", "--dlq-url", &queue.dlq_url, "inspect"], &endpoint);
    assert_eq!(code, 0);
    assert!(out.contains("redrive (not in the ledger)"), "{out}");
    let (code, out, _) = jobctl(
        &[
            "dlq",
            "--dlq-url",
            &queue.dlq_url,
            "redrive",
            "--queue-url",
            &queue.url,
            "--dry-run",
        ],
        &endpoint,
    );
    assert_eq!(code, 0);
    assert!(!out.contains("redriven"), "{out}");
    assert_eq!(
        aws.peek(&queue.dlq_url, 0).await.len(),
        1,
        "still there, visible"
    );
    assert!(aws.peek(&queue.url, 0).await.is_empty(), "nothing moved");
}

/// `jobctl dlq` reads an Extended Client pointer as the worker does: followed to its payload and
/// judged by the job in it; one whose payload is gone stands for the job its message names, and
/// is poison without one; a redrive sends the message's own attributes back with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dlq_follows_extended_client_pointers_and_redrives_them_with_their_attributes() {
    use fenced_jobs::blobs::s3::S3Blobs;
    use fenced_jobs::job::{JobDefaults, NewJob};
    use fenced_jobs::ledger::CreateRequest;
    let aws = emulator().await;
    let table = aws.table().await;
    let queue = aws.queue(30).await;
    let bucket = aws.bucket().await;
    let ledger = aws.ledger(&table);
    // GIVEN two live jobs: one whose pointer's payload is in the producer's bucket, one whose
    // payload the bucket's lifecycle dropped
    let now = fenced_jobs::clock::SystemClock.now_ms();
    for id in ["ptr-kept", "ptr-dropped"] {
        let body = job(id, "a long document", "");
        if id == "ptr-kept" {
            aws.s3
                .put_object()
                .bucket(&bucket)
                .key(format!("payloads/{id}"))
                .body(body.clone().into_bytes().into())
                .send()
                .await
                .expect("put payload");
        }
        let msg = fenced_jobs::job::parse_body(Some(&body)).expect("valid");
        let req = CreateRequest {
            job: NewJob::from_message(&msg, now, &JobDefaults::default()),
            now,
            enqueued: true,
        };
        ledger.create(req).await.expect("create");
    }
    let pointer = |id: &str| {
        serde_json::json!([
            "software.amazon.payloadoffloading.PayloadS3Pointer",
            {"s3BucketName": bucket, "s3Key": format!("payloads/{id}")}
        ])
        .to_string()
    };
    let string = |v: &str| {
        aws_sdk_sqs::types::MessageAttributeValue::builder()
            .data_type("String")
            .string_value(v)
            .build()
            .expect("attribute")
    };
    // AND their pointers in the DLQ, the second naming its job, a third naming none
    for (id, named) in [
        ("ptr-kept", None),
        ("ptr-dropped", Some("ptr-dropped")),
        ("ptr-anonymous", None),
    ] {
        let mut send = aws
            .sqs
            .send_message()
            .queue_url(&queue.dlq_url)
            .message_body(pointer(id))
            .message_attributes("ExtendedPayloadSize", string("120"))
            .message_attributes("fenced-jobs.reason", string("poison"));
        if let Some(job_id) = named {
            send = send.message_attributes("fenced-jobs.job-id", string(job_id));
        }
        send.send().await.expect("dead letter");
    }
    // WHEN the DLQ is inspected with the producer's bucket readable
    let blobs = S3Blobs::new(aws.s3.clone(), None);
    let entries = operator::dlq_inspect(
        &ledger,
        Some(&blobs),
        &worker_believed(),
        &SqsReader::new(aws.sqs.clone()),
        &queue.dlq_url,
        10,
        2,
    )
    .await
    .expect("inspect");
    let mut verdicts: Vec<(Option<String>, String)> = entries
        .iter()
        .map(|e| (e.job_id.clone(), e.verdict.label()))
        .collect();
    verdicts.sort();
    // THEN each live job is redrivable and the anonymous pointer is poison
    assert_eq!(
        verdicts,
        [
            (
                None,
                "poison (the payload the pointer names does not exist)".to_owned()
            ),
            (Some("ptr-dropped".into()), "redrive (ready)".to_owned()),
            (Some("ptr-kept".into()), "redrive (ready)".to_owned()),
        ],
    );
    // AND a redrive sends the two back with their own attributes, not the worker's
    let moved = operator::dlq_redrive(
        &SqsReader::new(aws.sqs.clone()),
        &queue.dlq_url,
        &queue.url,
        &entries,
    )
    .await
    .expect("redrive");
    assert_eq!(moved, 2);
    let back = aws
        .sqs
        .receive_message()
        .queue_url(&queue.url)
        .max_number_of_messages(10)
        .message_attribute_names("All")
        .send()
        .await
        .expect("receive");
    let messages = back.messages();
    assert_eq!(messages.len(), 2);
    for m in messages {
        let names: std::collections::BTreeSet<&str> = m
            .message_attributes()
            .into_iter()
            .flatten()
            .map(|(n, _)| n.as_str())
            .collect();
        assert!(names.contains("ExtendedPayloadSize"), "{names:?}");
        assert!(!names.contains("fenced-jobs.reason"), "{names:?}");
    }
}

/// jobctl believing the worker's dead letters: on the emulator every message's sender is the
/// one principal moto names.
fn worker_believed() -> Producers {
    Producers::parse("", crate::support::EMULATOR_SENDER).expect("parsed")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reconciler_sends_a_live_jobs_dead_letter_back_and_leaves_the_others() {
    // GIVEN a queue whose redrive policy allows 5 receives, and a job whose first attempt
    // failed on a message SQS keeps: its item keeps no input and is not watched, so the
    // message is all that can run it again
    let aws = emulator().await;
    let table = aws.table().await;
    let queue = aws.queue_with_receives(1, 5).await;
    let mut settings = fast_settings();
    settings.visibility.max_receive_count = 5;
    let handler = aws.handler(&table, SimulatedProvider::new(), settings);
    let source = aws.source(&queue).await;
    let body = job("sweep-1", "p", r#""simulate":{"fail_times":1}"#);
    aws.send(&queue, &body).await;
    aws.send(&queue, "{not json").await;
    deliver(&source, &handler).await;
    let item = aws.item(&table, "sweep-1").await;
    assert_eq!(item.state, JobState::RetryAuthorized, "{item:?}");
    assert!(!item.keeps_input() && !item.watched, "{item:?}");

    // WHEN a run of receives ends before any writes the job (a crash loop) and the redrive
    // policy moves its message to the DLQ, beside the worker's own poison letter
    let dead = || fenced_jobs::queue::sqs::depth(&aws.sqs, &queue.dlq_url);
    for _ in 0..40 {
        if dead().await == Some(2) {
            break;
        }
        let received = aws
            .sqs
            .receive_message()
            .queue_url(&queue.url)
            .visibility_timeout(0)
            .wait_time_seconds(1)
            .send()
            .await;
        received.expect("receive");
    }
    assert_eq!(dead().await, Some(2), "the DLQ");
    let ledger = aws.ledger(&table);
    let later = SystemClock.now_ms() + 3_600_000;
    let quick = fenced_jobs::ops::reconcile::ReconcileSettings {
        ready_after_ms: 1_000,
        retry_after_ms: 1_000,
        ..Default::default()
    };
    let sender = SqsTriggers::new(aws.sqs.clone(), queue.url.clone());
    let provider = SimulatedProvider::new();
    let report = fenced_jobs::ops::reconcile::reconcile(&ledger, &sender, &provider, later, &quick);
    let report = report.await.expect("reconcile");
    // (no index holds the job: nothing else would send it again)
    assert_eq!(report.resent, 0, "{report:?}");
    let reader = SqsReader::new(aws.sqs.clone());
    let urls = (queue.dlq_url.as_str(), queue.url.as_str());
    let limits = (10, SystemClock.now_ms());
    let anyone = Producers::default();
    let swept = operator::redrive_live(&ledger, &anyone, &reader, urls, limits).await;

    // THEN the job's letter goes back to the work queue, and its next delivery finishes it with
    // one more call; the poison letter stays in the DLQ for a person
    assert_eq!(
        (swept.moved, swept.left, swept.failed),
        (1, 1, 0),
        "{swept:?}"
    );
    // (the letter left was sent just now)
    let age = SystemClock.now_ms() - swept.oldest_left.expect("a letter left");
    assert!((0..600_000).contains(&age), "{age}");
    let mut item = aws.item(&table, "sweep-1").await;
    for _ in 0..10 {
        deliver(&source, &handler).await;
        item = aws.item(&table, "sweep-1").await;
        if item.state.is_terminal() {
            break;
        }
    }
    assert_eq!(item.state, JobState::Succeeded, "{item:?}");
    assert_eq!(handler.processor().provider().executions(), 2);
    // (held out of sight for the sweep's 30 s, so counted rather than read)
    assert_eq!(dead().await, Some(1), "the poison letter");
}
