//! The table as `template.yaml` defines it, and the sparse indexes the reconciler and `jobctl
//! list` read: queries of each shard, never a scan of the table.

use aws_sdk_dynamodb::Client;

use super::item::{get_n, get_s, n, s};
use super::{DynamoLedger, sdk_error};
use crate::job::{ATTENTION_SHARDS, JobState, Millis, attention_shard};
use crate::ledger::{LedgerError, LedgerIndex};

/// The sparse index of jobs that are not terminal: key `attention` (`state#shard`), sort key
/// `updated_at`, keys only. Terminal items carry no `attention` and are not in it.
pub const ATTENTION_INDEX: &str = "attention-index";

/// The sparse index of the same jobs by deadline: key `attention`, sort key `deadline_at`, keys
/// only. The reconciler finds jobs past their deadline with it.
pub const DEADLINE_INDEX: &str = "deadline-index";

impl DynamoLedger {
    /// Creates a ledger table as `template.yaml` defines it (key `job_id`, the sparse attention
    /// index, on demand), for local set-ups, tests and benchmarks. TTL is not switched on here.
    pub async fn create_table(client: &Client, name: &str) -> Result<(), LedgerError> {
        use aws_sdk_dynamodb::types::{
            AttributeDefinition, BillingMode, GlobalSecondaryIndex, KeySchemaElement, KeyType,
            Projection, ProjectionType, ScalarAttributeType,
        };
        let attribute = |name: &str, kind| {
            AttributeDefinition::builder()
                .attribute_name(name)
                .attribute_type(kind)
                .build()
        };
        let key = |name: &str, kind| {
            KeySchemaElement::builder()
                .attribute_name(name)
                .key_type(kind)
                .build()
        };
        let invalid = |e: aws_sdk_dynamodb::error::BuildError| LedgerError::Unavailable {
            operation: "create_table",
            code: e.to_string(),
        };
        let index = |name: &str, sort: &str| {
            GlobalSecondaryIndex::builder()
                .index_name(name)
                .key_schema(key("attention", KeyType::Hash).map_err(invalid)?)
                .key_schema(key(sort, KeyType::Range).map_err(invalid)?)
                .projection(
                    Projection::builder()
                        .projection_type(ProjectionType::KeysOnly)
                        .build(),
                )
                .build()
                .map_err(invalid)
        };
        client
            .create_table()
            .table_name(name)
            .attribute_definitions(attribute("job_id", ScalarAttributeType::S).map_err(invalid)?)
            .attribute_definitions(attribute("attention", ScalarAttributeType::S).map_err(invalid)?)
            .attribute_definitions(
                attribute("updated_at", ScalarAttributeType::N).map_err(invalid)?,
            )
            .attribute_definitions(
                attribute("deadline_at", ScalarAttributeType::N).map_err(invalid)?,
            )
            .key_schema(key("job_id", KeyType::Hash).map_err(invalid)?)
            .global_secondary_indexes(index(ATTENTION_INDEX, "updated_at")?)
            .global_secondary_indexes(index(DEADLINE_INDEX, "deadline_at")?)
            .billing_mode(BillingMode::PayPerRequest)
            .send()
            .await
            .map_err(|e| sdk_error("create_table", &e))?;
        Ok(())
    }

    /// Keys of jobs in `state` from `index` whose sort key `sort` is below `before`, smallest
    /// first, at most `limit`: a query of each shard, never a scan of the table.
    async fn keys_below(
        &self,
        index: &str,
        sort: &str,
        state: JobState,
        before: Millis,
        limit: usize,
    ) -> Result<Vec<(String, Millis)>, LedgerError> {
        let mut found = Vec::new();
        for shard in 0..ATTENTION_SHARDS {
            let mut start = None;
            let mut from_shard = 0;
            loop {
                let out = self
                    .client
                    .query()
                    .table_name(&self.table)
                    .index_name(index)
                    .key_condition_expression("#attn = :key AND #sort < :before")
                    .expression_attribute_names("#attn", "attention")
                    .expression_attribute_names("#sort", sort)
                    .expression_attribute_values(":key", s(&attention_shard(state, shard)))
                    .expression_attribute_values(":before", n(before))
                    .limit(limit.clamp(1, 1000) as i32)
                    .set_exclusive_start_key(start)
                    .send()
                    .await
                    .map_err(|e| sdk_error("query", &e))?;
                for item in out.items() {
                    if let (Some(id), Some(at)) = (get_s(item, "job_id"), get_n(item, sort)) {
                        found.push((id.to_owned(), at));
                        from_shard += 1;
                    }
                }
                start = out.last_evaluated_key().cloned();
                // Each shard is sorted: its first `limit` keys are all it can contribute.
                if start.is_none() || from_shard >= limit {
                    break;
                }
            }
        }
        found.sort_by_key(|(_, at)| *at);
        found.truncate(limit);
        Ok(found)
    }
}

impl LedgerIndex for DynamoLedger {
    /// Jobs in `state` last changed before `before`, oldest first, at most `limit`.
    async fn untouched_since(
        &self,
        state: JobState,
        before: Millis,
        limit: usize,
    ) -> Result<Vec<(String, Millis)>, LedgerError> {
        self.keys_below(ATTENTION_INDEX, "updated_at", state, before, limit)
            .await
    }

    /// Jobs in `state` whose deadline is at or before `now`, earliest first, at most `limit`.
    async fn past_deadline(
        &self,
        state: JobState,
        now: Millis,
        limit: usize,
    ) -> Result<Vec<(String, Millis)>, LedgerError> {
        self.keys_below(
            DEADLINE_INDEX,
            "deadline_at",
            state,
            now.saturating_add(1),
            limit,
        )
        .await
    }

    /// How many jobs are in `state` (a count query of each shard; no items are read).
    async fn count(&self, state: JobState) -> Result<u64, LedgerError> {
        let mut total = 0u64;
        for shard in 0..ATTENTION_SHARDS {
            let mut start = None;
            loop {
                let out = self
                    .client
                    .query()
                    .table_name(&self.table)
                    .index_name(ATTENTION_INDEX)
                    .key_condition_expression("#attn = :key")
                    .expression_attribute_names("#attn", "attention")
                    .expression_attribute_values(":key", s(&attention_shard(state, shard)))
                    .select(aws_sdk_dynamodb::types::Select::Count)
                    .set_exclusive_start_key(start)
                    .send()
                    .await
                    .map_err(|e| sdk_error("count", &e))?;
                total += u64::try_from(out.count()).unwrap_or(0);
                start = out.last_evaluated_key().cloned();
                if start.is_none() {
                    break;
                }
            }
        }
        Ok(total)
    }
}
