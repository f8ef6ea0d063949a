//! Payloads kept outside the ledger item: an answer or an input too large to store inline lives
//! in S3, and the item keeps a reference to it with the digest of its content.

use sha2::{Digest, Sha256};

/// A payload stored as an object: where it is, how large, and the SHA-256 of its bytes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BlobRef {
    /// S3 bucket.
    pub bucket: String,
    /// Object key.
    pub key: String,
    /// Size in bytes.
    pub size: u64,
    /// SHA-256 of the content, lowercase hex.
    pub sha256: String,
}

impl BlobRef {
    /// The reference as events, exports and `jobctl show` print it.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "bucket": self.bucket, "key": self.key, "size": self.size, "sha256": self.sha256,
        })
    }

    /// Whether `bytes` are the content this reference names (size and digest).
    pub fn matches(&self, bytes: &[u8]) -> bool {
        bytes.len() as u64 == self.size && sha256_hex(bytes) == self.sha256
    }
}

impl std::fmt::Display for BlobRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "s3://{}/{} ({} bytes, sha256 {})",
            self.bucket, self.key, self.size, self.sha256
        )
    }
}

/// An accepted answer: inline in the item, or stored as an object the item references.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ResultBody {
    /// The answer itself (JSON).
    Inline(String),
    /// The answer's object, written before the acceptance that references it.
    Stored(BlobRef),
}

impl From<&str> for ResultBody {
    fn from(text: &str) -> Self {
        ResultBody::Inline(text.to_owned())
    }
}

impl From<String> for ResultBody {
    fn from(text: String) -> Self {
        ResultBody::Inline(text)
    }
}

/// SHA-256 of `bytes`, lowercase hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    super::message::hex(&Sha256::digest(bytes))
}

/// Where the answer of `job_id`'s owner at `epoch` is stored: under the job, then the epoch,
/// then the content digest, so that a retried write of the same answer names the same object
/// and two owners never share one.
pub fn result_key(job_id: &str, epoch: u64, sha256: &str) -> String {
    format!("{RESULTS_PREFIX}{job_id}/{epoch}/{sha256}.json")
}

/// Where a large input of `job_id` is stored, named by its input digest.
pub fn input_key(job_id: &str, input_digest: &str) -> String {
    format!("{INPUTS_PREFIX}{job_id}/{input_digest}.json")
}

/// The largest stored answer read back (by a recovery, or `jobctl result`).
pub const MAX_RESULT_BYTES: usize = 64 * 1_048_576;

/// The prefix of every stored answer.
pub const RESULTS_PREFIX: &str = "results/";
/// The prefix of every stored input.
pub const INPUTS_PREFIX: &str = "inputs/";

/// The job id and the epoch a result key names, if it is one.
pub fn parse_result_key(key: &str) -> Option<(&str, u64)> {
    let rest = key.strip_prefix(RESULTS_PREFIX)?;
    let (head, _digest) = rest.rsplit_once('/')?;
    let (job_id, epoch) = head.rsplit_once('/')?;
    Some((job_id, epoch.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_result_key_names_its_job_and_epoch() {
        let key = result_key("job:a.b-1", 7, &sha256_hex(b"{}"));
        assert_eq!(parse_result_key(&key), Some(("job:a.b-1", 7)));
        assert_eq!(parse_result_key("inputs/j/1/x.json"), None);
        assert_eq!(parse_result_key("results/j/seven/x.json"), None);
    }

    #[test]
    fn a_reference_matches_only_its_own_bytes() {
        let r = BlobRef {
            bucket: "b".into(),
            key: "k".into(),
            size: 2,
            sha256: sha256_hex(b"{}"),
        };
        assert!(r.matches(b"{}"));
        assert!(!r.matches(b"[]"));
        assert!(!r.matches(b"{} "));
    }
}
