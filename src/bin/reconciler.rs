//! The reconciler as a scheduled Lambda function: each run re-sends lost triggers, expires jobs
//! past their deadline (cancelling a background call they left running) and counts `unknown`
//! jobs, then prints one metric document (EMF).

use fenced_jobs::clock::{Clock, SystemClock};
use fenced_jobs::ledger::dynamodb::DynamoLedger;
use fenced_jobs::ops::metrics::{self, MetricsTarget};
use fenced_jobs::ops::reconcile::{ReconcileReport, reconcile};
use fenced_jobs::provider::AnyProvider;
use fenced_jobs::queue::SqsTriggers;
use lambda_runtime::{Diagnostic, LambdaEvent, service_fn};

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    fenced_jobs::logs::init();

    let (table, queue_url, settings) =
        fenced_jobs::config::reconciler_from_lookup(|name| std::env::var(name).ok())?;
    let sdk = fenced_jobs::config::SdkTimeouts::from_lookup(|name| std::env::var(name).ok())?;
    let aws = sdk.apply(&aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await);
    let ledger = DynamoLedger::new(aws_sdk_dynamodb::Client::new(&aws), table);
    let sender = SqsTriggers::new(aws_sdk_sqs::Client::new(&aws), queue_url);
    // The provider, to cancel the background calls of jobs it expires.
    let provider = fenced_jobs::config::provider_from_lookup(|name| std::env::var(name).ok())?;
    let provider = AnyProvider::from_config(&provider, &aws).await?;
    let target = MetricsTarget::from_env();

    lambda_runtime::run(service_fn(|_: LambdaEvent<serde_json::Value>| async {
        let now = SystemClock.now_ms();
        let report: ReconcileReport = reconcile(&ledger, &sender, &provider, now, &settings)
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
