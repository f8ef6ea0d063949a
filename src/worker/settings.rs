//! The worker's settings: processing, heartbeat, time margins, replay and the visibility of
//! failed records, each read from its variable (see `docs/configuration.md`).

use super::pacing::PacingSettings;
use crate::job::account::Labels;
use crate::job::policy::Policy;
use crate::job::scope::Producers;
use crate::job::{InvalidMessage, JobDefaults, Millis, VisibilityPolicy};
use crate::ledger::schedule::Limits;
use crate::protocol::ReplayPolicy;
use crate::vars::{ConfigError, Vars};
pub use batching::Batching;
use batching::batching_from;
use who::{labels_from, policy_from, producers_from};

/// The memory kept for everything but Extended Client payloads: the runtime, the SDK clients
/// and their buffers, the rest of the batch (a 128 MB function holds the worker in about 20 MiB
/// at rest).
mod batching;
mod who;

const PAYLOAD_MEMORY_RESERVE_MB: i64 = 48;

/// Settings of the processor and the batch handler.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// `MAX_CONCURRENCY`: records processed at once in one invocation.
    pub max_concurrency: usize,
    /// `LEASE_SECONDS`: the ledger lease a claim grants and each renewal extends.
    pub lease_ms: Millis,
    /// `QUEUE_VISIBILITY_TIMEOUT_SECONDS`: the queue's visibility timeout; each heartbeat
    /// extends a record's visibility to this much from now.
    pub queue_visibility_s: i64,
    /// `MAXIMUM_BATCHING_WINDOW_SECONDS`: the event source mapping's batching window. A record
    /// was received at most this long before its invocation began, which dates the 12 hours
    /// SQS allows one receive's visibility.
    pub batching_window_ms: Millis,
    /// `HEARTBEAT_SECONDS`: interval of the heartbeat that extends visibility and renews leases;
    /// default a third of the shorter of the queue's visibility timeout and the lease; 0 turns
    /// it off (then the lease must outlast the longest call).
    pub heartbeat_ms: Millis,
    /// `CLOCK_SKEW_MS`: margin added to every lease before another receiver treats it as lapsed.
    pub skew_ms: Millis,
    /// `PROVIDER_TIMEOUT_SECONDS`: longest model call; a call cut off is recorded as uncertain.
    pub provider_timeout_ms: Millis,
    /// `PROGRESS_TIMEOUT_SECONDS`: the longest a streamed call may show no bytes before it is
    /// taken for hung (cancelled, its attempt uncertain) and its lease is no longer renewed.
    pub progress_timeout_ms: Millis,
    /// `POLL_INTERVAL_MS`: pause between two retrievals of a provider call that is still running.
    pub poll_ms: Millis,
    /// `DEADLINE_MARGIN_MS`: time kept before the Lambda deadline for the final writes, the
    /// visibility changes and the response.
    pub deadline_margin_ms: Millis,
    /// `MIN_CALL_SECONDS`: no claim for a provider that cannot be asked about a call afterwards
    /// unless this much time is left before the margin (a call cut off would be uncertain).
    pub min_call_ms: Millis,
    /// `MIN_BACKGROUND_CALL_SECONDS`: the same for a provider that can be asked afterwards (the
    /// call is submitted, its reference recorded, and the job handed over if it runs long).
    pub min_background_call_ms: Millis,
    /// `INLINE_MAX_BYTES`: the largest answer or input kept inline in the ledger item; a larger
    /// one is stored in `RESULTS_BUCKET` (when set) and the item keeps its reference.
    pub inline_max_bytes: usize,
    /// `RESULTS_RETENTION_DAYS`: how long the results bucket keeps a stored answer or input
    /// (its lifecycle rule); 0 when it keeps them for ever. A job whose deadline and the item's
    /// retention after it reach past it is refused at its first sight.
    pub results_retention_days: i64,
    /// What a job gets when its message does not say (`DEFAULT_DEADLINE_SECONDS`,
    /// `DEFAULT_MAX_ATTEMPTS`, `RETENTION_DAYS`).
    pub job_defaults: JobDefaults,
    /// `REPLAY_POLICY`: `never` (default) or `replay`.
    pub replay: ReplayPolicy,
    /// Visibility of failed records (`BACKOFF_BASE_SECONDS`, `BACKOFF_CAP_SECONDS`,
    /// `DEFER_JITTER_SECONDS`, `AWAITING_DECISION_SECONDS`, `PACED_SPREAD_SECONDS`,
    /// `MAX_RECEIVE_COUNT`).
    pub visibility: VisibilityPolicy,
    /// `PAYLOAD_MEMORY_BYTES`: the memory Extended Client payloads of one batch may take while
    /// they are read and their records processed; by default the function's
    /// (`AWS_LAMBDA_FUNCTION_MEMORY_SIZE`, which Lambda sets) less 48 MiB for the runtime, the
    /// clients and the rest of the batch, 512 MiB without it.
    pub payload_memory_bytes: usize,
    /// The provider's limits and how calls are paced against them (`PROVIDER_RPM`,
    /// `PROVIDER_TPM`, `PROVIDER_LIMIT_KEY`, `PACING_CHUNK`, `PACING_HORIZON_SECONDS`,
    /// `MAX_CALLS_IN_FLIGHT`).
    pub pacing: PacingSettings,
    /// What producers may ask for (`ALLOWED_MODELS`, `ALLOWED_PARAMETERS`,
    /// `MAX_ATTEMPTS_LIMIT`, `MAX_DEADLINE_SECONDS`).
    pub policy: Policy,
    /// Who may send jobs, and each producer's namespace (`PRODUCERS`, `TRUSTED_SENDERS`).
    pub producers: Producers,
    /// What each producer may label its jobs with (`PRODUCER_TENANTS`, `URGENT_PRODUCERS`).
    pub labels: Labels,
    /// `PAYLOAD_BUCKET`: the one bucket an Extended Client pointer may name (unset: pointers
    /// are refused).
    pub payload_bucket: Option<String>,
    /// `DAILY_SPEND_LIMIT` (USD): what the deployment's calls may cost in a day (UTC), in
    /// micro-dollars (`None`: no limit).
    pub daily_spend_limit_micros: Option<u64>,
    /// `TENANT_DAILY_SPEND_LIMIT` (USD): what one tenant's calls may cost in a day (UTC),
    /// within the deployment's, in micro-dollars (`None`: no limit per tenant).
    pub tenant_daily_spend_limit_micros: Option<u64>,
    /// `PRODUCER_DAILY_SPEND_LIMIT` (USD): what one producer's calls may cost in a day (UTC),
    /// within the deployment's, in micro-dollars (`None`: no limit per producer).
    pub producer_daily_spend_limit_micros: Option<u64>,
    /// `URGENT_PACING_PERCENT`: the share of `PROVIDER_RPM` and `PROVIDER_TPM` kept for urgent
    /// jobs (their own schedule item); normal jobs pace within the rest. 0: none kept.
    pub urgent_pacing_percent: u8,
    /// `TENANT_PACING_PERCENT`: the most of normal jobs' paced capacity one tenant's calls may
    /// take (a schedule item per tenant); 100: no cap.
    pub tenant_pacing_percent: u8,
    /// `PRODUCER_PACING_PERCENT`: the most of normal jobs' paced capacity one producer's calls
    /// may take, whatever their tenants (a schedule item per producer); 100: no cap.
    pub producer_pacing_percent: u8,
    /// The prices each attempt's usage is paid at: the built-in table, with `PRICES_FILE`'s
    /// models over it.
    pub prices: std::sync::Arc<crate::job::prices::PriceTable>,
    /// `ALLOW_UNPRICED_MODELS` (`false`, the default): a call of a model the price table lacks
    /// is made under a spend limit (costed at 0) instead of refused.
    pub allow_unpriced_models: bool,
    /// How deferrable jobs go through the providers' batch interfaces (`DEFERRABLE`,
    /// `BATCH_GATHER_SECONDS`, `BATCH_MAX_LINES`, `BATCH_POLL_SECONDS`).
    pub batching: Batching,
    /// What sets this deployment's idempotency keys apart from every other's sent to the same
    /// provider account: 16 hex characters of SHA-256 over `DEPLOYMENT_ID` (the template sets
    /// the account, Region and stack), else over `JOBS_TABLE`; empty in tests.
    pub idempotency_prefix: String,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            max_concurrency: 16,
            lease_ms: 60_000,
            queue_visibility_s: 30,
            batching_window_ms: 0,
            heartbeat_ms: 10_000,
            skew_ms: 2_000,
            provider_timeout_ms: 240_000,
            progress_timeout_ms: 300_000,
            poll_ms: 1_000,
            deadline_margin_ms: 5_000,
            min_call_ms: 20_000,
            min_background_call_ms: 1_000,
            inline_max_bytes: crate::job::DEFAULT_INLINE_MAX_BYTES,
            results_retention_days: 0,
            job_defaults: JobDefaults::default(),
            replay: ReplayPolicy::Never,
            visibility: VisibilityPolicy::default(),
            pacing: PacingSettings::default(),
            payload_memory_bytes: 512 * 1_048_576,
            policy: Policy::default(),
            producers: Producers::default(),
            labels: Labels::default(),
            payload_bucket: None,
            prices: std::sync::Arc::default(),
            allow_unpriced_models: false,
            daily_spend_limit_micros: None,
            tenant_daily_spend_limit_micros: None,
            producer_daily_spend_limit_micros: None,
            urgent_pacing_percent: 0,
            tenant_pacing_percent: 100,
            producer_pacing_percent: 100,
            batching: Batching::default(),
            idempotency_prefix: String::new(),
        }
    }
}

