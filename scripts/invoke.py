"""Invokes the functions with sample events under cargo-lambda's Lambda runtime emulator, against
the local AWS emulator, and prints each answer; with --check, also compares each answer with
what events/README.md says it should be and checks the effects in the resources of this run.

    invoke.py [--check] [--function-table NAME] EVENT...

Needs AWS_ENDPOINT_URL (a loopback address) and the variables `emulator.sh create` prints
(JOBS_TABLE, QUEUE_URL, DLQ_URL, RESULTS_BUCKET, EVENT_BUS_NAME, EVENTS_QUEUE_URL), cargo-lambda
on PATH, and the binaries in WORKER_BIN and DISPATCHER_BIN (default target/debug/...).

`cargo lambda watch --only-lambda-apis` serves the Runtime API and the invoke endpoint; this
script starts each function binary itself with exactly the environment of this run. (Under a
plain `cargo lambda watch`, `[package.metadata.lambda.env]` in Cargo.toml is applied after the
`--env-var` flags each time the function starts, so it would win; the README says more.)

The function is chosen by the event: SQS records go to the worker, DynamoDB stream records to
the dispatcher, and a bare job message (such as events/job.json) is sent to the worker as the
body of one SQS record.
"""

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import time
from urllib.parse import urlparse

import boto3

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TERMINAL = {"succeeded", "failed_terminal", "expired", "cancelled"}
SOURCE_ATTRIBUTE = "fenced-jobs.source-message-id"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port, what, proc, seconds=60):
    for _ in range(seconds * 10):
        if proc.poll() is not None:
            sys.exit(f"invoke: {what} exited with status {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.1)
    sys.exit(f"invoke: {what} did not listen on 127.0.0.1:{port}")


def load_event(path):
    """The event to invoke with, and the function it is for."""
    with open(path, encoding="utf-8") as f:
        event = json.load(f)
    records = event.get("Records") if isinstance(event, dict) else None
    if not records:
        if isinstance(event, dict) and "job_id" in event:
            print(f"{path} is a job message: invoking the worker with it as one SQS record")
            return "worker", sqs_event_around(json.dumps(event))
        sys.exit(f"invoke: {path} has no Records and is not a job message")
    sources = {r.get("eventSource") for r in records}
    if sources == {"aws:sqs"}:
        return "worker", event
    if sources == {"aws:dynamodb"}:
        return "dispatcher", event
    sys.exit(f"invoke: {path} mixes or names no event sources ({sorted(map(str, sources))})")


def sqs_event_around(body):
    now_ms = str(int(time.time() * 1000))
    return {
        "Records": [
            {
                "messageId": "00000000-0000-4000-8000-000000000001",
                "receiptHandle": "AQEB-local-invoke-handle",
                "body": body,
                "attributes": {
                    "ApproximateReceiveCount": "1",
                    "SentTimestamp": now_ms,
                    "SenderId": "AIDAEXAMPLE",
                    "ApproximateFirstReceiveTimestamp": now_ms,
                },
                "messageAttributes": {},
                "md5OfBody": "00000000000000000000000000000000",
                "eventSource": "aws:sqs",
                "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:jobs",
                "awsRegion": "us-east-1",
            }
        ]
    }


def expectations():
    """events/README.md's table: for each event file, the message ids its answer reports as
    failures and the number of records dead-lettered."""
    table = {}
    with open(os.path.join(ROOT, "events", "README.md"), encoding="utf-8") as f:
        for line in f:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            name = re.match(r"\[`([^`]+\.json)`\]", cells[0]) if len(cells) >= 5 else None
            if not name:
                continue
            failures = set(re.findall(r"`([0-9a-f-]{36})`", cells[3]))
            dead = re.match(r"(\d+)", cells[4])
            table[name.group(1)] = (failures, int(dead.group(1)) if dead else 0)
    return table


class Functions:
    """cargo-lambda's Runtime API, and each function binary polling it."""

    def __init__(self, env):
        self.env = env
        self.port = free_port()
        self.log = open(os.path.join(ROOT, ".emulator", "invoke.log"), "w", encoding="utf-8")
        self.watch = subprocess.Popen(
            ["cargo", "lambda", "watch", "--only-lambda-apis", "--invoke-address", "127.0.0.1",
             "--invoke-port", str(self.port)],
            cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT,
        )
        wait_for_port(self.port, "cargo lambda watch", self.watch)
        self.running = {}

    def start(self, name):
        if name in self.running:
            return
        binary = os.environ.get(f"{name.upper()}_BIN") or os.path.join(ROOT, "target", "debug", name)
        if not os.access(binary, os.X_OK):
            sys.exit(f"invoke: no {name} binary at {binary}")
        env = dict(self.env)
        env.update({
            "AWS_LAMBDA_RUNTIME_API": f"http://127.0.0.1:{self.port}/.rt/{name}",
            "AWS_LAMBDA_FUNCTION_NAME": name,
            "AWS_LAMBDA_FUNCTION_VERSION": "1",
            "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "128",
        })
        self.running[name] = subprocess.Popen([binary], env=env, stdout=self.log, stderr=subprocess.STDOUT)

    def invoke(self, name, event):
        self.start(name)
        out = subprocess.run(
            ["cargo", "lambda", "invoke", name, "--invoke-address", "127.0.0.1",
             "--invoke-port", str(self.port), "--data-ascii", json.dumps(event)],
            cwd=ROOT, capture_output=True, text=True, timeout=180,
        )
        if out.returncode != 0:
            sys.exit(f"invoke: cargo lambda invoke {name} failed: {out.stderr.strip()}")
        return json.loads(out.stdout)

    def stop(self):
        for proc in [*self.running.values(), self.watch]:
            proc.terminate()
        for proc in [*self.running.values(), self.watch]:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        self.log.close()


def clients():
    session = boto3.session.Session(
        aws_access_key_id="emulator", aws_secret_access_key="emulator", region_name="us-east-1"
    )
    endpoint = os.environ["AWS_ENDPOINT_URL"]
    return session.client("dynamodb", endpoint_url=endpoint), session.client("sqs", endpoint_url=endpoint)


def drain(sqs, url, wait=0):
    """Every message on the queue at `url` now, deleted as read."""
    messages = []
    while True:
        out = sqs.receive_message(
            QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=wait,
            MessageAttributeNames=["All"],
        )
        batch = out.get("Messages", [])
        if not batch:
            return messages
        messages += batch
        sqs.delete_message_batch(
            QueueUrl=url,
            Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(batch)],
        )
        wait = 0


