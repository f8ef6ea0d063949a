use super::*;
use crate::job::scope::Producers;
use crate::job::{JobState, NewJob};
use crate::ledger::memory::{Fault, FaultyLedger, InMemoryLedger};
use crate::ledger::{AttemptEnd, ClaimRequest, EndRequest};
use crate::queue::RecordingTriggers;
use crate::queue::dead_letters::{DETAIL_ATTRIBUTE, REASON_ATTRIBUTE};
use crate::queue::{Message, QueueReader};

fn new_job(job_id: &str) -> NewJob {
    NewJob::example(job_id, 10_000_000)
}

async fn unknown_job(ledger: &impl JobLedger, job_id: &str) {
    let claim = ClaimRequest {
        job: new_job(job_id),
        expect: crate::job::Expect::FRESH,
        owner_id: "w".into(),
        now: 1_000,
        lease_until: 61_000,
        provider_ref: None,
        route: None,
        first_sight: false,
        list_due: false,
    };
    assert!(matches!(ledger.claim(claim).await, Ok(Write::Applied(_))));
    let end = EndRequest {
        job_id: job_id.to_owned(),
        epoch: 1,
        attempt: 1,
        now: 2_000,
        end: AttemptEnd::Unknown {
            evidence: "cut off".into(),
        },
        usage: None,
        input: None,
    };
    assert!(matches!(ledger.end(end).await, Ok(Write::Applied(_))));
}

fn dead_letter(id: &str, prompt: &str) -> String {
    format!(
        r#"{{"job_id":"{id}","contract":"summary.v1","input":{{"model":"m","prompt":"{prompt}"}}}}"#
    )
}

/// Sends `bodies` to the DLQ as the worker's role, the one at `marked.0` with the attributes
/// `marked.1`.
fn worker_letters(
    queue: &crate::queue::MemoryQueue,
    dlq: &str,
    bodies: &[String],
    marked: (usize, &[(String, String)]),
) {
    for (i, body) in bodies.iter().enumerate() {
        let message = Message {
            body,
            attributes: if i == marked.0 { marked.1 } else { &[] },
            fifo: None,
        };
        queue
            .send_as(dlq, Some("AROAWORKER:fn"), message)
            .expect("sent");
    }
}

#[tokio::test]
async fn a_redrive_moves_the_live_jobs_letters_and_leaves_the_others() {
    // GIVEN a DLQ with letters of an unknown job, a job never seen, and a broken body
    let ledger = InMemoryLedger::new();
    unknown_job(&ledger, "stuck").await;
    let queue = crate::queue::MemoryQueue::new();
    let (dlq, work) = ("https://sqs.local/1/dlq", "https://sqs.local/1/work");
    queue.create(dlq);
    queue.create(work);
    let bodies = [
        // A re-trigger by id, as the reconciler and operators send them.
        r#"{"job_id":"stuck"}"#.to_owned(),
        dead_letter("new", "p"),
        "{broken".to_owned(),
        // A job the worker refused at its first sight (its deadline too far), with its
        // reason: a redrive would only be refused again.
        dead_letter("far", "p"),
    ];
    let refused = [
        (REASON_ATTRIBUTE.to_owned(), "poison".to_owned()),
        (
            DETAIL_ATTRIBUTE.to_owned(),
            "deadline_at: further away than MAX_RECEIVE_COUNT receives carry".to_owned(),
        ),
    ];
    worker_letters(&queue, dlq, &bodies, (3, &refused));
    // WHEN an operator inspects it (visible to others meanwhile; SQS's short receive comes
    // back empty twice first), believing the worker's letters, and redrives it
    let worker = Producers::parse("", "AROAWORKER").expect("parsed");
    queue.sample_nothing(dlq, 2);
    let entries = dlq_inspect(&ledger, None, &worker, &queue, dlq, 10, 0)
        .await
        .expect("inspected");
    let verdicts: Vec<String> = entries.iter().map(|e| e.verdict.label()).collect();
    assert_eq!(verdicts.len(), 4, "{verdicts:?}");
    assert!(
        verdicts
            .iter()
            .any(|v| v.starts_with("poison (body is not JSON")),
        "{verdicts:?}"
    );
    assert!(
        verdicts.contains(
            &"poison (deadline_at: further away than MAX_RECEIVE_COUNT receives carry)".to_owned()
        ),
        "{verdicts:?}"
    );
    let held = dlq_inspect(&ledger, None, &worker, &queue, dlq, 10, 60)
        .await
        .expect("held");
    let moved = dlq_redrive(&queue, dlq, work, &held).await.expect("moved");
    // THEN the two live jobs' letters are in the work queue; the broken and the refused
    // ones stay
    assert_eq!(moved, 2);
    assert_eq!(queue.bodies(work), bodies[..2]);
    assert_eq!(queue.bodies(dlq), bodies[2..]);
    // AND the same refusal on a letter nobody trusted sent is not believed: a stranger's
    // letter is judged by its body alone (the one producer's job, never seen: redrivable)
    let stranger = "https://sqs.local/1/stranger";
    queue.create(stranger);
    let message = Message {
        body: &bodies[3],
        attributes: &refused,
        fifo: None,
    };
    queue
        .send_as(stranger, Some("AIDASOMEONE"), message)
        .expect("sent");
    let judged = dlq_inspect(&ledger, None, &worker, &queue, stranger, 10, 0)
        .await
        .expect("inspected");
    assert_eq!(judged[0].verdict, DlqVerdict::Redrive(None), "{judged:?}");
    // AND its redrive carries none of the reasons it planted
    let again = "https://sqs.local/1/again";
    queue.create(again);
    assert_eq!(
        dlq_redrive(&queue, stranger, again, &judged)
            .await
            .expect("moved"),
        1
    );
    let sent = queue.receive(again, 10, 0).await.expect("received");
    assert!(
        sent[0]
            .attributes
            .iter()
            .all(|(n, _)| n != REASON_ATTRIBUTE && n != DETAIL_ATTRIBUTE),
        "{:?}",
        sent[0].attributes
    );
    // AND a queue that is not there is a typed error, not a string
    let missing = dlq_inspect(
        &ledger,
        None,
        &Producers::default(),
        &queue,
        "https://sqs.local/1/gone",
        10,
        0,
    )
    .await;
    assert!(
        matches!(
            missing,
            Err(OperatorError::Queue(QueueError::NoSuchQueue(_)))
        ),
        "{missing:?}"
    );
}

