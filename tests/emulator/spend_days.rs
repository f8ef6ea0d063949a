//! The day's spend read back: the day items count alike on DynamoDB, on a second
//! implementation and in memory, and `jobctl spend` shows each level's items by model, with
//! what calls not charged yet hold.

use fenced_jobs::job::JobState;
use fenced_jobs::job::RecordOutcome;
use fenced_jobs::ledger::dynamodb::DynamoLedger;
use serde_json::json;

use crate::spend::{LATE_EVENING, cost_of, job_with, late_evening, producers_job, run_job};
use crate::support::{emulator, fast_settings};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobctl_spend_shows_the_day_by_producer_account_and_model_with_what_is_held() {
    // GIVEN a limit at every level, two producers' jobs of two models, and a call of billing's
    // still running (its reservation held, not charged)
    let aws = emulator().await;
    let table = aws.table().await;
    let limit = 1_000_000;
    let settings = fenced_jobs::worker::Settings {
        daily_spend_limit_micros: Some(limit),
        producer_daily_spend_limit_micros: Some(limit),
        tenant_daily_spend_limit_micros: Some(limit),
        ..fast_settings()
    };
    let ledger: DynamoLedger = aws.ledger(&table);
    let (processor, inv) = late_evening(&ledger, settings);
    let run = |msg, owner| run_job(&processor, &inv, msg, owner);
    let done = RecordOutcome::Done(JobState::Succeeded);
    assert_eq!(
        run(producers_job("billing", "a-1", Some("acme")), "w/1").await,
        done
    );
    let mini = json!({"model": "gpt-4o-mini", "prompt": "Summarise.",
                      "parameters": {"max_tokens": 100}});
    let mut other_model = job_with("a-2", Some("acme"), mini);
    other_model.job_id = "billing/a-2".into();
    assert_eq!(run(other_model, "w/2").await, done);
    assert_eq!(
        run(producers_job("search", "a-1", Some("acme")), "w/3").await,
        done
    );
    use fenced_jobs::ledger::{LedgerIndex, spend::SpendBudget};
    for item in [
        "2026-12-01",
        "2026-12-01#producer#billing",
        "2026-12-01#billing/acme",
    ] {
        let held = ledger.reserve(item, "sim-1", 77, limit, LATE_EVENING);
        assert!(held.await.expect("reserved"));
    }
    // A job due on the same day is not taken for a day item, nor a day item for a job.
    let deadline = fenced_jobs::job::message::parse_rfc3339_ms("2026-12-01T23:30:00Z");
    let due = ledger.due("2026-12-01", (0, deadline.expect("a time")), None, 10);
    assert!(due.await.expect("due").is_empty());

    // WHEN the operator asks for the day
    let jobctl = |format: &[&str]| {
        let spend = ["spend", "--day", "2026-12-01", "--table", &table];
        let ran = crate::support::jobctl(&[&spend[..], format].concat(), &[]);
        assert_eq!(ran.code, 0, "{}", ran.err);
        ran.out
    };
    let shown: serde_json::Value = serde_json::from_str(&jobctl(&["--json"])).expect("json");

    // THEN each level counts its own calls, the held call included, by model
    let cost = |id: &'static str| cost_of(&ledger, id);
    let (b1, b2, s1) = (
        cost("billing/a-1").await,
        cost("billing/a-2").await,
        cost("search/a-1").await,
    );
    let item = |level: &str, name: &str| {
        shown["items"]
            .as_array()
            .expect("items")
            .iter()
            .find(|i| i["level"] == level && i["name"] == name)
            .unwrap_or_else(|| panic!("{level} {name} in {shown}"))
            .clone()
    };
    let deployment = item("deployment", "");
    assert_eq!(deployment["counted_micros"], b1 + b2 + s1 + 77);
    assert_eq!(deployment["held_micros"], 77);
    assert_eq!(deployment["limit_micros"], limit);
    assert_eq!(deployment["models"]["gpt-4o-mini"], b2);
    assert_eq!(deployment["models"]["sim-1"], b1 + s1 + 77);
    // What the calls were charged, by the path they went by: the held call is not yet.
    assert_eq!(deployment["paths"], json!({"standard": b1 + b2 + s1}));
    let billing = item("producer", "billing");
    assert_eq!(
        (
            billing["counted_micros"].clone(),
            billing["held_micros"].clone()
        ),
        (json!(b1 + b2 + 77), json!(77))
    );
    let search = item("producer", "search");
    assert_eq!(
        (
            search["counted_micros"].clone(),
            search["held_micros"].clone()
        ),
        (json!(s1), json!(0))
    );
    assert_eq!(
        item("account", "billing/acme")["counted_micros"],
        b1 + b2 + 77
    );
    assert_eq!(
        item("account", "search/acme")["models"],
        json!({"sim-1": s1})
    );
    assert_eq!(shown["items"].as_array().map(Vec::len), Some(5));
    // AND the month to date sums its days: here the one day that counted anything
    let month = ["spend", "--month", "2026-12", "--json", "--table", &table];
    let ran = crate::support::jobctl(&month, &[]);
    assert_eq!(ran.code, 0, "{}", ran.err);
    let month: serde_json::Value = serde_json::from_str(&ran.out).expect("json");
    assert_eq!(month["month"], "2026-12");
    assert_eq!(
        month["items"][0]["counted_micros"],
        deployment["counted_micros"]
    );
    assert_eq!(
        crate::support::jobctl(&["spend", "--month", "2026-1", "--table", &table], &[]).code,
        2
    );
    let text = jobctl(&[]);
    assert!(
        text.contains("search/acme") && text.contains("gpt-4o-mini"),
        "{text}"
    );
}

