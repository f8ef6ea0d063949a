//! The in-memory ledger and the DynamoDB ledger (on the emulator, through the SDK) run the same
//! sequence of operations, stale epochs and lapsed leases included, and must agree on every
//! outcome and on every final item. This keeps the fast fake honest.
//!
//! Why this file is long: each story of the contract runs on both ledgers, and they share the
//! helpers that build their requests.

use aws_sdk_dynamodb::types::AttributeValue;
use fenced_jobs::job::decision::SettleReason;
use fenced_jobs::job::{Expect, JobItem, JobState, NewJob, attention_key};
use fenced_jobs::ledger::memory::InMemoryLedger;
use fenced_jobs::ledger::{
    AttemptEnd, CancelRequest, CreateRequest, DecideRequest, EndRequest, EnqueuedRequest,
    JobLedger, KeptInput, OperatorAction, RecordRefRequest, RecoverRequest, SettleFrom,
    SettleRequest, Write,
};

use crate::support::{self, T, claim, new_job as job};

fn end_req(id: &str, epoch: u64, attempt: u32, now: i64, end: AttemptEnd) -> EndRequest {
    EndRequest {
        job_id: id.into(),
        epoch,
        attempt,
        now,
        end,
        usage: None,
        input: None,
    }
}

fn expect(epoch: u64, attempts: u32) -> Expect {
    Expect { epoch, attempts }
}

fn ok(result: &str) -> AttemptEnd {
    AttemptEnd::Succeeded {
        result: result.into(),
        finish: fenced_jobs::job::contract::Finish::Stop,
    }
}

fn retry() -> AttemptEnd {
    AttemptEnd::RetryAuthorized {
        error: "rate limited".into(),
    }
}

/// One line per operation: what the ledger answered.
fn line(step: &str, w: Write) -> String {
    match w {
        Write::Applied(r) => format!(
            "{step}: applied {} e{} a{}",
            r.state, r.owner_epoch, r.attempts
        ),
        Write::Refused(Some(r)) => format!(
            "{step}: refused, saw {} e{} a{}",
            r.state, r.owner_epoch, r.attempts
        ),
        Write::Refused(None) => format!("{step}: refused, no item"),
    }
}

