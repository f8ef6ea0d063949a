//! The Lambda function: an SQS event source mapping with `ReportBatchItemFailures`.
//!
//! Reads its configuration once, builds the AWS clients once, and lends them to every
//! invocation.

use std::sync::Arc;

use fenced_jobs::blobs::s3::S3Blobs;
use fenced_jobs::clock::{Clock, SystemClock};
use fenced_jobs::config::{Config, s3_client};
use fenced_jobs::job::contract::Contracts;
use fenced_jobs::ledger::dynamodb::DynamoLedger;
use fenced_jobs::ops::metrics;
use fenced_jobs::provider::{AnyProvider, SetupError};
use fenced_jobs::queue::{SqsDeadLetters, SqsVisibility};
use fenced_jobs::worker::handler::{BatchHandler, event_from_json};
use fenced_jobs::worker::pacing::Pacer;
use fenced_jobs::worker::processor::{Invocation, Processor};
use lambda_runtime::{Diagnostic, LambdaEvent, service_fn};
use tracing::Instrument;

// One thread: Lambda runs one invocation at a time per execution environment, with a fraction
// of a vCPU at small memory sizes, and a multi-thread runtime spends more CPU per AWS request
// (BENCHMARKS.md, "Runtime flavour") for no gain. The heartbeat and the records share the thread
// as tasks; nothing here blocks it.
#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), lambda_runtime::Error> {
    fenced_jobs::logs::init();

    let (config, contracts) = configured().await?;
    let aws = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
    // DynamoDB and SQS calls are bounded; the provider keeps its own bounds.
    let bounded = config.sdk.apply(&aws);
    let blobs = S3Blobs::new(s3_client(&bounded), config.results_bucket.clone());
    let ledger = DynamoLedger::new(aws_sdk_dynamodb::Client::new(&bounded), &config.jobs_table);
    let dlq_url = config.dlq_url.clone();
    let processor = paced(
        with_providers(ledger.clone(), &config, &aws).await?,
        &ledger,
        &config,
    )
    .with_blobs(Arc::new(blobs))
    .with_contracts(contracts);
    name_unpriced(&processor);
    name_loose_contracts(&processor);
    let sqs = aws_sdk_sqs::Client::new(&bounded);
    let mut handler = BatchHandler::new(processor, SqsVisibility::new(sqs.clone()));
    if let Some(dlq_url) = dlq_url {
        handler = handler.with_dead_letters(Arc::new(SqsDeadLetters::new(sqs, dlq_url)));
    }
    let handler = Arc::new(handler);

    let target = Arc::new(metrics::MetricsTarget::from_env());
    let margin_ms = config.settings.deadline_margin_ms;
    lambda_runtime::run(service_fn(move |event: LambdaEvent<serde_json::Value>| {
        let handler = Arc::clone(&handler);
        let target = Arc::clone(&target);
        async move {
            // A deadline hours in the past is not a deadline (some local runtime emulators send
            // one): treat it as unknown rather than refusing all work.
            let now = SystemClock.now_ms();
            let deadline = i64::try_from(event.context.deadline)
                .ok()
                .filter(|d| *d > now - 3_600_000);
            if deadline.is_none() {
                warn_no_deadline(event.context.deadline);
            }
            let invocation = Invocation {
                id: event.context.request_id.clone(),
                deadline,
            };
            tracing::debug!(
                records = event
                    .payload
                    .get("Records")
                    .and_then(|r| r.as_array())
                    .map(Vec::len),
                remaining_ms = invocation.deadline.map(|d| d - now),
                "invocation"
            );
            // Boxed: the handler's future is deep, and one allocation per invocation is nothing.
            // Read leniently: one malformed record is classified alone; an event without
            // Records fails the invocation, so nothing is acknowledged.
            let payload = event_from_json(&event.payload).map_err(|e| Diagnostic {
                error_type: "NoRecords".to_owned(),
                error_message: e.to_string(),
            })?;
            // Every line logged in this invocation carries its request id and trace.
            let span = fenced_jobs::telemetry::invocation_span(
                &invocation.id,
                event.context.xray_trace_id.as_deref(),
                metrics::cold_start(&target),
            );
            let report =
                Box::pin(handler.handle_batch(&payload, &invocation).instrument(span)).await;
            print_metrics(&target, &report);
            // Within what is left before the margin: a stalled collector costs spans only.
            fenced_jobs::telemetry::flush_before(invocation.deadline, margin_ms).await;
            report.into_response().map_err(|e| Diagnostic {
                error_type: "UnnamedFailure".to_owned(),
                error_message: e.to_string(),
            })
        }
    }))
    .await
}

