//! The shared path times ([`SharedTimes`]) as an item of the ledger table: `job_id` is
//! `#paths#<provider>#<model>`, with one list of numbers per path (`batch`, `flex`, `standard`,
//! `priority`), a `version` each write raises, the `writer` of the last write, and a TTL a week
//! after the last write. An add reads the item (consistently), merges, and puts it back on the
//! version it read; a writer that lost the race reads again (three tries), and one that finds
//! its own write there (an SDK retry of a write whose answer was lost) is done. A read alone is
//! eventually consistent.

use std::collections::HashMap;

use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::types::AttributeValue;
use futures::future::BoxFuture;
use tracing::Instrument;

use super::item::{Item, get_n, n, s};
use super::{DynamoLedger, classify, transport_error};
use crate::job::Millis;
use crate::job::path::{ALL, name};
use crate::ledger::LedgerError;
use crate::ledger::path_times::{PATHS_KEY_PREFIX, SharedTimes, Taken, merged};

/// Writes one add may take when other environments race it.
const TRIES: usize = 3;
/// How long an item outlives its last write.
const TTL_S: i64 = 7 * 86_400;

/// The times an item holds (none for a path it lacks).
fn taken_of(item: &Item) -> Taken {
    std::array::from_fn(|i| match item.get(name(ALL[i])) {
        Some(AttributeValue::L(list)) => list
            .iter()
            .filter_map(|v| v.as_n().ok()?.parse().ok())
            .collect(),
        _ => Vec::new(),
    })
}

impl DynamoLedger {
    /// Puts `all` on `key`'s item as version `version + 1`, if it is still at `version` (0: no
    /// item): `false` when another writer was first.
    async fn put_times(
        &self,
        key: &str,
        all: &Taken,
        (version, writer): (i64, &str),
        now: Millis,
    ) -> Result<bool, LedgerError> {
        let mut item = HashMap::with_capacity(8);
        item.insert("writer".to_owned(), s(writer));
        item.insert("job_id".to_owned(), s(key));
        for (rate, list) in ALL.into_iter().zip(all) {
            let numbers = list.iter().map(|ms| n(*ms)).collect();
            item.insert(name(rate).to_owned(), AttributeValue::L(numbers));
        }
        item.insert("version".to_owned(), n(version + 1));
        item.insert("expires_at".to_owned(), n(now / 1_000 + TTL_S));
        let condition = match version {
            0 => "attribute_not_exists(job_id)",
            _ => "version = :seen",
        };
        let put = self
            .client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(item))
            .condition_expression(condition)
            .set_expression_attribute_values(
                (version > 0).then(|| HashMap::from([(":seen".to_owned(), n(version))])),
            )
            .send()
            .instrument(tracing::debug_span!("ledger", operation = "path times"));
        match Box::pin(put).await {
            Ok(_) => Ok(true),
            Err(SdkError::ServiceError(e)) => match e.err() {
                PutItemError::ConditionalCheckFailedException(_) => Ok(false),
                other => Err(classify(
                    "path times",
                    aws_sdk_dynamodb::error::ProvideErrorMetadata::code(other),
                )),
            },
            Err(other) => Err(transport_error("path times", &other)),
        }
    }
}

impl SharedTimes for DynamoLedger {
    fn merge<'a>(
        &'a self,
        key: &'a str,
        new: &'a Taken,
        now: Millis,
    ) -> BoxFuture<'a, Result<Taken, LedgerError>> {
        Box::pin(async move {
            let key = format!("{PATHS_KEY_PREFIX}{key}");
            let adds = new.iter().any(|t| !t.is_empty());
            // Names this add's writes: one refused only because its own retry (the SDK's, after
            // a lost answer) had landed is found done, not merged again.
            let writer = format!("{:016x}", fastrand::u64(..));
            let mut tried = false;
            for _ in 0..TRIES {
                let item = self.get_item("path times", &key, adds).await?;
                let landed = item.as_ref().and_then(|i| i.get("writer")?.as_s().ok());
                if let (true, Some(item)) = (tried && landed == Some(&writer), &item) {
                    return Ok(taken_of(item));
                }
                let kept = item.as_ref().map(taken_of).unwrap_or_default();
                let all = merged(&kept, new);
                if !adds {
                    return Ok(all);
                }
                let version = item.as_ref().and_then(|i| get_n(i, "version")).unwrap_or(0);
                if self.put_times(&key, &all, (version, &writer), now).await? {
                    return Ok(all);
                }
                tried = true;
            }
            Err(LedgerError::Unavailable {
                operation: "path times",
                code: "contention".to_owned(),
            })
        })
    }
}
