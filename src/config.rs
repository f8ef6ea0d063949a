//! Configuration, read once from the environment.

use std::env;

use crate::job::{Millis, VisibilityPolicy};
use crate::provider::bedrock::BedrockSettings;
use crate::provider::openai::{OpenAiApi, OpenAiSettings};

/// Everything the worker reads from its environment. See the README's configuration table.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// `JOBS_TABLE`: the ledger table (required).
    pub jobs_table: String,
    /// `PROVIDER`: which model provider runs the calls, and how to reach it.
    pub provider: ProviderConfig,
    /// Processing settings.
    pub settings: Settings,
}

/// The model providers this build knows.
#[derive(Debug, Clone, PartialEq)]
pub enum ProviderConfig {
    /// `simulated`: the deterministic, network-free provider.
    Simulated,
    /// `openai`: an OpenAI-compatible HTTP server.
    OpenAi {
        /// Where and how.
        settings: OpenAiSettings,
        /// Where the API key comes from.
        key: KeySource,
    },
    /// `bedrock`: Amazon Bedrock `Converse`.
    Bedrock(BedrockSettings),
}

/// Where a provider's API key comes from. Never from the template's own text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySource {
    /// No key (a local OpenAI-compatible server that needs none).
    None,
    /// `OPENAI_API_KEY`: the key itself, from the environment (local use).
    Value(Secret),
    /// `OPENAI_API_KEY_SECRET_ID`: a Secrets Manager secret (the key, or JSON with `api_key`).
    SecretsManager(String),
    /// `OPENAI_API_KEY_PARAMETER`: an SSM `SecureString` parameter.
    Parameter(String),
}

/// A credential. Its `Debug` shows nothing of it, so it cannot reach a log by accident.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a credential.
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }

    /// The credential, for the one place that sends it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

/// What happens to an attempt whose outcome is unknown (the call may have run).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReplayPolicy {
    /// `never`: the job becomes `unknown` and waits for retrieval or an operator.
    #[default]
    Never,
    /// `replay`: possible duplicate inference and cost are accepted; the decision is recorded
    /// and another attempt authorised, within the same attempt budget and deadline.
    Replay,
}

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
    /// `HEARTBEAT_SECONDS`: interval of the heartbeat that extends visibility and renews leases;
    /// default a third of the shorter of the queue's visibility timeout and the lease; 0 turns
    /// it off (then the lease must outlast the longest call).
    pub heartbeat_ms: Millis,
    /// `CLOCK_SKEW_MS`: margin added to every lease before another receiver treats it as lapsed.
    pub skew_ms: Millis,
    /// `PROVIDER_TIMEOUT_SECONDS`: longest model call; a call cut off is recorded as uncertain.
    pub provider_timeout_ms: Millis,
    /// `POLL_INTERVAL_MS`: pause between two retrievals of a provider call that is still running.
    pub poll_ms: Millis,
    /// `DEADLINE_MARGIN_MS`: time kept before the Lambda deadline for the final writes, the
    /// visibility changes and the response.
    pub deadline_margin_ms: Millis,
    /// `DEFAULT_MAX_ATTEMPTS`: attempt budget of a job whose message sets none.
    pub default_max_attempts: u32,
    /// `DEFAULT_DEADLINE_SECONDS`: deadline, from first sight, of a job whose message sets none.
    pub default_deadline_ms: Millis,
    /// `RETENTION_DAYS`: how long after its deadline a job item is kept (DynamoDB TTL).
    pub retention_days: i64,
    /// `REPLAY_POLICY`: `never` (default) or `replay`.
    pub replay: ReplayPolicy,
    /// Visibility of failed records (`BACKOFF_BASE_SECONDS`, `BACKOFF_CAP_SECONDS`,
    /// `DEFER_JITTER_SECONDS`, `AWAITING_DECISION_SECONDS`).
    pub visibility: VisibilityPolicy,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            max_concurrency: 16,
            lease_ms: 60_000,
            queue_visibility_s: 30,
            heartbeat_ms: 10_000,
            skew_ms: 2_000,
            provider_timeout_ms: 240_000,
            poll_ms: 1_000,
            deadline_margin_ms: 5_000,
            default_max_attempts: 3,
            default_deadline_ms: 86_400_000,
            retention_days: 30,
            replay: ReplayPolicy::Never,
            visibility: VisibilityPolicy::default(),
        }
    }
}

/// A configuration value that is missing or wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// A required variable is unset or empty.
    #[error("{0} must be set")]
    Missing(&'static str),
    /// A variable does not parse or is out of range.
    #[error("{name} is invalid: {reason}")]
    Invalid {
        /// The variable.
        name: &'static str,
        /// Why.
        reason: String,
    },
}

