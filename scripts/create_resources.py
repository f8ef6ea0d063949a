"""Creates the job table (with its stream), the work queue and its dead-letter queue, the
results bucket, and an EventBridge bus whose rule sends completion events to a queue, on the
local emulator.

Usage: create_resources.py TABLE QUEUE [--also-queue NAME ...]
(AWS_ENDPOINT_URL must point at the emulator). Prints shell exports for JOBS_TABLE, QUEUE_URL,
DLQ_URL, RESULTS_BUCKET, EVENT_BUS_NAME and EVENTS_QUEUE_URL. `--also-queue` creates more work
queues (a name ending in `.fifo` makes a FIFO queue), such as the ones the sample events in
`events/` name. Each resource is created only if it is not there yet.
"""

import argparse
import json
import os
import sys
from urllib.parse import urlparse

import boto3

endpoint = os.environ["AWS_ENDPOINT_URL"]
host = urlparse(endpoint).hostname
if host not in ("127.0.0.1", "localhost", "::1"):
    sys.exit(f"refusing to create resources on a non-local endpoint: {endpoint}")

parser = argparse.ArgumentParser()
parser.add_argument("table")
parser.add_argument("queue")
parser.add_argument("--also-queue", action="append", default=[])
args = parser.parse_args()
table, queue = args.table, args.queue
session = boto3.session.Session(
    aws_access_key_id="emulator", aws_secret_access_key="emulator", region_name="us-east-1"
)
ddb = session.client("dynamodb", endpoint_url=endpoint)
sqs = session.client("sqs", endpoint_url=endpoint)
s3 = session.client("s3", endpoint_url=endpoint)
events = session.client("events", endpoint_url=endpoint)

if table not in ddb.list_tables()["TableNames"]:
    ddb.create_table(
        TableName=table,
        AttributeDefinitions=[
            {"AttributeName": "job_id", "AttributeType": "S"},
            {"AttributeName": "attention", "AttributeType": "S"},
            {"AttributeName": "updated_at", "AttributeType": "N"},
            {"AttributeName": "deadline_at", "AttributeType": "N"},
            {"AttributeName": "due_on", "AttributeType": "S"},
        ],
        KeySchema=[{"AttributeName": "job_id", "KeyType": "HASH"}],
        # The sparse indexes of jobs that are not terminal: by last change (jobctl list, the
        # reconciler's re-sends) and by deadline (the reconciler's expiry).
        # And the terminal jobs by the day they finished (jobctl export, the orphan sweep).
        GlobalSecondaryIndexes=[
            {
                "IndexName": name,
                "KeySchema": [
                    {"AttributeName": partition, "KeyType": "HASH"},
                    {"AttributeName": sort, "KeyType": "RANGE"},
                ],
                "Projection": {"ProjectionType": "KEYS_ONLY"},
            }
            for name, partition, sort in [
                ("attention-index", "attention", "updated_at"),
                ("deadline-index", "attention", "deadline_at"),
                ("due-index", "due_on", "deadline_at"),
            ]
        ],
        StreamSpecification={"StreamEnabled": True, "StreamViewType": "NEW_AND_OLD_IMAGES"},
        BillingMode="PAY_PER_REQUEST",
    )
    ddb.update_time_to_live(
        TableName=table,
        TimeToLiveSpecification={"Enabled": True, "AttributeName": "expires_at"},
    )

dlq_url = sqs.create_queue(
    QueueName=f"{queue}-dlq", Attributes={"MessageRetentionPeriod": "1209600"}
)["QueueUrl"]
dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
queue_url = sqs.create_queue(
    QueueName=queue,
    Attributes={
        "VisibilityTimeout": os.environ.get("QUEUE_VISIBILITY_TIMEOUT", "30"),
        "RedrivePolicy": json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 300}),
    },
)["QueueUrl"]

for name in args.also_queue:
    fifo = {"FifoQueue": "true", "ContentBasedDeduplication": "true"} if name.endswith(".fifo") else {}
    sqs.create_queue(QueueName=name, Attributes=fifo)

bucket = f"{queue}-results".lower()
s3.create_bucket(Bucket=bucket)

bus = f"{queue}-bus"
events_url = sqs.create_queue(QueueName=f"{queue}-events")["QueueUrl"]
events_arn = sqs.get_queue_attributes(QueueUrl=events_url, AttributeNames=["QueueArn"])["Attributes"][
    "QueueArn"
]
if bus not in [b["Name"] for b in events.list_event_buses()["EventBuses"]]:
    events.create_event_bus(Name=bus)
events.put_rule(
    Name="completions", EventBusName=bus, EventPattern=json.dumps({"source": ["fenced-jobs"]})
)
events.put_targets(
    Rule="completions", EventBusName=bus, Targets=[{"Id": "events-queue", "Arn": events_arn}]
)

print(f"export JOBS_TABLE={table}")
print(f"export QUEUE_URL={queue_url}")
print(f"export DLQ_URL={dlq_url}")
print(f"export RESULTS_BUCKET={bucket}")
print(f"export EVENT_BUS_NAME={bus}")
print(f"export EVENTS_QUEUE_URL={events_url}")
