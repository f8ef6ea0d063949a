//! The signal that stops a running call, and why it was stopped: ownership lost, or an
//! operator's cancel. The heartbeat sends it; the call's steps wait on it and read why.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio_util::sync::CancellationToken;

/// Why a running call was stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stopped {
    /// Ownership lost: a renewal refused, or the lease about to lapse. The call may have run.
    Lost,
    /// An operator cancelled the job: the call is withdrawn, and the attempt ends `cancelled`.
    Withdrawn,
}

/// The signal that stops one running call. Clones share it.
#[derive(Debug, Clone, Default)]
pub struct StopSignal {
    token: CancellationToken,
    withdrawn: Arc<AtomicBool>,
}

impl StopSignal {
    /// A signal not yet sent.
    pub fn new() -> StopSignal {
        StopSignal::default()
    }

    /// Stops the call: ownership is lost.
    pub fn lose(&self) {
        self.token.cancel();
    }

    /// Stops the call: an operator cancelled its job.
    pub(crate) fn withdraw(&self) {
        // Before the token, so that whoever wakes on it reads why.
        self.withdrawn.store(true, Ordering::SeqCst);
        self.token.cancel();
    }

    /// Why the call was stopped, if it was.
    pub fn why(&self) -> Option<Stopped> {
        if self.withdrawn.load(Ordering::SeqCst) {
            Some(Stopped::Withdrawn)
        } else if self.token.is_cancelled() {
            Some(Stopped::Lost)
        } else {
            None
        }
    }

    /// Whether the call was stopped by an operator's cancel.
    pub fn withdrawn(&self) -> bool {
        self.why() == Some(Stopped::Withdrawn)
    }

    /// Waits until the call is stopped.
    pub async fn stopped(&self) {
        self.token.cancelled().await;
    }

    /// The token that is cancelled when the call is stopped, for what waits on a token.
    pub(crate) fn token(&self) -> &CancellationToken {
        &self.token
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signal_says_why_it_stopped_the_call() {
        let lost = StopSignal::new();
        assert_eq!(lost.why(), None);
        lost.clone().lose();
        assert_eq!(lost.why(), Some(Stopped::Lost));
        let withdrawn = StopSignal::new();
        withdrawn.clone().withdraw();
        assert_eq!(withdrawn.why(), Some(Stopped::Withdrawn));
        assert!(withdrawn.withdrawn() && !lost.withdrawn());
    }
}
