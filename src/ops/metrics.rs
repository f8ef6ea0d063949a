//! CloudWatch Embedded Metric Format: one JSON document per invocation, printed on its own line
//! to stdout, which Lambda's log stream turns into metrics without an API call.

use serde_json::{Map, Value, json};

use crate::job::Millis;
use crate::report::{BatchReport, ReconcileReport};

/// `METRICS_NAMESPACE`'s default.
pub(crate) const DEFAULT_NAMESPACE: &str = "FencedJobs";

/// Where metrics go: the namespace and the `Function` dimension's value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetricsTarget {
    /// `METRICS_NAMESPACE`.
    pub namespace: String,
    /// The function's name (`AWS_LAMBDA_FUNCTION_NAME`), or `local`.
    pub function: String,
}

impl MetricsTarget {
    /// From the environment.
    pub fn from_env() -> Self {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        MetricsTarget {
            namespace: var("METRICS_NAMESPACE").unwrap_or_else(|| DEFAULT_NAMESPACE.to_owned()),
            function: var("AWS_LAMBDA_FUNCTION_NAME").unwrap_or_else(|| "local".to_owned()),
        }
    }
}

/// A metric value: a count, or several samples of one measurement.
#[derive(Debug, Clone, PartialEq)]
pub enum Sample {
    /// One value.
    One(f64),
    /// Up to 100 values (each is a sample for CloudWatch's statistics).
    Many(Vec<f64>),
}

/// One EMF document with the `Function` dimension.
pub fn document(target: &MetricsTarget, at: Millis, metrics: &[(&str, &str, Sample)]) -> Value {
    let mut root = Map::new();
    let mut definitions = Vec::new();
    for (name, unit, sample) in metrics {
        let value = match sample {
            Sample::One(v) => json!(v),
            // An empty sample list is left out: EMF wants at least one value.
            Sample::Many(values) if values.is_empty() => continue,
            Sample::Many(values) => json!(values),
        };
        definitions.push(json!({"Name": name, "Unit": unit}));
        root.insert((*name).to_owned(), value);
    }
    root.insert("Function".to_owned(), json!(target.function));
    root.insert(
        "_aws".to_owned(),
        json!({
            "Timestamp": at,
            "CloudWatchMetrics": [{
                "Namespace": target.namespace,
                "Dimensions": [["Function"]],
                "Metrics": definitions,
            }]
        }),
    );
    Value::Object(root)
}

/// Whether this invocation is the process's first (its cold start, see
/// [`crate::telemetry::take_cold_start`]); on it, prints the `ColdStart` document (1, dimension
/// `Function`) on its own stdout line.
pub fn cold_start(target: &MetricsTarget) -> bool {
    use crate::clock::Clock;
    let cold = crate::telemetry::take_cold_start();
    if cold {
        let now = crate::clock::SystemClock.now_ms();
        let doc = document(target, now, &[("ColdStart", "Count", Sample::One(1.0))]);
        println!("{doc}");
    }
    cold
}

/// Outcome labels ([`RecordOutcome::label`]) counted per invocation, and their metric names.
const OUTCOME_METRICS: [(&str, &str); 10] = [
    ("succeeded", "Succeeded"),
    ("failed_terminal", "FailedTerminal"),
    ("expired", "Expired"),
    ("cancelled", "Cancelled"),
    ("deferred", "DeferredToLiveOwner"),
    ("backoff", "Transient"),
    ("paced", "Paced"),
    ("poison", "Poison"),
    ("conflict", "Conflict"),
    ("awaiting_decision", "Unknown"),
];

