//! The call schedule ([`CallSchedule`]) as an item of the ledger table: `job_id` is
//! `#schedule#<key>`, with `booked_requests_us` and `booked_tokens_us`, and a TTL a day ahead.
//!
//! While the provider is busy (both booked past now, within the horizon) a reservation is one
//! `UpdateItem` that adds its cost to both. A refusal returns the item (`ALL_OLD`): booked past
//! the horizon, the writer waits and nothing was written; idle (or no item yet), the writer
//! computes the new state with [`apply_reserve`] and writes it conditional on the state it saw.

use std::collections::HashMap;

use futures::future::BoxFuture;

use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValue, ReturnValuesOnConditionCheckFailure};
use tracing::Instrument;

use super::item::{Item, get_n, n};
use super::{DynamoLedger, classify, sdk_error, transport_error};
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
    async fn schedule_write(
        &self,
        key: &str,
        update: &str,
        condition: &str,
        values: Vec<(&str, AttributeValue)>,
    ) -> Result<Sent, LedgerError> {
        let names = HashMap::from([
            ("#r".to_owned(), "booked_requests_us".to_owned()),
            ("#t".to_owned(), "booked_tokens_us".to_owned()),
            ("#exp".to_owned(), "expires_at".to_owned()),
            ("#id".to_owned(), "job_id".to_owned()),
        ]);
        let names = names
            .into_iter()
            .filter(|(token, _)| {
                update.contains(token.as_str()) || condition.contains(token.as_str())
            })
            .collect();
        let values = values
            .into_iter()
            .map(|(token, value)| (token.to_owned(), value))
            .collect();
        let sent = self
            .client
            .update_item()
            .table_name(&self.table)
            .key("job_id", AttributeValue::S(key.to_owned()))
            .update_expression(update)
            .condition_expression(condition)
            .set_expression_attribute_names(Some(names))
            .set_expression_attribute_values(Some(values))
            .return_values(ReturnValue::AllNew)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .instrument(tracing::debug_span!("ledger", operation = "reserve"))
            .await;
        match sent {
            Ok(out) => Ok(Sent::Applied(out.attributes().cloned().unwrap_or_default())),
            Err(SdkError::ServiceError(e)) => match e.err() {
                UpdateItemError::ConditionalCheckFailedException(refused) => match refused.item() {
                    Some(item) => Ok(Sent::Refused(booked(item))),
                    // Some emulators omit the item: a consistent read tells.
                    None => self.read_schedule(key, true).await.map(Sent::Refused),
                },
                other => Err(classify("reserve", other.code())),
            },
            Err(other) => Err(transport_error("reserve", &other)),
        }
    }
}

impl DynamoLedger {
    async fn read_schedule(
        &self,
        key: &str,
        consistent: bool,
    ) -> Result<Option<Booked>, LedgerError> {
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .key("job_id", AttributeValue::S(key.to_owned()))
            .consistent_read(consistent)
            .send()
            .await
            .map_err(|e| sdk_error("reserve", &e))?;
        Ok(out.item().and_then(booked))
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
                "SET #r = #r + :cr, #t = #t + :ct, #exp = :exp",
                "#r >= :now AND #t >= :now AND #r <= :h AND #t <= :h",
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
                    "#r = :or AND #t = :ot"
                }
            };
            let update = "SET #r = :nr, #t = :nt, #exp = :exp";
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
