//! The queue on SQS: visibility changes through `ChangeMessageVisibilityBatch` (ten handles a
//! call), triggers and the worker's dead letters through `SendMessageBatch`.

use std::collections::HashMap;
use std::sync::Mutex;

use aws_sdk_sqs::Client;
use aws_sdk_sqs::error::ProvideErrorMetadata;
use aws_sdk_sqs::types::ChangeMessageVisibilityBatchRequestEntry;
use futures::future::BoxFuture;
use futures::{StreamExt, stream};

use super::dead_letters::{DeadLetter, DeadLetterQueue};
use super::triggers::{
    IN_LEDGER_ATTRIBUTE, Outgoing, Sent, TriggerSender, batches, batches_by, dedup_id,
};
use super::{ChangeResult, ChangeResults, VisibilityChange, VisibilityControl};
use crate::job::account::account;

/// SQS allows at most ten entries per batch call.
pub(crate) const SQS_BATCH_LIMIT: usize = 10;
/// Batch calls in flight at once.
const PARALLEL_CALLS: usize = 8;

/// Sends triggers with `SendMessageBatch`: to the work queue, and an urgent job's to the urgent
/// queue when one is set.
#[derive(Debug, Clone)]
pub struct SqsTriggers {
    client: Client,
    queue_url: String,
    urgent_url: Option<String>,
}

impl SqsTriggers {
    /// A sender to the queue at `queue_url`.
    pub fn new(client: Client, queue_url: impl Into<String>) -> Self {
        SqsTriggers {
            client,
            queue_url: queue_url.into(),
            urgent_url: None,
        }
    }

    /// Urgent jobs' triggers go to the queue at `url` (`URGENT_QUEUE_URL`), if set.
    pub fn with_urgent(mut self, url: Option<String>) -> Self {
        self.urgent_url = url.filter(|u| !u.is_empty());
        self
    }
}

impl TriggerSender for SqsTriggers {
    async fn send(&self, triggers: &[Outgoing], dedup_suffix: &str) -> Vec<Sent> {
        let Some(urgent_url) = &self.urgent_url else {
            return self.send_to(&self.queue_url, triggers, dedup_suffix).await;
        };
        let (urgent, normal): (Vec<Outgoing>, Vec<Outgoing>) =
            triggers.iter().cloned().partition(|t| t.class.urgent);
        let mut sent = self.send_to(urgent_url, &urgent, dedup_suffix).await;
        sent.extend(self.send_to(&self.queue_url, &normal, dedup_suffix).await);
        // In the order given.
        let mut ordered = Vec::with_capacity(sent.len());
        let (mut u, mut n) = (0, urgent.len());
        for t in triggers {
            let i = if t.class.urgent { &mut u } else { &mut n };
            ordered.push(sent[*i].clone());
            *i += 1;
        }
        ordered
    }
}

impl SqsTriggers {
    async fn send_to(
        &self,
        queue_url: &str,
        triggers: &[Outgoing],
        dedup_suffix: &str,
    ) -> Vec<Sent> {
        // A few requests in flight at once: a webhook's batch of thousands of jobs goes in a few
        // seconds, not one request after another.
        let mut requests = Vec::new();
        for batch in batches(triggers) {
            requests.push(self.send_batch(queue_url, batch, dedup_suffix));
        }
        // In the order given.
        let sent: Vec<Vec<Sent>> = futures::stream::iter(requests)
            .buffered(PARALLEL_CALLS)
            .collect()
            .await;
        sent.into_iter().flatten().collect()
    }

