//! A local stream event source mapping: what Lambda does between a table's DynamoDB stream and
//! the dispatcher, for the demo and the tests on the emulator.
//!
//! It reads every shard of the table's stream from where it last stopped, builds the stream
//! event Lambda would send (images in DynamoDB JSON), invokes the dispatcher, and keeps the
//! checkpoint as Lambda does: after the last record when the response names no failure, at the
//! failed record when it names one (that record and those after it come again).

use std::collections::HashMap;

use aws_sdk_dynamodbstreams::Client;
use aws_sdk_dynamodbstreams::types::{AttributeValue, ShardIteratorType};
use serde_json::{Map, Value, json};

use crate::ops::dispatch::{StreamChange, StreamEvent, StreamRecord, StreamResponse};

/// The local stream event source of one table.
#[derive(Debug)]
pub struct LocalStreamSource {
    client: Client,
    stream_arn: String,
    /// Per shard: the sequence number to read after (`None`: from the start).
    after: HashMap<String, Option<String>>,
    /// Per shard: a failed record to read again from.
    again: HashMap<String, String>,
}

/// A failed streams call.
#[derive(Debug, thiserror::Error)]
#[error("DynamoDB Streams {operation} failed: {detail}")]
pub struct StreamError {
    operation: &'static str,
    detail: String,
}

fn failed<E: std::fmt::Debug>(operation: &'static str) -> impl Fn(E) -> StreamError {
    move |e| StreamError {
        operation,
        detail: format!("{e:?}").chars().take(300).collect(),
    }
}

impl LocalStreamSource {
    /// The source of `table`'s latest stream.
    pub async fn connect(
        ddb: &aws_sdk_dynamodb::Client,
        client: Client,
        table: &str,
    ) -> Result<Self, StreamError> {
        let described = ddb
            .describe_table()
            .table_name(table)
            .send()
            .await
            .map_err(failed("describe_table"))?;
        let stream_arn = described
            .table()
            .and_then(|t| t.latest_stream_arn())
            .ok_or_else(|| StreamError {
                operation: "describe_table",
                detail: "the table has no stream".to_owned(),
            })?
            .to_owned();
        Ok(LocalStreamSource {
            client,
            stream_arn,
            after: HashMap::new(),
            again: HashMap::new(),
        })
    }

    /// The records written since the last checkpoint, as one stream event (not yet delivered).
    pub async fn read(&mut self) -> Result<(StreamEvent, Vec<String>), StreamError> {
        let described = self
            .client
            .describe_stream()
            .stream_arn(&self.stream_arn)
            .send()
            .await
            .map_err(failed("describe_stream"))?;
        let shards: Vec<String> = described
            .stream_description()
            .map(|d| {
                d.shards()
                    .iter()
                    .filter_map(|s| s.shard_id().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        let mut records = Vec::new();
        let mut shard_of = Vec::new();
        for shard in shards {
            let mut request = self
                .client
                .get_shard_iterator()
                .stream_arn(&self.stream_arn)
                .shard_id(&shard);
            request = match (
                self.again.get(&shard),
                self.after.get(&shard).cloned().flatten(),
            ) {
                (Some(seq), _) => request
                    .shard_iterator_type(ShardIteratorType::AtSequenceNumber)
                    .sequence_number(seq),
                (None, Some(seq)) => request
                    .shard_iterator_type(ShardIteratorType::AfterSequenceNumber)
                    .sequence_number(seq),
                (None, None) => request.shard_iterator_type(ShardIteratorType::TrimHorizon),
            };
            let mut iterator = request
                .send()
                .await
                .map_err(failed("get_shard_iterator"))?
                .shard_iterator()
                .map(str::to_owned);
            while let Some(it) = iterator.take() {
                let page = self
                    .client
                    .get_records()
                    .shard_iterator(it)
                    .limit(1000)
                    .send()
                    .await
                    .map_err(failed("get_records"))?;
                if page.records().is_empty() {
                    break;
                }
                for record in page.records() {
                    records.push(lambda_record(record));
                    shard_of.push(shard.clone());
                }
                iterator = page.next_shard_iterator().map(str::to_owned);
            }
        }
        Ok((StreamEvent { records }, shard_of))
    }

    /// Reads what is new, invokes `dispatcher` with it, and moves the checkpoints as its
    /// response says. Returns the event delivered and the response.
    pub async fn poll_once<F, Fut>(
        &mut self,
        dispatcher: F,
    ) -> Result<(StreamEvent, StreamResponse), StreamError>
    where
        F: FnOnce(StreamEvent) -> Fut,
        Fut: std::future::Future<Output = StreamResponse>,
    {
        let (event, shard_of) = self.read().await?;
        let response = dispatcher(event.clone()).await;
        let failed_at = response
            .batch_item_failures
            .first()
            .map(|f| f.item_identifier.clone());
        for (record, shard) in event.records.iter().zip(&shard_of) {
            let seq = record.dynamodb.sequence_number.clone();
            if failed_at.is_some() && seq == failed_at {
                self.again.insert(shard.clone(), seq.unwrap_or_default());
                break;
            }
            self.again.remove(shard);
            self.after.insert(shard.clone(), seq);
        }
        Ok((event, response))
    }
}

/// A stream record as Lambda hands it over.
fn lambda_record(record: &aws_sdk_dynamodbstreams::types::Record) -> StreamRecord {
    let change = record.dynamodb();
    let image = |m: Option<&HashMap<String, AttributeValue>>| {
        m.map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), json_of(v)))
                .collect::<Map<String, Value>>()
        })
    };
    StreamRecord {
        event_name: record.event_name().map(|e| e.as_str().to_owned()),
        dynamodb: StreamChange {
            new_image: image(change.and_then(|c| c.new_image())),
            old_image: image(change.and_then(|c| c.old_image())),
            sequence_number: change.and_then(|c| c.sequence_number()).map(str::to_owned),
            keys: image(change.and_then(|c| c.keys())),
        },
    }
}

fn json_of(v: &AttributeValue) -> Value {
    match v {
        AttributeValue::S(s) => json!({ "S": s }),
        AttributeValue::N(n) => json!({ "N": n }),
        AttributeValue::Bool(b) => json!({ "BOOL": b }),
        AttributeValue::M(m) => json!({
            "M": m.iter().map(|(k, v)| (k.clone(), json_of(v))).collect::<Map<String, Value>>()
        }),
        AttributeValue::L(l) => json!({ "L": l.iter().map(json_of).collect::<Vec<_>>() }),
        AttributeValue::Ss(ss) => json!({ "SS": ss }),
        AttributeValue::Ns(ns) => json!({ "NS": ns }),
        _ => json!({ "NULL": true }),
    }
}
