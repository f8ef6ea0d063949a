//! The heartbeat's counts of one invocation.

use std::sync::atomic::{AtomicU64, Ordering};

use super::StatsSnapshot;
use crate::report::{ModelUsage, ProviderFigures};

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
    usage: std::sync::Mutex<std::collections::BTreeMap<(&'static str, String), crate::job::Usage>>,
    latencies: std::sync::Mutex<Vec<u64>>,
    providers: std::sync::Mutex<Vec<ProviderFigures>>,
}

/// Provider latencies kept per invocation (the most one metric document takes).
const MAX_LATENCY_SAMPLES: usize = 100;

impl Stats {
    /// Counts a cut-off by the Lambda deadline.
    pub fn deadline_cutoff(&self) {
        self.deadline_cutoffs.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a call of `provider` refused for its rate limit or quota.
    pub fn throttled(&self, provider: &'static str) {
        self.provider_throttled.fetch_add(1, Ordering::Relaxed);
        self.of_provider(provider, |p| p.throttled += 1);
    }

    /// Changes `provider`'s figures with `change`.
    fn of_provider(&self, provider: &'static str, change: impl FnOnce(&mut ProviderFigures)) {
        let mut providers = self.providers.lock().unwrap_or_else(|p| p.into_inner());
        let at = match providers.iter().position(|p| p.provider == provider) {
            Some(at) => at,
            None => {
                providers.push(ProviderFigures {
                    provider,
                    ..ProviderFigures::default()
                });
                providers.len() - 1
            }
        };
        change(&mut providers[at]);
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

    /// Records how long one call of `provider` took (from its start to its answer or failure);
    /// the first [`MAX_LATENCY_SAMPLES`] of an invocation are kept, and as many of each
    /// provider's.
    pub fn provider_latency(&self, provider: &'static str, ms: u64) {
        let mut samples = self.latencies.lock().unwrap_or_else(|p| p.into_inner());
        if samples.len() < MAX_LATENCY_SAMPLES {
            samples.push(ms);
        }
        drop(samples);
        self.of_provider(provider, |p| {
            p.calls += 1;
            if p.latency_ms.len() < MAX_LATENCY_SAMPLES {
                p.latency_ms.push(ms);
            }
        });
    }

    /// Adds what an ended attempt of `model` at `provider` used to their sum.
    pub fn used(&self, provider: &'static str, model: &str, usage: &crate::job::Usage) {
        let mut sums = self.usage.lock().unwrap_or_else(|p| p.into_inner());
        let sum = sums.entry((provider, model.to_owned())).or_default();
        *sum = sum.plus(usage);
    }

    /// What the attempts ended so far used, by provider and model.
    pub(crate) fn usage_by_model(&self) -> Vec<ModelUsage> {
        let sums = self.usage.lock().unwrap_or_else(|p| p.into_inner());
        sums.iter()
            .map(|((provider, model), usage)| ModelUsage {
                provider,
                model: model.clone(),
                usage: *usage,
            })
            .collect()
    }

    /// Each provider's figures so far, in the order they first called.
    pub(crate) fn by_provider(&self) -> Vec<ProviderFigures> {
        self.providers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
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
