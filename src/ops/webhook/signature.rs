//! Standard Webhooks signatures, as OpenAI signs its webhooks: the headers `webhook-id`,
//! `webhook-timestamp` (Unix seconds) and `webhook-signature` (space-separated `v1,<base64>`
//! entries, any one of which may match), each an HMAC-SHA256 of `<id>.<timestamp>.<body>` under
//! the endpoint's secret (`whsec_` and the key in base64, or the key's own bytes). A timestamp
//! more than five minutes from now either way is refused. The rules are those of the Standard
//! Webhooks specification and of OpenAI's own verifier (`openai-python`,
//! `openai/lib/_webhooks.py`: the same headers, prefix, tolerance of 300 seconds and UTF-8
//! body).

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use hmac::{KeyInit, Mac};

/// How far a delivery's timestamp may be from now, either way (OpenAI's default tolerance).
pub const TOLERANCE_S: i64 = 300;

/// An endpoint's signing secret. Its `Debug` shows nothing of it.
#[derive(Clone)]
pub struct WebhookSecret(Vec<u8>);

impl std::fmt::Debug for WebhookSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WebhookSecret(..)")
    }
}

impl WebhookSecret {
    /// The secret as the provider shows it: `whsec_` and the key in base64, or the key's own
    /// text. An empty key, or `whsec_` before what is not base64, is refused.
    pub fn parse(text: &str) -> Result<WebhookSecret, String> {
        let text = text.trim();
        let key = match text.strip_prefix("whsec_") {
            Some(encoded) => STANDARD
                .decode(encoded)
                .map_err(|_| "the webhook secret after `whsec_` is not base64".to_owned())?,
            None => text.as_bytes().to_vec(),
        };
        if key.is_empty() {
            return Err("the webhook secret is empty".to_owned());
        }
        Ok(WebhookSecret(key))
    }
}

/// Why a delivery was refused before anything was read of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// A header the standard requires is missing.
    #[error("unsigned: no {0} header")]
    Unsigned(&'static str),
    /// `webhook-timestamp` is not whole seconds.
    #[error("the timestamp is not a number")]
    BadTimestamp,
    /// Signed more than [`TOLERANCE_S`] before now: a replay, or held too long.
    #[error("the timestamp is too old")]
    TooOld,
    /// Signed more than [`TOLERANCE_S`] after now.
    #[error("the timestamp is too new")]
    TooNew,
    /// The body is not UTF-8 (what the standard signs).
    #[error("the body is not UTF-8")]
    NotText,
    /// No signature matches.
    #[error("no signature matches")]
    Forged,
}

/// A delivery's headers, by lowercase name.
pub trait Headers {
    /// The header `name` (lowercase), if sent.
    fn header(&self, name: &str) -> Option<&str>;
}

impl Headers for std::collections::HashMap<String, String> {
    fn header(&self, name: &str) -> Option<&str> {
        self.get(name).map(String::as_str)
    }
}

/// Checks a delivery's signature and timestamp at `now_s` (Unix seconds): its `webhook-id` when
/// it is the sender's, as sent.
pub fn verify<'h>(
    secret: &WebhookSecret,
    headers: &'h impl Headers,
    body: &[u8],
    now_s: i64,
) -> Result<&'h str, Refused> {
    let id = headers
        .header("webhook-id")
        .ok_or(Refused::Unsigned("webhook-id"))?;
    let timestamp = headers
        .header("webhook-timestamp")
        .ok_or(Refused::Unsigned("webhook-timestamp"))?;
    let signatures = headers
        .header("webhook-signature")
        .ok_or(Refused::Unsigned("webhook-signature"))?;
    let at: i64 = timestamp
        .trim()
        .parse()
        .map_err(|_| Refused::BadTimestamp)?;
    // Saturating: a timestamp near the ends of i64 is far from now, never a wrap to near it.
    if now_s.saturating_sub(at) > TOLERANCE_S {
        return Err(Refused::TooOld);
    }
    if at.saturating_sub(now_s) > TOLERANCE_S {
        return Err(Refused::TooNew);
    }
    std::str::from_utf8(body).map_err(|_| Refused::NotText)?;
    let Ok(mut mac) = hmac::Hmac::<sha2::Sha256>::new_from_slice(&secret.0) else {
        return Err(Refused::Forged);
    };
    mac.update(id.as_bytes());
    mac.update(b".");
    mac.update(timestamp.as_bytes());
    mac.update(b".");
    mac.update(body);
    let matches = signatures.split_whitespace().any(|entry| {
        let encoded = entry.strip_prefix("v1,").unwrap_or(entry);
        // Compared in constant time by the MAC itself.
        STANDARD
            .decode(encoded)
            .is_ok_and(|given| mac.clone().verify_slice(&given).is_ok())
    });
    match matches {
        true => Ok(id),
        false => Err(Refused::Forged),
    }
}

/// The `webhook-signature` entry of `body` sent as `id` at `timestamp` under `secret`: what a
/// sender writes (tests and the local tools sign with it).
pub fn sign(secret: &WebhookSecret, id: &str, timestamp: i64, body: &[u8]) -> String {
    let Ok(mut mac) = hmac::Hmac::<sha2::Sha256>::new_from_slice(&secret.0) else {
        return String::new();
    };
    mac.update(format!("{id}.{timestamp}.").as_bytes());
    mac.update(body);
    format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()))
}
