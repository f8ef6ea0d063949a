use super::*;
use crate::job::InvalidMessage;
use crate::protocol::ReplayPolicy;
use crate::protocol::routing::ModelMap;
use crate::provider::anthropic::Structured;
use crate::provider::bedrock::BedrockSettings;
use crate::provider::openai::OpenAiApi;
use crate::provider::{KeySource, Secret};
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
    // Contracts strict unless the deployment opts out.
    assert!(c.contracts.strict && c.contracts.load().expect("loads").strict());
    let lenient = config(&[("JOBS_TABLE", "jobs"), ("CONTRACTS_STRICT", "false")]).expect("valid");
    assert!(!lenient.contracts.strict);
}

#[test]
fn with_webhooks_the_looks_at_a_running_batch_are_an_hour_apart_unless_set() {
    let batching = |vars: &[(&str, &str)]| {
        let mut all = vec![("JOBS_TABLE", "jobs")];
        all.extend_from_slice(vars);
        config(&all).expect("valid").settings.batching
    };
    let off = batching(&[]);
    assert_eq!((off.webhooks, off.poll_ms), (false, 600_000));
    let on = batching(&[("BATCH_WEBHOOKS", "on")]);
    assert_eq!((on.webhooks, on.poll_ms), (true, 3_600_000));
    let set = batching(&[("BATCH_WEBHOOKS", "on"), ("BATCH_POLL_SECONDS", "900")]);
    assert_eq!((set.webhooks, set.poll_ms), (true, 900_000));
    let typo = config(&[("JOBS_TABLE", "jobs"), ("BATCH_WEBHOOKS", "yes")]);
    assert!(typo.is_err(), "{typo:?}");
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
    let err = config(&[("JOBS_TABLE", "t"), ("REPLAY_POLICY", "sometimes")]).expect_err("invalid");
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
        ("PROVIDER", "anthropic"),
        ("ANTHROPIC_API_KEY_SECRET_ID", "arn:aws:secretsmanager:x"),
        ("ANTHROPIC_STRUCTURED_OUTPUT", "tool"),
        ("ALLOWED_MODELS", "claude-haiku-4-5"),
    ])
    .expect("valid");
    let ProviderConfig::Anthropic { settings, key } = &c.provider else {
        panic!("anthropic expected");
    };
    assert_eq!(settings.structured, Structured::Tool);
    assert_eq!(settings.base_url, "https://api.anthropic.com");
    assert_eq!(
        key,
        &KeySource::SecretsManager("arn:aws:secretsmanager:x".to_owned())
    );
    let plain = config(&[
        ("JOBS_TABLE", "t"),
        ("PROVIDER", "anthropic"),
        ("ANTHROPIC_BASE_URL", "http://example.com"),
    ]);
    assert!(matches!(
        plain,
        Err(ConfigError::Invalid {
            name: "ANTHROPIC_BASE_URL",
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
            endpoint_url: None,
            guardrail: None,
            stream: true,
        })
    );
}

