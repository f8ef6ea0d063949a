//! A local event source mapping: what Lambda does between an SQS queue and the handler, for the
//! demo and the tests on the emulator.
//!
//! It long-polls the queue, builds the `SqsEvent` Lambda would send (system and message
//! attributes included), invokes the handler, and then acts on the response as Lambda does:
//! deletes the successes with `DeleteMessageBatch`, and treats an error or an invalid response
//! (an empty or unknown `itemIdentifier`) as a failure of the whole batch, deleting nothing.

use std::collections::HashMap;
use std::future::Future;

use aws_lambda_events::encodings::Base64Data;
use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent, SqsMessage, SqsMessageAttribute};
use aws_sdk_sqs::Client;
use aws_sdk_sqs::error::{DisplayErrorContext, ProvideErrorMetadata};
use aws_sdk_sqs::types::{
    DeleteMessageBatchRequestEntry, Message, MessageSystemAttributeName, QueueAttributeName,
};

use crate::clock::{Clock, SystemClock};
use crate::worker::Invocation;
use crate::worker::batch;

/// A failure of the driver itself (not of the handler).
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    /// An SQS call failed.
    #[error("SQS {operation} failed: {detail}")]
    Sqs {
        /// The operation.
        operation: &'static str,
        /// The error code or transport failure.
        detail: String,
    },
}

/// What one poll did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PollReport {
    /// Messages received (the batch size).
    pub received: usize,
    /// Messages deleted as successes.
    pub deleted: usize,
    /// Messages reported as batch item failures.
    pub failed: usize,
    /// True when the invocation errored or its response was invalid.
    pub whole_batch_failed: bool,
    /// Deletes SQS did not confirm.
    pub delete_failures: usize,
}

/// The local event source mapping for one queue.
#[derive(Debug, Clone)]
pub struct LocalEventSource {
    client: Client,
    queue_url: String,
    queue_arn: String,
    region: String,
    /// Records per batch (several receives of at most ten are gathered into one batch).
    pub batch_size: i32,
    /// Long-poll wait in seconds (0 to 20).
    pub wait_seconds: i32,
    /// The invocation deadline handed to the handler, from the start of each invocation.
    pub function_timeout_ms: i64,
    /// Drills: skip the deletes and count them as failed, as when `DeleteMessageBatch` fails.
    pub fail_deletes: bool,
}

impl LocalEventSource {
    /// Connects to the queue at `queue_url` (one `GetQueueAttributes` for its ARN).
    pub async fn connect(client: Client, queue_url: &str) -> Result<Self, DriverError> {
        let attrs = client
            .get_queue_attributes()
            .queue_url(queue_url)
            .attribute_names(QueueAttributeName::QueueArn)
            .send()
            .await
            .map_err(|e| sqs_error("GetQueueAttributes", &e))?;
        let queue_arn = attrs
            .attributes()
            .and_then(|a| a.get(&QueueAttributeName::QueueArn))
            .cloned()
            .ok_or_else(|| DriverError::Sqs {
                operation: "GetQueueAttributes",
                detail: "no QueueArn".to_owned(),
            })?;
        let region = queue_arn
            .split(':')
            .nth(3)
            .unwrap_or("us-east-1")
            .to_owned();
        Ok(LocalEventSource {
            client,
            queue_url: queue_url.to_owned(),
            queue_arn,
            region,
            batch_size: 10,
            wait_seconds: 1,
            function_timeout_ms: 60_000,
            fail_deletes: false,
        })
    }

