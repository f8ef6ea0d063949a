"""Consuming fenced-jobs' completion events from Python, with boto3, and fetching each answer.

The stack publishes one event per job that ended (or needs a decision) to the bus, topic or
queue it was given (docs/contracts.md, "Completion events"). This reads them from an SQS queue:
the stack's event queue, or a queue an EventBridge rule or an SNS subscription fills (then the
event is in the envelope's `detail` or `Message`). The answer is in the event when it is small,
in the results bucket (checked against the size and SHA-256 the ledger recorded) when it is
large, and in the ledger item when it is too large for the event but not for the item.
"""

import hashlib
import json
import os

import boto3

sqs = boto3.client("sqs")
s3 = boto3.client("s3")
dynamodb = boto3.client("dynamodb")


def answer_of(event, table=None):
    """The accepted answer (the stored document, parsed) of a `succeeded` event; None for an
    event of another state (`failed_terminal`, `expired`, `cancelled`: see its `error`)."""
    if event["state"] != "succeeded":
        return None
    if "result" in event:
        return event["result"]
    if "result_ref" in event:
        ref = event["result_ref"]
        body = s3.get_object(Bucket=ref["bucket"], Key=ref["key"])["Body"].read()
        if len(body) != ref["size"] or hashlib.sha256(body).hexdigest() != ref["sha256"]:
            raise ValueError(f"{ref['key']} is not the answer the ledger accepted")
        return json.loads(body)
    # Too large for the event, small enough for the ledger item.
    item = dynamodb.get_item(
        TableName=table or os.environ["JOBS_TABLE"],
        Key={"job_id": {"S": event["job_id"]}},
        ProjectionExpression="#r",
        ExpressionAttributeNames={"#r": "result"},
        ConsistentRead=True,
    )["Item"]
    return json.loads(item["result"]["S"])


def receive(queue_url=None, wait_seconds=1):
    """Yields (event, answer) for each event the queue gives in one receive, deleting each
    message once the caller has taken it. An event can come twice (SQS delivers at least once):
    `event_id` is the same each time, so keep the ids you have handled."""
    queue_url = queue_url or os.environ["EVENT_QUEUE_URL"]
    got = sqs.receive_message(
        QueueUrl=queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=wait_seconds
    )
    for message in got.get("Messages", []):
        event = json.loads(message["Body"])
        yield event, answer_of(event)
        sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=message["ReceiptHandle"])


if __name__ == "__main__":
    # `python consume_events.py [COUNT]`: reads events until COUNT (1) have come, or a minute has
    # passed; prints each as a JSON line with a fingerprint of its answer, never the answer.
    import sys
    import time

    count = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    seen = set()
    until = time.time() + 60
    while len(seen) < count and time.time() < until:
        for event, answer in receive():
            if event["event_id"] in seen:
                continue
            seen.add(event["event_id"])
            output = None if answer is None else answer["output"]
            text = output if isinstance(output, str) else json.dumps(output)
            fingerprint = hashlib.sha256(text.encode()).hexdigest()
            line = {"job_id": event["job_id"], "state": event["state"], "answer_sha256": fingerprint}
            print(json.dumps(line), flush=True)