    /// One `SendMessageBatch` request of `batch`: each trigger's result, in order.
    async fn send_batch(
        &self,
        queue_url: &str,
        batch: &[Outgoing],
        dedup_suffix: &str,
    ) -> Vec<Sent> {
        use aws_sdk_sqs::types::SendMessageBatchRequestEntry;
        let fifo = queue_url.ends_with(".fifo");
        let entries: Vec<SendMessageBatchRequestEntry> = batch
            .iter()
            .enumerate()
            .filter_map(|(i, t)| {
                let mut entry = SendMessageBatchRequestEntry::builder()
                    .id(i.to_string())
                    .message_body(&t.body);
                if t.in_ledger {
                    let mark = aws_sdk_sqs::types::MessageAttributeValue::builder()
                        .data_type("String")
                        .string_value("true")
                        .build()
                        .ok()?;
                    entry = entry.message_attributes(IN_LEDGER_ATTRIBUTE, mark);
                }
                if fifo {
                    entry = entry
                        .message_group_id(&t.job_id)
                        .message_deduplication_id(dedup_id(&t.job_id, dedup_suffix));
                } else {
                    // A fair queue keeps one account's burst from delaying the others.
                    let account = account(&t.job_id, t.class.tenant.as_deref());
                    entry = entry.message_group_id(account);
                }
                entry.build().ok()
            })
            .collect();
        let request = self
            .client
            .send_message_batch()
            .queue_url(queue_url)
            .set_entries(Some(entries))
            .send();
        match Box::pin(request).await {
            Ok(out) => {
                let failed: HashMap<&str, String> = out
                    .failed()
                    .iter()
                    .map(|f| (f.id(), f.code().to_owned()))
                    .collect();
                let result = |i: usize| match failed.get(i.to_string().as_str()) {
                    Some(code) => Err(code.clone()),
                    None => Ok(()),
                };
                batch
                    .iter()
                    .enumerate()
                    .map(|(i, t)| (t.job_id.clone(), result(i)))
                    .collect()
            }
            Err(e) => {
                let reason = aws_sdk_sqs::error::DisplayErrorContext(&e).to_string();
                batch
                    .iter()
                    .map(|t| (t.job_id.clone(), Err(reason.clone())))
                    .collect()
            }
        }
    }
}

/// Visibility control over SQS. Queue URLs are resolved from the event's queue ARN once per
/// process and cached.
#[derive(Debug)]
pub struct SqsVisibility {
    client: Client,
    urls: Mutex<HashMap<String, Located>>,
    timeouts: Mutex<HashMap<String, Learnt>>,
}

/// What this environment knows of a queue's visibility timeout.
#[derive(Debug, Clone, Copy)]
enum Learnt {
    /// Read from the queue: kept for the environment's life.
    Seconds(i64),
    /// The lookup failed at this instant: not asked again for `RELEARN_AFTER`, so a role that
    /// may not read the queue costs one failing call (and one warning) per five minutes, not
    /// one per batch. The configured value applies meanwhile.
    FailedAt(std::time::Instant),
}

/// What this environment knows of a queue's URL.
#[derive(Debug, Clone)]
enum Located {
    /// Resolved: kept for the environment's life.
    Url(String),
    /// `GetQueueUrl` failed at this instant (a sample event naming a queue that is not there,
    /// a role without the action): not asked again, nor warned about, for `RELEARN_AFTER`.
    FailedAt(std::time::Instant),
}

/// How long a failed lookup of a queue's URL or visibility timeout stands before it is tried
/// again.
const RELEARN_AFTER: std::time::Duration = std::time::Duration::from_secs(300);

impl SqsVisibility {
    /// Visibility control through `client`.
    pub fn new(client: Client) -> Self {
        SqsVisibility {
            client,
            urls: Mutex::new(HashMap::new()),
            timeouts: Mutex::new(HashMap::new()),
        }
    }

    /// Reads a queue's `VisibilityTimeout` (a warning, and `None`, when it cannot).
    async fn read_visibility_timeout(&self, queue_arn: &str) -> Option<i64> {
        let url = self.queue_url(queue_arn).await?;
        let out = self
            .client
            .get_queue_attributes()
            .queue_url(url)
            .attribute_names(aws_sdk_sqs::types::QueueAttributeName::VisibilityTimeout)
            .send()
            .await
            .map_err(|e| tracing::warn!(error = %aws_sdk_sqs::error::DisplayErrorContext(&e), "GetQueueAttributes failed"))
            .ok()?;
        out.attributes()?
            .get(&aws_sdk_sqs::types::QueueAttributeName::VisibilityTimeout)?
            .parse()
            .ok()
    }

