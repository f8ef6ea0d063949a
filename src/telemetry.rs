//! Traces through OpenTelemetry. With `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or
//! `OTEL_EXPORTER_OTLP_ENDPOINT` set (X-Ray's own endpoint, signed with the function's
//! credentials by [`signed`]; or a collector such as the ADOT layer at
//! `http://localhost:4318`), the functions' own spans are exported over OTLP/HTTP (protobuf):
//! the invocation, each record, each ledger call and each provider call, under the trace Lambda
//! passed (`_X_AMZN_TRACE_ID`, read with X-Ray's propagator; new ids made X-Ray's way), sampled
//! as that header says. A provider call is a GenAI client span (`chat {model}`, the provider,
//! the model, token counts, finish reason, and what the call cost), so a trace shows what each
//! call cost. Spans carry ids, epochs, attempts, operations and those figures, never a prompt,
//! an answer or a receipt handle; log lines are not exported. Unset, nothing is built and
//! nothing is sent.
//!
//! Spans are batched in the process and sent by the end of each invocation ([`flush`]), before
//! Lambda freezes the environment, within what is left before the invocation's margin: a
//! collector that stalls costs spans, never the response.

use std::collections::HashMap;
use std::sync::OnceLock;
use std::time::Duration;

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry::{Array, KeyValue, StringValue, Value};
use opentelemetry_aws::trace::{XrayIdGenerator, XrayPropagator};
use opentelemetry_otlp::{Protocol, RetryPolicy, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};
use tracing::Subscriber;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::Layer;
use tracing_subscriber::registry::LookupSpan;

use crate::provider::Answer;

pub mod signed;

/// The targets of this crate's code: the library and its binaries.
pub(crate) const OWN_TARGETS: [&str; 5] = [
    "fenced_jobs",
    "worker",
    "reconciler",
    "dispatcher",
    "jobctl",
];

/// How long an export may take: the collector is local.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(2);

/// The provider the process installed, flushed by the end of each invocation.
static INSTALLED: OnceLock<SdkTracerProvider> = OnceLock::new();

/// The version of the OpenTelemetry semantic conventions whose GenAI names the provider call
/// spans use (`gen_ai.*`, of development status).
pub const GENAI_CONVENTIONS: &str = "1.41.0";

/// Whether the process has not yet begun an invocation.
static COLD: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// `true` for the first invocation of the process (its cold start), `false` after.
pub fn take_cold_start() -> bool {
    COLD.swap(false, std::sync::atomic::Ordering::Relaxed)
}

/// The trace ids of an X-Ray header (`Root=1-5759e988-bd862e3fe1be46a994272793;Parent=...`):
/// X-Ray's form of the root (`1-5759e988-bd862e3fe1be46a994272793`) and OpenTelemetry's
/// (`5759e988bd862e3fe1be46a994272793`), the same id; `None` for a header without a valid root.
pub fn trace_ids(xray_trace: &str) -> Option<(&str, String)> {
    let root = xray_trace
        .split(';')
        .find_map(|part| part.trim().strip_prefix("Root="))?;
    let mut parts = root.split('-');
    let (Some("1"), Some(time), Some(id), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return None;
    };
    let hex = |s: &str, len| s.len() == len && s.bytes().all(|b| b.is_ascii_hexdigit());
    (hex(time, 8) && hex(id, 24)).then(|| (root, format!("{time}{id}")))
}

