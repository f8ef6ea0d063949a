//! The HTTP providers against a scripted local server speaking each wire format: how every
//! answer is classified, background calls and their retrieval, and the fallback to Chat
//! Completions. No test reaches the internet.
//!
//! Why this file is long: every provider's table of answers is here, row by row, and the
//! providers share the scripted server, the requests and the answers' reading.

mod common;

use std::time::Duration;

use common::http::{HttpStub, Reply, bedrock};
use fenced_jobs::job::contract::{Contract, Finish};
use fenced_jobs::provider::Secret;
use fenced_jobs::provider::anthropic::{AnthropicProvider, AnthropicSettings, Structured};
use fenced_jobs::provider::openai::{OpenAiApi, OpenAiProvider, OpenAiSettings};
use fenced_jobs::provider::{
    Answer, Provider, ProviderError, ProviderRequest, Retrieval, Submission,
};
use serde_json::{Map, Value, json};

fn input(value: Value) -> Map<String, Value> {
    value.as_object().cloned().expect("object")
}

/// The contract of the requests: free text, as a job naming no contract file is held to.
static FREE_TEXT: std::sync::LazyLock<Contract> =
    std::sync::LazyLock::new(|| Contract::free_text("summary.v1"));

fn request<'a>(input: &'a Map<String, Value>, json: &'a str) -> ProviderRequest<'a> {
    ProviderRequest {
        job_id: "job-7",
        attempt: 2,
        epoch: 3,
        contract: "summary.v1",
        output: &FREE_TEXT,
        input,
        input_json: json,
        max_output_tokens: 0,
        idempotency_key: "job-7/2".to_owned(),
        progress: None,
    }
}

fn openai(url: &str, api: OpenAiApi) -> OpenAiProvider {
    let settings = OpenAiSettings {
        base_url: format!("{url}/v1"),
        api,
        model: None,
        connect_timeout_ms: 1_000,
        request_timeout_ms: 1_000,
        stream: false,
        ..OpenAiSettings::default()
    };
    OpenAiProvider::new(settings, Some(Secret::new("sk-test-secret"))).expect("client")
}

fn completed(id: &str, text: &str) -> Value {
    json!({
        "id": id, "object": "response", "status": "completed", "model": "gpt-test",
        "output": [{"type": "message", "role": "assistant",
                    "content": [{"type": "output_text", "text": text}]}],
        "usage": {"input_tokens": 5, "output_tokens": 2}
    })
}

fn chat_answer(text: &str) -> Value {
    json!({
        "id": "chatcmpl-1", "object": "chat.completion", "model": "gpt-test",
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": text}}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 2}
    })
}

fn output_of(answer: &Answer) -> String {
    let body: Value = serde_json::from_str(&answer.body).expect("json body");
    body["output"].as_str().expect("output").to_owned()
}

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
        Reply::json(429, json!({"error": {"code": "rate_limit_exceeded"}}))
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
    let (result, _) = chat_once(Reply::json(
        429,
        json!({"error": {"code": "insufficient_quota", "type": "insufficient_quota"}}),
    ))
    .await;
    assert!(
        matches!(result, Err(ProviderError::Transient { ref reason, .. }) if reason == "HTTP 429 insufficient_quota"),
        "{result:?}"
    );

    let (result, _) = chat_once(Reply::json(500, json!({"error": {"type": "server_error"}}))).await;
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
    let (result, _) = chat_once(Reply::json(
        503,
        json!({"error": {"type": "server_error", "code": "overloaded"}}),
    ))
    .await;
    assert!(
        matches!(result, Err(ProviderError::Transient { .. })),
        "{result:?}"
    );

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

#[tokio::test]
async fn a_background_response_is_submitted_then_completes_on_the_third_poll() {
    let stub = HttpStub::start(|req, before| {
        let polls = before.iter().filter(|r| r.method == "GET").count();
        match (req.method.as_str(), req.path.as_str()) {
            ("POST", "/v1/responses") => {
                Reply::json(200, json!({"id": "resp_42", "status": "queued"}))
            }
            ("GET", "/v1/responses/resp_42") if polls < 2 => {
                Reply::json(200, json!({"id": "resp_42", "status": "in_progress"}))
            }
            ("GET", "/v1/responses/resp_42") => {
                Reply::json(200, completed("resp_42", "Done at last."))
            }
            _ => Reply::json(404, json!({})),
        }
    })
    .await;
    let provider = openai(&stub.url, OpenAiApi::Responses);
    assert!(provider.can_retrieve());
    let inp = input(json!({"model": "gpt-test", "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Summarise."}
    ], "parameters": {"max_tokens": 64}}));
    // The job's own ceiling, in the Responses API's spelling, never the deployment's.
    let req = ProviderRequest {
        max_output_tokens: 16_384,
        ..request(&inp, "{}")
    };
    let submitted = provider.submit(&req).await.expect("submitted");
    assert_eq!(submitted, Submission::Started("resp_42".to_owned()));
    let body = stub.requests()[0].json();
    assert_eq!(body["background"], true);
    assert_eq!(body["store"], true);
    assert_eq!(body["max_output_tokens"], 64);
    assert_eq!(body["input"][1]["content"], "Summarise.");

    assert_eq!(
        provider.retrieve("resp_42", 0, &req).await,
        Retrieval::Running
    );
    assert_eq!(
        provider.retrieve("resp_42", 0, &req).await,
        Retrieval::Running
    );
    let Retrieval::Completed(answer) = provider.retrieve("resp_42", 0, &req).await else {
        panic!("completed expected on the third poll");
    };
    assert_eq!(output_of(&answer), "Done at last.");
    let usage = answer.usage.expect("usage");
    assert_eq!((usage.input, usage.output), (5, 2));
    assert_eq!(answer.provider_ref.as_deref(), Some("resp_42"));
    assert_eq!(
        provider.retrieve("resp_unknown", 0, &req).await,
        Retrieval::NotFound
    );
    provider.cancel("resp_42").await;
    assert_eq!(stub.count("POST", "/v1/responses/resp_42/cancel"), 1);
    assert_eq!(
        stub.count("POST", "/v1/responses"),
        2,
        "one submit, one cancel"
    );
}