/// The worker's document for one invocation: counts per outcome, provider latency, lease
/// renewals and lost ownerships.
pub fn invocation(target: &MetricsTarget, at: Millis, report: &BatchReport) -> Value {
    let count = |label: &str| {
        let n = report
            .records
            .iter()
            .filter(|r| r.outcome.label() == label)
            .count();
        Sample::One(n as f64)
    };
    let stats = &report.stats;
    let latencies = report.provider_latency_ms.iter().map(|&ms| ms as f64);
    let mut metrics = vec![("Records", "Count", Sample::One(report.records.len() as f64))];
    metrics.extend(
        OUTCOME_METRICS
            .iter()
            .map(|(label, name)| (*name, "Count", count(label))),
    );
    metrics.extend([
        ("Recovered", "Count", Sample::One(stats.recoveries as f64)),
        (
            "ProviderLatency",
            "Milliseconds",
            Sample::Many(latencies.collect()),
        ),
        (
            "LeaseRenewals",
            "Count",
            Sample::One(stats.lease_renewed as f64),
        ),
        (
            "LeaseRenewalsRefused",
            "Count",
            Sample::One(stats.lease_refused as f64),
        ),
        (
            "LostOwnerships",
            "Count",
            Sample::One(stats.ownership_lost as f64),
        ),
        (
            "DeadlineCutoffs",
            "Count",
            Sample::One(stats.deadline_cutoffs as f64),
        ),
        (
            "ProviderThrottled",
            "Count",
            Sample::One(stats.provider_throttled as f64),
        ),
        (
            "SpendDeferred",
            "Count",
            Sample::One(stats.spend_deferred as f64),
        ),
        (
            "UncontractedJobs",
            "Count",
            Sample::One(stats.uncontracted as f64),
        ),
        ("BatchLines", "Count", Sample::One(stats.batch_lines as f64)),
        ("BatchWaits", "Count", Sample::One(stats.batch_waits as f64)),
    ]);
    document(target, at, &metrics)
}

/// One document per provider and model the batch's ended attempts ran: `InputTokens` (every
/// input token, cached or not), `OutputTokens` and `Cost` (USD, at the price table's prices;
/// estimates included, left out for a model the table does not price), under the dimensions
/// `Function` and `Model`, and `Function`, `Provider` and `Model` (a job may fall back from one
/// provider to another).
pub fn usage_by_model(target: &MetricsTarget, at: Millis, report: &BatchReport) -> Vec<Value> {
    report
        .usage_by_model
        .iter()
        .map(|used| {
            let u = &used.usage;
            let mut metrics = vec![
                (
                    "InputTokens",
                    "Count",
                    Sample::One((u.input + u.cache_read + u.cache_write) as f64),
                ),
                ("OutputTokens", "Count", Sample::One(u.output as f64)),
            ];
            if let Some(micros) = u.cost_micros {
                metrics.push(("Cost", "None", Sample::One(micros as f64 / 1_000_000.0)));
            }
            let mut doc = document(target, at, &metrics);
            doc["Model"] = json!(used.model);
            doc["Provider"] = json!(used.provider);
            doc["_aws"]["CloudWatchMetrics"][0]["Dimensions"] =
                json!([["Function", "Model"], ["Function", "Provider", "Model"]]);
            doc
        })
        .collect()
}

/// One document per provider the batch's calls went to, with the dimensions `Function` and
/// `Provider`: `ProviderCalls`, `ProviderLatency` (milliseconds, up to 100 samples) and
/// `ProviderThrottled`.
pub fn by_provider(target: &MetricsTarget, at: Millis, report: &BatchReport) -> Vec<Value> {
    report
        .by_provider
        .iter()
        .map(|p| {
            let latencies = p.latency_ms.iter().map(|&ms| ms as f64).collect();
            let metrics = [
                ("ProviderCalls", "Count", Sample::One(p.calls as f64)),
                ("ProviderLatency", "Milliseconds", Sample::Many(latencies)),
                (
                    "ProviderThrottled",
                    "Count",
                    Sample::One(p.throttled as f64),
                ),
            ];
            let mut doc = document(target, at, &metrics);
            doc["Provider"] = json!(p.provider);
            doc["_aws"]["CloudWatchMetrics"][0]["Dimensions"] = json!([["Function", "Provider"]]);
            doc
        })
        .collect()
}

