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

    /// Sends a request whose answer streams: a success's response, its body unread; an error
    /// status read and classified (after a 401, sent once more with a rotated key, as
    /// [`ApiKey::send`] does).
    pub(crate) async fn stream(
        &self,
        build: impl Fn(Option<&Secret>) -> RequestBuilder,
        classify: Classify,
    ) -> Result<reqwest::Response, ProviderError> {
        let used = self.current();
        let mut response = build(used.as_ref())
            .send()
            .await
            .map_err(|e| transport_error(&e))?;
        if response.status() == StatusCode::UNAUTHORIZED
            && let Some(next) = self.replacement(used).await
        {
            response = build(Some(&next))
                .send()
                .await
                .map_err(|e| transport_error(&e))?;
        }
        if response.status().is_success() {
            return Ok(response);
        }
        let (status, headers, json) = read(Ok(response), classify).await?;
        Err(classify(status, &headers, &json))
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

/// A streamed request's answer: its events, or a whole JSON body from a server that does not
/// stream (an OpenAI-compatible server that ignores `stream`).
pub(crate) enum Streamed {
    Events(Events),
    Whole(Value),
}

impl Streamed {
    /// `response` (a success), read as events when it says it streams them.
    pub(crate) async fn of(
        response: reqwest::Response,
        progress: super::Progress,
        classify: Classify,
    ) -> Result<Streamed, ProviderError> {
        let events = response
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        if !events {
            return Ok(Streamed::Whole(read(Ok(response), classify).await?.2));
        }
        Ok(Streamed::Events(Events::new(response, progress)))
    }
}

/// A server-sent event: its `event` name (empty when none) and its data lines, joined.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Event {
    pub(crate) name: String,
    pub(crate) data: String,
}

/// The most bytes a streamed answer may take on the wire: its events wrap each token in some
/// hundred bytes of JSON, so the answer itself is bounded apart ([`MAX_RESPONSE_BYTES`], by the
/// reader that folds the events).
pub(crate) const MAX_STREAM_BYTES: usize = 64 * MAX_RESPONSE_BYTES;

/// A streamed answer read event by event within the progress rule: every chunk of bytes marks
/// progress, and a wait of more than the rule's timeout for the next one is a hung call,
/// uncertain (it may have run). A cut stream is uncertain too; one past [`MAX_STREAM_BYTES`]
/// permanent. Line ends may be CRLF, LF or CR.
pub(crate) struct Events {
    response: reqwest::Response,
    progress: super::Progress,
    pending: Pending,
    read: usize,
}

/// The bytes of a stream not yet read as events.
#[derive(Debug, Default)]
struct Pending {
    /// Line ends made LF.
    buffer: Vec<u8>,
    /// The last byte received was a CR: a line end, whatever follows (an LF after it is the
    /// same line end).
    after_cr: bool,
}

impl Events {
    /// Reads `response`'s events, marking `progress` (the request was just sent: marked now).
    pub(crate) fn new(response: reqwest::Response, progress: super::Progress) -> Events {
        progress.mark();
        Events {
            response,
            progress,
            pending: Pending::default(),
            read: 0,
        }
    }

    /// The next event, or `None` at the end of the stream.
    pub(crate) async fn next(&mut self) -> Result<Option<Event>, ProviderError> {
        loop {
            if let Some(event) = self.pending.take_event() {
                return Ok(Some(event));
            }
            let wait = self.progress.timeout();
            let chunk = match tokio::time::timeout(wait, self.response.chunk()).await {
                Err(_) => {
                    return Err(ProviderError::Uncertain {
                        evidence: format!(
                            "no bytes for {} s: the call is hung, cancelled; it may have run",
                            wait.as_secs()
                        ),
                    });
                }
                Ok(Err(e)) => return Err(transport_error(&e)),
                Ok(Ok(None)) => return Ok(self.pending.finish()),
                Ok(Ok(Some(chunk))) => chunk,
            };
            self.progress.streamed(chunk.len());
            self.read += chunk.len();
            if self.read > MAX_STREAM_BYTES {
                return Err(ProviderError::Permanent {
                    reason: format!("stream larger than {MAX_STREAM_BYTES} bytes"),
                });
            }
            self.pending.push(&chunk);
        }
    }
}

