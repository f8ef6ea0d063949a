//! Batch benchmark (`make bench`): handler CPU and AWS calls per record for fresh jobs, for
//! redelivered finished jobs and for duplicates, with the in-memory adapters and through the
//! AWS SDK on the local emulator; the SDK's own floor (a bare conditional `UpdateItem` loop
//! through the same client) and our CPU per DynamoDB request as a multiple of it; CPU per record
//! against input and answer size; the latency a fresh job waits on the ledger (claim, store,
//! accept) beside its CPU; batch wall time against the ideal with a simulated 50 ms call.
//!
//! `bench_batch peak N` handles one N-record batch through the SDK and exits, for `/usr/bin/time`;
//! `bench_batch floor` prints only the comparison with the floor (a quick look after a change);
//! `bench_batch contract` only the cost of judging answers against their contract;
//! `bench_batch latency` only the ledger's latency table;
//! `bench_batch only KIND [RECORDS] [MS]` runs one kind of work alone, for `perf` or callgrind.
//!
//! Why this file is long: every table shares the same handlers, events and CPU windows, and a
//! figure is only comparable with the floor when both are measured the same way, in one place.
//!
//! CPU is the process's CPU time (every thread of it; the emulator runs in another process) on a
//! single-threaded runtime, as the worker runs, summed over rounds of at least `ROUND_MS` of wall
//! time and divided by the records (or requests) handled.

#[path = "support/cpu.rs"]
mod cpu;

use std::sync::Arc;
use std::time::{Duration, Instant};

use aws_lambda_events::event::sqs::{SqsEvent, SqsMessage};
use aws_sdk_dynamodb::types::AttributeValue;
use fenced_jobs::blobs::s3::S3Blobs;
use fenced_jobs::clock::{Clock, SystemClock};
use fenced_jobs::config::SdkTimeouts;
use fenced_jobs::job::contract::Contracts;
use fenced_jobs::job::{Expect, JobDefaults, NewJob, ResultBody};
use fenced_jobs::ledger::dynamodb::DynamoLedger;
use fenced_jobs::ledger::memory::InMemoryLedger;
use fenced_jobs::ledger::{AttemptEnd, ClaimRequest, EndRequest, JobLedger, Write};
use fenced_jobs::provider::SimulatedProvider;
use fenced_jobs::queue::{RecordingVisibility, SqsVisibility, VisibilityControl};
use fenced_jobs::testing::sdk_calls::{CallCounter, counted_clients};
use fenced_jobs::worker::Settings;
use fenced_jobs::worker::handler::{BatchHandler, event_from_json};
use fenced_jobs::worker::processor::{Invocation, Processor};

use cpu::{median, process_cpu_ns};
use futures::{StreamExt, stream};
use tracing::Instrument;

const ARN: &str = "arn:aws:sqs:us-east-1:123456789012:bench";
const SIZES: [usize; 4] = [10, 100, 1_000, 10_000];
const ROUND_MS: u64 = 1_000;

/// No heartbeat (these records are fast; `bench_heartbeat` measures ticks), no jitter in play.
fn settings() -> Settings {
    Settings {
        heartbeat_ms: 0,
        lease_ms: 300_000,
        ..Settings::default()
    }
}

/// What each job of an event asks for.
#[derive(Clone, Copy, Default)]
struct Shape {
    /// The simulated call's latency.
    latency_ms: u64,
    /// The prompt's length (at least the short default one).
    input_bytes: usize,
    /// The answer's length (0: the simulated provider's short answer).
    answer_bytes: usize,
    /// An invoice extraction under `invoice-extract@2`, whose simulated model answers with a
    /// valid invoice (twenty fields, nested parties and line items).
    invoice: bool,
    /// The same invoice asked for under `summary.v1`, whose answer is free text: the invoice
    /// accepted without being parsed or validated.
    as_text: bool,
}

/// The invoice the simulated model answers with: valid under `invoice-extract@2`.
const INVOICE: &str = r#"{"number":"INV-2026-0042","issued":"2026-11-30","due":"2026-12-30","currency":"EUR","seller":{"name":"Acme GmbH","vat_id":"DE123456789","address":"Hauptstr. 1, Berlin","country":"DE"},"buyer":{"name":"Globex AG","vat_id":null,"address":"Bahnhofstr. 9, Zurich","country":"CH"},"purchase_order":"PO-7","lines":[{"description":"Widgets","quantity":4,"unit_price":50.0,"amount":200.0,"tax_rate":0.19,"sku":"W-1"},{"description":"Gadgets","quantity":2,"unit_price":75.5,"amount":151.0,"tax_rate":0.19,"sku":"G-2"},{"description":"Support, November","quantity":1,"unit_price":120.0,"amount":120.0,"tax_rate":0.19,"sku":null}],"subtotal":471.0,"tax":89.49,"total":560.49,"paid":false,"payment_terms":"30 days net","notes":null}"#;

