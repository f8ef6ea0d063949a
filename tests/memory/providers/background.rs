//! OpenAI background responses: submitted, then polled until they complete; queued too long,
//! failed, cancelled or cut off; retrieval errors; ids that are not ids; the fallback to Chat
//! Completions for a server without the Responses API.

use fenced_jobs::job::contract::{Contract, Finish};
use fenced_jobs::provider::openai::OpenAiApi;
use fenced_jobs::provider::{Provider, ProviderError, ProviderRequest, Retrieval, Submission};
use serde_json::{Value, json};

use super::openai;
use crate::support::http::{HttpStub, Reply};
use crate::support::providers::{FREE_TEXT, chat_answer, input, output_of, request};

fn completed(id: &str, text: &str) -> Value {
    json!({
        "id": id, "object": "response", "status": "completed", "model": "gpt-test",
        "output": [{"type": "message", "role": "assistant",
                    "content": [{"type": "output_text", "text": text}]}],
        "usage": {"input_tokens": 5, "output_tokens": 2}
    })
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
    // Nor does free text.
    let Err(ProviderError::InvalidOutput(rejected)) = cut.judged(&FREE_TEXT) else {
        panic!("free text never takes a truncated answer");
    };
    assert!(!rejected.terminal, "another attempt");
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
