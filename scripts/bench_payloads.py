"""The events of the peak-memory benches on the emulator.

Usage: bench_payloads.py pointers|costly EVENT_FILE
  pointers: ten Extended Client pointers to 8 MiB payloads (put in a producer bucket);
  costly:   ten plain bodies, each the costliest document the worker takes: many small maps,
            `[{"a":0},...]`, just under MAX_DOCUMENT_COST (32 MiB parsed, src/job/cost.rs).
AWS_ENDPOINT_URL must point at the emulator; RESULTS_BUCKET and QUEUE_URL come from
`emulator.sh create`.
"""

import json
import os
import sys

import boto3

# What src/job/cost.rs prices one `{"a":0},` at: its 8 bytes, an array element (64), the map's
# header (32) and first node (656), and its member (96).
SMALL_MAP_COST = 8 + 64 + 32 + 656 + 96
MAX_DOCUMENT_COST = 32 * 1_048_576

mode, event_file = sys.argv[1], sys.argv[2]
queue = os.environ["QUEUE_URL"].rsplit("/", 1)[-1]


def record(i, body, attributes=None):
    return {
        "messageId": f"m{i}", "receiptHandle": f"h{i}", "body": body,
        "attributes": {"ApproximateReceiveCount": "1"},
        "messageAttributes": attributes or {},
        "eventSource": "aws:sqs", "eventSourceARN": f"arn:aws:sqs:us-east-1:123456789012:{queue}",
    }


records = []
if mode == "pointers":
    session = boto3.session.Session(
        aws_access_key_id="emulator", aws_secret_access_key="emulator", region_name="us-east-1"
    )
    s3 = session.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"])
    producer = os.environ["RESULTS_BUCKET"] + "-producer"
    s3.create_bucket(Bucket=producer)
    prompt = "w" * (8 * 1024 * 1024)
    for i in range(10):
        body = json.dumps({"job_id": f"heavy-{i}", "contract": "summary.v1",
                           "input": {"model": "sim-1", "prompt": prompt}})
        key = f"payloads/{i}"
        s3.put_object(Bucket=producer, Key=key, Body=body.encode())
        pointer = ["software.amazon.payloadoffloading.PayloadS3Pointer",
                   {"s3BucketName": producer, "s3Key": key}]
        size = {"ExtendedPayloadSize": {"stringValue": str(len(body)), "dataType": "Number"}}
        records.append(record(i, json.dumps(pointer), size))
elif mode == "costly":
    # 5 % under the limit, for the rest of the body (job id, contract, model, prompt).
    n = int(MAX_DOCUMENT_COST * 0.95) // SMALL_MAP_COST
    rows = ",".join(['{"a":0}'] * n)
    for i in range(10):
        body = (f'{{"job_id":"costly-{i}","contract":"summary.v1",'
                f'"input":{{"model":"sim-1","prompt":"p","rows":[{rows}]}}}}')
        records.append(record(i, body))
else:
    sys.exit(f"bench_payloads.py: unknown mode {mode!r} (pointers or costly)")
with open(event_file, "w") as f:
    json.dump({"Records": records}, f)
