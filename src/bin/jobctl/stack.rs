//! `--stack NAME`: the deployed stack's outputs (CloudFormation `DescribeStacks`) as the
//! defaults of the options they name, so that nothing is copied by hand from
//! `sam list stack-outputs`. An option given on the line, or in its variable, wins over the
//! stack's output.

use clap::Command;

/// Each option a stack output fills: the output's key, the subcommands the option belongs to
/// (none: a global option), and the option's id.
const FILLS: [(&str, &[&str], &str); 10] = [
    ("JobsTableName", &[], "table"),
    ("ResultsBucketName", &[], "results_bucket"),
    ("UrgentQueueUrl", &[], "urgent_queue_url"),
    ("QueueUrl", &["submit"], "queue_url"),
    ("QueueUrl", &["authorize-retry"], "queue_url"),
    ("QueueUrl", &["reconcile"], "queue_url"),
    ("QueueUrl", &["dlq", "redrive"], "queue_url"),
    ("DeadLetterQueueUrl", &["dlq"], "dlq_url"),
    ("TrustedSenders", &["dlq"], "trusted_senders"),
    (
        "DispatchFailureQueueUrl",
        &["events", "replay"],
        "queue_url",
    ),
];

/// The value of `--name` on the command line (`--name VALUE` or `--name=VALUE`), read before
/// the line is parsed: the stack's outputs decide the defaults the parse uses.
pub(crate) fn flag(args: &[String], name: &str) -> Option<String> {
    let prefix = format!("{name}=");
    args.iter().enumerate().find_map(|(i, arg)| {
        if arg == name {
            args.get(i + 1).cloned()
        } else {
            arg.strip_prefix(&prefix).map(str::to_owned)
        }
    })
}

/// The outputs of stack `name`, by key.
pub(crate) async fn outputs(
    config: &aws_config::SdkConfig,
    name: &str,
) -> Result<Vec<(String, String)>, String> {
    let described = aws_sdk_cloudformation::Client::new(config)
        .describe_stacks()
        .stack_name(name)
        .send()
        .await
        .map_err(|e| aws_sdk_cloudformation::error::DisplayErrorContext(e).to_string())?;
    let stack = described
        .stacks()
        .first()
        .ok_or_else(|| format!("no stack {name}"))?;
    Ok(stack
        .outputs()
        .iter()
        .filter_map(|o| Some((o.output_key()?.to_owned(), o.output_value()?.to_owned())))
        .collect())
}

/// `command` with the options `outputs` name defaulting to them. `CompletionEvents` fills the
/// target `events` publishes to by its form: a topic's ARN, a queue's URL, else a bus's name.
pub(crate) fn fill(mut command: Command, outputs: &[(String, String)]) -> Command {
    let output = |key: &str| {
        outputs
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
    };
    for (key, path, id) in FILLS {
        if let Some(value) = output(key) {
            command = with_default(command, path, id, value);
        }
    }
    if let Some(target) = output("CompletionEvents") {
        let id = if target.starts_with("arn:") {
            "event_topic_arn"
        } else if target.starts_with("https://") || target.starts_with("http://") {
            "event_queue_url"
        } else {
            "event_bus_name"
        };
        command = with_default(command, &["events"], id, target);
    }
    command
}

/// `command` with the option `id` of the subcommand at `path` defaulting to `value`.
fn with_default(command: Command, path: &[&str], id: &'static str, value: String) -> Command {
    match path.split_first() {
        // A handful of short strings, once per run: kept for the parse. An option the stack
        // gives is no longer one the line must give.
        None => command.mut_arg(id, |arg| {
            arg.default_value(&*value.leak())
                .required(false)
                .required_unless_present(clap::builder::Resettable::<clap::Id>::Reset)
        }),
        Some((sub, rest)) => {
            let rest = rest.to_vec();
            command.mut_subcommand(*sub, move |sc| with_default(sc, &rest, id, value))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flag_is_read_in_either_form_before_the_line_is_parsed() {
        let args: Vec<String> = [
            "jobctl",
            "list",
            "--stack",
            "jobs-prod",
            "--region=eu-west-1",
        ]
        .map(str::to_owned)
        .into();
        assert_eq!(flag(&args, "--stack").as_deref(), Some("jobs-prod"));
        assert_eq!(flag(&args, "--region").as_deref(), Some("eu-west-1"));
        assert_eq!(flag(&args, "--profile"), None);
    }
}
