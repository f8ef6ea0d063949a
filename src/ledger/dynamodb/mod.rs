//! The ledger in DynamoDB: one item per job, every transition one conditional write with
//! `ReturnValuesOnConditionCheckFailure=ALL_OLD` when refused. A write that creates the item
//! (a fresh claim, a producer's create, an expiry on first sight) is a `PutItem` of the whole
//! item on `attribute_not_exists`, which returns nothing when applied (the item is what was
//! sent); every other one is an `UpdateItem` with `ReturnValues=ALL_NEW`.
//!
//! - this file: the client, the two kinds of conditional write the transitions go through, and
//!   the classification of failed requests;
//! - [`operations`]: one function per transition, each with its condition;
//! - [`item`]: the item codec (attribute values to and from [`JobItem`]);
//! - [`index`]: the table definition and the sparse-index queries ([`LedgerIndex`]).

mod batches;
pub mod billing;
mod index;
mod item;
mod operations;
mod path_times;
mod schedule;
mod spend;

use std::collections::HashMap;

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValue, ReturnValuesOnConditionCheckFailure};
use tracing::Instrument;

pub use index::{ATTENTION_INDEX, DEADLINE_INDEX, DUE_INDEX, INDEXES, IndexKeys};
use item::s;
pub use item::{Item, decode, encode, from_json_image, to_json_image};

#[cfg(doc)]
use super::LedgerIndex;
use super::{JobLedger, LedgerError, Write};
use crate::job::{JobItem, JobState, attention_key};

/// Attribute names, each used through a `#placeholder` (several are DynamoDB reserved words).
const NAMES: [(&str, &str); 47] = [
    ("#id", "job_id"),
    ("#state", "state"),
    ("#epoch", "owner_epoch"),
    ("#attempts", "attempts"),
    ("#max", "max_attempts"),
    ("#digest", "input_digest"),
    ("#contract", "contract"),
    ("#input", "input"),
    ("#meta", "metadata"),
    ("#deadline", "deadline_at"),
    ("#owner", "owner_id"),
    ("#until", "owner_until"),
    ("#log", "attempt_log"),
    ("#rec", "recoveries"),
    ("#dec", "decisions"),
    ("#attn", "attention"),
    ("#result", "result"),
    ("#err", "last_error"),
    ("#created", "created_at"),
    ("#updated", "updated_at"),
    ("#ttl", "expires_at"),
    ("#outcome", "outcome"),
    ("#finished", "finished_at"),
    ("#ref", "provider_ref"),
    ("#enq", "enqueued_at"),
    ("#cancel", "cancel_requested"),
    ("#tenant", "tenant"),
    ("#prio", "priority"),
    ("#rref", "result_ref"),
    ("#inref", "input_ref"),
    ("#due", "due_on"),
    ("#dday", "due_day"),
    ("#thr", "throttles"),
    ("#unsent", "not_sent"),
    ("#gb", "given_back"),
    ("#rdrop", "recoveries_dropped"),
    ("#booked_r", "booked_requests_us"),
    ("#booked_t", "booked_tokens_us"),
    ("#finish", "finish"),
    ("#errors", "errors"),
    ("#excerpt", "excerpt"),
    ("#usage", "usage"),
    ("#maxcost", "max_cost_micros"),
    ("#spent", "spent_micros"),
    ("#held", "held_micros"),
    ("#limit", "limit_micros"),
    ("#progress", "progress"),
];

/// What a conditional `UpdateItem` did: the item after it (`ALL_NEW`, unless the writer asked
/// for nothing), or the item before it when the condition refused it (`ALL_OLD`). Either may be
/// missing from an emulator's answer.
enum Updated {
    Applied(Option<Item>),
    Refused(Option<Item>),
}

/// The DynamoDB job ledger.
#[derive(Debug, Clone)]
pub struct DynamoLedger {
    client: Client,
    table: String,
}

impl DynamoLedger {
    /// A ledger on `table` through `client`.
    pub fn new(client: Client, table: impl Into<String>) -> Self {
        DynamoLedger {
            client,
            table: table.into(),
        }
    }

