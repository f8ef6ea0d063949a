"""The template's own consistency, beyond what cfn-lint checks.

    check_template.py template.yaml       check the template (exit 1 with every problem found)
    check_template.py --self-test FILE    also prove each rule fails on a broken copy

Rules: the work queue's visibility timeout is at least six times the worker's timeout plus the
batching window (for the parameter defaults); the redrive allows a 24-hour job's hand-overs (one
per function timeout) and a message the worker keeps failing on still reaches the DLQ within the
queue's retention; the worker dead-letters poison itself (DLQ_URL); every SQS event source
reports batch item failures, and so does every DynamoDB stream event source, which also bisects failed batches and
has an on-failure destination; the DLQ keeps messages 14 days; every function has a role of its
own (no SAM policies, no managed policy) and JSON logs in a log group that expires them; no IAM
action has a wildcard; the table is on demand with TTL, point-in-time recovery,
its three sparse indexes and a stream of new and old images; the results bucket is encrypted,
blocks public access and expires what it stores; alarms watch poison, conflicts, terminal
failures, lost ownerships, deadline cut-offs, provider throttling, unknown jobs and the age of
queued messages; the dashboard shows only metrics the functions emit; every parameter is in the
README's table; no environment variable holds a key in plain text.
"""

import copy
import json
import pathlib
import re
import sys

from cfnlint.decode import decode


def resolve(template, value):
    """A literal, or a parameter's default behind a Ref."""
    if isinstance(value, dict) and "Ref" in value:
        return template.get("Parameters", {}).get(value["Ref"], {}).get("Default")
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


def role_actions(template, role):
    actions = set()
    for name, stmt in statements(template):
        if name == role and stmt.get("Effect") == "Allow":
            action = stmt.get("Action", [])
            actions |= set([action] if isinstance(action, str) else action)
    return actions


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
    if not table.get("TimeToLiveSpecification", {}).get("Enabled"):
        found.append("JobsTable: TTL off")
    pitr = table.get("PointInTimeRecoverySpecification", {})
    if not pitr.get("PointInTimeRecoveryEnabled"):
        found.append("JobsTable: point-in-time recovery off")
    indexes = {i.get("IndexName") for i in table.get("GlobalSecondaryIndexes", [])}
    for index in ("attention-index", "deadline-index", "finished-index"):
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

    readme = (pathlib.Path(__file__).parent.parent / "README.md").read_text()
    for parameter in template.get("Parameters", {}):
        if f"| `{parameter}` |" not in readme:
            found.append(f"parameter {parameter} is not in the README's table")

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
    return found


def self_test(template):
    """Every rule must catch a copy broken on purpose."""

    def broken(change):
        t = copy.deepcopy(template)
        change(t)
        return problems(t)

    r = lambda t: t["Resources"]
    cases = {
        "visibility": lambda t: r(t)["JobsQueue"]["Properties"].__setitem__("VisibilityTimeout", 900),
        "batch item failures": lambda t: r(t)["WorkerFunction"]["Properties"]["Events"]["Jobs"][
            "Properties"
        ].__setitem__("FunctionResponseTypes", []),
        "wildcard": lambda t: r(t)["WorkerRole"]["Properties"]["Policies"][0]["PolicyDocument"][
            "Statement"
        ][0].__setitem__("Action", "dynamodb:*"),
        "own role": lambda t: r(t)["WorkerFunction"]["Properties"].pop("Role"),
        "s3 actions allowed": lambda t: [
            stmt["Action"].remove("s3:DeleteObject")
            for stmt in r(t)["WorkerRole"]["Properties"]["Policies"][0]["PolicyDocument"]["Statement"]
            if isinstance(stmt, dict) and stmt.get("Sid") == "StoredAnswersAndInputs"
        ],
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
