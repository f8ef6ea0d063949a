//! `jobctl` as people who use the AWS CLI expect it: `--output json|text|table`, `--query`
//! (JMESPath) over each result's JSON form, `--out-file` for files, the global options under a
//! heading of their own, `--debug` that never logs a credential, and a `watch` that tells a
//! timeout from a failure.

use fenced_jobs::provider::SimulatedProvider;

use crate::support::{Ran, deliver, emulator, fast_settings, job};

/// Runs jobctl against the emulator's `table` with `args` and the environment `env`.
fn jobctl(table: &str, args: &[&str], env: &[(&str, &str)]) -> Ran {
    crate::support::jobctl(&[args, &["--table", table]].concat(), env)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobctl_prints_and_queries_as_the_aws_cli_does() {
    // GIVEN a job that succeeded, and one submitted that no worker runs
    let aws = emulator().await;
    let table = aws.table().await;
    let queue = aws.queue(30).await;
    let handler = aws.handler(&table, SimulatedProvider::new(), fast_settings());
    let source = aws.source(&queue).await;
    aws.send(&queue, &job("q-ok", "fine", "")).await;
    deliver(&source, &handler).await;
    let dir = std::env::temp_dir().join(format!("jobctl-cli-{table}"));
    std::fs::create_dir_all(&dir).expect("dir");
    let lines = dir.join("jobs.jsonl");
    std::fs::write(&lines, job("q-waits", "later", "") + "\n").expect("write");
    let lines = lines.to_str().expect("path");
    let submitted = jobctl(&table, &["submit", lines, "--queue-url", &queue.url], &[]);
    assert_eq!(submitted.code, 0, "{}", submitted.err);
    let run = |args: &[&str]| jobctl(&table, args, &[]);

    // THEN --output json prints the JSON form, and --json still does
    let listed = run(&["list", "--state", "ready", "--output", "json"]);
    let rows: serde_json::Value = serde_json::from_str(&listed.out).expect("json");
    assert_eq!(rows[0]["job_id"], "q-waits", "{rows}");
    let old: serde_json::Value = serde_json::from_str(&run(&["--json", "show", "q-ok"]).out)
        .expect("--json is --output json");
    assert_eq!(old["state"], "succeeded");
    // AND --output table draws it, a column a key
    let drawn = run(&["list", "--state", "ready", "--output", "table"]).out;
    assert!(
        drawn.contains("| job_id ") && drawn.contains("| q-waits "),
        "{drawn}"
    );
    // AND --query picks from the JSON form: JSON by default, bare with --output text
    assert_eq!(
        run(&["show", "q-ok", "--query", "state"]).out,
        "\"succeeded\"\n"
    );
    let bare = run(&[
        "show",
        "q-ok",
        "--query",
        "[state, owner_epoch]",
        "--output",
        "text",
    ]);
    assert_eq!(bare.out, "succeeded\t1\n");
    let ids = run(&[
        "list",
        "--state",
        "ready",
        "--query",
        "[].job_id",
        "--output",
        "text",
    ]);
    assert_eq!(ids.out, "q-waits\n");
    // AND a query that does not parse is a usage error, before any AWS call
    let broken = run(&["show", "q-ok", "--query", "state["]);
    assert_eq!(broken.code, 2, "{}", broken.err);
    assert!(broken.err.contains("--query"), "{}", broken.err);
    // AND a file is --out-file; --output takes a format only
    let file = dir.join("answer.txt");
    let saved = run(&["result", "q-ok", "--out-file", file.to_str().expect("path")]);
    assert_eq!(saved.code, 0, "{}", saved.err);
    assert!(!std::fs::read(&file).expect("written").is_empty());
    assert_eq!(run(&["result", "q-ok", "--output", "answer.txt"]).code, 2);

    // THEN a watch that times out on a live job is not a failed job: its own status
    let waited = run(&["watch", "q-waits", "--timeout", "1", "--interval", "1"]);
    assert_eq!(waited.code, 5, "{}", waited.err);
    assert!(
        waited.out.contains("ready") && waited.out.contains("+0s"),
        "{}",
        waited.out
    );
    assert_eq!(run(&["watch", "q-ok"]).code, 0);
    std::fs::remove_dir_all(&dir).expect("cleaned");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobctl_help_sets_the_global_options_apart_and_debug_logs_no_credential() {
    let aws = emulator().await;
    let table = aws.table().await;
    // The global options under their own heading, in every subcommand's help.
    for args in [&["--help"][..], &["list", "--help"][..]] {
        let help = jobctl(&table, args, &[]);
        assert_eq!(help.code, 0);
        let (own, global) = help.out.split_once("Global options:").expect("a heading");
        assert!(
            global.contains("--output") && global.contains("--query"),
            "{}",
            help.out
        );
        assert!(!own.contains("--endpoint-url"), "{}", help.out);
    }
    // --debug says what the SDK does, and never the credentials it signs with.
    let secrets = [
        ("AWS_ACCESS_KEY_ID", "AKIDDEBUGTESTKEY"),
        ("AWS_SECRET_ACCESS_KEY", "debug-test-secret-key"),
        ("AWS_SESSION_TOKEN", "debug-test-session-token"),
    ];
    let debug = jobctl(&table, &["show", "nobody", "--debug"], &secrets);
    assert_eq!(debug.code, 1, "no such job: {}", debug.err);
    assert!(
        debug.err.contains("beginning attempt #1") && debug.err.contains("resolving endpoint"),
        "the SDK's progress: {}",
        debug.err
    );
    assert!(
        !debug.err.contains('\u{1b}'),
        "no colour codes off a terminal"
    );
    for (_, secret) in &secrets[1..] {
        assert!(
            !debug.err.contains(secret),
            "{secret} logged: {}",
            debug.err
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobctl_reads_a_stacks_outputs_and_an_option_given_wins() {
    // GIVEN a deployed stack whose outputs name the table and the work queue
    let aws = emulator().await;
    let table = aws.table().await;
    let queue = aws.queue(30).await;
    let stack = crate::support::unique("jobs-stack");
    let template = serde_json::json!({
        "Resources": {"Marker": {"Type": "AWS::SQS::Queue"}},
        "Outputs": {
            "JobsTableName": {"Value": table},
            "QueueUrl": {"Value": queue.url},
        }
    });
    aws_sdk_cloudformation::Client::new(&aws.config)
        .create_stack()
        .stack_name(&stack)
        .template_body(template.to_string())
        .send()
        .await
        .expect("a stack");
    let run = |args: &[&str]| {
        let ran = crate::support::jobctl(args, &[]);
        (Some(ran.code), ran.out, ran.err)
    };
    let dir = std::env::temp_dir().join(format!("jobctl-stack-{table}"));
    std::fs::create_dir_all(&dir).expect("dir");
    let lines = dir.join("jobs.jsonl");
    std::fs::write(&lines, job("s-1", "from the stack", "") + "\n").expect("write");

    // WHEN jobctl is given the stack alone, THEN the table and the queue are the stack's
    let lines = lines.to_str().expect("path");
    let (code, _, err) = run(&["--stack", &stack, "submit", lines]);
    assert_eq!(code, Some(0), "{err}");
    let (code, out, err) = run(&[
        "--stack", &stack, "list", "--state", "ready", "--output", "json",
    ]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("s-1"), "{out}");
    assert_eq!(
        aws.peek(&queue.url, 0).await.len(),
        1,
        "the trigger went to the stack's queue"
    );
    // AND an option given wins over the stack's output
    let (code, _, err) = run(&["--stack", &stack, "--table", "no-such-table", "show", "s-1"]);
    assert_eq!(code, Some(3), "{err}");
    assert!(err.contains("--table"), "{err}");
    // AND a stack that is not there is said so, before anything else
    let (code, _, err) = run(&["--stack", "no-such-stack", "list"]);
    assert_eq!(code, Some(3));
    assert!(err.contains("no-such-stack"), "{err}");
    std::fs::remove_dir_all(&dir).expect("cleaned");
}
