//! Pure job logic: the ledger item, its states, the message contract and the decisions taken on
//! them. Nothing here performs I/O, reads a clock or knows an AWS type: callers pass `now`.

pub mod account;
pub mod artifact;
pub mod contract;
pub mod cost;
pub mod decision;
mod digest;
pub mod message;
pub mod outcome;
pub mod path;
pub mod pointer;
pub mod policy;
pub mod prices;
mod progress;
pub mod scope;
pub(crate) mod simulate;
pub mod state;
pub mod usage;

pub use account::JobClass;
pub use artifact::{BlobRef, ResultBody};
pub use decision::{Expect, Next, next_step};
pub use message::{InvalidMessage, JobMessage, Trigger, parse_body, parse_trigger};
pub use outcome::{Failure, RecordOutcome, VisibilityPolicy};
pub use policy::{OUTPUT_CEILINGS, output_ceiling};
pub use progress::{BatchCounts, BatchMember, CallProgress};
pub use state::JobState;
pub use usage::Usage;

/// Unix time in milliseconds. Every instant in the ledger uses it.
pub type Millis = i64;

/// How many partitions the attention index spreads each state over.
pub(crate) const ATTENTION_SHARDS: u8 = 16;

/// The key of a job in the sparse attention index: its state and a shard from its id
/// (`unknown#07`), or `None` for a job the reconciler has no need to find. Sharding keeps the
/// many jobs of a busy table from landing on one index partition.
///
/// A terminal job leaves the index, and a job running on its first claim (`epoch` 1) never
/// enters it: the message that claimed it stays in the queue until the job is terminal and
/// brings it back if its owner dies, and the next delivery after a lapsed lease recovers it
/// (a raised epoch) or records its attempt unknown, both of which enter the index. The
/// happy path (first claim, then acceptance) therefore writes no index entry. Past its first
/// claim, a job is in it only while `watched` ([`JobItem::watched`]); any other live job's
/// message, which SQS keeps, brings it back, and the due index holds it past its deadline.
pub fn attention_key(state: JobState, epoch: u64, watched: bool, job_id: &str) -> Option<String> {
    use sha2::{Digest, Sha256};
    if state.is_terminal() || (state == JobState::Running && epoch <= 1) || !watched {
        return None;
    }
    let shard = Sha256::digest(job_id.as_bytes())[0] % ATTENTION_SHARDS;
    Some(attention_shard(state, shard))
}

/// The attention-index key of one shard of a state.
pub(crate) fn attention_shard(state: JobState, shard: u8) -> String {
    format!("{}#{shard:02}", state.as_str())
}

/// The day (UTC, `YYYY-MM-DD`) of the instant `at`: a job is filed in the due index under its
/// deadline's day, and the day's spend under the day it is spent.
pub(crate) fn utc_day(at: Millis) -> String {
    let date = time::OffsetDateTime::from_unix_timestamp(at.div_euclid(1000))
        .map_or(time::OffsetDateTime::UNIX_EPOCH.date(), |t| t.date());
    format!(
        "{:04}-{:02}-{:02}",
        date.year(),
        u8::from(date.month()),
        date.day()
    )
}

/// DynamoDB's limit on one item, attribute names and values together.
pub(crate) const MAX_ITEM_BYTES: usize = 400 * 1024;

/// `INLINE_MAX_BYTES` when unset: answers and inputs up to 4 KiB stay in the item, larger ones
/// go to the results bucket. The break-even at list prices: a kept input is billed on every
/// later write of the item (at least two), 2 write units per KB at $0.625 per million, where
/// storing it costs a `PutObject` ($5 per million) and a `GetObject` when read back ($0.40);
/// an answer is billed on the acceptance alone (1 unit per KB), where storing it costs the
/// same put and a get per reader. Inputs break even at 4 KB, answers near 8 KB; one bound
/// keeps the items under 5 KB.
pub const DEFAULT_INLINE_MAX_BYTES: usize = 4 * 1024;

/// The largest `INLINE_MAX_BYTES` may be: an inline answer and an inline input together stay
/// well inside one item.
pub(crate) const INLINE_LIMIT_BYTES: usize = 160 * 1024;

/// Room kept under [`MAX_ITEM_BYTES`] for what the estimate of [`JobItem::item_bytes`] leaves
/// out and for the writes that follow an acceptance.
pub(crate) const ITEM_HEADROOM_BYTES: usize = 8 * 1024;

/// How many given-back attempts an item keeps (the counts keep them all): a throttle storm
/// must not grow the item towards DynamoDB's limit.
pub(crate) const GIVEN_BACK_KEPT: usize = 5;

