//! The heartbeat's counts of one invocation.

use std::sync::atomic::{AtomicU64, Ordering};

use super::StatsSnapshot;

/// Per-invocation counts, logged with the batch and returned in its report.
#[derive(Debug, Default)]
pub struct Stats {
    pub(super) heartbeat_ticks: AtomicU64,
    pub(super) heartbeat_late: AtomicU64,
    pub(super) visibility_calls: AtomicU64,
    pub(super) visibility_renewed: AtomicU64,
    pub(super) visibility_refused: AtomicU64,
    pub(super) visibility_uncertain: AtomicU64,
    pub(super) ownership_lost: AtomicU64,
    deadline_cutoffs: AtomicU64,
    recoveries: AtomicU64,
    provider_throttled: AtomicU64,
    spend_deferred: AtomicU64,
    uncontracted: AtomicU64,
    batch_lines: AtomicU64,
    batch_waits: AtomicU64,
    usage: std::sync::Mutex<std::collections::BTreeMap<String, crate::job::Usage>>,
    latencies: std::sync::Mutex<Vec<u64>>,
}

/// Provider latencies kept per invocation (the most one metric document takes).
const MAX_LATENCY_SAMPLES: usize = 100;

impl Stats {
    /// Counts a cut-off by the Lambda deadline.
    pub fn deadline_cutoff(&self) {
        self.deadline_cutoffs.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a provider call refused for its rate limit or quota.
    pub fn throttled(&self) {
        self.provider_throttled.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a record that waits for the next day's spend.
    pub(crate) fn spend_deferred(&self) {
        self.spend_deferred.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a new job naming a contract the lenient registry does not hold.
    pub(crate) fn uncontracted(&self) {
        self.uncontracted.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a line submitted in a provider batch.
    pub fn batch_line(&self) {
        self.batch_lines.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a record that looked at its running batch and waits, nothing written.
    pub(crate) fn batch_wait(&self) {
        self.batch_waits.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a recovery claim.
    pub fn recovery(&self) {
        self.recoveries.fetch_add(1, Ordering::Relaxed);
    }

    /// Records how long one provider call took (from its start to its answer or failure); the
    /// first [`MAX_LATENCY_SAMPLES`] of an invocation are kept.
    pub fn provider_latency(&self, ms: u64) {
        let mut samples = self.latencies.lock().unwrap_or_else(|p| p.into_inner());
        if samples.len() < MAX_LATENCY_SAMPLES {
            samples.push(ms);
        }
    }

    /// Adds what an ended attempt of `model` used to that model's sum.
    pub fn used(&self, model: &str, usage: &crate::job::Usage) {
        let mut sums = self.usage.lock().unwrap_or_else(|p| p.into_inner());
        let sum = sums.entry(model.to_owned()).or_default();
        *sum = sum.plus(usage);
    }

    /// What the attempts ended so far used, by model.
    pub(crate) fn usage_by_model(&self) -> Vec<(String, crate::job::Usage)> {
        let sums = self.usage.lock().unwrap_or_else(|p| p.into_inner());
        sums.iter().map(|(m, u)| (m.clone(), *u)).collect()
    }

    /// The provider latencies recorded so far, in milliseconds.
    pub(crate) fn latencies(&self) -> Vec<u64> {
        self.latencies
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The counts so far, without the lease renewals (they are kept per record: see
    /// [`Flights::snapshot`]).
    pub(super) fn counts(&self) -> StatsSnapshot {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        StatsSnapshot {
            heartbeat_ticks: get(&self.heartbeat_ticks),
            heartbeat_late: get(&self.heartbeat_late),
            visibility_calls: get(&self.visibility_calls),
            visibility_renewed: get(&self.visibility_renewed),
            visibility_refused: get(&self.visibility_refused),
            visibility_uncertain: get(&self.visibility_uncertain),
            ownership_lost: get(&self.ownership_lost),
            deadline_cutoffs: get(&self.deadline_cutoffs),
            recoveries: get(&self.recoveries),
            provider_throttled: get(&self.provider_throttled),
            spend_deferred: get(&self.spend_deferred),
            uncontracted: get(&self.uncontracted),
            batch_lines: get(&self.batch_lines),
            batch_waits: get(&self.batch_waits),
            ..StatsSnapshot::default()
        }
    }
}

pub(super) fn bump(counter: &AtomicU64, by: u64) {
    counter.fetch_add(by, Ordering::Relaxed);
}
