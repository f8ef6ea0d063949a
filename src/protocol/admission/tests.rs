use super::*;
use crate::job::AttemptEntry;

const NOW: Millis = 1_000_000;

fn facts() -> Facts {
    Facts {
        deadline_at: NOW + 600_000,
        skew: 2_000,
        latest_call_start: NOW + 60_000,
        can_retrieve: false,
        in_ledger: false,
        next_call_micros: 0,
        max_cost_micros: None,
        carries_input: true,
    }
}

fn past() -> Facts {
    Facts {
        deadline_at: NOW - 10_000,
        ..facts()
    }
}

fn ready(epoch: u64) -> JobItem {
    let mut r = NewJob::example("j", NOW + 600_000).into_record(JobState::Ready, NOW - 1_000);
    r.owner_epoch = epoch;
    r
}

#[test]
fn no_call_is_claimed_that_would_take_the_job_past_its_spend_limit() {
    // A call estimated at 400 micro-dollars, a limit of 1,000.
    let costly = Facts {
        next_call_micros: 400,
        max_cost_micros: Some(1_000),
        ..facts()
    };
    // First sight: the first call fits.
    let (_, step) = Admission::start(costly, None, "d", NOW);
    assert!(
        matches!(step, Step::Write(Op::Claim { .. }) | Step::Admit),
        "{step:?}"
    );
    // A first call dearer than the whole limit: the job is created failed, never run.
    let dear = Facts {
        next_call_micros: 1_001,
        ..costly
    };
    let (_, step) = Admission::start(dear, None, "d", NOW);
    assert_eq!(
        step,
        Step::Write(Op::Settle(Settle::Absent(SettleReason::SpendLimit)))
    );
    // Seen after attempts that spent 700 of its 1,000: the next would pass it, so the job
    // ends without a claim, as when its attempts are spent.
    let mut spent = ready(1);
    spent.max_cost_micros = Some(1_000);
    spent.attempt_log = vec![AttemptEntry {
        usage: Some(crate::job::Usage {
            cost_micros: Some(700),
            ..crate::job::Usage::default()
        }),
        ..AttemptEntry::claimed(1, 1, "w", NOW - 5_000, None)
    }];
    spent.attempts = 1;
    let (mut machine, _) = Admission::start(costly, None, "d", NOW);
    assert_eq!(
        machine.seen(Some(&spent), "d", NOW),
        Step::Write(Op::Settle(Settle::Seen {
            state: JobState::Ready,
            epoch: 1,
            reason: SettleReason::SpendLimit,
        }))
    );
    // With 600 spent, the next call fits.
    spent.attempt_log[0].usage = Some(crate::job::Usage {
        cost_micros: Some(600),
        ..crate::job::Usage::default()
    });
    let (mut machine, _) = Admission::start(costly, None, "d", NOW);
    assert!(matches!(
        machine.seen(Some(&spent), "d", NOW),
        Step::Write(Op::Claim { .. }) | Step::Admit
    ));
}

#[test]
fn a_later_record_of_the_batch_never_claims_and_is_acknowledged_only_on_a_terminal_view() {
    // A job its first record could not claim: the duplicate backs off, it does not claim.
    assert_eq!(
        follow(&ready(2), "d", NOW, 2_000),
        backoff("duplicate in batch")
    );
    // A live owner: deferred to it, not acknowledged.
    let mut running = ready(3);
    running.state = JobState::Running;
    running.owner_until = Some(NOW + 30_000);
    let deferred = follow(&running, "d", NOW, 2_000);
    assert!(
        matches!(deferred, RecordOutcome::Failed(Failure::Deferred { .. })),
        "{deferred:?}"
    );
    // Terminal: acknowledged; another input under the same id: a conflict either way.
    let mut done = ready(3);
    done.state = JobState::Succeeded;
    assert!(follow(&done, "d", NOW, 2_000).is_success());
    let conflict = follow(&done, "other", NOW, 2_000);
    assert!(
        matches!(conflict, RecordOutcome::Failed(Failure::Conflict { .. })),
        "{conflict:?}"
    );
}

