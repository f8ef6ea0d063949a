//! The reconciler as a scheduled Lambda function: each run re-sends lost triggers, expires jobs
//! past their deadline (cancelling a background call they left running), counts `unknown` jobs,
//! with `DLQ_URL` sends live jobs' dead letters back to the work queue and, with
//! `RESULTS_BUCKET`, removes stored answers no item references; then prints one metric document
//! (EMF).

use fenced_jobs::blobs::s3::S3Blobs;
use fenced_jobs::clock::{Clock, SystemClock};
use fenced_jobs::config::s3_client;
use fenced_jobs::job::scope::Producers;
use fenced_jobs::ledger::dynamodb::DynamoLedger;
use fenced_jobs::ops::metrics::{self, MetricsTarget};
use fenced_jobs::ops::operator::redrive_live;
use fenced_jobs::ops::reconcile::{ReconcileReport, expire_found, reconcile};
use fenced_jobs::ops::results::sweep_orphans;
use fenced_jobs::provider::AnyProvider;
use fenced_jobs::queue::SqsTriggers;
use fenced_jobs::queue::reader::SqsReader;
use lambda_runtime::{Diagnostic, LambdaEvent, service_fn};
use tracing::Instrument;

// One thread: Lambda runs one invocation at a time per execution environment, with a fraction
// of a vCPU at small memory sizes, and a multi-thread runtime spends more CPU per AWS request
// (BENCHMARKS.md, "Runtime flavour") for no gain. The heartbeat and the records share the thread
// as tasks; nothing here blocks it.
#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), lambda_runtime::Error> {
    fenced_jobs::logs::init();

    let (table, queue_url, settings) =
        match fenced_jobs::config::reconciler_from_lookup(|name| std::env::var(name).ok()) {
            Ok(config) => config,
            Err(e) => {
                fenced_jobs::logs::report_init_error("ConfigError", &e.to_string()).await;
                return Err(e.into());
            }
        };
    let sdk = fenced_jobs::config::SdkTimeouts::from_lookup(|name| std::env::var(name).ok())?;
    let aws = sdk.apply(&aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await);
    let ledger = DynamoLedger::new(aws_sdk_dynamodb::Client::new(&aws), table);
    // Urgent jobs' triggers go to their own queue; both queues' depth makes today's forecast.
    let urgent_url = std::env::var("URGENT_QUEUE_URL").ok();
    let queues = Queues {
        sqs: aws_sdk_sqs::Client::new(&aws),
        urls: [Some(queue_url.clone()), urgent_url.clone()],
    };
    let sender = SqsTriggers::new(queues.sqs.clone(), queue_url.clone()).with_urgent(urgent_url);
    let sweep = fenced_jobs::config::dlq_sweep_from_lookup(|name| std::env::var(name).ok())?.map(
        |(dlq_url, producers)| DlqSweep {
            // A long poll: a short one may miss a letter of a small DLQ.
            reader: SqsReader::new(queues.sqs.clone()).waiting(1),
            dlq_url,
            queue_url,
            producers,
        },
    );
    // The provider, to cancel the background calls of jobs it expires.
    let provider = fenced_jobs::config::provider_from_lookup(|name| std::env::var(name).ok())?;
    let provider = AnyProvider::from_config(&provider, &aws).await?;
    let target = MetricsTarget::from_env();
    // With a results bucket, answers no item references are removed.
    let blobs = std::env::var("RESULTS_BUCKET")
        .ok()
        .filter(|b| !b.is_empty())
        .map(|bucket| S3Blobs::new(s3_client(&aws), Some(bucket)));

    lambda_runtime::run(service_fn(|event: LambdaEvent<serde_json::Value>| {
        let span = fenced_jobs::telemetry::invocation_span(
            &event.context.request_id,
            event.context.xray_trace_id.as_deref(),
            fenced_jobs::ops::metrics::cold_start(&target),
        );
        // Boxed: the run's future is deep, and one allocation per run is nothing.
        let run = Box::pin(
            run_once(
                &ledger,
                (&sender, &queues, sweep.as_ref()),
                &provider,
                &settings,
                &target,
                blobs.as_ref(),
            )
            .instrument(span),
        );
        let deadline = i64::try_from(event.context.deadline).ok();
        async move {
            let result = run.await;
            fenced_jobs::telemetry::flush_before(deadline, fenced_jobs::telemetry::FLUSH_MARGIN_MS)
                .await;
            result
        }
    }))
    .await
}