impl Settings {
    /// Checks the relations between settings.
    pub fn validate(&self) -> Result<(), ConfigError> {
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

impl Config {
    /// Reads the process environment.
    pub fn from_env() -> Result<Config, ConfigError> {
        Config::from_lookup(|name| env::var(name).ok())
    }

    /// Reads configuration through `lookup` (the environment, or a map in tests).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
        let get = |name: &str| lookup(name).filter(|v| !v.trim().is_empty());
        let jobs_table = get("JOBS_TABLE").ok_or(ConfigError::Missing("JOBS_TABLE"))?;
        let d = Settings::default();
        let number = |name, default, min, max| integer(&get, name, default, min, max);
        let settings = Settings {
            max_concurrency: number("MAX_CONCURRENCY", d.max_concurrency as i64, 1, 10_000)?
                as usize,
            lease_ms: number("LEASE_SECONDS", d.lease_ms / 1000, 1, 43_200)? * 1000,
            queue_visibility_s: number(
                "QUEUE_VISIBILITY_TIMEOUT_SECONDS",
                d.queue_visibility_s,
                1,
                43_200,
            )?,
            heartbeat_ms: 0,
            skew_ms: number("CLOCK_SKEW_MS", d.skew_ms, 0, 60_000)?,
            provider_timeout_ms: number(
                "PROVIDER_TIMEOUT_SECONDS",
                d.provider_timeout_ms / 1000,
                1,
                43_200,
            )? * 1000,
            poll_ms: number("POLL_INTERVAL_MS", d.poll_ms, 10, 600_000)?,
            deadline_margin_ms: number("DEADLINE_MARGIN_MS", d.deadline_margin_ms, 0, 600_000)?,
            default_max_attempts: number(
                "DEFAULT_MAX_ATTEMPTS",
                i64::from(d.default_max_attempts),
                1,
                100,
            )? as u32,
            default_deadline_ms: number(
                "DEFAULT_DEADLINE_SECONDS",
                d.default_deadline_ms / 1000,
                1,
                31_536_000,
            )? * 1000,
            retention_days: number("RETENTION_DAYS", d.retention_days, 1, 3_650)?,
            replay: match get("REPLAY_POLICY").as_deref() {
                None | Some("never") => ReplayPolicy::Never,
                Some("replay") => ReplayPolicy::Replay,
                Some(_) => {
                    return Err(ConfigError::Invalid {
                        name: "REPLAY_POLICY",
                        reason: "expected never or replay".to_owned(),
                    });
                }
            },
            visibility: VisibilityPolicy {
                backoff_base_s: number(
                    "BACKOFF_BASE_SECONDS",
                    d.visibility.backoff_base_s,
                    0,
                    43_200,
                )?,
                backoff_cap_s: number(
                    "BACKOFF_CAP_SECONDS",
                    d.visibility.backoff_cap_s,
                    0,
                    43_200,
                )?,
                defer_jitter_s: number(
                    "DEFER_JITTER_SECONDS",
                    d.visibility.defer_jitter_s,
                    0,
                    3_600,
                )?,
                awaiting_decision_s: number(
                    "AWAITING_DECISION_SECONDS",
                    d.visibility.awaiting_decision_s,
                    0,
                    43_200,
                )?,
            },
        };
        let provider = match get("PROVIDER").as_deref() {
            None | Some("simulated") => ProviderConfig::Simulated,
            Some("openai") => {
                let o = OpenAiSettings::default();
                let settings = OpenAiSettings {
                    base_url: get("OPENAI_BASE_URL").unwrap_or(o.base_url),
                    api: match get("OPENAI_API").as_deref() {
                        None | Some("responses") => OpenAiApi::Responses,
                        Some("chat") => OpenAiApi::Chat,
                        Some(_) => {
                            return Err(ConfigError::Invalid {
                                name: "OPENAI_API",
                                reason: "expected responses or chat".to_owned(),
                            });
                        }
                    },
                    model: get("OPENAI_MODEL"),
                    connect_timeout_ms: number(
                        "OPENAI_CONNECT_TIMEOUT_MS",
                        o.connect_timeout_ms,
                        1,
                        60_000,
                    )?,
                    request_timeout_ms: number(
                        "OPENAI_REQUEST_TIMEOUT_SECONDS",
                        o.request_timeout_ms / 1000,
                        1,
                        900,
                    )? * 1000,
                };
                let sources = [
                    get("OPENAI_API_KEY").map(|v| KeySource::Value(Secret::new(v))),
                    get("OPENAI_API_KEY_SECRET_ID").map(KeySource::SecretsManager),
                    get("OPENAI_API_KEY_PARAMETER").map(KeySource::Parameter),
                ];
                let mut given = sources.into_iter().flatten();
                let key = given.next().unwrap_or(KeySource::None);
                if given.next().is_some() {
                    return Err(ConfigError::Invalid {
                        name: "OPENAI_API_KEY",
                        reason: "give one of OPENAI_API_KEY, OPENAI_API_KEY_SECRET_ID and \
                                 OPENAI_API_KEY_PARAMETER"
                            .to_owned(),
                    });
                }
                ProviderConfig::OpenAi { settings, key }
            }
            Some("bedrock") => ProviderConfig::Bedrock(BedrockSettings {
                model_id: get("BEDROCK_MODEL_ID"),
                endpoint_url: get("BEDROCK_ENDPOINT_URL"),
            }),
            Some(other) => {
                return Err(ConfigError::Invalid {
                    name: "PROVIDER",
                    reason: format!(
                        "unknown provider {other:?} (known: simulated, openai, bedrock)"
                    ),
                });
            }
        };
        let mut settings = settings;
        let default_heartbeat_s = settings.queue_visibility_s.min(settings.lease_ms / 1000) / 3;
        settings.heartbeat_ms =
            number("HEARTBEAT_SECONDS", default_heartbeat_s.max(1), 0, 43_200)? * 1000;
        settings.validate()?;
        Ok(Config {
            jobs_table,
            provider,
            settings,
        })
    }
}

/// The reconciler's environment: `JOBS_TABLE`, `QUEUE_URL` and the `RECONCILE_*` settings.
pub fn reconciler_from_lookup(
    lookup: impl Fn(&str) -> Option<String>,
) -> Result<(String, String, crate::reconcile::ReconcileSettings), ConfigError> {
    let get = |name: &str| lookup(name).filter(|v| !v.trim().is_empty());
    let table = get("JOBS_TABLE").ok_or(ConfigError::Missing("JOBS_TABLE"))?;
    let queue_url = get("QUEUE_URL").ok_or(ConfigError::Missing("QUEUE_URL"))?;
    let d = crate::reconcile::ReconcileSettings::default();
    let seconds = |name, default_ms: Millis| {
        Ok::<_, ConfigError>(integer(&get, name, default_ms / 1000, 1, 31_536_000)? * 1000)
    };
    let settings = crate::reconcile::ReconcileSettings {
        ready_after_ms: seconds("RECONCILE_READY_AFTER_SECONDS", d.ready_after_ms)?,
        retry_after_ms: seconds("RECONCILE_RETRY_AFTER_SECONDS", d.retry_after_ms)?,
        enqueue_stale_after_ms: seconds(
            "RECONCILE_ENQUEUE_STALE_SECONDS",
            d.enqueue_stale_after_ms,
        )?,
        max_jobs: integer(&get, "RECONCILE_MAX_JOBS", d.max_jobs as i64, 1, 100_000)? as usize,
    };
    Ok((table, queue_url, settings))
}

/// The integer variable `name`, `default` when unset, refused outside `min..=max`.
fn integer(
    get: &impl Fn(&str) -> Option<String>,
    name: &'static str,
    default: i64,
    min: i64,
    max: i64,
) -> Result<i64, ConfigError> {
    match get(name) {
        None => Ok(default),
        Some(raw) => match raw.trim().parse::<i64>() {
            Ok(v) if (min..=max).contains(&v) => Ok(v),
            _ => Err(ConfigError::Invalid {
                name,
                reason: format!("expected an integer from {min} to {max}"),
            }),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn config(vars: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        Config::from_lookup(|k| map.get(k).cloned())
    }

    #[test]
    fn defaults_apply_and_the_table_is_required() {
        assert_eq!(config(&[]), Err(ConfigError::Missing("JOBS_TABLE")));
        let c = config(&[("JOBS_TABLE", "jobs")]).expect("valid");
        assert_eq!(c.settings, Settings::default());
        assert_eq!(c.provider, ProviderConfig::Simulated);
    }

    #[test]
    fn bad_values_are_named() {
        let err = config(&[("JOBS_TABLE", "t"), ("MAX_CONCURRENCY", "0")]).expect_err("invalid");
        assert!(matches!(
            err,
            ConfigError::Invalid {
                name: "MAX_CONCURRENCY",
                ..
            }
        ));
        let err =
            config(&[("JOBS_TABLE", "t"), ("REPLAY_POLICY", "sometimes")]).expect_err("invalid");
        assert!(matches!(
            err,
            ConfigError::Invalid {
                name: "REPLAY_POLICY",
                ..
            }
        ));
        let c = config(&[("JOBS_TABLE", "t"), ("REPLAY_POLICY", "replay")]).expect("valid");
        assert_eq!(c.settings.replay, ReplayPolicy::Replay);
        let err = config(&[("JOBS_TABLE", "t"), ("PROVIDER", "magic")]).expect_err("invalid");
        assert!(matches!(
            err,
            ConfigError::Invalid {
                name: "PROVIDER",
                ..
            }
        ));
        let err = config(&[
            ("JOBS_TABLE", "t"),
            ("HEARTBEAT_SECONDS", "0"),
            ("LEASE_SECONDS", "60"),
            ("PROVIDER_TIMEOUT_SECONDS", "60"),
        ])
        .expect_err("invalid");
        assert!(matches!(
            err,
            ConfigError::Invalid {
                name: "PROVIDER_TIMEOUT_SECONDS",
                ..
            }
        ));
        let err = config(&[
            ("JOBS_TABLE", "t"),
            ("LEASE_SECONDS", "20"),
            ("HEARTBEAT_SECONDS", "10"),
        ])
        .expect_err("invalid");
        assert!(matches!(
            err,
            ConfigError::Invalid {
                name: "HEARTBEAT_SECONDS",
                ..
            }
        ));
    }

    #[test]
    fn providers_are_configured_and_keys_never_printed() {
        let c = config(&[
            ("JOBS_TABLE", "t"),
            ("PROVIDER", "openai"),
            ("OPENAI_BASE_URL", "http://127.0.0.1:9/v1"),
            ("OPENAI_API_KEY", "sk-very-secret"),
            ("OPENAI_API", "chat"),
        ])
        .expect("valid");
        let ProviderConfig::OpenAi { settings, key } = &c.provider else {
            panic!("openai expected");
        };
        assert_eq!(settings.api, OpenAiApi::Chat);
        assert_eq!(settings.base_url, "http://127.0.0.1:9/v1");
        assert_eq!(key, &KeySource::Value(Secret::new("sk-very-secret")));
        assert!(!format!("{c:?}").contains("very-secret"));
        let two_keys = config(&[
            ("JOBS_TABLE", "t"),
            ("PROVIDER", "openai"),
            ("OPENAI_API_KEY", "k"),
            ("OPENAI_API_KEY_PARAMETER", "/p"),
        ]);
        assert!(matches!(
            two_keys,
            Err(ConfigError::Invalid {
                name: "OPENAI_API_KEY",
                ..
            })
        ));
        let c = config(&[
            ("JOBS_TABLE", "t"),
            ("PROVIDER", "bedrock"),
            ("BEDROCK_MODEL_ID", "anthropic.claude"),
        ])
        .expect("valid");
        assert_eq!(
            c.provider,
            ProviderConfig::Bedrock(BedrockSettings {
                model_id: Some("anthropic.claude".to_owned()),
                endpoint_url: None
            })
        );
    }

    #[test]
    fn the_reconciler_reads_its_own_variables() {
        let map = |vars: &[(&str, &str)]| {
            let vars: HashMap<String, String> = vars
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect();
            reconciler_from_lookup(move |k| vars.get(k).cloned())
        };
        assert_eq!(
            map(&[("JOBS_TABLE", "t")]).map(|_| ()),
            Err(ConfigError::Missing("QUEUE_URL"))
        );
        let (table, queue, s) = map(&[
            ("JOBS_TABLE", "t"),
            ("QUEUE_URL", "q"),
            ("RECONCILE_READY_AFTER_SECONDS", "60"),
        ])
        .expect("valid");
        assert_eq!((table.as_str(), queue.as_str()), ("t", "q"));
        assert_eq!(s.ready_after_ms, 60_000);
        assert_eq!(s.retry_after_ms, 1_200_000);
        assert!(matches!(
            map(&[
                ("JOBS_TABLE", "t"),
                ("QUEUE_URL", "q"),
                ("RECONCILE_MAX_JOBS", "0")
            ]),
            Err(ConfigError::Invalid {
                name: "RECONCILE_MAX_JOBS",
                ..
            })
        ));
    }

    #[test]
    fn the_heartbeat_defaults_to_a_third_of_the_shorter_window() {
        let c = config(&[
            ("JOBS_TABLE", "t"),
            ("QUEUE_VISIBILITY_TIMEOUT_SECONDS", "1830"),
        ])
        .expect("valid");
        assert_eq!(c.settings.heartbeat_ms, 20_000);
        let c = config(&[
            ("JOBS_TABLE", "t"),
            ("QUEUE_VISIBILITY_TIMEOUT_SECONDS", "12"),
        ])
        .expect("valid");
        assert_eq!(c.settings.heartbeat_ms, 4_000);
    }
}
