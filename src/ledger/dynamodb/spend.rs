//! The day's spend ([`SpendBudget`]) as an item of the ledger table: `job_id` is
//! `#spend#<YYYY-MM-DD>`, with `spent_micros`, and a TTL two days after its day. A reservation
//! is one `UpdateItem` conditional on the sum staying within the limit; an adjustment is one
//! unconditional `UpdateItem` (a give-back may take the sum below what any call reserved, never
//! above what they cost).

use aws_sdk_dynamodb::types::ReturnValue;
use futures::future::BoxFuture;

use super::item::n;
use super::{DynamoLedger, Updated};
use crate::job::Millis;
use crate::ledger::LedgerError;
use crate::ledger::spend::{SPEND_KEY_PREFIX, SpendBudget};

/// How long a day item outlives the start of the request that wrote it.
const TTL_S: i64 = 2 * 86_400;

impl SpendBudget for DynamoLedger {
    fn reserve<'a>(
        &'a self,
        day: &'a str,
        micros: u64,
        limit: u64,
        now: Millis,
    ) -> BoxFuture<'a, Result<bool, LedgerError>> {
        Box::pin(async move {
            // A call dearer than the whole day never fits: no write.
            let Some(room) = limit.checked_sub(micros) else {
                return Ok(false);
            };
            let updated = self
                .send_update(
                    "spend",
                    &format!("{SPEND_KEY_PREFIX}{day}"),
                    "SET #spent = if_not_exists(#spent, :zero) + :micros, #ttl = :exp",
                    "attribute_not_exists(#spent) OR #spent <= :room",
                    vec![
                        (":zero", n(0)),
                        (":micros", n(micros)),
                        (":room", n(room)),
                        (":exp", n(now / 1_000 + TTL_S)),
                    ],
                    ReturnValue::None,
                )
                .await?;
            Ok(matches!(updated, Updated::Applied(_)))
        })
    }

    fn adjust<'a>(
        &'a self,
        day: &'a str,
        delta: i64,
        now: Millis,
    ) -> BoxFuture<'a, Result<(), LedgerError>> {
        Box::pin(async move {
            if delta == 0 {
                return Ok(());
            }
            self.send_update(
                "spend",
                &format!("{SPEND_KEY_PREFIX}{day}"),
                "SET #spent = if_not_exists(#spent, :zero) + :delta, #ttl = :exp",
                "",
                vec![
                    (":zero", n(0)),
                    (":delta", n(delta)),
                    (":exp", n(now / 1_000 + TTL_S)),
                ],
                ReturnValue::None,
            )
            .await
            .map(|_| ())
        })
    }
}
