//! `make invoke` as a user runs it: the worker and the dispatcher under cargo-lambda's Lambda
//! runtime emulator, against the local emulator, with every sample event in `events/`, each
//! answering what `events/README.md` says (`scripts/invoke.sh --check`). The binaries are the
//! ones this test build made. Needs cargo-lambda in `.venv` (`make test` installs it).

use std::path::Path;
use std::process::{Command, Output};

use crate::support;

fn invoke(args: &[&str]) -> Output {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let events: Vec<String> = std::fs::read_dir(root.join("events"))
        .expect("events/")
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .map(|p| p.display().to_string())
        .collect();
    assert!(events.len() >= 5, "sample events: {events:?}");
    Command::new(root.join("scripts/invoke.sh"))
        .args(args)
        .args(&events)
        .current_dir(root)
        .env("WORKER_BIN", env!("CARGO_BIN_EXE_worker"))
        .env("DISPATCHER_BIN", env!("CARGO_BIN_EXE_dispatcher"))
        .output()
        .expect("run scripts/invoke.sh")
}

fn text(out: &Output) -> String {
    format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn every_sample_event_gets_its_documented_answer_under_cargo_lambda() {
    // GIVEN every sample event, WHEN each is invoked as `make invoke` does,
    // THEN each answer and its effects are the ones events/README.md documents.
    let out = invoke(&["--check"]);
    assert!(out.status.success(), "{}", text(&out));
}

#[tokio::test]
async fn the_check_fails_when_the_function_uses_a_table_the_run_did_not_create() {
    // GIVEN the functions pointed at a table other than the one this run created (what a
    // `[package.metadata.lambda.env]` naming a table did under `cargo lambda watch`),
    let emulator = support::emulator().await;
    let elsewhere = emulator.table().await;
    // WHEN the sample events are invoked and checked,
    let out = invoke(&["--check", "--function-table", &elsewhere]);
    // THEN the check fails and says why, and the jobs are in the other table.
    let said = text(&out);
    assert!(!out.status.success(), "{said}");
    assert!(said.contains("absent in jobs-invoke-"), "{said}");
    let job = emulator.item(&elsewhere, "summary-2026-11-29-0001").await;
    assert_eq!(job.state, fenced_jobs::job::JobState::Succeeded);
}
