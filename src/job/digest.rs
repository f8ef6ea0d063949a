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
    let mut out = String::new();
    write_canonical(value, &mut out);
    out
}

fn write_canonical(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort_unstable();
            out.push('{');
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(key.clone()).to_string());
                out.push(':');
                write_canonical(&map[key], out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
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