    /// The table name.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// One conditional `UpdateItem` of a job's item: the index keys follow the state it sets
    /// (`target`), and the item comes back decoded.
    async fn update(
        &self,
        operation: &'static str,
        job_id: &str,
        update: &str,
        condition: &str,
        values: Vec<(&str, AttributeValue)>,
        target: Option<(JobState, bool)>,
    ) -> Result<Write, LedgerError> {
        self.update_to(operation, job_id, update, condition, values, target, None)
            .await
    }

    /// [`DynamoLedger::update`], where the caller may already know the record the write leaves
    /// (`rebuilt`): then nothing comes back when it applies, and `rebuilt` is the answer.
    #[allow(clippy::too_many_arguments)]
    async fn update_to(
        &self,
        operation: &'static str,
        job_id: &str,
        update: &str,
        condition: &str,
        mut values: Vec<(&str, AttributeValue)>,
        target: Option<(JobState, bool)>,
        rebuilt: Option<JobItem>,
    ) -> Result<Write, LedgerError> {
        // Every write that sets a state keeps the sparse attention index in step with it (the
        // state it leaves, and whether it leaves the job watched: `JobItem::watched`).
        let mut update = update.to_owned();
        if let Some((state, watched)) = target {
            // The epoch the write leaves, where it raises one: only a first claim (epoch 1)
            // leaves a running job out of the index; a write that raises none never sets
            // `running`.
            let epoch = values
                .iter()
                .find(|(token, _)| *token == ":new_epoch")
                .and_then(|(_, v)| v.as_n().ok()?.parse().ok())
                .unwrap_or(u64::MAX);
            match attention_key(state, epoch, watched, job_id) {
                Some(key) => {
                    update.push_str(", #attn = :attn");
                    values.push((":attn", s(&key)));
                }
                None => remove_attention(&mut update),
            }
        }
        let returns = match rebuilt {
            Some(_) => ReturnValue::None,
            None => ReturnValue::AllNew,
        };
        let item = match self
            .send_update(operation, job_id, &update, condition, values, returns)
            .await?
        {
            Updated::Applied(item) => item,
            Updated::Refused(old) => return self.refused(job_id, old.as_ref()).await,
        };
        match (rebuilt, item) {
            (Some(record), _) => Ok(Write::Applied(record)),
            (None, Some(item)) => Ok(Write::Applied(decode(&item)?)),
            // ALL_NEW always returns the item; an emulator that omits it gets one more read.
            (None, None) => match self.get(job_id).await? {
                Some(record) => Ok(Write::Applied(record)),
                None => Err(LedgerError::Corrupt {
                    job_id: job_id.to_owned(),
                    detail: "applied write left no item".to_owned(),
                }),
            },
        }
    }

    /// Sends one conditional `UpdateItem` on the item `key` (a job's, or a schedule's),
    /// returning `returns` when it applies and the whole item when it is refused. Only the
    /// placeholders the expressions use are sent (DynamoDB rejects unused ones).
    async fn send_update(
        &self,
        operation: &'static str,
        key: &str,
        update: &str,
        condition: &str,
        values: Vec<(&str, AttributeValue)>,
        returns: ReturnValue,
    ) -> Result<Updated, LedgerError> {
        self.send_update_named(operation, key, (update, condition), values, &[], returns)
            .await
    }

