//! The webhook function, behind a Lambda function URL: OpenAI's webhooks say when a batch
//! ended, and each of its jobs' triggers is sent by id (a completed batch's to the urgent queue,
//! `URGENT_QUEUE_URL`, ahead of any backlog), so its answer is collected in seconds. Needs `JOBS_TABLE`, `QUEUE_URL`
//! and the endpoint's signing secret (`OPENAI_WEBHOOK_SECRET_ID`, a Secrets Manager secret).

use fenced_jobs::clock::{Clock, SystemClock};
use fenced_jobs::ledger::dynamodb::DynamoLedger;
use fenced_jobs::ops::webhook::{UrlRequest, handle, read_secret};
use fenced_jobs::queue::SqsTriggers;
use lambda_runtime::{LambdaEvent, service_fn};
use tracing::Instrument;

// One thread: one request at a time per execution environment, and nothing here blocks it.
#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), lambda_runtime::Error> {
    fenced_jobs::logs::init();
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    let sdk = fenced_jobs::config::SdkTimeouts::from_lookup(env)?;
    let aws = sdk.apply(&aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await);
    let set_up = async {
        let table = env("JOBS_TABLE").ok_or("JOBS_TABLE is not set")?;
        let queue = env("QUEUE_URL").ok_or("QUEUE_URL is not set")?;
        let secret = read_secret(&env, &aws).await?;
        Ok::<_, String>((table, queue, secret))
    };
    let (table, queue, secret) = match set_up.await {
        Ok(set) => set,
        Err(e) => {
            fenced_jobs::logs::report_init_error("ConfigError", &e).await;
            return Err(e.into());
        }
    };
    let ledger = DynamoLedger::new(aws_sdk_dynamodb::Client::new(&aws), table);
    let sender = SqsTriggers::new(aws_sdk_sqs::Client::new(&aws), queue)
        .with_urgent(env("URGENT_QUEUE_URL"));
    lambda_runtime::run(service_fn(|event: LambdaEvent<UrlRequest>| {
        let span = fenced_jobs::telemetry::invocation_span(
            &event.context.request_id,
            event.context.xray_trace_id.as_deref(),
            false,
        );
        let (ledger, sender, secret) = (&ledger, &sender, &secret);
        async move {
            let now = SystemClock.now_ms();
            let answer = handle(&event.payload, secret, ledger, sender, now)
                .instrument(span)
                .await;
            // What was done and why, never the body or its signature.
            match &answer {
                fenced_jobs::ops::webhook::Answer::Failed(why) => {
                    tracing::warn!(why = %why, "a webhook was not acted on; its sender retries")
                }
                other => tracing::info!(answer = ?other, "webhook"),
            }
            let deadline = i64::try_from(event.context.deadline).ok();
            fenced_jobs::telemetry::flush_before(deadline, fenced_jobs::telemetry::FLUSH_MARGIN_MS)
                .await;
            Ok::<_, lambda_runtime::Error>(answer.response())
        }
    }))
    .await
}
