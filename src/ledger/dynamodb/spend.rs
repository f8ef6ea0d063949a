//! The day's spend ([`SpendBudget`]) as an item of the ledger table: `job_id` is
//! `#spend#<YYYY-MM-DD>`, with `spent_micros`, and a TTL two days after its day. A reservation
//! is one `UpdateItem` conditional on the sum staying within the limit; an adjustment is one
//! unconditional `UpdateItem`, and a give-back (less than reserved) is sent once, never retried,
//! so that a repeat whose first try landed never takes the day below what its calls cost.

use aws_sdk_dynamodb::types::ReturnValue;
use futures::future::BoxFuture;

use super::item::n;
use super::{DynamoLedger, Updated};
use crate::job::Millis;
use crate::ledger::LedgerError;
use crate::ledger::spend::{SPEND_KEY_PREFIX, SpendBudget};

/// The operation that gives the day back what a call did not cost: sent once (see
/// [`DynamoLedger::send_update`]), as an unconditional write repeated would count twice.
pub(super) const GIVE_BACK: &str = "spend give-back";

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
            // Less than reserved: given back once. More (a call that cost more than its
            // estimate): a repeat counts more, never less, so the SDK may retry it.
            let operation = if delta < 0 { GIVE_BACK } else { "spend" };
            self.send_update(
                operation,
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