/// The span of one invocation, on every log line inside it: its request id, whether it is the
/// process's cold start (`cold_start`), and the trace Lambda passed in `xray_trace`
/// (`Root=...;Parent=...;Sampled=...`), when there is one, in both forms (`xray_trace_id`,
/// `trace_id`), so that a line is found from its trace and a trace from its lines. With tracing
/// on, its spans are in that trace.
pub fn invocation_span(
    request_id: &str,
    xray_trace: Option<&str>,
    cold_start: bool,
) -> tracing::Span {
    let ids = xray_trace.and_then(trace_ids);
    let span = tracing::info_span!(
        "invocation",
        requestId = request_id,
        cold_start,
        xray_trace_id = ids.as_ref().map(|(xray, _)| *xray),
        trace_id = ids.as_ref().map(|(_, otel)| otel.as_str()),
    );
    span.set_attribute("faas.coldstart", cold_start);
    if let Some(header) = xray_trace {
        let carrier = HashMap::from([("x-amzn-trace-id".to_owned(), header.to_owned())]);
        let parent = XrayPropagator::default().extract(&carrier);
        // Without the OpenTelemetry layer installed there is nothing to set.
        let _ = span.set_parent(parent);
    }
    span
}

/// A tracer provider exporting to `endpoint` (the whole URL, `.../v1/traces`), or to the one
/// the environment names when `None`, for the function `service`. X-Ray's own OTLP endpoint
/// (`https://xray.<region>.amazonaws.com/v1/traces`) is signed with the function's credentials
/// ([`signed`]); any other (a collector layer's) is sent as it is.
pub fn provider(endpoint: Option<&str>, service: &str) -> Result<SdkTracerProvider, String> {
    let url = endpoint.map(str::to_owned).or_else(endpoint_from_env);
    match url.as_deref().and_then(signed::xray_region) {
        None => build(endpoint.map(str::to_owned), service, None),
        Some(region) => {
            let credentials = signed::credentials_from_env().ok_or(
                "X-Ray's OTLP endpoint is signed with the function's credentials, and \
                 AWS_ACCESS_KEY_ID or AWS_SECRET_ACCESS_KEY is not set",
            )?;
            build(url.clone(), service, Some((region.to_owned(), credentials)))
        }
    }
}

/// A tracer provider exporting to `endpoint`, each request signed for X-Ray in `region` with
/// `credentials`.
pub fn signed_provider(
    endpoint: &str,
    service: &str,
    region: &str,
    credentials: aws_credential_types::Credentials,
) -> Result<SdkTracerProvider, String> {
    build(
        Some(endpoint.to_owned()),
        service,
        Some((region.to_owned(), credentials)),
    )
}

/// The traces endpoint the environment names, as the exporter reads it.
fn endpoint_from_env() -> Option<String> {
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").or_else(|| {
        var("OTEL_EXPORTER_OTLP_ENDPOINT")
            .map(|base| format!("{}/v1/traces", base.trim_end_matches('/')))
    })
}

/// [`provider`], its requests signed when `signer` says for which Region and with what.
fn build(
    endpoint: Option<String>,
    service: &str,
    signer: Option<(String, aws_credential_types::Credentials)>,
) -> Result<SdkTracerProvider, String> {
    // The exporter's blocking HTTP client runs on the batch processor's own thread, and must
    // not be built on an async runtime's.
    let built = std::thread::spawn(move || {
        // No retries: a trace is never worth holding the invocation up (a refused export
        // costs a connect; the spans are dropped).
        let mut builder = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .with_timeout(EXPORT_TIMEOUT)
            .with_retry_policy(RetryPolicy::disabled());
        if let Some((region, credentials)) = signer {
            let client = reqwest::blocking::Client::builder()
                .timeout(EXPORT_TIMEOUT)
                .build()
                .map_err(|e| {
                    opentelemetry_otlp::ExporterBuildError::InternalFailure(e.to_string())
                })?;
            builder = builder.with_http_client(signed::Signed::new(client, &region, credentials));
        }
        match endpoint {
            Some(url) => builder.with_endpoint(url).build(),
            None => builder.build(),
        }
    })
    .join()
    .map_err(|_| "building the span exporter panicked".to_owned())?;
    let exporter = built.map_err(|e| e.to_string())?;
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_sampler(Sampler::ParentBased(Box::new(Sampler::AlwaysOn)))
        .with_id_generator(XrayIdGenerator::default())
        .with_resource(
            Resource::builder_empty()
                .with_attribute(KeyValue::new("service.name", service.to_owned()))
                .with_attribute(KeyValue::new("cloud.provider", "aws"))
                .with_attribute(KeyValue::new("cloud.platform", "aws_lambda"))
                .build(),
        )
        .build())
}

