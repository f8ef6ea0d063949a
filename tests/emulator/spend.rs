//! The deployment's spend per day, on the emulator's table, with a clock the test moves: a
//! call the day cannot take waits for the next day, never failed, and the day counts what calls
//! cost.

use std::sync::Arc;

use fenced_jobs::clock::{Clock, ManualClock};
use fenced_jobs::job::{Failure, JobState, RecordOutcome};
use fenced_jobs::ledger::JobLedger;
use fenced_jobs::ledger::dynamodb::DynamoLedger;
use fenced_jobs::provider::SimulatedProvider;
use fenced_jobs::worker::processor::{Invocation, Processor};
use serde_json::json;

use crate::support::{self, NoWatch, emulator, fast_settings};

/// 2026-12-01T23:00:00Z: an hour before the next day.
pub(crate) const LATE_EVENING: i64 = 1_796_166_000_000;

fn job(id: &str) -> fenced_jobs::job::JobMessage {
    tenant_job(id, None)
}

fn tenant_job(id: &str, tenant: Option<&str>) -> fenced_jobs::job::JobMessage {
    let input =
        json!({"model": "sim-1", "prompt": "Summarise.", "parameters": {"max_tokens": 100}});
    job_with(id, tenant, input)
}

pub(crate) fn job_with(
    id: &str,
    tenant: Option<&str>,
    input: serde_json::Value,
) -> fenced_jobs::job::JobMessage {
    let body = json!({
        "job_id": id,
        "tenant": tenant,
        "contract": "summary.v1",
        "deadline_at": "2026-12-04T00:00:00Z",
        "input": input,
    });
    fenced_jobs::job::parse_body(Some(&body.to_string())).expect("a valid job")
}

