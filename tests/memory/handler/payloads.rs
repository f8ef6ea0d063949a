//! Payloads outside the body: Extended Client pointers, stored inputs and answers, reads within
//! the memory set aside for them, and inputs that went missing.

use std::sync::Arc;

use aws_lambda_events::event::sqs::SqsMessage;
use fenced_jobs::clock::{Clock, SystemClock};
use fenced_jobs::job::{JobState, RecordOutcome};
use fenced_jobs::ledger::JobLedger;
use fenced_jobs::ledger::memory::InMemoryLedger;
use fenced_jobs::provider::SimulatedProvider;
use fenced_jobs::queue::RecordingVisibility;
use fenced_jobs::worker::Settings;
use fenced_jobs::worker::handler::BatchHandler;
use fenced_jobs::worker::processor::{Invocation, Processor};

use super::{event, handler, handler_with_blobs, invocation, job, reading_payloads, record};

/// A trigger for a job whose input is stored reads the object only when it will call: behind
/// a live owner it defers without touching the store (here one that fails every call).
#[tokio::test]
async fn a_stored_input_is_read_only_when_the_delivery_will_call() {
    use fenced_jobs::blobs::MemoryBlobs;
    use fenced_jobs::job::{BlobRef, Expect, NewJob};
    use fenced_jobs::ledger::ClaimRequest;
    let ledger = Arc::new(InMemoryLedger::new());
    let blobs = Arc::new(MemoryBlobs::new("results"));
    blobs.fail(true);
    let h = BatchHandler::new(
        Processor::new(
            ledger.clone(),
            SimulatedProvider::new(),
            SystemClock,
            Settings::default(),
        )
        .with_blobs(blobs),
        RecordingVisibility::new(),
    )
    .with_seed(1);
    let now = SystemClock.now_ms();
    let job = NewJob {
        class: Default::default(),
        job_id: "stored-in".into(),
        input_digest: "d".into(),
        contract: "c".into(),
        input: String::new(),
        input_ref: Some(BlobRef {
            bucket: "results".into(),
            key: "inputs/stored-in/d.json".into(),
            size: 10,
            sha256: "e".repeat(64),
        }),
        metadata: None,
        deadline_at: now + 3_600_000,
        max_attempts: 3,
        max_cost_micros: None,
        expires_at: 0,
    };
    let claimed = ledger
        .claim(ClaimRequest {
            job,
            expect: Expect::FRESH,
            owner_id: "live-owner".into(),
            now,
            lease_until: now + 60_000,
            provider_ref: None,
            route: None,
            first_sight: false,
            list_due: false,
        })
        .await
        .expect("claim");
    assert!(matches!(claimed, fenced_jobs::ledger::Write::Applied(_)));
    let report = h
        .handle_batch(
            &event(vec![record(Some("t"), r#"{"job_id":"stored-in"}"#)]),
            &invocation(),
        )
        .await;
    assert_eq!(
        report.records[0].outcome.label(),
        "deferred",
        "{:?}",
        report.records[0].outcome
    );
}

/// Payloads outside the body: an Extended Client pointer is followed, a missing or malformed one
/// is poison, a store that cannot be reached is a backoff, and an answer above the inline limit
/// is stored and referenced, or without a bucket kept inline when the item can hold it.
#[tokio::test]
async fn pointers_and_stored_answers_get_their_documented_outcomes() {
    use fenced_jobs::blobs::MemoryBlobs;
    let class = "software.amazon.payloadoffloading.PayloadS3Pointer";
    let pointer =
        |key: &str| format!(r#"["{class}",{{"s3BucketName":"producer","s3Key":"{key}"}}]"#);
    let blobs = Arc::new(MemoryBlobs::new("results"));
    blobs.insert("producer", "p/ok", job("j-ptr", "").as_bytes());
    blobs.insert("producer", "p/bad", b"{not json");
    // What the worker keeps is never a job's input, whoever names it.
    blobs.insert(
        "producer",
        "results/j/1/ab.json",
        job("j-theirs", "").as_bytes(),
    );
    blobs.insert("other", "p/ok", job("j-other", "").as_bytes());
    blobs.insert("producer", "p/../p/ok", job("j-dots", "").as_bytes());
    let ledger = Arc::new(InMemoryLedger::new());
    let h = BatchHandler::new(
        Processor::new(
            ledger.clone(),
            SimulatedProvider::new(),
            SystemClock,
            reading_payloads(),
        )
        .with_blobs(blobs.clone()),
        RecordingVisibility::new(),
    )
    .with_seed(1);
    let rows = [
        ("pointer", pointer("p/ok"), "succeeded"),
        ("pointer to nothing", pointer("p/gone"), "poison"),
        ("pointer to a bad body", pointer("p/bad"), "poison"),
        (
            "pointer of the wrong shape",
            format!(r#"["{class}",{{"s3Key":"k"}}]"#),
            "poison",
        ),
        (
            "pointer to another bucket",
            format!(r#"["{class}",{{"s3BucketName":"other","s3Key":"p/ok"}}]"#),
            "poison",
        ),
        (
            "pointer to a stored answer",
            pointer("results/j/1/ab.json"),
            "poison",
        ),
        ("pointer with a dot segment", pointer("p/../p/ok"), "poison"),
        (
            "large answer",
            job("j-large", r#","simulate":{"answer_bytes":100000}"#),
            "succeeded",
        ),
    ];
    let records = rows
        .iter()
        .enumerate()
        .map(|(i, (_, body, _))| record(Some(&format!("m{i}")), body))
        .collect();
    let report = h.handle_batch(&event(records), &invocation()).await;
    for (r, (name, _, expected)) in report.records.iter().zip(&rows) {
        assert_eq!(r.outcome.label(), *expected, "{name}: {:?}", r.outcome);
    }
    for unread in ["j-theirs", "j-other", "j-dots"] {
        assert!(ledger.get(unread).await.expect("get").is_none(), "{unread}");
    }
    let large = ledger.get("j-large").await.expect("get").expect("item");
    let blob = large.result_ref.expect("stored");
    assert_eq!(large.result, None);
    assert_eq!(blobs.keys(), vec![blob.key.clone()]);
    let ptr = ledger.get("j-ptr").await.expect("get").expect("item");
    assert_eq!(
        ptr.input_digest,
        fenced_jobs::job::parse_body(Some(&job("j-ptr", "")))
            .expect("valid")
            .digest
    );

    // The store unreachable: the pointer's record backs off; nothing is poisoned.
    blobs.fail(true);
    let report = h
        .handle_batch(
            &event(vec![record(Some("again"), &pointer("p/ok"))]),
            &invocation(),
        )
        .await;
    assert_eq!(report.records[0].outcome.label(), "backoff");
    // An answer too large for the item, with the bucket refusing it, from a provider that
    // keeps it under the attempt's reference: not paid for again. The job is handed over (it
    // stays running, its lease ended) and the record backs off.
    let huge = job("j-huge", r#","simulate":{"answer_bytes":450000}"#);
    let before = h.processor().provider().executions();
    let report = h
        .handle_batch(&event(vec![record(Some("huge"), &huge)]), &invocation())
        .await;
    assert_eq!(report.records[0].outcome.label(), "backoff");
    let item = ledger.get("j-huge").await.expect("get").expect("item");
    assert_eq!((item.state, item.attempts), (JobState::Running, 1));
    assert_eq!(h.processor().provider().executions(), before + 1);
    // Once the bucket works again, the next delivery (after the ended lease's skew margin)
    // fetches the answer from the provider and stores it: one execution in all.
    blobs.fail(false);
    tokio::time::sleep(std::time::Duration::from_millis(2_100)).await;
    let report = h
        .handle_batch(&event(vec![record(Some("huge-2"), &huge)]), &invocation())
        .await;
    assert_eq!(report.records[0].outcome.label(), "succeeded");
    let item = ledger.get("j-huge").await.expect("get").expect("item");
    assert!(item.result_ref.is_some(), "{item:?}");
    assert_eq!(
        h.processor().provider().executions(),
        before + 1,
        "paid once"
    );
    blobs.fail(true);

    // Without a bucket, a large answer the item can hold stays inline.
    let plain = handler(
        Arc::new(InMemoryLedger::new()),
        SimulatedProvider::new(),
        reading_payloads(),
    );
    let report = plain
        .handle_batch(
            &event(vec![record(
                Some("l"),
                &job("j-inline", r#","simulate":{"answer_bytes":100000}"#),
            )]),
            &invocation(),
        )
        .await;
    assert_eq!(report.records[0].outcome.label(), "succeeded");
    let kept = plain
        .processor()
        .ledger()
        .get("j-inline")
        .await
        .expect("get")
        .expect("item");
    assert!(kept.result.expect("inline").len() > 100_000);
}

#[tokio::test]
async fn an_answer_too_large_for_the_item_fails_the_job_once_and_is_never_retried() {
    // GIVEN a job whose answer is about 450 KB, more than a DynamoDB item holds
    let ledger = Arc::new(InMemoryLedger::new());
    let h = handler(
        ledger.clone(),
        SimulatedProvider::new(),
        Settings::default(),
    );
    let body = job("huge", r#","simulate":{"answer_bytes":450000}"#);
    // WHEN it is processed, and delivered again
    let first = h
        .handle_batch(&event(vec![record(Some("m1"), &body)]), &invocation())
        .await;
    let again = h
        .handle_batch(&event(vec![record(Some("m2"), &body)]), &invocation())
        .await;
    // THEN the attempt ends failed_terminal with the reason, one call paid, nothing looping
    for report in [&first, &again] {
        assert_eq!(
            report.records[0].outcome,
            RecordOutcome::Done(JobState::FailedTerminal)
        );
    }
    assert_eq!(h.processor().provider().executions(), 1);
    let item = ledger.get("huge").await.expect("get").expect("item");
    assert_eq!(item.result, None);
    let error = item.last_error.expect("error");
    assert_eq!(error.kind, "too_large");
    assert!(error.message.contains("bytes"), "{}", error.message);
}

/// A results bucket whose reads of the producer's bucket take `delay` each, or never answer
/// (`None`).
#[derive(Debug)]
struct SlowReads {
    store: fenced_jobs::blobs::MemoryBlobs,
    delay: Option<std::time::Duration>,
}

impl fenced_jobs::blobs::BlobStore for SlowReads {
    fn bucket(&self) -> Option<&str> {
        self.store.bucket()
    }
    fn put<'a>(
        &'a self,
        key: &'a str,
        body: &'a [u8],
    ) -> futures::future::BoxFuture<
        'a,
        Result<fenced_jobs::job::BlobRef, fenced_jobs::blobs::BlobError>,
    > {
        self.store.put(key, body)
    }
    fn get<'a>(
        &'a self,
        bucket: &'a str,
        key: &'a str,
        limit: usize,
    ) -> futures::future::BoxFuture<'a, Result<Vec<u8>, fenced_jobs::blobs::BlobError>> {
        Box::pin(async move {
            if bucket == "producer" {
                match self.delay {
                    Some(delay) => tokio::time::sleep(delay).await,
                    None => std::future::pending().await,
                }
            }
            self.store.get(bucket, key, limit).await
        })
    }
    fn delete<'a>(
        &'a self,
        key: &'a str,
    ) -> futures::future::BoxFuture<'a, Result<(), fenced_jobs::blobs::BlobError>> {
        self.store.delete(key)
    }
    fn list<'a>(
        &'a self,
        prefix: &'a str,
        limit: usize,
    ) -> futures::future::BoxFuture<'a, Result<Vec<String>, fenced_jobs::blobs::BlobError>> {
        self.store.list(prefix, limit)
    }
}

fn pointer_record(id: &str, key: &str, size: Option<usize>) -> SqsMessage {
    let class = "software.amazon.payloadoffloading.PayloadS3Pointer";
    let body = format!(r#"["{class}",{{"s3BucketName":"producer","s3Key":"{key}"}}]"#);
    let mut r = record(Some(id), &body);
    if let Some(size) = size {
        let mut attribute = aws_lambda_events::sqs::SqsMessageAttribute::default();
        attribute.string_value = Some(size.to_string());
        attribute.data_type = Some("Number".into());
        r.message_attributes
            .insert("ExtendedPayloadSize".into(), attribute);
    }
    r
}

#[tokio::test]
async fn payloads_are_read_one_at_a_time_within_the_memory_set_aside_for_them() {
    use fenced_jobs::blobs::MemoryBlobs;
    // GIVEN four Extended Client pointers to payloads of about 1 MiB each, and 9 MiB set aside
    // for payloads (each takes about four times its size while its record is processed)
    let blobs = Arc::new(MemoryBlobs::new("results"));
    let prompt = "p".repeat(1_000_000);
    for i in 0..4 {
        let payload = job(&format!("big-{i}"), &format!(r#","text":"{prompt}""#));
        blobs.insert("producer", &format!("k{i}"), payload.as_bytes());
    }
    let ledger = Arc::new(InMemoryLedger::new());
    let settings = Settings {
        payload_memory_bytes: 9 * 1_048_576,
        ..reading_payloads()
    };
    let h = handler_with_blobs(ledger.clone(), settings, blobs);
    let records = (0..4)
        .map(|i| pointer_record(&format!("m{i}"), &format!("k{i}"), Some(1_000_100)))
        .collect();
    // WHEN the batch is handled
    let report = h.handle_batch(&event(records), &invocation()).await;
    // THEN the payloads that fit are read and run, and the others back off unread, for a later
    // batch (never poison, never a job written)
    let labels: Vec<&str> = report.records.iter().map(|r| r.outcome.label()).collect();
    assert_eq!(labels, ["succeeded", "succeeded", "backoff", "backoff"]);
    assert!(ledger.get("big-2").await.expect("get").is_none());
    assert!(ledger.get("big-3").await.expect("get").is_none());
}

#[tokio::test]
async fn a_payload_read_that_never_answers_does_not_hold_the_batch_past_its_deadline() {
    // GIVEN a pointer whose payload read never answers, beside an ordinary job, and an
    // invocation with three seconds left
    let blobs = Arc::new(SlowReads {
        store: fenced_jobs::blobs::MemoryBlobs::new("results"),
        delay: None,
    });
    let ledger = Arc::new(InMemoryLedger::new());
    let settings = Settings {
        deadline_margin_ms: 1_000,
        ..reading_payloads()
    };
    let h = BatchHandler::new(
        Processor::new(ledger, SimulatedProvider::new(), SystemClock, settings).with_blobs(blobs),
        RecordingVisibility::new(),
    );
    let short = Invocation {
        id: "inv-short".into(),
        deadline: Some(SystemClock.now_ms() + 3_000),
    };
    let records = vec![
        pointer_record("m0", "k0", None),
        record(Some("m1"), &job("plain", "")),
    ];
    // WHEN the batch is handled
    let started = std::time::Instant::now();
    let report = h.handle_batch(&event(records), &short).await;
    // THEN it answers before the deadline, the stuck record backing off
    assert!(started.elapsed() < std::time::Duration::from_millis(3_000));
    assert_eq!(report.records[0].outcome.label(), "backoff");
    assert!(report.response.is_ok());
}

#[tokio::test]
async fn records_stay_invisible_while_payloads_are_read_and_while_they_wait_for_memory() {
    // GIVEN four pointers to payloads of about 1 MiB, each read taking 800 ms, room for three
    // of them, and a queue whose visibility timeout is 2 s (a second consumer would receive a
    // record the moment it shows)
    let store = fenced_jobs::blobs::MemoryBlobs::new("results");
    let prompt = "p".repeat(1_000_000);
    for i in 0..4 {
        let payload = job(&format!("slow-{i}"), &format!(r#","text":"{prompt}""#));
        store.insert("producer", &format!("k{i}"), payload.as_bytes());
    }
    let settings = Settings {
        payload_memory_bytes: 13 * 1_048_576,
        heartbeat_ms: 300,
        ..reading_payloads()
    };
    let visibility = RecordingVisibility::new();
    visibility.set_visibility_timeout(2);
    let processor = Processor::new(
        Arc::new(InMemoryLedger::new()),
        SimulatedProvider::new(),
        SystemClock,
        settings,
    );
    let slow = SlowReads {
        store,
        delay: Some(std::time::Duration::from_millis(800)),
    };
    let h = BatchHandler::new(processor.with_blobs(Arc::new(slow)), visibility);
    let records = (0..4)
        .map(|i| pointer_record(&format!("m{i}"), &format!("k{i}"), Some(1_000_100)))
        .collect();
    // WHEN the batch is handled (about 2.4 s of reading)
    let report = h.handle_batch(&event(records), &invocation()).await;
    let labels: Vec<&str> = report.records.iter().map(|r| r.outcome.label()).collect();
    assert_eq!(labels, ["succeeded", "succeeded", "succeeded", "backoff"]);
    // THEN every record, the one waiting for memory included, was kept invisible by the queue's
    // 2 s while the payloads were read, before any final visibility
    let changes = h.visibility().changes();
    for i in 0..4 {
        let handle = format!("handle-m{i}");
        let held = changes
            .iter()
            .any(|(_, c)| c.receipt_handle == handle && c.seconds == 2);
        assert!(held, "m{i} was left to show: {changes:?}");
    }
}

/// A live job whose input went missing is never poison (its message is its only trigger): a
/// stored input that is gone or altered ends the job `failed_terminal` (`input_lost`) with no
/// call, and an Extended Client pointer whose payload is gone goes on from the job its message
/// names in `fenced-jobs.job-id`; without that attribute, or naming no job, it is poison.
#[tokio::test]
async fn a_live_job_whose_input_is_gone_is_never_poison() {
    use fenced_jobs::blobs::MemoryBlobs;
    use fenced_jobs::job::{BlobRef, JobDefaults, NewJob};
    use fenced_jobs::ledger::CreateRequest;
    let ledger = Arc::new(InMemoryLedger::new());
    let blobs = Arc::new(MemoryBlobs::new("results"));
    blobs.insert("results", "inputs/altered/d.json", b"{\"other\":1}");
    let h = BatchHandler::new(
        Processor::new(
            ledger.clone(),
            SimulatedProvider::new(),
            SystemClock,
            reading_payloads(),
        )
        .with_blobs(blobs.clone()),
        RecordingVisibility::new(),
    )
    .with_seed(1);
    let now = SystemClock.now_ms();
    let ready = |job: NewJob| CreateRequest {
        job,
        now,
        enqueued: true,
    };
    // GIVEN two ready jobs whose stored inputs are gone and altered
    for (id, key) in [
        ("gone", "inputs/gone/d.json"),
        ("altered", "inputs/altered/d.json"),
    ] {
        let job = NewJob {
            class: Default::default(),
            job_id: id.into(),
            input_digest: "d".into(),
            contract: "c".into(),
            input: String::new(),
            input_ref: Some(BlobRef {
                bucket: "results".into(),
                key: key.into(),
                size: 11,
                sha256: "e".repeat(64),
            }),
            metadata: None,
            deadline_at: now + 3_600_000,
            max_attempts: 3,
            max_cost_micros: None,
            expires_at: 0,
        };
        ledger.create(ready(job)).await.expect("create");
    }
    // AND a ready job first read from a pointer whose payload the producer's bucket dropped
    let msg = fenced_jobs::job::parse_body(Some(&job("from-ptr", ""))).expect("valid");
    let defaults = JobDefaults::default();
    ledger
        .create(ready(NewJob::from_message(&msg, now, &defaults)))
        .await
        .expect("create");
    let named = |id: &str, job_id: Option<&str>| {
        let mut r = pointer_record(id, "p/dropped", None);
        if let Some(job_id) = job_id {
            let mut attribute = aws_lambda_events::sqs::SqsMessageAttribute::default();
            attribute.string_value = Some(job_id.into());
            attribute.data_type = Some("String".into());
            r.message_attributes
                .insert("fenced-jobs.job-id".into(), attribute);
        }
        r
    };
    // WHEN their messages are delivered
    let report = h
        .handle_batch(
            &event(vec![
                record(Some("m-gone"), r#"{"job_id":"gone"}"#),
                record(Some("m-altered"), r#"{"job_id":"altered"}"#),
                named("m-ptr", Some("from-ptr")),
                named("m-anon", None),
                named("m-none", Some("no-such-job")),
            ]),
            &invocation(),
        )
        .await;
    // THEN the jobs with a lost input end failed_terminal, with no call, and are acknowledged
    let labels: Vec<&str> = report.records.iter().map(|r| r.outcome.label()).collect();
    assert_eq!(
        labels,
        [
            "failed_terminal",
            "failed_terminal",
            "succeeded",
            "poison",
            "poison"
        ]
    );
    for id in ["gone", "altered"] {
        let item = ledger.get(id).await.expect("get").expect("item");
        let error = item.last_error.expect("an error");
        assert_eq!((item.attempts, error.kind.as_str()), (0, "input_lost"));
    }
    // AND the pointer's job ran from its item, once
    assert_eq!(h.processor().provider().executions(), 1);
}
