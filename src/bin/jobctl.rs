//! `jobctl`: the operator's command line over the job ledger.

use clap::{Parser, Subcommand};
use fenced_jobs::blobs::s3::S3Blobs;
use fenced_jobs::clock::{Clock, SystemClock};
use fenced_jobs::config::s3_client;
use fenced_jobs::job::JobState;
use fenced_jobs::job::message::format_rfc3339_ms;
use fenced_jobs::ledger::dynamodb::DynamoLedger;
use fenced_jobs::ledger::{LedgerIndex, OperatorAction};
use fenced_jobs::ops::operator::{self, OperatorError};
use fenced_jobs::ops::producer::Intake;
use fenced_jobs::ops::results::{self, ResultError};
use fenced_jobs::queue::SqsTriggers;

/// Inspect jobs and decide about the ones whose last attempt has an unknown outcome.
#[derive(Parser)]
#[command(version)]
struct Cli {
    /// The ledger table.
    #[arg(long, env = "JOBS_TABLE")]
    table: String,
    /// The results bucket: large answers are read from it, large inputs written to it.
    #[arg(long, env = "RESULTS_BUCKET", global = true)]
    results_bucket: Option<String>,
    /// Answers and inputs above this many bytes are kept in the results bucket.
    #[arg(long, env = "INLINE_MAX_BYTES", global = true, default_value_t = fenced_jobs::job::DEFAULT_INLINE_MAX_BYTES)]
    inline_max_bytes: usize,
    /// Print JSON instead of text.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Show a job: state, epoch, lease, deadline, attempts, recoveries and decisions.
    Show {
        /// The job id.
        job_id: String,
        /// Include the accepted answer.
        #[arg(long)]
        result: bool,
    },
    /// List the jobs in one state, oldest update first (a query of the sparse attention index,
    /// not a scan; terminal states are not indexed).
    List {
        /// ready, running, unknown or retry_authorized.
        #[arg(long, default_value = "unknown")]
        state: String,
        /// At most this many.
        #[arg(long, default_value_t = 50)]
        limit: usize,
    },
    /// Authorise another attempt of an `unknown` job (accepting a possible duplicate call),
    /// then send it a new trigger message.
    AuthorizeRetry {
        /// The job id.
        job_id: String,
        /// Why (recorded on the job).
        #[arg(long)]
        reason: String,
        /// Who decides (recorded on the job).
        #[arg(long, env = "USER", default_value = "operator")]
        operator: String,
        /// The queue to send the trigger to.
        #[arg(long, env = "QUEUE_URL")]
        queue_url: String,
    },
    /// Dead-letter queue: each message paired with its job's ledger state.
    Dlq {
        #[command(subcommand)]
        command: DlqCommand,
        /// The dead-letter queue.
        #[arg(long, env = "DLQ_URL")]
        dlq_url: String,
        /// At most this many messages.
        #[arg(long, default_value_t = 100)]
        max: usize,
    },
    /// Submit jobs (one JSON object a line, from FILE or stdin): each is written to the ledger
    /// as `ready` unless it is there, then its trigger is sent.
    Submit {
        /// The JSONL file; `-` or nothing for stdin.
        file: Option<std::path::PathBuf>,
        /// The work queue.
        #[arg(long, env = "QUEUE_URL")]
        queue_url: String,
    },
    /// Print a job's accepted answer, from the ledger item or from the results bucket (checked
    /// against the size and SHA-256 its acceptance recorded).
    Result {
        /// The job id.
        job_id: String,
        /// Write it to FILE instead of standard output.
        #[arg(long)]
        output: Option<std::path::PathBuf>,
    },
    /// Write the jobs that finished since a time as JSON lines (job id, state, metadata, answer
    /// or its reference, or the error), read day by day from the finished index, not a scan.
    /// For a dump of the whole table use DynamoDB's export to S3.
    Export {
        /// succeeded, failed_terminal or expired (default: all three).
        #[arg(long)]
        state: Option<String>,
        /// RFC 3339 time (default: 24 hours ago).
        #[arg(long)]
        since: Option<String>,
        /// Write to FILE instead of standard output.
        #[arg(long)]
        output: Option<std::path::PathBuf>,
    },
    /// Re-send lost triggers, expire jobs past their deadline, count `unknown` jobs.
    Reconcile {
        /// The work queue.
        #[arg(long, env = "QUEUE_URL")]
        queue_url: String,
        /// Re-send `ready` jobs unchanged and unsent for this long.
        #[arg(long, default_value_t = 300)]
        ready_after_seconds: i64,
        /// Re-send `retry_authorized` jobs unchanged for this long.
        #[arg(long, default_value_t = 1200)]
        retry_after_seconds: i64,
    },
    /// Give an `unknown` job up: `failed_terminal`.
    Fail {
        /// The job id.
        job_id: String,
        /// Why (recorded on the job).
        #[arg(long)]
        reason: String,
        /// Who decides (recorded on the job).
        #[arg(long, env = "USER", default_value = "operator")]
        operator: String,
    },
}

