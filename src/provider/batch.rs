//! Deferrable jobs through a provider's batch interface: the reference an attempt's line is
//! known by, and what a provider keeps of its batches in one execution environment.
//!
//! A line's reference is recorded twice under the owner's epoch: with the claim, before the
//! batch exists (`batch::<line>`, *pending*: a later owner finds the batch by listing), and
//! once the batch is created (`batch:<batch id>:<line>`). The line's id names the job, the
//! attempt and the epoch, so the answer of an attempt given back is never taken for another's.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};

use sha2::{Digest, Sha256};

use serde_json::Value;

use super::{ProviderError, ProviderRequest, Retrieval};
use crate::clock::{Clock, SystemClock};
use crate::job::{BatchCounts, Millis};

/// How long a running batch's status is taken as it was read, for every delivery of the
/// environment that asks: the records of one batch, redelivered together, share one request.
pub(crate) const STATUS_FRESH_MS: Millis = 10_000;
/// How long before an attempt's claim the batches listed for its line may have been created
/// (clocks differ).
const LISTING_SLACK_MS: Millis = 300_000;

/// How long a line that never ran waits before it goes again, its attempt given back: its batch
/// expired or was cancelled before running it, or failed as a whole for the account's capacity.
pub(crate) const UNRUN_WAIT_MS: Millis = 300_000;

/// The codes a provider fails a whole batch with for its capacity, before any line ran, which
/// waiting clears: OpenAI's `token_limit_exceeded` (the organisation's enqueued tokens for the
/// model are used up: "try again once some in_progress batches have been completed").
const CAPACITY_CODES: [&str; 1] = ["token_limit_exceeded"];

/// A line its batch never ran (`reason`): nothing ran, so its attempt is given back and the
/// job waits [`UNRUN_WAIT_MS`] for a later batch, within its deadline, spending no attempt.
pub(crate) fn never_ran(reason: String) -> ProviderError {
    ProviderError::Throttled {
        retry_after_ms: Some(UNRUN_WAIT_MS),
        reason,
    }
}

/// What a batch reference starts with.
const PREFIX: &str = "batch:";

/// One attempt's request, written as a line of the provider's batch input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchLine {
    /// The line's id ([`line_id`]), the provider's `custom_id`.
    pub id: String,
    /// The line as the provider's batch input takes it (JSON).
    pub body: String,
}

/// The id of the line of `job_id`'s attempt claimed at `epoch`: `j`, 24 hex digits of the job
/// id's SHA-256, the attempt and the epoch. Within every provider's `custom_id` rules
/// (`[A-Za-z0-9_-]{1,64}`), whatever characters the job id has.
pub fn line_id(job_id: &str, attempt: u32, epoch: u64) -> String {
    let digest = Sha256::digest(job_id.as_bytes());
    let mut id = String::with_capacity(48);
    id.push('j');
    for b in &digest[..12] {
        id.push_str(&format!("{b:02x}"));
    }
    id.push_str(&format!("-a{attempt}-e{epoch}"));
    id
}

/// The id of the line of an attempt claimed at `epoch`, for the job `job_id` of `digest` (its
/// contract and input) in the deployment `scope` (its idempotency prefix): [`line_id`] over all
/// three, so that two deployments sharing a provider account, or a job id used again for
/// another input, never name the same line, and an answer found by listing is only ever the
/// answer to this job's input.
pub(crate) fn scoped_line_id(
    scope: &str,
    job_id: &str,
    digest: &str,
    attempt: u32,
    epoch: u64,
) -> String {
    line_id(
        &format!("{scope}\u{0}{job_id}\u{0}{digest}"),
        attempt,
        epoch,
    )
}

/// The reference of `line` in the batch `batch_id`.
pub fn batch_ref(batch_id: &str, line: &str) -> String {
    format!("{PREFIX}{batch_id}:{line}")
}

/// The reference of `line` before its batch is known (found again by listing the batches).
pub fn pending_ref(line: &str) -> String {
    format!("{PREFIX}:{line}")
}

/// A batch reference's batch id (`None` while pending) and line, if `provider_ref` is one.
pub fn parse_ref(provider_ref: &str) -> Option<(Option<&str>, &str)> {
    let rest = provider_ref.strip_prefix(PREFIX)?;
    let (batch, line) = rest.rsplit_once(':')?;
    if line.is_empty() {
        return None;
    }
    Some(((!batch.is_empty()).then_some(batch), line))
}

