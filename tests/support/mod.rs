//! Shared set-up for both test binaries (`tests/memory`, `tests/emulator`): SDK clients pointed
//! at `AWS_ENDPOINT_URL` (which must be a loopback address), tables and queues with unique names
//! so tests run in parallel, and the settings, job bodies and ledger requests the tests build.

#![allow(dead_code)]

pub mod contracts;
pub mod http;
pub mod providers;

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use aws_sdk_sqs::types::QueueAttributeName;
use fenced_jobs::clock::SystemClock;
use fenced_jobs::job::{Expect, NewJob};
use fenced_jobs::ledger::dynamodb::DynamoLedger;
use fenced_jobs::ledger::{AttemptEnd, ClaimRequest, EndRequest, JobLedger, RecoverRequest, Write};
use fenced_jobs::provider::Provider;
use fenced_jobs::provider::{Answer, ProviderError, ProviderRequest, SimulatedProvider};
use fenced_jobs::queue::SqsVisibility;
use fenced_jobs::testing::event_source::{LocalEventSource, PollReport};
use fenced_jobs::testing::sdk_calls::{CallCounter, counted_clients};
use fenced_jobs::worker::Settings;
use fenced_jobs::worker::handler::{BatchHandler, BatchReport};
use fenced_jobs::worker::processor::Processor;

/// A fixed instant of the ledger tests, in milliseconds.
pub const T: i64 = 1_800_000_000_000;

/// The sender moto names on every message (its `SenderId`): on the emulator the worker, the
/// producers and the tests are all this one principal.
pub const EMULATOR_SENDER: &str = "AIDAIT2UOQQY3AUEKVGXU";

/// The queue the in-memory tests' records come from.
pub const ARN: &str = "arn:aws:sqs:us-east-1:123456789012:jobs";

/// Clients on the emulator, with a request counter on each.
pub struct Emulator {
    pub ddb: aws_sdk_dynamodb::Client,
    pub sqs: aws_sdk_sqs::Client,
    pub calls: CallCounter,
    pub s3: aws_sdk_s3::Client,
    pub events: aws_sdk_eventbridge::Client,
    pub streams: aws_sdk_dynamodbstreams::Client,
    /// The configuration the clients were built from (for other services' clients).
    pub config: aws_config::SdkConfig,
}

impl Emulator {
    fn on(config: &aws_config::SdkConfig) -> Emulator {
        let (ddb, sqs, calls) = counted_clients(config);
        Emulator {
            ddb,
            sqs,
            calls,
            s3: fenced_jobs::config::s3_client(config),
            events: aws_sdk_eventbridge::Client::new(config),
            streams: aws_sdk_dynamodbstreams::Client::new(config),
            config: config.clone(),
        }
    }

    /// A new S3 bucket.
    pub async fn bucket(&self) -> String {
        let name = unique("bucket").to_lowercase();
        self.s3
            .create_bucket()
            .bucket(&name)
            .send()
            .await
            .expect("create bucket");
        name
    }
}

/// A queue and its dead-letter queue.
pub struct Queue {
    pub url: String,
    pub arn: String,
    pub dlq_url: String,
}

pub async fn emulator() -> Emulator {
    let endpoint = std::env::var("AWS_ENDPOINT_URL").unwrap_or_default();
    let local = ["http://127.0.0.1:", "http://localhost:", "http://[::1]:"];
    assert!(
        local.iter().any(|p| endpoint.starts_with(p)),
        "AWS_ENDPOINT_URL must point at the local emulator (got {endpoint:?}); run `make test`"
    );
    let config = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .region(aws_config::Region::new("us-east-1"))
        .load()
        .await;
    Emulator::on(&config)
}

