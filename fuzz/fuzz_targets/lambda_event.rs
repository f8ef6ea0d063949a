//! A whole Lambda event through the handler with in-memory adapters: arbitrary bytes as the
//! event (first byte 0), or as the bodies of a well-formed event (otherwise; 0xFF separates
//! bodies). No panic, no whole-batch failure caused by a bad record, every record classified.

#![no_main]

use std::sync::{Arc, OnceLock};

use aws_lambda_events::event::sqs::{SqsEvent, SqsMessage};
use fenced_jobs::clock::{Clock, SystemClock};
use fenced_jobs::worker::Settings;
use fenced_jobs::worker::handler::BatchHandler;
use fenced_jobs::job::{Failure, RecordOutcome};
use fenced_jobs::ledger::memory::InMemoryLedger;
use fenced_jobs::worker::processor::{Invocation, Processor};
use fenced_jobs::provider::{Answer, Provider, ProviderError, ProviderRequest};
use fenced_jobs::queue::RecordingVisibility;
use libfuzzer_sys::fuzz_target;

/// Answers at once, whatever the input asks (no simulated latency to wait for).
struct Instant;

impl Provider for Instant {
    async fn call(&self, req: &ProviderRequest<'_>) -> Result<Answer, ProviderError> {
        Ok(Answer {
            body: format!("{{\"len\":{}}}", req.input_json.len()),
            provider_ref: None,
            finish: fenced_jobs::job::contract::Finish::Stop,
        })
    }
}

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime")
    })
}

fn event_of(data: &[u8]) -> Option<SqsEvent> {
    match data.split_first() {
        None => None,
        Some((0, rest)) => {
            let value: serde_json::Value = serde_json::from_slice(rest).ok()?;
            fenced_jobs::worker::handler::event_from_json(&value).ok()
        }
        Some((_, rest)) => {
            let mut event = SqsEvent::default();
            for (i, body) in rest.split(|b| *b == 0xFF).take(20).enumerate() {
                let mut m = SqsMessage::default();
                m.message_id = Some(format!("m{i}"));
                m.receipt_handle = Some(format!("h{i}"));
                m.body = Some(String::from_utf8_lossy(body).into_owned());
                m.event_source_arn = Some("arn:aws:sqs:us-east-1:1:q".to_owned());
                event.records.push(m);
            }
            Some(event)
        }
    }
}

/// A record a batch response can name (an empty id cannot be reported).
fn named(record: &SqsMessage) -> bool {
    record.message_id.as_deref().is_some_and(|id| !id.is_empty())
}

fuzz_target!(|data: &[u8]| {
    let Some(event) = event_of(data) else {
        return;
    };
    let handler = BatchHandler::new(
        Processor::new(
            Arc::new(InMemoryLedger::new()),
            Instant,
            SystemClock,
            Settings::default(),
        ),
        RecordingVisibility::new(),
    )
    .with_seed(7);
    let inv = Invocation {
        id: "fuzz".into(),
        deadline: Some(SystemClock.now_ms() + 60_000),
    };
    let report = runtime().block_on(handler.handle_batch(&event, &inv));
    assert_eq!(report.records.len(), event.records.len(), "a record went missing");
    for (record, r) in event.records.iter().zip(&report.records) {
        assert!(
            !matches!(r.outcome, RecordOutcome::Failed(Failure::Backoff { cause: "panic", .. })),
            "processing panicked"
        );
        if named(record) {
            continue;
        }
        // Only a failed record without a (non-empty) message id may fail the whole batch.
        assert!(r.outcome.is_success() || report.response.is_err());
    }
    if event.records.iter().all(named) {
        assert!(report.response.is_ok(), "whole batch failed");
    }
});
