//! The recovery drill on the emulator (`make drill` prints its timeline): a model call outlasts
//! the visibility timeout while its worker is paused; another receiver first defers to the live
//! owner, then fences it after its lease lapses; the resumed worker cannot accept; the uncertain
//! attempt waits for a recorded decision; after it, the job succeeds, and its answer survives a
//! failed message deletion.

use std::time::{Duration, Instant};

use fenced_jobs::clock::{Clock, SystemClock};
use fenced_jobs::job::{Failure, JobItem, JobState, RecordOutcome};
use fenced_jobs::ledger::{JobLedger, OperatorAction};
use fenced_jobs::ops::operator;
use fenced_jobs::provider::SimulatedProvider;
use fenced_jobs::testing::event_source::PollReport;
use fenced_jobs::worker::handler::BatchReport;

use crate::support::{self, deliver, emulator, job, slow_settings};

const JOB: &str = "drill-1";
/// The provider cannot be asked about the call afterwards, so the recovery finds an attempt
/// whose outcome is unknown.
const NOT_RETRIEVABLE: &str = r#""simulate":{"retrievable":false}"#;

struct Timeline {
    started: Instant,
    deliveries: u32,
    rows: Vec<String>,
    /// The same rows as data, for `make bench`'s picture of the drill.
    events: Vec<serde_json::Value>,
}

impl Timeline {
    /// One line: who, the record's outcome, and the job as the ledger holds it afterwards.
    fn row(
        &mut self,
        actor: &str,
        poll: Option<(&PollReport, &BatchReport)>,
        item: &JobItem,
        what: &str,
    ) {
        // A's row after it resumes reports its first delivery, already counted.
        if actor != "A" && poll.is_some_and(|(p, _)| p.received > 0) {
            self.deliveries += 1;
        }
        let (outcome, renewals, deletion) = match poll {
            Some((p, b)) => (
                b.records
                    .first()
                    .map_or("-", |r| r.outcome.label())
                    .to_owned(),
                format!("{}/{}", b.stats.lease_renewed, b.stats.lease_refused),
                if p.deleted > 0 {
                    "deleted"
                } else if p.delete_failures > 0 {
                    "delete failed"
                } else {
                    "kept"
                },
            ),
            None => ("-".to_owned(), "-".to_owned(), "-"),
        };
        let deadline_left = format!("{}s", (item.deadline_at - SystemClock.now_ms()) / 1000);
        let recovery = item.recoveries.last().map_or("-", |r| r.reason.as_str());
        self.events.push(serde_json::json!({
            "at": self.started.elapsed().as_secs_f64(),
            "actor": actor,
            "label": if outcome == "-" {
                format!("e{} {}", item.owner_epoch, item.state.as_str())
            } else {
                format!("{outcome} (e{} {})", item.owner_epoch, item.state.as_str())
            },
        }));
        self.rows.push(format!(
            "{:>5.1}s  {:<8} {:>10} {:<17} {:>5}  {:<17} {:>8}  {:>9}  {:>12}  {:<24} {:<13} {what}",
            self.started.elapsed().as_secs_f64(),
            actor,
            self.deliveries,
            outcome,
            item.owner_epoch,
            item.state.as_str(),
            format!("{}/{}", item.attempts, item.max_attempts),
            deadline_left,
            renewals,
            recovery,
            deletion,
        ));
    }