    /// [`DynamoLedger::send_update`] with names of its own beside [`NAMES`] (`(placeholder,
    /// attribute)`): attributes named after what they count.
    async fn send_update_named(
        &self,
        operation: &'static str,
        key: &str,
        (update, condition): (&str, &str),
        values: Vec<(&str, AttributeValue)>,
        own_names: &[(&str, &str)],
        returns: ReturnValue,
    ) -> Result<Updated, LedgerError> {
        // A few dozen tokens at most: a list is cheaper than hashing each.
        let used: Vec<&str> = placeholders(update)
            .chain(placeholders(condition))
            .collect();
        // Each name the expressions use, looked up once (a name of its own before the shared
        // ones), into maps sized for them from the start.
        let mut names = HashMap::with_capacity(used.len());
        for token in used.iter().filter(|t| t.starts_with('#')) {
            if names.contains_key(*token) {
                continue;
            }
            if let Some((_, name)) = own_names.iter().chain(&NAMES).find(|(t, _)| t == token) {
                names.insert((*token).to_owned(), (*name).to_owned());
            }
        }
        let mut sent = HashMap::with_capacity(values.len());
        sent.extend(
            values
                .into_iter()
                .filter(|(token, _)| used.contains(token))
                .map(|(token, value)| (token.to_owned(), value)),
        );
        let values: HashMap<String, AttributeValue> = sent;
        let request = self
            .client
            .update_item()
            .table_name(&self.table)
            .key("job_id", s(key))
            .update_expression(update)
            // An adjustment of the day's spend is the one write without a condition.
            .set_condition_expression((!condition.is_empty()).then(|| condition.to_owned()))
            .set_expression_attribute_names(Some(names))
            .set_expression_attribute_values(Some(values))
            .return_values(returns)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld);
        let span = tracing::debug_span!("ledger", operation, job_id = key);
        let sent = if operation == spend::GIVE_BACK {
            // Sent once, never retried by the SDK: a retry of one whose answer was lost would
            // take the day below what was spent; one lost leaves it above, never below.
            let once = aws_sdk_dynamodb::config::Builder::default()
                .retry_config(aws_sdk_dynamodb::config::retry::RetryConfig::disabled());
            Box::pin(
                request
                    .customize()
                    .config_override(once)
                    .send()
                    .instrument(span),
            )
            .await
        } else {
            // On the heap: the SDK's future is kilobytes, and every future that awaits a
            // ledger write would otherwise carry it (and be copied with it).
            Box::pin(request.send().instrument(span)).await
        };
        match sent {
            Ok(out) => Ok(Updated::Applied(out.attributes)),
            Err(SdkError::ServiceError(e)) => match e.into_err() {
                UpdateItemError::ConditionalCheckFailedException(refused) => {
                    Ok(Updated::Refused(refused.item))
                }
                other => Err(classify(operation, other.code())),
            },
            Err(other) => Err(transport_error(operation, &other)),
        }
    }

    /// Reads the item `key` (a job's, or a schedule's).
    async fn get_item(
        &self,
        operation: &'static str,
        key: &str,
        consistent: bool,
    ) -> Result<Option<Item>, LedgerError> {
        let read = self
            .client
            .get_item()
            .table_name(&self.table)
            .key("job_id", s(key))
            .consistent_read(consistent)
            .send()
            .instrument(tracing::debug_span!("ledger", operation, job_id = key));
        let out = Box::pin(read).await.map_err(|e| sdk_error(operation, &e))?;
        Ok(out.item)
    }

    /// Creates an item whole: one `PutItem` on `attribute_not_exists(job_id)`. The table has no
    /// update expression to evaluate, and nothing comes back when it applies, since the item is
    /// the record sent; a refusal returns the item that was there.
    async fn put_new(
        &self,
        operation: &'static str,
        record: JobItem,
    ) -> Result<Write, LedgerError> {
        let job_id = record.job_id.as_str();
        let put = self
            .client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(encode(&record)))
            .condition_expression("attribute_not_exists(job_id)")
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .instrument(tracing::debug_span!("ledger", operation, job_id));
        let sent = Box::pin(put).await;
        match sent {
            Ok(_) => Ok(Write::Applied(record)),
            Err(SdkError::ServiceError(e)) => match e.err() {
                PutItemError::ConditionalCheckFailedException(refused) => {
                    self.refused(job_id, refused.item()).await
                }
                other => Err(classify(operation, other.code())),
            },
            Err(other) => Err(transport_error(operation, &other)),
        }
    }

    /// A refused write, with the item `ALL_OLD` returned. It is absent when there was no item,
    /// and some emulators omit it: then a consistent read tells.
    async fn refused(&self, job_id: &str, old: Option<&Item>) -> Result<Write, LedgerError> {
        match old {
            Some(old) => Ok(Write::Refused(Some(decode(old)?))),
            None => Ok(Write::Refused(self.get(job_id).await?)),
        }
    }
}