/// A tracing layer was built: log lines look up the span they were written in.
static TRACING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The OpenTelemetry span id of the span the caller is in (16 hex digits), with tracing on and
/// a span its layer records in a sampled trace (one that reaches the collector); `None`
/// otherwise, at the cost of one load.
pub(crate) fn current_span_id() -> Option<String> {
    use opentelemetry::trace::TraceContextExt;
    if !TRACING.load(std::sync::atomic::Ordering::Relaxed) {
        return None;
    }
    // The layer makes each span's context the current one while it is entered (and a line is
    // written on the thread that entered it), so no lookup goes back through the subscriber.
    let context = opentelemetry::Context::current();
    let span = context.span();
    let id = span.span_context();
    (id.is_valid() && id.is_sampled()).then(|| id.span_id().to_string())
}

/// The layer sending the crate's own spans (at debug and above, no events) through `provider`.
pub fn layer<S>(provider: &SdkTracerProvider) -> impl Layer<S> + use<S>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    use tracing_subscriber::filter::{FilterExt, Targets, filter_fn};
    TRACING.store(true, std::sync::atomic::Ordering::Relaxed);
    let own = Targets::new().with_targets(OWN_TARGETS.map(|t| (t, tracing::Level::DEBUG)));
    tracing_opentelemetry::layer()
        .with_tracer(provider.tracer("fenced-jobs"))
        .with_location(false)
        .with_threads(false)
        .with_tracked_inactivity(false)
        .with_filter(own.and(filter_fn(|meta| meta.is_span())))
}

/// The layer for this process when the environment names an endpoint, its provider installed
/// for [`flush`]; `None` otherwise, or when it cannot be built (said on stderr).
pub fn from_env<S>() -> Option<impl Layer<S>>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    let set = |name: &str| std::env::var(name).is_ok_and(|v| !v.trim().is_empty());
    if !set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") && !set("OTEL_EXPORTER_OTLP_ENDPOINT") {
        return None;
    }
    let service =
        std::env::var("AWS_LAMBDA_FUNCTION_NAME").unwrap_or_else(|_| "fenced-jobs".into());
    match provider(None, &service) {
        Ok(provider) => {
            let layer = layer(&provider);
            let _ = INSTALLED.set(provider);
            Some(layer)
        }
        Err(e) => {
            eprintln!("tracing is off: the OTLP exporter could not be built: {e}");
            None
        }
    }
}

/// Sends the spans the invocation finished, waiting for the collector's answer at most
/// `budget` (and the export timeout): Lambda may freeze the environment as soon as the
/// invocation returns, and the response must not wait on a collector that stalls. A flush cut
/// short costs spans, never the response; a zero budget sends nothing now (the spans wait in
/// the batch for the next invocation's flush).
pub async fn flush(budget: Duration) {
    if let Some(provider) = INSTALLED.get() {
        flush_provider(provider, budget).await;
    }
}

/// [`flush`] within what is left of an invocation whose deadline is `deadline_ms` (milliseconds
/// since the epoch; `None`, or 0, when there is none) once `margin_ms` is kept back.
pub async fn flush_before(deadline_ms: Option<i64>, margin_ms: i64) {
    use crate::clock::Clock;
    let deadline = deadline_ms.filter(|d| *d > 0);
    let now = crate::clock::SystemClock.now_ms();
    flush(flush_budget(deadline, margin_ms, now)).await;
}

/// The margin the reconciler and the dispatcher keep back from their deadline for the flush.
pub const FLUSH_MARGIN_MS: i64 = 1_000;

