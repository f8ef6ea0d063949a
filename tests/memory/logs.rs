//! The logs of a full batch (success through a real HTTP provider, a call whose connection
//! drops, poison, a conflict, a job-id trigger) carry what an operator needs per record and
//! nothing secret: no receipt handle, prompt, answer or credential.

use std::io::Write;
use std::sync::{Arc, Mutex};

use aws_lambda_events::event::sqs::{SqsEvent, SqsMessage};
use fenced_jobs::clock::{Clock, SystemClock};
use fenced_jobs::ledger::memory::InMemoryLedger;
use fenced_jobs::provider::OpenAiProvider;
use fenced_jobs::provider::Secret;
use fenced_jobs::provider::openai::{OpenAiApi, OpenAiSettings};
use fenced_jobs::queue::RecordingVisibility;
use fenced_jobs::worker::Settings;
use fenced_jobs::worker::handler::BatchHandler;
use fenced_jobs::worker::processor::{Invocation, Processor};
use serde_json::{Value, json};

use crate::support::http::{HttpStub, Reply};

const API_KEY: &str = "sk-CANARY-KEY-5521";
const PROMPT: &str = "CANARY-PROMPT-8830";
const ANSWER: &str = "CANARY-ANSWER-1177";
const HANDLE: &str = "CANARY-HANDLE-4406";

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Captured {
    /// What was written, as text, and each line as the JSON object it must be.
    fn lines(&self) -> (String, Vec<Value>) {
        let text = String::from_utf8(self.0.lock().expect("buffer").clone()).expect("utf-8");
        let lines = text
            .lines()
            .map(|l| serde_json::from_str(l).expect("every log line is JSON"))
            .collect();
        (text, lines)
    }
}

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("buffer").extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn record(id: &str, body: &str) -> SqsMessage {
    let mut m = SqsMessage::default();
    m.message_id = Some(id.to_owned());
    m.receipt_handle = Some(format!("{HANDLE}-{id}"));
    m.body = Some(body.to_owned());
    m.event_source_arn = Some("arn:aws:sqs:us-east-1:123456789012:jobs".to_owned());
    m.attributes
        .insert("ApproximateReceiveCount".into(), "2".into());
    m
}

fn job(id: &str, prompt: &str) -> String {
    json!({"job_id": id, "contract": "c", "input": {"model": "m", "prompt": prompt}}).to_string()
}

/// Set in a test binary that runs one of the tests below alone ([`alone`]).
const ALONE: &str = "FENCED_JOBS_TEST_ALONE";

