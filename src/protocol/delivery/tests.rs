//! One delivery, command by command, answered by the ledger's own transitions.

use super::*;
use crate::job::{NewJob, Route, Usage};
use crate::ledger::AttemptEnd;
use crate::ledger::Write;
use crate::ledger::transitions::{apply_claim, apply_end};
use crate::ledger::{ClaimRequest, EndRequest};
use crate::protocol::ReplayPolicy;
use crate::protocol::calling::Said;
use crate::protocol::ending::EndWrite;
use crate::protocol::ending::Placed;
use crate::provider::ProviderError;

const NOW: Millis = 1_000_000;
const DEADLINE: Millis = NOW + 600_000;
/// The digest of [`NewJob::example`]'s input.
const DIGEST: &str = "d";

fn lane(name: &str) -> Lane {
    Lane {
        name: name.to_owned(),
        serves: true,
        admission: Facts {
            deadline_at: DEADLINE,
            skew: 2_000,
            latest_call_start: Millis::MAX,
            can_retrieve: false,
            in_ledger: false,
            next_call_micros: 0,
            max_cost_micros: None,
            carries_input: true,
        },
        call: CallFacts {
            skew: 2_000,
            provider_timeout_ms: 60_000,
            min_call_ms: 100,
            invocation_end: NOW + 300_000,
            latest_call_start: Millis::MAX,
            renewed: true,
            poll_ms: 1_000,
            horizon_ms: 10_000,
            replay: ReplayPolicy::Never,
        },
        end: EndFacts {
            skew: 2_000,
            lease_ms: 30_000,
            invocation_end: NOW + 300_000,
            can_retrieve: false,
            replay: ReplayPolicy::Never,
            tries: 3,
            first_pause_ms: 100,
            batch_poll_ms: 300_000,
        },
    }
}

/// The claim `d` asks for, applied to `item` as the executor makes it: routed to its lane.
fn claim(d: &Delivery, item: Option<&JobItem>, op: Op) -> JobItem {
    let Op::Claim {
        expect,
        first_sight,
    } = op
    else {
        panic!("not a claim: {op:?}");
    };
    let req = ClaimRequest {
        route: Some(Route {
            provider: d.plan.lanes[d.lane()].name.clone(),
            model: "m".to_owned(),
            path: None,
        }),
        job: NewJob::example("j", DEADLINE),
        expect,
        owner_id: d.owner_id(),
        now: NOW,
        lease_until: NOW + 30_000,
        provider_ref: None,
        first_sight,
        list_due: false,
    };
    apply_claim(item, &req).expect("the claim applies")
}

/// The end `d` asks to write, applied to `item`.
fn end(d: &Delivery, item: &JobItem) -> Observation {
    let Some(EndWrite::End(req)) = d.end_write(NOW) else {
        panic!("not an end");
    };
    let req: EndRequest = req;
    Observation::Answered(Some(match apply_end(Some(item), &req) {
        Some(after) => Write::Applied(after),
        None => Write::Refused(Some(item.clone())),
    }))
}

/// The end's write (`write`) applied to `record`: what the first attempt's call is charged.
fn ended(d: &mut Delivery, write: Command, record: &JobItem) -> Charge {
    assert_eq!(write, Command::End(EndStep::Write { pause_ms: 0 }));
    match d.observe(end(d, record), NOW) {
        Command::Charge { attempt: 1, charge } => charge,
        other => panic!("no charge of the first attempt: {other:?}"),
    }
}

fn closed(command: Command) -> Closed {
    match command {
        Command::Done(closed) => *closed,
        other => panic!("not done: {other:?}"),
    }
}

/// Takes capacity and claims from `item`: the claim's item.
fn claimed(d: &mut Delivery, first: Command, item: Option<&JobItem>) -> JobItem {
    assert_eq!(first, Command::Take);
    let Command::Write(op) = d.observe(Observation::Taken, NOW) else {
        panic!("no write after the capacity");
    };
    let record = claim(d, item, op);
    assert_eq!(
        d.observe(Observation::Applied(record.clone()), NOW),
        Command::Use
    );
    record
}

