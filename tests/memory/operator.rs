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
        stderr.contains("--table or JOBS_TABLE is required"),
        "{stderr}"
    );
}
