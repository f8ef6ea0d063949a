//! What looks at running provider batches read of their request counts, one item a batch:
//! `job_id` `#batch#<batch id>`, with `total`, `completed`, `failed`, `noted_at` and a TTL
//! three days on (a batch's window is a day). `jobctl watch` reads it beside a batched job's
//! item. It has no `state`: no index holds it and the stream's announcements skip it.

use aws_sdk_dynamodb::types::ReturnValue;

use super::DynamoLedger;
use super::item::{get_n, n};
use crate::job::{BatchCounts, Millis};
use crate::ledger::LedgerError;

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
