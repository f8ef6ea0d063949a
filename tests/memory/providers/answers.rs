//! How every answer and error of each wire format is classified (Chat Completions, Bedrock's
//! Converse, Anthropic's Messages), and a server that is not there or redirects.

use std::time::Duration;

use fenced_jobs::job::contract::Finish;
use fenced_jobs::provider::anthropic::Structured;
use fenced_jobs::provider::openai::OpenAiApi;
use fenced_jobs::provider::{Answer, Provider, ProviderError, ProviderRequest};
use serde_json::json;

use super::{anthropic, anthropic_error, message, openai, openai_error};
use crate::support::http::{HttpStub, Reply, bedrock};
use crate::support::providers::{chat_answer, input, output_of, request};

/// One chat call against a server that always gives `reply`.
async fn chat_once(reply: Reply) -> (Result<Answer, ProviderError>, HttpStub) {
    let stub = HttpStub::start(move |_, _| reply.clone()).await;
    let provider = openai(&stub.url, OpenAiApi::Chat);
    let inp = input(json!({"model": "gpt-test", "prompt": "Summarise this.",
                           "parameters": {"temperature": 0.2}}));
    // The job sets no ceiling on its answer: the deployment's is sent.
    let req = ProviderRequest {
        max_output_tokens: 16_384,
        ..request(&inp, "{}")
    };
    let result = provider.call(&req).await;
    (result, stub)
}

#[tokio::test]
async fn chat_completions_answers_and_errors_are_classified() {
    let (result, stub) = chat_once(Reply::json(200, chat_answer("A summary."))).await;
    let answer = result.expect("answer");
    assert_eq!(output_of(&answer), "A summary.");
    let usage = answer.usage.expect("usage");
    assert_eq!((usage.input, usage.output), (5, 2));
    let sent = &stub.requests()[0];
    assert_eq!(sent.path, "/v1/chat/completions");
    assert_eq!(sent.header("authorization"), Some("Bearer sk-test-secret"));
    assert_eq!(sent.header("idempotency-key"), Some("job-7/2"));
    let body = sent.json();
    assert_eq!(body["model"], "gpt-test");
    assert_eq!(body["messages"][0]["content"], "Summarise this.");
    assert_eq!(body["temperature"], 0.2);
    assert_eq!(body["max_completion_tokens"], 16_384);

    let (result, _) = chat_once(
        openai_error(429, json!({"error": {"code": "rate_limit_exceeded"}}))
            .with_header("retry-after", "7"),
    )
    .await;
    assert_eq!(
        result,
        Err(ProviderError::Throttled {
            retry_after_ms: Some(7_000),
            reason: "HTTP 429 rate_limit_exceeded".to_owned()
        })
    );
    // The provider's quota, which waiting does not clear: not a throttle (it spends its
    // attempt, and the job ends when its budget does).
    let (result, _) = chat_once(openai_error(
        429,
        json!({"error": {"code": "insufficient_quota", "type": "insufficient_quota"}}),
    ))
    .await;
    assert!(
        matches!(result, Err(ProviderError::Transient { ref reason, .. }) if reason == "HTTP 429 insufficient_quota"),
        "{result:?}"
    );

    let (result, _) = chat_once(openai_error(
        500,
        json!({"error": {"type": "server_error"}}),
    ))
    .await;
    assert!(
        matches!(result, Err(ProviderError::Transient { ref reason, .. }) if reason == "HTTP 500 server_error"),
        "{result:?}"
    );

    // A gateway that gave up while the model may still run, a key already in use, and a bare
    // 429 or 503 (a retrying gateway after its upstream request ran, a mesh after
    // forwarding): the call may have run, so no retry without a decision.
    for status in [409, 429, 502, 503, 504, 524] {
        let (result, _) = chat_once(Reply::json(status, json!({}))).await;
        assert!(
            matches!(result, Err(ProviderError::Uncertain { .. })),
            "{status}: {result:?}"
        );
    }
    let (result, _) = chat_once(Reply::json(500, json!({}))).await;
    assert!(
        matches!(result, Err(ProviderError::Uncertain { .. })),
        "{result:?}"
    );
    let (result, _) = chat_once(openai_error(
        503,
        json!({"error": {"type": "server_error", "code": "overloaded"}}),
    ))
    .await;
    assert!(
        matches!(result, Err(ProviderError::Transient { .. })),
        "{result:?}"
    );

    // The API itself timed out reading the request: nothing ran.
    let (result, _) = chat_once(openai_error(408, json!({}))).await;
    assert!(
        matches!(result, Err(ProviderError::Transient { .. })),
        "{result:?}"
    );
    // The same words from a gateway in front (LiteLLM, OpenRouter): a body shaped like
    // OpenAI's without the API's own headers, or a 408 after giving up on its upstream, which
    // may have run. None is a refusal before work.
    for (status, body) in [
        (408, json!({})),
        (
            408,
            json!({"error": {"message": "Request timed out", "type": "timeout", "code": "408"}}),
        ),
        (
            429,
            json!({"error": {"code": "rate_limit_exceeded", "type": "requests"}}),
        ),
        (500, json!({"error": {"type": "server_error"}})),
        (
            503,
            json!({"error": {"type": "server_error", "code": "overloaded"}}),
        ),
    ] {
        let (result, _) = chat_once(Reply::json(status, body.clone())).await;
        assert!(
            matches!(result, Err(ProviderError::Uncertain { .. })),
            "{status} {body}: {result:?}"
        );
    }

    let (result, _) = chat_once(Reply::json(
        400,
        json!({"error": {"code": "invalid_value", "message": "Summarise this. is bad"}}),
    ))
    .await;
    let Err(ProviderError::Permanent { reason }) = result else {
        panic!("permanent expected: {result:?}");
    };
    assert_eq!(reason, "HTTP 400 invalid_value");
    assert!(
        !reason.contains("Summarise"),
        "the provider's message is not kept"
    );

    // The request went out and the connection died without an answer: it may have run.
    let (result, _) = chat_once(Reply::Drop).await;
    assert!(
        matches!(result, Err(ProviderError::Uncertain { .. })),
        "{result:?}"
    );
}

