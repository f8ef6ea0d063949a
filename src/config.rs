//! Configuration, read once from the environment: each part reads its own settings (the worker's
//! [`Settings`], the provider's [`ProviderConfig`], the reconciler's [`ReconcileSettings`]); this
//! module only assembles them for each binary.

use std::env;
use std::time::Duration;

use crate::events::aws::AwsSink;
use crate::job::Millis;
use crate::job::contract::Contracts;
use crate::ops::reconcile::ReconcileSettings;
use crate::provider::ProviderConfig;
pub use crate::vars::ConfigError;
use crate::vars::Vars;
use crate::worker::settings::Settings;

/// Everything the worker reads from its environment. See the README's configuration table.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// `JOBS_TABLE`: the ledger table (required).
    pub jobs_table: String,
    /// `PROVIDER`: which model provider runs the calls, and how to reach it.
    pub provider: ProviderConfig,
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
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ContractSource {
    /// `CONTRACTS_DIR`: a folder of `<id>.json` contract files read at start-up, over the
    /// built-in ones (a Lambda layer's `/opt/contracts`, say).
    pub dir: Option<String>,
    /// `CONTRACTS_STRICT`: `true` refuses a new job naming a contract the registry does not
    /// hold (poison); `false` (the default) holds it to free text.
    pub strict: bool,
}

