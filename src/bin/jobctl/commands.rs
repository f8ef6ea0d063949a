//! The commands' bodies: reading, printing and writing for `jobctl`.

use fenced_jobs::blobs::s3::S3Blobs;
use fenced_jobs::clock::{Clock, SystemClock};
use fenced_jobs::job::JobState;
use fenced_jobs::job::message::format_rfc3339_ms;
use fenced_jobs::ledger::LedgerIndex;
use fenced_jobs::ledger::dynamodb::DynamoLedger;
use fenced_jobs::ops::operator::{self, OperatorError};
use fenced_jobs::ops::producer::Intake;
use fenced_jobs::ops::results;
use fenced_jobs::queue::{SqsReader, SqsTriggers};

use super::{AWS_ERROR, DlqCommand, REFUSED, usage};
use crate::output::Out;
use fenced_jobs::ops::files::OutputFile;

pub(crate) async fn list(
    ledger: &DynamoLedger,
    state: &str,
    limit: usize,
    out: &Out,
) -> Result<(), OperatorError> {
    let state: JobState = match state.parse() {
        Ok(s) if !JobState::is_terminal(s) => s,
        _ => usage("--state takes ready, running, unknown or retry_authorized"),
    };
    let jobs = ledger.list(state, limit).await?;
    let rows: Vec<serde_json::Value> = jobs
        .iter()
        .map(|(id, at)| serde_json::json!({"job_id": id, "state": state.as_str(), "updated_at": format_rfc3339_ms(*at)}))
        .collect();
    out.emit(serde_json::Value::Array(rows), || {
        let mut text = format!("{:<40} {:<17} updated\n", "job_id", "state");
        for (id, at) in &jobs {
            text += &format!(
                "{id:<40} {:<17} {}\n",
                state.as_str(),
                format_rfc3339_ms(*at)
            );
        }
        text
    });
    Ok(())
}

pub(crate) async fn spend(
    ledger: &DynamoLedger,
    (day, month): (Option<String>, Option<String>),
    (sqs, queues): (&aws_sdk_sqs::Client, [Option<String>; 2]),
    out: &Out,
) -> Result<(), OperatorError> {
    use fenced_jobs::ops::spend;
    let today = spend::day_of(SystemClock.now_ms());
    let (label, lines) = match (day, month) {
        (_, Some(month)) if spend::is_month(&month) => {
            let lines = spend::month(ledger, &month, &today).await?;
            (month, lines)
        }
        (_, Some(_)) => usage("--month takes a month as YYYY-MM (UTC), like 2026-12"),
        (Some(day), None) if spend::is_day(&day) => {
            let lines = spend::day(ledger, &day).await?;
            (day, lines)
        }
        (Some(_), None) => usage("--day takes a day as YYYY-MM-DD (UTC), like 2026-12-05"),
        (None, None) => (today.clone(), spend::day(ledger, &today).await?),
    };
    // Today, with a work queue: what the rest of the day will cost.
    let forecast = match (&queues[0], label == today) {
        (Some(_), true) => {
            let queued = fenced_jobs::queue::sqs::queued(sqs, &queues, |url| {
                eprintln!("jobctl: {url}'s depth could not be read; counted as empty")
            });
            spend::forecast(&lines, queued.await)
        }
        _ => None,
    };
    let mut doc = spend::to_json(&label, &lines);
    if let Some(f) = forecast {
        doc["forecast"] = serde_json::json!({"queued": f.queued, "per_call_micros": f.per_call,
            "forecast_micros": f.total, "limit_micros": f.limit});
    }
    out.emit(doc, || {
        let mut text = spend::text(&label, &lines);
        if let Some(f) = forecast {
            let over = f.limit.is_some_and(|l| f.total > l);
            text.push_str(&format!(
                "forecast for the day: {} ({} jobs queued at {} a call){}\n",
                operator::dollars(f.total),
                f.queued,
                operator::dollars(f.per_call),
                if over { ", past the daily limit" } else { "" }
            ));
        }
        text
    });
    Ok(())
}

/// The dead-letter queue to read, how much of it, and who the deployment's producers are.
pub(crate) struct DlqSource<'a> {
    pub(crate) url: &'a str,
    pub(crate) max: usize,
    pub(crate) producers: &'a fenced_jobs::job::scope::Producers,
}

