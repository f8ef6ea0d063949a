//! Heartbeat benchmark (`make bench`): for 10, 100 and 1,000 slow records in flight, the SQS and
//! DynamoDB calls one heartbeat tick makes and the heartbeat's own CPU time per tick (median of
//! the ticks), with the in-memory adapters and through the AWS SDK on the local emulator.
//!
//! The runtime is single-threaded, and the CPU time is the process's (SDK request building,
//! signing and I/O included; the emulator runs in another process).

#[path = "support/cpu.rs"]
mod cpu;

use std::time::{Duration, Instant};

use fenced_jobs::clock::{Clock, SystemClock};
use fenced_jobs::job::{Expect, NewJob};
use fenced_jobs::ledger::dynamodb::DynamoLedger;
use fenced_jobs::ledger::memory::InMemoryLedger;
use fenced_jobs::ledger::{ClaimRequest, JobLedger};
use fenced_jobs::queue::{RecordingVisibility, SqsVisibility, VisibilityControl};
use fenced_jobs::testing::sdk_calls::counted_clients;
use fenced_jobs::worker::Settings;
use fenced_jobs::worker::heartbeat::{Delivered, Flights, Heartbeat};

use cpu::{median, process_cpu_ns};

const SIZES: [usize; 3] = [10, 100, 1_000];
const ROUNDS: usize = 5;
const ROUND_MS: u64 = 300;
const ARN: &str = "arn:aws:sqs:us-east-1:123456789012:bench";

fn settings() -> Settings {
    Settings {
        queue_visibility_s: 600,
        lease_ms: 600_000,
        heartbeat_ms: 200_000,
        ..Settings::default()
    }
}

fn job(i: usize, now: i64) -> NewJob {
    NewJob {
        class: Default::default(),
        job_id: format!("bench-{i}"),
        input_digest: "d".into(),
        contract: "c".into(),
        input: r#"{"model":"m","prompt":"p"}"#.into(),
        input_ref: None,
        metadata: None,
        deadline_at: now + 3_600_000,
        max_attempts: 3,
        max_cost_micros: None,
        expires_at: now / 1000 + 86_400,
    }
}

/// Claims every job and registers it as running in `flights`.
async fn claim_all<L: JobLedger>(ledger: &L, flights: &Flights, n: usize) {
    let now = SystemClock.now_ms();
    for i in 0..n {
        let req = ClaimRequest {
            job: job(i, now),
            expect: Expect::FRESH,
            owner_id: "bench".into(),
            now,
            lease_until: now + 600_000,
            provider_ref: None,
            route: None,
            first_sight: false,
            list_due: false,
        };
        ledger.claim(req).await.expect("claim");
        flights.running(i, &format!("bench-{i}"), 1, now + 600_000, now + 3_600_000);
    }
}

/// Runs `ROUNDS` rounds of ticks, each round long enough (`ROUND_MS` of wall time) for the
/// kernel's CPU accounting to be exact; returns (ticks run, median CPU ns per tick).
async fn ticks<L: JobLedger, V: VisibilityControl>(
    flights: &Flights,
    ledger: &L,
    visibility: &V,
) -> (u64, u64) {
    let settings = settings();
    let beat = Heartbeat {
        flights,
        ledger,
        visibility,
        clock: &SystemClock,
        settings: &settings,
    };
    let mut per_tick = Vec::with_capacity(ROUNDS);
    let mut total = 0;
    for _ in 0..ROUNDS {
        let started = Instant::now();
        let before = process_cpu_ns();
        let mut reps = 0;
        while reps == 0 || started.elapsed() < Duration::from_millis(ROUND_MS) {
            beat.tick().await;
            reps += 1;
        }
        per_tick.push((process_cpu_ns() - before) / reps);
        total += reps;
    }
    (total, median(per_tick))
}

async fn in_memory(n: usize) -> (f64, f64, u64) {
    let ledger = InMemoryLedger::new();
    let visibility = RecordingVisibility::new();
    let now = SystemClock.now_ms();
    let delivered = (0..n)
        .map(|i| Delivered {
            queue_arn: Some(ARN.into()),
            receipt_handle: Some(format!("handle-{i}")),
            received_at: now,
        })
        .collect();
    let flights = Flights::new(delivered, 600);
    claim_all(&ledger, &flights, n).await;
    let writes_before = ledger.writes();
    let (ticks, cpu) = ticks(&flights, &ledger, &visibility).await;
    let stats = flights.snapshot();
    let sqs = stats.visibility_calls as f64 / ticks as f64;
    let ddb = (ledger.writes() - writes_before) as f64 / ticks as f64;
    (sqs, ddb, cpu)
}

