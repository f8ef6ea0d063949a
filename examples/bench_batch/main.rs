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
//! - this file: the handlers, events and CPU windows every table shares, and the tables of
//!   records;
//! - [`floor`]: the comparison with the SDK's floor, and `only`;
//! - [`latency`]: the ledger's latency beside the CPU;
//! - [`contracts`]: what judging an answer against its contract costs.
//!
//! CPU is the process's CPU time (every thread of it; the emulator runs in another process) on a
//! single-threaded runtime, as the worker runs, summed over rounds of at least `ROUND_MS` of wall
//! time and divided by the records (or requests) handled.

mod contracts;
#[path = "../support/cpu.rs"]
mod cpu;
mod floor;
mod latency;

use std::sync::Arc;
use std::time::{Duration, Instant};

use aws_lambda_events::event::sqs::{SqsEvent, SqsMessage};
use fenced_jobs::blobs::s3::S3Blobs;
use fenced_jobs::clock::{Clock, SystemClock};
use fenced_jobs::config::SdkTimeouts;
use fenced_jobs::job::contract::Contracts;
use fenced_jobs::ledger::JobLedger;
use fenced_jobs::ledger::dynamodb::DynamoLedger;
use fenced_jobs::ledger::memory::InMemoryLedger;
use fenced_jobs::provider::SimulatedProvider;
use fenced_jobs::queue::{RecordingVisibility, SqsVisibility, VisibilityControl};
use fenced_jobs::testing::sdk_calls::{CallCounter, counted_clients};
use fenced_jobs::worker::Settings;
use fenced_jobs::worker::handler::{BatchHandler, event_from_json};
use fenced_jobs::worker::processor::{Invocation, Processor};

use cpu::{median, process_cpu_ns};
use floor::Floor;
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
    let number =
        |at: usize, default: u64| args.get(at).and_then(|v| v.parse().ok()).unwrap_or(default);
    match args.get(1).map(String::as_str) {
        Some("peak") => runtime.block_on(peak(number(2, 10_000) as usize)),
        // One kind of request alone for a while, under `perf stat` or a profiler.
        Some("only") => runtime.block_on(floor::only(
            args.get(2).map_or("", String::as_str),
            number(3, 100) as usize,
            number(4, 5_000),
        )),
        // Only the cost of judging answers against their contract.
        Some("contract") => runtime.block_on(async {
            contracts::contract_row(false).await;
            contracts::contract_row(true).await;
        }),
        Some("latency") => runtime.block_on(latency::latency_table()),
        // Only the comparison with the floor (a quick look after a change, or a profiler run).
        Some("floor") => runtime.block_on(floor::floor_table()),
        _ => runtime.block_on(every_table()),
    }
}

/// One `n`-record batch of fresh records through the SDK, for `/usr/bin/time`.
async fn peak(n: usize) {
    let (handler, _, _) = sdk_handler(false).await;
    let json = event_json(
        &format!("peak-{}", fastrand::u32(..)),
        n,
        1,
        Shape::default(),
    );
    run(&handler, &parse(&json)).await;
    println!("handled one batch of {n} fresh records through the SDK");
}

/// Every table, as `make bench` runs them (the SDK's only on the local emulator).
async fn every_table() {
    let local = std::env::var("AWS_ENDPOINT_URL").is_ok_and(|e| e.starts_with("http://127.0.0.1:"));
    println!("Handler CPU per record (µs) and DynamoDB calls per record:\n");
    println!(
        "| adapters | records per batch | fresh CPU/record (µs) | redelivered CPU/record (µs) | DynamoDB calls/fresh record | DynamoDB calls/redelivered record |"
    );
    println!("| --- | ---: | ---: | ---: | ---: | ---: |");
    cpu_table(false).await;
    if local {
        cpu_table(true).await;
        floor::floor_table().await;
        println!(
            "\nCPU per record against input and answer size (SDK + emulator, results bucket, 10 records per batch):\n"
        );
        println!(
            "| job | fresh CPU/record (µs) | redelivered CPU/record (µs) | DynamoDB calls/fresh record | S3 calls/fresh record |"
        );
        println!("| --- | ---: | ---: | ---: | ---: |");
        size_table().await;
        println!("\nDuplicates within one batch (SDK + emulator):\n");
        println!("| batch | DynamoDB calls | DynamoDB calls per job | SQS calls |");
        println!("| --- | ---: | ---: | ---: |");
        duplicate_calls().await;
        latency::latency_table().await;
        println!(
            "\nRuntime flavour: fresh records' CPU per record (µs), SDK + emulator, medians of {ALTERNATIONS} alternations:\n"
        );
        println!(
            "| records per batch | current-thread | multi-thread (2 workers) | multi-thread costs |"
        );
        println!("| ---: | ---: | ---: | ---: |");
        runtime_row(100);
    } else {
        println!(
            "\n(AWS_ENDPOINT_URL is not the local emulator: SDK rows skipped; run `make bench`)"
        );
    }
    println!(
        "\nJudging answers against their contract: fresh invoice extractions' CPU per record (µs), 100 records a batch, medians of {ALTERNATIONS} alternations:\n"
    );
    println!(
        "| adapters | summary.v1 (accepted as text) | invoice-extract@2 (parsed, validated, stored as JSON) | judged costs |"
    );
    println!("| --- | ---: | ---: | ---: |");
    contracts::contract_row(false).await;
    if local {
        contracts::contract_row(true).await;
    }
    println!("\nBatch wall time against the ideal (in-memory ledger, simulated call):\n");
    println!("| records | concurrency | call latency | ideal | measured | ratio |");
    println!("| ---: | ---: | ---: | ---: | ---: | ---: |");
    wall_against_ideal().await;
}
