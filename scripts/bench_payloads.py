"""Ten Extended Client pointers to 8 MiB payloads on the emulator, for the peak-memory bench:
puts the payloads in a producer bucket and writes the SQS event that points at them.

Usage: bench_payloads.py EVENT_FILE   (AWS_ENDPOINT_URL must point at the emulator; the
results bucket and queue come from `emulator.sh create`: RESULTS_BUCKET, QUEUE_URL)
"""

import json
import os
import sys

import boto3

session = boto3.session.Session(
    aws_access_key_id="emulator", aws_secret_access_key="emulator", region_name="us-east-1"
)
s3 = session.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"])
producer = os.environ["RESULTS_BUCKET"] + "-producer"
s3.create_bucket(Bucket=producer)
queue = os.environ["QUEUE_URL"].rsplit("/", 1)[-1]
prompt = "w" * (8 * 1024 * 1024)
records = []
for i in range(10):
    body = json.dumps({"job_id": f"heavy-{i}", "contract": "summary.v1",
                       "input": {"model": "sim-1", "prompt": prompt}})
    key = f"payloads/{i}"
    s3.put_object(Bucket=producer, Key=key, Body=body.encode())
    pointer = ["software.amazon.payloadoffloading.PayloadS3Pointer",
               {"s3BucketName": producer, "s3Key": key}]
    records.append({
        "messageId": f"m{i}", "receiptHandle": f"h{i}", "body": json.dumps(pointer),
        "attributes": {"ApproximateReceiveCount": "1"},
        "messageAttributes": {"ExtendedPayloadSize": {"stringValue": str(len(body)), "dataType": "Number"}},
        "eventSource": "aws:sqs", "eventSourceARN": f"arn:aws:sqs:us-east-1:123456789012:{queue}",
    })
with open(sys.argv[1], "w") as f:
    json.dump({"Records": records}, f)
