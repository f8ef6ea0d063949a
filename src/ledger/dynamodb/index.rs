//! The table as `template.yaml` defines it, and the sparse indexes the reconciler and `jobctl
//! list` read: queries of each shard, never a scan of the table.

use aws_sdk_dynamodb::Client;

use super::item::{get_n, get_s, n, s};
use super::{DynamoLedger, sdk_error};
use crate::job::{ATTENTION_SHARDS, JobState, Millis, attention_shard};
use crate::ledger::{IndexCursor, LedgerError, LedgerIndex};

/// The sparse index of jobs that are not terminal: key `attention` (`state#shard`), sort key
/// `updated_at`, keys only. Terminal items carry no `attention` and are not in it.
pub const ATTENTION_INDEX: &str = "attention-index";

/// The sparse index of the same jobs by deadline: key `attention`, sort key `deadline_at`, keys
/// only. The reconciler finds jobs past their deadline with it.
pub const DEADLINE_INDEX: &str = "deadline-index";

/// The index of jobs by their deadline: key `due_on` (the deadline's day, UTC), sort key
/// `deadline_at`, keys only. A job enters it with the first write that lists it (every write
/// but a first claim whose message SQS keeps, and that claim's acceptance) and its keys never
/// change. The reconciler finds with it the jobs no other index holds (those on their first
/// claim), and the orphan sweep the finished ones that could have left an object.
pub const DUE_INDEX: &str = "due-index";

/// The item that records how far the reconciler has walked the due index (`walked_to`, Unix
/// ms). No job id starts with `#`.
pub(crate) const DUE_WALK_KEY: &str = "#reconcile#due";

/// One global secondary index: its name and its partition and sort key attributes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexKeys {
    /// The index name.
    pub name: &'static str,
    /// The partition key attribute.
    pub partition: &'static str,
    /// The sort key attribute.
    pub sort: &'static str,
}

/// The ledger table's indexes, as `template.yaml` defines them (a test holds the two together).
pub const INDEXES: [IndexKeys; 3] = [
    IndexKeys {
        name: ATTENTION_INDEX,
        partition: "attention",
        sort: "updated_at",
    },
    IndexKeys {
        name: DEADLINE_INDEX,
        partition: "attention",
        sort: "deadline_at",
    },
    IndexKeys {
        name: DUE_INDEX,
        partition: "due_on",
        sort: "deadline_at",
    },
];

