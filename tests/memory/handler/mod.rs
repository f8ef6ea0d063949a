//! The batch handler over the in-memory ledger: fast tests of batch behaviour (deduplication,
//! panics, missing ids, budgets, deadlines, hangs) without the emulator, a module per behaviour;
//! the handler, records and events they build are here.

mod admission;
mod background;
mod bad_input;
mod batch;
mod deadlines;
mod ledger_faults;
mod payloads;
mod recovery;

use std::sync::Arc;

use aws_lambda_events::event::sqs::{SqsEvent, SqsMessage};
use fenced_jobs::clock::{Clock, SystemClock};
use fenced_jobs::ledger::JobLedger;
use fenced_jobs::ledger::memory::{Fault, FaultyLedger, InMemoryLedger};
use fenced_jobs::provider::{Provider, SimulatedProvider};
use fenced_jobs::queue::RecordingVisibility;
use fenced_jobs::worker::Settings;
use fenced_jobs::worker::handler::BatchHandler;
use fenced_jobs::worker::processor::{Invocation, Processor};

use crate::support::ARN;

type Handler<L, P> = BatchHandler<L, P, SystemClock, RecordingVisibility>;

fn handler<L: JobLedger, P: Provider>(ledger: L, provider: P, settings: Settings) -> Handler<L, P> {
    BatchHandler::new(
        Processor::new(ledger, provider, SystemClock, settings),
        RecordingVisibility::new(),
    )
    .with_seed(1)
}

/// The bucket the tests' Extended Client producers put payloads in.
const PAYLOAD_BUCKET: &str = "producer";

/// The default settings, with pointers to [`PAYLOAD_BUCKET`] taken.
fn reading_payloads() -> Settings {
    Settings {
        payload_bucket: Some(PAYLOAD_BUCKET.to_owned()),
        ..Settings::default()
    }
}

/// [`handler`] over the simulated provider, storing answers and inputs in `blobs`.
fn handler_with_blobs<L: JobLedger>(
    ledger: L,
    settings: Settings,
    blobs: Arc<fenced_jobs::blobs::MemoryBlobs>,
) -> Handler<L, SimulatedProvider> {
    BatchHandler::new(
        Processor::new(ledger, SimulatedProvider::new(), SystemClock, settings).with_blobs(blobs),
        RecordingVisibility::new(),
    )
}

fn record(id: Option<&str>, body: &str) -> SqsMessage {
    let mut m = SqsMessage::default();
    m.message_id = id.map(str::to_owned);
    m.receipt_handle = Some(format!("handle-{}", id.unwrap_or("none")));
    m.body = Some(body.to_owned());
    m.event_source_arn = Some(ARN.to_owned());
    m.attributes
        .insert("ApproximateReceiveCount".into(), "1".into());
    m.attributes.insert(
        "ApproximateFirstReceiveTimestamp".into(),
        SystemClock.now_ms().to_string(),
    );
    m.attributes
        .insert("SentTimestamp".into(), SystemClock.now_ms().to_string());
    m
}

fn event(records: Vec<SqsMessage>) -> SqsEvent {
    let mut e = SqsEvent::default();
    e.records = records;
    e
}

fn invocation() -> Invocation {
    Invocation {
        id: "inv-1".into(),
        deadline: Some(SystemClock.now_ms() + 60_000),
    }
}

fn job(id: &str, extra_input: &str) -> String {
    format!(
        r#"{{"job_id":"{id}","contract":"c","input":{{"model":"m","prompt":"p"{extra_input}}}}}"#
    )
}

/// A job claimed by a worker that vanished a minute ago, with its call's reference recorded.
async fn lapsed_claim(ledger: &InMemoryLedger, body: &str) {
    use fenced_jobs::job::{Expect, NewJob};
    use fenced_jobs::ledger::ClaimRequest;
    let msg = fenced_jobs::job::parse_body(Some(body)).expect("valid");
    let then = SystemClock.now_ms() - 120_000;
    let job = NewJob {
        class: Default::default(),
        job_id: msg.job_id.clone(),
        input_digest: msg.digest.clone(),
        contract: msg.contract.clone(),
        input: msg.input_canonical.clone(),
        input_ref: None,
        metadata: None,
        deadline_at: then + 3_600_000,
        max_attempts: 3,
        max_cost_micros: None,
        expires_at: 0,
    };
    let claimed = ledger
        .claim(ClaimRequest {
            job,
            expect: Expect::FRESH,
            owner_id: "vanished".into(),
            now: then,
            lease_until: then + 60_000,
            provider_ref: Some(format!("sim:{}/1", msg.job_id)),
            route: None,
            first_sight: false,
            list_due: false,
        })
        .await
        .expect("claim");
    assert!(matches!(claimed, fenced_jobs::ledger::Write::Applied(_)));
}

fn faulty(operation: &'static str, fault: Fault, times: u32) -> FaultyLedger<InMemoryLedger> {
    let ledger = FaultyLedger::new(InMemoryLedger::new());
    ledger.inject(operation, fault, times);
    ledger
}

fn tight_settings() -> Settings {
    Settings {
        deadline_margin_ms: 1_000,
        min_background_call_ms: 100,
        poll_ms: 100,
        ..Settings::default()
    }
}
