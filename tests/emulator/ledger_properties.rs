//! Random sequences of ledger operations (claims, renewals, acceptances, releases, recovery
//! claims, decisions, cancels, expiries, creations, references; claims on first sight or after a read),
//! with current and stale epochs and clocks that jump, applied to the in-memory ledger and to DynamoDB on the emulator: the same
//! answer to every operation and the same items at the end. This keeps the fast fake honest.
//! A failure names the seed and the step, and `LEDGER_PROPERTY_SEED=<seed>` replays it alone.

use fenced_jobs::job::decision::SettleReason;
use fenced_jobs::job::{BlobRef, Expect, JobItem, JobState, NewJob, ResultBody};
use fenced_jobs::ledger::memory::InMemoryLedger;
use fenced_jobs::ledger::{
    AttemptEnd, CancelRequest, ClaimRequest, CreateRequest, DecideRequest, EndRequest,
    EnqueuedRequest, JobLedger, OperatorAction, RecordRefRequest, RecoverRequest, RenewRequest,
    SettleFrom, SettleRequest, Write,
};

use crate::support::{self, T};

const JOBS: [&str; 3] = ["a", "b", "c"];

/// One operation, on job `JOBS[job]`, with everything it needs but the id prefix.
#[derive(Debug, Clone)]
enum Op {
    Create(usize, NewJob),
    /// The last field: the claimant has seen no item (first sight), whatever the ledger holds.
    Claim(usize, NewJob, Expect, i64, bool),
    Finish(usize, u64, u32, i64, AttemptEnd),
    Settle(usize, SettleFrom, SettleReason, i64),
    Recover(usize, u64, i64),
    Renew(usize, u64, Option<i64>, i64),
    Decide(usize, u64, OperatorAction, i64),
    Cancel(usize, JobState, u64, i64),
    Enqueued(usize, i64),
    RecordRef(usize, u64, u32, i64),
}

