//! Logs as Lambda's own log controls ask for them: JSON lines (or text, when the function's
//! `LoggingConfig` says `Text`) at the level Lambda passes in `AWS_LAMBDA_LOG_LEVEL`, each line
//! one flat object with `timestamp`, `level`, `message`, the event's fields, and the fields of
//! the spans it happened in (the invocation's `requestId`, `cold_start`, `trace_id` and
//! `xray_trace_id`, the record's `job_id`) at the top level, where CloudWatch Logs Insights and
//! Lambda's level filter find them; with tracing on, `span_id` too, the span of the trace the
//! line was written in.
//!
//! `RUST_LOG`, when set, overrides the level for every crate: `RUST_LOG=trace` lets the AWS SDK
//! log request and response bodies, so it is for local debugging only. `AWS_LAMBDA_LOG_LEVEL`
//! applies to this crate, with the libraries held at `warn`.

use std::fmt;

use serde_json::Value;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Subscriber};
use tracing_subscriber::Layer;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, MakeWriter};
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;

/// How the process logs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogSettings {
    /// JSON lines (`AWS_LAMBDA_LOG_FORMAT` unset or `JSON`), or text (`Text`).
    pub json: bool,
    /// The filter directives.
    pub filter: String,
}

impl LogSettings {
    /// Reads `RUST_LOG`, `AWS_LAMBDA_LOG_LEVEL` and `AWS_LAMBDA_LOG_FORMAT` through `lookup`.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> LogSettings {
        let json = !lookup("AWS_LAMBDA_LOG_FORMAT").is_some_and(|f| f.eq_ignore_ascii_case("text"));
        let filter = match lookup("RUST_LOG").filter(|v| !v.trim().is_empty()) {
            Some(directives) => directives,
            None => {
                let level = match lookup("AWS_LAMBDA_LOG_LEVEL")
                    .unwrap_or_default()
                    .to_ascii_uppercase()
                    .as_str()
                {
                    "TRACE" => "trace",
                    "DEBUG" => "debug",
                    "WARN" => "warn",
                    "ERROR" | "FATAL" => "error",
                    _ => "info",
                };
                let own: Vec<String> = crate::telemetry::OWN_TARGETS
                    .iter()
                    .map(|t| format!("{t}={level}"))
                    .collect();
                format!("warn,{}", own.join(","))
            }
        };
        LogSettings { json, filter }
    }
}

/// Installs the process's log subscriber, from the environment, writing to stdout; with an
/// OTLP endpoint set, the OpenTelemetry layer beside it ([`crate::telemetry`]), which alone sees
/// the debug spans of ledger and provider calls (so they cost nothing without tracing).
pub fn init() {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let settings = LogSettings::from_lookup(|name| std::env::var(name).ok());
    let filter = tracing_subscriber::EnvFilter::try_new(&settings.filter)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let registry = tracing_subscriber::registry().with(crate::telemetry::from_env());
    let installed = if settings.json {
        registry
            .with(json_layer(std::io::stdout).with_filter(filter))
            .try_init()
    } else {
        let fmt = tracing_subscriber::fmt::layer()
            .with_ansi(false)
            .with_target(false)
            .with_writer(std::io::stdout)
            .with_filter(filter);
        registry.with(fmt).try_init()
    };
    if let Err(e) = installed {
        eprintln!("logging was already set up: {e}");
    }
}

/// The JSON subscriber the functions install, writing flat lines to `writer` at `filter`: for
/// tests of the log format, and for benchmarks that count what logging costs.
pub fn json_subscriber<W>(filter: &str, writer: W) -> impl Subscriber + Send + Sync
where
    W: for<'a> MakeWriter<'a> + Send + Sync + 'static,
{
    use tracing_subscriber::layer::SubscriberExt;
    tracing_subscriber::registry()
        .with(json_layer(writer).with_filter(tracing_subscriber::EnvFilter::new(filter)))
}

/// Flat JSON lines to `writer`: spans keep their fields as values (`KeepFields`), which each
/// line copies, and the formatter's own per-span text is left empty. The functions' format,
/// for a subscriber of its own (beside the tracing layer, say).
pub fn json_layer<S, W>(writer: W) -> impl Layer<S> + Send + Sync
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    W: for<'a> MakeWriter<'a> + Send + Sync + 'static,
{
    let fmt = tracing_subscriber::fmt::layer()
        .fmt_fields(NoText)
        .event_format(FlatJson)
        .with_writer(writer);
    KeepFields.and_then(fmt)
}

/// Fields by name, in the order first given; a name given again keeps its place and takes the
/// newer value (a line's own fields over its spans', an inner span's over an outer one's).
type Named = Vec<(&'static str, Value)>;

/// A span's fields as JSON values, kept in its extensions from its creation on.
struct SpanFields(Named);

/// Keeps each span's fields as values (`SpanFields`), so that a line copies them rather than
/// parsing them back from text.
struct KeepFields;

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for KeepFields {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else {
            return;
        };
        let mut fields = Named::new();
        attrs.record(&mut Fields(&mut fields));
        span.extensions_mut().insert(SpanFields(fields));
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else {
            return;
        };
        if let Some(SpanFields(fields)) = span.extensions_mut().get_mut::<SpanFields>() {
            values.record(&mut Fields(fields));
        }
    }
}

