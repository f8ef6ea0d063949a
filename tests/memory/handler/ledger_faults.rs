//! A ledger whose answers are lost: a paid answer survives failing acceptance writes, and a
//! claim whose answer was lost is recognised, not made twice or deferred to.

use std::sync::Arc;

use fenced_jobs::job::{JobState, RecordOutcome};
use fenced_jobs::ledger::JobLedger;
use fenced_jobs::ledger::memory::Fault;
use fenced_jobs::provider::SimulatedProvider;
use fenced_jobs::worker::Settings;

use super::{event, faulty, handler, invocation, job, lapsed_claim, record};

#[tokio::test]
async fn a_paid_answer_survives_failing_acceptance_writes() {
    // GIVEN a ledger whose first two end-of-attempt writes fail
    let ledger = faulty("end", Fault::Fail, 2);
    let h = handler(ledger, SimulatedProvider::new(), Settings::default());
    // WHEN a job is processed
    let report = h
        .handle_batch(
            &event(vec![record(Some("m1"), &job("paid", ""))]),
            &invocation(),
        )
        .await;
    // THEN the acceptance is tried again within the invocation and lands: one call, succeeded
    assert_eq!(
        report.records[0].outcome,
        RecordOutcome::Done(JobState::Succeeded)
    );
    assert_eq!(h.processor().provider().executions(), 1);
}

#[tokio::test]
async fn a_claim_whose_answer_was_lost_is_recognised_and_its_call_made_once() {
    // GIVEN a ledger that applies the first claim and loses its answer
    let ledger = Arc::new(faulty("claim", Fault::LoseAnswer, 1));
    let h = handler(
        ledger.clone(),
        SimulatedProvider::new(),
        Settings::default(),
    );
    // WHEN a job is processed
    let report = h
        .handle_batch(
            &event(vec![record(Some("m1"), &job("lost-claim", ""))]),
            &invocation(),
        )
        .await;
    // THEN the worker reads its own claim back and goes on: one call, succeeded, no job left
    // running without a call (which would later turn unknown)
    assert_eq!(
        report.records[0].outcome,
        RecordOutcome::Done(JobState::Succeeded)
    );
    assert_eq!(h.processor().provider().executions(), 1);
    let item = ledger
        .inner
        .get("lost-claim")
        .await
        .expect("get")
        .expect("item");
    assert_eq!((item.owner_epoch, item.attempts), (1, 1));
}

#[tokio::test]
async fn a_recovery_claim_whose_answer_was_lost_is_recognised_not_deferred_to() {
    // GIVEN a job whose owner's lease lapsed, and a ledger that applies the next recovery claim
    // and loses its answer
    let ledger = Arc::new(faulty("recover", Fault::LoseAnswer, 1));
    let body = job("lost-recovery", "");
    lapsed_claim(&ledger.inner, &body).await;
    let h = handler(
        ledger.clone(),
        SimulatedProvider::new(),
        Settings::default(),
    );
    // WHEN it is delivered
    let report = h
        .handle_batch(&event(vec![record(Some("m1"), &body)]), &invocation())
        .await;
    // THEN the worker recognises its own recovery claim (no deferral to itself for a whole
    // lease) and collects the answer from the provider without a new call
    assert_eq!(
        report.records[0].outcome,
        RecordOutcome::Done(JobState::Succeeded),
        "{:?}",
        report.records[0].outcome
    );
    assert_eq!(report.stats.recoveries, 1);
    assert_eq!(h.processor().provider().executions(), 0);
}

/// A claim applied whose answer and first read-back were both lost: the worker reads again,
/// finds its own claim and makes the call, instead of leaving a `running` job with no call for
/// a recovery to find uncertain.
#[tokio::test]
async fn a_claim_whose_answer_and_read_back_were_lost_is_read_again_and_runs() {
    // GIVEN a ledger that applies the claim and loses its answer, and fails the read after it
    let ledger = faulty("claim", Fault::LoseAnswer, 1);
    ledger.inject("get", Fault::Fail, 1);
    let h = handler(ledger, SimulatedProvider::new(), Settings::default());
    // WHEN a job is delivered
    let report = h
        .handle_batch(
            &event(vec![record(Some("m1"), &job("lost-claim", ""))]),
            &invocation(),
        )
        .await;
    // THEN the next read recognises the claim, and the job runs once, in this delivery
    assert_eq!(report.records[0].outcome.label(), "succeeded");
    assert_eq!(h.processor().provider().executions(), 1);
    let item = h
        .processor()
        .ledger()
        .inner
        .get("lost-claim")
        .await
        .expect("get")
        .expect("item");
    assert_eq!((item.owner_epoch, item.attempts), (1, 1));
}
