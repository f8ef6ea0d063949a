//! The call machine, step by step.

use super::*;
use crate::job::{AttemptOutcome, BlobRef, JobState};

const NOW: Millis = 1_000_000;
const DEADLINE: Millis = NOW + 600_000;

fn facts() -> CallFacts {
    CallFacts {
        skew: 2_000,
        provider_timeout_ms: 120_000,
        min_call_ms: MIN_CALL_BUDGET_MS,
        invocation_end: NOW + 300_000,
        latest_call_start: NOW + 200_000,
        renewed: true,
        poll_ms: 5_000,
        horizon_ms: 10_000,
        replay: ReplayPolicy::Never,
    }
}

fn claimed() -> JobItem {
    crate::protocol::claimed_example(DEADLINE, NOW, None)
}

fn ended(step: CallStep) -> AttemptEnd {
    match step {
        CallStep::Done(Waited::Ended(end, _) | Waited::Asked(end)) => end,
        other => panic!("not ended: {other:?}"),
    }
}

fn throttled(retry_after_ms: Option<Millis>) -> Said {
    Said::Failed(ProviderError::Throttled {
        retry_after_ms,
        reason: "429".into(),
    })
}

/// A claimed call that went to the background under `r1` and whose reference was recorded.
fn polling() -> Calling {
    let (mut m, _) = Calling::start(facts(), claimed(), NOW);
    assert_eq!(
        m.submitted(Said::Started("r1".into()), NOW),
        CallStep::Record
    );
    let recorded = Some(Write::Applied(claimed()));
    assert!(matches!(
        m.recorded(recorded, NOW),
        CallStep::Retrieve { .. }
    ));
    m
}

#[test]
fn a_call_leaves_with_the_least_of_its_bounds_as_its_budget() {
    let (_, step) = Calling::start(facts(), claimed(), NOW);
    assert_eq!(step, CallStep::Submit { budget_ms: 120_000 });
    let unrenewed = CallFacts {
        renewed: false,
        ..facts()
    };
    let (_, step) = Calling::start(unrenewed, claimed(), NOW);
    assert_eq!(step, CallStep::Submit { budget_ms: 28_000 });
}

#[test]
fn a_call_without_time_or_with_a_lapsed_lease_is_not_sent_and_its_attempt_given_back() {
    let (_, step) = Calling::start(facts(), claimed(), NOW + 200_001);
    assert!(matches!(
        ended(step),
        AttemptEnd::GivenBack { why: AttemptOutcome::NotSent, error, .. } if error.contains("no time")
    ));
    let (_, step) = Calling::start(facts(), claimed(), NOW + 29_000);
    assert!(matches!(
        ended(step),
        AttemptEnd::GivenBack { why: AttemptOutcome::NotSent, error, .. } if error.contains("lease lapsed")
    ));
}

#[test]
fn a_429_on_the_flex_path_gives_the_attempt_back_at_once_for_another_path() {
    let mut on_flex = claimed();
    if let Some(attempt) = on_flex.attempt_log.last_mut() {
        attempt.route = Some(crate::job::Route {
            path: Some((crate::job::usage::Rate::Flex, "cheapest".into())),
            ..crate::job::Route::default()
        });
    }
    let (mut m, _) = Calling::start(facts(), on_flex, NOW);
    // Within the horizon, yet not sent again on the path that refused.
    assert!(matches!(
        ended(m.submitted(throttled(Some(2_000)), NOW)),
        AttemptEnd::GivenBack {
            why: AttemptOutcome::Throttled,
            ..
        }
    ));
}

#[test]
fn a_429_is_sent_again_under_the_same_claim_only_within_the_horizon() {
    let (mut m, _) = Calling::start(facts(), claimed(), NOW);
    let step = m.submitted(throttled(Some(2_000)), NOW);
    assert_eq!(
        step,
        CallStep::Throttled {
            retry_after_ms: Some(2_000)
        }
    );
    // The pacer's pause is longer than the provider's wait: it wins.
    assert_eq!(
        m.paced(NOW + 3_000, NOW),
        CallStep::Resend { at: NOW + 3_000 }
    );
    assert!(matches!(
        m.resent(true, NOW + 3_000),
        CallStep::Submit { .. }
    ));
    m.submitted(throttled(None), NOW + 4_000);
    assert!(matches!(m.paced(0, NOW + 4_000), CallStep::Resend { .. }));
    // Ownership lost (or no room) while it waited: nothing was sent, the attempt goes back.
    assert!(matches!(
        ended(m.resent(false, NOW + 5_000)),
        AttemptEnd::GivenBack {
            why: AttemptOutcome::Throttled,
            ..
        }
    ));
    let (mut m, _) = Calling::start(facts(), claimed(), NOW);
    m.submitted(throttled(Some(60_000)), NOW);
    assert!(matches!(
        ended(m.paced(0, NOW)),
        AttemptEnd::GivenBack { .. }
    ));
}