#[tokio::test]
async fn nothing_listening_is_transient_and_a_slow_background_request_is_uncertain() {
    // A port that was free a moment ago: the connect fails, nothing was sent.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let provider = openai(&format!("http://127.0.0.1:{port}"), OpenAiApi::Chat);
    let inp = input(json!({"model": "m", "prompt": "p"}));
    let result = provider.call(&request(&inp, "{}")).await;
    assert!(
        matches!(result, Err(ProviderError::Transient { ref reason, .. }) if reason == "connection failed"),
        "{result:?}"
    );

    // Slower than the request timeout (1 s): the submit was sent, its fate is unknown.
    let stub = HttpStub::start(|_, _| {
        Reply::Slow(
            Duration::from_secs(3),
            Box::new(Reply::json(
                200,
                json!({"id": "resp_slow", "status": "queued"}),
            )),
        )
    })
    .await;
    let provider = openai(&stub.url, OpenAiApi::Responses);
    let result = provider.submit(&request(&inp, "{}")).await;
    let Err(ProviderError::Uncertain { evidence }) = result else {
        panic!("uncertain expected: {result:?}");
    };
    assert!(evidence.starts_with("timeout"), "{evidence}");
}

async fn converse_once(reply: Reply) -> (Result<Answer, ProviderError>, HttpStub) {
    let stub = HttpStub::start(move |_, _| reply.clone()).await;
    let provider = bedrock(&stub.url);
    let inp = input(json!({"model": "anthropic.claude-test", "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Summarise."}
    ], "parameters": {"max_tokens": 100}}));
    let result = provider.call(&request(&inp, "{}")).await;
    (result, stub)
}

fn bedrock_error(status: u16, kind: &str) -> Reply {
    Reply::json(status, json!({"message": "Summarise. was rejected"}))
        .with_header("x-amzn-errortype", kind)
}

