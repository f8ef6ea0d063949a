//! The dispatcher: a DynamoDB stream event source mapping on the ledger table, with
//! `ReportBatchItemFailures`. Publishes one completion event per job that became terminal or
//! `unknown`, to EventBridge (`EVENT_BUS_NAME`), SNS (`EVENT_TOPIC_ARN`) or SQS
//! (`EVENT_QUEUE_URL`), whichever is set.

use std::sync::Arc;

use fenced_jobs::config::{SdkTimeouts, sink_from_env};
use fenced_jobs::ops::dispatch::{StreamEvent, dispatch};
use lambda_runtime::{LambdaEvent, service_fn};
use tracing::Instrument;

// One thread: Lambda runs one invocation at a time per execution environment, with a fraction
// of a vCPU at small memory sizes, and a multi-thread runtime spends more CPU per AWS request
// (BENCHMARKS.md, "Runtime flavour") for no gain. The heartbeat and the records share the thread
// as tasks; nothing here blocks it.
#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), lambda_runtime::Error> {
    fenced_jobs::logs::init();
    let aws = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
    let bounded = SdkTimeouts::from_lookup(|name| std::env::var(name).ok())?.apply(&aws);
    let sink = match sink_from_env(&bounded) {
        Ok(sink) => Arc::new(sink),
        Err(e) => {
            fenced_jobs::logs::report_init_error("ConfigError", &e.to_string()).await;
            return Err(e.into());
        }
    };
    let target = Arc::new(fenced_jobs::ops::metrics::MetricsTarget::from_env());
    lambda_runtime::run(service_fn(move |event: LambdaEvent<StreamEvent>| {
        let sink = Arc::clone(&sink);
        let target = Arc::clone(&target);
        async move {
            let span = fenced_jobs::telemetry::invocation_span(
                &event.context.request_id,
                event.context.xray_trace_id.as_deref(),
                fenced_jobs::ops::metrics::cold_start(&target),
            );
            let report = dispatch(&event.payload, sink.as_ref())
                .instrument(span)
                .await;
            let deadline = i64::try_from(event.context.deadline).ok();
            fenced_jobs::telemetry::flush_before(deadline, fenced_jobs::telemetry::FLUSH_MARGIN_MS)
                .await;
            Ok::<_, lambda_runtime::Error>(report.response())
        }
    }))
    .await
}
