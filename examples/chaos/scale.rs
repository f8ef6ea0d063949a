//! The scale scenario: a burst of jobs, a thousand concurrent invocations and a provider that
//! enforces requests-per-minute and tokens-per-minute limits, in virtual time. The handler,
//! processor, heartbeat and ledger are the crate's own; the queue, the Lambda consumers and the
//! rate-limited provider are modelled. It reports what the limit allowed and what was made of
//! it: goodput, 429s, jobs lost to throttling, the invocation-seconds spent, and every request
//! the cost per job is computed from (`BENCHMARKS.md`, "Scale").
//!
//! Why this file is long: the scenario's parts (queue, consumers, counting ledger and schedule,
//! the limited provider) share one set of counters with its report; the sections below are
//! where it would split.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_lambda_events::event::sqs::{SqsEvent, SqsMessage};
use fenced_jobs::clock::Clock;
use fenced_jobs::job::scope::Producers;
use fenced_jobs::job::{JobState, Millis};
use fenced_jobs::ledger::memory::InMemoryLedger;
use fenced_jobs::ledger::schedule::{
    Booked, CallSchedule, Limits, MemorySchedule, Reservation, ReserveRequest,
};
use fenced_jobs::ledger::{JobLedger, LedgerError};
use fenced_jobs::provider::{Answer, Provider, ProviderError, ProviderRequest};
use fenced_jobs::queue::{ChangeResult, ChangeResults, VisibilityChange, VisibilityControl};
use fenced_jobs::worker::Settings;
use fenced_jobs::worker::handler::BatchHandler;
use fenced_jobs::worker::pacing::{Pacer, PacingSettings};
use fenced_jobs::worker::processor::{Invocation, Processor};

use crate::sim::{VirtualClock, listed};

const QUEUE_ARN: &str = "arn:aws:sqs:us-east-1:123456789012:scale";

/// How a scale run is set up.
#[derive(Debug, Clone)]
pub struct ScaleConfig {
    /// Seed of every random choice.
    pub seed: u64,
    /// Jobs in the burst, all sent at the start.
    pub jobs: usize,
    /// Concurrent invocations (the event source mapping's `MaximumConcurrency`).
    pub concurrency: usize,
    /// Records per invocation.
    pub batch_size: usize,
    /// The provider's requests per minute.
    pub rpm: u64,
    /// The provider's tokens per minute (prompt plus `max_tokens`, counted when the request
    /// arrives, as OpenAI counts them).
    pub tpm: u64,
    /// The model's time per call.
    pub call_ms: (u64, u64),
    /// The share of the provider's limits the shared schedule is configured with
    /// (`PROVIDER_RPM`, `PROVIDER_TPM`); `None` runs without a schedule.
    pub schedule_share: Option<f64>,
    /// How the worker paces its calls (`PACING_*`).
    pub pacing: PacingSettings,
    /// `PACED_SPREAD_SECONDS`.
    pub paced_spread_s: i64,
    /// The redrive policy's `maxReceiveCount` (`MAX_RECEIVE_COUNT`): a message received this
    /// often goes to the DLQ on its next receive, as SQS moves it.
    pub max_receive: u32,
    /// The burst's tenant (its message group), if it has one.
    pub burst_tenant: Option<&'static str>,
    /// Jobs that arrive one at a time while the burst runs, whose latency is measured.
    pub trickle: Option<Trickle>,
    /// The queue is a fair queue: a receive takes the visible messages of each message group
    /// in turn, so a group with a backlog does not delay the others (SQS fair queues).
    pub fair: bool,
    /// Concurrent invocations of the urgent queue's event source mapping (0: no urgent queue,
    /// urgent jobs share the work queue).
    pub urgent_concurrency: usize,
    /// `URGENT_PACING_PERCENT`.
    pub urgent_percent: u8,
    /// `TENANT_PACING_PERCENT`.
    pub tenant_percent: u8,
    /// Two producers: the burst's (`bulk`), which names its jobs' tenants and message groups in
    /// turn from a thousand of each ([`ROTATED`]), and the trickle's (`steady`), which keeps
    /// its own.
    pub rotating: bool,
    /// `PRODUCER_PACING_PERCENT`.
    pub producer_percent: u8,
}

/// Jobs that arrive one at a time, from the start.
#[derive(Debug, Clone, Copy)]
pub struct Trickle {
    /// How many.
    pub jobs: usize,
    /// One every this long.
    pub every_ms: Millis,
    /// Their tenant.
    pub tenant: Option<&'static str>,
    /// They are urgent.
    pub urgent: bool,
}

