//! What the HTTP providers share: the client (no redirects, TLS through aws-lc-rs), the key
//! they send (read again after a 401 when it may have been rotated), the capped read of an
//! answer, transport failures classified by what they prove, `Retry-After`, and provider codes
//! made safe to record.

use std::sync::RwLock;
use std::time::Duration;

use reqwest::header::{HeaderMap, HeaderValue};
use reqwest::{Client, RequestBuilder, StatusCode};
use serde_json::Value;

use super::keys::{KeyRotation, Secret};
use crate::job::Millis;
use crate::provider::{MAX_RETRY_AFTER_MS, ProviderError};

/// How a provider reads an error status: what it proves about the work.
pub(crate) type Classify = fn(StatusCode, &HeaderMap, &Value) -> ProviderError;

/// An HTTP client for a provider: TLS through aws-lc-rs (the provider the AWS SDK uses too),
/// and never a redirect followed: it would carry the key and the prompt to wherever the server
/// says (a 3xx is a refusal like any other).
pub(crate) fn client(connect_timeout_ms: Millis) -> Result<Client, String> {
    // A second call finds the crypto provider installed, which is fine.
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    Client::builder()
        .connect_timeout(Duration::from_millis(connect_timeout_ms.max(1) as u64))
        .pool_idle_timeout(Duration::from_secs(60))
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|e| format!("HTTP client: {e}"))
}

/// The key a provider's requests carry, and where it can be read again.
#[derive(Debug)]
pub(crate) struct ApiKey {
    /// The key requests are sent with; replaced when a 401 finds it rotated.
    key: RwLock<Option<Secret>>,
    /// Where the key can be read again, when it can (boxed: an SDK configuration is large).
    rotation: Option<Box<KeyRotation>>,
    /// Held while a refused key is replaced: the calls refused meanwhile wait, then take the
    /// new key instead of reading it again.
    rotating: tokio::sync::Mutex<()>,
}

impl ApiKey {
    pub(crate) fn new(key: Option<Secret>) -> ApiKey {
        ApiKey {
            key: RwLock::new(key),
            rotation: None,
            rotating: tokio::sync::Mutex::new(()),
        }
    }

    /// Reads the key again from `rotation` after a 401 (at most once a minute), so a key
    /// rotated in Secrets Manager or SSM is taken up without a new execution environment and
    /// without spending jobs' attempts on the old one.
    pub(crate) fn rotated_by(&mut self, rotation: KeyRotation) {
        self.rotation = Some(Box::new(rotation));
    }

    pub(crate) fn current(&self) -> Option<Secret> {
        self.key.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Sends the request `build` makes with a key and reads its answer; after a 401 whose key
    /// turns out to have been rotated, sends it once more with the new key (a 401 is refused
    /// before any work, so the resend repeats nothing).
    pub(crate) async fn send(
        &self,
        build: impl Fn(Option<&Secret>) -> RequestBuilder,
        classify: Classify,
    ) -> Result<(StatusCode, HeaderMap, Value), ProviderError> {
        let used = self.current();
        let first = read(build(used.as_ref()).send().await, classify).await?;
        if first.0 != StatusCode::UNAUTHORIZED {
            return Ok(first);
        }
        let Some(next) = self.replacement(used).await else {
            return Ok(first);
        };
        read(build(Some(&next)).send().await, classify).await
    }

    /// The key to send instead of `used`, which was refused: one another call has put in its
    /// place meanwhile, or one read again; `None` when there is none. One replacement at a time.
    pub(crate) async fn replacement(&self, used: Option<Secret>) -> Option<Secret> {
        let rotation = self.rotation.as_ref()?;
        let _one = self.rotating.lock().await;
        let stored = self.current();
        if stored != used {
            return stored;
        }
        let key = rotation.read_again(used.as_ref()).await?;
        *self.key.write().unwrap_or_else(|p| p.into_inner()) = Some(key.clone());
        Some(key)
    }
}

/// The most of a response body that is read. An answer beyond it could not be stored in the
/// ledger item anyway.
pub const MAX_RESPONSE_BYTES: usize = 1_048_576;

/// Reads the whole answer to a request (at most [`MAX_RESPONSE_BYTES`]); a transport
/// failure is classified, and an error status whose body was cut off by `classify` alone.
pub(crate) async fn read(
    sent: Result<reqwest::Response, reqwest::Error>,
    classify: Classify,
) -> Result<(StatusCode, HeaderMap, Value), ProviderError> {
    let mut response = sent.map_err(|e| transport_error(&e))?;
    let status = response.status();
    let headers = response.headers().clone();
    let mut bytes = Vec::new();
    loop {
        match response.chunk().await {
            Ok(Some(chunk)) if bytes.len() + chunk.len() > MAX_RESPONSE_BYTES => {
                // An answer this large could never be stored: the same call would give it
                // again, so it is a permanent failure, not a reason to pay for a retry.
                return Err(ProviderError::Permanent {
                    reason: format!("answer larger than {MAX_RESPONSE_BYTES} bytes"),
                });
            }
            Ok(Some(chunk)) => bytes.extend_from_slice(&chunk),
            Ok(None) => break,
            // The work was done and its answer lost on the way.
            Err(e) if status.is_success() => return Err(transport_error(&e)),
            // The status alone says what happened; the body that was cut off adds nothing.
            Err(_) => return Err(classify(status, &headers, &Value::Null)),
        }
    }
    let json = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    if status.is_success() && json.is_null() {
        return Err(ProviderError::Uncertain {
            evidence: format!("HTTP {} with a body that is not JSON", status.as_u16()),
        });
    }
    Ok((status, headers, json))
}

/// A request that never produced a response.
pub(crate) fn transport_error(e: &reqwest::Error) -> ProviderError {
    if e.is_connect() {
        // Nothing was sent.
        ProviderError::Transient {
            retry_after_ms: None,
            reason: "connection failed".to_owned(),
        }
    } else if e.is_builder() {
        ProviderError::Permanent {
            reason: "request could not be built".to_owned(),
        }
    } else {
        ProviderError::Uncertain {
            evidence: format!(
                "{} after the request was sent; it may have run",
                transport_kind(e)
            ),
        }
    }
}

pub(crate) fn transport_kind(e: &reqwest::Error) -> &'static str {
    if e.is_timeout() {
        "timeout"
    } else if e.is_connect() {
        "connection failed"
    } else if e.is_decode() || e.is_body() {
        "answer cut off"
    } else {
        "connection lost"
    }
}