/// Reservations within and past their limits, charges down and up, a release, another day and
/// models with and without a price, on `days`: what `count` says of the first day.
pub(crate) async fn day_scenario(
    days: &dyn fenced_jobs::ledger::spend::SpendBudget,
) -> Vec<fenced_jobs::ledger::spend::DayCount> {
    let d = "2026-12-01";
    let reserve = |item: String, model: &'static str, micros: u64| async move {
        days.reserve(&item, model, micros, 1_000, LATE_EVENING)
            .await
            .expect("reserve")
    };
    assert!(reserve(d.into(), "sim-1", 600).await);
    assert!(!reserve(d.into(), "sim-1", 500).await, "past the limit");
    assert!(reserve(format!("{d}#billing/acme"), "sim-1", 600).await);
    assert!(!reserve(format!("{d}#billing/acme"), "gpt-4o-mini", 1_001).await);
    days.charge(d, ("sim-1", "standard"), 600, 150, LATE_EVENING)
        .await
        .expect("charge");
    assert!(reserve(d.into(), "gpt-4o-mini", 300).await);
    days.charge(d, ("gpt-4o-mini", "flex"), 300, 420, LATE_EVENING)
        .await
        .expect("more");
    assert!(reserve(d.into(), "(unpriced)", 0).await);
    assert!(reserve(format!("{d}#producer#"), "sim-1", 200).await);
    let producer = format!("{d}#producer#");
    let released = days.charge(&producer, ("sim-1", ""), 200, 0, LATE_EVENING);
    released.await.expect("release");
    assert!(reserve("2026-12-02".into(), "sim-1", 5).await);
    days.count(d).await.expect("count")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_days_items_count_on_dynamodb_as_in_memory() {
    let aws = emulator().await;
    let ledger = aws.ledger(&aws.table().await);
    let memory = fenced_jobs::ledger::spend::MemorySpend::new();
    let expected = day_scenario(&memory).await;
    assert_eq!(expected.len(), 3, "{expected:?}");
    assert_eq!(expected[0].counted, 570);
    // What was charged, by path: the release counts under none.
    assert_eq!(
        expected[0].paths,
        [("flex".to_owned(), 420), ("standard".to_owned(), 150)].into()
    );
    assert_eq!(day_scenario(&ledger).await, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobctl_spend_forecasts_the_rest_of_today_from_the_queue_and_todays_calls() {
    use fenced_jobs::clock::Clock;
    use fenced_jobs::ledger::spend::SpendBudget;
    // GIVEN two calls charged today, at 300 and 500, against a limit of 1,500
    let aws = emulator().await;
    let table = aws.table().await;
    let ledger = aws.ledger(&table);
    let now = fenced_jobs::clock::SystemClock.now_ms();
    let today = fenced_jobs::ops::spend::day_of(now);
    for cost in [300, 500] {
        let reserved = ledger.reserve(&today, "sim-1", 600, 1_500, now);
        assert!(reserved.await.expect("reserve"));
        let charged = ledger.charge(&today, ("sim-1", "standard"), 600, cost, now);
        charged.await.expect("charge");
    }
    // AND three jobs waiting in the work queue
    let queue = aws.queue(30).await;
    for i in 0..3 {
        let body = crate::support::job(&format!("waiting-{i}"), "p", "");
        aws.send(&queue, &body).await;
    }

    // WHEN the operator asks for today's spend with the work queue
    let args = ["spend", "--queue-url", &queue.url, "--table", &table];
    let json = crate::support::jobctl(&[&args[..], &["--json"]].concat(), &[]);
    assert_eq!(json.code, 0, "{}", json.err);
    let shown: serde_json::Value = serde_json::from_str(&json.out).expect("json");

    // THEN the day will count what it counts and the three jobs at 400 a call: past its limit
    assert_eq!(
        shown["forecast"],
        json!({"queued": 3, "per_call_micros": 400, "forecast_micros": 2_000,
               "limit_micros": 1_500})
    );
    let text = crate::support::jobctl(&args, &[]);
    assert!(text.out.contains("past the daily limit"), "{}", text.out);
    // AND another day has no forecast
    let past = [
        "spend",
        "--day",
        "2026-01-01",
        "--queue-url",
        &queue.url,
        "--json",
    ];
    let past = crate::support::jobctl(&[&past[..], &["--table", &table]].concat(), &[]);
    let past: serde_json::Value = serde_json::from_str(&past.out).expect("json");
    assert!(past.get("forecast").is_none(), "{past}");
}
