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

#[cfg(test)]
use crate::events::Target;
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
    /// The item's key (DynamoDB JSON).
    #[serde(rename = "Keys", default, skip_serializing_if = "Option::is_none")]
    pub keys: Option<Map<String, Value>>,
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
    /// Records that could not be decoded (logged, passed over).
    pub undecodable: usize,
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
pub(crate) struct Undecodable {
    /// Its sequence number.
    pub sequence: Option<String>,
    /// Why (never item content).
    pub reason: String,
}

/// The event a stream record announces, if any: a new image whose state is terminal or
/// `unknown` and differs from the old image's.
pub(crate) fn event_of(record: &StreamRecord) -> Result<Option<CompletionEvent>, Undecodable> {
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

/// Publishes the events of one stream batch through `sink`. A record that cannot be decoded
/// is logged (its sequence number and job id, never content), counted and passed over: no
/// retry could decode it, and stopping there would have Lambda give up on every record after
/// it. `jobctl events replay --job` publishes its event from the item once it is readable.
pub async fn dispatch(event: &StreamEvent, sink: &impl EventSink) -> DispatchReport {
    let mut report = DispatchReport::default();
    // The events, each with the index of its record.
    let mut events: Vec<(usize, CompletionEvent)> = Vec::new();
    let mut stop_at = None;
    for (i, record) in event.records.iter().enumerate() {
        match event_of(record) {
            Ok(Some(e)) => events.push((i, e)),
            Ok(None) => report.skipped += 1,
            Err(e) => {
                let job_id = record
                    .dynamodb
                    .keys
                    .as_ref()
                    .and_then(|k| k.get("job_id")?.get("S")?.as_str().map(str::to_owned));
                tracing::error!(error = %e, job_id, "a stream record could not be decoded; its event is not published");
                report.undecodable += 1;
            }
        }
    }
    let batch: Vec<CompletionEvent> = events.iter().map(|(_, e)| e.clone()).collect();
    match crate::events::publish(sink, &batch).await {
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
    // A record without a sequence number (stream records always have one) is named with an
    // empty identifier, which Lambda takes as a failure of the whole batch: the safe outcome.
    report.failed_at = stop_at.map(|i| {
        event.records[i]
            .dynamodb
            .sequence_number
            .clone()
            .unwrap_or_default()
    });
    report
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::RecordingSink;
    use serde_json::json;

    fn image(state: &str, epoch: u64) -> Map<String, Value> {
        let n = |v: i64| json!({ "N": v.to_string() });
        let s = |v: &str| json!({ "S": v });
        let mut m = Map::new();
        m.insert("job_id".into(), s("j-1"));
        m.insert("state".into(), s(state));
        m.insert("owner_epoch".into(), n(epoch as i64));
        m.insert("attempts".into(), n(epoch as i64));
        m.insert("max_attempts".into(), n(3));
        m.insert("input_digest".into(), s("d"));
        m.insert("contract".into(), s("c"));
        m.insert("input".into(), s(r#"{"prompt":"do not leak"}"#));
        m.insert("metadata".into(), s(r#"{"order":7}"#));
        m.insert("deadline_at".into(), n(10_000));
        m.insert("created_at".into(), n(1));
        m.insert("updated_at".into(), n(2));
        m.insert("expires_at".into(), n(3));
        if state == "succeeded" {
            m.insert("result".into(), s(r#"{"output":"ok"}"#));
        }
        m
    }

    fn record(seq: &str, old: Option<(&str, u64)>, new: Option<(&str, u64)>) -> StreamRecord {
        StreamRecord {
            event_name: Some(if old.is_none() { "INSERT" } else { "MODIFY" }.into()),
            dynamodb: StreamChange {
                new_image: new.map(|(s, e)| image(s, e)),
                old_image: old.map(|(s, e)| image(s, e)),
                sequence_number: Some(seq.into()),
                keys: None,
            },
        }
    }

    #[tokio::test]
    async fn only_entering_a_terminal_state_or_unknown_is_announced() {
        let event = StreamEvent {
            records: vec![
                record("1", None, Some(("ready", 0))),
                record("2", Some(("ready", 0)), Some(("running", 1))),
                record("3", Some(("running", 1)), Some(("unknown", 1))),
                record("4", Some(("unknown", 1)), Some(("unknown", 1))),
                record("5", Some(("unknown", 1)), Some(("running", 2))),
                record("6", Some(("running", 2)), Some(("succeeded", 2))),
                record("7", Some(("succeeded", 2)), None),
            ],
        };
        let sink = RecordingSink::new();
        let report = dispatch(&event, &sink).await;
        assert_eq!((report.published, report.skipped), (2, 5));
        assert!(report.response().batch_item_failures.is_empty());
        let published = sink.published();
        let states: Vec<&str> = published.iter().map(|e| e.state.as_str()).collect();
        assert_eq!(states, ["unknown", "succeeded"]);
        let done = &published[1].detail;
        assert_eq!(done["result"]["output"], "ok");
        assert_eq!(done["metadata"]["order"], 7);
        assert_eq!(done["epoch"], 2);
        assert!(!done.to_string().contains("do not leak"));
    }

    #[tokio::test]
    async fn a_failed_publish_names_its_record_and_the_retry_yields_the_same_events() {
        let event = StreamEvent {
            records: vec![
                record("10", Some(("running", 1)), Some(("failed_terminal", 1))),
                record("11", Some(("ready", 0)), Some(("running", 1))),
                record("12", None, Some(("expired", 0))),
            ],
        };
        let sink = RecordingSink::new();
        sink.refuse_after(Some(1));
        let report = dispatch(&event, &sink).await;
        assert_eq!(report.failed_at.as_deref(), Some("12"));
        assert_eq!(
            report.response().batch_item_failures,
            vec![ItemFailure {
                item_identifier: "12".into()
            }]
        );
        // Lambda retries from the failed record; a whole redelivery repeats ids, never changes them.
        sink.refuse_after(None);
        let retried = dispatch(&event, &sink).await;
        assert_eq!(retried.failed_at, None);
        let ids: Vec<String> = sink.published().iter().map(|e| e.id.clone()).collect();
        assert_eq!(ids.len(), 3);
        assert_eq!(ids[0], ids[1]);
        assert_ne!(ids[1], ids[2]);
    }

    #[tokio::test]
    async fn an_undecodable_record_is_passed_over_and_its_neighbours_published() {
        let mut bad = record("21", Some(("running", 1)), Some(("succeeded", 1)));
        if let Some(image) = bad.dynamodb.new_image.as_mut() {
            image.remove("owner_epoch");
        }
        let event = StreamEvent {
            records: vec![
                record("20", Some(("running", 1)), Some(("expired", 1))),
                bad,
                record("22", Some(("running", 1)), Some(("expired", 1))),
            ],
        };
        let sink = RecordingSink::new();
        let report = dispatch(&event, &sink).await;
        // Stopping at it would have Lambda give up on record 22 after its retries.
        assert_eq!(report.failed_at, None);
        assert_eq!((report.published, report.undecodable), (2, 1));
        assert_eq!(sink.published().len(), 2);
    }

    #[tokio::test]
    async fn ten_large_answers_go_in_requests_that_fit_each_target() {
        // GIVEN ten jobs that succeeded with 30 KiB answers (ten events make 300 KiB)
        let answer = format!(r#"{{"output":"{}"}}"#, "a".repeat(30 * 1024));
        let records: Vec<StreamRecord> = (0..10)
            .map(|i| {
                let mut r = record(
                    &format!("{}", 40 + i),
                    Some(("running", 1)),
                    Some(("succeeded", 1)),
                );
                if let Some(image) = r.dynamodb.new_image.as_mut() {
                    image.insert("job_id".into(), json!({ "S": format!("big-{i}") }));
                    image.insert("result".into(), json!({ "S": answer }));
                }
                r
            })
            .collect();
        let event = StreamEvent { records };
        for target in [Target::EventBridge, Target::Sns, Target::Sqs] {
            // WHEN they are dispatched to a sink that refuses a request over its target's limit
            let sink = RecordingSink::of(target);
            let report = dispatch(&event, &sink).await;
            // THEN every event is published, with its answer, in requests that fit
            assert_eq!(
                (report.published, report.failed_at.clone()),
                (10, None),
                "{target:?}"
            );
            let requests = sink.requests();
            assert_eq!(requests.iter().sum::<usize>(), 10);
            if target == Target::Sqs {
                assert_eq!(requests, [10]);
            } else {
                assert!(requests.len() >= 2, "{target:?}: {requests:?}");
            }
            assert!(
                sink.published()
                    .iter()
                    .all(|e| e.detail["result"]["output"].is_string())
            );
        }
    }

    #[tokio::test]
    async fn an_event_too_large_for_a_request_goes_without_its_answer() {
        // GIVEN an event whose answer alone is over 256 KiB (an inline limit raised that far)
        let record = record("50", Some(("running", 1)), Some(("succeeded", 1)));
        let mut event = event_of(&record).expect("decodes").expect("announced");
        event.detail["result"] = json!({ "output": "x".repeat(300 * 1024) });
        // WHEN it is published to an SNS topic
        let sink = RecordingSink::of(Target::Sns);
        crate::events::publish(&sink, &[event])
            .await
            .expect("published");
        // THEN it carries where the answer is instead
        let sent = &sink.published()[0].detail;
        assert!(sent.get("result").is_none());
        assert_eq!(sent["result_in_ledger"], true);
    }
}
