//! What a job costs on the AWS bill (`make bench`): fresh jobs run through the worker's batch
//! handler on a ledger that bills each write by DynamoDB's documented rules (the emulator bills
//! nothing) and an object store that counts its requests, for prompts of 1, 10 and 50 KiB. It
//! prints the largest item, the write units per job (table and index writes), the read units of
//! a redelivery, the S3 requests, the cost per million jobs at list prices beside the Python
//! peer's, and the whole bill of one reference job (model and AWS).
//!
//! Lambda and SQS are not counted here: their figures per job (Lambda $0.05 per million jobs
//! for a 0 s call at 128 MB, SQS 1.2 requests) come from the CPU model of `BENCHMARKS.md` §10.

mod records;

use std::fmt::Debug;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use aws_lambda_events::event::sqs::SqsEvent;
use fenced_jobs::blobs::{BlobError, BlobStore, MemoryBlobs};
use fenced_jobs::clock::{Clock, ManualClock, SystemClock};
use fenced_jobs::job::prices::{PriceTable, Rate};
use fenced_jobs::job::{BlobRef, DEFAULT_INLINE_MAX_BYTES, Usage};
use fenced_jobs::ledger::memory::InMemoryLedger;
use fenced_jobs::provider::SimulatedProvider;
use fenced_jobs::queue::RecordingVisibility;
use fenced_jobs::worker::Settings;
use fenced_jobs::worker::handler::BatchHandler;
use fenced_jobs::worker::processor::{Invocation, Processor};
use futures::future::BoxFuture;
use records::{Failing, deferrable, record};

/// us-east-1 list prices, USD per million requests.
const WRITE_UNIT: f64 = 0.625;
const READ_UNIT: f64 = 0.125;
const SQS_REQUEST: f64 = 0.40;
/// One Lambda request, and 20 ms at 128 MB (arm64), per million: a look at a running batch.
const LAMBDA_LOOK: f64 = 0.20 + 0.02 * 0.125 * 13.33;
const S3_PUT: f64 = 5.0;
const S3_GET: f64 = 0.4;
/// Lambda (compute and requests) and SQS (1.2 requests) per million jobs, 0 s call (from the
/// scale model's counts per job).
const LAMBDA: f64 = 0.05;
const SQS: f64 = 0.48;
/// The Python peer (Powertools batch + idempotency) per million jobs, 0 s call, measured side
/// by side at these prompt sizes.
const PEER: [(usize, f64); 3] = [(1, 1.79), (10, 1.83), (50, 2.07)];
/// Jobs per size: ten batches of ten.
const JOBS: usize = 100;

/// An object store that counts what S3 would bill.
#[derive(Debug, Default)]
struct Counted {
    store: MemoryBlobs,
    puts: AtomicU64,
    gets: AtomicU64,
}

impl BlobStore for Counted {
    fn bucket(&self) -> Option<&str> {
        self.store.bucket()
    }
    fn put<'a>(
        &'a self,
        key: &'a str,
        body: &'a [u8],
    ) -> BoxFuture<'a, Result<BlobRef, BlobError>> {
        self.puts.fetch_add(1, Ordering::Relaxed);
        self.store.put(key, body)
    }
    fn get<'a>(
        &'a self,
        bucket: &'a str,
        key: &'a str,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<u8>, BlobError>> {
        self.gets.fetch_add(1, Ordering::Relaxed);
        self.store.get(bucket, key, limit)
    }
    fn delete<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<(), BlobError>> {
        self.store.delete(key)
    }
    fn list<'a>(
        &'a self,
        prefix: &'a str,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<String>, BlobError>> {
        self.store.list(prefix, limit)
    }
}

/// What one prompt size cost per job.
struct Row {
    kib: usize,
    largest_item: usize,
    table_units: f64,
    index_writes: f64,
    redelivery_read: f64,
    puts: f64,
    gets: f64,
}

impl Row {
    fn dollars_per_million(&self) -> f64 {
        (self.table_units + self.index_writes) * WRITE_UNIT
            + self.puts * S3_PUT
            + self.gets * S3_GET
            + LAMBDA
            + SQS
    }
}

