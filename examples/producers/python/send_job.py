"""Sending jobs to fenced-jobs from Python, with boto3.

A job is one SQS message whose body is the job as JSON (docs/contracts.md, "The message
contract"). A body larger than the queue takes goes to S3, and the message carries an Amazon
SQS Extended Client pointer to it, which the worker follows (it may read only the bucket the
stack names in `PayloadBucketName`).
"""

import json
import os
import uuid

import boto3

sqs = boto3.client("sqs")
s3 = boto3.client("s3")

# Bodies above this go through S3: the Extended Client's own threshold (SQS takes 1 MiB).
INLINE_LIMIT = 256 * 1024
POINTER_CLASS = "software.amazon.payloadoffloading.PayloadS3Pointer"


def send_job(job, queue_url=None, payload_bucket=None):
    """Sends `job` (a dict: job_id, contract, input, and optionally deadline_at, max_attempts,
    max_cost, metadata, tenant, priority) to the work queue; returns the SQS message id.

    Sending the same job again is safe: the worker runs it once. Sending another input under
    the same job_id is a conflict, never a second run.
    """
    queue_url = queue_url or os.environ["QUEUE_URL"]
    body = json.dumps(job, separators=(",", ":"))
    size = len(body.encode())
    attributes = {}
    if size > INLINE_LIMIT:
        bucket = payload_bucket or os.environ["PAYLOAD_BUCKET"]
        key = f"payloads/{uuid.uuid4()}"
        s3.put_object(Bucket=bucket, Key=key, Body=body.encode())
        body = json.dumps([POINTER_CLASS, {"s3BucketName": bucket, "s3Key": key}])
        attributes = {
            "ExtendedPayloadSize": {"DataType": "Number", "StringValue": str(size)},
            # Names the job, so that a payload your bucket's lifecycle removed never sends a
            # job the ledger holds to the dead-letter queue.
            "fenced-jobs.job-id": {"DataType": "String", "StringValue": job["job_id"]},
        }
    sent = sqs.send_message(
        QueueUrl=queue_url, MessageBody=body, MessageAttributes=attributes
    )
    return sent["MessageId"]


if __name__ == "__main__":
    # `python send_job.py < jobs.jsonl`: each line a job, each sent; prints the message ids.
    import sys

    for line in sys.stdin:
        if line.strip():
            print(send_job(json.loads(line)))
