//! A provider that needs no network: deterministic answers, with latency and outcome taken from
//! `input.simulate`, so tests and the demo can drive every path.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde_json::Value;
use sha2::{Digest, Sha256};

use super::batch::{self, BatchApi, BatchLine, Book, Status};
use super::{Answer, Provider, ProviderError, ProviderRequest, Retrieval};
use crate::clock::{Clock, SystemClock};
use crate::job::contract::Finish;
use crate::job::simulate::{BadAnswer, SimulatedOutcome, Simulation, simulation_of};
use crate::job::{BatchCounts, Millis};

/// The simulated provider. It counts its executions (calls started), in total and per job.
#[derive(Debug)]
pub struct SimulatedProvider {
    executions: AtomicU64,
    retrievals: AtomicU64,
    per_job: Mutex<HashMap<String, u32>>,
    /// Its name, as attempts record it (`simulated`).
    name: &'static str,
    /// Models it refuses as overloaded, before any work (a provider's outage of one model).
    overloaded: Vec<String>,
    /// Its batch interface, when it has one ([`SimulatedProvider::with_batches`]).
    batches: Option<Batches>,
    /// Its flex tier has no capacity: a flex call is refused before any work.
    flex_full: bool,
}

/// The most lines of one batch (OpenAI's limit; Anthropic's is 100,000).
const MAX_BATCH_LINES: usize = 50_000;
/// The largest batch input (OpenAI's file; Anthropic's batch takes 256 MB).
const MAX_BATCH_FILE_BYTES: usize = 200_000_000;

/// The simulated batch interface: each batch ends once the longest `simulate.latency_ms` of
/// its lines has passed since it was created.
#[derive(Debug, Default)]
struct Batches {
    created: Mutex<Vec<SimBatch>>,
    book: Book,
}

#[derive(Debug)]
struct SimBatch {
    id: String,
    created_at: Millis,
    ends_at: Millis,
    lines: Vec<String>,
}

impl Default for SimulatedProvider {
    fn default() -> Self {
        SimulatedProvider {
            executions: AtomicU64::default(),
            retrievals: AtomicU64::default(),
            per_job: Mutex::default(),
            name: "simulated",
            overloaded: Vec::new(),
            batches: None,
            flex_full: false,
        }
    }
}

impl SimulatedProvider {
    /// A provider with zero executions.
    pub fn new() -> Self {
        Self::default()
    }

    /// The same provider under another name: a second simulated provider in a list.
    pub fn named(mut self, name: &'static str) -> Self {
        self.name = name;
        self
    }

    /// The same provider, overloaded for `model`: its calls are refused before any work, as
    /// Anthropic's 529 `overloaded_error` refuses them.
    pub fn overloaded_for(mut self, model: &str) -> Self {
        self.overloaded.push(model.to_owned());
        self
    }

    /// The same provider with its flex tier out of capacity: a call that asks for it
    /// (`parameters.service_tier: flex`) is refused before any work with a 429, as OpenAI's
    /// flex processing guide says its tier may answer.
    pub fn flex_full(mut self) -> Self {
        self.flex_full = true;
        self
    }

    /// The same provider with a batch interface: deferrable jobs go through it.
    pub fn with_batches(mut self) -> Self {
        self.batches = Some(Batches::default());
        self
    }

    /// Batches created so far, each with its number of lines.
    pub fn batch_sizes(&self) -> Vec<usize> {
        self.batches.as_ref().map_or_else(Vec::new, |b| {
            let created = b.created.lock().unwrap_or_else(|p| p.into_inner());
            created.iter().map(|b| b.lines.len()).collect()
        })
    }

    /// Ends every batch created so far, whatever its lines' latency (what this environment
    /// knew of them is forgotten): for benchmarks that look at running batches first.
    pub fn end_batches(&self) {
        if let Some(batches) = &self.batches {
            let mut created = batches.created.lock().unwrap_or_else(|p| p.into_inner());
            for b in created.iter_mut() {
                b.ends_at = 0;
            }
            batches.book.forget();
        }
    }

    /// Calls started so far.
    pub fn executions(&self) -> u64 {
        self.executions.load(Ordering::Relaxed)
    }

    /// Retrievals by reference so far (they are not executions).
    pub fn retrievals(&self) -> u64 {
        self.retrievals.load(Ordering::Relaxed)
    }

