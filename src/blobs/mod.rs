//! Objects outside the ledger: answers and inputs too large for an item, and the payloads that
//! Extended Client pointers name. [`s3::S3Blobs`] is the real store; [`MemoryBlobs`] keeps the
//! same contract in memory for the fast tests and the simulation.

pub mod body;
pub mod s3;

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::sync::Mutex;

use futures::future::BoxFuture;

use crate::job::{BlobRef, artifact::sha256_hex};

/// Why a store call did not do what was asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BlobError {
    /// No such object (or no such bucket).
    #[error("no such object")]
    NotFound,
    /// The object is larger than the caller takes.
    #[error("the object has {bytes} bytes, more than {limit}")]
    TooLarge {
        /// Its size.
        bytes: u64,
        /// The caller's limit.
        limit: usize,
    },
    /// The object is not the content its reference names (its size or SHA-256 differ).
    #[error("the object is not the content its reference names")]
    Mismatch,
    /// No bucket is configured for writes (`RESULTS_BUCKET`).
    #[error("no results bucket is configured")]
    NoBucket,
    /// The store could not be reached or refused the call; worth trying again.
    #[error("{operation} failed: {detail}")]
    Unavailable {
        /// The call.
        operation: &'static str,
        /// A classification (an error code, never content).
        detail: String,
    },
}

/// An object store: writes go to one bucket (when one is configured); reads may name any bucket
/// (an Extended Client pointer names the producer's).
pub trait BlobStore: Send + Sync + Debug {
    /// The bucket writes go to, if any.
    fn bucket(&self) -> Option<&str>;

    /// Writes `body` under `key` in the write bucket and returns its reference. Writing the same
    /// bytes under the same key again is harmless.
    fn put<'a>(&'a self, key: &'a str, body: &'a [u8])
    -> BoxFuture<'a, Result<BlobRef, BlobError>>;

    /// Reads an object, refusing one larger than `limit` bytes.
    fn get<'a>(
        &'a self,
        bucket: &'a str,
        key: &'a str,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<u8>, BlobError>>;

    /// Deletes an object of the write bucket (absent is fine).
    fn delete<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<(), BlobError>>;

    /// Keys of the write bucket under `prefix`, in key order, at most `limit`.
    fn list<'a>(
        &'a self,
        prefix: &'a str,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<String>, BlobError>>;
}

/// Reads `blob` and checks that it is the content the reference names.
pub async fn read_checked(
    store: &dyn BlobStore,
    blob: &BlobRef,
    limit: usize,
) -> Result<Vec<u8>, BlobError> {
    let bytes = store.get(&blob.bucket, &blob.key, limit).await?;
    if !blob.matches(&bytes) {
        return Err(BlobError::Mismatch);
    }
    Ok(bytes)
}

/// The reference of `body` stored under `key` in `bucket`.
pub fn reference(bucket: &str, key: &str, body: &[u8]) -> BlobRef {
    BlobRef {
        bucket: bucket.to_owned(),
        key: key.to_owned(),
        size: body.len() as u64,
        sha256: sha256_hex(body),
    }
}

/// Objects by (bucket, key).
type Objects = BTreeMap<(String, String), Vec<u8>>;

/// An in-memory store with S3's contract, for tests and the simulation.
#[derive(Debug, Default)]
pub struct MemoryBlobs {
    bucket: Option<String>,
    objects: Mutex<Objects>,
    failing: std::sync::atomic::AtomicBool,
}

impl MemoryBlobs {
    /// A store writing to `bucket`.
    pub fn new(bucket: &str) -> Self {
        MemoryBlobs {
            bucket: Some(bucket.to_owned()),
            ..MemoryBlobs::default()
        }
    }

    /// Stores an object in any bucket, as a producer would.
    pub fn insert(&self, bucket: &str, key: &str, body: &[u8]) {
        self.lock()
            .insert((bucket.to_owned(), key.to_owned()), body.to_vec());
    }

    /// Makes every call fail as unavailable (`true`) or work again.
    pub fn fail(&self, failing: bool) {
        self.failing
            .store(failing, std::sync::atomic::Ordering::Relaxed);
    }

    /// The keys of the write bucket, in order.
    pub fn keys(&self) -> Vec<String> {
        let bucket = self.bucket.clone().unwrap_or_default();
        self.lock()
            .keys()
            .filter(|(b, _)| *b == bucket)
            .map(|(_, k)| k.clone())
            .collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Objects> {
        self.objects.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn check(&self, operation: &'static str) -> Result<(), BlobError> {
        if self.failing.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(BlobError::Unavailable {
                operation,
                detail: "injected".to_owned(),
            });
        }
        Ok(())
    }

    fn write_bucket(&self) -> Result<&str, BlobError> {
        self.bucket.as_deref().ok_or(BlobError::NoBucket)
    }
}

impl BlobStore for MemoryBlobs {
    fn bucket(&self) -> Option<&str> {
        self.bucket.as_deref()
    }

    fn put<'a>(
        &'a self,
        key: &'a str,
        body: &'a [u8],
    ) -> BoxFuture<'a, Result<BlobRef, BlobError>> {
        Box::pin(async move {
            self.check("put")?;
            let bucket = self.write_bucket()?;
            self.insert(bucket, key, body);
            Ok(reference(bucket, key, body))
        })
    }

    fn get<'a>(
        &'a self,
        bucket: &'a str,
        key: &'a str,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<u8>, BlobError>> {
        Box::pin(async move {
            self.check("get")?;
            let objects = self.lock();
            let body = objects
                .get(&(bucket.to_owned(), key.to_owned()))
                .ok_or(BlobError::NotFound)?;
            if body.len() > limit {
                return Err(BlobError::TooLarge {
                    bytes: body.len() as u64,
                    limit,
                });
            }
            Ok(body.clone())
        })
    }

    fn delete<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<(), BlobError>> {
        Box::pin(async move {
            self.check("delete")?;
            let bucket = self.write_bucket()?.to_owned();
            self.lock().remove(&(bucket, key.to_owned()));
            Ok(())
        })
    }

    fn list<'a>(
        &'a self,
        prefix: &'a str,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<String>, BlobError>> {
        Box::pin(async move {
            self.check("list")?;
            let bucket = self.write_bucket()?;
            Ok(self
                .lock()
                .keys()
                .filter(|(b, k)| b == bucket && k.starts_with(prefix))
                .take(limit)
                .map(|(_, key)| key.clone())
                .collect())
        })
    }
}
