//! The call schedule ([`CallSchedule`]) as an item of the ledger table: `job_id` is
//! `#schedule#<key>`, with `booked_requests_us` and `booked_tokens_us`, and a TTL a day ahead.
//!
//! While the provider is busy (both booked past now, within the horizon) a reservation is one
//! `UpdateItem` that adds its cost to both. A refusal returns the item (`ALL_OLD`): booked past
//! the horizon, the writer waits and nothing was written; idle (or no item yet), the writer
//! computes the new state with [`apply_reserve`] and writes it conditional on the state it saw.

use aws_sdk_dynamodb::types::{AttributeValue, ReturnValue};
use futures::future::BoxFuture;

use super::item::{Item, get_n, n};
use super::{DynamoLedger, Updated};
use crate::ledger::LedgerError;
use crate::ledger::schedule::{
    Booked, CallSchedule, Reservation, ReserveRequest, SCHEDULE_KEY_PREFIX, apply_reserve, ceil_ms,
};

/// Writes one reservation may take when other writers race it on an idle schedule.
const TRIES: usize = 3;
/// How long a schedule item outlives its last reservation.
const TTL_S: i64 = 86_400;

/// What one write did.
enum Sent {
    Applied(Item),
    Refused(Option<Booked>),
}

impl DynamoLedger {
    /// One conditional write of the schedule item, through the ledger's own `UpdateItem` path.
    async fn schedule_write(
        &self,
        key: &str,
        update: &str,
        condition: &str,
        values: Vec<(&str, AttributeValue)>,
    ) -> Result<Sent, LedgerError> {
        match self
            .send_update(
                "reserve",
                key,
                update,
                condition,
                values,
                ReturnValue::AllNew,
            )
            .await?
        {
            Updated::Applied(item) => Ok(Sent::Applied(item.unwrap_or_default())),
            Updated::Refused(Some(item)) => Ok(Sent::Refused(booked(&item))),
            // Some emulators omit the item: a consistent read tells.
            Updated::Refused(None) => self.read_schedule(key, true).await.map(Sent::Refused),
        }
    }
}

impl DynamoLedger {
    async fn read_schedule(
        &self,
        key: &str,
        consistent: bool,
    ) -> Result<Option<Booked>, LedgerError> {
        let item = self.get_item("reserve", key, consistent).await?;
        Ok(item.as_ref().and_then(booked))
    }
}

fn booked(item: &Item) -> Option<Booked> {
    Some(Booked {
        requests_us: get_n(item, "booked_requests_us")?,
        tokens_us: get_n(item, "booked_tokens_us")?,
    })
}

impl CallSchedule for DynamoLedger {
    fn reserve(&self, req: ReserveRequest) -> BoxFuture<'_, Result<Reservation, LedgerError>> {
        Box::pin(self.reserve_chunk(req))
    }

    fn peek<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<Booked>, LedgerError>> {
        Box::pin(async move {
            let key = format!("{SCHEDULE_KEY_PREFIX}{key}");
            self.read_schedule(&key, false).await
        })
    }
}

impl DynamoLedger {
    async fn reserve_chunk(&self, req: ReserveRequest) -> Result<Reservation, LedgerError> {
        let key = format!("{SCHEDULE_KEY_PREFIX}{}", req.key);
        let (cost_r, cost_t) = req.limits.cost_us(req.requests, req.tokens);
        let expires = n(req.now / 1_000 + TTL_S);
        // Busy: both resources booked from now on and within the horizon.
        let sent = self
            .schedule_write(
                &key,
                "SET #booked_r = #booked_r + :cr, #booked_t = #booked_t + :ct, #ttl = :exp",
                "#booked_r >= :now AND #booked_t >= :now AND #booked_r <= :h AND #booked_t <= :h",
                vec![
                    (":cr", n(cost_r)),
                    (":ct", n(cost_t)),
                    (":exp", expires.clone()),
                    (":now", n(req.now.saturating_mul(1_000))),
                    (":h", n(req.horizon_end_us())),
                ],
            )
            .await?;
        let mut seen = match sent {
            Sent::Applied(item) => {
                let after = booked(&item).ok_or_else(|| LedgerError::Corrupt {
                    job_id: key.clone(),
                    detail: "schedule item without its bookings".to_owned(),
                })?;
                let start_us = (after.requests_us.saturating_sub(cost_r))
                    .max(after.tokens_us.saturating_sub(cost_t));
                return Ok(Reservation::Granted {
                    start: ceil_ms(start_us).max(req.now),
                });
            }
            Sent::Refused(seen) => seen,
        };
        for _ in 0..TRIES {
            let (next, got) = apply_reserve(seen, &req);
            let Some(next) = next.filter(|_| matches!(got, Reservation::Granted { .. })) else {
                return Ok(got);
            };
            // Idle, or not created yet: the new state, conditional on the one seen.
            let mut values = vec![
                (":nr", n(next.requests_us)),
                (":nt", n(next.tokens_us)),
                (":exp", expires.clone()),
            ];
            let condition = match seen {
                None => "attribute_not_exists(#id)",
                Some(old) => {
                    values.push((":or", n(old.requests_us)));
                    values.push((":ot", n(old.tokens_us)));
                    "#booked_r = :or AND #booked_t = :ot"
                }
            };
            let update = "SET #booked_r = :nr, #booked_t = :nt, #ttl = :exp";
            match self.schedule_write(&key, update, condition, values).await? {
                Sent::Applied(_) => return Ok(got),
                Sent::Refused(now_seen) => seen = now_seen,
            }
        }
        // Raced on every try: somebody else got the capacity just now.
        Ok(Reservation::Booked {
            until: req.now + 1_000,
        })
    }
}