#[test]
fn a_first_sight_is_admitted_then_claims_and_creates() {
    let (mut m, step) = Admission::start(facts(), None, "d", NOW);
    assert_eq!(step, Step::Admit);
    let claim = Op::Claim {
        expect: Expect::FRESH,
        first_sight: true,
    };
    assert_eq!(m.admitted(NOW), Step::Write(claim));
}

#[test]
fn a_first_sight_without_capacity_creates_its_item_then_waits_whatever_the_write_answers() {
    let waits = Step::End(RecordOutcome::Failed(Failure::Paced { wait_ms: 7_000 }));
    let start = || {
        let (mut m, step) = Admission::start(facts(), None, "d", NOW);
        assert_eq!(step, Step::Admit);
        assert_eq!(m.no_capacity(7_000), Step::Write(Op::Create));
        m
    };
    let created = ready(0);
    assert_eq!(
        start().applied(&created),
        Applied::End(RecordOutcome::Failed(Failure::Paced { wait_ms: 7_000 }))
    );
    // Refused (the item exists: it is not decided from), failed, or lost: it waits.
    assert_eq!(start().seen(Some(&ready(3)), "d", NOW), waits);
    assert_eq!(start().failed(), waits);
    assert_eq!(start().unanswered(), waits);
    assert!(!start().ours(&created, "owner"));
}

#[test]
fn a_job_already_seen_without_capacity_waits_without_a_write() {
    let in_ledger = Facts {
        in_ledger: true,
        ..facts()
    };
    let (mut m, step) = Admission::start(in_ledger, Some(&ready(2)), "d", NOW);
    assert_eq!(step, Step::Admit);
    assert_eq!(
        m.no_capacity(500),
        Step::End(RecordOutcome::Failed(Failure::Paced { wait_ms: 500 }))
    );
}

#[test]
fn a_refusal_decides_from_the_item_and_the_next_claim_is_not_a_first_sight() {
    let (mut m, _) = Admission::start(facts(), None, "d", NOW);
    m.admitted(NOW);
    let step = m.seen(Some(&ready(2)), "d", NOW);
    let expect = Expect {
        epoch: 2,
        attempts: 0,
    };
    assert_eq!(
        step,
        Step::Write(Op::Claim {
            expect,
            first_sight: false
        })
    );
}

#[test]
fn a_contended_job_backs_off_after_four_decisions() {
    let (mut m, _) = Admission::start(facts(), None, "d", NOW);
    m.admitted(NOW);
    for epoch in 1..MAX_ROUNDS as u64 {
        assert!(matches!(
            m.seen(Some(&ready(epoch)), "d", NOW),
            Step::Write(_)
        ));
    }
    assert_eq!(
        m.seen(Some(&ready(9)), "d", NOW),
        Step::End(backoff("contention"))
    );
}

#[test]
fn no_claim_is_made_without_time_for_its_call_nor_in_the_deadlines_margin() {
    let late = Facts {
        latest_call_start: NOW - 1,
        ..facts()
    };
    let (_, step) = Admission::start(late, None, "d", NOW);
    assert_eq!(step, Step::End(backoff("too little time left for a call")));
    let closing = Facts {
        deadline_at: NOW + 1_000,
        ..facts()
    };
    let (_, step) = Admission::start(closing, None, "d", NOW);
    assert!(matches!(
        step,
        Step::End(RecordOutcome::Failed(Failure::Deferred { .. }))
    ));
}

#[test]
fn a_claim_whose_answer_was_lost_is_read_for_three_times_then_left_to_its_lease() {
    let (mut m, _) = Admission::start(facts(), None, "d", NOW);
    m.admitted(NOW);
    assert_eq!(m.unanswered(), Step::ReadBack { pause_ms: 0 });
    assert_eq!(m.read_failed(), Step::ReadBack { pause_ms: 100 });
    assert_eq!(m.read_failed(), Step::ReadBack { pause_ms: 400 });
    assert!(!m.unconfirmed());
    assert_eq!(m.read_failed(), Step::End(backoff("ledger")));
    assert!(m.unconfirmed());
}

