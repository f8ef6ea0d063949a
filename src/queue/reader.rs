//! Reading a queue as an operator does (`jobctl dlq`, `jobctl events replay`): messages received and
//! held invisible while they are judged, then sent on, deleted or released. The worker never
//! reads a queue this way (Lambda's event source mapping receives and deletes for it), so these
//! calls are the operator's alone and stay out of the worker's role. The trait and an in-memory
//! queue for tests here; SQS in [`SqsReader`].

use std::fmt::Debug;
use std::future::Future;

use aws_sdk_sqs::Client;
use aws_sdk_sqs::config::http::HttpResponse;
use aws_sdk_sqs::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_sqs::types::{MessageAttributeValue, MessageSystemAttributeName};

/// SQS receives at most ten messages a request.
pub(crate) const RECEIVE_LIMIT: usize = 10;

/// One message received, invisible to others until it is deleted, released or its hold ends.
#[derive(Clone, PartialEq, Eq)]
pub struct Received {
    /// Its message id.
    pub message_id: Option<String>,
    /// Its body.
    pub body: String,
    /// Its string attributes.
    pub attributes: Vec<(String, String)>,
    /// The principal SQS says sent it (`SenderId`: a role's unique id and session, a user's
    /// id), which the sender cannot choose.
    pub sender_id: Option<String>,
    /// The handle that deletes or releases it.
    pub receipt_handle: String,
    /// When it was sent (`SentTimestamp`; a dead letter the redrive policy moved keeps its
    /// first).
    pub sent_at: Option<crate::job::Millis>,
}

impl Debug for Received {
    // A receipt handle and a body never reach a log.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Received")
            .field("message_id", &self.message_id)
            .field("body_bytes", &self.body.len())
            .field("attributes", &self.attributes.len())
            .finish_non_exhaustive()
    }
}

/// A message to send.
#[derive(Clone, Copy)]
pub struct Message<'a> {
    /// Its body.
    pub body: &'a str,
    /// Its string attributes.
    pub attributes: &'a [(String, String)],
    /// On a FIFO queue, its message group and deduplication id.
    pub fifo: Option<(&'a str, &'a str)>,
}

impl Debug for Message<'_> {
    // A body never reaches a log.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Message")
            .field("body_bytes", &self.body.len())
            .field("attributes", &self.attributes.len())
            .field("fifo", &self.fifo.is_some())
            .finish()
    }
}

