//! The Messages API's classification and request parts, unit by unit.

use super::*;
use reqwest::StatusCode;
use reqwest::header::HeaderMap;

/// The headers Anthropic's API answers with.
fn from_api() -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert("request-id", "req_01".parse().expect("value"));
    headers.insert("anthropic-organization-id", "org-1".parse().expect("value"));
    headers
}

fn kind(status: u16, body: &Value) -> &'static str {
    let status = StatusCode::from_u16(status).expect("status");
    classify(status, &from_api(), body).kind()
}

/// The same answer from a gateway in front: none of Anthropic's own headers.
fn gateway(status: u16, body: &Value) -> &'static str {
    let status = StatusCode::from_u16(status).expect("status");
    classify(status, &HeaderMap::new(), body).kind()
}

fn error(kind: &str) -> Value {
    json!({"type": "error", "error": {"type": kind, "message": "quotes the prompt"}})
}

#[test]
fn statuses_are_classified_by_what_they_prove() {
    assert_eq!(kind(429, &error("rate_limit_error")), "throttled");
    let spend = json!({"type": "error", "error": {"type": "rate_limit_error",
        "details": {"error_code": "enforced_spend_limit_reached"}}});
    assert_eq!(kind(429, &spend), "transient");
    assert_eq!(kind(529, &error("overloaded_error")), "transient");
    assert_eq!(kind(408, &Value::Null), "transient");
    for status in [401, 403, 425] {
        assert_eq!(gateway(status, &Value::Null), "transient", "{status}");
    }
    // Anthropic's words from a gateway (its body's shape, not its headers), and a gateway's
    // 408: it gave up on its upstream, which may have run.
    for (status, body) in [
        (429, error("rate_limit_error")),
        (529, error("overloaded_error")),
        (429, spend.clone()),
        (408, Value::Null),
        (408, error("timeout_error")),
    ] {
        assert_eq!(gateway(status, &body), "uncertain", "{status} {body}");
    }
    assert_eq!(kind(500, &error("api_error")), "uncertain");
    // Without Anthropic's own error object, a 429 or 529 is a gateway's word.
    for status in [429, 529, 500, 502, 503, 504, 520] {
        assert_eq!(kind(status, &Value::Null), "uncertain", "{status}");
    }
    assert_eq!(
        kind(429, &json!({"error": {"type": "rate_limit_error"}})),
        "uncertain"
    );
    for status in [400, 404, 413, 422] {
        assert_eq!(kind(status, &error("invalid_request_error")), "permanent");
    }
    let reason = classify(StatusCode::TOO_MANY_REQUESTS, &from_api(), &spend).to_string();
    assert!(reason.contains("enforced_spend_limit_reached"), "{reason}");
    assert!(!reason.contains("prompt"), "{reason}");
    // A refusal of the request's form keeps Anthropic's words for the operator; one about
    // the conversation (or with no path), which may quote the prompt, keeps only its type.
    let said = |message: &str| {
        let body = json!({"type": "error", "error": {"type": "invalid_request_error",
                          "message": message}});
        classify(StatusCode::BAD_REQUEST, &from_api(), &body).to_string()
    };
    let schema = said(
        "output_config.format.schema: For 'integer' type, property 'minimum' is not supported",
    );
    assert!(
        schema.ends_with("property 'minimum' is not supported"),
        "{schema}"
    );
    for quoting in [
        "messages.0.content.0.text: quotes the prompt",
        "quotes the prompt",
    ] {
        let reason = said(quoting);
        assert!(!reason.contains("prompt"), "{reason}");
    }
}

#[test]
fn parts_are_carried_in_anthropics_form() {
    let input = json!({"messages": [
        {"role": "system", "content": [{"type": "text", "text": "rules",
            "cache_control": {"type": "ephemeral"}}]},
        {"role": "user", "content": [
            {"type": "input_text", "text": "look"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
            {"type": "document", "source": {"type": "url", "url": "https://x/y.pdf"}}
        ]},
        {"role": "assistant", "content": "ok"}
    ]});
    let (system, messages) = conversation(input.as_object().expect("object")).expect("ok");
    assert_eq!(system[0]["cache_control"]["type"], "ephemeral");
    let parts = &messages[0]["content"];
    assert_eq!(parts[0], json!({"type": "text", "text": "look"}));
    assert_eq!(parts[1]["source"]["media_type"], "image/png");
    assert_eq!(parts[2]["type"], "document");
    assert_eq!(messages[1]["content"], "ok");
    let audio = json!({"messages": [{"role": "user", "content": [{"type": "input_audio"}]}]});
    assert!(conversation(audio.as_object().expect("object")).is_err());
}

#[test]
fn stop_reasons_read_into_one_vocabulary() {
    assert_eq!(stop_finish(Some("end_turn")), Finish::Stop);
    assert_eq!(stop_finish(Some("stop_sequence")), Finish::Stop);
    assert_eq!(stop_finish(Some("max_tokens")), Finish::Length);
    assert_eq!(stop_finish(Some("refusal")), Finish::ContentFilter);
    assert_eq!(stop_finish(Some("tool_use")), Finish::ToolUse);
    assert_eq!(stop_finish(Some("pause_turn")), Finish::Unknown);
    assert_eq!(stop_finish(None), Finish::Unknown);
}
