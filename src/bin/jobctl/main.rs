//! `jobctl`: the operator's command line over the job ledger.
//!
//! Exit status: 0 done; 1 refused or partial (no such job, not in a state the command acts on,
//! changed meanwhile, some lines not submitted, a watched job that did not succeed); 2 usage;
//! 3 an AWS call failed; 4 a stored answer is not the content its acceptance recorded; 5 a
//! watch gave up waiting on a job still live.

use clap::{Parser, Subcommand};
use fenced_jobs::blobs::s3::S3Blobs;
use fenced_jobs::config::s3_client;
use fenced_jobs::ledger::dynamodb::DynamoLedger;
use fenced_jobs::ops::operator::OperatorError;

mod commands;
mod output;
mod progress;
mod run;
mod stack;
mod watch;

/// The heading of the options every subcommand takes.
const GLOBAL: &str = "Global options";

/// Exit status when a command was refused, or did only part of its work.
pub(crate) const REFUSED: i32 = 1;
/// Exit status of a usage error (clap's too).
pub(crate) const USAGE: i32 = 2;
/// Exit status when an AWS call failed.
pub(crate) const AWS_ERROR: i32 = 3;
/// Exit status when a stored answer is not the content its acceptance recorded: not a failure
/// to try again, but a bucket someone changed.
pub(crate) const INTEGRITY: i32 = 4;
/// Exit status when `watch` gave up waiting (`--timeout`) on a job that is not terminal yet:
/// not a failure of the job.
pub(crate) const TIMED_OUT: i32 = 5;

/// Ends the process with a usage error.
pub(crate) fn usage(what: &str) -> ! {
    eprintln!("jobctl: {what}");
    std::process::exit(USAGE)
}