/// The wait a response asks for: `retry-after-ms`, or `retry-after` in seconds or as an HTTP
/// date; at most [`MAX_RETRY_AFTER_MS`], and nothing for a value that is not a finite number.
pub fn retry_after_ms(headers: &HeaderMap) -> Option<Millis> {
    let text = |name: &str| {
        headers
            .get(name)
            .and_then(|v: &HeaderValue| v.to_str().ok())
    };
    let capped = |ms: f64| {
        ms.is_finite()
            .then(|| ms.clamp(0.0, MAX_RETRY_AFTER_MS as f64) as Millis)
    };
    if let Some(ms) = text("retry-after-ms").and_then(|v| v.trim().parse::<f64>().ok()) {
        return capped(ms);
    }
    let value = text("retry-after")?.trim();
    if let Ok(seconds) = value.parse::<f64>() {
        return capped(seconds * 1000.0);
    }
    let at =
        time::OffsetDateTime::parse(value, &time::format_description::well_known::Rfc2822).ok()?;
    let ms = (at - time::OffsetDateTime::now_utc()).whole_milliseconds();
    Some(ms.clamp(0, i128::from(MAX_RETRY_AFTER_MS)) as Millis)
}

/// A provider code, made safe to record: short, and only identifier characters.
pub(crate) fn code_text(code: &str) -> String {
    code.chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
        .take(64)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_reads_milliseconds_seconds_and_dates() {
        let mut h = HeaderMap::new();
        h.insert("retry-after-ms", HeaderValue::from_static("1500"));
        h.insert("retry-after", HeaderValue::from_static("9"));
        assert_eq!(retry_after_ms(&h), Some(1_500));
        let mut h = HeaderMap::new();
        h.insert("retry-after", HeaderValue::from_static("2.5"));
        assert_eq!(retry_after_ms(&h), Some(2_500));
        let mut h = HeaderMap::new();
        h.insert(
            "retry-after",
            HeaderValue::from_static("Wed, 21 Oct 2015 07:28:00 GMT"),
        );
        assert_eq!(
            retry_after_ms(&h),
            Some(0),
            "a date in the past asks no wait"
        );
        let mut h = HeaderMap::new();
        h.insert("retry-after", HeaderValue::from_static("soon"));
        assert_eq!(retry_after_ms(&h), None);
        // Capped, never overflowing, and nothing for what is not a finite number.
        for huge in ["1e20", "86400", "9223372036854775807"] {
            let mut h = HeaderMap::new();
            h.insert("retry-after", HeaderValue::from_str(huge).expect("header"));
            assert_eq!(retry_after_ms(&h), Some(MAX_RETRY_AFTER_MS), "{huge}");
        }
        for odd in ["inf", "NaN", "-inf"] {
            let mut h = HeaderMap::new();
            h.insert(
                "retry-after-ms",
                HeaderValue::from_str(odd).expect("header"),
            );
            assert_eq!(retry_after_ms(&h), None, "{odd}");
        }
    }
}
