//! Each subcommand carried out: the arms of the command line, with what they share.

use fenced_jobs::blobs::s3::S3Blobs;
use fenced_jobs::clock::{Clock, SystemClock};
use fenced_jobs::ledger::OperatorAction;
use fenced_jobs::ledger::dynamodb::DynamoLedger;
use fenced_jobs::ops::operator::{self, OperatorError};
use fenced_jobs::ops::producer::Intake;
use fenced_jobs::ops::results::{self, ResultError};
use fenced_jobs::queue::SqsTriggers;

use crate::commands::{
    self, DlqSource, caller, dlq, export, list, print, reconcile, replay, submit, write_out,
};
use crate::output::Out;
use crate::watch::watch;
use crate::{AWS_ERROR, Command, EventsCommand, INTEGRITY, REFUSED, USAGE, usage};

/// What every subcommand may use: the AWS configuration, the ledger, the bucket and the global
/// options.
pub(crate) struct Ctx {
    pub(crate) config: aws_config::SdkConfig,
    pub(crate) ledger: DynamoLedger,
    pub(crate) blobs: S3Blobs,
    pub(crate) out: Out,
    pub(crate) urgent_queue_url: Option<String>,
    pub(crate) inline_max_bytes: usize,
}

impl Ctx {
    /// Triggers sent to `queue_url`, urgent jobs' to the urgent queue when there is one.
    fn triggers(&self, queue_url: String) -> SqsTriggers {
        SqsTriggers::new(aws_sdk_sqs::Client::new(&self.config), queue_url)
            .with_urgent(self.urgent_queue_url.clone())
    }
}

/// Carries out `command`.
pub(crate) async fn command(ctx: &Ctx, command: Command) -> Result<(), OperatorError> {
    let (ledger, out) = (&ctx.ledger, &ctx.out);
    match command {
        Command::Result {
            job_id,
            out_file,
            force,
        } => result(ctx, &job_id, out_file.as_deref(), force).await,
        Command::Export {
            state,
            since,
            out_file,
            force,
        } => export(ledger, state, since, out_file, force).await,
        Command::Show { job_id, result } => operator::show(ledger, &job_id)
            .await
            .map(|record| print(&record, out, result)),
        Command::List { state, limit } => list(ledger, &state, limit, out).await,
        Command::Spend {
            day,
            month,
            queue_url,
        } => spend(ctx, (day, month), queue_url).await,
        Command::Watch {
            job_id,
            interval,
            timeout,
        } => watch(ledger, &job_id, interval, timeout, out).await,
        Command::Completions { .. } => Ok(()),
        Command::Events {
            command,
            event_bus_name,
            event_topic_arn,
            event_queue_url,
        } => {
            let sinks = [event_bus_name, event_topic_arn, event_queue_url];
            events(ctx, command, sinks).await
        }
        Command::Dlq {
            command,
            dlq_url,
            max,
            producers,
            trusted_senders,
        } => dead_letters(ctx, command, &dlq_url, max, [producers, trusted_senders]).await,
        Command::AuthorizeRetry {
            job_id,
            reason,
            operator: by,
            queue_url,
        } => authorize_retry(ctx, &job_id, &reason, &by, queue_url).await,
        Command::Submit { file, queue_url } => submit_file(ctx, file, queue_url).await,
        Command::Reconcile {
            queue_url,
            ready_after_seconds,
            retry_after_seconds,
        } => {
            let ready_and_retry_ms = [ready_after_seconds * 1000, retry_after_seconds * 1000];
            reconcile_once(ctx, queue_url, ready_and_retry_ms).await
        }
        Command::Cancel {
            job_ids,
            file,
            tenant,
            reason,
            operator: by,
            yes,
        } => {
            let ids = cancel_ids(ctx, commands::job_ids(job_ids, file), tenant, yes).await;
            let caller = caller(&ctx.config).await;
            commands::cancel(ledger, &ids, &by, &caller, &reason, out).await
        }
        Command::Fail {
            job_id,
            reason,
            operator: by,
            yes,
        } => fail(ctx, &job_id, &by, &reason, yes).await,
    }
}

/// `dlq inspect` or `dlq redrive` on the queue at `url`, its messages judged by the producers
/// named (`--producers`, `--trusted-senders`).
async fn dead_letters(
    ctx: &Ctx,
    command: crate::DlqCommand,
    url: &str,
    max: usize,
    [producers, trusted_senders]: [String; 2],
) -> Result<(), OperatorError> {
    let producers = fenced_jobs::job::scope::Producers::parse(&producers, &trusted_senders)
        .unwrap_or_else(|e| usage(&format!("--producers, --trusted-senders: {e}")));
    let source = DlqSource {
        url,
        max,
        producers: &producers,
    };
    let sqs = aws_sdk_sqs::Client::new(&ctx.config);
    dlq(&ctx.ledger, &ctx.blobs, &sqs, source, command, &ctx.out).await
}

/// `jobctl spend`: a day's or a month's items, and today's forecast from the work queue and
/// the urgent one.
async fn spend(
    ctx: &Ctx,
    when: (Option<String>, Option<String>),
    queue_url: Option<String>,
) -> Result<(), OperatorError> {
    let queues = [queue_url, ctx.urgent_queue_url.clone()];
    let sqs = aws_sdk_sqs::Client::new(&ctx.config);
    commands::spend(&ctx.ledger, when, (&sqs, queues), &ctx.out).await
}