    /// Resolves `arn:aws:sqs:REGION:ACCOUNT:NAME` to the queue URL with `GetQueueUrl`. A failed
    /// lookup is said once and stands for `RELEARN_AFTER`: meanwhile the queue's records keep
    /// the visibility they have (no extension, no backoff), which SQS's own timeout then ends.
    pub async fn queue_url(&self, queue_arn: &str) -> Option<String> {
        let known = self
            .urls
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(queue_arn)
            .cloned();
        match known {
            Some(Located::Url(url)) => return Some(url),
            Some(Located::FailedAt(at)) if at.elapsed() < RELEARN_AFTER => return None,
            _ => {}
        }
        let Some((account, name)) = parse_queue_arn(queue_arn) else {
            tracing::warn!(
                queue_arn,
                "the event source is not an SQS queue ARN: no visibility changes"
            );
            return None;
        };
        let located = match self
            .client
            .get_queue_url()
            .queue_name(name)
            .queue_owner_aws_account_id(account)
            .send()
            .await
        {
            Ok(out) => out.queue_url().map(|u| Located::Url(u.to_owned())),
            Err(e) => {
                tracing::warn!(
                    queue = name,
                    code = e.code().unwrap_or("transport"),
                    "GetQueueUrl failed: this queue's records keep the visibility they have \
                     (no extension, no backoff); asked again in five minutes"
                );
                None
            }
        };
        let located = located.unwrap_or(Located::FailedAt(std::time::Instant::now()));
        self.urls
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(queue_arn.to_owned(), located.clone());
        match located {
            Located::Url(url) => Some(url),
            Located::FailedAt(_) => None,
        }
    }
}

/// The account and queue name of an SQS queue ARN.
pub(crate) fn parse_queue_arn(arn: &str) -> Option<(&str, &str)> {
    let mut parts = arn.split(':');
    let (
        Some("arn"),
        Some(_partition),
        Some("sqs"),
        Some(_region),
        Some(account),
        Some(name),
        None,
    ) = (
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
    )
    else {
        return None;
    };
    (!account.is_empty() && !name.is_empty()).then_some((account, name))
}

impl SqsVisibility {
    /// One `ChangeMessageVisibilityBatch` call for at most ten changes; results in their order.
    async fn change_chunk(&self, url: &str, chunk: &[VisibilityChange]) -> Vec<ChangeResult> {
        let mut results = vec![ChangeResult::Uncertain; chunk.len()];
        let entries = chunk
            .iter()
            .enumerate()
            .filter_map(|(i, c)| {
                ChangeMessageVisibilityBatchRequestEntry::builder()
                    .id(i.to_string())
                    .receipt_handle(&c.receipt_handle)
                    .visibility_timeout(c.seconds)
                    .build()
                    .ok()
            })
            .collect();
        let sent = self
            .client
            .change_message_visibility_batch()
            .queue_url(url)
            .set_entries(Some(entries))
            .send()
            .await;
        match sent {
            Ok(res) => {
                let mut mark = |id: &str, result| {
                    if let Some(slot) = id.parse::<usize>().ok().and_then(|i| results.get_mut(i)) {
                        *slot = result;
                    }
                };
                for ok in res.successful() {
                    mark(ok.id(), ChangeResult::Changed);
                }
                for failed in res.failed() {
                    // Only the code: an SQS error message may quote a receipt handle.
                    tracing::warn!(code = failed.code(), "visibility change refused");
                    let result = if failed.sender_fault() {
                        ChangeResult::Refused
                    } else {
                        ChangeResult::Uncertain
                    };
                    mark(failed.id(), result);
                }
            }
            Err(e) => {
                tracing::warn!(
                    code = e.code().unwrap_or("transport"),
                    "visibility change failed"
                );
            }
        }
        results
    }
}