pub(crate) async fn scenario<L: JobLedger>(
    ledger: &L,
    prefix: &str,
) -> (Vec<String>, Vec<Option<JobItem>>) {
    let id = |s: &str| format!("{prefix}{s}");
    let a = job(&id("a"), "d-a", 3, T + 3_600_000);
    let mut log = Vec::new();
    macro_rules! step {
        ($name:expr, $op:expr) => {
            log.push(line($name, $op.await.expect("ledger call")))
        };
    }
    step!(
        "claim fresh",
        ledger.claim(claim(&a, Expect::FRESH, "w1", T))
    );
    step!(
        "claim duplicate",
        ledger.claim(claim(&a, Expect::FRESH, "w2", T + 1))
    );
    step!(
        "end stale epoch",
        ledger.end(end_req(&a.job_id, 0, 1, T + 2, ok("stale")))
    );
    let recover = |now: i64| RecoverRequest {
        job_id: a.job_id.clone(),
        seen_epoch: 1,
        owner_id: "w3".into(),
        now,
        lapsed_before: now - 2_000,
        lease_until: now + 60_000,
        reason: "lease lapsed".into(),
        seen_recoveries: 0,
        input: None,
    };
    let renew = |epoch: u64, expected: i64, now: i64| fenced_jobs::ledger::RenewRequest {
        job_id: a.job_id.clone(),
        epoch,
        expected_until: Some(expected),
        now,
        lease_until: now + 60_000,
        progress: None,
    };
    // The claim's lease ends at T + 60 s; each renewal extends the lease it names.
    step!(
        "renew stale epoch",
        ledger.renew(renew(0, T + 60_000, T + 500))
    );
    step!("renew", ledger.renew(renew(1, T + 60_000, T + 500)));
    step!(
        "renew a lease that changed",
        ledger.renew(renew(1, T + 60_000, T + 600))
    );
    step!(
        "renew lapsed lease nobody took over",
        ledger.renew(renew(1, T + 60_500, T + 61_000))
    );
    step!("recover live lease", ledger.recover(recover(T + 1_000)));
    step!("recover lapsed lease", ledger.recover(recover(T + 124_000)));
    step!(
        "fenced owner renews",
        ledger.renew(renew(1, T + 121_000, T + 124_500))
    );
    step!(
        "fenced owner accepts",
        ledger.end(end_req(&a.job_id, 1, 1, T + 121_000, ok("old")))
    );
    step!(
        "new owner releases",
        ledger.end(end_req(&a.job_id, 2, 1, T + 122_000, retry()))
    );
    step!(
        "claim with old expectation",
        ledger.claim(claim(&a, Expect::FRESH, "w4", T + 123_000))
    );
    let other_input = job(&a.job_id, "d-other", 3, T + 3_600_000);
    step!(
        "claim other digest",
        ledger.claim(claim(&other_input, expect(2, 1), "w4", T + 124_000))
    );
    step!(
        "claim retry",
        ledger.claim(claim(&a, expect(2, 1), "w4", T + 125_000))
    );
    step!(
        "accept after deadline",
        ledger.end(end_req(&a.job_id, 3, 2, T + 3_600_000, ok("late")))
    );
    step!(
        "accept",
        ledger.end(end_req(&a.job_id, 3, 2, T + 126_000, ok("answer")))
    );
    let settle = |id: &str, from: SettleFrom, reason, now| SettleRequest {
        job_id: id.into(),
        from,
        reason,
        now,
    };
    let seen = |state, epoch| SettleFrom::Seen { state, epoch };
    use fenced_jobs::job::JobState::*;
    step!(
        "settle a terminal job",
        ledger.settle(settle(
            &a.job_id,
            seen(Succeeded, 3),
            SettleReason::DeadlinePassed,
            T + 127_000
        ))
    );
    step!(
        "accept twice",
        ledger.end(end_req(&a.job_id, 3, 2, T + 128_000, ok("again")))
    );

    let b = job(&id("b"), "d-b", 1, T + 3_600_000);
    step!("b claim", ledger.claim(claim(&b, Expect::FRESH, "w1", T)));
    step!(
        "b release",
        ledger.end(end_req(&b.job_id, 1, 1, T + 1, retry()))
    );
    step!(
        "b claim past budget",
        ledger.claim(claim(&b, expect(1, 1), "w2", T + 2))
    );
    step!(
        "b settle budget",
        ledger.settle(settle(
            &b.job_id,
            seen(RetryAuthorized, 1),
            SettleReason::BudgetSpent,
            T + 3
        ))
    );

    let c = job(&id("c"), "d-c", 3, T - 1);
    let absent = || SettleFrom::Absent(Box::new(c.clone()));
    step!(
        "c settle absent",
        ledger.settle(settle(&c.job_id, absent(), SettleReason::DeadlinePassed, T))
    );
    step!(
        "c settle absent again",
        ledger.settle(settle(
            &c.job_id,
            absent(),
            SettleReason::DeadlinePassed,
            T + 1
        ))
    );

    let d = job(&id("d"), "d-d", 3, T + 10_000);
    step!("d claim", ledger.claim(claim(&d, Expect::FRESH, "w1", T)));
    let unknown = AttemptEnd::Unknown {
        evidence: "timed out after sending".into(),
    };
    step!(
        "d uncertain",
        ledger.end(end_req(&d.job_id, 1, 1, T + 5_000, unknown))
    );
    step!(
        "d claim unknown",
        ledger.claim(claim(&d, expect(1, 1), "w2", T + 6_000))
    );
    step!(
        "d claim after deadline",
        ledger.claim(claim(&d, Expect::FRESH, "w2", T + 20_000))
    );
    step!(
        "d settle deadline",
        ledger.settle(settle(
            &d.job_id,
            seen(Unknown, 1),
            SettleReason::DeadlinePassed,
            T + 20_000
        ))
    );
    step!(
        "e settle missing",
        ledger.settle(settle(
            &id("e"),
            seen(Ready, 0),
            SettleReason::DeadlinePassed,
            T
        ))
    );

    let f = job(&id("f"), "d-f", 3, T + 10_000);
    step!("f claim", ledger.claim(claim(&f, Expect::FRESH, "w1", T)));
    let replay = AttemptEnd::Replay {
        evidence: "cut off".into(),
        by: "replay-policy".into(),
    };
    step!(
        "f replay",
        ledger.end(end_req(&f.job_id, 1, 1, T + 1_000, replay))
    );
    step!(
        "f claim replayed",
        ledger.claim(claim(&f, expect(1, 1), "w2", T + 2_000))
    );

    let g = job(&id("g"), "d-g", 3, T + 10_000);
    let decide = |epoch: u64, action: OperatorAction, now: i64| DecideRequest {
        job_id: g.job_id.clone(),
        epoch,
        action,
        by: "operator:alice".into(),
        caller: Some("arn:aws:iam::123456789012:user/alice".into()),
        reason: "provider dashboard shows no completion".into(),
        now,
    };
    let uncertain = || AttemptEnd::Unknown {
        evidence: "cut off".into(),
    };
    step!("g claim", ledger.claim(claim(&g, Expect::FRESH, "w1", T)));
    step!(
        "g decide while running",
        ledger.decide(decide(1, OperatorAction::AuthorizeRetry, T + 1))
    );
    step!(
        "g uncertain",
        ledger.end(end_req(&g.job_id, 1, 1, T + 2, uncertain()))
    );
    step!(
        "g decide stale epoch",
        ledger.decide(decide(0, OperatorAction::AuthorizeRetry, T + 3))
    );
    step!(
        "g authorize retry",
        ledger.decide(decide(1, OperatorAction::AuthorizeRetry, T + 4))
    );
    step!(
        "g decide again",
        ledger.decide(decide(1, OperatorAction::Fail, T + 5))
    );
    step!(
        "g claim authorized",
        ledger.claim(claim(&g, expect(2, 1), "w2", T + 6))
    );
    step!(
        "g uncertain again",
        ledger.end(end_req(&g.job_id, 3, 2, T + 7, uncertain()))
    );
    step!(
        "g fail",
        ledger.decide(decide(3, OperatorAction::Fail, T + 8))
    );

    let h = job(&id("h"), "d-h", 3, T + 10_000);
    let recover_h = |epoch: u64, now: i64| RecoverRequest {
        job_id: h.job_id.clone(),
        seen_epoch: epoch,
        owner_id: "w9".into(),
        now,
        lapsed_before: now - 2_000,
        lease_until: now + 60_000,
        reason: "asking the provider".into(),
        seen_recoveries: 0,
        input: None,
    };
    let cut_off = AttemptEnd::Unknown {
        evidence: "cut off".into(),
    };
    step!("h claim", ledger.claim(claim(&h, Expect::FRESH, "w1", T)));
    step!(
        "h uncertain",
        ledger.end(end_req(&h.job_id, 1, 1, T + 1, cut_off))
    );
    step!("h recover stale epoch", ledger.recover(recover_h(0, T + 2)));
    step!("h recover unknown", ledger.recover(recover_h(1, T + 3)));
    step!(
        "h accept retrieved",
        ledger.end(end_req(&h.job_id, 2, 1, T + 4, ok("retrieved")))
    );

    let i = job(&id("i"), "d-i", 3, T + 10_000);
    let record_ref = |epoch: u64, attempt: u32, r: &str| RecordRefRequest {
        job_id: i.job_id.clone(),
        epoch,
        attempt,
        provider_ref: r.into(),
        now: T + 2,
        input: None,
    };
    step!(
        "i record before claim",
        ledger.record_ref(record_ref(1, 1, "resp_0"))
    );
    step!("i claim", ledger.claim(claim(&i, Expect::FRESH, "w1", T)));
    step!(
        "i record stale epoch",
        ledger.record_ref(record_ref(0, 1, "resp_x"))
    );
    step!(
        "i record other attempt",
        ledger.record_ref(record_ref(1, 2, "resp_y"))
    );
    step!("i record", ledger.record_ref(record_ref(1, 1, "resp_1")));
    step!(
        "i uncertain",
        ledger.end(end_req(&i.job_id, 1, 1, T + 3, uncertain()))
    );
    step!(
        "i record after the end",
        ledger.record_ref(record_ref(1, 1, "resp_z"))
    );

    let j = job(&id("j"), "d-j", 3, T + 10_000);
    let other = job(&j.job_id, "d-other", 3, T + 10_000);
    let create = |job: &NewJob, now: i64| CreateRequest {
        job: job.clone(),
        now,
        enqueued: false,
    };
    let enqueued = |now: i64| EnqueuedRequest {
        job_id: j.job_id.clone(),
        now,
    };
    step!(
        "j enqueued before create",
        ledger.mark_enqueued(enqueued(T))
    );
    step!("j create", ledger.create(create(&j, T)));
    step!("j create again", ledger.create(create(&j, T + 1)));
    step!(
        "j create other digest",
        ledger.create(create(&other, T + 1))
    );
    step!("j enqueued", ledger.mark_enqueued(enqueued(T + 2)));
    step!(
        "j claim fresh",
        ledger.claim(claim(&j, Expect::FRESH, "w1", T + 3))
    );
    step!(
        "j enqueued while running",
        ledger.mark_enqueued(enqueued(T + 4))
    );
    let expire = |now: i64| SettleRequest {
        job_id: j.job_id.clone(),
        from: SettleFrom::PastDeadline,
        reason: SettleReason::DeadlinePassed,
        now,
    };
    step!("j expire before deadline", ledger.settle(expire(T + 9_999)));
    step!("j expire", ledger.settle(expire(T + 10_000)));
    step!(
        "j owner accepts after expiry",
        ledger.end(end_req(&j.job_id, 1, 1, T + 10_001, ok("late")))
    );
    step!("j expire again", ledger.settle(expire(T + 10_002)));
    step!(
        "j enqueued after expiry",
        ledger.mark_enqueued(enqueued(T + 10_003))
    );

    let mut items = Vec::new();
    for s in ["a", "b", "c", "d", "e", "f", "g", "h", "i", "j"] {
        let mut item = ledger.get(&id(s)).await.expect("get");
        if let Some(item) = item.as_mut() {
            item.job_id = s.to_owned();
        }
        items.push(item);
    }
    (log, items)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_in_memory_ledger_and_dynamodb_agree_on_every_conditional_write() {
    let memory = InMemoryLedger::new();
    let (memory_log, memory_items) = scenario(&memory, "").await;

    let aws = support::emulator().await;
    let table = aws.table().await;
    let dynamo = aws.ledger(&table);
    let (dynamo_log, dynamo_items) = scenario(&dynamo, "").await;

    for (m, d) in memory_log.iter().zip(&dynamo_log) {
        assert_eq!(m, d);
    }
    assert_eq!(memory_log.len(), dynamo_log.len());
    assert_eq!(memory_items, dynamo_items);

    // The expected story, so that both agreeing on a wrong answer fails too.
    let expected = [
        "claim fresh: applied running e1 a1",
        "claim duplicate: refused, saw running e1 a1",
        "end stale epoch: refused, saw running e1 a1",
        "renew stale epoch: refused, saw running e1 a1",
        "renew: applied running e1 a1",
        "renew a lease that changed: refused, saw running e1 a1",
        "renew lapsed lease nobody took over: applied running e1 a1",
        "recover live lease: refused, saw running e1 a1",
        "recover lapsed lease: applied running e2 a1",
        "fenced owner renews: refused, saw running e2 a1",
        "fenced owner accepts: refused, saw running e2 a1",
        "new owner releases: applied retry_authorized e2 a1",
        "claim with old expectation: refused, saw retry_authorized e2 a1",
        "claim other digest: refused, saw retry_authorized e2 a1",
        "claim retry: applied running e3 a2",
        "accept after deadline: refused, saw running e3 a2",
        "accept: applied succeeded e3 a2",
        "settle a terminal job: refused, saw succeeded e3 a2",
        "accept twice: refused, saw succeeded e3 a2",
        "b claim: applied running e1 a1",
        "b release: applied retry_authorized e1 a1",
        "b claim past budget: refused, saw retry_authorized e1 a1",
        "b settle budget: applied failed_terminal e1 a1",
        "c settle absent: applied expired e0 a0",
        "c settle absent again: refused, saw expired e0 a0",
        "d claim: applied running e1 a1",
        "d uncertain: applied unknown e1 a1",
        "d claim unknown: refused, saw unknown e1 a1",
        "d claim after deadline: refused, saw unknown e1 a1",
        "d settle deadline: applied expired e1 a1",
        "e settle missing: refused, no item",
        "f claim: applied running e1 a1",
        "f replay: applied retry_authorized e1 a1",
        "f claim replayed: applied running e2 a2",
        "g claim: applied running e1 a1",
        "g decide while running: refused, saw running e1 a1",
        "g uncertain: applied unknown e1 a1",
        "g decide stale epoch: refused, saw unknown e1 a1",
        "g authorize retry: applied retry_authorized e2 a1",
        "g decide again: refused, saw retry_authorized e2 a1",
        "g claim authorized: applied running e3 a2",
        "g uncertain again: applied unknown e3 a2",
        "g fail: applied failed_terminal e4 a2",
        "h claim: applied running e1 a1",
        "h uncertain: applied unknown e1 a1",
        "h recover stale epoch: refused, saw unknown e1 a1",
        "h recover unknown: applied running e2 a1",
        "h accept retrieved: applied succeeded e2 a1",
        "i record before claim: refused, no item",
        "i claim: applied running e1 a1",
        "i record stale epoch: refused, saw running e1 a1",
        "i record other attempt: refused, saw running e1 a1",
        "i record: applied running e1 a1",
        "i uncertain: applied unknown e1 a1",
        "i record after the end: refused, saw unknown e1 a1",
        "j enqueued before create: refused, no item",
        "j create: applied ready e0 a0",
        "j create again: refused, saw ready e0 a0",
        "j create other digest: refused, saw ready e0 a0",
        "j enqueued: applied ready e0 a0",
        "j claim fresh: applied running e1 a1",
        "j enqueued while running: applied running e1 a1",
        "j expire before deadline: refused, saw running e1 a1",
        "j expire: applied expired e1 a1",
        "j owner accepts after expiry: refused, saw expired e1 a1",
        "j expire again: refused, saw expired e1 a1",
        "j enqueued after expiry: refused, saw expired e1 a1",
    ];
    assert_eq!(memory_log, expected);
    let a = memory_items[0].as_ref().expect("a");
    assert_eq!(a.result.as_deref(), Some("answer"));
    assert_eq!(a.attempt_log.len(), 2);
    assert_eq!(a.recoveries.len(), 1);
    let f = memory_items[5].as_ref().expect("f");
    assert_eq!(f.decisions.len(), 1);
    assert_eq!(f.decisions[0].action, "replay");
    assert_eq!(f.decisions[0].by, "replay-policy");
    let g = memory_items[6].as_ref().expect("g");
    let actions: Vec<&str> = g.decisions.iter().map(|d| d.action.as_str()).collect();
    assert_eq!(actions, ["authorize_retry", "fail"]);
    assert_eq!(g.decisions[1].by, "operator:alice");
    let i = memory_items[8].as_ref().expect("i");
    assert_eq!(i.attempt_log[0].provider_ref.as_deref(), Some("resp_1"));
    let j = memory_items[9].as_ref().expect("j");
    assert_eq!(j.enqueued_at, Some(T + 4));
    assert_eq!(j.input_digest, "d-j");
}

/// An operator's cancel: at once for a job nobody runs, as a request its owner carries out for
/// a running one (whose heartbeat's renewals and other ends it refuses).
pub(crate) async fn cancels<L: JobLedger>(
    ledger: &L,
    prefix: &str,
) -> (Vec<String>, Vec<Option<JobItem>>) {
    let id = |s: &str| format!("{prefix}{s}");
    let mut log = Vec::new();
    macro_rules! step {
        ($name:expr, $op:expr) => {
            log.push(line($name, $op.await.expect("ledger call")))
        };
    }
    let k = job(&id("k"), "d-k", 3, T + 10_000);
    let cancel_k = |seen: JobState, epoch: u64, now: i64| CancelRequest {
        job_id: k.job_id.clone(),
        seen,
        epoch,
        by: "operator:alice".into(),
        caller: None,
        reason: "submitted by mistake".into(),
        now,
    };
    let renew_k = |until: i64, now: i64| fenced_jobs::ledger::RenewRequest {
        job_id: k.job_id.clone(),
        epoch: 1,
        expected_until: Some(until),
        now,
        lease_until: now + 60_000,
        // What the owner says of its call rides on the renewal, the same on every engine.
        progress: Some(fenced_jobs::job::CallProgress {
            epoch: 1,
            streamed_bytes: u64::try_from(now - T).unwrap_or(0),
        }),
    };
    step!("k claim", ledger.claim(claim(&k, Expect::FRESH, "w1", T)));
    step!(
        "k cancel as if ready",
        ledger.cancel(cancel_k(JobState::Ready, 1, T + 1))
    );
    step!(
        "k cancel running",
        ledger.cancel(cancel_k(JobState::Running, 1, T + 2))
    );
    step!(
        "k cancel running again",
        ledger.cancel(cancel_k(JobState::Running, 1, T + 3))
    );
    let lease = ledger
        .get(&k.job_id)
        .await
        .expect("get")
        .and_then(|r| r.owner_until);
    step!(
        "k heartbeat renews",
        ledger.renew(renew_k(lease.unwrap_or_default(), T + 4))
    );
    step!(
        "k owner accepts",
        ledger.end(end_req(&k.job_id, 1, 1, T + 5, ok("too late")))
    );
    step!(
        "k owner gives back",
        ledger.end(end_req(&k.job_id, 1, 1, T + 5, retry()))
    );
    step!(
        "k owner ends cancelled",
        ledger.end(end_req(&k.job_id, 1, 1, T + 6, AttemptEnd::Cancelled))
    );
    step!(
        "k cancel cancelled",
        ledger.cancel(cancel_k(JobState::Cancelled, 1, T + 7))
    );
    let l = job(&id("l"), "d-l", 3, T + 10_000);
    let cancel_l = |seen: JobState, epoch: u64| CancelRequest {
        job_id: l.job_id.clone(),
        seen,
        epoch,
        by: "operator:alice".into(),
        caller: None,
        reason: "no longer wanted".into(),
        now: T + 1,
    };
    step!(
        "l cancel absent",
        ledger.cancel(cancel_l(JobState::Ready, 0))
    );
    step!(
        "l create",
        ledger.create(CreateRequest {
            job: l.clone(),
            now: T,
            enqueued: false,
        })
    );
    step!(
        "l owner ends cancelled unasked",
        ledger.end(end_req(&l.job_id, 0, 0, T, AttemptEnd::Cancelled))
    );
    step!(
        "l cancel ready",
        ledger.cancel(cancel_l(JobState::Ready, 0))
    );
    step!(
        "l claim cancelled",
        ledger.claim(claim(&l, Expect::FRESH, "w1", T + 2))
    );

    let mut items = Vec::new();
    for s in ["k", "l"] {
        let mut item = ledger.get(&id(s)).await.expect("get");
        if let Some(item) = item.as_mut() {
            item.job_id = s.to_owned();
        }
        items.push(item);
    }
    (log, items)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_in_memory_ledger_and_dynamodb_agree_on_cancels() {
    let (memory_log, items) = cancels(&InMemoryLedger::new(), "").await;
    let aws = support::emulator().await;
    let table = aws.table().await;
    let (dynamo_log, dynamo_items) = cancels(&aws.ledger(&table), "").await;
    assert_eq!(memory_log, dynamo_log);
    assert_eq!(items, dynamo_items);
    let expected = [
        "k claim: applied running e1 a1",
        "k cancel as if ready: refused, saw running e1 a1",
        "k cancel running: applied running e1 a1",
        "k cancel running again: refused, saw running e1 a1",
        "k heartbeat renews: refused, saw running e1 a1",
        "k owner accepts: refused, saw running e1 a1",
        "k owner gives back: refused, saw running e1 a1",
        "k owner ends cancelled: applied cancelled e1 a1",
        "k cancel cancelled: refused, saw cancelled e1 a1",
        "l cancel absent: refused, no item",
        "l create: applied ready e0 a0",
        "l owner ends cancelled unasked: refused, saw ready e0 a0",
        "l cancel ready: applied cancelled e1 a0",
        "l claim cancelled: refused, saw cancelled e1 a0",
    ];
    assert_eq!(memory_log, expected);
    let k = items[0].as_ref().expect("k");
    assert_eq!(k.cancel_requested, Some(T + 2));
    assert_eq!(k.decisions.len(), 1);
    assert_eq!(k.decisions[0].action, "cancel");
    assert_eq!(k.decisions[0].epoch, 1);
    assert_eq!(k.result, None);
    assert_eq!(
        k.attempt_log[0].outcome,
        fenced_jobs::job::AttemptOutcome::Cancelled
    );
    let l = items[1].as_ref().expect("l");
    assert_eq!(l.decisions[0].epoch, 1);
    assert_eq!(
        l.last_error.as_ref().map(|e| e.kind.as_str()),
        Some("cancelled")
    );
}

/// The item `id` as DynamoDB holds it (a consistent read).
async fn stored(
    client: &aws_sdk_dynamodb::Client,
    table: &str,
    id: &str,
) -> fenced_jobs::ledger::dynamodb::Item {
    client
        .get_item()
        .table_name(table)
        .key("job_id", AttributeValue::S(id.to_owned()))
        .consistent_read(true)
        .send()
        .await
        .expect("get")
        .item
        .expect("item")
}

/// The raw item, as DynamoDB holds it, without the attributes the job id decides.
async fn raw_item(
    aws: &support::Emulator,
    table: &str,
    id: &str,
) -> fenced_jobs::ledger::dynamodb::Item {
    let mut item = stored(&aws.ddb, table, id).await;
    let attention = item
        .remove("attention")
        .and_then(|v| v.as_s().ok().cloned());
    // Both are first claims: the queue brings such a job back, so the index never holds it.
    let expected = attention_key(JobState::Running, 1, false, id);
    assert_eq!(
        attention, expected,
        "{id}: the attention key of a job running on its first claim"
    );
    item.remove("job_id");
    item
}

/// An item written before every item carried `due_day` (it has `due_on` and no `due_day`)
/// takes a write that lists the job, keeping its entry; a first claim of today lists it on the
/// end that leaves the happy path, from its own `due_day`.
pub(crate) async fn an_older_item_keeps_its_due_entry(
    client: &aws_sdk_dynamodb::Client,
    table: &str,
    ledger: &impl JobLedger,
) {
    for id in ["older", "today"] {
        let mut first = claim(&job(id, "d", 3, T + 3_600_000), Expect::FRESH, "w1", T);
        first.first_sight = true;
        assert!(matches!(ledger.claim(first).await, Ok(Write::Applied(_))));
    }
    client
        .update_item()
        .table_name(table)
        .key("job_id", AttributeValue::S("older".into()))
        .update_expression("SET due_on = :day REMOVE due_day")
        .expression_attribute_values(":day", AttributeValue::S("2026-11-30".into()))
        .send()
        .await
        .expect("an older item's shape");
    for id in ["older", "today"] {
        let end = ledger.end(end_req(id, 1, 1, T + 10, retry())).await;
        assert!(matches!(end, Ok(Write::Applied(_))), "{id}: {end:?}");
    }
    let due = |id: &'static str| async move {
        let item = stored(client, table, id).await;
        item.get("due_on").and_then(|v| v.as_s().ok()).cloned()
    };
    assert_eq!(due("older").await.as_deref(), Some("2026-11-30"));
    let today = fenced_jobs::job::message::format_rfc3339_ms(T + 3_600_000);
    assert_eq!(due("today").await.as_deref(), Some(&today[..10]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_item_takes_a_listing_write_and_keeps_its_due_entry() {
    let aws = support::emulator().await;
    let table = aws.table().await;
    an_older_item_keeps_its_due_entry(&aws.ddb, &table, &aws.ledger(&table)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_on_first_sight_writes_the_item_a_claim_in_place_writes() {
    let aws = support::emulator().await;
    let table = aws.table().await;
    let dynamo = aws.ledger(&table);
    // The same job twice (only the id differs): created whole by a first-sight claim, and by
    // the in-place claim's `if_not_exists` update.
    let whole = job("whole", "d", 3, T + 3_600_000);
    let in_place = job("in-place", "d", 3, T + 3_600_000);
    let mut first = claim(&whole, Expect::FRESH, "w1", T);
    first.first_sight = true;
    let mut update = claim(&in_place, Expect::FRESH, "w1", T);
    update.first_sight = false;
    update.provider_ref = first.provider_ref.clone();
    let Write::Applied(created) = dynamo.claim(first).await.expect("claim") else {
        panic!("the first-sight claim is applied");
    };
    assert!(matches!(dynamo.claim(update).await, Ok(Write::Applied(_))));
    assert_eq!(
        raw_item(&aws, &table, "whole").await,
        raw_item(&aws, &table, "in-place").await
    );
    // What the whole-item write returned is what the table holds.
    assert_eq!(dynamo.get("whole").await.expect("get"), Some(created));
}

/// An owner accepts an answer with the record its claim returned: a stale epoch is refused with
/// the item as it stands, and the applied write returns exactly what the ledger then holds.
pub(crate) async fn accept_as_known_owner<L: JobLedger>(ledger: &L, id: &str) {
    let mut first = claim(&job(id, "d", 3, T + 3_600_000), Expect::FRESH, "w1", T);
    first.first_sight = true;
    let Ok(Write::Applied(claimed)) = ledger.claim(first).await else {
        panic!("{id}: the claim is applied");
    };
    let stale = end_req(id, 0, 1, T + 10, ok("late"));
    assert_eq!(
        ledger.end_known(&claimed, stale).await.expect("finish"),
        Write::Refused(Some(claimed.clone())),
        "{id}"
    );
    let accept = end_req(id, 1, 1, T + 20, ok("the answer"));
    let Ok(Write::Applied(accepted)) = ledger.end_known(&claimed, accept).await else {
        panic!("{id}: the acceptance is applied");
    };
    assert_eq!(accepted.state, JobState::Succeeded);
    assert_eq!(accepted.result.as_deref(), Some("the answer"));
    assert_eq!(ledger.get(id).await.expect("get"), Some(accepted), "{id}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acceptance_by_a_known_owner_returns_the_record_the_ledger_holds() {
    let aws = support::emulator().await;
    let table = aws.table().await;
    accept_as_known_owner(&InMemoryLedger::new(), "known-memory").await;
    aws.calls.reset();
    accept_as_known_owner(&aws.ledger(&table), "known-dynamodb").await;
    // Each request was timed as the ledger waited for it, the refused acceptance included
    // (what `bench_batch` reports as the ledger's latency).
    for (operation, requests) in [("PutItem", 1), ("UpdateItem", 2), ("GetItem", 1)] {
        let took = aws.calls.took("dynamodb", operation);
        assert_eq!(
            aws.calls.get("dynamodb", operation),
            requests,
            "{operation}"
        );
        assert_eq!(took.len() as u64, requests, "{operation}");
        assert!(took.iter().all(|t| !t.is_zero()), "{operation}");
    }
    aws.calls.reset();
    assert!(aws.calls.took("dynamodb", "UpdateItem").is_empty());
}

/// Recovers the job `id` (claimed once) `times` times, each as a recoverer that read the item
/// first, and returns the item after.
pub(crate) async fn recovered_often<L: JobLedger>(ledger: &L, id: &str, times: u64) -> JobItem {
    let a = job(id, "d-r", 3, T + 86_400_000);
    ledger
        .claim(claim(&a, Expect::FRESH, "w0", T))
        .await
        .expect("claim");
    for epoch in 1..=times {
        let seen = ledger.get(id).await.expect("get").expect("item");
        let now = T + epoch as i64 * 120_000;
        let req = RecoverRequest {
            job_id: id.to_owned(),
            seen_epoch: epoch,
            owner_id: format!("w{epoch}"),
            now,
            lapsed_before: now - 2_000,
            lease_until: now + 60_000,
            reason: "lease lapsed".into(),
            seen_recoveries: seen.recoveries.len(),
            input: None,
        };
        let written = ledger.recover(req).await.expect("recover");
        assert!(matches!(written, Write::Applied(_)), "{written:?}");
    }
    ledger.get(id).await.expect("get").expect("item")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_recovered_again_and_again_lists_its_first_recoveries_and_counts_the_rest() {
    // GIVEN a job taken over 14 times (an unknown job asked about at every delivery, say)
    let memory = InMemoryLedger::new();
    let aws = support::emulator().await;
    let table = aws.table().await;
    let dynamo = aws.ledger(&table);
    let (m, d) = (
        recovered_often(&memory, "often", 14).await,
        recovered_often(&dynamo, "often", 14).await,
    );
    // THEN its item keeps ten of them and counts the other four, alike in both ledgers, so
    // the item stays bounded however long the job lives
    assert_eq!((m.recoveries.len(), m.recoveries_dropped), (10, 4));
    assert_eq!(m.owner_epoch, 15);
    assert_eq!(m, d);
}

/// Where a job's input is kept, the same in both ledgers: not by its first claim (its message
/// carries it), by an end that leaves the job live (for a trigger by id), and never written
/// again over what the item keeps.
pub(crate) async fn input_kept_off_the_happy_path<L: JobLedger>(ledger: &L, id: &str) {
    let new = job(id, "d", 3, T + 3_600_000);
    let mut first = claim(&new, Expect::FRESH, "w1", T);
    first.first_sight = true;
    let Ok(Write::Applied(claimed)) = ledger.claim(first).await else {
        panic!("{id}: the claim is applied");
    };
    assert!(!claimed.keeps_input(), "{id}: {claimed:?}");
    let mut failed = end_req(id, 1, 1, T + 10, retry());
    failed.input = Some(KeptInput::Inline(new.input.clone()));
    let Ok(Write::Applied(live)) = ledger.end(failed).await else {
        panic!("{id}: the end is applied");
    };
    assert_eq!(live.input, new.input, "{id}");
    // A second claim keeps what the item holds (`if_not_exists`), whatever it carries.
    let mut other = new.clone();
    other.input = r#"{"model":"m","prompt":"not this"}"#.into();
    let second = claim(&other, expect(1, 1), "w2", T + 20);
    let Ok(Write::Applied(again)) = ledger.claim(second).await else {
        panic!("{id}: the second claim is applied");
    };
    assert_eq!(again.input, new.input, "{id}");
    assert_eq!(ledger.get(id).await.expect("get"), Some(again));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_input_is_kept_off_the_happy_path_in_both_ledgers() {
    let aws = support::emulator().await;
    let table = aws.table().await;
    input_kept_off_the_happy_path(&aws.ledger(&table), "dynamo").await;
    input_kept_off_the_happy_path(&InMemoryLedger::new(), "memory").await;
    // On DynamoDB, the first claim's item has no `input` attribute at all.
    let mut fresh = claim(&job("bare", "d", 3, T + 3_600_000), Expect::FRESH, "w1", T);
    fresh.first_sight = true;
    assert!(matches!(
        aws.ledger(&table).claim(fresh).await,
        Ok(Write::Applied(_))
    ));
    let item = raw_item(&aws, &table, "bare").await;
    assert!(!item.contains_key("input"), "{item:?}");
}

/// What the indexes show of the jobs `scenario` left: each live state's jobs by last change and
/// by deadline, its count, and every job by its deadline, in order.
pub(crate) async fn index_views<L: JobLedger + fenced_jobs::ledger::LedgerIndex>(
    ledger: &L,
) -> Vec<String> {
    use fenced_jobs::ledger::IndexCursor;
    let mut views = Vec::new();
    for state in [
        JobState::Ready,
        JobState::Running,
        JobState::Unknown,
        JobState::RetryAuthorized,
    ] {
        let by_change = ledger
            .untouched_since(state, i64::MAX, &IndexCursor::default(), 100)
            .await
            .expect("by last change");
        let by_deadline = ledger
            .past_deadline(state, T + 86_400_000, 100)
            .await
            .expect("by deadline");
        let count = ledger.count(state).await.expect("count");
        views.push(format!("{state:?}: {by_change:?} {by_deadline:?} {count}"));
    }
    // Every job, in any state, by its deadline (walked in pages of two: the cursor moves).
    let mut walk = fenced_jobs::ledger::DueWalk::new(T - 86_400_000, T + 8 * 86_400_000);
    let mut due = Vec::new();
    while let Some(page) = walk.next(ledger, 2).await.expect("due") {
        due.extend(page);
    }
    // DynamoDB promises no order among entries with the same sort key (dynalite and moto
    // differ): only the set at each deadline is compared.
    due.sort_by(|a, b| (a.1, &a.0).cmp(&(b.1, &b.0)));
    views.push(format!("due: {due:?}"));
    views
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sparse_indexes_show_the_same_jobs_in_memory_and_on_dynamodb() {
    let memory = InMemoryLedger::new();
    scenario(&memory, "").await;
    let aws = support::emulator().await;
    let table = aws.table().await;
    let dynamo = aws.ledger(&table);
    scenario(&dynamo, "").await;
    let views = index_views(&memory).await;
    assert_eq!(views, index_views(&dynamo).await);
    // The views hold jobs: a wrong index agreeing on nothing would fail here.
    assert!(
        views
            .iter()
            .any(|v| v.starts_with("Unknown") && !v.ends_with(" 0")),
        "{views:?}"
    );
    assert!(views.last().is_some_and(|v| v.contains('"')), "{views:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_emulator_checks_and_applies_each_conditional_write_in_one_step() {
    // GIVEN one item with a counter, and 24 writers that each read it and then write
    // `n = n + 1` on the condition that `n` is still what they read, 24 times over (the
    // ledger's every write is such a write: a claim on the epoch it read); each write sets
    // forty more attributes too, as an end of attempt does, so that an emulator that checks
    // and applies in two steps has a gap between them
    let aws = support::emulator().await;
    let table = aws.table().await;
    let key = || AttributeValue::S("counter".into());
    aws.ddb
        .put_item()
        .table_name(&table)
        .item("job_id", key())
        .item("n", AttributeValue::N("0".into()))
        .send()
        .await
        .expect("put");
    let update = (0..40).fold("SET n = n + :one".to_owned(), |u, i| {
        u + &format!(", a{i} = :one")
    });
    let writers = (0..24).map(|_| {
        let (ddb, table, update) = (aws.ddb.clone(), table.clone(), update.clone());
        tokio::spawn(async move {
            let mut applied = Vec::new();
            for _ in 0..24 {
                let read = AttributeValue::N(counter(&ddb, &table).await);
                let written = ddb
                    .update_item()
                    .table_name(&table)
                    .key("job_id", key())
                    .update_expression(&update)
                    .condition_expression("n = :read")
                    .expression_attribute_values(":one", AttributeValue::N("1".into()))
                    .expression_attribute_values(":read", read.clone())
                    .send()
                    .await;
                if written.is_ok() {
                    applied.push(read);
                }
            }
            applied
        })
    });
    let mut applied = Vec::new();
    for writer in writers.collect::<Vec<_>>() {
        applied.extend(writer.await.expect("writer"));
    }

    // THEN at most one write was applied for each value read, as DynamoDB applies a
    // conditional write atomically (moto's own server does not: two writes could both pass
    // the check before either applied; `scripts/moto_atomic.py`), and the counter counts them
    let distinct: std::collections::BTreeSet<_> =
        applied.iter().filter_map(|v| v.as_n().ok()).collect();
    assert_eq!(
        distinct.len(),
        applied.len(),
        "a value read was written twice"
    );
    assert_eq!(counter(&aws.ddb, &table).await, applied.len().to_string());
}

/// The counter of the item `counter` in `table`, read consistently.
async fn counter(ddb: &aws_sdk_dynamodb::Client, table: &str) -> String {
    let item = ddb
        .get_item()
        .table_name(table)
        .key("job_id", AttributeValue::S("counter".into()))
        .consistent_read(true)
        .send()
        .await
        .expect("get");
    let n = item
        .item()
        .and_then(|i| i.get("n"))
        .and_then(|v| v.as_n().ok());
    n.expect("a counter").clone()
}