    /// Calls started so far for one job.
    pub fn executions_for(&self, job_id: &str) -> u32 {
        self.lock().get(job_id).copied().unwrap_or(0)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, u32>> {
        self.per_job.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Provider for SimulatedProvider {
    async fn call(&self, req: &ProviderRequest<'_>) -> Result<Answer, ProviderError> {
        self.executions.fetch_add(1, Ordering::Relaxed);
        *self.lock().entry(req.job_id.to_owned()).or_default() += 1;

        let sim = simulation_of(req.input);
        let model = req.input.get("model").and_then(Value::as_str);
        if model.is_some_and(|m| self.overloaded.iter().any(|o| o == m)) {
            return Err(refusal(SimulatedOutcome::Overloaded));
        }
        let tier = req
            .input
            .get("parameters")
            .and_then(|p| p.get("service_tier"));
        if self.flex_full && tier.and_then(Value::as_str) == Some("flex") {
            return Err(ProviderError::Throttled {
                retry_after_ms: None,
                reason: "HTTP 429 resource unavailable (flex capacity)".to_owned(),
            });
        }
        let answers = sim.outcome == SimulatedOutcome::Ok && req.attempt > sim.fail_times;
        let streamed = req.progress.as_ref().filter(|_| answers);
        run_for(sim.latency_ms, streamed).await;
        // Transient failures are tied to the attempt number, not to this process's memory, so
        // the behaviour is the same whichever invocation runs the attempt.
        if req.attempt <= sim.fail_times {
            return Err(ProviderError::Transient {
                retry_after_ms: None,
                reason: format!(
                    "simulated transient failure {} of {}",
                    req.attempt, sim.fail_times
                ),
            });
        }
        match sim.outcome {
            SimulatedOutcome::Ok => Ok(answer(req, &sim)),
            SimulatedOutcome::Transient => Err(ProviderError::Transient {
                retry_after_ms: None,
                reason: "simulated transient failure".to_owned(),
            }),
            SimulatedOutcome::Permanent => Err(ProviderError::Permanent {
                reason: "simulated permanent failure".to_owned(),
            }),
            SimulatedOutcome::Hang => std::future::pending().await,
            SimulatedOutcome::Overloaded | SimulatedOutcome::SpendLimit => {
                Err(refusal(sim.outcome))
            }
            SimulatedOutcome::Stall => {
                // The answer's first bytes, then silence: the progress rule finds it hung.
                let Some(progress) = &req.progress else {
                    return std::future::pending().await;
                };
                progress.mark();
                tokio::time::sleep(progress.timeout()).await;
                Err(ProviderError::Uncertain {
                    evidence: format!(
                        "no bytes for {} s: the call is hung, cancelled; it may have run",
                        progress.timeout().as_secs()
                    ),
                })
            }
        }
    }

    fn name(&self) -> &'static str {
        self.name
    }

    fn can_retrieve(&self) -> bool {
        true
    }

    /// Every attempt gets a reference before its call (like an idempotency key).
    fn reference(&self, job_id: &str, attempt: u32, epoch: u64) -> Option<String> {
        Some(format!("sim:{job_id}/{attempt}@{epoch}"))
    }

    /// What the simulated upstream says about an attempt started at `started_at`: the same
    /// outcome its call has, once its latency has passed since it started; `hang` is forever
    /// running; `"retrievable": false` makes the provider not know it.
    async fn retrieve(
        &self,
        provider_ref: &str,
        started_at: Millis,
        req: &ProviderRequest<'_>,
    ) -> Retrieval {
        self.retrievals.fetch_add(1, Ordering::Relaxed);
        if batch::is_batch_ref(provider_ref) {
            return match &self.batches {
                Some(_) => batch::retrieve_line(self, provider_ref, started_at, req).await,
                None => Retrieval::NotFound,
            };
        }
        let sim = simulation_of(req.input);
        let finished = SystemClock.now_ms() - started_at >= sim.latency_ms as Millis;
        self.word(req, finished)
    }

    /// Every tier, so that the paths can be tried without a vendor.
    fn tiers(&self) -> &'static [crate::job::usage::Rate] {
        &[
            crate::job::usage::Rate::Flex,
            crate::job::usage::Rate::Priority,
        ]
    }

    fn batches(&self) -> bool {
        self.batches.is_some()
    }

    fn batch_line(
        &self,
        req: &ProviderRequest<'_>,
        line: &str,
    ) -> Result<BatchLine, ProviderError> {
        let sim = simulation_of(req.input);
        let body = serde_json::json!({"job_id": req.job_id, "latency_ms": sim.latency_ms});
        Ok(BatchLine {
            id: line.to_owned(),
            body: body.to_string(),
        })
    }

    async fn submit_batch(&self, lines: &[BatchLine]) -> Result<String, ProviderError> {
        let Some(batches) = &self.batches else {
            return Err(ProviderError::Permanent {
                reason: "no batch interface".to_owned(),
            });
        };
        // The tighter of the providers' limits, as OpenAI refuses a larger batch: 50,000 lines,
        // a 200 MB file.
        let bytes: usize = lines.iter().map(|l| l.body.len() + 1).sum();
        if lines.is_empty() || lines.len() > MAX_BATCH_LINES || bytes > MAX_BATCH_FILE_BYTES {
            return Err(ProviderError::Permanent {
                reason: format!("HTTP 400 batch of {} lines, {bytes} bytes", lines.len()),
            });
        }
        let now = SystemClock.now_ms();
        let mut longest = 0;
        for line in lines {
            let body: Value = serde_json::from_str(&line.body).unwrap_or_default();
            longest = longest.max(body["latency_ms"].as_i64().unwrap_or(0));
            let job_id = body["job_id"].as_str().unwrap_or_default().to_owned();
            self.executions.fetch_add(1, Ordering::Relaxed);
            *self.lock().entry(job_id).or_default() += 1;
        }
        let mut created = batches.created.lock().unwrap_or_else(|p| p.into_inner());
        let id = format!("simbatch-{}", created.len() + 1);
        created.push(SimBatch {
            id: id.clone(),
            created_at: now,
            ends_at: now + longest,
            lines: lines.iter().map(|l| l.id.clone()).collect(),
        });
        Ok(id)
    }
}

impl SimulatedProvider {
    /// What the simulated upstream says about an attempt: the same outcome its call has,
    /// `finished` or not; `hang` is forever running; `"retrievable": false` makes the
    /// provider not know it.
    fn word(&self, req: &ProviderRequest<'_>, finished: bool) -> Retrieval {
        let sim = simulation_of(req.input);
        if !sim.retrievable {
            return Retrieval::NotFound;
        }
        if req.attempt <= sim.fail_times {
            return Retrieval::Failed(ProviderError::Transient {
                retry_after_ms: None,
                reason: format!(
                    "simulated transient failure {} of {}",
                    req.attempt, sim.fail_times
                ),
            });
        }
        match sim.outcome {
            SimulatedOutcome::Ok if finished => Retrieval::Completed(answer(req, &sim)),
            SimulatedOutcome::Ok | SimulatedOutcome::Hang | SimulatedOutcome::Stall => {
                Retrieval::Running
            }
            SimulatedOutcome::Overloaded | SimulatedOutcome::SpendLimit => {
                Retrieval::Failed(refusal(sim.outcome))
            }
            SimulatedOutcome::Transient => Retrieval::Failed(ProviderError::Transient {
                retry_after_ms: None,
                reason: "simulated transient failure".to_owned(),
            }),
            SimulatedOutcome::Permanent => Retrieval::Failed(ProviderError::Permanent {
                reason: "simulated permanent failure".to_owned(),
            }),
        }
    }
}

impl BatchApi for SimulatedProvider {
    fn book(&self) -> &Book {
        // Only asked through `retrieve_line`, which runs only with batches on.
        static NONE: std::sync::OnceLock<Book> = std::sync::OnceLock::new();
        self.batches
            .as_ref()
            .map_or_else(|| NONE.get_or_init(Book::default), |b| &b.book)
    }

