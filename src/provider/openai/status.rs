//! What an OpenAI-compatible server's answer proves about the work: statuses classified
//! (throttled, transient, uncertain, permanent), retrieval errors, and a missing Responses API.

use reqwest::StatusCode;
use reqwest::header::HeaderMap;
use serde_json::Value;

use crate::provider::http::{code_text, form_message, retry_after_ms, sent_by};
use crate::provider::{ProviderError, Retrieval};

/// The request fields (`error.param`) whose refusals never quote the prompt: our parameters,
/// the output format and its schema, tools. A message about anything else (`messages`,
/// `input`) is not kept.
const FORM_FIELDS: [&str; 16] = [
    "response_format",
    "text",
    "tools",
    "tool_choice",
    "model",
    "max_tokens",
    "max_output_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "seed",
    "stop",
    "service_tier",
    "reasoning",
    "metadata",
    "background",
];

/// The headers OpenAI's API sends with every answer, errors included (API reference,
/// "Debugging requests", developers.openai.com/api/reference/overview): `openai-organization`,
/// `openai-processing-ms`, `openai-version`. A gateway in front answers with headers of its
/// own (LiteLLM's documented response headers are its `x-litellm-*` and the `x-ratelimit-*` it
/// re-issues; `x-request-id` is common to many), so one of these proves the API itself said it.
pub(super) const OWN_HEADERS: [&str; 3] = [
    "openai-processing-ms",
    "openai-version",
    "openai-organization",
];

/// An error status of a call, classified by what it proves about the work (the table in
/// `docs/providers.md`). The provider's own word is its error object and code together with
/// one of its [`OWN_HEADERS`]: a body shaped like OpenAI's proves nothing alone, since
/// gateways answer with the same shape after their upstream request ran.
///
/// - throttled, refused for the rate limit before any work: a 429 in the provider's own word
///   (`rate_limit_exceeded`, say), but not `insufficient_quota`, which waiting does not clear:
///   that one is transient and spends its attempt;
/// - transient, refused before any work: 401 and 403 (credentials are configuration, not the
///   job's fault) and 425 (early data, refused by whichever hop before forwarding), a 408 with
///   the provider's own headers, and a 500 or 503 in the provider's own word;
/// - uncertain, the call may have run: a 408, 429, 500 or 503 that is not the provider's own
///   word (a retrying gateway or a service mesh answers so after forwarding), 409 (a request
///   with this idempotency key is in flight), 502, 504, the 52x of proxies and load balancers,
///   and any other 5xx;
/// - permanent: any other 4xx.
pub(super) fn classify(status: StatusCode, headers: &HeaderMap, json: &Value) -> ProviderError {
    let code = json
        .pointer("/error/code")
        .and_then(Value::as_str)
        .or_else(|| json.pointer("/error/type").and_then(Value::as_str));
    let reason = match code {
        Some(code) => format!("HTTP {} {}", status.as_u16(), code_text(code)),
        None => format!("HTTP {}", status.as_u16()),
    };
    let from_api = sent_by(headers, &OWN_HEADERS);
    let own_word = from_api && json.get("error").is_some_and(Value::is_object);
    let transient = |reason| ProviderError::Transient {
        retry_after_ms: retry_after_ms(headers),
        reason,
    };
    match status.as_u16() {
        429 if own_word && code == Some("insufficient_quota") => transient(reason),
        429 if own_word && code.is_some() => ProviderError::Throttled {
            retry_after_ms: retry_after_ms(headers),
            reason,
        },
        401 | 403 | 425 => transient(reason),
        408 if from_api => transient(reason),
        500 | 503 if own_word => transient(reason),
        408 | 409 | 429 | 500..=599 => ProviderError::Uncertain {
            evidence: format!("{reason} after the request was sent; it may have run"),
        },
        _ => {
            // The operator reads why: OpenAI's message, when it is about the request's form.
            let said = form_message(
                json.pointer("/error/message").and_then(Value::as_str),
                json.pointer("/error/param").and_then(Value::as_str),
                &FORM_FIELDS,
            );
            let reason = match said {
                Some(said) => format!("{reason}: {said}"),
                None => reason,
            };
            ProviderError::Permanent { reason }
        }
    }
}

/// [`classify`] for a status code and a JSON body alone, without the provider's own headers:
/// what the fault simulation's gateways answer (bare, or shaped like OpenAI's) goes through
/// the same table as a real server's.
pub fn classify_status(status: u16, body: &Value) -> ProviderError {
    match StatusCode::from_u16(status) {
        Ok(status) => classify(status, &HeaderMap::new(), body),
        Err(_) => ProviderError::Uncertain {
            evidence: format!("HTTP {status}"),
        },
    }
}

/// An error status of a retrieval: 400, 404 and 410 say the provider does not know the call;
/// 401 and 403 refuse to say; anything else (429, 5xx) says nothing about it, so ask again.
pub(super) fn retrieval_error(status: StatusCode, headers: &HeaderMap) -> Retrieval {
    match status.as_u16() {
        400 | 404 | 410 => Retrieval::NotFound,
        401 | 403 => Retrieval::Denied,
        _ => {
            tracing::warn!(%status, "retrieval refused; asking again");
            Retrieval::Unreachable {
                retry_after_ms: retry_after_ms(headers),
            }
        }
    }
}

