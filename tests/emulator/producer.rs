//! The producer and the reconciler on the emulator: ledger first, then the trigger; triggers
//! that carry only a job id; repairs of a producer that stopped between its two steps; expiry.

use fenced_jobs::clock::{Clock, SystemClock};
use fenced_jobs::job::{Expect, NewJob};
use fenced_jobs::job::{Failure, InvalidMessage, JobState, RecordOutcome, parse_body};
use fenced_jobs::ledger::{ClaimRequest, CreateRequest, JobLedger, Write};
use fenced_jobs::ops::producer::{Intake, submit};
use fenced_jobs::ops::reconcile::{ReconcileSettings, reconcile};
use fenced_jobs::provider::SimulatedProvider;
use fenced_jobs::queue::SqsTriggers;

use crate::support::{deliver, emulator, fast_settings, job};

fn lines(text: &str) -> impl Iterator<Item = std::io::Result<String>> + '_ {
    text.lines().map(|l| Ok(l.to_owned()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_writes_the_ledger_first_then_sends_and_the_worker_runs_every_job() {
    // GIVEN a file with three jobs, a repeat, a conflicting reuse of an id, a bad line and a
    // job too large to travel whole (a queue with a 1 s visibility timeout, so that a peek
    // does not hide the messages for long)
    let aws = emulator().await;
    let table = aws.table().await;
    let queue = aws.queue(1).await;
    let ledger = aws.ledger(&table);
    let big = "x".repeat(70_000);
    let file = [
        job("p-1", "first", ""),
        job("p-2", "second", ""),
        String::new(),
        job("p-1", "first", ""),
        job("p-1", "another input", ""),
        "{not json".to_owned(),
        job("p-big", &big, ""),
    ]
    .join("\n");

    // WHEN it is submitted
    let mut progress_calls = 0;
    let report = submit(
        &ledger,
        &SqsTriggers::new(aws.sqs.clone(), &queue.url),
        lines(&file),
        || SystemClock.now_ms(),
        &Intake {
            defaults: fast_settings().job_defaults,
            ..Intake::default()
        },
        |_| progress_calls += 1,
    )
    .await;

    // THEN each line is accounted for, and only new jobs were sent
    assert_eq!(report.lines, 6);
    assert_eq!(report.created, 3);
    assert_eq!(report.already_present, 1);
    assert_eq!(report.conflicts, vec![(5, "p-1".to_owned())]);
    assert_eq!(report.invalid.len(), 1);
    assert_eq!(report.invalid[0].0, 6);
    assert_eq!(report.sent, 3);
    assert!(report.send_failed.is_empty() && report.ledger_failed.is_empty());
    assert_eq!(progress_calls, 1);
    for id in ["p-1", "p-2", "p-big"] {
        let item = ledger.get(id).await.expect("get").expect("item");
        assert_eq!(item.state, JobState::Ready);
        assert!(item.enqueued_at.is_some(), "{id}: enqueue recorded");
    }
    let bodies: Vec<String> = aws
        .peek(&queue.url, 1)
        .await
        .iter()
        .filter_map(|m| m.body().map(str::to_owned))
        .collect();
    assert!(
        bodies.contains(&r#"{"job_id":"p-big"}"#.to_owned()),
        "a large job travels by id"
    );

    // AND the worker runs all three (the by-id trigger reads its input from the ledger)
    tokio::time::sleep(std::time::Duration::from_millis(1_100)).await;
    let handler = aws.handler(&table, SimulatedProvider::new(), fast_settings());
    let source = aws.source(&queue).await;
    aws.calls.reset();
    let mut done = 0;
    for _ in 0..5 {
        let (poll, _) = deliver(&source, &handler).await;
        done += poll.deleted;
        if done == 3 {
            break;
        }
    }
    assert_eq!(done, 3);
    // The whole-job messages say their items exist, so each is claimed in place at once (no
    // whole-item write refused first); the by-id trigger reads its item once.
    assert_eq!(
        (
            aws.calls.get("dynamodb", "PutItem"),
            aws.calls.get("dynamodb", "GetItem"),
            aws.calls.get("dynamodb", "UpdateItem"),
        ),
        (0, 1, 6),
        "{:?}",
        aws.calls.counts()
    );
    for id in ["p-1", "p-2", "p-big"] {
        let item = ledger.get(id).await.expect("get").expect("item");
        assert_eq!(
            (item.state, item.attempts),
            (JobState::Succeeded, 1),
            "{id}"
        );
    }
    assert_eq!(handler.processor().provider().executions(), 3);

    // AND submitting the same file again sends nothing new
    let again = submit(
        &ledger,
        &SqsTriggers::new(aws.sqs.clone(), &queue.url),
        lines(&file),
        || SystemClock.now_ms(),
        &Intake {
            defaults: fast_settings().job_defaults,
            ..Intake::default()
        },
        |_| {},
    )
    .await;
    assert_eq!(
        (again.created, again.already_present, again.sent),
        (0, 4, 0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trigger_naming_a_job_the_ledger_does_not_hold_is_poison() {
    let aws = emulator().await;
    let table = aws.table().await;
    let queue = aws.queue(30).await;
    let handler = aws.handler(&table, SimulatedProvider::new(), fast_settings());
    let source = aws.source(&queue).await;
    aws.send(&queue, r#"{"job_id":"never-submitted"}"#).await;
    let (_, report) = deliver(&source, &handler).await;
    let report = report.expect("report");
    assert_eq!(
        report.records[0].outcome,
        RecordOutcome::Failed(Failure::Poison(InvalidMessage::UnknownJob))
    );
    assert_eq!(report.records[0].visibility_s, Some(0));
    assert_eq!(aws.item_count(&table).await, 0, "nothing was created");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reconciler_repairs_a_stopped_producer_and_expires_jobs_past_their_deadline() {
    let aws = emulator().await;
    let table = aws.table().await;
    let queue = aws.queue(30).await;
    let ledger = aws.ledger(&table);
    let now = SystemClock.now_ms();
    let settings = fast_settings();
    let create = |body: String, at: i64| {
        let msg = parse_body(Some(&body)).expect("valid");
        CreateRequest {
            job: NewJob::from_message(&msg, at, &settings.job_defaults),
            now: at,
            enqueued: false,
        }
    };
    // GIVEN a producer that wrote a job and stopped before sending it
    ledger
        .create(create(job("stranded", "p", ""), now - 10_000))
        .await
        .expect("create");
    // AND a job that is running past its deadline (and the skew margin), and one ready past it
    let late = |id: &str| {
        let deadline = fenced_jobs::job::message::format_rfc3339_ms(now - 5_000);
        format!(
            r#"{{"job_id":"{id}","contract":"c","deadline_at":"{deadline}","input":{{"model":"m","prompt":"p"}}}}"#
        )
    };
    ledger
        .create(create(late("late-running"), now - 60_000))
        .await
        .expect("create");
    // A job's second claim (its first attempt failed), by `owner` at `at`, its lease to `until`:
    // a running job the reconciler watches. One on its first claim is left to the message that
    // claimed it, which stays in the queue until the job is terminal.
    let second_claim = |body: String, owner: &'static str, at: i64, until: i64| {
        let ledger = &ledger;
        let job = create(body, at).job;
        async move {
            let claim = |expect, lease_until| ClaimRequest {
                job: job.clone(),
                expect,
                owner_id: owner.into(),
                now: at,
                lease_until,
                provider_ref: None,
                route: None,
                first_sight: false,
                // The item keeps its input (a producer created it): the worker's claim says so.
                list_due: true,
            };
            let first = ledger.claim(claim(Expect::FRESH, until)).await;
            assert!(matches!(first, Ok(Write::Applied(_))), "{first:?}");
            let failed = ledger
                .end(fenced_jobs::ledger::EndRequest {
                    job_id: job.job_id.clone(),
                    epoch: 1,
                    attempt: 1,
                    now: at,
                    end: fenced_jobs::ledger::AttemptEnd::RetryAuthorized {
                        error: "transient".into(),
                    },
                    usage: None,
                    input: None,
                })
                .await;
            assert!(matches!(failed, Ok(Write::Applied(_))), "{failed:?}");
            let again = Expect {
                epoch: 1,
                attempts: 1,
            };
            let second = ledger.claim(claim(again, until)).await;
            assert!(matches!(second, Ok(Write::Applied(_))), "{second:?}");
        }
    };
    second_claim(late("late-running"), "w1", now - 59_000, now + 60_000).await;
    ledger
        .create(create(late("late-ready"), now - 60_000))
        .await
        .expect("create");

    // AND a job whose owner vanished long ago (its message may be in the DLQ)
    ledger
        .create(create(job("abandoned", "p", ""), now - 700_000))
        .await
        .expect("create");
    second_claim(
        job("abandoned", "p", ""),
        "gone",
        now - 700_000,
        now - 640_000,
    )
    .await;

    // AND one whose owner vanished on its first claim: its message brings it back
    ledger
        .create(create(job("first-claim", "p", ""), now - 700_000))
        .await
        .expect("create");
    let first = ledger
        .claim(ClaimRequest {
            job: create(job("first-claim", "p", ""), now - 700_000).job,
            expect: Expect::FRESH,
            owner_id: "gone".into(),
            now: now - 700_000,
            lease_until: now - 640_000,
            provider_ref: None,
            route: None,
            first_sight: false,
            list_due: false,
        })
        .await;
    assert!(matches!(first, Ok(Write::Applied(_))));

    // WHEN the reconciler runs
    let quick = ReconcileSettings {
        ready_after_ms: 5_000,
        ..ReconcileSettings::default()
    };
    let report = reconcile(
        &ledger,
        &SqsTriggers::new(aws.sqs.clone(), &queue.url),
        &SimulatedProvider::new(),
        now,
        &quick,
    )
    .await
    .expect("reconcile");

    // THEN the late jobs are expired (the live owner fenced), the stranded and the abandoned
    // ones re-sent, and the job on its first claim is not looked at
    assert_eq!(report.expired, 2, "{report:?}");
    assert_eq!(report.resent, 2, "{report:?}");
    assert_eq!(report.unknown, 0);
    let left = ledger.get("first-claim").await.expect("get").expect("item");
    assert_eq!((left.state, left.owner_epoch), (JobState::Running, 1));
    for id in ["late-running", "late-ready"] {
        let item = ledger.get(id).await.expect("get").expect("item");
        assert_eq!(item.state, JobState::Expired, "{id}");
    }
    let owner_accepts = ledger
        .end(fenced_jobs::ledger::EndRequest {
            job_id: "late-running".into(),
            epoch: 2,
            attempt: 2,
            now: now + 1,
            end: fenced_jobs::ledger::AttemptEnd::Succeeded {
                result: "{}".into(),
                finish: fenced_jobs::job::contract::Finish::Stop,
            },
            usage: None,
            input: None,
        })
        .await
        .expect("finish");
    assert!(matches!(owner_accepts, Write::Refused(_)));

    // AND a second run right away sends nothing more
    let again = reconcile(
        &ledger,
        &SqsTriggers::new(aws.sqs.clone(), &queue.url),
        &SimulatedProvider::new(),
        now + 1_000,
        &quick,
    )
    .await
    .expect("reconcile");
    assert_eq!((again.expired, again.resent), (0, 0), "{again:?}");

    // AND the worker runs the stranded job, and fences and investigates the abandoned one
    // (no reference: its attempt may have run, so it waits for a decision)
    let handler = aws.handler(&table, SimulatedProvider::new(), fast_settings());
    let source = aws.source(&queue).await;
    let (poll, _) = deliver(&source, &handler).await;
    assert_eq!((poll.received, poll.deleted), (2, 1));
    let item = ledger.get("stranded").await.expect("get").expect("item");
    assert_eq!(item.state, JobState::Succeeded);
    let item = ledger.get("abandoned").await.expect("get").expect("item");
    assert_eq!((item.state, item.owner_epoch), (JobState::Unknown, 3));
    assert_eq!(handler.processor().provider().executions(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_sent_recently_never_hides_a_job_whose_trigger_was_never_sent() {
    let aws = emulator().await;
    let table = aws.table().await;
    let queue = aws.queue(30).await;
    let ledger = aws.ledger(&table);
    let now = SystemClock.now_ms();
    let settings = fast_settings();
    let create = |id: &str, at: i64, enqueued: bool| {
        let msg = parse_body(Some(&job(id, "p", ""))).expect("valid");
        CreateRequest {
            job: NewJob::from_message(&msg, at, &settings.job_defaults),
            now: at,
            enqueued,
        }
    };
    // GIVEN 30 jobs sent ten minutes ago, all in the same millisecond, still waiting in the
    // queue (a backlog: their triggers are not stale)
    for i in 0..30 {
        let req = create(&format!("backlog-{i:02}"), now - 600_000, true);
        ledger.create(req).await.expect("create");
    }
    // AND a job written six minutes ago by a producer that stopped before sending it
    ledger
        .create(create("stranded", now - 360_000, false))
        .await
        .expect("create");
    let sqs = SqsTriggers::new(aws.sqs.clone(), &queue.url);
    let provider = SimulatedProvider::new();
    // WHEN a reconciler that takes 4 jobs a run but may read 40 runs
    let walk = ReconcileSettings {
        max_jobs: 4,
        max_examined: 40,
        ..ReconcileSettings::default()
    };
    let report = reconcile(&ledger, &sqs, &provider, now, &walk)
        .await
        .expect("reconcile");
    // THEN it walks past the backlog (pages of 4 within one millisecond) and re-sends the
    // stranded job alone
    assert_eq!((report.resent, report.walks_cut), (1, 0), "{report:?}");
    assert_eq!(report.examined, 31, "{report:?}");
    let item = ledger.get("stranded").await.expect("get").expect("item");
    assert!(item.enqueued_at.is_some_and(|at| at == now));
    let sent = aws.peek(&queue.url, 0).await;
    assert_eq!(sent.len(), 1);
    assert!(sent[0].body().is_some_and(|b| b.contains("stranded")));

    // AND with a budget smaller than the backlog the walk stops, says so, and sends nothing
    let short = ReconcileSettings {
        max_examined: 20,
        ..walk
    };
    ledger
        .create(create("stranded-2", now - 360_000, false))
        .await
        .expect("create");
    let cut = reconcile(&ledger, &sqs, &provider, now + 1_000, &short)
        .await
        .expect("reconcile");
    assert_eq!((cut.resent, cut.walks_cut, cut.examined), (0, 1, 20));
}

/// A job claimed on first sight as the worker claims it (its item keeps no input), due two
/// seconds after `now`, on a message SQS may drop (so the claim lists it in the due index),
/// whose owner died and whose message is gone (dead-lettered, its retention passed): no other
/// index holds it. The reconciler runs before the deadline, past
/// it, and once more; what each run did, and the job after them.
pub(crate) async fn lost_on_its_first_claim<L>(
    ledger: &L,
    triggers: &impl fenced_jobs::queue::TriggerSender,
    now: i64,
) -> (
    Vec<fenced_jobs::ops::reconcile::ReconcileReport>,
    fenced_jobs::job::JobItem,
)
where
    L: JobLedger + fenced_jobs::ledger::LedgerIndex,
{
    let msg = parse_body(Some(&job("lost", "p", ""))).expect("valid");
    let mut new = NewJob::from_message(&msg, now, &fast_settings().job_defaults);
    new.deadline_at = now + 2_000;
    let claimed = ledger
        .claim(ClaimRequest {
            job: new,
            expect: Expect::FRESH,
            owner_id: "gone".into(),
            now,
            lease_until: now + 1_000,
            provider_ref: None,
            route: None,
            first_sight: true,
            list_due: true,
        })
        .await;
    let Ok(Write::Applied(claimed)) = claimed else {
        panic!("{claimed:?}");
    };
    assert!(!claimed.keeps_input());
    let provider = SimulatedProvider::new();
    let settings = ReconcileSettings::default();
    let mut runs = Vec::new();
    for at in [now, now + 10_000, now + 20_000] {
        let run = reconcile(ledger, triggers, &provider, at, &settings).await;
        runs.push(run.expect("reconcile"));
    }
    // The run past the deadline finds it in the due index and expires it, saying why; nothing
    // is sent (a trigger by id cannot run a job without its input); the walk is recorded, so
    // the last run reads nothing again.
    let lost: Vec<_> = runs.iter().map(|r| (r.expired, r.message_lost)).collect();
    assert_eq!(lost, [(0, 0), (1, 1), (0, 0)], "{runs:?}");
    assert_eq!(runs.iter().map(|r| r.resent).sum::<u64>(), 0);
    let walked: Vec<_> = runs.iter().map(|r| r.due_walked).collect();
    assert_eq!(walked, [0, 1, 0]);
    let item = ledger.get("lost").await.expect("get").expect("item");
    assert_eq!(item.state, JobState::Expired);
    assert_eq!(
        item.last_error.as_ref().map(|e| e.kind.as_str()),
        Some("message_lost")
    );
    (runs, item)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_whose_message_is_lost_on_its_first_claim_ends_message_lost_at_its_deadline() {
    use aws_sdk_dynamodb::types::AttributeValue;
    let aws = emulator().await;
    let table = aws.table().await;
    let queue = aws.queue(1).await;
    let triggers = SqsTriggers::new(aws.sqs.clone(), &queue.url);
    let now = SystemClock.now_ms();
    lost_on_its_first_claim(&aws.ledger(&table), &triggers, now).await;
    // The walk's record is an item of the table, as far as the last run saw deadlines pass.
    let walk = aws
        .ddb
        .get_item()
        .table_name(&table)
        .key("job_id", AttributeValue::S("#reconcile#due".into()))
        .consistent_read(true)
        .send()
        .await
        .expect("get");
    let walked = walk.item().and_then(|i| i.get("walked_to")).cloned();
    let skew = ReconcileSettings::default().skew_ms;
    assert_eq!(
        walked,
        Some(AttributeValue::N((now + 20_000 - skew).to_string()))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_triggers_go_several_requests_at_once_and_come_back_in_order() {
    use fenced_jobs::queue::{Outgoing, TriggerSender};
    let aws = emulator().await;
    let queue = aws.queue(30).await;
    let sender = SqsTriggers::new(aws.sqs.clone(), &queue.url);
    // Ten requests of ten and one of five: more than go at once.
    let triggers: Vec<Outgoing> = (0..105)
        .map(|i| Outgoing::by_id(&format!("many-{i:03}")))
        .collect();
    let sent = sender.send(&triggers, "once").await;
    let ids: Vec<&str> = sent.iter().map(|(id, _)| id.as_str()).collect();
    let asked: Vec<&str> = triggers.iter().map(|t| t.job_id.as_str()).collect();
    assert_eq!(ids, asked, "results come back in the order given");
    assert!(sent.iter().all(|(_, r)| r.is_ok()), "{sent:?}");
    let mut received = std::collections::BTreeSet::new();
    while received.len() < triggers.len() {
        let out = aws
            .sqs
            .receive_message()
            .queue_url(&queue.url)
            .max_number_of_messages(10)
            .wait_time_seconds(1);
        let out = out.send().await.expect("receive");
        if out.messages().is_empty() {
            break;
        }
        received.extend(
            out.messages()
                .iter()
                .filter_map(|m| m.body().map(str::to_owned)),
        );
    }
    assert_eq!(received.len(), 105, "each trigger is on the queue once");
}
