//! What an operator does with a job: read it, decide about an `unknown` one, and send it a new
//! trigger. The `jobctl` binary is a thin command line over these functions.

use serde_json::{Value, json};

use crate::job::message::format_rfc3339_ms;
use crate::job::{BlobRef, JobItem, JobState, Millis};
use crate::ledger::transitions::shows_cancel;
use crate::ledger::{CancelRequest, DecideRequest, JobLedger, LedgerError, OperatorAction, Write};
use crate::queue::{Outgoing, QueueError, TriggerSender};

/// Why an operator's command did nothing.
#[derive(Debug, thiserror::Error)]
pub enum OperatorError {
    /// No such job.
    #[error("job {0} is not in the ledger")]
    NotFound(String),
    /// The job is not waiting for a decision.
    #[error("job {job_id} is {state}; only an unknown job can be decided")]
    NotUnknown {
        /// Job id.
        job_id: String,
        /// Its state.
        state: JobState,
    },
    /// The job is terminal already: nothing to cancel.
    #[error("job {job_id} is {state} already; nothing to cancel")]
    Terminal {
        /// Job id.
        job_id: String,
        /// Its state.
        state: JobState,
    },
    /// The job changed between the read and the write; read it again and re-decide.
    #[error("job {0} changed while deciding; nothing was written")]
    Changed(String),
    /// The ledger failed.
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    /// The trigger could not be sent (the decision is recorded; send it again).
    #[error("decision recorded, but the trigger message was not sent: {0}")]
    NotSent(String),
    /// A queue request failed.
    #[error(transparent)]
    Queue(#[from] QueueError),
}

/// Reads a job, consistently.
pub async fn show<L: JobLedger>(ledger: &L, job_id: &str) -> Result<JobItem, OperatorError> {
    ledger
        .get(job_id)
        .await?
        .ok_or_else(|| OperatorError::NotFound(job_id.to_owned()))
}

/// Decides about an `unknown` job with one conditional write on the epoch just read.
pub async fn decide<L: JobLedger>(
    ledger: &L,
    job_id: &str,
    action: OperatorAction,
    by: &str,
    caller: Option<&str>,
    reason: &str,
    now: Millis,
) -> Result<JobItem, OperatorError> {
    let seen = show(ledger, job_id).await?;
    if seen.state != JobState::Unknown {
        return Err(OperatorError::NotUnknown {
            job_id: job_id.to_owned(),
            state: seen.state,
        });
    }
    let req = DecideRequest {
        job_id: job_id.to_owned(),
        epoch: seen.owner_epoch,
        action,
        by: by.to_owned(),
        caller: caller.map(str::to_owned),
        reason: reason.to_owned(),
        now,
    };
    let decision = req.decision();
    // Our decision, applied though its answer was lost: the epoch it raised, the state it set,
    // and the same decision (who, why, when) last in the item's record.
    let ours = |item: &JobItem| {
        item.owner_epoch == decision.epoch
            && item.state == action.target()
            && item.decisions.last() == Some(&decision)
    };
    match ledger.decide(req).await {
        Ok(Write::Applied(record)) => Ok(record),
        Ok(Write::Refused(Some(item))) if ours(&item) => Ok(item),
        Ok(Write::Refused(_)) => Err(OperatorError::Changed(job_id.to_owned())),
        Err(e) => match ledger.get(job_id).await {
            Ok(Some(item)) if ours(&item) => Ok(item),
            _ => Err(e.into()),
        },
    }
}

/// What a cancel did.
#[derive(Debug, Clone, PartialEq)]
pub enum Cancelled {
    /// The job was not running: it is `cancelled` now.
    Ended(JobItem),
    /// The job is running: the request is recorded (now or before), and its owner stops the
    /// call and ends it `cancelled` at its next lease renewal, or whoever recovers it does.
    Requested(JobItem),
}

impl Cancelled {
    /// The item as the cancel left it.
    pub fn record(&self) -> &JobItem {
        match self {
            Cancelled::Ended(r) | Cancelled::Requested(r) => r,
        }
    }
}

/// Tries at a cancel whose job moved between the read and the write (a claim took a `ready`
/// job, an attempt ended).
const CANCEL_TRIES: u32 = 3;

/// Cancels a job with one conditional write on the state and epoch just read: at once when
/// nobody runs it, by a request its owner carries out when it runs. A job that moved meanwhile
/// is read again and the cancel tried again, a few times.
pub async fn cancel<L: JobLedger>(
    ledger: &L,
    job_id: &str,
    by: &str,
    caller: Option<&str>,
    reason: &str,
    now: Millis,
) -> Result<Cancelled, OperatorError> {
    for _ in 0..CANCEL_TRIES {
        let seen = show(ledger, job_id).await?;
        if seen.state.is_terminal() {
            return Err(OperatorError::Terminal {
                job_id: job_id.to_owned(),
                state: seen.state,
            });
        }
        if seen.cancel_requested.is_some() {
            return Ok(Cancelled::Requested(seen));
        }
        let req = CancelRequest {
            job_id: job_id.to_owned(),
            seen: seen.state,
            epoch: seen.owner_epoch,
            by: by.to_owned(),
            caller: caller.map(str::to_owned),
            reason: reason.to_owned(),
            now,
        };
        let done = |record: JobItem| {
            if req.immediate() {
                Cancelled::Ended(record)
            } else {
                Cancelled::Requested(record)
            }
        };
        match ledger.cancel(req.clone()).await {
            Ok(Write::Applied(record)) => return Ok(done(record)),
            // Our write, applied though its answer was lost.
            Ok(Write::Refused(Some(item))) if shows_cancel(&item, &req) => return Ok(done(item)),
            Ok(Write::Refused(_)) => continue,
            Err(e) => match ledger.get(job_id).await {
                Ok(Some(item)) if shows_cancel(&item, &req) => return Ok(done(item)),
                _ => return Err(e.into()),
            },
        }
    }
    Err(OperatorError::Changed(job_id.to_owned()))
}

/// Index pages read at a time when looking for a tenant's jobs.
const TENANT_PAGE: usize = 500;

/// The furthest any job's deadline can be from now: the worker refuses one further than
/// `MAX_RECEIVE_COUNT` receives of 12 hours carry, and SQS's `maxReceiveCount` is at most 1,000.
const FURTHEST_DEADLINE_MS: Millis = 1_000 * 43_200_000;

/// The live jobs of the account `tenant` (`billing/acme`, or the unnamed producer's `acme`:
/// [`crate::job::account::account`]) at `now`: those the attention index lists (every `ready`
/// and `unknown` job, and those watched while `retry_authorized` or `running`), then those the
/// due index lists by deadline (every other job past its first claim, and a first claim whose
/// message SQS may drop). A first claim whose message SQS keeps is in no index: it is found
/// once that attempt ends and leaves it live. One query page and one read a job, and a query a
/// day up to the furthest deadline: an operator's command, not a hot path.
pub async fn tenant_jobs<L: JobLedger + crate::ledger::LedgerIndex>(
    ledger: &L,
    tenant: &str,
    now: Millis,
) -> Result<Vec<String>, OperatorError> {
    let mut found = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let mut take = async |job_id: &String| -> Result<(), OperatorError> {
        if !seen.insert(job_id.clone()) {
            return Ok(());
        }
        let item = ledger.get(job_id).await?;
        if item.is_some_and(|r| !r.state.is_terminal() && r.account() == tenant) {
            found.push(job_id.clone());
        }
        Ok(())
    };
    for state in [
        JobState::Ready,
        JobState::RetryAuthorized,
        JobState::Unknown,
        JobState::Running,
    ] {
        let mut cursor = crate::ledger::IndexCursor::default();
        loop {
            let page = ledger
                .untouched_since(state, Millis::MAX, &cursor, TENANT_PAGE)
                .await?;
            cursor.advance(&page);
            for (job_id, _) in &page {
                take(job_id).await?;
            }
            if page.len() < TENANT_PAGE {
                break;
            }
        }
    }
    // From a day back: a job past its deadline is live until the reconciler expires it.
    let mut walk = crate::ledger::DueWalk::new(now - 86_400_000, now + FURTHEST_DEADLINE_MS);
    while let Some(page) = walk.next(ledger, TENANT_PAGE).await? {
        for (job_id, _) in &page {
            take(job_id).await?;
        }
    }
    Ok(found)
}

/// Sends the trigger for `record` to the queue (after the decision is recorded: ledger first).
/// It carries only the job id: the worker reads the job from the ledger, so the trigger can
/// never disagree with it.
pub async fn send_trigger(
    sender: &impl TriggerSender,
    record: &JobItem,
) -> Result<(), OperatorError> {
    let trigger = [Outgoing::by_id(&record.job_id).of_class(&record.class)];
    let suffix = format!("epoch-{}", record.owner_epoch);
    let sent = sender.send(&trigger, &suffix).await;
    match sent.into_iter().next() {
        Some((_, Ok(()))) => Ok(()),
        Some((_, Err(reason))) => Err(OperatorError::NotSent(reason)),
        None => Err(OperatorError::NotSent("nothing sent".to_owned())),
    }
}

/// One attempt of the record for scripts; its excerpt (the answer's own text) only
/// `with_result`.
fn attempt_json(a: &crate::job::AttemptEntry, with_result: bool) -> Value {
    let mut fields = json!({
        "number": a.number, "epoch": a.epoch, "owner_id": a.owner_id,
        "started_at": format_rfc3339_ms(a.started_at),
        "provider_ref": a.provider_ref, "outcome": a.outcome.as_str(),
        "finished_at": a.finished_at.map(format_rfc3339_ms),
        "finish": a.finish.map(|f| f.as_str()),
    });
    if !a.errors.is_empty() {
        fields["errors"] = json!(a.errors);
    }
    if let Some(route) = &a.route {
        fields["provider"] = json!(route.provider);
        fields["model"] = json!(route.model);
        if let Some((rate, why)) = &route.path {
            fields["path"] = json!({"name": crate::job::path::name(*rate), "why": why});
        }
    }
    // A deferrable job's line: the batch it went in (null while its id is not recorded).
    if let Some((batch, _)) = a
        .provider_ref
        .as_deref()
        .and_then(crate::provider::batch::parse_ref)
    {
        fields["batch"] = json!(batch);
    }
    if let Some(usage) = &a.usage {
        fields["usage"] = json!(usage);
    }
    // The excerpt is the answer's own text: shown only with the answer.
    if let (Some(excerpt), true) = (&a.excerpt, with_result) {
        fields["excerpt"] = json!(excerpt);
    }
    fields
}

/// The record for scripts. The answer is included only when asked for.
pub fn to_json(record: &JobItem, with_result: bool) -> Value {
    let attempt = |a: &crate::job::AttemptEntry| attempt_json(a, with_result);
    let attempts: Vec<Value> = record.attempt_log.iter().map(attempt).collect();
    let given_back: Vec<Value> = record.given_back.iter().map(attempt).collect();
    let decisions: Vec<Value> = record
        .decisions
        .iter()
        .map(|d| json!({"epoch": d.epoch, "action": d.action, "by": d.by, "caller": d.caller, "reason": d.reason, "at": format_rfc3339_ms(d.at)}))
        .collect();
    let recoveries: Vec<Value> = record
        .recoveries
        .iter()
        .map(|r| json!({"epoch": r.epoch, "owner_id": r.owner_id, "reason": r.reason, "at": format_rfc3339_ms(r.at)}))
        .collect();
    let mut out = json!({
        "job_id": record.job_id,
        "state": record.state.as_str(),
        "owner_epoch": record.owner_epoch,
        "owner_id": record.owner_id,
        "owner_until": record.owner_until.map(format_rfc3339_ms),
        "cancel_requested": record.cancel_requested.map(format_rfc3339_ms),
        "tenant": record.account(),
        "priority": record.class.priority(),
        "deadline_at": format_rfc3339_ms(record.deadline_at),
        "attempts": record.attempts,
        "max_attempts": record.max_attempts,
        "max_cost_micros": record.max_cost_micros,
        "throttles": record.throttles,
        "not_sent": record.not_sent,
        "recoveries_dropped": record.recoveries_dropped,
        "given_back": given_back,
        "contract": record.contract,
        "input_digest": record.input_digest,
        "attempt_log": attempts,
        "usage": record.usage(),
        "recoveries": recoveries,
        "decisions": decisions,
        "last_error": record.last_error.as_ref().map(|e| json!({"kind": e.kind, "message": e.message, "at": format_rfc3339_ms(e.at)})),
        "result_bytes": record.result.as_ref().map(String::len),
        "result_ref": record.result_ref.as_ref().map(BlobRef::to_json),
        "input_ref": record.input_ref.as_ref().map(BlobRef::to_json),
        "created_at": format_rfc3339_ms(record.created_at),
        "updated_at": format_rfc3339_ms(record.updated_at),
    });
    if with_result {
        out["result"] = record
            .result
            .as_deref()
            .and_then(|r| serde_json::from_str(r).ok())
            .unwrap_or(Value::Null);
    }
    out
}

/// The record for people: one field a line, then the attempts and decisions as tables.
pub fn to_text(record: &JobItem, with_result: bool) -> String {
    let mut out = fields_text(record, with_result);
    out.push_str(&attempts_text(record, with_result));
    out.push_str(&history_text(record));
    out
}

/// The record's fields, one a line, in the order they are printed.
fn fields_text(record: &JobItem, with_result: bool) -> String {
    let mut out = String::new();
    let mut line = |k: &str, v: String| out.push_str(&format!("{k:<13} {v}\n"));
    line("job_id", record.job_id.clone());
    line("state", record.state.to_string());
    line("epoch", record.owner_epoch.to_string());
    line(
        "owner",
        record.owner_id.clone().unwrap_or_else(|| "-".into()),
    );
    line(
        "lease until",
        record.owner_until.map_or("-".into(), format_rfc3339_ms),
    );
    line("tenant", record.account());
    if record.class.urgent {
        line("priority", "urgent".to_owned());
    }
    if let Some(at) = record.cancel_requested {
        line(
            "cancel",
            format!(
                "requested {} (its owner stops the call and ends it cancelled)",
                format_rfc3339_ms(at)
            ),
        );
    }
    line("deadline", format_rfc3339_ms(record.deadline_at));
    line(
        "attempts",
        format!("{} of {}", record.attempts, record.max_attempts),
    );
    if record.throttles > 0 {
        line(
            "throttles",
            format!(
                "{} (refused for the rate limit; no attempt spent)",
                record.throttles
            ),
        );
    }
    if record.not_sent > 0 {
        line(
            "not sent",
            format!(
                "{} (claimed, but no time was left for the call; no attempt spent)",
                record.not_sent
            ),
        );
    }
    if let Some(u) = record.usage() {
        line("used", usage_text(&u));
    }
    if let Some(max) = record.max_cost_micros {
        line("max cost", dollars(max));
    }
    line("contract", record.contract.clone());
    line("digest", record.input_digest.clone());
    if let Some(e) = &record.last_error {
        line("last error", format!("{}: {}", e.kind, e.message));
    }
    if let Some(blob) = &record.input_ref {
        line("input", blob.to_string());
    }
    line(
        "result",
        match (&record.result, &record.result_ref, with_result) {
            (_, Some(blob), _) => format!("{blob} (`jobctl result` prints it)"),
            (None, None, _) => "-".into(),
            (Some(r), _, true) => r.clone(),
            (Some(r), _, false) => format!("{} bytes (--result to print it)", r.len()),
        },
    );
    out
}

/// The attempts as a table, those given back first, each with its route, usage and refusal.
fn attempts_text(record: &JobItem, with_result: bool) -> String {
    let mut out = String::new();
    out.push_str("\nattempt  epoch  outcome     started                   provider_ref\n");
    // The attempts given back (the last few) first: they came before the ones in the log
    // that share their numbers.
    for a in record.given_back.iter().chain(&record.attempt_log) {
        out.push_str(&format!(
            "{:<8} {:<6} {:<11} {:<25} {}\n",
            a.number,
            a.epoch,
            a.outcome.as_str(),
            format_rfc3339_ms(a.started_at),
            a.provider_ref.as_deref().unwrap_or("-")
        ));
        if let Some(r) = &a.route {
            out.push_str(&format!("         sent to {} ({})", r.provider, r.model));
            if let Some((rate, why)) = &r.path {
                let path = crate::job::path::name(*rate);
                out.push_str(&format!(" by the {path} path: {why}"));
            }
            out.push('\n');
        }
        if let Some(u) = &a.usage {
            out.push_str(&format!("         used {}\n", usage_text(u)));
        }
        if !a.errors.is_empty() {
            let finish = a.finish.map_or("-", |f| f.as_str());
            out.push_str(&format!(
                "         refused (finish {finish}): {}\n",
                a.errors.join("; ")
            ));
        }
        if let (Some(excerpt), true) = (&a.excerpt, with_result) {
            out.push_str(&format!("         answer began: {excerpt}\n"));
        }
    }
    out
}

/// The recoveries and operators' decisions as a table, if there were any.
fn history_text(record: &JobItem) -> String {
    let mut out = String::new();
    if !record.recoveries.is_empty()
        || !record.decisions.is_empty()
        || record.recoveries_dropped > 0
    {
        out.push_str(
            "\nepoch  what             by                       when                      why\n",
        );
        for r in &record.recoveries {
            out.push_str(&format!(
                "{:<6} {:<16} {:<24} {:<25} {}\n",
                r.epoch,
                "recovery",
                r.owner_id,
                format_rfc3339_ms(r.at),
                r.reason
            ));
        }
        if record.recoveries_dropped > 0 {
            out.push_str(&format!(
                "       {} more recoveries after these (counted, not listed)\n",
                record.recoveries_dropped
            ));
        }
        for d in &record.decisions {
            out.push_str(&format!(
                "{:<6} {:<16} {:<24} {:<25} {}\n",
                d.epoch,
                d.action,
                d.by,
                format_rfc3339_ms(d.at),
                d.reason
            ));
            if let Some(caller) = &d.caller {
                out.push_str(&format!("       as {caller}\n"));
            }
        }
    }
    out
}

/// An attempt's usage on one line (`176 in (+1024 read from the cache, 0 written to it), 300
/// out (256 reasoning)`), `~` before an estimate.
fn usage_text(u: &crate::job::Usage) -> String {
    let mut text = format!("{}{} in", if u.estimated { "~" } else { "" }, u.input);
    if u.cache_read > 0 || u.cache_write > 0 {
        text.push_str(&format!(
            " (+{} read from the cache, {} written to it)",
            u.cache_read, u.cache_write
        ));
    }
    text.push_str(&format!(", {} out", u.output));
    if u.reasoning > 0 {
        text.push_str(&format!(" ({} reasoning)", u.reasoning));
    }
    match u.cost_micros {
        Some(micros) => text.push_str(&format!(", {}", dollars(micros))),
        None => text.push_str(", not priced"),
    }
    if u.estimated {
        text.push_str(", estimated: a call's outcome is unknown");
    }
    text
}

/// Micro-dollars as dollars: `$0.006000`.
pub fn dollars(micros: u64) -> String {
    format!("${}.{:06}", micros / 1_000_000, micros % 1_000_000)
}

mod dlq;
mod sweep;
pub use dlq::{DlqEntry, DlqVerdict, dlq_inspect, dlq_redrive};
pub use sweep::{SWEEP_HOLD_SECONDS, Sweep, redrive_live};

#[cfg(test)]
mod tests;