#[derive(Subcommand)]
enum DlqCommand {
    /// Show what a redrive would do with each message (they stay in the DLQ).
    Inspect,
    /// Move the messages whose jobs are not terminal back to the work queue.
    Redrive {
        /// The work queue.
        #[arg(long, env = "QUEUE_URL")]
        queue_url: String,
    },
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let cli = Cli::parse();
    let config = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
    let ledger = DynamoLedger::new(aws_sdk_dynamodb::Client::new(&config), &cli.table);
    let blobs = S3Blobs::new(s3_client(&config), cli.results_bucket.clone());
    let result = match cli.command {
        Command::Result { job_id, output } => {
            match results::result(&ledger, Some(&blobs), &job_id).await {
                Ok(bytes) => write_out(output.as_deref(), &bytes),
                Err(e) => {
                    eprintln!("jobctl: {e}");
                    std::process::exit(match e {
                        ResultError::NotFound(_) | ResultError::NoAnswer { .. } => 1,
                        _ => 2,
                    });
                }
            }
        }
        Command::Export {
            state,
            since,
            output,
        } => export(&ledger, state, since, output).await,
        Command::Show { job_id, result } => operator::show(&ledger, &job_id)
            .await
            .map(|record| print(&record, cli.json, result)),
        Command::List { state, limit } => list(&ledger, &state, limit, cli.json).await,
        Command::Dlq {
            command,
            dlq_url,
            max,
        } => {
            let sqs = aws_sdk_sqs::Client::new(&config);
            dlq(&ledger, &sqs, &dlq_url, max, command, cli.json).await
        }
        Command::AuthorizeRetry {
            job_id,
            reason,
            operator: by,
            queue_url,
        } => {
            let now = SystemClock.now_ms();
            match operator::decide(
                &ledger,
                &job_id,
                OperatorAction::AuthorizeRetry,
                &by,
                &reason,
                now,
            )
            .await
            {
                Ok(record) => {
                    let sqs = aws_sdk_sqs::Client::new(&config);
                    operator::send_trigger(&SqsTriggers::new(sqs, queue_url), &record)
                        .await
                        .map(|()| print(&record, cli.json, false))
                }
                Err(e) => Err(e),
            }
        }
        Command::Submit { file, queue_url } => {
            let sqs = aws_sdk_sqs::Client::new(&config);
            let intake = Intake {
                blobs: Some(&blobs),
                inline_max_bytes: cli.inline_max_bytes,
                ..Intake::default()
            };
            let sender = SqsTriggers::new(sqs, queue_url);
            submit(&ledger, &sender, file, &intake, cli.json).await
        }
        Command::Reconcile {
            queue_url,
            ready_after_seconds,
            retry_after_seconds,
        } => {
            let sqs = aws_sdk_sqs::Client::new(&config);
            let settings = fenced_jobs::ops::reconcile::ReconcileSettings {
                ready_after_ms: ready_after_seconds * 1000,
                retry_after_ms: retry_after_seconds * 1000,
                ..Default::default()
            };
            reconcile(
                &ledger,
                &config,
                SqsTriggers::new(sqs, queue_url),
                &settings,
                cli.json,
            )
            .await
        }
        Command::Fail {
            job_id,
            reason,
            operator: by,
        } => {
            let now = SystemClock.now_ms();
            operator::decide(&ledger, &job_id, OperatorAction::Fail, &by, &reason, now)
                .await
                .map(|record| print(&record, cli.json, false))
        }
    };
    if let Err(e) = result {
        eprintln!("jobctl: {e}");
        std::process::exit(match e {
            OperatorError::NotFound(_)
            | OperatorError::NotUnknown { .. }
            | OperatorError::Changed(_) => 1,
            _ => 2,
        });
    }
}