#[test]
fn an_unanswered_settle_is_not_read_for() {
    let (mut m, _) = Admission::start(past(), None, "d", NOW);
    assert_eq!(m.unanswered(), Step::End(backoff("ledger")));
}

#[test]
fn a_job_past_its_deadline_is_settled_without_a_permit() {
    let (m, step) = Admission::start(past(), None, "d", NOW);
    assert_eq!(
        step,
        Step::Write(Op::Settle(Settle::Absent(SettleReason::DeadlinePassed)))
    );
    let mut expired = ready(0);
    expired.state = JobState::Expired;
    assert_eq!(
        m.applied(&expired),
        Applied::End(RecordOutcome::Done(JobState::Expired))
    );
}

#[test]
fn a_delivery_without_the_input_never_claims_or_recovers_but_may_still_settle() {
    let bare = Facts {
        carries_input: false,
        ..facts()
    };
    // Claimable (retry authorised after the first attempt): it waits, nothing written.
    let mut retried = ready(1);
    retried.state = JobState::RetryAuthorized;
    retried.attempts = 1;
    let (_, step) = Admission::start(bare, Some(&retried), &retried.input_digest, NOW);
    assert_eq!(step, Step::End(backoff("input with the job's message")));
    // With the input, the same item is claimed (after capacity is taken).
    let (_, step) = Admission::start(facts(), Some(&retried), &retried.input_digest, NOW);
    assert_eq!(step, Step::Admit);
    // Nor is a lapsed owner fenced from it: the recovery's question, and the price of what it
    // finds, are built from the input; with it, the same item is recovered.
    let mut lapsed = ready(1);
    lapsed.state = JobState::Running;
    lapsed.owner_until = Some(NOW - 60_000);
    let (_, step) = Admission::start(bare, Some(&lapsed), &lapsed.input_digest, NOW);
    assert_eq!(step, Step::End(backoff("input with the job's message")));
    let (_, step) = Admission::start(facts(), Some(&lapsed), &lapsed.input_digest, NOW);
    assert!(matches!(step, Step::Write(Op::Recover { .. })), "{step:?}");
    // Past its deadline, it is still expired.
    let bare_past = Facts {
        carries_input: false,
        ..past()
    };
    let mut late = retried.clone();
    late.deadline_at = NOW - 10_000;
    let (_, step) = Admission::start(bare_past, Some(&late), &late.input_digest, NOW);
    assert!(matches!(step, Step::Write(Op::Settle(_))), "{step:?}");
}

#[test]
fn a_job_whose_stored_input_is_lost_ends_only_when_it_would_be_claimed() {
    // Claimable: it ends `input_lost`, on the state and epoch seen.
    let item = ready(1);
    let settle = input_lost(&item, NOW, 2_000).expect("ends the job");
    assert_eq!(settle.reason, SettleReason::InputLost);
    assert_eq!(
        settle.from,
        SettleFrom::Seen {
            state: item.state,
            epoch: 1
        }
    );
    // Held by an owner whose lease holds: nothing written, for that owner to end it.
    let mut held = ready(1);
    held.state = JobState::Running;
    held.owner_until = Some(NOW + 60_000);
    assert_eq!(input_lost(&held, NOW, 2_000), None);
}

#[test]
fn a_refused_job_is_poison_unless_a_read_finds_it_in_the_ledger_and_a_failed_read_backs_off() {
    let invalid = || InvalidMessage::Invalid {
        field: "model",
        rule: "not allowed",
    };
    let poison = Some(Failure::Poison(invalid()));
    // Nothing says the item may exist: no read, poison.
    assert_eq!(refused_at_first_sight(invalid(), None), poison);
    assert_eq!(refused_at_first_sight(invalid(), Some(Ok(false))), poison);
    // The ledger holds it: never judged again.
    assert_eq!(refused_at_first_sight(invalid(), Some(Ok(true))), None);
    assert!(matches!(
        refused_at_first_sight(invalid(), Some(Err(()))),
        Some(Failure::Backoff {
            cause: "ledger",
            ..
        })
    ));
}