impl Pending {
    /// The last event of a stream that ended: one with no blank line after it is still one.
    fn finish(&mut self) -> Option<Event> {
        if std::mem::take(&mut self.after_cr) {
            self.buffer.push(b'\n');
        }
        if self.buffer.is_empty() {
            return None;
        }
        self.buffer.extend_from_slice(b"\n\n");
        self.take_event()
    }

    /// Appends `chunk` to the buffer with its line ends made LF.
    fn push(&mut self, chunk: &[u8]) {
        for &b in chunk {
            if std::mem::take(&mut self.after_cr) {
                self.buffer.push(b'\n');
                if b == b'\n' {
                    continue;
                }
            }
            match b {
                b'\r' => self.after_cr = true,
                b => self.buffer.push(b),
            }
        }
    }

    /// The first whole event in the buffer, if any (comments and blank events skipped).
    fn take_event(&mut self) -> Option<Event> {
        loop {
            let (end, gap) = event_end(&self.buffer)?;
            let raw: Vec<u8> = self.buffer.drain(..end + gap).collect();
            let text = String::from_utf8_lossy(&raw[..end]);
            let mut event = Event {
                name: String::new(),
                data: String::new(),
            };
            let mut has_data = false;
            for line in text.lines() {
                let (field, value) = line.split_once(':').unwrap_or((line, ""));
                let value = value.strip_prefix(' ').unwrap_or(value);
                match field {
                    "event" => event.name = value.to_owned(),
                    "data" => {
                        if has_data {
                            event.data.push('\n');
                        }
                        event.data.push_str(value);
                        has_data = true;
                    }
                    _ => {}
                }
            }
            if has_data || !event.name.is_empty() {
                return Some(event);
            }
        }
    }
}

/// Where the first event in `buffer` (line ends LF) ends, and the length of the blank line
/// after it.
fn event_end(buffer: &[u8]) -> Option<(usize, usize)> {
    buffer.windows(2).position(|w| w == b"\n\n").map(|i| (i, 2))
}

/// The most of a response body that is read. An answer beyond it could not be stored in the
/// ledger item anyway.
pub(crate) const MAX_RESPONSE_BYTES: usize = 1_048_576;

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

/// The largest batch file (results or input) read: a batch is gathered from one invocation's
/// records, so its files stay far below this.
pub(crate) const MAX_BATCH_FILE_BYTES: usize = 256 * MAX_RESPONSE_BYTES;

/// A batch file read as it arrives, one JSONL line at a time, never whole: beyond what `each`
/// keeps, at most one line and one chunk are held. Each line that names its `custom_id` is
/// given to `each` with that id. `false` if the file could not be read whole now (an error
/// status, a transport failure, a file cut off or shorter than announced, more than
/// [`MAX_BATCH_FILE_BYTES`], a line not UTF-8): what `each` was given is then not the file, and
/// the caller drops it.
pub(crate) async fn read_lines(
    request: RequestBuilder,
    mut each: impl FnMut(String, &str),
) -> bool {
    let mut response = match request.send().await {
        Ok(r) if r.status().is_success() => r,
        Ok(r) => {
            tracing::warn!(status = %r.status(), "batch file not read");
            return false;
        }
        Err(e) => {
            tracing::warn!(error = %transport_kind(&e), "batch file not read");
            return false;
        }
    };
    let announced = response.content_length();
    let (mut read, mut lines) = (0usize, Lines::default());
    loop {
        match response.chunk().await {
            Ok(Some(chunk)) if read + chunk.len() > MAX_BATCH_FILE_BYTES => {
                tracing::warn!("batch file larger than {MAX_BATCH_FILE_BYTES} bytes; not read");
                return false;
            }
            Ok(Some(chunk)) => {
                read += chunk.len();
                if !lines.push(&chunk, &mut each) {
                    tracing::warn!("batch file line not UTF-8; not read");
                    return false;
                }
            }
            Ok(None) => break,
            // A file cut off is no file: a line missing from it may have run.
            Err(e) => {
                tracing::warn!(error = %transport_kind(&e), "batch file cut off; not read");
                return false;
            }
        }
    }
    if announced.is_some_and(|n| n != read as u64) {
        tracing::warn!("batch file shorter than announced; not read");
        return false;
    }
    lines.finish(&mut each)
}

/// The lines of a JSONL file as its chunks arrive: the bytes after the last newline wait for
/// the next chunk.
#[derive(Default)]
struct Lines {
    partial: Vec<u8>,
}