/// An amount of USD (`DEFAULT_MAX_COST`, `DAILY_SPEND_LIMIT`), in micro-dollars (unset: none).
fn usd(vars: &Vars<'_>, name: &'static str) -> Result<Option<u64>, ConfigError> {
    let Some(text) = vars.get(name).filter(|t| !t.trim().is_empty()) else {
        return Ok(None);
    };
    match text
        .trim()
        .parse::<f64>()
        .ok()
        .and_then(crate::job::prices::limit_micros)
    {
        Some(micros) => Ok(Some(micros)),
        None => Err(ConfigError::Invalid {
            name,
            reason: "a number of USD above 0, at most 1000000".to_owned(),
        }),
    }
}

/// The price table: the built-in one, with the models of the file `PRICES_FILE` names over it.
fn prices(vars: &Vars<'_>) -> Result<crate::job::prices::PriceTable, ConfigError> {
    use crate::job::prices::PriceTable;
    let Some(path) = vars.get("PRICES_FILE").filter(|p| !p.trim().is_empty()) else {
        return Ok(PriceTable::built_in());
    };
    let invalid = |reason: String| ConfigError::Invalid {
        name: "PRICES_FILE",
        reason,
    };
    let text = std::fs::read_to_string(&path).map_err(|e| invalid(format!("{path:?}: {e}")))?;
    let own = PriceTable::parse(&text).map_err(|e| invalid(format!("{path:?}: {e}")))?;
    Ok(PriceTable::built_in().with(own))
}