/// A job of sim-1 whose calls the simulated provider answers with `simulate`, its input as long
/// as [`job`]'s (so that its call reserves as much).
fn refused_job(id: &str, simulate: serde_json::Value) -> fenced_jobs::job::JobMessage {
    job_with(
        id,
        None,
        json!({"model": "sim-1", "prompt": "Summarise.", "parameters": {"max_tokens": 100},
               "simulate": simulate}),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_days_limit_records_wait_for_the_next_day_and_then_run() {
    // GIVEN a deployment whose calls may cost a day what one call at the most (its input at
    // four bytes a token and 100 tokens out at sim-1's $1 and $4 a million) and 20
    // micro-dollars more, the day's spend kept in the ledger table
    let aws = emulator().await;
    let table = aws.table().await;
    let first = job("day-1");
    let most = (first.input_canonical.len() as u64).div_ceil(4) + 4 * 100;
    let settings = fenced_jobs::worker::Settings {
        daily_spend_limit_micros: Some(most + 20),
        ..fast_settings()
    };
    let ledger: DynamoLedger = aws.ledger(&table);
    let (processor, inv) = late_evening(&ledger, settings);

    // WHEN one job runs, and a second is delivered the same evening
    let done = processor.process(&first, "w/1", &inv, &NoWatch).await;
    assert_eq!(done.outcome, RecordOutcome::Done(JobState::Succeeded));
    let second = job("day-2");
    let waited = processor.process(&second, "w/2", &inv, &NoWatch).await;

    // THEN the second waits for the next day (an hour away), its job untouched: the first's
    // call cost less than it reserved, but what it cost and the most the second's can cost pass
    // the limit
    let RecordOutcome::Failed(Failure::Paced { wait_ms }) = waited.outcome else {
        panic!("paced for the next day: {:?}", waited.outcome);
    };
    assert_eq!(wait_ms, 3_600_000);
    let untouched = ledger
        .get("day-2")
        .await
        .expect("get")
        .expect("the item to wait in");
    assert_eq!((untouched.state, untouched.attempts), (JobState::Ready, 0));
    let cost = cost_of(&ledger, "day-1").await;
    assert!(cost < most, "{cost} of {most}");
    assert_eq!(day_spent(&aws, &table, "2026-12-01").await, cost);
    assert_eq!(processor.provider().executions(), 1);

    // AND once the day has turned, it runs
    processor.clock().advance(3_600_000);
    assert!(processor.clock().now_ms() >= LATE_EVENING + 3_600_000);
    let next_day = processor.process(&second, "w/3", &inv, &NoWatch).await;
    assert_eq!(next_day.outcome, RecordOutcome::Done(JobState::Succeeded));
    assert_eq!(processor.provider().executions(), 2);
    let second_cost = cost_of(&ledger, "day-2").await;
    assert_eq!(day_spent(&aws, &table, "2026-12-02").await, second_cost);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_one_tenants_limit_its_records_wait_while_another_tenants_run() {
    // GIVEN a limit per tenant of one call at the most and 20 micro-dollars more, and none for
    // the deployment
    let aws = emulator().await;
    let table = aws.table().await;
    let first = tenant_job("acme-1", Some("acme"));
    let most = (first.input_canonical.len() as u64).div_ceil(4) + 4 * 100;
    let settings = fenced_jobs::worker::Settings {
        tenant_daily_spend_limit_micros: Some(most + 20),
        ..fast_settings()
    };
    let ledger: DynamoLedger = aws.ledger(&table);
    let (processor, inv) = late_evening(&ledger, settings);

    // WHEN acme's first job runs, then acme's second and another tenant's are delivered
    let done = processor.process(&first, "w/1", &inv, &NoWatch).await;
    assert_eq!(done.outcome, RecordOutcome::Done(JobState::Succeeded));
    let acme = processor
        .process(&tenant_job("acme-2", Some("acme")), "w/2", &inv, &NoWatch)
        .await;
    let globex = processor
        .process(
            &tenant_job("globex-1", Some("globex")),
            "w/3",
            &inv,
            &NoWatch,
        )
        .await;

    // THEN acme's second waits for the next day, the other tenant's runs, and each tenant's
    // day item holds what its calls cost
    assert!(
        matches!(
            acme.outcome,
            RecordOutcome::Failed(Failure::Paced { wait_ms: 3_600_000 })
        ),
        "{:?}",
        acme.outcome
    );
    assert_eq!(globex.outcome, RecordOutcome::Done(JobState::Succeeded));
    assert_eq!(processor.provider().executions(), 2);
    assert_eq!(
        day_spent(&aws, &table, "2026-12-01#acme").await,
        cost_of(&ledger, "acme-1").await
    );
    assert_eq!(
        day_spent(&aws, &table, "2026-12-01#globex").await,
        cost_of(&ledger, "globex-1").await
    );
    let item = ledger.get("acme-1").await.expect("get").expect("item");
    assert_eq!(item.class.tenant.as_deref(), Some("acme"));
}

/// `tenant_job`'s job `id`, sent by `producer` (its id scoped as the worker scopes it).
pub(crate) fn producers_job(
    producer: &str,
    id: &str,
    tenant: Option<&str>,
) -> fenced_jobs::job::JobMessage {
    let mut msg = tenant_job(id, tenant);
    msg.job_id = format!("{producer}/{id}");
    msg
}

/// The most one call of [`tenant_job`]'s jobs can cost: its input at four bytes a token and
/// 100 tokens out, at sim-1's $1 and $4 a million.
fn most_of_one_call() -> u64 {
    let job = tenant_job("any", None);
    (job.input_canonical.len() as u64).div_ceil(4) + 4 * 100
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_day_is_its_producers_and_a_job_without_a_tenant_has_one_too() {
    // GIVEN a limit of one call at the most a day per account (a producer's tenant)
    let aws = emulator().await;
    let table = aws.table().await;
    let settings = fenced_jobs::worker::Settings {
        tenant_daily_spend_limit_micros: Some(most_of_one_call() + 20),
        ..fast_settings()
    };
    let ledger: DynamoLedger = aws.ledger(&table);
    let (processor, inv) = late_evening(&ledger, settings);
    let run = |msg, owner| run_job(&processor, &inv, msg, owner);
    let first = producers_job("billing", "acme-1", Some("acme"));
    let done = RecordOutcome::Done(JobState::Succeeded);
    let next_day = RecordOutcome::Failed(Failure::Paced { wait_ms: 3_600_000 });

    // WHEN billing's acme spends its day, and search labels a job acme too
    assert_eq!(run(first, "w/1").await, done);
    let again = producers_job("billing", "acme-2", Some("acme"));
    assert_eq!(run(again, "w/2").await, next_day);
    // THEN search's acme is search's own account: it runs
    let search = producers_job("search", "acme-1", Some("acme"));
    assert_eq!(run(search, "w/3").await, done);

    // WHEN billing leaves the tenant out: its `(none)` account, capped as a tenant is
    assert_eq!(
        run(producers_job("billing", "n-1", None), "w/4").await,
        done
    );
    let unlabelled = producers_job("billing", "n-2", None);
    assert_eq!(run(unlabelled, "w/5").await, next_day);

    // AND each account's day item holds what its own calls cost
    let cost = |id: &'static str| cost_of(&ledger, id);
    let day = |key: &'static str| day_spent(&aws, &table, key);
    let acme = cost("billing/acme-1").await;
    assert_eq!(day("2026-12-01#billing/acme").await, acme);
    let search_acme = cost("search/acme-1").await;
    assert_eq!(day("2026-12-01#search/acme").await, search_acme);
    let none = cost("billing/n-1").await;
    assert_eq!(day("2026-12-01#billing/(none)").await, none);
    assert_eq!(processor.provider().executions(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_one_producers_limit_its_records_wait_while_another_producers_run() {
    // GIVEN a limit of one call at the most a day per producer, and none per tenant
    let aws = emulator().await;
    let table = aws.table().await;
    let settings = fenced_jobs::worker::Settings {
        producer_daily_spend_limit_micros: Some(most_of_one_call() + 20),
        ..fast_settings()
    };
    let ledger: DynamoLedger = aws.ledger(&table);
    let (processor, inv) = late_evening(&ledger, settings);
    let run = |msg, owner| run_job(&processor, &inv, msg, owner);
    let first = producers_job("billing", "acme-1", Some("acme"));

    // WHEN billing's first job spends its day, then billing's job of another tenant and
    // search's come
    assert_eq!(
        run(first, "w/1").await,
        RecordOutcome::Done(JobState::Succeeded)
    );
    let billing = producers_job("billing", "globex-1", Some("globex"));
    let search = producers_job("search", "globex-1", Some("globex"));
    let (billing, search) = (run(billing, "w/2").await, run(search, "w/3").await);

    // THEN billing's waits for the next day whatever its tenant, and search's runs: one
    // producer's spent day defers no other producer's records
    assert_eq!(
        billing,
        RecordOutcome::Failed(Failure::Paced { wait_ms: 3_600_000 })
    );
    assert_eq!(search, RecordOutcome::Done(JobState::Succeeded));
    let day = |key: &'static str| day_spent(&aws, &table, key);
    let billing_cost = cost_of(&ledger, "billing/acme-1").await;
    assert_eq!(day("2026-12-01#producer#billing").await, billing_cost);
    let search_cost = cost_of(&ledger, "search/globex-1").await;
    assert_eq!(day("2026-12-01#producer#search").await, search_cost);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_refused_before_any_work_gives_the_day_what_it_reserved() {
    // GIVEN a day that can take one call at the most, and jobs whose calls the provider
    // refuses before any work: one for good (a 400), one once (its rate limit)
    let aws = emulator().await;
    let table = aws.table().await;
    let refused = refused_job("refused-1", json!({"outcome": "permanent"}));
    let once = refused_job("refused-2", json!({"fail_times": 1}));
    let most = (once.input_canonical.len() as u64).div_ceil(4) + 4 * 100;
    let settings = fenced_jobs::worker::Settings {
        daily_spend_limit_micros: Some(most + 20),
        ..fast_settings()
    };
    let ledger: DynamoLedger = aws.ledger(&table);
    let (processor, inv) = late_evening(&ledger, settings);

    // WHEN each is delivered, the second twice
    let failed = processor.process(&refused, "w/1", &inv, &NoWatch).await;
    let first = processor.process(&once, "w/2", &inv, &NoWatch).await;
    let second = processor.process(&once, "w/3", &inv, &NoWatch).await;

    // THEN the refusals cost the day nothing, so the retry found room for its call, and the
    // day holds what the one answered call cost, as the jobs' items do
    assert_eq!(
        failed.outcome,
        RecordOutcome::Done(JobState::FailedTerminal)
    );
    assert!(
        matches!(
            first.outcome,
            RecordOutcome::Failed(Failure::Backoff { .. })
        ),
        "{:?}",
        first.outcome
    );
    assert_eq!(second.outcome, RecordOutcome::Done(JobState::Succeeded));
    assert_eq!(processor.provider().executions(), 3);
    let cost = cost_of(&ledger, "refused-2").await;
    assert_eq!(day_spent(&aws, &table, "2026-12-01").await, cost);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_a_spend_limit_a_model_without_a_price_is_never_called_unless_allowed() {
    // GIVEN a day's limit, and a job of a model the price table lacks
    let aws = emulator().await;
    let table = aws.table().await;
    let input = json!({"model": "sim-unpriced", "prompt": "Summarise.",
                       "parameters": {"max_tokens": 100}});
    let unpriced = job_with("unpriced-1", None, input);
    let limited = fenced_jobs::worker::Settings {
        daily_spend_limit_micros: Some(1_000_000),
        ..fast_settings()
    };
    let ledger: DynamoLedger = aws.ledger(&table);
    let (processor, inv) = late_evening(&ledger, limited.clone());

    // WHEN it is delivered
    let waited = processor.process(&unpriced, "w/1", &inv, &NoWatch).await;

    // THEN no call is made: the record waits a quarter of an hour for a price, its job kept
    // `ready` (its deadline fixed, its message re-sent if lost)
    assert_eq!(
        waited.outcome,
        RecordOutcome::Failed(Failure::Paced { wait_ms: 900_000 })
    );
    assert_eq!(processor.provider().executions(), 0);
    let item = ledger.get("unpriced-1").await.expect("get").expect("item");
    assert_eq!((item.state, item.attempts), (JobState::Ready, 0));

    // AND a deployment that allows unpriced models runs it, the day counting nothing for it
    let allowed = fenced_jobs::worker::Settings {
        allow_unpriced_models: true,
        ..limited
    };
    let (processor, inv) = late_evening(&ledger, allowed);
    let done = processor.process(&unpriced, "w/2", &inv, &NoWatch).await;
    assert_eq!(done.outcome, RecordOutcome::Done(JobState::Succeeded));
    assert_eq!(processor.provider().executions(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_priority_call_is_paid_at_priority_prices_and_is_unpriced_without_them() {
    use fenced_jobs::job::prices::{PriceTable, Rate};
    // GIVEN a day's limit, jobs that ask for the priority tier, and a price table with sim-1's
    // priority prices (twice its on-demand ones)
    let aws = emulator().await;
    let table = aws.table().await;
    let priority = |id: &str| {
        let input = json!({"model": "sim-1", "prompt": "Summarise.",
                           "parameters": {"max_tokens": 100, "service_tier": "priority"}});
        job_with(id, None, input)
    };
    let prices = PriceTable::parse(
        r#"{"models": {"sim-1": {"input": 1.0, "output": 4.0,
                                 "priority_input": 2.0, "priority_output": 8.0}}}"#,
    )
    .expect("prices");
    let any_parameter = fenced_jobs::job::policy::Policy {
        parameters: None,
        ..fenced_jobs::job::policy::Policy::default()
    };
    let settings = fenced_jobs::worker::Settings {
        daily_spend_limit_micros: Some(1_000_000),
        policy: any_parameter,
        prices: Arc::new(prices.clone()),
        ..fast_settings()
    };
    let ledger: DynamoLedger = aws.ledger(&table);
    let (processor, inv) = late_evening(&ledger, settings.clone());

    // WHEN one runs
    let done = processor
        .process(&priority("tier-1"), "w/1", &inv, &NoWatch)
        .await;

    // THEN it is paid at the priority prices, by the job and the day alike
    assert_eq!(done.outcome, RecordOutcome::Done(JobState::Succeeded));
    let item = ledger.get("tier-1").await.expect("get").expect("item");
    let used = item.usage().expect("usage");
    let cost = used.cost_micros.expect("priced");
    assert_eq!(Some(cost), prices.cost_at("sim-1", &used, Rate::Priority));
    assert!(
        cost > prices
            .cost_at("sim-1", &used, Rate::Standard)
            .expect("standard")
    );
    assert_eq!(day_spent(&aws, &table, "2026-12-01").await, cost);

    // AND under the built-in table, which gives no priority prices, it is never called
    let built_in = fenced_jobs::worker::Settings {
        prices: Arc::default(),
        ..settings
    };
    let (processor, inv) = late_evening(&ledger, built_in);
    let waited = processor
        .process(&priority("tier-2"), "w/2", &inv, &NoWatch)
        .await;
    assert_eq!(
        waited.outcome,
        RecordOutcome::Failed(Failure::Paced { wait_ms: 900_000 })
    );
    assert_eq!(processor.provider().executions(), 0);
}

#[test]
fn start_up_finds_each_model_the_deployment_may_call_that_has_no_price() {
    use fenced_jobs::job::policy::Policy;
    use fenced_jobs::ledger::memory::InMemoryLedger;
    use fenced_jobs::protocol::routing::ModelMap;
    let processor = |allowed: &str, map: &str| {
        let settings = fenced_jobs::worker::Settings {
            policy: Policy {
                models: Policy::parse_models(allowed).expect("models"),
                ..Policy::default()
            },
            ..fast_settings()
        };
        Processor::new(
            InMemoryLedger::new(),
            SimulatedProvider::new(),
            ManualClock::at(0),
            settings,
        )
        .with_models(ModelMap::parse("SIMULATED_MODELS", map).expect("map"))
    };
    // Jobs name `small` (run as sim-1, priced), `big` (run as a model nobody priced) and sim-1.
    let listed = processor("small, big, sim-1", "small=sim-1, big=sim-huge");
    assert_eq!(
        listed.unpriced_models(),
        (vec!["sim-huge".to_owned()], false)
    );
    // Any model: the map's are checked, and the rest cannot be named before a job names them.
    let open = processor("*", "big=sim-huge");
    assert_eq!(open.unpriced_models(), (vec!["sim-huge".to_owned()], true));
    // Any model, every one mapped to a priced one.
    let mapped = processor("*", "*=sim-1");
    assert_eq!(mapped.unpriced_models(), (Vec::new(), false));
}

/// A processor whose clock stands an hour before the next day, its days' spend in `ledger`'s
/// table, and an invocation with no deadline.
/// What processing `msg` as the delivery `owner` came to.
pub(crate) async fn run_job(
    processor: &Processor<DynamoLedger, SimulatedProvider, ManualClock>,
    inv: &Invocation,
    msg: fenced_jobs::job::JobMessage,
    owner: &str,
) -> RecordOutcome {
    processor.process(&msg, owner, inv, &NoWatch).await.outcome
}

pub(crate) fn late_evening(
    ledger: &DynamoLedger,
    settings: fenced_jobs::worker::Settings,
) -> (
    Processor<DynamoLedger, SimulatedProvider, ManualClock>,
    Invocation,
) {
    let processor = Processor::new(
        ledger.clone(),
        SimulatedProvider::new(),
        ManualClock::at(LATE_EVENING),
        settings,
    )
    .with_spend_budget(Arc::new(ledger.clone()));
    let inv = Invocation {
        id: "spend".into(),
        deadline: None,
    };
    (processor, inv)
}

/// What the job's attempts cost, as its item records them.
pub(crate) async fn cost_of(ledger: &DynamoLedger, job_id: &str) -> u64 {
    ledger
        .get(job_id)
        .await
        .expect("get")
        .expect("item")
        .usage()
        .and_then(|u| u.cost_micros)
        .expect("priced")
}

/// What the day's item in the table says was spent.
async fn day_spent(aws: &support::Emulator, table: &str, day: &str) -> u64 {
    let item = aws
        .ddb
        .get_item()
        .table_name(table)
        .key(
            "job_id",
            aws_sdk_dynamodb::types::AttributeValue::S(format!("#spend#{day}")),
        )
        .consistent_read(true)
        .send()
        .await
        .expect("get")
        .item
        .expect("the day's item");
    // The item expires 40 days after its last write (the test's clock stands on its day): a
    // month's days are there until the next month ends.
    let expires: i64 = item["expires_at"]
        .as_n()
        .expect("a TTL")
        .parse()
        .expect("seconds");
    let day_start = LATE_EVENING / 1_000 - 23 * 3_600;
    assert!(
        (day_start + 40 * 86_400..=day_start + 42 * 86_400).contains(&expires),
        "{expires}"
    );
    item["spent_micros"]
        .as_n()
        .expect("a number")
        .parse()
        .expect("an integer")
}
