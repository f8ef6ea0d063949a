//! The dispatcher: a DynamoDB stream event source mapping on the ledger table, with partial
//! batch responses. Each stream record that moves a job into a terminal state, or into
//! `unknown`, becomes one [`CompletionEvent`]; every other record is skipped from the two state
//! attributes alone, without decoding the item.
//!
//! Records are published in stream order. When publishing fails, the failed record's sequence
//! number is reported and nothing after it is attempted: Lambda retries from that record, and
//! the events already published before it are not sent again. A record redelivered anyway
//! yields the same event, with the same id (job id, epoch and state).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::events::{CompletionEvent, EventSink, announced};
use crate::job::JobState;
use crate::ledger::dynamodb::{decode, from_json_image};

/// A DynamoDB stream event, as Lambda delivers it (only what the dispatcher reads).
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
pub struct StreamEvent {
    /// The records, in stream order.
    #[serde(rename = "Records", default)]
    pub records: Vec<StreamRecord>,
}

/// One stream record.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
pub struct StreamRecord {
    /// `INSERT`, `MODIFY` or `REMOVE`.
    #[serde(rename = "eventName", default)]
    pub event_name: Option<String>,
    /// The change.
    #[serde(default)]
    pub dynamodb: StreamChange,
}

/// The change a stream record carries.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
pub struct StreamChange {
    /// The item after the change (DynamoDB JSON).
    #[serde(rename = "NewImage", default, skip_serializing_if = "Option::is_none")]
    pub new_image: Option<Map<String, Value>>,
    /// The item before the change (DynamoDB JSON).
    #[serde(rename = "OldImage", default, skip_serializing_if = "Option::is_none")]
    pub old_image: Option<Map<String, Value>>,
    /// The record's position in its shard: what a batch item failure names.
    #[serde(rename = "SequenceNumber", default)]
    pub sequence_number: Option<String>,
}

/// The partial batch response of a stream event source mapping.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamResponse {
    /// At most one: the first record not handled.
    #[serde(rename = "batchItemFailures")]
    pub batch_item_failures: Vec<ItemFailure>,
}

/// A record Lambda must retry from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ItemFailure {
    /// Its sequence number.
    #[serde(rename = "itemIdentifier")]
    pub item_identifier: String,
}

/// What one batch came to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DispatchReport {
    /// Events published.
    pub published: usize,
    /// Records that announce nothing.
    pub skipped: usize,
    /// The sequence number Lambda retries from, if publishing stopped.
    pub failed_at: Option<String>,
}

impl DispatchReport {
    /// The response for Lambda.
    pub fn response(&self) -> StreamResponse {
        StreamResponse {
            batch_item_failures: self
                .failed_at
                .iter()
                .map(|seq| ItemFailure {
                    item_identifier: seq.clone(),
                })
                .collect(),
        }
    }
}

/// Why a record could not be turned into its event.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("stream record {sequence:?}: {reason}")]
pub struct Undecodable {
    /// Its sequence number.
    pub sequence: Option<String>,
    /// Why (never item content).
    pub reason: String,
}

/// The event a stream record announces, if any: a new image whose state is terminal or
/// `unknown` and differs from the old image's.
pub fn event_of(record: &StreamRecord) -> Result<Option<CompletionEvent>, Undecodable> {
    let change = &record.dynamodb;
    let state_of = |image: &Option<Map<String, Value>>| -> Option<String> {
        image
            .as_ref()?
            .get("state")?
            .get("S")?
            .as_str()
            .map(str::to_owned)
    };
    let Some(new_state) = state_of(&change.new_image) else {
        return Ok(None); // a removal (TTL), or an image without a state
    };
    let entered = new_state.parse::<JobState>().is_ok_and(announced)
        && state_of(&change.old_image).as_deref() != Some(new_state.as_str());
    if !entered {
        return Ok(None);
    }
    let undecodable = |reason: String| Undecodable {
        sequence: change.sequence_number.clone(),
        reason,
    };
    let image = change.new_image.as_ref().map(from_json_image);
    let item = image
        .flatten()
        .ok_or_else(|| undecodable("the new image is not DynamoDB JSON".to_owned()))?;
    let job = decode(&item).map_err(|e| undecodable(e.to_string()))?;
    Ok(CompletionEvent::of(&job))
}

/// Publishes the events of one stream batch through `sink`.
pub async fn dispatch(event: &StreamEvent, sink: &impl EventSink) -> DispatchReport {
    let mut report = DispatchReport::default();
    // The events, each with the index of its record, up to the first undecodable record.
    let mut events: Vec<(usize, CompletionEvent)> = Vec::new();
    let mut stop_at = None;
    for (i, record) in event.records.iter().enumerate() {
        match event_of(record) {
            Ok(Some(e)) => events.push((i, e)),
            Ok(None) => report.skipped += 1,
            Err(e) => {
                tracing::error!(error = %e, "a stream record could not be decoded");
                stop_at = Some(i);
                break;
            }
        }
    }
    let batch: Vec<CompletionEvent> = events.iter().map(|(_, e)| e.clone()).collect();
    match sink.publish(&batch).await {
        Ok(()) => report.published = batch.len(),
        Err((first, why)) => {
            tracing::warn!(reason = %why, "publishing completion events failed; the rest is retried");
            report.published = first;
            stop_at = Some(events[first].0);
        }
    }
    for (_, e) in &events[..report.published] {
        tracing::info!(job_id = %e.job_id, state = e.state.as_str(), event_id = %e.id, "completion event published");
    }
    report.failed_at = stop_at.map(|i| {
        event.records[i]
            .dynamodb
            .sequence_number
            .clone()
            .unwrap_or_default()
    });
    report
}