/// A 404 or 405 on `POST /responses` that is not about the model: the server has no such API.
pub(super) fn no_responses_api(status: StatusCode, json: &Value) -> bool {
    let about_model = json
        .pointer("/error/code")
        .and_then(Value::as_str)
        .is_some_and(|c| c.contains("model"));
    matches!(status.as_u16(), 404 | 405) && !about_model
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;
    use serde_json::json;

    /// The headers OpenAI's API answers with, as a real error of its own carries them.
    fn from_api() -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert("openai-processing-ms", HeaderValue::from_static("12"));
        headers.insert("openai-version", HeaderValue::from_static("2020-10-01"));
        headers
    }

    #[test]
    fn statuses_are_classified_by_what_they_say_about_the_work() {
        let mut headers = from_api();
        headers.insert("retry-after", HeaderValue::from_static("7"));
        let body = json!({"error": {"code": "rate_limit_exceeded", "message": "secret prompt"}});
        let e = classify(StatusCode::TOO_MANY_REQUESTS, &headers, &body);
        assert_eq!(
            e,
            ProviderError::Throttled {
                retry_after_ms: Some(7_000),
                reason: "HTTP 429 rate_limit_exceeded".to_owned()
            }
        );
        let e = classify(StatusCode::BAD_REQUEST, &HeaderMap::new(), &Value::Null);
        assert_eq!(
            e,
            ProviderError::Permanent {
                reason: "HTTP 400".to_owned()
            }
        );
        // A refusal of the request's form keeps OpenAI's words for the operator; one about the
        // conversation, which may quote the prompt, keeps only its code.
        let schema = json!({"error": {"type": "invalid_request_error", "code": null,
            "param": "response_format",
            "message": "Invalid schema for response_format 'invoice': In context=('properties', 'n'), 'minimum' is not permitted."}});
        let said = classify(StatusCode::BAD_REQUEST, &from_api(), &schema).to_string();
        assert!(said.ends_with("'minimum' is not permitted."), "{said}");
        let quoted = json!({"error": {"code": "invalid_value", "param": "messages[0].content",
            "message": "secret prompt"}});
        let said = classify(StatusCode::BAD_REQUEST, &from_api(), &quoted).to_string();
        assert!(!said.contains("secret"), "{said}");
        let own = json!({"error": {"type": "server_error"}});
        let kind_with = |status: u16, headers: &HeaderMap, body: &Value| {
            let status = StatusCode::from_u16(status).expect("status");
            classify(status, headers, body).kind()
        };
        let api = from_api();
        let kind = |status: u16, body: &Value| kind_with(status, &api, body);
        let gateway = |status: u16, body: &Value| kind_with(status, &HeaderMap::new(), body);
        // Refused before any work, whoever answers.
        for status in [401, 403, 425] {
            assert_eq!(gateway(status, &Value::Null), "transient", "{status}");
        }
        // The API's own refusals before work.
        assert_eq!(kind(408, &Value::Null), "transient");
        assert_eq!(kind(500, &own), "transient");
        assert_eq!(kind(503, &own), "transient");
        // The provider's own rate-limit refusal; its quota, which waiting does not clear.
        let limited = json!({"error": {"type": "requests", "code": "rate_limit_exceeded"}});
        assert_eq!(kind(429, &limited), "throttled");
        let quota = json!({"error": {"type": "insufficient_quota", "code": "insufficient_quota"}});
        assert_eq!(kind(429, &quota), "transient");
        // The same words from a gateway (its body shaped like OpenAI's, or Anthropic's, but
        // none of the API's own headers): LiteLLM and OpenRouter answer so after their
        // upstream request may have run, and a 408 is a gateway giving up on its upstream.
        let anthropic = json!({"type": "error", "error": {"type": "rate_limit_error"}});
        for (status, body) in [
            (408, &Value::Null),
            (
                408,
                &json!({"error": {"code": "timeout", "message": "Request timed out"}}),
            ),
            (429, &limited),
            (429, &anthropic),
            (429, &quota),
            (500, &own),
            (503, &own),
        ] {
            assert_eq!(gateway(status, body), "uncertain", "{status} {body}");
        }
        // A gateway or proxy failing while the model may still run, or a key in use: and a
        // bare 429 or 503, even with the API's headers (a proxy passing them through).
        for status in [409, 429, 500, 501, 502, 503, 504, 520, 522, 524, 599] {
            assert_eq!(kind(status, &Value::Null), "uncertain", "{status}");
            assert_eq!(kind(status, &json!({})), "uncertain", "{status}");
        }
        assert_eq!(
            kind(429, &json!({"error": {"message": "slow down"}})),
            "uncertain"
        );
        assert_eq!(kind(502, &own), "uncertain");
        for status in [400, 404, 413, 422] {
            assert_eq!(kind(status, &Value::Null), "permanent", "{status}");
        }
        // What the fault simulation's gateways answer goes through the same table.
        assert_eq!(classify_status(408, &Value::Null).kind(), "uncertain");
        assert_eq!(classify_status(429, &limited).kind(), "uncertain");
    }
}