    async fn status(&self, batch_id: &str, want: &str) -> Result<Status, Retrieval> {
        let Some(batches) = &self.batches else {
            return Err(Retrieval::NotFound);
        };
        let created = batches.created.lock().unwrap_or_else(|p| p.into_inner());
        let Some(batch) = created.iter().find(|b| b.id == batch_id) else {
            return Err(Retrieval::NotFound);
        };
        let now = SystemClock.now_ms();
        if now < batch.ends_at {
            // Its lines are answered at an even pace from its creation to its end.
            let total = batch.lines.len() as u64;
            let span = (batch.ends_at - batch.created_at).max(1);
            let done = (now - batch.created_at).clamp(0, span);
            let completed = total * u64::try_from(done).unwrap_or(0) / span as u64;
            return Ok(Status::Running(Some(BatchCounts {
                total,
                completed,
                failed: 0,
            })));
        }
        let mut results = batch::Results::reading(want);
        for line in &batch.lines {
            results.line(line.clone(), "");
        }
        Ok(Status::Ended(std::sync::Arc::new(results.done())))
    }

    fn list_path(&self, _after: Option<&str>) -> String {
        "batches".to_owned()
    }

    /// Its batches as one page of a provider's list, newest first.
    async fn get_json(&self, _path: &str) -> Result<Value, Retrieval> {
        let Some(batches) = &self.batches else {
            return Ok(Value::Null);
        };
        let created = batches.created.lock().unwrap_or_else(|p| p.into_inner());
        let data: Vec<Value> = created
            .iter()
            .rev()
            .map(|b| serde_json::json!({"id": b.id, "created_at": b.created_at}))
            .collect();
        Ok(serde_json::json!({"data": data, "has_more": false}))
    }

