"""Judges the AWS requests a test recorded against the template's own IAM policies.

    iam_check.py template.yaml calls.json    exit 1, naming each request the policies refuse
    iam_check.py --self-test template.yaml   prove the resolution and the judgement on cases

calls.json, written by an emulator test (tests/emulator/iam.rs):

    {"resources": {"JobsQueue": "<queue name>", "JobsTable": "<table name>", ...},
     "parameters": {"Producers": "...", ...},
     "calls": [{"role": "WorkerRole", "service": "sqs", "operation": "...",
                "path": "/...", "names": {"QueueUrl": "..."}}, ...]}

The template is resolved as CloudFormation would resolve it (parameters, conditions, Ref,
Fn::GetAtt, Fn::Sub, Fn::Join, Fn::Split, Fn::Select, Fn::If, AWS::NoValue), with the physical
names of the test's resources for the logical ids it names, and each recorded request becomes
the IAM action and resource ARN that AWS authorises it as (the Service Authorization Reference:
an SQS batch call is authorised as its single action, S3's HeadObject as s3:GetObject and
ListObjectsV2 as s3:ListBucket with its s3:prefix, DynamoDB Streams' calls as dynamodb:*
actions on the stream). Each request is then judged by @cloud-copilot/iam-simulate (npm,
scripts/iam/package-lock.json), an evaluator of identity and resource policies we did not
write, with the role's inline policies and the resource's own policy (queue, bucket, bus,
topic). moto's own enforcement cannot judge these: it authorises DynamoDB calls against the
resource "*", refuses every statement with a condition, and reads no resource policy.
"""

import json
import pathlib
import re
import subprocess
import sys
from urllib.parse import parse_qs, unquote, urlsplit

from cfnlint.decode import decode

ACCOUNT = "123456789012"
REGION = "us-east-1"
PARTITION = "aws"
STACK = "fenced-jobs"
ROOT = pathlib.Path(__file__).resolve().parent
NO_VALUE = object()