pub(crate) async fn dlq(
    ledger: &DynamoLedger,
    blobs: &S3Blobs,
    sqs: &aws_sdk_sqs::Client,
    source: DlqSource<'_>,
    command: DlqCommand,
    out: &Out,
) -> Result<(), OperatorError> {
    // A redrive holds the messages it read invisible for a minute (long enough to move them);
    // an inspection or a dry run leaves them visible to everyone.
    let redrive_to = match command {
        DlqCommand::Redrive {
            queue_url,
            dry_run: false,
        } => Some(queue_url),
        _ => None,
    };
    let hold_s = if redrive_to.is_some() { 60 } else { 0 };
    let queue = SqsReader::new(sqs.clone());
    let reading = operator::dlq_inspect(
        ledger,
        Some(blobs),
        source.producers,
        &queue,
        source.url,
        source.max,
        hold_s,
    );
    let entries = crate::progress::shown("reading the dead-letter queue", reading).await?;
    let moved = match redrive_to {
        None => None,
        Some(to) => {
            let moving = operator::dlq_redrive(&queue, source.url, &to, &entries);
            Some(crate::progress::shown("redriving", moving).await?)
        }
    };
    let rows: Vec<serde_json::Value> = entries
        .iter()
        .map(|e| serde_json::json!({"message_id": e.message_id, "job_id": e.job_id, "verdict": e.verdict.label()}))
        .collect();
    out.emit(
        serde_json::json!({"messages": rows, "redriven": moved}),
        || {
            let mut text = format!("{:<38} {:<32} verdict\n", "message_id", "job_id");
            for e in &entries {
                text += &format!(
                    "{:<38} {:<32} {}\n",
                    e.message_id.as_deref().unwrap_or("-"),
                    e.job_id.as_deref().unwrap_or("-"),
                    e.verdict.label()
                );
            }
            if let Some(moved) = moved {
                text += &format!("\nredriven: {moved} of {}\n", entries.len());
            }
            text
        },
    );
    Ok(())
}

pub(crate) async fn submit(
    ledger: &DynamoLedger,
    sender: &SqsTriggers,
    file: Option<std::path::PathBuf>,
    intake: &Intake<'_>,
    out: &Out,
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
    out.emit(serde_json::json!(report), || submitted(&report));
    let clean = report.invalid.is_empty()
        && report.conflicts.is_empty()
        && report.ledger_failed.is_empty()
        && report.send_failed.is_empty();
    if !clean {
        std::process::exit(REFUSED);
    }
    Ok(())
}

/// A submit's report as people read it.
fn submitted(report: &fenced_jobs::ops::producer::SubmitReport) -> String {
    let mut text = format!(
        "lines {}: created {}, already present {}, conflicts {}, invalid {}, ledger failed {}, sent {}, failed to send {}\n",
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
        text += &format!("  line {line}: invalid: {reason}\n");
    }
    for (line, job_id) in report.conflicts.iter().take(20) {
        text += &format!("  line {line}: conflict: {job_id} is held with another input\n");
    }
    for (line, reason) in report.ledger_failed.iter().take(20) {
        text += &format!("  line {line}: not written: {reason}\n");
    }
    for (job_id, reason) in report.send_failed.iter().take(20) {
        text += &format!("  {job_id}: not sent ({reason}); the reconciler will send it\n");
    }
    text
}

pub(crate) fn print(record: &fenced_jobs::job::JobItem, out: &Out, with_result: bool) {
    out.emit(operator::to_json(record, with_result), || {
        operator::to_text(record, with_result)
    });
}

/// One reconciler run by hand, with the provider the environment names (to cancel the
/// background calls of the jobs it expires).
pub(crate) async fn reconcile(
    ledger: &DynamoLedger,
    aws: &aws_config::SdkConfig,
    triggers: SqsTriggers,
    settings: &fenced_jobs::ops::reconcile::ReconcileSettings,
    out: &Out,
) -> Result<(), OperatorError> {
    let provider = fenced_jobs::config::provider_from_lookup(|name| std::env::var(name).ok())
        .map_err(|e| OperatorError::NotSent(e.to_string()))?;
    let provider = fenced_jobs::provider::AnyProvider::from_config(&provider, aws)
        .await
        .map_err(|e| OperatorError::NotSent(e.to_string()))?;
    let now = SystemClock.now_ms();
    let run = fenced_jobs::ops::reconcile::reconcile(ledger, &triggers, &provider, now, settings);
    let report = crate::progress::shown("reconciling", run).await?;
    out.emit(serde_json::json!(report), || {
        format!(
            "expired {} (refused {}, calls cancelled {}), examined {} (walks cut {}), re-sent {} (failed {}), unknown {}, errors {}",
            report.expired,
            report.expire_refused,
            report.cancelled,
            report.examined,
            report.walks_cut,
            report.resent,
            report.send_failed,
            report.unknown,
            report.errors
        )
    });
    Ok(())
}

