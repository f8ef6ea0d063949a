//! A seeded, reproducible model of the world around the real handler: a standard SQS queue with
//! a DLQ, Lambda consumers that crash, pause and time out, a DynamoDB ledger that throttles and
//! loses responses, and a provider with a long-tailed latency, errors, hangs and lost
//! connections. Time is virtual (tokio's paused clock), so hours pass in seconds and a seed
//! replays the same run.
//!
//! The handler, processor, heartbeat and ledger contract are the crate's own; only the world
//! around them is modelled. Invariants are checked as the run goes and at its end.
//!
//! Why this file is long: the world's parts (queue, consumers, ledger client, provider) share
//! one private state and one set of fault counters; the sections below (SQS, Lambda, DynamoDB,
//! provider, the run) are where it would split.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_lambda_events::event::sqs::{SqsEvent, SqsMessage};
use fenced_jobs::blobs::{BlobError, BlobStore, MemoryBlobs, read_checked};
use fenced_jobs::clock::Clock;
use fenced_jobs::job::contract::{Contracts, Finish};
use fenced_jobs::job::{
    AttemptOutcome, BlobRef, JobItem, JobState, Millis, ResultBody, parse_trigger,
};
use fenced_jobs::ledger::memory::InMemoryLedger;
use fenced_jobs::ledger::transitions::known_after_end;
use fenced_jobs::ledger::{
    AttemptEnd, CancelRequest, ClaimRequest, CreateRequest, DecideRequest, EndRequest,
    EnqueuedRequest, JobLedger, LedgerError, RecordRefRequest, RecoverRequest, RenewRequest,
    SettleRequest, Write,
};
use fenced_jobs::ledger::{IndexCursor, LedgerIndex};
use fenced_jobs::ops::dispatch::{StreamChange, StreamEvent, StreamRecord};
use fenced_jobs::ops::operator::redrive_live;
use fenced_jobs::protocol::ReplayPolicy;
use fenced_jobs::protocol::routing::ModelMap;
use fenced_jobs::provider::{Answer, Provider, ProviderError, ProviderRequest, Retrieval};
use fenced_jobs::queue::{
    ChangeResult, ChangeResults, DeadLetter, DeadLetterQueue, Message, Outgoing, QueueError,
    QueueReader, Received, Sent, TriggerSender, VisibilityChange, VisibilityControl,
};
use fenced_jobs::worker::Settings;
use fenced_jobs::worker::handler::BatchHandler;
use fenced_jobs::worker::processor::{Invocation, Processor};

const QUEUE_ARN: &str = "arn:aws:sqs:us-east-1:123456789012:chaos";
const START_MS: Millis = 1_800_000_000_000;

/// Within how many reconciler runs a job with no trigger must be re-sent once it is due (a
/// page a run is a fiftieth of the jobs, and a read that fails skips a job for one run).
const UNSENT_FOUND_WITHIN_RUNS: usize = 4;

/// How a run is set up.
#[derive(Debug, Clone)]
pub struct ChaosConfig {
    /// Seed of every random choice.
    pub seed: u64,
    /// Jobs submitted at the start.
    pub jobs: usize,
    /// Concurrent Lambda consumers.
    pub consumers: usize,
    /// Records per invocation.
    pub batch_size: usize,
    /// Fault probabilities; all zero turns faults off.
    pub faults: FaultRates,
    /// A mixed backlog (`--mixed`) instead of the faulty world's jobs: who picks each job's
    /// path.
    pub mix: Option<Mix>,
}

/// Who picks each job's path in a mixed backlog: jobs sent over two hours, due five minutes
/// to two days after, in a world whose provider answers slower on flex, ends most batches
/// within the hour and some only within the day, and refuses flex and batches at random.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mix {
    /// The worker chooses by deadline and price (`PATHS=batch,flex`); `webhooks`: the
    /// provider announces each batch's end.
    Chooser { webhooks: bool },
    /// Every job at the standard price (`PATHS` unset, nothing deferrable).
    Standard,
    /// The producer marks `deferrable` each job due [`BY_HAND_FROM_MS`] or more after it
    /// sends it; the others go at the standard price.
    ByHand,
}

/// The shortest deadline a producer choosing by hand sends in a batch: the providers' 24-hour
/// completion window, and an hour for a standard call should the batch fail.
pub const BY_HAND_FROM_MS: Millis = 25 * 3_600_000;

/// The probability of each fault, per opportunity.
#[derive(Debug, Clone, Default)]
pub struct FaultRates {
    /// A receive also returns a message that is in flight (a second delivery).
    pub duplicate_delivery: f64,
    /// A trigger carrying only the job id arrives beside a job's own message (an operator's or
    /// a second sender's): it may find an item that keeps no input, and must then wait for the
    /// job's message rather than call without it.
    pub stray_trigger: f64,
    /// A deleted message comes back once.
    pub delivery_after_delete: f64,
    /// A visibility change fails (not applied) or times out (applied, no answer).
    pub visibility_failure: f64,
    /// A delete fails (the message stays).
    pub delete_failure: f64,
    /// An invocation's process vanishes at a random moment (no response).
    pub crash: f64,
    /// An invocation's worker stops the world for longer than the lease.
    pub pause: f64,
    /// A ledger call is throttled (not applied).
    pub ddb_throttle: f64,
    /// A ledger call times out: applied or not, the response is lost.
    pub ddb_timeout: f64,
    /// The provider refuses before doing the work with a 503.
    pub provider_transient: f64,
    /// The provider refuses for its rate limit before doing the work (a 429 with
    /// `Retry-After`): the attempt must be given back, never spent.
    pub provider_throttle: f64,
    /// The provider rejects the request for good.
    pub provider_permanent: f64,
    /// The provider never answers.
    pub provider_hang: f64,
    /// The provider is overloaded and refuses before any work (Anthropic's 529): the next
    /// provider of the list takes the job.
    pub provider_overloaded: f64,
    /// The answer streams, then goes silent: the progress rule finds the call hung, and it may
    /// have run.
    pub stalled_stream: f64,
    /// A deferrable job (one in five): its attempts go as lines of the provider's batches.
    pub deferrable: f64,
    /// A batch is created upstream and the answer to its create is lost: its lines' owners
    /// record their pending references and whoever looks next finds the batch by listing.
    pub batch_answer_lost: f64,
    /// A batch's create is refused before anything is made: for now (a 429 or an overload:
    /// its lines given back) or for good (a 4xx: their attempts spent).
    pub batch_refused: f64,
    /// An ended batch's results file comes cut off, missing lines: they must be read again,
    /// never taken for lines that did not run.
    pub batch_results_cut: f64,
    /// With webhooks (every other pair of seeds), an ended batch's webhook never comes: its
    /// records' own looks collect the answers.
    pub webhook_lost: f64,
    /// The webhook comes again later (OpenAI's retry, or a replay): it must send nothing more.
    pub webhook_again: f64,
    /// A stranger's webhook naming the batch, signed with another secret: refused, nothing sent.
    pub webhook_forged: f64,
    /// The webhook function is cut off after its triggers went, before it recorded the
    /// delivery: the sender's retry a minute later must be acted on again, not refused.
    pub webhook_cut_off: f64,
    /// The flex tier refuses a call the worker sent by it, for its capacity (a 429), before
    /// any work: the attempt is given back at once and the job's next claim takes another path.
    pub flex_refused: f64,
    /// A job's deadline is more than a day away: the worker chooses a batch for it though it
    /// did not ask, and its claim, its send and its price must all say batch.
    pub long_deadline: f64,
    /// The provider ran the call and the connection was lost before the answer.
    pub connection_lost: f64,
    /// A provider forgets a call (retrieval answers "not found").
    pub provider_forgets: f64,
    /// A gateway answers an error status (502, 504, 524, 409, a bare 500, 429 or 503) after
    /// the model ran;
    /// the worker classifies it with the real OpenAI status table.
    pub gateway_error: f64,
    /// The model's answer is too large for a ledger item.
    pub oversized_answer: f64,
    /// A ledger call stalls for minutes instead of failing (an unbounded client).
    pub ddb_stall: f64,
    /// A provider retrieval stalls for minutes.
    pub retrieval_stall: f64,
    /// A provider retrieval is refused (a 429 or 5xx: ask again; a 401/403: denied).
    pub retrieval_error: f64,
    /// An invocation gets a short timeout (8 to 40 s), so claims come late in it.
    pub short_invocation: f64,
    /// A worker stops the world past its lease while its messages stay invisible, so nobody
    /// takes its jobs over.
    pub lapse_alone: f64,
    /// The answer is above the inline limit: it is stored in the results bucket (by the
    /// consumers that have one) before its acceptance.
    pub large_answer: f64,
    /// A results-bucket call (a write before an acceptance, a removal after a refusal) fails.
    pub store_error: f64,
    /// A write to the results bucket lands, and its answer is lost (the caller sees a failure).
    pub store_lost_answer: f64,
    /// The job's input is above the inline limit: the consumers with a results bucket store it
    /// before the claim, and a trigger carrying only the job id reads it back.
    pub large_input: f64,
    /// A stored input read back is gone (a lifecycle rule shorter than the job): its live job is
    /// never poison, and ends `failed_terminal` when it would be claimed.
    pub input_expired: f64,
    /// A producer writes a job's item and stops before sending its trigger: only the
    /// reconciler's walk of the index finds it, past the jobs sent before it.
    pub trigger_never_sent: f64,
    /// A results-bucket call takes seconds instead of milliseconds (every call takes some
    /// time), so an owner's write, a recovery's read and a refused owner's removal interleave
    /// with the other owners' ledger writes.
    pub store_slow: f64,
    /// Poison messages among the jobs (a fraction of the job count): the worker dead-letters them.
    pub poison_message: f64,
    /// Jobs due further away than the redrive count carries them (a fraction of the job count):
    /// the worker refuses them at their first sight and dead-letters them with their reason,
    /// before anything is written.
    pub deadline_past_reach: f64,
    /// The worker's send to the DLQ fails (the record falls back to visibility 0).
    pub dlq_send_failure: f64,
    /// The answer is kept inline and carried whole in its completion event (30 to 60 KB): a
    /// few of them fill one EventBridge or SNS request.
    pub event_sized_answer: f64,
    /// A request of the dispatcher to the events' target fails (the stream batch is retried
    /// from its first unpublished record).
    pub event_publish_failure: f64,
    /// A claim is applied and its answer lost, and so is the read that follows it: the worker
    /// reads again and makes the call.
    pub claim_and_read_lost: f64,
    /// A worker stops the world just after its claim is answered, for longer than the lease,
    /// and resumes where it was: before its call.
    pub pause_after_claim: f64,
    /// A worker stops the world just before it asks to accept an answer it stored in the
    /// results bucket, for longer than the lease: a recovery may fence it and accept that same
    /// object meanwhile, while the paused owner's refused acceptance comes back to it.
    pub pause_before_stored_accept: f64,
    /// The model answers complete JSON that the jobs' contract (`chaos.v1`) refuses.
    pub invalid_answer: f64,
    /// The model runs out of tokens: its answer is cut in half, finish `length`.
    pub truncated_answer: f64,
    /// Another producer sends a job under an id the first producer uses, with its own input,
    /// before the first's (a fraction of the job count).
    pub foreign_job_id: f64,
    /// Another producer sends a body that is not a job, naming the first producer's job in the
    /// attribute the worker's dead letters name jobs in (a fraction of the job count).
    pub planted_job_attribute: f64,
    /// An operator cancels a job picked at random (a chance per virtual minute), whatever it
    /// is doing: once the cancel is written, the job must end `cancelled` (or `expired`).
    pub operator_cancel: f64,
    /// A message is lost for good: after a crash, a backlogged message's retention ends while
    /// its owner is down; at the operator's pass, a dead letter of a live job is dropped instead
    /// of redriven. Every such job still ends terminal: re-sent by the reconciler when its item
    /// keeps its input, or found in the due index at its deadline and expired `message_lost`.
    pub message_lost: f64,
    /// A job's message is dead-lettered by the redrive policy when it is about to be delivered
    /// (a chance per receive), as after a run of receives that each ended before writing the
    /// job (a worker that crashes on it). The reconciler's sweep (every 10 minutes) must send it
    /// back within three sweeps that read the DLQ through, whether the job's item keeps its
    /// input or not.
    pub crash_loop: f64,
    /// A job's message waited in a backlog (half the jobs): SQS's retention (4 days, the worker's default)
    /// deletes it one to six hours after it first becomes visible, whatever its job is doing.
    /// Its first claim lists the job in the due index (the message may be gone before the
    /// deadline); a message SQS keeps is never lost.
    pub backlogged: f64,
}

impl FaultRates {
    /// A mixed backlog's: no fault but the paths' own refusals (flex capacity, a batch's
    /// create), as the providers give them.
    pub fn paths() -> Self {
        FaultRates {
            flex_refused: 0.2,
            batch_refused: 0.05,
            ..FaultRates::default()
        }
    }

    /// Every fault kind enabled.
    pub fn all() -> Self {
        FaultRates {
            duplicate_delivery: 0.02,
            stray_trigger: 0.02,
            delivery_after_delete: 0.01,
            visibility_failure: 0.02,
            delete_failure: 0.02,
            crash: 0.02,
            pause: 0.05,
            ddb_throttle: 0.01,
            ddb_timeout: 0.01,
            provider_transient: 0.03,
            provider_throttle: 0.05,
            provider_permanent: 0.01,
            provider_hang: 0.005,
            provider_overloaded: 0.03,
            stalled_stream: 0.005,
            deferrable: 0.2,
            batch_answer_lost: 0.1,
            batch_refused: 0.05,
            batch_results_cut: 0.05,
            webhook_lost: 0.1,
            webhook_again: 0.2,
            webhook_forged: 0.1,
            webhook_cut_off: 0.1,
            flex_refused: 0.2,
            long_deadline: 0.03,
            connection_lost: 0.02,
            provider_forgets: 0.2,
            gateway_error: 0.02,
            oversized_answer: 0.003,
            ddb_stall: 0.002,
            retrieval_stall: 0.02,
            retrieval_error: 0.03,
            short_invocation: 0.05,
            lapse_alone: 0.01,
            large_answer: 0.05,
            store_error: 0.05,
            store_slow: 0.05,
            store_lost_answer: 0.1,
            large_input: 0.03,
            input_expired: 0.2,
            trigger_never_sent: 0.02,
            poison_message: 0.01,
            deadline_past_reach: 0.005,
            dlq_send_failure: 0.2,
            pause_after_claim: 0.01,
            claim_and_read_lost: 0.01,
            event_publish_failure: 0.1,
            event_sized_answer: 0.4,
            pause_before_stored_accept: 0.3,
            invalid_answer: 0.03,
            truncated_answer: 0.03,
            foreign_job_id: 0.01,
            planted_job_attribute: 0.005,
            message_lost: 0.3,
            crash_loop: 0.003,
            backlogged: 0.5,
            operator_cancel: 0.3,
        }
    }
}

/// What a run found.
#[derive(Debug, Clone, Default)]
pub struct ChaosReport {
    /// Jobs.
    pub jobs: usize,
    /// Records delivered to invocations.
    pub deliveries: u64,
    /// Invocations started.
    pub invocations: u64,
    /// Faults injected, by kind.
    pub faults: BTreeMap<&'static str, u64>,
    /// Invariant violations (empty on a good run).
    pub violations: Vec<String>,
    /// Provider executions per job: mean and max.
    pub executions_mean: f64,
    /// See `executions_mean`.
    pub executions_max: u64,
    /// Jobs by final state.
    pub end_states: BTreeMap<String, u64>,
    /// Virtual time the run took.
    pub virtual_ms: Millis,
    /// The deployment took the provider's webhooks (`BATCH_WEBHOOKS=on`).
    pub webhooks: bool,
    /// For each job that succeeded from a batch's line: the time from the batch's end to the
    /// job's `succeeded`.
    pub batch_to_succeeded_ms: Vec<Millis>,
    /// What the model's executions cost at the deployment's prices, each at its model's and
    /// path's, micro-dollars (a mixed backlog's, whose calls report their usage).
    pub model_cost_micros: u64,
    /// Jobs that succeeded by their deadline.
    pub met_deadline: u64,
    /// The model's executions (each one paid), whichever provider ran them, by the path each
    /// took.
    pub paid_by_path: BTreeMap<&'static str, u64>,
}