/// The JSON of an event of `n` records for jobs `{prefix}-0..n`, each job `copies` times, as
/// Lambda sends it.
fn event_json(prefix: &str, n: usize, copies: usize, shape: Shape) -> String {
    let now = SystemClock.now_ms();
    let Shape {
        latency_ms,
        input_bytes,
        answer_bytes,
        invoice,
        as_text,
    } = shape;
    let (contract, output) = if invoice {
        let contract = if as_text {
            "summary.v1"
        } else {
            "invoice-extract@2"
        };
        (contract, format!(r#","output":{INVOICE}"#))
    } else {
        ("summary.v1", String::new())
    };
    let records: Vec<SqsMessage> = (0..n)
        .map(|i| {
            let job = i / copies;
            let mut prompt = format!("Summarise document {job}.");
            prompt.extend(std::iter::repeat_n('x', input_bytes.saturating_sub(prompt.len())));
            let mut m = SqsMessage::default();
            m.message_id = Some(format!("{prefix}-msg-{i}"));
            m.receipt_handle = Some(format!("{prefix}-handle-{i}"));
            m.body = Some(format!(
                r#"{{"job_id":"{prefix}-{job}","contract":"{contract}","input":{{"model":"sim-1","messages":[{{"role":"user","content":"{prompt}"}}],"parameters":{{"temperature":0}},"simulate":{{"latency_ms":{latency_ms},"answer_bytes":{answer_bytes}{output}}}}}}}"#
            ));
            m.event_source = Some("aws:sqs".into());
            m.event_source_arn = Some(ARN.into());
            m.aws_region = Some("us-east-1".into());
            for (k, v) in [
                ("ApproximateReceiveCount", "1".to_owned()),
                ("SentTimestamp", now.to_string()),
                ("ApproximateFirstReceiveTimestamp", now.to_string()),
                ("SenderId", "AIDABENCH".to_owned()),
            ] {
                m.attributes.insert(k.into(), v);
            }
            m
        })
        .collect();
    let mut e = SqsEvent::default();
    e.records = records;
    serde_json::to_string(&e).expect("serialise")
}

/// The same event delivered again: SQS counts the receive.
fn redelivery(json: &str) -> String {
    let again = json.replace(
        r#""ApproximateReceiveCount":"1""#,
        r#""ApproximateReceiveCount":"2""#,
    );
    assert_ne!(again, json, "the event names its receive count");
    again
}

fn invocation() -> Invocation {
    Invocation {
        id: format!("bench-{}", fastrand::u64(..)),
        deadline: Some(SystemClock.now_ms() + 900_000),
    }
}

struct Measure {
    cpu_per_record_us: f64,
    records: usize,
}

/// CPU per DynamoDB request of a measurement whose requests `calls` counted.
fn per_request(m: &Measure, calls: &CallCounter) -> f64 {
    m.cpu_per_record_us * m.records as f64 / calls.total("dynamodb") as f64
}

/// Handles batches (round `r` from `make(r)`) until `ROUND_MS` passed, at least once. The CPU
/// window covers what the function does: parsing the event JSON as the worker does (the
/// runtime's JSON tree, then each record from it), and handling it.
async fn measure<L: JobLedger, V: VisibilityControl>(
    handler: &BatchHandler<L, SimulatedProvider, SystemClock, V>,
    n: usize,
    make: impl FnMut(usize) -> String,
) -> Measure {
    measure_for(handler, n, ROUND_MS, 0, make).await
}

/// [`measure`] for `ms` of wall time, with rounds numbered from `first_round`.
async fn measure_for<L: JobLedger, V: VisibilityControl>(
    handler: &BatchHandler<L, SimulatedProvider, SystemClock, V>,
    n: usize,
    ms: u64,
    first_round: usize,
    mut make: impl FnMut(usize) -> String,
) -> Measure {
    let started = Instant::now();
    let mut cpu = 0;
    let mut rounds = 0;
    while rounds == 0 || started.elapsed() < Duration::from_millis(ms) {
        let json = make(first_round + rounds);
        let before = process_cpu_ns();
        let event = parse(&json);
        run(handler, &event).await;
        cpu += process_cpu_ns() - before;
        rounds += 1;
    }
    Measure {
        cpu_per_record_us: cpu as f64 / 1e3 / (rounds * n) as f64,
        records: rounds * n,
    }
}

async fn run<L: JobLedger, V: VisibilityControl>(
    handler: &BatchHandler<L, SimulatedProvider, SystemClock, V>,
    event: &SqsEvent,
) {
    let inv = invocation();
    // As the worker runs a batch: inside the invocation's span, which names it on every line.
    let span = fenced_jobs::telemetry::invocation_span(&inv.id, None, false);
    let report = handler.handle_batch(event, &inv).instrument(span).await;
    assert_eq!(report.response, Ok(vec![]), "every record succeeds");
}

/// The event as the worker reads it: the runtime's JSON tree, then each record from it.
fn parse(json: &str) -> SqsEvent {
    let value: serde_json::Value = serde_json::from_str(json).expect("event");
    event_from_json(&value).expect("records")
}

/// The in-memory handler, holding each job to the built-in contracts as the worker does.
fn memory_handler()
-> BatchHandler<InMemoryLedger, SimulatedProvider, SystemClock, RecordingVisibility> {
    BatchHandler::new(
        Processor::new(
            InMemoryLedger::new(),
            SimulatedProvider::new(),
            SystemClock,
            settings(),
        )
        .with_contracts(Arc::new(built_in())),
        RecordingVisibility::new(),
    )
}

/// The contracts built in from `contracts/`, as the worker loads them (`summary.v1` among
/// them: a job under an id the registry lacks costs a warning line per record).
fn built_in() -> Contracts {
    Contracts::with_built_in(&[], false).expect("the built-in contracts")
}

/// What judging an answer against its contract costs: fresh invoice extractions (100 records a
/// batch) asked for under `summary.v1`, where the answer is accepted as text, and under
/// `invoice-extract@2`, where it is parsed, validated and stored as JSON; alternated, medians.
/// In memory, or through the SDK on the emulator when `sdk`.
async fn contract_row(sdk: bool) {
    let [free, held] = if sdk {
        let (handler, _, _) = sdk_handler(false).await;
        alternate_invoices(&handler).await
    } else {
        alternate_invoices(&memory_handler()).await
    };
    let adapters = if sdk { "SDK + emulator" } else { "in memory" };
    println!(
        "| {adapters} | {free:.1} | {held:.1} | ×{:.2} |",
        held / free
    );
}

/// Fresh invoice extractions' CPU per record through `handler`, asked for as free text and
/// held to `invoice-extract@2`, alternated [`ALTERNATIONS`] times: the medians.
async fn alternate_invoices<L: JobLedger, V: VisibilityControl>(
    handler: &BatchHandler<L, SimulatedProvider, SystemClock, V>,
) -> [f64; 2] {
    const N: usize = 100;
    let held = Shape {
        invoice: true,
        ..Shape::default()
    };
    let free = Shape {
        as_text: true,
        ..held
    };
    let tag = fastrand::u32(..);
    let (mut free_us, mut held_us) = (vec![], vec![]);
    for round in 0..ALTERNATIONS {
        for (shape, side, us) in [(free, "free", &mut free_us), (held, "held", &mut held_us)] {
            let jobs = |r: usize| event_json(&format!("c{tag}-{round}-{side}-{r}"), N, 1, shape);
            let m = measure_for(handler, N, SLICE_MS, 0, jobs).await;
            us.push(m.cpu_per_record_us);
        }
    }
    [free_us, held_us].map(median)
}

/// A handler through the SDK on the emulator (with a results bucket when `bucket`), its
/// DynamoDB client and the counter of both clients' calls.
async fn sdk_handler(
    bucket: bool,
) -> (
    BatchHandler<DynamoLedger, SimulatedProvider, SystemClock, SqsVisibility>,
    Floor,
    CallCounter,
) {
    // The SDK configuration as the worker builds it: each call bounded.
    let config = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
    let config = SdkTimeouts::default().apply(&config);
    let (ddb, sqs, calls) = counted_clients(&config);
    let table = format!("bench-batch-{}", std::process::id());
    if ddb
        .describe_table()
        .table_name(&table)
        .send()
        .await
        .is_err()
    {
        DynamoLedger::create_table(&ddb, &table)
            .await
            .expect("table");
    }
    // The queue the records name, so that the handler's one lookup of its visibility timeout
    // succeeds and is kept, as on AWS.
    sqs.create_queue()
        .queue_name(ARN.rsplit(':').next().unwrap_or("bench"))
        .send()
        .await
        .expect("queue");
    let floor = Floor {
        client: ddb.clone(),
        table: table.clone(),
    };
    // The built-in contracts, as the worker loads them.
    let mut processor = Processor::new(
        DynamoLedger::new(ddb, table),
        SimulatedProvider::new(),
        SystemClock,
        settings(),
    )
    .with_contracts(Arc::new(built_in()));
    if bucket {
        let s3 = aws_sdk_s3::Client::from_conf(
            aws_sdk_s3::config::Builder::from(&config)
                .force_path_style(true)
                .interceptor(calls.clone())
                .build(),
        );
        let name = format!("bench-batch-{}", fastrand::u32(..));
        s3.create_bucket()
            .bucket(&name)
            .send()
            .await
            .expect("bucket");
        processor = processor.with_blobs(Arc::new(S3Blobs::new(s3, Some(name))));
    }
    (
        BatchHandler::new(processor, SqsVisibility::new(sqs)),
        floor,
        calls,
    )
}

/// The SDK's own floor: bare conditional `UpdateItem` calls through the handler's DynamoDB
/// client, on the handler's table, as many in flight as the handler runs records.
struct Floor {
    client: aws_sdk_dynamodb::Client,
    table: String,
}

impl Floor {
    /// CPU per request (µs) over `ms` of wall time, in rounds of `n` requests with
    /// `in_flight` of them in flight at a time (as the handler runs a batch's records), each
    /// creating a small item under a condition (as a fresh claim creates the job's item).
    async fn cpu_per_request_us(&self, n: usize, in_flight: usize, ms: u64) -> f64 {
        let tag = fastrand::u32(..);
        let started = Instant::now();
        let (mut cpu, mut requests) = (0, 0);
        while requests == 0 || started.elapsed() < Duration::from_millis(ms) {
            let before = process_cpu_ns();
            stream::iter(requests..requests + n)
                .map(|i| {
                    self.client
                        .update_item()
                        .table_name(&self.table)
                        .key("job_id", AttributeValue::S(format!("floor-{tag}-{i}")))
                        .update_expression("SET #v = :v")
                        .condition_expression("attribute_not_exists(#v)")
                        .expression_attribute_names("#v", "v")
                        .expression_attribute_values(":v", AttributeValue::N("1".to_owned()))
                        .send()
                })
                .buffer_unordered(in_flight)
                .for_each(|result| async move {
                    result.expect("floor update");
                })
                .await;
            cpu += process_cpu_ns() - before;
            requests += n;
        }
        cpu as f64 / 1e3 / requests as f64
    }
}

/// A fresh job's two requests as the ledger sends them (the claim's `PutItem` of the whole item,
/// the acceptance's `UpdateItem` with its expressions), built bare from literals: the SDK's own
/// cost of the bytes the design sends, without the ledger's code. CPU per request (µs).
async fn same_requests_cpu_per_request_us(
    floor: &Floor,
    n: usize,
    in_flight: usize,
    ms: u64,
) -> f64 {
    cpu_per_request_of_jobs(n, in_flight, ms, |tag, i, _| async move {
        let id = format!("bare-{tag}-{i}");
        floor.claim_bare(&id).await;
        floor.accept_bare(&id).await;
    })
    .await
}

/// CPU per request (µs) of rounds of `n` fresh jobs with `in_flight` at a time, over `ms` of
/// wall time: each job `job(tag, i, now)` makes two requests (a claim and an acceptance).
async fn cpu_per_request_of_jobs<F, Fut>(n: usize, in_flight: usize, ms: u64, job: F) -> f64
where
    F: Fn(u32, usize, i64) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let tag = fastrand::u32(..);
    let started = Instant::now();
    let (mut cpu, mut requests, mut jobs) = (0, 0, 0);
    while requests == 0 || started.elapsed() < Duration::from_millis(ms) {
        let before = process_cpu_ns();
        let now = SystemClock.now_ms();
        stream::iter(jobs..jobs + n)
            .map(|i| job(tag, i, now))
            .buffer_unordered(in_flight)
            .for_each(|()| async {})
            .await;
        cpu += process_cpu_ns() - before;
        requests += 2 * n;
        jobs += n;
    }
    cpu as f64 / 1e3 / requests as f64
}

impl Floor {
    /// A claim's `PutItem`, as the ledger sends it for a fresh job (the same attributes).
    async fn claim_bare(&self, id: &str) {
        // The times as a fresh claim writes them: a day's deadline, a 5-minute lease, and the
        // item kept 30 days past its deadline.
        let at = SystemClock.now_ms();
        let deadline = at + 86_400_000;
        let (now, deadline_at) = (at.to_string(), deadline.to_string());
        let owner_until = (at + 300_000).to_string();
        let expires_at = (deadline / 1_000 + 30 * 86_400).to_string();
        let owner = format!("bench-10451536109615056148/{id}-msg");
        let sv = |v: &str| AttributeValue::S(v.to_owned());
        let nv = |v: &str| AttributeValue::N(v.to_owned());
        let entry = std::collections::HashMap::from([
            ("number".to_owned(), nv("1")),
            ("epoch".to_owned(), nv("1")),
            ("owner_id".to_owned(), sv(&owner)),
            ("started_at".to_owned(), nv(&now)),
            ("outcome".to_owned(), sv("pending")),
            ("provider_ref".to_owned(), sv(&format!("sim:{id}/1@1"))),
            ("provider".to_owned(), sv("simulated")),
            ("model".to_owned(), sv("sim-1")),
        ]);
        let item = std::collections::HashMap::from([
            ("job_id".to_owned(), sv(id)),
            ("state".to_owned(), sv("running")),
            ("owner_epoch".to_owned(), nv("1")),
            ("attempts".to_owned(), nv("1")),
            ("max_attempts".to_owned(), nv("3")),
            ("input_digest".to_owned(), sv(&"8d47eb98".repeat(8))),
            ("contract".to_owned(), sv("summary.v1")),
            ("deadline_at".to_owned(), nv(&deadline_at)),
            (
                "attempt_log".to_owned(),
                AttributeValue::L(vec![AttributeValue::M(entry)]),
            ),
            ("created_at".to_owned(), nv(&now)),
            ("updated_at".to_owned(), nv(&now)),
            ("expires_at".to_owned(), nv(&expires_at)),
            ("owner_id".to_owned(), sv(&owner)),
            ("owner_until".to_owned(), nv(&owner_until)),
            // Any day: only its size counts here.
            ("due_day".to_owned(), sv("2026-12-06")),
        ]);
        self.client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(item))
            .condition_expression("attribute_not_exists(job_id)")
            .return_values_on_condition_check_failure(
                aws_sdk_dynamodb::types::ReturnValuesOnConditionCheckFailure::AllOld,
            )
            .send()
            .await
            .expect("bare claim");
    }

    /// An acceptance's `UpdateItem`, as the ledger sends it for a first claim's short answer.
    async fn accept_bare(&self, id: &str) {
        let now = AttributeValue::N(SystemClock.now_ms().to_string());
        let sv = |v: &str| AttributeValue::S(v.to_owned());
        let nv = |v: &str| AttributeValue::N(v.to_owned());
        let usage = std::collections::HashMap::from(
            [
                ("cache_write", "0"),
                ("cache_read", "0"),
                ("output", "8"),
                ("reasoning", "0"),
                ("cost_micros", "71"),
                ("input", "39"),
            ]
            .map(|(k, v)| (k.to_owned(), nv(v))),
        );
        let names = [
            ("#cancel", "cancel_requested"),
            ("#finish", "finish"),
            ("#usage", "usage"),
            ("#state", "state"),
            ("#log", "attempt_log"),
            ("#result", "result"),
            ("#attn", "attention"),
            ("#deadline", "deadline_at"),
            ("#updated", "updated_at"),
            ("#outcome", "outcome"),
            ("#epoch", "owner_epoch"),
            ("#attempts", "attempts"),
            ("#finished", "finished_at"),
        ]
        .map(|(k, v)| (k.to_owned(), v.to_owned()));
        let values = std::collections::HashMap::from([
            (":now".to_owned(), now),
            (":finish".to_owned(), sv("stop")),
            (":usage".to_owned(), AttributeValue::M(usage)),
            (":outcome".to_owned(), sv("succeeded")),
            (":running".to_owned(), sv("running")),
            (":to".to_owned(), sv("succeeded")),
            (
                ":result".to_owned(),
                sv(
                    r#"{"contract":"summary.v1","model":"sim-1","output":"simulated answer f0a193e2450d","usage":{"input_tokens":39,"output_tokens":8}}"#,
                ),
            ),
            (":epoch".to_owned(), nv("1")),
            (":attempt".to_owned(), nv("1")),
        ]);
        self.client
            .update_item()
            .table_name(&self.table)
            .key("job_id", sv(id))
            .update_expression("SET #state = :to, #updated = :now, #log[0].#outcome = :outcome, #log[0].#finished = :now, #result = :result, #log[0].#finish = :finish, #log[0].#usage = :usage REMOVE #attn")
            .condition_expression("#state = :running AND #epoch = :epoch AND #attempts = :attempt AND #deadline > :now AND attribute_not_exists(#cancel)")
            .set_expression_attribute_names(Some(std::collections::HashMap::from(names)))
            .set_expression_attribute_values(Some(values))
            .return_values(aws_sdk_dynamodb::types::ReturnValue::None)
            .return_values_on_condition_check_failure(
                aws_sdk_dynamodb::types::ReturnValuesOnConditionCheckFailure::AllOld,
            )
            .send()
            .await
            .expect("bare acceptance");
    }
}