impl ScaleConfig {
    /// The scenario of `make scale`: 100,000 jobs, 1,000 concurrent invocations of 10 records,
    /// 5,000 requests and 3,000,000 tokens per minute, calls of 1 to 3 s.
    pub fn burst(seed: u64) -> Self {
        ScaleConfig {
            seed,
            jobs: 100_000,
            concurrency: 1_000,
            batch_size: 10,
            rpm: 5_000,
            tpm: 3_000_000,
            call_ms: (1_000, 3_000),
            schedule_share: Some(1.0),
            pacing: PacingSettings::default(),
            paced_spread_s: Settings::default().visibility.paced_spread_s,
            max_receive: 300,
            burst_tenant: None,
            trickle: None,
            fair: false,
            urgent_concurrency: 0,
            urgent_percent: 0,
            tenant_percent: 100,
            rotating: false,
            producer_percent: 100,
        }
    }

    /// The fairness runs of `make scale`: one tenant's burst of `burst` jobs and another's
    /// trickle of one job every 3 s for 10 minutes, in the work queue, a fair queue or not,
    /// each tenant's calls capped at `share` percent of the pace (`burst` 0: the trickle
    /// unloaded).
    pub fn tenants(seed: u64, burst: usize, fair: bool, share: u8) -> Self {
        ScaleConfig {
            jobs: burst,
            burst_tenant: Some("bulk"),
            trickle: Some(Trickle {
                jobs: 200,
                every_ms: 3_000,
                tenant: Some("trickle"),
                urgent: false,
            }),
            fair,
            tenant_percent: share,
            ..ScaleConfig::burst(seed)
        }
    }

    /// The producers' runs of `make scale`: a producer's burst of `burst` jobs, whose tenants and
    /// message groups rotate through a thousand of each, and another producer's trickle in its own
    /// account and group, in a fair queue; each account's calls capped at half the pace and
    /// each producer's at `share` percent.
    pub fn producers(seed: u64, burst: usize, share: u8) -> Self {
        ScaleConfig {
            rotating: true,
            producer_percent: share,
            ..ScaleConfig::tenants(seed, burst, true, 50)
        }
    }

    /// The priority runs of `make scale`: urgent jobs, one every 3 s for 10 minutes, behind a
    /// backlog of `burst` jobs; through an urgent queue of their own (with its event source
    /// mapping of 100 and a fifth of the pace kept for them) or not (`burst` 0: unloaded).
    pub fn urgent(seed: u64, burst: usize, own_queue: bool) -> Self {
        ScaleConfig {
            jobs: burst,
            trickle: Some(Trickle {
                jobs: 200,
                every_ms: 3_000,
                tenant: None,
                urgent: true,
            }),
            urgent_concurrency: if own_queue { 100 } else { 0 },
            urgent_percent: if own_queue { 20 } else { 0 },
            ..ScaleConfig::burst(seed)
        }
    }
}

/// What a scale run measured.
#[derive(Debug, Clone, Default)]
pub struct ScaleReport {
    /// Jobs by final state.
    pub end_states: BTreeMap<String, u64>,
    /// Calls the model ran (answered without a 429).
    pub executed: u64,
    /// Calls answered 429.
    pub throttled: u64,
    /// Tokens of the calls the model ran.
    pub tokens: u64,
    /// When the last job's first execution began, from the burst (ms).
    pub admission_ms: Millis,
    /// When the last job ended (ms).
    pub drain_ms: Millis,
    /// Jobs that ended failed or expired without the model ever running them.
    pub failed_by_throttling: u64,
    /// Invocations, and their summed duration (ms).
    pub invocations: u64,
    /// See `invocations`.
    pub invocation_ms: u64,
    /// Records delivered.
    pub deliveries: u64,
    /// Ledger writes (schedule reservations and conditional writes refused included: they
    /// cost a unit too), and reads of the schedule (eventually consistent).
    pub ledger_writes: u64,
    /// See `ledger_writes`.
    pub schedule_reads: u64,
    /// SQS requests: receives (one per invocation), deletes (batches of 10) and visibility
    /// changes (batches of 10).
    pub sqs_requests: u64,
    /// Reservations of the shared schedule: granted, the calls they granted, and refused.
    pub reservations: (u64, u64, u64),
    /// Messages the redrive policy moved to the DLQ (goal 0: none of them is poison).
    pub dead_lettered: u64,
    /// The trickle's jobs: from their submit to their acceptance (ms), sorted; a job that was
    /// not accepted counts as the whole run.
    pub trickle_latency: Vec<Millis>,
    /// Minute by minute from the burst: calls the model ran, calls answered 429, and jobs not
    /// yet ended at the minute's start.
    pub minutes: Vec<Minute>,
}

/// One minute of a run, for `make bench`'s picture of the burst.
#[derive(Debug, Default, Clone, Copy, serde::Serialize)]
pub struct Minute {
    /// Calls the model ran.
    pub executed: u64,
    /// Calls answered 429.
    pub throttled: u64,
    /// Jobs not yet ended when the minute began.
    pub open: u64,
}

impl ScaleReport {
    /// Goodput: the share of the binding limit the model's executions used, from the burst to
    /// the moment the last job was first admitted (while work was always waiting).
    pub fn goodput(&self, config: &ScaleConfig) -> f64 {
        let minutes = self.admission_ms.max(1) as f64 / 60_000.0;
        let by_requests = self.executed as f64 / (config.rpm as f64 * minutes);
        let by_tokens = self.tokens as f64 / (config.tpm as f64 * minutes);
        by_requests.max(by_tokens)
    }