/// Runs the test `name` (its path in this binary) again in a process of its own, and whether
/// it passed: what a line's callsite shows is cached for the whole process, and the other
/// tests of this binary, running beside it on other threads, each with a subscriber of its own
/// or none, can leave a line it reads disabled. `false` when this process is that one.
fn alone(name: &str) -> bool {
    if std::env::var_os(ALONE).is_some() {
        return false;
    }
    let exe = std::env::current_exe().expect("this test binary");
    let out = std::process::Command::new(exe)
        .args([name, "--exact", "--test-threads=1", "--nocapture"])
        .env(ALONE, "1")
        .output()
        .expect("the test binary runs");
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    assert!(
        out.status.success() && text(&out.stdout).contains("1 passed"),
        "{name} alone:\n{}\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    true
}

#[tokio::test]
async fn a_full_batch_logs_each_record_without_secrets() {
    if alone("logs::a_full_batch_logs_each_record_without_secrets") {
        return;
    }
    let captured = Captured::default();
    let sink = captured.clone();
    // The functions' own format: flat JSON lines, span fields at the top level.
    let subscriber = fenced_jobs::logs::json_subscriber("debug", move || sink.clone());
    let _guard = tracing::subscriber::set_default(subscriber);

    let server = HttpStub::start(|req, _| {
        let body = req.json();
        let prompt = body["messages"][0]["content"].as_str().unwrap_or_default();
        if prompt.ends_with("drop") {
            return Reply::Drop;
        }
        Reply::json(
            200,
            json!({"choices": [{"finish_reason": "stop",
                                "message": {"role": "assistant", "content": ANSWER}}],
                   "error_echo": prompt}),
        )
    })
    .await;
    let settings = OpenAiSettings {
        base_url: format!("{}/v1", server.url),
        api: OpenAiApi::Chat,
        ..OpenAiSettings::default()
    };
    let provider = OpenAiProvider::new(settings, Some(Secret::new(API_KEY))).expect("client");
    let ledger = Arc::new(InMemoryLedger::new());
    let handler = BatchHandler::new(
        Processor::new(ledger.clone(), provider, SystemClock, Settings::default()),
        RecordingVisibility::new(),
    );
    let mut event = SqsEvent::default();
    event.records = vec![
        record("m-ok", &job("log-ok", PROMPT)),
        record("m-drop", &job("log-drop", &format!("{PROMPT} drop"))),
        record(
            "m-poison",
            &format!(r#"{{"job_id":"{PROMPT} !","contract":"c"}}"#),
        ),
        record("m-conflict", &job("log-ok", &format!("{PROMPT} other"))),
        record("m-by-id", r#"{"job_id":"log-ok"}"#),
    ];
    let inv = Invocation {
        id: "inv-logs".into(),
        deadline: Some(SystemClock.now_ms() + 60_000),
    };
    let span = tracing::info_span!("invocation", requestId = "req-7");
    let report = tracing::Instrument::instrument(handler.handle_batch(&event, &inv), span).await;
    assert!(report.records[0].outcome.is_success());
    drop(_guard);

    let (text, lines) = captured.lines();
    for secret in [API_KEY, PROMPT, ANSWER, HANDLE] {
        assert!(!text.contains(secret), "{secret} reached the logs:\n{text}");
    }
    let done = |message_id: &str| {
        lines
            .iter()
            .find(|l| {
                let message = l["message"].as_str().unwrap_or_default();
                l["message_id"] == message_id
                    && (message == "record done"
                        || message.starts_with("poison")
                        || message.starts_with("conflict"))
            })
            .unwrap_or_else(|| panic!("no line for {message_id}:\n{text}"))
            .clone()
    };
    let ok = done("m-ok");
    assert_eq!(ok["job_id"], "log-ok");
    assert_eq!(ok["delivery_count"], "2");
    assert_eq!(ok["epoch"], 1);
    assert_eq!(ok["attempts"], 1);
    assert_eq!(ok["outcome"], "succeeded");
    assert_eq!(ok["renewal"], "none");
    assert_eq!(
        (ok["level"].as_str(), ok["requestId"].as_str()),
        (Some("INFO"), Some("req-7"))
    );
    assert!(ok["deadline_left_ms"].as_i64().expect("deadline") > 0);
    assert_eq!(done("m-drop")["outcome"], "awaiting_decision");
    assert_eq!(done("m-poison")["message"], "poison record");
    assert_eq!(done("m-by-id")["outcome"], "succeeded");
    assert!(
        lines
            .iter()
            .any(|l| l["message"] == "batch done" && l["requestId"] == "req-7"),
        "{text}"
    );
    // Lines logged while a record is processed name its job at the top level, and every line
    // its invocation.
    assert!(
        lines
            .iter()
            .any(|l| l["job_id"] == "log-drop" && l["message"] != "record done"),
        "{text}"
    );
    assert!(lines.iter().all(|l| l["requestId"] == "req-7"), "{text}");
}

/// A function that cannot start (its configuration is incomplete) says so through the Runtime
/// API's init-error endpoint, with an error type, then exits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configuration_error_is_reported_as_an_init_error() {
    let runtime_api = HttpStub::start(|_, _| Reply::json(202, json!({"status": "OK"}))).await;
    let address = runtime_api.url.trim_start_matches("http://").to_owned();
    for (binary, missing) in [
        (env!("CARGO_BIN_EXE_worker"), "JOBS_TABLE"),
        (env!("CARGO_BIN_EXE_dispatcher"), "EVENT_BUS_NAME"),
    ] {
        let mut command = std::process::Command::new(binary);
        command
            .env_clear()
            .env("AWS_LAMBDA_RUNTIME_API", &address)
            .env("AWS_REGION", "us-east-1")
            .env("PATH", std::env::var("PATH").unwrap_or_default());
        let status = tokio::task::spawn_blocking(move || command.status())
            .await
            .expect("joined")
            .expect("the function runs");
        assert!(
            !status.success(),
            "{binary} started without its configuration"
        );
        let reported = runtime_api
            .requests()
            .into_iter()
            .rev()
            .find(|r| r.method == "POST" && r.path == "/2018-06-01/runtime/init/error")
            .unwrap_or_else(|| panic!("{binary}: no init error reported"));
        assert_eq!(
            reported.header("lambda-runtime-function-error-type"),
            Some("ConfigError")
        );
        let body = reported.json();
        assert_eq!(body["errorType"], "ConfigError");
        assert!(
            body["errorMessage"]
                .as_str()
                .expect("message")
                .contains(missing),
            "{body}"
        );
    }
}

/// With an OTLP endpoint, each record and provider call becomes a span under the trace Lambda
/// passed, sent to a local collector (here a stub on the loopback: no network): the provider
/// call a GenAI client span with its model, tokens, finish reason, response and cost, and no
/// content, a refused call an error with its type; an invocation that is not sampled sends
/// nothing. Each log line carries the trace in both forms, the cold start, and the span it was
/// written in.
#[tokio::test]
async fn records_and_provider_calls_become_genai_spans_without_content() {
    if alone("logs::records_and_provider_calls_become_genai_spans_without_content") {
        return;
    }
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
    use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
    use prost::Message;
    use tracing_subscriber::Layer;
    use tracing_subscriber::layer::SubscriberExt;

    let collector = HttpStub::start(|_, _| Reply::json(200, json!({}))).await;
    let provider =
        fenced_jobs::telemetry::provider(Some(&format!("{}/v1/traces", collector.url)), "worker")
            .expect("a tracer provider");
    let layer = fenced_jobs::telemetry::layer(&provider);
    let captured = Captured::default();
    let sink = captured.clone();
    let lines = fenced_jobs::logs::json_layer(move || sink.clone())
        .with_filter(tracing_subscriber::EnvFilter::new("info"));
    let subscriber = tracing_subscriber::registry().with(layer).with(lines);
    let _guard = tracing::subscriber::set_default(subscriber);

    let server = HttpStub::start(|req, _| {
        let prompt = req.json()["messages"][0]["content"].as_str().map(str::to_owned);
        if prompt.unwrap_or_default().ends_with("refuse") {
            return Reply::json(
                400,
                json!({"error": {"message": "no", "type": "invalid_request_error", "code": "invalid_value"}}),
            );
        }
        Reply::json(
            200,
            json!({
                "id": "chatcmpl-otel-1",
                "model": "gpt-4.1-mini-2025-04-14",
                "choices": [{"message": {"role": "assistant", "content": ANSWER}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 1200, "completion_tokens": 300,
                          "prompt_tokens_details": {"cached_tokens": 1000}},
            }),
        )
    })
    .await;
    let settings = OpenAiSettings {
        base_url: format!("{}/v1", server.url),
        api: OpenAiApi::Chat,
        ..OpenAiSettings::default()
    };
    let openai = OpenAiProvider::new(settings, Some(Secret::new(API_KEY))).expect("client");
    let handler = BatchHandler::new(
        Processor::new(
            Arc::new(InMemoryLedger::new()),
            openai,
            SystemClock,
            Settings::default(),
        ),
        RecordingVisibility::new(),
    );
    let inv = Invocation {
        id: "inv-otel".into(),
        deadline: Some(SystemClock.now_ms() + 60_000),
    };
    let runs = [
        ("otel-1", "1", PROMPT.to_owned()),
        ("otel-2", "0", PROMPT.to_owned()),
        ("otel-3", "1", format!("{PROMPT} refuse")),
    ];
    for (i, (job_id, sampled, prompt)) in runs.iter().enumerate() {
        let mut event = SqsEvent::default();
        let body = json!({"job_id": job_id, "contract": "c", "input": {"model": "gpt-4.1-mini", "prompt": prompt}});
        event.records = vec![record(&format!("m-{job_id}"), &body.to_string())];
        let header = format!(
            "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled={sampled}"
        );
        let span = fenced_jobs::telemetry::invocation_span("req-x", Some(&header), i == 0);
        let report =
            tracing::Instrument::instrument(handler.handle_batch(&event, &inv), span).await;
        // A job refused for good is terminal too: its record is done.
        assert!(report.records[0].outcome.is_success(), "{job_id}");
    }
    let flushed = tokio::task::spawn_blocking(move || provider.force_flush()).await;
    assert!(matches!(flushed, Ok(Ok(()))), "{flushed:?}");

    let sent = collector.requests();
    assert!(sent.iter().all(|r| r.path == "/v1/traces"), "{sent:?}");
    for secret in [API_KEY, PROMPT, ANSWER, HANDLE] {
        assert!(
            sent.iter().all(|r| !r.body.contains(secret)),
            "{secret} was traced"
        );
    }
    let spans: Vec<_> = sent
        .iter()
        .map(|r| ExportTraceServiceRequest::decode(r.raw.as_slice()).expect("an OTLP request"))
        .flat_map(|req| req.resource_spans)
        .flat_map(|r| r.scope_spans)
        .flat_map(|s| s.spans)
        .collect();
    let text = |span: &opentelemetry_proto::tonic::trace::v1::Span, key: &str| {
        span.attributes
            .iter()
            .find(|kv| kv.key == key)
            .and_then(|kv| kv.value.as_ref()?.value.clone())
    };
    let named = |name: &str| {
        spans.iter().find(|s| s.name == name).unwrap_or_else(|| {
            panic!(
                "no {name} span: {:?}",
                spans.iter().map(|s| &s.name).collect::<Vec<_>>()
            )
        })
    };
    // Only the sampled invocation's spans, all in the trace Lambda passed.
    let root = hex_bytes("5759e988bd862e3fe1be46a994272793");
    assert!(spans.iter().all(|s| s.trace_id == root), "another trace");
    assert!(
        spans
            .iter()
            .filter_map(|s| text(s, "job_id"))
            .all(|v| v != Any::StringValue("otel-2".into())),
        "not sampled: nothing sent"
    );
    let of_job = |name: &str, job_id: &str| {
        spans
            .iter()
            .find(|s| s.name == name && text(s, "job_id") == Some(Any::StringValue(job_id.into())))
            .unwrap_or_else(|| panic!("no {name} span of {job_id}"))
    };
    let (invocation, record, call) = (
        named("invocation"),
        of_job("record", "otel-1"),
        of_job("chat gpt-4.1-mini", "otel-1"),
    );
    assert_eq!(
        text(invocation, "faas.coldstart"),
        Some(Any::BoolValue(true))
    );
    assert_eq!(invocation.parent_span_id, hex_bytes("53995c3f42cd8ad8"));
    assert_eq!(record.parent_span_id, invocation.span_id);
    assert!(call.start_time_unix_nano >= record.start_time_unix_nano);
    assert_eq!(call.kind, SpanKind::Client as i32);
    assert_eq!(
        text(call, "gen_ai.operation.name"),
        Some(Any::StringValue("chat".into()))
    );
    assert_eq!(
        text(call, "gen_ai.provider.name"),
        Some(Any::StringValue("openai".into()))
    );
    assert_eq!(
        text(call, "gen_ai.request.model"),
        Some(Any::StringValue("gpt-4.1-mini".into()))
    );
    assert_eq!(
        text(call, "gen_ai.usage.input_tokens"),
        Some(Any::IntValue(1200))
    );
    assert_eq!(
        text(call, "gen_ai.usage.output_tokens"),
        Some(Any::IntValue(300))
    );
    let Some(Any::ArrayValue(reasons)) = text(call, "gen_ai.response.finish_reasons") else {
        panic!("no finish reasons: {call:?}");
    };
    let reasons: Vec<_> = reasons.values.iter().map(|v| v.value.clone()).collect();
    assert_eq!(reasons, [Some(Any::StringValue("stop".into()))]);
    // Of 1,200 input tokens, 200 at $0.40 and 1,000 from the cache at $0.10, and 300 output at
    // $1.60 per million.
    assert_eq!(
        text(call, "fenced_jobs.cost_usd"),
        Some(Any::DoubleValue(0.00066))
    );
    assert!(text(call, "attempt").is_some() && text(call, "epoch").is_some());
    // What the conventions name beyond the counts, from what the call and its answer say.
    let said = |key: &str| text(call, key).unwrap_or_else(|| panic!("no {key}: {call:?}"));
    assert_eq!(
        said("gen_ai.usage.cache_read.input_tokens"),
        Any::IntValue(1000)
    );
    assert_eq!(
        said("gen_ai.usage.cache_creation.input_tokens"),
        Any::IntValue(0)
    );
    assert_eq!(
        said("gen_ai.response.id"),
        Any::StringValue("chatcmpl-otel-1".into())
    );
    let model = Any::StringValue("gpt-4.1-mini-2025-04-14".into());
    assert_eq!(said("gen_ai.response.model"), model);
    assert_eq!(said("gen_ai.output.type"), Any::StringValue("text".into()));
    assert_eq!(said("server.address"), Any::StringValue("127.0.0.1".into()));
    assert!(matches!(said("gen_ai.request.max_tokens"), Any::IntValue(n) if n > 0));
    assert!(text(call, "error.type").is_none());
    // A refused call: an error, with its type, and no figures it never had.
    let refused = of_job("chat gpt-4.1-mini", "otel-3");
    assert_eq!(
        text(refused, "error.type"),
        Some(Any::StringValue("permanent".into()))
    );
    let status = refused.status.as_ref().expect("a status");
    assert_eq!(status.code, 2, "STATUS_CODE_ERROR: {status:?}");
    assert!(call.status.as_ref().is_none_or(|s| s.code != 2), "{call:?}");

    // Each line carries its trace in both forms, whether the environment was cold, and the
    // span it was written in: one of the spans the trace holds.
    let (logged, lines) = captured.lines();
    let done = |job: &str| {
        lines
            .iter()
            .find(|l| l["job_id"] == job && l["message"] == "record done")
            .unwrap_or_else(|| panic!("no record done line of {job}: {logged}"))
    };
    for (job, cold) in [("otel-1", true), ("otel-2", false)] {
        let line = done(job);
        assert_eq!(
            line["trace_id"], "5759e988bd862e3fe1be46a994272793",
            "{line}"
        );
        assert_eq!(line["xray_trace_id"], "1-5759e988-bd862e3fe1be46a994272793");
        assert_eq!(line["cold_start"], cold, "{line}");
    }
    let exported: Vec<&Vec<u8>> = spans.iter().map(|s| &s.span_id).collect();
    let span_of = |line: &Value| line.get("span_id").and_then(Value::as_str).map(hex_bytes);
    for line in &lines {
        if let Some(id) = span_of(line) {
            assert!(exported.contains(&&id), "a span the trace holds: {line}");
        }
    }
    let in_record = lines
        .iter()
        .find(|l| l["job_id"] == "otel-1" && l["level"] == "WARN")
        .expect("the record's warning");
    assert_eq!(
        span_of(in_record),
        Some(record.span_id.clone()),
        "the record's span"
    );
    assert!(
        done("otel-2").get("span_id").is_none(),
        "not sampled: no span"
    );
}

/// The bytes a hexadecimal id stands for.
fn hex_bytes(hex: &str) -> Vec<u8> {
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"))
        .collect()
}

#[test]
fn a_line_is_flat_in_order_and_the_innermost_value_wins() {
    let captured = Captured::default();
    let sink = captured.clone();
    let subscriber = fenced_jobs::logs::json_subscriber("info", move || sink.clone());
    tracing::subscriber::with_default(subscriber, || {
        let outer = tracing::info_span!("invocation", requestId = "r-1", job_id = "outer");
        let _outer = outer.enter();
        let inner = tracing::info_span!("record", job_id = "j-1", epoch = tracing::field::Empty);
        let _inner = inner.enter();
        inner.record("epoch", 3);
        tracing::info!(job_id = "j-event", attempts = 2, "record done");
    });
    let text = String::from_utf8(captured.0.lock().expect("buffer").clone()).expect("utf-8");
    let line: serde_json::Map<String, Value> =
        serde_json::from_str(text.trim()).expect("one JSON line");
    assert_eq!(line["level"], "INFO");
    assert_eq!(line["requestId"], "r-1");
    assert_eq!(line["job_id"], "j-event", "the event's own value wins");
    assert_eq!(line["epoch"], 3, "a field recorded after the span began");
    assert_eq!(line["attempts"], 2);
    assert_eq!(line["message"], "record done");
    let keys: Vec<&str> = text
        .trim()
        .trim_start_matches('{')
        .split(",\"")
        .filter_map(|part| part.trim_start_matches('"').split('"').next())
        .collect();
    assert_eq!(&keys[..3], ["timestamp", "level", "requestId"], "{text}");
    assert_eq!(text.matches("\"job_id\"").count(), 1, "{text}");
}

/// A collector that takes connections and never answers costs spans, never the response: the
/// invocation's flush gives up when what is left before its margin runs out, well before the
/// export's own timeout (2 s), and a batch that ran to its margin sends nothing now.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_collector_costs_spans_never_the_response() {
    use std::time::{Duration, Instant};
    use tracing_subscriber::layer::SubscriberExt;

    // GIVEN a collector that accepts every connection and holds it, answering nothing
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}/v1/traces", listener.local_addr().expect("addr"));
    let held = Arc::new(Mutex::new(Vec::new()));
    let holding = held.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            holding.lock().expect("held").push(stream);
        }
    });
    let provider = fenced_jobs::telemetry::provider(Some(&url), "worker").expect("provider");
    let layer = fenced_jobs::telemetry::layer(&provider);
    let _guard = tracing::subscriber::set_default(tracing_subscriber::registry().with(layer));
    tracing::info_span!(target: "fenced_jobs", "record").in_scope(|| {});

    // WHEN a batch that ended 100 ms before its margin flushes its spans
    let now = SystemClock.now_ms();
    let budget = fenced_jobs::telemetry::flush_budget(Some(now + 5_100), 5_000, now);
    assert!(budget <= Duration::from_millis(100), "{budget:?}");
    let started = Instant::now();
    let sent = fenced_jobs::telemetry::flush_provider(&provider, budget).await;

    // THEN the flush gives up within its budget, not the export's timeout
    let took = started.elapsed();
    assert!(!sent);
    assert!(took < Duration::from_millis(1_500), "{took:?}");
    // AND the collector was reached (the stall was real)
    let waited = Instant::now();
    while held.lock().expect("held").is_empty() && waited.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        !held.lock().expect("held").is_empty(),
        "no export reached the collector"
    );

    // AND a batch that ran to its margin has nothing left to flush with
    let at_margin = fenced_jobs::telemetry::flush_budget(Some(now + 5_000), 5_000, now);
    assert_eq!(at_margin, Duration::ZERO);
    assert!(!fenced_jobs::telemetry::flush_provider(&provider, at_margin).await);
    // AND without a deadline (a local runtime) the export's own timeout bounds it
    assert_eq!(
        fenced_jobs::telemetry::flush_budget(None, 5_000, now),
        Duration::from_secs(2)
    );
}
