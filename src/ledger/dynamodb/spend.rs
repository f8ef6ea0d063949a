//! The day's spend ([`SpendBudget`]) as items of the ledger table: `job_id` is
//! `#spend#<YYYY-MM-DD>` (then `#producer#<name>` or `#<account>`), with `spent_micros` (what
//! the limit sees), `held_micros` (of it, what calls not charged yet hold), `limit_micros`, one
//! `model#<name>` a model, and a TTL 40 days after its day (a month's days are all there). Each item is also in the due index
//! under `due_on` `#spend#<YYYY-MM-DD>` (no job's deadline day), set by its first write and
//! never changed, so that `jobctl spend` lists a day's items with one query and no later write
//! costs the index anything. A reservation is one `UpdateItem` conditional on the sum staying
//! within the limit; a charge is one unconditional `UpdateItem`, and one that gives back (costs
//! less than reserved) is sent once, never retried, so that a repeat whose first try landed
//! never takes the day below what its calls cost.

use aws_sdk_dynamodb::types::{AttributeValue, KeysAndAttributes, ReturnValue};
use futures::future::BoxFuture;

use super::item::{Item, get_s, n, s};
use super::{DynamoLedger, Updated, sdk_error};
use crate::job::Millis;
use crate::ledger::LedgerError;
use crate::ledger::LedgerIndex;
use crate::ledger::spend::{DayCount, SPEND_KEY_PREFIX, SpendBudget, until_next_day};

/// The operation that gives the day back what a call did not cost: sent once (see
/// [`DynamoLedger::send_update`]), as an unconditional write repeated would count twice.
pub(super) const GIVE_BACK: &str = "spend give-back";

/// How long a day item outlives the start of the request that wrote it.
/// Forty days: `jobctl spend --month` finds every day of a month until its next one ends.
const TTL_S: i64 = 40 * 86_400;

/// The prefix of the attribute that counts one model.
const MODEL_PREFIX: &str = "model#";
/// The prefix of the attribute that counts what one path's calls were charged.
const PATH_PREFIX: &str = "path#";

/// The most keys one `BatchGetItem` may ask for (DynamoDB's API reference).
const BATCH_GET_MAX: usize = 100;

/// The due index's key of `day`'s items (`day` is an item's key: its first part is the date).
fn due_key(day: &str) -> String {
    let date = day.split('#').next().unwrap_or(day);
    format!("{SPEND_KEY_PREFIX}{date}")
}

impl SpendBudget for DynamoLedger {
    fn reserve<'a>(
        &'a self,
        day: &'a str,
        model: &'a str,
        micros: u64,
        limit: u64,
        now: Millis,
    ) -> BoxFuture<'a, Result<bool, LedgerError>> {
        Box::pin(async move {
            // A call dearer than the whole day never fits: no write.
            let Some(room) = limit.checked_sub(micros) else {
                return Ok(false);
            };
            let model = format!("{MODEL_PREFIX}{model}");
            let updated = self
                .send_update_named(
                    "spend",
                    &format!("{SPEND_KEY_PREFIX}{day}"),
                    (
                        "SET #spent = if_not_exists(#spent, :zero) + :micros, \
                         #held = if_not_exists(#held, :zero) + :micros, \
                         #model = if_not_exists(#model, :zero) + :micros, \
                         #limit = :limit, #ttl = :exp, \
                         #due = if_not_exists(#due, :due), \
                         #deadline = if_not_exists(#deadline, :day_end)",
                        "attribute_not_exists(#spent) OR #spent <= :room",
                    ),
                    vec![
                        (":zero", n(0)),
                        (":micros", n(micros)),
                        (":room", n(room)),
                        (":limit", n(limit)),
                        (":exp", n(now / 1_000 + TTL_S)),
                        (":due", s(&due_key(day))),
                        (":day_end", n(now + until_next_day(now))),
                    ],
                    &[("#model", &model)],
                    ReturnValue::None,
                )
                .await?;
            Ok(matches!(updated, Updated::Applied(_)))
        })
    }

    fn charge<'a>(
        &'a self,
        day: &'a str,
        (model, path): (&'a str, &'a str),
        reserved: u64,
        cost: u64,
        now: Millis,
    ) -> BoxFuture<'a, Result<(), LedgerError>> {
        Box::pin(async move {
            let delta = i128::from(cost) - i128::from(reserved);
            // Less than reserved: given back once. More (a call that cost more than its
            // estimate), or as much: a repeat counts more, never less, so the SDK may retry it.
            let operation = if delta < 0 { GIVE_BACK } else { "spend" };
            let model = format!("{MODEL_PREFIX}{model}");
            let path = format!("{PATH_PREFIX}{path}");
            let mut update = String::from(
                "SET #spent = if_not_exists(#spent, :zero) + :delta, \
                 #held = if_not_exists(#held, :zero) - :reserved, \
                 #model = if_not_exists(#model, :zero) + :delta, #ttl = :exp",
            );
            let mut values = vec![
                (":zero", n(0)),
                (":delta", n(delta)),
                (":reserved", n(reserved)),
                (":exp", n(now / 1_000 + TTL_S)),
            ];
            // What it cost, under its path, and one more call charged, in the same write.
            if cost > 0 && path.len() > PATH_PREFIX.len() {
                update.push_str(", #path = if_not_exists(#path, :zero) + :cost");
                values.push((":cost", n(cost)));
            }
            if cost > 0 {
                update.push_str(", #calls = if_not_exists(#calls, :zero) + :one");
                values.push((":one", n(1)));
            }
            self.send_update_named(
                operation,
                &format!("{SPEND_KEY_PREFIX}{day}"),
                (&update, ""),
                values,
                &[("#model", &model), ("#path", &path), ("#calls", "calls")],
                ReturnValue::None,
            )
            .await
            .map(|_| ())
        })
    }

    fn count<'a>(&'a self, day: &'a str) -> BoxFuture<'a, Result<Vec<DayCount>, LedgerError>> {
        Box::pin(async move {
            let keys = self.day_keys(day).await?;
            let mut counts = Vec::with_capacity(keys.len());
            for chunk in keys.chunks(BATCH_GET_MAX) {
                counts.extend(self.read_days(chunk).await?.iter().filter_map(day_count));
            }
            counts.sort_by(|a, b| a.item.cmp(&b.item));
            Ok(counts)
        })
    }
}