#[tokio::test]
async fn bedrock_converse_answers_and_errors_are_classified() {
    let (result, stub) = converse_once(Reply::json(
        200,
        json!({
            "output": {"message": {"role": "assistant", "content": [{"text": "Brief."}]}},
            "stopReason": "end_turn",
            "usage": {"inputTokens": 9, "outputTokens": 1, "totalTokens": 10},
            "metrics": {"latencyMs": 12}
        }),
    ))
    .await;
    let answer = result.expect("answer");
    assert_eq!(output_of(&answer), "Brief.");
    let usage = answer.usage.expect("usage");
    assert_eq!((usage.input, usage.output, usage.estimated), (9, 1, false));
    let sent = &stub.requests()[0];
    assert_eq!(sent.path, "/model/anthropic.claude-test/converse");
    let body = sent.json();
    assert_eq!(body["system"][0]["text"], "Be brief.");
    assert_eq!(body["messages"][0]["content"][0]["text"], "Summarise.");
    assert_eq!(body["inferenceConfig"]["maxTokens"], 100);
    assert!(sent.header("authorization").is_some(), "signed");

    let (result, stub) = converse_once(bedrock_error(429, "ThrottlingException")).await;
    assert_eq!(
        result,
        Err(ProviderError::Throttled {
            retry_after_ms: None,
            reason: "ThrottlingException".to_owned()
        })
    );
    assert_eq!(stub.requests().len(), 1, "no SDK retries");
    let (result, _) = converse_once(bedrock_error(500, "InternalServerException")).await;
    assert!(matches!(result, Err(ProviderError::Transient { .. })));
    let (result, _) = converse_once(bedrock_error(400, "ValidationException")).await;
    assert_eq!(
        result,
        Err(ProviderError::Permanent {
            reason: "ValidationException".to_owned()
        })
    );
    // A service quota, which waiting does not clear: not a throttle, it spends its attempt.
    let (result, _) = converse_once(bedrock_error(400, "ServiceQuotaExceededException")).await;
    assert!(
        matches!(result, Err(ProviderError::Transient { .. })),
        "{result:?}"
    );
    // A code this client does not know may have run the model: never permanent.
    let (result, _) = converse_once(bedrock_error(424, "ModelStreamErrorException")).await;
    assert!(
        matches!(result, Err(ProviderError::Uncertain { .. })),
        "{result:?}"
    );
    let (result, _) = converse_once(Reply::Drop).await;
    assert!(
        matches!(result, Err(ProviderError::Uncertain { .. })),
        "{result:?}"
    );
}

/// A redirect is never followed: it would carry the key and the prompt wherever the server
/// says. The 3xx is a refusal like any other, and the other server never hears of the call.
#[tokio::test]
async fn a_redirect_is_refused_not_followed() {
    let elsewhere = HttpStub::start(|_, _| Reply::json(200, chat_answer("stolen"))).await;
    let location = format!("{}/v1/chat/completions", elsewhere.url);
    let (result, stub) =
        chat_once(Reply::json(307, json!({})).with_header("location", &location)).await;
    assert!(
        matches!(&result, Err(ProviderError::Permanent { reason }) if reason.contains("307")),
        "{result:?}"
    );
    assert_eq!(stub.requests().len(), 1);
    assert!(elsewhere.requests().is_empty());
}

/// One Messages call for a job with a system message and a ceiling of its own, against a
/// server that always gives `reply`.
async fn message_once(reply: Reply) -> (Result<Answer, ProviderError>, HttpStub) {
    let stub = HttpStub::start(move |_, _| reply.clone()).await;
    let provider = anthropic(&stub.url, Structured::Format);
    let inp = input(json!({"model": "claude-test", "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Summarise this."}
    ], "parameters": {"max_tokens": 100, "temperature": 1.5, "stop": "END", "seed": 7}}));
    let result = provider.call(&request(&inp, "{}")).await;
    (result, stub)
}