/// [`flush`] for `provider`: whether the collector took the spans within `budget`.
pub async fn flush_provider(provider: &SdkTracerProvider, budget: Duration) -> bool {
    if budget.is_zero() {
        return false;
    }
    let provider = provider.clone();
    // The blocking flush goes on in its thread when the budget runs out; nothing waits for it.
    let flushing = tokio::task::spawn_blocking(move || provider.force_flush());
    matches!(
        tokio::time::timeout(budget.min(EXPORT_TIMEOUT), flushing).await,
        Ok(Ok(Ok(())))
    )
}

/// The time a flush may take: what is left before the invocation's margin (`deadline_ms`
/// less `margin_ms`, both in milliseconds since the epoch) at `now_ms`, at most the export
/// timeout; without a deadline, the export timeout.
pub fn flush_budget(deadline_ms: Option<i64>, margin_ms: i64, now_ms: i64) -> Duration {
    match deadline_ms {
        None => EXPORT_TIMEOUT,
        Some(deadline) => {
            let left = deadline.saturating_sub(margin_ms).saturating_sub(now_ms);
            Duration::from_millis(u64::try_from(left).unwrap_or(0)).min(EXPORT_TIMEOUT)
        }
    }
}

/// What a provider call's span records once it is answered, as the GenAI semantic conventions
/// name it ([`GENAI_CONVENTIONS`]): the tokens the provider says it used (the input's count
/// including what the cache served and what was written to it, each also on its own), why the
/// model stopped, the response's id and model, and what it cost.
pub(crate) fn record_call(span: &tracing::Span, answer: &Answer, cost_micros: Option<u64>) {
    let count = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    if let Some(u) = &answer.usage {
        let input = u.input + u.cache_read + u.cache_write;
        span.set_attribute("gen_ai.usage.input_tokens", count(input));
        span.set_attribute("gen_ai.usage.output_tokens", count(u.output));
        span.set_attribute("gen_ai.usage.cache_read.input_tokens", count(u.cache_read));
        span.set_attribute(
            "gen_ai.usage.cache_creation.input_tokens",
            count(u.cache_write),
        );
    }
    let reasons = Array::String(vec![StringValue::from(answer.finish.as_str())]);
    span.set_attribute("gen_ai.response.finish_reasons", Value::Array(reasons));
    if let Some(id) = answer.response_id.as_ref().or(answer.provider_ref.as_ref()) {
        span.set_attribute("gen_ai.response.id", id.clone());
    }
    if let Some(model) = &answer.model {
        span.set_attribute("gen_ai.response.model", model.clone());
    }
    if let Some(micros) = cost_micros {
        span.set_attribute("fenced_jobs.cost_usd", micros as f64 / 1e6);
    }
}

/// A provider call that did not answer: the span's status is an error, and `error.type` says
/// which (`error_type`), so that a call whose outcome is unknown is never shown as a success.
pub(crate) fn record_failure(span: &tracing::Span, error_type: &'static str) {
    span.set_attribute("error.type", error_type);
    span.set_status(opentelemetry::trace::Status::error(error_type));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_xray_header_gives_its_root_in_both_forms_and_nothing_else_does() {
        let header = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1";
        assert_eq!(
            trace_ids(header),
            Some((
                "1-5759e988-bd862e3fe1be46a994272793",
                "5759e988bd862e3fe1be46a994272793".to_owned()
            ))
        );
        let reordered = "Sampled=0;Root=1-5759e988-bd862e3fe1be46a994272793";
        assert!(trace_ids(reordered).is_some());
        for bad in [
            "Parent=53995c3f42cd8ad8",
            "Root=2-5759e988-bd862e3fe1be46a994272793",
            "Root=1-5759e988-bd862e3fe1be46a99427279",
            "Root=1-5759e98z-bd862e3fe1be46a994272793",
            "Root=1-5759e988-bd862e3fe1be46a994272793-00",
        ] {
            assert_eq!(trace_ids(bad), None, "{bad}");
        }
    }

    #[test]
    fn only_the_first_invocation_is_a_cold_start() {
        take_cold_start();
        assert!(!take_cold_start());
    }
}