    /// The `q` quantile (0 to 1) of the trickle's latency, in seconds.
    pub fn trickle_quantile(&self, q: f64) -> f64 {
        let n = self.trickle_latency.len();
        if n == 0 {
            return 0.0;
        }
        let i = ((n as f64 * q).ceil() as usize).clamp(1, n) - 1;
        self.trickle_latency[i] as f64 / 1_000.0
    }

    /// The share of calls answered 429.
    pub fn throttled_share(&self) -> f64 {
        self.throttled as f64 / (self.throttled + self.executed).max(1) as f64
    }

    /// The figures, as printed by `make scale`.
    pub fn print(&self, config: &ScaleConfig) {
        let per_job = |n: u64| n as f64 / config.jobs.max(1) as f64;
        println!(
            "seed {}: {} jobs, {} concurrent invocations of {}, limits {} RPM / {} TPM, calls {}-{} ms",
            config.seed,
            config.jobs,
            config.concurrency,
            config.batch_size,
            config.rpm,
            config.tpm,
            config.call_ms.0,
            config.call_ms.1
        );
        println!("  jobs ending: {}", listed(&self.end_states));
        if let Some(trickle) = &config.trickle {
            println!(
                "  trickle ({} jobs, one every {} s{}{}): submit to acceptance p50 {:.1} s, p99 {:.1} s",
                trickle.jobs,
                trickle.every_ms / 1_000,
                if trickle.urgent { ", urgent" } else { "" },
                if config.fair { ", fair queue" } else { "" },
                self.trickle_quantile(0.5),
                self.trickle_quantile(0.99)
            );
        }
        println!(
            "  goodput {:.1} % of the limit; 429s {:.1} % of calls ({:.3} per accepted answer); failed or expired by throttling alone: {}",
            100.0 * self.goodput(config),
            100.0 * self.throttled_share(),
            self.throttled as f64 / self.executed.max(1) as f64,
            self.failed_by_throttling
        );
        println!(
            "  live jobs dead-lettered by the redrive policy (maxReceiveCount {}): {}",
            config.max_receive, self.dead_lettered
        );
        println!(
            "  last admission {:.1} min, drained {:.1} min; executions per job {:.3}",
            self.admission_ms as f64 / 60_000.0,
            self.drain_ms as f64 / 60_000.0,
            per_job(self.executed)
        );
        println!(
            "  reservations: {} granted for {} calls, {} refused (horizon full)",
            self.reservations.0, self.reservations.1, self.reservations.2
        );
        println!(
            "  per job: {:.3} invocations, {:.2} invocation-s, {:.2} deliveries, {:.2} ledger writes, {:.2} schedule reads, {:.2} SQS requests",
            per_job(self.invocations),
            per_job(self.invocation_ms) / 1_000.0,
            per_job(self.deliveries),
            per_job(self.ledger_writes),
            per_job(self.schedule_reads),
            per_job(self.sqs_requests)
        );
    }
}

/// Counters the parts of the world share.
#[derive(Default)]
struct Counters {
    executed: AtomicU64,
    throttled: AtomicU64,
    tokens: AtomicU64,
    sqs: AtomicU64,
    /// Calls the model ran and calls answered 429, per minute from the burst.
    minutes: Mutex<Vec<Minute>>,
}