async fn emulator(n: usize) -> (f64, f64, u64) {
    let config = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
    let (ddb, sqs, calls) = counted_clients(&config);
    let suffix = format!("{}-{n}", std::process::id());
    let table = format!("bench-{suffix}");
    DynamoLedger::create_table(&ddb, &table)
        .await
        .expect("table");
    let url = sqs
        .create_queue()
        .queue_name(format!("bench-{suffix}"))
        .attributes(
            aws_sdk_sqs::types::QueueAttributeName::VisibilityTimeout,
            "600",
        )
        .send()
        .await
        .expect("queue")
        .queue_url()
        .expect("url")
        .to_owned();
    let arn = format!("arn:aws:sqs:us-east-1:123456789012:bench-{suffix}");
    for start in (0..n).step_by(10) {
        let entries = (start..(start + 10).min(n))
            .map(|i| {
                aws_sdk_sqs::types::SendMessageBatchRequestEntry::builder()
                    .id(i.to_string())
                    .message_body(format!("m{i}"))
                    .build()
                    .expect("entry")
            })
            .collect();
        sqs.send_message_batch()
            .queue_url(&url)
            .set_entries(Some(entries))
            .send()
            .await
            .expect("send");
    }
    let mut handles = Vec::with_capacity(n);
    while handles.len() < n {
        let got = sqs
            .receive_message()
            .queue_url(&url)
            .max_number_of_messages(10)
            .send()
            .await
            .expect("receive");
        handles.extend(
            got.messages()
                .iter()
                .filter_map(|m| m.receipt_handle().map(str::to_owned)),
        );
    }
    let now = SystemClock.now_ms();
    let delivered = handles
        .into_iter()
        .map(|h| Delivered {
            queue_arn: Some(arn.clone()),
            receipt_handle: Some(h),
            received_at: now,
        })
        .collect();
    let flights = Flights::new(delivered, 600);
    let ledger = DynamoLedger::new(ddb, &table);
    claim_all(&ledger, &flights, n).await;
    let visibility = SqsVisibility::new(sqs);
    visibility
        .queue_url(&arn)
        .await
        .expect("queue url resolves");
    calls.reset();
    let (ticks, cpu) = ticks(&flights, &ledger, &visibility).await;
    let stats = flights.snapshot();
    let expected = n as u64 * ticks;
    assert_eq!(
        stats.lease_renewed, expected,
        "every lease renewed: {stats:?}"
    );
    assert_eq!(
        stats.visibility_renewed, expected,
        "every visibility renewed: {stats:?}"
    );
    let per_tick = |service: &str| calls.total(service) as f64 / ticks as f64;
    (per_tick("sqs"), per_tick("dynamodb"), cpu)
}

fn row(adapters: &str, n: usize, (sqs, ddb, cpu): (f64, f64, u64)) {
    println!(
        "| {adapters} | {n} | {sqs:.0} | {ddb:.0} | {:.3} | {:.2} |",
        cpu as f64 / 1e6,
        cpu as f64 / 1e3 / n as f64
    );
}

fn main() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        println!("Heartbeat, per tick (CPU: median of {ROUNDS} rounds of at least {ROUND_MS} ms of ticks):\n");
        println!("| adapters | records in flight | SQS calls | DynamoDB calls | heartbeat CPU (ms) | CPU per record (µs) |");
        println!("| --- | ---: | ---: | ---: | ---: | ---: |");
        for n in SIZES {
            row("in memory", n, in_memory(n).await);
        }
        let local = std::env::var("AWS_ENDPOINT_URL").is_ok_and(|e| e.starts_with("http://127.0.0.1:"));
        if local {
            for n in SIZES {
                row("SDK + emulator", n, emulator(n).await);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        } else {
            println!("\n(AWS_ENDPOINT_URL is not the local emulator: SDK rows skipped; run `make bench`)");
        }
    });
}
