//! What is refused at a job's first sight: a deadline beyond what the results bucket keeps or
//! the redrive count carries, another producer's job, what the deployment does not allow.

use std::sync::Arc;

use aws_lambda_events::event::sqs::SqsMessage;
use fenced_jobs::clock::{Clock, SystemClock};
use fenced_jobs::job::{Failure, JobState, RecordOutcome};
use fenced_jobs::ledger::JobLedger;
use fenced_jobs::ledger::memory::InMemoryLedger;
use fenced_jobs::provider::SimulatedProvider;
use fenced_jobs::queue::RecordingVisibility;
use fenced_jobs::worker::Settings;
use fenced_jobs::worker::handler::BatchHandler;
use fenced_jobs::worker::processor::Processor;

use super::{event, handler, handler_with_blobs, invocation, job, reading_payloads, record};

/// A job whose deadline is further away than the results bucket keeps what is stored for it
/// (`RESULTS_RETENTION_DAYS` less the item's `RETENTION_DAYS`) is refused at its first sight;
/// one within it runs, and a job already in the ledger is not judged again.
#[tokio::test]
async fn a_deadline_beyond_what_the_results_bucket_keeps_is_refused_at_first_sight() {
    use fenced_jobs::blobs::MemoryBlobs;
    use fenced_jobs::job::message::format_rfc3339_ms;
    let ledger = Arc::new(InMemoryLedger::new());
    // GIVEN a bucket that keeps objects 90 days and items kept 30 days after their deadline
    // (and producers allowed deadlines up to 100 days)
    let settings = Settings {
        results_retention_days: 90,
        policy: fenced_jobs::job::policy::Policy {
            max_deadline_ms: 100 * 86_400_000,
            ..Default::default()
        },
        ..Settings::default()
    };
    let h = BatchHandler::new(
        Processor::new(
            ledger.clone(),
            SimulatedProvider::new(),
            SystemClock,
            settings,
        )
        .with_blobs(Arc::new(MemoryBlobs::new("results"))),
        RecordingVisibility::new(),
    )
    .with_seed(1);
    let day = 86_400_000;
    let due = |id: &str, days: i64| {
        let at = format_rfc3339_ms(SystemClock.now_ms() + days * day);
        format!(
            r#"{{"job_id":"{id}","contract":"c","deadline_at":"{at}","input":{{"model":"m","prompt":"p"}}}}"#
        )
    };
    // WHEN jobs due in 70 and in 50 days arrive
    let report = h
        .handle_batch(
            &event(vec![
                record(Some("far"), &due("far", 70)),
                record(Some("near"), &due("near", 50)),
            ]),
            &invocation(),
        )
        .await;
    // THEN the first is poison, named by its rule, and never reaches the ledger
    let labels: Vec<&str> = report.records.iter().map(|r| r.outcome.label()).collect();
    assert_eq!(labels, ["poison", "succeeded"]);
    assert!(ledger.get("far").await.expect("get").is_none());
    // AND a message whose producer created the item first is not judged again
    let in_ledger = |id: &str| {
        let mut r = record(Some(id), &due(id, 70));
        let mut attribute = aws_lambda_events::sqs::SqsMessageAttribute::default();
        attribute.string_value = Some("true".into());
        attribute.data_type = Some("String".into());
        r.message_attributes.insert("JobInLedger".into(), attribute);
        r
    };
    let msg = fenced_jobs::job::parse_body(Some(&due("far-2", 70))).expect("valid");
    let now = SystemClock.now_ms();
    let created = fenced_jobs::job::NewJob::from_message(&msg, now, &Default::default());
    ledger
        .create(fenced_jobs::ledger::CreateRequest {
            job: created,
            now,
            enqueued: true,
        })
        .await
        .expect("create");
    let report = h
        .handle_batch(&event(vec![in_ledger("far-2")]), &invocation())
        .await;
    assert_ne!(report.records[0].outcome.label(), "poison");
    // BUT the attribute alone, for a job the ledger does not hold, carries none past the rule
    let report = h
        .handle_batch(&event(vec![in_ledger("far-3")]), &invocation())
        .await;
    assert_eq!(report.records[0].outcome.label(), "poison");
    assert!(ledger.get("far-3").await.expect("get").is_none());
}