/// Whether `provider_ref` names a line of a provider batch.
pub fn is_batch_ref(provider_ref: &str) -> bool {
    parse_ref(provider_ref).is_some()
}

/// What the provider said of one batch.
#[derive(Debug, Clone)]
pub(crate) enum Status {
    /// Not ended: its lines are not answered yet (the request counts, where the provider
    /// reports them).
    Running(Option<BatchCounts>),
    /// Ended (completed, expired, cancelled): the answered lines' results by line id, as the
    /// provider wrote them; a line whole results do not hold was never run.
    Ended(Arc<Results>),
    /// The provider failed the batch as a whole before running any line (its input refused).
    #[cfg_attr(not(feature = "openai"), allow(dead_code))]
    Failed(String),
}

/// The results of an ended batch as one environment keeps them: every line while they fit in
/// [`RESULTS_READ_BYTES`], else the line the reader asked for and those read before the budget
/// ran out (`whole` false: a line missing from them is read again, on its own).
#[derive(Debug, Clone, Default)]
pub(crate) struct Results {
    lines: HashMap<String, String>,
    whole: bool,
    bytes: usize,
}

/// The most of one results file one read keeps (a batch's lines past it are read again by
/// the delivery that wants them), and the most the environment keeps of every batch's
/// results at once: with the worker's payload budget (`PAYLOAD_MEMORY_BYTES`, the function's
/// memory less 48 MiB), memory stays bounded whatever size the provider's files are.
pub(crate) const RESULTS_READ_BYTES: usize = 4 * 1_048_576;
const RESULTS_KEPT_BYTES: usize = 4 * RESULTS_READ_BYTES;

impl Results {
    /// Results to be read, keeping the line `want` whatever its size.
    pub(crate) fn reading(want: &str) -> Reading<'_> {
        Reading {
            want,
            results: Results {
                whole: true,
                ..Results::default()
            },
        }
    }

    /// The line `line`'s result, if kept.
    pub(crate) fn get(&self, line: &str) -> Option<&String> {
        self.lines.get(line)
    }

    /// Whether `line` is known to be absent from the batch (`Some(false)`), present
    /// (`Some(true)`), or not kept (`None`: read again to tell).
    pub(crate) fn holds(&self, line: &str) -> Option<bool> {
        match (self.lines.contains_key(line), self.whole) {
            (true, _) => Some(true),
            (false, true) => Some(false),
            (false, false) => None,
        }
    }
}

/// A results file being read, line by line.
pub(crate) struct Reading<'a> {
    want: &'a str,
    results: Results,
}

impl Reading<'_> {
    /// Takes the line `id` (`raw` as the provider wrote it), while the budget allows.
    pub(crate) fn line(&mut self, id: String, raw: &str) {
        let cost = id.len() + raw.len();
        let r = &mut self.results;
        if id == self.want || r.bytes + cost <= RESULTS_READ_BYTES {
            r.bytes += cost;
            r.lines.insert(id, raw.to_owned());
        } else {
            r.whole = false;
        }
    }

    /// The results read.
    pub(crate) fn done(self) -> Results {
        self.results
    }
}

/// What one execution environment knows of a provider's batches: a batch's status, asked at
/// most once per `fresh_ms` whichever delivery asks, and its results, read once (every
/// delivery of the environment reads its own line from them); the batch each line found by
/// listing belongs to.
#[derive(Debug, Default)]
pub(crate) struct Book {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    batches: HashMap<String, (Millis, Status)>,
    lines: HashMap<String, String>,
}

/// Batches an environment keeps (an ended one with its results, within
/// [`RESULTS_KEPT_BYTES`] in all): the oldest go first.
const KEPT_BATCHES: usize = 16;

impl Book {
    /// The status of `batch_id` if it was asked at or after `since` (an ended batch never
    /// changes).
    pub(crate) fn status(&self, batch_id: &str, since: Millis) -> Option<Status> {
        let inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let (at, status) = inner.batches.get(batch_id)?;
        match status {
            Status::Running(_) if *at < since => None,
            status => Some(status.clone()),
        }
    }