/// The emulator's clients for one role of the template: every request they send is recorded
/// into `calls`, with `role`, for `scripts/iam_check.py` to judge against that role's policy.
pub async fn emulator_as(
    role: &str,
    calls: &std::sync::Arc<std::sync::Mutex<Vec<fenced_jobs::testing::sdk_calls::RecordedCall>>>,
) -> Emulator {
    use fenced_jobs::testing::sdk_calls::CallRecorder;
    let config = emulator().await.config;
    let recorder = CallRecorder::new(role, calls.clone());
    let counter = CallCounter::new();
    Emulator {
        ddb: aws_sdk_dynamodb::Client::from_conf(
            aws_sdk_dynamodb::config::Builder::from(&config)
                .interceptor(recorder.clone())
                .interceptor(counter.clone())
                .build(),
        ),
        sqs: aws_sdk_sqs::Client::from_conf(
            aws_sdk_sqs::config::Builder::from(&config)
                .interceptor(recorder.clone())
                .interceptor(counter.clone())
                .build(),
        ),
        calls: counter,
        s3: aws_sdk_s3::Client::from_conf(
            aws_sdk_s3::config::Builder::from(&config)
                .force_path_style(true)
                .interceptor(recorder.clone())
                .build(),
        ),
        events: aws_sdk_eventbridge::Client::from_conf(
            aws_sdk_eventbridge::config::Builder::from(&config)
                .interceptor(recorder.clone())
                .build(),
        ),
        streams: aws_sdk_dynamodbstreams::Client::from_conf(
            aws_sdk_dynamodbstreams::config::Builder::from(&config)
                .interceptor(recorder)
                .build(),
        ),
        config,
    }
}

/// The same emulator, reached through `proxy_url` (a loopback proxy that may stall or refuse
/// chosen requests), with the worker's bounds on every call.
pub async fn through(proxy_url: &str, timeouts: fenced_jobs::config::SdkTimeouts) -> Emulator {
    let config = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .region(aws_config::Region::new("us-east-1"))
        .endpoint_url(proxy_url)
        .load()
        .await;
    Emulator::on(&timeouts.apply(&config))
}