/// The ledger's own writes without the handler, in rounds of `n` jobs with `in_flight` at a
/// time: each claimed fresh and finished with a short answer, as a fresh record is. CPU per
/// request (µs).
async fn ledger_cpu_per_request_us(
    ledger: &DynamoLedger,
    n: usize,
    in_flight: usize,
    ms: u64,
) -> f64 {
    cpu_per_request_of_jobs(n, in_flight, ms, |tag, i, now| async move {
        let msg = fenced_jobs::job::parse_body(Some(
            &format!(r#"{{"job_id":"ledger-{tag}-{i}","contract":"summary.v1","input":{{"model":"sim-1","messages":[{{"role":"user","content":"Summarise document {i}."}}]}}}}"#),
        ))
        .expect("message");
        let job = NewJob::from_message(&msg, now, &JobDefaults::default());
        let claim = ClaimRequest {
            job,
            expect: Expect::FRESH,
            owner_id: format!("owner-{i}"),
            now,
            lease_until: now + 300_000,
            provider_ref: None,
            route: None,
            first_sight: true,
            list_due: false,
        };
        let Ok(Write::Applied(record)) = ledger.claim(claim).await else {
            panic!("claim refused");
        };
        let finish = EndRequest {
            job_id: record.job_id.clone(),
            epoch: record.owner_epoch,
            attempt: record.attempts,
            now,
            end: AttemptEnd::Succeeded {
                result: ResultBody::Inline("simulated answer".to_owned()),
                finish: fenced_jobs::job::contract::Finish::Stop,
            },
            usage: None,
            input: None,
        };
        let accepted = ledger.end_known(&record, finish).await;
        assert!(matches!(accepted, Ok(Write::Applied(_))));
    })
    .await
}

/// `BENCH_MAX_RECORDS` caps the batch sizes (a quick look in a debug build).
fn sizes() -> impl Iterator<Item = usize> {
    let max = std::env::var("BENCH_MAX_RECORDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(usize::MAX);
    SIZES.into_iter().filter(move |n| *n <= max)
}

async fn cpu_table(sdk: bool) {
    for n in sizes() {
        let tag = format!("{}{n}-{}", if sdk { "s" } else { "m" }, fastrand::u32(..));
        let fresh_json =
            |round: usize| event_json(&format!("{tag}-r{round}"), n, 1, Shape::default());
        let first = redelivery(&fresh_json(0));
        let (fresh, redelivered, calls_fresh, calls_again) = if sdk {
            let (handler, _, calls) = sdk_handler(false).await;
            calls.reset();
            let fresh = measure(&handler, n, fresh_json).await;
            let calls_fresh = calls.total("dynamodb") as f64 / fresh.records as f64;
            calls.reset();
            let again = measure(&handler, n, |_| first.clone()).await;
            let calls_again = calls.total("dynamodb") as f64 / again.records as f64;
            (fresh, again, calls_fresh, calls_again)
        } else {
            let handler = memory_handler();
            let fresh = measure(&handler, n, fresh_json).await;
            let again = measure(&handler, n, |_| first.clone()).await;
            (fresh, again, 0.0, 0.0)
        };
        let adapters = if sdk { "SDK + emulator" } else { "in memory" };
        let calls = if sdk {
            format!("{calls_fresh:.2} | {calls_again:.2}")
        } else {
            "– | –".to_owned()
        };
        println!(
            "| {adapters} | {n} | {:.1} | {:.1} | {calls} |",
            fresh.cpu_per_record_us, redelivered.cpu_per_record_us
        );
    }
}

/// How many times the floor and the handler alternate in one comparison, and for how long each.
const ALTERNATIONS: usize = 5;
const SLICE_MS: u64 = 600;

/// The comparison with the floor, for 10 and 100 records per batch.
async fn floor_table() {
    println!(
        "\nOur CPU per DynamoDB request against the SDK's floor (a bare conditional `UpdateItem` through the same client, in rounds of a batch's size with as many in flight as the handler), medians of {ALTERNATIONS} alternations, µs per request (multiple of the floor):\n"
    );
    println!(
        "| records per batch | in flight | floor | a fresh job's two requests, bare | ledger writes alone | fresh records | redelivered records |"
    );
    println!("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for n in [10, 100] {
        floor_row(n).await;
    }
}

/// Our CPU per DynamoDB request against the floor, for `n`-record batches: the floor (with as
/// many requests in flight as the handler runs records), the ledger's writes alone, fresh and
/// redelivered records, alternating `ALTERNATIONS` times so that the machine's drift touches
/// each alike. Medians, and each as a multiple of the floor's.
async fn floor_row(n: usize) {
    let (handler, floor, calls) = sdk_handler(false).await;
    let in_flight = n.min(settings().max_concurrency);
    let tag = format!("floor{n}-{}", fastrand::u32(..));
    let fresh_json = |round: usize| event_json(&format!("{tag}-r{round}"), n, 1, Shape::default());
    let first = fresh_json(0);
    run(&handler, &parse(&first)).await;
    let first = redelivery(&first);
    let (mut floors, mut bare, mut ledgers) = (vec![], vec![], vec![]);
    let (mut fresh, mut again) = (vec![], vec![]);
    let mut round = 1;
    for _ in 0..ALTERNATIONS {
        floors.push(floor.cpu_per_request_us(n, in_flight, SLICE_MS).await);
        bare.push(same_requests_cpu_per_request_us(&floor, n, in_flight, SLICE_MS).await);
        let ledger = handler.processor().ledger();
        ledgers.push(ledger_cpu_per_request_us(ledger, n, in_flight, SLICE_MS).await);
        calls.reset();
        let m = measure_for(&handler, n, SLICE_MS, round, fresh_json).await;
        round += m.records / n;
        fresh.push(per_request(&m, &calls));
        calls.reset();
        let m = measure_for(&handler, n, SLICE_MS, 0, |_| first.clone()).await;
        again.push(per_request(&m, &calls));
    }
    let floor = median(floors);
    let [bare, ledger, fresh, again] = [bare, ledgers, fresh, again].map(median);
    println!(
        "| {n} | {in_flight} | {floor:.1} | {bare:.1} ({:.2}) | {ledger:.1} ({:.2}) | {fresh:.1} ({:.2}) | {again:.1} ({:.2}) |",
        bare / floor,
        ledger / floor,
        fresh / floor,
        again / floor,
    );
}

/// One kind of the floor comparison alone (`floor`, `bare`, `ledger`, `fresh` or `redelivered`) for
/// `ms`, `n` records per batch: prints its CPU per DynamoDB request. `memory-fresh` and
/// `memory-redelivered` run the in-memory handler instead (CPU per record): the handler's own
/// work, for a profiler.
async fn only(kind: &str, n: usize, ms: u64) {
    let (handler, floor, calls) = sdk_handler(false).await;
    let memory = memory_handler();
    let in_flight = n.min(settings().max_concurrency);
    let tag = format!("only{n}-{}", fastrand::u32(..));
    let fresh = |round: usize| event_json(&format!("{tag}-r{round}"), n, 1, Shape::default());
    // Redelivered batches: the first one handled fresh, then delivered again and again.
    let first = event_json(&tag, n, 1, Shape::default());
    let again = redelivery(&first);
    match kind {
        "redelivered" => run(&handler, &parse(&first)).await,
        "memory-redelivered" => run(&memory, &parse(&first)).await,
        _ => {}
    }
    calls.reset();
    let (figure, unit) = match kind {
        "floor" => (
            floor.cpu_per_request_us(n, in_flight, ms).await,
            "DynamoDB request",
        ),
        "bare" => (
            same_requests_cpu_per_request_us(&floor, n, in_flight, ms).await,
            "DynamoDB request",
        ),
        "ledger" => {
            let ledger = handler.processor().ledger();
            let us = ledger_cpu_per_request_us(ledger, n, in_flight, ms).await;
            (us, "DynamoDB request")
        }
        "fresh" => {
            let m = measure_for(&handler, n, ms, 0, fresh).await;
            (per_request(&m, &calls), "DynamoDB request")
        }
        "redelivered" => {
            let m = measure_for(&handler, n, ms, 0, |_| again.clone()).await;
            (per_request(&m, &calls), "DynamoDB request")
        }
        "memory-fresh" => {
            let m = measure_for(&memory, n, ms, 0, fresh).await;
            (m.cpu_per_record_us, "record")
        }
        "memory-redelivered" => {
            let m = measure_for(&memory, n, ms, 0, |_| again.clone()).await;
            (m.cpu_per_record_us, "record")
        }
        _ => panic!(
            "only floor|bare|ledger|fresh|redelivered|memory-fresh|memory-redelivered [records] [ms]"
        ),
    };
    let requests = calls.total("dynamodb");
    println!("{kind}: {figure:.1} µs per {unit}, {requests} DynamoDB requests");
}

/// Fresh records' CPU per record in `n`-record batches on a current-thread runtime (as the
/// functions run) and on a two-worker multi-thread one, each measured on its own runtime in its
/// own thread, alternating.
fn runtime_row(n: usize) {
    let on = |multi: bool| {
        std::thread::spawn(move || {
            let mut builder = if multi {
                let mut b = tokio::runtime::Builder::new_multi_thread();
                b.worker_threads(2);
                b
            } else {
                tokio::runtime::Builder::new_current_thread()
            };
            let runtime = builder.enable_all().build().expect("runtime");
            runtime.block_on(async {
                let (handler, _, _) = sdk_handler(false).await;
                let tag = format!("rt{multi}-{}", fastrand::u32(..));
                let json =
                    |round: usize| event_json(&format!("{tag}-r{round}"), n, 1, Shape::default());
                measure_for(&handler, n, SLICE_MS, 0, json)
                    .await
                    .cpu_per_record_us
            })
        })
        .join()
        .expect("measurement thread")
    };
    let (mut current, mut multi) = (vec![], vec![]);
    for _ in 0..ALTERNATIONS {
        current.push(on(false));
        multi.push(on(true));
    }
    let (current, multi) = (median(current), median(multi));
    println!(
        "| {n} | {current:.1} | {multi:.1} | {:+.0} % |",
        (multi / current - 1.0) * 100.0
    );
}

/// CPU per record against input size and against answer size (10-record batches, through the
/// SDK with a results bucket: inputs and answers above 64 KiB go to S3).
async fn size_table() {
    let (handler, _, calls) = sdk_handler(true).await;
    let n = 10;
    let kb = |bytes: usize| bytes / 1_000;
    for (what, shape) in [1_000, 10_000, 100_000, 1_000_000]
        .map(|bytes| {
            let shape = Shape {
                input_bytes: bytes,
                ..Shape::default()
            };
            (format!("input {} KB", kb(bytes)), shape)
        })
        .into_iter()
        .chain([1_000, 10_000, 100_000, 1_000_000].map(|bytes| {
            let shape = Shape {
                answer_bytes: bytes,
                ..Shape::default()
            };
            (format!("answer {} KB", kb(bytes)), shape)
        }))
    {
        let tag = format!("size-{}", fastrand::u32(..));
        let fresh_json = |round: usize| event_json(&format!("{tag}-r{round}"), n, 1, shape);
        let first = redelivery(&fresh_json(0));
        calls.reset();
        let fresh = measure(&handler, n, fresh_json).await;
        let per = |service| calls.total(service) as f64 / fresh.records as f64;
        let (ddb, s3) = (per("dynamodb"), per("s3"));
        let again = measure(&handler, n, |_| first.clone()).await;
        println!(
            "| {what} | {:.1} | {:.1} | {ddb:.2} | {s3:.2} |",
            fresh.cpu_per_record_us, again.cpu_per_record_us
        );
    }
}

/// The time a fresh job waits on the ledger, beside its CPU: 10-record batches through the SDK
/// with a results bucket, a short answer (kept in the item) and a 10 KB one (stored in S3 first),
/// each operation's wall time as its caller waits for it; and the floor's `UpdateItem` in the
/// same run. The emulator's latency, not DynamoDB's: compare the rows with each other.
async fn latency_table() {
    println!(
        "\nThe ledger's latency a fresh job waits for, beside its CPU (SDK + emulator, results bucket, 10 records per batch, 10 in flight): each operation's wall time from the SDK's taking the request to its answer, median / p90 in ms. The emulator's latency, not DynamoDB's: compare the rows with each other.\n"
    );
    println!(
        "| job | claim (`PutItem`) | store the answer (S3 `PutObject`) | accept (`UpdateItem`) | a job waits in all (medians) | fresh CPU/record (µs) |"
    );
    println!("| --- | ---: | ---: | ---: | ---: | ---: |");
    let (handler, floor, calls) = sdk_handler(true).await;
    let n = 10;
    let in_flight = n.min(settings().max_concurrency);
    let ms = |service, operation| quantiles(calls.took(service, operation));
    for (what, answer_bytes) in [("short answer", 0), ("10 KB answer", 10_000)] {
        let tag = format!("latency-{}", fastrand::u32(..));
        let shape = Shape {
            answer_bytes,
            ..Shape::default()
        };
        calls.reset();
        let fresh = measure(&handler, n, |r| {
            event_json(&format!("{tag}-r{r}"), n, 1, shape)
        })
        .await;
        let (claim, store, accept) = (
            ms("dynamodb", "PutItem"),
            ms("s3", "PutObject"),
            ms("dynamodb", "UpdateItem"),
        );
        let job =
            claim.map_or(0.0, |q| q.0) + store.map_or(0.0, |q| q.0) + accept.map_or(0.0, |q| q.0);
        println!(
            "| {what} | {} | {} | {} | {job:.2} | {:.1} |",
            shown(claim),
            shown(store),
            shown(accept),
            fresh.cpu_per_record_us
        );
    }
    calls.reset();
    floor.cpu_per_request_us(n, in_flight, ROUND_MS).await;
    println!(
        "| the floor: a bare conditional `UpdateItem` | – | – | {} | – | – |",
        shown(ms("dynamodb", "UpdateItem"))
    );
}

/// The median and the 90th percentile of `took`, in ms; none when it is empty.
fn quantiles(mut took: Vec<Duration>) -> Option<(f64, f64)> {
    if took.is_empty() {
        return None;
    }
    took.sort_unstable();
    let at = |q: f64| took[((took.len() - 1) as f64 * q).round() as usize].as_secs_f64() * 1e3;
    Some((at(0.5), at(0.9)))
}

fn shown(q: Option<(f64, f64)>) -> String {
    q.map_or_else(
        || "–".to_owned(),
        |(median, p90)| format!("{median:.2} / {p90:.2}"),
    )
}

async fn duplicate_calls() {
    let (handler, _, calls) = sdk_handler(false).await;
    let tag = format!("dup-{}", fastrand::u32(..));
    for (label, copies) in [
        ("each job once", 1),
        ("each job twice", 2),
        ("each job five times", 5),
    ] {
        let e = parse(&event_json(
            &format!("{tag}-{copies}"),
            100,
            copies,
            Shape::default(),
        ));
        calls.reset();
        run(&handler, &e).await;
        let jobs = 100 / copies;
        println!(
            "| 100 records, {label} ({jobs} jobs) | {} | {:.2} | {} |",
            calls.total("dynamodb"),
            calls.total("dynamodb") as f64 / jobs as f64,
            calls.total("sqs"),
        );
    }
}

async fn wall_against_ideal() {
    let latency_ms = 50;
    let concurrency = settings().max_concurrency;
    for n in [1_000, 10_000]
        .into_iter()
        .filter(|n| sizes().any(|s| s >= *n))
    {
        let handler = memory_handler();
        let e = parse(&event_json(
            &format!("wall{n}"),
            n,
            1,
            Shape {
                latency_ms,
                ..Shape::default()
            },
        ));
        let started = Instant::now();
        run(&handler, &e).await;
        let wall = started.elapsed().as_secs_f64();
        // Each record also makes two in-memory ledger round trips (claim, accept): microseconds.
        let ideal = n.div_ceil(concurrency) as f64 * latency_ms as f64 / 1e3;
        println!(
            "| {n} | {concurrency} | {latency_ms} ms | {ideal:.2} s | {wall:.2} s | {:.3} |",
            wall / ideal
        );
    }
}

fn main() {
    // The worker's logs, as it writes them at its default level (a line per record), into a sink.
    let filter = fenced_jobs::logs::LogSettings::from_lookup(|_| None).filter;
    let sink = Arc::new(std::fs::File::create("/dev/null").expect("/dev/null"));
    let logs = fenced_jobs::logs::json_subscriber(&filter, sink);
    tracing::subscriber::set_global_default(logs).expect("one subscriber");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("peak") {
        let n: usize = args.get(2).and_then(|v| v.parse().ok()).unwrap_or(10_000);
        runtime.block_on(async {
            let (handler, _, _) = sdk_handler(false).await;
            let json = event_json(
                &format!("peak-{}", fastrand::u32(..)),
                n,
                1,
                Shape::default(),
            );
            run(&handler, &parse(&json)).await;
            println!("handled one batch of {n} fresh records through the SDK");
        });
        return;
    }
    if args.get(1).map(String::as_str) == Some("only") {
        // One kind of request alone for a while, under `perf stat` or a profiler.
        let kind = args.get(2).cloned().unwrap_or_default();
        let n: usize = args.get(3).and_then(|v| v.parse().ok()).unwrap_or(100);
        let ms: u64 = args.get(4).and_then(|v| v.parse().ok()).unwrap_or(5_000);
        runtime.block_on(only(&kind, n, ms));
        return;
    }
    if args.get(1).map(String::as_str) == Some("contract") {
        // Only the cost of judging answers against their contract.
        runtime.block_on(async {
            contract_row(false).await;
            contract_row(true).await;
        });
        return;
    }
    if args.get(1).map(String::as_str) == Some("latency") {
        runtime.block_on(latency_table());
        return;
    }
    if args.get(1).map(String::as_str) == Some("floor") {
        // Only the comparison with the floor (a quick look after a change, or a profiler run).
        runtime.block_on(floor_table());
        return;
    }
    let local = std::env::var("AWS_ENDPOINT_URL").is_ok_and(|e| e.starts_with("http://127.0.0.1:"));
    runtime.block_on(async {
        println!("Handler CPU per record (µs) and DynamoDB calls per record:\n");
        println!("| adapters | records per batch | fresh CPU/record (µs) | redelivered CPU/record (µs) | DynamoDB calls/fresh record | DynamoDB calls/redelivered record |");
        println!("| --- | ---: | ---: | ---: | ---: | ---: |");
        cpu_table(false).await;
        if local {
            cpu_table(true).await;
            floor_table().await;
            println!("\nCPU per record against input and answer size (SDK + emulator, results bucket, 10 records per batch):\n");
            println!("| job | fresh CPU/record (µs) | redelivered CPU/record (µs) | DynamoDB calls/fresh record | S3 calls/fresh record |");
            println!("| --- | ---: | ---: | ---: | ---: |");
            size_table().await;
            println!("\nDuplicates within one batch (SDK + emulator):\n");
            println!("| batch | DynamoDB calls | DynamoDB calls per job | SQS calls |");
            println!("| --- | ---: | ---: | ---: |");
            duplicate_calls().await;
            latency_table().await;
        } else {
            println!("\n(AWS_ENDPOINT_URL is not the local emulator: SDK rows skipped; run `make bench`)");
        }
        if local {
            println!("\nRuntime flavour: fresh records' CPU per record (µs), SDK + emulator, medians of {ALTERNATIONS} alternations:\n");
            println!("| records per batch | current-thread | multi-thread (2 workers) | multi-thread costs |");
            println!("| ---: | ---: | ---: | ---: |");
            runtime_row(100);
        }
        println!("\nJudging answers against their contract: fresh invoice extractions' CPU per record (µs), 100 records a batch, medians of {ALTERNATIONS} alternations:\n");
        println!("| adapters | summary.v1 (accepted as text) | invoice-extract@2 (parsed, validated, stored as JSON) | judged costs |");
        println!("| --- | ---: | ---: | ---: |");
        contract_row(false).await;
        if local {
            contract_row(true).await;
        }
        println!("\nBatch wall time against the ideal (in-memory ledger, simulated call):\n");
        println!("| records | concurrency | call latency | ideal | measured | ratio |");
        println!("| ---: | ---: | ---: | ---: | ---: | ---: |");
        wall_against_ideal().await;
    });
}
