//! X-Ray subsegments from the functions' own spans: with active tracing, Lambda opens a segment
//! per invocation and runs an X-Ray daemon beside the function (`AWS_XRAY_DAEMON_ADDRESS`). This
//! layer sends that daemon one subsegment per record, ledger call and provider call, under the
//! invocation's segment, annotated with the job id, the epoch and the operation: the fields
//! named in [`ANNOTATED`], never anything else a span carries (no prompt, no answer).
//!
//! The invocation span carries the trace header Lambda passed (`xray_trace`); a sampled-out
//! invocation sends nothing. Sending is one UDP datagram per finished span, which never blocks
//! and never fails the work.

use std::net::UdpSocket;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value, json};
use tracing::Subscriber;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;

/// The span fields sent as annotations.
pub(crate) const ANNOTATED: [&str; 5] = ["job_id", "epoch", "attempt", "operation", "message_id"];
/// The span names sent as subsegments.
pub(crate) const TRACED: [&str; 3] = ["record", "ledger", "provider"];

/// The span of one invocation: its request id (on every log line inside it) and the trace
/// header Lambda passed (where this layer finds the trace and the invocation's segment).
pub fn invocation_span(request_id: &str, xray_trace: Option<&str>) -> tracing::Span {
    tracing::info_span!(
        "invocation",
        requestId = request_id,
        xray_trace = xray_trace.unwrap_or("")
    )
}

/// Sends finished spans to the X-Ray daemon.
#[derive(Debug)]
pub struct XRayLayer {
    socket: UdpSocket,
    daemon: String,
}

impl XRayLayer {
    /// A layer sending to `AWS_XRAY_DAEMON_ADDRESS` (`host:port`, or Lambda's `udp:host:port
    /// tcp:host:port` form), if it is set.
    pub fn from_env() -> Option<XRayLayer> {
        let address = std::env::var("AWS_XRAY_DAEMON_ADDRESS").ok()?;
        XRayLayer::to(&address)
    }

    /// A layer sending to `address`.
    pub fn to(address: &str) -> Option<XRayLayer> {
        let daemon = address
            .split_whitespace()
            .find_map(|part| part.strip_prefix("udp:"))
            .unwrap_or(address)
            .to_owned();
        let socket = UdpSocket::bind("0.0.0.0:0").ok()?;
        socket.set_nonblocking(true).ok()?;
        Some(XRayLayer { socket, daemon })
    }
}

/// What the layer keeps for a span.
struct Traced {
    id: String,
    start: f64,
    annotations: Map<String, Value>,
    /// The trace header, on the invocation span: `Root=...;Parent=...;Sampled=1`.
    header: Option<String>,
}

impl<S> Layer<S> for XRayLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let mut traced = Traced {
            id: segment_id(),
            start: now(),
            annotations: Map::new(),
            header: None,
        };
        attrs.record(&mut Annotations(&mut traced));
        span.extensions_mut().insert(traced);
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(id)
            && let Some(traced) = span.extensions_mut().get_mut::<Traced>()
        {
            values.record(&mut Annotations(traced));
        }
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(&id) else { return };
        if !TRACED.contains(&span.name()) {
            return;
        }
        // The trace and the parent: the nearest traced span above, or the invocation's segment.
        let mut parent_id = None;
        let mut header = None;
        for above in span.scope().skip(1) {
            let extensions = above.extensions();
            let Some(traced) = extensions.get::<Traced>() else {
                continue;
            };
            if parent_id.is_none() && TRACED.contains(&above.name()) {
                parent_id = Some(traced.id.clone());
            }
            if let Some(h) = &traced.header {
                header = Some(h.clone());
                break;
            }
        }
        let Some(header) = header else { return };
        let Some((root, invocation_parent)) = parse_header(&header) else {
            return;
        };
        let extensions = span.extensions();
        let Some(traced) = extensions.get::<Traced>() else {
            return;
        };
        let document = json!({
            "name": span.name(),
            "id": traced.id,
            "trace_id": root,
            "parent_id": parent_id.unwrap_or(invocation_parent),
            "type": "subsegment",
            "start_time": traced.start,
            "end_time": now(),
            "annotations": traced.annotations,
        });
        let datagram = format!("{{\"format\": \"json\", \"version\": 1}}\n{document}");
        // Best effort: a full buffer or a missing daemon never holds the work up.
        let _ = self.socket.send_to(datagram.as_bytes(), &self.daemon);
    }
}

/// The trace root and the parent segment of a sampled trace header.
fn parse_header(header: &str) -> Option<(String, String)> {
    let mut root = None;
    let mut parent = None;
    let mut sampled = false;
    for part in header.split(';') {
        match part.split_once('=') {
            Some(("Root", v)) => root = Some(v.to_owned()),
            Some(("Parent", v)) => parent = Some(v.to_owned()),
            Some(("Sampled", v)) => sampled = v == "1",
            _ => {}
        }
    }
    if !sampled {
        return None;
    }
    Some((root?, parent?))
}

/// Collects the annotated fields, and the trace header.
struct Annotations<'a>(&'a mut Traced);

impl Annotations<'_> {
    fn keep(&mut self, field: &Field, value: Value) {
        if ANNOTATED.contains(&field.name()) {
            self.0.annotations.insert(field.name().to_owned(), value);
        }
    }
}

impl Visit for Annotations<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "xray_trace" {
            self.0.header = Some(value.to_owned());
        }
        self.keep(field, Value::String(value.to_owned()));
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.keep(field, value.into());
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.keep(field, value.into());
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "xray_trace" {
            self.0.header = Some(format!("{value:?}"));
        }
        self.keep(field, Value::String(format!("{value:?}")));
    }
}

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// 16 hexadecimal digits, as X-Ray wants a segment id.
fn segment_id() -> String {
    format!("{:016x}", fastrand::u64(..))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_sampled_headers_are_traced() {
        let sampled = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1";
        assert_eq!(
            parse_header(sampled),
            Some((
                "1-5759e988-bd862e3fe1be46a994272793".to_owned(),
                "53995c3f42cd8ad8".to_owned()
            ))
        );
        assert_eq!(
            parse_header(&sampled.replace("Sampled=1", "Sampled=0")),
            None
        );
        assert_eq!(parse_header("Root=1-a-b"), None);
    }

    #[test]
    fn lambdas_daemon_address_form_is_read() {
        let layer =
            XRayLayer::to("udp:169.254.79.129:2000 tcp:169.254.79.129:2000").expect("layer");
        assert_eq!(layer.daemon, "169.254.79.129:2000");
    }
}