/// Virtual wall-clock time: tokio's (paused) clock from a fixed start.
#[derive(Clone)]
pub struct VirtualClock {
    origin: tokio::time::Instant,
}

impl VirtualClock {
    /// A clock at the run's fixed start.
    pub fn start() -> Self {
        VirtualClock {
            origin: tokio::time::Instant::now(),
        }
    }
}

impl Clock for VirtualClock {
    fn now_ms(&self) -> Millis {
        START_MS + self.origin.elapsed().as_millis() as Millis
    }
}

/// Shared state of the world: randomness, fault counts, violations.
struct World {
    rng: Mutex<fastrand::Rng>,
    rates: FaultRates,
    faults: Mutex<BTreeMap<&'static str, u64>>,
    violations: Mutex<Vec<String>>,
    clock: VirtualClock,
    /// Terminal states and results as first seen, to catch any later change.
    terminal: Mutex<HashMap<String, Terminal>>,
    /// The results bucket the even-numbered consumers and the reconciler share.
    bucket: Arc<MemoryBlobs>,
    /// Jobs whose next read fails (the read-back after a claim whose answer was lost).
    failing_reads: Mutex<std::collections::HashSet<String>>,
    /// The table's stream: a record for every write that changed a job's state, in order,
    /// with each job's state before (the dispatcher reads only the two states and the item).
    stream: Mutex<(HashMap<String, JobState>, Vec<StreamRecord>)>,
    /// Jobs whose producer never sent a trigger: when each was written, and when the
    /// reconciler first sent one.
    unsent: Mutex<HashMap<String, (Millis, Option<Millis>)>>,
    /// Jobs whose cancel an operator wrote.
    cancelled: Mutex<Vec<String>>,
    /// When each reconciler run started and ended.
    reconciler_runs: Mutex<Vec<(Millis, Millis)>>,
    /// When each reconciler sweep of the DLQ started that read it through.
    clean_sweeps: Mutex<Vec<Millis>>,
    /// Each batch created: its id and when it ends.
    batch_ends: Mutex<Vec<(String, Millis)>>,
    /// Jobs whose message was lost for good (`message_lost`).
    lost: Mutex<Vec<String>>,
    /// The mixed backlog's deployment, if the run is one.
    mix: Option<Mix>,
    /// The model's executions by model and path (`standard`, `flex`, `batch`).
    executed: Mutex<BTreeMap<(String, &'static str), u64>>,
}

/// A terminal item as first seen: state, inline answer, stored answer.
type Terminal = (JobState, Option<String>, Option<BlobRef>);

impl World {
    fn roll(&self, p: f64) -> bool {
        p > 0.0 && self.rng.lock().expect("rng").f64() < p
    }

    /// Adds a stream record for a write that changed the job's state.
    fn streamed(&self, record: &JobItem) {
        let mut stream = self.stream.lock().expect("stream");
        let (states, records) = &mut *stream;
        let before = states.insert(record.job_id.clone(), record.state);
        if before == Some(record.state) {
            return;
        }
        let image = |state: JobState| {
            let mut m = serde_json::Map::new();
            m.insert("state".into(), serde_json::json!({ "S": state.as_str() }));
            m
        };
        let new_image = fenced_jobs::ledger::dynamodb::to_json_image(
            &fenced_jobs::ledger::dynamodb::encode(record),
        );
        let sequence = records.len().to_string();
        records.push(StreamRecord {
            event_name: Some(if before.is_some() { "MODIFY" } else { "INSERT" }.into()),
            dynamodb: StreamChange {
                new_image: new_image.as_object().cloned(),
                old_image: before.map(image),
                sequence_number: Some(sequence),
                keys: None,
            },
        });
    }

    fn fault(&self, kind: &'static str, p: f64) -> bool {
        let hit = self.roll(p);
        if hit {
            *self.faults.lock().expect("faults").entry(kind).or_default() += 1;
        }
        hit
    }

    /// How many of the reconciler's sweeps read the DLQ through since `at`.
    fn clean_sweeps_since(&self, at: Millis) -> usize {
        let sweeps = self.clean_sweeps.lock().expect("sweeps");
        sweeps.iter().filter(|t| **t > at).count()
    }

    /// `model` ran a call on `path`.
    fn executed(&self, model: &str, path: &'static str) {
        *self
            .executed
            .lock()
            .expect("executed")
            .entry((model.to_owned(), path))
            .or_default() += 1;
    }

    fn range(&self, lo: u64, hi: u64) -> u64 {
        self.rng.lock().expect("rng").u64(lo..=hi)
    }

    fn violation(&self, what: String) {
        self.violations.lock().expect("violations").push(what);
    }

    fn now(&self) -> Millis {
        self.clock.now_ms()
    }
}

// ---------------------------------------------------------------------------------------------
// SQS

struct Msg {
    id: String,
    /// The principal SQS names as its sender (a producer's role, the reconciler's).
    sender: &'static str,
    job_id: String,
    body: String,
    receive_count: u32,
    visible_at: Millis,
    first_receive: Option<Millis>,
    /// When the current receive happened: SQS refuses a visibility past 12 hours from it.
    received_at: Millis,
    handle: u64,
    deleted: bool,
    in_dlq: bool,
    /// When it reached the DLQ.
    dead_at: Millis,
    /// A second delivery of the current one will happen at this instant (a duplicate).
    duplicate_at: Option<Millis>,
    /// The message comes back at this instant after its deletion (once).
    resurrect_at: Option<Millis>,
    /// The worker dead-lettered it as poison or a conflict (its reason attribute): a redrive
    /// leaves it.
    refused: bool,
    /// Its string attributes: the sender's, or the worker's on a dead letter.
    attributes: Vec<(String, String)>,
    /// When it was sent (`SentTimestamp`): SQS deletes it once its retention has passed.
    sent_at: Millis,
    /// It waited in a backlog: at its first receive, its retention is found to end one to six
    /// hours later.
    backlogged: bool,
    /// Sent to the urgent queue (the webhook function's triggers).
    urgent: bool,
}

/// A standard queue with a redrive policy.
struct Queue {
    msgs: Mutex<Vec<Msg>>,
    next_handle: AtomicI64,
    visibility_ms: Millis,
    max_receive: u32,
    /// `MessageRetentionPeriod`, as the worker is told it.
    retention_ms: Millis,
}

/// The record a receive of `m` hands the worker, with the attributes SQS gives it.
fn record_of(m: &Msg) -> SqsMessage {
    let mut r = SqsMessage::default();
    r.message_id = Some(m.id.clone());
    r.receipt_handle = Some(format!("{}#{}", m.id, m.handle));
    r.body = Some(m.body.clone());
    r.event_source_arn = Some(QUEUE_ARN.to_owned());
    let first = m.first_receive.unwrap_or(m.received_at);
    for (name, value) in [
        ("ApproximateReceiveCount", m.receive_count.to_string()),
        ("ApproximateFirstReceiveTimestamp", first.to_string()),
        ("SentTimestamp", m.sent_at.to_string()),
        ("SenderId", format!("{}:session", m.sender)),
    ] {
        r.attributes.insert(name.into(), value);
    }
    for (name, value) in &m.attributes {
        let mut attribute = aws_lambda_events::sqs::SqsMessageAttribute::default();
        attribute.string_value = Some(value.clone());
        attribute.data_type = Some("String".into());
        r.message_attributes.insert(name.clone(), attribute);
    }
    r
}

impl Queue {
    fn receive(&self, world: &World, max: usize) -> Vec<SqsMessage> {
        let now = world.now();
        let mut strays = Vec::new();
        let out = self.take(world, max, now, &mut strays);
        for (job_id, at) in strays {
            let body = format!(r#"{{"job_id":"{job_id}"}}"#);
            self.push(RECONCILER, &job_id, &body, at);
        }
        out
    }

    /// The messages a receive at `now` returns, and the stray triggers it plans.
    fn take(
        &self,
        world: &World,
        max: usize,
        now: Millis,
        strays: &mut Vec<(String, Millis)>,
    ) -> Vec<SqsMessage> {
        let mut msgs = self.msgs.lock().expect("queue");
        let mut out = Vec::new();
        // The urgent queue's own event source mapping receives while the work queue holds a
        // backlog: its messages are taken first.
        let (urgent, normal): (Vec<&mut Msg>, Vec<&mut Msg>) =
            msgs.iter_mut().partition(|m| m.urgent);
        for m in urgent.into_iter().chain(normal) {
            if out.len() >= max {
                break;
            }
            if m.in_dlq {
                continue;
            }
            if self.retention_passed(world, m, now) {
                continue;
            }
            if m.deleted {
                match m.resurrect_at {
                    Some(at) if at <= now => {
                        m.resurrect_at = None;
                        m.deleted = false;
                        m.visible_at = now;
                    }
                    _ => continue,
                }
            }
            if m.visible_at > now {
                // In flight: delivered again only as a planned duplicate.
                match m.duplicate_at {
                    Some(at) if at <= now => m.duplicate_at = None,
                    _ => continue,
                }
            }
            if !m.refused
                && parse_trigger(Some(&m.body)).is_ok()
                && world.fault("crash_loop", world.rates.crash_loop)
            {
                // Receives that each ended before writing the job: the redrive policy moves it.
                m.in_dlq = true;
                m.dead_at = now;
                continue;
            }
            if m.receive_count >= self.max_receive {
                m.in_dlq = true;
                m.dead_at = now;
                if parse_trigger(Some(&m.body)).is_ok() {
                    world.violation(format!(
                        "{}: a live job's message was dead-lettered after {} receives",
                        m.job_id, m.receive_count
                    ));
                }
                continue;
            }
            if m.backlogged && m.receive_count == 0 {
                let gone_at = now + world.range(3_600_000, 6 * 3_600_000) as Millis;
                m.sent_at = gone_at - self.retention_ms;
            }
            m.receive_count += 1;
            m.handle = self.next_handle.fetch_add(1, Ordering::Relaxed) as u64;
            m.visible_at = now + self.visibility_ms;
            m.received_at = now;
            if world.fault("duplicate_delivery", world.rates.duplicate_delivery) {
                m.duplicate_at =
                    Some(now + world.range(100, self.visibility_ms as u64 - 1) as Millis);
            }
            if m.receive_count == 1
                && m.body.contains("\"input\"")
                && world.fault("stray_trigger", world.rates.stray_trigger)
            {
                let at = now + world.range(1_000, 600_000) as Millis;
                strays.push((m.job_id.clone(), at));
            }
            m.first_receive.get_or_insert(now);
            out.push(record_of(m));
        }
        out
    }

    fn find<'a>(msgs: &'a mut [Msg], handle: &str) -> Option<(&'a mut Msg, bool)> {
        let (id, seq) = handle.split_once('#')?;
        let seq: u64 = seq.parse().ok()?;
        let m = msgs.iter_mut().find(|m| m.id == id)?;
        let current = m.handle == seq && !m.deleted && !m.in_dlq;
        Some((m, current))
    }

    /// Deletes by handle; an old handle "succeeds" without deleting.
    fn delete(&self, world: &World, handle: &str) {
        if world.fault("delete_failure", world.rates.delete_failure) {
            return;
        }
        let mut msgs = self.msgs.lock().expect("queue");
        match Queue::find(&mut msgs, handle) {
            Some((m, true)) => {
                m.deleted = true;
                if world.fault("delivery_after_delete", world.rates.delivery_after_delete) {
                    m.resurrect_at = Some(world.now() + world.range(1_000, 120_000) as Millis);
                }
            }
            Some((_, false)) => {
                *world
                    .faults
                    .lock()
                    .expect("faults")
                    .entry("stale_handle_delete")
                    .or_default() += 1;
            }
            None => {}
        }
    }

    fn change(&self, world: &World, handle: &str, seconds: i32) -> ChangeResult {
        if world.fault("visibility_failure", world.rates.visibility_failure / 2.0) {
            return ChangeResult::Uncertain;
        }
        let timed_out = world.fault("visibility_timeout", world.rates.visibility_failure / 2.0);
        let now = world.now();
        let mut msgs = self.msgs.lock().expect("queue");
        let result = match Queue::find(&mut msgs, handle) {
            // As SQS: past 12 hours from this receive, the change is refused, not shortened.
            Some((m, true)) if now + Millis::from(seconds) * 1000 > m.received_at + 43_200_000 => {
                world.violation(format!(
                    "{}: visibility of {seconds} s asked past 12 hours from its receive",
                    m.job_id
                ));
                ChangeResult::Refused
            }
            Some((m, true)) => {
                m.visible_at = now + Millis::from(seconds) * 1000;
                ChangeResult::Changed
            }
            _ => ChangeResult::Refused,
        };
        if timed_out {
            ChangeResult::Uncertain
        } else {
            result
        }
    }

    /// Keeps the messages of these receipt handles invisible until `until` (their visibility
    /// outlasts a pause of the worker that holds them).
    fn hold(&self, handles: &[String], until: Millis) {
        let mut msgs = self.msgs.lock().expect("queue");
        for handle in handles {
            if let Some((m, true)) = Queue::find(&mut msgs, handle) {
                m.visible_at = m.visible_at.max(until);
                m.duplicate_at = None;
            }
        }
    }

    /// A new message for a job (a producer's or the reconciler's trigger), visible from
    /// `visible_at`, sent by `sender`.
    fn push(&self, sender: &'static str, job_id: &str, body: &str, visible_at: Millis) {
        self.push_with(sender, job_id, body, visible_at, Vec::new());
    }

    /// [`Queue::push`], with string attributes.
    fn push_with(
        &self,
        sender: &'static str,
        job_id: &str,
        body: &str,
        visible_at: Millis,
        attributes: Vec<(String, String)>,
    ) {
        self.send(sender, job_id, body, visible_at, attributes, false);
    }

    /// A new message, to the urgent queue if `urgent`.
    fn send(
        &self,
        sender: &'static str,
        job_id: &str,
        body: &str,
        visible_at: Millis,
        attributes: Vec<(String, String)>,
        urgent: bool,
    ) {
        let mut msgs = self.msgs.lock().expect("queue");
        let id = format!("msg-{:06}", msgs.len());
        msgs.push(Msg {
            id,
            sender,
            job_id: job_id.to_owned(),
            body: body.to_owned(),
            receive_count: 0,
            visible_at,
            first_receive: None,
            received_at: 0,
            handle: 0,
            deleted: false,
            in_dlq: false,
            dead_at: 0,
            duplicate_at: None,
            resurrect_at: None,
            refused: false,
            attributes,
            sent_at: visible_at,
            backlogged: false,
            urgent,
        });
    }

    /// Whether SQS deletes `m` at `now`, its retention passed, delivered or not (a job's
    /// message so deleted is lost for good).
    fn retention_passed(&self, world: &World, m: &mut Msg, now: Millis) -> bool {
        if m.deleted || now < m.sent_at.saturating_add(self.retention_ms) {
            return false;
        }
        m.deleted = true;
        m.resurrect_at = None;
        m.duplicate_at = None;
        if parse_trigger(Some(&m.body)).is_ok() {
            *world
                .faults
                .lock()
                .expect("faults")
                .entry("retention_passed")
                .or_default() += 1;
            world.lost.lock().expect("lost").push(m.job_id.clone());
        }
        true
    }

    /// Ends the retention of `job_id`'s backlogged message (one whose retention ends within
    /// six hours anyway) at `now`: SQS deletes it before its next receive.
    fn retention_ends(&self, job_id: &str, now: Millis) {
        let mut msgs = self.msgs.lock().expect("queue");
        for m in msgs.iter_mut().filter(|m| m.job_id == job_id && !m.in_dlq) {
            if m.sent_at + self.retention_ms <= now + 6 * 3_600_000 {
                m.sent_at = now - self.retention_ms;
            }
        }
    }