/// Waits until table `name` is `ACTIVE`: a new table is `CREATING` first and refuses reads and
/// writes until then (`ResourceNotFoundException`, in DynamoDB and in dynalite alike). Asked
/// every 50 ms for at most two minutes.
async fn wait_until_active(client: &Client, name: &str) -> Result<(), LedgerError> {
    for _ in 0..2_400 {
        let described = client
            .describe_table()
            .table_name(name)
            .send()
            .await
            .map_err(|e| sdk_error("describe_table", &e))?;
        let status = described.table().and_then(|t| t.table_status());
        if status == Some(&aws_sdk_dynamodb::types::TableStatus::Active) {
            return Ok(());
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    Err(LedgerError::Unavailable {
        operation: "create_table",
        code: "the table did not become ACTIVE within two minutes".to_owned(),
    })
}

impl DynamoLedger {
    /// Creates a ledger table as `template.yaml` defines it (key `job_id`, the sparse attention
    /// index, on demand), for local set-ups, tests and benchmarks, and waits until it is
    /// active. TTL is not switched on here.
    pub async fn create_table(client: &Client, name: &str) -> Result<(), LedgerError> {
        use aws_sdk_dynamodb::types::{
            AttributeDefinition, BillingMode, GlobalSecondaryIndex, KeySchemaElement, KeyType,
            Projection, ProjectionType, ScalarAttributeType, StreamSpecification, StreamViewType,
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
        let index = |name: &str, partition: &str, sort: &str| {
            GlobalSecondaryIndex::builder()
                .index_name(name)
                .key_schema(key(partition, KeyType::Hash).map_err(invalid)?)
                .key_schema(key(sort, KeyType::Range).map_err(invalid)?)
                .projection(
                    Projection::builder()
                        .projection_type(ProjectionType::KeysOnly)
                        .build(),
                )
                .build()
                .map_err(invalid)
        };
        let mut create = client.create_table();
        for keys in INDEXES {
            create = create.global_secondary_indexes(index(keys.name, keys.partition, keys.sort)?);
        }
        create
            .table_name(name)
            .attribute_definitions(attribute("job_id", ScalarAttributeType::S).map_err(invalid)?)
            .attribute_definitions(attribute("attention", ScalarAttributeType::S).map_err(invalid)?)
            .attribute_definitions(
                attribute("updated_at", ScalarAttributeType::N).map_err(invalid)?,
            )
            .attribute_definitions(
                attribute("deadline_at", ScalarAttributeType::N).map_err(invalid)?,
            )
            .attribute_definitions(attribute("due_on", ScalarAttributeType::S).map_err(invalid)?)
            .key_schema(key("job_id", KeyType::Hash).map_err(invalid)?)
            .stream_specification(
                StreamSpecification::builder()
                    .stream_enabled(true)
                    .stream_view_type(StreamViewType::NewAndOldImages)
                    .build()
                    .map_err(invalid)?,
            )
            .billing_mode(BillingMode::PayPerRequest)
            .send()
            .await
            .map_err(|e| sdk_error("create_table", &e))?;
        wait_until_active(client, name).await
    }

    /// Keys of jobs in `state` from `index` whose sort key `sort` is below `before` and that
    /// `after` admits, smallest first, at most `limit`: a query of each shard, never a scan of
    /// the table.
    async fn keys_below(
        &self,
        index: &str,
        sort: &str,
        state: JobState,
        before: Millis,
        after: &IndexCursor,
        limit: usize,
    ) -> Result<Vec<(String, Millis)>, LedgerError> {
        let mut found = Vec::new();
        if before <= after.at {
            return Ok(found);
        }
        for shard in 0..ATTENTION_SHARDS {
            let mut start = None;
            let mut from_shard = 0;
            loop {
                let out = self
                    .client
                    .query()
                    .table_name(&self.table)
                    .index_name(index)
                    .key_condition_expression("#attn = :key AND #sort BETWEEN :from AND :last")
                    .expression_attribute_names("#attn", "attention")
                    .expression_attribute_names("#sort", sort)
                    .expression_attribute_values(":key", s(&attention_shard(state, shard)))
                    .expression_attribute_values(":from", n(after.at))
                    .expression_attribute_values(":last", n(before - 1))
                    .limit(limit.clamp(1, 1000) as i32)
                    .set_exclusive_start_key(start)
                    .send()
                    .await
                    .map_err(|e| sdk_error("query", &e))?;
                for item in out.items() {
                    if let (Some(id), Some(at)) = (get_s(item, "job_id"), get_n(item, sort))
                        && after.admits(id, at)
                    {
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
        after: &IndexCursor,
        limit: usize,
    ) -> Result<Vec<(String, Millis)>, LedgerError> {
        self.keys_below(ATTENTION_INDEX, "updated_at", state, before, after, limit)
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
            &IndexCursor::default(),
            limit,
        )
        .await
    }

    /// Jobs due on `day` with a deadline from `from` to `to`, in (deadline, job id) order after
    /// `cursor`.
    async fn due(
        &self,
        day: &str,
        (from, to): (Millis, Millis),
        cursor: Option<&(String, Millis)>,
        limit: usize,
    ) -> Result<Vec<(String, Millis)>, LedgerError> {
        let start = cursor.map(|(id, at)| {
            std::collections::HashMap::from([
                ("job_id".to_owned(), s(id)),
                ("due_on".to_owned(), s(day)),
                ("deadline_at".to_owned(), n(*at)),
            ])
        });
        let out = self
            .client
            .query()
            .table_name(&self.table)
            .index_name(DUE_INDEX)
            .key_condition_expression("#due = :day AND #deadline BETWEEN :from AND :to")
            .expression_attribute_names("#due", "due_on")
            .expression_attribute_names("#deadline", "deadline_at")
            .expression_attribute_values(":day", s(day))
            .expression_attribute_values(":from", n(from))
            .expression_attribute_values(":to", n(to.max(from)))
            .limit(limit.clamp(1, 1000) as i32)
            .set_exclusive_start_key(start)
            .send()
            .await
            .map_err(|e| sdk_error("query", &e))?;
        Ok(out
            .items()
            .iter()
            .filter_map(|item| {
                Some((
                    get_s(item, "job_id")?.to_owned(),
                    get_n(item, "deadline_at")?,
                ))
            })
            .collect())
    }

    async fn finished(
        &self,
        (from, to): (Millis, Millis),
        after: Option<&str>,
        limit: usize,
    ) -> Result<(Vec<crate::job::JobItem>, Option<String>), LedgerError> {
        let start = after.map(|id| std::collections::HashMap::from([("job_id".to_owned(), s(id))]));
        let mut scan = self
            .client
            .scan()
            .table_name(&self.table)
            .filter_expression("#updated BETWEEN :from AND :to AND #state IN (:s0, :s1, :s2, :s3)")
            .expression_attribute_names("#updated", "updated_at")
            .expression_attribute_names("#state", "state")
            .expression_attribute_values(":from", n(from))
            .expression_attribute_values(":to", n(to.max(from)))
            .limit(limit.clamp(1, 1000) as i32)
            .set_exclusive_start_key(start);
        for (i, state) in JobState::TERMINAL.iter().enumerate() {
            scan = scan.expression_attribute_values(format!(":s{i}"), s(state.as_str()));
        }
        let out = scan.send().await.map_err(|e| sdk_error("scan", &e))?;
        let jobs = out
            .items()
            .iter()
            .map(super::item::decode)
            .collect::<Result<Vec<_>, _>>()?;
        let next = out
            .last_evaluated_key()
            .and_then(|key| get_s(key, "job_id"))
            .map(str::to_owned);
        Ok((jobs, next))
    }

    async fn due_walked(&self) -> Result<Option<Millis>, LedgerError> {
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .key("job_id", s(DUE_WALK_KEY))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| sdk_error("get", &e))?;
        Ok(out.item().and_then(|item| get_n(item, "walked_to")))
    }

    async fn walked_due_to(&self, to: Millis) -> Result<(), LedgerError> {
        let sent = self
            .client
            .update_item()
            .table_name(&self.table)
            .key("job_id", s(DUE_WALK_KEY))
            .update_expression("SET #walked = :to")
            .condition_expression("attribute_not_exists(#walked) OR #walked < :to")
            .expression_attribute_names("#walked", "walked_to")
            .expression_attribute_values(":to", n(to))
            .send()
            .await;
        match sent {
            Ok(_) => Ok(()),
            // Another run walked further: its record stands.
            Err(e)
                if e.as_service_error()
                    .is_some_and(|e| e.is_conditional_check_failed_exception()) =>
            {
                Ok(())
            }
            Err(e) => Err(sdk_error("walked_due_to", &e)),
        }
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