/// A background response still `queued` past `OPENAI_QUEUED_TIMEOUT_SECONDS` from its claim
/// never started: it is cancelled, and its attempt ends refused before work.
#[tokio::test]
async fn a_response_queued_too_long_is_cancelled_and_refused_before_work() {
    // Queued until cancelled; then the server says so.
    let stub = HttpStub::start(|req, before| {
        let cancelled = before.iter().any(|r| r.path.ends_with("/cancel"));
        match req.method.as_str() {
            "GET" if cancelled => Reply::json(200, json!({"id": "resp_q", "status": "cancelled"})),
            "GET" => Reply::json(200, json!({"id": "resp_q", "status": "queued"})),
            _ => Reply::json(200, json!({"id": "resp_q", "status": "cancelled"})),
        }
    })
    .await;
    let provider = openai(&stub.url, OpenAiApi::Responses);
    let inp = input(json!({"model": "gpt-test", "prompt": "p"}));
    let req = request(&inp, "{}");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("time")
        .as_millis() as i64;
    assert_eq!(
        provider.retrieve("resp_q", now - 60_000, &req).await,
        Retrieval::Running
    );
    assert_eq!(stub.count("POST", "/v1/responses/resp_q/cancel"), 0);
    let late = provider.retrieve("resp_q", now - 601_000, &req).await;
    assert!(
        matches!(&late, Retrieval::Failed(ProviderError::Transient { reason, .. })
            if reason.contains("queued")),
        "{late:?}"
    );
    assert_eq!(stub.count("POST", "/v1/responses/resp_q/cancel"), 1);

    // A response that started while the cancel was on its way is followed, not refused.
    let stub = HttpStub::start(|req, before| {
        let cancelled = before.iter().any(|r| r.path.ends_with("/cancel"));
        match req.method.as_str() {
            "GET" if cancelled => {
                Reply::json(200, json!({"id": "resp_q", "status": "in_progress"}))
            }
            "GET" => Reply::json(200, json!({"id": "resp_q", "status": "queued"})),
            _ => Reply::json(409, json!({"error": {"code": "cannot_cancel"}})),
        }
    })
    .await;
    let provider = openai(&stub.url, OpenAiApi::Responses);
    let started = provider.retrieve("resp_q", now - 601_000, &req).await;
    assert_eq!(started, Retrieval::Running);
}