def check(path, function, event, answer, expected):
    """What is wrong with this answer and its effects (empty when it is as documented)."""
    ddb, sqs = clients()
    problems = []
    failures = {f["itemIdentifier"] for f in answer.get("batchItemFailures", [])}
    want_failures, want_dead = expected
    if failures != want_failures:
        problems.append(f"reported failures {sorted(failures)}, expected {sorted(want_failures)}")
    if function == "dispatcher":
        published = [json.loads(m["Body"]) for m in drain(sqs, os.environ["EVENTS_QUEUE_URL"], wait=2)]
        jobs = sorted(e.get("detail", {}).get("job_id", "?") for e in published)
        want = sorted(
            r["dynamodb"]["NewImage"]["job_id"]["S"]
            for r in event["Records"]
            if r["dynamodb"].get("NewImage", {}).get("state", {}).get("S") in TERMINAL | {"unknown"}
        )
        if jobs != want:
            problems.append(f"published events for {jobs}, expected {want}")
        return problems
    dead = {
        m.get("MessageAttributes", {}).get(SOURCE_ATTRIBUTE, {}).get("StringValue")
        for m in drain(sqs, os.environ["DLQ_URL"])
    }
    if len(dead) != want_dead:
        problems.append(f"{len(dead)} records dead-lettered, expected {want_dead}")
    # An acknowledged record is a terminal job in the table this run created, or a dead letter.
    for record in event["Records"]:
        if record["messageId"] in failures or record["messageId"] in dead:
            continue
        try:
            job_id = json.loads(record["body"])["job_id"]
        except (ValueError, KeyError, TypeError):
            problems.append(f"record {record['messageId']} acknowledged, but it carries no job")
            continue
        item = ddb.get_item(
            TableName=os.environ["JOBS_TABLE"], Key={"job_id": {"S": job_id}}, ConsistentRead=True
        ).get("Item")
        state = item["state"]["S"] if item else None
        if state not in TERMINAL:
            problems.append(
                f"record {record['messageId']} acknowledged, but job {job_id} is {state or 'absent'} "
                f"in {os.environ['JOBS_TABLE']}"
            )
    return problems


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with events/README.md")
    parser.add_argument(
        "--function-table",
        help="give the functions this table instead of the run's (to see the check catch it)",
    )
    parser.add_argument("events", nargs="+")
    args = parser.parse_args()
    if urlparse(os.environ.get("AWS_ENDPOINT_URL", "")).hostname not in ("127.0.0.1", "localhost", "::1"):
        sys.exit("invoke: AWS_ENDPOINT_URL must point at the local emulator")
    names = ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION",
             "JOBS_TABLE", "QUEUE_URL", "DLQ_URL", "RESULTS_BUCKET", "EVENT_BUS_NAME", "PATH")
    env = {name: os.environ[name] for name in names}
    if args.function_table:
        env["JOBS_TABLE"] = args.function_table
    env.update({"PROVIDER": "simulated", "AWS_EC2_METADATA_DISABLED": "true",
                "RUST_LOG": os.environ.get("RUST_LOG", "info")})
    table = expectations() if args.check else {}
    functions = Functions(env)
    failed = 0
    try:
        for path in args.events:
            function, event = load_event(path)
            print(f"invoking {function} with {path} (table {env['JOBS_TABLE']})")
            answer = functions.invoke(function, event)
            print(json.dumps(answer, separators=(",", ":")))
            if args.check:
                name = os.path.basename(path)
                if name not in table:
                    sys.exit(f"invoke: events/README.md says nothing of {name}")
                problems = check(path, function, event, answer, table[name])
                for p in problems:
                    print(f"  {name}: {p}", file=sys.stderr)
                failed += bool(problems)
    finally:
        functions.stop()
    if failed:
        print(f"invoke: {failed} of {len(args.events)} events not answered as documented; "
              "the functions' logs are in .emulator/invoke.log", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
