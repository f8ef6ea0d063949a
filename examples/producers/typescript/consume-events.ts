// Consuming fenced-jobs' completion events from TypeScript, with the AWS SDK for JavaScript v3,
// and fetching each answer.
//
// The stack publishes one event per job that ended (or needs a decision) to the bus, topic or
// queue it was given (docs/contracts.md, "Completion events"). This reads them from an SQS
// queue: the stack's event queue, or a queue an EventBridge rule or an SNS subscription fills
// (then the event is in the envelope's `detail` or `Message`). The answer is in the event when
// it is small, in the results bucket (checked against the size and SHA-256 the ledger recorded)
// when it is large, and in the ledger item when it is too large for the event but not the item.

import { createHash } from "node:crypto";
import { DynamoDBClient, GetItemCommand } from "@aws-sdk/client-dynamodb";
import { GetObjectCommand, S3Client } from "@aws-sdk/client-s3";
import { DeleteMessageCommand, ReceiveMessageCommand, SQSClient } from "@aws-sdk/client-sqs";

const sqs = new SQSClient({});
// A local emulator (AWS_ENDPOINT_URL) takes path-style bucket addresses only.
const s3 = new S3Client({ forcePathStyle: process.env.AWS_ENDPOINT_URL !== undefined });
const dynamodb = new DynamoDBClient({});

/** A completion event (the fields this reads; see docs/contracts.md for all of them). */
export interface CompletionEvent {
  event_id: string;
  job_id: string;
  state: "succeeded" | "failed_terminal" | "expired" | "cancelled" | "unknown";
  result?: Answer;
  result_ref?: { bucket: string; key: string; size: number; sha256: string };
  result_in_ledger?: boolean;
  error?: { kind: string; message: string };
}

/** The accepted answer: the document the worker stored. */
export interface Answer {
  contract: string;
  model: string;
  output: unknown;
  [key: string]: unknown;
}

/** The accepted answer of a `succeeded` event; undefined for another state (see its `error`). */
export async function answerOf(
  event: CompletionEvent,
  table = process.env.JOBS_TABLE!,
): Promise<Answer | undefined> {
  if (event.state !== "succeeded") return undefined;
  if (event.result !== undefined) return event.result;
  if (event.result_ref) {
    const ref = event.result_ref;
    const got = await s3.send(new GetObjectCommand({ Bucket: ref.bucket, Key: ref.key }));
    const body = Buffer.from(await got.Body!.transformToByteArray());
    const sha256 = createHash("sha256").update(body).digest("hex");
    if (body.length !== ref.size || sha256 !== ref.sha256) {
      throw new Error(`${ref.key} is not the answer the ledger accepted`);
    }
    return JSON.parse(body.toString("utf8")) as Answer;
  }
  // Too large for the event, small enough for the ledger item.
  const item = await dynamodb.send(
    new GetItemCommand({
      TableName: table,
      Key: { job_id: { S: event.job_id } },
      ProjectionExpression: "#r",
      ExpressionAttributeNames: { "#r": "result" },
      ConsistentRead: true,
    }),
  );
  return JSON.parse(item.Item!.result.S!) as Answer;
}

/**
 * The events one receive gives, each with its answer, each message deleted once the caller
 * took it. An event can come twice (SQS delivers at least once): `event_id` is the same each
 * time, so keep the ids you have handled.
 */
export async function* receive(
  queueUrl = process.env.EVENT_QUEUE_URL!,
  waitSeconds = 1,
): AsyncGenerator<[CompletionEvent, Answer | undefined]> {
  const got = await sqs.send(
    new ReceiveMessageCommand({
      QueueUrl: queueUrl,
      MaxNumberOfMessages: 10,
      WaitTimeSeconds: waitSeconds,
    }),
  );
  for (const message of got.Messages ?? []) {
    const event = JSON.parse(message.Body!) as CompletionEvent;
    yield [event, await answerOf(event)];
    await sqs.send(new DeleteMessageCommand({ QueueUrl: queueUrl, ReceiptHandle: message.ReceiptHandle! }));
  }
}

// `node dist/consume-events.js [COUNT]`: reads events until COUNT (1) have come, or a minute
// has passed; prints each as a JSON line with a fingerprint of its answer, never the answer.
if (import.meta.url === `file://${process.argv[1]}`) {
  const count = Number(process.argv[2] ?? 1);
  const seen = new Set<string>();
  const until = Date.now() + 60_000;
  while (seen.size < count && Date.now() < until) {
    for await (const [event, answer] of receive()) {
      if (seen.has(event.event_id)) continue;
      seen.add(event.event_id);
      const output = answer === undefined ? undefined : answer.output;
      const text = typeof output === "string" ? output : JSON.stringify(output ?? null);
      const fingerprint = createHash("sha256").update(text).digest("hex");
      console.log(JSON.stringify({ job_id: event.job_id, state: event.state, answer_sha256: fingerprint }));
    }
  }
}