#[tokio::test]
async fn failed_and_cancelled_background_responses_are_definite_failures_and_an_incomplete_one_is_cut_off()
 {
    let stub = HttpStub::start(|req, _| match req.path.as_str() {
        "/v1/responses/resp_f" => Reply::json(
            200,
            json!({"id": "resp_f", "status": "failed", "error": {"code": "server_error"}}),
        ),
        "/v1/responses/resp_c" => Reply::json(200, json!({"id": "resp_c", "status": "cancelled"})),
        "/v1/responses/resp_i" => Reply::json(
            200,
            json!({"id": "resp_i", "status": "incomplete",
                   "incomplete_details": {"reason": "max_output_tokens"},
                   "output": [{"type": "message", "content": [
                       {"type": "output_text", "text": "{\"number\": \"INV-1\", \"tot"}]}]}),
        ),
        _ => Reply::json(503, json!({})),
    })
    .await;
    let provider = openai(&stub.url, OpenAiApi::Responses);
    let inp = input(json!({"model": "m", "prompt": "p"}));
    let req = request(&inp, "{}");
    assert!(matches!(
        provider.retrieve("resp_f", 0, &req).await,
        Retrieval::Failed(ProviderError::Transient { .. })
    ));
    assert!(matches!(
        provider.retrieve("resp_c", 0, &req).await,
        Retrieval::Failed(ProviderError::Transient { .. })
    ));
    // An incomplete response is the model's answer cut off: its contract judges it.
    let Retrieval::Completed(cut) = provider.retrieve("resp_i", 0, &req).await else {
        panic!("an incomplete response carries its answer so far");
    };
    assert_eq!(cut.finish, Finish::Length);
    assert_eq!(cut.provider_ref.as_deref(), Some("resp_i"));
    let json = Contract::parse("x@1", r#"{"format": "json"}"#).expect("compiles");
    let Err(ProviderError::InvalidOutput(rejected)) = cut.clone().judged(&json) else {
        panic!("a JSON contract never takes a truncated answer");
    };
    assert_eq!(rejected.errors, ["the answer is cut off: finish length"]);
    assert_eq!(rejected.excerpt, r#"{"number": "INV-1", "tot"#);
    assert!(cut.judged(&FREE_TEXT).is_ok(), "free text takes it");
    // The provider cannot be asked right now: nothing is known, and it is never read as
    // running.
    assert_eq!(
        provider.retrieve("resp_x", 0, &req).await,
        Retrieval::Unreachable {
            retry_after_ms: None
        }
    );
}

#[tokio::test]
async fn retrieval_errors_say_not_found_denied_or_ask_again() {
    let stub = HttpStub::start(|req, _| match req.path.as_str() {
        "/v1/responses/resp_400" => Reply::json(400, json!({"error": {"code": "invalid_id"}})),
        "/v1/responses/resp_410" => Reply::json(410, json!({})),
        "/v1/responses/resp_401" => Reply::json(401, json!({})),
        "/v1/responses/resp_403" => Reply::json(403, json!({})),
        "/v1/responses/resp_429" => Reply::json(429, json!({})).with_header("retry-after", "3"),
        "/v1/responses/resp_502" => Reply::json(502, json!({})),
        _ => Reply::json(500, json!({"error": {"type": "server_error"}})),
    })
    .await;
    let provider = openai(&stub.url, OpenAiApi::Responses);
    let inp = input(json!({"model": "m", "prompt": "p"}));
    let req = request(&inp, "{}");
    for id in ["resp_400", "resp_410"] {
        assert_eq!(
            provider.retrieve(id, 0, &req).await,
            Retrieval::NotFound,
            "{id}"
        );
    }
    for id in ["resp_401", "resp_403"] {
        assert_eq!(
            provider.retrieve(id, 0, &req).await,
            Retrieval::Denied,
            "{id}"
        );
    }
    assert_eq!(
        provider.retrieve("resp_429", 0, &req).await,
        Retrieval::Unreachable {
            retry_after_ms: Some(3_000)
        }
    );
    for id in ["resp_502", "resp_500"] {
        assert_eq!(
            provider.retrieve(id, 0, &req).await,
            Retrieval::Unreachable {
                retry_after_ms: None
            },
            "{id}"
        );
    }
}

/// A model the server has no Responses API for gets Chat Completions, and once Chat
/// Completions answered for it, its calls go there directly; other models are not switched.
#[tokio::test]
async fn a_server_without_the_responses_api_gets_chat_completions() {
    let stub = HttpStub::start(|req, _| match req.path.as_str() {
        "/v1/chat/completions" => Reply::json(200, chat_answer("From chat.")),
        "/v1/responses" if req.json()["model"] == "other" => {
            Reply::json(200, completed("resp_1", "From responses."))
        }
        _ => Reply::json(404, json!({"detail": "Not Found"})),
    })
    .await;
    let provider = openai(&stub.url, OpenAiApi::Responses);
    let inp = input(json!({"model": "m", "prompt": "p"}));
    let req = request(&inp, "{}");
    for _ in 0..2 {
        let Ok(Submission::Answered(answer)) = provider.submit(&req).await else {
            panic!("an answer from chat expected");
        };
        assert_eq!(output_of(&answer), "From chat.");
    }
    assert_eq!(
        stub.count("POST", "/v1/responses"),
        1,
        "asked once, then remembered"
    );
    assert_eq!(stub.count("POST", "/v1/chat/completions"), 2);
    let other = input(json!({"model": "other", "prompt": "p"}));
    let Ok(Submission::Answered(answer)) = provider.submit(&request(&other, "{}")).await else {
        panic!("an answer from the Responses API expected");
    };
    assert_eq!(output_of(&answer), "From responses.");
    assert_eq!(
        stub.count("POST", "/v1/responses"),
        2,
        "another model is not switched"
    );

    // A stray 404 whose Chat Completions call fails too switches nothing.
    let stub = HttpStub::start(|_, _| Reply::json(404, json!({"detail": "Not Found"}))).await;
    let provider = openai(&stub.url, OpenAiApi::Responses);
    for _ in 0..2 {
        assert!(provider.submit(&req).await.is_err());
    }
    assert_eq!(
        stub.count("POST", "/v1/responses"),
        2,
        "asked again each time"
    );

    // An unknown model is the job's problem, not a missing API.
    let stub =
        HttpStub::start(|_, _| Reply::json(404, json!({"error": {"code": "model_not_found"}})))
            .await;
    let provider = openai(&stub.url, OpenAiApi::Responses);
    assert!(matches!(
        provider.submit(&req).await,
        Err(ProviderError::Permanent { .. })
    ));
    assert_eq!(stub.count("POST", "/v1/chat/completions"), 0);
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

/// A response id is checked before it goes into a URL, the ledger, an event or a terminal:
/// one that is not an id is not used (the submit is uncertain: it may have started a call
/// nothing can follow), and a stored reference that is not one is never put in a path.
#[tokio::test]
async fn a_response_id_that_is_not_an_id_is_never_used() {
    let stub = HttpStub::start(|_, _| {
        Reply::json(200, json!({"id": "../files/file-1?x=", "status": "queued"}))
    })
    .await;
    let provider = openai(&stub.url, OpenAiApi::Responses);
    let inp = input(json!({"model": "gpt-test", "prompt": "Summarise this."}));
    let req = request(&inp, "{}");
    let submitted = provider.submit(&req).await;
    assert!(
        matches!(&submitted, Err(ProviderError::Uncertain { evidence }) if evidence.contains("usable response id")),
        "{submitted:?}"
    );
    assert!(matches!(
        provider.retrieve("../files/file-1", 0, &req).await,
        Retrieval::Denied
    ));
    provider.cancel("resp_1/../../x").await;
    let paths: Vec<String> = stub.requests().iter().map(|r| r.path.clone()).collect();
    assert_eq!(paths, ["/v1/responses"]);
}

/// A key rotated in SSM is taken up after the server refuses the old one: the call is sent
/// again at once with the new key, and no attempt is spent; a second refusal within the
/// minute does not read the parameter again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_key_is_read_again_after_a_401() {
    use fenced_jobs::provider::{AnyProvider, KeySource, ProviderConfig};
    let aws = common::emulator().await;
    let ssm = aws_sdk_ssm::Client::new(&aws.config);
    let name = format!("/{}/openai-key", common::unique("keys"));
    let put = |value: &'static str| {
        ssm.put_parameter()
            .name(&name)
            .value(value)
            .r#type(aws_sdk_ssm::types::ParameterType::SecureString)
            .overwrite(true)
            .send()
    };
    put("sk-old").await.expect("put");
    let accepted = std::sync::Arc::new(std::sync::Mutex::new("Bearer sk-new".to_owned()));
    let accepts = accepted.clone();
    let stub = HttpStub::start(move |request, _| {
        let good = accepts.lock().expect("lock").clone();
        if request.header("authorization") == Some(good.as_str()) {
            Reply::json(200, chat_answer("done"))
        } else {
            Reply::json(
                401,
                json!({"error": {"code": "invalid_api_key", "type": "invalid_request_error"}}),
            )
        }
    })
    .await;
    let config = ProviderConfig::OpenAi {
        settings: OpenAiSettings {
            base_url: format!("{}/v1", stub.url),
            api: OpenAiApi::Chat,
            ..OpenAiSettings::default()
        },
        key: KeySource::Parameter(name.clone()),
    };
    let provider = AnyProvider::from_config(&config, &aws.config)
        .await
        .expect("provider");
    // GIVEN the key was rotated after the environment read it
    put("sk-new").await.expect("rotate");
    let inp = input(json!({"model": "gpt-test", "prompt": "Summarise this."}));
    let answer = provider.call(&request(&inp, "{}")).await.expect("answered");
    assert_eq!(output_of(&answer), "done");
    let auth: Vec<Option<String>> = stub
        .requests()
        .iter()
        .map(|r| r.header("authorization").map(str::to_owned))
        .collect();
    assert_eq!(
        auth,
        [Some("Bearer sk-old".into()), Some("Bearer sk-new".into())]
    );
    // AND a key rotated again within the minute is not read again: the 401 is the answer
    put("sk-newer").await.expect("rotate");
    *accepted.lock().expect("lock") = "Bearer sk-newer".to_owned();
    let refused = provider.call(&request(&inp, "{}")).await;
    assert!(
        matches!(&refused, Err(ProviderError::Transient { reason, .. }) if reason.contains("401")),
        "{refused:?}"
    );
    assert_eq!(stub.requests().len(), 3);
    // AND calls refused together while the key is replaced wait for the one that reads it,
    // and are sent again with the new key rather than failing on the minute's rule
    put("sk-third").await.expect("rotate");
    *accepted.lock().expect("lock") = "Bearer sk-third".to_owned();
    let provider = AnyProvider::from_config(
        &ProviderConfig::OpenAi {
            settings: OpenAiSettings {
                base_url: format!("{}/v1", stub.url),
                api: OpenAiApi::Chat,
                ..OpenAiSettings::default()
            },
            key: KeySource::Parameter(name.clone()),
        },
        &aws.config,
    )
    .await
    .expect("provider");
    put("sk-new").await.expect("rotate");
    *accepted.lock().expect("lock") = "Bearer sk-new".to_owned();
    let before = stub.requests().len();
    let req = request(&inp, "{}");
    let calls = (0..4).map(|_| provider.call(&req));
    for answer in futures::future::join_all(calls).await {
        assert_eq!(output_of(&answer.expect("answered")), "done");
    }
    let resent = stub.requests()[before..]
        .iter()
        .filter(|r| r.header("authorization") == Some("Bearer sk-new"))
        .count();
    assert_eq!((stub.requests().len() - before, resent), (8, 4));
}

fn anthropic(url: &str, structured: Structured) -> AnthropicProvider {
    let settings = AnthropicSettings {
        base_url: url.to_owned(),
        structured,
        connect_timeout_ms: 1_000,
        stream: false,
        ..AnthropicSettings::default()
    };
    AnthropicProvider::new(settings, Some(Secret::new("sk-ant-test-secret"))).expect("client")
}

fn message(content: Value, stop_reason: &str) -> Value {
    json!({
        "id": "msg_01", "type": "message", "role": "assistant", "model": "claude-test",
        "content": content, "stop_reason": stop_reason,
        "usage": {"input_tokens": 9, "output_tokens": 4, "cache_read_input_tokens": 100,
                  "cache_creation_input_tokens": 20, "service_tier": "standard"}
    })
}

fn anthropic_error(status: u16, kind: &str) -> Reply {
    Reply::json(
        status,
        json!({"type": "error", "error": {"type": kind, "message": "Summarise this. failed"},
               "request_id": "req_01"}),
    )
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
    );
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

/// The contract's schema reaches Anthropic in its own form: structured output, or a tool the
/// model is made to call whose input is the answer.
#[tokio::test]
async fn anthropic_carries_the_contract_as_structured_output_or_a_forced_tool() {
    let schema = json!({"type": "object", "properties": {"title": {"type": "string"}},
                        "required": ["title"], "additionalProperties": false});
    let contract =
        Contract::parse("invoice@2", &json!({"schema": schema}).to_string()).expect("contract");
    let inp = input(
        json!({"model": "claude-test", "messages": [{"role": "user", "content": [
            {"type": "text", "text": "Long document", "cache_control": {"type": "ephemeral"}},
            {"type": "text", "text": "Extract."}
        ]}]}),
    );
    let req = ProviderRequest {
        output: &contract,
        max_output_tokens: 2_048,
        ..request(&inp, "{}")
    };

    let reply = message(
        json!([{"type": "text", "text": "{\"title\": \"T\"}"}]),
        "end_turn",
    );
    let stub = HttpStub::start(move |_, _| Reply::json(200, reply.clone())).await;
    let answer = anthropic(&stub.url, Structured::Format)
        .call(&req)
        .await
        .expect("answer")
        .judged(&contract)
        .expect("accepted");
    let body: Value = serde_json::from_str(&answer.body).expect("json");
    assert_eq!(body["output"], json!({"title": "T"}));
    let sent = stub.requests()[0].json();
    assert_eq!(
        sent["output_config"],
        json!({"format": {"type": "json_schema", "schema": schema}})
    );
    assert_eq!(sent["max_tokens"], 2_048, "the deployment's ceiling");
    assert_eq!(
        sent["messages"][0]["content"][0]["cache_control"],
        json!({"type": "ephemeral"})
    );

    let reply = message(
        json!([{"type": "tool_use", "id": "toolu_1", "name": "invoice_2",
                "input": {"title": "T"}}]),
        "tool_use",
    );
    let stub = HttpStub::start(move |_, _| Reply::json(200, reply.clone())).await;
    let answer = anthropic(&stub.url, Structured::Tool)
        .call(&req)
        .await
        .expect("answer");
    assert_eq!(
        answer.finish,
        Finish::Stop,
        "the forced tool's call is the answer"
    );
    let body: Value =
        serde_json::from_str(&answer.judged(&contract).expect("ok").body).expect("json");
    assert_eq!(body["output"], json!({"title": "T"}));
    let sent = stub.requests()[0].json();
    assert_eq!(sent["tools"][0]["name"], "invoice_2");
    assert_eq!(sent["tools"][0]["input_schema"], schema);
    assert_eq!(
        sent["tool_choice"],
        json!({"type": "tool", "name": "invoice_2"})
    );
    assert!(sent.get("output_config").is_none());

    // An answer that breaks the contract is refused after the call, whatever was asked.
    let reply = message(
        json!([{"type": "text", "text": "{\"title\": 7}"}]),
        "end_turn",
    );
    let stub = HttpStub::start(move |_, _| Reply::json(200, reply.clone())).await;
    let answer = anthropic(&stub.url, Structured::Format).call(&req).await;
    assert!(matches!(
        answer.expect("answer").judged(&contract),
        Err(ProviderError::InvalidOutput(_))
    ));
}

/// Server-sent events: `event: <name>` and its JSON data, each sent after `pause`.
fn sse(events: &[(&str, Value)], pause: Duration) -> Vec<(Duration, String)> {
    events
        .iter()
        .map(|(name, data)| (pause, format!("event: {name}\ndata: {data}\n\n")))
        .collect()
}

fn message_events(stop: bool) -> Vec<(&'static str, Value)> {
    let mut events = vec![
        (
            "message_start",
            json!({"type": "message_start", "message": {"id": "msg_1",
            "type": "message", "role": "assistant", "model": "claude-test", "content": [],
            "usage": {"input_tokens": 9, "output_tokens": 1, "cache_read_input_tokens": 100,
                      "cache_creation_input_tokens": 20}}}),
        ),
        (
            "content_block_start",
            json!({"type": "content_block_start", "index": 0,
            "content_block": {"type": "text", "text": ""}}),
        ),
        ("ping", json!({"type": "ping"})),
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0,
            "delta": {"type": "text_delta", "text": "Brief"}}),
        ),
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0,
            "delta": {"type": "text_delta", "text": "."}}),
        ),
        (
            "content_block_stop",
            json!({"type": "content_block_stop", "index": 0}),
        ),
        (
            "message_delta",
            json!({"type": "message_delta",
            "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 4}}),
        ),
    ];
    if stop {
        events.push(("message_stop", json!({"type": "message_stop"})));
    }
    events
}