/// The queues whose depth makes today's spend forecast.
struct Queues {
    sqs: aws_sdk_sqs::Client,
    urls: [Option<String>; 2],
}

/// The DLQ whose live jobs' letters go back to the work queue, and who may have sent them.
struct DlqSweep {
    reader: SqsReader,
    dlq_url: String,
    queue_url: String,
    producers: Producers,
}

/// The most dead letters one run reads (a GetItem each, ten to a receive).
const SWEEP_MAX: usize = 1_000;

/// One run: reconcile, sweep the DLQ and orphans, today's spend forecast, one metric document.
async fn run_once(
    ledger: &DynamoLedger,
    (sender, queues, sweep): (&SqsTriggers, &Queues, Option<&DlqSweep>),
    provider: &AnyProvider,
    settings: &fenced_jobs::ops::reconcile::ReconcileSettings,
    target: &MetricsTarget,
    blobs: Option<&S3Blobs>,
) -> Result<serde_json::Value, Diagnostic> {
    let now = SystemClock.now_ms();
    let mut report: ReconcileReport = reconcile(ledger, sender, provider, now, settings)
        .await
        .map_err(|e| Diagnostic {
            error_type: "LedgerError".to_owned(),
            error_message: e.to_string(),
        })?;
    if let Some(sweep) = sweep {
        sweep_dlq(
            ledger,
            sweep,
            provider,
            (now, settings.skew_ms),
            &mut report,
        )
        .await;
    }
    if let Some(blobs) = blobs {
        let since = now - settings.orphan_window_ms;
        let limits = (settings.max_jobs, settings.inline_max_bytes);
        match sweep_orphans(ledger, blobs, since, now, limits).await {
            Ok(removed) => report.orphans_removed = removed,
            Err(e) => {
                tracing::warn!(error = %e, "the orphan sweep failed; it runs again next time");
                report.errors += 1;
            }
        }
    }
    report.spend_forecast_percent = forecast(ledger, queues, now).await;
    tracing::info!(
        expired = report.expired,
        expire_refused = report.expire_refused,
        examined = report.examined,
        walks_cut = report.walks_cut,
        resent = report.resent,
        send_failed = report.send_failed,
        redriven = report.redriven,
        dead_letters_left = report.dead_letters_left,
        unknown = report.unknown,
        errors = report.errors,
        orphans_removed = report.orphans_removed,
        "reconciled"
    );
    println!(
        "{}",
        metrics::reconciliation(target, SystemClock.now_ms(), &report)
    );
    Ok(serde_json::json!(report))
}

/// Sends live jobs' dead letters back to the work queue, and expires those past their
/// deadline.
async fn sweep_dlq(
    ledger: &DynamoLedger,
    sweep: &DlqSweep,
    provider: &AnyProvider,
    (now, skew_ms): (i64, i64),
    report: &mut ReconcileReport,
) {
    let urls = (sweep.dlq_url.as_str(), sweep.queue_url.as_str());
    let limits = (SWEEP_MAX, now - skew_ms);
    let swept = redrive_live(ledger, &sweep.producers, &sweep.reader, urls, limits).await;
    report.redriven = swept.moved;
    report.dead_letters_left = swept.left;
    report.errors += swept.failed;
    report.dead_letter_age_s = swept
        .oldest_left
        .map(|at| u64::try_from((now - at) / 1_000).unwrap_or(0));
    expire_found(ledger, provider, &swept.overdue, (now, skew_ms), report).await;
}

/// Today's spend forecast in percent of the daily limit (`None`: no limit, nothing charged
/// yet, or a read that failed, which is said).
async fn forecast(ledger: &DynamoLedger, queues: &Queues, now: i64) -> Option<u64> {
    let queued = fenced_jobs::queue::sqs::queued(&queues.sqs, &queues.urls, |_| {
        tracing::warn!("a queue's depth could not be read; counted as empty")
    })
    .await;
    fenced_jobs::ops::spend::today_percent(ledger, queued, now)
        .await
        .map_err(|e| tracing::warn!(error = %e, "today's spend could not be read"))
        .ok()
        .flatten()
}
