//! The event sinks on AWS: an EventBridge bus (the default), an SNS topic or an SQS queue. Each
//! sends up to ten events a request; on a FIFO topic or queue the job id is the message group
//! and the event id the deduplication id.

pub use super::EVENT_SOURCE;
use super::{CompletionEvent, EventSink, Target};

/// A sink on AWS.
#[derive(Debug, Clone)]
pub enum AwsSink {
    /// `PutEvents` to a bus.
    EventBridge {
        /// Client.
        client: aws_sdk_eventbridge::Client,
        /// Bus name or ARN.
        bus: String,
    },
    /// `PublishBatch` to a topic.
    Sns {
        /// Client.
        client: aws_sdk_sns::Client,
        /// Topic ARN.
        topic_arn: String,
    },
    /// `SendMessageBatch` to a queue.
    Sqs {
        /// Client.
        client: aws_sdk_sqs::Client,
        /// Queue URL.
        queue_url: String,
    },
}

impl EventSink for AwsSink {
    fn target(&self) -> Target {
        match self {
            AwsSink::EventBridge { .. } => Target::EventBridge,
            AwsSink::Sns { .. } => Target::Sns,
            AwsSink::Sqs { .. } => Target::Sqs,
        }
    }

    async fn send(&self, events: &[CompletionEvent]) -> Result<(), (usize, String)> {
        match self {
            AwsSink::EventBridge { client, bus } => put_events(client, bus, events).await,
            AwsSink::Sns { client, topic_arn } => publish_batch(client, topic_arn, events).await,
            AwsSink::Sqs { client, queue_url } => send_batch(client, queue_url, events).await,
        }
    }
}

/// An entry that could not be built is not published (never counted as sent).
fn unbuilt(i: usize, e: &impl std::fmt::Display) -> (usize, String) {
    (i, format!("entry not built: {e}"))
}

/// The first refused entry of a request, from the per-entry answers.
fn first_failed(entries: impl IntoIterator<Item = Option<String>>) -> Result<(), (usize, String)> {
    match entries
        .into_iter()
        .enumerate()
        .find_map(|(i, e)| e.map(|code| (i, code)))
    {
        Some(failed) => Err(failed),
        None => Ok(()),
    }
}

/// The first entry a batch request refused, from the (entry id, code) pairs it answered; the
/// entries are numbered by their place in the request (an id that is not a number counts as the
/// first, so nothing refused is ever taken as published).
fn first_refused<'a>(
    refused: impl Iterator<Item = (&'a str, &'a str)>,
) -> Result<(), (usize, String)> {
    match refused
        .map(|(id, code)| (id.parse::<usize>().unwrap_or(0), code))
        .min_by_key(|(at, _)| *at)
    {
        Some((at, code)) => Err((at, code.to_owned())),
        None => Ok(()),
    }
}

async fn put_events(
    client: &aws_sdk_eventbridge::Client,
    bus: &str,
    events: &[CompletionEvent],
) -> Result<(), (usize, String)> {
    use aws_sdk_eventbridge::types::PutEventsRequestEntry;
    let entries = events
        .iter()
        .map(|e| {
            PutEventsRequestEntry::builder()
                .event_bus_name(bus)
                .source(EVENT_SOURCE)
                .detail_type(e.detail_type())
                .detail(e.detail.to_string())
                .resources(e.job_id.clone())
                .build()
        })
        .collect();
    let out = client
        .put_events()
        .set_entries(Some(entries))
        .send()
        .await
        .map_err(|e| {
            (
                0,
                aws_sdk_eventbridge::error::DisplayErrorContext(&e).to_string(),
            )
        })?;
    if out.failed_entry_count() == 0 {
        return Ok(());
    }
    first_failed(
        out.entries()
            .iter()
            .map(|e| e.error_code().map(str::to_owned)),
    )
}

async fn publish_batch(
    client: &aws_sdk_sns::Client,
    topic_arn: &str,
    events: &[CompletionEvent],
) -> Result<(), (usize, String)> {
    use aws_sdk_sns::types::{MessageAttributeValue, PublishBatchRequestEntry};
    let fifo = topic_arn.ends_with(".fifo");
    let entries = events
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let state = MessageAttributeValue::builder()
                .data_type("String")
                .string_value(e.state.as_str())
                .build()
                .map_err(|b| unbuilt(i, &b))?;
            let mut entry = PublishBatchRequestEntry::builder()
                .id(i.to_string())
                .message(e.detail.to_string())
                .message_attributes("state", state);
            if let Some(producer) = &e.producer {
                let producer = MessageAttributeValue::builder()
                    .data_type("String")
                    .string_value(producer)
                    .build()
                    .map_err(|b| unbuilt(i, &b))?;
                entry = entry.message_attributes("producer", producer);
            }
            if fifo {
                entry = entry
                    .message_group_id(&e.job_id)
                    .message_deduplication_id(&e.id);
            }
            entry.build().map_err(|b| unbuilt(i, &b))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let out = client
        .publish_batch()
        .topic_arn(topic_arn)
        .set_publish_batch_request_entries(Some(entries))
        .send()
        .await
        .map_err(|e| (0, aws_sdk_sns::error::DisplayErrorContext(&e).to_string()))?;
    first_refused(out.failed().iter().map(|f| (f.id(), f.code())))
}

async fn send_batch(
    client: &aws_sdk_sqs::Client,
    queue_url: &str,
    events: &[CompletionEvent],
) -> Result<(), (usize, String)> {
    use aws_sdk_sqs::types::{MessageAttributeValue, SendMessageBatchRequestEntry};
    let fifo = queue_url.ends_with(".fifo");
    let entries = events
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let mut entry = SendMessageBatchRequestEntry::builder()
                .id(i.to_string())
                .message_body(e.detail.to_string());
            if let Some(producer) = &e.producer {
                let producer = MessageAttributeValue::builder()
                    .data_type("String")
                    .string_value(producer)
                    .build()
                    .map_err(|b| unbuilt(i, &b))?;
                entry = entry.message_attributes("producer", producer);
            }
            if fifo {
                entry = entry
                    .message_group_id(&e.job_id)
                    .message_deduplication_id(&e.id);
            }
            entry.build().map_err(|b| unbuilt(i, &b))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let out = client
        .send_message_batch()
        .queue_url(queue_url)
        .set_entries(Some(entries))
        .send()
        .await
        .map_err(|e| (0, aws_sdk_sqs::error::DisplayErrorContext(&e).to_string()))?;
    first_refused(out.failed().iter().map(|f| (f.id(), f.code())))
}