#[test]
fn a_reference_that_cannot_be_recorded_is_cancelled_and_the_attempt_made_uncertain() {
    let (mut m, _) = Calling::start(facts(), claimed(), NOW);
    m.submitted(Said::Started("r1".into()), NOW);
    assert_eq!(m.recorded(None, NOW), CallStep::Record);
    assert_eq!(m.record(NOW).provider_ref, "r1");
    assert_eq!(m.recorded(None, NOW), CallStep::Record);
    assert_eq!(m.recorded(None, NOW), CallStep::CancelUpstream);
    assert!(matches!(
        ended(m.cancelled_upstream(NOW)),
        AttemptEnd::Unknown { evidence } if evidence.contains("could not be recorded")
    ));
    let (mut m, _) = Calling::start(facts(), claimed(), NOW);
    m.submitted(Said::Started("r1".into()), NOW);
    assert_eq!(
        m.recorded(Some(Write::Refused(None)), NOW),
        CallStep::CancelUpstream
    );
}

#[test]
fn polling_waits_between_retrievals_and_gives_up_on_a_provider_that_keeps_refusing() {
    let mut m = polling();
    assert_eq!(
        m.retrieved(Retrieval::Running, NOW + 1_000),
        CallStep::Pause { ms: 5_000 }
    );
    let unreachable = Retrieval::Unreachable {
        retry_after_ms: Some(9_000),
    };
    assert_eq!(
        m.retrieved(unreachable, NOW + 6_000),
        CallStep::Pause { ms: 9_000 }
    );
    m.retrieved(Retrieval::Denied, NOW + 7_000);
    m.retrieved(Retrieval::Denied, NOW + 8_000);
    let step = m.retrieved(Retrieval::Denied, NOW + 9_000);
    assert!(matches!(
        step,
        CallStep::Done(Waited::Asked(AttemptEnd::Unknown { evidence })) if evidence.starts_with("attempt 1 (r1): ")
    ));
}

#[test]
fn time_up_hands_a_running_call_over_and_past_the_deadline_cancels_it() {
    let mut m = polling();
    // The invocation's end comes first: the next delivery takes the call over.
    let step = m.retrieved(Retrieval::Running, NOW + 300_000);
    assert_eq!(step, CallStep::Done(Waited::Running));
    let short = CallFacts {
        invocation_end: DEADLINE + 60_000,
        ..facts()
    };
    let (mut m, _) = Calling::start(short, claimed(), NOW);
    m.submitted(Said::Started("r1".into()), NOW);
    m.recorded(Some(Write::Applied(claimed())), NOW);
    assert_eq!(
        m.retrieved(Retrieval::Running, DEADLINE),
        CallStep::CancelUpstream
    );
    assert_eq!(ended(m.cancelled_upstream(DEADLINE)), AttemptEnd::Expired);
}

#[test]
fn a_call_cut_off_by_the_deadline_expires_and_one_cut_off_by_the_invocation_is_uncertain() {
    let late = CallFacts {
        provider_timeout_ms: 900_000,
        invocation_end: DEADLINE + 1,
        ..facts()
    };
    let (mut m, _) = Calling::start(late, claimed(), NOW);
    assert_eq!(
        ended(m.submitted(Said::TimedOut, DEADLINE)),
        AttemptEnd::Expired
    );
    let (mut m, _) = Calling::start(facts(), claimed(), NOW + 200_000);
    let end = ended(m.submitted(Said::TimedOut, NOW + 300_000));
    assert!(m.cut_off());
    assert!(
        matches!(end, AttemptEnd::Unknown { evidence } if evidence.contains("Lambda deadline"))
    );
}

#[test]
fn a_recovery_without_a_reference_is_uncertain_and_never_calls() {
    let mut fenced = claimed();
    fenced.state = JobState::Running;
    let (_, step) = Calling::resume(
        facts(),
        fenced.clone(),
        "lease of epoch 1 lapsed",
        None,
        NOW,
    );
    assert!(matches!(
        ended(step),
        AttemptEnd::Unknown { evidence } if evidence == "attempt 1, lease of epoch 1 lapsed: the call may have run and no reference was recorded"
    ));
    if let Some(last) = fenced.attempt_log.last_mut() {
        last.provider_ref = Some("j/1@1".into());
    }
    let (m, step) = Calling::resume(
        facts(),
        fenced.clone(),
        "lease of epoch 1 lapsed",
        None,
        NOW,
    );
    assert!(matches!(step, CallStep::Retrieve { .. }));
    assert_eq!(m.reference().map(|(r, _)| r), Some("j/1@1"));
    // An answer the lapsed owner stored is the outcome: nobody is asked, nothing is paid again.
    let blob = BlobRef {
        bucket: "b".into(),
        key: "results/j/1/x.json".into(),
        size: 2,
        sha256: "x".into(),
    };
    let (_, step) = Calling::resume(facts(), fenced, "lapsed", Some(blob.clone()), NOW);
    assert_eq!(
        ended(step),
        AttemptEnd::Succeeded {
            result: crate::job::ResultBody::Stored(blob),
            finish: crate::job::contract::Finish::Unknown,
        }
    );
}