/// The formatter's text of a span's fields: none (the lines take `SpanFields` instead).
struct NoText;

impl<'w> FormatFields<'w> for NoText {
    fn format_fields<R: tracing_subscriber::field::RecordFields>(
        &self,
        _writer: Writer<'w>,
        _fields: R,
    ) -> fmt::Result {
        Ok(())
    }
}

/// One flat JSON object per event: the spans' fields (outermost first), then the event's.
struct FlatJson;

impl<S, N> FormatEvent<S, N> for FlatJson
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let now = time::OffsetDateTime::now_utc()
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap_or_default();
        let mut line: Named = Vec::with_capacity(24);
        line.push(("timestamp", Value::String(now)));
        line.push((
            "level",
            Value::String(event.metadata().level().as_str().to_owned()),
        ));
        let mut fields = Fields(&mut line);
        if let Some(scope) = ctx.event_scope() {
            for span in scope.from_root() {
                if let Some(SpanFields(named)) = span.extensions().get::<SpanFields>() {
                    for (name, value) in named {
                        fields.put(name, value.clone());
                    }
                }
            }
        }
        event.record(&mut fields);
        // With tracing on, the span the line was written in, as its trace has it.
        if let Some(span_id) = crate::telemetry::current_span_id() {
            fields.put("span_id", Value::String(span_id));
        }
        let text = serde_json::to_string(&Line(&line)).map_err(|_| fmt::Error)?;
        writeln!(writer, "{text}")
    }
}

/// A line's fields as one JSON object, in their order.
struct Line<'a>(&'a [(&'static str, Value)]);

impl serde::Serialize for Line<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (name, value) in self.0 {
            map.serialize_entry(name, value)?;
        }
        map.end()
    }
}

/// Collects fields into a line (or a span's list).
struct Fields<'a>(&'a mut Named);

impl Fields<'_> {
    fn put(&mut self, name: &'static str, value: Value) {
        match self.0.iter_mut().find(|(n, _)| *n == name) {
            Some(slot) => slot.1 = value,
            None => self.0.push((name, value)),
        }
    }
}

impl Visit for Fields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.put(field.name(), Value::String(value.into()));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.put(field.name(), value.into());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.put(field.name(), value.into());
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.put(field.name(), value.into());
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.put(field.name(), value.into());
    }
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.put(field.name(), Value::String(format!("{value:?}")));
    }
}

/// Tells Lambda that the function could not start (a configuration error, say) through the
/// Runtime API's init-error endpoint, so the console and the logs show it as an init error with
/// its type, instead of a runtime that exited. Without `AWS_LAMBDA_RUNTIME_API` (not in Lambda)
/// it does nothing.
pub async fn report_init_error(error_type: &str, message: &str) {
    let Ok(api) = std::env::var("AWS_LAMBDA_RUNTIME_API") else {
        return;
    };
    tracing::error!(error_type, error = message, "the function could not start");
    if let Err(e) = post_init_error(&api, error_type, message).await {
        eprintln!("could not report the init error: {e}");
    }
}

/// One HTTP/1.1 request to the Runtime API on its local address (plain HTTP, no client library).
async fn post_init_error(api: &str, error_type: &str, message: &str) -> std::io::Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let body = serde_json::json!({ "errorType": error_type, "errorMessage": message }).to_string();
    let mut stream = tokio::net::TcpStream::connect(api).await?;
    let request = format!(
        "POST /2018-06-01/runtime/init/error HTTP/1.1\r\nHost: {api}\r\n\
         Lambda-Runtime-Function-Error-Type: {error_type}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await?;
    let mut status = [0u8; 12];
    stream.read_exact(&mut status).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn settings(vars: &[(&str, &str)]) -> LogSettings {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        LogSettings::from_lookup(|name| map.get(name).cloned())
    }

    #[test]
    fn lambda_log_controls_are_honoured_and_rust_log_overrides_them() {
        assert!(settings(&[]).json);
        assert!(settings(&[]).filter.contains("fenced_jobs=info"));
        let text = settings(&[("AWS_LAMBDA_LOG_FORMAT", "Text")]);
        assert!(!text.json);
        let debug = settings(&[("AWS_LAMBDA_LOG_LEVEL", "DEBUG")]);
        assert!(debug.filter.starts_with("warn,"), "libraries stay at warn");
        assert!(debug.filter.contains("worker=debug"));
        let fatal = settings(&[("AWS_LAMBDA_LOG_LEVEL", "FATAL")]);
        assert!(fatal.filter.contains("dispatcher=error"));
        let rust = settings(&[("AWS_LAMBDA_LOG_LEVEL", "DEBUG"), ("RUST_LOG", "trace")]);
        assert_eq!(rust.filter, "trace");
    }
}