/// Why a queue request did nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueueError {
    /// The queue is not there (a wrong URL, or another region).
    #[error("no such queue: {0}")]
    NoSuchQueue(String),
    /// The caller's credentials do not allow the action.
    #[error("not allowed to {0} (check the caller's IAM policy)")]
    Denied(&'static str),
    /// The queue throttled the request; it may be sent again.
    #[error("{0} was throttled; try again")]
    Throttled(&'static str),
    /// SQS refused the request as it was made (a limit, a malformed attribute).
    #[error("{action} refused: {detail}")]
    Refused {
        /// The request.
        action: &'static str,
        /// What SQS said.
        detail: String,
    },
    /// No answer: a transport failure or a fault on SQS's side. It may have been applied.
    #[error("{action} failed: {detail}")]
    Failed {
        /// The request.
        action: &'static str,
        /// What went wrong.
        detail: String,
    },
}

/// A queue an operator reads.
pub trait QueueReader: Send + Sync {
    /// Receives up to `max` messages (at most [`RECEIVE_LIMIT`]) with their attributes, each
    /// invisible for `hold_s` seconds (0: it stays visible).
    fn receive(
        &self,
        queue_url: &str,
        max: usize,
        hold_s: i32,
    ) -> impl Future<Output = Result<Vec<Received>, QueueError>> + Send;

    /// Sends one message.
    fn send(
        &self,
        queue_url: &str,
        message: Message<'_>,
    ) -> impl Future<Output = Result<(), QueueError>> + Send;

    /// Deletes a received message.
    fn delete(
        &self,
        queue_url: &str,
        receipt_handle: &str,
    ) -> impl Future<Output = Result<(), QueueError>> + Send;

    /// Makes a received message visible again at once.
    fn release(
        &self,
        queue_url: &str,
        receipt_handle: &str,
    ) -> impl Future<Output = Result<(), QueueError>> + Send;
}

/// A queue on SQS.
#[derive(Debug, Clone)]
pub struct SqsReader {
    client: Client,
    wait_s: i32,
}

impl SqsReader {
    /// Queues through `client`, each receive a short poll.
    pub fn new(client: Client) -> Self {
        SqsReader { client, wait_s: 0 }
    }

    /// Each receive a long poll of `seconds`: SQS then asks every server of the queue, where a
    /// short poll samples some and may come back empty while a small queue holds messages.
    pub fn waiting(mut self, seconds: i32) -> Self {
        self.wait_s = seconds;
        self
    }
}

/// What an SDK error comes to, by its error code.
fn classified<E>(action: &'static str, queue_url: &str, e: SdkError<E, HttpResponse>) -> QueueError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    let sent = matches!(e, SdkError::ServiceError(_));
    // A service error's message may quote the request (SQS repeats a refused receipt handle
    // whole), so only its code is kept; a transport error says nothing of the request.
    let detail = if sent {
        format!("error code {}", e.code().unwrap_or("none"))
    } else {
        aws_sdk_sqs::error::DisplayErrorContext(&e).to_string()
    };
    match e.code() {
        Some("AWS.SimpleQueueService.NonExistentQueue" | "QueueDoesNotExist") => {
            QueueError::NoSuchQueue(queue_url.to_owned())
        }
        Some("AccessDenied" | "AccessDeniedException") => QueueError::Denied(action),
        Some("ThrottlingException" | "RequestThrottled" | "OverLimit") => {
            QueueError::Throttled(action)
        }
        Some(_)
            if sent
                && !e
                    .raw_response()
                    .is_some_and(|r| r.status().is_server_error()) =>
        {
            QueueError::Refused { action, detail }
        }
        _ => QueueError::Failed { action, detail },
    }
}

impl QueueReader for SqsReader {
    async fn receive(
        &self,
        queue_url: &str,
        max: usize,
        hold_s: i32,
    ) -> Result<Vec<Received>, QueueError> {
        let out = self
            .client
            .receive_message()
            .queue_url(queue_url)
            .max_number_of_messages(i32::try_from(max).unwrap_or(i32::MAX))
            .visibility_timeout(hold_s)
            .wait_time_seconds(self.wait_s)
            .message_attribute_names("All")
            .message_system_attribute_names(MessageSystemAttributeName::SenderId)
            .message_system_attribute_names(MessageSystemAttributeName::SentTimestamp)
            .send()
            .await
            .map_err(|e| classified("ReceiveMessage", queue_url, e))?;
        Ok(out
            .messages()
            .iter()
            .map(|m| Received {
                message_id: m.message_id().map(str::to_owned),
                body: m.body().unwrap_or_default().to_owned(),
                attributes: m
                    .message_attributes()
                    .into_iter()
                    .flatten()
                    .filter_map(|(name, v)| Some((name.clone(), v.string_value()?.to_owned())))
                    .collect(),
                sender_id: m
                    .attributes()
                    .and_then(|a| a.get(&MessageSystemAttributeName::SenderId))
                    .cloned(),
                sent_at: m
                    .attributes()
                    .and_then(|a| a.get(&MessageSystemAttributeName::SentTimestamp))
                    .and_then(|at| at.parse().ok()),
                receipt_handle: m.receipt_handle().unwrap_or_default().to_owned(),
            })
            .collect())
    }

    async fn send(&self, queue_url: &str, message: Message<'_>) -> Result<(), QueueError> {
        let mut send = self
            .client
            .send_message()
            .queue_url(queue_url)
            .message_body(message.body);
        for (name, value) in message.attributes {
            let value = MessageAttributeValue::builder()
                .data_type("String")
                .string_value(value)
                .build()
                .map_err(|e| QueueError::Refused {
                    action: "SendMessage",
                    detail: e.to_string(),
                })?;
            send = send.message_attributes(name, value);
        }
        if let Some((group, dedup)) = message.fifo {
            send = send.message_group_id(group).message_deduplication_id(dedup);
        }
        send.send()
            .await
            .map_err(|e| classified("SendMessage", queue_url, e))?;
        Ok(())
    }

    async fn delete(&self, queue_url: &str, receipt_handle: &str) -> Result<(), QueueError> {
        self.client
            .delete_message()
            .queue_url(queue_url)
            .receipt_handle(receipt_handle)
            .send()
            .await
            .map_err(|e| classified("DeleteMessage", queue_url, e))?;
        Ok(())
    }

    async fn release(&self, queue_url: &str, receipt_handle: &str) -> Result<(), QueueError> {
        self.client
            .change_message_visibility()
            .queue_url(queue_url)
            .receipt_handle(receipt_handle)
            .visibility_timeout(0)
            .send()
            .await
            .map_err(|e| classified("ChangeMessageVisibility", queue_url, e))?;
        Ok(())
    }
}

/// Queues in memory, as SQS keeps them for a reader with no clock: a received message held
/// for more than 0 seconds stays invisible until it is deleted or released. SQS's limits are
/// enforced as SQS enforces them: ten messages a receive, a hold within 12 hours, ten attributes
/// and 1 MiB a message, a group id on a FIFO queue, a receipt handle of this receive.
#[cfg(any(test, feature = "test-support"))]
#[derive(Debug, Default)]
pub struct MemoryQueue {
    queues: std::sync::Mutex<std::collections::HashMap<String, Kept>>,
}

#[cfg(any(test, feature = "test-support"))]
#[derive(Debug, Default)]
struct Kept {
    /// Visible messages: the order they were sent in, body, attributes.
    visible: std::collections::VecDeque<Queued>,
    /// Received and held, by receipt handle.
    held: Vec<(String, Queued)>,
    /// Receipt handles of messages received with a hold of 0, and the message each names: the
    /// message stays visible and the handle still deletes it.
    shown: Vec<(String, u64)>,
    /// The receipt handles of deleted messages.
    deleted: Vec<String>,
    /// Receives still to come back empty whatever the queue holds, as SQS's short receive
    /// may when it samples servers that hold none of its messages.
    empty_receives: usize,
    sent: u64,
    receipts: u64,
}

#[cfg(any(test, feature = "test-support"))]
/// Order sent, body, attributes, sender.
type Queued = (u64, String, Vec<(String, String)>, Option<String>);

#[cfg(any(test, feature = "test-support"))]
impl MemoryQueue {
    /// No queues.
    pub fn new() -> Self {
        MemoryQueue::default()
    }

    /// Creates the queue at `url`, empty.
    pub fn create(&self, url: &str) {
        self.lock().entry(url.to_owned()).or_default();
    }

    #[cfg(test)]
    /// The next `n` receives of `url` find nothing, whatever it holds (SQS's short receive
    /// samples a subset of its servers and may come back empty from a queue with messages).
    pub(crate) fn sample_nothing(&self, url: &str, n: usize) {
        self.lock()
            .entry(url.to_owned())
            .or_default()
            .empty_receives = n;
    }

    /// The bodies in the queue at `url`, visible or held, oldest first.
    pub fn bodies(&self, url: &str) -> Vec<String> {
        let queues = self.lock();
        let Some(q) = queues.get(url) else {
            return Vec::new();
        };
        let mut all: Vec<_> = q
            .visible
            .iter()
            .chain(q.held.iter().map(|(_, m)| m))
            .collect();
        all.sort_by_key(|m| m.0);
        all.into_iter().map(|m| m.1.clone()).collect()
    }

    /// Sends `message` to `url` as the principal `sender_id` (what SQS gives as the message's
    /// `SenderId`; `None` for none, which SQS never gives).
    pub(crate) fn send_as(
        &self,
        queue_url: &str,
        sender_id: Option<&str>,
        message: Message<'_>,
    ) -> Result<(), QueueError> {
        let bytes = message.body.len()
            + message
                .attributes
                .iter()
                .map(|(n, v)| n.len() + "String".len() + v.len())
                .sum::<usize>();
        if message.attributes.len() > 10 {
            return Err(refused("SendMessage", "at most 10 message attributes"));
        }
        if bytes > crate::job::message::MAX_BODY_BYTES {
            return Err(refused("SendMessage", "a message is at most 1 MiB"));
        }
        if queue_url.ends_with(".fifo") != message.fifo.is_some() {
            return Err(refused(
                "SendMessage",
                "a FIFO queue takes a group id, and only a FIFO queue",
            ));
        }
        self.with(queue_url, |q| {
            q.sent += 1;
            let kept = (
                q.sent,
                message.body.to_owned(),
                message.attributes.to_vec(),
                sender_id.map(str::to_owned),
            );
            q.visible.push_back(kept);
            Ok(())
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, Kept>> {
        self.queues.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn with<T>(
        &self,
        url: &str,
        f: impl FnOnce(&mut Kept) -> Result<T, QueueError>,
    ) -> Result<T, QueueError> {
        let mut queues = self.lock();
        let q = queues
            .get_mut(url)
            .ok_or_else(|| QueueError::NoSuchQueue(url.to_owned()))?;
        f(q)
    }
}

#[cfg(any(test, feature = "test-support"))]
fn refused(action: &'static str, detail: &str) -> QueueError {
    QueueError::Refused {
        action,
        detail: detail.to_owned(),
    }
}

#[cfg(any(test, feature = "test-support"))]
impl QueueReader for MemoryQueue {
    async fn receive(
        &self,
        queue_url: &str,
        max: usize,
        hold_s: i32,
    ) -> Result<Vec<Received>, QueueError> {
        if !(1..=RECEIVE_LIMIT).contains(&max) {
            return Err(refused("ReceiveMessage", "MaxNumberOfMessages is 1 to 10"));
        }
        if !(0..=crate::job::outcome::SQS_MAX_VISIBILITY_S as i32).contains(&hold_s) {
            return Err(refused("ReceiveMessage", "VisibilityTimeout is 0 to 43200"));
        }
        self.with(queue_url, |q| {
            if q.empty_receives > 0 {
                q.empty_receives -= 1;
                return Ok(Vec::new());
            }
            let taken: Vec<_> = (0..max.min(q.visible.len()))
                .filter_map(|_| q.visible.pop_front())
                .collect();
            let mut received = Vec::with_capacity(taken.len());
            let mut back = Vec::new();
            for message in taken {
                q.receipts += 1;
                let receipt_handle = format!("receipt-{}", q.receipts);
                received.push(Received {
                    message_id: Some(format!("m-{}", message.0)),
                    body: message.1.clone(),
                    attributes: message.2.clone(),
                    sender_id: message.3.clone(),
                    receipt_handle: receipt_handle.clone(),
                    sent_at: None,
                });
                if hold_s == 0 {
                    q.shown.push((receipt_handle, message.0));
                    back.push(message);
                } else {
                    q.held.push((receipt_handle, message));
                }
            }
            // A hold of 0 leaves this receive's messages visible, in their places; messages
            // held by earlier receives stay held.
            if !back.is_empty() {
                back.extend(q.visible.drain(..));
                back.sort_by_key(|m| m.0);
                q.visible = back.into();
            }
            Ok(received)
        })
    }

    async fn send(&self, queue_url: &str, message: Message<'_>) -> Result<(), QueueError> {
        self.send_as(queue_url, None, message)
    }

    async fn delete(&self, queue_url: &str, receipt_handle: &str) -> Result<(), QueueError> {
        self.with(queue_url, |q| {
            // As SQS: deleting a message already deleted succeeds; an unknown handle does not.
            if let Some(at) = q.held.iter().position(|(h, _)| h == receipt_handle) {
                q.held.remove(at);
                q.deleted.push(receipt_handle.to_owned());
            }
            if let Some(at) = q.shown.iter().position(|(h, _)| h == receipt_handle) {
                let (_, id) = q.shown.remove(at);
                q.visible.retain(|m| m.0 != id);
                q.held.retain(|(_, m)| m.0 != id);
                q.deleted.push(receipt_handle.to_owned());
            }
            if q.deleted.iter().any(|h| h == receipt_handle) {
                Ok(())
            } else {
                Err(refused("DeleteMessage", "ReceiptHandleIsInvalid"))
            }
        })
    }

    async fn release(&self, queue_url: &str, receipt_handle: &str) -> Result<(), QueueError> {
        self.with(queue_url, |q| {
            let at = q
                .held
                .iter()
                .position(|(h, _)| h == receipt_handle)
                .ok_or_else(|| refused("ChangeMessageVisibility", "ReceiptHandleIsInvalid"))?;
            let (_, message) = q.held.remove(at);
            q.visible.push_front(message);
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const URL: &str = "https://sqs.local/1/dlq";

    fn plain(body: &str) -> Message<'_> {
        Message {
            body,
            attributes: &[],
            fifo: None,
        }
    }

    #[tokio::test]
    async fn the_memory_queue_holds_releases_and_deletes_as_sqs_does() {
        let q = MemoryQueue::new();
        q.create(URL);
        for body in ["a", "b", "c"] {
            q.send(URL, plain(body)).await.expect("sent");
        }
        // A hold of 0 leaves every message visible: the next receive sees them again.
        let seen = q.receive(URL, 10, 0).await.expect("received");
        assert_eq!(seen.len(), 3);
        assert_eq!(q.receive(URL, 10, 0).await.expect("again").len(), 3);
        // A hold keeps them from the next receive until released or deleted.
        let held = q.receive(URL, 2, 60).await.expect("held");
        assert_eq!(held.len(), 2);
        let rest = q.receive(URL, 10, 60).await.expect("rest");
        assert_eq!(
            rest.iter().map(|m| m.body.as_str()).collect::<Vec<_>>(),
            ["c"]
        );
        q.release(URL, &held[0].receipt_handle)
            .await
            .expect("released");
        let back = q.receive(URL, 10, 60).await.expect("back");
        assert_eq!(
            back.iter().map(|m| m.body.as_str()).collect::<Vec<_>>(),
            ["a"]
        );
        // Deleting twice succeeds; a handle of no receive does not.
        q.delete(URL, &held[1].receipt_handle)
            .await
            .expect("deleted");
        q.delete(URL, &held[1].receipt_handle).await.expect("again");
        assert!(matches!(
            q.delete(URL, "made-up").await,
            Err(QueueError::Refused { .. })
        ));
        assert_eq!(q.bodies(URL), ["a", "c"]);
    }

    #[tokio::test]
    async fn a_receive_that_holds_nothing_leaves_other_receives_held_and_its_handles_delete() {
        let q = MemoryQueue::new();
        q.create(URL);
        for body in ["a", "b"] {
            q.send(URL, plain(body)).await.expect("sent");
        }
        let held = q.receive(URL, 1, 60).await.expect("held");
        let shown = q.receive(URL, 10, 0).await.expect("shown");
        assert_eq!(
            shown.iter().map(|m| m.body.as_str()).collect::<Vec<_>>(),
            ["b"],
            "the held message stays held"
        );
        assert_eq!(q.receive(URL, 10, 0).await.expect("again").len(), 1);
        q.delete(URL, &shown[0].receipt_handle)
            .await
            .expect("a handle of a hold of 0 deletes");
        assert!(q.receive(URL, 10, 0).await.expect("none").is_empty());
        q.release(URL, &held[0].receipt_handle)
            .await
            .expect("released");
        assert_eq!(q.bodies(URL), ["a"]);
    }

    #[tokio::test]
    async fn the_memory_queue_refuses_what_sqs_refuses() {
        let q = MemoryQueue::new();
        q.create(URL);
        fn refused<T>(r: Result<T, QueueError>) -> bool {
            matches!(r, Err(QueueError::Refused { .. }))
        }
        assert!(refused(q.receive(URL, 11, 0).await));
        assert!(refused(q.receive(URL, 0, 0).await));
        assert!(refused(q.receive(URL, 1, 43_201).await));
        assert!(q.receive(URL, 1, 43_200).await.is_ok());
        let big = "x".repeat(crate::job::message::MAX_BODY_BYTES + 1);
        assert!(refused(q.send(URL, plain(&big)).await));
        let attributes: Vec<(String, String)> =
            (0..11).map(|i| (format!("a{i}"), "v".to_owned())).collect();
        let many = Message {
            attributes: &attributes,
            ..plain("m")
        };
        assert!(refused(q.send(URL, many).await));
        // A FIFO queue takes a group id, and only a FIFO queue does.
        q.create("https://sqs.local/1/q.fifo");
        assert!(refused(
            q.send("https://sqs.local/1/q.fifo", plain("m")).await
        ));
        let grouped = Message {
            fifo: Some(("g", "d")),
            ..plain("m")
        };
        assert!(refused(q.send(URL, grouped).await));
        assert!(q.send("https://sqs.local/1/q.fifo", grouped).await.is_ok());
        assert_eq!(
            q.receive("https://sqs.local/1/none", 1, 0).await,
            Err(QueueError::NoSuchQueue(
                "https://sqs.local/1/none".to_owned()
            ))
        );
    }

    #[test]
    fn a_received_message_shows_neither_its_body_nor_its_handle() {
        let m = Received {
            message_id: Some("m-1".into()),
            body: "secret prompt".into(),
            attributes: Vec::new(),
            sender_id: None,
            sent_at: None,
            receipt_handle: "AQEB-handle".into(),
        };
        let shown = format!("{m:?}");
        assert!(shown.contains("m-1"), "{shown}");
        assert!(
            !shown.contains("secret") && !shown.contains("AQEB"),
            "{shown}"
        );
    }
}
