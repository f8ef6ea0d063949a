//! The reconciler as a scheduled Lambda function: each run re-sends lost triggers, expires jobs
//! past their deadline and counts `unknown` jobs, then prints one metric document (EMF).

use fenced_jobs::clock::{Clock, SystemClock};
use fenced_jobs::ledger::dynamodb::DynamoLedger;
use fenced_jobs::metrics::{self, MetricsTarget};
use fenced_jobs::reconcile::{ReconcileReport, ReconcileSettings, reconcile};
use lambda_runtime::{Diagnostic, LambdaEvent, service_fn};

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    fenced_jobs::logs::init();

    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let table = var("JOBS_TABLE").ok_or("JOBS_TABLE must be set")?;
    let queue_url = var("QUEUE_URL").ok_or("QUEUE_URL must be set")?;
    let seconds = |name: &str, default: i64| -> Result<i64, String> {
        match var(name) {
            None => Ok(default),
            Some(v) => v
                .parse::<i64>()
                .ok()
                .filter(|s| *s > 0)
                .ok_or(format!("{name} must be a positive integer")),
        }
    };
    let d = ReconcileSettings::default();
    let settings = ReconcileSettings {
        ready_after_ms: seconds("RECONCILE_READY_AFTER_SECONDS", d.ready_after_ms / 1000)? * 1000,
        retry_after_ms: seconds("RECONCILE_RETRY_AFTER_SECONDS", d.retry_after_ms / 1000)? * 1000,
        enqueue_stale_after_ms: seconds(
            "RECONCILE_ENQUEUE_STALE_SECONDS",
            d.enqueue_stale_after_ms / 1000,
        )? * 1000,
        max_jobs: seconds("RECONCILE_MAX_JOBS", d.max_jobs as i64)? as usize,
    };
    let aws = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
    let ledger = DynamoLedger::new(aws_sdk_dynamodb::Client::new(&aws), table);
    let sqs = aws_sdk_sqs::Client::new(&aws);
    let target = MetricsTarget::from_env();

    lambda_runtime::run(service_fn(|_: LambdaEvent<serde_json::Value>| async {
        let now = SystemClock.now_ms();
        let report: ReconcileReport = reconcile(&ledger, &sqs, &queue_url, now, &settings)
            .await
            .map_err(|e| Diagnostic {
                error_type: "LedgerError".to_owned(),
                error_message: e.to_string(),
            })?;
        tracing::info!(
            expired = report.expired,
            expire_refused = report.expire_refused,
            examined = report.examined,
            resent = report.resent,
            send_failed = report.send_failed,
            unknown = report.unknown,
            errors = report.errors,
            "reconciled"
        );
        println!(
            "{}",
            metrics::reconciliation(&target, SystemClock.now_ms(), &report)
        );
        Ok::<_, Diagnostic>(serde_json::json!(report))
    }))
    .await
}
