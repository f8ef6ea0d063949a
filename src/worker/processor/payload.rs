//! Payloads outside the item: a large input stored before the claim and read back for the
//! call, a large answer stored before its acceptance (where it went is [`Placed`]; how the
//! attempt then ends is the [`Ending`](crate::protocol::ending::Ending)'s to say). Pointer bodies
//! are read in `blobs::body`.

use std::time::Duration;

use super::{Invocation, Processed, Processor, backoff, failed, ledger_failure};
use crate::blobs::{BlobError, read_checked, reference};
use crate::clock::Clock;
use crate::job::artifact::{MAX_RESULT_BYTES, RESULTS_PREFIX, input_key, result_key, sha256_hex};
use crate::job::decision::{Next, next_step};
use crate::job::message::{MAX_PAYLOAD_BYTES, input_digest};
use crate::job::{
    BlobRef, Failure, INLINE_LIMIT_BYTES, InvalidMessage, JobItem, JobMessage, JobState, NewJob,
    RecordOutcome,
};
use crate::ledger::{JobLedger, KeptInput, Write};
use crate::protocol::ending::Placed;
use crate::provider::Provider;

/// Why a job's stored input cannot be used now.
pub(super) enum InputError {
    /// The object is gone or is not the job's input (`gone`, `altered`): it never comes back.
    Lost(&'static str),
    /// The store cannot be reached now.
    Unavailable(Failure),
}

/// Tries at writing an answer to the store before the attempt ends without it.
const STORE_TRIES: u32 = 3;
/// Pause before the second try; doubled after.
const STORE_PAUSE_MS: u64 = 200;

impl<L: JobLedger, P: Provider, C: Clock> Processor<L, P, C> {
    /// The message with its input stored, when no item could hold it (above
    /// `INLINE_LIMIT_BYTES`; poison without a results bucket); `None` when the message goes as
    /// it is. A smaller input is stored only when a write keeps it ([`Self::kept_job`],
    /// [`Self::kept_input`]): the first claim keeps none. The key derives from the input digest,
    /// so a redelivery writes the same object again.
    pub(super) async fn offload_input(
        &self,
        msg: &JobMessage,
    ) -> Result<Option<JobMessage>, Failure> {
        let size = msg.input_canonical.len();
        if msg.input_ref.is_some() || size <= INLINE_LIMIT_BYTES {
            return Ok(None);
        }
        let store = self.blobs().filter(|b| b.bucket().is_some());
        let Some(store) = store else {
            return Err(Failure::Poison(InvalidMessage::TooLarge {
                bytes: size,
                limit: INLINE_LIMIT_BYTES,
            }));
        };
        let key = input_key(&msg.job_id, &msg.digest);
        match store.put(&key, msg.input_canonical.as_bytes()).await {
            Ok(blob) => Ok(Some(JobMessage {
                input_ref: Some(blob),
                ..msg.clone()
            })),
            Err(e) => {
                tracing::warn!(job_id = %msg.job_id, error = %e, "storing the input failed");
                Err(backoff("input store"))
            }
        }
    }

    /// The job a write that keeps its input (a claim after the first, a creation) writes:
    /// without the input when the item it finds (`view`) keeps it already; with the input
    /// stored and its reference in place of it when it is above `INLINE_MAX_BYTES`. `None`:
    /// the job goes as it is.
    pub(super) async fn kept_job(
        &self,
        msg: &JobMessage,
        job: &NewJob,
        view: Option<&JobItem>,
    ) -> Option<NewJob> {
        if job.input.is_empty() {
            return None;
        }
        if view.is_some_and(JobItem::keeps_input) {
            return Some(NewJob {
                input: String::new(),
                ..job.clone()
            });
        }
        match self.kept_input(msg).await? {
            KeptInput::Stored(blob) => Some(NewJob {
                input: String::new(),
                input_ref: Some(*blob),
                ..job.clone()
            }),
            KeptInput::Inline(_) => None,
        }
    }

