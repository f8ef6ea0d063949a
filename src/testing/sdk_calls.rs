//! Counts the AWS requests a client sends, by service and operation, retries included.
//!
//! Attach a [`CallCounter`] to an SDK client's config with `.interceptor(counter.clone())`; the
//! demo and the tests use it to report DynamoDB and SQS calls per record.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use aws_smithy_runtime_api::box_error::BoxError;
use aws_smithy_runtime_api::client::interceptors::Intercept;
use aws_smithy_runtime_api::client::interceptors::context::BeforeTransmitInterceptorContextRef;
use aws_smithy_runtime_api::client::orchestrator::Metadata;
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_types::config_bag::ConfigBag;

/// A shared tally of requests sent, keyed `service:operation` (service in lowercase).
#[derive(Debug, Clone, Default)]
pub struct CallCounter(Arc<Mutex<BTreeMap<String, u64>>>);

impl CallCounter {
    /// A counter at zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// Requests per `service:operation` so far.
    pub fn counts(&self) -> BTreeMap<String, u64> {
        self.lock().clone()
    }

    /// Requests to one service so far.
    pub fn total(&self, service: &str) -> u64 {
        let prefix = format!("{service}:");
        self.lock()
            .iter()
            .filter(|(k, _)| k.starts_with(&prefix))
            .map(|(_, v)| v)
            .sum()
    }

    /// Requests for one operation so far.
    pub fn get(&self, service: &str, operation: &str) -> u64 {
        self.lock()
            .get(&format!("{service}:{operation}"))
            .copied()
            .unwrap_or(0)
    }

    /// Back to zero.
    pub fn reset(&self) {
        self.lock().clear();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, u64>> {
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

    fn read_before_transmit(
        &self,
        _context: &BeforeTransmitInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let key = cfg.load::<Metadata>().map_or_else(
            || "unknown:unknown".to_owned(),
            |m| format!("{}:{}", m.service().to_ascii_lowercase(), m.name()),
        );
        *self.lock().entry(key).or_default() += 1;
        Ok(())
    }
}
