//! The ending machine, step by step, against the ledger's own transitions.

use super::*;
use crate::ledger::transitions::{apply_end, apply_renew};

const NOW: Millis = 1_000_000;
const DEADLINE: Millis = NOW + 600_000;

fn facts() -> EndFacts {
    EndFacts {
        skew: 2_000,
        lease_ms: 30_000,
        invocation_end: NOW + 60_000,
        can_retrieve: true,
        replay: ReplayPolicy::Never,
        tries: 3,
        first_pause_ms: 100,
        batch_poll_ms: 300_000,
    }
}

/// The item as a claim at `NOW` leaves it (with a reference when `reference`).
fn claimed(reference: bool) -> JobItem {
    crate::protocol::claimed_example(DEADLINE, NOW, reference.then(|| "j/1@1".to_owned()))
}

/// The ledger's answer to `write` on `item`, as the transitions give it.
fn apply(item: &JobItem, write: EndWrite) -> Write {
    let after = match &write {
        EndWrite::End(req) => apply_end(Some(item), req),
        EndWrite::Renew(req) => apply_renew(Some(item), req),
    };
    after.map_or_else(|| Write::Refused(Some(item.clone())), Write::Applied)
}

fn answer(body: &str) -> Waited {
    Waited::Ended(
        AttemptEnd::Succeeded {
            result: ResultBody::Inline(body.into()),
            finish: crate::job::contract::Finish::Stop,
        },
        None,
    )
}

fn done(step: EndStep) -> Closed {
    match step {
        EndStep::Done(closed) => *closed,
        other => panic!("not done: {other:?}"),
    }
}

#[test]
fn an_answer_is_placed_then_accepted_by_one_write_on_the_owners_epoch() {
    let owner = claimed(false);
    let (mut m, step) = Ending::start(facts(), owner.clone(), answer("42"), NOW);
    assert_eq!(step, EndStep::Place);
    assert_eq!(m.answer(), Some("42"));
    assert_eq!(
        m.placed(Placed::Inline, NOW),
        EndStep::Write { pause_ms: 0 }
    );
    let EndWrite::End(req) = m.write(NOW) else {
        panic!("an end");
    };
    assert_eq!((req.epoch, req.attempt), (1, 1));
    let closed = done(m.answered(Some(apply(&owner, EndWrite::End(req))), NOW));
    assert_eq!(closed.outcome, RecordOutcome::Done(JobState::Succeeded));
    assert!(!closed.refused);
}

#[test]
fn an_answer_refused_by_the_deadline_alone_expires_the_job_on_the_owners_epoch() {
    let owner = claimed(false);
    let (mut m, _) = Ending::start(facts(), owner.clone(), answer("42"), NOW);
    m.placed(Placed::Inline, NOW);
    // The write reaches the table after the deadline: refused, the job still ours.
    let late = DEADLINE + 1;
    let step = m.answered(Some(apply(&owner, m.write(late))), late);
    assert_eq!(step, EndStep::Write { pause_ms: 0 });
    let EndWrite::End(req) = m.write(late) else {
        panic!("an end");
    };
    assert_eq!(req.end, AttemptEnd::Expired);
    let closed = done(m.answered(Some(apply(&owner, EndWrite::End(req))), late));
    assert_eq!(closed.outcome, RecordOutcome::Done(JobState::Expired));
    assert!(closed.refused);
}

#[test]
fn a_failed_end_is_tried_again_after_renewing_the_lease_with_growing_pauses_then_backs_off() {
    let owner = claimed(false);
    let waited = Waited::Ended(
        AttemptEnd::RetryAuthorized {
            error: "503".into(),
        },
        None,
    );
    let (mut m, _) = Ending::start(facts(), owner.clone(), waited, NOW);
    assert_eq!(m.answered(None, NOW), EndStep::Write { pause_ms: 200 });
    assert!(matches!(m.write(NOW), EndWrite::Renew(r) if r.lease_until == NOW + 30_000));
    assert_eq!(m.answered(None, NOW), EndStep::Write { pause_ms: 0 });
    assert_eq!(m.answered(None, NOW), EndStep::Write { pause_ms: 400 });
    m.answered(None, NOW);
    // The third failed write spends the tries: the record backs off, the owner in view.
    let closed = done(m.answered(None, NOW));
    assert_eq!(closed.outcome, backoff("ledger"));
    assert_eq!(closed.view, Some(owner));
}