class Resolver:
    """The template's values as CloudFormation resolves them for one set of parameters."""

    def __init__(self, template, physical=None, parameters=None):
        self.template = template
        self.physical = physical or {}
        self.params = {}
        for name, spec in template.get("Parameters", {}).items():
            value = (parameters or {}).get(name, spec.get("Default", ""))
            if spec.get("Type") == "CommaDelimitedList" and isinstance(value, str):
                value = value.split(",")
            self.params[name] = value
        self.params.update(
            {
                "AWS::AccountId": ACCOUNT,
                "AWS::Region": REGION,
                "AWS::Partition": PARTITION,
                "AWS::StackName": STACK,
                "AWS::URLSuffix": "amazonaws.com",
            }
        )
        self.conditions = {}

    def resources(self):
        return self.template.get("Resources", {})

    def exists(self, logical):
        cond = self.resources()[logical].get("Condition")
        return cond is None or self.condition(cond)

    def condition(self, name):
        if name not in self.conditions:
            self.conditions[name] = self.truth(self.template["Conditions"][name])
        return self.conditions[name]

    def truth(self, expr):
        (fn, arg), = expr.items()
        if fn == "Fn::Equals":
            return self.value(arg[0]) == self.value(arg[1])
        if fn == "Fn::Not":
            return not self.truth(arg[0])
        if fn == "Fn::And":
            return all(self.truth(a) for a in arg)
        if fn == "Fn::Or":
            return any(self.truth(a) for a in arg)
        if fn == "Condition":
            return self.condition(arg)
        raise ValueError(f"unknown condition function {fn}")

    def name(self, logical):
        """The physical name: the test's, or CloudFormation's stack-logical form."""
        if logical in self.physical:
            return self.physical[logical]
        props = self.resources()[logical].get("Properties", {})
        for key in ("QueueName", "TableName", "BucketName", "Name", "RoleName", "LogGroupName"):
            if key in props:
                return self.value(props[key])
        return f"{STACK}-{logical}"

    def ref(self, name):
        if name in self.params:
            return self.params[name]
        if name == "AWS::NoValue":
            return NO_VALUE
        kind = self.resources()[name]["Type"]
        physical = self.name(name)
        if kind == "AWS::SQS::Queue":
            return f"https://sqs.{REGION}.amazonaws.com/{ACCOUNT}/{physical}"
        if kind == "AWS::SNS::Topic":
            return f"arn:{PARTITION}:sns:{REGION}:{ACCOUNT}:{physical}"
        return physical

    def get_att(self, logical, attribute):
        kind = self.resources()[logical]["Type"]
        physical = self.name(logical)
        arns = {
            "AWS::SQS::Queue": f"arn:{PARTITION}:sqs:{REGION}:{ACCOUNT}:{physical}",
            "AWS::DynamoDB::Table": f"arn:{PARTITION}:dynamodb:{REGION}:{ACCOUNT}:table/{physical}",
            "AWS::S3::Bucket": f"arn:{PARTITION}:s3:::{physical}",
            "AWS::IAM::Role": f"arn:{PARTITION}:iam::{ACCOUNT}:role/{physical}",
            "AWS::Logs::LogGroup": f"arn:{PARTITION}:logs:{REGION}:{ACCOUNT}:log-group:{physical}:*",
            "AWS::Events::EventBus": f"arn:{PARTITION}:events:{REGION}:{ACCOUNT}:event-bus/{physical}",
        }
        if attribute == "Arn" and kind in arns:
            return arns[kind]
        if attribute == "StreamArn":
            return f"{arns[kind]}/stream/2026-01-01T00:00:00.000"
        if attribute == "QueueName":
            return physical
        if attribute == "RoleId":
            return f"AROA{logical.upper()[:17]}"
        raise ValueError(f"unknown attribute {logical}.{attribute}")

    def sub(self, text, variables):
        def one(match):
            key = match.group(1)
            if key in variables:
                return str(self.value(variables[key]))
            if "." in key:
                return str(self.get_att(*key.split(".", 1)))
            return str(self.ref(key))

        return re.sub(r"\$\{([^}!]+)\}", one, text)

    def value(self, node):
        """The node with every function resolved; AWS::NoValue entries dropped."""
        if isinstance(node, list):
            out = [self.value(n) for n in node]
            return [v for v in out if v is not NO_VALUE]
        if not isinstance(node, dict):
            return node
        if len(node) == 1:
            (fn, arg), = node.items()
            if fn == "Ref":
                return self.ref(arg)
            if fn == "Fn::GetAtt":
                parts = arg if isinstance(arg, list) else arg.split(".", 1)
                return self.get_att(*parts)
            if fn == "Fn::Sub":
                text, variables = (arg, {}) if isinstance(arg, str) else (arg[0], arg[1])
                return self.sub(text, variables)
            if fn == "Fn::Join":
                return arg[0].join(str(v) for v in self.value(arg[1]))
            if fn == "Fn::Split":
                return self.value(arg[1]).split(arg[0])
            if fn == "Fn::Select":
                return self.value(arg[1])[int(self.value(arg[0]))]
            if fn == "Fn::If":
                return self.value(arg[1] if self.condition(arg[0]) else arg[2])
        return {k: v for k, v in ((k, self.value(v)) for k, v in node.items()) if v is not NO_VALUE}

    def role_policies(self, role):
        """The role's inline policies, resolved."""
        props = self.resources()[role].get("Properties", {})
        return [
            {"name": p["PolicyName"], "policy": self.value(p["PolicyDocument"])}
            for p in props.get("Policies", [])
        ]

    def resource_policies(self):
        """(the ARN each covers, the policy) for every queue, bucket, bus and topic policy."""
        out = []
        for logical, res in self.resources().items():
            if not self.exists(logical):
                continue
            kind, props = res["Type"], res.get("Properties", {})
            if kind == "AWS::SQS::QueuePolicy":
                for url in self.value(props["Queues"]):
                    name = url.rsplit("/", 1)[-1]
                    out.append((f"arn:{PARTITION}:sqs:{REGION}:{ACCOUNT}:{name}", self.value(props["PolicyDocument"])))
            elif kind == "AWS::SNS::TopicPolicy":
                for arn in self.value(props["Topics"]):
                    out.append((arn, self.value(props["PolicyDocument"])))
            elif kind == "AWS::S3::BucketPolicy":
                bucket = self.value(props["Bucket"])
                out.append((f"arn:{PARTITION}:s3:::{bucket}", self.value(props["PolicyDocument"])))
            elif kind == "AWS::Events::EventBusPolicy":
                bus = self.value(props["EventBusName"])
                statement = self.value(props["Statement"])
                out.append(
                    (
                        f"arn:{PARTITION}:events:{REGION}:{ACCOUNT}:event-bus/{bus}",
                        {"Version": "2012-10-17", "Statement": [statement]},
                    )
                )
        return out