#[tokio::test]
async fn a_producer_s_letter_is_judged_in_its_own_namespace_whatever_it_names() {
    use crate::job::pointer::NAMED_JOB_ATTRIBUTE;
    // GIVEN two producers, billing's job-1 waiting for a decision, and a DLQ holding: search's
    // own message (moved there by the redrive policy) that names billing's job-1 in the
    // attribute the worker's letters name jobs in, with a reason of its own; the worker's
    // letter for billing's job-1; and a pointer of search's to billing's payload
    let producers = Producers::parse(
        "billing=AROABILLING,search=AROASEARCH",
        "AROAOPERATOR,AROAWORKER",
    )
    .expect("parsed");
    let ledger = InMemoryLedger::new();
    unknown_job(&ledger, "billing/job-1").await;
    let queue = crate::queue::MemoryQueue::new();
    let (dlq, work) = ("https://sqs.local/1/dlq", "https://sqs.local/1/work");
    queue.create(dlq);
    queue.create(work);
    let planted = [
        (NAMED_JOB_ATTRIBUTE.to_owned(), "billing/job-1".to_owned()),
        (REASON_ATTRIBUTE.to_owned(), "conflict".to_owned()),
        ("trace".to_owned(), "t-1".to_owned()),
    ];
    let own = [(NAMED_JOB_ATTRIBUTE.to_owned(), "billing/job-1".to_owned())];
    let pointer = r#"["software.amazon.payloadoffloading.PayloadS3Pointer",{"s3BucketName":"payloads","s3Key":"billing/p.json"}]"#;
    type Letter<'a> = (&'a str, String, &'a [(String, String)]);
    let letters: [Letter<'_>; 4] = [
        ("AROASEARCH:lambda", dead_letter("job-1", "p"), &planted),
        ("AROAWORKER:fn", r#"{"job_id":"job-1"}"#.to_owned(), &own),
        ("AROASEARCH:lambda", pointer.to_owned(), &[]),
        // Someone else (allowed by IAM to send to the DLQ) writing the worker's words.
        ("AROASTRANGER:x", r#"{"job_id":"job-1"}"#.to_owned(), &own),
    ];
    for (sender, body, attributes) in &letters {
        let message = Message {
            body,
            attributes,
            fifo: None,
        };
        queue.send_as(dlq, Some(sender), message).expect("sent");
    }
    // WHEN an operator inspects the DLQ with the deployment's producers
    let entries = dlq_inspect(&ledger, None, &producers, &queue, dlq, 10, 60)
        .await
        .expect("inspected");
    let judged: Vec<_> = entries
        .iter()
        .map(|e| (e.job_id.as_deref(), e.verdict.clone()))
        .collect();
    // THEN search's letter is search's job-1 (never seen), the worker's is billing's, and the
    // pointer outside search's prefix is poison
    assert_eq!(judged[0], (Some("search/job-1"), DlqVerdict::Redrive(None)));
    assert_eq!(
        judged[1],
        (
            Some("billing/job-1"),
            DlqVerdict::Redrive(Some(JobState::Unknown))
        )
    );
    assert!(
        matches!(&judged[2], (None, DlqVerdict::Poison(why)) if why.contains("s3Key")),
        "{judged:?}"
    );
    // AND the stranger's letter is not believed: poison, its job not named
    assert!(
        matches!(&judged[3], (None, DlqVerdict::Poison(why)) if why.contains("TRUSTED_SENDERS")),
        "{judged:?}"
    );
    // AND the redrive names each job by its whole id, and carries nothing search planted
    let moved = dlq_redrive(&queue, dlq, work, &entries)
        .await
        .expect("moved");
    assert_eq!(moved, 2);
    let sent = queue.receive(work, 10, 0).await.expect("received");
    let named = |m: &crate::queue::reader::Received| {
        m.attributes
            .iter()
            .filter(|(n, _)| n.starts_with("fenced-jobs."))
            .cloned()
            .collect::<Vec<_>>()
    };
    assert_eq!(
        named(&sent[0]),
        [(NAMED_JOB_ATTRIBUTE.to_owned(), "search/job-1".to_owned())]
    );
    assert!(
        sent[0]
            .attributes
            .contains(&("trace".to_owned(), "t-1".to_owned()))
    );
    assert_eq!(named(&sent[1]), own);
    // AND without the producers jobctl cannot tell the worker's letter from a producer's: a
    // letter naming a producer's job stays where it is
    let blind = dlq_inspect(&ledger, None, &Producers::default(), &queue, dlq, 10, 0)
        .await
        .expect("inspected");
    assert!(
        blind
            .iter()
            .all(|e| !matches!(e.verdict, DlqVerdict::Redrive(_))),
        "{blind:?}"
    );
}

#[test]
fn throttles_are_shown_when_there_were_any() {
    let mut record = new_job("busy").into_record(JobState::RetryAuthorized, 1_000);
    assert!(!to_text(&record, false).contains("throttles"));
    record.throttles = 2;
    assert!(to_text(&record, false).contains("throttles     2 (refused for the rate limit"));
    assert_eq!(to_json(&record, false)["throttles"], 2);
    // The attempts given back are listed with their outcome.
    record.not_sent = 1;
    record.given_back.push(crate::job::AttemptEntry {
        outcome: crate::job::AttemptOutcome::NotSent,
        finished_at: Some(1_500),
        ..crate::job::AttemptEntry::claimed(1, 1, "inv/m", 1_000, None)
    });
    let text = to_text(&record, false);
    assert!(text.contains("not sent      1 (claimed"), "{text}");
    assert!(text.contains("1        1      not_sent"), "{text}");
    assert_eq!(
        to_json(&record, false)["given_back"][0]["outcome"],
        "not_sent"
    );
}

#[test]
fn each_attempt_shows_what_it_used_and_an_estimate_says_so() {
    let mut record = new_job("used").into_record(JobState::Unknown, 1_000);
    let heard = crate::job::Usage {
        input: 176,
        output: 300,
        cache_read: 1_024,
        reasoning: 256,
        cost_micros: Some(6_000),
        ..crate::job::Usage::default()
    };
    record.attempt_log = vec![
        crate::job::AttemptEntry {
            outcome: crate::job::AttemptOutcome::InvalidOutput,
            usage: Some(heard),
            ..crate::job::AttemptEntry::claimed(1, 1, "w", 1_000, None)
        },
        crate::job::AttemptEntry {
            outcome: crate::job::AttemptOutcome::Uncertain,
            usage: Some(crate::job::Usage::estimate(400, 16_384)),
            ..crate::job::AttemptEntry::claimed(2, 2, "w", 2_000, None)
        },
    ];
    let text = to_text(&record, false);
    let lines = [
        "         used 176 in (+1024 read from the cache, 0 written to it), 300 out (256 reasoning), $0.006000\n",
        "         used ~100 in, 16384 out, not priced, estimated: a call's outcome is unknown\n",
        // The job's line sums them: the cost of the attempts priced, marked as holding an
        // estimate.
        "used          ~276 in (+1024 read from the cache, 0 written to it), 16684 out (256 reasoning), $0.006000, estimated",
    ];
    for line in lines {
        assert!(text.contains(line), "{line:?} in {text}");
    }
    assert_eq!(to_json(&record, false)["usage"]["cost_micros"], 6_000);
    record.max_cost_micros = Some(1_250_000);
    assert!(to_text(&record, false).contains("max cost      $1.250000\n"));
    assert_eq!(to_json(&record, false)["max_cost_micros"], 1_250_000);
    let json = to_json(&record, false);
    assert_eq!(json["attempt_log"][0]["usage"]["cache_read"], 1_024);
    assert_eq!(json["attempt_log"][1]["usage"]["estimated"], true);
    assert!(json["attempt_log"][0]["usage"].get("estimated").is_none());
}

#[tokio::test]
async fn a_decision_whose_answer_was_lost_reports_success_and_its_trigger_is_sent() {
    // GIVEN an unknown job, and a ledger that applies the next decision and loses its answer
    let ledger = FaultyLedger::new(InMemoryLedger::new());
    unknown_job(&ledger, "j").await;
    ledger.inject("decide", Fault::LoseAnswer, 1);
    // WHEN an operator authorises a retry
    let decided = decide(
        &ledger,
        "j",
        OperatorAction::AuthorizeRetry,
        "alice",
        Some("arn:aws:iam::123456789012:user/alice"),
        "checked upstream",
        3_000,
    )
    .await
    .expect("recognised as applied");
    // THEN the decision is reported as made, and its trigger goes out
    assert_eq!(
        (decided.state, decided.owner_epoch),
        (JobState::RetryAuthorized, 2)
    );
    let triggers = RecordingTriggers::new();
    send_trigger(&triggers, &decided).await.expect("sent");
    assert_eq!(triggers.sent().len(), 1);

    // AND another operator's decision on the same epoch is still refused
    let again = decide(&ledger, "j", OperatorAction::Fail, "bob", None, "no", 4_000).await;
    assert!(
        matches!(again, Err(OperatorError::NotUnknown { .. })),
        "{again:?}"
    );
}

#[test]
fn a_refused_answer_shows_its_errors_and_its_excerpt_only_with_the_answer() {
    let mut record = new_job("refused").into_record(JobState::RetryAuthorized, 1_000);
    record.attempt_log.push(crate::job::AttemptEntry {
        outcome: crate::job::AttemptOutcome::InvalidOutput,
        finished_at: Some(1_500),
        finish: Some(crate::job::contract::Finish::Length),
        errors: vec!["the answer is cut off: finish length".into()],
        excerpt: Some(r#"{"secret": "tot"#.into()),
        ..crate::job::AttemptEntry::claimed(1, 1, "inv/m", 1_000, None)
    });
    let text = to_text(&record, false);
    assert!(
        text.contains("invalid_output")
            && text.contains("refused (finish length): the answer is cut off"),
        "{text}"
    );
    assert!(!text.contains("secret"), "{text}");
    assert!(to_text(&record, true).contains(r#"answer began: {"secret": "tot"#));
    let json = to_json(&record, false);
    assert_eq!(json["attempt_log"][0]["finish"], "length");
    assert_eq!(
        json["attempt_log"][0]["errors"][0],
        "the answer is cut off: finish length"
    );
    assert!(json["attempt_log"][0].get("excerpt").is_none());
    assert_eq!(
        to_json(&record, true)["attempt_log"][0]["excerpt"],
        r#"{"secret": "tot"#
    );
}

#[tokio::test]
async fn a_tenants_live_jobs_are_found_through_the_indexes_and_no_other_tenants() {
    use crate::ledger::CreateRequest;
    let ledger = crate::ledger::memory::InMemoryLedger::new();
    for (id, tenant) in [("a-1", "acme"), ("a-2", "acme"), ("g-1", "globex")] {
        let mut job = crate::job::NewJob::from_message(
            &crate::job::parse_body(Some(&format!(
                r#"{{"job_id":"{id}","tenant":"{tenant}","contract":"c","input":{{"model":"m","prompt":"p"}}}}"#
            )))
            .expect("valid"),
            1_000,
            &crate::job::JobDefaults::default(),
        );
        job.input = "{}".into();
        ledger
            .create(CreateRequest {
                job,
                now: 1_000,
                enqueued: false,
            })
            .await
            .expect("create");
    }
    cancel(&ledger, "a-2", "op", None, "gone", 2_000)
        .await
        .expect("cancel");
    // A first claim listed due (its message SQS may drop), in no attention index.
    let mut first = crate::job::NewJob::from_message(
        &crate::job::parse_body(Some(
            r#"{"job_id":"a-3","tenant":"acme","contract":"c","input":{"model":"m","prompt":"p"}}"#,
        ))
        .expect("valid"),
        1_000,
        &crate::job::JobDefaults::default(),
    );
    first.input = String::new();
    claimed(&ledger, first).await;
    let found = tenant_jobs(&ledger, "acme", 2_000).await.expect("walk");
    assert_eq!(found, ["a-1", "a-3"], "a cancelled job is not live");
    assert_eq!(
        tenant_jobs(&ledger, "initech", 2_000)
            .await
            .expect("walk")
            .len(),
        0
    );
}

/// A job claimed for its first attempt, running under a lease, due at `deadline_at`.
async fn running_job(ledger: &impl JobLedger, job_id: &str, deadline_at: Millis) {
    claimed(ledger, NewJob::example(job_id, deadline_at)).await;
}

/// `job` claimed for its first attempt, running under a lease, listed in the due index.
async fn claimed(ledger: &impl JobLedger, job: NewJob) {
    let claim = ClaimRequest {
        job,
        expect: crate::job::Expect::FRESH,
        owner_id: "w".into(),
        now: 1_000,
        lease_until: 61_000,
        provider_ref: None,
        route: None,
        first_sight: false,
        list_due: true,
    };
    assert!(matches!(ledger.claim(claim).await, Ok(Write::Applied(_))));
}

#[tokio::test]
async fn the_reconcilers_sweep_sends_back_only_live_jobs_letters_the_redrive_policy_moved() {
    // GIVEN a DLQ holding the letters the redrive policy moved of a running job, one past its
    // deadline, an unknown one, a finished one and one never claimed, and a letter the worker
    // sent (with its reason) of a running job
    let ledger = InMemoryLedger::new();
    running_job(&ledger, "crashing", 10_000_000).await;
    running_job(&ledger, "refused", 10_000_000).await;
    running_job(&ledger, "late", 3_000).await;
    unknown_job(&ledger, "stuck").await;
    running_job(&ledger, "done", 10_000_000).await;
    let end = EndRequest {
        job_id: "done".to_owned(),
        epoch: 1,
        attempt: 1,
        now: 2_000,
        end: AttemptEnd::Succeeded {
            result: r#"{"output":"ok"}"#.into(),
            finish: crate::job::contract::Finish::Stop,
        },
        usage: None,
        input: None,
    };
    assert!(matches!(ledger.end(end).await, Ok(Write::Applied(_))));
    let queue = crate::queue::MemoryQueue::new();
    let (dlq, work) = ("https://sqs.local/1/dlq", "https://sqs.local/1/work");
    queue.create(dlq);
    queue.create(work);
    let reason = [(REASON_ATTRIBUTE.to_owned(), "poison".to_owned())];
    // Re-triggers by id (the ledger's jobs' digests are made up), and a job never seen.
    let by_id = |id: &str| format!(r#"{{"job_id":"{id}"}}"#);
    let bodies = [
        by_id("crashing"),
        by_id("stuck"),
        by_id("done"),
        dead_letter("new", "p"),
        by_id("refused"),
        by_id("late"),
    ];
    worker_letters(&queue, dlq, &bodies, (4, &reason));

    // WHEN the reconciler sweeps it at 5,000
    let worker = Producers::parse("", "AROAWORKER").expect("parsed");
    let swept = redrive_live(&ledger, &worker, &queue, (dlq, work), (10, 5_000)).await;

    // THEN only the running job's letter is back in the work queue; the others stay, and the
    // job past its deadline is named for the reconciler to expire
    assert_eq!(
        (swept.moved, swept.left, swept.failed),
        (1, 5, 0),
        "{swept:?}"
    );
    assert_eq!(swept.overdue, ["late"]);
    assert_eq!(queue.bodies(work), bodies[..1]);
    assert_eq!(queue.bodies(dlq), bodies[1..]);
}