    fn print(&self) {
        println!("\njob {JOB}: recovery drill timeline");
        println!(
            "{:>6}  {:<8} {:>10} {:<17} {:>5}  {:<17} {:>8}  {:>9}  {:>12}  {:<24} {:<13} what",
            "t",
            "worker",
            "deliveries",
            "record outcome",
            "epoch",
            "job state",
            "attempts",
            "deadline",
            "renewed/ref",
            "recovery reason",
            "deletion"
        );
        for row in &self.rows {
            println!("{row}");
        }
        // `make bench` draws the timeline from this file.
        if let Ok(path) = std::env::var("DRILL_TIMELINE") {
            let json = serde_json::to_string(&self.events).expect("the timeline as JSON");
            std::fs::write(path, json).expect("write the timeline");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_recovery_drill() {
    let aws = emulator().await;
    let table = aws.table().await;
    let queue = aws.queue(2).await;
    let ledger = aws.ledger(&table);
    // A's receive is the first delivery; the rows count the ones the drill sees after it.
    let mut timeline = Timeline {
        started: Instant::now(),
        deliveries: 1,
        rows: Vec::new(),
        events: Vec::new(),
    };
    aws.send(&queue, &job(JOB, "a long report", NOT_RETRIEVABLE))
        .await;

    // Worker A claims the job, then its process freezes for 7 s (no heartbeat, no renewal).
    let worker_a = support::spawn_frozen_worker(&table, &queue.url, Duration::from_millis(7_000));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let item = ledger.get(JOB).await.expect("get").expect("claimed");
    timeline.row(
        "A",
        None,
        &item,
        "A claimed attempt 1 and froze inside the call",
    );

    // Worker B: the message comes back after 2 s. It defers to A's live lease, then fences A.
    let b = aws.handler(
        &table,
        SimulatedProvider::new(),
        slow_settings(2, 600, 4_000),
    );
    let source_b = aws.source(&queue).await;
    let give_up = Instant::now() + Duration::from_secs(12);
    let mut deferred = false;
    loop {
        assert!(Instant::now() < give_up, "B never recovered the job");
        let (poll, report) = deliver(&source_b, &b).await;
        if let Some(report) = report {
            let item = ledger.get(JOB).await.expect("get").expect("item");
            match &report.records[0].outcome {
                RecordOutcome::Failed(Failure::Deferred { .. }) => {
                    timeline.row(
                        "B",
                        Some((&poll, &report)),
                        &item,
                        "live owner: deferred, no model call",
                    );
                    deferred = true;
                }
                RecordOutcome::Failed(Failure::AwaitingDecision) => {
                    timeline.row(
                        "B",
                        Some((&poll, &report)),
                        &item,
                        "lease lapsed: recovery claim fenced A; attempt uncertain",
                    );
                    break;
                }
                other => panic!("unexpected outcome for B: {other:?}"),
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(deferred, "B first deferred to the live owner");
    assert_eq!(
        b.processor().provider().executions(),
        0,
        "a live or lapsed owner never causes a second call"
    );

    // A resumes with an answer: its epoch is stale, the acceptance is refused.
    let (a_poll, a_report, a_calls) = worker_a.join().expect("worker A");
    let a_report = a_report.expect("A's report");
    let item = ledger.get(JOB).await.expect("get").expect("item");
    timeline.row(
        "A",
        Some((&a_poll, &a_report)),
        &item,
        "A resumed: acceptance refused at stale epoch 1",
    );
    assert_eq!(a_calls, 1);
    assert_eq!(item.result, None, "the stale answer was not published");
    assert_eq!((item.state, item.owner_epoch), (JobState::Unknown, 2));

    // Another delivery cannot re-run the uncertain attempt without a decision.
    aws.send(&queue, &job(JOB, "a long report", NOT_RETRIEVABLE))
        .await;
    let (poll, report) = deliver(&source_b, &b).await;
    let report = report.expect("report");
    assert_eq!(
        report.records[0].outcome,
        RecordOutcome::Failed(Failure::AwaitingDecision)
    );
    let item = ledger.get(JOB).await.expect("get").expect("item");
    assert_eq!(item.state, JobState::Unknown);
    timeline.row(
        "B",
        Some((&poll, &report)),
        &item,
        "provider asked again, does not know the call: waits for a decision",
    );

    // The operator decides; the trigger runs attempt 2; its deletion fails.
    let decided = operator::decide(
        &ledger,
        JOB,
        OperatorAction::AuthorizeRetry,
        "operator",
        None,
        "drill: upstream shows no completion",
        SystemClock.now_ms(),
    )
    .await
    .expect("decide");
    operator::send_trigger(
        &fenced_jobs::queue::SqsTriggers::new(aws.sqs.clone(), &queue.url),
        &decided,
    )
    .await
    .expect("trigger");
    timeline.row(
        "operator",
        None,
        &decided,
        "retry authorised (decision recorded), trigger sent",
    );
    let c = aws.handler(
        &table,
        SimulatedProvider::new(),
        slow_settings(2, 600, 4_000),
    );
    let mut source_c = aws.source(&queue).await;
    source_c.fail_deletes = true;
    let (poll, report) = deliver(&source_c, &c).await;
    let report = report.expect("report");
    let item = ledger.get(JOB).await.expect("get").expect("item");
    timeline.row(
        "C",
        Some((&poll, &report)),
        &item,
        "attempt 2 accepted; the delete failed",
    );
    assert_eq!((item.state, item.attempts), (JobState::Succeeded, 2));
    assert_eq!(poll.delete_failures, 1);

    // The undeleted message comes back: acknowledged from the ledger, without a model call.
    source_c.fail_deletes = false;
    tokio::time::sleep(Duration::from_millis(2_200)).await;
    let (poll, report) = deliver(&source_c, &c).await;
    let report = report.expect("report");
    timeline.row(
        "C",
        Some((&poll, &report)),
        &item,
        "redelivered: terminal, acknowledged, no call",
    );
    assert_eq!(
        report.records[0].outcome,
        RecordOutcome::Done(JobState::Succeeded)
    );
    assert_eq!(poll.deleted, 1);
    assert_eq!(c.processor().provider().executions(), 1);
    assert_eq!(
        ledger.get(JOB).await.expect("get").expect("item").result,
        item.result
    );

    timeline.print();
}