impl ContractSource {
    fn from_vars(vars: &Vars<'_>) -> Result<ContractSource, ConfigError> {
        Ok(ContractSource {
            dir: vars.get("CONTRACTS_DIR"),
            strict: vars.choice(
                "CONTRACTS_STRICT",
                false,
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
        let provider = ProviderConfig::from_vars(&vars)?;
        if provider.names_model() && vars.get("ALLOWED_MODELS").is_none() {
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

/// The provider the environment names (`PROVIDER` and its settings), for a binary that needs
/// only that of the worker's configuration (the reconciler cancels expired background calls).
pub fn provider_from_lookup(
    lookup: impl Fn(&str) -> Option<String>,
) -> Result<ProviderConfig, ConfigError> {
    ProviderConfig::from_vars(&Vars::new(&lookup))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::InvalidMessage;
    use crate::provider::bedrock::BedrockSettings;
    use crate::provider::openai::OpenAiApi;
    use crate::provider::{KeySource, Secret};
    use crate::worker::settings::ReplayPolicy;
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
        // The defaults, with the table's name setting the idempotency keys apart.
        assert_eq!(
            c.settings,
            Settings {
                idempotency_prefix: c.settings.idempotency_prefix.clone(),
                ..Settings::default()
            }
        );
        assert_eq!(c.settings.idempotency_prefix.len(), 16);
        assert_eq!(c.provider, ProviderConfig::Simulated);
    }

    #[test]
    fn the_provider_limits_and_the_pacing_are_read() {
        let c = config(&[
            ("JOBS_TABLE", "t"),
            ("MAX_CONCURRENCY", "24"),
            ("PROVIDER_RPM", "5000"),
            ("PROVIDER_TPM", "3000000"),
            ("PROVIDER_LIMIT_KEY", "openai-org-1"),
            ("PACING_HORIZON_SECONDS", "4"),
        ])
        .expect("valid");
        let pacing = c.settings.pacing();
        assert_eq!((pacing.limits.rpm, pacing.limits.tpm), (5_000, 3_000_000));
        assert_eq!(pacing.key, "openai-org-1");
        assert_eq!(pacing.horizon_ms, 4_000);
        // Unset, the ceiling of calls in flight is the records processed at once.
        assert_eq!(pacing.max_in_flight, 24);
        let capped = config(&[("JOBS_TABLE", "t"), ("MAX_CALLS_IN_FLIGHT", "4")]).expect("valid");
        assert_eq!(capped.settings.pacing().max_in_flight, 4);
    }

    #[test]
    fn the_results_retention_must_cover_the_longest_deadline_and_the_item_after_it() {
        // 30 days of item after the longest deadline a producer may ask for (7 days): 37 days
        // is enough, 36 is not.
        let ok = config(&[("JOBS_TABLE", "t"), ("RESULTS_RETENTION_DAYS", "37")]).expect("valid");
        assert_eq!(ok.settings.stored_room_ms(), Some(7 * 86_400_000));
        for (days, longest) in [("36", "604800"), ("31", "86401")] {
            let err = config(&[
                ("JOBS_TABLE", "t"),
                ("RESULTS_RETENTION_DAYS", days),
                ("MAX_DEADLINE_SECONDS", longest),
            ])
            .expect_err("too short");
            assert!(matches!(
                err,
                ConfigError::Invalid {
                    name: "RESULTS_RETENTION_DAYS",
                    ..
                }
            ));
        }
        config(&[
            ("JOBS_TABLE", "t"),
            ("RESULTS_RETENTION_DAYS", "31"),
            ("MAX_DEADLINE_SECONDS", "86400"),
        ])
        .expect("valid");
        // Unset, the bucket is taken to keep its objects: nothing to check.
        let unset = config(&[("JOBS_TABLE", "t")]).expect("valid");
        assert_eq!(unset.settings.stored_room_ms(), None);
    }

    #[test]
    fn what_producers_may_ask_for_is_read_and_bounds_the_defaults() {
        use crate::job::policy::Models;
        let c = config(&[
            ("JOBS_TABLE", "t"),
            ("ALLOWED_MODELS", "gpt-4.1-mini, gpt-4.1"),
            ("ALLOWED_PARAMETERS", "temperature<=1,max_tokens<=2048"),
            ("MAX_ATTEMPTS_LIMIT", "5"),
            ("MAX_DEADLINE_SECONDS", "86400"),
            ("PRODUCERS", "billing=AROABILLING"),
            ("TRUSTED_SENDERS", "AROARECONCILER"),
        ])
        .expect("valid");
        let policy = &c.settings.policy;
        assert_eq!(
            policy.models,
            Models::Only(vec!["gpt-4.1-mini".into(), "gpt-4.1".into()])
        );
        let parameters = policy.parameters.as_ref().expect("a list");
        assert_eq!(parameters.get("max_tokens"), Some(&Some(2048.0)));
        assert_eq!(parameters.get("stream"), None);
        assert_eq!(
            (policy.max_attempts, policy.max_deadline_ms),
            (5, 86_400_000)
        );
        assert!(c.settings.producers.scoped());
        // Unset, the built-in safe list holds: no streaming, bounded answers.
        let d = config(&[("JOBS_TABLE", "t")]).expect("valid");
        let parameters = d.settings.policy.parameters.expect("the built-in list");
        assert_eq!(parameters.get("stream"), None);
        assert_eq!(parameters.get("max_tokens"), Some(&Some(16_384.0)));
        // The defaults a message falls back on must be within what a message may ask.
        for (name, vars) in [
            (
                "DEFAULT_MAX_ATTEMPTS",
                [("DEFAULT_MAX_ATTEMPTS", "6"), ("MAX_ATTEMPTS_LIMIT", "5")],
            ),
            (
                "DEFAULT_DEADLINE_SECONDS",
                [
                    ("DEFAULT_DEADLINE_SECONDS", "7200"),
                    ("MAX_DEADLINE_SECONDS", "3600"),
                ],
            ),
            (
                "PRODUCERS",
                [("PRODUCERS", "billing"), ("MAX_ATTEMPTS_LIMIT", "5")],
            ),
            (
                "ALLOWED_PARAMETERS",
                [
                    ("ALLOWED_PARAMETERS", "max_tokens<=x"),
                    ("MAX_ATTEMPTS_LIMIT", "5"),
                ],
            ),
        ] {
            let mut all = vec![("JOBS_TABLE", "t")];
            all.extend(vars);
            let err = config(&all).expect_err(name);
            assert!(
                matches!(err, ConfigError::Invalid { name: n, .. } if n == name),
                "{err:?}"
            );
        }
        // A provider that calls the model a job names needs the list.
        let err = config(&[
            ("JOBS_TABLE", "t"),
            ("PROVIDER", "openai"),
            ("OPENAI_API_KEY", "k"),
        ])
        .expect_err("no list");
        assert!(matches!(
            err,
            ConfigError::Invalid {
                name: "ALLOWED_MODELS",
                ..
            }
        ));
    }

    #[test]
    fn the_redrive_count_must_carry_the_default_deadline() {
        // A 1-day default deadline: nine receives carry it (three waits of about 12 hours past
        // the first half and its reserve), eight do not.
        let ok = config(&[("JOBS_TABLE", "t"), ("MAX_RECEIVE_COUNT", "9")]).expect("valid");
        assert_eq!(
            ok.settings
                .visibility
                .reach_ms(ok.settings.batching_window_ms),
            Some(3 * 43_080_000)
        );
        let err = config(&[("JOBS_TABLE", "t"), ("MAX_RECEIVE_COUNT", "8")]).expect_err("too few");
        assert!(matches!(
            err,
            ConfigError::Invalid {
                name: "MAX_RECEIVE_COUNT",
                ..
            }
        ));
        // A shorter default deadline is carried by fewer; 0 sets no redrive count at all.
        config(&[
            ("JOBS_TABLE", "t"),
            ("MAX_RECEIVE_COUNT", "8"),
            ("DEFAULT_DEADLINE_SECONDS", "3600"),
        ])
        .expect("valid");
        let none = config(&[("JOBS_TABLE", "t"), ("MAX_RECEIVE_COUNT", "0")]).expect("valid");
        assert_eq!(none.settings.visibility.reach_ms(0), None);
    }

    #[test]
    fn a_first_sight_deadline_is_refused_past_the_bucket_and_past_the_redrive_count() {
        let day = 86_400_000;
        let c = config(&[
            ("JOBS_TABLE", "t"),
            ("RESULTS_RETENTION_DAYS", "40"),
            ("MAX_RECEIVE_COUNT", "20"),
        ])
        .expect("valid");
        let s = &c.settings;
        // 20 receives: 10 past the first half, 2 kept back, 8 waits of about 12 hours.
        let reach = s.visibility.reach_ms(0).expect("a reach");
        assert_eq!(reach, 8 * 43_080_000);
        assert_eq!(s.deadline_refused(reach, 0, true), None);
        let rule = |r: Option<InvalidMessage>| match r {
            Some(InvalidMessage::Invalid { rule, .. }) => rule,
            other => panic!("{other:?}"),
        };
        assert!(rule(s.deadline_refused(reach + 1, 0, true)).contains("MAX_RECEIVE_COUNT"));
        // The bucket keeps 40 days less the item's 30: past 10 days, when answers are stored.
        assert!(rule(s.deadline_refused(11 * day, 0, true)).contains("RESULTS_RETENTION_DAYS"));
        assert!(rule(s.deadline_refused(11 * day, 0, false)).contains("MAX_RECEIVE_COUNT"));
        // Measured from now.
        assert_eq!(s.deadline_refused(day + reach, day, true), None);
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
            ("ALLOWED_MODELS", "*"),
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
    fn a_provider_is_reached_over_tls_unless_it_is_on_this_machine() {
        let openai = |url: &str| {
            config(&[
                ("JOBS_TABLE", "t"),
                ("PROVIDER", "openai"),
                ("ALLOWED_MODELS", "*"),
                ("OPENAI_BASE_URL", url),
            ])
        };
        for url in [
            "https://api.openai.com/v1",
            "http://127.0.0.1:8080/v1",
            "http://localhost:8080/v1",
            "http://[::1]:8080/v1",
        ] {
            openai(url).expect(url);
        }
        for url in [
            "http://api.openai.com/v1",
            "http://127.0.0.1.example.com/v1",
            "http://user@127.0.0.1/v1",
            "ftp://127.0.0.1/v1",
            "api.openai.com/v1",
        ] {
            assert!(
                matches!(
                    openai(url),
                    Err(ConfigError::Invalid {
                        name: "OPENAI_BASE_URL",
                        ..
                    })
                ),
                "{url}"
            );
        }
        let bedrock = config(&[
            ("JOBS_TABLE", "t"),
            ("PROVIDER", "bedrock"),
            ("BEDROCK_MODEL_ID", "m"),
            ("BEDROCK_ENDPOINT_URL", "http://bedrock.internal"),
        ]);
        assert!(matches!(
            bedrock,
            Err(ConfigError::Invalid {
                name: "BEDROCK_ENDPOINT_URL",
                ..
            })
        ));
    }

    #[test]
    fn idempotency_keys_differ_between_deployments_and_stay_stable_within_one() {
        let key = |vars: &[(&str, &str)]| {
            config(vars)
                .expect("valid")
                .settings
                .idempotency_key("job-1", 2, 3)
        };
        let a = key(&[
            ("JOBS_TABLE", "jobs"),
            ("DEPLOYMENT_ID", "111111111111/eu-west-1/jobs"),
        ]);
        let b = key(&[
            ("JOBS_TABLE", "jobs"),
            ("DEPLOYMENT_ID", "222222222222/eu-west-1/jobs"),
        ]);
        assert_ne!(a, b);
        assert!(
            a.ends_with(":job-1/2@3") && a.len() == 16 + ":job-1/2@3".len(),
            "{a}"
        );
        assert_eq!(
            a,
            key(&[
                ("JOBS_TABLE", "other"),
                ("DEPLOYMENT_ID", "111111111111/eu-west-1/jobs")
            ])
        );
        // Without a deployment id, the table's name sets them apart.
        assert_ne!(
            key(&[("JOBS_TABLE", "jobs-a")]),
            key(&[("JOBS_TABLE", "jobs-b")])
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