impl VisibilityControl for SqsVisibility {
    /// The queue's `VisibilityTimeout`, read once per execution environment and queue (a
    /// failed read is tried again after `RELEARN_AFTER`).
    async fn visibility_timeout_s(&self, queue_arn: &str) -> Option<i64> {
        let known = self
            .timeouts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(queue_arn)
            .copied();
        match known {
            Some(Learnt::Seconds(s)) => return Some(s),
            Some(Learnt::FailedAt(at)) if at.elapsed() < RELEARN_AFTER => return None,
            _ => {}
        }
        let seconds = self.read_visibility_timeout(queue_arn).await;
        let learnt = seconds.map_or_else(
            || Learnt::FailedAt(std::time::Instant::now()),
            Learnt::Seconds,
        );
        self.timeouts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(queue_arn.to_owned(), learnt);
        seconds
    }

    async fn change(&self, queue_arn: &str, changes: Vec<VisibilityChange>) -> ChangeResults {
        if changes.is_empty() {
            return ChangeResults::default();
        }
        let Some(url) = self.queue_url(queue_arn).await else {
            return ChangeResults {
                calls: 0,
                results: vec![ChangeResult::Uncertain; changes.len()],
            };
        };
        // Calls run concurrently (a large batch's changes must fit in the deadline margin);
        // `buffered` keeps their results in request order.
        let owned: Vec<Vec<VisibilityChange>> =
            changes.chunks(SQS_BATCH_LIMIT).map(<[_]>::to_vec).collect();
        let url = url.as_str();
        let chunks: Vec<Vec<ChangeResult>> = stream::iter(owned)
            .map(|chunk| async move { self.change_chunk(url, &chunk).await })
            .buffered(PARALLEL_CALLS)
            .collect()
            .await;
        ChangeResults {
            calls: chunks.len() as u32,
            results: chunks.into_iter().flatten().collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_arns_are_parsed_strictly() {
        assert_eq!(
            parse_queue_arn("arn:aws:sqs:eu-west-1:123456789012:jobs"),
            Some(("123456789012", "jobs"))
        );
        assert_eq!(
            parse_queue_arn("arn:aws:sqs:us-east-1:123456789012:jobs.fifo"),
            Some(("123456789012", "jobs.fifo"))
        );
        assert_eq!(parse_queue_arn("arn:aws:sns:us-east-1:1:t"), None);
        assert_eq!(parse_queue_arn("arn:aws:sqs:us-east-1:1:q:extra"), None);
        assert_eq!(parse_queue_arn(""), None);
    }
}

/// The worker's dead letters, sent to one queue (the work queue's DLQ) with
/// `SendMessageBatch`: ten a request, never more bytes than SQS takes in one.
#[derive(Debug, Clone)]
pub struct SqsDeadLetters {
    client: Client,
    queue_url: String,
}

impl SqsDeadLetters {
    /// Dead letters to the queue at `queue_url`.
    pub fn new(client: Client, queue_url: impl Into<String>) -> Self {
        SqsDeadLetters {
            client,
            queue_url: queue_url.into(),
        }
    }

    /// Sends one request's letters; `true` for each SQS took. Entries SQS failed on its side
    /// are sent once more, alone: the ones it took are never sent twice.
    async fn send_batch(&self, letters: &[&DeadLetter]) -> Vec<bool> {
        let mut taken = vec![false; letters.len()];
        let mut pending: Vec<usize> = (0..letters.len()).collect();
        for _ in 0..2 {
            let batch: Vec<&DeadLetter> = pending.iter().map(|&i| letters[i]).collect();
            let Some(failed) = self.send_entries(&batch).await else {
                break;
            };
            let mut again = Vec::new();
            for (at, &i) in pending.iter().enumerate() {
                match failed.iter().find(|(id, _)| *id == at) {
                    None => taken[i] = true,
                    Some((_, sender_fault)) if !sender_fault => again.push(i),
                    Some(_) => {}
                }
            }
            if again.is_empty() {
                break;
            }
            pending = again;
        }
        taken
    }

    /// One `SendMessageBatch`: the entries it failed, by position, each with whether the
    /// fault was the sender's; `None` when the request failed as a whole.
    async fn send_entries(&self, letters: &[&DeadLetter]) -> Option<Vec<(usize, bool)>> {
        use aws_sdk_sqs::types::{MessageAttributeValue, SendMessageBatchRequestEntry};
        let fifo = self.queue_url.ends_with(".fifo");
        let mut entries = Vec::with_capacity(letters.len());
        for (i, letter) in letters.iter().enumerate() {
            let mut entry = SendMessageBatchRequestEntry::builder()
                .id(i.to_string())
                .message_body(&letter.body);
            for (name, value) in letter.all_attributes()? {
                let value = MessageAttributeValue::builder()
                    .data_type("String")
                    .string_value(value)
                    .build()
                    .ok()?;
                entry = entry.message_attributes(name, value);
            }
            if fifo {
                let group = letter
                    .group_id
                    .clone()
                    .or_else(|| letter.job_id.clone())
                    .unwrap_or_else(|| "dead-letters".to_owned());
                // The original message id: a send repeated within five minutes (a delivery
                // whose acknowledgement was lost) is dropped by the queue.
                let dedup = letter
                    .message_id
                    .clone()
                    .unwrap_or_else(|| crate::job::artifact::sha256_hex(letter.body.as_bytes()));
                entry = entry
                    .message_group_id(group)
                    .message_deduplication_id(dedup);
            }
            entries.push(entry.build().ok()?);
        }
        match self
            .client
            .send_message_batch()
            .queue_url(&self.queue_url)
            .set_entries(Some(entries))
            .send()
            .await
        {
            Ok(out) => Some(
                out.failed()
                    .iter()
                    .filter_map(|f| Some((f.id().parse().ok()?, f.sender_fault())))
                    .collect(),
            ),
            Err(e) => {
                tracing::warn!(error = %aws_sdk_sqs::error::DisplayErrorContext(&e), "dead-letter send failed");
                None
            }
        }
    }
}

impl DeadLetterQueue for SqsDeadLetters {
    fn send<'a>(&'a self, letters: &'a [DeadLetter]) -> BoxFuture<'a, Vec<bool>> {
        Box::pin(async move {
            // A letter that cannot fit in one message is not sent (the redrive policy moves
            // it as it is), nor does it make its batch's request too large.
            let fit: Vec<&DeadLetter> = letters
                .iter()
                .filter(|l| l.all_attributes().is_some())
                .collect();
            let mut taken = Vec::with_capacity(fit.len());
            for batch in batches_by(&fit, |l| l.size()) {
                taken.extend(self.send_batch(batch).await);
            }
            let mut taken = taken.into_iter();
            letters
                .iter()
                .map(|l| l.all_attributes().is_some() && taken.next().unwrap_or(false))
                .collect()
        })
    }
}

/// The jobs waiting in the queues at `urls` together (see [`depth`]); a queue that cannot be
/// read counts none, and is passed to `unread`.
pub async fn queued(
    client: &aws_sdk_sqs::Client,
    urls: &[Option<String>],
    unread: impl Fn(&str),
) -> u64 {
    let mut queued = 0;
    for url in urls.iter().flatten() {
        match depth(client, url).await {
            Some(depth) => queued += depth,
            None => unread(url),
        }
    }
    queued
}

/// The jobs waiting in the queue at `url`, visible and in flight, as SQS approximates them
/// (`GetQueueAttributes`); `None` when it cannot be read.
pub async fn depth(client: &aws_sdk_sqs::Client, url: &str) -> Option<u64> {
    use aws_sdk_sqs::types::QueueAttributeName as Name;
    let read = client
        .get_queue_attributes()
        .queue_url(url)
        .attribute_names(Name::ApproximateNumberOfMessages)
        .attribute_names(Name::ApproximateNumberOfMessagesNotVisible)
        .send()
        .await
        .ok()?;
    let attributes = read.attributes()?;
    let count = |name: Name| attributes.get(&name)?.parse::<u64>().ok();
    Some(
        count(Name::ApproximateNumberOfMessages).unwrap_or(0)
            + count(Name::ApproximateNumberOfMessagesNotVisible).unwrap_or(0),
    )
}
