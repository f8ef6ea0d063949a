"""The template's own consistency, beyond what cfn-lint checks.

    check_template.py template.yaml       check the template (exit 1 with every problem found)
    check_template.py --self-test FILE    also prove each rule fails on a broken copy

Rules: the work queue's visibility timeout is at least six times the worker's timeout plus the
batching window (for the parameter defaults); the redrive allows a 24-hour job's hand-overs (one
per function timeout) and a message the worker keeps failing on still reaches the DLQ within the
queue's retention; the worker's MemorySize holds the worst case its budgets allow (the runtime's
reserve, the costliest document and the largest payload, from the code's constants); the worker
dead-letters poison itself (DLQ_URL); every SQS event source
reports batch item failures, and so does every DynamoDB stream event source, which also bisects failed batches and
has an on-failure destination; the DLQ keeps messages 14 days; every function has a role of its
own (no SAM policies, no managed policy) and JSON logs in a log group that expires them; no IAM
action has a wildcard; the table is on demand with TTL, point-in-time recovery,
its three sparse indexes and a stream of new and old images; the results bucket is encrypted,
blocks public access and expires what it stores; alarms watch poison, conflicts, terminal
failures, lost ownerships, deadline cut-offs, provider throttling, unknown jobs and the age of
queued messages; the dashboard shows only metrics the functions emit; every parameter is in the
configuration reference's table and every alarm has its section in the runbook; no environment variable holds a key in plain text.

And what keeps jobs and answers to their owners: every queue and topic is encrypted at rest; the
results bucket refuses every call without TLS, on the bucket and its objects; the table has
deletion protection; no role deletes objects outside results/, and the worker's and the
dispatcher's roles carry no action their code does not send; completion events go to a bus, topic
or queue of this stack (never the account's default bus) whose policy denies publishing to every
principal but the dispatcher's role, which may publish there alone; the worker is told what
producers may ask for (models, parameters, attempts, deadline), the bucket keeps inputs and
answers for the longest deadline plus the 30 days an item outlives its job (for the parameter
defaults), and with Bedrock the worker's role may call only the models the deployment names, in
its own Region.
"""

import copy
import json
import pathlib
import re
import sys

from cfnlint.decode import decode


def resolve(template, value):
    """A literal, or a parameter's default behind a Ref; for an Fn::If, the larger of its two
    values (the worst case a check must hold for)."""
    if isinstance(value, dict) and "Ref" in value:
        return template.get("Parameters", {}).get(value["Ref"], {}).get("Default")
    if isinstance(value, dict) and "Fn::If" in value:
        _, yes, no = value["Fn::If"]
        values = [resolve(template, v) for v in (yes, no)]
        numbers = [int(v) for v in values if isinstance(v, (int, str)) and str(v).isdigit()]
        return max(numbers) if numbers else values[0]
    return value


def functions(template):
    for name, res in template.get("Resources", {}).items():
        if res.get("Type") == "AWS::Serverless::Function":
            yield name, res


def statements(template):
    for name, res in template.get("Resources", {}).items():
        props = res.get("Properties", {})
        for policy in props.get("Policies", []) or []:
            if isinstance(policy, dict):
                document = policy.get("PolicyDocument", policy)
                for stmt in document.get("Statement", []):
                    if isinstance(stmt, dict) and "Fn::If" in stmt:
                        stmt = stmt["Fn::If"][1]
                    if isinstance(stmt, dict):
                        yield name, stmt


# The metrics an alarm must watch (with the DLQ's oldest message and unknown jobs).
ALARMED = [
    "Poison",
    "Conflict",
    "FailedTerminal",
    "LostOwnerships",
    "DeadlineCutoffs",
    "ProviderThrottled",
    "UnknownJobs",
    "ApproximateAgeOfOldestMessage",
]


def emitted_metrics():
    """The metric names the functions' EMF documents carry, read from the code that writes them."""
    source = (pathlib.Path(__file__).parent.parent / "src/ops/metrics.rs").read_text()
    return set(re.findall(r'"([A-Z][A-Za-z]+)",\s*"(?:Count|Milliseconds)"', source)) | set(
        re.findall(r'\("[a-z_]+", "([A-Z][A-Za-z]+)"\)', source)
    )


def ledger_actions():
    """The item reads and writes the ledger sends (the worker's; the index queries are the
    reconciler's), read from the code that sends them."""
    root = pathlib.Path(__file__).parent.parent / "src/ledger/dynamodb"
    source = "".join(p.read_text() for p in sorted(root.glob("*.rs")))
    calls = set(re.findall(r"\.(put_item|update_item|get_item)\(\)", source))
    return {"dynamodb:" + "".join(w.capitalize() for w in c.split("_")) for c in calls}


# The S3 and SQS calls the worker's code sends, by SDK method, and the IAM action each needs.
S3_CALLS = {
    "put_object": "s3:PutObject",
    "get_object": "s3:GetObject",
    "delete_object": "s3:DeleteObject",
    "list_objects_v2": "s3:ListBucket",
}
SQS_CALLS = {
    "change_message_visibility_batch": "sqs:ChangeMessageVisibility",
    "get_queue_url": "sqs:GetQueueUrl",
    "get_queue_attributes": "sqs:GetQueueAttributes",
    "send_message_batch": "sqs:SendMessage",
}