/// Inspect jobs and decide about the ones whose last attempt has an unknown outcome.
#[derive(Parser)]
#[command(version)]
struct Cli {
    /// The deployed stack: its outputs (CloudFormation `DescribeStacks`) are the defaults of
    /// the table, the queues, the buckets and the event target (an option or its variable
    /// wins).
    #[arg(long, global = true, help_heading = GLOBAL)]
    stack: Option<String>,
    /// The ledger table.
    #[arg(long, env = "JOBS_TABLE", global = true, help_heading = GLOBAL)]
    table: Option<String>,
    /// The named profile of your AWS configuration (SSO and credential_process profiles need
    /// jobctl built with `--features cli`).
    #[arg(long, env = "AWS_PROFILE", global = true, help_heading = GLOBAL)]
    profile: Option<String>,
    /// The AWS Region.
    #[arg(long, global = true, help_heading = GLOBAL)]
    region: Option<String>,
    /// Send every AWS request to this endpoint (a local emulator, a VPC endpoint).
    #[arg(long, global = true, help_heading = GLOBAL)]
    endpoint_url: Option<String>,
    /// The results bucket: large answers are read from it, large inputs written to it.
    #[arg(long, env = "RESULTS_BUCKET", global = true, help_heading = GLOBAL)]
    results_bucket: Option<String>,
    /// Answers and inputs above this many bytes are kept in the results bucket.
    #[arg(long, env = "INLINE_MAX_BYTES", global = true, help_heading = GLOBAL, default_value_t = fenced_jobs::job::DEFAULT_INLINE_MAX_BYTES)]
    inline_max_bytes: usize,
    /// How results print: json, text (lines for people; the default) or table (the JSON form
    /// as a table).
    #[arg(long, value_enum, global = true, help_heading = GLOBAL)]
    output: Option<output::Format>,
    /// A JMESPath expression over each result's JSON form (`--query 'items[].name'`), as the
    /// AWS CLI's; prints JSON unless `--output` says otherwise.
    #[arg(long, global = true, help_heading = GLOBAL)]
    query: Option<String>,
    /// `--output json`, as earlier versions spelled it.
    #[arg(long, global = true, hide = true)]
    json: bool,
    /// Log each AWS request's progress to standard error (never credentials, nor what the
    /// requests carry).
    #[arg(long, global = true, help_heading = GLOBAL)]
    debug: bool,
    /// The urgent queue: triggers of urgent jobs go there (the stack's `UrgentQueue`).
    #[arg(long, env = "URGENT_QUEUE_URL", global = true, help_heading = GLOBAL)]
    urgent_queue_url: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Show a job: state, epoch, lease, deadline, attempts, recoveries and decisions.
    Show {
        /// The job id.
        job_id: String,
        /// Include the accepted answer.
        #[arg(long)]
        result: bool,
    },
    /// List the jobs in one state, oldest update first (a query of the sparse attention index,
    /// not a scan; terminal states are not indexed).
    List {
        /// ready, running, unknown or retry_authorized.
        #[arg(long, default_value = "unknown")]
        state: String,
        /// At most this many.
        #[arg(long, default_value_t = 50)]
        limit: usize,
    },
    /// Authorise another attempt of an `unknown` job (accepting a possible duplicate call),
    /// then send it a new trigger message.
    AuthorizeRetry {
        /// The job id.
        job_id: String,
        /// Why (recorded on the job).
        #[arg(long)]
        reason: String,
        /// Who decides (recorded on the job).
        #[arg(long, env = "USER", default_value = "operator")]
        operator: String,
        /// The queue to send the trigger to.
        #[arg(long, env = "QUEUE_URL")]
        queue_url: String,
    },
    /// Dead-letter queue: each message paired with its job's ledger state.
    Dlq {
        #[command(subcommand)]
        command: DlqCommand,
        /// The dead-letter queue.
        #[arg(long, env = "DLQ_URL")]
        dlq_url: String,
        /// At most this many messages.
        #[arg(long, default_value_t = 100)]
        max: usize,
        /// The deployment's producers, as the worker's `PRODUCERS` (the stack's `Producers`):
        /// a letter a producer sent is judged in its namespace, and what it says in attributes
        /// named like the worker's is not believed.
        #[arg(long, env = "PRODUCERS", default_value = "")]
        producers: String,
        /// The principal ids whose dead letters are believed (`ID,...`): the worker's role
        /// (the stack's `TrustedSenders` output lists it with the reconciler's and the
        /// operators'). A letter from anyone else is judged as a stranger's.
        #[arg(long, env = "TRUSTED_SENDERS", default_value = "")]
        trusted_senders: String,
    },
    /// Submit jobs (one JSON object a line, from FILE or stdin): each is written to the ledger
    /// as `ready` unless it is there, then its trigger is sent.
    Submit {
        /// The JSONL file; `-` or nothing for stdin.
        file: Option<std::path::PathBuf>,
        /// The work queue.
        #[arg(long, env = "QUEUE_URL")]
        queue_url: String,
    },
    /// Print a job's accepted answer, from the ledger item or from the results bucket (checked
    /// against the size and SHA-256 its acceptance recorded).
    Result {
        /// The job id.
        job_id: String,
        /// Write it to FILE instead of standard output (a new file, readable by its owner
        /// only).
        #[arg(long, value_name = "FILE")]
        out_file: Option<std::path::PathBuf>,
        /// Replace FILE if it exists.
        #[arg(long, requires = "out_file")]
        force: bool,
    },
    /// Write the jobs that finished since a time as JSON lines (job id, state, metadata, answer
    /// or its reference, or the error), read day by day from the finished index, not a scan.
    /// For a dump of the whole table use DynamoDB's export to S3.
    Export {
        /// succeeded, failed_terminal, expired or cancelled (default: all four).
        #[arg(long)]
        state: Option<String>,
        /// RFC 3339 time (default: 24 hours ago).
        #[arg(long)]
        since: Option<String>,
        /// Write to FILE instead of standard output (a new file, readable by its owner only;
        /// none is left if the export fails).
        #[arg(long, value_name = "FILE")]
        out_file: Option<std::path::PathBuf>,
        /// Replace FILE if it exists.
        #[arg(long, requires = "out_file")]
        force: bool,
    },
    /// The day's spend against the daily limits: the deployment's, each producer's and each
    /// account's, what calls not charged yet hold of it, and each one's spend by model and by
    /// path (read from the day's items through the due index, not a scan). A day is counted at
    /// the levels a limit is set for.
    Spend {
        /// The day, `YYYY-MM-DD` (UTC; default: today).
        #[arg(long)]
        day: Option<String>,
        /// A month instead, `YYYY-MM` (UTC): its days summed, up to today.
        #[arg(long, conflicts_with = "day")]
        month: Option<String>,
        /// The work queue: today's forecast counts the jobs waiting in it (and in the urgent
        /// queue) at what today's calls cost on average.
        #[arg(long, env = "QUEUE_URL")]
        queue_url: Option<String>,
    },
    /// Re-send lost triggers, expire jobs past their deadline, count `unknown` jobs.
    Reconcile {
        /// The work queue.
        #[arg(long, env = "QUEUE_URL")]
        queue_url: String,
        /// Re-send `ready` jobs unchanged and unsent for this long.
        #[arg(long, default_value_t = 300)]
        ready_after_seconds: i64,
        /// Re-send `retry_authorized` jobs unchanged for this long.
        #[arg(long, default_value_t = 1200)]
        retry_after_seconds: i64,
    },
    /// Give an `unknown` job up: `failed_terminal`. Asks for confirmation on a terminal; needs
    /// `--yes` elsewhere.
    Fail {
        /// The job id.
        job_id: String,
        /// Why (recorded on the job).
        #[arg(long)]
        reason: String,
        /// Who decides (recorded on the job).
        #[arg(long, env = "USER", default_value = "operator")]
        operator: String,
        /// Do not ask.
        #[arg(long)]
        yes: bool,
    },
    /// Cancel jobs: one that nobody runs (ready, retry_authorized, unknown) is `cancelled` at
    /// once; a running one is asked to stop, and its owner cancels the call (upstream where
    /// the provider can) and ends it `cancelled` at its next lease renewal. Asks for
    /// confirmation on a terminal; needs `--yes` elsewhere.
    Cancel {
        /// The job ids.
        job_ids: Vec<String>,
        /// Also each job id in FILE, one a line (`-`: stdin).
        #[arg(long)]
        file: Option<std::path::PathBuf>,
        /// Also every live job of this account (a producer's tenant, `billing/acme`; the
        /// unnamed producer's `acme`) the attention or due index lists (a running job on its
        /// first claim whose message SQS keeps is in neither until that attempt ends: run it
        /// again then).
        #[arg(long)]
        tenant: Option<String>,
        /// Why (recorded on each job).
        #[arg(long)]
        reason: String,
        /// Who cancels (recorded on each job).
        #[arg(long, env = "USER", default_value = "operator")]
        operator: String,
        /// Do not ask.
        #[arg(long)]
        yes: bool,
    },
    /// Follow a job until it is terminal, printing each change (with the time since the watch
    /// began and the owner's lease); exit 0 if it succeeded, 1 if it ended otherwise, 5 if
    /// `--timeout` passed first.
    Watch {
        /// The job id.
        job_id: String,
        /// Seconds between two reads.
        #[arg(long, default_value_t = 2)]
        interval: u64,
        /// Give up after this many seconds (0: never), with exit status 5.
        #[arg(long, default_value_t = 0)]
        timeout: u64,
    },
    /// Completion events: publish again those the dispatcher gave up on.
    Events {
        #[command(subcommand)]
        command: EventsCommand,
        /// Publish to this EventBridge bus (or EVENT_TOPIC_ARN, EVENT_QUEUE_URL: exactly one).
        #[arg(long, env = "EVENT_BUS_NAME")]
        event_bus_name: Option<String>,
        /// Publish to this SNS topic.
        #[arg(long, env = "EVENT_TOPIC_ARN")]
        event_topic_arn: Option<String>,
        /// Publish to this SQS queue.
        #[arg(long, env = "EVENT_QUEUE_URL")]
        event_queue_url: Option<String>,
    },
    /// Print a completion script for a shell (`jobctl completions bash > /etc/bash_completion.d/jobctl`).
    Completions {
        /// bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
}

#[derive(Subcommand)]
enum EventsCommand {
    /// For each message of the dispatcher's failure queue (a stream batch Lambda gave up on),
    /// announce again every job that finished, or became `unknown`, while that batch's records
    /// arrived, then delete the message; or announce the jobs given with --job. Event ids are
    /// the dispatcher's, so consumers drop what they already had.
    Replay {
        /// The dispatcher's failure queue (the stack's `DispatchFailureQueue`).
        #[arg(
            long,
            env = "DISPATCH_FAILURE_QUEUE_URL",
            required_unless_present = "job"
        )]
        queue_url: Option<String>,
        /// Announce this job as it stands instead (repeatable).
        #[arg(long)]
        job: Vec<String>,
        /// At most this many failure messages.
        #[arg(long, default_value_t = 100)]
        max: usize,
        /// Count what would be published; publish and delete nothing.
        #[arg(long)]
        dry_run: bool,
    },
}