/// One pass of the reconciler, its triggers sent to `queue_url`.
async fn reconcile_once(
    ctx: &Ctx,
    queue_url: String,
    [ready_after_ms, retry_after_ms]: [i64; 2],
) -> Result<(), OperatorError> {
    let settings = fenced_jobs::ops::reconcile::ReconcileSettings {
        ready_after_ms,
        retry_after_ms,
        ..Default::default()
    };
    reconcile(
        &ctx.ledger,
        &ctx.config,
        ctx.triggers(queue_url),
        &settings,
        &ctx.out,
    )
    .await
}

/// `submit`: each job of `file` into the ledger, then its trigger to `queue_url`.
async fn submit_file(
    ctx: &Ctx,
    file: Option<std::path::PathBuf>,
    queue_url: String,
) -> Result<(), OperatorError> {
    // The worker's own rules, from its variables in this environment.
    let rules = fenced_jobs::config::producer_rules(|name| std::env::var(name).ok())
        .unwrap_or_else(|e| usage(&e.to_string()));
    let intake = Intake {
        blobs: Some(&ctx.blobs),
        inline_max_bytes: ctx.inline_max_bytes,
        rules,
        ..Intake::default()
    };
    submit(
        &ctx.ledger,
        &ctx.triggers(queue_url),
        file,
        &intake,
        &ctx.out,
    )
    .await
}

/// `fail`: the job failed for good, once confirmed.
async fn fail(
    ctx: &Ctx,
    job_id: &str,
    by: &str,
    reason: &str,
    yes: bool,
) -> Result<(), OperatorError> {
    if !yes && !crate::confirmed(&format!("fail job {job_id} for good")) {
        usage("not confirmed: fail needs --yes when not run on a terminal");
    }
    let record = decide(ctx, job_id, OperatorAction::Fail, by, reason).await?;
    print(&record, &ctx.out, false);
    Ok(())
}

/// `result`: the accepted answer, to standard output or a file; ends the process on a refusal.
async fn result(
    ctx: &Ctx,
    job_id: &str,
    output: Option<&std::path::Path>,
    force: bool,
) -> Result<(), OperatorError> {
    match results::result(&ctx.ledger, Some(&ctx.blobs), job_id).await {
        Ok(bytes) => write_out(output, force, &bytes),
        Err(e) => {
            eprintln!("jobctl: {e}");
            std::process::exit(match e {
                ResultError::NotFound(_) | ResultError::NoAnswer { .. } => REFUSED,
                ResultError::NoStore(_) => USAGE,
                ResultError::Store(fenced_jobs::blobs::BlobError::Mismatch) => INTEGRITY,
                _ => AWS_ERROR,
            });
        }
    }
}

/// `events replay`, to the sink of the bus, topic or queue named (in that order).
async fn events(
    ctx: &Ctx,
    command: EventsCommand,
    [bus, topic, queue]: [Option<String>; 3],
) -> Result<(), OperatorError> {
    let lookup = |name: &str| match name {
        "EVENT_BUS_NAME" => bus.clone(),
        "EVENT_TOPIC_ARN" => topic.clone(),
        "EVENT_QUEUE_URL" => queue.clone(),
        _ => None,
    };
    let sink = fenced_jobs::config::sink_from_lookup(&ctx.config, lookup)
        .unwrap_or_else(|e| usage(&e.to_string()));
    let sqs = aws_sdk_sqs::Client::new(&ctx.config);
    let EventsCommand::Replay {
        queue_url,
        job,
        max,
        dry_run,
    } = command;
    replay(
        &ctx.ledger,
        &sink,
        &sqs,
        queue_url,
        &job,
        max,
        dry_run,
        &ctx.out,
    )
    .await
}

/// The operator's decision `action` on `job_id`, recorded with who asked (their AWS identity).
async fn decide(
    ctx: &Ctx,
    job_id: &str,
    action: OperatorAction,
    by: &str,
    reason: &str,
) -> Result<fenced_jobs::job::JobItem, OperatorError> {
    let caller = caller(&ctx.config).await;
    let now = SystemClock.now_ms();
    operator::decide(&ctx.ledger, job_id, action, by, Some(&caller), reason, now).await
}

/// `authorize-retry`: the decision, then the trigger that runs the job again.
async fn authorize_retry(
    ctx: &Ctx,
    job_id: &str,
    reason: &str,
    by: &str,
    queue_url: String,
) -> Result<(), OperatorError> {
    let record = decide(ctx, job_id, OperatorAction::AuthorizeRetry, by, reason).await?;
    operator::send_trigger(&ctx.triggers(queue_url), &record).await?;
    print(&record, &ctx.out, false);
    Ok(())
}

/// The jobs `cancel` acts on: `ids`, and every live job of `tenant`; ends the process when
/// there is none, or when the cancel is not confirmed.
async fn cancel_ids(
    ctx: &Ctx,
    mut ids: Vec<String>,
    tenant: Option<String>,
    yes: bool,
) -> Vec<String> {
    if let Some(tenant) = &tenant {
        let now = fenced_jobs::clock::Clock::now_ms(&fenced_jobs::clock::SystemClock);
        let listing = operator::tenant_jobs(&ctx.ledger, tenant, now);
        match crate::progress::shown("listing the account's live jobs", listing).await {
            Ok(found) => ids.extend(found),
            Err(e) => {
                eprintln!("jobctl: {e}");
                std::process::exit(AWS_ERROR);
            }
        }
    }
    if ids.is_empty() && tenant.is_some() {
        println!("no live job of that tenant");
        std::process::exit(0);
    }
    if ids.is_empty() {
        usage("no job to cancel: give job ids, --file or --tenant");
    }
    if !yes && !crate::confirmed(&format!("cancel {} job(s)", ids.len())) {
        usage("not confirmed: cancel needs --yes when not run on a terminal");
    }
    ids
}
