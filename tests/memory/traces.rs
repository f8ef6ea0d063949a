//! Spans sent straight to X-Ray's OTLP endpoint, without a collector: each export request is
//! signed with SigV4 for the service `xray` with the function's credentials, and the signature
//! checks out against the request as it arrived (here at a stub on the loopback standing in
//! for the endpoint, which recomputes it).

use fenced_jobs::telemetry::signed::Signed;
use opentelemetry_http::{Bytes, Request};
use tracing_subscriber::layer::SubscriberExt;

use crate::support::http::{HttpStub, Reply};

fn credentials() -> aws_credential_types::Credentials {
    aws_credential_types::Credentials::new(
        "AKIDTRACES",
        "traces-secret",
        Some("traces-token".into()),
        None,
        "test",
    )
}

/// The time an `X-Amz-Date` header names (`20261205T095959Z`).
fn amz_date(text: &str) -> std::time::SystemTime {
    let n = |at: usize, len: usize| text[at..at + len].parse::<u32>().expect("digits");
    let month = time::Month::try_from(n(4, 2) as u8).expect("month");
    let date = time::Date::from_calendar_date(n(0, 4) as i32, month, n(6, 2) as u8).expect("date");
    let at = time::Time::from_hms(n(9, 2) as u8, n(11, 2) as u8, n(13, 2) as u8).expect("time");
    time::PrimitiveDateTime::new(date, at).assume_utc().into()
}

#[tokio::test]
async fn spans_reach_xrays_endpoint_signed_with_the_functions_credentials() {
    let collector = HttpStub::start(|_, _| Reply::json(200, serde_json::json!({}))).await;
    let endpoint = format!("{}/v1/traces", collector.url);
    let provider =
        fenced_jobs::telemetry::signed_provider(&endpoint, "worker", "eu-west-1", credentials())
            .expect("a tracer provider");
    let layer = fenced_jobs::telemetry::layer(&provider);
    let subscriber = tracing_subscriber::registry().with(layer);
    tracing::subscriber::with_default(subscriber, || {
        let span = fenced_jobs::telemetry::invocation_span("req-signed", None, false);
        let _entered = span.enter();
    });
    let flushed = tokio::task::spawn_blocking(move || provider.force_flush()).await;
    assert!(matches!(flushed, Ok(Ok(()))), "{flushed:?}");

    let sent = collector.requests();
    assert_eq!(sent.len(), 1, "one export");
    let request = &sent[0];
    let auth = request.header("authorization").expect("signed");
    assert!(
        auth.starts_with("AWS4-HMAC-SHA256 Credential=AKIDTRACES/")
            && auth.contains("/eu-west-1/xray/aws4_request"),
        "{auth}"
    );
    assert_eq!(request.header("x-amz-security-token"), Some("traces-token"));
    // The stand-in endpoint signs what it received again, as X-Ray does, and gets the same.
    let signed_headers = auth
        .split("SignedHeaders=")
        .nth(1)
        .and_then(|s| s.split(',').next())
        .expect("signed headers");
    let again = |body: Vec<u8>| {
        let mut check = Request::builder()
            .method(request.method.as_str())
            .uri(format!("{}{}", collector.url, request.path));
        for name in signed_headers
            .split(';')
            .filter(|n| !n.starts_with("x-amz-"))
        {
            check = check.header(name, request.header(name).expect("a signed header"));
        }
        let mut check = check.body(Bytes::from(body)).expect("a request");
        let date = amz_date(request.header("x-amz-date").expect("a date"));
        Signed::new((), "eu-west-1", credentials())
            .sign(&mut check, date)
            .expect("signed");
        check.headers()["authorization"]
            .to_str()
            .expect("text")
            .to_owned()
    };
    assert_eq!(again(request.raw.clone()), auth);
    // A body changed on the way would not pass.
    let mut changed = request.raw.clone();
    changed.push(0);
    assert_ne!(again(changed), auth);
}