    /// Marks the last message of `job_id` as one that waited in a backlog.
    fn backlog(&self, job_id: &str) {
        let mut msgs = self.msgs.lock().expect("queue");
        if let Some(m) = msgs.iter_mut().rev().find(|m| m.job_id == job_id) {
            m.backlogged = true;
        }
    }

    /// A message the worker sent to the DLQ itself, with the attributes it sent.
    fn dead_letter(
        &self,
        body: &str,
        job_id: Option<&str>,
        (refused, now): (bool, Millis),
        attributes: Vec<(String, String)>,
    ) {
        let mut msgs = self.msgs.lock().expect("queue");
        let id = format!("dead-{:06}", msgs.len());
        msgs.push(Msg {
            id,
            sender: WORKER,
            job_id: job_id.unwrap_or_default().to_owned(),
            body: body.to_owned(),
            receive_count: 0,
            visible_at: 0,
            first_receive: None,
            received_at: 0,
            handle: 0,
            deleted: false,
            in_dlq: true,
            dead_at: now,
            duplicate_at: None,
            resurrect_at: None,
            refused,
            attributes,
            sent_at: now,
            backlogged: false,
            urgent: false,
        });
    }

    /// Every letter the worker wrote names, in its job-id attribute, only the job the worker
    /// read from it: what a sender planted there is never carried on.
    fn check_dead_letters(&self, world: &World) {
        let msgs = self.msgs.lock().expect("queue");
        for m in msgs.iter().filter(|m| m.in_dlq && !m.deleted) {
            let named = m
                .attributes
                .iter()
                .find(|(n, _)| n == fenced_jobs::queue::JOB_ID_ATTRIBUTE);
            if let Some((_, named)) = named
                && m.refused
                && *named != m.job_id
            {
                world.violation(format!(
                    "a dead letter names job {named:?}, which the worker did not read from it"
                ));
            }
        }
    }

    /// The bodies in the DLQ.
    fn dead_bodies(&self) -> Vec<String> {
        let msgs = self.msgs.lock().expect("queue");
        msgs.iter()
            .filter(|m| m.in_dlq && !m.deleted)
            .map(|m| m.body.clone())
            .collect()
    }

    /// Messages neither deleted nor dead-lettered.
    fn live(&self) -> usize {
        let msgs = self.msgs.lock().expect("queue");
        msgs.iter().filter(|m| !m.deleted && !m.in_dlq).count()
    }

    /// The operator's pass over the DLQ: redrive the jobs that are not terminal (those waiting
    /// for a decision stay for a person), drop the ones that are. A live job's letter the
    /// redrive policy moved is the reconciler's sweep's: one it left through three of its sweeps
    /// that read the DLQ through is a violation (a failed receive ends a sweep early, and a large
    /// DLQ of letters waiting for an operator takes many receives).
    fn redrive(&self, world: &World, ledger: &InMemoryLedger) -> u64 {
        let mut moved = 0;
        let mut lost = Vec::new();
        let now = world.now();
        let mut msgs = self.msgs.lock().expect("queue");
        // (a letter the sweep holds is out of the operator's sight too)
        for m in msgs
            .iter_mut()
            .filter(|m| m.in_dlq && !m.deleted && m.visible_at <= now)
        {
            // Poison stays for a person, as `jobctl dlq redrive` leaves it: a body that is not a
            // job, or one the worker refused at its first sight.
            if parse_trigger(Some(&m.body)).is_err() || m.refused {
                continue;
            }
            // The job by its whole id: the other producer's in its own namespace.
            let whole = match m.sender {
                FOREIGN => format!("foreign/{}", m.job_id),
                _ => m.job_id.clone(),
            };
            let item = futures::executor::block_on(ledger.get(&whole))
                .ok()
                .flatten();
            // A person deletes a live job's letter before the sweep sent it back: the reconciler
            // must still end the job, from the due index or by a trigger by id (a first claim
            // in neither is the loss decision 160 names, not injected).
            let found = item
                .as_ref()
                .is_some_and(|r| !r.state.is_terminal() && (r.due_listed || r.keeps_input()));
            if found && world.fault("dlq_letter_lost", world.rates.message_lost) {
                m.deleted = true;
                lost.push(whole);
                continue;
            }
            let state = item.map(|r| r.state);
            match state {
                Some(s) if s.is_terminal() => {
                    m.deleted = true;
                    continue;
                }
                Some(JobState::Unknown) => continue,
                Some(_) if world.clean_sweeps_since(m.dead_at) < 3 => continue,
                Some(_) => world.violation(format!(
                    "{whole}: a live job's dead letter waited {} min, through three of the reconciler's sweeps",
                    (now - m.dead_at) / 60_000
                )),
                None => {}
            }
            // What comes out of the DLQ is an operator's redrive, naming the job by its whole
            // id as jobctl does.
            if m.sender == FOREIGN {
                m.attributes
                    .push((fenced_jobs::queue::JOB_ID_ATTRIBUTE.to_owned(), whole));
            }
            m.in_dlq = false;
            m.receive_count = 0;
            m.sender = OPERATOR;
            moved += 1;
        }
        world.lost.lock().expect("lost").extend(lost);
        moved
    }

    /// The DLQ's letters visible at `now`, each held for `hold_s` seconds, as the reconciler's
    /// sweep receives them.
    fn receive_dead(&self, now: Millis, max: usize, hold_s: i32) -> Vec<Received> {
        let mut msgs = self.msgs.lock().expect("queue");
        // Not every letter is visible to a receive at once: SQS returns some of them.
        let max = max.min(1 + (now as usize % 10));
        let mut out = Vec::new();
        for m in msgs.iter_mut() {
            if out.len() == max {
                break;
            }
            if !m.in_dlq || m.deleted || m.visible_at > now {
                continue;
            }
            m.handle = self.next_handle.fetch_add(1, Ordering::Relaxed) as u64;
            m.visible_at = now + Millis::from(hold_s) * 1_000;
            out.push(Received {
                message_id: Some(m.id.clone()),
                body: m.body.clone(),
                attributes: m.attributes.clone(),
                sender_id: Some(format!("{}:session", m.sender)),
                receipt_handle: format!("{}#{}", m.id, m.handle),
                sent_at: Some(m.sent_at),
            });
        }
        out
    }

    /// Deletes a DLQ letter by the handle of its last receive.
    fn delete_dead(&self, handle: &str) {
        let mut msgs = self.msgs.lock().expect("queue");
        let Some((id, seq)) = handle.split_once('#') else {
            return;
        };
        if let Some(m) = msgs.iter_mut().find(|m| m.id == id && m.in_dlq) {
            m.deleted |= seq == m.handle.to_string();
        }
    }
}

/// The DLQ and the work queue as the reconciler's sweep reads and writes them.
struct SimSweep {
    world: Arc<World>,
    queue: Arc<Queue>,
}

impl QueueReader for SimSweep {
    async fn receive(
        &self,
        queue_url: &str,
        max: usize,
        hold_s: i32,
    ) -> Result<Vec<Received>, QueueError> {
        let world = &self.world;
        if world.fault("dlq_receive_failure", world.rates.visibility_failure) {
            return Err(QueueError::Failed {
                action: "ReceiveMessage",
                detail: "InternalError".to_owned(),
            });
        }
        // A short poll samples SQS's servers: an empty answer while letters wait.
        if queue_url != DLQ_URL || world.fault("dlq_receive_empty", 0.2) {
            return Ok(Vec::new());
        }
        Ok(self.queue.receive_dead(world.now(), max, hold_s))
    }

    async fn send(&self, _queue_url: &str, message: Message<'_>) -> Result<(), QueueError> {
        let named = message
            .attributes
            .iter()
            .find(|(n, _)| n == fenced_jobs::queue::JOB_ID_ATTRIBUTE)
            .map(|(_, v)| v.clone());
        let job_id = named
            .or_else(|| {
                parse_trigger(Some(message.body))
                    .ok()
                    .map(|t| t.job_id().to_owned())
            })
            .unwrap_or_default();
        let now = self.world.now();
        let attributes = message.attributes.to_vec();
        self.queue
            .push_with(RECONCILER, &job_id, message.body, now, attributes);
        Ok(())
    }

    async fn delete(&self, _queue_url: &str, receipt_handle: &str) -> Result<(), QueueError> {
        self.queue.delete_dead(receipt_handle);
        Ok(())
    }

    async fn release(&self, _queue_url: &str, _receipt_handle: &str) -> Result<(), QueueError> {
        Ok(())
    }
}

/// A consumer's view of the queue's visibility API.
struct SimVisibility {
    world: Arc<World>,
    queue: Arc<Queue>,
    gate: Arc<PauseGate>,
}

impl VisibilityControl for SimVisibility {
    async fn change(&self, _arn: &str, changes: Vec<VisibilityChange>) -> ChangeResults {
        self.gate.pass(&self.world).await;
        tokio::time::sleep(Duration::from_millis(5)).await;
        let results = changes
            .iter()
            .map(|c| self.queue.change(&self.world, &c.receipt_handle, c.seconds))
            .collect();
        ChangeResults {
            calls: changes.len().div_ceil(10) as u32,
            results,
        }
    }
}

/// The worker's own sends to the DLQ, which sometimes fail.
struct SimDeadLetters {
    world: Arc<World>,
    queue: Arc<Queue>,
}

impl std::fmt::Debug for SimDeadLetters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SimDeadLetters")
    }
}

/// Whether `body` is among the DLQ's bodies `dead`: as it came, or, when it left no room for
/// the reason, as the worker's smaller letter that names it by its digest.
fn dead_lettered(dead: &[String], body: &str) -> bool {
    let digest = fenced_jobs::job::artifact::sha256_hex(body.as_bytes());
    dead.iter().any(|d| {
        d == body
            || serde_json::from_str::<serde_json::Value>(d)
                .is_ok_and(|letter| letter["sha256"] == digest.as_str())
    })
}

