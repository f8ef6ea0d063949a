//! A provider batch's own items, beside its jobs'.
//!
//! - What looks at the running batch read of its request counts: `#batch#<batch id>`, with
//!   `total`, `completed`, `failed`, `noted_at` and a TTL three days on (a batch's window is a
//!   day). `jobctl watch` reads it beside a batched job's item.
//! - The batch's jobs, listed once by the worker that created it, for the webhook function:
//!   `#batch-jobs#<batch id>#<part>`, each part [`MEMBERS_PER_ITEM`] jobs at most (`jobs`, a
//!   list of `{id, tenant?, urgent?}`), part 0 saying how many parts there are (`parts`).
//! - The webhook deliveries acted on: `#webhook#<id>`, written once their triggers were sent,
//!   read (consistently) before a delivery is acted on.
//!
//! None of them has a `state`: no index holds them and the stream's announcements skip them.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::{AttributeValue, ReturnValue};
use tracing::Instrument;

use super::item::{Item, get_n, n, s};
use super::{DynamoLedger, sdk_error};
use crate::job::{BatchCounts, BatchMember, JobClass, Millis};
use crate::ledger::LedgerError;
use crate::ledger::pushed::{MEMBERS_PER_ITEM, MEMBERS_TTL_S, PushedLedger};

/// What the keys of a batch's list of its jobs start with.
const MEMBERS_KEY_PREFIX: &str = "#batch-jobs#";
/// What the key of a webhook delivery acted on starts with.
const DELIVERY_KEY_PREFIX: &str = "#webhook#";

/// What the key of a batch's item starts with.
const BATCH_KEY_PREFIX: &str = "#batch#";

/// How long a batch's item outlives its last note.
const TTL_S: i64 = 3 * 86_400;

impl DynamoLedger {
    /// Writes the counts of `batch_id` read at `now`: one unconditional `UpdateItem` (a note
    /// overtaken by an older one is put right by the next look).
    pub(super) async fn put_batch_note(
        &self,
        batch_id: &str,
        counts: BatchCounts,
        now: Millis,
    ) -> Result<(), LedgerError> {
        self.send_update_named(
            "batch note",
            &format!("{BATCH_KEY_PREFIX}{batch_id}"),
            (
                "SET #total = :total, #completed = :completed, #failed = :failed, \
                 #noted = :now, #ttl = :exp",
                "",
            ),
            vec![
                (":total", n(counts.total)),
                (":completed", n(counts.completed)),
                (":failed", n(counts.failed)),
                (":now", n(now)),
                (":exp", n(now / 1_000 + TTL_S)),
            ],
            &[
                ("#total", "total"),
                ("#completed", "completed"),
                ("#failed", "failed"),
                ("#noted", "noted_at"),
            ],
            ReturnValue::None,
        )
        .await
        .map(|_| ())
    }

    /// The counts last noted for `batch_id`, and when (`None`: no look noted any).
    pub async fn batch_counts(
        &self,
        batch_id: &str,
    ) -> Result<Option<(BatchCounts, Millis)>, LedgerError> {
        let key = format!("{BATCH_KEY_PREFIX}{batch_id}");
        let Some(item) = self.get_item("batch note", &key, false).await? else {
            return Ok(None);
        };
        let count = |name: &str| get_n(&item, name).and_then(|v| u64::try_from(v).ok());
        let counts = BatchCounts {
            total: count("total").unwrap_or(0),
            completed: count("completed").unwrap_or(0),
            failed: count("failed").unwrap_or(0),
        };
        Ok(Some((counts, get_n(&item, "noted_at").unwrap_or(0))))
    }
}

/// The key of part `part` of `batch_id`'s list of its jobs.
fn members_key(batch_id: &str, part: usize) -> String {
    format!("{MEMBERS_KEY_PREFIX}{batch_id}#{part}")
}