    /// Keeps what the provider said of `batch_id` at `at`.
    pub(crate) fn keep(&self, batch_id: &str, at: Millis, status: Status) {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner.batches.remove(batch_id);
        let size = |s: &Status| match s {
            Status::Ended(results) => results.bytes,
            _ => 0,
        };
        let adding = size(&status);
        while inner.batches.len() >= KEPT_BATCHES
            || inner.batches.values().map(|(_, s)| size(s)).sum::<usize>() + adding
                > RESULTS_KEPT_BYTES
        {
            let oldest = inner
                .batches
                .iter()
                .min_by_key(|(_, (at, _))| *at)
                .map(|(id, _)| id.clone());
            match oldest {
                Some(oldest) => inner.batches.remove(&oldest),
                None => break,
            };
        }
        inner.batches.insert(batch_id.to_owned(), (at, status));
    }

    /// Forgets what it knew of `batch_id`.
    pub(crate) fn forget_batch(&self, batch_id: &str) {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner.batches.remove(batch_id);
    }

    /// Forgets every batch and line.
    pub(crate) fn forget(&self) {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        *inner = Inner::default();
    }

    /// The batch `line` was found in by listing, if it was.
    pub(crate) fn found(&self, line: &str) -> Option<String> {
        let inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner.lines.get(line).cloned()
    }

    /// `line` is in the batch `batch_id`.
    pub(crate) fn place(&self, line: &str, batch_id: &str) {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if inner.lines.len() >= 100_000 {
            inner.lines.clear();
        }
        inner.lines.insert(line.to_owned(), batch_id.to_owned());
    }
}

/// A provider's batch interface, as [`retrieve_line`] asks it.
pub(crate) trait BatchApi: Sync {
    /// What this environment knows of the provider's batches.
    fn book(&self) -> &Book;

    /// What the provider says of `batch_id` now (an `Err` is what the retrieval answers: the
    /// provider could not be asked, refused to say, or does not know the batch); an ended
    /// batch's results keep the line `want` whatever else the budget leaves out.
    fn status(
        &self,
        batch_id: &str,
        want: &str,
    ) -> impl Future<Output = Result<Status, Retrieval>> + Send;

    /// The path of one page of the provider's list of batches (newest first), after the batch
    /// `after` when it is not the first.
    fn list_path(&self, after: Option<&str>) -> String;

    /// A `GET` of `path`, read as JSON (an `Err` is what the retrieval answers).
    fn get_json(&self, path: &str) -> impl Future<Output = Result<Value, Retrieval>> + Send;

    /// When a listed batch was created (Unix milliseconds), if it says.
    fn created_ms(&self, batch: &Value) -> Option<Millis>;

    /// Whether a listed batch may be one of this crate's.
    fn ours(&self, _batch: &Value) -> bool {
        true
    }

    /// Whether `batch_id` holds `line` (`None`: it cannot tell yet).
    fn holds(&self, batch_id: &str, line: &str) -> impl Future<Output = Option<bool>> + Send;