impl Counters {
    /// Counts a call in its minute: ran, or answered 429.
    fn minute(&self, minute: usize, ran: bool) {
        let mut minutes = self.minutes.lock().expect("minutes");
        if minutes.len() <= minute {
            minutes.resize(minute + 1, Minute::default());
        }
        if ran {
            minutes[minute].executed += 1;
        } else {
            minutes[minute].throttled += 1;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// SQS: a standard queue, its messages ordered by when they become visible

struct Msg {
    /// Its message group ("" on a queue that is not fair).
    group: String,
    /// The principal SQS names as its sender (`SenderId`; "": none).
    sender: &'static str,
    body: String,
    receive_count: u32,
    visible_at: Millis,
    handle: u64,
    deleted: bool,
}

/// (visible at, message index, handle), earliest first.
type Ready = BinaryHeap<Reverse<(Millis, usize, u64)>>;

#[derive(Default)]
struct QueueState {
    msgs: Vec<Msg>,
    /// Each message group's (visible at, message index, handle): stale entries are skipped
    /// when popped.
    ready: BTreeMap<String, Ready>,
    /// The group a fair receive starts with.
    turn: usize,
    next_handle: u64,
    dead_lettered: u64,
}

impl QueueState {
    fn schedule(&mut self, i: usize, at: Millis, handle: u64) {
        let group = self.msgs[i].group.clone();
        self.ready
            .entry(group)
            .or_default()
            .push(Reverse((at, i, handle)));
    }

    /// The next visible message of `group` at `now` (stale entries dropped), or when its next
    /// one becomes visible.
    fn next_of(&mut self, group: &str, now: Millis) -> Result<usize, Option<Millis>> {
        let Some(heap) = self.ready.get_mut(group) else {
            return Err(None);
        };
        while let Some(&Reverse((at, i, handle))) = heap.peek() {
            let m = &self.msgs[i];
            if m.deleted || m.handle != handle || m.visible_at != at {
                heap.pop();
                continue;
            }
            if at > now {
                return Err(Some(at));
            }
            heap.pop();
            return Ok(i);
        }
        Err(None)
    }
}

struct Queue {
    state: Mutex<QueueState>,
    visibility_ms: Millis,
    max_receive: u32,
    /// A fair queue: each message group's messages are taken in turn.
    fair: bool,
}

impl Queue {
    /// A message from `sender` visible from `at`, in `group` (a fair queue's message group).
    fn push(&self, body: String, (group, sender): (&str, &'static str), at: Millis) {
        let mut q = self.state.lock().expect("queue");
        let i = q.msgs.len();
        let group = if self.fair { group } else { "" };
        q.msgs.push(Msg {
            group: group.to_owned(),
            sender,
            body,
            receive_count: 0,
            visible_at: at,
            handle: 0,
            deleted: false,
        });
        q.schedule(i, at, 0);
    }

    /// Up to `max` visible messages, or when the next one becomes visible. A fair queue takes
    /// one message of each group in turn.
    fn receive(&self, now: Millis, max: usize) -> Result<Vec<SqsMessage>, Option<Millis>> {
        let mut q = self.state.lock().expect("queue");
        let mut out = Vec::new();
        let groups: Vec<String> = q.ready.keys().cloned().collect();
        let start = q.turn;
        q.turn = q.turn.wrapping_add(1);
        let mut next_visible: Option<Millis> = None;
        let mut dry = 0;
        let mut g = 0;
        while out.len() < max && dry < groups.len() {
            let group = &groups[(start + g) % groups.len()];
            g += 1;
            let i = match q.next_of(group, now) {
                Ok(i) => {
                    dry = 0;
                    i
                }
                Err(at) => {
                    dry += 1;
                    next_visible = match (next_visible, at) {
                        (Some(a), Some(b)) => Some(a.min(b)),
                        (a, b) => a.or(b),
                    };
                    continue;
                }
            };
            let m = &q.msgs[i];
            let exhausted = m.receive_count >= self.max_receive;
            if exhausted {
                // The redrive policy moves it instead of delivering it.
                q.msgs[i].deleted = true;
                q.dead_lettered += 1;
                continue;
            }
            q.next_handle += 1;
            let handle = q.next_handle;
            let visible_at = now + self.visibility_ms;
            let m = &mut q.msgs[i];
            m.receive_count += 1;
            m.handle = handle;
            m.visible_at = visible_at;
            let mut r = SqsMessage::default();
            r.message_id = Some(format!("m{i}"));
            r.receipt_handle = Some(format!("{i}#{handle}"));
            r.body = Some(m.body.clone());
            r.event_source_arn = Some(QUEUE_ARN.to_owned());
            r.attributes.insert(
                "ApproximateReceiveCount".into(),
                m.receive_count.to_string(),
            );
            if !m.sender.is_empty() {
                r.attributes.insert("SenderId".into(), m.sender.to_owned());
            }
            out.push(r);
            q.schedule(i, visible_at, handle);
        }
        if out.is_empty() {
            return Err(next_visible);
        }
        Ok(out)
    }

    fn dead_lettered(&self) -> u64 {
        self.state.lock().expect("queue").dead_lettered
    }

    fn current(q: &mut QueueState, handle: &str) -> Option<usize> {
        let (i, seq) = handle.split_once('#')?;
        let (i, seq): (usize, u64) = (i.parse().ok()?, seq.parse().ok()?);
        let m = q.msgs.get(i)?;
        (m.handle == seq && !m.deleted).then_some(i)
    }

    fn delete(&self, handle: &str) {
        let mut q = self.state.lock().expect("queue");
        if let Some(i) = Queue::current(&mut q, handle) {
            q.msgs[i].deleted = true;
        }
    }

    fn change(&self, handle: &str, seconds: i32, now: Millis) -> ChangeResult {
        let mut q = self.state.lock().expect("queue");
        let Some(i) = Queue::current(&mut q, handle) else {
            return ChangeResult::Refused;
        };
        let at = now + Millis::from(seconds) * 1_000;
        let m = &mut q.msgs[i];
        m.visible_at = at;
        let handle = m.handle;
        q.schedule(i, at, handle);
        ChangeResult::Changed
    }
}

struct ScaleVisibility {
    queue: Arc<Queue>,
    clock: VirtualClock,
    counters: Arc<Counters>,
}

impl VisibilityControl for ScaleVisibility {
    async fn change(&self, _arn: &str, changes: Vec<VisibilityChange>) -> ChangeResults {
        tokio::time::sleep(Duration::from_millis(5)).await;
        let calls = changes.len().div_ceil(10) as u32;
        self.counters
            .sqs
            .fetch_add(u64::from(calls), Ordering::Relaxed);
        let now = self.clock.now_ms();
        let results = changes
            .iter()
            .map(|c| self.queue.change(&c.receipt_handle, c.seconds, now))
            .collect();
        ChangeResults { calls, results }
    }
}

// ---------------------------------------------------------------------------------------------
// DynamoDB: the shared table (the in-memory ledger counts its writes) and the schedule

/// The shared schedule in memory, its reservations counted.
#[derive(Debug, Default)]
struct CountingSchedule {
    schedule: MemorySchedule,
    granted: AtomicU64,
    granted_calls: AtomicU64,
    booked: AtomicU64,
    peeks: AtomicU64,
}

impl CallSchedule for CountingSchedule {
    fn reserve(
        &self,
        req: ReserveRequest,
    ) -> futures::future::BoxFuture<'_, Result<Reservation, LedgerError>> {
        let calls = req.requests;
        Box::pin(async move {
            tokio::time::sleep(Duration::from_millis(5)).await;
            let got = self.schedule.reserve(req).await;
            match got {
                Ok(Reservation::Granted { .. }) => {
                    self.granted.fetch_add(1, Ordering::Relaxed);
                    self.granted_calls.fetch_add(calls, Ordering::Relaxed);
                }
                _ => {
                    self.booked.fetch_add(1, Ordering::Relaxed);
                }
            }
            got
        })
    }

    fn peek<'a>(
        &'a self,
        key: &'a str,
    ) -> futures::future::BoxFuture<'a, Result<Option<Booked>, LedgerError>> {
        Box::pin(async move {
            tokio::time::sleep(Duration::from_millis(3)).await;
            self.peeks.fetch_add(1, Ordering::Relaxed);
            self.schedule.peek(key).await
        })
    }
}

// ---------------------------------------------------------------------------------------------
// The provider: requests and tokens per minute, as two continuously refilled buckets

/// One limit: refilled continuously at `per_minute`, holding at most `burst_ms` worth.
struct Bucket {
    per_minute: f64,
    level: f64,
    at: Millis,
    burst_ms: f64,
}

impl Bucket {
    fn new(per_minute: u64, burst_ms: f64, now: Millis) -> Self {
        let per_minute = per_minute as f64;
        Bucket {
            per_minute,
            level: per_minute * burst_ms / 60_000.0,
            at: now,
            burst_ms,
        }
    }

