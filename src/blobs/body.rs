//! A record's body as the worker and `jobctl dlq` read it: an Amazon SQS Extended Client
//! pointer is followed to its payload.

use super::{BlobError, BlobStore};
use crate::job::message::{MAX_PAYLOAD_BYTES, parse_payload, parse_pointer};
use crate::job::{Failure, InvalidMessage, Trigger, parse_trigger};

/// Parses a record's body; an Extended Client pointer is followed to its payload (read through
/// `blobs`), which is then parsed like any body. A payload that is gone is poison; a store that cannot be
/// reached is a backoff.
pub(crate) async fn resolve_body(
    blobs: Option<&dyn BlobStore>,
    body: Option<&str>,
) -> Result<Trigger, Failure> {
    resolve_body_within(blobs, body, MAX_PAYLOAD_BYTES).await
}

/// [`resolve_body`] with room for a payload of at most `room` bytes now: one larger (by the
/// object's own size, whatever the pointer's attributes say) but within the payload limit
/// waits for a batch with more room (a backoff, unread); one past the limit is poison.
pub(crate) async fn resolve_body_within(
    blobs: Option<&dyn BlobStore>,
    body: Option<&str>,
    room: usize,
) -> Result<Trigger, Failure> {
    let pointer = match body.and_then(parse_pointer) {
        None => return parse_trigger(body).map_err(Failure::Poison),
        Some(Err(invalid)) => return Err(Failure::Poison(invalid)),
        Some(Ok(pointer)) => pointer,
    };
    let Some(blobs) = blobs else {
        return Err(unavailable("no object store for a pointer body"));
    };
    let bytes = blobs
        .get(&pointer.bucket, &pointer.key, room.min(MAX_PAYLOAD_BYTES))
        .await
        .map_err(|e| match e {
            BlobError::NotFound => Failure::Poison(InvalidMessage::PayloadMissing),
            BlobError::TooLarge { bytes, .. } if bytes <= MAX_PAYLOAD_BYTES as u64 => {
                unavailable("payload memory")
            }
            BlobError::TooLarge { bytes, limit } => Failure::Poison(InvalidMessage::TooLarge {
                bytes: bytes as usize,
                limit,
            }),
            e => {
                tracing::warn!(error = %e, "reading a pointer's payload failed");
                unavailable("payload unavailable")
            }
        })?;
    let text = String::from_utf8(bytes)
        .map_err(|_| Failure::Poison(InvalidMessage::NotJson { line: 1, column: 1 }))?;
    parse_payload(&text).map_err(Failure::Poison)
}

/// A store that cannot be read now: the record backs off.
fn unavailable(cause: &'static str) -> Failure {
    Failure::Backoff {
        retry_after_ms: None,
        cause,
    }
}