#[derive(Subcommand)]
enum DlqCommand {
    /// Show what a redrive would do with each message (they stay in the DLQ, visible).
    Inspect,
    /// Move the messages whose jobs are not terminal back to the work queue.
    Redrive {
        /// The work queue.
        #[arg(long, env = "QUEUE_URL")]
        queue_url: String,
        /// Show what would move; move nothing.
        #[arg(long)]
        dry_run: bool,
    },
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    use clap::{CommandFactory, FromArgMatches};
    let args: Vec<String> = std::env::args().collect();
    let flag = |name| stack::flag(&args, name);
    // With a stack, its outputs become the options' defaults before the line is parsed.
    let mut command = Cli::command();
    let mut config = None;
    if let Some(name) = flag("--stack") {
        let early = aws_config(flag("--profile"), flag("--region"), flag("--endpoint-url")).await;
        match stack::outputs(&early, &name).await {
            Ok(outputs) => command = stack::fill(command, &outputs),
            Err(e) => {
                eprintln!("jobctl: the outputs of stack {name} could not be read: {e}");
                std::process::exit(AWS_ERROR);
            }
        }
        config = Some(early);
    }
    let matches = command.get_matches_from(&args);
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    if let Command::Completions { shell } = cli.command {
        clap_complete::generate(shell, &mut Cli::command(), "jobctl", &mut std::io::stdout());
        return;
    }
    let format = cli.output.or(cli.json.then_some(output::Format::Json));
    let out = output::Out::new(format, cli.query.as_deref()).unwrap_or_else(|e| usage(&e));
    if cli.debug {
        debug_to_stderr();
    }
    let config = match config {
        Some(config) => config,
        None => {
            let (profile, region) = (cli.profile.clone(), cli.region.clone());
            aws_config(profile, region, cli.endpoint_url.clone()).await
        }
    };
    let table = cli
        .table
        .clone()
        .filter(|t| !t.trim().is_empty())
        .unwrap_or_else(|| {
            usage("--table, JOBS_TABLE or --stack is required: the ledger table's name")
        });
    let ctx = run::Ctx {
        ledger: DynamoLedger::new(aws_sdk_dynamodb::Client::new(&config), &table),
        blobs: S3Blobs::new(s3_client(&config), cli.results_bucket.clone()),
        out,
        urgent_queue_url: cli.urgent_queue_url.clone(),
        inline_max_bytes: cli.inline_max_bytes,
        config,
    };
    if let Err(e) = run::command(&ctx, cli.command).await {
        eprintln!("jobctl: {e}");
        if let Some(hint) = hint(&e) {
            eprintln!("jobctl: {hint}");
        }
        std::process::exit(match e {
            OperatorError::NotFound(_)
            | OperatorError::NotUnknown { .. }
            | OperatorError::Terminal { .. }
            | OperatorError::Changed(_) => REFUSED,
            OperatorError::Ledger(_) | OperatorError::NotSent(_) | OperatorError::Queue(_) => {
                AWS_ERROR
            }
        });
    }
}