/// A job whose deadline is further away than the redrive count's receives carry it
/// (`MAX_RECEIVE_COUNT`) is refused at its first sight, with its reason: SQS could dead-letter
/// its message while it lives. One within reach runs.
#[tokio::test]
async fn a_deadline_beyond_what_the_redrive_count_carries_is_refused_at_first_sight() {
    use fenced_jobs::job::message::format_rfc3339_ms;
    let ledger = Arc::new(InMemoryLedger::new());
    // GIVEN a queue that dead-letters at 20 receives: 8 waits of about 12 hours, 4 days
    let mut settings = Settings::default();
    settings.visibility.max_receive_count = 20;
    let h = BatchHandler::new(
        Processor::new(
            ledger.clone(),
            SimulatedProvider::new(),
            SystemClock,
            settings,
        ),
        RecordingVisibility::new(),
    )
    .with_seed(1);
    let hour = 3_600_000;
    let due = |id: &str, hours: i64| {
        let at = format_rfc3339_ms(SystemClock.now_ms() + hours * hour);
        format!(
            r#"{{"job_id":"{id}","contract":"c","deadline_at":"{at}","input":{{"model":"m","prompt":"p"}}}}"#
        )
    };
    // WHEN jobs due in 100 and in 90 hours arrive
    let report = h
        .handle_batch(
            &event(vec![
                record(Some("far"), &due("far", 100)),
                record(Some("near"), &due("near", 90)),
            ]),
            &invocation(),
        )
        .await;
    // THEN the first is poison, named by its rule, and never reaches the ledger; the second runs
    let labels: Vec<&str> = report.records.iter().map(|r| r.outcome.label()).collect();
    assert_eq!(labels, ["poison", "succeeded"]);
    let RecordOutcome::Failed(Failure::Poison(reason)) = &report.records[0].outcome else {
        panic!("{:?}", report.records[0].outcome);
    };
    assert!(reason.to_string().contains("MAX_RECEIVE_COUNT"), "{reason}");
    assert!(ledger.get("far").await.expect("get").is_none());
    // AND delivered again (its dead letter could not be sent), it is refused again, its item
    // still unwritten; a redelivery of a job the ledger holds is not judged
    let again = |id: &str, hours: i64| {
        let mut r = record(Some(id), &due(id, hours));
        r.attributes
            .insert("ApproximateReceiveCount".into(), "2".into());
        r
    };
    let report = h
        .handle_batch(
            &event(vec![again("far", 100), again("near", 100)]),
            &invocation(),
        )
        .await;
    let labels: Vec<&str> = report.records.iter().map(|r| r.outcome.label()).collect();
    assert_eq!(labels, ["poison", "succeeded"]);
    assert!(ledger.get("far").await.expect("get").is_none());
}

/// A record as the principal `sender` sent it (SQS's `SenderId`, which the sender cannot choose).
fn sent_by(sender: &str, id: &str, body: &str) -> SqsMessage {
    let mut r = record(Some(id), body);
    r.attributes.insert("SenderId".into(), sender.into());
    r
}