impl Lines {
    /// Takes `chunk`, giving each line it completes to `each`; `false` for a line not UTF-8.
    fn push(&mut self, chunk: &[u8], each: &mut impl FnMut(String, &str)) -> bool {
        let mut rest = chunk;
        while let Some(at) = rest.iter().position(|b| *b == b'\n') {
            self.partial.extend_from_slice(&rest[..at]);
            rest = &rest[at + 1..];
            if !self.line(each) {
                return false;
            }
        }
        self.partial.extend_from_slice(rest);
        true
    }

    /// The last line, when the file does not end with a newline.
    fn finish(mut self, each: &mut impl FnMut(String, &str)) -> bool {
        self.line(each)
    }

    fn line(&mut self, each: &mut impl FnMut(String, &str)) -> bool {
        let bytes = std::mem::take(&mut self.partial);
        let Ok(text) = std::str::from_utf8(&bytes) else {
            return false;
        };
        let text = text.trim();
        if text.is_empty() {
            return true;
        }
        let id = serde_json::from_str::<Value>(text)
            .ok()
            .and_then(|v| v.get("custom_id")?.as_str().map(str::to_owned));
        if let Some(id) = id {
            each(id, text);
        }
        true
    }
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

/// Whether the answer carries one of `own`, the headers only the provider's API itself sends:
/// the proof that its error is the provider's word, not a gateway's in front of it.
pub(crate) fn sent_by(headers: &HeaderMap, own: &[&str]) -> bool {
    own.iter().any(|name| headers.contains_key(*name))
}

/// How much of a provider's own message a refusal keeps.
const MESSAGE_KEPT: usize = 300;

/// A provider's message for a request it refused, made safe to record when it is about a part
/// of the request `about` names that carries no prompt (its parameters, the schema, a tool's
/// form; `fields` lists them): its first [`MESSAGE_KEPT`] characters, control characters as
/// spaces. `None` for any other message, which may quote the prompt.
pub(crate) fn form_message(
    message: Option<&str>,
    about: Option<&str>,
    fields: &[&str],
) -> Option<String> {
    let about = about?;
    let field = about.split(['.', '[', ':', ' ']).next().unwrap_or_default();
    if !fields.contains(&field) {
        return None;
    }
    let kept: String = message?
        .chars()
        .take(MESSAGE_KEPT)
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    (!kept.trim().is_empty()).then_some(kept)
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
    fn a_jsonl_file_is_read_line_by_line_whatever_its_chunks() {
        let mut seen = Vec::new();
        let mut each = |id: String, raw: &str| seen.push((id, raw.len()));
        let mut lines = Lines::default();
        // A line split across chunks, CRLF, a blank line, a line naming no id, no final newline.
        for chunk in [
            &b"{\"custom_id\":\"a\",\"x\":1}\r\n{\"custom_"[..],
            b"id\":\"b\"}\n\n{\"other\":1}\n{\"custom_id\":\"c\"}",
        ] {
            assert!(lines.push(chunk, &mut each));
        }
        assert!(lines.finish(&mut each));
        let ids: Vec<&str> = seen.iter().map(|(id, _)| id.as_str()).collect();
        assert_eq!(ids, ["a", "b", "c"]);
        // A line that is not UTF-8 makes the file unread.
        let mut bad = Lines::default();
        assert!(!bad.push(b"\xff\xfe\n", &mut |_, _| {}));
    }

    #[test]
    fn events_are_read_whatever_the_line_ends_and_the_chunks() {
        let mut pending = Pending::default();
        let names = |pending: &mut Pending| {
            std::iter::from_fn(|| pending.take_event())
                .map(|e| format!("{}={}", e.name, e.data))
                .collect::<Vec<_>>()
        };
        // An event split across chunks, CRLF between its lines, a CR split from its LF.
        pending.push(b"event: a\r\ndata: {\"x\"");
        assert!(names(&mut pending).is_empty());
        pending.push(b":1}\r");
        pending.push(b"\n\r\n: a comment\n\nevent: b\rdata: one\rdata: two\r\r");
        // The last CR may be a CRLF's: the event it ends waits for the next byte.
        assert_eq!(names(&mut pending), ["a={\"x\":1}"]);
        // A last event with no blank line after it, at the end of the stream.
        pending.push(b"data: [DONE]");
        assert_eq!(names(&mut pending), ["b=one\ntwo"]);
        assert_eq!(pending.finish().map(|e| e.data).as_deref(), Some("[DONE]"));
        assert!(pending.finish().is_none());
    }

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