# Calls authorised as another action than their name (the Service Authorization Reference).
ACTION_OF = {
    "sqs": {
        "ChangeMessageVisibilityBatch": "ChangeMessageVisibility",
        "DeleteMessageBatch": "DeleteMessage",
        "SendMessageBatch": "SendMessage",
    },
    "s3": {
        "HeadObject": "GetObject",
        "ListObjectsV2": "ListBucket",
        "ListObjects": "ListBucket",
        "HeadBucket": "ListBucket",
        "DeleteObjects": "DeleteObject",
        "CreateMultipartUpload": "PutObject",
        "UploadPart": "PutObject",
        "CompleteMultipartUpload": "PutObject",
        "AbortMultipartUpload": "AbortMultipartUpload",
    },
}

# Calls IAM does not authorise by policy.
UNJUDGED = {("sts", "GetCallerIdentity")}


def queue_arn(url_or_name):
    """A queue's ARN from its URL (moto's or AWS's) or its name."""
    parts = [p for p in urlsplit(url_or_name).path.split("/") if p] if "://" in url_or_name else [url_or_name]
    account = parts[-2] if len(parts) >= 2 else ACCOUNT
    return f"arn:{PARTITION}:sqs:{REGION}:{account}:{parts[-1]}"


def iam_request(call):
    """(action, resource ARN, context) for one recorded call; None for one IAM does not judge."""
    service, op, names = call["service"], call["operation"], call.get("names", {})
    if (service, op) in UNJUDGED:
        return None
    context = {}
    if service == "sqs":
        resource = queue_arn(names.get("QueueUrl") or names.get("QueueName") or "*")
        action = "sqs:" + ACTION_OF["sqs"].get(op, op)
    elif service in ("dynamodb", "dynamodb streams"):
        action = "dynamodb:" + op
        if "StreamArn" in names:
            resource = names["StreamArn"]
        elif "TableName" in names:
            resource = f"arn:{PARTITION}:dynamodb:{REGION}:{ACCOUNT}:table/{names['TableName']}"
            if "IndexName" in names:
                resource += f"/index/{names['IndexName']}"
            # A single-item request's partition key (IAM's dynamodb:LeadingKeys, a set).
            if "LeadingKey" in names:
                context["dynamodb:LeadingKeys"] = [names["LeadingKey"]]
        else:
            resource = "*"
    elif service == "s3":
        url = urlsplit(call["path"])
        bucket, _, key = url.path.lstrip("/").partition("/")
        action = "s3:" + ACTION_OF["s3"].get(op, op)
        if action == "s3:ListBucket":
            resource = f"arn:{PARTITION}:s3:::{bucket}"
            prefix = parse_qs(url.query).get("prefix")
            if prefix:
                context["s3:prefix"] = prefix[0]
        else:
            resource = f"arn:{PARTITION}:s3:::{bucket}/{unquote(key)}"
    elif service == "eventbridge":
        action = "events:" + op
        bus = names.get("EventBusName", "default")
        resource = bus if bus.startswith("arn:") else f"arn:{PARTITION}:events:{REGION}:{ACCOUNT}:event-bus/{bus}"
    elif service == "sns":
        action, resource = "sns:" + op, names.get("TopicArn", "*")
    elif service == "xray" and urlsplit(call["path"]).path == "/v1/traces":
        # X-Ray's OTLP traces endpoint authorises an export as PutTraceSegments (the X-Ray
        # developer guide, "OTLP traces endpoint"); the functions export to it directly.
        action, resource = "xray:PutTraceSegments", "*"
    elif service == "secretsmanager":
        action, resource = "secretsmanager:" + op, names.get("SecretId", "*")
    else:
        action, resource = f"{service}:{op}", "*"
    return action, resource, context