/// `--debug`: jobctl's and the AWS SDK's progress (each request's operation, endpoint, retries
/// and timing) to standard error. Request signing logs nothing (its canonical request carries a
/// session token), nor does anything log what requests and answers carry (the SDK logs those
/// only at `trace`).
fn debug_to_stderr() {
    let filter = tracing_subscriber::EnvFilter::new(
        "info,jobctl=debug,fenced_jobs=debug,aws_config=debug,aws_smithy_runtime=debug,\
         aws_smithy_runtime_api=debug,aws_sigv4=off,aws_smithy_http_client=info,hyper=info",
    );
    use std::io::IsTerminal;
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .init();
}

/// The AWS configuration the command line and the environment name, with a Region.
async fn aws_config(
    profile: Option<String>,
    region: Option<String>,
    endpoint_url: Option<String>,
) -> aws_config::SdkConfig {
    let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest());
    if let Some(profile) = profile {
        loader = loader.profile_name(profile);
    }
    if let Some(region) = region {
        loader = loader.region(aws_config::Region::new(region));
    }
    if let Some(url) = endpoint_url {
        loader = loader.endpoint_url(url);
    }
    let config = loader.load().await;
    // As the AWS CLI says it, before any request fails for it.
    if config.region().is_none() {
        usage("no region: set AWS_REGION, or --region, or a profile's region");
    }
    config
}

/// What to do about an AWS failure, as a person reads it, where its code says.
fn hint(e: &OperatorError) -> Option<&'static str> {
    use fenced_jobs::ledger::LedgerError;
    let OperatorError::Ledger(LedgerError::Unavailable { code, .. }) = e else {
        return None;
    };
    Some(match code.as_str() {
        "dispatch_failure" => {
            "the request did not reach DynamoDB: check the network, --endpoint-url (or \
             AWS_ENDPOINT_URL) and that credentials are set (AWS_PROFILE, AWS_ACCESS_KEY_ID)"
        }
        "timeout" => "DynamoDB did not answer in time: try again, or check --endpoint-url",
        "ResourceNotFoundException" => {
            "no such table in this region: check --table (or JOBS_TABLE) and --region"
        }
        "UnrecognizedClientException" | "InvalidSignatureException" => {
            "the credentials are not valid for this account: check AWS_PROFILE or the keys"
        }
        "ExpiredTokenException" => "the credentials have expired: log in again (aws sso login)",
        "AccessDeniedException" => {
            "the credentials may not do this: the role needs the table's read and write actions"
        }
        _ => return None,
    })
}