impl Settings {
    /// The pacing settings with their ceiling of calls in flight resolved (`MAX_CALLS_IN_FLIGHT`,
    /// or `MAX_CONCURRENCY` when it is unset).
    /// Normal jobs' limits are what `URGENT_PACING_PERCENT` leaves of the provider's.
    pub fn pacing(&self) -> PacingSettings {
        let mut pacing = self.pacing.clone();
        if pacing.max_in_flight == 0 {
            pacing.max_in_flight = u32::try_from(self.max_concurrency).unwrap_or(u32::MAX);
        }
        if self.urgent_pacing().is_some() {
            pacing.limits = pacing
                .limits
                .share(100 - u64::from(self.urgent_pacing_percent));
        }
        pacing
    }

    /// The pacing of `tenant`'s normal jobs, beside the provider's: at most
    /// `TENANT_PACING_PERCENT` of normal jobs' limits, on a schedule item of the tenant's own
    /// (`<key>#tenant#<tenant>`), when that is under 100 and limits are set. Its ceiling of
    /// calls in flight is the provider pacer's business.
    pub(crate) fn tenant_pacing(&self, tenant: &str) -> Option<PacingSettings> {
        self.share_pacing(self.tenant_pacing_percent, &format!("tenant#{tenant}"))
    }

    /// `PRODUCER_PACING_PERCENT` of normal jobs' limits, on a schedule item of the producer's
    /// own (`<PROVIDER_LIMIT_KEY>#producer#<name>`, the unnamed producer's name empty), when
    /// below 100 and limits are set.
    pub(crate) fn producer_pacing(&self, producer: &str) -> Option<PacingSettings> {
        self.share_pacing(
            self.producer_pacing_percent,
            &format!("producer#{producer}"),
        )
    }