def sdk_actions(path, calls):
    """The IAM actions of the SDK calls the code in `path` makes (`calls`: method -> action)."""
    source = (pathlib.Path(__file__).parent.parent / path).read_text()
    sent = set(re.findall(r"\.(" + "|".join(calls) + r")\(\)", source))
    return {calls[c] for c in sent}


def worker_actions():
    """Every action the worker's code needs: the ledger's item reads and writes, the results
    bucket's object calls (stored answers and inputs, the recovery's look for a stored answer,
    Extended Client payloads) and the queue calls (visibility, its own dead letters)."""
    return (
        ledger_actions()
        | sdk_actions("src/blobs/s3.rs", S3_CALLS)
        | sdk_actions("src/queue/sqs.rs", SQS_CALLS)
    )


# What the roles' code calls besides the ledger, bucket and queue: the provider (its Converse call
# and its key), the dispatcher's event targets.
PROVIDER_CALLS = {
    "converse": "bedrock:InvokeModel",
    "converse_stream": "bedrock:InvokeModelWithResponseStream",
    "get_secret_value": "secretsmanager:GetSecretValue",
}
DISPATCH_CALLS = {
    "put_events": "events:PutEvents",
    "publish_batch": "sns:Publish",
    "send_message_batch": "sqs:SendMessage",
}
# What Lambda does as a role rather than the code: tracing, logs, and the event source mappings'
# polling of the work queue and of the ledger's stream.
RUNTIME_ACTIONS = {
    "xray:PutTraceSegments",
    "xray:PutTelemetryRecords",
    "logs:CreateLogStream",
    "logs:PutLogEvents",
}
QUEUE_POLLING = {"sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:GetQueueAttributes"}
STREAM_POLLING = {
    "dynamodb:DescribeStream",
    "dynamodb:GetRecords",
    "dynamodb:GetShardIterator",
    "dynamodb:ListStreams",
}


# What a call's own parameters make Bedrock check under the caller's role: a guardrail in the
# Converse request is applied as bedrock:ApplyGuardrail.
PROVIDER_PARAMETERS = {"set_guardrail_config": "bedrock:ApplyGuardrail"}


def provider_actions():
    bedrock = (pathlib.Path(__file__).parent.parent / "src/provider/bedrock/mod.rs").read_text()
    applied = {action for call, action in PROVIDER_PARAMETERS.items() if f".{call}(" in bedrock}
    return (
        sdk_actions("src/provider/bedrock/mod.rs", PROVIDER_CALLS)
        | sdk_actions("src/provider/keys.rs", PROVIDER_CALLS)
        | applied
    )


def dispatcher_actions():
    """The publishing calls of the dispatcher's event sinks."""
    return sdk_actions("src/events/aws.rs", DISPATCH_CALLS)


# Stored answers are the only objects the code deletes: a refused one (the worker,
# src/worker/processor/end.rs) and orphans (the reconciler, src/ops/results.rs). Inputs expire.
DELETED_PREFIXES = ("results/",)

# What producers may ask for, which the worker enforces: a job beyond it is refused.
PRODUCER_LIMITS = (
    "ALLOWED_MODELS",
    "ALLOWED_PARAMETERS",
    "MAX_ATTEMPTS_LIMIT",
    "MAX_DEADLINE_SECONDS",
    "PRODUCERS",
    "TRUSTED_SENDERS",
    "PAYLOAD_BUCKET",
)

# How long an item outlives its job (RETENTION_DAYS, 30 by default): what it references must
# outlive it.
ITEM_KEPT_DAYS = 30

DISPATCHER_ARN = {"Fn::GetAtt": ["DispatcherRole", "Arn"]}
# The principals a target's policy lets publish: the dispatcher's role, and the roles the
# deployment names for `jobctl events replay` (none by default).
PUBLISHERS = {
    "Fn::Split": [
        ",",
        {"Fn::Join": [",", [DISPATCHER_ARN, {"Fn::Join": [",", {"Ref": "EventReplayPrincipalArns"}]}]]},
    ]
}

# The dispatcher's targets by variable: the resource type it must be, the action that publishes
# to it, and its ARN from its logical id.
EVENT_TARGETS = {
    "EVENT_BUS_NAME": ("AWS::Events::EventBus", "events:PutEvents", lambda ref: {"Fn::GetAtt": [ref, "Arn"]}),
    "EVENT_TOPIC_ARN": ("AWS::SNS::Topic", "sns:Publish", lambda ref: {"Ref": ref}),
    "EVENT_QUEUE_URL": ("AWS::SQS::Queue", "sqs:SendMessage", lambda ref: {"Fn::GetAtt": [ref, "Arn"]}),
}


def as_list(value):
    return value if isinstance(value, list) else [value]