    fn created_ms(&self, batch: &Value) -> Option<Millis> {
        batch.get("created_at").and_then(Value::as_i64)
    }

    async fn holds(&self, batch_id: &str, line: &str) -> Option<bool> {
        let batches = self.batches.as_ref()?;
        let created = batches.created.lock().unwrap_or_else(|p| p.into_inner());
        let batch = created.iter().find(|b| b.id == batch_id)?;
        Some(batch.lines.iter().any(|l| l == line))
    }

    fn line_result(&self, _raw: &str, req: &ProviderRequest<'_>) -> Retrieval {
        self.word(req, true)
    }
}

/// A refusal before any work, in the words of the provider that gives it (Anthropic's).
fn refusal(outcome: SimulatedOutcome) -> ProviderError {
    let reason = match outcome {
        SimulatedOutcome::SpendLimit => "HTTP 429 rate_limit_error enforced_spend_limit_reached",
        _ => "HTTP 529 overloaded_error",
    };
    ProviderError::Transient {
        retry_after_ms: None,
        reason: reason.to_owned(),
    }
}

/// Waits out a call's `latency_ms`. A call that will answer streams meanwhile (`progress`):
/// twenty even parts at most, each well within the progress rule's timeout.
async fn run_for(latency_ms: u64, progress: Option<&super::Progress>) {
    const CHUNK_BYTES: usize = 64;
    let Some(progress) = progress else {
        if latency_ms > 0 {
            tokio::time::sleep(Duration::from_millis(latency_ms)).await;
        }
        return;
    };
    let timeout_ms = u64::try_from(progress.timeout().as_millis()).unwrap_or(u64::MAX);
    let part = (latency_ms / 20).clamp(1_000, (timeout_ms / 2).max(1));
    let mut left = latency_ms;
    while left > 0 {
        let now = part.min(left);
        tokio::time::sleep(Duration::from_millis(now)).await;
        left -= now;
        progress.streamed(CHUNK_BYTES);
    }
}

/// The answer depends on the input and contract, and on the attempt's number only for a bad
/// answer (`bad_answer` for attempts `1..=bad_times`); never on the time.
fn answer(req: &ProviderRequest<'_>, sim: &Simulation) -> Answer {
    use std::fmt::Write;
    /// The answer's document, fields in the order they are written.
    #[derive(serde::Serialize)]
    struct Document<'a> {
        contract: &'a str,
        model: &'a str,
        output: String,
        usage: Usage,
    }
    /// The usage it reports, in the Responses API's words: the input and the answer at four
    /// bytes a token.
    #[derive(serde::Serialize)]
    struct Usage {
        input_tokens: u64,
        output_tokens: u64,
    }
    let mut output = match &sim.output {
        Some(Value::String(text)) => text.clone(),
        Some(value) => value.to_string(),
        None => {
            let mut hasher = Sha256::new();
            hasher.update(req.contract.as_bytes());
            hasher.update(b"\0");
            hasher.update(req.input_json.as_bytes());
            let digest = hasher.finalize();
            let mut output = String::from("simulated answer ");
            for b in &digest[..6] {
                let _ = write!(output, "{b:02x}");
            }
            output
        }
    };
    output.extend(std::iter::repeat_n('.', sim.answer_bytes));
    let mut finish = Finish::Stop;
    match sim.bad_answer.filter(|_| req.attempt <= sim.bad_times) {
        Some(BadAnswer::Truncated) => {
            let mut half = output.len() / 2;
            while !output.is_char_boundary(half) {
                half -= 1;
            }
            output.truncate(half);
            finish = Finish::Length;
        }
        Some(BadAnswer::Invalid) => output = r#"{"unexpected": true}"#.to_owned(),
        None => {}
    }
    let tokens = |bytes: usize| (bytes as u64).div_ceil(crate::job::usage::BYTES_PER_TOKEN);
    let reported = Usage {
        input_tokens: tokens(req.input_json.len()),
        output_tokens: tokens(output.len()),
    };
    let usage = crate::job::Usage {
        input: reported.input_tokens,
        output: reported.output_tokens,
        ..crate::job::Usage::default()
    };
    let document = Document {
        contract: req.contract,
        model: req.input.get("model").and_then(Value::as_str).unwrap_or(""),
        output,
        usage: reported,
    };
    Answer {
        body: serde_json::to_string(&document).unwrap_or_default(),
        provider_ref: None,
        finish,
        usage: Some(usage),
        model: Some(document.model.to_owned()),
        response_id: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::job::message::canonical_json;
    use serde_json::{Map, Value, json};

    /// An input and its canonical JSON, as the processor hands them over.
    struct Input(Map<String, Value>, String);

    fn input(v: Value) -> Input {
        let json = canonical_json(&v);
        match v {
            Value::Object(m) => Input(m, json),
            _ => Input(Map::new(), json),
        }
    }

    static FREE_TEXT: std::sync::LazyLock<crate::job::contract::Contract> =
        std::sync::LazyLock::new(|| crate::job::contract::Contract::free_text("c"));

    fn request(input: &Input, attempt: u32) -> ProviderRequest<'_> {
        ProviderRequest {
            job_id: "j",
            attempt,
            epoch: u64::from(attempt),
            contract: "c",
            output: &FREE_TEXT,
            input: &input.0,
            input_json: &input.1,
            max_output_tokens: 0,
            idempotency_key: format!("j/{attempt}"),
            progress: None,
        }
    }

