//! What an OpenAI-compatible server's answer proves about the work: statuses classified
//! (throttled, transient, uncertain, permanent), retrieval errors, and a missing Responses API.

use reqwest::StatusCode;
use reqwest::header::HeaderMap;
use serde_json::Value;

use crate::provider::http::{code_text, retry_after_ms};
use crate::provider::{ProviderError, Retrieval};

/// An error status of a call, classified by what it proves about the work (the table in
/// `docs/providers.md`):
///
/// - throttled, refused for the rate limit before any work: a 429 that carries the provider's
///   own error object and code (`rate_limit_exceeded`, say), but not `insufficient_quota`,
///   which waiting does not clear: that one is transient and spends its attempt;
/// - transient, refused before any work: 408, 425, 401 and 403 (credentials are configuration,
///   not the job's fault), and a 500 or 503 that carries the provider's own error object;
/// - uncertain, the call may have run: a 429 or a 503 without the provider's error object and
///   code (a retrying gateway or a service mesh answers so after forwarding), 409 (a request
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
    let providers_own_error = json.get("error").is_some_and(Value::is_object);
    let transient = |reason| ProviderError::Transient {
        retry_after_ms: retry_after_ms(headers),
        reason,
    };
    match status.as_u16() {
        429 if providers_own_error && code == Some("insufficient_quota") => transient(reason),
        429 if providers_own_error && code.is_some() => ProviderError::Throttled {
            retry_after_ms: retry_after_ms(headers),
            reason,
        },
        401 | 403 | 408 | 425 => transient(reason),
        500 | 503 if providers_own_error => transient(reason),
        409 | 429 | 500..=599 => ProviderError::Uncertain {
            evidence: format!("{reason} after the request was sent; it may have run"),
        },
        _ => ProviderError::Permanent { reason },
    }
}

/// [`classify`] for a status code and a JSON body alone (no headers): what the fault
/// simulation's gateways answer goes through the same table as a real server's.
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

    #[test]
    fn statuses_are_classified_by_what_they_say_about_the_work() {
        let mut headers = HeaderMap::new();
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
        let own = json!({"error": {"type": "server_error"}});
        let kind = |status: u16, body: &Value| {
            let status = StatusCode::from_u16(status).expect("status");
            classify(status, &HeaderMap::new(), body).kind()
        };
        // Refused before any work.
        for status in [401, 403, 408, 425] {
            assert_eq!(kind(status, &Value::Null), "transient", "{status}");
        }
        assert_eq!(kind(500, &own), "transient");
        assert_eq!(kind(503, &own), "transient");
        // The provider's own rate-limit refusal; its quota, which waiting does not clear.
        let limited = json!({"error": {"type": "requests", "code": "rate_limit_exceeded"}});
        assert_eq!(kind(429, &limited), "throttled");
        let anthropic = json!({"type": "error", "error": {"type": "rate_limit_error"}});
        assert_eq!(kind(429, &anthropic), "throttled");
        let quota = json!({"error": {"type": "insufficient_quota", "code": "insufficient_quota"}});
        assert_eq!(kind(429, &quota), "transient");
        // A gateway or proxy failing while the model may still run, or a key in use: and a
        // bare 429 or 503, which a retrying gateway (after its upstream request ran) or a
        // service mesh (after forwarding) answers.
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
    }
}