/// The worker's configuration and its output contracts, compiled once per execution
/// environment; either failing stops start-up with the reason, reported to the runtime.
async fn configured() -> Result<(Config, Arc<Contracts>), lambda_runtime::Error> {
    let loaded = Config::from_env().and_then(|config| {
        let contracts = config.contracts.load()?;
        Ok((config, contracts))
    });
    match loaded {
        Ok((config, contracts)) => {
            tracing::info!(
                contracts = contracts.len(),
                strict = contracts.strict(),
                "output contracts loaded"
            );
            Ok((config, Arc::new(contracts)))
        }
        Err(e) => {
            fenced_jobs::logs::report_init_error("ConfigError", &e.to_string()).await;
            Err(e.into())
        }
    }
}

/// Names, at start-up, the models this deployment may call that the price table lacks: under
/// any spend limit (a job's `max_cost`, `DAILY_SPEND_LIMIT`, `TENANT_DAILY_SPEND_LIMIT`) none
/// of their calls is made, unless `ALLOW_UNPRICED_MODELS=true` lets them run counted at 0.
fn name_unpriced(processor: &Processor<DynamoLedger, AnyProvider, SystemClock>) {
    let (unpriced, open) = processor.unpriced_models();
    let allowed = processor.settings().allow_unpriced_models;
    if !unpriced.is_empty() {
        if allowed {
            tracing::warn!(models = ?unpriced, "models without a price run uncounted by every spend limit (ALLOW_UNPRICED_MODELS=true)");
        } else {
            tracing::warn!(models = ?unpriced, "models without a price: no call of theirs is made under a spend limit (add them to PRICES_FILE, or ALLOW_UNPRICED_MODELS=true)");
        }
    }
    if open {
        tracing::info!(
            allow_unpriced = allowed,
            "jobs may name any model (ALLOWED_MODELS=*): whether one has a price is known only when a job names it"
        );
    }
}

/// Names, at start-up, each contract a configured provider's strict mode cannot take even in
/// its dialect: it is sent with `strict: false`, and its answers are judged here alone.
fn name_loose_contracts(processor: &Processor<DynamoLedger, AnyProvider, SystemClock>) {
    for (contract, provider, why) in processor.loose_contracts() {
        tracing::warn!(
            contract,
            provider,
            why,
            "the provider's strict mode cannot take this contract's schema: sent with strict false, its answers judged here alone"
        );
    }
}

/// Says once per execution environment that the runtime's deadline is not a time: cargo lambda's
/// runtime emulator sends 600000 (ten minutes, as a duration). The batch then runs with no
/// invocation deadline: calls are bounded by their leases and the jobs' deadlines only.
fn warn_no_deadline(deadline_ms: u64) {
    static WARNED: std::sync::Once = std::sync::Once::new();
    WARNED.call_once(|| {
        tracing::warn!(
            deadline_ms,
            "the runtime's invocation deadline is not a time in the last hour (a local runtime \
             emulator's, say): working without an invocation deadline (said once)"
        );
    });
}

/// One metric document per invocation, on its own stdout line (EMF), and one per model its
/// calls ran with what they used and cost.
fn print_metrics(target: &metrics::MetricsTarget, report: &fenced_jobs::report::BatchReport) {
    let now = SystemClock.now_ms();
    println!("{}", metrics::invocation(target, now, report));
    let by_provider = metrics::by_provider(target, now, report);
    for doc in by_provider
        .iter()
        .chain(&metrics::usage_by_model(target, now, report))
    {
        println!("{doc}");
    }
}

/// The processor over `ledger` with the providers `config` lists, in order: the first, then
/// those that take a job after a definite refusal of the one before.
/// The processor's pacers and day budgets, all items of the ledger table: the provider's
/// shared schedule, urgent jobs' share of it, each tenant's cap, and the days' spend (asked only under
/// `DAILY_SPEND_LIMIT` or `TENANT_DAILY_SPEND_LIMIT`).
fn paced(
    processor: Processor<DynamoLedger, AnyProvider, SystemClock>,
    ledger: &DynamoLedger,
    config: &Config,
) -> Processor<DynamoLedger, AnyProvider, SystemClock> {
    let schedule = Arc::new(ledger.clone());
    let mut processor = processor
        .with_pacer(Pacer::new(config.settings.pacing(), Some(schedule.clone())))
        .with_tenant_schedule(schedule.clone())
        .with_spend_budget(Arc::new(ledger.clone()))
        .with_shared_times(Arc::new(ledger.clone()));
    if let Some(urgent) = config.settings.urgent_pacing() {
        processor = processor.with_urgent_pacer(Pacer::new(urgent, Some(schedule)));
    }
    processor
}

async fn with_providers(
    ledger: DynamoLedger,
    config: &Config,
    aws: &aws_config::SdkConfig,
) -> Result<Processor<DynamoLedger, AnyProvider, SystemClock>, SetupError> {
    let first = AnyProvider::from_config(&config.provider, aws).await?;
    let mut processor = Processor::new(ledger, first, SystemClock, config.settings.clone())
        .with_models(config.models.clone());
    for (fallback, models) in &config.fallbacks {
        let provider = AnyProvider::from_config(fallback, aws).await?;
        processor = processor.with_fallback(provider, models.clone());
    }
    Ok(processor)
}