    #[tokio::test]
    async fn answers_are_deterministic_and_executions_counted() {
        let p = SimulatedProvider::new();
        let inp = input(json!({"model": "m", "prompt": "p"}));
        let a = p.call(&request(&inp, 1)).await.expect("ok");
        let b = p.call(&request(&inp, 2)).await.expect("ok");
        assert_eq!(a, b);
        assert_eq!(p.executions(), 2);
        assert_eq!(p.executions_for("j"), 2);
        let other = input(json!({"model": "m", "prompt": "q"}));
        assert_ne!(p.call(&request(&other, 1)).await.expect("ok"), a);
    }

    #[tokio::test]
    async fn an_answer_is_a_fixed_document() {
        let p = SimulatedProvider::new();
        let inp = input(json!({"model": "m\"1", "prompt": "p", "simulate": {"answer_bytes": 3}}));
        let answer = p.call(&request(&inp, 1)).await.expect("ok");
        assert_eq!(
            answer.body,
            r#"{"contract":"c","model":"m\"1","output":"simulated answer b49ada2be8e7...","usage":{"input_tokens":15,"output_tokens":8}}"#
        );
    }

    #[tokio::test]
    async fn fail_times_fails_the_first_attempts_then_takes_the_outcome() {
        let p = SimulatedProvider::new();
        let inp = input(json!({"model": "m", "prompt": "p", "simulate": {"fail_times": 2}}));
        assert!(matches!(
            p.call(&request(&inp, 1)).await,
            Err(ProviderError::Transient { .. })
        ));
        assert!(matches!(
            p.call(&request(&inp, 2)).await,
            Err(ProviderError::Transient { .. })
        ));
        assert!(p.call(&request(&inp, 3)).await.is_ok());
        let perm =
            input(json!({"model": "m", "prompt": "p", "simulate": {"outcome": "permanent"}}));
        assert!(matches!(
            p.call(&request(&perm, 1)).await,
            Err(ProviderError::Permanent { .. })
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn latency_is_honoured_and_hang_never_returns() {
        let p = SimulatedProvider::new();
        let slow = input(json!({"model": "m", "prompt": "p", "simulate": {"latency_ms": 5000}}));
        let started = tokio::time::Instant::now();
        p.call(&request(&slow, 1)).await.expect("ok");
        assert!(started.elapsed() >= Duration::from_millis(5000));
        let hang = input(json!({"model": "m", "prompt": "p", "simulate": {"outcome": "hang"}}));
        let cut = tokio::time::timeout(Duration::from_secs(3600), p.call(&request(&hang, 1))).await;
        assert!(cut.is_err());
    }

    #[tokio::test]
    async fn a_batch_past_the_providers_limits_is_refused_and_runs_nothing() {
        let provider = SimulatedProvider::new().with_batches();
        let line = |i: usize| BatchLine {
            id: format!("l{i}"),
            body: r#"{"job_id":"j","latency_ms":0}"#.to_owned(),
        };
        let too_many: Vec<BatchLine> = (0..=MAX_BATCH_LINES).map(line).collect();
        assert!(matches!(
            provider.submit_batch(&too_many).await,
            Err(ProviderError::Permanent { .. })
        ));
        assert!(provider.submit_batch(&[]).await.is_err());
        assert_eq!(
            (provider.executions(), provider.batch_sizes().len()),
            (0, 0)
        );
        let fits: Vec<BatchLine> = (0..MAX_BATCH_LINES).map(line).collect();
        assert!(provider.submit_batch(&fits).await.is_ok());
    }
}
