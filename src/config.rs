//! Configuration, read once from the environment: each part reads its own settings (the worker's
//! [`Settings`], the provider's [`ProviderConfig`], the reconciler's [`ReconcileSettings`]); this
//! module only assembles them for each binary.

use std::env;
use std::time::Duration;

use crate::events::aws::AwsSink;
use crate::job::Millis;
use crate::job::contract::Contracts;
use crate::ops::reconcile::ReconcileSettings;
use crate::protocol::routing::ModelMap;
use crate::provider::ProviderConfig;
pub use crate::vars::ConfigError;
use crate::vars::Vars;
use crate::worker::settings::Settings;

/// Everything the worker reads from its environment. See `docs/configuration.md`.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// `JOBS_TABLE`: the ledger table (required).
    pub jobs_table: String,
    /// `PROVIDER`: which model provider runs the calls, and how to reach it (the first of the
    /// list).
    pub provider: ProviderConfig,
    /// The first provider's model for each job model name (`<PROVIDER>_MODELS`).
    pub models: ModelMap,
    /// The providers after the first, in order, each with its models: the next takes a job
    /// after a definite refusal of the one before.
    pub fallbacks: Vec<(ProviderConfig, ModelMap)>,
    /// Processing settings.
    pub settings: Settings,
    /// Bounds on every DynamoDB and SQS call.
    pub sdk: SdkTimeouts,
    /// `RESULTS_BUCKET`: where answers and inputs above `INLINE_MAX_BYTES` are stored (unset:
    /// every answer inline, and one the item cannot hold ends `failed_terminal`).
    pub results_bucket: Option<String>,
    /// `DLQ_URL`: the work queue's dead-letter queue, where the worker sends poison and
    /// conflicts at once with their reason (unset: they wait for the redrive policy).
    pub dlq_url: Option<String>,
    /// Where the output contracts come from.
    pub contracts: ContractSource,
}

/// Where the worker's output contracts come from: those built in from `contracts/`, and a
/// folder read at start-up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContractSource {
    /// `CONTRACTS_DIR`: a folder of `<id>.json` contract files read at start-up, over the
    /// built-in ones (a Lambda layer's `/opt/contracts`, say).
    pub dir: Option<String>,
    /// `CONTRACTS_STRICT`: `true` (the default) refuses a new job naming a contract the
    /// registry does not hold (poison); `false` holds it to free text, and says so for each.
    pub strict: bool,
}

impl Default for ContractSource {
    fn default() -> Self {
        ContractSource {
            dir: None,
            strict: true,
        }
    }
}

impl ContractSource {
    fn from_vars(vars: &Vars<'_>) -> Result<ContractSource, ConfigError> {
        Ok(ContractSource {
            dir: vars.get("CONTRACTS_DIR"),
            strict: vars.choice(
                "CONTRACTS_STRICT",
                true,
                &[("true", true), ("false", false)],
            )?,
        })
    }

    /// Reads and compiles the registry: a folder that cannot be read, a contract that does
    /// not compile, or a strict registry with no contract stops start-up with the reason.
    pub fn load(&self) -> Result<Contracts, ConfigError> {
        let invalid = |reason: String| ConfigError::Invalid {
            name: "CONTRACTS_DIR",
            reason,
        };
        let mut files = Vec::new();
        if let Some(dir) = &self.dir {
            let entries = std::fs::read_dir(dir).map_err(|e| invalid(format!("{dir:?}: {e}")))?;
            for entry in entries {
                let path = entry.map_err(|e| invalid(format!("{dir:?}: {e}")))?.path();
                let (Some(id), Some("json")) = (
                    path.file_stem().and_then(|s| s.to_str()),
                    path.extension().and_then(|s| s.to_str()),
                ) else {
                    continue;
                };
                let text = std::fs::read_to_string(&path)
                    .map_err(|e| invalid(format!("{}: {e}", path.display())))?;
                files.push((id.to_owned(), text));
            }
        }
        let contracts =
            Contracts::with_built_in(&files, self.strict).map_err(|e| invalid(e.to_string()))?;
        if self.strict && contracts.is_empty() {
            return Err(ConfigError::Invalid {
                name: "CONTRACTS_STRICT",
                reason: "a strict registry with no contract would refuse every job".to_owned(),
            });
        }
        Ok(contracts)
    }
}