#[test]
fn no_try_is_made_whose_pause_would_pass_the_invocations_end() {
    let short = EndFacts {
        invocation_end: NOW + 150,
        ..facts()
    };
    let waited = Waited::Ended(AttemptEnd::Expired, None);
    let (mut m, _) = Ending::start(short, claimed(false), waited, NOW);
    assert_eq!(done(m.answered(None, NOW)).outcome, backoff("ledger"));
}

#[test]
fn a_refusal_showing_the_owners_own_end_counts_as_applied() {
    let owner = claimed(false);
    let (mut m, _) = Ending::start(facts(), owner.clone(), answer("42"), NOW);
    m.placed(Placed::Inline, NOW);
    let Write::Applied(after) = apply(&owner, m.write(NOW)) else {
        panic!("applied");
    };
    // The first try was applied and its answer lost; the retry is refused by it.
    let closed = done(m.answered(Some(Write::Refused(Some(after))), NOW));
    assert_eq!(closed.outcome, RecordOutcome::Done(JobState::Succeeded));
}

#[test]
fn a_refused_stored_answer_is_discarded_only_once_the_job_is_terminal_without_it() {
    let owner = claimed(false);
    let (blob, stored) = stored_answer();
    let mut rival = owner.clone();
    rival.owner_epoch = 2;
    let (mut m, step) = Ending::start(facts(), owner.clone(), stored.clone(), NOW);
    assert_eq!(step, EndStep::Write { pause_ms: 0 });
    // A recovery fenced us and is still at work: it may be accepting this very object.
    let closed = done(m.answered(Some(Write::Refused(Some(rival.clone()))), NOW));
    assert_eq!(closed.discard, None);
    rival.state = JobState::FailedTerminal;
    let (mut m, _) = Ending::start(facts(), owner, stored, NOW);
    let closed = done(m.answered(Some(Write::Refused(Some(rival))), NOW));
    assert_eq!(closed.discard, Some(blob));
    assert!(closed.refused);
}

#[test]
fn an_attempt_given_back_after_a_429_waits_for_the_providers_capacity() {
    let owner = claimed(false);
    let end = AttemptEnd::GivenBack {
        why: AttemptOutcome::Throttled,
        error: "429".into(),
        given_back: Vec::new(),
    };
    let (mut m, _) = Ending::start(facts(), owner.clone(), Waited::Ended(end, Some(7_000)), NOW);
    let closed = done(m.answered(Some(apply(&owner, m.write(NOW))), NOW));
    assert_eq!(
        closed.outcome,
        RecordOutcome::Failed(Failure::Paced { wait_ms: 7_000 })
    );
}

#[test]
fn an_unknown_attempt_not_yet_asked_about_waits_for_its_recovery_once_asked_for_a_decision() {
    let owner = claimed(true);
    let unknown = || AttemptEnd::Unknown {
        evidence: "dropped".into(),
    };
    let (mut m, _) = Ending::start(facts(), owner.clone(), Waited::Ended(unknown(), None), NOW);
    let closed = done(m.answered(Some(apply(&owner, m.write(NOW))), NOW));
    assert_eq!(
        closed.outcome,
        RecordOutcome::Failed(Failure::AwaitingRecovery)
    );
    let (mut m, _) = Ending::start(facts(), owner.clone(), Waited::Asked(unknown()), NOW);
    let closed = done(m.answered(Some(apply(&owner, m.write(NOW))), NOW));
    assert_eq!(
        closed.outcome,
        RecordOutcome::Failed(Failure::AwaitingDecision)
    );
}