/// A streamed Messages call against a server that sends `reply`, under a progress rule of
/// `timeout`.
async fn streamed_message(reply: Reply, timeout: Duration) -> Result<Answer, ProviderError> {
    let stub = HttpStub::start(move |_, _| reply.clone()).await;
    let settings = AnthropicSettings {
        base_url: stub.url.clone(),
        connect_timeout_ms: 1_000,
        ..AnthropicSettings::default()
    };
    let provider = AnthropicProvider::new(settings, None).expect("client");
    let inp = input(json!({"model": "claude-test", "prompt": "Summarise this."}));
    let req = ProviderRequest {
        progress: Some(fenced_jobs::provider::Progress::new(timeout)),
        ..request(&inp, "{}")
    };
    let answer = provider.call(&req).await;
    let sent = stub.requests()[0].json();
    assert_eq!(sent["stream"], true, "the answer streams");
    assert_eq!(
        sent["max_tokens"], 4096,
        "neither the job nor the deployment sets a ceiling: the default"
    );
    answer
}

/// A streamed answer is taken only whole: its text and usage once `message_stop` came; a
/// stream that ends before, or an error event in it, is uncertain; and a stream that stops
/// sending bytes is hung: cancelled within the progress timeout, uncertain.
#[tokio::test]
async fn anthropic_streams_are_taken_whole_and_a_stalled_one_is_hung() {
    let minute = Duration::from_secs(60);
    let whole = Reply::Events {
        parts: sse(&message_events(true), Duration::ZERO),
        stall: false,
    };
    let answer = streamed_message(whole, minute).await.expect("answer");
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
        (9, 4, 100, 20)
    );

    let cut = Reply::Events {
        parts: sse(&message_events(false), Duration::ZERO),
        stall: false,
    };
    let result = streamed_message(cut, minute).await;
    assert!(
        matches!(&result, Err(ProviderError::Uncertain { evidence }) if evidence.contains("ended before")),
        "{result:?}"
    );

    let mut events = message_events(false);
    events.truncate(4);
    events.push((
        "error",
        json!({"type": "error", "error": {"type": "overloaded_error", "message": "x"}}),
    ));
    let failed = Reply::Events {
        parts: sse(&events, Duration::ZERO),
        stall: false,
    };
    let result = streamed_message(failed, minute).await;
    assert!(
        matches!(&result, Err(ProviderError::Uncertain { evidence }) if evidence.contains("overloaded_error")),
        "{result:?}"
    );

    // A delta for a block that never started: a part of the answer would be lost.
    let mut events = message_events(true);
    events.remove(1);
    let orphan = Reply::Events {
        parts: sse(&events, Duration::ZERO),
        stall: false,
    };
    let result = streamed_message(orphan, minute).await;
    assert!(
        matches!(&result, Err(ProviderError::Uncertain { evidence }) if evidence.contains("never started")),
        "{result:?}"
    );

    // Bytes every 300 ms keep a 1 s rule satisfied; then silence.
    let mut events = message_events(false);
    events.truncate(5);
    let stalled = Reply::Events {
        parts: sse(&events, Duration::from_millis(300)),
        stall: true,
    };
    let started = std::time::Instant::now();
    let result = streamed_message(stalled, Duration::from_secs(1)).await;
    let took = started.elapsed();
    assert!(
        matches!(&result, Err(ProviderError::Uncertain { evidence }) if evidence.contains("no bytes for 1 s")),
        "{result:?}"
    );
    assert!(
        took >= Duration::from_millis(2_400) && took < Duration::from_secs(5),
        "cancelled one timeout after the last bytes: {took:?}"
    );
}