def when(value):
    """What an `!If [condition, value, AWS::NoValue]` gives when its condition holds."""
    if isinstance(value, dict) and "Fn::If" in value:
        return value["Fn::If"][1]
    return value


def arn_text(resource):
    """A resource's ARN as written: a literal, or the string of its Fn::Sub."""
    if isinstance(resource, dict) and "Fn::Sub" in resource:
        sub = resource["Fn::Sub"]
        return sub[0] if isinstance(sub, list) else sub
    return resource if isinstance(resource, str) else json.dumps(resource)


def policy_statements(resources, ref):
    """The resource-policy statements of the bus, topic or queue `ref`: its bus policy (its own
    Policy or an EventBusPolicy), topic policy or queue policy."""
    target = {"Ref": ref}
    found = []
    own = resources.get(ref, {}).get("Properties", {}).get("Policy")
    if isinstance(own, str):
        own = json.loads(own)
    if isinstance(own, dict):
        found += as_list(own.get("Statement", []))
    for res in resources.values():
        props = res.get("Properties", {})
        kind = res.get("Type")
        if kind == "AWS::Events::EventBusPolicy" and props.get("EventBusName") == target:
            found += as_list(props.get("Statement", []))
        if (kind == "AWS::SNS::TopicPolicy" and target in props.get("Topics", [])) or (
            kind == "AWS::SQS::QueuePolicy" and target in props.get("Queues", [])
        ):
            found += as_list(props.get("PolicyDocument", {}).get("Statement", []))
    return [s for s in found if isinstance(s, dict)]


def only_dispatcher(stmt, action, arn):
    """A Deny of `action` on `arn` to every principal but the dispatcher's role: a Deny, so that no
    account principal's own policy (sns:Publish on *, say) can allow it; that one condition, so
    that nothing narrows it."""
    return (
        stmt.get("Effect") == "Deny"
        and stmt.get("Principal") in ("*", {"AWS": "*"})
        and action in as_list(stmt.get("Action", []))
        and arn in as_list(stmt.get("Resource", []))
        and stmt.get("Condition") in (
            {"StringNotEquals": {"aws:PrincipalArn": DISPATCHER_ARN}},
            {"StringNotEquals": {"aws:PrincipalArn": PUBLISHERS}},
        )
    )


def tls_only(stmt):
    """A Deny of every S3 call without TLS, on the results bucket and its objects."""
    condition = stmt.get("Condition", {})
    return (
        stmt.get("Effect") == "Deny"
        and stmt.get("Principal") in ("*", {"AWS": "*"})
        and bool({"s3:*", "*"} & set(as_list(stmt.get("Action", []))))
        and {"Fn::GetAtt": ["ResultsBucket", "Arn"]} in as_list(stmt.get("Resource", []))
        and "${ResultsBucket.Arn}/*" in [arn_text(r) for r in as_list(stmt.get("Resource", []))]
        and list(condition) == ["Bool"]
        and list(condition["Bool"]) == ["aws:SecureTransport"]
        and str(condition["Bool"]["aws:SecureTransport"]).lower() == "false"
    )


def role_actions(template, role):
    actions = set()
    for name, stmt in statements(template):
        if name == role and stmt.get("Effect") == "Allow":
            action = stmt.get("Action", [])
            actions |= set([action] if isinstance(action, str) else action)
    return actions


def worst_case_mib():
    """The worker's worst case in MiB, from the constants in the code: the memory it keeps back
    for the runtime and the clients (PAYLOAD_MEMORY_RESERVE_MB), the most a document may cost
    parsed (MAX_DOCUMENT_COST) and the largest payload's bytes read beside it
    (MAX_PAYLOAD_BYTES)."""
    src = pathlib.Path(__file__).resolve().parent.parent / "src"

    def constant(path, name):
        text = (src / path).read_text()
        expr = re.search(rf"const {name}: \w+ = ([0-9_ *]+);", text).group(1)
        value = 1
        for factor in expr.replace("_", "").split("*"):
            value *= int(factor)
        return value

    mib = 1_048_576
    return (
        constant("worker/settings.rs", "PAYLOAD_MEMORY_RESERVE_MB")
        + constant("job/cost.rs", "MAX_DOCUMENT_COST") // mib
        + constant("job/message.rs", "MAX_PAYLOAD_BYTES") // mib
    )