    /// `percent` of normal jobs' limits on the schedule item `<PROVIDER_LIMIT_KEY>#<key>`.
    fn share_pacing(&self, percent: u8, key: &str) -> Option<PacingSettings> {
        let percent = u64::from(percent);
        let mut pacing = self.pacing();
        (percent < 100 && pacing.limits.any()).then(|| {
            pacing.limits = pacing.limits.share(percent);
            pacing.key = format!("{}#{key}", pacing.key);
            pacing.max_in_flight = 10_000;
            pacing
        })
    }

    /// The urgent jobs' pacing: `URGENT_PACING_PERCENT` of the provider's limits, on a
    /// schedule item of its own, when both are set.
    pub fn urgent_pacing(&self) -> Option<PacingSettings> {
        let percent = u64::from(self.urgent_pacing_percent);
        (percent > 0 && self.pacing.limits.any()).then(|| {
            let mut pacing = self.pacing.clone();
            if pacing.max_in_flight == 0 {
                pacing.max_in_flight = u32::try_from(self.max_concurrency).unwrap_or(u32::MAX);
            }
            pacing.limits = pacing.limits.share(percent);
            pacing.key = format!("{}#urgent", pacing.key);
            pacing
        })
    }

    /// The longest deadline, from a job's first sight, whose stored input and answer the
    /// results bucket keeps for as long as the item may reference them (the bucket's retention
    /// less the item's after the deadline); `None` when the bucket keeps them for ever.
    pub(crate) fn stored_room_ms(&self) -> Option<Millis> {
        (self.results_retention_days > 0).then(|| {
            (self.results_retention_days - self.job_defaults.retention_days).max(0) * 86_400_000
        })
    }

    /// Why a job first seen at `now` is refused for its `deadline_at`, if it is: further away
    /// than the results bucket keeps what is stored for it (`RESULTS_RETENTION_DAYS` less
    /// `RETENTION_DAYS`, when the worker `stores` answers there: its input or answer would be
    /// deleted while its item references them), or than `MAX_RECEIVE_COUNT` receives carry
    /// ([`VisibilityPolicy::reach_ms`]: the redrive policy could dead-letter its message while
    /// it lives).
    pub fn deadline_refused(
        &self,
        deadline_at: Millis,
        now: Millis,
        stores: bool,
    ) -> Option<InvalidMessage> {
        let away = deadline_at.saturating_sub(now);
        if stores && away > self.stored_room_ms().unwrap_or(Millis::MAX) {
            return Some(InvalidMessage::Invalid {
                field: "deadline_at",
                rule: "further away than the results bucket keeps a stored answer (RESULTS_RETENTION_DAYS less RETENTION_DAYS)",
            });
        }
        let reach = self.visibility.reach_ms(self.batching_window_ms);
        (away > reach.unwrap_or(Millis::MAX)).then_some(InvalidMessage::Invalid {
            field: "deadline_at",
            rule: "further away than MAX_RECEIVE_COUNT receives carry a job before the redrive policy dead-letters it",
        })
    }