/// Chat Completions streams too: the deltas joined, the usage of the last chunk, taken only
/// once `[DONE]` came; and a server that ignores `stream` answers whole, which is read as is.
#[tokio::test]
async fn chat_completions_streams_are_taken_whole() {
    let chunk = |delta: Value, finish: Value| {
        json!({"id": "c1", "object": "chat.completion.chunk", "model": "gpt-test",
               "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
    };
    let mut parts: Vec<String> = [
        chunk(json!({"role": "assistant", "content": ""}), Value::Null),
        chunk(json!({"content": "From "}), Value::Null),
        chunk(json!({"content": "a stream."}), Value::Null),
        chunk(json!({}), json!("stop")),
        json!({"id": "c1", "object": "chat.completion.chunk", "model": "gpt-test",
               "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 3}}),
    ]
    .iter()
    .map(|c| format!("data: {c}\n\n"))
    .collect();
    let call = |parts: Vec<String>| async move {
        let reply = Reply::Events {
            parts: parts.into_iter().map(|p| (Duration::ZERO, p)).collect(),
            stall: false,
        };
        let stub = HttpStub::start(move |_, _| reply.clone()).await;
        let settings = OpenAiSettings {
            stream: true,
            ..OpenAiSettings {
                base_url: format!("{}/v1", stub.url),
                api: OpenAiApi::Chat,
                ..OpenAiSettings::default()
            }
        };
        let provider = OpenAiProvider::new(settings, None).expect("client");
        let inp = input(json!({"model": "gpt-test", "prompt": "p"}));
        let answer = provider.call(&request(&inp, "{}")).await;
        let sent = stub.requests()[0].json();
        assert_eq!(sent["stream"], true);
        assert_eq!(sent["stream_options"]["include_usage"], true);
        answer
    };
    // Without `[DONE]`, the answer may be cut: uncertain.
    let result = call(parts.clone()).await;
    assert!(
        matches!(result, Err(ProviderError::Uncertain { .. })),
        "{result:?}"
    );
    parts.push("data: [DONE]\n\n".to_owned());
    let answer = call(parts).await.expect("answer");
    assert_eq!(output_of(&answer), "From a stream.");
    assert_eq!(answer.finish, Finish::Stop);
    let usage = answer.usage.expect("usage");
    assert_eq!((usage.input, usage.output), (5, 3));
    // A server that ignores `stream` answers whole: read as is.
    let (result, _) = {
        let stub = HttpStub::start(|_, _| Reply::json(200, chat_answer("Whole."))).await;
        let settings = OpenAiSettings {
            base_url: format!("{}/v1", stub.url),
            api: OpenAiApi::Chat,
            ..OpenAiSettings::default()
        };
        let provider = OpenAiProvider::new(settings, None).expect("client");
        let inp = input(json!({"model": "gpt-test", "prompt": "p"}));
        (provider.call(&request(&inp, "{}")).await, stub)
    };
    assert_eq!(output_of(&result.expect("answer")), "Whole.");
}

/// Bedrock with all a job may ask of `Converse`: cache points where parts carry
/// `cache_control`, an image and a document, the service tier and the model's own fields, the
/// deployment's guardrail, the contract's schema; the cache's tokens kept in the usage.
#[tokio::test]
async fn bedrock_carries_cache_points_media_tiers_fields_guardrails_and_the_schema() {
    let reply = json!({
        "output": {"message": {"role": "assistant", "content": [{"text": "{\"title\": \"T\"}"}]}},
        "stopReason": "end_turn",
        "usage": {"inputTokens": 9, "outputTokens": 3, "totalTokens": 132,
                  "cacheReadInputTokens": 100, "cacheWriteInputTokens": 20}
    });
    let stub = HttpStub::start(move |_, _| Reply::json(200, reply.clone())).await;
    let schema = json!({"type": "object", "properties": {"title": {"type": "string"}},
                        "required": ["title"], "additionalProperties": false});
    let contract =
        Contract::parse("invoice@2", &json!({"schema": schema}).to_string()).expect("contract");
    let inp = input(json!({"model": "anthropic.claude-test", "messages": [
        {"role": "system", "content": [{"type": "text", "text": "Rules.",
            "cache_control": {"type": "ephemeral"}}]},
        {"role": "user", "content": [
            {"type": "text", "text": "A long document.", "cache_control": {"type": "ephemeral"}},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
            {"type": "document", "title": "contract",
             "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0="}},
            {"type": "text", "text": "Extract the title."}
        ]}
    ], "parameters": {"service_tier": "flex",
                      "additionalModelRequestFields": {"top_k": 40}}}));
    let req = ProviderRequest {
        output: &contract,
        ..request(&inp, "{}")
    };
    let answer = bedrock(&stub.url).call(&req).await.expect("answer");
    let usage = answer.usage.expect("usage");
    assert_eq!((usage.cache_read, usage.cache_write), (100, 20));
    let sent = stub.requests()[0].json();
    assert_eq!(
        sent["system"],
        json!([{"text": "Rules."}, {"cachePoint": {"type": "default"}}])
    );
    let content = &sent["messages"][0]["content"];
    assert_eq!(content[0], json!({"text": "A long document."}));
    assert_eq!(content[1], json!({"cachePoint": {"type": "default"}}));
    assert_eq!(
        content[2],
        json!({"image": {"format": "png", "source": {"bytes": "iVBORw0KGgo="}}})
    );
    assert_eq!(
        content[3],
        json!({"document": {"format": "pdf", "name": "contract",
                            "source": {"bytes": "JVBERi0="}}})
    );
    assert_eq!(sent["serviceTier"], json!({"type": "flex"}));
    assert_eq!(sent["additionalModelRequestFields"], json!({"top_k": 40}));
    assert_eq!(
        sent["guardrailConfig"],
        json!({"guardrailIdentifier": "gr-1", "guardrailVersion": "2", "trace": "disabled"})
    );
    assert_eq!(
        sent["outputConfig"]["textFormat"]["structure"]["jsonSchema"]["name"],
        "invoice_2"
    );
    assert!(answer.judged(&contract).is_ok());
}

/// One `ConverseStream` event as Bedrock frames it: the event's type in its headers, its JSON
/// payload.
fn converse_event(kind: &str, payload: Value) -> Vec<u8> {
    use aws_smithy_types::event_stream::{Header, HeaderValue, Message};
    let message = Message::new(payload.to_string().into_bytes())
        .add_header(Header::new(
            ":message-type",
            HeaderValue::String("event".into()),
        ))
        .add_header(Header::new(
            ":event-type",
            HeaderValue::String(kind.to_owned().into()),
        ))
        .add_header(Header::new(
            ":content-type",
            HeaderValue::String("application/json".into()),
        ));
    let mut bytes = Vec::new();
    aws_smithy_eventstream::frame::write_message_to(&message, &mut bytes).expect("frame");
    bytes
}

/// A streamed Converse call against a server that sends these events (then stalls, with
/// `stall`), under a progress rule of `timeout`.
async fn converse_streamed(
    events: Vec<Vec<u8>>,
    pause: Duration,
    stall: bool,
    timeout: Duration,
) -> (Result<Answer, ProviderError>, HttpStub) {
    let reply = Reply::Bytes {
        content_type: "application/vnd.amazon.eventstream",
        parts: events.into_iter().map(|e| (pause, e)).collect(),
        stall,
    };
    let stub = HttpStub::start(move |_, _| reply.clone()).await;
    let provider = common::http::bedrock_with(&stub.url, true);
    let inp = input(json!({"model": "anthropic.claude-test", "prompt": "Summarise."}));
    let req = ProviderRequest {
        progress: Some(fenced_jobs::provider::Progress::new(timeout)),
        ..request(&inp, "{}")
    };
    (provider.call(&req).await, stub)
}

/// Bedrock streams through `ConverseStream` (its event-stream frames): the answer taken whole
/// once the stream ended after `messageStop`, its usage from the metadata; a stream that ends
/// before is uncertain, and one that goes silent is hung within the progress timeout.
#[tokio::test]
async fn bedrock_converse_streams_are_taken_whole_and_a_stalled_one_is_hung() {
    let delta = |text: &str| {
        converse_event(
            "contentBlockDelta",
            json!({"contentBlockIndex": 0, "delta": {"text": text}}),
        )
    };
    let start = converse_event("messageStart", json!({"role": "assistant"}));
    let stop = converse_event("messageStop", json!({"stopReason": "end_turn"}));
    let meta = converse_event(
        "metadata",
        json!({"usage": {"inputTokens": 9, "outputTokens": 2, "totalTokens": 11,
                         "cacheReadInputTokens": 4}, "metrics": {"latencyMs": 5}}),
    );
    let minute = Duration::from_secs(60);
    let whole = vec![start.clone(), delta("Brief"), delta("."), stop, meta];
    let (answer, stub) = converse_streamed(whole, Duration::ZERO, false, minute).await;
    let answer = answer.expect("answer");
    assert_eq!(output_of(&answer), "Brief.");
    assert_eq!(answer.finish, Finish::Stop);
    let usage = answer.usage.expect("usage");
    assert_eq!((usage.input, usage.output, usage.cache_read), (9, 2, 4));
    assert_eq!(
        stub.requests()[0].path,
        "/model/anthropic.claude-test/converse-stream"
    );

    let cut = vec![start.clone(), delta("Bri")];
    let (result, _) = converse_streamed(cut, Duration::ZERO, false, minute).await;
    assert!(
        matches!(&result, Err(ProviderError::Uncertain { evidence }) if evidence.contains("ended before")),
        "{result:?}"
    );

    let stalled = vec![start, delta("Bri")];
    let began = std::time::Instant::now();
    let (result, _) = converse_streamed(
        stalled,
        Duration::from_millis(300),
        true,
        Duration::from_secs(1),
    )
    .await;
    assert!(
        matches!(&result, Err(ProviderError::Uncertain { evidence }) if evidence.contains("no bytes for 1 s")),
        "{result:?}"
    );
    let took = began.elapsed();
    assert!(
        took >= Duration::from_millis(1_500) && took < Duration::from_secs(5),
        "{took:?}"
    );
}

/// The uploaded JSONL of a `POST /v1/files`: the multipart part after its headers.
fn uploaded_jsonl(body: &str) -> String {
    let start = body.find("application/jsonl\r\n\r\n").expect("file part") + 21;
    let end = body[start..]
        .find("\r\n--batch-")
        .expect("closing boundary")
        + start;
    body[start..end].to_owned()
}

/// An OpenAI Batch API server: one batch over one uploaded file, validating, then in
/// progress, finalizing, and completed with an output file (a success and a refused line) and
/// an error file (an expired line).
async fn openai_batch_server(lines: [String; 4]) -> HttpStub {
    let [ok, refused, expired, _never] = lines;
    HttpStub::start(move |req, before| {
        let looks = before
            .iter()
            .filter(|r| r.method == "GET" && r.path == "/v1/batches/batch_1")
            .count();
        let uploaded = || {
            before
                .iter()
                .find(|r| r.path == "/v1/files")
                .map(|r| uploaded_jsonl(&r.body))
                .unwrap_or_default()
        };
        match (req.method.as_str(), req.path.as_str()) {
            ("POST", "/v1/files") => Reply::json(200, json!({"id": "file-in1", "purpose": "batch"})),
            ("POST", "/v1/batches") => Reply::json(200, json!({"id": "batch_1", "status": "validating"})),
            ("GET", "/v1/batches/batch_1") => {
                let status = ["validating", "in_progress", "finalizing"]
                    .get(looks)
                    .copied()
                    .unwrap_or("completed");
                Reply::json(200, json!({"id": "batch_1", "status": status, "input_file_id": "file-in1",
                    "output_file_id": "file-out1", "error_file_id": "file-err1",
                    "created_at": 1_700_000_000, "metadata": {"source": "fenced-jobs"}}))
            }
            ("GET", "/v1/batches?limit=100") => Reply::json(200, json!({"data": [
                {"id": "batch_1", "created_at": 4_000_000_000_i64, "metadata": {"source": "fenced-jobs"}},
                {"id": "batch_other", "created_at": 4_000_000_000_i64, "metadata": {"source": "someone-else"}}
            ], "has_more": false, "last_id": "batch_other"})),
            ("GET", "/v1/files/file-in1/content") => Reply::Json { status: 200, headers: vec![], body: uploaded() },
            ("GET", "/v1/files/file-out1/content") => {
                let answered = json!({"id": "batch_req_1", "custom_id": ok, "response": {"status_code": 200,
                    "body": chat_answer("Batched answer.")}, "error": null});
                let refused = json!({"id": "batch_req_2", "custom_id": refused, "response": {"status_code": 400,
                    "body": {"error": {"code": "invalid_value", "message": "no"}}}, "error": null});
                Reply::Json { status: 200, headers: vec![], body: format!("{answered}\n{refused}\n") }
            }
            ("GET", "/v1/files/file-err1/content") => {
                let line = json!({"id": "batch_req_3", "custom_id": expired, "response": null,
                    "error": {"code": "batch_expired", "message": "not run"}});
                Reply::Json { status: 200, headers: vec![], body: format!("{line}\n") }
            }
            _ => Reply::json(404, json!({"error": {"code": "not_found"}})),
        }
    })
    .await
}

#[tokio::test]
async fn openai_batches_are_uploaded_created_followed_and_read_line_by_line() {
    use fenced_jobs::provider::batch::{batch_ref, line_id, pending_ref};
    let ids = [1, 2, 3, 4].map(|a| line_id("job-7", a, 9));
    let stub = openai_batch_server(ids.clone()).await;
    let provider = openai(&stub.url, OpenAiApi::Responses);
    assert!(provider.batches());
    let inp = input(json!({"model": "gpt-test", "prompt": "Summarise.", "deferrable": true}));
    let req = request(&inp, "{}");
    let lines: Vec<_> = ids
        .iter()
        .map(|id| provider.batch_line(&req, id).expect("line"))
        .collect();
    assert_eq!(
        provider.submit_batch(&lines).await.as_deref(),
        Ok("batch_1")
    );
    let sent = stub.requests();
    let jsonl = uploaded_jsonl(&sent[0].body);
    assert!(sent[0].body.contains("name=\"purpose\"\r\n\r\nbatch\r\n"));
    let first: Value = serde_json::from_str(jsonl.lines().next().expect("line")).expect("json");
    assert_eq!(first["custom_id"], ids[0].as_str());
    assert_eq!(first["url"], "/v1/chat/completions");
    assert_eq!(first["body"]["messages"][0]["content"], "Summarise.");
    assert!(first["body"].get("deferrable").is_none());
    assert_eq!(jsonl.lines().count(), 4);
    let create = sent[1].json();
    assert_eq!(create["input_file_id"], "file-in1");
    assert_eq!(create["completion_window"], "24h");
    assert_eq!(create["endpoint"], "/v1/chat/completions");

    // Validating: running (and taken as running for ten seconds by this environment).
    let a = batch_ref("batch_1", &ids[0]);
    assert_eq!(provider.retrieve(&a, 0, &req).await, Retrieval::Running);
    assert_eq!(provider.retrieve(&a, 0, &req).await, Retrieval::Running);
    assert_eq!(stub.count("GET", "/v1/batches/batch_1"), 1);
    // Another environment, later: in progress, finalizing, then completed.
    for _ in 0..2 {
        let later = openai(&stub.url, OpenAiApi::Responses);
        assert_eq!(later.retrieve(&a, 0, &req).await, Retrieval::Running);
    }
    let later = openai(&stub.url, OpenAiApi::Responses);
    let Retrieval::Completed(answer) = later.retrieve(&a, 0, &req).await else {
        panic!("the first line answered");
    };
    assert_eq!(output_of(&answer), "Batched answer.");
    // The other lines from the results read once.
    let reads = stub.count("GET", "/v1/files/file-out1/content");
    assert!(matches!(
        later
            .retrieve(&batch_ref("batch_1", &ids[1]), 0, &req)
            .await,
        Retrieval::Failed(ProviderError::Permanent { .. })
    ));
    assert!(matches!(
        later.retrieve(&batch_ref("batch_1", &ids[2]), 0, &req).await,
        Retrieval::Failed(ProviderError::Transient { ref reason, .. }) if reason.contains("batch_expired")
    ));
    // A line an ended batch's files do not hold was lost on the way: read them again later.
    assert!(matches!(
        later
            .retrieve(&batch_ref("batch_1", &ids[3]), 0, &req)
            .await,
        Retrieval::Unreachable { .. }
    ));
    assert_eq!(stub.count("GET", "/v1/files/file-out1/content"), reads);

    // A line whose batch id was never recorded is found by listing (ours only), then read.
    let fresh = openai(&stub.url, OpenAiApi::Responses);
    let pending = pending_ref(&ids[0]);
    assert!(matches!(
        fresh.retrieve(&pending, 4_000_000_000_000, &req).await,
        Retrieval::Completed(_)
    ));
    assert_eq!(stub.count("GET", "/v1/batches/batch_other"), 0);
    // A line no batch holds was never submitted: the provider does not know it.
    let never = pending_ref(&line_id("job-7", 5, 9));
    assert_eq!(
        fresh.retrieve(&never, 4_000_000_000_000, &req).await,
        Retrieval::NotFound
    );
    assert_eq!(
        stub.count("POST", "/v1/batches"),
        1,
        "nothing was submitted again"
    );
}

#[tokio::test]
async fn anthropic_message_batches_are_created_followed_and_read_line_by_line() {
    use fenced_jobs::provider::batch::{batch_ref, line_id, pending_ref};
    let ids = [1, 2, 3, 4, 5].map(|a| line_id("job-7", a, 9));
    let lines = ids.clone();
    let stub = HttpStub::start(move |req, before| {
        let looks = before
            .iter()
            .filter(|r| r.method == "GET" && r.path == "/v1/messages/batches/msgbatch_1")
            .count();
        let batch = |status: &str| {
            json!({"id": "msgbatch_1", "type": "message_batch", "processing_status": status,
                   "created_at": "2096-01-01T00:00:00Z", "results_url": null})
        };
        match (req.method.as_str(), req.path.as_str()) {
            ("POST", "/v1/messages/batches") => Reply::json(200, batch("in_progress")),
            ("GET", "/v1/messages/batches/msgbatch_1") if looks == 0 => {
                Reply::json(200, batch("in_progress"))
            }
            ("GET", "/v1/messages/batches/msgbatch_1") => Reply::json(200, batch("ended")),
            ("GET", "/v1/messages/batches?limit=100") => Reply::json(
                200,
                json!({"data": [batch("ended")], "has_more": false, "last_id": "msgbatch_1"}),
            ),
            ("GET", "/v1/messages/batches/msgbatch_1/results") => {
                let results = [
                    json!({"custom_id": lines[0], "result": {"type": "succeeded", "message":
                        message(json!([{"type": "text", "text": "Batched."}]), "end_turn")}}),
                    json!({"custom_id": lines[1], "result": {"type": "errored", "error":
                        {"type": "error", "error": {"type": "invalid_request_error", "message": "no"}}}}),
                    json!({"custom_id": lines[2], "result": {"type": "errored", "error":
                        {"type": "error", "error": {"type": "overloaded_error", "message": "busy"}}}}),
                    json!({"custom_id": lines[3], "result": {"type": "expired"}}),
                ];
                let body: Vec<String> = results.iter().map(Value::to_string).collect();
                Reply::Json {
                    status: 200,
                    headers: vec![],
                    body: body.join("\n"),
                }
            }
            _ => anthropic_error(404, "not_found_error"),
        }
    })
    .await;
    let provider = anthropic(&stub.url, Structured::Format);
    assert!(provider.batches());
    let inp =
        input(json!({"model": "claude-test", "prompt": "Summarise this.", "deferrable": true}));
    let req = request(&inp, "{}");
    let batch: Vec<_> = ids[..4]
        .iter()
        .map(|id| provider.batch_line(&req, id).expect("line"))
        .collect();
    assert_eq!(
        provider.submit_batch(&batch).await.as_deref(),
        Ok("msgbatch_1")
    );
    let created = stub.requests()[0].clone();
    assert_eq!(created.header("anthropic-version"), Some("2023-06-01"));
    assert_eq!(created.header("x-api-key"), Some("sk-ant-test-secret"));
    let sent = created.json();
    assert_eq!(sent["requests"].as_array().map(Vec::len), Some(4));
    assert_eq!(sent["requests"][0]["custom_id"], ids[0].as_str());
    assert_eq!(sent["requests"][0]["params"]["model"], "claude-test");
    assert_eq!(sent["requests"][0]["params"]["max_tokens"], 4_096);
    assert!(sent["requests"][0]["params"].get("stream").is_none());

    let a = batch_ref("msgbatch_1", &ids[0]);
    assert_eq!(provider.retrieve(&a, 0, &req).await, Retrieval::Running);
    let later = anthropic(&stub.url, Structured::Format);
    let Retrieval::Completed(answer) = later.retrieve(&a, 0, &req).await else {
        panic!("the first line answered");
    };
    assert_eq!(output_of(&answer), "Batched.");
    let failed = |i: usize| {
        let later = &later;
        let line = batch_ref("msgbatch_1", &ids[i]);
        let req = req.clone();
        async move { later.retrieve(&line, 0, &req).await }
    };
    assert!(matches!(
        failed(1).await,
        Retrieval::Failed(ProviderError::Permanent { .. })
    ));
    assert!(matches!(
        failed(2).await,
        Retrieval::Failed(ProviderError::Transient { .. })
    ));
    assert!(matches!(
        failed(3).await,
        Retrieval::Failed(ProviderError::Transient { ref reason, .. }) if reason.contains("expired")
    ));
    assert!(matches!(failed(4).await, Retrieval::Unreachable { .. }));
    assert_eq!(
        stub.count("GET", "/v1/messages/batches/msgbatch_1/results"),
        1
    );

    // Found again by listing its ended batch; a line no batch holds is not known.
    let fresh = anthropic(&stub.url, Structured::Format);
    assert!(matches!(
        fresh.retrieve(&pending_ref(&ids[0]), 0, &req).await,
        Retrieval::Completed(_)
    ));
    assert_eq!(
        fresh.retrieve(&pending_ref(&ids[4]), 0, &req).await,
        Retrieval::NotFound
    );
    assert_eq!(stub.count("POST", "/v1/messages/batches"), 1);
}

/// What a batch server can do wrong: a results file cut off, a list that goes on past what is
/// read, no Batch API at all.
#[tokio::test]
async fn a_cut_results_file_a_long_list_and_a_server_without_batches_are_never_taken_for_answers() {
    use fenced_jobs::provider::batch::{batch_ref, line_id, pending_ref};
    let line = line_id("job-7", 1, 9);
    let stub = HttpStub::start(|req, before| {
        match (req.method.as_str(), req.path.as_str()) {
            ("GET", "/v1/batches/batch_1") => Reply::json(
                200,
                json!({"id": "batch_1",
                "status": "completed", "output_file_id": "file-out1", "error_file_id": null}),
            ),
            // The output file announces more than it sends.
            ("GET", "/v1/files/file-out1/content") => Reply::Cut {
                status: 200,
                body: format!("{}\n", "x".repeat(4_000)),
                sent: 100,
            },
            // Every page full of other people's batches, and more to come.
            ("GET", path) if path.starts_with("/v1/batches?") => {
                let page = before
                    .iter()
                    .filter(|r| r.path.starts_with("/v1/batches?"))
                    .count();
                let data: Vec<Value> = (0..100)
                    .map(|i| {
                        json!({"id": format!("batch_p{page}_{i}"), "created_at": 4_000_000_000_i64,
                                    "metadata": {"source": "someone-else"}})
                    })
                    .collect();
                Reply::json(
                    200,
                    json!({"data": data, "has_more": true, "last_id": format!("batch_p{page}_99")}),
                )
            }
            ("POST", "/v1/files") => Reply::json(404, json!({"error": {"code": "not_found"}})),
            _ => Reply::json(404, json!({})),
        }
    })
    .await;
    let provider = openai(&stub.url, OpenAiApi::Responses);
    let inp = input(json!({"model": "gpt-test", "prompt": "Summarise."}));
    let req = request(&inp, "{}");
    // A file cut off: nothing is concluded, and it is read again next time.
    for _ in 0..2 {
        assert!(matches!(
            provider
                .retrieve(&batch_ref("batch_1", &line), 0, &req)
                .await,
            Retrieval::Unreachable { .. }
        ));
    }
    assert_eq!(stub.count("GET", "/v1/files/file-out1/content"), 2);
    // Ten pages and still more: the line may be further on, so it is not "never sent".
    assert_eq!(
        provider
            .retrieve(&pending_ref(&line), 4_000_000_000_000, &req)
            .await,
        Retrieval::Running
    );
    assert_eq!(stub.count("GET", "/v1/batches?"), 10);
    // No Batch API: the lines were not sent, and deferrable jobs are called directly.
    assert!(provider.batches());
    let lines = vec![provider.batch_line(&req, &line).expect("line")];
    assert!(matches!(
        provider.submit_batch(&lines).await,
        Err(ProviderError::Transient { ref reason, .. }) if reason.contains("no Batch API")
    ));
    assert!(!provider.batches());
}