/// Bounds on each DynamoDB and SQS call, which the SDK leaves unbounded by default: a stalled
/// call must never hold a batch past its deadline. Not applied to the model provider, whose
/// calls are bounded by `PROVIDER_TIMEOUT_SECONDS` and the invocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SdkTimeouts {
    /// `AWS_CONNECT_TIMEOUT_MS`: establishing a connection.
    pub connect_ms: Millis,
    /// `AWS_ATTEMPT_TIMEOUT_MS`: one attempt of a request.
    pub attempt_ms: Millis,
    /// `AWS_OPERATION_TIMEOUT_MS`: a request with all its retries.
    pub operation_ms: Millis,
}

impl Default for SdkTimeouts {
    fn default() -> Self {
        SdkTimeouts {
            connect_ms: 1_000,
            attempt_ms: 2_000,
            operation_ms: 5_000,
        }
    }
}

impl SdkTimeouts {
    /// Reads `AWS_CONNECT_TIMEOUT_MS`, `AWS_ATTEMPT_TIMEOUT_MS` and `AWS_OPERATION_TIMEOUT_MS`.
    pub fn from_lookup(
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<SdkTimeouts, ConfigError> {
        let vars = Vars::new(&lookup);
        let d = SdkTimeouts::default();
        let t = SdkTimeouts {
            connect_ms: vars.integer("AWS_CONNECT_TIMEOUT_MS", d.connect_ms, 10, 60_000)?,
            attempt_ms: vars.integer("AWS_ATTEMPT_TIMEOUT_MS", d.attempt_ms, 10, 300_000)?,
            operation_ms: vars.integer("AWS_OPERATION_TIMEOUT_MS", d.operation_ms, 10, 900_000)?,
        };
        if t.attempt_ms > t.operation_ms {
            return Err(ConfigError::Invalid {
                name: "AWS_ATTEMPT_TIMEOUT_MS",
                reason: "must not be longer than AWS_OPERATION_TIMEOUT_MS".to_owned(),
            });
        }
        Ok(t)
    }

    /// `aws` with these bounds, for the DynamoDB and SQS clients.
    pub fn apply(&self, aws: &aws_config::SdkConfig) -> aws_config::SdkConfig {
        let ms = |v: Millis| Duration::from_millis(u64::try_from(v).unwrap_or(0));
        aws.to_builder()
            .timeout_config(
                aws_config::timeout::TimeoutConfig::builder()
                    .connect_timeout(ms(self.connect_ms))
                    .operation_attempt_timeout(ms(self.attempt_ms))
                    .operation_timeout(ms(self.operation_ms))
                    .build(),
            )
            .build()
    }
}

/// The rules `jobctl submit` holds each job to, read through `lookup` from the worker's own
/// variables, so that a job the worker would refuse never reaches the ledger or the queue.
pub fn producer_rules(
    lookup: impl Fn(&str) -> Option<String>,
) -> Result<crate::job::account::ProducerRules, ConfigError> {
    crate::worker::settings::producer_rules(&Vars::new(&lookup))
}

impl Config {
    /// Reads the process environment.
    pub fn from_env() -> Result<Config, ConfigError> {
        Config::from_lookup(|name| env::var(name).ok())
    }

    /// Reads configuration through `lookup` (the environment, or a map in tests).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
        let vars = Vars::new(&lookup);
        let jobs_table = vars.required("JOBS_TABLE")?;
        let settings = Settings::from_vars(&vars)?;
        let mut providers = ProviderConfig::list_from_vars(&vars)?.into_iter();
        let (provider, models) = providers
            .next()
            .unwrap_or((ProviderConfig::Simulated, ModelMap::default()));
        let fallbacks: Vec<_> = providers.collect();
        let names_model = provider.names_model() || fallbacks.iter().any(|(p, _)| p.names_model());
        if names_model && vars.get("ALLOWED_MODELS").is_none() {
            // A real provider bills each job by the model it names: the deployment says which.
            return Err(ConfigError::Invalid {
                name: "ALLOWED_MODELS",
                reason: "must name the models jobs may use (`*` for any) with a provider that calls the model a job names".to_owned(),
            });
        }
        let sdk = SdkTimeouts::from_lookup(&lookup)?;
        Ok(Config {
            jobs_table,
            provider,
            models,
            fallbacks,
            settings,
            sdk,
            results_bucket: vars.get("RESULTS_BUCKET"),
            dlq_url: vars.get("DLQ_URL"),
            contracts: ContractSource::from_vars(&vars)?,
        })
    }
}