    /// The idempotency key of the call of `attempt` of `job_id` under `epoch`: the same for a
    /// re-send of that call, different for every other call, and, with its prefix, for every
    /// other deployment's calls to the same provider account.
    pub fn idempotency_key(&self, job_id: &str, attempt: u32, epoch: u64) -> String {
        if self.idempotency_prefix.is_empty() {
            format!("{job_id}/{attempt}@{epoch}")
        } else {
            format!("{}:{job_id}/{attempt}@{epoch}", self.idempotency_prefix)
        }
    }

    /// Reads the settings, each from its variable, the default where it is unset, and checks
    /// the relations between them.
    pub(crate) fn from_vars(vars: &Vars<'_>) -> Result<Settings, ConfigError> {
        let d = Settings::default();
        let number = |name, default, min, max| vars.integer(name, default, min, max);
        let queue_visibility_s = number(
            "QUEUE_VISIBILITY_TIMEOUT_SECONDS",
            d.queue_visibility_s,
            1,
            43_200,
        )?;
        let lease_ms = vars.seconds("LEASE_SECONDS", d.lease_ms, 1, 43_200)?;
        let default_heartbeat_s = queue_visibility_s.min(lease_ms / 1000) / 3;
        let rules = producer_rules(vars)?;
        let settings = Settings {
            max_concurrency: number("MAX_CONCURRENCY", d.max_concurrency as i64, 1, 10_000)?
                as usize,
            lease_ms,
            queue_visibility_s,
            batching_window_ms: vars.seconds("MAXIMUM_BATCHING_WINDOW_SECONDS", 0, 0, 300)?,
            heartbeat_ms: vars.seconds(
                "HEARTBEAT_SECONDS",
                default_heartbeat_s.max(1) * 1000,
                0,
                43_200,
            )?,
            skew_ms: number("CLOCK_SKEW_MS", d.skew_ms, 0, 60_000)?,
            provider_timeout_ms: vars.seconds(
                "PROVIDER_TIMEOUT_SECONDS",
                d.provider_timeout_ms,
                1,
                43_200,
            )?,
            progress_timeout_ms: vars.seconds(
                "PROGRESS_TIMEOUT_SECONDS",
                d.progress_timeout_ms,
                1,
                43_200,
            )?,
            poll_ms: number("POLL_INTERVAL_MS", d.poll_ms, 10, 600_000)?,
            deadline_margin_ms: number("DEADLINE_MARGIN_MS", d.deadline_margin_ms, 0, 600_000)?,
            min_call_ms: vars.seconds("MIN_CALL_SECONDS", d.min_call_ms, 0, 900)?,
            min_background_call_ms: vars.seconds(
                "MIN_BACKGROUND_CALL_SECONDS",
                d.min_background_call_ms,
                0,
                900,
            )?,
            inline_max_bytes: number(
                "INLINE_MAX_BYTES",
                d.inline_max_bytes as i64,
                0,
                crate::job::INLINE_LIMIT_BYTES as i64,
            )? as usize,
            results_retention_days: number("RESULTS_RETENTION_DAYS", 0, 0, 36_500)?,
            job_defaults: job_defaults_from(vars, &d.job_defaults)?,
            replay: vars.choice("REPLAY_POLICY", ReplayPolicy::Never, REPLAY_POLICIES)?,
            visibility: visibility_from(vars, &d.visibility)?,
            batching: batching_from(vars)?,
            payload_memory_bytes: payload_memory_bytes(vars)?,
            pacing: pacing_from(vars, &d.pacing)?,
            policy: rules.policy,
            labels: rules.labels,
            producers: rules.producers,
            payload_bucket: vars.get("PAYLOAD_BUCKET").filter(|b| !b.trim().is_empty()),
            prices: std::sync::Arc::new(prices(vars)?),
            allow_unpriced_models: vars.choice(
                "ALLOW_UNPRICED_MODELS",
                false,
                &[("false", false), ("true", true)],
            )?,
            daily_spend_limit_micros: usd(vars, "DAILY_SPEND_LIMIT")?,
            tenant_daily_spend_limit_micros: usd(vars, "TENANT_DAILY_SPEND_LIMIT")?,
            producer_daily_spend_limit_micros: usd(vars, "PRODUCER_DAILY_SPEND_LIMIT")?,
            urgent_pacing_percent: number("URGENT_PACING_PERCENT", 0, 0, 90)? as u8,
            tenant_pacing_percent: number("TENANT_PACING_PERCENT", 100, 1, 100)? as u8,
            producer_pacing_percent: number("PRODUCER_PACING_PERCENT", 100, 1, 100)? as u8,
            idempotency_prefix: vars.deployment_scope(),
        };
        settings.validate()?;
        Ok(settings)
    }