def problems(template):
    found = []
    # The worker writes the ledger with every kind of write the ledger code sends: a role
    # without one fails on AWS only (AccessDenied), never on the emulator.
    # The same for S3 and SQS: the worker lists a lapsed owner's stored answer, and without
    # s3:ListBucket a missing object answers 403, not 404.
    missing = worker_actions() - role_actions(template, "WorkerRole")
    if missing:
        found.append(f"WorkerRole: the code sends {sorted(missing)}, which the role does not allow")
    # ListBucket is granted on a bucket, never on its objects (where it would allow nothing).
    for name, stmt in statements(template):
        action = stmt.get("Action", [])
        actions = [action] if isinstance(action, str) else action
        resource = stmt.get("Resource", [])
        resource = resource if isinstance(resource, list) else [resource]
        if "s3:ListBucket" in actions and any("/*" in json.dumps(r) for r in resource):
            found.append(f"{name}: s3:ListBucket on objects (it applies to a bucket)")
    globals_fn = template.get("Globals", {}).get("Function", {})
    resources = template.get("Resources", {})
    # The worker's memory holds its worst case: the runtime's reserve, the costliest document
    # the worker parses and the largest payload's bytes beside it.
    worst = worst_case_mib()
    memory = resources.get("WorkerFunction", {}).get("Properties", {}).get("MemorySize", globals_fn.get("MemorySize"))
    if not isinstance(memory, int) or memory < worst:
        found.append(f"WorkerFunction: MemorySize {memory} MB is below the worst case the budgets allow ({worst} MiB)")

    # No action the code does not send: what a role allows beyond it is only exposure.
    unused = role_actions(template, "WorkerRole") - (
        worker_actions() | provider_actions() | RUNTIME_ACTIONS | QUEUE_POLLING
    )
    if unused:
        found.append(f"WorkerRole: allows {sorted(unused)}, which the code never sends")
    sent = dispatcher_actions()
    missing = sent - role_actions(template, "DispatcherRole")
    if missing:
        found.append(f"DispatcherRole: the code sends {sorted(missing)}, which the role does not allow")
    unused = role_actions(template, "DispatcherRole") - (sent | RUNTIME_ACTIONS | STREAM_POLLING)
    if unused:
        found.append(f"DispatcherRole: allows {sorted(unused)}, which the code never sends")
    for name, stmt in statements(template):
        if stmt.get("Effect") == "Allow" and "s3:DeleteObject" in as_list(stmt.get("Action", [])):
            for resource in as_list(stmt.get("Resource", [])):
                arn = arn_text(resource)
                if not any(arn.endswith(f"/{prefix}*") for prefix in DELETED_PREFIXES):
                    found.append(f"{name}: s3:DeleteObject on {arn}, where the code deletes nothing")

    # Prompts and answers at rest: the work queue and its DLQ hold them for 14 days.
    for name, res in resources.items():
        props = res.get("Properties", {})
        if res.get("Type") == "AWS::SQS::Queue" and not (
            props.get("SqsManagedSseEnabled") is True or props.get("KmsMasterKeyId")
        ):
            found.append(f"{name}: queue not encrypted at rest")
        if res.get("Type") == "AWS::SNS::Topic" and not props.get("KmsMasterKeyId"):
            found.append(f"{name}: topic not encrypted at rest")

    # Completion events: consumers act on them, so only the dispatcher may publish them. Each
    # target is one this stack creates (never the account's default bus, where any principal
    # allowed events:PutEvents could forge one), its policy denies publishing to every other
    # principal, and the dispatcher's role may publish to it alone.
    dispatcher = resources.get("DispatcherFunction", {}).get("Properties", {})
    dispatcher_env = (dispatcher.get("Environment") or {}).get("Variables", {})
    targets = {}
    for variable, (kind, action, arn_of) in EVENT_TARGETS.items():
        if variable not in dispatcher_env:
            continue
        target = when(dispatcher_env[variable])
        ref = target.get("Ref") if isinstance(target, dict) else None
        if resources.get(ref, {}).get("Type") != kind:
            found.append(f"DispatcherFunction: {variable} is not an {kind} of this stack")
            continue
        targets.setdefault(action, []).append(arn_of(ref))
        if not any(only_dispatcher(s, action, arn_of(ref)) for s in policy_statements(resources, ref)):
            found.append(f"{ref}: no policy denying {action} to every principal but the dispatcher")
    # The stream's failure destination: Lambda sends the batches it gave up on as the role.
    for event in (dispatcher.get("Events") or {}).values():
        failure = event.get("Properties", {}).get("DestinationConfig", {}).get("OnFailure", {})
        if failure.get("Destination"):
            targets.setdefault("sqs:SendMessage", []).append(failure["Destination"])
    granted = {}
    for name, stmt in statements(template):
        if name == "DispatcherRole" and stmt.get("Effect") == "Allow":
            for action in as_list(stmt.get("Action", [])):
                granted.setdefault(action, []).extend(as_list(stmt.get("Resource", [])))
    for _, action, _ in EVENT_TARGETS.values():
        allowed = targets.get(action, [])
        for arn in allowed:
            if arn not in granted.get(action, []):
                found.append(f"DispatcherRole: no {action} on {json.dumps(arn)}")
        for arn in granted.get(action, []):
            if arn not in allowed:
                found.append(f"DispatcherRole: {action} on {json.dumps(arn)}, not its event target")

    worker = resources.get("WorkerFunction", {}).get("Properties", {})
    timeout = int(resolve(template, worker.get("Timeout", globals_fn.get("Timeout", 3))))
    for name, fn in functions(template):
        for event in (fn["Properties"].get("Events") or {}).values():
            if event.get("Type") == "DynamoDB":
                props = event.get("Properties", {})
                if "ReportBatchItemFailures" not in (props.get("FunctionResponseTypes") or []):
                    found.append(f"{name}: stream event without ReportBatchItemFailures")
                if not props.get("BisectBatchOnFunctionError"):
                    found.append(f"{name}: stream event does not bisect failed batches")
                if not props.get("DestinationConfig", {}).get("OnFailure"):
                    found.append(f"{name}: stream event without an on-failure destination")
                continue
            if event.get("Type") != "SQS":
                continue
            props = event.get("Properties", {})
            if "ReportBatchItemFailures" not in (props.get("FunctionResponseTypes") or []):
                found.append(f"{name}: SQS event without ReportBatchItemFailures")
            window = int(resolve(template, props.get("MaximumBatchingWindowInSeconds", 0)) or 0)
            queue_ref = props.get("Queue", {}).get("Fn::GetAtt", [None])[0]
            queue = resources.get(queue_ref, {}).get("Properties", {})
            visibility = int(resolve(template, queue.get("VisibilityTimeout", 30)))
            if visibility < 6 * timeout + window:
                found.append(
                    f"{queue_ref}: visibility {visibility} s < 6 x timeout {timeout} s + window {window} s"
                )
            redrive = queue.get("RedrivePolicy", {})
            receives = int(resolve(template, redrive.get("maxReceiveCount", 0)) or 0)
            # A live job is received about once per invocation for as long as its deadline
            # allows (24 hours by default): the worker dead-letters poison itself, so the count
            # is sized for live jobs.
            if receives < 86400 // timeout:
                found.append(
                    f"{queue_ref}: maxReceiveCount {receives} < a 24-hour job's {86400 // timeout} hand-overs"
                )
            retention = int(resolve(template, queue.get("MessageRetentionPeriod", 345600)))
            if receives * visibility > retention:
                found.append(
                    f"{queue_ref}: {receives} receives {visibility} s apart outlast the retention {retention} s"
                )
            env = (fn["Properties"].get("Environment") or {}).get("Variables", {})
            if "DLQ_URL" not in env:
                found.append(f"{name}: no DLQ_URL, so poison waits for maxReceiveCount receives")
            dlq_ref = redrive.get("deadLetterTargetArn", {}).get("Fn::GetAtt", [None])[0]
            dlq = resources.get(dlq_ref, {}).get("Properties", {})
            if int(dlq.get("MessageRetentionPeriod", 0)) != 1209600:
                found.append(f"{dlq_ref}: DLQ retention is not 14 days")
        env = (fn["Properties"].get("Environment") or {}).get("Variables", {})
        for key, value in env.items():
            if "KEY" in key and "SECRET" not in key and "PARAMETER" not in key and isinstance(value, str):
                found.append(f"{name}: {key} holds a literal value")

    for name, fn in functions(template):
        props = fn["Properties"]
        if "Role" not in props or props.get("Policies"):
            found.append(f"{name}: no role of its own (SAM would attach managed policies)")
        logging = props.get("LoggingConfig", {})
        if logging.get("LogFormat") != "JSON" or "LogGroup" not in logging:
            found.append(f"{name}: logs not JSON into a log group of its own")
    for name, res in resources.items():
        if res.get("Type") == "AWS::IAM::Role" and res.get("Properties", {}).get("ManagedPolicyArns"):
            found.append(f"{name}: a managed policy (its actions reach beyond this stack)")
        if res.get("Type") == "AWS::Logs::LogGroup" and "RetentionInDays" not in res.get("Properties", {}):
            found.append(f"{name}: logs kept forever")

    for name, stmt in statements(template):
        actions = stmt.get("Action", [])
        for action in actions if isinstance(actions, list) else [actions]:
            if isinstance(action, str) and "*" in action:
                found.append(f"{name}: wildcard action {action}")

    table = resources.get("JobsTable", {}).get("Properties", {})
    if table.get("BillingMode") != "PAY_PER_REQUEST":
        found.append("JobsTable: not on demand")
    if table.get("DeletionProtectionEnabled") is not True:
        found.append("JobsTable: deletion protection off (the ledger is the jobs' only record)")
    if not table.get("TimeToLiveSpecification", {}).get("Enabled"):
        found.append("JobsTable: TTL off")
    pitr = table.get("PointInTimeRecoverySpecification", {})
    if not pitr.get("PointInTimeRecoveryEnabled"):
        found.append("JobsTable: point-in-time recovery off")
    indexes = {i.get("IndexName") for i in table.get("GlobalSecondaryIndexes", [])}
    for index in ("attention-index", "deadline-index", "due-index"):
        if index not in indexes:
            found.append(f"JobsTable: no {index}")
    if table.get("StreamSpecification", {}).get("StreamViewType") != "NEW_AND_OLD_IMAGES":
        found.append("JobsTable: no stream of new and old images")

    # Under partial batch responses a failed record is no Lambda error: alarm on what fails.
    alarmed = {
        res["Properties"].get("MetricName")
        for res in resources.values()
        if res.get("Type") == "AWS::CloudWatch::Alarm"
    }
    for metric in ALARMED:
        if metric not in alarmed:
            found.append(f"no alarm on {metric}")
    dashboard = resources.get("Dashboard", {}).get("Properties", {}).get("DashboardBody")
    if not dashboard:
        found.append("no dashboard")
    else:
        body = dashboard["Fn::Sub"][0] if isinstance(dashboard, dict) else dashboard
        body = re.sub(r"\$\{[^}]+\}", "x", body)
        try:
            widgets = json.loads(body)["widgets"]
        except (ValueError, KeyError):
            found.append("the dashboard body is not JSON with widgets")
            widgets = []
        emitted = emitted_metrics()
        for widget in widgets:
            namespace = None
            for row in widget.get("properties", {}).get("metrics", []):
                names = [v for v in row if isinstance(v, str)]
                if len(names) < 2:
                    continue
                # "..." and "." repeat the row above; our namespace was substituted by "x".
                namespace = namespace if names[0] in ("...", ".") else names[0]
                if namespace == "x" and names[1] not in emitted:
                    found.append(f"the dashboard shows {names[1]}, which no function emits")

    docs = pathlib.Path(__file__).parent.parent / "docs"
    configuration = (docs / "configuration.md").read_text()
    for parameter in template.get("Parameters", {}):
        if f"| `{parameter}` |" not in configuration:
            found.append(f"parameter {parameter} is not in docs/configuration.md's table")
    # The runbook is keyed by alarm: one section per alarm, named by its logical id.
    runbook = set(re.findall(r"(?m)^## (\S+)\s*$", (docs / "runbook.md").read_text()))
    alarms = {name for name, res in resources.items() if res.get("Type") == "AWS::CloudWatch::Alarm"}
    for name in sorted(alarms - runbook):
        found.append(f"alarm {name} has no section in docs/runbook.md")
    for name in sorted(runbook - alarms):
        found.append(f"docs/runbook.md has a section for {name}, which the template does not create")

    bucket = resources.get("ResultsBucket", {}).get("Properties", {})
    if not bucket.get("BucketEncryption"):
        found.append("ResultsBucket: not encrypted")
    block = bucket.get("PublicAccessBlockConfiguration", {})
    for flag in ("BlockPublicAcls", "BlockPublicPolicy", "IgnorePublicAcls", "RestrictPublicBuckets"):
        if block.get(flag) is not True:
            found.append(f"ResultsBucket: {flag} is not on")
    rules = bucket.get("LifecycleConfiguration", {}).get("Rules", [])
    expiring = {r.get("Prefix") for r in rules if r.get("ExpirationInDays")}
    for prefix in ("results/", "inputs/"):
        if prefix not in expiring:
            found.append(f"ResultsBucket: nothing expires {prefix}")
    bucket_statements = [
        stmt
        for res in resources.values()
        if res.get("Type") == "AWS::S3::BucketPolicy"
        and res.get("Properties", {}).get("Bucket") == {"Ref": "ResultsBucket"}
        for stmt in as_list(res["Properties"].get("PolicyDocument", {}).get("Statement", []))
        if isinstance(stmt, dict)
    ]
    if not any(tls_only(stmt) for stmt in bucket_statements):
        found.append("ResultsBucket: no policy denying every call without TLS, on the bucket and its objects")

    worker_env = (worker.get("Environment") or {}).get("Variables", {})
    for variable in PRODUCER_LIMITS:
        if variable not in worker_env:
            found.append(f"WorkerFunction: no {variable}, so producers may ask for anything")
    # A job's input and answer must outlive its item: the longest deadline plus the item's days
    # (for the parameter defaults; CloudFormation rules cannot compare numbers).
    longest = resolve(template, worker_env.get("MAX_DEADLINE_SECONDS"))
    kept = int(resolve(template, worker_env.get("RETENTION_DAYS", ITEM_KEPT_DAYS)))
    if longest is not None:
        for rule in rules:
            days = resolve(template, rule.get("ExpirationInDays"))
            if days is not None and int(days) * 86400 < int(longest) + kept * 86400:
                found.append(
                    f"ResultsBucket: {rule.get('Prefix')} expires after {days} days, before a job due in"
                    f" {longest} s and its item's {kept} days"
                )

    # With Bedrock, only the models the deployment names; the cross-Region statement is bound to
    # the profiles named instead.
    for name, stmt in statements(template):
        if name != "WorkerRole" or "bedrock:InvokeModel" not in as_list(stmt.get("Action", [])):
            continue
        condition = stmt.get("Condition", {})
        if "bedrock:InferenceProfileArn" in condition.get("StringEquals", {}):
            continue
        resource = json.dumps(stmt.get("Resource"))
        if '{"Ref": "AllowedModels"}' not in resource or re.search(r"(model|profile)/\*", resource):
            found.append(f"WorkerRole: {stmt.get('Sid')} reaches models beyond AllowedModels")
        if condition.get("StringEquals", {}).get("aws:RequestedRegion") != {"Ref": "AWS::Region"}:
            found.append(f"WorkerRole: {stmt.get('Sid')} reaches other Regions")
    return found