pub fn unique(prefix: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!(
        "{prefix}-{}-{nanos}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

impl Emulator {
    pub async fn table(&self) -> String {
        let name = unique("jobs");
        DynamoLedger::create_table(&self.ddb, &name)
            .await
            .expect("create table");
        name
    }

    pub async fn queue(&self, visibility_timeout_s: u32) -> Queue {
        self.make_queue(visibility_timeout_s, false, 5).await
    }

    /// A queue whose redrive policy allows `max_receive_count` receives.
    pub async fn queue_with_receives(
        &self,
        visibility_timeout_s: u32,
        max_receive_count: u32,
    ) -> Queue {
        self.make_queue(visibility_timeout_s, false, max_receive_count)
            .await
    }

    /// A FIFO queue (content-based deduplication) with its FIFO DLQ.
    pub async fn fifo_queue(&self, visibility_timeout_s: u32) -> Queue {
        self.make_queue(visibility_timeout_s, true, 5).await
    }

    async fn make_queue(
        &self,
        visibility_timeout_s: u32,
        fifo: bool,
        max_receive_count: u32,
    ) -> Queue {
        let name = unique("work");
        let suffix = if fifo { ".fifo" } else { "" };
        let with_fifo =
            |req: aws_sdk_sqs::operation::create_queue::builders::CreateQueueFluentBuilder| {
                if fifo {
                    req.attributes(QueueAttributeName::FifoQueue, "true")
                } else {
                    req
                }
            };
        let dlq_url = with_fifo(
            self.sqs
                .create_queue()
                .queue_name(format!("{name}-dlq{suffix}")),
        )
        .send()
        .await
        .expect("create dlq")
        .queue_url()
        .expect("dlq url")
        .to_owned();
        let dlq_arn = self.arn_of(&dlq_url).await;
        let redrive = format!(
            r#"{{"deadLetterTargetArn":"{dlq_arn}","maxReceiveCount":{max_receive_count}}}"#
        );
        let mut create = with_fifo(
            self.sqs
                .create_queue()
                .queue_name(format!("{name}{suffix}")),
        )
        .attributes(
            QueueAttributeName::VisibilityTimeout,
            visibility_timeout_s.to_string(),
        )
        .attributes(QueueAttributeName::RedrivePolicy, redrive);
        if fifo {
            create = create.attributes(QueueAttributeName::ContentBasedDeduplication, "true");
        }
        let url = create
            .send()
            .await
            .expect("create queue")
            .queue_url()
            .expect("queue url")
            .to_owned();
        let arn = self.arn_of(&url).await;
        Queue { url, arn, dlq_url }
    }

    async fn arn_of(&self, url: &str) -> String {
        self.sqs
            .get_queue_attributes()
            .queue_url(url)
            .attribute_names(QueueAttributeName::QueueArn)
            .send()
            .await
            .expect("queue attributes")
            .attributes()
            .and_then(|a| a.get(&QueueAttributeName::QueueArn))
            .expect("arn")
            .clone()
    }

    pub fn ledger(&self, table: &str) -> DynamoLedger {
        DynamoLedger::new(self.ddb.clone(), table)
    }

    /// The job's item, which must exist.
    pub async fn item(&self, table: &str, job_id: &str) -> fenced_jobs::job::JobItem {
        self.ledger(table)
            .get(job_id)
            .await
            .expect("get")
            .expect("item")
    }

    pub fn handler<P: Provider>(
        &self,
        table: &str,
        provider: P,
        settings: Settings,
    ) -> BatchHandler<DynamoLedger, P, SystemClock, SqsVisibility> {
        self.processor_handler(Processor::new(
            self.ledger(table),
            provider,
            SystemClock,
            settings,
        ))
    }

    /// A handler around `processor`, its visibility changed on this emulator's queues.
    pub fn processor_handler<P: Provider>(
        &self,
        processor: Processor<DynamoLedger, P, SystemClock>,
    ) -> BatchHandler<DynamoLedger, P, SystemClock, SqsVisibility> {
        BatchHandler::new(processor, SqsVisibility::new(self.sqs.clone())).with_seed(42)
    }

    pub async fn source(&self, queue: &Queue) -> LocalEventSource {
        let mut source = LocalEventSource::connect(self.sqs.clone(), &queue.url)
            .await
            .expect("connect");
        source.wait_seconds = 0;
        source
    }

    pub async fn send(&self, queue: &Queue, body: &str) -> String {
        self.send_to(queue, None, body).await
    }

    pub async fn send_in_group(&self, queue: &Queue, group: &str, body: &str) -> String {
        self.send_to(queue, Some(group), body).await
    }

    /// Sends one message (in a message group, on a FIFO queue); returns its message id.
    async fn send_to(&self, queue: &Queue, group: Option<&str>, body: &str) -> String {
        self.sqs
            .send_message()
            .queue_url(&queue.url)
            .set_message_group_id(group.map(str::to_owned))
            .message_body(body)
            .send()
            .await
            .expect("send")
            .message_id()
            .expect("message id")
            .to_owned()
    }

    /// Receives what is visible now, without deleting it (a second consumer's view).
    pub async fn peek(&self, queue_url: &str, wait_s: i32) -> Vec<aws_sdk_sqs::types::Message> {
        self.sqs
            .receive_message()
            .queue_url(queue_url)
            .max_number_of_messages(10)
            .wait_time_seconds(wait_s)
            .message_attribute_names("All")
            .send()
            .await
            .expect("receive")
            .messages()
            .to_vec()
    }

    pub async fn item_count(&self, table: &str) -> usize {
        self.ddb
            .scan()
            .table_name(table)
            .send()
            .await
            .expect("scan")
            .items()
            .len()
    }
}

/// Settings for fast tests: short backoff, short deferral jitter.
pub fn fast_settings() -> Settings {
    let mut s = Settings::default();
    s.visibility.backoff_base_s = 1;
    s.visibility.backoff_cap_s = 1;
    s.visibility.defer_jitter_s = 1;
    s
}

/// A job body with the given id, prompt and extra input fields (JSON, without braces).
pub fn job(id: &str, prompt: &str, extra_input: &str) -> String {
    let extra = if extra_input.is_empty() {
        String::new()
    } else {
        format!(",{extra_input}")
    };
    format!(
        r#"{{"job_id":"{id}","contract":"summary.v1","input":{{"model":"sim-1","prompt":"{prompt}"{extra}}}}}"#
    )
}

/// What one run of jobctl came to: its exit status, standard output and standard error.
pub struct Ran {
    pub code: i32,
    pub out: String,
    pub err: String,
}

/// Runs jobctl against the emulator with `args` and the environment `env`, none of the test
/// process's own `JOBS_TABLE` or `QUEUE_URL`, nothing on its standard input.
pub fn jobctl(args: &[&str], env: &[(&str, &str)]) -> Ran {
    let endpoint = std::env::var("AWS_ENDPOINT_URL").expect("emulator");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_jobctl"))
        .args(args)
        .args(["--endpoint-url", &endpoint, "--region", "us-east-1"])
        .env_remove("JOBS_TABLE")
        .env_remove("QUEUE_URL")
        .envs(env.iter().copied())
        .stdin(std::process::Stdio::null())
        .output()
        .expect("jobctl runs");
    Ran {
        code: out.status.code().unwrap_or(-1),
        out: String::from_utf8_lossy(&out.stdout).into_owned(),
        err: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// The stream records of `table` so far, read with `streams` (whose credentials may be a role's)
/// and announced through the dispatcher to `sink`, which must take every one.
pub async fn announce(
    ddb: &aws_sdk_dynamodb::Client,
    streams: aws_sdk_dynamodbstreams::Client,
    table: &str,
    sink: &fenced_jobs::events::aws::AwsSink,
) {
    use fenced_jobs::ops::dispatch::dispatch;
    let mut stream =
        fenced_jobs::testing::stream_source::LocalStreamSource::connect(ddb, streams, table)
            .await
            .expect("stream");
    let (_, response) = stream
        .poll_once(|e| async move { dispatch(&e, sink).await.response() })
        .await
        .expect("stream poll");
    assert!(response.batch_item_failures.is_empty(), "{response:?}");
}

/// One delivery through the local event source, keeping the handler's own report.
pub async fn deliver<P: Provider>(
    source: &LocalEventSource,
    handler: &BatchHandler<DynamoLedger, P, SystemClock, SqsVisibility>,
) -> (PollReport, Option<BatchReport>) {
    let slot = std::sync::Mutex::new(None);
    let slot_ref = &slot;
    let poll = source
        .poll_once(|event, inv| async move {
            let report = handler.handle_batch(&event, &inv).await;
            *slot_ref.lock().expect("slot") = Some(report.clone());
            report.into_response()
        })
        .await
        .expect("poll");
    (poll, slot.into_inner().expect("slot"))
}

/// A provider that, while its own call is in flight, lets a second worker fence this one and
/// commit its own answer: what happens when a paused worker resumes after a takeover.
pub struct TakenOverDuringTheCall {
    pub inner: SimulatedProvider,
    pub rival: DynamoLedger,
}

impl Provider for TakenOverDuringTheCall {
    async fn call(&self, req: &ProviderRequest<'_>) -> Result<Answer, ProviderError> {
        let answer = self.inner.call(req).await?;
        // The rival's clock is ten minutes ahead: to it the lease has lapsed.
        let later = fenced_jobs::clock::Clock::now_ms(&fenced_jobs::clock::SystemClock) + 600_000;
        let fenced = self
            .rival
            .recover(RecoverRequest {
                job_id: req.job_id.to_owned(),
                seen_epoch: req.epoch,
                owner_id: "rival".into(),
                now: later,
                lapsed_before: later - 2_000,
                lease_until: later + 60_000,
                reason: "lease lapsed".into(),
                seen_recoveries: 0,
                input: None,
            })
            .await
            .expect("recover");
        let Write::Applied(fenced) = fenced else {
            panic!("recovery refused: {fenced:?}")
        };
        let accepted = self
            .rival
            .end(EndRequest {
                job_id: req.job_id.to_owned(),
                epoch: fenced.owner_epoch,
                attempt: fenced.attempts,
                now: later,
                end: AttemptEnd::Succeeded {
                    result: r#"{"output":"rival answer"}"#.into(),
                    finish: fenced_jobs::job::contract::Finish::Stop,
                },
                usage: None,
                input: None,
            })
            .await
            .expect("rival accepts");
        assert!(matches!(accepted, Write::Applied(_)));
        Ok(answer)
    }
}

/// Settings for the slow-record tests: a heartbeat of `heartbeat_ms` on a queue whose
/// visibility timeout is `visibility_s`, with a lease of `lease_ms`.
pub fn slow_settings(visibility_s: i64, heartbeat_ms: i64, lease_ms: i64) -> Settings {
    let mut s = fast_settings();
    s.queue_visibility_s = visibility_s;
    s.heartbeat_ms = heartbeat_ms;
    s.lease_ms = lease_ms;
    s.skew_ms = 200;
    s.validate().expect("valid settings");
    s
}

/// Blocks its thread for `freeze` before answering: with the heartbeat on the same thread, the
/// whole worker stops, as in a stop-the-world pause.
pub struct FreezesWorker {
    pub inner: fenced_jobs::provider::SimulatedProvider,
    pub freeze: std::time::Duration,
}

impl Provider for FreezesWorker {
    async fn call(
        &self,
        req: &fenced_jobs::provider::ProviderRequest<'_>,
    ) -> Result<fenced_jobs::provider::Answer, fenced_jobs::provider::ProviderError> {
        std::thread::sleep(self.freeze);
        self.inner.call(req).await
    }

    fn reference(&self, job_id: &str, attempt: u32, epoch: u64) -> Option<String> {
        self.inner.reference(job_id, attempt, epoch)
    }
}

/// Worker A of the pause scenarios, on its own thread and runtime: it takes one batch from the
/// queue with a lease of 4 s (heartbeat 0.6 s, queue visibility 2 s), and its call freezes the
/// whole thread for `freeze`. Returns its poll, its report and its provider calls.
pub fn spawn_frozen_worker(
    table: &str,
    queue_url: &str,
    freeze: std::time::Duration,
) -> std::thread::JoinHandle<(PollReport, Option<BatchReport>, u64)> {
    let (table, url) = (table.to_owned(), queue_url.to_owned());
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async move {
            let aws = emulator().await;
            let provider = FreezesWorker {
                inner: fenced_jobs::provider::SimulatedProvider::new(),
                freeze,
            };
            let handler = aws.handler(&table, provider, slow_settings(2, 600, 4_000));
            let queue = Queue {
                url,
                arn: String::new(),
                dlq_url: String::new(),
            };
            let (poll, report) = deliver(&aws.source(&queue).await, &handler).await;
            (
                poll,
                report,
                handler.processor().provider().inner.executions(),
            )
        })
    })
}

/// A job as a ledger test makes it.
pub fn new_job(id: &str, digest: &str, max_attempts: u32, deadline_at: i64) -> NewJob {
    NewJob {
        class: Default::default(),
        job_id: id.into(),
        input_digest: digest.into(),
        contract: "summary.v1".into(),
        input: r#"{"model":"m","prompt":"p"}"#.into(),
        input_ref: None,
        metadata: Some(r#"{"trace":"t-1"}"#.into()),
        deadline_at,
        max_attempts,
        max_cost_micros: Some(1_000_000),
        expires_at: deadline_at / 1000 + 86_400,
    }
}

/// The claim of `job` by `owner`, expecting `expect`, with a one-minute lease.
pub fn claim(job: &NewJob, expect: Expect, owner: &str, now: i64) -> ClaimRequest {
    ClaimRequest {
        job: job.clone(),
        expect,
        owner_id: owner.into(),
        now,
        lease_until: now + 60_000,
        provider_ref: Some(format!("ref:{}/{}", job.job_id, expect.attempts + 1)),
        route: None,
        // A fresh claim tries the whole-item write first, which must keep the same contract
        // whether the item is absent or a producer's untouched one.
        first_sight: expect == Expect::FRESH,
        list_due: false,
    }
}

/// Nobody keeps the attempt alive: the calls of a test that uses it end at once.
pub struct NoWatch;

impl fenced_jobs::worker::processor::AttemptWatch for NoWatch {
    fn running(
        &self,
        _: &str,
        _: u64,
        _: i64,
        _: i64,
    ) -> fenced_jobs::worker::processor::StopSignal {
        fenced_jobs::worker::processor::StopSignal::new()
    }
    fn call_ended(&self) {}
    fn recovered(&self) {}
    fn deadline_cutoff(&self) {}
    fn provider_latency(&self, _: &'static str, _: u64) {}
}