#[test]
fn a_line_of_a_batch_is_handed_over_once_recorded_and_while_its_batch_runs() {
    use crate::provider::batch::{batch_ref, pending_ref};
    let line = batch_ref("batch_1", "j1-a1-e1");
    let (mut m, _) = Calling::start(facts(), claimed(), NOW);
    assert_eq!(
        m.submitted(Said::Started(line.clone()), NOW),
        CallStep::Record
    );
    assert!(m.batched());
    // No poll in this invocation: the batch takes far longer.
    let recorded = Some(Write::Applied(claimed()));
    assert_eq!(m.recorded(recorded, NOW), CallStep::Done(Waited::Batched));
    // A reference that cannot be recorded: the claim's pending one finds the batch later; the
    // batch holds other jobs' lines, so nothing is cancelled.
    let (mut m, _) = Calling::start(facts(), claimed(), NOW);
    m.submitted(Said::Started(line.clone()), NOW);
    for _ in 1..RECORD_TRIES {
        assert_eq!(m.recorded(None, NOW), CallStep::Record);
    }
    assert_eq!(m.recorded(None, NOW), CallStep::Done(Waited::Batched));
    let (mut m, _) = Calling::start(facts(), claimed(), NOW);
    m.submitted(Said::Started(pending_ref("j1-a1-e1")), NOW);
    assert_eq!(
        m.recorded(Some(Write::Refused(None)), NOW),
        CallStep::Done(Waited::Lost)
    );
    // A recovery that finds the batch still running hands over again; ended, it decides.
    let mut owner = claimed();
    owner.attempt_log[0].provider_ref = Some(line);
    let (mut m, step) = Calling::resume(facts(), owner.clone(), "lapsed", None, NOW);
    assert!(matches!(step, CallStep::Retrieve { .. }));
    assert_eq!(
        m.retrieved(Retrieval::Running, NOW),
        CallStep::Done(Waited::Batched)
    );
    let (mut m, _) = Calling::resume(facts(), owner, "lapsed", None, NOW);
    let failed = Retrieval::Failed(ProviderError::Transient {
        retry_after_ms: None,
        reason: "batch_expired".into(),
    });
    assert!(matches!(
        ended(m.retrieved(failed, NOW)),
        AttemptEnd::RetryAuthorized { .. }
    ));
}

#[test]
fn a_line_no_batch_holds_gives_its_attempt_back() {
    let (mut m, _) = Calling::start(facts(), claimed(), NOW);
    let step = m.submitted(Said::NotSent("the batch did not go".into()), NOW);
    assert!(matches!(
        ended(step),
        AttemptEnd::GivenBack { why: AttemptOutcome::NotSent, error, .. } if error.contains("did not go")
    ));
}

#[test]
fn a_cancel_request_stops_the_call_and_cancels_a_background_one_upstream_but_never_a_batch() {
    // A call in flight: its wait stops, the attempt ends cancelled.
    let (mut m, _) = Calling::start(facts(), claimed(), NOW);
    assert_eq!(
        ended(m.submitted(Said::Withdrawn, NOW)),
        AttemptEnd::Cancelled
    );
    // A background call: cancelled upstream first.
    let mut m = polling();
    assert_eq!(m.withdrawn(), CallStep::CancelUpstream);
    assert_eq!(ended(m.cancelled_upstream(NOW)), AttemptEnd::Cancelled);
    // A recovery of a job with a cancel request asks nothing: it cancels what runs.
    let mut marked = claimed();
    marked.cancel_requested = Some(NOW);
    marked.attempt_log[0].provider_ref = Some("r1".into());
    let (mut m, step) = Calling::resume(facts(), marked.clone(), "lapsed", None, NOW);
    assert_eq!(step, CallStep::CancelUpstream);
    assert_eq!(ended(m.cancelled_upstream(NOW)), AttemptEnd::Cancelled);
    // A batch line is never cancelled upstream: its batch holds other jobs' lines.
    marked.attempt_log[0].provider_ref = Some(crate::provider::batch::batch_ref("b1", "l1"));
    let (_, step) = Calling::resume(facts(), marked, "lapsed", None, NOW);
    assert_eq!(ended(step), AttemptEnd::Cancelled);
}
