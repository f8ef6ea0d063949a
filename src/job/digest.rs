//! The input digest, over the canonical JSON of an input: what makes two messages the same job.

use serde_json::Value;
use sha2::{Digest, Sha256};

/// The input digest: SHA-256 over a domain tag, the contract and the canonical input.
///
/// The contract is part of the digest, so the same input under another output contract is a
/// different job, and a job_id reused for it is a conflict.
pub fn input_digest(contract: &str, input_canonical: &str) -> String {
    let mut hasher = Sha256::new();
    hasher.update(b"fenced-jobs/input/v1\0");
    hasher.update(contract.as_bytes());
    hasher.update(b"\0");
    hasher.update(input_canonical.as_bytes());
    hex(&hasher.finalize())
}

/// Canonical JSON: object keys sorted by their UTF-8 bytes, no insignificant whitespace, strings
/// and numbers as serde_json writes them. Key order in the sender's JSON never changes it.
pub fn canonical_json(value: &Value) -> String {
    let mut out = Vec::new();
    write_canonical(value, &mut out);
    // serde_json writes UTF-8 only.
    String::from_utf8(out).unwrap_or_default()
}

fn write_canonical(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
            out.push(b'{');
            for (i, (key, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_scalar(key, out);
                out.push(b':');
                write_canonical(item, out);
            }
            out.push(b'}');
        }
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_canonical(item, out);
            }
            out.push(b']');
        }
        scalar => write_scalar(scalar, out),
    }
}

/// A string or scalar as serde_json writes it (writing to memory cannot fail).
fn write_scalar<T: serde::Serialize + ?Sized>(value: &T, out: &mut Vec<u8>) {
    let _ = serde_json::to_writer(out, value);
}

/// Lowercase hex of `bytes`.
pub(crate) fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(DIGITS[usize::from(b >> 4)] as char);
        out.push(DIGITS[usize::from(b & 0x0f)] as char);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_json_sorts_keys_and_writes_no_whitespace() {
        let value: Value = serde_json::from_str(
            r#"{ "b": [1, -2.5, true, null, {"z": "é\"\\\u001f", "a": {}}], "a": "x y" }"#,
        )
        .expect("json");
        let canonical = canonical_json(&value);
        assert_eq!(
            canonical,
            r#"{"a":"x y","b":[1,-2.5,true,null,{"a":{},"z":"é\"\\\u001f"}]}"#
        );
    }

    #[test]
    fn the_digest_of_an_input_never_changes() {
        // A stored job's digest must match its redeliveries forever: pinned.
        let input: Value = serde_json::from_str(r#"{"prompt":"p","model":"m"}"#).expect("json");
        assert_eq!(
            input_digest("summary.v1", &canonical_json(&input)),
            "b0603a9d4942f25669573f6214d61dfd0fd4cc2f5e7b0152942fcfc6ab654e50"
        );
    }
}