/// Every row of the README's Anthropic table, on the wire.
#[tokio::test]
async fn anthropic_messages_answers_and_errors_are_classified() {
    let text = json!([{"type": "text", "text": "Brief"}, {"type": "text", "text": "."}]);
    let (result, stub) = message_once(Reply::json(200, message(text, "end_turn"))).await;
    let answer = result.expect("answer");
    assert_eq!(output_of(&answer), "Brief.");
    assert_eq!(answer.finish, Finish::Stop);
    let usage = answer.usage.expect("usage");
    assert_eq!(
        (
            usage.input,
            usage.output,
            usage.cache_read,
            usage.cache_write
        ),
        (9, 4, 100, 20),
        "cache reads and writes are counted apart"
    );
    let sent = &stub.requests()[0];
    assert_eq!(
        (sent.method.as_str(), sent.path.as_str()),
        ("POST", "/v1/messages")
    );
    assert_eq!(sent.header("x-api-key"), Some("sk-ant-test-secret"));
    assert_eq!(sent.header("anthropic-version"), Some("2023-06-01"));
    assert_eq!(
        sent.header("authorization"),
        None,
        "the key goes in x-api-key only"
    );
    let body = sent.json();
    assert_eq!(body["model"], "claude-test");
    assert_eq!(
        body["system"],
        json!([{"type": "text", "text": "Be brief."}])
    );
    assert_eq!(
        body["messages"],
        json!([{"role": "user", "content": "Summarise this."}])
    );
    assert_eq!(body["max_tokens"], 100);
    assert_eq!(body["temperature"], 1.0, "Anthropic's range is 0 to 1");
    assert_eq!(body["stop_sequences"], json!(["END"]));
    assert!(body.get("seed").is_none() && body.get("parameters").is_none());
    assert!(body.get("output_config").is_none(), "free text: no format");

    // Cut off by the answer's ceiling, or refused: the one vocabulary.
    let (result, _) = message_once(Reply::json(200, message(json!([]), "max_tokens"))).await;
    assert_eq!(result.expect("answer").finish, Finish::Length);
    let (result, _) = message_once(Reply::json(200, message(json!([]), "refusal"))).await;
    assert_eq!(result.expect("answer").finish, Finish::ContentFilter);

    // Refused for the rate limit, before any work: a throttle with its wait.
    let (result, _) =
        message_once(anthropic_error(429, "rate_limit_error").with_header("retry-after", "12"))
            .await;
    assert_eq!(
        result,
        Err(ProviderError::Throttled {
            retry_after_ms: Some(12_000),
            reason: "HTTP 429 rate_limit_error".to_owned()
        })
    );
    // The spend limit is no throttle: waiting does not clear it.
    let spend = Reply::json(
        429,
        json!({"type": "error", "error": {"type": "rate_limit_error", "message": "x",
               "details": {"error_code": "enforced_spend_limit_reached"}}}),
    )
    .with_header("anthropic-organization-id", "org-test");
    let (result, _) = message_once(spend).await;
    assert!(
        matches!(&result, Err(ProviderError::Transient { reason, .. })
            if reason.ends_with("enforced_spend_limit_reached")),
        "{result:?}"
    );
    // Overloaded: refused before work.
    let (result, _) = message_once(anthropic_error(529, "overloaded_error")).await;
    assert!(
        matches!(result, Err(ProviderError::Transient { .. })),
        "{result:?}"
    );
    // Credentials are configuration, not the job's fault.
    let (result, _) = message_once(anthropic_error(401, "authentication_error")).await;
    assert!(
        matches!(result, Err(ProviderError::Transient { .. })),
        "{result:?}"
    );
    // Anthropic's own failure, or a gateway's, after the request was sent: it may have run.
    for reply in [
        anthropic_error(500, "api_error"),
        Reply::json(502, json!({})),
        Reply::json(529, json!({})),
        Reply::json(429, json!({"message": "slow down"})),
        // Anthropic's body without its headers: a gateway shaped like it (LiteLLM answers
        // Anthropic's format), or a gateway's 408 after giving up on its upstream.
        Reply::json(
            429,
            json!({"type": "error", "error": {"type": "rate_limit_error"}}),
        ),
        Reply::json(
            529,
            json!({"type": "error", "error": {"type": "overloaded_error"}}),
        ),
        Reply::json(408, json!({})),
    ] {
        let (result, _) = message_once(reply.clone()).await;
        assert!(
            matches!(result, Err(ProviderError::Uncertain { .. })),
            "{reply:?}: {result:?}"
        );
    }
    // The request itself is wrong: the same call gives the same.
    for (status, kind) in [
        (400, "invalid_request_error"),
        (404, "not_found_error"),
        (413, "request_too_large"),
    ] {
        let (result, _) = message_once(anthropic_error(status, kind)).await;
        assert_eq!(
            result,
            Err(ProviderError::Permanent {
                reason: format!("HTTP {status} {kind}")
            })
        );
    }
    // The connection lost after sending, or the answer cut off: uncertain, never a partial
    // answer accepted.
    let (result, _) = message_once(Reply::Drop).await;
    assert!(
        matches!(result, Err(ProviderError::Uncertain { .. })),
        "{result:?}"
    );
    let whole = message(json!([{"type": "text", "text": "Brief."}]), "end_turn").to_string();
    let (result, _) = message_once(Reply::Cut {
        status: 200,
        body: whole.clone(),
        sent: whole.len() / 2,
    })
    .await;
    assert!(
        matches!(result, Err(ProviderError::Uncertain { .. })),
        "{result:?}"
    );
    // Nothing listening: nothing was sent.
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        format!("http://{}", listener.local_addr().expect("addr"))
    };
    let inp = input(json!({"model": "claude-test", "prompt": "Summarise this."}));
    let result = anthropic(&closed, Structured::Format)
        .call(&request(&inp, "{}"))
        .await;
    assert!(
        matches!(result, Err(ProviderError::Transient { .. })),
        "{result:?}"
    );
}