/// Asks on the terminal; anything but `yes` (or no terminal at all) is a no.
fn confirmed(what: &str) -> bool {
    use std::io::{BufRead, IsTerminal, Write};
    if !std::io::stdin().is_terminal() {
        return false;
    }
    eprint!("{what}? Type yes: ");
    let _ = std::io::stderr().flush();
    let mut answer = String::new();
    let _ = std::io::stdin().lock().read_line(&mut answer);
    answer.trim() == "yes"
}

#[cfg(test)]
mod tests {
    use super::*;
    use fenced_jobs::ledger::LedgerError;

    #[test]
    fn a_stacks_outputs_are_the_defaults_and_an_option_given_wins() {
        use clap::{CommandFactory, FromArgMatches};
        let outputs: Vec<(String, String)> = [
            ("JobsTableName", "jobs-prod"),
            ("QueueUrl", "https://sqs.eu-west-1.amazonaws.com/1/jobs"),
            (
                "DeadLetterQueueUrl",
                "https://sqs.eu-west-1.amazonaws.com/1/dlq",
            ),
            ("TrustedSenders", "AROA1,AROA2"),
            (
                "DispatchFailureQueueUrl",
                "https://sqs.eu-west-1.amazonaws.com/1/failed",
            ),
            ("ResultsBucketName", "results-prod"),
            (
                "UrgentQueueUrl",
                "https://sqs.eu-west-1.amazonaws.com/1/urgent",
            ),
            ("CompletionEvents", "arn:aws:sns:eu-west-1:1:events"),
        ]
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .into();
        let parse = |args: &[&str]| {
            let command = stack::fill(Cli::command(), &outputs);
            let matches = command.try_get_matches_from(args).expect("parsed");
            Cli::from_arg_matches(&matches).expect("a command line")
        };
        let cli = parse(&["jobctl", "submit", "jobs.jsonl"]);
        assert_eq!(cli.table.as_deref(), Some("jobs-prod"));
        assert_eq!(cli.results_bucket.as_deref(), Some("results-prod"));
        let Command::Submit { queue_url, .. } = cli.command else {
            panic!("submit")
        };
        assert_eq!(queue_url, "https://sqs.eu-west-1.amazonaws.com/1/jobs");
        let given = parse(&["jobctl", "--table", "other", "list"]);
        assert_eq!(given.table.as_deref(), Some("other"), "the option wins");
        let Command::Events {
            event_topic_arn,
            event_bus_name,
            ..
        } = parse(&["jobctl", "events", "replay"]).command
        else {
            panic!("events")
        };
        assert_eq!(
            event_topic_arn.as_deref(),
            Some("arn:aws:sns:eu-west-1:1:events")
        );
        assert_eq!(event_bus_name, None);
        let Command::Dlq {
            dlq_url,
            trusted_senders,
            command,
            ..
        } = parse(&["jobctl", "dlq", "redrive"]).command
        else {
            panic!("dlq")
        };
        assert_eq!(dlq_url, "https://sqs.eu-west-1.amazonaws.com/1/dlq");
        assert_eq!(trusted_senders, "AROA1,AROA2");
        assert!(
            matches!(command, DlqCommand::Redrive { queue_url, .. } if queue_url.ends_with("/jobs"))
        );
    }

    #[test]
    fn an_aws_failure_comes_with_what_to_do_about_it() {
        let failed = |code: &str| {
            OperatorError::Ledger(LedgerError::Unavailable {
                operation: "get",
                code: code.to_owned(),
            })
        };
        assert!(hint(&failed("dispatch_failure")).is_some_and(|h| h.contains("--endpoint-url")));
        assert!(hint(&failed("ResourceNotFoundException")).is_some_and(|h| h.contains("--table")));
        assert!(hint(&failed("ExpiredTokenException")).is_some());
        assert_eq!(hint(&failed("InternalServerError")), None);
        assert_eq!(hint(&OperatorError::NotFound("j".into())), None);
    }
}
