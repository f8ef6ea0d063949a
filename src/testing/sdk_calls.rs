//! Counts the AWS requests a client sends, by service and operation, retries included, and
//! times each operation.
//!
//! Attach a [`CallCounter`] to an SDK client's config with `.interceptor(counter.clone())`; the
//! demo and the tests use it to report DynamoDB and SQS calls per record, the benchmarks the
//! latency each operation adds.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aws_smithy_runtime_api::box_error::BoxError;
use aws_smithy_runtime_api::client::interceptors::Intercept;
use aws_smithy_runtime_api::client::interceptors::context::{
    BeforeSerializationInterceptorContextRef, BeforeTransmitInterceptorContextRef,
    FinalizerInterceptorContextRef,
};
use aws_smithy_runtime_api::client::orchestrator::Metadata;
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_types::config_bag::{ConfigBag, Storable, StoreReplace};

/// A shared tally of requests sent, keyed `service:operation` (service in lowercase), and of
/// each operation's wall time.
#[derive(Debug, Clone, Default)]
pub struct CallCounter(Arc<Mutex<Tally>>);

#[derive(Debug, Default)]
struct Tally {
    /// Requests sent (each retry one more).
    sent: BTreeMap<String, u64>,
    /// Each operation's wall time, from before its input is serialized to its output or error
    /// (retries and their backoff included): the time its caller waited. An operation that
    /// never ends (its caller dropped it, or a timeout outside the SDK's fired) has none.
    took: BTreeMap<String, Vec<Duration>>,
}

/// When an operation began, kept in its own configuration bag.
#[derive(Debug)]
struct Began(Instant);

impl Storable for Began {
    type Storer = StoreReplace<Self>;
}

fn key(cfg: &ConfigBag) -> String {
    cfg.load::<Metadata>().map_or_else(
        || "unknown:unknown".to_owned(),
        |m| format!("{}:{}", m.service().to_ascii_lowercase(), m.name()),
    )
}

impl CallCounter {
    /// A counter at zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// Requests per `service:operation` so far.
    pub fn counts(&self) -> BTreeMap<String, u64> {
        self.lock().sent.clone()
    }

    /// Each finished operation's wall time so far, for one operation, in the order they ended.
    pub fn took(&self, service: &str, operation: &str) -> Vec<Duration> {
        self.lock()
            .took
            .get(&format!("{service}:{operation}"))
            .cloned()
            .unwrap_or_default()
    }

    /// Requests to one service so far.
    pub fn total(&self, service: &str) -> u64 {
        let prefix = format!("{service}:");
        self.lock()
            .sent
            .iter()
            .filter(|(k, _)| k.starts_with(&prefix))
            .map(|(_, v)| v)
            .sum()
    }

    /// Requests for one operation so far.
    pub fn get(&self, service: &str, operation: &str) -> u64 {
        self.lock()
            .sent
            .get(&format!("{service}:{operation}"))
            .copied()
            .unwrap_or(0)
    }