async fn list(
    ledger: &DynamoLedger,
    state: &str,
    limit: usize,
    json: bool,
) -> Result<(), OperatorError> {
    let state: JobState = match state.parse() {
        Ok(s) if !JobState::is_terminal(s) => s,
        _ => {
            eprintln!("jobctl: --state takes ready, running, unknown or retry_authorized");
            std::process::exit(2);
        }
    };
    let jobs = ledger.list(state, limit).await?;
    if json {
        let rows: Vec<serde_json::Value> = jobs
            .iter()
            .map(|(id, at)| serde_json::json!({"job_id": id, "state": state.as_str(), "updated_at": format_rfc3339_ms(*at)}))
            .collect();
        println!("{}", serde_json::Value::Array(rows));
    } else {
        println!("{:<40} {:<17} updated", "job_id", "state");
        for (id, at) in &jobs {
            println!("{id:<40} {:<17} {}", state.as_str(), format_rfc3339_ms(*at));
        }
    }
    Ok(())
}

async fn dlq(
    ledger: &DynamoLedger,
    sqs: &aws_sdk_sqs::Client,
    dlq_url: &str,
    max: usize,
    command: DlqCommand,
    json: bool,
) -> Result<(), OperatorError> {
    // Held invisible for a minute: long enough to redrive, short enough to inspect again.
    let entries = operator::dlq_inspect(ledger, sqs, dlq_url, max, 60).await?;
    let moved = match command {
        DlqCommand::Inspect => None,
        DlqCommand::Redrive { queue_url } => {
            Some(operator::dlq_redrive(sqs, dlq_url, &queue_url, &entries).await?)
        }
    };
    if json {
        let rows: Vec<serde_json::Value> = entries
            .iter()
            .map(|e| serde_json::json!({"message_id": e.message_id, "job_id": e.job_id, "verdict": e.verdict.label()}))
            .collect();
        println!(
            "{}",
            serde_json::json!({"messages": rows, "redriven": moved})
        );
    } else {
        println!("{:<38} {:<32} verdict", "message_id", "job_id");
        for e in &entries {
            println!(
                "{:<38} {:<32} {}",
                e.message_id.as_deref().unwrap_or("-"),
                e.job_id.as_deref().unwrap_or("-"),
                e.verdict.label()
            );
        }
        if let Some(moved) = moved {
            println!("\nredriven: {moved} of {}", entries.len());
        }
    }
    Ok(())
}

async fn submit(
    ledger: &DynamoLedger,
    sender: &SqsTriggers,
    file: Option<std::path::PathBuf>,
    intake: &Intake<'_>,
    json: bool,
) -> Result<(), OperatorError> {
    use std::io::{BufRead, IsTerminal, Write};
    let reader: Box<dyn BufRead> = match file {
        Some(path) if path.as_os_str() != "-" => match std::fs::File::open(&path) {
            Ok(f) => Box::new(std::io::BufReader::new(f)),
            Err(e) => {
                eprintln!("jobctl: {}: {e}", path.display());
                std::process::exit(2);
            }
        },
        _ => Box::new(std::io::stdin().lock()),
    };
    let terminal = std::io::stderr().is_terminal();
    let report = fenced_jobs::ops::producer::submit(
        ledger,
        sender,
        reader.lines(),
        || SystemClock.now_ms(),
        intake,
        |r| {
            if terminal {
                eprint!(
                    "\r{} lines: {} created, {} present, {} sent",
                    r.lines, r.created, r.already_present, r.sent
                );
                let _ = std::io::stderr().flush();
            }
        },
    )
    .await;
    if terminal {
        eprintln!();
    }
    if json {
        println!("{}", serde_json::json!(report));
    } else {
        println!(
            "lines {}: created {}, already present {}, conflicts {}, invalid {}, ledger failed {}, sent {}, failed to send {}",
            report.lines,
            report.created,
            report.already_present,
            report.conflicts.len(),
            report.invalid.len(),
            report.ledger_failed.len(),
            report.sent,
            report.send_failed.len()
        );
        for (line, reason) in report.invalid.iter().take(20) {
            println!("  line {line}: invalid: {reason}");
        }
        for (line, job_id) in report.conflicts.iter().take(20) {
            println!("  line {line}: conflict: {job_id} is held with another input");
        }
        for (line, reason) in report.ledger_failed.iter().take(20) {
            println!("  line {line}: not written: {reason}");
        }
        for (job_id, reason) in report.send_failed.iter().take(20) {
            println!("  {job_id}: not sent ({reason}); the reconciler will send it");
        }
    }
    let clean = report.invalid.is_empty()
        && report.conflicts.is_empty()
        && report.ledger_failed.is_empty()
        && report.send_failed.is_empty();
    if !clean {
        std::process::exit(1);
    }
    Ok(())
}