    fn refill(&mut self, now: Millis) {
        let cap = self.per_minute * self.burst_ms / 60_000.0;
        self.level = (self.level + (now - self.at) as f64 * self.per_minute / 60_000.0).min(cap);
        self.at = now;
    }

    /// The wait until `n` is available (0 when it is now).
    fn wait_ms(&self, n: f64) -> Millis {
        if self.level >= n {
            0
        } else {
            ((n - self.level) * 60_000.0 / self.per_minute).ceil() as Millis
        }
    }
}

#[derive(Clone)]
struct LimitedProvider {
    limits: Arc<Mutex<(Bucket, Bucket)>>,
    clock: VirtualClock,
    counters: Arc<Counters>,
    rng: Arc<Mutex<fastrand::Rng>>,
    call_ms: (u64, u64),
    /// Jobs whose model ran, and when each was first admitted.
    admitted: Arc<Mutex<HashMap<String, Millis>>>,
    /// When the burst arrived.
    start: Millis,
}

/// The tokens a request is charged when it arrives: its prompt (4 bytes a token) and the
/// `max_tokens` of its parameters, which is what reaches the provider.
fn charged_tokens(req: &ProviderRequest<'_>) -> u64 {
    let prompt = req
        .input
        .get("prompt")
        .and_then(|p| p.as_str())
        .map_or(0, str::len) as u64;
    let max_tokens = req
        .input
        .get("parameters")
        .and_then(|p| p.get("max_tokens"))
        .and_then(serde_json::Value::as_u64)
        .unwrap_or(0);
    prompt.div_ceil(4) + max_tokens
}

impl Provider for LimitedProvider {
    async fn call(&self, req: &ProviderRequest<'_>) -> Result<Answer, ProviderError> {
        tokio::time::sleep(Duration::from_millis(30)).await;
        let now = self.clock.now_ms();
        let minute = usize::try_from((now - self.start) / 60_000).unwrap_or_default();
        let tokens = charged_tokens(req) as f64;
        let refused = {
            let mut limits = self.limits.lock().expect("limits");
            let (requests, token_bucket) = &mut *limits;
            requests.refill(now);
            token_bucket.refill(now);
            let wait = requests.wait_ms(1.0).max(token_bucket.wait_ms(tokens));
            if wait == 0 {
                requests.level -= 1.0;
                token_bucket.level -= tokens;
                None
            } else {
                Some(wait)
            }
        };
        if let Some(wait) = refused {
            self.counters.throttled.fetch_add(1, Ordering::Relaxed);
            self.counters.minute(minute, false);
            // Retry-After in whole seconds, as most gateways send it.
            return Err(ProviderError::Throttled {
                retry_after_ms: Some((wait + 999) / 1_000 * 1_000),
                reason: "HTTP 429 rate_limit_exceeded".into(),
            });
        }
        self.counters.executed.fetch_add(1, Ordering::Relaxed);
        self.counters.minute(minute, true);
        self.counters
            .tokens
            .fetch_add(tokens as u64, Ordering::Relaxed);
        self.admitted
            .lock()
            .expect("admitted")
            .entry(req.job_id.to_owned())
            .or_insert(now);
        let took = {
            let (lo, hi) = self.call_ms;
            self.rng.lock().expect("rng").u64(lo..=hi.max(lo))
        };
        tokio::time::sleep(Duration::from_millis(took)).await;
        Ok(Answer {
            body: format!(r#"{{"job":"{}","summary":"ok"}}"#, req.job_id),
            provider_ref: None,
            finish: fenced_jobs::job::contract::Finish::Stop,
            usage: None,
            model: None,
            response_id: None,
        })
    }
}

// ---------------------------------------------------------------------------------------------
// The run

fn settings(config: &ScaleConfig) -> Settings {
    let mut s = Settings {
        max_concurrency: 10,
        lease_ms: 60_000,
        queue_visibility_s: 30,
        heartbeat_ms: 10_000,
        skew_ms: 2_000,
        provider_timeout_ms: 120_000,
        deadline_margin_ms: 5_000,
        ..Settings::default()
    };
    s.visibility.paced_spread_s = config.paced_spread_s;
    s.visibility.max_receive_count = config.max_receive;
    s.tenant_pacing_percent = config.tenant_percent;
    s.producer_pacing_percent = config.producer_percent;
    if config.rotating {
        s.producers = Producers::parse(PRODUCERS, "").expect("the run's producers");
    }
    if let Some(share) = config.schedule_share {
        // The tenants' caps are shares of the limits the worker is configured with.
        s.pacing.limits = Limits {
            rpm: (config.rpm as f64 * share) as u64,
            tpm: (config.tpm as f64 * share) as u64,
        };
    }
    s
}

/// Runs the burst; call inside a current-thread runtime whose clock is paused.
pub async fn run(config: &ScaleConfig) -> ScaleReport {
    let clock = VirtualClock::start();
    let start = clock.now_ms();
    let counters = Arc::new(Counters::default());
    let table = Arc::new(InMemoryLedger::new());
    let new_queue = || {
        Arc::new(Queue {
            state: Mutex::new(QueueState::default()),
            visibility_ms: 30_000,
            max_receive: config.max_receive,
            fair: config.fair,
        })
    };
    let queue = new_queue();
    let urgent_queue = new_queue();
    let mut rng = fastrand::Rng::with_seed(config.seed);
    let deadline = fenced_jobs::job::message::format_rfc3339_ms(start + 4 * 3_600_000);
    let mut job_ids = Vec::with_capacity(config.jobs);
    // Prompts of 100 to 1,500 tokens, answers of up to 300.
    let body = |rng: &mut fastrand::Rng, job_id: &str, tenant: Option<&str>, urgent: bool| {
        let prompt = "w".repeat(rng.usize(400..=6_000));
        let tenant = tenant.map_or(String::new(), |t| format!(r#","tenant":"{t}""#));
        let priority = if urgent {
            r#","priority":"urgent""#
        } else {
            ""
        };
        format!(
            r#"{{"job_id":"{job_id}","contract":"scale.v1","deadline_at":"{deadline}","max_attempts":3{tenant}{priority},"input":{{"model":"m","parameters":{{"max_tokens":300}},"prompt":"{prompt}"}}}}"#
        )
    };
    for i in 0..config.jobs {
        let job_id = format!("job-{i:06}");
        if config.rotating {
            // The next of a thousand tenants and of a thousand message groups, in turn.
            let tenant = format!("t{}", i % ROTATED);
            let body = body(&mut rng, &job_id, Some(&tenant), false);
            let group = format!("g{}", (i * 7) % ROTATED);
            queue.push(body, (&group, BULK), start);
            job_ids.push(format!("bulk/{job_id}"));
            continue;
        }
        let body = body(&mut rng, &job_id, config.burst_tenant, false);
        queue.push(body, (config.burst_tenant.unwrap_or_default(), ""), start);
        job_ids.push(job_id);
    }
    // The trickle: each job submitted at its moment, to the urgent queue if it has one.
    let mut trickle = Vec::new();
    for i in 0..config.trickle.map_or(0, |t| t.jobs) {
        let Some(spec) = config.trickle else { break };
        let job_id = format!("trickle-{i:04}");
        let at = start + i as Millis * spec.every_ms;
        let body = body(&mut rng, &job_id, spec.tenant, spec.urgent);
        let to = if spec.urgent && config.urgent_concurrency > 0 {
            &urgent_queue
        } else {
            &queue
        };
        let job_id = if config.rotating {
            // Its own account's group, as jobctl sends it.
            let account = format!("steady/{}", spec.tenant.unwrap_or("(none)"));
            to.push(body, (&account, STEADY), at);
            format!("steady/{job_id}")
        } else {
            to.push(body, (spec.tenant.unwrap_or_default(), ""), at);
            job_id
        };
        trickle.push((job_id.clone(), at));
        job_ids.push(job_id);
    }
    let provider = LimitedProvider {
        limits: Arc::new(Mutex::new((
            Bucket::new(config.rpm, 10_000.0, start),
            Bucket::new(config.tpm, 10_000.0, start),
        ))),
        clock: clock.clone(),
        counters: Arc::clone(&counters),
        rng: Arc::new(Mutex::new(fastrand::Rng::with_seed(config.seed ^ 0x5eed))),
        call_ms: config.call_ms,
        admitted: Arc::new(Mutex::new(HashMap::new())),
        start,
    };
    let schedule = Arc::new(CountingSchedule::default());
    let limits = config
        .schedule_share
        .map_or(Limits::default(), |share| Limits {
            rpm: (config.rpm as f64 * share) as u64,
            tpm: (config.tpm as f64 * share) as u64,
        });
    let invocations = Arc::new(AtomicU64::new(0));
    let invocation_ms = Arc::new(AtomicU64::new(0));
    let deliveries = Arc::new(AtomicU64::new(0));
    let remaining = Arc::new(AtomicU64::new(job_ids.len() as u64));
    let horizon = start + 6 * 3_600_000;

    // The work queue's consumers, then the urgent queue's (their own event source mapping).
    let queues = std::iter::repeat_n(&queue, config.concurrency).chain(std::iter::repeat_n(
        &urgent_queue,
        config.urgent_concurrency,
    ));
    let consumers = queues.enumerate().map(|(c, queue)| {
        let percent = u64::from(config.urgent_percent);
        let pacer = |limits: Limits, key: &str| {
            Pacer::new(
                PacingSettings {
                    limits,
                    key: key.to_owned(),
                    max_in_flight: config.batch_size as u32,
                    ..config.pacing.clone()
                },
                Some(Arc::clone(&schedule) as Arc<dyn CallSchedule>),
            )
        };
        let mut processor = Processor::new(
            Arc::clone(&table),
            provider.clone(),
            clock.clone(),
            settings(config),
        )
        .with_tenant_schedule(Arc::clone(&schedule) as Arc<dyn CallSchedule>);
        if percent > 0 && limits.any() {
            processor = processor
                .with_pacer(pacer(limits.share(100 - percent), "provider"))
                .with_urgent_pacer(pacer(limits.share(percent), "provider#urgent"));
        } else {
            processor = processor.with_pacer(pacer(limits, "provider"));
        }
        let handler = BatchHandler::new(
            processor,
            ScaleVisibility {
                queue: Arc::clone(queue),
                clock: clock.clone(),
                counters: Arc::clone(&counters),
            },
        )
        .with_seed(config.seed.wrapping_add(c as u64));
        let (queue, clock, counters) = (Arc::clone(queue), clock.clone(), Arc::clone(&counters));
        let (invocations, invocation_ms, deliveries) = (
            Arc::clone(&invocations),
            Arc::clone(&invocation_ms),
            Arc::clone(&deliveries),
        );
        let (remaining, table) = (Arc::clone(&remaining), Arc::clone(&table));
        let batch_size = config.batch_size;
        let mut rng = fastrand::Rng::with_seed(config.seed.wrapping_mul(31).wrapping_add(c as u64));
        async move {
            // A long poll: one request answers when messages arrive or after 20 s empty.
            let mut polling_since: Option<Millis> = None;
            while remaining.load(Ordering::Relaxed) > queue.dead_lettered()
                && clock.now_ms() < horizon
            {
                let now = clock.now_ms();
                if polling_since.is_none_or(|since| now - since >= 20_000) {
                    counters.sqs.fetch_add(1, Ordering::Relaxed);
                    polling_since = Some(now);
                }
                let records = match queue.receive(now, batch_size) {
                    Ok(records) => records,
                    Err(next) => {
                        let wait = next.map_or(20_000, |at| (at - now).clamp(0, 20_000));
                        let jitter = rng.i64(1..=200);
                        tokio::time::sleep(Duration::from_millis((wait + jitter) as u64)).await;
                        continue;
                    }
                };
                polling_since = None;
                deliveries.fetch_add(records.len() as u64, Ordering::Relaxed);
                let n = invocations.fetch_add(1, Ordering::Relaxed);
                let mut event = SqsEvent::default();
                event.records = records;
                let began = clock.now_ms();
                let inv = Invocation {
                    id: format!("inv-{n}"),
                    deadline: Some(began + 300_000),
                };
                let report = handler.handle_batch(&event, &inv).await;
                invocation_ms.fetch_add((clock.now_ms() - began) as u64, Ordering::Relaxed);
                let Ok(failed) = report.response else {
                    continue;
                };
                let mut deleted = 0;
                for record in &event.records {
                    let id = record.message_id.as_deref().unwrap_or_default();
                    if failed.iter().any(|f| f == id) {
                        continue;
                    }
                    queue.delete(record.receipt_handle.as_deref().unwrap_or_default());
                    deleted += 1;
                    let job_id = record
                        .body
                        .as_deref()
                        .and_then(|b| fenced_jobs::job::parse_trigger(Some(b)).ok())
                        .map(|t| scoped(record, t.job_id()));
                    if let Some(job_id) = job_id {
                        let done = table.get(&job_id).await.ok().flatten();
                        if done.is_some_and(|r| r.state.is_terminal()) {
                            remaining.fetch_sub(1, Ordering::Relaxed);
                        }
                    }
                }
                counters
                    .sqs
                    .fetch_add((deleted as u64).div_ceil(10), Ordering::Relaxed);
            }
        }
    });
    // The jobs not yet ended, sampled at each minute's start.
    let sampler = async {
        let mut open = Vec::new();
        while remaining.load(Ordering::Relaxed) > queue.dead_lettered() && clock.now_ms() < horizon
        {
            open.push(remaining.load(Ordering::Relaxed));
            tokio::time::sleep(Duration::from_secs(60)).await;
        }
        open
    };
    let (_, open) = futures::join!(futures::future::join_all(consumers), sampler);

    let mut report = ScaleReport {
        executed: counters.executed.load(Ordering::Relaxed),
        throttled: counters.throttled.load(Ordering::Relaxed),
        tokens: counters.tokens.load(Ordering::Relaxed),
        drain_ms: clock.now_ms() - start,
        invocations: invocations.load(Ordering::Relaxed),
        invocation_ms: invocation_ms.load(Ordering::Relaxed),
        deliveries: deliveries.load(Ordering::Relaxed),
        ledger_writes: table.writes() + schedule.schedule.writes(),
        schedule_reads: schedule.peeks.load(Ordering::Relaxed),
        sqs_requests: counters.sqs.load(Ordering::Relaxed),
        dead_lettered: queue.dead_lettered(),
        ..ScaleReport::default()
    };
    let mut minutes = counters.minutes.lock().expect("minutes").clone();
    minutes.resize(minutes.len().max(open.len()), Minute::default());
    for (minute, open) in minutes.iter_mut().zip(open) {
        minute.open = open;
    }
    report.minutes = minutes;
    report.reservations = (
        schedule.granted.load(Ordering::Relaxed),
        schedule.granted_calls.load(Ordering::Relaxed),
        schedule.booked.load(Ordering::Relaxed),
    );
    for (job_id, submitted) in &trickle {
        let item = table.get(job_id).await.ok().flatten();
        let latency = match item {
            Some(r) if r.state == JobState::Succeeded => r.updated_at - submitted,
            _ => clock.now_ms() - start,
        };
        report.trickle_latency.push(latency);
    }
    report.trickle_latency.sort_unstable();
    let admitted = provider.admitted.lock().expect("admitted").clone();
    report.admission_ms = admitted.values().max().map_or(0, |at| at - start);
    for job_id in &job_ids {
        let item = table.get(job_id).await.ok().flatten();
        let state = item.as_ref().map_or("absent", |r| r.state.as_str());
        *report.end_states.entry(state.to_owned()).or_default() += 1;
        let lost = item.as_ref().is_some_and(|r| {
            matches!(r.state, JobState::FailedTerminal | JobState::Expired)
                && !admitted.contains_key(job_id)
        });
        report.failed_by_throttling += u64::from(lost);
    }
    report
}

/// How many tenants and message groups the rotating producer names its jobs with, in turn.
const ROTATED: usize = 1_000;

/// The producers of a run with two (`rotating`), by the principal SQS names.
const PRODUCERS: &str = "bulk=AROABULK,steady=AROASTEADY";
/// The burst's producer's principal.
const BULK: &str = "AROABULK";
/// The trickle's producer's principal.
const STEADY: &str = "AROASTEADY";

/// The whole id of the job `job_id` a delivered `record` names, in its sender's namespace.
fn scoped(record: &SqsMessage, job_id: &str) -> String {
    match record.attributes.get("SenderId").map(String::as_str) {
        Some(BULK) => format!("bulk/{job_id}"),
        Some(STEADY) => format!("steady/{job_id}"),
        _ => job_id.to_owned(),
    }
}

/// Runs the burst on its own current-thread runtime with a paused clock.
pub fn run_blocking(config: &ScaleConfig) -> ScaleReport {
    crate::sim::in_virtual_time(run(config))
}
