use super::signature::{sign, verify};
use super::*;
use crate::job::{BatchMember, JobClass};
use crate::ledger::JobLedger;
use crate::ledger::memory::InMemoryLedger;
use crate::ledger::pushed::{MEMBERS_PER_ITEM, PushedLedger};
use crate::queue::{RecordingTriggers, Sent};

/// The example of the Standard Webhooks specification (its README and its libraries' tests):
/// this secret, id, timestamp and body give this signature. OpenAI's verifier
/// (`openai-python`'s `webhook_signature_matches`) computes the same.
const SPEC_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const SPEC_ID: &str = "msg_p5jXN8AQM9LWM0D4loKWxJek";
const SPEC_AT: i64 = 1_614_265_330;
const SPEC_BODY: &str = r#"{"test": 2432232314}"#;
const SPEC_SIGNATURE: &str = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";

fn secret() -> WebhookSecret {
    WebhookSecret::parse(SPEC_SECRET).expect("the specification's secret")
}

fn headers(id: &str, at: i64, signature: &str) -> HashMap<String, String> {
    HashMap::from([
        ("webhook-id".to_owned(), id.to_owned()),
        ("webhook-timestamp".to_owned(), at.to_string()),
        ("webhook-signature".to_owned(), signature.to_owned()),
    ])
}

#[test]
fn the_specifications_example_verifies_and_any_change_to_it_does_not() {
    let spec = headers(SPEC_ID, SPEC_AT, SPEC_SIGNATURE);
    let body = SPEC_BODY.as_bytes();
    assert_eq!(verify(&secret(), &spec, body, SPEC_AT), Ok(SPEC_ID));
    assert_eq!(sign(&secret(), SPEC_ID, SPEC_AT, body), SPEC_SIGNATURE);
    // Within five minutes either way, and no further.
    assert_eq!(verify(&secret(), &spec, body, SPEC_AT + 300), Ok(SPEC_ID));
    assert_eq!(verify(&secret(), &spec, body, SPEC_AT - 300), Ok(SPEC_ID));
    let late = verify(&secret(), &spec, body, SPEC_AT + 301);
    assert_eq!(late, Err(Refused::TooOld));
    let early = verify(&secret(), &spec, body, SPEC_AT - 301);
    assert_eq!(early, Err(Refused::TooNew));
    // Another body, id, timestamp or secret: forged.
    let forged = |h: &HashMap<String, String>, body: &[u8], secret: &WebhookSecret| {
        verify(secret, h, body, SPEC_AT).map(str::to_owned)
    };
    let other_body = br#"{"test": 2432232315}"#;
    assert_eq!(forged(&spec, other_body, &secret()), Err(Refused::Forged));
    let other_id = headers("msg_other", SPEC_AT, SPEC_SIGNATURE);
    assert_eq!(forged(&other_id, body, &secret()), Err(Refused::Forged));
    let other_at = headers(SPEC_ID, SPEC_AT + 1, SPEC_SIGNATURE);
    assert_eq!(forged(&other_at, body, &secret()), Err(Refused::Forged));
    let stranger = WebhookSecret::parse("whsec_c3RyYW5nZXI=").expect("base64");
    assert_eq!(forged(&spec, body, &stranger), Err(Refused::Forged));
}