    /// What one line's result, as the provider wrote it, comes to for the attempt.
    fn line_result(&self, raw: &str, req: &ProviderRequest<'_>) -> Retrieval;
}

/// What became of the line `provider_ref` names (claimed at `started_at`): its batch, found by
/// listing while the reference is pending, asked about (at most once in ten seconds per batch in one
/// environment), and the line read from its results once it ended. A line an ended batch does
/// not hold was never run (the batch expired or was cancelled first): refused before work.
pub(crate) async fn retrieve_line<A: BatchApi>(
    api: &A,
    provider_ref: &str,
    started_at: Millis,
    req: &ProviderRequest<'_>,
) -> Retrieval {
    let Some((batch, line)) = parse_ref(provider_ref) else {
        return Retrieval::Denied;
    };
    let batch = match batch.map(str::to_owned).or_else(|| api.book().found(line)) {
        Some(batch) => batch,
        None => match find(api, line, started_at).await {
            Ok(Some(batch)) => batch,
            Ok(None) => return Retrieval::NotFound,
            Err(said) => return said,
        },
    };
    let now = SystemClock.now_ms();
    let status = match api.book().status(&batch, now - STATUS_FRESH_MS) {
        // Results that left this line out, for the budget: read again, for this line.
        Some(Status::Ended(results)) if results.holds(line).is_none() => {
            match api.status(&batch, line).await {
                Ok(status) => status,
                Err(said) => return said,
            }
        }
        Some(status) => status,
        None => match api.status(&batch, line).await {
            Ok(status) => {
                api.book().keep(&batch, now, status.clone());
                status
            }
            Err(said) => return said,
        },
    };
    match status {
        Status::Running(counts) => {
            // Shown by `jobctl watch`: the hand-over that follows writes them.
            if let (Some(counts), Some(progress)) = (counts, &req.progress) {
                progress.batch(counts);
            }
            Retrieval::Running
        }
        Status::Failed(why) => {
            let reason = format!("the batch failed before running any line: {why}");
            Retrieval::Failed(if CAPACITY_CODES.contains(&why.as_str()) {
                never_ran(reason)
            } else {
                ProviderError::Transient {
                    retry_after_ms: None,
                    reason,
                }
            })
        }
        Status::Ended(results) => match results.get(line) {
            Some(raw) => api.line_result(raw, req),
            // Both APIs give every line of an ended batch a result (an expired or cancelled
            // one says so): a line missing was lost on the way, and may have run. Read again.
            None => {
                tracing::warn!(%batch, "an ended batch's results miss a line; reading them again later");
                api.book().forget_batch(&batch);
                Retrieval::Unreachable {
                    retry_after_ms: None,
                }
            }
        },
    }
}

/// Pages of a provider's batch list read to find a line (100 batches each).
const LIST_PAGES: usize = 10;

/// The batches created since `since` (Unix milliseconds), newest first: the list read page
/// by page until one reaches older batches, has no more, or [`LIST_PAGES`] were read.
async fn created_since<A: BatchApi>(api: &A, since: Millis) -> Result<Listed, Retrieval> {
    let mut found = Vec::new();
    let mut after: Option<String> = None;
    for _ in 0..LIST_PAGES {
        let page = api.get_json(&api.list_path(after.as_deref())).await?;
        let mut older = false;
        for batch in page
            .get("data")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            match (api.created_ms(batch), batch_id(batch)) {
                (Some(at), _) if at < since => older = true,
                (Some(_), Some(id)) if api.ours(batch) => found.push(id),
                _ => {}
            }
        }
        let more = page.get("has_more").and_then(Value::as_bool) == Some(true);
        after = page
            .get("last_id")
            .and_then(Value::as_str)
            .filter(|id| valid_id(id))
            .map(str::to_owned);
        if older || !more {
            return Ok(Listed {
                batches: found,
                complete: true,
            });
        }
        if after.is_none() {
            break;
        }
    }
    // The list goes on past what was read: a batch made since the claim may be further on.
    Ok(Listed {
        batches: found,
        complete: false,
    })
}

/// The batches a listing found, and whether it reached every batch made since the claim.
struct Listed {
    batches: Vec<String>,
    complete: bool,
}

/// What a batch create answered with a failing `status` proves, from what the provider's
/// classification of it (`said`) makes of it: a 5xx, whoever sent it and in whatever words, may
/// have come after the batch was created, so it is uncertain (its lines are looked for by
/// listing) and never "not sent", which would send them again in a second batch under new
/// epochs. Any other status keeps its classification.
pub fn create_failed(status: u16, said: ProviderError) -> ProviderError {
    match said {
        ProviderError::Transient { reason, .. } | ProviderError::Throttled { reason, .. }
            if (500..600).contains(&status) =>
        {
            ProviderError::Uncertain {
                evidence: format!("{reason}: the batch may have been created"),
            }
        }
        said => said,
    }
}

/// A batch's id, when it is one this crate will put in a URL or the ledger: 1-128 characters
/// of `A-Z a-z 0-9 _ -`.
pub(crate) fn batch_id(batch: &Value) -> Option<String> {
    batch
        .get("id")
        .and_then(Value::as_str)
        .filter(|id| valid_id(id))
        .map(str::to_owned)
}

/// Whether `id` is a provider's id this crate will use: 1-128 characters of `A-Z a-z 0-9 _ -`.
pub(crate) fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 128
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// The batch holding `line`, among those created since its claim: `None` once every one of
/// them says it does not (the submission never happened); `Running` while one cannot tell, or
/// the list runs on past the pages read.
async fn find<A: BatchApi>(
    api: &A,
    line: &str,
    started_at: Millis,
) -> Result<Option<String>, Retrieval> {
    let listed = created_since(api, started_at - LISTING_SLACK_MS).await?;
    let mut undecided = !listed.complete;
    for batch in listed.batches {
        match api.holds(&batch, line).await {
            Some(true) => {
                tracing::info!(%batch, "the attempt's batch was found by listing");
                api.book().place(line, &batch);
                return Ok(Some(batch));
            }
            Some(false) => {}
            None => undecided = true,
        }
    }
    if undecided {
        return Err(Retrieval::Running);
    }
    Ok(None)
}

#[cfg(test)]
mod tests;