fn classify(operation: &'static str, code: Option<&str>) -> LedgerError {
    match code {
        Some(
            "ProvisionedThroughputExceededException"
            | "ThrottlingException"
            | "RequestLimitExceeded",
        ) => LedgerError::Throttled { operation },
        Some("ValidationException") => LedgerError::Rejected {
            operation,
            code: "ValidationException".to_owned(),
        },
        Some(code) => LedgerError::Unavailable {
            operation,
            code: code.to_owned(),
        },
        // The message is not kept: a service message may quote request values.
        None => LedgerError::Unavailable {
            operation,
            code: "unclassified".to_owned(),
        },
    }
}

/// Classifies a failed request that was not a refused condition.
fn sdk_error<E: ProvideErrorMetadata, R>(
    operation: &'static str,
    err: &SdkError<E, R>,
) -> LedgerError {
    match err {
        SdkError::ServiceError(se) => classify(operation, se.err().code()),
        other => transport_error(operation, other),
    }
}

fn transport_error<E, R>(operation: &'static str, err: &SdkError<E, R>) -> LedgerError {
    let code = match err {
        SdkError::TimeoutError(_) => "timeout",
        SdkError::DispatchFailure(_) => "dispatch_failure",
        SdkError::ResponseError(_) => "response_error",
        SdkError::ConstructionFailure(_) => "construction_failure",
        _ => "sdk_error",
    };
    LedgerError::Unavailable {
        operation,
        code: code.to_owned(),
    }
}

/// The whole placeholders (`#name`, `:value`) `expr` uses, in one pass.
fn placeholders(expr: &str) -> impl Iterator<Item = &str> {
    expr.match_indices(['#', ':']).map(|(at, _)| {
        let rest = &expr[at + 1..];
        let len = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        &expr[at..=at + len]
    })
}

/// Adds `#attn` to the update's `REMOVE` clause, or a clause of its own: an expression may
/// name each clause once.
fn remove_attention(update: &mut String) {
    let Some(at) = update.find("REMOVE ") else {
        update.push_str(" REMOVE #attn");
        return;
    };
    let paths = at + "REMOVE ".len();
    let end = [" ADD ", " SET ", " DELETE "]
        .iter()
        .filter_map(|clause| update[paths..].find(clause))
        .min()
        .map_or(update.len(), |e| paths + e);
    update.insert_str(end, ", #attn");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_update_names_its_remove_clause_once() {
        let mut plain = String::from("SET #a = :a");
        remove_attention(&mut plain);
        assert_eq!(plain, "SET #a = :a REMOVE #attn");
        let mut give_back = String::from("REMOVE #log[0] ADD #thr :one SET #a = :a");
        remove_attention(&mut give_back);
        assert_eq!(give_back, "REMOVE #log[0], #attn ADD #thr :one SET #a = :a");
        let mut last = String::from("SET #a = :a REMOVE #x");
        remove_attention(&mut last);
        assert_eq!(last, "SET #a = :a REMOVE #x, #attn");
    }

    #[test]
    fn placeholders_are_whole_tokens() {
        let found = |expr| placeholders(expr).collect::<Vec<_>>();
        assert_eq!(found("#a = :now"), ["#a", ":now"]);
        assert_eq!(found("#a = :now_x"), ["#a", ":now_x"]);
        assert_eq!(
            found("#log[0].#outcome = :o, #logs = list_append(#logs, :l)"),
            ["#log", "#outcome", ":o", "#logs", "#logs", ":l"]
        );
        assert_eq!(
            found("#state IN (:ready,:retry)"),
            ["#state", ":ready", ":retry"]
        );
    }
}