fn encode_member(m: &BatchMember) -> AttributeValue {
    let mut fields = HashMap::with_capacity(3);
    fields.insert("id".to_owned(), s(&m.job_id));
    if let Some(tenant) = &m.class.tenant {
        fields.insert("tenant".to_owned(), s(tenant));
    }
    if m.class.urgent {
        fields.insert("urgent".to_owned(), AttributeValue::Bool(true));
    }
    AttributeValue::M(fields)
}

/// A member as [`encode_member`] wrote it; `None` for anything else.
fn decode_member(value: &AttributeValue) -> Option<BatchMember> {
    let fields = value.as_m().ok()?;
    let job_id = fields.get("id")?.as_s().ok()?.clone();
    let tenant = fields.get("tenant").and_then(|t| t.as_s().ok()).cloned();
    let urgent = fields
        .get("urgent")
        .and_then(|u| u.as_bool().ok())
        .copied()
        .unwrap_or(false);
    Some(BatchMember {
        job_id,
        class: JobClass { tenant, urgent },
    })
}

impl DynamoLedger {
    /// Writes `batch_id`'s list of its jobs, created at `now`: one unconditional `PutItem` a
    /// part (the same list written again is the same items).
    pub(super) async fn put_batch_members(
        &self,
        batch_id: &str,
        members: &[BatchMember],
        now: Millis,
    ) -> Result<(), LedgerError> {
        let parts = members.chunks(MEMBERS_PER_ITEM);
        let count = parts.len();
        for (part, chunk) in parts.enumerate() {
            let mut item = HashMap::with_capacity(4);
            item.insert("job_id".to_owned(), s(&members_key(batch_id, part)));
            item.insert(
                "jobs".to_owned(),
                AttributeValue::L(chunk.iter().map(encode_member).collect()),
            );
            item.insert("expires_at".to_owned(), n(now / 1_000 + MEMBERS_TTL_S));
            if part == 0 {
                item.insert("parts".to_owned(), n(count));
            }
            self.put_plain("batch members", item).await?;
        }
        Ok(())
    }

    /// One unconditional `PutItem` of `item` (an item of its own, not a job's).
    async fn put_plain(&self, operation: &'static str, item: Item) -> Result<(), LedgerError> {
        let put = self
            .client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(item))
            .send()
            .instrument(tracing::debug_span!("ledger", operation));
        Box::pin(put)
            .await
            .map(|_| ())
            .map_err(|e| sdk_error(operation, &e))
    }
}

impl PushedLedger for DynamoLedger {
    async fn batch_members(&self, batch_id: &str) -> Result<Vec<BatchMember>, LedgerError> {
        let mut members = Vec::new();
        let mut parts = 1;
        let mut part = 0;
        while part < parts {
            let key = members_key(batch_id, part);
            let Some(item) = self.get_item("batch members", &key, false).await? else {
                break;
            };
            if part == 0 {
                parts = get_n(&item, "parts").map_or(1, |p| p.clamp(1, 1_000) as usize);
            }
            if let Some(AttributeValue::L(jobs)) = item.get("jobs") {
                members.extend(jobs.iter().filter_map(decode_member));
            }
            part += 1;
        }
        Ok(members)
    }

    async fn was_acted_on(&self, id: &str, now: Millis) -> Result<bool, LedgerError> {
        let key = format!("{DELIVERY_KEY_PREFIX}{id}");
        let item = self.get_item("webhook delivery", &key, true).await?;
        // Kept past its time reads as absent: the TTL deletes late.
        let kept = |item: &Item| get_n(item, "expires_at").is_some_and(|s| s >= now / 1_000);
        Ok(item.as_ref().is_some_and(kept))
    }

    async fn acted_on(&self, id: &str, now: Millis, until: Millis) -> Result<(), LedgerError> {
        let mut item = HashMap::with_capacity(3);
        item.insert(
            "job_id".to_owned(),
            s(&format!("{DELIVERY_KEY_PREFIX}{id}")),
        );
        item.insert("acted_at".to_owned(), n(now));
        item.insert("expires_at".to_owned(), n(until / 1_000 + 1));
        self.put_plain("webhook delivery", item).await
    }
}