/// Runs `JOBS` fresh jobs of `kib` KiB prompts under `inline_max_bytes`, going as `failing`
/// says (each delivered again until it succeeds), their messages sent `sent_ago_ms` before.
async fn row(kib: usize, inline_max_bytes: usize, failing: Failing, sent_ago_ms: i64) -> Row {
    let blobs = Arc::new(Counted {
        store: MemoryBlobs::new("results"),
        ..Counted::default()
    });
    let settings = Settings {
        heartbeat_ms: 0,
        lease_ms: 300_000,
        inline_max_bytes,
        ..Settings::default()
    };
    let ledger = Arc::new(InMemoryLedger::metered());
    let mut executions = 0;
    for b in 0..JOBS / 10 {
        let jobs = (kib, b, sent_ago_ms);
        executions += batch(&ledger, &blobs, &settings, jobs, failing).await;
    }
    assert_eq!(
        executions,
        u64::from(failing.calls()) * JOBS as u64,
        "{failing:?}"
    );
    let bill = ledger.bill().expect("metered");
    let (puts, gets) = (
        blobs.puts.load(Ordering::Relaxed),
        blobs.gets.load(Ordering::Relaxed),
    );
    let jobs = JOBS as f64;
    Row {
        kib,
        largest_item: bill.largest_item,
        table_units: bill.table_units as f64 / jobs,
        index_writes: bill.index_writes as f64 / jobs,
        // A redelivery of a finished job reads its item once, consistently: a unit per 4 KB.
        redelivery_read: bill.largest_item.div_ceil(4096) as f64,
        puts: puts as f64 / jobs,
        gets: gets as f64 / jobs,
    }
}

/// Runs ten fresh jobs (`cost-{kib}-{b}-*`, prompts of `kib` KiB, their messages sent
/// `sent_ago_ms` before) through every delivery `failing` takes, on a ledger and a store shared
/// with the other batches; the calls the provider saw.
async fn batch(
    ledger: &Arc<InMemoryLedger>,
    blobs: &Arc<Counted>,
    settings: &Settings,
    (kib, b, sent_ago_ms): (usize, usize, i64),
    failing: Failing,
) -> u64 {
    // Each batch on a clock of its own, from now: the simulated provider tells a call's
    // end by the system clock.
    let clock = Arc::new(ManualClock::at(SystemClock.now_ms()));
    let handler = |provider: SimulatedProvider| {
        BatchHandler::new(
            Processor::new(ledger.clone(), provider, clock.clone(), settings.clone())
                .with_blobs(blobs.clone()),
            RecordingVisibility::new(),
        )
    };
    // The refusing provider answers only the first delivery.
    let (first, then) = match failing {
        Failing::Throttled => (
            handler(SimulatedProvider::new().overloaded_for("sim-1")),
            handler(SimulatedProvider::new()),
        ),
        _ => (
            handler(SimulatedProvider::new()),
            handler(SimulatedProvider::new()),
        ),
    };
    for receive in 1..=failing.deliveries() {
        let mut event = SqsEvent::default();
        event.records = (0..10)
            .map(|i| {
                let job = format!("cost-{kib}-{b}-{i}");
                record(&job, kib * 1024, failing, receive, sent_ago_ms)
            })
            .collect();
        let handler = if receive == 1 { &first } else { &then };
        let inv = Invocation {
            // Each delivery its own invocation, as Lambda's request ids are.
            id: format!("bench-cost-{b}-{receive}"),
            deadline: Some(clock.now_ms() + 900_000),
        };
        let run = handler.handle_batch(&event, &inv);
        if failing == Failing::Recovered && receive == 1 {
            // The owner dies while its calls run; the lease lapses before the next delivery
            // (a heartbeat renews nothing here), and the calls end meanwhile.
            let cut = tokio::time::timeout(std::time::Duration::from_millis(100), run).await;
            assert!(cut.is_err(), "the first delivery outlived its owner");
            tokio::time::sleep(std::time::Duration::from_millis(150)).await;
            clock.advance(settings.lease_ms + settings.skew_ms + 1_000);
            continue;
        }
        let report = run.await;
        let failed = report.response.as_ref().map_or(usize::MAX, Vec::len);
        let expected = if receive == failing.deliveries() {
            0
        } else {
            10
        };
        assert_eq!(failed, expected, "{failing:?}, delivery {receive}");
    }
    first.processor().provider().executions() + then.processor().provider().executions()
}

