//! The S3 store: one bucket for writes, any bucket for reads.

use aws_sdk_s3::Client;
use aws_sdk_s3::error::ProvideErrorMetadata;
use aws_sdk_s3::primitives::ByteStream;
use futures::future::BoxFuture;

use super::{BlobError, BlobStore, reference};
use crate::job::BlobRef;

/// Objects in S3 through the AWS SDK.
#[derive(Debug, Clone)]
pub struct S3Blobs {
    client: Client,
    bucket: Option<String>,
}

impl S3Blobs {
    /// A store writing to `bucket` (`None`: reads only).
    pub fn new(client: Client, bucket: Option<String>) -> Self {
        S3Blobs { client, bucket }
    }

    fn write_bucket(&self) -> Result<&str, BlobError> {
        self.bucket.as_deref().ok_or(BlobError::NoBucket)
    }
}

fn unavailable<E: ProvideErrorMetadata>(operation: &'static str, e: &E) -> BlobError {
    match e.code() {
        Some("NoSuchKey" | "NoSuchBucket" | "NotFound") => BlobError::NotFound,
        code => BlobError::Unavailable {
            operation,
            detail: code.unwrap_or("no response").to_owned(),
        },
    }
}

/// The longest a body may take to arrive (16 MiB takes well under a second in a region).
const BODY_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(20);

impl BlobStore for S3Blobs {
    fn bucket(&self) -> Option<&str> {
        self.bucket.as_deref()
    }

    fn put<'a>(
        &'a self,
        key: &'a str,
        body: &'a [u8],
    ) -> BoxFuture<'a, Result<BlobRef, BlobError>> {
        Box::pin(async move {
            let bucket = self.write_bucket()?;
            self.client
                .put_object()
                .bucket(bucket)
                .key(key)
                .content_type("application/json")
                .body(ByteStream::from(body.to_vec()))
                .send()
                .await
                .map_err(|e| unavailable("put_object", &e))?;
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
            let object = self
                .client
                .get_object()
                .bucket(bucket)
                .key(key)
                .send()
                .await
                .map_err(|e| unavailable("get_object", &e))?;
            let size = object.content_length().unwrap_or_default().max(0) as u64;
            if size > limit as u64 {
                return Err(BlobError::TooLarge { bytes: size, limit });
            }
            // Read into one buffer of the announced size (no second copy), within a bound the
            // client's operation timeout does not give a streamed body.
            let mut bytes = Vec::with_capacity(size as usize);
            let mut body = object.body;
            let cut = || BlobError::Unavailable {
                operation: "get_object",
                detail: "the body was cut off".to_owned(),
            };
            let read = async {
                while let Some(chunk) = body.try_next().await.map_err(|_| cut())? {
                    if bytes.len() + chunk.len() > limit {
                        return Err(BlobError::TooLarge {
                            bytes: (bytes.len() + chunk.len()) as u64,
                            limit,
                        });
                    }
                    bytes.extend_from_slice(&chunk);
                }
                Ok(())
            };
            tokio::time::timeout(BODY_READ_TIMEOUT, read)
                .await
                .map_err(|_| BlobError::Unavailable {
                    operation: "get_object",
                    detail: "the body was not read in time".to_owned(),
                })??;
            Ok(bytes)
        })
    }

    fn delete<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<(), BlobError>> {
        Box::pin(async move {
            self.client
                .delete_object()
                .bucket(self.write_bucket()?)
                .key(key)
                .send()
                .await
                .map_err(|e| unavailable("delete_object", &e))?;
            Ok(())
        })
    }

    fn list<'a>(
        &'a self,
        prefix: &'a str,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<String>, BlobError>> {
        Box::pin(async move {
            let page = self
                .client
                .list_objects_v2()
                .bucket(self.write_bucket()?)
                .prefix(prefix)
                .max_keys(i32::try_from(limit.min(1_000)).unwrap_or(1_000))
                .send()
                .await
                .map_err(|e| unavailable("list_objects_v2", &e))?;
            Ok(page
                .contents()
                .iter()
                .filter_map(|o| o.key().map(str::to_owned))
                .collect())
        })
    }
}