/// How many recoveries an item lists (the rest are counted): a job asked about again and again
/// must not grow its item towards DynamoDB's limit.
pub(crate) const RECOVERIES_KEPT: usize = 10;

/// One job's ledger item, decoded.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct JobItem {
    /// Partition key: the application's job id.
    pub job_id: String,
    /// Current state.
    pub state: JobState,
    /// Fencing token: raised by every claim and recovery claim.
    pub owner_epoch: u64,
    /// Attempts started so far (cumulative across deliveries).
    pub attempts: u32,
    /// Attempt budget, fixed at creation.
    pub max_attempts: u32,
    /// Spend limit, micro-dollars (`None`: none): no attempt is claimed whose estimated cost
    /// would take the job's spend past it.
    pub max_cost_micros: Option<u64>,
    /// Calls the provider refused for its rate limit before doing any work (HTTP 429,
    /// Bedrock's throttling): each gave its attempt back, so they spend no budget; the job's
    /// deadline bounds them.
    pub throttles: u32,
    /// Claims whose call was never sent (no time was left for it, or the lease lapsed before
    /// it left): each gave its attempt back.
    pub not_sent: u32,
    /// The last [`GIVEN_BACK_KEPT`] attempts given back (throttled or not sent), in order: out
    /// of `attempt_log`, which holds the attempts that count against the budget. `throttles`
    /// and `not_sent` count them all.
    pub given_back: Vec<AttemptEntry>,
    /// Digest of contract + input.
    pub input_digest: String,
    /// Output-contract version.
    pub contract: String,
    /// Canonical JSON of the input; empty when it is stored (`input_ref`), and while the job
    /// runs on its first claim, whose message carries it ([`JobItem::keeps_input`]).
    pub input: String,
    /// Where the input is stored when it is too large for the item.
    pub input_ref: Option<BlobRef>,
    /// Producer's correlation data (canonical JSON).
    pub metadata: Option<String>,
    /// Fixed deadline, set at creation and never moved.
    pub deadline_at: Millis,
    /// Who holds (or last held) the job.
    pub owner_id: Option<String>,
    /// When the current owner's lease ends.
    pub owner_until: Option<Millis>,
    /// One entry per attempt, in order.
    pub attempt_log: Vec<AttemptEntry>,
    /// Recovery claims (fencing of a lapsed owner), in order: the first [`RECOVERIES_KEPT`].
    pub recoveries: Vec<RecoveryRecord>,
    /// Recovery claims after those, counted.
    pub recoveries_dropped: u32,
    /// Recorded decisions about uncertain attempts (replay policy, later operators), in order.
    pub decisions: Vec<DecisionRecord>,
    /// The accepted result (JSON), once succeeded, when it is inline.
    pub result: Option<String>,
    /// Where the accepted result is stored, once succeeded, when it is not inline.
    pub result_ref: Option<BlobRef>,
    /// The last error seen, if any.
    pub last_error: Option<ErrorRecord>,
    /// Creation time.
    pub created_at: Millis,
    /// Last write time.
    pub updated_at: Millis,
    /// DynamoDB TTL attribute, in Unix seconds.
    pub expires_at: i64,
    /// When the producer or the reconciler last sent a trigger for the job.
    pub enqueued_at: Option<Millis>,
    /// Its tenant and priority.
    pub class: JobClass,
    /// When an operator asked to cancel the job while it ran (the decision records who and
    /// why): its owner stops the call and ends the attempt `cancelled`; no other end is
    /// accepted.
    pub cancel_requested: Option<Millis>,
    /// What the owner of `epoch` last said of its running call, for `jobctl watch`.
    pub call_progress: Option<CallProgress>,
    /// The job is in the due index, where the reconciler finds it at its deadline: every job
    /// but a first claim whose message SQS keeps, and its acceptance (`ClaimRequest::list_due`).
    pub due_listed: bool,
    /// The reconciler watches the job in the attention indexes ([`attention_key`]): set by its
    /// creation, a write keeping its input or leaving it `unknown`, an operator's decision.
    pub watched: bool,
}

impl JobItem {
    /// What its attempts used and cost, summed (`None` when none recorded any): `estimated`
    /// when one of them is an estimate, `cost_micros` the sum of the attempts the price table
    /// priced (`None` when it priced none).
    pub fn usage(&self) -> Option<Usage> {
        self.attempt_log
            .iter()
            .filter_map(|a| a.usage)
            .reduce(|sum, u| sum.plus(&u))
    }

