//! The jobs `bench_cost` bills: how each one's first attempt goes, and its SQS record.

use aws_lambda_events::event::sqs::SqsMessage;
use fenced_jobs::clock::{Clock, SystemClock};

/// How a job's first attempt goes before one succeeds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Failing {
    /// Its first `n` attempts fail with a transient error (0: the happy path).
    Transient(u32),
    /// Its first call is refused before any work (a 429 or 529): the attempt is given back.
    Throttled,
    /// Its first answer is one the job's contract refuses (cut off at the token limit).
    Refused,
    /// Its first owner dies while the call runs; the next delivery, once the lease lapsed,
    /// recovers the job and collects the answer from the provider by its reference.
    Recovered,
}

impl Failing {
    /// The deliveries the job takes to end.
    pub(crate) fn deliveries(self) -> u32 {
        match self {
            Failing::Transient(n) => n + 1,
            Failing::Throttled | Failing::Refused | Failing::Recovered => 2,
        }
    }

    /// The calls the job makes (a recovery asks for the answer instead).
    pub(crate) fn calls(self) -> u32 {
        match self {
            Failing::Transient(n) => n + 1,
            Failing::Throttled | Failing::Refused => 2,
            Failing::Recovered => 1,
        }
    }

    /// The job's `simulate` controls.
    fn simulate(self) -> String {
        match self {
            Failing::Transient(n) => format!(r#"{{"fail_times":{n}}}"#),
            Failing::Throttled => "{}".to_owned(),
            Failing::Refused => r#"{"bad_answer":"truncated","bad_times":1}"#.to_owned(),
            Failing::Recovered => r#"{"latency_ms":200}"#.to_owned(),
        }
    }
}

/// A job's record with a prompt of `bytes`, as a producer sends it `sent_ago_ms` before now,
/// delivered for the `receive`th time, going as `failing` says.
pub(crate) fn record(
    job: &str,
    bytes: usize,
    failing: Failing,
    receive: u32,
    sent_ago_ms: i64,
) -> SqsMessage {
    let mut m = record_of(job, bytes, &failing.simulate(), "", receive);
    let sent = SystemClock.now_ms() - sent_ago_ms;
    m.attributes
        .insert("SentTimestamp".into(), sent.to_string());
    m
}

/// A deferrable job's record (its batch runs until the benchmark ends it).
pub(crate) fn deferrable(job: &str, bytes: usize, receive: u32) -> SqsMessage {
    record_of(
        job,
        bytes,
        r#"{"latency_ms":3600000}"#,
        r#","deferrable":true"#,
        receive,
    )
}

fn record_of(job: &str, bytes: usize, simulate: &str, extra: &str, receive: u32) -> SqsMessage {
    let now = SystemClock.now_ms().to_string();
    let mut prompt = format!("Summarise document {job}.");
    prompt.extend(std::iter::repeat_n('x', bytes.saturating_sub(prompt.len())));
    let mut m = SqsMessage::default();
    m.message_id = Some(format!("{job}-msg"));
    m.receipt_handle = Some(format!("{job}-handle"));
    m.body = Some(format!(
        r#"{{"job_id":"{job}","contract":"summary.v1","input":{{"model":"sim-1","messages":[{{"role":"user","content":"{prompt}"}}],"parameters":{{"temperature":0}},"simulate":{simulate}{extra}}}}}"#
    ));
    m.event_source = Some("aws:sqs".into());
    m.event_source_arn = Some("arn:aws:sqs:us-east-1:123456789012:bench".into());
    let receive = receive.to_string();
    for (k, v) in [
        ("ApproximateReceiveCount", receive.as_str()),
        ("SentTimestamp", now.as_str()),
        ("ApproximateFirstReceiveTimestamp", now.as_str()),
        ("SenderId", "AIDABENCH"),
    ] {
        m.attributes.insert(k.into(), v.into());
    }
    m
}