impl DeadLetterQueue for SimDeadLetters {
    fn send<'a>(&'a self, letters: &'a [DeadLetter]) -> futures::future::BoxFuture<'a, Vec<bool>> {
        Box::pin(async move {
            letters
                .iter()
                .map(|letter| {
                    let w = &self.world;
                    if w.fault("dlq_send_failure", w.rates.dlq_send_failure) {
                        return false;
                    }
                    // As SQS does: a message over 1 MiB, body and attributes, is refused.
                    let Some(attributes) = letter.all_attributes() else {
                        return false;
                    };
                    // Poison and conflicts both stay for a person, as `jobctl dlq redrive`
                    // leaves them (a conflict again is all a redrive could give).
                    self.queue.dead_letter(
                        &letter.body,
                        letter.job_id.as_deref(),
                        (true, w.now()),
                        attributes,
                    );
                    true
                })
                .collect()
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Lambda: a stop-the-world pause of one worker

#[derive(Default)]
struct PauseGate {
    from: AtomicI64,
    until: AtomicI64,
}

impl PauseGate {
    /// Waits out a pause in progress: the worker does no I/O while it is stopped.
    async fn pass(&self, world: &World) {
        let now = world.now();
        let (from, until) = (
            self.from.load(Ordering::Relaxed),
            self.until.load(Ordering::Relaxed),
        );
        if from <= now && now < until {
            tokio::time::sleep(Duration::from_millis((until - now) as u64)).await;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// DynamoDB

/// One consumer's ledger client: the shared table with throttling, lost responses and pauses,
/// and the contract's invariants checked on every applied write.
struct SimLedger {
    world: Arc<World>,
    table: Arc<InMemoryLedger>,
    gate: Arc<PauseGate>,
}

impl SimLedger {
    async fn call(
        &self,
        operation: &'static str,
        job_id: &str,
        apply: impl std::future::Future<Output = Result<Write, LedgerError>>,
    ) -> Result<Write, LedgerError> {
        self.gate.pass(&self.world).await;
        tokio::time::sleep(Duration::from_millis(self.world.range(2, 20))).await;
        if self.world.fault("ddb_stall", self.world.rates.ddb_stall) {
            // No answer for minutes: only the worker's own bounds end the wait.
            tokio::time::sleep(Duration::from_millis(self.world.range(60_000, 900_000))).await;
        }
        if self
            .world
            .fault("ddb_throttle", self.world.rates.ddb_throttle)
        {
            return Err(LedgerError::Throttled { operation });
        }
        // A timeout: half the time the write was applied before the response was lost.
        let timeout = self
            .world
            .fault("ddb_timeout", self.world.rates.ddb_timeout);
        if timeout && self.world.roll(0.5) {
            return Err(LedgerError::Unavailable {
                operation,
                code: "timeout".into(),
            });
        }
        let written = apply.await?;
        if let Write::Applied(record) = &written {
            self.check(job_id, record);
            self.world.streamed(record);
        }
        // A pause that began while the request was out holds its answer: the worker reads it
        // (a claim, say, and then sends its call) only after the pause.
        self.gate.pass(&self.world).await;
        if timeout {
            return Err(LedgerError::Unavailable {
                operation,
                code: "timeout".into(),
            });
        }
        Ok(written)
    }

    fn check(&self, job_id: &str, record: &JobItem) {
        if let (JobState::Succeeded, Some(result)) = (record.state, &record.result)
            && !meets_contract(job_id, result.as_bytes())
        {
            self.world
                .violation(format!("{job_id}: an accepted answer fails its contract"));
        }
        if record.attempts > record.max_attempts {
            self.world.violation(format!(
                "{job_id}: {} attempts over a budget of {}",
                record.attempts, record.max_attempts
            ));
        }
        let mut terminal = self.world.terminal.lock().expect("terminal");
        let seen = (
            record.state,
            record.result.clone(),
            record.result_ref.clone(),
        );
        match terminal.get(job_id) {
            Some(first) if *first != seen => {
                self.world.violation(format!(
                    "{job_id}: terminal {} changed to {}",
                    first.0.as_str(),
                    record.state.as_str()
                ));
            }
            Some(_) => {}
            None if record.state.is_terminal() => {
                terminal.insert(job_id.to_owned(), seen);
            }
            None => {}
        }
    }
}

impl JobLedger for SimLedger {
    async fn note_batch_members(
        &self,
        batch_id: &str,
        members: &[fenced_jobs::job::BatchMember],
        now: Millis,
    ) -> Result<(), LedgerError> {
        self.table.note_batch_members(batch_id, members, now).await
    }
    async fn claim(&self, req: ClaimRequest) -> Result<Write, LedgerError> {
        let id = req.job.job_id.clone();
        if self
            .world
            .fault("pause_after_claim", self.world.rates.pause_after_claim)
        {
            // The pause starts once the write has had its latency (at most 20 ms), so the
            // claim is applied and its answer held until the pause ends.
            let from = self.world.now() + 25;
            let until = from + self.world.range(70_000, 200_000) as Millis;
            self.gate.from.store(from, Ordering::Relaxed);
            self.gate.until.store(until, Ordering::Relaxed);
        }
        if self
            .world
            .fault("claim_and_read_lost", self.world.rates.claim_and_read_lost)
        {
            // Applied, its answer lost, and the read that would recognise it lost too.
            let written = self.call("claim", &id, self.table.claim(req)).await;
            if written.is_ok() {
                let mut failing = self.world.failing_reads.lock().expect("reads");
                failing.insert(id);
            }
            return written.and_then(|_| {
                Err(LedgerError::Unavailable {
                    operation: "claim",
                    code: "timeout".into(),
                })
            });
        }
        self.call("claim", &id, self.table.claim(req)).await
    }
    async fn end(&self, req: EndRequest) -> Result<Write, LedgerError> {
        let id = req.job_id.clone();
        let epoch = req.epoch;
        if let AttemptEnd::Succeeded {
            result: ResultBody::Stored(_),
            ..
        } = &req.end
            && self.world.fault(
                "pause_before_stored_accept",
                self.world.rates.pause_before_stored_accept,
            )
        {
            // From now: the write is sent, and judged, only after the pause.
            let now = self.world.now();
            let until = now + self.world.range(70_000, 200_000) as Millis;
            self.gate.from.store(now, Ordering::Relaxed);
            self.gate.until.store(until, Ordering::Relaxed);
        }
        // A refusal for the rate limit, or a call never sent, proves nothing ran: neither
        // spends an attempt.
        if let AttemptEnd::RetryAuthorized { error } | AttemptEnd::FailedTerminal { error, .. } =
            &req.end
            && (error.contains("HTTP 429 rate_limit_exceeded")
                || error.contains("no time left to make the call")
                || error.contains("lapsed before the call was sent"))
        {
            self.world.violation(format!(
                "{id}: attempt {} spent without a call that ran ({}: {error})",
                req.attempt,
                req.end.target().as_str()
            ));
        }
        // What the table held just before: a write applied for anyone but the current owner
        // would be a stale result accepted.
        let apply = async {
            let before = self.table.get(&id).await?;
            let written = self.table.end(req).await?;
            if let (Write::Applied(_), Some(b)) = (&written, &before)
                && (b.owner_epoch != epoch || b.state != JobState::Running)
            {
                self.world.violation(format!(
                    "{id}: a write of epoch {epoch} was applied over epoch {} ({})",
                    b.owner_epoch,
                    b.state.as_str()
                ));
            }
            Ok(written)
        };
        self.call("end", &id, apply).await
    }
    async fn end_known(&self, known: &JobItem, req: EndRequest) -> Result<Write, LedgerError> {
        let id = req.job_id.clone();
        let rebuilt = known_after_end(known, &req);
        let written = self.end(req).await?;
        let (Write::Applied(_), Some(rebuilt)) = (&written, rebuilt) else {
            return Ok(written);
        };
        // The owner builds the accepted item from its claim instead of reading it back: only
        // writes of other kinds since the claim (renewals, a recorded reference, a re-enqueue)
        // may tell them apart. The accepted item is terminal, so this read sees it as written.
        if let Ok(Some(stored)) = self.table.get(&id).await {
            let mut expected = rebuilt.clone();
            expected.owner_until = stored.owner_until;
            expected.enqueued_at = stored.enqueued_at;
            for (mine, theirs) in expected.attempt_log.iter_mut().zip(&stored.attempt_log) {
                mine.provider_ref.clone_from(&theirs.provider_ref);
            }
            if expected != stored {
                self.world.violation(format!(
                    "{id}: the accepted record the owner built differs from the table's item"
                ));
            }
        }
        Ok(Write::Applied(rebuilt))
    }
    async fn settle(&self, req: SettleRequest) -> Result<Write, LedgerError> {
        let id = req.job_id.clone();
        self.call("settle", &id, self.table.settle(req)).await
    }
    async fn recover(&self, req: RecoverRequest) -> Result<Write, LedgerError> {
        let id = req.job_id.clone();
        self.call("recover", &id, self.table.recover(req)).await
    }
    async fn renew(&self, req: RenewRequest) -> Result<Write, LedgerError> {
        let id = req.job_id.clone();
        self.call("renew", &id, self.table.renew(req)).await
    }
    async fn create(&self, req: CreateRequest) -> Result<Write, LedgerError> {
        let id = req.job.job_id.clone();
        self.call("create", &id, self.table.create(req)).await
    }
    async fn mark_enqueued(&self, req: EnqueuedRequest) -> Result<Write, LedgerError> {
        let id = req.job_id.clone();
        self.call("mark_enqueued", &id, self.table.mark_enqueued(req))
            .await
    }
    async fn record_ref(&self, req: RecordRefRequest) -> Result<Write, LedgerError> {
        let id = req.job_id.clone();
        self.call("record_ref", &id, self.table.record_ref(req))
            .await
    }
    async fn decide(&self, req: DecideRequest) -> Result<Write, LedgerError> {
        let id = req.job_id.clone();
        self.call("decide", &id, self.table.decide(req)).await
    }
    async fn cancel(&self, req: CancelRequest) -> Result<Write, LedgerError> {
        let id = req.job_id.clone();
        self.call("cancel", &id, self.table.cancel(req)).await
    }
    async fn get(&self, job_id: &str) -> Result<Option<JobItem>, LedgerError> {
        self.gate.pass(&self.world).await;
        if self.world.fault("ddb_stall", self.world.rates.ddb_stall) {
            tokio::time::sleep(Duration::from_millis(self.world.range(60_000, 900_000))).await;
        }
        tokio::time::sleep(Duration::from_millis(self.world.range(2, 10))).await;
        if self
            .world
            .fault("ddb_throttle", self.world.rates.ddb_throttle)
        {
            return Err(LedgerError::Throttled { operation: "get" });
        }
        let lost = self
            .world
            .failing_reads
            .lock()
            .expect("reads")
            .remove(job_id);
        if lost {
            return Err(LedgerError::Unavailable {
                operation: "get",
                code: "timeout".into(),
            });
        }
        self.table.get(job_id).await
    }
}

/// The reconciler reads the sparse indexes of the shared table (reads: no faults).
impl LedgerIndex for SimLedger {
    async fn untouched_since(
        &self,
        state: JobState,
        before: Millis,
        after: &IndexCursor,
        limit: usize,
    ) -> Result<Vec<(String, Millis)>, LedgerError> {
        if *after != IndexCursor::default() {
            *self
                .world
                .faults
                .lock()
                .expect("faults")
                .entry("reconciler_walk_past")
                .or_default() += 1;
        }
        self.table
            .untouched_since(state, before, after, limit)
            .await
    }
    async fn past_deadline(
        &self,
        state: JobState,
        now: Millis,
        limit: usize,
    ) -> Result<Vec<(String, Millis)>, LedgerError> {
        self.table.past_deadline(state, now, limit).await
    }
    async fn count(&self, state: JobState) -> Result<u64, LedgerError> {
        self.table.count(state).await
    }
    async fn due(
        &self,
        day: &str,
        range: (Millis, Millis),
        cursor: Option<&(String, Millis)>,
        limit: usize,
    ) -> Result<Vec<(String, Millis)>, LedgerError> {
        self.table.due(day, range, cursor, limit).await
    }
    async fn due_walked(&self) -> Result<Option<Millis>, LedgerError> {
        self.table.due_walked().await
    }
    async fn finished(
        &self,
        range: (Millis, Millis),
        after: Option<&str>,
        limit: usize,
    ) -> Result<(Vec<JobItem>, Option<String>), LedgerError> {
        self.table.finished(range, after, limit).await
    }
    async fn walked_due_to(&self, to: Millis) -> Result<(), LedgerError> {
        self.table.walked_due_to(to).await
    }
}

/// The reconciler's triggers: new messages on the simulated queue.
struct SimTriggers {
    world: Arc<World>,
    queue: Arc<Queue>,
}

impl TriggerSender for SimTriggers {
    async fn send(&self, triggers: &[Outgoing], _dedup_suffix: &str) -> Vec<Sent> {
        let now = self.world.now();
        let mut unsent = self.world.unsent.lock().expect("unsent");
        triggers
            .iter()
            .map(|t| {
                if let Some((_, first @ None)) = unsent.get_mut(&t.job_id) {
                    *first = Some(now);
                }
                let (job_id, body, urgent) = (&t.job_id, &t.body, t.class.urgent);
                self.queue
                    .send(RECONCILER, job_id, body, now, Vec::new(), urgent);
                (t.job_id.clone(), Ok(()))
            })
            .collect()
    }
}

// ---------------------------------------------------------------------------------------------
// S3: the results bucket

/// The results bucket through a client whose writes and removals sometimes fail.
struct SimBlobs {
    world: Arc<World>,
}

impl std::fmt::Debug for SimBlobs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SimBlobs")
    }
}

impl SimBlobs {
    /// The time a call takes: milliseconds, now and then seconds.
    async fn latency(&self) {
        let ms = if self.world.fault("store_slow", self.world.rates.store_slow) {
            self.world.range(1_000, 30_000)
        } else {
            self.world.range(5, 40)
        };
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }

    fn refused(&self, operation: &'static str) -> Result<(), BlobError> {
        if self
            .world
            .fault("store_error", self.world.rates.store_error)
        {
            return Err(BlobError::Unavailable {
                operation,
                detail: "InternalError".into(),
            });
        }
        Ok(())
    }
}

impl BlobStore for SimBlobs {
    fn bucket(&self) -> Option<&str> {
        self.world.bucket.bucket()
    }
    fn put<'a>(
        &'a self,
        key: &'a str,
        body: &'a [u8],
    ) -> futures::future::BoxFuture<'a, Result<BlobRef, BlobError>> {
        Box::pin(async move {
            self.latency().await;
            self.refused("put")?;
            let put = self.world.bucket.put(key, body).await;
            if self
                .world
                .fault("store_lost_answer", self.world.rates.store_lost_answer)
            {
                return Err(BlobError::Unavailable {
                    operation: "put",
                    detail: "timeout".into(),
                });
            }
            put
        })
    }
    fn get<'a>(
        &'a self,
        bucket: &'a str,
        key: &'a str,
        limit: usize,
    ) -> futures::future::BoxFuture<'a, Result<Vec<u8>, BlobError>> {
        Box::pin(async move {
            self.latency().await;
            self.refused("get")?;
            if key.starts_with("inputs/")
                && self
                    .world
                    .fault("input_expired", self.world.rates.input_expired)
            {
                let _ = self.world.bucket.delete(key).await;
            }
            self.world.bucket.get(bucket, key, limit).await
        })
    }
    fn delete<'a>(&'a self, key: &'a str) -> futures::future::BoxFuture<'a, Result<(), BlobError>> {
        Box::pin(async move {
            self.latency().await;
            self.refused("delete")?;
            self.world.bucket.delete(key).await
        })
    }
    fn list<'a>(
        &'a self,
        prefix: &'a str,
        limit: usize,
    ) -> futures::future::BoxFuture<'a, Result<Vec<String>, BlobError>> {
        Box::pin(async move {
            self.latency().await;
            self.world.bucket.list(prefix, limit).await
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Provider

/// What the provider did with one attempt.
#[derive(Clone)]
struct Execution {
    done_at: Millis,
    answer: Result<String, ProviderError>,
    /// Why the model stopped.
    finish: Finish,
    forgotten: bool,
    /// The worker was told, truthfully, that the call failed (a definite failure), or the model
    /// answered badly (the worker learns nothing else of it); false when the model ran and its
    /// outcome reached the worker as anything else.
    definite_failure: bool,
}

#[derive(Clone)]
struct SimProvider {
    /// Its name in the deployment's list (attempts record it).
    name: &'static str,
    world: Arc<World>,
    table: Arc<InMemoryLedger>,
    runs: Arc<Mutex<HashMap<(String, u32), Execution>>>,
    per_job: Arc<Mutex<HashMap<String, u64>>>,
    /// The batches created: each one's lines, by line id, with the job and attempt each runs.
    batches: Arc<Mutex<Vec<Vec<Line>>>>,
}

/// A line of a batch: its id, the job and the attempt it runs.
type Line = (String, String, u32);

impl SimProvider {
    /// The job and attempt of the line a batch reference names, if a batch holds it (found by
    /// listing when the reference is pending).
    fn line(&self, provider_ref: &str) -> Option<Option<(String, u32)>> {
        let (batch, line) = fenced_jobs::provider::batch::parse_ref(provider_ref)?;
        let batches = self.batches.lock().expect("batches");
        let held = |lines: &Vec<Line>| {
            lines
                .iter()
                .find(|(id, _, _)| id == line)
                .map(|(_, job, attempt)| (job.clone(), *attempt))
        };
        Some(match batch {
            Some(batch) => batch
                .strip_prefix("chaosbatch-")
                .and_then(|n| n.parse::<usize>().ok())
                .and_then(|n| batches.get(n))
                .and_then(held),
            None => batches.iter().find_map(held),
        })
    }

    /// Checks that the attempt was recorded before it ran, and that a second attempt had a
    /// recorded cause.
    async fn check_attempt(&self, req: &ProviderRequest<'_>) {
        // A trigger by id for a job whose item keeps no input must never call without it.
        if !req.input.contains_key("model") {
            self.world.violation(format!(
                "{}: attempt {} called without the job's input",
                req.job_id, req.attempt
            ));
        }
        let item = self.table.get(req.job_id).await.ok().flatten();
        let Some(item) = item else {
            self.world
                .violation(format!("{}: executed without a ledger item", req.job_id));
            return;
        };
        let attempt = item.attempt_log.get(req.attempt as usize - 1);
        let recorded = attempt.is_some_and(|a| a.epoch == req.epoch);
        // The claim decides the path: an attempt claimed as a batch line goes in a batch.
        let line = attempt.and_then(|a| a.provider_ref.as_deref());
        if line.is_some_and(fenced_jobs::provider::batch::is_batch_ref) {
            self.world.violation(format!(
                "{}: attempt {} claimed as a batch line was sent as a call",
                req.job_id, req.attempt
            ));
        }
        self.check_route(req, &item);
        if item.owner_epoch != req.epoch || item.attempts != req.attempt || !recorded {
            self.world.violation(format!(
                "{}: attempt {} at epoch {} executed without its attempt record",
                req.job_id, req.attempt, req.epoch
            ));
        }
        if req.attempt > 1 {
            // Ground truth: the previous attempt ran the model and the worker was never told
            // that it failed, so only a recorded decision may authorise this one.
            let ran = self
                .runs
                .lock()
                .expect("runs")
                .get(&(req.job_id.to_owned(), req.attempt - 1))
                .map(|run| run.definite_failure);
            let decided_now = item
                .decisions
                .iter()
                .any(|d| matches!(d.action.as_str(), "replay" | "authorize_retry"));
            if ran == Some(false) && !decided_now {
                self.world.violation(format!(
                    "{}: attempt {} executed after attempt {} ran with no definite failure and no decision (it ended {})",
                    req.job_id,
                    req.attempt,
                    req.attempt - 1,
                    item.attempt_log[req.attempt as usize - 2].outcome.as_str()
                ));
            }
            let previous = &item.attempt_log[req.attempt as usize - 2];
            let definite = matches!(
                previous.outcome,
                AttemptOutcome::Transient
                    | AttemptOutcome::Permanent
                    | AttemptOutcome::InvalidOutput
            );
            let decided = item
                .decisions
                .iter()
                .any(|d| matches!(d.action.as_str(), "replay" | "authorize_retry"));
            if !definite && !decided {
                self.world.violation(format!(
                    "{}: attempt {} ran after an attempt ending {} without a recorded decision",
                    req.job_id,
                    req.attempt,
                    previous.outcome.as_str()
                ));
            }
        }
    }

    /// Checks that the call went to the provider its claim named, and that it is another
    /// provider than the one of the job's attempt before only when that one refused definitely.
    fn check_route(&self, req: &ProviderRequest<'_>, item: &fenced_jobs::job::JobItem) {
        let Some(current) = item.attempt_log.iter().find(|a| a.epoch == req.epoch) else {
            return;
        };
        let named = current.route.as_ref().map(|r| r.provider.as_str());
        if named != Some(self.name) {
            self.world.violation(format!(
                "{}: attempt {} sent to {} though its claim named {named:?}",
                req.job_id, req.attempt, self.name
            ));
        }
        let before = item
            .attempt_log
            .iter()
            .chain(&item.given_back)
            .filter(|a| a.epoch < req.epoch)
            .max_by_key(|a| a.epoch);
        if let Some(before) = before
            && before.route.as_ref().map(|r| r.provider.as_str()) != named
            && !fenced_jobs::protocol::routing::refused(before)
        {
            self.world.violation(format!(
                "{}: attempt {} moved to {} after an attempt ending {} at its provider",
                req.job_id,
                req.attempt,
                self.name,
                before.outcome.as_str()
            ));
        }
    }

    /// How long a call runs (`flex`: on the flex tier).
    fn latency(&self, flex: bool) -> u64 {
        // Mostly seconds, with a long tail of minutes.
        let ms = if self.world.roll(0.03) {
            self.world.range(60_000, 600_000)
        } else {
            self.world.range(200, 8_000)
        };
        // OpenAI's flex processing answers slower than the standard tier (its guide has
        // clients wait up to 15 minutes): three times as long, in a mixed backlog.
        if flex && self.world.mix.is_some() {
            ms * 3
        } else {
            ms
        }
    }

    /// What a call reports it used: in a mixed backlog, the reference job's 1,000 tokens in and
    /// 500 out, which the worker prices by the path it took.
    fn usage(&self) -> Option<fenced_jobs::job::Usage> {
        self.world.mix.map(|_| fenced_jobs::job::Usage {
            input: 1_000,
            output: 500,
            ..Default::default()
        })
    }
}

impl Provider for SimProvider {
    async fn call(&self, req: &ProviderRequest<'_>) -> Result<Answer, ProviderError> {
        let w = &self.world;
        if w.fault("provider_transient", w.rates.provider_transient) {
            tokio::time::sleep(Duration::from_millis(50)).await;
            return Err(ProviderError::Transient {
                retry_after_ms: None,
                reason: "HTTP 503".into(),
            });
        }
        if w.fault("provider_overloaded", w.rates.provider_overloaded) {
            tokio::time::sleep(Duration::from_millis(50)).await;
            return Err(ProviderError::Transient {
                retry_after_ms: None,
                reason: "HTTP 529 overloaded_error".into(),
            });
        }
        let tier = req
            .input
            .get("parameters")
            .and_then(|p| p.get("service_tier"));
        let flex = tier.and_then(serde_json::Value::as_str) == Some("flex");
        if flex && w.fault("flex_refused", w.rates.flex_refused) {
            tokio::time::sleep(Duration::from_millis(50)).await;
            return Err(ProviderError::Throttled {
                retry_after_ms: None,
                reason: "HTTP 429 resource unavailable (flex capacity)".into(),
            });
        }
        if w.fault("provider_throttle", w.rates.provider_throttle) {
            tokio::time::sleep(Duration::from_millis(50)).await;
            // Now and then longer than the worker waits in process: the attempt is given back.
            let retry_after_ms = if w.roll(0.1) { 30_000 } else { 1_000 };
            return Err(ProviderError::Throttled {
                retry_after_ms: Some(retry_after_ms),
                reason: "HTTP 429 rate_limit_exceeded".into(),
            });
        }
        self.check_attempt(req).await;
        let key = (req.job_id.to_owned(), req.attempt);
        if self.runs.lock().expect("runs").contains_key(&key) {
            w.violation(format!(
                "{}: attempt {} executed twice",
                req.job_id, req.attempt
            ));
        }
        *self
            .per_job
            .lock()
            .expect("per job")
            .entry(req.job_id.to_owned())
            .or_default() += 1;
        w.executed(
            self.model(req.input),
            if flex { "flex" } else { "standard" },
        );
        let latency = self.latency(flex);
        let now = w.now();
        let permanent = w.fault("provider_permanent", w.rates.provider_permanent);
        let invalid = !permanent && w.fault("invalid_answer", w.rates.invalid_answer);
        let answer = if permanent {
            Err(ProviderError::Permanent {
                reason: "HTTP 400".into(),
            })
        } else if w.fault("oversized_answer", w.rates.oversized_answer) {
            Ok(format!(
                r#"{{"job":"{}","pad":"{}"}}"#,
                req.job_id,
                "x".repeat(450_000)
            ))
        } else if w.fault("event_sized_answer", w.rates.event_sized_answer) {
            Ok(format!(
                r#"{{"job":"{}","attempt":{},"pad":"{}"}}"#,
                req.job_id,
                req.attempt,
                "z".repeat(w.range(30_000, 60_000) as usize)
            ))
        } else if w.fault("large_answer", w.rates.large_answer) {
            Ok(format!(
                r#"{{"job":"{}","attempt":{},"pad":"{}"}}"#,
                req.job_id,
                req.attempt,
                "y".repeat(80_000)
            ))
        } else if invalid {
            Ok(r#"{"unexpected":true}"#.to_owned())
        } else {
            Ok(format!(
                r#"{{"job":"{}","attempt":{}}}"#,
                req.job_id, req.attempt
            ))
        };
        let truncated = !permanent && w.fault("truncated_answer", w.rates.truncated_answer);
        let bad_answer = invalid || truncated;
        // The model's text in the document every provider of the crate answers with.
        let answer = answer.map(|mut output| {
            if truncated {
                output.truncate(output.len() / 2);
            }
            serde_json::json!({"contract": req.contract, "output": output}).to_string()
        });
        let finish = if truncated {
            Finish::Length
        } else {
            Finish::Stop
        };
        let hang = w.fault("provider_hang", w.rates.provider_hang);
        let stalled = !hang && w.fault("stalled_stream", w.rates.stalled_stream);
        let hang = hang || stalled;
        let lost = !hang && w.fault("connection_lost", w.rates.connection_lost);
        // A gateway in front of the model gives up while the model still runs, and answers
        // with its own status: the worker reads it through the real status table.
        let gateway =
            (!hang && !lost && w.fault("gateway_error", w.rates.gateway_error)).then(|| {
                // Bare 429s and 503s too: a retrying gateway after its upstream request ran, a
                // service mesh after forwarding; a 408, a gateway giving up on its upstream;
                // and bodies shaped like the provider's own (LiteLLM, OpenRouter), without the
                // headers only the provider sends.
                let status = [502, 504, 524, 409, 500, 429, 503, 408][w.range(0, 7) as usize];
                let body = match w.range(0, 2) {
                    0 => serde_json::json!({}),
                    1 => serde_json::json!({"error": {"type": "server_error",
                        "code": "rate_limit_exceeded", "message": "upstream"}}),
                    _ => serde_json::json!({"type": "error",
                        "error": {"type": "overloaded_error", "message": "upstream"}}),
                };
                fenced_jobs::provider::openai::classify_status(status, &body)
            });
        let forgotten = w.roll(w.rates.provider_forgets);
        self.runs.lock().expect("runs").insert(
            key,
            Execution {
                done_at: if hang {
                    Millis::MAX
                } else {
                    now + latency as Millis
                },
                answer: answer.clone(),
                finish,
                forgotten,
                // A bad answer is one whichever way the worker learns it (the call, or a
                // retrieval after the call was cut off); learnt as nothing, the attempt stays
                // uncertain, which the check of the previous attempt's outcome guards.
                definite_failure: bad_answer || (permanent && !lost && gateway.is_none()),
            },
        );
        if stalled && let Some(progress) = &req.progress {
            // The first bytes, then silence: the progress rule ends the call, uncertain.
            progress.mark();
            tokio::time::sleep(progress.timeout()).await;
            return Err(ProviderError::Uncertain {
                evidence: "no bytes within the progress timeout; it may have run".into(),
            });
        }
        if hang {
            std::future::pending::<()>().await;
        }
        tokio::time::sleep(Duration::from_millis(latency)).await;
        if lost {
            return Err(ProviderError::Uncertain {
                evidence: "connection lost after the request was sent".into(),
            });
        }
        if let Some(error) = gateway {
            return Err(error);
        }
        answer.map(|body| Answer {
            body,
            provider_ref: None,
            finish,
            usage: self.usage(),
            model: None,
            response_id: None,
        })
    }

    fn reference(&self, job_id: &str, attempt: u32, epoch: u64) -> Option<String> {
        Some(format!("{job_id}/{attempt}@{epoch}"))
    }

    fn name(&self) -> &'static str {
        self.name
    }

    async fn cancel(&self, provider_ref: &str) {
        let Some((job, attempt)) = provider_ref
            .rsplit_once('@')
            .and_then(|(r, _)| r.rsplit_once('/'))
        else {
            return;
        };
        let key = (job.to_owned(), attempt.parse().unwrap_or(0));
        let now = self.world.now();
        if let Some(run) = self.runs.lock().expect("runs").get_mut(&key)
            && run.done_at > now
        {
            run.done_at = now;
            run.answer = Err(ProviderError::Transient {
                retry_after_ms: None,
                reason: "response cancelled".into(),
            });
            *self
                .world
                .faults
                .lock()
                .expect("faults")
                .entry("upstream_cancelled")
                .or_default() += 1;
        }
    }

    fn can_retrieve(&self) -> bool {
        true
    }

    fn batches(&self) -> bool {
        true
    }

    fn tiers(&self) -> &'static [fenced_jobs::job::usage::Rate] {
        &[fenced_jobs::job::usage::Rate::Flex]
    }

    fn batch_line(
        &self,
        req: &ProviderRequest<'_>,
        line: &str,
    ) -> Result<fenced_jobs::provider::BatchLine, ProviderError> {
        let body = serde_json::json!({"job": req.job_id, "attempt": req.attempt,
            "contract": req.contract, "model": self.model(req.input)});
        Ok(fenced_jobs::provider::BatchLine {
            id: line.to_owned(),
            body: body.to_string(),
        })
    }

    /// Runs each line as an execution that ends with the batch (minutes to an hour from now):
    /// an answer, a failed line (transient or permanent); the create's answer may be lost.
    async fn submit_batch(
        &self,
        lines: &[fenced_jobs::provider::BatchLine],
    ) -> Result<String, ProviderError> {
        let w = &self.world;
        tokio::time::sleep(Duration::from_millis(100)).await;
        if w.fault("batch_refused", w.rates.batch_refused) {
            return Err(if w.roll(0.5) {
                ProviderError::Throttled {
                    retry_after_ms: Some(1_000),
                    reason: "HTTP 429 rate_limit_exceeded".into(),
                }
            } else {
                ProviderError::Permanent {
                    reason: "HTTP 400 invalid_request".into(),
                }
            });
        }
        // Within the hour; in a mixed backlog one batch in ten takes longer, up to the day the
        // providers promise (Anthropic: most batches within an hour, every one within 24 hours).
        let takes = if w.mix.is_some() && w.roll(0.1) {
            w.range(3_600_000, 24 * 3_600_000)
        } else {
            w.range(60_000, 3_600_000)
        };
        let done_at = w.now() + takes as Millis;
        let mut held = Vec::new();
        for line in lines {
            let body: serde_json::Value = serde_json::from_str(&line.body).unwrap_or_default();
            let job = body["job"].as_str().unwrap_or_default().to_owned();
            let attempt = body["attempt"].as_u64().unwrap_or(0) as u32;
            let key = (job.clone(), attempt);
            if self.runs.lock().expect("runs").contains_key(&key) {
                w.violation(format!("{job}: attempt {attempt} executed twice (batch)"));
            }
            // The line's claim recorded its pending reference before the batch went.
            let item = self.table.get(&job).await.ok().flatten();
            let claimed = item.is_some_and(|item| {
                item.attempt_log.iter().any(|a| {
                    a.number == attempt
                        && a.provider_ref.as_deref()
                            == Some(fenced_jobs::provider::batch::pending_ref(&line.id).as_str())
                })
            });
            if !claimed {
                w.violation(format!(
                    "{job}: attempt {attempt}'s line went in a batch before its claim recorded it"
                ));
            }
            *self
                .per_job
                .lock()
                .expect("per job")
                .entry(job.clone())
                .or_default() += 1;
            w.executed(body["model"].as_str().unwrap_or_default(), "batch");
            let failed = if w.fault("provider_transient", w.rates.provider_transient) {
                Some(ProviderError::Transient {
                    retry_after_ms: None,
                    reason: "batch line failed: server_error".into(),
                })
            } else if w.fault("provider_permanent", w.rates.provider_permanent) {
                Some(ProviderError::Permanent {
                    reason: "batch line failed: invalid_request".into(),
                })
            } else {
                None
            };
            let answer = match failed {
                Some(e) => Err(e),
                None => Ok(serde_json::json!({
                    "contract": body["contract"],
                    "output": format!(r#"{{"job":"{job}","attempt":{attempt}}}"#),
                })
                .to_string()),
            };
            self.runs.lock().expect("runs").insert(
                key,
                Execution {
                    done_at,
                    definite_failure: answer.is_err(),
                    answer,
                    finish: Finish::Stop,
                    forgotten: false,
                },
            );
            held.push((line.id.clone(), job, attempt));
        }
        let id = {
            let mut batches = self.batches.lock().expect("batches");
            batches.push(held);
            format!("chaosbatch-{}", batches.len() - 1)
        };
        w.batch_ends
            .lock()
            .expect("batch ends")
            .push((id.clone(), done_at));
        if w.fault("batch_answer_lost", w.rates.batch_answer_lost) {
            // Its create timed out, or the provider failed it with a 5xx in its own word after
            // the batch was made: the same classification as the real clients'.
            return Err(if w.roll(0.5) {
                ProviderError::Uncertain {
                    evidence: "the batch's create timed out after it was sent".into(),
                }
            } else {
                let said = ProviderError::Transient {
                    retry_after_ms: None,
                    reason: "HTTP 500 server_error".into(),
                };
                fenced_jobs::provider::batch::create_failed(500, said)
            });
        }
        Ok(id)
    }

    async fn retrieve(
        &self,
        provider_ref: &str,
        _started_at: Millis,
        _req: &ProviderRequest<'_>,
    ) -> Retrieval {
        tokio::time::sleep(Duration::from_millis(20)).await;
        if self
            .world
            .fault("retrieval_stall", self.world.rates.retrieval_stall)
        {
            tokio::time::sleep(Duration::from_millis(self.world.range(60_000, 600_000))).await;
        }
        if self
            .world
            .fault("retrieval_error", self.world.rates.retrieval_error)
        {
            // The provider could not be asked this time: nothing is learnt about the call.
            return if self.world.roll(0.3) {
                Retrieval::Denied
            } else {
                Retrieval::Unreachable {
                    retry_after_ms: Some(self.world.range(0, 2_000) as Millis),
                }
            };
        }
        // The results file of an ended batch, cut off: the line must be read again later.
        if fenced_jobs::provider::batch::is_batch_ref(provider_ref)
            && self
                .world
                .fault("batch_results_cut", self.world.rates.batch_results_cut)
        {
            return Retrieval::Unreachable {
                retry_after_ms: None,
            };
        }
        let key = match self.line(provider_ref) {
            Some(Some(key)) => key,
            // A line no batch holds was never sent.
            Some(None) => return Retrieval::NotFound,
            None => {
                let Some((job, attempt)) = provider_ref
                    .rsplit_once('@')
                    .and_then(|(r, _)| r.rsplit_once('/'))
                else {
                    return Retrieval::NotFound;
                };
                (job.to_owned(), attempt.parse().unwrap_or(0))
            }
        };
        let run = self.runs.lock().expect("runs").get(&key).cloned();
        match run {
            None => Retrieval::NotFound,
            Some(run) if run.forgotten => Retrieval::NotFound,
            Some(run) if run.done_at > self.world.now() => Retrieval::Running,
            Some(run) => match run.answer {
                Ok(body) => Retrieval::Completed(Answer {
                    body,
                    provider_ref: Some(provider_ref.to_owned()),
                    finish: run.finish,
                    usage: self.usage(),
                    model: None,
                    response_id: None,
                }),
                Err(e) => Retrieval::Failed(e),
            },
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The run

/// The jobs' output contract: JSON naming the job.
const CONTRACT: &str = r#"{"schema": {"type": "object", "required": ["job"],
    "properties": {"job": {"type": "string"}, "attempt": {"type": "integer"}}}}"#;

/// The registry the consumers hold the jobs to.
fn contracts() -> Contracts {
    Contracts::compile([("chaos.v1", CONTRACT)], true).expect("the chaos contract compiles")
}

/// Whether an accepted answer's document holds the answer the job asked for: its output parsed,
/// naming the job, as no truncated or invalid answer does. Checked apart from the worker's own
/// judgement, on every acceptance and every stored answer.
fn meets_contract(job_id: &str, document: &[u8]) -> bool {
    serde_json::from_slice::<serde_json::Value>(document)
        .is_ok_and(|d| d["output"]["job"].as_str() == Some(job_id))
}

/// The whole id of the job `job_id` a record names: the other producer's ids are in its
/// namespace.
fn whole_id(record: &SqsMessage, job_id: &str) -> String {
    let foreign = record
        .attributes
        .get("SenderId")
        .is_some_and(|s| s.starts_with(FOREIGN));
    if foreign {
        format!("foreign/{job_id}")
    } else {
        job_id.to_owned()
    }
}

/// The jobs' producer: the deployment's first, whose ids stay as they come.
const PRODUCER: &str = "AROAPRODUCER";
/// Another producer, which sends ids the first already uses.
const FOREIGN: &str = "AROAFOREIGN";
/// The tenant the jobs' producer labels its jobs with, and the other producer forges on its own.
const TENANT: &str = "acme";
/// The reconciler's role, which names jobs by their whole id.
const RECONCILER: &str = "AROARECONCILER";
/// The operator's, who redrives the DLQ.
const OPERATOR: &str = "AROAOPERATOR";
/// The worker's, which sends poison and conflicts to the DLQ.
const WORKER: &str = "AROAWORKER";
/// The DLQ's URL, as the reconciler's sweep names it.
const DLQ_URL: &str = "https://sqs.local/1/dlq";
/// The work queue's.
const WORK_URL: &str = "https://sqs.local/1/work";

fn settings(replay: bool, mix: Option<Mix>) -> Settings {
    let mut s = Settings {
        max_concurrency: 8,
        lease_ms: 60_000,
        queue_visibility_s: 30,
        heartbeat_ms: 10_000,
        skew_ms: 2_000,
        provider_timeout_ms: 240_000,
        poll_ms: 5_000,
        deadline_margin_ms: 5_000,
        progress_timeout_ms: 120_000,
        ..Settings::default()
    };
    s.producers = fenced_jobs::job::scope::Producers::parse(
        &format!("={PRODUCER},foreign={FOREIGN}"),
        &format!("{RECONCILER},{OPERATOR}"),
    )
    .expect("producers");
    // Every call counted in its account's and its producer's day (never refused: the limits
    // are out of reach), at a price, so that the world can see whose day each went to and that
    // each reservation is let go once.
    s.tenant_daily_spend_limit_micros = Some(u64::MAX / 4);
    s.producer_daily_spend_limit_micros = Some(u64::MAX / 4);
    let price = r#"{"input": 1.0, "output": 4.0, "batch_input": 0.5, "batch_output": 2.0}"#;
    // The first provider's model also sells flex: the worker chooses each attempt's path, a
    // deferrable job's batch as it asks, most others flex (their hours leave room for it).
    let flex = r#"{"input": 1.0, "output": 4.0, "batch_input": 0.5, "batch_output": 2.0,
        "flex_input": 0.5, "flex_output": 2.0}"#;
    let models = format!(r#"{{"models": {{"m": {flex}, "sim-backup": {price}}}}}"#);
    // A mixed backlog's deployments other than the chooser choose nothing.
    if matches!(mix, None | Some(Mix::Chooser { .. })) {
        s.batching.paths = fenced_jobs::job::path::Paths::parse("batch,flex").expect("paths");
    }
    s.prices = Arc::new(
        fenced_jobs::job::prices::PriceTable::built_in()
            .with(fenced_jobs::job::prices::PriceTable::parse(&models).expect("the sim's prices")),
    );
    s.replay = if replay {
        ReplayPolicy::Replay
    } else {
        ReplayPolicy::Never
    };
    s
}

/// A job with its input stored and its item created `ready`, as a producer submits it.
async fn submit_stored(world: &World, table: &InMemoryLedger, body: &str) {
    let msg = fenced_jobs::job::parse_body(Some(body)).expect("a valid job");
    let key = fenced_jobs::job::artifact::input_key(&msg.job_id, &msg.digest);
    let blob = world
        .bucket
        .put(&key, msg.input_canonical.as_bytes())
        .await
        .expect("the bucket takes the input");
    let stored = fenced_jobs::job::JobMessage {
        input_ref: Some(blob),
        ..msg
    };
    let job = fenced_jobs::job::NewJob::from_message(&stored, START_MS, &Default::default());
    let req = fenced_jobs::ledger::CreateRequest {
        job,
        now: START_MS,
        enqueued: true,
    };
    table.create(req).await.expect("the table takes the item");
}

/// Runs the world; call inside a current-thread runtime whose clock is paused.
pub async fn run(config: &ChaosConfig) -> ChaosReport {
    let world = Arc::new(World {
        rng: Mutex::new(fastrand::Rng::with_seed(config.seed)),
        rates: config.faults.clone(),
        faults: Mutex::new(BTreeMap::new()),
        violations: Mutex::new(Vec::new()),
        clock: VirtualClock::start(),
        terminal: Mutex::new(HashMap::new()),
        bucket: Arc::new(MemoryBlobs::new("results")),
        failing_reads: Mutex::new(std::collections::HashSet::new()),
        stream: Mutex::new((HashMap::new(), Vec::new())),
        unsent: Mutex::new(HashMap::new()),
        cancelled: Mutex::new(Vec::new()),
        lost: Mutex::new(Vec::new()),
        reconciler_runs: Mutex::new(Vec::new()),
        clean_sweeps: Mutex::new(Vec::new()),
        batch_ends: Mutex::new(Vec::new()),
        mix: config.mix,
        executed: Mutex::new(BTreeMap::new()),
    });
    let table = Arc::new(InMemoryLedger::new());
    let queue = Arc::new(Queue {
        msgs: Mutex::new(Vec::new()),
        next_handle: AtomicI64::new(1),
        visibility_ms: 30_000,
        // As the template sets it: the worker dead-letters poison itself, so the redrive policy
        // is sized for live jobs, and one reaching it is a violation.
        max_receive: 300,
        retention_ms: Settings::default().visibility.retention_s * 1_000,
    });
    let replay = config.seed % 2 == 1;
    let mut job_ids = Vec::with_capacity(config.jobs);
    let mut digests = HashMap::new();
    for i in 0..config.jobs {
        let job_id = format!("job-{i:06}");
        if let Some(mix) = config.mix {
            let (body, sent) = mixed_job(&world, mix, &job_id);
            let digest = fenced_jobs::job::parse_body(Some(&body)).map(|m| m.digest);
            digests.insert(job_id.clone(), digest.expect("a valid job"));
            queue.push(PRODUCER, &job_id, &body, sent);
            job_ids.push(job_id);
            continue;
        }
        // Most jobs have hours; one in ten has more than SQS's 12 hours of one receive, so a
        // job waiting for a decision (or a long backoff) outlives its first receive's chain.
        let long = world.fault("long_deadline", world.rates.long_deadline);
        let deadline = if long {
            START_MS + world.range(30 * 3_600_000, 40 * 3_600_000) as Millis
        } else if world.roll(0.1) {
            START_MS + world.range(13 * 3_600_000, 20 * 3_600_000) as Millis
        } else {
            START_MS + world.range(3_600_000, 14_400_000) as Millis
        };
        // A large input is submitted as `jobctl submit` does it: stored, the item created
        // `ready` referencing it, and a trigger carrying only the job id sent.
        let large = world.fault("large_input", world.rates.large_input);
        let padding = if large {
            "x".repeat(70_000)
        } else {
            String::new()
        };
        let deferrable = if world.roll(world.rates.deferrable) {
            r#","deferrable":true"#
        } else {
            ""
        };
        let mut body = format!(
            r#"{{"job_id":"{job_id}","tenant":"{TENANT}","contract":"chaos.v1","deadline_at":"{}","max_attempts":{},"input":{{"model":"m","prompt":"p{i}{padding}"{deferrable}}}}}"#,
            fenced_jobs::job::message::format_rfc3339_ms(deadline),
            world.range(1, 4)
        );
        let digest = fenced_jobs::job::parse_body(Some(&body)).map(|m| m.digest);
        digests.insert(job_id.clone(), digest.expect("a valid job"));
        if large {
            submit_stored(&world, &table, &body).await;
            body = format!(r#"{{"job_id":"{job_id}"}}"#);
        }
        // The queue is behind: a submitted trigger waits in it for up to three hours, its job
        // `ready` and sent all the while (a backlog the reconciler must walk past).
        let visible_at = START_MS
            + if large {
                world.range(0, 3 * 3_600_000)
            } else {
                world.range(0, 600_000)
            } as Millis;
        if !large && world.fault("trigger_never_sent", world.rates.trigger_never_sent) {
            let msg = fenced_jobs::job::parse_body(Some(&body)).expect("a valid job");
            let req = fenced_jobs::ledger::CreateRequest {
                job: fenced_jobs::job::NewJob::from_message(&msg, visible_at, &Default::default()),
                now: visible_at,
                enqueued: false,
            };
            table.create(req).await.expect("the table takes the item");
            world
                .unsent
                .lock()
                .expect("unsent")
                .insert(job_id.clone(), (visible_at, None));
        } else {
            queue.push(PRODUCER, &job_id, &body, visible_at);
            // (Not a job due past the run's 36 hours: a job whose message is gone waits for
            // its deadline.)
            if !long && world.fault("backlogged", world.rates.backlogged) {
                queue.backlog(&job_id);
            }
        }
        job_ids.push(job_id);
    }
    // Another producer's jobs under ids the first uses, sent before the first's: each is its own
    // job in its producer's namespace, and the first's job runs its own input.
    let mut foreign = Vec::new();
    for _ in 0..(config.jobs as f64 * world.rates.foreign_job_id).ceil() as usize {
        let job_id = job_ids[world.range(0, job_ids.len() as u64 - 1) as usize].clone();
        let body = format!(
            r#"{{"job_id":"{job_id}","tenant":"{TENANT}","contract":"chaos.v1","input":{{"model":"m","prompt":"another producer's"}}}}"#
        );
        *world
            .faults
            .lock()
            .expect("faults")
            .entry("foreign_job_id")
            .or_default() += 1;
        queue.push(FOREIGN, &job_id, &body, START_MS);
        foreign.push(job_id);
    }
    let mut poison = Vec::new();
    // Another producer's body that is not a job, naming the first producer's job where the
    // worker's dead letters name theirs: its letter must carry no job id (the worker read none),
    // so that no trusted redrive can take it into the first producer's job.
    for i in 0..(config.jobs as f64 * world.rates.planted_job_attribute).ceil() as usize {
        let victim = job_ids[world.range(0, job_ids.len() as u64 - 1) as usize].clone();
        let body =
            format!(r#"{{"job_id":"planted-{i}","contract":"chaos.v1","input":"not an object"}}"#);
        *world
            .faults
            .lock()
            .expect("faults")
            .entry("planted_job_attribute")
            .or_default() += 1;
        let planted = vec![(fenced_jobs::queue::JOB_ID_ATTRIBUTE.to_owned(), victim)];
        queue.push_with(FOREIGN, "", &body, START_MS, planted);
        poison.push(body);
    }
    for i in 0..(config.jobs as f64 * world.rates.poison_message).ceil() as usize {
        let body =
            format!(r#"{{"job_id":"poison-{i}","contract":"chaos.v1","input":"not an object"}}"#);
        *world
            .faults
            .lock()
            .expect("faults")
            .entry("poison_message")
            .or_default() += 1;
        queue.push(
            PRODUCER,
            &format!("poison-{i}"),
            &body,
            START_MS + world.range(0, 600_000) as Millis,
        );
        poison.push(body);
    }
    // Jobs due well past what 300 receives carry (59 days): refused at their first sight, so
    // they must reach the DLQ with no item ever written.
    let mut far = Vec::new();
    for i in 0..(config.jobs as f64 * world.rates.deadline_past_reach).ceil() as usize {
        let job_id = format!("far-{i}");
        let body = format!(
            r#"{{"job_id":"{job_id}","contract":"chaos.v1","deadline_at":"{}","input":{{"model":"m","prompt":"far"}}}}"#,
            fenced_jobs::job::message::format_rfc3339_ms(START_MS + 70 * 86_400_000)
        );
        *world
            .faults
            .lock()
            .expect("faults")
            .entry("deadline_past_reach")
            .or_default() += 1;
        queue.push(PRODUCER, &job_id, &body, START_MS + 1_000 * i as Millis);
        poison.push(body);
        far.push(job_id);
    }
    // One poison body of nearly 1 MiB: no room beside it for the reason, so the worker
    // dead-letters a smaller letter of its own in its place.
    if world.rates.poison_message > 0.0 {
        let body = format!("{{not json {}", "x".repeat(1_048_500));
        *world
            .faults
            .lock()
            .expect("faults")
            .entry("dead_letter_too_large")
            .or_default() += 1;
        queue.push(
            PRODUCER,
            "poison-large",
            &body,
            START_MS + world.range(0, 600_000) as Millis,
        );
        poison.push(body);
    }
    // One valid body of nearly 1 MiB whose input is many small maps: it would take about
    // 90 MiB parsed, past what a document may cost, so it is poison with its reason.
    if world.rates.poison_message > 0.0 {
        let rows = vec![r#"{"a":0}"#; 130_000].join(",");
        let body = format!(
            r#"{{"job_id":"poison-costly","contract":"chaos.v1","input":{{"model":"m","prompt":"p","rows":[{rows}]}}}}"#
        );
        *world
            .faults
            .lock()
            .expect("faults")
            .entry("document_too_costly")
            .or_default() += 1;
        queue.push(
            PRODUCER,
            "poison-costly",
            &body,
            START_MS + world.range(0, 600_000) as Millis,
        );
        poison.push(body);
    }
    let provider = SimProvider {
        name: "simulated",
        world: Arc::clone(&world),
        table: Arc::clone(&table),
        runs: Arc::new(Mutex::new(HashMap::new())),
        per_job: Arc::new(Mutex::new(HashMap::new())),
        batches: Arc::default(),
    };
    let deliveries = Arc::new(AtomicI64::new(0));
    let invocations = Arc::new(AtomicI64::new(0));
    // The days every consumer counts its calls in.
    let spend = Arc::new(fenced_jobs::ledger::spend::MemorySpend::new());
    // Two hours past the last deadline a job of the run may have (40 hours; a mixed
    // backlog's, 50): a job waiting for a decision lives until its deadline.
    let horizon = START_MS + if config.mix.is_some() { 52 } else { 42 } * 3_600_000;
    let finished = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Every other pair of seeds takes the provider's webhooks: each batch lists its jobs, and
    // its end sends their triggers.
    let webhooks = match config.mix {
        None => (config.seed / 2) % 2 == 1,
        Some(mix) => mix == Mix::Chooser { webhooks: true },
    };
    // The consumers share what each path took, as the deployed environments do.
    let path_times = Arc::new(fenced_jobs::ledger::path_times::MemoryTimes::new());

    let consumers = (0..config.consumers).map(|c| {
        let gate = Arc::new(PauseGate::default());
        let mut processor = Processor::new(
            SimLedger {
                world: Arc::clone(&world),
                table: Arc::clone(&table),
                gate: Arc::clone(&gate),
            },
            provider.clone(),
            world.clock.clone(),
            Settings {
                batching: fenced_jobs::worker::settings::Batching {
                    webhooks,
                    ..settings(replay, config.mix).batching
                },
                ..settings(replay, config.mix)
            },
        )
        .with_shared_times(path_times.clone())
        // A second provider, sharing the world's ground truth, takes a job the first refused.
        .with_fallback(
            SimProvider {
                name: "simulated-backup",
                ..provider.clone()
            },
            ModelMap::parse("SIMULATED_MODELS", "*=sim-backup").expect("model map"),
        )
        .with_contracts(Arc::new(contracts()))
        .with_spend_budget(Arc::clone(&spend) as Arc<dyn fenced_jobs::ledger::spend::SpendBudget>);
        // Half the consumers have a results bucket; the others keep every answer inline.
        if c % 2 == 0 {
            processor = processor.with_blobs(Arc::new(SimBlobs {
                world: Arc::clone(&world),
            }));
        }
        let handler = BatchHandler::new(
            processor,
            SimVisibility {
                world: Arc::clone(&world),
                queue: Arc::clone(&queue),
                gate: Arc::clone(&gate),
            },
        )
        .with_seed(config.seed.wrapping_add(c as u64))
        .with_dead_letters(Arc::new(SimDeadLetters {
            world: Arc::clone(&world),
            queue: Arc::clone(&queue),
        }));
        let (world, queue, table) = (Arc::clone(&world), Arc::clone(&queue), Arc::clone(&table));
        let (deliveries, invocations) = (Arc::clone(&deliveries), Arc::clone(&invocations));
        let finished = Arc::clone(&finished);
        async move {
            while !finished.load(Ordering::Relaxed) {
                let records = queue.receive(&world, config.batch_size);
                if records.is_empty() {
                    tokio::time::sleep(Duration::from_millis(1_000 + c as u64 * 97)).await;
                    continue;
                }
                deliveries.fetch_add(records.len() as i64, Ordering::Relaxed);
                let n = invocations.fetch_add(1, Ordering::Relaxed);
                let mut event = SqsEvent::default();
                event.records = records;
                let timeout_ms: Millis =
                    if world.fault("short_invocation", world.rates.short_invocation) {
                        world.range(8_000, 40_000) as Millis
                    } else {
                        300_000
                    };
                let inv = Invocation {
                    id: format!("inv-{n}"),
                    deadline: Some(world.now() + timeout_ms),
                };
                if world.fault("lapse_alone", world.rates.lapse_alone) {
                    // Past the lease, while the batch's messages stay invisible: nobody else
                    // can take its jobs over.
                    let from = world.now() + world.range(0, 5_000) as Millis;
                    let until = from + world.range(70_000, 150_000) as Millis;
                    gate.from.store(from, Ordering::Relaxed);
                    gate.until.store(until, Ordering::Relaxed);
                    let handles: Vec<String> = event
                        .records
                        .iter()
                        .filter_map(|r| r.receipt_handle.clone())
                        .collect();
                    queue.hold(&handles, until + 30_000);
                } else if world.fault("pause", world.rates.pause) {
                    let from = world.now() + world.range(0, 20_000) as Millis;
                    gate.from.store(from, Ordering::Relaxed);
                    gate.until.store(
                        from + world.range(70_000, 200_000) as Millis,
                        Ordering::Relaxed,
                    );
                }
                // Lambda ends the invocation at its deadline; a crash ends it earlier.
                let crash = world.fault("crash", world.rates.crash);
                let cut = if crash {
                    world.range(1, 60_000)
                } else {
                    timeout_ms as u64
                };
                let handled = tokio::time::timeout(
                    Duration::from_millis(cut),
                    handler.handle_batch(&event, &inv),
                )
                .await;
                // A crashed or timed-out invocation returns nothing: nothing is deleted.
                let Ok(report) = handled else {
                    // A backlogged message's retention may end while its owner is down: only
                    // the due index then shows the reconciler its job. (Only a job with an
                    // item has an owner: a message SQS drops before any claim wrote one leaves
                    // nothing anyone could find, and is its producer's to send again.)
                    if crash && world.fault("message_lost", world.rates.message_lost) {
                        let now = world.now();
                        for record in &event.records {
                            let Ok(trigger) = parse_trigger(record.body.as_deref()) else {
                                continue;
                            };
                            let whole = whole_id(record, trigger.job_id());
                            let item = table.get(&whole).await.ok().flatten();
                            if item.is_some() {
                                queue.retention_ends(trigger.job_id(), now);
                            }
                        }
                    }
                    if !crash {
                        world.violation(format!(
                            "{}: no response before the invocation's deadline",
                            inv.id
                        ));
                    }
                    continue;
                };
                if world.now() > inv.deadline.unwrap_or(Millis::MAX) {
                    world.violation(format!(
                        "{}: response posted {} ms after the invocation's deadline",
                        inv.id,
                        world.now() - inv.deadline.unwrap_or(0)
                    ));
                }
                let Ok(failed) = report.response else {
                    continue;
                };
                for record in &event.records {
                    let id = record.message_id.as_deref().unwrap_or_default();
                    if failed.iter().any(|f| f == id) {
                        continue;
                    }
                    match parse_trigger(record.body.as_deref()) {
                        // Poison is acknowledged only once the worker sent it to the DLQ.
                        Err(_) => {
                            let body = record.body.clone().unwrap_or_default();
                            if !dead_lettered(&queue.dead_bodies(), &body) {
                                world.violation(format!(
                                    "{id}: poison acknowledged without reaching the DLQ"
                                ));
                            }
                        }
                        Ok(trigger) => {
                            let job_id = whole_id(record, trigger.job_id());
                            let state = table.get(&job_id).await.ok().flatten().map(|r| r.state);
                            // A job refused at its first sight is acknowledged once the worker
                            // sent it to the DLQ, with no item.
                            let refused = state.is_none()
                                && record
                                    .body
                                    .as_ref()
                                    .is_some_and(|b| queue.dead_bodies().contains(b));
                            if !refused && !state.is_some_and(JobState::is_terminal) {
                                world.violation(format!(
                                    "{job_id}: message acknowledged while the job is {:?}",
                                    state.map(JobState::as_str)
                                ));
                            }
                        }
                    }
                    queue.delete(&world, record.receipt_handle.as_deref().unwrap_or_default());
                }
            }
        }
    });
    // The operator looks at the DLQ every 10 minutes; the run ends when the queue is empty and
    // the DLQ holds only jobs waiting for a decision.
    let operator = {
        let (world, queue, table) = (Arc::clone(&world), Arc::clone(&queue), Arc::clone(&table));
        let finished = Arc::clone(&finished);
        // The operator's own client, with the same faults.
        let ledger = SimLedger {
            world: Arc::clone(&world),
            table: Arc::clone(&table),
            gate: Arc::new(PauseGate::default()),
        };
        let job_ids = job_ids.clone();
        async move {
            let mut ticks = 0u64;
            let mut quiet = 0u64;
            loop {
                tokio::time::sleep(Duration::from_millis(60_000)).await;
                ticks += 1;
                if world.fault("operator_cancel", world.rates.operator_cancel) {
                    // A job picked among a few at random, one not finished if there is one.
                    let mut job_id = &job_ids[0];
                    for _ in 0..20 {
                        job_id = &job_ids[world.range(0, job_ids.len() as u64 - 1) as usize];
                        let item = table.get(job_id).await.ok().flatten();
                        if item.is_some_and(|r| !r.state.is_terminal()) {
                            break;
                        }
                    }
                    let now = world.now();
                    let cancel = fenced_jobs::ops::operator::cancel(
                        &ledger, job_id, "chaos", None, "chaos", now,
                    );
                    let kind = match cancel.await {
                        Ok(fenced_jobs::ops::operator::Cancelled::Requested(_)) => {
                            Some("cancel_running")
                        }
                        Ok(fenced_jobs::ops::operator::Cancelled::Ended(_)) => Some("cancel_idle"),
                        Err(_) => None,
                    };
                    if let Some(kind) = kind {
                        world
                            .cancelled
                            .lock()
                            .expect("cancelled")
                            .push(job_id.clone());
                        *world
                            .faults
                            .lock()
                            .expect("faults")
                            .entry(kind)
                            .or_default() += 1;
                    }
                }
                // Empty for 45 minutes in a row: the reconciler (every 10 minutes, re-sending
                // what was untouched for 20) has had its chance to re-trigger stranded jobs.
                quiet = if queue.live() == 0 { quiet + 1 } else { 0 };
                let empty = quiet >= 45;
                if ticks.is_multiple_of(10) || empty {
                    let moved = queue.redrive(&world, &table);
                    if moved > 0 {
                        *world
                            .faults
                            .lock()
                            .expect("faults")
                            .entry("dlq_redrive")
                            .or_default() += moved;
                    }
                    // A job whose message was lost waits for the reconciler: re-sent, or expired
                    // at its deadline.
                    let mut waiting = false;
                    let lost = world.lost.lock().expect("lost").clone();
                    for job_id in lost {
                        let item = table.get(&job_id).await.ok().flatten();
                        waiting |= item.is_some_and(|r| {
                            !r.state.is_terminal() && r.state != JobState::Unknown
                        });
                    }
                    if empty && moved == 0 && !waiting {
                        break;
                    }
                }
                if world.now() > horizon {
                    world.violation(format!(
                        "the run did not settle within {} virtual hours",
                        (horizon - START_MS) / 3_600_000
                    ));
                    break;
                }
            }
            finished.store(true, Ordering::Relaxed);
        }
    };
    // The reconciler on its schedule (every 10 virtual minutes), on the same table through a
    // client with the same faults, sending its triggers to the queue and cancelling the calls
    // of the jobs it expires.
    let canceller = provider.clone();
    let reconciler = {
        let ledger = SimLedger {
            world: Arc::clone(&world),
            table: Arc::clone(&table),
            gate: Arc::new(PauseGate::default()),
        };
        let triggers = SimTriggers {
            world: Arc::clone(&world),
            queue: Arc::clone(&queue),
        };
        let (world, finished) = (Arc::clone(&world), Arc::clone(&finished));
        let queue = Arc::clone(&queue);
        let jobs = config.jobs;
        // Whose letter each is, as the template tells the reconciler.
        let producers = fenced_jobs::job::scope::Producers::parse(
            &format!("={PRODUCER},foreign={FOREIGN}"),
            &format!("{WORKER},{RECONCILER},{OPERATOR}"),
        )
        .expect("producers");
        async move {
            // Pages of a fiftieth of the jobs: the backlog of submitted jobs is deeper than a
            // page, as a backlog of millions is for the deployed one's pages of a thousand.
            let settings = fenced_jobs::ops::reconcile::ReconcileSettings {
                max_jobs: (jobs / 50).max(4),
                ..Default::default()
            };
            while !finished.load(Ordering::Relaxed) {
                tokio::time::sleep(Duration::from_millis(600_000)).await;
                let now = world.now();
                let run = fenced_jobs::ops::reconcile::reconcile(
                    &ledger, &triggers, &canceller, now, &settings,
                )
                .await;
                let ended = world.now();
                world
                    .reconciler_runs
                    .lock()
                    .expect("runs")
                    .push((now, ended));
                if let Ok(r) = run {
                    let mut faults = world.faults.lock().expect("faults");
                    *faults.entry("reconciler_expired").or_default() += r.expired;
                    *faults.entry("reconciler_resent").or_default() += r.resent;
                    if r.message_lost > 0 {
                        *faults.entry("reconciler_message_lost").or_default() += r.message_lost;
                    }
                }
                // Live jobs' dead letters, back to the work queue.
                let sweep = SimSweep {
                    world: Arc::clone(&world),
                    queue: Arc::clone(&queue),
                };
                let urls = (DLQ_URL, WORK_URL);
                // (a letter the ledger's read failed for stays: it is judged again next time)
                let limits = (1_000, now - settings.skew_ms);
                let swept = redrive_live(&ledger, &producers, &sweep, urls, limits).await;
                let (moved, failed, overdue) = (swept.moved, swept.failed, swept.overdue);
                if failed == 0 {
                    world.clean_sweeps.lock().expect("sweeps").push(now);
                }
                let mut report = fenced_jobs::ops::reconcile::ReconcileReport::default();
                let clocks = (now, settings.skew_ms);
                let expiry = fenced_jobs::ops::reconcile::expire_found(
                    &ledger,
                    &canceller,
                    &overdue,
                    clocks,
                    &mut report,
                );
                expiry.await;
                let counts = [
                    ("reconciler_redriven", moved),
                    ("reconciler_sweep_failed", failed),
                    ("reconciler_expired_dead_letter", report.expired),
                ];
                for (kind, n) in counts.into_iter().filter(|(_, n)| *n > 0) {
                    *world
                        .faults
                        .lock()
                        .expect("faults")
                        .entry(kind)
                        .or_default() += n;
                }
                // Stored answers no item references, through the faulty client.
                let blobs = SimBlobs {
                    world: Arc::clone(&world),
                };
                let since = now - settings.orphan_window_ms;
                if let Ok(n) = fenced_jobs::ops::results::sweep_orphans(
                    &ledger,
                    &blobs,
                    since,
                    now,
                    (1_000, settings.inline_max_bytes),
                )
                .await
                {
                    *world
                        .faults
                        .lock()
                        .expect("faults")
                        .entry("orphans_removed")
                        .or_default() += n;
                }
            }
        }
    };
    let pushed = webhook_actor(
        Arc::clone(&world),
        Arc::clone(&table),
        Arc::clone(&queue),
        Arc::clone(&finished),
        webhooks,
    );
    futures::future::join4(
        futures::future::join_all(consumers),
        operator,
        reconciler,
        pushed,
    )
    .await;

    // End of the run: every job terminal, or unknown with its evidence recorded.
    let mut report = ChaosReport {
        jobs: config.jobs,
        deliveries: deliveries.load(Ordering::Relaxed) as u64,
        invocations: invocations.load(Ordering::Relaxed) as u64,
        virtual_ms: world.now() - START_MS,
        webhooks,
        ..ChaosReport::default()
    };
    // Each execution priced as its model is on its path (the mixed backlog's report usage).
    let prices = settings(false, config.mix).prices;
    let usage = provider.usage();
    for ((model, path), n) in world.executed.lock().expect("executed").iter() {
        *report.paid_by_path.entry(path).or_default() += n;
        let rate = fenced_jobs::job::path::parse(path).unwrap_or_default();
        let each = usage.and_then(|u| prices.cost_at(model, &u, rate));
        report.model_cost_micros += n * each.unwrap_or(0);
    }
    let ends: HashMap<String, Millis> = world
        .batch_ends
        .lock()
        .expect("batch ends")
        .iter()
        .cloned()
        .collect();
    for job_id in &job_ids {
        let item = table.get(job_id).await.ok().flatten();
        report
            .batch_to_succeeded_ms
            .extend(item.as_ref().and_then(|r| batch_wait(r, &ends)));
        let state = item.as_ref().map(|r| r.state);
        let label = state.map_or("absent", JobState::as_str).to_owned();
        *report.end_states.entry(label).or_default() += 1;
        report.met_deadline += u64::from(
            item.as_ref()
                .is_some_and(|r| r.state == JobState::Succeeded && r.updated_at <= r.deadline_at),
        );
        // An unknown job whose last call finished with an answer the provider still holds was
        // left uncollected.
        let collectable = item.as_ref().is_some_and(|r| {
            r.state == JobState::Unknown
                && r.attempt_log
                    .last()
                    .is_some_and(|a| a.provider_ref.is_some())
                && provider
                    .runs
                    .lock()
                    .expect("runs")
                    .get(&(job_id.clone(), r.attempts))
                    .is_some_and(|run| {
                        run.answer.is_ok() && !run.forgotten && run.done_at <= world.now()
                    })
        });
        match item {
            Some(r) if r.state.is_terminal() => {}
            Some(_) if collectable => world.violation(format!(
                "{job_id}: ended unknown with a collectable answer left uncollected"
            )),
            Some(r) if r.state == JobState::Unknown && r.last_error.is_some() => {}
            Some(r) => world.violation(format!(
                "{job_id}: ended {} without a decision or evidence",
                r.state.as_str()
            )),
            None => world.violation(format!("{job_id}: lost (no ledger item)")),
        }
    }
    // A job whose trigger was never sent is found by the reconciler's walk within a few runs
    // of its becoming due, however deep the backlog sent before it.
    let ready_after = fenced_jobs::ops::reconcile::ReconcileSettings::default().ready_after_ms;
    let runs = world.reconciler_runs.lock().expect("runs").clone();
    let cancelled = world.cancelled.lock().expect("cancelled").clone();
    for (job_id, (written, first)) in world.unsent.lock().expect("unsent").iter() {
        // A job cancelled before its trigger was due needs none.
        if cancelled.contains(job_id) {
            continue;
        }
        let bound = runs
            .iter()
            .filter(|(start, _)| *start >= written + ready_after)
            .nth(UNSENT_FOUND_WITHIN_RUNS - 1)
            .map(|(_, end)| *end);
        if let Some(bound) = bound
            && first.is_none_or(|at| at > bound)
        {
            world.violation(format!(
                "{job_id}: written with no trigger at {written}, first re-sent at {first:?}, \
                 after {UNSENT_FOUND_WITHIN_RUNS} reconciler runs that could find it (by {bound})"
            ));
        }
    }
    // The other producer labels its jobs with the first's tenant: what its calls spend is
    // counted in its own account and its own day, never the first's.
    let items = spend.items();
    let counted = |suffix: &str| items.iter().any(|i| i.ends_with(suffix));
    let mut foreign_called = false;
    for job_id in &foreign {
        let theirs = table.get(&format!("foreign/{job_id}")).await.ok().flatten();
        foreign_called |= theirs.is_some_and(|r| r.attempts > 0);
    }
    let own = [format!("#foreign/{TENANT}"), "#producer#foreign".to_owned()];
    if foreign_called && !own.iter().all(|suffix| counted(suffix)) {
        world.violation(format!(
            "the other producer's calls, labelled {TENANT}, were not counted in its own account \
             and day: the day items are {items:?}"
        ));
    }
    // Each call's reservation is let go once, by its charge or its release: no day holds less
    // than nothing, charges no less than nothing, or counts other than its models' sum.
    let mut days: Vec<&str> = items.iter().filter_map(|i| i.split('#').next()).collect();
    days.dedup();
    for day in days {
        use fenced_jobs::ledger::spend::SpendBudget;
        for count in spend.count(day).await.unwrap_or_default() {
            let by_model: i64 = count.models.values().sum();
            if count.held < 0 || count.counted < count.held || by_model != count.counted {
                world.violation(format!(
                    "the day item {} holds {}, counts {} and {by_model} by model",
                    count.item, count.held, count.counted
                ));
            }
        }
    }
    for job_id in &foreign {
        let ours = table.get(job_id).await.ok().flatten();
        if ours.is_some_and(|r| Some(&r.input_digest) != digests.get(job_id)) {
            world.violation(format!(
                "{job_id}: holds another producer's input under its producer's id"
            ));
        }
        let theirs = table.get(&format!("foreign/{job_id}")).await.ok().flatten();
        if !theirs.is_some_and(|r| r.state.is_terminal() || r.state == JobState::Unknown) {
            world.violation(format!(
                "{job_id}: the other producer's job of that id did not run as its own"
            ));
        }
    }
    // A job whose cancel was written ends cancelled, or expired if its deadline came first;
    // never with an answer accepted after the cancel.
    for job_id in &cancelled {
        let state = table.get(job_id).await.ok().flatten().map(|r| r.state);
        if !matches!(state, Some(JobState::Cancelled | JobState::Expired)) {
            world.violation(format!(
                "{job_id}: its cancel was written, and it ended {:?}",
                state.map(JobState::as_str)
            ));
        }
    }
    check_bucket(&world, &table, &job_ids).await;
    check_events(&world, &table, &job_ids, config.seed).await;
    // Every poison message ended in the DLQ: sent there by the worker, or, when those sends
    // failed, moved by the redrive policy.
    queue.check_dead_letters(&world);
    let dead = queue.dead_bodies();
    for body in &poison {
        if !dead_lettered(&dead, body) {
            world.violation(format!("a poison message never reached the DLQ: {body}"));
        }
    }
    for job_id in &far {
        if table.get(job_id).await.ok().flatten().is_some() {
            world.violation(format!(
                "{job_id}: a job due past the redrive count's reach has an item"
            ));
        }
    }
    let per_job = provider.per_job.lock().expect("per job").clone();
    let total: u64 = per_job.values().sum();
    report.executions_mean = total as f64 / config.jobs.max(1) as f64;
    report.executions_max = per_job.values().copied().max().unwrap_or(0);
    report.faults = world.faults.lock().expect("faults").clone();
    report.violations = world.violations.lock().expect("violations").clone();
    report
}

/// The events' target, with its request limits enforced, whose requests sometimes fail.
struct SimSink<'a> {
    world: &'a World,
    inner: fenced_jobs::events::RecordingSink,
}

impl fenced_jobs::events::EventSink for SimSink<'_> {
    fn target(&self) -> fenced_jobs::events::Target {
        self.inner.target()
    }
    async fn send(
        &self,
        events: &[fenced_jobs::events::CompletionEvent],
    ) -> Result<(), (usize, String)> {
        if self.world.fault(
            "event_publish_failure",
            self.world.rates.event_publish_failure,
        ) {
            return Err((0, "ThrottlingException".into()));
        }
        self.inner.send(events).await
    }
}

/// The table's stream through the real dispatcher, in Lambda's batches of 100, to a target
/// chosen by the seed (EventBridge, SNS or SQS, each with its request limits): every batch is
/// published within a few retries, and every job's final state is announced, its answer in the
/// event or read from the item.
async fn check_events(world: &World, table: &InMemoryLedger, job_ids: &[String], seed: u64) {
    use fenced_jobs::events::{RecordingSink, Target};
    let target = [Target::EventBridge, Target::Sns, Target::Sqs][(seed % 3) as usize];
    let sink = SimSink {
        world,
        inner: RecordingSink::of(target),
    };
    let records = std::mem::take(&mut world.stream.lock().expect("stream").1);
    for batch in records.chunks(100) {
        let mut from = 0;
        let mut tries = 0;
        while from < batch.len() {
            let event = StreamEvent {
                records: batch[from..].to_vec(),
            };
            let report = fenced_jobs::ops::dispatch::dispatch(&event, &sink).await;
            let Some(failed) = report.failed_at else {
                break;
            };
            tries += 1;
            if tries > 30 {
                world.violation(format!("a stream batch was never published ({target:?})"));
                break;
            }
            from += event
                .records
                .iter()
                .position(|r| r.dynamodb.sequence_number.as_deref() == Some(failed.as_str()))
                .unwrap_or(0);
        }
    }
    let published = sink.inner.published();
    let slim = published
        .iter()
        .filter(|e| e.detail.get("result_in_ledger").is_some())
        .count();
    *world
        .faults
        .lock()
        .expect("faults")
        .entry("events_without_their_answer")
        .or_default() += slim as u64;
    for job_id in job_ids {
        let Some(job) = table.get(job_id).await.ok().flatten() else {
            continue;
        };
        if !fenced_jobs::events::announced(job.state) {
            continue;
        }
        let announced = published
            .iter()
            .any(|e| e.job_id == *job_id && e.state == job.state);
        if !announced {
            world.violation(format!(
                "{job_id}: {} never announced ({target:?})",
                job.state.as_str()
            ));
        }
    }
}

/// The results bucket at the end: every stored answer an item references holds the bytes its
/// reference names, and once a last sweep ran (without faults) no object is left that no item
/// references.
async fn check_bucket(world: &World, table: &InMemoryLedger, job_ids: &[String]) {
    let bucket = world.bucket.as_ref();
    // Inputs are the lifecycle rule's to remove (a consumer that stored one may lose its
    // claim to one that kept it inline); a live job's gone input is checked by its outcome.
    let answers = || {
        bucket
            .keys()
            .into_iter()
            .filter(|k| !k.starts_with(fenced_jobs::job::artifact::INPUTS_PREFIX))
    };
    for key in answers() {
        let job_id = fenced_jobs::job::artifact::parse_result_key(&key).map(|(id, _)| id);
        let Some(job) = table.get(job_id.unwrap_or("")).await.ok().flatten() else {
            world.violation(format!("{key}: stored for no job"));
            continue;
        };
        if let Some(blob) = job.result_ref.as_ref().filter(|b| b.key == key) {
            match read_checked(bucket, blob, usize::MAX).await {
                Err(_) => world.violation(format!(
                    "{}: its stored answer is not what it references",
                    job.job_id
                )),
                Ok(bytes) if !meets_contract(&job.job_id, &bytes) => world.violation(format!(
                    "{}: an accepted answer fails its contract",
                    job.job_id
                )),
                Ok(_) => {}
            }
        }
    }
    let now = world.now();
    // Every job the run created, whatever its deadline (the longest a worker takes).
    let every_deadline = now + fenced_jobs::job::policy::Policy::default().max_deadline_ms;
    let removed = fenced_jobs::ops::results::sweep_orphans(
        table,
        bucket,
        START_MS,
        every_deadline,
        (usize::MAX, fenced_jobs::job::DEFAULT_INLINE_MAX_BYTES),
    )
    .await
    .unwrap_or(0);
    *world
        .faults
        .lock()
        .expect("faults")
        .entry("orphans_left_for_last_sweep")
        .or_default() += removed;
    for key in answers() {
        let job_id = fenced_jobs::job::artifact::parse_result_key(&key).map(|(id, _)| id);
        let job = table.get(job_id.unwrap_or("")).await.ok().flatten();
        let referenced = job
            .as_ref()
            .is_some_and(|j| j.result_ref.as_ref().is_some_and(|b| b.key == key));
        if !referenced && job.is_some_and(|j| j.state.is_terminal()) {
            world.violation(format!("{key}: an orphan the sweep left"));
        }
    }
    for job_id in job_ids {
        if let Some(blob) = table
            .get(job_id)
            .await
            .ok()
            .flatten()
            .and_then(|j| j.result_ref)
            && !bucket.keys().contains(&blob.key)
        {
            world.violation(format!("{job_id}: references an answer that is not stored"));
        }
    }
}

/// Runs the world on its own current-thread runtime with a paused clock.
pub fn run_blocking(config: &ChaosConfig) -> ChaosReport {
    in_virtual_time(run(config))
}

/// Runs `world` on its own current-thread runtime whose clock is paused (virtual time).
pub fn in_virtual_time<F: std::future::Future>(world: F) -> F::Output {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("runtime");
    runtime.block_on(world)
}

/// Counts by name, as printed: `name count, name count`.
pub fn listed<K: std::fmt::Display>(counts: &BTreeMap<K, u64>) -> String {
    let items: Vec<String> = counts.iter().map(|(k, v)| format!("{k} {v}")).collect();
    items.join(", ")
}

impl ChaosReport {
    /// The figures, as printed by `make chaos`.
    pub fn print(&self, config: &ChaosConfig) {
        println!(
            "seed {}: {} jobs, {} consumers, {} invocations, {} deliveries, {:.1} virtual hours",
            config.seed,
            self.jobs,
            config.consumers,
            self.invocations,
            self.deliveries,
            self.virtual_ms as f64 / 3_600_000.0
        );
        println!("  faults injected: {}", listed(&self.faults));
        println!(
            "  provider executions per job: mean {:.3}, max {}",
            self.executions_mean, self.executions_max
        );
        println!("  jobs ending: {}", listed(&self.end_states));
        let mut waits = self.batch_to_succeeded_ms.clone();
        waits.sort_unstable();
        if let Some(median) = waits.get(waits.len() / 2) {
            println!(
                "  a batch's end to its job's success ({}): median {:.1} s over {} jobs",
                if self.webhooks {
                    "webhooks"
                } else {
                    "looks alone"
                },
                *median as f64 / 1_000.0,
                waits.len()
            );
        }
        println!("  invariant violations: {}", self.violations.len());
        for v in self.violations.iter().take(20) {
            println!("    {v}");
        }
    }
}

/// The webhook function's ledger when it is cut off after its sends: the record of the
/// delivery never lands.
struct CutOff<'a>(&'a InMemoryLedger);

impl fenced_jobs::ledger::pushed::PushedLedger for CutOff<'_> {
    async fn batch_members(
        &self,
        batch_id: &str,
    ) -> Result<Vec<fenced_jobs::job::BatchMember>, LedgerError> {
        self.0.batch_members(batch_id).await
    }
    async fn was_acted_on(&self, id: &str, now: Millis) -> Result<bool, LedgerError> {
        self.0.was_acted_on(id, now).await
    }
    async fn acted_on(&self, _: &str, _: Millis, _: Millis) -> Result<(), LedgerError> {
        Err(LedgerError::Unavailable {
            operation: "webhook delivery",
            code: "cut off".to_owned(),
        })
    }
}

/// A job of a mixed backlog (`mix`), and when its trigger is sent: within the run's first two
/// hours, due five minutes to two days after that (evenly on a log scale: as many due within
/// the first hour as from four hours to two days), `deferrable` as `mix` has it.
fn mixed_job(world: &World, mix: Mix, job_id: &str) -> (String, Millis) {
    let sent = START_MS + world.range(0, 2 * 3_600_000) as Millis;
    let (soonest, latest) = ((5 * 60_000) as f64, (48 * 3_600_000) as f64);
    let at = world.range(0, 1_000_000) as f64 / 1_000_000.0;
    let due_in = (soonest.ln() + at * (latest / soonest).ln()).exp() as Millis;
    let deferrable = if mix == Mix::ByHand && due_in >= BY_HAND_FROM_MS {
        r#","deferrable":true"#
    } else {
        ""
    };
    let body = format!(
        r#"{{"job_id":"{job_id}","tenant":"{TENANT}","contract":"chaos.v1","deadline_at":"{}","max_attempts":3,"input":{{"model":"m","prompt":"{job_id}"{deferrable}}}}}"#,
        fenced_jobs::job::message::format_rfc3339_ms(sent + due_in),
    );
    (body, sent)
}

/// How long after its batch's end a job that succeeded from a line of it did (`ends`: each
/// batch's end).
fn batch_wait(item: &JobItem, ends: &HashMap<String, Millis>) -> Option<Millis> {
    let (batch, _) = item
        .last_provider_ref()
        .and_then(fenced_jobs::provider::batch::parse_ref)?;
    let end = ends.get(batch?)?;
    (item.state == JobState::Succeeded).then(|| item.updated_at - end)
}

/// OpenAI's webhooks, when the deployment takes them: each batch's end is announced once, 1 to
/// 30 s after it, unless lost; sometimes again a minute later (a retry, or a replay), which must
/// send nothing; sometimes also by a stranger with another secret, which must be refused. The
/// function is the real one ([`fenced_jobs::ops::webhook::handle`]), over the world's table and
/// queue.
async fn webhook_actor(
    world: Arc<World>,
    table: Arc<InMemoryLedger>,
    queue: Arc<Queue>,
    finished: Arc<std::sync::atomic::AtomicBool>,
    webhooks: bool,
) {
    use fenced_jobs::ops::webhook::{Answer, UrlRequest, WebhookSecret, handle};
    if !webhooks {
        return;
    }
    let secret = WebhookSecret::parse("whsec_Y2hhb3Mtc2VjcmV0").expect("the endpoint's secret");
    let stranger = WebhookSecret::parse("whsec_c3RyYW5nZXI=").expect("a stranger's secret");
    let triggers = SimTriggers {
        world: Arc::clone(&world),
        queue,
    };
    // (when, batch, delivery id, again, forged, cut off)
    let mut due: Vec<(Millis, String, String, bool, bool, bool)> = Vec::new();
    let mut seen = 0;
    while !finished.load(Ordering::Relaxed) {
        tokio::time::sleep(Duration::from_millis(5_000)).await;
        let now = world.now();
        {
            let ends = world.batch_ends.lock().expect("batch ends");
            for (batch, end) in ends.iter().skip(seen) {
                let id = format!("msg_{batch}");
                if world.fault("webhook_lost", world.rates.webhook_lost) {
                    continue;
                }
                let at = end + world.range(1_000, 30_000) as Millis;
                let cut = world.fault("webhook_cut_off", world.rates.webhook_cut_off);
                due.push((at, batch.clone(), id.clone(), false, false, cut));
                if cut {
                    // The sender's retry of a delivery it heard no answer to.
                    due.push((at + 60_000, batch.clone(), id.clone(), false, false, false));
                } else if world.fault("webhook_again", world.rates.webhook_again) {
                    due.push((at + 60_000, batch.clone(), id.clone(), true, false, false));
                }
                if world.fault("webhook_forged", world.rates.webhook_forged) {
                    let forged = format!("{id}-forged");
                    due.push((at, batch.clone(), forged, false, true, false));
                }
            }
            seen = ends.len();
        }
        let (ready, later): (Vec<_>, Vec<_>) = due.into_iter().partition(|d| d.0 <= now);
        due = later;
        for (_, batch, id, again, forged, cut) in ready {
            let body = format!(
                r#"{{"id":"evt_{batch}","object":"event","type":"batch.completed","data":{{"id":"{batch}"}}}}"#
            );
            let signer = if forged { &stranger } else { &secret };
            let request = UrlRequest::signed(signer, &id, now / 1_000, &body);
            let answer = match cut {
                true => handle(&request, &secret, &CutOff(&table), &triggers, now).await,
                false => handle(&request, &secret, table.as_ref(), &triggers, now).await,
            };
            let expected = match (forged, again) {
                (true, _) => matches!(answer, Answer::Refused(_)),
                (false, true) => answer == Answer::Replayed,
                (false, false) => matches!(answer, Answer::Triggered(_)),
            };
            if !expected {
                world.violation(format!(
                    "{batch}: webhook {id} (again {again}, forged {forged}) answered {answer:?}"
                ));
            }
        }
    }
}