#[test]
fn a_claim_calls_ends_its_attempt_charges_the_call_and_ends_the_delivery() {
    let (mut d, first) = Delivery::start("o".into(), DIGEST.into(), vec![lane("a")], None, NOW);
    let record = claimed(&mut d, first, None);
    assert_eq!(record.state, JobState::Running);
    let Command::Call(CallStep::Submit { .. }) = d.observe(Observation::Carried, NOW) else {
        panic!("no call after the claim");
    };
    let answer = crate::provider::Answer {
        body: "42".into(),
        provider_ref: None,
        finish: crate::job::contract::Finish::Stop,
        usage: None,
        model: None,
        response_id: None,
    };
    let said = Observation::Said(Said::Answered(answer));
    assert_eq!(d.observe(said, NOW), Command::End(EndStep::Place));
    let write = d.observe(Observation::Placed(Placed::Inline), NOW);
    assert_eq!(ended(&mut d, write, &record), Charge::HeardOrReserved);
    let closed = closed(d.observe(Observation::Carried, NOW));
    assert_eq!(closed.outcome, RecordOutcome::Done(JobState::Succeeded));
    assert_eq!(d.view().map(|v| v.state), Some(JobState::Succeeded));
}

#[test]
fn a_definite_refusal_is_charged_what_was_heard_and_the_next_provider_claims_in_the_same_delivery()
{
    let lanes = vec![lane("a"), lane("b")];
    let (mut d, first) = Delivery::start("o".into(), DIGEST.into(), lanes, None, NOW);
    let record = claimed(&mut d, first, None);
    d.observe(Observation::Carried, NOW);
    let refused = ProviderError::Transient {
        retry_after_ms: None,
        reason: "overloaded".into(),
    };
    // The job stays live, and its item keeps no input (the message carried it): kept first.
    let keep = d.observe(Observation::Said(Said::Failed(refused)), NOW);
    assert_eq!(keep, Command::KeepInput);
    let write = d.observe(Observation::Kept(None), NOW);
    // The provider refused before any work: nothing reserved is charged.
    assert_eq!(ended(&mut d, write, &record), Charge::Heard);
    let left = d.view().cloned().expect("the end's item");
    assert_eq!(left.state, JobState::RetryAuthorized);
    let take = d.observe(Observation::Carried, NOW);
    assert_eq!((d.hop(), d.lane(), d.owner_id()), (1, 1, "o+1".to_owned()));
    let again = claimed(&mut d, take, Some(&left));
    assert_eq!(
        routing::latest(&again)
            .and_then(|a| a.route.as_ref())
            .map(|r| r.provider.as_str()),
        Some("b")
    );
}

#[test]
fn an_item_that_routes_the_claim_elsewhere_gives_back_what_was_taken_before_it_admits_again() {
    let lanes = vec![lane("a"), lane("b")];
    // Another delivery's attempt, refused by the first provider.
    let (mut other, first) = Delivery::start("x".into(), DIGEST.into(), lanes.clone(), None, NOW);
    let record = claimed(&mut other, first, None);
    other.observe(Observation::Carried, NOW);
    let refused = ProviderError::Transient {
        retry_after_ms: None,
        reason: "overloaded".into(),
    };
    other.observe(Observation::Said(Said::Failed(refused)), NOW);
    other.observe(end(&other, &record), NOW);
    let seen = other.view().cloned().expect("the end's item");

    let (mut d, first) = Delivery::start("o".into(), DIGEST.into(), lanes, None, NOW);
    assert_eq!(first, Command::Take);
    let Command::Write(op) = d.observe(Observation::Taken, NOW) else {
        panic!("no write");
    };
    assert!(matches!(
        op,
        Op::Claim {
            first_sight: true,
            ..
        }
    ));
    // The create is refused: the item shows the first provider's refusal.
    let give_back = d.observe(Observation::Refused(Some(seen)), NOW);
    assert_eq!((give_back, d.lane()), (Command::Release, 1));
    assert_eq!(d.observe(Observation::Carried, NOW), Command::Take);
}