fn new_job(digest: &str, max_attempts: u32, deadline_at: i64, metadata: bool) -> NewJob {
    // One job in three (those with a budget of two) keeps its input as an object.
    let stored = max_attempts == 2;
    NewJob {
        class: Default::default(),
        job_id: String::new(),
        input_digest: digest.into(),
        contract: "c".into(),
        input: if stored {
            String::new()
        } else {
            r#"{"model":"m","prompt":"p"}"#.into()
        },
        input_ref: stored.then(|| BlobRef {
            bucket: "results".into(),
            key: format!("inputs/j/{digest}.json"),
            size: 26,
            sha256: "e".repeat(64),
        }),
        metadata: metadata.then(|| r#"{"trace":"t"}"#.to_owned()),
        deadline_at,
        max_attempts,
        // Kept by the claim that creates the item, like the metadata.
        max_cost_micros: metadata.then_some(500_000),
        expires_at: deadline_at / 1000 + 86_400,
    }
}

/// A random operation, biased towards what the current item (from the in-memory ledger) would
/// accept, so that sequences go deep instead of being refused at once.
fn op(rng: &mut fastrand::Rng, now: i64, items: &[Option<JobItem>]) -> Op {
    let j = rng.usize(0..JOBS.len());
    let item = items[j].as_ref();
    let epoch = item.map_or(0, |r| r.owner_epoch);
    let attempts = item.map_or(0, |r| r.attempts);
    // Mostly the current values, sometimes stale or from the future.
    let pick_epoch = |rng: &mut fastrand::Rng| match rng.u8(0..10) {
        0 => epoch.saturating_sub(1),
        1 => epoch + 1,
        _ => epoch,
    };
    let job = new_job(
        if rng.u8(0..8) == 0 { "d2" } else { "d1" },
        rng.u32(1..=3),
        T + rng.i64(-60_000..600_000),
        rng.bool(),
    );
    match rng.u8(0..10) {
        0 => Op::Create(j, job),
        1 | 2 => {
            let e = pick_epoch(rng);
            let expect = Expect {
                epoch: e,
                attempts: if rng.bool() { attempts } else { e as u32 },
            };
            Op::Claim(j, job, expect, now, rng.bool())
        }
        3 | 4 => {
            let end = match rng.u8(0..6) {
                0 if rng.bool() => AttemptEnd::Succeeded {
                    result: format!("r{}", rng.u8(..)).into(),
                    finish: fenced_jobs::job::contract::Finish::Stop,
                },
                0 => AttemptEnd::Succeeded {
                    result: ResultBody::Stored(BlobRef {
                        bucket: "results".into(),
                        key: format!("results/j/{}/d.json", rng.u8(..)),
                        size: rng.u64(..1 << 40),
                        sha256: "d".repeat(64),
                    }),
                    finish: fenced_jobs::job::contract::Finish::Unknown,
                },
                1 if rng.bool() => AttemptEnd::Invalid {
                    rejected: fenced_jobs::job::contract::Rejected {
                        finish: fenced_jobs::job::contract::Finish::Length,
                        errors: vec!["the answer is cut off: finish length".into()],
                        excerpt: "{\"to".into(),
                        terminal: false,
                    },
                    last: rng.bool(),
                },
                1 => AttemptEnd::RetryAuthorized { error: "e".into() },
                2 => AttemptEnd::FailedTerminal {
                    kind: "permanent",
                    error: "e".into(),
                },
                3 => AttemptEnd::Unknown {
                    evidence: "cut off".into(),
                },
                4 => AttemptEnd::Replay {
                    evidence: "cut off".into(),
                    by: "replay-policy".into(),
                },
                5 if rng.bool() => AttemptEnd::Cancelled,
                _ => AttemptEnd::Expired,
            };
            // Mostly the current attempt; sometimes one the log does not have.
            let attempt = if rng.u8(0..8) == 0 {
                attempts + 1
            } else {
                attempts.max(1)
            };
            Op::Finish(j, pick_epoch(rng), attempt, now, end)
        }
        5 => {
            let from = match rng.u8(0..3) {
                0 => SettleFrom::Absent(Box::new(job)),
                1 => SettleFrom::PastDeadline,
                _ => SettleFrom::Seen {
                    state: item.map_or(JobState::Ready, |r| r.state),
                    epoch: pick_epoch(rng),
                },
            };
            let reason = if rng.bool() {
                SettleReason::DeadlinePassed
            } else {
                SettleReason::BudgetSpent
            };
            Op::Settle(j, from, reason, now)
        }
        6 => Op::Recover(j, pick_epoch(rng), now),
        7 => {
            // The lease as it stands, a stale one, or none (a hand-over).
            let until = item.and_then(|r| r.owner_until);
            let expected = match rng.u8(0..4) {
                0 => None,
                1 => until.map(|u| u - 1),
                _ => until,
            };
            Op::Renew(j, pick_epoch(rng), expected, now)
        }
        8 => {
            let action = if rng.bool() {
                OperatorAction::AuthorizeRetry
            } else {
                OperatorAction::Fail
            };
            if rng.bool() {
                // The state as it stands, or another one.
                let seen = match item {
                    Some(r) if rng.u8(0..4) > 0 => r.state,
                    _ => JobState::ALL[rng.usize(..JobState::ALL.len())],
                };
                Op::Cancel(j, seen, pick_epoch(rng), now)
            } else {
                Op::Decide(j, pick_epoch(rng), action, now)
            }
        }
        _ => {
            if rng.bool() {
                Op::Enqueued(j, now)
            } else {
                Op::RecordRef(j, pick_epoch(rng), attempts.max(1), now)
            }
        }
    }
}

async fn apply<L: JobLedger>(ledger: &L, prefix: &str, op: &Op) -> Write {
    let id = |j: &usize| format!("{prefix}{}", JOBS[*j]);
    let named = |j: &usize, job: &NewJob| NewJob {
        job_id: id(j),
        ..job.clone()
    };
    let written = match op {
        Op::Create(j, job) => {
            ledger
                .create(CreateRequest {
                    job: named(j, job),
                    now: job.deadline_at - 600_000,
                    enqueued: false,
                })
                .await
        }
        Op::Claim(j, job, expect, now, first_sight) => {
            ledger
                .claim(ClaimRequest {
                    job: named(j, job),
                    expect: *expect,
                    owner_id: format!("w{now}"),
                    now: *now,
                    lease_until: now + 30_000,
                    provider_ref: Some(format!("ref{now}")),
                    route: None,
                    first_sight: *first_sight,
                    // Some claims on a message SQS may drop, so both kinds of first claim
                    // meet every other write.
                    list_due: now % 3 == 0,
                })
                .await
        }
        Op::Finish(j, epoch, attempt, now, end) => {
            ledger
                .end(EndRequest {
                    job_id: id(j),
                    epoch: *epoch,
                    attempt: *attempt,
                    now: *now,
                    end: end.clone(),
                    usage: None,
                    input: None,
                })
                .await
        }
        Op::Settle(j, from, reason, now) => {
            let from = match from {
                SettleFrom::Absent(job) => SettleFrom::Absent(Box::new(named(j, job))),
                other => other.clone(),
            };
            ledger
                .settle(SettleRequest {
                    job_id: id(j),
                    from,
                    reason: *reason,
                    now: *now,
                })
                .await
        }
        Op::Recover(j, epoch, now) => {
            ledger
                .recover(RecoverRequest {
                    job_id: id(j),
                    seen_epoch: *epoch,
                    owner_id: format!("r{now}"),
                    now: *now,
                    lapsed_before: now - 2_000,
                    lease_until: now + 30_000,
                    reason: "lapsed".into(),
                    seen_recoveries: 0,
                    input: None,
                })
                .await
        }
        Op::Renew(j, epoch, expected_until, now) => {
            ledger
                .renew(RenewRequest {
                    job_id: id(j),
                    epoch: *epoch,
                    expected_until: *expected_until,
                    now: *now,
                    lease_until: now + 30_000,
                    progress: None,
                })
                .await
        }
        Op::Decide(j, epoch, action, now) => {
            ledger
                .decide(DecideRequest {
                    job_id: id(j),
                    epoch: *epoch,
                    action: *action,
                    by: "op".into(),
                    caller: None,
                    reason: "why".into(),
                    now: *now,
                })
                .await
        }
        Op::Cancel(j, seen, epoch, now) => {
            ledger
                .cancel(CancelRequest {
                    job_id: id(j),
                    seen: *seen,
                    epoch: *epoch,
                    by: "op".into(),
                    caller: None,
                    reason: "why".into(),
                    now: *now,
                })
                .await
        }
        Op::Enqueued(j, now) => {
            ledger
                .mark_enqueued(EnqueuedRequest {
                    job_id: id(j),
                    now: *now,
                })
                .await
        }
        Op::RecordRef(j, epoch, attempt, now) => {
            ledger
                .record_ref(RecordRefRequest {
                    job_id: id(j),
                    epoch: *epoch,
                    attempt: *attempt,
                    provider_ref: format!("resp{now}"),
                    now: *now,
                    // Half of them keep the input (a batch line a webhook announces): kept only
                    // where the item keeps none.
                    input: (now % 2 == 0).then(|| {
                        fenced_jobs::ledger::KeptInput::Inline(format!(r#"{{"kept":{now}}}"#))
                    }),
                })
                .await
        }
    };
    let mut written = written.expect("ledger call");
    // Compare items without the per-ledger prefix.
    if let Write::Applied(r) | Write::Refused(Some(r)) = &mut written {
        r.job_id = r.job_id.trim_start_matches(prefix).to_owned();
    }
    written
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_operation_sequences_get_the_same_answers_from_memory_and_dynamodb() {
    let aws = support::emulator().await;
    let table = aws.table().await;
    agree_on_random_sequences(&aws.ledger(&table)).await;
}

/// Random operation sequences (16 seeds, or `LEDGER_PROPERTY_SEED`) applied to `dynamo` and to
/// the in-memory ledger: the same answer at every step, the same items at the end.
pub(crate) async fn agree_on_random_sequences(dynamo: &impl JobLedger) {
    let seeds: Vec<u64> = match std::env::var("LEDGER_PROPERTY_SEED") {
        Ok(s) => vec![s.parse().expect("a seed")],
        Err(_) => (1..=16).collect(),
    };
    let mut applied = 0;
    for seed in seeds {
        let memory = InMemoryLedger::new();
        let mut rng = fastrand::Rng::with_seed(seed);
        let mut now = T - 120_000;
        let prefix = format!("s{seed}-");
        for step in 0..40 {
            now += match rng.u8(0..10) {
                0 => 120_000, // a jump past leases and some deadlines
                _ => rng.i64(0..5_000),
            };
            let mut items = Vec::new();
            for j in JOBS {
                items.push(memory.get(&format!("{prefix}{j}")).await.expect("get"));
            }
            let op = op(&mut rng, now, &items);
            let m = apply(&memory, &prefix, &op).await;
            let d = apply(dynamo, &prefix, &op).await;
            assert_eq!(
                m, d,
                "seed {seed}, step {step}: {op:?}\nreplay: LEDGER_PROPERTY_SEED={seed}"
            );
            applied += usize::from(matches!(m, Write::Applied(_)));
        }
        for j in JOBS {
            let id = format!("{prefix}{j}");
            let m = memory.get(&id).await.expect("get");
            let d = dynamo.get(&id).await.expect("get");
            assert_eq!(m, d, "seed {seed}: final item {j}");
        }
    }
    // The sequences went somewhere: a good share of the operations were applied.
    assert!(applied > 100, "only {applied} operations applied");
}