    /// Whether the item keeps the job's input (inline or stored). A job created by a claim does
    /// not: a write is billed on the whole item, and the message that claimed it stays in the
    /// queue until the job is terminal, carrying the input to every delivery. A write that
    /// leaves the job live (an end, a recovery, a later claim) keeps it where SQS may drop that
    /// message, so every job the reconciler triggers by id has it; a job submitted to the
    /// ledger keeps it from its creation.
    pub fn keeps_input(&self) -> bool {
        !self.input.is_empty() || self.input_ref.is_some()
    }

    /// The account its tenant is counted under: its producer's and its tenant's names
    /// together ([`account::account`]).
    pub fn account(&self) -> String {
        account::account(&self.job_id, self.class.tenant.as_deref())
    }

    /// An upper estimate of the item's size in DynamoDB: every string at its length, every
    /// number and attribute name at a generous fixed size, and every attempt, recovery and
    /// decision record in full.
    pub(crate) fn item_bytes(&self) -> usize {
        const FIELD: usize = 40; // an attribute name and a number, generously
        let opt = |s: &Option<String>| s.as_ref().map_or(0, String::len);
        let attempts: usize = self
            .attempt_log
            .iter()
            .chain(&self.given_back)
            .map(|a| {
                let errors: usize = a.errors.iter().map(|e| e.len() + FIELD).sum();
                let usage = a.usage.map_or(0, |_| 8 * FIELD);
                let route = a
                    .route
                    .as_ref()
                    .map_or(0, |r| 2 * FIELD + r.provider.len() + r.model.len());
                10 * FIELD
                    + a.owner_id.len()
                    + opt(&a.provider_ref)
                    + route
                    + errors
                    + opt(&a.excerpt)
                    + usage
            })
            .sum();
        let recoveries: usize = self
            .recoveries
            .iter()
            .map(|r| 5 * FIELD + r.owner_id.len() + r.reason.len())
            .sum();
        let decisions: usize = self
            .decisions
            .iter()
            .map(|d| 6 * FIELD + d.action.len() + d.by.len() + d.reason.len())
            .sum();
        let blob = |r: &Option<BlobRef>| {
            r.as_ref()
                .map_or(0, |r| 4 * FIELD + r.bucket.len() + r.key.len())
        };
        let error = self
            .last_error
            .as_ref()
            .map_or(0, |e| 4 * FIELD + e.kind.len() + e.message.len());
        let progress = self.call_progress.map_or(0, |_| 6 * FIELD);
        24 * FIELD
            + progress
            + self.job_id.len()
            + self.input_digest.len()
            + self.contract.len()
            + self.input.len()
            + opt(&self.metadata)
            + opt(&self.owner_id)
            + opt(&self.result)
            + blob(&self.result_ref)
            + blob(&self.input_ref)
            + attempts
            + recoveries
            + decisions
            + error
    }

    /// The provider's reference for the last attempt, if it has one: what a later owner can
    /// ask the provider about.
    pub fn last_provider_ref(&self) -> Option<&str> {
        self.attempt_log.last()?.provider_ref.as_deref()
    }

    /// Whether the item could also hold `result` as its accepted answer.
    pub(crate) fn can_hold_result(&self, result: &str) -> bool {
        self.item_bytes() + result.len() + ITEM_HEADROOM_BYTES <= MAX_ITEM_BYTES
    }
}

/// The evidence kept for one attempt.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AttemptEntry {
    /// 1-based attempt number.
    pub number: u32,
    /// The epoch the attempt was claimed at.
    pub epoch: u64,
    /// Who claimed it.
    pub owner_id: String,
    /// When it was claimed (before the provider call).
    pub started_at: Millis,
    /// The provider's reference for the call, when it gives one.
    pub provider_ref: Option<String>,
    /// How it ended, as far as the ledger knows.
    pub outcome: AttemptOutcome,
    /// When the outcome was recorded.
    pub finished_at: Option<Millis>,
    /// Why the model stopped, when an answer came (accepted or not).
    pub finish: Option<contract::Finish>,
    /// What was wrong with an answer its contract refused (see [`contract::Rejected`]).
    pub errors: Vec<String>,
    /// The first bytes of an answer its contract refused: restricted evidence, never logged.
    pub excerpt: Option<String>,
    /// What the call used, when the provider said (an estimate, marked, for a call whose
    /// outcome is unknown).
    pub usage: Option<Usage>,
    /// Which of the deployment's providers the attempt was sent to, and the model it asked for
    /// there (`None` in items written before providers were named).
    pub route: Option<Route>,
}

