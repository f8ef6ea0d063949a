//! The ledger's contract on a second DynamoDB implementation: dynalite (npm), started beside
//! moto by `make test` (`SECOND_DYNAMODB_URL`). The same conditional-write scenarios, cancels,
//! recoveries, inputs kept off the happy path and random operation sequences as on moto, each
//! compared with the in-memory ledger, so the two implementations are held to one answer.
//!
//! What dynalite lacks, and how each test meets it (nothing is faked):
//! - `ReturnValuesOnConditionCheckFailure` (DynamoDB returns the item with a refused write, as
//!   moto does): dynalite returns none, and the ledger reads the item back consistently, as it
//!   does for any refusal without one; the answers are the same.
//! - DynamoDB Streams: no stream API at all, so the dispatcher's tests stay on moto.
//!
//! Where the two disagree, DynamoDB's documentation decides: an item of 400 KB (409,600 bytes,
//! names and values) is taken by DynamoDB and dynalite, refused by moto (which stops at
//! 405,000); the ledger's `MAX_ITEM_BYTES` is DynamoDB's.

use fenced_jobs::ledger::dynamodb::DynamoLedger;
use fenced_jobs::ledger::memory::InMemoryLedger;

use crate::{ledger_contract, ledger_properties, support};

/// A new ledger table on the second implementation, as the template defines it.
async fn second_ledger() -> DynamoLedger {
    let (client, table) = second_table().await;
    DynamoLedger::new(client, &table)
}

/// A client on the second implementation and a new ledger table there.
async fn second_table() -> (aws_sdk_dynamodb::Client, String) {
    let endpoint = std::env::var("SECOND_DYNAMODB_URL").unwrap_or_default();
    assert!(
        endpoint.starts_with("http://127.0.0.1:"),
        "SECOND_DYNAMODB_URL must point at the local dynalite (got {endpoint:?}); run `make test`, \
         or `SECOND_DYNAMODB=1 scripts/with-emulator.sh cargo test --test emulator`"
    );
    let config = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .region(aws_config::Region::new("us-east-1"))
        .endpoint_url(endpoint)
        .load()
        .await;
    let client = aws_sdk_dynamodb::Client::new(&config);
    let table = support::unique("jobs");
    DynamoLedger::create_table(&client, &table)
        .await
        .expect("create table");
    (client, table)
}

/// Whether `client` takes an item of `bytes` in all (its key, one attribute's name and value).
async fn takes_item_of(client: &aws_sdk_dynamodb::Client, table: &str, bytes: usize) -> bool {
    use aws_sdk_dynamodb::types::AttributeValue;
    let (key, name) = ("job_id", "result");
    let id = format!("size-{bytes}");
    let overhead = key.len() + id.len() + name.len();
    client
        .put_item()
        .table_name(table)
        .item(key, AttributeValue::S(id))
        .item(name, AttributeValue::S("x".repeat(bytes - overhead)))
        .send()
        .await
        .is_ok()
}

/// DynamoDB's item limit is 400 KB, attribute names and values together (the Developer Guide,
/// "Service, account, and table quotas in Amazon DynamoDB": 409,600 bytes), which the ledger's
/// `MAX_ITEM_BYTES` assumes. dynalite holds an item to exactly that. moto does not: it refuses
/// past 405,000 bytes (its own bound, `moto/dynamodb/models/dynamo_type.py`), so a test of
/// ours near the limit belongs on dynalite, and this one says so if moto's bound moves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_item_is_held_to_400_kb_names_and_values_together() {
    let documented = 400 * 1024;
    let (second, table) = second_table().await;
    assert!(takes_item_of(&second, &table, documented).await, "400 KB");
    assert!(
        !takes_item_of(&second, &table, documented + 1).await,
        "one byte over"
    );
    // moto's own, lower bound.
    let aws = support::emulator().await;
    let moto_table = aws.table().await;
    assert!(takes_item_of(&aws.ddb, &moto_table, 405_000).await);
    assert!(!takes_item_of(&aws.ddb, &moto_table, 405_001).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_second_dynamodb_agrees_on_every_conditional_write() {
    let (memory_log, memory_items) = ledger_contract::scenario(&InMemoryLedger::new(), "").await;
    let (log, items) = ledger_contract::scenario(&second_ledger().await, "").await;
    for (m, d) in memory_log.iter().zip(&log) {
        assert_eq!(m, d);
    }
    assert_eq!(memory_log.len(), log.len());
    assert_eq!(memory_items, items);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_second_dynamodb_agrees_on_cancels() {
    let (memory_log, memory_items) = ledger_contract::cancels(&InMemoryLedger::new(), "").await;
    let (log, items) = ledger_contract::cancels(&second_ledger().await, "").await;
    assert_eq!(memory_log, log);
    assert_eq!(memory_items, items);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_second_dynamodb_agrees_on_recoveries_inputs_and_known_owners() {
    let ledger = second_ledger().await;
    let memory = InMemoryLedger::new();
    let m = ledger_contract::recovered_often(&memory, "often", 14).await;
    let d = ledger_contract::recovered_often(&ledger, "often", 14).await;
    assert_eq!(m, d);
    ledger_contract::input_kept_off_the_happy_path(&ledger, "second").await;
    ledger_contract::accept_as_known_owner(&ledger, "known-second").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_second_dynamodb_lets_an_older_item_keep_its_due_entry() {
    let (client, table) = second_table().await;
    let ledger = DynamoLedger::new(client.clone(), &table);
    ledger_contract::an_older_item_keeps_its_due_entry(&client, &table, &ledger).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_operation_sequences_get_the_same_answers_from_memory_and_the_second_dynamodb() {
    ledger_properties::agree_on_random_sequences(&second_ledger().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_second_dynamodb_shows_the_same_jobs_in_its_sparse_indexes() {
    let memory = InMemoryLedger::new();
    ledger_contract::scenario(&memory, "").await;
    let ledger = second_ledger().await;
    ledger_contract::scenario(&ledger, "").await;
    assert_eq!(
        ledger_contract::index_views(&memory).await,
        ledger_contract::index_views(&ledger).await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_second_dynamodb_finds_a_job_lost_on_its_first_claim_by_its_deadline() {
    use fenced_jobs::clock::{Clock, SystemClock};
    let ledger = second_ledger().await;
    let triggers = fenced_jobs::queue::RecordingTriggers::new();
    crate::producer::lost_on_its_first_claim(&ledger, &triggers, SystemClock.now_ms()).await;
    assert!(triggers.sent().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_second_dynamodb_counts_the_day_as_memory_does() {
    let memory = fenced_jobs::ledger::spend::MemorySpend::new();
    let expected = crate::spend_days::day_scenario(&memory).await;
    let ledger = second_ledger().await;
    assert_eq!(crate::spend_days::day_scenario(&ledger).await, expected);
}