#[test]
fn one_matching_signature_among_several_is_enough_and_a_missing_header_is_unsigned() {
    let body = SPEC_BODY.as_bytes();
    let rotated = format!("v1,bm90IGl0 {SPEC_SIGNATURE} v1a,whatever");
    let several = headers(SPEC_ID, SPEC_AT, &rotated);
    assert_eq!(verify(&secret(), &several, body, SPEC_AT), Ok(SPEC_ID));
    // OpenAI's verifier takes an entry without its `v1,` as the signature itself.
    let bare = headers(SPEC_ID, SPEC_AT, &SPEC_SIGNATURE[3..]);
    assert_eq!(verify(&secret(), &bare, body, SPEC_AT), Ok(SPEC_ID));
    for name in ["webhook-id", "webhook-timestamp", "webhook-signature"] {
        let mut missing = headers(SPEC_ID, SPEC_AT, SPEC_SIGNATURE);
        missing.remove(name);
        let said = verify(&secret(), &missing, body, SPEC_AT);
        assert_eq!(said, Err(Refused::Unsigned(name)));
    }
    let mut words = headers(SPEC_ID, SPEC_AT, SPEC_SIGNATURE);
    words.insert("webhook-timestamp".to_owned(), "soon".to_owned());
    let said = verify(&secret(), &words, body, SPEC_AT);
    assert_eq!(said, Err(Refused::BadTimestamp));
    // The ends of the clock are far from now, never wrapped near it.
    for (at, refused) in [(i64::MIN, Refused::TooOld), (i64::MAX, Refused::TooNew)] {
        let extreme = headers(SPEC_ID, at, SPEC_SIGNATURE);
        assert_eq!(verify(&secret(), &extreme, body, SPEC_AT), Err(refused));
    }
    let spec = headers(SPEC_ID, SPEC_AT, SPEC_SIGNATURE);
    let not_text = verify(&secret(), &spec, b"\xff", SPEC_AT);
    assert_eq!(not_text, Err(Refused::NotText));
}

#[test]
fn a_secret_is_whsec_and_base64_or_its_own_text_and_never_empty() {
    assert!(WebhookSecret::parse("whsec_").is_err());
    assert!(WebhookSecret::parse("whsec_not base64!").is_err());
    assert!(WebhookSecret::parse("  ").is_err());
    let raw = WebhookSecret::parse("plain").expect("the key's own text");
    let signed = sign(&raw, "id", 10, b"{}");
    assert_eq!(
        verify(&raw, &headers("id", 10, &signed), b"{}", 10),
        Ok("id")
    );
    assert_eq!(format!("{raw:?}"), "WebhookSecret(..)");
}

/// Now, in ms, and a signed delivery of `body` as `id` sent now.
const NOW: Millis = 1_800_000_000_000;

fn delivery(id: &str, body: &str) -> UrlRequest {
    UrlRequest::signed(&secret(), id, NOW / 1_000, body)
}

fn ended(kind: &str, batch: &str) -> String {
    serde_json::json!({
        "id": "evt_1", "object": "event", "created_at": NOW / 1_000,
        "type": kind, "data": {"id": batch}
    })
    .to_string()
}

/// A ledger whose batch `batch_1` lists a normal job and an urgent one of a tenant.
async fn ledger() -> InMemoryLedger {
    let ledger = InMemoryLedger::new();
    let members = [
        BatchMember {
            job_id: "a".to_owned(),
            class: JobClass::default(),
        },
        BatchMember {
            job_id: "b".to_owned(),
            class: JobClass {
                tenant: Some("t1".to_owned()),
                urgent: true,
            },
        },
    ];
    let listed = ledger.note_batch_members("batch_1", &members, NOW).await;
    listed.expect("listed");
    ledger
}