#[test]
fn an_answer_the_bucket_could_not_take_is_left_with_the_provider_and_the_job_handed_over() {
    let owner = claimed(true);
    let (mut m, _) = Ending::start(facts(), owner.clone(), answer("big"), NOW);
    assert_eq!(
        m.placed(Placed::KeptByProvider, NOW),
        EndStep::Write { pause_ms: 0 }
    );
    let EndWrite::Renew(req) = m.write(NOW) else {
        panic!("a renewal");
    };
    assert_eq!(req.lease_until, NOW);
    let closed = done(m.answered(Some(apply(&owner, EndWrite::Renew(req))), NOW));
    assert_eq!(closed.outcome, backoff("results bucket"));
    // A call still running upstream is handed over to be taken at once.
    let (mut m, _) = Ending::start(facts(), owner.clone(), Waited::Running, NOW);
    let closed = done(m.answered(Some(apply(&owner, m.write(NOW))), NOW));
    assert_eq!(
        closed.outcome,
        RecordOutcome::Failed(Failure::Deferred {
            remaining_ms: 2_000
        })
    );
    // A line of a running batch: handed over, its record back after the batch poll interval,
    // never later than the job's deadline.
    let (mut m, _) = Ending::start(facts(), owner.clone(), Waited::Batched, NOW);
    let closed = done(m.answered(Some(apply(&owner, m.write(NOW))), NOW));
    assert_eq!(
        closed.outcome,
        RecordOutcome::Failed(Failure::Deferred {
            remaining_ms: 300_000
        })
    );
    let near = DEADLINE - 10_000;
    let (mut m, _) = Ending::start(facts(), owner.clone(), Waited::Batched, near);
    let closed = done(m.answered(Some(apply(&owner, m.write(near))), near));
    assert_eq!(
        closed.outcome,
        RecordOutcome::Failed(Failure::Deferred {
            remaining_ms: 10_000
        })
    );
}

#[test]
fn an_answer_within_the_skew_margin_of_the_deadline_is_not_accepted() {
    let (m, step) = Ending::start(facts(), claimed(false), answer("42"), DEADLINE - 1_000);
    assert!(m.late());
    assert_eq!(step, EndStep::Write { pause_ms: 0 });
    assert!(matches!(
        m.write(DEADLINE - 1_000),
        EndWrite::End(EndRequest {
            end: AttemptEnd::Expired,
            ..
        })
    ));
}

#[test]
fn an_answer_that_comes_after_a_cancel_request_is_not_accepted_and_the_job_ends_cancelled() {
    let owner = claimed(false);
    let mut marked = owner.clone();
    marked.cancel_requested = Some(NOW);
    let (blob, stored) = stored_answer();
    let (mut m, _) = Ending::start(facts(), owner, stored, NOW);
    // The acceptance is refused by the request; the job is still ours.
    let step = m.answered(Some(apply(&marked, m.write(NOW))), NOW);
    assert_eq!(step, EndStep::Write { pause_ms: 0 });
    let EndWrite::End(req) = m.write(NOW) else {
        panic!("an end");
    };
    assert_eq!(req.end, AttemptEnd::Cancelled);
    let closed = done(m.answered(Some(apply(&marked, EndWrite::End(req))), NOW));
    assert_eq!(closed.outcome, RecordOutcome::Done(JobState::Cancelled));
    // The answer stored for it goes: nobody will ever accept it.
    assert_eq!(closed.discard, Some(blob));
}

/// An answer stored in the bucket, and the owner's word that it came.
fn stored_answer() -> (BlobRef, Waited) {
    let blob = BlobRef {
        bucket: "b".into(),
        key: "results/j/1/x".into(),
        size: 2,
        sha256: "x".into(),
    };
    let stored = Waited::Ended(
        AttemptEnd::Succeeded {
            result: ResultBody::Stored(blob.clone()),
            finish: crate::job::contract::Finish::Stop,
        },
        None,
    );
    (blob, stored)
}