/// Writes `bytes` to a new file at `path` (replacing one only when `force`), or to standard
/// output.
pub(crate) fn write_out(
    path: Option<&std::path::Path>,
    force: bool,
    bytes: &[u8],
) -> Result<(), OperatorError> {
    use std::io::Write;
    let written = match path {
        Some(path) => OutputFile::create(path, force)
            .and_then(|mut file| {
                file.writer().write_all(bytes)?;
                file.finish()
            })
            .map_err(|e| format!("{}: {e}", path.display())),
        None => {
            let mut out = std::io::stdout().lock();
            out.write_all(bytes)
                .and_then(|()| out.write_all(b"\n"))
                .map_err(|e| e.to_string())
        }
    };
    written.map_err(|e| usage(&e))
}

/// The principal AWS authenticates this command as (`sts:GetCallerIdentity`), recorded with an
/// operator's decision beside the name they give; a decision is not made without it.
pub(crate) async fn caller(config: &aws_config::SdkConfig) -> String {
    match aws_sdk_sts::Client::new(config)
        .get_caller_identity()
        .send()
        .await
    {
        Ok(out) => out.arn().unwrap_or("unknown").to_owned(),
        Err(e) => {
            eprintln!(
                "jobctl: who you are could not be established (sts:GetCallerIdentity): {}",
                aws_sdk_sts::error::DisplayErrorContext(&e)
            );
            std::process::exit(AWS_ERROR);
        }
    }
}

pub(crate) async fn export(
    ledger: &DynamoLedger,
    state: Option<String>,
    since: Option<String>,
    output: Option<std::path::PathBuf>,
    force: bool,
) -> Result<(), OperatorError> {
    use std::io::{IsTerminal, Write};
    let state = match state.as_deref().map(str::parse::<JobState>) {
        None => None,
        Some(Ok(s)) if s.is_terminal() => Some(s),
        Some(_) => usage("--state takes succeeded, failed_terminal, expired or cancelled"),
    };
    let now = SystemClock.now_ms();
    let since = match since.as_deref() {
        None => now - 86_400_000,
        Some(text) => fenced_jobs::job::message::parse_rfc3339_ms(text)
            .unwrap_or_else(|| usage("--since takes an RFC 3339 time, like 2026-11-30T00:00:00Z")),
    };
    let mut file = match &output {
        Some(path) => match OutputFile::create(path, force) {
            Ok(f) => Some(f),
            Err(e) => usage(&format!("{}: {e}", path.display())),
        },
        None => None,
    };
    let mut out: Box<dyn Write + '_> = match &mut file {
        Some(f) => Box::new(std::io::BufWriter::new(f.writer())),
        None => Box::new(std::io::BufWriter::new(std::io::stdout().lock())),
    };
    let terminal = std::io::stderr().is_terminal();
    let report = results::export(ledger, (since, now), state, &mut out, |r, _| {
        if terminal {
            eprint!("\r{} written, {} filtered", r.written, r.filtered);
            let _ = std::io::stderr().flush();
        }
    })
    .await;
    if terminal {
        eprintln!();
    }
    let flushed = out.flush();
    drop(out);
    // The file takes its name only once complete; a failed export removes it (before `usage`
    // exits, which runs no destructor).
    let done = match (report, flushed) {
        (Ok(r), Ok(())) => match file.take().map(OutputFile::finish) {
            None | Some(Ok(())) => Ok(r),
            Some(Err(e)) => Err(e.to_string()),
        },
        (Err(e), _) => Err(e.to_string()),
        (_, Err(e)) => Err(e.to_string()),
    };
    drop(file);
    match done {
        Ok(r) => {
            eprintln!(
                "exported {} jobs (of {} finished in the window)",
                r.written, r.read
            );
            Ok(())
        }
        Err(e) => usage(&e),
    }
}

