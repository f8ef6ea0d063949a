//! The provider's rate limit in memory, on a clock the test moves: a job refused by 429s again
//! and again still has its whole budget, calls sent again after 429s keep to the limit the 429s
//! lowered, and a tenant capped at half the pace leaves the other half to another tenant.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use fenced_jobs::clock::{Clock, ManualClock};
use fenced_jobs::job::{Failure, JobState, Millis, RecordOutcome, parse_body};
use fenced_jobs::ledger::JobLedger;
use fenced_jobs::ledger::memory::InMemoryLedger;
use fenced_jobs::ledger::schedule::{CallSchedule, Limits, MemorySchedule};
use fenced_jobs::provider::{Answer, Provider, ProviderError, ProviderRequest};
use fenced_jobs::worker::Settings;
use fenced_jobs::worker::processor::{Invocation, Processor};

use crate::support::{self, NoWatch, T};

/// One clock for the test and the processor.
#[derive(Clone)]
struct SharedClock(Arc<ManualClock>);

impl Clock for SharedClock {
    fn now_ms(&self) -> Millis {
        self.0.now_ms()
    }
}

/// A provider at its rate limit for the first `refusals` calls, then answering.
struct Limited {
    refusals: u32,
    calls: AtomicU32,
}

impl Provider for Limited {
    async fn call(&self, req: &ProviderRequest<'_>) -> Result<Answer, ProviderError> {
        let n = self.calls.fetch_add(1, Ordering::Relaxed);
        if n < self.refusals {
            return Err(ProviderError::Throttled {
                retry_after_ms: Some(60_000),
                reason: "HTTP 429 rate_limit_exceeded".into(),
            });
        }
        Ok(Answer {
            body: format!(r#"{{"job":"{}"}}"#, req.job_id),
            provider_ref: None,
            finish: fenced_jobs::job::contract::Finish::Stop,
            usage: None,
            model: None,
            response_id: None,
        })
    }
}

#[tokio::test]
async fn a_job_refused_by_429s_more_often_than_its_budget_still_runs_and_counts_them() {
    let ledger = Arc::new(InMemoryLedger::new());
    let clock = SharedClock(Arc::new(ManualClock::at(T)));
    let provider = Limited {
        refusals: 3,
        calls: AtomicU32::new(0),
    };
    let processor = Processor::new(
        Arc::clone(&ledger),
        provider,
        clock.clone(),
        Settings::default(),
    );
    let msg = parse_body(Some(
        r#"{"job_id":"busy","contract":"summary.v1","max_attempts":1,"input":{"model":"m","prompt":"p"}}"#,
    ))
    .expect("valid");
    let inv = Invocation {
        id: "inv".into(),
        deadline: None,
    };
    let mut outcomes = Vec::new();
    for delivery in 0..4 {
        let processed = processor
            .process(&msg, &format!("w{delivery}"), &inv, &NoWatch)
            .await;
        outcomes.push(processed.outcome);
        // The wait the provider asked for (60 s, past the in-process horizon) passes.
        clock.0.advance(61_000);
    }
    // Given back, each refused delivery waits for capacity (the provider's Retry-After), not a
    // backoff that grows with the receives.
    let labels: Vec<&str> = outcomes.iter().map(RecordOutcome::label).collect();
    assert_eq!(labels, ["paced", "paced", "paced", "succeeded"]);
    assert_eq!(
        outcomes[0],
        RecordOutcome::Failed(Failure::Paced { wait_ms: 60_000 })
    );
    let item = ledger.get("busy").await.expect("get").expect("item");
    assert_eq!(item.state, JobState::Succeeded);
    assert_eq!(
        (item.attempts, item.max_attempts, item.throttles),
        (1, 1, 3)
    );
    assert!(matches!(
        processor
            .process(&msg, "late", &inv, &NoWatch)
            .await
            .outcome,
        RecordOutcome::Done(JobState::Succeeded)
    ));
    // The environment's adaptive limit was halved by each refusal and grew back by the answer.
    assert!(processor.pacer().limit() < 16.0);
}

/// A provider refusing every call of its first round for its rate limit (a short
/// `Retry-After`), then answering slowly; it counts the calls running at once in each round.
struct Crowded {
    round_size: u32,
    calls: AtomicU32,
    running: AtomicU32,
    most_after_refusals: AtomicU32,
}

impl Provider for Crowded {
    async fn call(&self, req: &ProviderRequest<'_>) -> Result<Answer, ProviderError> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst);
        if n < self.round_size {
            // All of the first round are in flight together before they are refused.
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            return Err(ProviderError::Throttled {
                retry_after_ms: Some(200),
                reason: "HTTP 429 rate_limit_exceeded".into(),
            });
        }
        let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_after_refusals.fetch_max(now, Ordering::SeqCst);
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        self.running.fetch_sub(1, Ordering::SeqCst);
        Ok(Answer {
            body: format!(r#"{{"job":"{}"}}"#, req.job_id),
            provider_ref: None,
            finish: fenced_jobs::job::contract::Finish::Stop,
            usage: None,
            model: None,
            response_id: None,
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_sent_again_after_429s_keep_to_the_limit_the_429s_lowered() {
    // GIVEN a batch of ten records whose ten calls, sent together, are all refused for the
    // rate limit with a short Retry-After (so each is sent again under its claim)
    let provider = Crowded {
        round_size: 10,
        calls: AtomicU32::new(0),
        running: AtomicU32::new(0),
        most_after_refusals: AtomicU32::new(0),
    };
    let mut settings = Settings::default();
    settings.pacing.max_in_flight = 10;
    let pacer = fenced_jobs::worker::pacing::Pacer::new(settings.pacing(), None);
    let handler = fenced_jobs::worker::BatchHandler::new(
        Processor::new(
            Arc::new(InMemoryLedger::new()),
            provider,
            fenced_jobs::clock::SystemClock,
            settings,
        )
        .with_pacer(pacer),
        fenced_jobs::queue::RecordingVisibility::new(),
    );
    let records = (0..10)
        .map(|i| {
            let mut m = aws_lambda_events::sqs::SqsMessage::default();
            m.message_id = Some(format!("m{i}"));
            m.receipt_handle = Some(format!("h{i}"));
            m.body = Some(support::job(&format!("crowd-{i}"), "p", ""));
            m.event_source_arn = Some("arn:aws:sqs:us-east-1:123456789012:q".into());
            m
        })
        .collect();
    let mut event = aws_lambda_events::sqs::SqsEvent::default();
    event.records = records;
    let inv = Invocation {
        id: "inv".into(),
        deadline: Some(fenced_jobs::clock::SystemClock.now_ms() + 60_000),
    };
    // WHEN the batch runs
    let report = handler.handle_batch(&event, &inv).await;
    // THEN every job succeeded, and the calls sent again never ran more than five at once:
    // the limit the refusals halved holds for them, instead of all ten going again together
    assert!(
        report.records.iter().all(|r| r.outcome.is_success()),
        "{report:?}"
    );
    let provider = handler.processor().provider();
    assert_eq!(provider.calls.load(Ordering::SeqCst), 20);
    let most = provider.most_after_refusals.load(Ordering::SeqCst);
    assert!(
        (1..=5).contains(&most),
        "{most} calls at once after the refusals"
    );
}

#[tokio::test]
async fn a_tenant_capped_at_half_the_pace_leaves_the_other_half_to_another_tenant() {
    for (percent, other_runs) in [(50, true), (100, false)] {
        // GIVEN 1,200 requests a minute, a horizon of 0.2 s, and tenants capped at `percent`
        let processor = capped(percent, 100);

        // WHEN one tenant's jobs run until the pace turns one away, then another's comes
        let bulk = run_before_paced(&processor, ("", Some("bulk"), false), 20).await;
        let other = run_before_paced(&processor, ("", Some("other"), false), 1).await;

        // THEN the capped tenant stopped at its share, and the other tenant's job ran; uncapped,
        // the first tenant took the whole horizon and the other waits behind it
        assert!(bulk < 20, "{percent} %: never paced");
        assert_eq!(other == 1, other_runs, "{percent} %: bulk ran {bulk}");
    }
}

/// A processor whose tenants are capped at half of 1,200 requests a minute, over a horizon of
/// 0.2 s.
fn half_per_account()
-> Processor<InMemoryLedger, fenced_jobs::provider::SimulatedProvider, ManualClock> {
    capped(50, 100)
}

/// A processor whose accounts are capped at `tenant` percent, and producers at `producer`
/// percent, of 1,200 requests a minute, over a horizon of 0.2 s.
fn capped(
    tenant: u8,
    producer: u8,
) -> Processor<InMemoryLedger, fenced_jobs::provider::SimulatedProvider, ManualClock> {
    let mut settings = Settings::default();
    settings.pacing.limits = Limits { rpm: 1_200, tpm: 0 };
    settings.pacing.horizon_ms = 200;
    settings.pacing.chunk = 1;
    settings.tenant_pacing_percent = tenant;
    settings.producer_pacing_percent = producer;
    let schedule: Arc<dyn CallSchedule> = Arc::new(MemorySchedule::new());
    Processor::new(
        InMemoryLedger::new(),
        fenced_jobs::provider::SimulatedProvider::new(),
        ManualClock::at(1_800_000_000_000),
        settings.clone(),
    )
    .with_pacer(fenced_jobs::worker::pacing::Pacer::new(
        settings.pacing(),
        Some(Arc::clone(&schedule)),
    ))
    .with_tenant_schedule(schedule)
}

/// How many jobs of `producer` (empty: the unnamed one), labelled `tenant` (if any) and
/// `urgent`, run before the pace turns one away, of at most `most`.
async fn run_before_paced(
    processor: &Processor<InMemoryLedger, fenced_jobs::provider::SimulatedProvider, ManualClock>,
    (producer, tenant, urgent): (&str, Option<&str>, bool),
    most: usize,
) -> usize {
    let inv = Invocation {
        id: "accounts".into(),
        deadline: None,
    };
    for i in 0..most {
        let body = serde_json::json!({
            "job_id": format!("{}-{i}", tenant.unwrap_or("none")),
            "tenant": tenant,
            "priority": if urgent { "urgent" } else { "normal" },
            "contract": "c",
            "input": {"model": "m", "prompt": "p"},
        });
        let mut msg = parse_body(Some(&body.to_string())).expect("valid");
        if !producer.is_empty() {
            // As the worker scopes it: the job in its producer's namespace.
            msg.job_id = format!("{producer}/{}", msg.job_id);
        }
        let owner = format!("w/{}", msg.job_id);
        let done = processor.process(&msg, &owner, &inv, &NoWatch).await;
        if matches!(done.outcome, RecordOutcome::Failed(Failure::Paced { .. })) {
            return i;
        }
    }
    most
}

#[tokio::test]
async fn a_tenants_share_is_its_producers_and_neither_an_unlabelled_nor_an_urgent_job_escapes_it() {
    // GIVEN tenants capped at half the pace, each account its own share
    // WHEN billing's jobs labelled acme run until paced, then search's acme
    let p = half_per_account();
    let billing = run_before_paced(&p, ("billing", Some("acme"), false), 20).await;
    let search = run_before_paced(&p, ("search", Some("acme"), false), 1).await;
    // THEN billing stopped at its share and search's acme is another account: it runs
    assert!(billing < 20, "billing's acme never paced");
    assert_eq!(search, 1, "search's acme shares billing's share");

    // WHEN billing leaves the tenant out, the jobs are its `(none)` account's: capped too
    let p = half_per_account();
    let unlabelled = run_before_paced(&p, ("billing", None, false), 20).await;
    let other = run_before_paced(&p, ("search", None, false), 1).await;
    assert!(unlabelled < 20, "unlabelled jobs escape the cap");
    assert_eq!(other, 1, "billing's unlabelled jobs took the whole pace");

    // WHEN billing's acme jobs are urgent: the urgent right of way is no way past the cap
    let p = half_per_account();
    let urgent = run_before_paced(&p, ("billing", Some("acme"), true), 20).await;
    let other = run_before_paced(&p, ("search", Some("acme"), false), 1).await;
    assert!(urgent < 20, "urgent jobs escape the cap");
    assert_eq!(other, 1, "billing's urgent jobs took the whole pace");
}

#[tokio::test]
async fn a_producer_that_names_a_new_tenant_for_each_job_stays_within_its_own_share() {
    for (producer_percent, steady_runs) in [(50, true), (100, false)] {
        // GIVEN accounts capped at a third of the pace and producers at `producer_percent`
        let p = capped(34, producer_percent);
        // WHEN one producer names a new tenant for each job until the pace turns one away
        let inv = Invocation {
            id: "rotating".into(),
            deadline: None,
        };
        let mut ran = 0;
        for i in 0..40 {
            let body = serde_json::json!({"job_id": format!("j{i}"), "tenant": format!("t{i}"),
                "contract": "c", "input": {"model": "m", "prompt": "p"}});
            let mut msg = parse_body(Some(&body.to_string())).expect("valid");
            msg.job_id = format!("bulk/{}", msg.job_id);
            let done = p.process(&msg, &format!("w/{i}"), &inv, &NoWatch).await;
            if matches!(done.outcome, RecordOutcome::Failed(Failure::Paced { .. })) {
                break;
            }
            ran += 1;
        }
        // THEN with the producer capped it stops at its share, and another producer's job
        // runs; uncapped, its new tenants take the whole pace
        let steady = run_before_paced(&p, ("steady", Some("t0"), false), 1).await;
        assert_eq!(
            steady == 1,
            steady_runs,
            "{producer_percent} %: the rotating producer ran {ran}"
        );
    }
}