/// With `PRODUCERS`, each producer's job ids live in its own namespace, known from the principal
/// SQS says sent the message: the same id from two producers is two jobs (not a conflict that
/// dead-letters the second), a producer cannot trigger or read another's job, an unknown sender
/// is refused, and the reconciler's role names jobs by their whole id.
#[tokio::test]
async fn producers_are_kept_apart_by_the_sender_sqs_names() {
    use fenced_jobs::blobs::MemoryBlobs;
    use fenced_jobs::job::scope::Producers;
    let ledger = Arc::new(InMemoryLedger::new());
    let blobs = Arc::new(MemoryBlobs::new("results"));
    blobs.insert("producer", "search/p1", job("from-pointer", "").as_bytes());
    let settings = Settings {
        producers: Producers::parse("billing=AROABILLING,search=AROASEARCH", "AROARECONCILER")
            .expect("producers"),
        ..reading_payloads()
    };
    let h = handler_with_blobs(ledger.clone(), settings, blobs).with_seed(1);
    let labels = |report: &fenced_jobs::report::BatchReport| -> Vec<&'static str> {
        report.records.iter().map(|r| r.outcome.label()).collect()
    };
    // WHEN two producers send the same job id with different inputs, and a stranger sends one
    let billing = job("job-1", r#","text":"billing's""#);
    let search = job("job-1", r#","text":"search's""#);
    let report = h
        .handle_batch(
            &event(vec![
                sent_by("AROABILLING:run-1", "m1", &billing),
                sent_by("AROASEARCH:run-7", "m2", &search),
                sent_by("AROASTRANGER:x", "m3", &job("job-2", "")),
            ]),
            &invocation(),
        )
        .await;
    // THEN each producer's job runs in its own namespace, and the stranger's is refused unwritten
    assert_eq!(labels(&report), ["succeeded", "succeeded", "poison"]);
    for id in ["billing/job-1", "search/job-1"] {
        let item = ledger.get(id).await.expect("get").expect(id);
        assert_eq!(item.state, JobState::Succeeded);
    }
    assert!(ledger.get("job-1").await.expect("get").is_none());
    assert!(ledger.get("job-2").await.expect("get").is_none());
    // AND a producer reaches neither another's job by its whole id nor another's payloads,
    // while its own trigger and the reconciler's whole-id trigger find their jobs
    let pointer = |key: &str| {
        let class = "software.amazon.payloadoffloading.PayloadS3Pointer";
        format!(r#"["{class}",{{"s3BucketName":"producer","s3Key":"{key}"}}]"#)
    };
    let report = h
        .handle_batch(
            &event(vec![
                sent_by("AROASEARCH:run-7", "m4", r#"{"job_id":"billing/job-1"}"#),
                sent_by("AROABILLING:run-1", "m5", &pointer("search/p1")),
                sent_by("AROASEARCH:run-7", "m6", r#"{"job_id":"job-1"}"#),
                sent_by("AROARECONCILER:r", "m7", r#"{"job_id":"billing/job-1"}"#),
                sent_by("AROASEARCH:run-7", "m8", &pointer("search/p1")),
            ]),
            &invocation(),
        )
        .await;
    assert_eq!(
        labels(&report),
        ["poison", "poison", "succeeded", "succeeded", "succeeded"]
    );
    assert!(
        ledger
            .get("search/from-pointer")
            .await
            .expect("get")
            .is_some()
    );
    assert!(
        ledger
            .get("billing/from-pointer")
            .await
            .expect("get")
            .is_none()
    );
}

/// What a producer may ask for is the deployment's to say: a model, a parameter or a bound it
/// does not allow is refused at the job's first sight, before any write or call, and named.
#[tokio::test]
async fn a_job_asking_for_what_the_deployment_does_not_allow_is_refused_unwritten() {
    use fenced_jobs::job::policy::Policy;
    let ledger = Arc::new(InMemoryLedger::new());
    let settings = Settings {
        policy: Policy {
            models: Policy::parse_models("m").expect("models"),
            ..Policy::default()
        },
        ..Settings::default()
    };
    let h = handler(ledger.clone(), SimulatedProvider::new(), settings);
    let other_model = job("big-model", "").replace(r#""model":"m""#, r#""model":"m-large""#);
    let report = h
        .handle_batch(
            &event(vec![
                record(
                    Some("m1"),
                    &job("fine", r#","parameters":{"max_tokens":512}"#),
                ),
                record(Some("m2"), &other_model),
                record(
                    Some("m3"),
                    &job("stream", r#","parameters":{"stream":true}"#),
                ),
                record(
                    Some("m4"),
                    &job("huge", r#","parameters":{"max_tokens":1000000}"#),
                ),
                record(
                    Some("m5"),
                    &job("many", "")
                        .replace(r#""contract":"c""#, r#""contract":"c","max_attempts":50"#),
                ),
            ]),
            &invocation(),
        )
        .await;
    let labels: Vec<&str> = report.records.iter().map(|r| r.outcome.label()).collect();
    assert_eq!(
        labels,
        ["succeeded", "poison", "poison", "poison", "poison"]
    );
    let reasons: Vec<String> = report.records[1..]
        .iter()
        .map(|r| match &r.outcome {
            RecordOutcome::Failed(Failure::Poison(why)) => why.to_string(),
            other => panic!("{other:?}"),
        })
        .collect();
    assert!(reasons[0].contains("ALLOWED_MODELS"), "{reasons:?}");
    assert!(
        reasons[1].contains("input.parameters.stream"),
        "{reasons:?}"
    );
    assert!(reasons[2].contains("within its bound"), "{reasons:?}");
    assert!(reasons[3].contains("MAX_ATTEMPTS_LIMIT"), "{reasons:?}");
    for id in ["big-model", "stream", "huge", "many"] {
        assert!(ledger.get(id).await.expect("get").is_none(), "{id}");
    }
    assert_eq!(h.processor().provider().executions(), 1);
}

/// What a producer may label its jobs with is the deployment's to say: a tenant outside the
/// producer's `PRODUCER_TENANTS`, or `urgent` from a producer `URGENT_PRODUCERS` does not name,
/// is refused at the job's first sight, unwritten, with its reason.
#[tokio::test]
async fn a_producer_labels_its_jobs_only_with_its_own_tenants_and_its_right_to_urgency() {
    use fenced_jobs::job::account::Labels;
    use fenced_jobs::job::scope::Producers;
    let ledger = Arc::new(InMemoryLedger::new());
    let producers =
        Producers::parse("billing=AROABILLING,search=AROASEARCH", "").expect("producers");
    let settings = Settings {
        labels: Labels::parse("billing=acme", "search", &producers.names()).expect("labels"),
        producers,
        ..Settings::default()
    };
    let h = handler(ledger.clone(), SimulatedProvider::new(), settings);
    let labelled = |id: &str, tenant: &str, priority: &str| {
        job(id, "").replace(
            r#""contract":"c""#,
            &format!(r#""contract":"c","tenant":"{tenant}","priority":"{priority}""#),
        )
    };
    // WHEN billing names its own tenant and another, and each producer sends an urgent job,
    // search's in the message group of billing's account
    let mut forged = sent_by("AROASEARCH:r", "m4", &labelled("rush", "globex", "urgent"));
    forged
        .attributes
        .insert("MessageGroupId".into(), "billing/acme".into());
    let report = h
        .handle_batch(
            &event(vec![
                sent_by("AROABILLING:r", "m1", &labelled("own", "acme", "normal")),
                sent_by(
                    "AROABILLING:r",
                    "m2",
                    &labelled("other", "globex", "normal"),
                ),
                sent_by("AROABILLING:r", "m3", &labelled("rush", "acme", "urgent")),
                forged,
            ]),
            &invocation(),
        )
        .await;
    // THEN billing's own tenant runs, its other tenant and its urgent job are poison with their
    // reasons, and search, which may send urgent jobs and lists no tenants, runs
    let labels: Vec<&str> = report.records.iter().map(|r| r.outcome.label()).collect();
    assert_eq!(labels, ["succeeded", "poison", "poison", "succeeded"]);
    let reason = |i: usize| match &report.records[i].outcome {
        RecordOutcome::Failed(Failure::Poison(why)) => why.to_string(),
        other => panic!("{other:?}"),
    };
    assert!(reason(1).contains("PRODUCER_TENANTS"), "{}", reason(1));
    assert!(reason(2).contains("URGENT_PRODUCERS"), "{}", reason(2));
    for id in ["billing/other", "billing/rush"] {
        assert!(ledger.get(id).await.expect("get").is_none(), "{id}");
    }
    // AND the group a message carries is not its account: the job is search's own
    let item = ledger.get("search/rush").await.expect("get").expect("item");
    assert_eq!(item.account(), "search/globex");
}