    /// Checks the relations between settings.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.job_defaults.max_attempts > self.policy.max_attempts {
            return Err(ConfigError::Invalid {
                name: "DEFAULT_MAX_ATTEMPTS",
                reason: "must not be more than MAX_ATTEMPTS_LIMIT".to_owned(),
            });
        }
        if self.job_defaults.deadline_ms > self.policy.max_deadline_ms {
            return Err(ConfigError::Invalid {
                name: "DEFAULT_DEADLINE_SECONDS",
                reason: "must not be more than MAX_DEADLINE_SECONDS".to_owned(),
            });
        }
        if self.results_retention_days > 0
            && self.policy.max_deadline_ms > self.stored_room_ms().unwrap_or(Millis::MAX)
        {
            return Err(ConfigError::Invalid {
                name: "RESULTS_RETENTION_DAYS",
                reason: format!(
                    "must cover the longest deadline (MAX_DEADLINE_SECONDS) and the item's {} days after it (RETENTION_DAYS): a stored answer would be deleted while its item references it",
                    self.job_defaults.retention_days
                ),
            });
        }
        if let Some(reach) = self.visibility.reach_ms(self.batching_window_ms)
            && self.job_defaults.deadline_ms > reach
        {
            return Err(ConfigError::Invalid {
                name: "MAX_RECEIVE_COUNT",
                reason: format!(
                    "must carry the default deadline (DEFAULT_DEADLINE_SECONDS): {} receives keep a job from the redrive policy for {} s",
                    self.visibility.max_receive_count,
                    reach / 1000
                ),
            });
        }
        if self.heartbeat_ms > 0 {
            // One missed renewal must not lose the lease.
            if 2 * self.heartbeat_ms + self.skew_ms >= self.lease_ms {
                return Err(ConfigError::Invalid {
                    name: "HEARTBEAT_SECONDS",
                    reason: "must be less than half of LEASE_SECONDS minus CLOCK_SKEW_MS"
                        .to_owned(),
                });
            }
            if self.heartbeat_ms >= self.queue_visibility_s * 1000 {
                return Err(ConfigError::Invalid {
                    name: "HEARTBEAT_SECONDS",
                    reason: "must be shorter than QUEUE_VISIBILITY_TIMEOUT_SECONDS".to_owned(),
                });
            }
        } else if self.provider_timeout_ms + self.skew_ms >= self.lease_ms {
            // Without renewal the lease must outlast the longest call.
            return Err(ConfigError::Invalid {
                name: "PROVIDER_TIMEOUT_SECONDS",
                reason: "must be shorter than LEASE_SECONDS minus CLOCK_SKEW_MS when HEARTBEAT_SECONDS is 0"
                    .to_owned(),
            });
        }
        Ok(())
    }
}

/// `REPLAY_POLICY`'s values.
const REPLAY_POLICIES: &[(&str, ReplayPolicy)] = &[
    ("never", ReplayPolicy::Never),
    ("replay", ReplayPolicy::Replay),
];

/// The memory set aside for Extended Client payloads: `PAYLOAD_MEMORY_BYTES`, by default the
/// function's memory less what the rest of the worker holds.
fn payload_memory_bytes(vars: &Vars<'_>) -> Result<usize, ConfigError> {
    let function_mb = vars.integer("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", 560, 128, 10_240)?;
    Ok(vars.integer(
        "PAYLOAD_MEMORY_BYTES",
        (function_mb - PAYLOAD_MEMORY_RESERVE_MB) * 1_048_576,
        1_048_576,
        10_240 * 1_048_576,
    )? as usize)
}