def self_test(template):
    """Every rule must catch a copy broken on purpose."""

    def broken(change):
        t = copy.deepcopy(template)
        change(t)
        return problems(t)

    r = lambda t: t["Resources"]

    def listed(t, role):
        return r(t)[role]["Properties"]["Policies"][0]["PolicyDocument"]["Statement"]

    def sid(t, role, name):
        """A statement of `role` by its Sid (inside its !If, if it has one)."""
        return next(when(s) for s in listed(t, role) if when(s).get("Sid") == name)

    cases = {
        "memory for the worst case": lambda t: t["Globals"]["Function"].__setitem__("MemorySize", 64),
        "visibility": lambda t: r(t)["JobsQueue"]["Properties"].__setitem__("VisibilityTimeout", 900),
        "batch item failures": lambda t: r(t)["WorkerFunction"]["Properties"]["Events"]["Jobs"][
            "Properties"
        ].__setitem__("FunctionResponseTypes", []),
        "wildcard": lambda t: r(t)["WorkerRole"]["Properties"]["Policies"][0]["PolicyDocument"][
            "Statement"
        ][0].__setitem__("Action", "dynamodb:*"),
        "own role": lambda t: r(t)["WorkerFunction"]["Properties"].pop("Role"),
        "s3 actions allowed": lambda t: listed(t, "WorkerRole").remove(sid(t, "WorkerRole", "RefusedAnswers")),
        "sqs actions allowed": lambda t: [
            stmt["Action"].remove("sqs:ChangeMessageVisibility")
            for stmt in r(t)["WorkerRole"]["Properties"]["Policies"][0]["PolicyDocument"]["Statement"]
            if isinstance(stmt, dict) and stmt.get("Sid") == "FailedRecordVisibility"
        ],
        "list on buckets": lambda t: [
            stmt.__setitem__("Resource", "arn:aws:s3:::b/*")
            for stmt in r(t)["WorkerRole"]["Properties"]["Policies"][0]["PolicyDocument"]["Statement"]
            if isinstance(stmt, dict) and stmt.get("Sid") == "ListResults"
        ],
        "ledger writes allowed": lambda t: [
            stmt["Action"].remove("dynamodb:PutItem")
            for stmt in r(t)["WorkerRole"]["Properties"]["Policies"][0]["PolicyDocument"]["Statement"]
            if isinstance(stmt.get("Action"), list) and "dynamodb:PutItem" in stmt["Action"]
        ],
        "managed policy": lambda t: r(t)["WorkerRole"]["Properties"].__setitem__(
            "ManagedPolicyArns",
            ["arn:aws:iam::aws:policy/service-role/AWSLambdaSQSQueueExecutionRole"],
        ),
        "log retention": lambda t: r(t)["WorkerLogGroup"]["Properties"].pop("RetentionInDays"),
        "json logs": lambda t: r(t)["DispatcherFunction"]["Properties"]["LoggingConfig"].pop("LogFormat"),
        "receive count": lambda t: r(t)["JobsQueue"]["Properties"]["RedrivePolicy"].__setitem__(
            "maxReceiveCount", 5
        ),
        "retention against receives": lambda t: r(t)["JobsQueue"]["Properties"].__setitem__(
            "MessageRetentionPeriod", 345600
        ),
        "worker's own dead letters": lambda t: r(t)["WorkerFunction"]["Properties"]["Environment"][
            "Variables"
        ].pop("DLQ_URL"),
        "dlq retention": lambda t: r(t)["JobsDeadLetterQueue"]["Properties"].__setitem__(
            "MessageRetentionPeriod", 345600
        ),
        "pitr": lambda t: r(t)["JobsTable"]["Properties"].pop("PointInTimeRecoverySpecification"),
        "index": lambda t: r(t)["JobsTable"]["Properties"]["GlobalSecondaryIndexes"].pop(),
        "stream": lambda t: r(t)["JobsTable"]["Properties"].pop("StreamSpecification"),
        "stream batch item failures": lambda t: r(t)["DispatcherFunction"]["Properties"]["Events"][
            "Transitions"
        ]["Properties"].__setitem__("FunctionResponseTypes", []),
        "stream on-failure destination": lambda t: r(t)["DispatcherFunction"]["Properties"][
            "Events"
        ]["Transitions"]["Properties"].pop("DestinationConfig"),
        "public access": lambda t: r(t)["ResultsBucket"]["Properties"][
            "PublicAccessBlockConfiguration"
        ].__setitem__("BlockPublicPolicy", False),
        "bucket expiry": lambda t: r(t)["ResultsBucket"]["Properties"].pop("LifecycleConfiguration"),
        "alarm on lost ownerships": lambda t: r(t).pop("LostOwnershipsAlarm"),
        "dashboard": lambda t: r(t).pop("Dashboard"),
        "documented parameters": lambda t: t["Parameters"].__setitem__("Undocumented", {"Type": "String"}),
        "dashboard metric": lambda t: r(t)["Dashboard"]["Properties"]["DashboardBody"]["Fn::Sub"].__setitem__(
            0, r(t)["Dashboard"]["Properties"]["DashboardBody"]["Fn::Sub"][0].replace("LostOwnerships", "LostOwners")
        ),
        "literal key": lambda t: r(t)["WorkerFunction"]["Properties"]["Environment"]["Variables"].__setitem__(
            "OPENAI_API_KEY", "sk-live"
        ),
        "work queue encryption": lambda t: r(t)["JobsQueue"]["Properties"].pop("SqsManagedSseEnabled"),
        "dlq encryption": lambda t: r(t)["JobsDeadLetterQueue"]["Properties"].pop("SqsManagedSseEnabled"),
        "topic encryption": lambda t: r(t)["CompletionTopic"]["Properties"].pop("KmsMasterKeyId"),
        "tls on every call": lambda t: r(t)["ResultsBucketPolicy"]["Properties"]["PolicyDocument"][
            "Statement"
        ][0].__setitem__("Action", "s3:GetObject"),
        "tls on the bucket too": lambda t: r(t)["ResultsBucketPolicy"]["Properties"]["PolicyDocument"][
            "Statement"
        ][0].__setitem__("Resource", {"Fn::Sub": "${ResultsBucket.Arn}/*"}),
        "deletion protection": lambda t: r(t)["JobsTable"]["Properties"].pop("DeletionProtectionEnabled"),
        "deletes under results/ only": lambda t: sid(t, "WorkerRole", "RefusedAnswers").__setitem__(
            "Resource",
            [{"Fn::Sub": "${ResultsBucket.Arn}/results/*"}, {"Fn::Sub": "${ResultsBucket.Arn}/inputs/*"}],
        ),
        "unused worker action": lambda t: sid(t, "WorkerRole", "FailedRecordVisibility")["Action"].append(
            "sqs:PurgeQueue"
        ),
        "dispatcher actions allowed": lambda t: listed(t, "DispatcherRole").remove(
            next(s for s in listed(t, "DispatcherRole") if when(s).get("Sid") == "PublishToTopic")
        ),
        "unused dispatcher action": lambda t: sid(t, "DispatcherRole", "FailedBatches").__setitem__(
            "Action", ["sqs:SendMessage", "sqs:ReceiveMessage"]
        ),
        "the stack's own bus": lambda t: r(t)["DispatcherFunction"]["Properties"]["Environment"][
            "Variables"
        ].__setitem__("EVENT_BUS_NAME", "default"),
        "publishing to the stack's bus alone": lambda t: sid(t, "DispatcherRole", "PublishToBus").__setitem__(
            "Resource",
            {"Fn::Sub": "arn:${AWS::Partition}:events:${AWS::Region}:${AWS::AccountId}:event-bus/default"},
        ),
        "bus policy": lambda t: r(t).pop("CompletionBusPolicy"),
        "bus policy a deny": lambda t: r(t)["CompletionBusPolicy"]["Properties"]["Statement"].__setitem__(
            "Effect", "Allow"
        ),
        "topic policy": lambda t: r(t).pop("CompletionTopicPolicy"),
        "topic policy names the dispatcher": lambda t: r(t)["CompletionTopicPolicy"]["Properties"][
            "PolicyDocument"
        ]["Statement"][0]["Condition"]["StringNotEquals"].__setitem__(
            "aws:PrincipalArn", {"Fn::GetAtt": ["WorkerRole", "Arn"]}
        ),
        "queue policy": lambda t: r(t).pop("CompletionQueuePolicy"),
        "producer limits": lambda t: r(t)["WorkerFunction"]["Properties"]["Environment"]["Variables"].pop(
            "ALLOWED_MODELS"
        ),
        "retention over the longest deadline": lambda t: t["Parameters"]["MaxDeadlineSeconds"].__setitem__(
            "Default", 90 * 86400
        ),
        "bedrock models named": lambda t: sid(t, "WorkerRole", "BedrockConverse").__setitem__(
            "Resource", {"Fn::Sub": "arn:${AWS::Partition}:bedrock:${AWS::Region}::foundation-model/*"}
        ),
        "bedrock in this region": lambda t: sid(t, "WorkerRole", "BedrockConverse").pop("Condition"),
        "parameter documented": lambda t: t["Parameters"].__setitem__("UndocumentedKnob", {"Type": "String"}),
        "alarm in the runbook": lambda t: r(t).__setitem__(
            "UnexplainedAlarm", {"Type": "AWS::CloudWatch::Alarm", "Properties": {"MetricName": "Poison"}}
        ),
    }
    missed = [name for name, change in cases.items() if not broken(change)]
    return [f"self-test: the {name} rule did not catch a broken copy" for name in missed]


def main():
    args = sys.argv[1:]
    test = "--self-test" in args
    path = [a for a in args if a != "--self-test"][0]
    template, matches = decode(path)
    if matches:
        print("\n".join(str(m) for m in matches))
        return 1
    found = problems(template)
    if test and not found:
        found = self_test(template)
    for p in found:
        print(f"template: {p}")
    if not found:
        print(f"template: consistent{' (self-test passed)' if test else ''}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