/// An S3 client on `aws`: path-style addressing when an endpoint is set (a local emulator has no
/// bucket host names).
pub fn s3_client(aws: &aws_config::SdkConfig) -> aws_sdk_s3::Client {
    let config = aws_sdk_s3::config::Builder::from(aws)
        .force_path_style(aws.endpoint_url().is_some())
        .build();
    aws_sdk_s3::Client::from_conf(config)
}

/// Where the dispatcher publishes: `EVENT_BUS_NAME` (EventBridge), `EVENT_TOPIC_ARN` (SNS) or
/// `EVENT_QUEUE_URL` (SQS); exactly one must be set.
pub fn sink_from_env(aws: &aws_config::SdkConfig) -> Result<AwsSink, ConfigError> {
    sink_from_lookup(aws, |name| env::var(name).ok())
}

/// [`sink_from_env`], reading through `lookup`.
pub fn sink_from_lookup(
    aws: &aws_config::SdkConfig,
    lookup: impl Fn(&str) -> Option<String>,
) -> Result<AwsSink, ConfigError> {
    let vars = Vars::new(&lookup);
    let set = |name| vars.get(name);
    match (
        set("EVENT_BUS_NAME"),
        set("EVENT_TOPIC_ARN"),
        set("EVENT_QUEUE_URL"),
    ) {
        (Some(bus), None, None) => Ok(AwsSink::EventBridge {
            client: aws_sdk_eventbridge::Client::new(aws),
            bus,
        }),
        (None, Some(topic_arn), None) => Ok(AwsSink::Sns {
            client: aws_sdk_sns::Client::new(aws),
            topic_arn,
        }),
        (None, None, Some(queue_url)) => Ok(AwsSink::Sqs {
            client: aws_sdk_sqs::Client::new(aws),
            queue_url,
        }),
        _ => Err(ConfigError::Invalid {
            name: "EVENT_BUS_NAME",
            reason: "set exactly one of EVENT_BUS_NAME, EVENT_TOPIC_ARN and EVENT_QUEUE_URL"
                .to_owned(),
        }),
    }
}

/// The provider of the list `PROVIDER` names whose calls run in the background (`openai`), else
/// the first, with its settings: for a binary that needs only that of the worker's
/// configuration (the reconciler cancels expired background calls).
pub fn provider_from_lookup(
    lookup: impl Fn(&str) -> Option<String>,
) -> Result<ProviderConfig, ConfigError> {
    let list = ProviderConfig::list_from_vars(&Vars::new(&lookup))?;
    let background = list.iter().position(|(p, _)| p.runs_in_background());
    let (provider, _) = list
        .into_iter()
        .nth(background.unwrap_or(0))
        .unwrap_or((ProviderConfig::Simulated, ModelMap::default()));
    Ok(provider)
}

/// The reconciler's environment: `JOBS_TABLE`, `QUEUE_URL` and the `RECONCILE_*` settings.
pub fn reconciler_from_lookup(
    lookup: impl Fn(&str) -> Option<String>,
) -> Result<(String, String, ReconcileSettings), ConfigError> {
    let vars = Vars::new(&lookup);
    let table = vars.required("JOBS_TABLE")?;
    let queue_url = vars.required("QUEUE_URL")?;
    Ok((table, queue_url, ReconcileSettings::from_vars(&vars)?))
}

/// The reconciler's sweep of the DLQ, from `DLQ_URL` (unset or empty: no sweep) and the
/// deployment's `PRODUCERS` and `TRUSTED_SENDERS` (the worker's, its own and the operators'
/// roles), by which it tells whose letter each is.
pub fn dlq_sweep_from_lookup(
    lookup: impl Fn(&str) -> Option<String>,
) -> Result<Option<(String, crate::job::scope::Producers)>, ConfigError> {
    let vars = Vars::new(&lookup);
    let Some(dlq_url) = vars.get("DLQ_URL").filter(|url| !url.is_empty()) else {
        return Ok(None);
    };
    let producers = crate::job::scope::Producers::parse(
        &vars.get("PRODUCERS").unwrap_or_default(),
        &vars.get("TRUSTED_SENDERS").unwrap_or_default(),
    )
    .map_err(|reason| ConfigError::Invalid {
        name: "PRODUCERS",
        reason,
    })?;
    Ok(Some((dlq_url, producers)))
}

#[cfg(test)]
mod tests;