/// A provider of the deployment, the model an attempt asks it for, and the path it takes.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Route {
    /// The provider's name (`openai`, `anthropic`, `aws.bedrock`, `simulated`).
    pub provider: String,
    /// The model, in the provider's own name.
    pub model: String,
    /// The path the worker chose for it ([`path`]), and why; `None` where it chose none (the
    /// job's own `deferrable` and `service_tier` decided).
    pub path: Option<(usage::Rate, String)>,
}

impl AttemptEntry {
    /// The attempt a claim records, before its call: pending, nothing heard yet.
    pub(crate) fn claimed(
        number: u32,
        epoch: u64,
        owner_id: &str,
        started_at: Millis,
        provider_ref: Option<String>,
    ) -> AttemptEntry {
        AttemptEntry {
            number,
            epoch,
            owner_id: owner_id.to_owned(),
            started_at,
            provider_ref,
            outcome: AttemptOutcome::Pending,
            finished_at: None,
            finish: None,
            errors: Vec::new(),
            excerpt: None,
            usage: None,
            route: None,
        }
    }

    /// The attempt, sent to `route`.
    pub(crate) fn routed(self, route: Option<Route>) -> AttemptEntry {
        AttemptEntry { route, ..self }
    }
}

/// How an attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AttemptOutcome {
    /// Claimed; no outcome recorded yet.
    Pending,
    /// The answer was accepted.
    Succeeded,
    /// A definite transient failure: the provider did not do the work.
    Transient,
    /// A definite permanent failure.
    Permanent,
    /// The call may have run; its outcome is not known.
    Uncertain,
    /// The job deadline passed while the attempt was open.
    Expired,
    /// Given back: the provider refused the call for its rate limit before any work.
    Throttled,
    /// Given back: the call was never sent.
    NotSent,
    /// The call answered, but not with the answer its job's contract asks for.
    InvalidOutput,
    /// An operator cancelled the job while the attempt ran: its answer, if any, is never
    /// accepted.
    Cancelled,
}

impl AttemptOutcome {
    /// The name stored in the ledger.
    pub fn as_str(self) -> &'static str {
        match self {
            AttemptOutcome::Pending => "pending",
            AttemptOutcome::Succeeded => "succeeded",
            AttemptOutcome::Transient => "transient",
            AttemptOutcome::Permanent => "permanent",
            AttemptOutcome::Uncertain => "uncertain",
            AttemptOutcome::Expired => "expired",
            AttemptOutcome::Throttled => "throttled",
            AttemptOutcome::NotSent => "not_sent",
            AttemptOutcome::InvalidOutput => "invalid_output",
            AttemptOutcome::Cancelled => "cancelled",
        }
    }

    /// Parses a stored name; unknown names read as `Uncertain`, the cautious reading.
    pub fn parse(s: &str) -> AttemptOutcome {
        match s {
            "pending" => AttemptOutcome::Pending,
            "succeeded" => AttemptOutcome::Succeeded,
            "transient" => AttemptOutcome::Transient,
            "permanent" => AttemptOutcome::Permanent,
            "expired" => AttemptOutcome::Expired,
            "throttled" => AttemptOutcome::Throttled,
            "not_sent" => AttemptOutcome::NotSent,
            "invalid_output" => AttemptOutcome::InvalidOutput,
            "cancelled" => AttemptOutcome::Cancelled,
            _ => AttemptOutcome::Uncertain,
        }
    }
}

/// A recovery claim: who fenced a lapsed owner, when and why.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RecoveryRecord {
    /// The epoch the recovery claim raised the job to.
    pub epoch: u64,
    /// The recovering owner.
    pub owner_id: String,
    /// When.
    pub at: Millis,
    /// Why.
    pub reason: String,
}

/// A recorded decision about an uncertain attempt: who allowed what, when and why.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DecisionRecord {
    /// The epoch the decision was written at.
    pub epoch: u64,
    /// What was decided (`replay`).
    pub action: String,
    /// Who decided (`replay-policy`, or an operator, as they named themselves: `--operator`).
    pub by: String,
    /// The principal AWS authenticated for an operator's decision (the ARN
    /// `sts:GetCallerIdentity` gives), beside the name they gave; `None` for the replay policy.
    pub caller: Option<String>,
    /// Why.
    pub reason: String,
    /// When.
    pub at: Millis,
}

/// The last error recorded on a job. Messages are classifications, never provider text with
/// prompt or answer content.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ErrorRecord {
    /// Short machine-readable kind (`transient`, `permanent`, `uncertain`, `deadline`, `budget`).
    pub kind: String,
    /// Human-readable detail.
    pub message: String,
    /// When it was recorded.
    pub at: Millis,
}