impl DynamoLedger {
    /// The keys of `day`'s items: the due index's partition of the day items
    /// ([`LedgerIndex::due`], over every deadline), page by page.
    async fn day_keys(&self, day: &str) -> Result<Vec<String>, LedgerError> {
        const PAGE: usize = 1_000;
        let partition = due_key(day);
        let mut keys: Vec<(String, Millis)> = Vec::new();
        loop {
            let page = self
                .due(&partition, (0, Millis::MAX), keys.last(), PAGE)
                .await?;
            let full = page.len() == PAGE;
            keys.extend(page);
            if !full {
                return Ok(keys.into_iter().map(|(key, _)| key).collect());
            }
        }
    }

    /// The items `keys` (at most [`BATCH_GET_MAX`]), read consistently; keys DynamoDB left
    /// unprocessed are asked again, a little later each time.
    async fn read_days(&self, keys: &[String]) -> Result<Vec<Item>, LedgerError> {
        let invalid = |e: aws_sdk_dynamodb::error::BuildError| LedgerError::Unavailable {
            operation: "batch_get",
            code: e.to_string(),
        };
        let mut wanted = KeysAndAttributes::builder()
            .set_keys(Some(
                keys.iter()
                    .map(|k| [("job_id".to_owned(), s(k))].into())
                    .collect(),
            ))
            .consistent_read(true)
            .build()
            .map_err(invalid)?;
        let mut items = Vec::with_capacity(keys.len());
        for attempt in 0..8u32 {
            if attempt > 0 {
                tokio::time::sleep(std::time::Duration::from_millis(50 << attempt)).await;
            }
            let read = self
                .client
                .batch_get_item()
                .request_items(&self.table, wanted.clone())
                .send();
            // On the heap, as the ledger's other requests (`send_update_named`).
            let mut out = Box::pin(read)
                .await
                .map_err(|e| sdk_error("batch_get", &e))?;
            if let Some(read) = out.responses.as_mut().and_then(|r| r.remove(&self.table)) {
                items.extend(read);
            }
            match out.unprocessed_keys.and_then(|mut u| u.remove(&self.table)) {
                Some(left) if !left.keys().is_empty() => wanted = left,
                _ => return Ok(items),
            }
        }
        Err(LedgerError::Unavailable {
            operation: "batch_get",
            code: "DynamoDB left keys unprocessed eight times".to_owned(),
        })
    }
}

/// One day item as it counts.
fn day_count(item: &Item) -> Option<DayCount> {
    let signed = |v: &AttributeValue| v.as_n().ok()?.parse::<i64>().ok();
    let item_key = get_s(item, "job_id")?.strip_prefix(SPEND_KEY_PREFIX)?;
    Some(DayCount {
        item: item_key.to_owned(),
        counted: item.get("spent_micros").and_then(signed).unwrap_or(0),
        held: item.get("held_micros").and_then(signed).unwrap_or(0),
        limit: item
            .get("limit_micros")
            .and_then(signed)
            .and_then(|l| u64::try_from(l).ok()),
        models: item
            .iter()
            .filter_map(|(name, v)| Some((name.strip_prefix(MODEL_PREFIX)?.to_owned(), signed(v)?)))
            .collect(),
        paths: item
            .iter()
            .filter_map(|(name, v)| Some((name.strip_prefix(PATH_PREFIX)?.to_owned(), signed(v)?)))
            .collect(),
        calls: item.get("calls").and_then(signed).unwrap_or(0),
    })
}
