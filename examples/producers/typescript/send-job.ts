// Sending jobs to fenced-jobs from TypeScript, with the AWS SDK for JavaScript v3.
//
// A job is one SQS message whose body is the job as JSON (docs/contracts.md, "The message
// contract"). A body larger than the queue takes goes to S3, and the message carries an Amazon
// SQS Extended Client pointer to it, which the worker follows (it may read only the bucket the
// stack names in `PayloadBucketName`).

import { randomUUID } from "node:crypto";
import { PutObjectCommand, S3Client } from "@aws-sdk/client-s3";
import { MessageAttributeValue, SendMessageCommand, SQSClient } from "@aws-sdk/client-sqs";

const sqs = new SQSClient({});
// A local emulator (AWS_ENDPOINT_URL) takes path-style bucket addresses only.
const s3 = new S3Client({ forcePathStyle: process.env.AWS_ENDPOINT_URL !== undefined });

/** Bodies above this go through S3: the Extended Client's own threshold (SQS takes 1 MiB). */
const INLINE_LIMIT = 256 * 1024;
const POINTER_CLASS = "software.amazon.payloadoffloading.PayloadS3Pointer";

/** A job as the message contract has it. */
export interface Job {
  job_id: string;
  contract: string;
  input: { model: string; prompt?: string; messages?: unknown[]; [key: string]: unknown };
  deadline_at?: string;
  max_attempts?: number;
  max_cost?: number;
  metadata?: Record<string, unknown>;
  tenant?: string;
  priority?: "urgent" | "normal";
}

/**
 * Sends `job` to the work queue; returns the SQS message id. Sending the same job again is
 * safe: the worker runs it once. Another input under the same job_id is a conflict, never a
 * second run.
 */
export async function sendJob(
  job: Job,
  queueUrl = process.env.QUEUE_URL!,
  payloadBucket = process.env.PAYLOAD_BUCKET,
): Promise<string> {
  let body = JSON.stringify(job);
  const size = Buffer.byteLength(body);
  let attributes: Record<string, MessageAttributeValue> | undefined;
  if (size > INLINE_LIMIT) {
    if (!payloadBucket) throw new Error("a job this large needs PAYLOAD_BUCKET");
    const key = `payloads/${randomUUID()}`;
    await s3.send(new PutObjectCommand({ Bucket: payloadBucket, Key: key, Body: body }));
    body = JSON.stringify([POINTER_CLASS, { s3BucketName: payloadBucket, s3Key: key }]);
    attributes = {
      ExtendedPayloadSize: { DataType: "Number", StringValue: String(size) },
      // Names the job, so that a payload your bucket's lifecycle removed never sends a job
      // the ledger holds to the dead-letter queue.
      "fenced-jobs.job-id": { DataType: "String", StringValue: job.job_id },
    };
  }
  const sent = await sqs.send(
    new SendMessageCommand({ QueueUrl: queueUrl, MessageBody: body, MessageAttributes: attributes }),
  );
  return sent.MessageId!;
}

// `node dist/send-job.js < jobs.jsonl`: each line a job, each sent; prints the message ids.
if (import.meta.url === `file://${process.argv[1]}`) {
  let input = "";
  for await (const chunk of process.stdin) input += chunk;
  for (const line of input.split("\n").filter((l) => l.trim())) {
    console.log(await sendJob(JSON.parse(line) as Job));
  }
}
