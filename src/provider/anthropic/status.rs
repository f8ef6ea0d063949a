//! What an answer of Anthropic's Messages API proves about the work: error statuses classified
//! (throttled, transient, uncertain, permanent), by Anthropic's own word only, and its stop
//! reasons in the one vocabulary of finish reasons.

use reqwest::StatusCode;
use reqwest::header::HeaderMap;
use serde_json::Value;

use crate::job::contract::Finish;
use crate::provider::ProviderError;
use crate::provider::http::{code_text, form_message, retry_after_ms, sent_by};

/// The header Anthropic's API sends with every answer, errors included (API overview, "Response
/// headers", docs.anthropic.com/en/api/overview): `anthropic-organization-id`. Its other one,
/// `request-id`, is a name many servers use, so it proves nothing.
pub(super) const OWN_HEADERS: [&str; 1] = ["anthropic-organization-id"];

/// An error status, classified by what it proves about the work (the table in
/// `docs/providers.md`). Anthropic's own word is its error object (`"type": "error"`) together
/// with its [`OWN_HEADERS`]: a body of the same shape from a gateway proves nothing.
///
/// - throttled: a 429 with Anthropic's own `rate_limit_error`; but one whose
///   `error.details.error_code` is `enforced_spend_limit_reached` is transient, since waiting
///   does not clear it (it spends its attempt);
/// - transient, refused before any work: a 529 with Anthropic's own `overloaded_error`, a 408
///   with its headers; 401 and 403 (credentials are configuration, not the job's fault) and 425;
/// - uncertain, the call may have run: a 500 (`api_error`: Anthropic's own failure, possibly
///   mid-generation), a 408, 429 or 529 that is not Anthropic's own word (a gateway's), 502,
///   504, the 52x of proxies, and any other 5xx;
/// - permanent: any other 4xx (`invalid_request_error`, `not_found_error`, 413).
pub(super) fn classify(status: StatusCode, headers: &HeaderMap, json: &Value) -> ProviderError {
    let from_api = sent_by(headers, &OWN_HEADERS);
    let own = from_api && json.get("type").and_then(Value::as_str) == Some("error");
    let kind = json
        .pointer("/error/type")
        .and_then(Value::as_str)
        .filter(|_| own);
    let detail = json
        .pointer("/error/details/error_code")
        .and_then(Value::as_str)
        .filter(|_| own);
    let mut reason = format!("HTTP {}", status.as_u16());
    for word in [kind, detail].into_iter().flatten() {
        reason.push(' ');
        reason.push_str(&code_text(word));
    }
    let retry_after_ms = retry_after_ms(headers);
    match (status.as_u16(), kind) {
        (429, Some(_)) if detail == Some("enforced_spend_limit_reached") => {
            ProviderError::Transient {
                retry_after_ms,
                reason,
            }
        }
        (429, Some("rate_limit_error")) => ProviderError::Throttled {
            retry_after_ms,
            reason,
        },
        (529, Some("overloaded_error")) | (401 | 403 | 425, _) => ProviderError::Transient {
            retry_after_ms,
            reason,
        },
        (408, _) if from_api => ProviderError::Transient {
            retry_after_ms,
            reason,
        },
        (408 | 429 | 500..=599, _) => ProviderError::Uncertain {
            evidence: format!("{reason} after the request was sent; it may have run"),
        },
        _ => {
            // The operator reads why: Anthropic's message, when the path it starts with is a
            // part of the request that carries no prompt.
            let message = json.pointer("/error/message").and_then(Value::as_str);
            let reason = match form_message(message, message.filter(|_| own), &FORM_FIELDS) {
                Some(said) => format!("{reason}: {said}"),
                None => reason,
            };
            ProviderError::Permanent { reason }
        }
    }
}

/// The request fields whose refusals never quote the prompt (an Anthropic message starts with
/// the path it is about, `output_config.format.schema: ...`): our parameters, the output
/// format and its schema, tools. A message about `messages` or `system` is not kept.
const FORM_FIELDS: [&str; 12] = [
    "output_config",
    "tools",
    "tool_choice",
    "model",
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "stop_sequences",
    "metadata",
    "thinking",
    "service_tier",
];

/// A `stop_reason` in the one vocabulary of finish reasons.
pub(super) fn stop_finish(reason: Option<&str>) -> Finish {
    match reason {
        Some("end_turn" | "stop_sequence") => Finish::Stop,
        Some("max_tokens" | "model_context_window_exceeded") => Finish::Length,
        Some("refusal") => Finish::ContentFilter,
        Some("tool_use") => Finish::ToolUse,
        _ => Finish::Unknown,
    }
}
