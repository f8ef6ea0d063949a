//! The operator's path without the emulator: a re-trigger names only the job, and the worker
//! rebuilds it from the ledger with the same digest; `jobctl` says what to set when the region
//! or the table is missing.

use fenced_jobs::job::JobState;

use crate::support::job;

#[test]
fn a_re_trigger_names_the_job_and_the_worker_reads_it_back_with_the_same_digest() {
    let body = job("t-1", "hello", r#""parameters":{"temperature":0}"#);
    let msg = fenced_jobs::job::parse_body(Some(&body)).expect("valid");
    let record = fenced_jobs::job::NewJob {
        class: Default::default(),
        job_id: msg.job_id.clone(),
        input_digest: msg.digest.clone(),
        contract: msg.contract.clone(),
        input: msg.input_canonical.clone(),
        input_ref: None,
        metadata: Some(r#"{"trace":"x"}"#.into()),
        deadline_at: 1_900_000_000_000,
        max_attempts: 4,
        max_cost_micros: None,
        expires_at: 0,
    }
    .into_record(JobState::RetryAuthorized, 0);
    // The operator's trigger carries only the id ...
    let trigger = fenced_jobs::queue::Outgoing::by_id(&record.job_id);
    assert_eq!(
        fenced_jobs::job::parse_trigger(Some(&trigger.body)).expect("valid"),
        fenced_jobs::job::Trigger::Ref("t-1".to_owned())
    );
    // ... and the worker rebuilds the job from the ledger: same digest, deadline, budget.
    let again = fenced_jobs::job::JobMessage::from_record(&record);
    assert_eq!(again.digest, msg.digest);
    assert_eq!(
        (again.deadline_at, again.max_attempts),
        (Some(1_900_000_000_000), Some(4))
    );
    assert_eq!(again.metadata.as_deref(), Some(r#"{"trace":"x"}"#));
}

#[test]
fn jobctl_says_what_to_set_when_the_region_or_the_table_is_missing() {
    let run = |region: Option<&str>, table: &str| {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_jobctl"));
        cmd.args(["show", "job-1", "--table", table])
            .env_remove("AWS_REGION")
            .env_remove("AWS_DEFAULT_REGION")
            .env_remove("JOBS_TABLE")
            .env("AWS_CONFIG_FILE", "/nonexistent/config")
            .env("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/credentials");
        if let Some(region) = region {
            cmd.env("AWS_REGION", region);
        }
        let out = cmd.output().expect("jobctl runs");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, stderr) = run(None, "jobs");
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("set AWS_REGION, or --region"), "{stderr}");
    let (code, stderr) = run(Some("us-east-1"), "");
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("--table, JOBS_TABLE or --stack is required"),
        "{stderr}"
    );
}

/// `jobctl submit` holds each line to the worker's own rules, read from the worker's own
/// variables: a job the worker would refuse at its first sight (a model not allowed, a tenant
/// its producer may not name, an unknown producer's id) is refused before anything is written
/// or sent, with its reason, and an allowed job of a named producer goes by its whole id.
#[tokio::test]
async fn submit_refuses_what_the_worker_would_refuse_before_writing_anything() {
    use fenced_jobs::clock::{Clock, SystemClock};
    use fenced_jobs::ledger::JobLedger;
    use fenced_jobs::ledger::memory::InMemoryLedger;
    use fenced_jobs::ops::producer::{Intake, submit};
    use fenced_jobs::queue::triggers::RecordingTriggers;
    let vars = [
        ("PRODUCERS", "billing=AROABILLING"),
        ("PRODUCER_TENANTS", "billing=acme"),
        ("ALLOWED_MODELS", "m"),
    ];
    let rules = fenced_jobs::config::producer_rules(|name| {
        vars.iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| (*v).to_owned())
    })
    .expect("rules");
    let line = |id: &str, tenant: &str, model: &str| {
        serde_json::json!({"job_id": id, "tenant": tenant, "contract": "c",
            "input": {"model": model, "prompt": "p"}})
        .to_string()
    };
    let file = [
        line("billing/ok", "acme", "m"),
        line("billing/other-tenant", "globex", "m"),
        line("billing/big-model", "acme", "big"),
        line("stranger/job", "acme", "m"),
        line("unnamed", "globex", "m"),
    ]
    .join("\n");
    let ledger = InMemoryLedger::new();
    let triggers = RecordingTriggers::new();
    let report = submit(
        &ledger,
        &triggers,
        file.lines().map(|l| Ok(l.to_owned())),
        || SystemClock.now_ms(),
        &Intake {
            rules,
            ..Intake::default()
        },
        |_| {},
    )
    .await;
    let refused: Vec<(u64, &str)> = report
        .invalid
        .iter()
        .map(|(n, why)| (*n, why.as_str()))
        .collect();
    assert_eq!(refused.len(), 3, "{refused:?}");
    assert!(
        refused[0].0 == 2 && refused[0].1.contains("PRODUCER_TENANTS"),
        "{refused:?}"
    );
    assert!(
        refused[1].0 == 3 && refused[1].1.contains("ALLOWED_MODELS"),
        "{refused:?}"
    );
    assert_eq!(refused[2].0, 4, "{refused:?}");
    // The unnamed producer lists no tenants: its job goes in, by its own id.
    assert_eq!((report.created, report.sent), (2, 2));
    for id in ["billing/other-tenant", "billing/big-model", "stranger/job"] {
        assert!(ledger.get(id).await.expect("get").is_none(), "{id}");
    }
    assert!(ledger.get("billing/ok").await.expect("get").is_some());
    assert!(ledger.get("unnamed").await.expect("get").is_some());
    assert_eq!(triggers.sent().len(), 2);
}