/// The reconciler's document for one run (`UnknownJobs` feeds the "stuck in unknown" alarm).
pub fn reconciliation(target: &MetricsTarget, at: Millis, report: &ReconcileReport) -> Value {
    let mut metrics = vec![
        ("Expired", "Count", Sample::One(report.expired as f64)),
        (
            "MessagesLost",
            "Count",
            Sample::One(report.message_lost as f64),
        ),
        ("Resent", "Count", Sample::One(report.resent as f64)),
        (
            "ResendFailed",
            "Count",
            Sample::One(report.send_failed as f64),
        ),
        ("Redriven", "Count", Sample::One(report.redriven as f64)),
        (
            "DeadLettersLeft",
            "Count",
            Sample::One(report.dead_letters_left as f64),
        ),
        ("UnknownJobs", "Count", Sample::One(report.unknown as f64)),
        (
            "ReconcileWalksCut",
            "Count",
            Sample::One(report.walks_cut as f64),
        ),
        (
            "OrphansRemoved",
            "Count",
            Sample::One(report.orphans_removed as f64),
        ),
        (
            "ReconcileErrors",
            "Count",
            Sample::One(report.errors as f64),
        ),
    ];
    // Left out when the sweep left no letter (SQS's own age of the DLQ's oldest message
    // leaves out a letter received three times, which the sweep's receives soon make all).
    if let Some(age) = report.dead_letter_age_s {
        metrics.push(("DeadLetterAge", "Seconds", Sample::One(age as f64)));
    }
    // Left out when there is nothing to forecast.
    if let Some(percent) = report.spend_forecast_percent {
        metrics.push((
            "SpendForecastPercent",
            "Percent",
            Sample::One(percent as f64),
        ));
    }
    document(target, at, &metrics)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::{Failure, InvalidMessage, JobState, RecordOutcome};
    use crate::report::RecordReport;

    /// The EMF specification's rules for a document: `_aws` with a numeric `Timestamp` and a
    /// `CloudWatchMetrics` array of directives, each with a non-empty `Namespace`, `Dimensions`
    /// as an array of arrays of at most 30 names, each present at the root as a string, and at
    /// most 100 `Metrics`, each with a `Name` present at the root as a number or an array of at
    /// most 100 numbers, and a `Unit` from CloudWatch's list.
    fn check_emf(doc: &Value) -> Result<(), String> {
        const UNITS: [&str; 27] = [
            "Seconds",
            "Microseconds",
            "Milliseconds",
            "Bytes",
            "Kilobytes",
            "Megabytes",
            "Gigabytes",
            "Terabytes",
            "Bits",
            "Kilobits",
            "Megabits",
            "Gigabits",
            "Terabits",
            "Percent",
            "Count",
            "Bytes/Second",
            "Kilobytes/Second",
            "Megabytes/Second",
            "Gigabytes/Second",
            "Terabytes/Second",
            "Bits/Second",
            "Kilobits/Second",
            "Megabits/Second",
            "Gigabits/Second",
            "Terabits/Second",
            "Count/Second",
            "None",
        ];
        let root = doc.as_object().ok_or("root is not an object")?;
        let aws = root
            .get("_aws")
            .and_then(Value::as_object)
            .ok_or("no _aws")?;
        if !aws.get("Timestamp").is_some_and(Value::is_u64) {
            return Err("Timestamp must be a non-negative integer".into());
        }
        let directives = aws
            .get("CloudWatchMetrics")
            .and_then(Value::as_array)
            .ok_or("no CloudWatchMetrics array")?;
        for d in directives {
            let ns = d.get("Namespace").and_then(Value::as_str).unwrap_or("");
            if ns.is_empty() || ns.len() > 1024 {
                return Err("Namespace must be 1 to 1024 characters".into());
            }
            for set in d
                .get("Dimensions")
                .and_then(Value::as_array)
                .ok_or("no Dimensions")?
            {
                let set = set.as_array().ok_or("a dimension set is not an array")?;
                if set.len() > 30 {
                    return Err("more than 30 dimensions".into());
                }
                for name in set {
                    let name = name.as_str().ok_or("dimension name not a string")?;
                    if !root.get(name).is_some_and(Value::is_string) {
                        return Err(format!("dimension {name} has no string value"));
                    }
                }
            }
            let metrics = d
                .get("Metrics")
                .and_then(Value::as_array)
                .ok_or("no Metrics")?;
            if metrics.len() > 100 {
                return Err("more than 100 metrics".into());
            }
            for m in metrics {
                let name = m
                    .get("Name")
                    .and_then(Value::as_str)
                    .ok_or("metric without Name")?;
                if let Some(unit) = m.get("Unit")
                    && !unit.as_str().is_some_and(|u| UNITS.contains(&u))
                {
                    return Err(format!("{name}: unit not allowed"));
                }
                match root.get(name) {
                    Some(Value::Number(_)) => {}
                    Some(Value::Array(values))
                        if !values.is_empty()
                            && values.len() <= 100
                            && values.iter().all(Value::is_number) => {}
                    _ => return Err(format!("{name} has no numeric value at the root")),
                }
            }
        }
        Ok(())
    }

    fn target() -> MetricsTarget {
        MetricsTarget {
            namespace: "Test".into(),
            function: "worker".into(),
        }
    }

    fn report(outcomes: Vec<RecordOutcome>, latencies: Vec<u64>) -> BatchReport {
        BatchReport {
            records: outcomes
                .into_iter()
                .map(|outcome| RecordReport {
                    message_id: Some("m".into()),
                    job_id: Some("j".into()),
                    outcome,
                    visibility_s: None,
                    job: None,
                    renewals: Default::default(),
                })
                .collect(),
            visibility: Default::default(),
            stats: Default::default(),
            provider_latency_ms: latencies,
            by_provider: Vec::new(),
            usage_by_model: Vec::new(),
            response: Ok(Vec::new()),
        }
    }

    #[test]
    fn each_model_gets_its_tokens_and_cost_under_its_own_dimension() {
        let mut r = report(vec![], vec![]);
        let used = |input, output, cost| crate::job::Usage {
            input,
            output,
            cache_read: 10,
            cost_micros: cost,
            ..crate::job::Usage::default()
        };
        let model = |provider, model: &str, usage| crate::report::ModelUsage {
            provider,
            model: model.to_owned(),
            usage,
        };
        r.usage_by_model = vec![
            model("openai", "gpt-4.1", used(100, 50, Some(1_500))),
            model("simulated", "in-house", used(7, 3, None)),
        ];
        let docs = usage_by_model(&target(), 1_000, &r);
        assert_eq!(docs.len(), 2);
        assert_eq!(docs[0]["Model"], "gpt-4.1");
        assert_eq!(docs[0]["InputTokens"], 110.0);
        assert_eq!(docs[0]["OutputTokens"], 50.0);
        assert_eq!(docs[0]["Cost"], 0.0015);
        assert_eq!(docs[0]["Provider"], "openai");
        assert_eq!(
            docs[0]["_aws"]["CloudWatchMetrics"][0]["Dimensions"],
            json!([["Function", "Model"], ["Function", "Provider", "Model"]])
        );
        for doc in &docs {
            check_emf(doc).expect("valid EMF");
        }
        // A model the table does not price has tokens and no cost.
        assert!(docs[1].get("Cost").is_none());
        assert!(usage_by_model(&target(), 1_000, &report(vec![], vec![])).is_empty());
    }

    #[test]
    fn each_provider_gets_its_calls_latencies_and_throttles_under_its_own_dimension() {
        let mut r = report(vec![], vec![]);
        r.by_provider = vec![
            crate::report::ProviderFigures {
                provider: "openai",
                calls: 2,
                latency_ms: vec![900, 1_100],
                throttled: 1,
            },
            crate::report::ProviderFigures {
                provider: "anthropic",
                calls: 1,
                latency_ms: vec![700],
                throttled: 0,
            },
        ];
        let docs = by_provider(&target(), 1_000, &r);
        assert_eq!(docs.len(), 2);
        assert_eq!(docs[0]["Provider"], "openai");
        assert_eq!(docs[0]["ProviderCalls"], 2.0);
        assert_eq!(docs[0]["ProviderLatency"], json!([900.0, 1100.0]));
        assert_eq!(docs[0]["ProviderThrottled"], 1.0);
        assert_eq!(docs[1]["Provider"], "anthropic");
        for doc in &docs {
            check_emf(doc).expect("valid EMF");
            let dims = &doc["_aws"]["CloudWatchMetrics"][0]["Dimensions"];
            assert_eq!(dims, &json!([["Function", "Provider"]]));
        }
    }

    #[test]
    fn an_invocation_document_meets_the_emf_rules_and_counts_outcomes() {
        let r = report(
            vec![
                RecordOutcome::Done(JobState::Succeeded),
                RecordOutcome::Done(JobState::Succeeded),
                RecordOutcome::Failed(Failure::Deferred { remaining_ms: 5 }),
                RecordOutcome::Failed(Failure::AwaitingDecision),
            ],
            vec![120, 340],
        );
        let mut r = r;
        r.stats.provider_throttled = 3;
        r.stats.batch_lines = 7;
        let doc = invocation(&target(), 1_700_000_000_000, &r);
        check_emf(&doc).expect("valid EMF");
        assert_eq!(doc["ProviderThrottled"], 3.0);
        assert_eq!(doc["BatchLines"], 7.0);
        assert_eq!(doc["BatchWaits"], 0.0);
        assert_eq!(doc["Succeeded"], 2.0);
        assert_eq!(doc["DeferredToLiveOwner"], 1.0);
        assert_eq!(doc["Unknown"], 1.0);
        assert_eq!(doc["Poison"], 0.0);
        assert_eq!(doc["ProviderLatency"], json!([120.0, 340.0]));
        assert_eq!(doc["_aws"]["CloudWatchMetrics"][0]["Namespace"], "Test");
    }

    #[test]
    fn every_outcome_metric_counts_a_real_outcome() {
        let one_of_each = vec![
            RecordOutcome::Done(JobState::Succeeded),
            RecordOutcome::Done(JobState::FailedTerminal),
            RecordOutcome::Done(JobState::Expired),
            RecordOutcome::Done(JobState::Cancelled),
            RecordOutcome::Failed(Failure::Deferred { remaining_ms: 1 }),
            RecordOutcome::Failed(Failure::Backoff {
                retry_after_ms: None,
                cause: "x",
            }),
            RecordOutcome::Failed(Failure::Paced { wait_ms: 1 }),
            RecordOutcome::Failed(Failure::Poison(InvalidMessage::MissingBody)),
            RecordOutcome::Failed(Failure::Conflict {
                ledger_digest: "a".into(),
                message_digest: "b".into(),
            }),
            RecordOutcome::Failed(Failure::AwaitingDecision),
        ];
        let doc = invocation(&target(), 1, &report(one_of_each, Vec::new()));
        for (_, name) in OUTCOME_METRICS {
            assert_eq!(doc[name], 1.0, "{name}");
        }
    }

    #[test]
    fn no_latency_samples_means_no_latency_metric() {
        let doc = invocation(&target(), 1, &report(Vec::new(), Vec::new()));
        check_emf(&doc).expect("valid EMF");
        assert!(doc.get("ProviderLatency").is_none());
        let names: Vec<&str> = doc["_aws"]["CloudWatchMetrics"][0]["Metrics"]
            .as_array()
            .expect("metrics")
            .iter()
            .filter_map(|m| m["Name"].as_str())
            .collect();
        assert!(!names.contains(&"ProviderLatency"));
    }

    #[test]
    fn the_spend_forecast_is_a_metric_only_when_there_is_one() {
        let none = reconciliation(&target(), 5, &ReconcileReport::default());
        check_emf(&none).expect("valid EMF");
        assert!(none.get("SpendForecastPercent").is_none());
        let report = ReconcileReport {
            spend_forecast_percent: Some(120),
            ..ReconcileReport::default()
        };
        let some = reconciliation(&target(), 5, &report);
        check_emf(&some).expect("valid EMF");
        assert_eq!(some["SpendForecastPercent"], 120.0);
    }

    #[test]
    fn the_checker_rejects_what_the_spec_rejects() {
        let good = reconciliation(&target(), 5, &ReconcileReport::default());
        check_emf(&good).expect("valid EMF");
        let mut no_value = good.clone();
        no_value
            .as_object_mut()
            .expect("object")
            .remove("UnknownJobs");
        assert!(check_emf(&no_value).is_err());
        let mut no_dimension = good.clone();
        no_dimension
            .as_object_mut()
            .expect("object")
            .remove("Function");
        assert!(check_emf(&no_dimension).is_err());
        let mut bad_time = good;
        bad_time["_aws"]["Timestamp"] = json!("now");
        assert!(check_emf(&bad_time).is_err());
    }
}