    /// Back to zero.
    pub fn reset(&self) {
        *self.lock() = Tally::default();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Tally> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// DynamoDB and SQS clients from one SDK configuration, both counting into one [`CallCounter`].
pub fn counted_clients(
    config: &aws_config::SdkConfig,
) -> (aws_sdk_dynamodb::Client, aws_sdk_sqs::Client, CallCounter) {
    let calls = CallCounter::new();
    let ddb = aws_sdk_dynamodb::Client::from_conf(
        aws_sdk_dynamodb::config::Builder::from(config)
            .interceptor(calls.clone())
            .build(),
    );
    let sqs = aws_sdk_sqs::Client::from_conf(
        aws_sdk_sqs::config::Builder::from(config)
            .interceptor(calls.clone())
            .build(),
    );
    (ddb, sqs, calls)
}

impl Intercept for CallCounter {
    fn name(&self) -> &'static str {
        "CallCounter"
    }

    fn read_before_execution(
        &self,
        _context: &BeforeSerializationInterceptorContextRef<'_>,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        cfg.interceptor_state().store_put(Began(Instant::now()));
        Ok(())
    }

    fn read_before_transmit(
        &self,
        _context: &BeforeTransmitInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        *self.lock().sent.entry(key(cfg)).or_default() += 1;
        Ok(())
    }

    fn read_after_execution(
        &self,
        _context: &FinalizerInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        if let Some(Began(at)) = cfg.load::<Began>() {
            let took = at.elapsed();
            self.lock().took.entry(key(cfg)).or_default().push(took);
        }
        Ok(())
    }
}

/// One AWS request as IAM would judge it: who sent it, and what it named.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
pub struct RecordedCall {
    /// The template's logical id of the role the sender runs as (`WorkerRole`, ...).
    pub role: String,
    /// The SDK's service name, in lowercase (`sqs`, `dynamodb`, `s3`, ...).
    pub service: String,
    /// The API operation (`ChangeMessageVisibilityBatch`, `Query`, ...).
    pub operation: String,
    /// The request's path (S3 names its bucket and key there).
    pub path: String,
    /// The resource names the request's JSON or form body carries (`QueueUrl`, `TableName`,
    /// `IndexName`, `StreamArn`, `EventBusName`, `TopicArn`, `SecretId`), by name.
    pub names: BTreeMap<String, String>,
}

/// Records every request a client sends as one role, for an IAM evaluator to judge later
/// (`scripts/iam_check.py`). Attach with `.interceptor(recorder.clone())`.
#[derive(Debug, Clone)]
pub struct CallRecorder {
    role: String,
    calls: Arc<Mutex<Vec<RecordedCall>>>,
}

/// The body fields that name a resource, in the services the functions call.
const NAMED: [&str; 8] = [
    "QueueName",
    "QueueUrl",
    "TableName",
    "IndexName",
    "StreamArn",
    "EventBusName",
    "TopicArn",
    "SecretId",
];

impl CallRecorder {
    /// A recorder for `role` that appends to `calls` (shared by every role of one test).
    pub fn new(role: &str, calls: Arc<Mutex<Vec<RecordedCall>>>) -> Self {
        Self {
            role: role.to_owned(),
            calls,
        }
    }

    fn names_in(body: &[u8]) -> BTreeMap<String, String> {
        let mut names = BTreeMap::new();
        if let Ok(serde_json::Value::Object(doc)) = serde_json::from_slice(body) {
            for key in NAMED {
                if let Some(v) = doc.get(key).and_then(|v| v.as_str()) {
                    names.insert(key.to_owned(), v.to_owned());
                }
            }
            // A single-item DynamoDB request names its partition key (the job_id of the ledger's
            // items), which a policy may bound (`dynamodb:LeadingKeys`).
            if let Some(key) = ["Key", "Item"]
                .iter()
                .find_map(|k| doc.get(*k)?.get("job_id")?.get("S")?.as_str())
            {
                names.insert("LeadingKey".to_owned(), key.to_owned());
            }
            // PutEvents names its bus in each entry.
            if let Some(bus) = doc
                .get("Entries")
                .and_then(|e| e.get(0))
                .and_then(|e| e.get("EventBusName"))
                .and_then(|v| v.as_str())
            {
                names.insert("EventBusName".to_owned(), bus.to_owned());
            }
        } else if let Ok(text) = std::str::from_utf8(body) {
            // The query protocol (SNS): a form.
            for pair in text.split('&') {
                if let Some((k, v)) = pair.split_once('=')
                    && NAMED.contains(&k)
                {
                    names.insert(k.to_owned(), percent_decoded(v));
                }
            }
        }
        names
    }
}

fn percent_decoded(v: &str) -> String {
    let bytes = v.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(b) => {
                        out.push(b);
                        i += 3;
                        continue;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b'+' => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

impl Intercept for CallRecorder {
    fn name(&self) -> &'static str {
        "CallRecorder"
    }

    fn read_before_transmit(
        &self,
        context: &BeforeTransmitInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let (service, operation) = cfg.load::<Metadata>().map_or_else(
            || ("unknown".to_owned(), "unknown".to_owned()),
            |m| (m.service().to_ascii_lowercase(), m.name().to_owned()),
        );
        let request = context.request();
        let path = request
            .uri()
            .split_once("://")
            .map_or(request.uri(), |(_, rest)| {
                rest.find('/').map_or("/", |i| &rest[i..])
            })
            .to_owned();
        let names = request
            .body()
            .bytes()
            .map(Self::names_in)
            .unwrap_or_default();
        let call = RecordedCall {
            role: self.role.clone(),
            service,
            operation,
            path,
            names,
        };
        self.calls
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(call);
        Ok(())
    }
}