/// What a claim creates when the job is not in the ledger yet: the job as its message carries it,
/// with defaults applied by the caller.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct NewJob {
    /// Job id.
    pub job_id: String,
    /// Digest of contract + input.
    pub input_digest: String,
    /// Output-contract version.
    pub contract: String,
    /// Canonical input JSON; empty when it is stored (`input_ref`).
    pub input: String,
    /// Where the input is stored when it is too large for the item.
    pub input_ref: Option<BlobRef>,
    /// Producer's correlation data.
    pub metadata: Option<String>,
    /// Fixed deadline.
    pub deadline_at: Millis,
    /// Attempt budget.
    pub max_attempts: u32,
    /// Spend limit, micro-dollars.
    pub max_cost_micros: Option<u64>,
    /// DynamoDB TTL, Unix seconds.
    pub expires_at: i64,
    /// Its tenant and priority.
    pub class: JobClass,
}

/// What a job gets when its message does not say: a deadline, an attempt budget, and how long
/// its item is kept after the deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JobDefaults {
    /// `DEFAULT_DEADLINE_SECONDS`: deadline, from first sight, of a job whose message sets none.
    pub deadline_ms: Millis,
    /// `DEFAULT_MAX_ATTEMPTS`: attempt budget of a job whose message sets none.
    pub max_attempts: u32,
    /// `RETENTION_DAYS`: how long after its deadline a job item is kept (DynamoDB TTL).
    pub retention_days: i64,
    /// `DEFAULT_MAX_COST` (USD): spend limit, in micro-dollars, of a job whose message sets
    /// none (`None`: no limit).
    pub max_cost_micros: Option<u64>,
}

impl Default for JobDefaults {
    fn default() -> Self {
        JobDefaults {
            deadline_ms: 86_400_000,
            max_attempts: 3,
            retention_days: 30,
            max_cost_micros: None,
        }
    }
}

#[cfg(any(test, feature = "test-support"))]
impl NewJob {
    /// A job for tests: digest `d`, contract `c`, input `{}`, three attempts, kept for ever.
    pub fn example(job_id: &str, deadline_at: Millis) -> NewJob {
        NewJob {
            class: Default::default(),
            job_id: job_id.to_owned(),
            input_digest: "d".into(),
            contract: "c".into(),
            input: "{}".into(),
            input_ref: None,
            metadata: None,
            deadline_at,
            max_attempts: 3,
            max_cost_micros: None,
            expires_at: 0,
        }
    }
}

impl NewJob {
    /// The job a message creates at `now`: the message's deadline and budget, or the defaults,
    /// and a TTL of the deadline plus the retention.
    pub fn from_message(msg: &JobMessage, now: Millis, defaults: &JobDefaults) -> NewJob {
        let deadline_at = msg.deadline_at.unwrap_or(now + defaults.deadline_ms);
        NewJob {
            job_id: msg.job_id.clone(),
            input_digest: msg.digest.clone(),
            contract: msg.contract.clone(),
            input: if msg.input_ref.is_some() {
                String::new()
            } else {
                msg.input_canonical.clone()
            },
            input_ref: msg.input_ref.clone(),
            metadata: msg.metadata.clone(),
            deadline_at,
            max_attempts: msg.max_attempts.unwrap_or(defaults.max_attempts),
            max_cost_micros: msg.max_cost_micros.or(defaults.max_cost_micros),
            expires_at: deadline_at.max(now) / 1000 + defaults.retention_days * 86_400,
            class: msg.class.clone(),
        }
    }

    /// The record a first write of this job creates, in `state`, before any claim.
    pub fn into_record(self, state: JobState, now: Millis) -> JobItem {
        JobItem {
            job_id: self.job_id,
            state,
            owner_epoch: 0,
            attempts: 0,
            max_attempts: self.max_attempts,
            max_cost_micros: self.max_cost_micros,
            input_digest: self.input_digest,
            contract: self.contract,
            input: self.input,
            input_ref: self.input_ref,
            metadata: self.metadata,
            deadline_at: self.deadline_at,
            owner_id: None,
            owner_until: None,
            throttles: 0,
            not_sent: 0,
            given_back: Vec::new(),
            attempt_log: Vec::new(),
            recoveries: Vec::new(),
            recoveries_dropped: 0,
            decisions: Vec::new(),
            result: None,
            result_ref: None,
            last_error: None,
            created_at: now,
            updated_at: now,
            expires_at: self.expires_at,
            enqueued_at: None,
            class: self.class,
            cancel_requested: None,
            call_progress: None,
            due_listed: false,
            watched: false,
        }
    }
}