fn print(record: &fenced_jobs::job::JobRecord, json: bool, with_result: bool) {
    if json {
        println!("{}", operator::to_json(record, with_result));
    } else {
        print!("{}", operator::to_text(record, with_result));
    }
}

/// One reconciler run by hand, with the provider the environment names (to cancel the
/// background calls of the jobs it expires).
async fn reconcile(
    ledger: &DynamoLedger,
    aws: &aws_config::SdkConfig,
    triggers: SqsTriggers,
    settings: &fenced_jobs::ops::reconcile::ReconcileSettings,
    json: bool,
) -> Result<(), OperatorError> {
    let provider = fenced_jobs::config::provider_from_lookup(|name| std::env::var(name).ok())
        .map_err(|e| OperatorError::NotSent(e.to_string()))?;
    let provider = fenced_jobs::provider::AnyProvider::from_config(&provider, aws)
        .await
        .map_err(|e| OperatorError::NotSent(e.to_string()))?;
    let now = SystemClock.now_ms();
    let report =
        fenced_jobs::ops::reconcile::reconcile(ledger, &triggers, &provider, now, settings).await?;
    if json {
        println!("{}", serde_json::json!(report));
    } else {
        println!(
            "expired {} (refused {}, calls cancelled {}), examined {}, re-sent {} (failed {}), unknown {}, errors {}",
            report.expired,
            report.expire_refused,
            report.cancelled,
            report.examined,
            report.resent,
            report.send_failed,
            report.unknown,
            report.errors
        );
    }
    Ok(())
}

/// Writes `bytes` to `path`, or to standard output.
fn write_out(path: Option<&std::path::Path>, bytes: &[u8]) -> Result<(), OperatorError> {
    use std::io::Write;
    let written = match path {
        Some(path) => std::fs::write(path, bytes),
        None => {
            let mut out = std::io::stdout().lock();
            out.write_all(bytes).and_then(|()| out.write_all(b"\n"))
        }
    };
    written.map_err(|e| {
        eprintln!("jobctl: {e}");
        std::process::exit(2)
    })
}

async fn export(
    ledger: &DynamoLedger,
    state: Option<String>,
    since: Option<String>,
    output: Option<std::path::PathBuf>,
) -> Result<(), OperatorError> {
    use std::io::{IsTerminal, Write};
    let usage = |what: &str| -> ! {
        eprintln!("jobctl: {what}");
        std::process::exit(2)
    };
    let state = match state.as_deref().map(str::parse::<JobState>) {
        None => None,
        Some(Ok(s)) if s.is_terminal() => Some(s),
        Some(_) => usage("--state takes succeeded, failed_terminal or expired"),
    };
    let now = SystemClock.now_ms();
    let since = match since.as_deref() {
        None => now - 86_400_000,
        Some(text) => fenced_jobs::job::message::parse_rfc3339_ms(text)
            .unwrap_or_else(|| usage("--since takes an RFC 3339 time, like 2026-11-30T00:00:00Z")),
    };
    let mut out: Box<dyn Write> = match &output {
        Some(path) => match std::fs::File::create(path) {
            Ok(f) => Box::new(std::io::BufWriter::new(f)),
            Err(e) => usage(&format!("{}: {e}", path.display())),
        },
        None => Box::new(std::io::BufWriter::new(std::io::stdout().lock())),
    };
    let terminal = std::io::stderr().is_terminal();
    let report = results::export(ledger, since, now, state, &mut out, |r, day| {
        if terminal {
            eprint!("\r{day}: {} written, {} filtered", r.written, r.filtered);
            let _ = std::io::stderr().flush();
        }
    })
    .await;
    if terminal {
        eprintln!();
    }
    let _ = out.flush();
    match report {
        Ok(r) => {
            eprintln!("exported {} jobs from {} days", r.written, r.days);
            Ok(())
        }
        Err(e) => usage(&e.to_string()),
    }
}
