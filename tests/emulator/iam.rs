//! Each function under its own role: the worker, the reconciler and the dispatcher run their
//! main paths on the emulator with clients that record every request, and every recorded
//! (role, action, resource) is judged against the template's own policies, resolved as
//! CloudFormation would with this test's resources, by an IAM evaluator we did not write
//! (`scripts/iam_check.py`, `@cloud-copilot/iam-simulate`). A call the role may not make fails
//! the test as AWS would refuse it. moto itself enforces no IAM that could judge these (see the
//! script's header).

use std::sync::{Arc, Mutex};

use fenced_jobs::blobs::s3::S3Blobs;
use fenced_jobs::clock::{Clock, SystemClock};
use fenced_jobs::events::aws::AwsSink;
use fenced_jobs::ops::operator::redrive_live;
use fenced_jobs::ops::producer::{Intake, submit};
use fenced_jobs::ops::reconcile::{ReconcileSettings, reconcile};
use fenced_jobs::ops::results::sweep_orphans;
use fenced_jobs::provider::SimulatedProvider;
use fenced_jobs::queue::{SqsDeadLetters, SqsReader, SqsTriggers, SqsVisibility};
use fenced_jobs::testing::sdk_calls::RecordedCall;
use fenced_jobs::worker::handler::BatchHandler;
use fenced_jobs::worker::processor::Processor;

use crate::support::{self, deliver, emulator, emulator_as, fast_settings, job};

/// Judges `calls` against the template with `resources` (logical id to physical name); the
/// evaluator's refusals, if any.
fn refusals(resources: serde_json::Value, calls: &[RecordedCall]) -> Result<String, String> {
    refusals_with(resources, serde_json::json!({}), calls)
}

/// [`refusals`] for a stack made with `parameters`.
fn refusals_with(
    resources: serde_json::Value,
    parameters: serde_json::Value,
    calls: &[RecordedCall],
) -> Result<String, String> {
    let root = env!("CARGO_MANIFEST_DIR");
    let file = std::env::temp_dir().join(support::unique("iam-calls") + ".json");
    let document =
        serde_json::json!({"resources": resources, "parameters": parameters, "calls": calls});
    std::fs::write(&file, document.to_string()).expect("write calls");
    let python = format!("{root}/.venv/bin/python");
    let out = std::process::Command::new(python)
        .arg(format!("{root}/scripts/iam_check.py"))
        .arg(format!("{root}/template.yaml"))
        .arg(&file)
        .output()
        .expect("run scripts/iam_check.py (make test installs .venv and scripts/iam)");
    let _ = std::fs::remove_file(&file);
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    if out.status.success() {
        Ok(said)
    } else {
        Err(said)
    }
}

/// The queue's name, the last part of its URL.
fn name_of(url: &str) -> &str {
    url.rsplit('/').next().unwrap_or(url)
}

