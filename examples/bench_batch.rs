//! Batch benchmark (`make bench`): handler CPU and AWS calls per record for fresh jobs, for
//! redelivered finished jobs and for duplicates, with the in-memory adapters and through the
//! AWS SDK on the local emulator; batch wall time against the ideal with a simulated 50 ms call.
//!
//! `bench_batch peak N` handles one N-record batch through the SDK and exits, for `/usr/bin/time`.
//!
//! CPU is the thread time of a single-threaded runtime (the emulator runs in another process),
//! summed over rounds of at least `ROUND_MS` of wall time and divided by the records handled.

use std::time::{Duration, Instant};

use aws_lambda_events::event::sqs::{SqsEvent, SqsMessage};
use fenced_jobs::clock::{Clock, SystemClock};
use fenced_jobs::ledger::JobLedger;
use fenced_jobs::ledger::dynamodb::DynamoLedger;
use fenced_jobs::ledger::memory::InMemoryLedger;
use fenced_jobs::provider::SimulatedProvider;
use fenced_jobs::queue::{RecordingVisibility, SqsVisibility, VisibilityControl};
use fenced_jobs::testing::sdk_calls::{CallCounter, counted_clients};
use fenced_jobs::worker::Settings;
use fenced_jobs::worker::handler::BatchHandler;
use fenced_jobs::worker::processor::{Invocation, Processor};

const ARN: &str = "arn:aws:sqs:us-east-1:123456789012:bench";
const SIZES: [usize; 4] = [10, 100, 1_000, 10_000];
const ROUND_MS: u64 = 1_000;

fn thread_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(0)
}

/// No heartbeat (these records are fast; `bench_heartbeat` measures ticks), no jitter in play.
fn settings() -> Settings {
    Settings {
        heartbeat_ms: 0,
        lease_ms: 300_000,
        ..Settings::default()
    }
}

/// The JSON of an event of `n` records for jobs `{prefix}-0..n`, each job `copies` times, as
/// Lambda sends it.
fn event_json(prefix: &str, n: usize, copies: usize, latency_ms: u64) -> String {
    let now = SystemClock.now_ms();
    let records: Vec<SqsMessage> = (0..n)
        .map(|i| {
            let job = i / copies;
            let mut m = SqsMessage::default();
            m.message_id = Some(format!("{prefix}-msg-{i}"));
            m.receipt_handle = Some(format!("{prefix}-handle-{i}"));
            m.body = Some(format!(
                r#"{{"job_id":"{prefix}-{job}","contract":"summary.v1","input":{{"model":"sim-1","messages":[{{"role":"user","content":"Summarise document {job}."}}],"parameters":{{"temperature":0}},"simulate":{{"latency_ms":{latency_ms}}}}}}}"#
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

/// Handles batches (round `r` from `make(r)`) until `ROUND_MS` passed, at least once. The CPU
/// window covers what the function does: parsing the event JSON, as the runtime does, and
/// handling it.
async fn measure<L: JobLedger, V: VisibilityControl>(
    handler: &BatchHandler<L, SimulatedProvider, SystemClock, V>,
    n: usize,
    mut make: impl FnMut(usize) -> String,
) -> Measure {
    let started = Instant::now();
    let mut cpu = 0;
    let mut rounds = 0;
    while rounds == 0 || started.elapsed() < Duration::from_millis(ROUND_MS) {
        let json = make(rounds);
        let before = thread_cpu_ns();
        let event: SqsEvent = serde_json::from_str(&json).expect("event");
        run(handler, &event).await;
        cpu += thread_cpu_ns() - before;
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
    let report = handler.handle_batch(event, &invocation()).await;
    assert_eq!(report.response, Ok(vec![]), "every record succeeds");
}

fn parse(json: &str) -> SqsEvent {
    serde_json::from_str(json).expect("event")
}

fn memory_handler()
-> BatchHandler<InMemoryLedger, SimulatedProvider, SystemClock, RecordingVisibility> {
    BatchHandler::new(
        Processor::new(
            InMemoryLedger::new(),
            SimulatedProvider::new(),
            SystemClock,
            settings(),
        ),
        RecordingVisibility::new(),
    )
}

async fn sdk_handler() -> (
    BatchHandler<DynamoLedger, SimulatedProvider, SystemClock, SqsVisibility>,
    CallCounter,
) {
    let config = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
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
    let handler = BatchHandler::new(
        Processor::new(
            DynamoLedger::new(ddb, table),
            SimulatedProvider::new(),
            SystemClock,
            settings(),
        ),
        SqsVisibility::new(sqs),
    );
    (handler, calls)
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
        let fresh_json = |round: usize| event_json(&format!("{tag}-r{round}"), n, 1, 0);
        let first = fresh_json(0);
        let (fresh, redelivered, calls_fresh, calls_again) = if sdk {
            let (handler, calls) = sdk_handler().await;
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

async fn duplicate_calls() {
    let (handler, calls) = sdk_handler().await;
    let tag = format!("dup-{}", fastrand::u32(..));
    for (label, copies) in [
        ("each job once", 1),
        ("each job twice", 2),
        ("each job five times", 5),
    ] {
        let e = parse(&event_json(&format!("{tag}-{copies}"), 100, copies, 0));
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
        let e = parse(&event_json(&format!("wall{n}"), n, 1, latency_ms));
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
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("peak") {
        let n: usize = args.get(2).and_then(|v| v.parse().ok()).unwrap_or(10_000);
        runtime.block_on(async {
            let (handler, _) = sdk_handler().await;
            let json = event_json(&format!("peak-{}", fastrand::u32(..)), n, 1, 0);
            run(&handler, &parse(&json)).await;
            println!("handled one batch of {n} fresh records through the SDK");
        });
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
            println!("\nDuplicates within one batch (SDK + emulator):\n");
            println!("| batch | DynamoDB calls | DynamoDB calls per job | SQS calls |");
            println!("| --- | ---: | ---: | ---: |");
            duplicate_calls().await;
        } else {
            println!("\n(AWS_ENDPOINT_URL is not the local emulator: SDK rows skipped; run `make bench`)");
        }
        println!("\nBatch wall time against the ideal (in-memory ledger, simulated call):\n");
        println!("| records | concurrency | call latency | ideal | measured | ratio |");
        println!("| ---: | ---: | ---: | ---: | ---: | ---: |");
        wall_against_ideal().await;
    });
}