/// A job's defaults where its message says nothing: `DEFAULT_MAX_ATTEMPTS`,
/// `DEFAULT_DEADLINE_SECONDS`, `RETENTION_DAYS`, `DEFAULT_MAX_COST`.
fn job_defaults_from(vars: &Vars<'_>, j: &JobDefaults) -> Result<JobDefaults, ConfigError> {
    Ok(JobDefaults {
        max_attempts: vars.integer("DEFAULT_MAX_ATTEMPTS", i64::from(j.max_attempts), 1, 100)?
            as u32,
        deadline_ms: vars.seconds("DEFAULT_DEADLINE_SECONDS", j.deadline_ms, 1, 31_536_000)?,
        retention_days: vars.integer("RETENTION_DAYS", j.retention_days, 1, 3_650)?,
        max_cost_micros: usd(vars, "DEFAULT_MAX_COST")?,
    })
}

/// The visibility each failure gets: the back-off, the jitter of a deferral, the waits.
fn visibility_from(vars: &Vars<'_>, v: &VisibilityPolicy) -> Result<VisibilityPolicy, ConfigError> {
    let number = |name, default, min, max| vars.integer(name, default, min, max);
    Ok(VisibilityPolicy {
        backoff_base_s: number("BACKOFF_BASE_SECONDS", v.backoff_base_s, 0, 43_200)?,
        backoff_cap_s: number("BACKOFF_CAP_SECONDS", v.backoff_cap_s, 0, 43_200)?,
        defer_jitter_s: number("DEFER_JITTER_SECONDS", v.defer_jitter_s, 0, 3_600)?,
        awaiting_decision_s: number(
            "AWAITING_DECISION_SECONDS",
            v.awaiting_decision_s,
            0,
            43_200,
        )?,
        paced_spread_s: number("PACED_SPREAD_SECONDS", v.paced_spread_s, 0, 3_600)?,
        max_receive_count: number(
            "MAX_RECEIVE_COUNT",
            i64::from(v.max_receive_count),
            0,
            1_000,
        )? as u32,
        retention_s: number("MESSAGE_RETENTION_SECONDS", v.retention_s, 60, 1_209_600)?,
    })
}

/// The provider's limits and how calls share them.
fn pacing_from(vars: &Vars<'_>, p: &PacingSettings) -> Result<PacingSettings, ConfigError> {
    let number = |name, default, min, max| vars.integer(name, default, min, max);
    Ok(PacingSettings {
        limits: Limits {
            rpm: number("PROVIDER_RPM", 0, 0, 100_000_000)? as u64,
            tpm: number("PROVIDER_TPM", 0, 0, 100_000_000_000)? as u64,
        },
        key: vars
            .get("PROVIDER_LIMIT_KEY")
            .filter(|k| !k.is_empty())
            .unwrap_or_else(|| p.key.clone()),
        chunk: number("PACING_CHUNK", p.chunk as i64, 1, 1_000)? as u64,
        horizon_ms: vars.seconds("PACING_HORIZON_SECONDS", p.horizon_ms, 1, 900)?,
        max_in_flight: number("MAX_CALLS_IN_FLIGHT", i64::from(p.max_in_flight), 0, 10_000)? as u32,
    })
}

/// The rules a producer's job is held to at its first sight, from the worker's own variables
/// (`PRODUCERS`, `TRUSTED_SENDERS`, `PRODUCER_TENANTS`, `URGENT_PRODUCERS`, `ALLOWED_MODELS`,
/// `ALLOWED_PARAMETERS`, `MAX_ATTEMPTS_LIMIT`, `MAX_DEADLINE_SECONDS`).
pub(crate) fn producer_rules(
    vars: &Vars<'_>,
) -> Result<crate::job::account::ProducerRules, ConfigError> {
    let producers = producers_from(vars)?;
    Ok(crate::job::account::ProducerRules {
        labels: labels_from(vars, &producers)?,
        producers,
        policy: policy_from(vars, &Settings::default().policy)?,
    })
}