/// The reconciler's runs under its role: a lost trigger re-sent, an orphan sweep, the DLQ's
/// sweep and today's spend forecast.
async fn reconciler_runs(
    setup: &support::Emulator,
    calls: &Arc<Mutex<Vec<RecordedCall>>>,
    table: &str,
    (queue, urgent): (&support::Queue, &support::Queue),
    bucket: &str,
) {
    // AND the reconciler runs later, under its role: a lost trigger re-sent, an orphan sweep
    let reconciler = emulator_as("ReconcilerRole", calls).await;
    let producer = setup.ledger(table);
    let later = SystemClock.now_ms() + 600_000;
    let resent = reconcile(
        &reconciler.ledger(table),
        &SqsTriggers::new(reconciler.sqs.clone(), queue.url.clone())
            .with_urgent(Some(urgent.url.clone())),
        &SimulatedProvider::new(),
        later,
        &ReconcileSettings {
            ready_after_ms: 1_000,
            retry_after_ms: 1_000,
            enqueue_stale_after_ms: 1_000,
            ..ReconcileSettings::default()
        },
    )
    .await
    .expect("reconcile");
    assert!(resent.resent >= 1, "{resent:?}");
    let blobs = S3Blobs::new(reconciler.s3.clone(), Some(bucket.to_owned()));
    sweep_orphans(
        &reconciler.ledger(table),
        &blobs,
        later - 3_600_000,
        later,
        (100, fenced_jobs::job::DEFAULT_INLINE_MAX_BYTES),
    )
    .await
    .expect("sweep");
    // AND its DLQ sweep: a live job's letter, as the redrive policy leaves it, goes back to the
    // work queue; the worker's poison letter stays
    let letter = job("iam-again", "p", r#""simulate":{"fail_times":1}"#);
    let dead = setup.sqs.send_message().queue_url(&queue.dlq_url);
    dead.message_body(letter).send().await.expect("dead letter");
    let reader = SqsReader::new(reconciler.sqs.clone());
    let urls = (queue.dlq_url.as_str(), queue.url.as_str());
    let anyone = fenced_jobs::job::scope::Producers::default();
    let limits = (10, SystemClock.now_ms());
    let swept = redrive_live(&reconciler.ledger(table), &anyone, &reader, urls, limits).await;
    assert_eq!(
        (swept.moved, swept.left, swept.failed),
        (1, 1, 0),
        "{swept:?}"
    );
    // AND today's spend forecast, under its role: the queues' depth and the day's items (one
    // charged call today, 60 of a 1,000 limit)
    {
        use fenced_jobs::ledger::spend::SpendBudget;
        let now = SystemClock.now_ms();
        let today = fenced_jobs::ops::spend::day_of(now);
        let reserved = producer.reserve(&today, "sim-1", 100, 1_000, now);
        assert!(reserved.await.expect("reserve"));
        let charged = producer.charge(&today, ("sim-1", "standard"), 100, 60, now);
        charged.await.expect("charge");
    }
    let depth = fenced_jobs::queue::sqs::depth(&reconciler.sqs, &queue.url).await;
    let depth = depth.expect("the reconciler reads the work queue's depth");
    let now = SystemClock.now_ms();
    let read_as_reconciler = reconciler.ledger(table);
    let percent = fenced_jobs::ops::spend::today_percent(&read_as_reconciler, depth, now);
    let percent = percent.await.expect("the reconciler reads today's items");
    assert_eq!(percent, Some((60 + depth * 60) * 100 / 1_000));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_function_makes_only_the_calls_its_role_in_the_template_allows() {
    // GIVEN the stack's table, work queue, urgent queue, DLQ, results bucket and event bus,
    // made by the test's own (unjudged) clients
    let setup = emulator().await;
    let table = setup.table().await;
    let queue = setup.queue(30).await;
    let urgent = setup.queue(30).await;
    let bucket = setup.bucket().await;
    let bus = support::unique("bus");
    setup
        .events
        .create_event_bus()
        .name(&bus)
        .send()
        .await
        .expect("bus");
    let calls: Arc<Mutex<Vec<RecordedCall>>> = Arc::default();

    // AND jobs on both queues that take the worker's every path: an answer stored in S3, a
    // transient failure (a visibility change on each queue), poison (a dead letter)
    let producer = setup.ledger(&table);
    let sender = SqsTriggers::new(setup.sqs.clone(), queue.url.clone())
        .with_urgent(Some(urgent.url.clone()));
    let lines = [
        job("iam-big", "p", r#""simulate":{"answer_bytes":20000}"#),
        job("iam-again", "p", r#""simulate":{"fail_times":1}"#),
        r#"{"job_id":"iam-urgent","priority":"urgent","contract":"summary.v1","input":{"model":"sim-1","prompt":"p","simulate":{"fail_times":1}}}"#.to_owned(),
        r#"{"job_id":"iam-lost","priority":"urgent","contract":"summary.v1","input":{"model":"sim-1","prompt":"p"}}"#.to_owned(),
    ];
    let report = submit(
        &producer,
        &sender,
        lines.into_iter().map(Ok),
        || SystemClock.now_ms(),
        &Intake::default(),
        |_| {},
    )
    .await;
    assert_eq!(report.created, 4, "{report:?}");
    setup.send(&queue, "{not json").await;

    // WHEN the worker handles both queues as its event source mappings would, under its role
    let worker = emulator_as("WorkerRole", &calls).await;
    let handler = BatchHandler::new(
        Processor::new(
            worker.ledger(&table),
            SimulatedProvider::new(),
            SystemClock,
            fast_settings(),
        )
        .with_blobs(Arc::new(S3Blobs::new(
            worker.s3.clone(),
            Some(bucket.clone()),
        ))),
        SqsVisibility::new(worker.sqs.clone()),
    )
    .with_dead_letters(Arc::new(SqsDeadLetters::new(
        worker.sqs.clone(),
        queue.dlq_url.clone(),
    )))
    .with_seed(3);
    let mut on_urgent = worker.source(&urgent).await;
    on_urgent.batch_size = 1;
    let (poll, _) = deliver(&worker.source(&queue).await, &handler).await;
    assert_eq!((poll.received, poll.deleted), (3, 2), "{poll:?}");
    let (poll, _) = deliver(&on_urgent, &handler).await;
    assert_eq!(poll.received, 1, "{poll:?}");

    reconciler_runs(&setup, &calls, &table, (&queue, &urgent), &bucket).await;

    // AND the dispatcher announces what ended, under its role
    let dispatcher = emulator_as("DispatcherRole", &calls).await;
    let sink = AwsSink::EventBridge {
        client: dispatcher.events.clone(),
        bus: bus.clone(),
    };
    crate::support::announce(&setup.ddb, dispatcher.streams.clone(), &table, &sink).await;

    // THEN every request each role sent is one its policy in the template allows
    let calls = calls.lock().expect("calls").clone();
    for (role, service) in [
        ("WorkerRole", "sqs"),
        ("WorkerRole", "dynamodb"),
        ("WorkerRole", "s3"),
        ("ReconcilerRole", "sqs"),
        ("DispatcherRole", "eventbridge"),
    ] {
        assert!(
            calls.iter().any(|c| c.role == role && c.service == service),
            "{role} sent no {service} request: the scenario no longer covers it"
        );
    }
    let urgent_visibility = calls.iter().any(|c| {
        c.role == "WorkerRole"
            && c.operation.starts_with("ChangeMessageVisibility")
            && c.names.get("QueueUrl").map(String::as_str) == Some(urgent.url.as_str())
    });
    assert!(
        urgent_visibility,
        "the worker changed no urgent record's visibility"
    );
    let resources = serde_json::json!({
        "JobsQueue": name_of(&queue.url),
        "UrgentQueue": name_of(&urgent.url),
        "JobsDeadLetterQueue": name_of(&queue.dlq_url),
        "JobsTable": table,
        "ResultsBucket": bucket,
        "CompletionBus": bus,
    });
    if let Err(refused) = refusals(resources, &calls) {
        panic!("requests the template's roles may not make:\n{refused}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_webhook_function_acts_once_on_a_signed_batch_end_under_its_own_role() {
    use fenced_jobs::job::{BatchMember, JobClass};
    use fenced_jobs::ledger::JobLedger;
    use fenced_jobs::ops::webhook::{Answer, UrlRequest, handle, read_secret};
    // GIVEN the stack's table and queues, the endpoint's signing secret in Secrets Manager, and
    // a batch whose creator listed a normal job and an urgent one
    let setup = emulator().await;
    let table = setup.table().await;
    let queue = setup.queue(30).await;
    let urgent = setup.queue(30).await;
    let secret_id = support::unique("webhook-secret");
    aws_sdk_secretsmanager::Client::new(&setup.config)
        .create_secret()
        .name(&secret_id)
        .secret_string(r#"{"webhook_secret":"whsec_c2VjcmV0LWtleQ=="}"#)
        .send()
        .await
        .expect("create secret");
    let lookup = |name: &str| (name == "OPENAI_WEBHOOK_SECRET_ID").then(|| secret_id.clone());
    let secret = read_secret(&lookup, &setup.config)
        .await
        .expect("the secret");
    let calls: Arc<Mutex<Vec<RecordedCall>>> = Arc::default();
    let worker = emulator_as("WorkerRole", &calls).await;
    let members = [
        BatchMember {
            job_id: "hook-a".to_owned(),
            class: JobClass::default(),
        },
        BatchMember {
            job_id: "hook-b".to_owned(),
            class: JobClass {
                tenant: Some("t1".to_owned()),
                urgent: true,
            },
        },
    ];
    let now = SystemClock.now_ms();
    let as_worker = worker.ledger(&table);
    let listed = as_worker.note_batch_members("batch_9", &members, now);
    listed.await.expect("the worker lists the batch's jobs");

    // WHEN OpenAI's signed webhook says the batch completed, to the function under its role
    let hook = emulator_as("WebhookRole", &calls).await;
    let (ledger, sender) = (
        hook.ledger(&table),
        SqsTriggers::new(hook.sqs.clone(), queue.url.clone()).with_urgent(Some(urgent.url.clone())),
    );
    let body =
        r#"{"id":"evt_9","object":"event","type":"batch.completed","data":{"id":"batch_9"}}"#;
    let signed = |id: &str, with: &fenced_jobs::ops::webhook::WebhookSecret| {
        UrlRequest::signed(with, id, now / 1_000, body)
    };
    let answer = handle(&signed("msg_9", &secret), &secret, &ledger, &sender, now).await;
    // THEN each job's trigger by id is on the urgent queue, ahead of the work queue's backlog
    assert_eq!(answer, Answer::Triggered(2));
    let bodies = |url: &str| {
        let sqs = setup.sqs.clone();
        let url = url.to_owned();
        async move {
            let out = sqs
                .receive_message()
                .queue_url(url)
                .max_number_of_messages(10);
            let out = out.send().await.expect("receive");
            let got: Vec<String> = out
                .messages()
                .iter()
                .filter_map(|m| m.body().map(str::to_owned))
                .collect();
            got
        }
    };
    assert!(bodies(&queue.url).await.is_empty());
    let mut on_urgent = bodies(&urgent.url).await;
    on_urgent.sort();
    assert_eq!(
        on_urgent,
        [r#"{"job_id":"hook-a"}"#, r#"{"job_id":"hook-b"}"#]
    );
    // AND the same delivery again, or one signed by a stranger, sends nothing
    let again = handle(
        &signed("msg_9", &secret),
        &secret,
        &ledger,
        &sender,
        now + 1_000,
    )
    .await;
    assert_eq!(again, Answer::Replayed);
    let stranger = fenced_jobs::ops::webhook::WebhookSecret::parse("whsec_c3RyYW5nZXI=");
    let stranger = stranger.expect("base64");
    let forged = handle(&signed("msg_10", &stranger), &secret, &ledger, &sender, now).await;
    assert!(matches!(forged, Answer::Refused(_)), "{forged:?}");
    assert!(bodies(&urgent.url).await.is_empty());

    // AND every request the function sent is one its role allows: the batch's list and its own
    // records in the table (never a job's item), and the two queues
    let calls = calls.lock().expect("calls").clone();
    let its_own: Vec<&RecordedCall> = calls.iter().filter(|c| c.role == "WebhookRole").collect();
    assert!(
        its_own.iter().any(|c| c.service == "dynamodb"),
        "{its_own:?}"
    );
    assert!(its_own.iter().any(|c| c.service == "sqs"), "{its_own:?}");
    let resources = serde_json::json!({
        "JobsQueue": name_of(&queue.url),
        "UrgentQueue": name_of(&urgent.url),
        "JobsTable": table,
    });
    // With the senders named, as the template advises: the queues' own policy lets the
    // function send.
    let stack = serde_json::json!({
        "OpenAiWebhookSecretArn": format!("arn:aws:secretsmanager:us-east-1:123456789012:secret:{secret_id}"),
        "QueueSenderArns": "arn:aws:iam::123456789012:role/producer",
    });
    if let Err(refused) = refusals_with(resources.clone(), stack.clone(), &calls) {
        panic!("requests the template's roles may not make:\n{refused}");
    }
    // AND the role could not touch a job's own item
    let mut stray = its_own[0].clone();
    stray.service = "dynamodb".to_owned();
    stray.operation = "GetItem".to_owned();
    stray.names.insert("TableName".to_owned(), table.clone());
    stray
        .names
        .insert("LeadingKey".to_owned(), "hook-a".to_owned());
    let judged = refusals_with(resources, stack, &[stray]);
    assert!(
        judged.is_err(),
        "the webhook's role may read a job's item: {judged:?}"
    );
}