#[tokio::test]
async fn a_batch_that_ended_sends_each_of_its_jobs_trigger_once_whatever_the_replays() {
    let (ledger, sender) = (ledger().await, RecordingTriggers::new());
    let request = delivery("msg_1", &ended("batch.completed", "batch_1"));
    let answer = handle(&request, &secret(), &ledger, &sender, NOW).await;
    assert_eq!(answer, Answer::Triggered(2));
    assert_eq!(answer.response().status_code, 200);
    let sent = sender.sent();
    let ids: Vec<(&str, bool, Option<&str>)> = sent
        .iter()
        .map(|(t, _)| (t.job_id.as_str(), t.class.urgent, t.class.tenant.as_deref()))
        .collect();
    // Each by the urgent queue, ahead of the work queue's backlog, its tenant kept.
    assert_eq!(ids, [("a", true, None), ("b", true, Some("t1"))]);
    assert!(sent.iter().all(|(t, suffix)| {
        t.body == format!(r#"{{"job_id":"{}"}}"#, t.job_id) && suffix == "webhook-msg_1"
    }));
    // The same delivery again, a minute later (sent twice, or replayed): nothing more.
    let again = handle(&request, &secret(), &ledger, &sender, NOW + 60_000).await;
    assert_eq!(again, Answer::Replayed);
    assert_eq!(again.response().status_code, 200);
    // Replayed past the tolerance: its timestamp refuses it.
    let late = handle(&request, &secret(), &ledger, &sender, NOW + 301_000).await;
    assert_eq!(late, Answer::Refused(Refused::TooOld));
    assert_eq!(sender.sent().len(), 2);
    // Every way a batch ends looks at its jobs; another delivery is acted on. A batch that did
    // not complete leaves lines to run again: by each job's own queue.
    for (n, kind) in ["batch.failed", "batch.expired", "batch.cancelled"]
        .iter()
        .enumerate()
    {
        let before = sender.sent().len();
        let other = delivery(&format!("msg_{}", n + 2), &ended(kind, "batch_1"));
        let answer = handle(&other, &secret(), &ledger, &sender, NOW).await;
        assert_eq!(answer, Answer::Triggered(2), "{kind}");
        let urgent: Vec<bool> = sender.sent()[before..]
            .iter()
            .map(|(t, _)| t.class.urgent)
            .collect();
        assert_eq!(urgent, [false, true], "{kind}");
    }
}

#[tokio::test]
async fn a_forged_or_stray_delivery_sends_nothing_and_records_nothing() {
    let (ledger, sender) = (ledger().await, RecordingTriggers::new());
    let body = ended("batch.completed", "batch_1");
    // Signed by a stranger.
    let mut forged = delivery("msg_1", &body);
    let stranger = WebhookSecret::parse("whsec_c3RyYW5nZXI=").expect("base64");
    let signature = sign(&stranger, "msg_1", NOW / 1_000, body.as_bytes());
    forged
        .headers
        .insert("webhook-signature".to_owned(), signature);
    let answer = handle(&forged, &secret(), &ledger, &sender, NOW).await;
    assert_eq!(answer, Answer::Refused(Refused::Forged));
    assert_eq!(answer.response().status_code, 401);
    // Unsigned.
    let mut unsigned = delivery("msg_1", &body);
    unsigned.headers.clear();
    let answer = handle(&unsigned, &secret(), &ledger, &sender, NOW).await;
    assert!(matches!(answer, Answer::Refused(Refused::Unsigned(_))));
    // Not a POST, or not an event.
    let mut get = delivery("msg_1", &body);
    get.request_context = serde_json::json!({"http": {"method": "GET"}});
    let answer = handle(&get, &secret(), &ledger, &sender, NOW).await;
    assert_eq!(answer.response().status_code, 400);
    let answer = handle(&delivery("msg_1", "[1]"), &secret(), &ledger, &sender, NOW).await;
    assert_eq!(answer, Answer::Malformed("not an event"));
    // Signed events of other kinds are acknowledged and left alone.
    for kind in ["response.completed", "fine_tuning.job.succeeded"] {
        let other = delivery("msg_1", &ended(kind, "resp_1"));
        let answer = handle(&other, &secret(), &ledger, &sender, NOW).await;
        assert_eq!(answer, Answer::Ignored, "{kind}");
    }
    assert!(sender.sent().is_empty());
    // None of them was recorded: the genuine delivery with that id is still acted on.
    let genuine = delivery("msg_1", &body);
    let answer = handle(&genuine, &secret(), &ledger, &sender, NOW).await;
    assert_eq!(answer, Answer::Triggered(2));
}

#[tokio::test]
async fn a_body_sent_as_base64_verifies_and_a_batch_no_list_keeps_triggers_nothing() {
    let (ledger, sender) = (ledger().await, RecordingTriggers::new());
    let body = ended("batch.completed", "batch_unlisted");
    let mut request = delivery("msg_1", &body);
    request.body = Some(base64::engine::general_purpose::STANDARD.encode(&body));
    request.is_base64_encoded = true;
    let answer = handle(&request, &secret(), &ledger, &sender, NOW).await;
    assert_eq!(answer, Answer::Triggered(0));
    let mut large = delivery("msg_2", &"x".repeat(MAX_BODY_BYTES + 1));
    large.is_base64_encoded = false;
    let answer = handle(&large, &secret(), &ledger, &sender, NOW).await;
    assert_eq!(answer, Answer::Malformed("a body too large"));
}

/// A queue that takes nothing, then everything.
#[derive(Default)]
struct Flaky {
    refused_once: std::sync::atomic::AtomicBool,
    inner: RecordingTriggers,
}

impl TriggerSender for Flaky {
    async fn send(&self, triggers: &[Outgoing], dedup_suffix: &str) -> Vec<Sent> {
        use std::sync::atomic::Ordering;
        if !self.refused_once.swap(true, Ordering::Relaxed) {
            let refused = |t: &Outgoing| (t.job_id.clone(), Err("throttled".to_owned()));
            return triggers.iter().map(refused).collect();
        }
        self.inner.send(triggers, dedup_suffix).await
    }
}

#[tokio::test]
async fn triggers_not_sent_fail_the_delivery_and_the_senders_retry_is_acted_on() {
    let (ledger, sender) = (ledger().await, Flaky::default());
    let request = delivery("msg_1", &ended("batch.completed", "batch_1"));
    let answer = handle(&request, &secret(), &ledger, &sender, NOW).await;
    assert!(
        matches!(&answer, Answer::Failed(why) if why.contains("2 of 2")),
        "{answer:?}"
    );
    assert_eq!(answer.response().status_code, 500);
    let retried = handle(&request, &secret(), &ledger, &sender, NOW + 5_000).await;
    assert_eq!(retried, Answer::Triggered(2));
    assert_eq!(sender.inner.sent().len(), 2);
    // Recorded once its triggers went, and only then.
    assert!(
        ledger
            .was_acted_on("msg_1", NOW + 5_000)
            .await
            .expect("read")
    );
}

/// A ledger whose record of a delivery acted on never lands (the function cut off after its
/// sends).
struct CutOff(InMemoryLedger);

impl PushedLedger for CutOff {
    async fn batch_members(
        &self,
        batch_id: &str,
    ) -> Result<Vec<BatchMember>, crate::ledger::LedgerError> {
        self.0.batch_members(batch_id).await
    }
    async fn was_acted_on(
        &self,
        id: &str,
        now: Millis,
    ) -> Result<bool, crate::ledger::LedgerError> {
        self.0.was_acted_on(id, now).await
    }
    async fn acted_on(
        &self,
        _: &str,
        _: Millis,
        _: Millis,
    ) -> Result<(), crate::ledger::LedgerError> {
        Err(crate::ledger::LedgerError::Unavailable {
            operation: "webhook delivery",
            code: "timeout".to_owned(),
        })
    }
}

#[tokio::test]
async fn a_delivery_whose_record_never_landed_is_acted_on_again_by_the_retry() {
    let (ledger, sender) = (CutOff(ledger().await), RecordingTriggers::new());
    let request = delivery("msg_1", &ended("batch.completed", "batch_1"));
    let first = handle(&request, &secret(), &ledger, &sender, NOW).await;
    let retried = handle(&request, &secret(), &ledger, &sender, NOW + 5_000).await;
    assert_eq!(
        (first, retried),
        (Answer::Triggered(2), Answer::Triggered(2))
    );
    assert_eq!(sender.sent().len(), 4, "the retry sent the triggers again");
}

#[tokio::test]
async fn a_batch_of_more_jobs_than_one_item_holds_is_listed_in_parts_and_read_whole() {
    let ledger = InMemoryLedger::metered();
    let members: Vec<BatchMember> = (0..MEMBERS_PER_ITEM + 5)
        .map(|i| BatchMember {
            job_id: format!("job-{i}"),
            class: JobClass::default(),
        })
        .collect();
    let listed = ledger.note_batch_members("big", &members, NOW).await;
    listed.expect("listed");
    assert_eq!(ledger.writes(), 2, "one write a part");
    let read = ledger.batch_members("big").await.expect("read");
    assert_eq!(read, members);
}
