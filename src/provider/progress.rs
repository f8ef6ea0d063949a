//! The progress rule of a streamed call: no bytes for its timeout, and the call is hung.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::job::{BatchCounts, CallProgress};

/// The progress rule of a streamed call: when its last bytes arrived. A call that streams marks
/// each chunk; one that shows no bytes for the timeout is hung: its provider cancels it and
/// the attempt is uncertain (it may have run), and the heartbeat stops renewing its lease
/// meanwhile, so a call that cannot be cancelled locally lets its lease lapse.
///
/// It also keeps what the call has to show for itself (the bytes streamed, a batch's request
/// counts), which the owner's next renewal or hand-over writes for `jobctl watch`.
#[derive(Debug, Clone)]
pub struct Progress(Arc<ProgressState>);

#[derive(Debug)]
struct ProgressState {
    start: tokio::time::Instant,
    /// Milliseconds from `start` to the last bytes (or the request's sending).
    last_ms: AtomicU64,
    /// The call streams: the rule applies.
    streaming: AtomicBool,
    timeout: Duration,
    /// Bytes of the answer streamed so far.
    bytes: AtomicU64,
    /// The provider batch's request counts, as last read.
    batch: Mutex<Option<BatchCounts>>,
}

impl Progress {
    /// The rule with `timeout`: nothing is watched until the call starts streaming.
    pub fn new(timeout: Duration) -> Progress {
        Progress(Arc::new(ProgressState {
            start: tokio::time::Instant::now(),
            last_ms: AtomicU64::new(0),
            streaming: AtomicBool::new(false),
            timeout,
            bytes: AtomicU64::new(0),
            batch: Mutex::new(None),
        }))
    }

    /// The longest a streamed call may show no bytes.
    pub fn timeout(&self) -> Duration {
        self.0.timeout
    }

    /// Bytes arrived (or the streamed request was sent): the call shows progress now.
    pub fn mark(&self) {
        let now = u64::try_from(self.0.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.0.last_ms.store(now, Ordering::Relaxed);
        self.0.streaming.store(true, Ordering::Relaxed);
    }

    /// `bytes` of the answer arrived: the call shows progress now.
    pub fn streamed(&self, bytes: usize) {
        let bytes = u64::try_from(bytes).unwrap_or(u64::MAX);
        self.0.bytes.fetch_add(bytes, Ordering::Relaxed);
        self.mark();
    }

    /// The provider reported the request counts of the batch the call runs in.
    pub fn batch(&self, counts: BatchCounts) {
        *self.0.batch.lock().unwrap_or_else(|p| p.into_inner()) = Some(counts);
    }

    /// The bytes the call streamed, said by the owner of `epoch` (`None`: none yet).
    pub fn said(&self, epoch: u64) -> Option<CallProgress> {
        let streamed_bytes = self.0.bytes.load(Ordering::Relaxed);
        (streamed_bytes > 0).then_some(CallProgress {
            epoch,
            streamed_bytes,
        })
    }

    /// The request counts of the batch the call runs in, as last read.
    pub fn batch_counts(&self) -> Option<BatchCounts> {
        *self.0.batch.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether the call streams and has shown no bytes for longer than the timeout.
    pub fn stalled(&self) -> bool {
        if !self.0.streaming.load(Ordering::Relaxed) {
            return false;
        }
        let now = u64::try_from(self.0.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        let idle = now.saturating_sub(self.0.last_ms.load(Ordering::Relaxed));
        u128::from(idle) > self.0.timeout.as_millis()
    }
}

/// The progress timeout of a streamed call nobody configured: long enough for a reasoning
/// model's silent first minutes, short of the idle limits of most proxies and load balancers.
pub const DEFAULT_PROGRESS_TIMEOUT: Duration = Duration::from_secs(300);

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn only_a_streaming_call_silent_past_its_timeout_is_stalled() {
        let progress = Progress::new(Duration::from_secs(2));
        tokio::time::advance(Duration::from_secs(5)).await;
        assert!(!progress.stalled(), "not streaming: nothing is watched");
        progress.mark();
        tokio::time::advance(Duration::from_secs(2)).await;
        assert!(!progress.stalled(), "within the timeout");
        tokio::time::advance(Duration::from_millis(10)).await;
        assert!(progress.stalled());
        progress.mark();
        assert!(!progress.stalled(), "bytes again");
    }

    #[test]
    fn it_says_the_bytes_streamed_once_there_are_any_and_keeps_the_last_batch_counts() {
        let progress = Progress::new(Duration::from_secs(2));
        progress.mark();
        assert_eq!(
            progress.said(3),
            None,
            "the request was sent; nothing to show"
        );
        progress.streamed(10);
        progress.streamed(5);
        assert_eq!(
            progress.said(3),
            Some(CallProgress {
                epoch: 3,
                streamed_bytes: 15,
            })
        );
        assert_eq!(progress.batch_counts(), None);
        for completed in [1, 2] {
            progress.batch(BatchCounts {
                total: 4,
                completed,
                failed: 0,
            });
        }
        assert_eq!(progress.batch_counts().map(|c| c.completed), Some(2));
    }
}