def simulations(resolver, calls, outside=None):
    """One simulation per distinct (role, action, resource, context), with its label. A role
    named in `outside` (a principal the template does not define: a producer, an operator) is
    {"arn": ..., "policies": [...]}."""
    outside = outside or {}
    policies = {name: r["policies"] for name, r in outside.items()}
    covered = resolver.resource_policies()
    seen = {}
    streams = {}
    for call in calls:
        # GetRecords names its stream only through the iterator: the one its role last named.
        names = call.get("names", {})
        if "StreamArn" in names:
            streams[call["role"]] = names["StreamArn"]
        elif call["service"] == "dynamodb streams" and call["role"] in streams:
            call = {**call, "names": {**names, "StreamArn": streams[call["role"]]}}
        judged = iam_request(call)
        if judged is None:
            continue
        action, resource, context = judged
        role = call["role"]
        key = (role, action, resource, json.dumps(context, sort_keys=True))
        if key in seen:
            continue
        if role not in policies:
            policies[role] = resolver.role_policies(role)
        role_arn = outside[role]["arn"] if role in outside else resolver.get_att(role, "Arn")
        resource_policy = next(
            (p for arn, p in covered if resource == arn or resource.startswith(arn + "/")), None
        )
        simulation = {
            "request": {
                "action": action,
                "principal": role_arn,
                "resource": {"resource": resource, "accountId": ACCOUNT},
                "contextVariables": {
                    "aws:PrincipalArn": role_arn,
                    "aws:PrincipalAccount": ACCOUNT,
                    "aws:RequestedRegion": REGION,
                    "aws:SecureTransport": "true",
                    **context,
                },
            },
            "identityPolicies": policies[role],
        }
        if resource_policy is not None:
            simulation["resourcePolicy"] = resource_policy
        seen[key] = simulation
    return seen


def judge(simulations_by_key):
    """The evaluator's result for each simulation, in order."""
    keys = list(simulations_by_key)
    if not keys:
        return {}
    out = subprocess.run(
        ["node", str(ROOT / "iam" / "judge.mjs")],
        input=json.dumps([simulations_by_key[k] for k in keys]),
        capture_output=True,
        text=True,
        check=True,
    )
    return dict(zip(keys, json.loads(out.stdout)))


def refusals(template, document):
    resolver = Resolver(template, document.get("resources"), document.get("parameters"))
    results = judge(simulations(resolver, document["calls"], document.get("outside")))
    return [
        f"{role} may not {action} on {resource}{' ' + ctx if ctx != '{}' else ''}: {r['result']}"
        + (f" {json.dumps(r.get('errors'))}" if r.get("errors") else "")
        for (role, action, resource, ctx), r in results.items()
        if r["result"] != "Allowed"
    ], len(results)


def load(path):
    template, matches = decode(path)
    if matches:
        raise SystemExit(f"{path}: {matches}")
    return template