#[test]
fn providers_are_listed_in_order_each_with_its_models() {
    let c = config(&[
        ("JOBS_TABLE", "t"),
        ("PROVIDER", "anthropic, bedrock"),
        (
            "BEDROCK_MODELS",
            "claude-haiku-4-5=us.anthropic.claude-haiku-4-5-v1:0",
        ),
        ("ALLOWED_MODELS", "claude-haiku-4-5"),
    ])
    .expect("valid");
    assert!(matches!(c.provider, ProviderConfig::Anthropic { .. }));
    assert_eq!(c.models, ModelMap::default());
    let [(ProviderConfig::Bedrock(_), models)] = c.fallbacks.as_slice() else {
        panic!("bedrock second: {:?}", c.fallbacks);
    };
    assert_eq!(
        models.get("claude-haiku-4-5"),
        Some("us.anthropic.claude-haiku-4-5-v1:0")
    );
    for (list, name) in [
        ("openai,openai", "PROVIDER"),
        ("openai,mistral", "PROVIDER"),
        // An empty entry is no provider (it must not read as the simulated one).
        (",openai", "PROVIDER"),
    ] {
        let err = config(&[
            ("JOBS_TABLE", "t"),
            ("PROVIDER", list),
            ("ALLOWED_MODELS", "*"),
        ])
        .expect_err(list);
        assert!(
            matches!(err, ConfigError::Invalid { name: n, .. } if n == name),
            "{list}: {err:?}"
        );
    }
    let bad_map = config(&[
        ("JOBS_TABLE", "t"),
        ("PROVIDER", "openai,anthropic"),
        ("ANTHROPIC_MODELS", "gpt-5-mini"),
        ("ALLOWED_MODELS", "*"),
    ]);
    assert!(matches!(
        bad_map,
        Err(ConfigError::Invalid {
            name: "ANTHROPIC_MODELS",
            ..
        })
    ));
    // The reconciler cancels background calls: it takes the provider that makes them.
    let vars = std::collections::HashMap::from([("PROVIDER", "anthropic,openai")]);
    let provider = provider_from_lookup(|n| vars.get(n).map(|v| (*v).to_owned())).expect("ok");
    assert!(matches!(provider, ProviderConfig::OpenAi { .. }));
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

#[test]
fn a_prices_file_adds_its_models_and_one_that_does_not_parse_stops_start_up() {
    let dir = std::env::temp_dir().join(format!("fenced-jobs-prices-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let good = dir.join("prices.json");
    std::fs::write(
        &good,
        r#"{"as_of": "2026-12-01", "models": {"in-house-7b": {"input": 0.01, "output": 0.02}}}"#,
    )
    .expect("written");
    let bad = dir.join("bad.json");
    std::fs::write(&bad, r#"{"models": {"m": {"input": 1}}}"#).expect("written");
    let path = |p: &std::path::Path| p.display().to_string();
    let c = config(&[("JOBS_TABLE", "t"), ("PRICES_FILE", &path(&good))]).expect("valid");
    assert!(c.settings.prices.price("in-house-7b").is_some());
    assert!(c.settings.prices.price("gpt-4.1").is_some(), "built in");
    assert_eq!(c.settings.prices.as_of, "2026-12-01");
    for wrong in [path(&bad), path(&dir.join("absent.json"))] {
        let refused = config(&[("JOBS_TABLE", "t"), ("PRICES_FILE", &wrong)]);
        assert!(
            matches!(
                refused,
                Err(ConfigError::Invalid {
                    name: "PRICES_FILE",
                    ..
                })
            ),
            "{refused:?}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_default_spend_limit_is_read_in_usd() {
    let c = config(&[("JOBS_TABLE", "t"), ("DEFAULT_MAX_COST", "0.5")]).expect("valid");
    assert_eq!(c.settings.job_defaults.max_cost_micros, Some(500_000));
    let none = config(&[("JOBS_TABLE", "t")]).expect("valid");
    assert_eq!(none.settings.job_defaults.max_cost_micros, None);
    for bad in ["0", "-2", "lots"] {
        assert!(
            matches!(
                config(&[("JOBS_TABLE", "t"), ("DEFAULT_MAX_COST", bad)]),
                Err(ConfigError::Invalid {
                    name: "DEFAULT_MAX_COST",
                    ..
                })
            ),
            "{bad}"
        );
    }
}

#[test]
fn urgent_jobs_keep_their_share_of_the_limits_and_tenants_their_day() {
    let c = config(&[
        ("JOBS_TABLE", "t"),
        ("PROVIDER_RPM", "1000"),
        ("PROVIDER_TPM", "2000000"),
        ("URGENT_PACING_PERCENT", "20"),
        ("TENANT_DAILY_SPEND_LIMIT", "5"),
    ])
    .expect("valid");
    let s = &c.settings;
    assert_eq!(s.tenant_daily_spend_limit_micros, Some(5_000_000));
    let normal = s.pacing();
    let urgent = s.urgent_pacing().expect("a share kept");
    assert_eq!((normal.limits.rpm, normal.limits.tpm), (800, 1_600_000));
    assert_eq!((urgent.limits.rpm, urgent.limits.tpm), (200, 400_000));
    assert_eq!(urgent.key, format!("{}#urgent", normal.key));
    // Without limits, or without a share, urgent jobs pace with the others.
    let unlimited = config(&[("JOBS_TABLE", "t"), ("URGENT_PACING_PERCENT", "20")]).expect("ok");
    assert!(unlimited.settings.urgent_pacing().is_none());
    let unshared = config(&[("JOBS_TABLE", "t"), ("PROVIDER_RPM", "1000")]).expect("ok");
    assert!(unshared.settings.urgent_pacing().is_none());
    assert_eq!(unshared.settings.pacing().limits.rpm, 1000);
    assert!(config(&[("JOBS_TABLE", "t"), ("URGENT_PACING_PERCENT", "95")]).is_err());
    // Tenants are not capped unless asked; a cap is a share of normal jobs' limits.
    assert!(s.tenant_pacing("acme").is_none());
    let capped = config(&[
        ("JOBS_TABLE", "t"),
        ("PROVIDER_RPM", "1000"),
        ("URGENT_PACING_PERCENT", "20"),
        ("TENANT_PACING_PERCENT", "50"),
    ])
    .expect("valid");
    let acme = capped.settings.tenant_pacing("acme").expect("capped");
    assert_eq!(acme.limits.rpm, 400);
    assert!(acme.key.ends_with("#tenant#acme"), "{}", acme.key);
    assert!(config(&[("JOBS_TABLE", "t"), ("TENANT_PACING_PERCENT", "0")]).is_err());
}

#[test]
fn the_reconciler_sweeps_the_dlq_only_when_named() {
    let map = |vars: &[(&str, &str)]| {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        dlq_sweep_from_lookup(move |k| vars.get(k).cloned())
    };
    assert!(map(&[]).expect("valid").is_none());
    assert!(map(&[("DLQ_URL", "")]).expect("valid").is_none());
    let (url, producers) = map(&[
        ("DLQ_URL", "https://sqs.local/1/dlq"),
        ("PRODUCERS", "billing=AROABILLING"),
        ("TRUSTED_SENDERS", "AROAWORKER"),
    ])
    .expect("valid")
    .expect("a sweep");
    assert_eq!(url, "https://sqs.local/1/dlq");
    assert!(producers.scoped() && producers.trusts(Some("AROAWORKER:fn")));
    assert!(matches!(
        map(&[("DLQ_URL", "q"), ("PRODUCERS", "billing")]),
        Err(ConfigError::Invalid {
            name: "PRODUCERS",
            ..
        })
    ));
}