/// `jobctl events replay`: the failure queue's batches, or the jobs given.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn replay(
    ledger: &DynamoLedger,
    sink: &fenced_jobs::events::aws::AwsSink,
    sqs: &aws_sdk_sqs::Client,
    queue_url: Option<String>,
    jobs: &[String],
    max: usize,
    dry_run: bool,
    out: &Out,
) -> Result<(), OperatorError> {
    use fenced_jobs::ops::replay::{ReplayError, ReplayReport, event_of_job, replay_failures};
    let failed = |e: String| OperatorError::NotSent(e);
    let report = if jobs.is_empty() {
        let Some(queue_url) = queue_url else {
            usage("--queue-url (or DISPATCH_FAILURE_QUEUE_URL) or --job is needed");
        };
        let queue = SqsReader::new(sqs.clone());
        let replaying = replay_failures(ledger, sink, &queue, &queue_url, max, dry_run);
        crate::progress::shown("replaying the failure queue's batches", replaying)
            .await
            .map_err(|e| match e {
                ReplayError::Ledger(e) => OperatorError::Ledger(e),
                ReplayError::Queue(e) => OperatorError::Queue(e),
                ReplayError::Publish(why) => failed(why),
            })?
    } else {
        let mut events = Vec::new();
        for job_id in jobs {
            match event_of_job(ledger, job_id).await? {
                Some(event) => events.push(event),
                None => eprintln!("jobctl: {job_id}: no such job, or nothing to announce yet"),
            }
        }
        if !dry_run {
            fenced_jobs::events::publish(sink, &events)
                .await
                .map_err(|(_, why)| failed(why))?;
        }
        ReplayReport {
            events: events.len(),
            ..ReplayReport::default()
        }
    };
    let doc = serde_json::json!({
        "messages": report.messages, "unreadable": report.unreadable,
        "events": report.events, "deleted": report.deleted, "dry_run": dry_run,
    });
    out.emit(doc, || {
        let verb = if dry_run {
            "would publish"
        } else {
            "published"
        };
        format!(
            "{} failure messages ({} naming no stream batch, left in the queue), {verb} {} events, deleted {} messages",
            report.messages, report.unreadable, report.events, report.deleted
        )
    });
    Ok(())
}

/// The job ids given, then those of `file` (one a line; `-`: stdin), blanks skipped.
pub(crate) fn job_ids(mut ids: Vec<String>, file: Option<std::path::PathBuf>) -> Vec<String> {
    use std::io::BufRead;
    let reader: Box<dyn BufRead> = match file {
        None => return ids,
        Some(path) if path.as_os_str() == "-" => Box::new(std::io::stdin().lock()),
        Some(path) => match std::fs::File::open(&path) {
            Ok(f) => Box::new(std::io::BufReader::new(f)),
            Err(e) => crate::usage(&format!("{}: {e}", path.display())),
        },
    };
    ids.extend(
        reader
            .lines()
            .map_while(Result::ok)
            .map(|line| line.trim().to_owned())
            .filter(|line| !line.is_empty()),
    );
    ids
}

/// Cancels each job, printing what became of it: `cancelled`, `cancel requested` (running:
/// its owner stops at its next lease renewal), or why not. The first failure is returned
/// once all were tried (its exit status), after a line for each job.
pub(crate) async fn cancel(
    ledger: &DynamoLedger,
    ids: &[String],
    by: &str,
    caller: &str,
    reason: &str,
    out: &Out,
) -> Result<(), OperatorError> {
    use std::io::{IsTerminal, Write};
    let mut first_error = None;
    // Progress on a terminal, beside the results on standard output.
    let progress = std::io::stderr().is_terminal() && ids.len() > 1;
    for (done, job_id) in ids.iter().enumerate() {
        if progress {
            eprint!("\r{done} of {} asked", ids.len());
            let _ = std::io::stderr().flush();
        }
        let now = SystemClock.now_ms();
        let outcome = operator::cancel(ledger, job_id, by, Some(caller), reason, now).await;
        let (status, detail) = match &outcome {
            Ok(operator::Cancelled::Ended(_)) => ("cancelled", String::new()),
            Ok(operator::Cancelled::Requested(_)) => (
                "cancel_requested",
                "running: its owner stops the call at its next lease renewal".to_owned(),
            ),
            Err(e) => ("refused", e.to_string()),
        };
        let doc = serde_json::json!({ "job_id": job_id, "status": status, "detail": detail });
        out.emit(doc, || match detail.is_empty() {
            true => format!("{job_id}: {status}"),
            false => format!("{job_id}: {status} ({detail})"),
        });
        if let Err(e) = outcome {
            first_error.get_or_insert(e);
        }
    }
    if progress {
        eprintln!("\r{} of {} asked", ids.len(), ids.len());
    }
    first_error.map_or(Ok(()), Err)
}