def self_test(template):
    """Each rule on a case whose answer is known: the check must say yes and no."""
    queue = {"JobsQueue": "work-1", "UrgentQueue": "work-2", "JobsDeadLetterQueue": "work-1-dlq",
             "JobsTable": "jobs-1", "ResultsBucket": "bucket-1"}

    def call(role, service, op, path="/", **names):
        return {"role": role, "service": service, "operation": op, "path": path, "names": names}

    moto_url = "http://127.0.0.1:5000/123456789012/"
    cases = [
        (call("WorkerRole", "sqs", "ChangeMessageVisibilityBatch", QueueUrl=moto_url + "work-1"), True),
        (call("WorkerRole", "sqs", "ChangeMessageVisibilityBatch", QueueUrl=moto_url + "work-2"), True),
        (call("WorkerRole", "sqs", "ChangeMessageVisibility", QueueUrl=moto_url + "elsewhere"), False),
        (call("WorkerRole", "sqs", "SendMessage", QueueUrl=moto_url + "work-1-dlq"), True),
        (call("DispatcherRole", "sqs", "SendMessage", QueueUrl=moto_url + "work-1-dlq"), False),
        (call("WorkerRole", "dynamodb", "UpdateItem", TableName="jobs-1"), True),
        (call("WorkerRole", "dynamodb", "DeleteItem", TableName="jobs-1"), False),
        (call("ReconcilerRole", "dynamodb", "Query", TableName="jobs-1", IndexName="attention-index"), True),
        (call("ReconcilerRole", "s3", "ListObjectsV2", "/bucket-1?list-type=2&prefix=results%2F"), True),
        (call("ReconcilerRole", "s3", "ListObjectsV2", "/bucket-1?list-type=2&prefix=inputs%2F"), False),
        (call("WorkerRole", "s3", "HeadObject", "/bucket-1/results/a"), True),
        (call("WorkerRole", "s3", "DeleteObject", "/bucket-1/inputs/a"), False),
        (call("ReconcilerRole", "sqs", "SendMessage", QueueUrl=moto_url + "work-2"), True),
        (call("WorkerRole", "sts", "GetCallerIdentity"), None),
    ]
    # Spans sent straight to X-Ray's OTLP endpoint, signed with each function's own role.
    cases += [(call(role, "xray", "ExportTraces", "/v1/traces"), True)
              for role in ("WorkerRole", "ReconcilerRole", "DispatcherRole")]
    # A producer allowed everything by its own policy: the queues' policies decide.
    admin = [{"name": "admin", "policy": {"Version": "2012-10-17",
                                          "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}}]
    producer = f"arn:aws:iam::{ACCOUNT}:role/producer"
    outside = {"Producer": {"arn": producer, "policies": admin}}
    named = {"QueueSenderArns": f"arn:aws:iam::{ACCOUNT}:role/billing-*"}
    cases += [
        (call("Producer", "sqs", "SendMessage", QueueUrl=moto_url + "work-1"), True),
        (call("Producer", "sqs", "SendMessage", QueueUrl=moto_url + "work-1-dlq"), False),
        ((call("Producer", "sqs", "SendMessage", QueueUrl=moto_url + "work-2"), named), False),
        ((call("Producer", "sqs", "ReceiveMessage", QueueUrl=moto_url + "work-2"), named), True),
    ]
    failures = []
    for case, allowed in cases:
        case, parameters = case if isinstance(case, tuple) else (case, {})
        document = {"resources": queue, "calls": [case], "outside": outside, "parameters": parameters}
        found, judged = refusals(template, document)
        if allowed is None:
            ok = judged == 0
        else:
            ok = judged == 1 and (not found) == allowed
        if not ok:
            failures.append(f"self-test: {case['role']} {case['operation']} {case['names'] or case['path']}: "
                            f"expected {'allowed' if allowed else 'refused' if allowed is False else 'unjudged'}, got {found}")
    return failures


def main():
    args = sys.argv[1:]
    if args and args[0] == "--self-test":
        failures = self_test(load(args[1]))
        for f in failures:
            print(f, file=sys.stderr)
        sys.exit(1 if failures else 0)
    template, calls = load(args[0]), json.loads(pathlib.Path(args[1]).read_text())
    found, judged = refusals(template, calls)
    for f in found:
        print(f"iam: {f}", file=sys.stderr)
    print(f"iam: {judged} distinct requests judged, {len(found)} refused", file=sys.stderr)
    sys.exit(1 if found else 0)


if __name__ == "__main__":
    main()
