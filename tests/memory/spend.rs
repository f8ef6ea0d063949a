//! The day's spend item's writes under the SDK's retries, against a scripted DynamoDB that
//! fails every request: a give-back is sent once (a retry whose first try landed would count
//! the day below what its calls cost); a write that counts more may be retried.

use std::time::Duration;

use fenced_jobs::ledger::dynamodb::DynamoLedger;
use fenced_jobs::ledger::spend::SpendBudget;
use serde_json::json;

use crate::support::http::{HttpStub, Reply};

#[tokio::test]
async fn a_give_back_of_the_days_spend_is_never_sent_twice() {
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

    // A give-back fails once and stays failed: the day counts more than was spent.
    assert!(days.adjust("2026-12-01", -500, 0).await.is_err());
    assert_eq!(sent(0), 1);
    // A correction upwards and a reservation are retried: a repeat only counts more.
    assert!(days.adjust("2026-12-01", 500, 0).await.is_err());
    assert_eq!(sent(1), 3);
    assert!(days.reserve("2026-12-01", 500, 1_000, 0).await.is_err());
    assert_eq!(sent(4), 3);
}