    /// How an end that leaves a job live keeps the input of `msg` (its item keeps none): in
    /// the item up to `INLINE_MAX_BYTES`, stored in the results bucket above it (in the item
    /// when the store fails: inputs the item could not hold were stored at first sight);
    /// `None` when the message does not carry it either (a trigger by id).
    pub(super) async fn kept_input(&self, msg: &JobMessage) -> Option<KeptInput> {
        if let Some(blob) = &msg.input_ref {
            return Some(KeptInput::Stored(Box::new(blob.clone())));
        }
        if msg.input_canonical.is_empty() {
            return None;
        }
        let store = self.blobs().filter(|b| b.bucket().is_some());
        if let Some(store) =
            store.filter(|_| msg.input_canonical.len() > self.settings.inline_max_bytes)
        {
            let key = input_key(&msg.job_id, &msg.digest);
            match store.put(&key, msg.input_canonical.as_bytes()).await {
                Ok(blob) => return Some(KeptInput::Stored(Box::new(blob))),
                Err(e) => {
                    tracing::warn!(job_id = %msg.job_id, error = %e, "storing the input failed; kept inline");
                }
            }
        }
        Some(KeptInput::Inline(msg.input_canonical.clone()))
    }

    /// The message a ledger item stands for, its stored input read back and checked against
    /// the job's digest only when this delivery will call the provider or ask it (a duplicate
    /// deferred to a live owner, or a finished job, costs no read of the object). One whose
    /// item keeps no input carries none, and its admission never claims or recovers from it.
    pub(super) async fn stored_input(&self, item: &JobItem) -> Result<JobMessage, InputError> {
        let mut msg = JobMessage::from_record(item);
        let now = self.clock.now_ms();
        let calls = match next_step(item, &item.input_digest, now, self.settings.skew_ms) {
            Next::Claim(_) | Next::AwaitRecovery => true,
            Next::AwaitDecision => self.can_ask_about(item),
            _ => false,
        };
        let Some(blob) = item.input_ref.as_ref().filter(|_| calls) else {
            return Ok(msg);
        };
        let Some(store) = self.blobs() else {
            return Err(InputError::Unavailable(backoff(
                "no object store for a stored input",
            )));
        };
        let bytes = match read_checked(store, blob, MAX_PAYLOAD_BYTES).await {
            Ok(bytes) => bytes,
            Err(BlobError::NotFound) => return Err(InputError::Lost("gone")),
            Err(BlobError::Mismatch) => return Err(InputError::Lost("altered")),
            Err(e) => {
                tracing::warn!(job_id = %item.job_id, error = %e, "reading the stored input failed");
                return Err(InputError::Unavailable(backoff("input store")));
            }
        };
        let text = String::from_utf8(bytes).map_err(|_| InputError::Lost("altered"))?;
        if input_digest(&item.contract, &text) != item.input_digest {
            return Err(InputError::Lost("altered"));
        }
        msg.input_canonical = text;
        Ok(msg)
    }

    /// A live job whose stored input is gone or altered is never poison: its message is the
    /// job's only trigger. It ends `input_lost`, or backs off, as
    /// [`input_lost`](crate::protocol::admission::input_lost) decides.
    pub(super) async fn input_lost(&self, item: JobItem, how: &'static str) -> Processed {
        tracing::error!(job_id = %item.job_id, how, "the job's stored input cannot be used");
        let now = self.clock.now_ms();
        let settle = crate::protocol::admission::input_lost(&item, now, self.settings.skew_ms);
        let Some(req) = settle else {
            return failed(backoff("stored input lost"), Some(item));
        };
        match self.ledger.settle(req).await {
            Ok(Write::Applied(record)) => Processed {
                outcome: RecordOutcome::Done(record.state),
                view: Some(record),
            },
            // Changed meanwhile: the next delivery decides from the item as it is then.
            Ok(Write::Refused(seen)) => failed(backoff("contention"), seen.or(Some(item))),
            Err(e) => ledger_failure(&item.job_id.clone(), &e, Some(item)),
        }
    }

