//! The day's spend item's writes under the SDK's retries, against a scripted DynamoDB that
//! fails every request: a give-back is sent once (a retry whose first try landed would count
//! the day below what its calls cost); a write that counts more may be retried.

use std::time::Duration;

use fenced_jobs::ledger::dynamodb::DynamoLedger;
use fenced_jobs::ledger::spend::SpendBudget;
use serde_json::json;

use crate::support::http::{HttpStub, Reply};

#[tokio::test]
async fn a_release_of_the_days_spend_is_never_sent_twice() {
    // DynamoDB's answer to a request it failed, retryable by the SDK's standard rules.
    let stub = HttpStub::start(|_, _| {
        Reply::json(
            500,
            json!({"__type": "com.amazonaws.dynamodb.v20120810#InternalServerError",
                   "message": "internal"}),
        )
    })
    .await;
    let retries = aws_sdk_dynamodb::config::retry::RetryConfig::standard()
        .with_max_attempts(3)
        .with_initial_backoff(Duration::from_millis(1));
    let config = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .region(aws_config::Region::new("us-east-1"))
        .endpoint_url(&stub.url)
        .credentials_provider(aws_sdk_dynamodb::config::Credentials::for_tests())
        .retry_config(retries)
        .load()
        .await;
    let days = DynamoLedger::new(aws_sdk_dynamodb::Client::new(&config), "jobs");
    let sent = |before: usize| stub.count("POST", "/") - before;

    // A give-back (a call that cost 100 of its 600) fails once and stays failed: the day
    // counts more than was spent.
    assert!(
        days.charge("2026-12-01", ("m", ""), 600, 100, 0)
            .await
            .is_err()
    );
    assert_eq!(sent(0), 1);
    // A charge upwards and a reservation are retried: a repeat only counts more.
    assert!(
        days.charge("2026-12-01", ("m", ""), 100, 600, 0)
            .await
            .is_err()
    );
    assert_eq!(sent(1), 3);
    assert!(
        days.reserve("2026-12-01", "m", 500, 1_000, 0)
            .await
            .is_err()
    );
    assert_eq!(sent(4), 3);
}

#[tokio::test]
async fn a_call_is_paid_at_the_tier_the_provider_says_served_it() {
    use fenced_jobs::job::prices::{PriceTable, Rate};
    use fenced_jobs::ledger::JobLedger;
    use fenced_jobs::ledger::memory::InMemoryLedger;
    use fenced_jobs::provider::openai::{OpenAiApi, OpenAiProvider, OpenAiSettings};
    use fenced_jobs::worker::processor::{Invocation, Processor};
    // GIVEN a job that asks for the priority tier, a price table with its priority prices,
    // and an OpenAI server that serves it at the default tier and says so (`service_tier` in
    // its answer)
    let stub = HttpStub::start(|_, _| {
        let mut answer = crate::support::providers::chat_answer("A summary.");
        answer["service_tier"] = json!("default");
        answer["usage"] = json!({"prompt_tokens": 1_000, "completion_tokens": 500});
        Reply::json(200, answer)
    })
    .await;
    let prices = PriceTable::parse(
        r#"{"models": {"gpt-test": {"input": 1.0, "output": 4.0,
                                    "priority_input": 2.0, "priority_output": 8.0}}}"#,
    )
    .expect("prices");
    let settings = fenced_jobs::worker::Settings {
        daily_spend_limit_micros: Some(1_000_000),
        policy: fenced_jobs::job::policy::Policy {
            parameters: None,
            ..fenced_jobs::job::policy::Policy::default()
        },
        prices: std::sync::Arc::new(prices.clone()),
        ..crate::support::fast_settings()
    };
    let provider = OpenAiProvider::new(
        OpenAiSettings {
            base_url: format!("{}/v1", stub.url),
            api: OpenAiApi::Chat,
            ..OpenAiSettings::default()
        },
        None,
    )
    .expect("provider");
    let processor = Processor::new(
        InMemoryLedger::new(),
        provider,
        fenced_jobs::clock::SystemClock,
        settings,
    );
    let body = json!({"job_id": "tier-1", "contract": "summary.v1", "input": {
        "model": "gpt-test", "prompt": "Summarise.",
        "parameters": {"max_tokens": 600, "service_tier": "priority"}}});
    let msg = fenced_jobs::job::parse_body(Some(&body.to_string())).expect("job");
    let inv = Invocation {
        id: "tier".into(),
        deadline: None,
    };

    // WHEN it runs
    processor
        .process(&msg, "tier/1", &inv, &crate::support::NoWatch)
        .await;

    // THEN it was asked at priority, and paid at the standard prices the answer names
    assert_eq!(
        stub.requests()[0].json()["service_tier"],
        "priority",
        "asked at the tier the job names"
    );
    let item = processor
        .ledger()
        .get("tier-1")
        .await
        .expect("get")
        .expect("item");
    let used = item.usage().expect("usage");
    assert_eq!(
        used.cost_micros,
        prices.cost_at("gpt-test", &used, Rate::Standard)
    );
    assert_ne!(
        used.cost_micros,
        prices.cost_at("gpt-test", &used, Rate::Priority)
    );
}
