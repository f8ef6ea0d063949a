//! The handler end to end on the emulator: real DynamoDB and SQS calls through the AWS SDK,
//! batches built and acknowledged by the local event source mapping.

use fenced_jobs::job::{AttemptOutcome, Failure, JobState, RecordOutcome};
use fenced_jobs::ledger::{JobLedger, Write};
use fenced_jobs::provider::SimulatedProvider;

use crate::support::{TakenOverDuringTheCall, deliver, emulator, fast_settings, job};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_job_succeeds_with_one_provider_call_and_two_ledger_writes() {
    // GIVEN a new job on the queue
    let aws = emulator().await;
    let table = aws.table().await;
    let queue = aws.queue(30).await;
    let handler = aws.handler(&table, SimulatedProvider::new(), fast_settings());
    let source = aws.source(&queue).await;
    aws.send(&queue, &job("happy-1", "summarise this", ""))
        .await;
    aws.calls.reset();

    // WHEN the event source delivers it
    let report = source
        .poll_once(|event, inv| handler.handle(event, inv))
        .await
        .expect("poll");

    // THEN it is deleted, the job succeeded once, with a claim and an acceptance only
    assert_eq!((report.received, report.deleted, report.failed), (1, 1, 0));
    assert_eq!(handler.processor().provider().executions(), 1);
    assert_eq!(aws.calls.total("dynamodb"), 2, "{:?}", aws.calls.counts());
    // The claim creates the item whole; the acceptance updates it.
    assert_eq!(aws.calls.get("dynamodb", "PutItem"), 1);
    assert_eq!(aws.calls.get("dynamodb", "UpdateItem"), 1);
    let record = aws
        .ledger(&table)
        .get("happy-1")
        .await
        .expect("get")
        .expect("item");
    assert_eq!(record.state, JobState::Succeeded);
    assert_eq!((record.owner_epoch, record.attempts), (1, 1));
    assert_eq!(record.attempt_log.len(), 1);
    assert_eq!(record.attempt_log[0].outcome, AttemptOutcome::Succeeded);
    assert!(
        record
            .result
            .as_deref()
            .is_some_and(|r| r.contains("simulated answer"))
    );
    assert!(aws.peek(&queue.url, 0).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redelivered_finished_job_costs_one_ledger_call_and_no_provider_call() {
    let aws = emulator().await;
    let table = aws.table().await;
    let queue = aws.queue(30).await;
    let handler = aws.handler(&table, SimulatedProvider::new(), fast_settings());
    let source = aws.source(&queue).await;
    let body = job("again-1", "summarise this", "");
    aws.send(&queue, &body).await;
    source
        .poll_once(|event, inv| handler.handle(event, inv))
        .await
        .expect("first delivery");
    let before = aws.ledger(&table).get("again-1").await.expect("get");

    // GIVEN the same job delivered again (a producer retry, or SQS at-least-once)
    aws.send(&queue, &body).await;
    aws.calls.reset();
    let report = source
        .poll_once(|event, inv| handler.handle(event, inv))
        .await
        .expect("second delivery");

    // THEN it is acknowledged from the ledger alone: its first write, refused, shows the item
    assert_eq!((report.received, report.deleted), (1, 1));
    assert_eq!(handler.processor().provider().executions(), 1);
    assert_eq!(aws.calls.total("dynamodb"), 1, "{:?}", aws.calls.counts());
    assert_eq!(aws.calls.get("dynamodb", "PutItem"), 1);
    assert_eq!(
        aws.ledger(&table).get("again-1").await.expect("get"),
        before
    );

    // GIVEN a copy that SQS delivers a second time (its receive count is 2)
    aws.send(&queue, &body).await;
    let received = aws
        .sqs
        .receive_message()
        .queue_url(&queue.url)
        .visibility_timeout(0)
        .send()
        .await
        .expect("receive");
    assert_eq!(received.messages().len(), 1);
    aws.calls.reset();
    let report = source
        .poll_once(|event, inv| handler.handle(event, inv))
        .await
        .expect("third delivery");

    // THEN one read decides it, and nothing is written
    assert_eq!((report.received, report.deleted), (1, 1));
    assert_eq!(handler.processor().provider().executions(), 1);
    assert_eq!(aws.calls.total("dynamodb"), 1, "{:?}", aws.calls.counts());
    assert_eq!(aws.calls.get("dynamodb", "GetItem"), 1);
    assert_eq!(
        aws.ledger(&table).get("again-1").await.expect("get"),
        before
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_while_a_live_owner_holds_the_job_defers_without_a_provider_call() {
    // GIVEN another worker holds the job under a live 20 s lease
    let aws = emulator().await;
    let table = aws.table().await;
    let queue = aws.queue(30).await;
    let body = job("busy-1", "long report", "");
    let other = aws.handler(&table, SimulatedProvider::new(), fast_settings());
    let msg = fenced_jobs::job::parse_body(Some(&body)).expect("valid");
    let now = fenced_jobs::clock::Clock::now_ms(&fenced_jobs::clock::SystemClock);
    let claimed = aws
        .ledger(&table)
        .claim(fenced_jobs::ledger::ClaimRequest {
            job: new_job(&msg, now),
            expect: fenced_jobs::job::Expect::FRESH,
            owner_id: "other-worker".into(),
            now,
            lease_until: now + 20_000,
            provider_ref: None,
            route: None,
            first_sight: false,
            list_due: false,
        })
        .await
        .expect("claim");
    assert!(matches!(claimed, Write::Applied(_)));
    drop(other);

    // WHEN a copy of its message is delivered to this worker
    let handler = aws.handler(&table, SimulatedProvider::new(), fast_settings());
    let source = aws.source(&queue).await;
    let message_id = aws.send(&queue, &body).await;
    let (report, batch) = deliver(&source, &handler).await;

    // THEN the record fails without a model call, invisible for the rest of the lease
    assert_eq!((report.received, report.failed, report.deleted), (1, 1, 0));
    assert_eq!(handler.processor().provider().executions(), 0);
    let batch = batch.expect("handler ran");
    let record = &batch.records[0];
    assert_eq!(record.message_id.as_deref(), Some(message_id.as_str()));
    assert!(matches!(
        record.outcome,
        RecordOutcome::Failed(Failure::Deferred { .. })
    ));
    let visibility = record.visibility_s.expect("visibility set");
    assert!((19..=23).contains(&visibility), "{visibility}");
    assert_eq!(batch.visibility.changed, 1);
    assert!(
        aws.peek(&queue.url, 1).await.is_empty(),
        "deferred copy came back early"
    );
    let item = aws
        .ledger(&table)
        .get("busy-1")
        .await
        .expect("get")
        .expect("item");
    assert_eq!((item.state, item.owner_epoch), (JobState::Running, 1));
    assert_eq!(item.owner_id.as_deref(), Some("other-worker"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_owner_cannot_accept_and_the_newer_result_stands() {
    let aws = emulator().await;
    let table = aws.table().await;
    let queue = aws.queue(30).await;
    let provider = TakenOverDuringTheCall {
        inner: SimulatedProvider::new(),
        rival: aws.ledger(&table),
    };
    let handler = aws.handler(&table, provider, fast_settings());
    let source = aws.source(&queue).await;
    aws.send(&queue, &job("stale-1", "contested", "")).await;

    let report = source
        .poll_once(|event, inv| handler.handle(event, inv))
        .await
        .expect("poll");

    // The stale owner's acceptance was refused; the job is terminal with the rival's answer, so
    // the record is acknowledged, and the stale answer was never written.
    assert_eq!((report.received, report.deleted), (1, 1));
    let item = aws
        .ledger(&table)
        .get("stale-1")
        .await
        .expect("get")
        .expect("item");
    assert_eq!(item.state, JobState::Succeeded);
    assert_eq!(item.owner_epoch, 2);
    assert_eq!(item.owner_id.as_deref(), Some("rival"));
    assert_eq!(item.result.as_deref(), Some(r#"{"output":"rival answer"}"#));
    assert_eq!(item.recoveries.len(), 1);
    // The rival's write, stamped with its clock ten minutes ahead, is the last one: the fenced
    // owner wrote nothing after it.
    assert!(item.updated_at > item.created_at + 500_000, "{item:?}");
    assert_eq!(item.attempt_log.len(), 1);
    assert_eq!(item.attempt_log[0].epoch, 1);
}

/// With `DLQ_URL` the worker sends poison and conflicts to the DLQ itself, with the reason as
/// message attributes, after one receive, and only then acknowledges them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_and_conflicts_reach_the_dlq_after_one_receive_with_their_reason() {
    let aws = emulator().await;
    let table = aws.table().await;
    let queue = aws.queue_with_receives(30, 300).await;
    let handler = aws
        .handler(&table, SimulatedProvider::new(), fast_settings())
        .with_dead_letters(std::sync::Arc::new(
            fenced_jobs::queue::SqsDeadLetters::new(aws.sqs.clone(), queue.dlq_url.clone()),
        ));
    let source = aws.source(&queue).await;
    aws.send(&queue, "{not json").await;
    aws.send(&queue, &job("dl-1", "first", "")).await;
    let (poll, _) = deliver(&source, &handler).await;
    assert_eq!((poll.received, poll.deleted), (2, 2));
    aws.send(&queue, &job("dl-1", "another input", "")).await;
    let (poll, _) = deliver(&source, &handler).await;
    assert_eq!((poll.received, poll.deleted), (1, 1));

    let dead = aws
        .sqs
        .receive_message()
        .queue_url(&queue.dlq_url)
        .max_number_of_messages(10)
        .message_attribute_names("All")
        .wait_time_seconds(1)
        .send()
        .await
        .expect("receive dlq");
    let mut seen: Vec<(String, String, Option<String>)> = dead
        .messages()
        .iter()
        .map(|m| {
            let attr = |name: &str| {
                m.message_attributes()
                    .and_then(|a| a.get(name))
                    .and_then(|v| v.string_value())
                    .map(str::to_owned)
            };
            (
                m.body().unwrap_or_default().to_owned(),
                attr("fenced-jobs.reason").expect("a reason"),
                attr("fenced-jobs.job-id"),
            )
        })
        .collect();
    seen.sort();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert_eq!(seen[0].0, job("dl-1", "another input", ""));
    assert_eq!(
        (seen[0].1.as_str(), seen[0].2.as_deref()),
        ("conflict", Some("dl-1"))
    );
    assert_eq!(
        (seen[1].0.as_str(), seen[1].1.as_str()),
        ("{not json", "poison")
    );
    assert!(
        aws.peek(&queue.url, 0).await.is_empty(),
        "nothing left in the queue"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_records_fail_visible_at_once_and_never_touch_the_ledger() {
    let aws = emulator().await;
    let table = aws.table().await;
    let queue = aws.queue(30).await;
    let handler = aws.handler(&table, SimulatedProvider::new(), fast_settings());
    let source = aws.source(&queue).await;
    let bodies = [
        "{not json".to_owned(),
        r#"{"job_id":"p-1","contract":"c","input":{"model":"m","prompt":"p"},"deadline":"x"}"#
            .to_owned(),
        r#"{"job_id":"bad id!","contract":"c","input":{"model":"m","prompt":"p"}}"#.to_owned(),
        r#"{"job_id":"p-2","contract":"c","input":{"model":"m"}}"#.to_owned(),
    ];
    for body in &bodies {
        aws.send(&queue, body).await;
    }
    aws.calls.reset();

    let report = source
        .poll_once(|event, inv| handler.handle(event, inv))
        .await
        .expect("poll");

    assert_eq!((report.received, report.failed, report.deleted), (4, 4, 0));
    assert_eq!(aws.calls.total("dynamodb"), 0, "{:?}", aws.calls.counts());
    assert_eq!(aws.item_count(&table).await, 0);
    assert_eq!(handler.processor().provider().executions(), 0);
    // Visibility 0: a second consumer gets them straight back, one receive closer to the DLQ.
    let again = aws.peek(&queue.url, 1).await;
    assert_eq!(again.len(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conflicting_input_for_a_known_job_is_refused_and_leaves_the_ledger_untouched() {
    let aws = emulator().await;
    let table = aws.table().await;
    let queue = aws.queue(30).await;
    let handler = aws.handler(&table, SimulatedProvider::new(), fast_settings());
    let source = aws.source(&queue).await;
    aws.send(&queue, &job("same-id", "first input", "")).await;
    source
        .poll_once(|event, inv| handler.handle(event, inv))
        .await
        .expect("first");
    let before = aws.ledger(&table).get("same-id").await.expect("get");

    aws.send(&queue, &job("same-id", "other input", "")).await;
    let (report, batch) = deliver(&source, &handler).await;

    assert_eq!((report.received, report.failed), (1, 1));
    let batch = batch.expect("handler ran");
    let RecordOutcome::Failed(Failure::Conflict {
        ledger_digest,
        message_digest,
    }) = &batch.records[0].outcome
    else {
        panic!("expected a conflict: {:?}", batch.records[0].outcome);
    };
    assert_ne!(ledger_digest, message_digest);
    assert_eq!(batch.records[0].visibility_s, Some(0));
    assert_eq!(
        aws.ledger(&table).get("same-id").await.expect("get"),
        before
    );
    assert_eq!(handler.processor().provider().executions(), 1);
    assert_eq!(aws.peek(&queue.url, 1).await.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mixed_batch_reports_exactly_the_records_whose_jobs_are_not_terminal() {
    let aws = emulator().await;
    let table = aws.table().await;
    let queue = aws.queue(30).await;
    let handler = aws.handler(&table, SimulatedProvider::new(), fast_settings());
    let source = aws.source(&queue).await;
    // A job finished earlier, and one whose id will be reused with another input.
    aws.send(&queue, &job("mix-done", "old", "")).await;
    aws.send(&queue, &job("mix-taken", "original", "")).await;
    let first = source
        .poll_once(|event, inv| handler.handle(event, inv))
        .await
        .expect("setup");
    assert_eq!(first.deleted, 2);

    let mut ids = std::collections::HashMap::new();
    for (name, body) in [
        ("ok", job("mix-ok", "fresh", "")),
        ("dup", job("mix-ok", "fresh", "")),
        ("done", job("mix-done", "old", "")),
        (
            "transient",
            job("mix-flaky", "retry me", r#""simulate":{"fail_times":1}"#),
        ),
        (
            "permanent",
            job(
                "mix-perm",
                "reject me",
                r#""simulate":{"outcome":"permanent"}"#,
            ),
        ),
        ("conflict", job("mix-taken", "changed", "")),
        ("poison", r#"{"job_id":"mix-poison"}"#.to_owned()),
    ] {
        ids.insert(name, aws.send(&queue, &body).await);
    }
    let calls_before = handler.processor().provider().executions();
    let (report, batch) = deliver(&source, &handler).await;
    assert_eq!(
        report.received, 7,
        "the emulator delivers the whole batch at once"
    );

    let batch = batch.expect("handler ran");
    let mut failed = batch.response.clone().expect("named failures");
    failed.sort();
    let mut expected = vec![
        ids["transient"].clone(),
        ids["conflict"].clone(),
        ids["poison"].clone(),
    ];
    expected.sort();
    assert_eq!(failed, expected);
    assert_eq!(report.deleted, 4);
    // One call each for ok, transient and permanent; none for the duplicate or the finished job.
    assert_eq!(
        handler.processor().provider().executions() - calls_before,
        3
    );
    let outcome = |name: &str| batch.outcome_of(&ids[name]).cloned().expect("outcome");
    assert_eq!(
        outcome("permanent"),
        RecordOutcome::Done(JobState::FailedTerminal)
    );
    assert_eq!(outcome("dup"), RecordOutcome::Done(JobState::Succeeded));
    assert!(matches!(
        outcome("transient"),
        RecordOutcome::Failed(Failure::Backoff { .. })
    ));
    let flaky = aws
        .ledger(&table)
        .get("mix-flaky")
        .await
        .expect("get")
        .expect("item");
    assert_eq!(
        (flaky.state, flaky.attempts),
        (JobState::RetryAuthorized, 1)
    );

    // The transient job comes back after its backoff (at most 1 s here) and succeeds.
    tokio::time::sleep(std::time::Duration::from_millis(1_500)).await;
    let mut retried = None;
    for _ in 0..10 {
        let r = source
            .poll_once(|event, inv| handler.handle(event, inv))
            .await
            .expect("retry");
        if aws
            .ledger(&table)
            .get("mix-flaky")
            .await
            .expect("get")
            .expect("item")
            .state
            == JobState::Succeeded
        {
            retried = Some(r);
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    }
    assert!(
        retried.is_some(),
        "the transient job did not succeed on redelivery"
    );
    let flaky = aws
        .ledger(&table)
        .get("mix-flaky")
        .await
        .expect("get")
        .expect("item");
    assert_eq!((flaky.owner_epoch, flaky.attempts), (2, 2));
    assert_eq!(flaky.attempt_log[0].outcome, AttemptOutcome::Transient);
    assert_eq!(flaky.attempt_log[1].outcome, AttemptOutcome::Succeeded);
}

fn new_job(msg: &fenced_jobs::job::JobMessage, now: i64) -> fenced_jobs::job::NewJob {
    fenced_jobs::job::NewJob {
        class: Default::default(),
        job_id: msg.job_id.clone(),
        input_digest: msg.digest.clone(),
        contract: msg.contract.clone(),
        input: msg.input_canonical.clone(),
        input_ref: None,
        metadata: None,
        deadline_at: now + 3_600_000,
        max_attempts: 3,
        max_cost_micros: None,
        expires_at: now / 1000 + 86_400,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queues_visibility_timeout_is_read_once_and_a_failed_read_is_not_retried_every_batch() {
    use fenced_jobs::queue::{SqsVisibility, VisibilityControl};
    let aws = emulator().await;
    let queue = aws.queue(45).await;
    let visibility = SqsVisibility::new(aws.sqs.clone());
    aws.calls.reset();

    // A queue the role can read: one lookup, then kept.
    for _ in 0..3 {
        assert_eq!(visibility.visibility_timeout_s(&queue.arn).await, Some(45));
    }
    assert_eq!(aws.calls.get("sqs", "GetQueueAttributes"), 1);

    // A queue that cannot be read (here: absent): one failing lookup, not one per batch.
    let absent = queue
        .arn
        .replace(queue.arn.rsplit(':').next().expect("name"), "no-such-queue");
    aws.calls.reset();
    for _ in 0..3 {
        assert_eq!(visibility.visibility_timeout_s(&absent).await, None);
    }
    assert_eq!(aws.calls.total("sqs"), 1, "{:?}", aws.calls.counts());
}
