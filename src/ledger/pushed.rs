//! What the webhook function reads and writes: a batch's jobs, and the webhook deliveries it
//! has already acted on.
//!
//! Both live on items of their own, beside the jobs' (no `state`, so no index holds them and
//! the stream's announcements skip them), each with a TTL: a batch's list of its jobs
//! (`#batch-jobs#<batch id>#<part>`, written once by the worker that created the batch), and
//! one item per webhook id acted on (`#webhook#<id>`, written once its triggers were sent, so a
//! replay within its window is refused, and a delivery cut off before the end is acted on
//! again by the sender's retry).

use std::future::Future;

use super::LedgerError;
use crate::job::{BatchMember, Millis};

/// The jobs one item of a batch's list holds at most: 1,000 of the longest ids and tenants
/// are well within DynamoDB's 400 KB item.
pub const MEMBERS_PER_ITEM: usize = 1_000;

/// How long a batch's list of its jobs outlives its creation: a provider batch's window is a
/// day, and OpenAI retries a webhook's delivery for up to 72 hours after the batch's end, so
/// 100 hours.
pub const MEMBERS_TTL_S: i64 = 100 * 3_600;

/// What the webhook function needs of the ledger.
pub trait PushedLedger: Send + Sync {
    /// The jobs the provider batch `batch_id` holds, as the worker that created it listed them
    /// (empty: no list was kept, or it expired).
    fn batch_members(
        &self,
        batch_id: &str,
    ) -> impl Future<Output = Result<Vec<BatchMember>, LedgerError>> + Send;

    /// Whether the webhook delivery `id` was acted on, as [`PushedLedger::acted_on`] recorded
    /// it, and is still kept at `now` (ms): a consistent read.
    fn was_acted_on(
        &self,
        id: &str,
        now: Millis,
    ) -> impl Future<Output = Result<bool, LedgerError>> + Send;

    /// Records that the webhook delivery `id` was acted on (its triggers sent) at `now`, kept
    /// until `until` (ms).
    fn acted_on(
        &self,
        id: &str,
        now: Millis,
        until: Millis,
    ) -> impl Future<Output = Result<(), LedgerError>> + Send;
}