/// The paths `main` bills: a label, `INLINE_MAX_BYTES`, how the first attempt goes, and how long
/// before the message was sent.
fn shapes() -> [(&'static str, usize, Failing, i64); 8] {
    // SQS's default retention (4 days) ends before a job due in a day (the default) whose
    // message was sent four days ago: SQS may drop it.
    let old = 4 * 86_400_000;
    let kept = DEFAULT_INLINE_MAX_BYTES;
    [
        (
            "A fresh job that succeeds (the happy path)",
            kept,
            Failing::Transient(0),
            0,
        ),
        (
            "A job whose first attempt failed (a transient error), on a message SQS keeps past its deadline: no input kept (the message carries it)",
            kept,
            Failing::Transient(1),
            0,
        ),
        (
            "The same, its first two attempts failed: each further failure on such a message",
            kept,
            Failing::Transient(2),
            0,
        ),
        (
            "A job whose first call was refused before any work (a 429 or 529: the attempt given back), on such a message",
            kept,
            Failing::Throttled,
            0,
        ),
        (
            "A job whose first answer its contract refused (cut off at the token limit), on such a message",
            kept,
            Failing::Refused,
            0,
        ),
        (
            "A job whose first owner died while its call ran: the next delivery recovers it once the lease lapsed and collects the answer by its reference",
            kept,
            Failing::Recovered,
            0,
        ),
        (
            "A job whose first attempt failed on a message SQS may drop before the deadline (sent four days ago, SQS's default retention): its input kept from then on, inline up to INLINE_MAX_BYTES 4 KiB (the default)",
            kept,
            Failing::Transient(1),
            old,
        ),
        (
            "The same with INLINE_MAX_BYTES 64 KiB (every input inline)",
            64 * 1024,
            Failing::Transient(1),
            old,
        ),
    ]
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    println!(
        "What a job costs on the AWS bill: {JOBS} jobs per prompt size, 0 s call, short answer; \
         DynamoDB units by its documented rules, S3 requests counted; Lambda ${LAMBDA:.2} and \
         SQS ${SQS:.2} per million jobs (§10)"
    );
    let mut reference = None;
    for (label, inline, failing, sent_ago_ms) in shapes() {
        println!();
        println!("{label}");
        println!(
            "| prompt | largest item | write units per job (table + index) | redelivery read units | S3 PUT / GET per job | per million jobs | Python peer |"
        );
        println!("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
        for (kib, peer) in PEER {
            let r = row(kib, inline, failing, sent_ago_ms).await;
            let happy = failing == Failing::Transient(0);
            if kib == 10 && happy {
                reference = Some(r.dollars_per_million());
            }
            let peer = if happy {
                format!("${peer:.2}")
            } else {
                "—".to_owned()
            };
            println!(
                "| {} KiB | {} B | {:.2} ({:.2} + {:.2}) | {:.0} | {:.2} / {:.2} | ${:.2} | {} |",
                r.kib,
                r.largest_item,
                r.table_units + r.index_writes,
                r.table_units,
                r.index_writes,
                r.redelivery_read,
                r.puts,
                r.gets,
                r.dollars_per_million(),
                peer
            );
        }
    }
    whole_bill(reference.expect("the 10 KiB row"));
    let batch_aws = batches(reference.expect("the 10 KiB row")).await;
    by_path(reference.expect("the 10 KiB row"), batch_aws);
}

/// The models of the price table the picture shows: each provider's families, large to small.
const PICTURED: [&str; 9] = [
    "gpt-5",
    "gpt-5-mini",
    "gpt-5-nano",
    "gpt-4.1-mini",
    "o4-mini",
    "claude-sonnet-4-5",
    "claude-haiku-4-5",
    "amazon.nova-pro-v1:0",
    "amazon.nova-lite-v1:0",
];

/// The reference job's whole bill per million jobs on each path its model's prices offer:
/// a direct call at standard prices, a batch line (`batch_aws`: its AWS share, 6 looks), and
/// each service tier the table prices for the model (a tier without prices of its own is one
/// its provider does not sell for it: `—`).
fn by_path(direct_aws: f64, batch_aws: f64) {
    let prices = PriceTable::built_in();
    let usage = reference_usage();
    println!();
    println!(
        "The reference job by model and path, per million jobs (model + AWS; batch with 6 looks; \
         a tier only where the price table prices it)"
    );
    println!("| model | direct | batch | flex | priority |");
    println!("| --- | ---: | ---: | ---: | ---: |");
    for model in PICTURED {
        let Some(price) = prices.price(model) else {
            continue;
        };
        let at = |rate: Rate, aws: f64| {
            price
                .cost_at(&usage, rate)
                .map_or("—".to_owned(), |micros| {
                    format!("${:.2}", micros as f64 + aws)
                })
        };
        let tier = |offered: bool, rate: Rate| {
            if offered {
                at(rate, direct_aws)
            } else {
                "—".to_owned()
            }
        };
        println!(
            "| {model} | {} | {} | {} | {} |",
            at(Rate::Standard, direct_aws),
            at(Rate::Batch, batch_aws),
            tier(price.flex.is_some(), Rate::Flex),
            tier(price.priority.is_some(), Rate::Priority),
        );
    }
}

/// What a deferrable job adds on the AWS bill, measured: its first delivery (claim, the
/// batch's reference, the hand-over), a look at its running batch, and the delivery that reads
/// its line and accepts the answer; for 10 KiB prompts, ten jobs a batch. Returns the write
/// units per job of the first delivery, of a look, and of the last delivery, and the largest
/// item.
async fn batch_aws(webhooks: bool) -> (f64, f64, f64, u64, (f64, f64)) {
    let mut settings = Settings {
        heartbeat_ms: 0,
        lease_ms: 300_000,
        skew_ms: 0,
        ..Settings::default()
    };
    // With webhooks: each batch lists its jobs, and the record of a line's batch keeps the input.
    settings.batching.webhooks = webhooks;
    // The deployed stack's results bucket: an input kept above INLINE_MAX_BYTES is stored there.
    let store = Arc::new(Counted {
        store: MemoryBlobs::new("results"),
        ..Counted::default()
    });
    let handler = BatchHandler::new(
        Processor::new(
            InMemoryLedger::metered(),
            SimulatedProvider::new().with_batches(),
            SystemClock,
            settings,
        )
        .with_blobs(store.clone()),
        RecordingVisibility::new(),
    );
    // Each delivery its own invocation (a record's owner id names it).
    let inv = |receive: u32| Invocation {
        id: format!("bench-batch-{receive}"),
        deadline: Some(SystemClock.now_ms() + 900_000),
    };
    let deliver = |receive: u32| {
        let mut event = SqsEvent::default();
        event.records = (0..JOBS)
            .map(|i| deferrable(&format!("batch-{i}"), 10 * 1024, receive))
            .collect();
        event
    };
    let units = |h: &BatchHandler<_, _, _, _>| {
        let ledger: &InMemoryLedger = h.processor().ledger();
        let bill = ledger.bill().expect("metered");
        (bill.table_units + bill.index_writes, bill.largest_item)
    };
    let mut after = Vec::new();
    for receive in 1..=2 {
        in_tens(&handler, &deliver(receive), &inv(receive)).await;
        after.push(units(&handler).0);
    }
    // A look writes nothing to the jobs; the batch's counts go on its own item, once per
    // batch while they change.
    let batches = (JOBS / 10) as u64;
    assert!(
        after[1] - after[0] <= batches,
        "a look writes one note a batch at most: {after:?}"
    );
    let (after_look, _) = units(&handler);
    handler.processor().provider().end_batches();
    let mut event = deliver(3);
    // With webhooks the answers are collected by the webhook's triggers, by id.
    if webhooks {
        by_id(&mut event);
    }
    for report in in_tens(&handler, &event, &inv(3)).await {
        assert_eq!(report.response, Ok(vec![]), "every line read and accepted");
    }
    let (total, largest) = units(&handler);
    assert_eq!(
        handler.processor().provider().batch_sizes(),
        vec![10; JOBS / 10],
        "one batch per invocation of ten"
    );
    let jobs = JOBS as f64;
    let s3 = |n: &AtomicU64| n.load(Ordering::Relaxed) as f64 / jobs;
    (
        after[0] as f64 / jobs,
        (after[1] - after[0]) as f64 / jobs,
        (total - after_look) as f64 / jobs,
        largest as u64,
        (s3(&store.puts), s3(&store.gets)),
    )
}

/// `event`'s records, ten to an invocation: each invocation's report.
async fn in_tens(
    handler: &BatchHandler<InMemoryLedger, SimulatedProvider, SystemClock, RecordingVisibility>,
    event: &SqsEvent,
    inv: &Invocation,
) -> Vec<fenced_jobs::report::BatchReport> {
    let mut reports = Vec::new();
    for chunk in event.records.chunks(10) {
        let mut part = SqsEvent::default();
        part.records = chunk.to_vec();
        reports.push(handler.handle_batch(&part, inv).await);
    }
    reports
}

/// `event`'s records made triggers by id of their jobs, as a webhook sends them.
fn by_id(event: &mut SqsEvent) {
    for record in &mut event.records {
        let id = record.message_id.as_deref().unwrap_or_default();
        let job = id.trim_end_matches("-msg");
        record.body = Some(format!(r#"{{"job_id":"{job}"}}"#));
    }
}

/// The reference job's model.
const MODEL: &str = "gpt-5-mini";

/// What the reference job's call costs at list prices, direct and through a batch, in dollars
/// per million jobs (micro-dollars per job).
fn reference_job() -> (f64, f64) {
    let usage = reference_usage();
    let prices = PriceTable::built_in();
    let cost = |batch| prices.cost_micros(MODEL, &usage, batch).expect("priced") as f64;
    (cost(false), cost(true))
}

/// The reference job's tokens: a 10 KiB document in, a summary out.
fn reference_usage() -> Usage {
    Usage {
        input: 2_600,
        output: 400,
        ..Usage::default()
    }
}

/// The reference job's model bill with and without batches, and what batches add on AWS;
/// returns the AWS share of a batch line with 6 looks (a batch of an hour).
async fn batches(direct_aws: f64) -> f64 {
    let (model, batch) = reference_job();
    let (first, noted, last, largest, _) = batch_aws(false).await;
    // A look: one consistent read of the item, a tenth of a receive and of a visibility change
    // (ten records a batch), a tenth of a Lambda invocation; nothing written to the job, and
    // the batch's counts noted on its own item (a share of one write a batch).
    let read_units = largest.div_ceil(4096) as f64;
    let look = read_units * READ_UNIT + noted * WRITE_UNIT + 0.2 * SQS_REQUEST + 0.1 * LAMBDA_LOOK;
    let fixed = (first + last) * WRITE_UNIT + 0.2 * SQS_REQUEST + LAMBDA + SQS;
    println!();
    println!(
        "Deferrable jobs through a provider batch ({MODEL}, the reference job), per million jobs:"
    );
    println!("| | model | AWS | total | vs. direct |");
    println!("| --- | ---: | ---: | ---: | ---: |");
    let direct = model + direct_aws;
    println!("| direct call | ${model:.2} | ${direct_aws:.2} | ${direct:.2} | — |");
    for looks in [1_u32, 6, 144] {
        let aws = fixed + f64::from(looks) * look;
        let total = batch + aws;
        println!(
            "| batch, {looks} look(s) at the running batch | ${batch:.2} | ${aws:.2} | ${total:.2} | {:.1} % less |",
            100.0 * (1.0 - total / direct)
        );
    }
    // With OpenAI's webhooks: the same writes with the batch's list and the kept input, the
    // answer collected by the webhook's trigger (a message sent, received and deleted, the
    // webhook's invocation and its reads shared by the batch's ten jobs), then one look by the
    // record's own message, which finds the job ended.
    let (w_first, _, w_last, w_largest, (puts, gets)) = batch_aws(true).await;
    let w_read = w_largest.div_ceil(4096) as f64;
    let trigger = 3.0 * SQS_REQUEST + 0.1 * (LAMBDA_LOOK + 4.0 * READ_UNIT + WRITE_UNIT);
    let w_aws = (w_first + w_last) * WRITE_UNIT
        + 0.2 * SQS_REQUEST
        + LAMBDA
        + SQS
        + trigger
        + puts * S3_PUT
        + gets * S3_GET
        + w_read * READ_UNIT
        + 0.2 * SQS_REQUEST
        + 0.1 * LAMBDA_LOOK;
    let w_total = batch + w_aws;
    println!(
        "| batch with OpenAI's webhooks, collected by the webhook's trigger | ${batch:.2} | ${w_aws:.2} | ${w_total:.2} | {:.1} % less |",
        100.0 * (1.0 - w_total / direct)
    );
    println!(
        "Measured: write units per job {first:.2} (first delivery: claim, the batch's \
         reference, the hand-over) + {last:.2} (the delivery that accepts), none to the job \
         for a look; a look costs {read_units:.0} read unit(s), {noted:.2} write units (the \
         batch's counts for jobctl watch, one item a batch), 0.2 SQS requests and a tenth of \
         an invocation (${look:.3} per million); 6 looks is a batch of an hour at \
         BATCH_POLL_SECONDS 600, 144 a whole day. With webhooks: write units per job \
         {w_first:.2} + {w_last:.2} (the batch's list of its jobs, and the input kept by the \
         record of the line's batch: stored in the results bucket above INLINE_MAX_BYTES, \
         {puts:.2} PUT and {gets:.2} GET per job), a look at the ended job {w_read:.0} read \
         unit(s)"
    );
    fixed + 6.0 * look
}

/// The whole bill of one reference job: a 10 KiB document summarised by `gpt-5-mini` (about
/// 2,600 input tokens, 400 output), at list prices, against its AWS share (`aws`, per million).
fn whole_bill(aws: f64) {
    let (model, batch) = reference_job();
    println!();
    println!(
        "Whole bill of a reference job ({MODEL}, a 10 KiB document: 2,600 input and 400 output \
         tokens), per million jobs: model ${model:.2} (batch ${batch:.2}) + AWS ${aws:.2} = \
         ${:.2}; AWS is {:.2} % of it",
        model + aws,
        100.0 * aws / (model + aws)
    );
}