    /// Receives one batch (if any), invokes `handler`, and deletes the successes.
    pub async fn poll_once<F, Fut, E>(&self, handler: F) -> Result<PollReport, DriverError>
    where
        F: FnOnce(SqsEvent, Invocation) -> Fut,
        Fut: Future<Output = Result<SqsBatchResponse, E>>,
        E: std::fmt::Display,
    {
        let messages = self.receive_batch().await?;
        let messages = messages.as_slice();
        let mut report = PollReport {
            received: messages.len(),
            ..PollReport::default()
        };
        if messages.is_empty() {
            return Ok(report);
        }
        let mut event = SqsEvent::default();
        event.records = messages.iter().map(|m| self.record_of(m)).collect();
        let now = SystemClock.now_ms();
        let invocation = Invocation {
            id: format!("local-{now}-{:08x}", fastrand::u32(..)),
            deadline: Some(now + self.function_timeout_ms),
        };

        let ids: Vec<&str> = messages.iter().filter_map(Message::message_id).collect();
        let to_delete = match handler(event, invocation).await {
            Err(e) => {
                tracing::warn!(error = %e, "invocation failed: whole batch fails");
                None
            }
            Ok(response) => {
                let reported: Vec<&str> = response
                    .batch_item_failures
                    .iter()
                    .map(|f| f.item_identifier.as_str())
                    .collect();
                match batch::successes(&ids, &reported) {
                    Ok(successes) => {
                        report.failed = reported.len();
                        Some(successes)
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "invalid batch response: whole batch fails");
                        None
                    }
                }
            }
        };
        let Some(successes) = to_delete else {
            report.whole_batch_failed = true;
            report.failed = messages.len();
            return Ok(report);
        };
        let handles: Vec<&str> = messages
            .iter()
            .filter(|m| m.message_id().is_some_and(|id| successes.contains(&id)))
            .filter_map(Message::receipt_handle)
            .collect();
        if self.fail_deletes {
            report.delete_failures = handles.len();
            return Ok(report);
        }
        self.delete(&handles, &mut report).await;
        Ok(report)
    }

    /// Like the event source mapping's batching: keeps receiving (ten at most a call) until the
    /// batch is full or the queue has nothing more right now.
    async fn receive_batch(&self) -> Result<Vec<Message>, DriverError> {
        let mut messages: Vec<Message> = Vec::new();
        let wanted = self.batch_size.max(1) as usize;
        while messages.len() < wanted {
            let wait = if messages.is_empty() {
                self.wait_seconds.clamp(0, 20)
            } else {
                0
            };
            let received = self
                .client
                .receive_message()
                .queue_url(&self.queue_url)
                .max_number_of_messages((wanted - messages.len()).min(10) as i32)
                .wait_time_seconds(wait)
                .message_system_attribute_names(MessageSystemAttributeName::All)
                .message_attribute_names("All")
                .send()
                .await
                .map_err(|e| sqs_error("ReceiveMessage", &e))?;
            let got = received.messages();
            if got.is_empty() {
                break;
            }
            messages.extend_from_slice(got);
        }
        Ok(messages)
    }

    /// Deletes the messages of these receipt handles, ten a call, counting what was deleted.
    async fn delete(&self, handles: &[&str], report: &mut PollReport) {
        for chunk in handles.chunks(10) {
            let entries = chunk
                .iter()
                .enumerate()
                .filter_map(|(i, handle)| {
                    DeleteMessageBatchRequestEntry::builder()
                        .id(i.to_string())
                        .receipt_handle(*handle)
                        .build()
                        .ok()
                })
                .collect();
            match self
                .client
                .delete_message_batch()
                .queue_url(&self.queue_url)
                .set_entries(Some(entries))
                .send()
                .await
            {
                Ok(out) => {
                    report.deleted += out.successful().len();
                    report.delete_failures += out.failed().len();
                }
                Err(e) => {
                    report.delete_failures += chunk.len();
                    tracing::warn!(code = e.code().unwrap_or("transport"), "delete failed");
                }
            }
        }
    }

    /// Messages visible and in flight, from `GetQueueAttributes` (approximate, as SQS says).
    pub async fn depth(&self) -> Result<(u64, u64), DriverError> {
        let out = self
            .client
            .get_queue_attributes()
            .queue_url(&self.queue_url)
            .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
            .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesNotVisible)
            .send()
            .await
            .map_err(|e| sqs_error("GetQueueAttributes", &e))?;
        let get = |name: QueueAttributeName| {
            out.attributes()
                .and_then(|a| a.get(&name))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        Ok((
            get(QueueAttributeName::ApproximateNumberOfMessages),
            get(QueueAttributeName::ApproximateNumberOfMessagesNotVisible),
        ))
    }

    /// The record Lambda would build from a received message.
    fn record_of(&self, m: &Message) -> SqsMessage {
        let mut record = SqsMessage::default();
        record.message_id = m.message_id().map(str::to_owned);
        record.receipt_handle = m.receipt_handle().map(str::to_owned);
        record.body = m.body().map(str::to_owned);
        record.md5_of_body = m.md5_of_body().map(str::to_owned);
        record.md5_of_message_attributes = m.md5_of_message_attributes().map(str::to_owned);
        record.attributes = m
            .attributes()
            .map(|attrs| {
                attrs
                    .iter()
                    .map(|(k, v)| (k.as_str().to_owned(), v.clone()))
                    .collect()
            })
            .unwrap_or_default();
        record.message_attributes = m
            .message_attributes()
            .map(|attrs| {
                attrs
                    .iter()
                    .map(|(k, v)| {
                        let mut a = SqsMessageAttribute::default();
                        a.string_value = v.string_value().map(str::to_owned);
                        a.binary_value = v.binary_value().map(|b| base64_data(b.as_ref()));
                        a.string_list_values = v.string_list_values().to_vec();
                        a.binary_list_values = v
                            .binary_list_values()
                            .iter()
                            .map(|b| base64_data(b.as_ref()))
                            .collect();
                        a.data_type = Some(v.data_type().to_owned());
                        (k.clone(), a)
                    })
                    .collect::<HashMap<_, _>>()
            })
            .unwrap_or_default();
        record.event_source = Some("aws:sqs".to_owned());
        record.event_source_arn = Some(self.queue_arn.clone());
        record.aws_region = Some(self.region.clone());
        record
    }
}

fn base64_data(bytes: &[u8]) -> Base64Data {
    let mut data = Base64Data::default();
    data.extend_from_slice(bytes);
    data
}

fn sqs_error<E, R>(operation: &'static str, e: &aws_sdk_sqs::error::SdkError<E, R>) -> DriverError
where
    E: std::error::Error + 'static,
    R: std::fmt::Debug,
{
    DriverError::Sqs {
        operation,
        detail: DisplayErrorContext(e)
            .to_string()
            .chars()
            .take(300)
            .collect(),
    }
}