#[test]
fn a_recovery_of_a_line_whose_batch_runs_gives_back_and_waits_with_nothing_written() {
    let mut seen = crate::protocol::claimed_example(
        DEADLINE,
        NOW,
        Some(crate::provider::batch::batch_ref("b1", "line-1")),
    );
    seen.owner_until = Some(NOW - 10_000);
    let later = NOW + 1_000;
    let (mut d, first) = Delivery::start(
        "o".into(),
        DIGEST.into(),
        vec![lane("a")],
        Some(seen.clone()),
        later,
    );
    assert_eq!(first, Command::LookAtBatch);
    assert_eq!(
        d.observe(Observation::BatchRunning(true), later),
        Command::Release
    );
    let closed = closed(d.observe(Observation::Carried, later));
    assert_eq!(
        closed.outcome,
        RecordOutcome::Failed(Failure::Deferred {
            remaining_ms: 300_000
        })
    );
    // Had it ended, the recovery goes on: the write it asked for.
    let (mut d, _) = Delivery::start(
        "o".into(),
        DIGEST.into(),
        vec![lane("a")],
        Some(seen.clone()),
        later,
    );
    // The item keeps no input: the recovery keeps it.
    let keep = d.observe(Observation::BatchRunning(false), later);
    assert_eq!(keep, Command::KeepInput);
    let input = KeptInput::Inline("{}".into());
    let write = d.observe(Observation::Kept(Some(input.clone())), later);
    assert!(
        matches!(write, Command::Write(Op::Recover { .. })),
        "{write:?}"
    );
    // It fences the owner seen, and only once that owner's lease lapsed by this clock less
    // the skew margin.
    let req = d.recovery(later).expect("a recovery claim");
    assert_eq!(
        (req.seen_epoch, req.owner_id.as_str()),
        (seen.owner_epoch, "o")
    );
    assert_eq!(
        (req.lapsed_before, req.lease_until),
        (later - 2_000, later + 30_000)
    );
    assert_eq!(req.input, Some(input));
}

#[test]
fn a_delivery_too_close_to_the_invocations_end_leaves_the_job_untouched() {
    let (_, first) = Delivery::start(
        "o".into(),
        DIGEST.into(),
        vec![lane("a")],
        None,
        NOW + 300_000,
    );
    let closed = closed(first);
    assert_eq!(closed.outcome, backoff("invocation deadline"));
    assert_eq!(closed.view, None);
}

#[test]
fn an_observation_the_command_did_not_ask_for_backs_off() {
    let (mut d, first) = Delivery::start("o".into(), DIGEST.into(), vec![lane("a")], None, NOW);
    assert_eq!(first, Command::Take);
    let closed = closed(d.observe(Observation::Paused, NOW));
    assert_eq!(closed.outcome, backoff("unexpected observation"));
}

#[test]
fn an_end_that_leaves_the_job_live_keeps_its_input_once_and_records_what_the_call_used() {
    let (mut d, first) = Delivery::start("o".into(), DIGEST.into(), vec![lane("a")], None, NOW);
    // A first claim keeps no input in the item: the message carries it.
    let record = claimed(&mut d, first, None);
    assert!(!record.keeps_input());
    d.observe(Observation::Carried, NOW);
    let heard = Usage {
        input: 10,
        output: 5,
        cost_micros: Some(7),
        ..Usage::default()
    };
    d.set_used(Used {
        heard: Some(heard),
        estimate: Usage::default(),
    });
    let refused = ProviderError::Transient {
        retry_after_ms: None,
        reason: "overloaded".into(),
    };
    let keep = d.observe(Observation::Said(Said::Failed(refused)), NOW);
    assert_eq!(keep, Command::KeepInput);
    let input = KeptInput::Inline("{\"q\":1}".into());
    let write = d.observe(Observation::Kept(Some(input.clone())), NOW);
    assert_eq!(write, Command::End(EndStep::Write { pause_ms: 0 }));
    let Some(EndWrite::End(req)) = d.end_write(NOW) else {
        panic!("not an end");
    };
    assert_eq!((req.input, req.usage), (Some(input), Some(heard)));
}

#[test]
fn an_attempt_given_back_records_no_usage_and_an_unknown_one_its_estimate_when_nothing_was_heard() {
    let estimate = Usage {
        input: 3,
        estimated: true,
        ..Usage::default()
    };
    let used = Used {
        heard: None,
        estimate,
    };
    let unknown = AttemptEnd::Unknown {
        evidence: "timed out".into(),
    };
    assert_eq!(used.recorded(&unknown), Some(estimate));
    assert_eq!(used.recorded(&AttemptEnd::Expired), None);
    let given_back = AttemptEnd::GivenBack {
        why: AttemptOutcome::NotSent,
        error: "no time".into(),
        given_back: vec![],
    };
    let heard = Used {
        heard: Some(estimate),
        estimate,
    };
    assert_eq!(heard.recorded(&given_back), None);
    assert_eq!(heard.recorded(&AttemptEnd::Expired), Some(estimate));
}
