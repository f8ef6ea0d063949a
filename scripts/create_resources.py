"""Creates the job table, the work queue and its dead-letter queue on the local emulator.

Usage: create_resources.py TABLE QUEUE   (AWS_ENDPOINT_URL must point at the emulator)
Prints shell exports for JOBS_TABLE, QUEUE_URL and DLQ_URL.
"""

import json
import os
import sys
from urllib.parse import urlparse

import boto3

endpoint = os.environ["AWS_ENDPOINT_URL"]
host = urlparse(endpoint).hostname
if host not in ("127.0.0.1", "localhost", "::1"):
    sys.exit(f"refusing to create resources on a non-local endpoint: {endpoint}")

table, queue = sys.argv[1], sys.argv[2]
session = boto3.session.Session(
    aws_access_key_id="emulator", aws_secret_access_key="emulator", region_name="us-east-1"
)
ddb = session.client("dynamodb", endpoint_url=endpoint)
sqs = session.client("sqs", endpoint_url=endpoint)

if table not in ddb.list_tables()["TableNames"]:
    ddb.create_table(
        TableName=table,
        AttributeDefinitions=[
            {"AttributeName": "job_id", "AttributeType": "S"},
            {"AttributeName": "attention", "AttributeType": "S"},
            {"AttributeName": "updated_at", "AttributeType": "N"},
            {"AttributeName": "deadline_at", "AttributeType": "N"},
        ],
        KeySchema=[{"AttributeName": "job_id", "KeyType": "HASH"}],
        # The sparse indexes of jobs that are not terminal: by last change (jobctl list, the
        # reconciler's re-sends) and by deadline (the reconciler's expiry).
        GlobalSecondaryIndexes=[
            {
                "IndexName": name,
                "KeySchema": [
                    {"AttributeName": "attention", "KeyType": "HASH"},
                    {"AttributeName": sort, "KeyType": "RANGE"},
                ],
                "Projection": {"ProjectionType": "KEYS_ONLY"},
            }
            for name, sort in [("attention-index", "updated_at"), ("deadline-index", "deadline_at")]
        ],
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
        "RedrivePolicy": json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 5}),
    },
)["QueueUrl"]

print(f"export JOBS_TABLE={table}")
print(f"export QUEUE_URL={queue_url}")
print(f"export DLQ_URL={dlq_url}")