    /// How an accepted answer is written: inline when it is small enough and the item can hold
    /// it; otherwise stored first (under the job, the owner's epoch and the digest), so the
    /// acceptance only references it. Without a bucket, an answer the item cannot hold ends the
    /// attempt `failed_terminal`. An answer that could not be stored after a few tries, nor found
    /// stored by a put that timed out, is never paid for again while it exists: kept inline if
    /// the item can hold it, left with the provider if the attempt's reference can fetch it
    /// again (the job is handed over: the next delivery recovers it and fetches the answer),
    /// and only otherwise the attempt ends like a transient failure.
    pub(super) async fn place_result(
        &self,
        claimed: &JobItem,
        body: &str,
        inv: &Invocation,
    ) -> Placed {
        let fits = claimed.can_hold_result(body);
        if fits && body.len() <= self.settings.inline_max_bytes {
            return Placed::Inline;
        }
        let Some(store) = self.blobs().filter(|b| b.bucket().is_some()) else {
            if fits {
                return Placed::Inline;
            }
            return Placed::TooLarge(format!(
                "the answer has {} bytes, more than the ledger item can hold, and no \
                 RESULTS_BUCKET is set",
                body.len()
            ));
        };
        let key = result_key(
            &claimed.job_id,
            claimed.owner_epoch,
            &sha256_hex(body.as_bytes()),
        );
        for tries in 1..=STORE_TRIES {
            match store.put(&key, body.as_bytes()).await {
                Ok(blob) => return Placed::Stored(blob),
                Err(e) => {
                    tracing::warn!(job_id = %claimed.job_id, error = %e, tries, "storing the answer failed");
                    let pause = STORE_PAUSE_MS << tries;
                    let end = inv
                        .deadline
                        .map_or(i64::MAX, |d| d - self.settings.deadline_margin_ms);
                    if tries == STORE_TRIES || self.clock.now_ms() + pause as i64 >= end {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(pause)).await;
                }
            }
        }
        // A put whose answer was lost may have landed.
        let sha256 = sha256_hex(body.as_bytes());
        if let Some(bucket) = store.bucket()
            && let Ok(bytes) = store.get(bucket, &key, MAX_RESULT_BYTES).await
            && sha256_hex(&bytes) == sha256
        {
            tracing::info!(job_id = %claimed.job_id, "the answer's object was stored after all");
            return Placed::Stored(reference(bucket, &key, &bytes));
        }
        let fetch = !fits
            && self.link_of(claimed).provider.can_retrieve()
            && self.attempt_reference(claimed).await;
        let placed = Placed::unstorable(fits, fetch);
        match placed {
            Placed::Inline => {
                tracing::warn!(job_id = %claimed.job_id, "the results bucket failed; the answer is kept in the item")
            }
            Placed::KeptByProvider => {
                tracing::warn!(job_id = %claimed.job_id, "the results bucket failed; the answer is left with the provider, to be fetched again")
            }
            _ => {}
        }
        placed
    }

    /// Whether the owner's attempt has a provider reference recorded in the item (at its claim,
    /// or after a background submission): what a later owner fetches the answer with.
    async fn attempt_reference(&self, claimed: &JobItem) -> bool {
        if claimed.last_provider_ref().is_some() {
            return true;
        }
        matches!(
            self.ledger.get(&claimed.job_id).await,
            Ok(Some(item)) if item.owner_epoch == claimed.owner_epoch
                && item.state == JobState::Running
                && item.last_provider_ref().is_some()
        )
    }

    /// The answer the owner of `job`'s last attempt stored before it could accept it (it
    /// crashed, stalled or lost its lease in between), if there is one and it is the content
    /// its key names: the evidence a recovery accepts instead of calling again.
    pub(super) async fn stored_answer(&self, job: &JobItem) -> Option<BlobRef> {
        let store = self.blobs()?;
        let bucket = store.bucket()?;
        let epoch = job.attempt_log.last()?.epoch;
        let prefix = format!("{RESULTS_PREFIX}{}/{epoch}/", job.job_id);
        let listed = store
            .list(&prefix, 1)
            .await
            .map_err(|e| {
                // Said, not hidden: without the evidence the job may become `unknown`.
                tracing::warn!(job_id = %job.job_id, error = %e, "looking for a stored answer failed");
            })
            .ok()?;
        let key = listed.first()?;
        let bytes = store.get(bucket, key, MAX_RESULT_BYTES).await.ok()?;
        let blob = reference(bucket, key, &bytes);
        (key == &result_key(&job.job_id, epoch, &blob.sha256)).then_some(blob)
    }
}
