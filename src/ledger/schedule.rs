//! The provider's capacity shared by every invocation: a schedule item in the ledger table per
//! provider limit, which hands out calls in chunks.
//!
//! The item holds, for requests and for tokens, the time until which the capacity is booked
//! (a theoretical arrival time, as in the generic cell rate algorithm). A reservation of `n`
//! calls and `t` tokens moves each forward by its cost at the limit's rate, from now if the
//! capacity was idle, and may start when both are free. It is granted only if it starts within
//! the horizon, so nobody books capacity they would not wait for: otherwise the item is left
//! as it was and the writer learns until when the capacity is booked. One conditional write
//! serves a chunk of calls, so the schedule costs far less than one write per call.

use futures::future::BoxFuture;

use super::LedgerError;
use crate::job::Millis;

/// The key prefix of schedule items in the ledger table (job ids never start with it: they
/// are validated to the characters of a job id, `#` excluded).
pub(crate) const SCHEDULE_KEY_PREFIX: &str = "#schedule#";

/// A provider's limits, as configured (`PROVIDER_RPM`, `PROVIDER_TPM`); 0 is no limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Limits {
    /// Requests per minute.
    pub rpm: u64,
    /// Tokens per minute.
    pub tpm: u64,
}

impl Limits {
    /// Whether any limit is set.
    pub fn any(self) -> bool {
        self.rpm > 0 || self.tpm > 0
    }

    /// `percent` of these limits (a limit set stays at least 1).
    pub fn share(self, percent: u64) -> Limits {
        let part = |limit: u64| {
            if limit == 0 {
                0
            } else {
                (u128::from(limit) * u128::from(percent) / 100).max(1) as u64
            }
        };
        Limits {
            rpm: part(self.rpm),
            tpm: part(self.tpm),
        }
    }

    /// The time `requests` and `tokens` take at these limits, in microseconds each.
    pub(crate) fn cost_us(self, requests: u64, tokens: u64) -> (i64, i64) {
        let at = |n: u64, per_minute: u64| -> i64 {
            if per_minute == 0 {
                0
            } else {
                i64::try_from(u128::from(n) * 60_000_000 / u128::from(per_minute))
                    .unwrap_or(i64::MAX)
            }
        };
        (at(requests, self.rpm), at(tokens, self.tpm))
    }
}

/// One reservation of a chunk of calls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReserveRequest {
    /// Which schedule: one per provider account and limit (`PROVIDER_LIMIT_KEY`).
    pub key: String,
    /// The limits the schedule keeps to.
    pub limits: Limits,
    /// Calls in the chunk.
    pub requests: u64,
    /// Tokens the chunk's calls are expected to be charged.
    pub tokens: u64,
    /// The writer's clock.
    pub now: Millis,
    /// The latest start the writer would wait for.
    pub horizon_ms: Millis,
}

impl ReserveRequest {
    /// The latest start the writer would wait for, in microseconds.
    pub(crate) fn horizon_end_us(&self) -> i64 {
        self.now
            .saturating_add(self.horizon_ms.max(0))
            .saturating_mul(1_000)
    }
}

/// What a reservation got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reservation {
    /// The chunk is the writer's from `start` (at or after now).
    Granted {
        /// When the chunk's calls may start.
        start: Millis,
    },
    /// Nothing was reserved: the capacity is booked until `until`, past the horizon.
    Booked {
        /// When the capacity booked so far ends.
        until: Millis,
    },
}

/// The schedule item's state: until when requests and tokens are booked, in microseconds since
/// the epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Booked {
    /// Requests booked until.
    pub requests_us: i64,
    /// Tokens booked until.
    pub tokens_us: i64,
}

/// Microseconds rounded up to milliseconds.
pub(crate) fn ceil_ms(us: i64) -> Millis {
    us.saturating_add(999).div_euclid(1_000)
}

/// The reservation as a pure function: the state after it and what it got, or the state
/// unchanged with `Booked` when it would start past the horizon.
pub(crate) fn apply_reserve(
    current: Option<Booked>,
    req: &ReserveRequest,
) -> (Option<Booked>, Reservation) {
    let now_us = req.now.saturating_mul(1_000);
    let current_or_idle = current.unwrap_or_default();
    let from_r = current_or_idle.requests_us.max(now_us);
    let from_t = current_or_idle.tokens_us.max(now_us);
    let start_us = from_r.max(from_t);
    if start_us > req.horizon_end_us() {
        let until = ceil_ms(start_us);
        return (current, Reservation::Booked { until });
    }
    let (cost_r, cost_t) = req.limits.cost_us(req.requests, req.tokens);
    let next = Booked {
        requests_us: from_r.saturating_add(cost_r),
        tokens_us: from_t.saturating_add(cost_t),
    };
    (
        Some(next),
        Reservation::Granted {
            start: ceil_ms(start_us),
        },
    )
}

/// Where the schedules are kept: the DynamoDB ledger table, or memory in tests.
pub trait CallSchedule: Send + Sync + std::fmt::Debug {
    /// Reserves a chunk of calls (one conditional write in the busy case).
    fn reserve(&self, req: ReserveRequest) -> BoxFuture<'_, Result<Reservation, LedgerError>>;

    /// Until when the schedule `key` is booked, read without writing (an eventually consistent
    /// read, a tenth of a refused write's price): how a writer refused before learns whether
    /// asking again could succeed.
    fn peek<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<Booked>, LedgerError>>;
}

impl Booked {
    /// When a reservation made at `now` would start.
    pub(crate) fn start_at(self, now: Millis) -> Millis {
        ceil_ms(self.requests_us.max(self.tokens_us)).max(now)
    }
}

/// Schedules in memory, with the same arithmetic under one lock.
#[derive(Debug, Default)]
pub struct MemorySchedule {
    items: std::sync::Mutex<std::collections::HashMap<String, Booked>>,
    writes: std::sync::atomic::AtomicU64,
}

impl MemorySchedule {
    /// No schedule booked yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Reservations asked for so far.
    pub fn writes(&self) -> u64 {
        self.writes.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl CallSchedule for MemorySchedule {
    fn reserve(&self, req: ReserveRequest) -> BoxFuture<'_, Result<Reservation, LedgerError>> {
        self.writes
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut items = self.items.lock().unwrap_or_else(|p| p.into_inner());
        let (next, got) = apply_reserve(items.get(&req.key).copied(), &req);
        if let Some(next) = next {
            items.insert(req.key.clone(), next);
        }
        Box::pin(std::future::ready(Ok(got)))
    }

    fn peek<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<Booked>, LedgerError>> {
        let items = self.items.lock().unwrap_or_else(|p| p.into_inner());
        Box::pin(std::future::ready(Ok(items.get(key).copied())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(now: Millis, requests: u64, tokens: u64) -> ReserveRequest {
        ReserveRequest {
            key: "k".into(),
            limits: Limits {
                rpm: 600,
                tpm: 60_000,
            },
            requests,
            tokens,
            now,
            horizon_ms: 5_000,
        }
    }

    #[test]
    fn an_idle_schedule_grants_at_once_and_books_the_chunks_cost() {
        let (next, got) = apply_reserve(None, &req(1_000, 10, 500));
        assert_eq!(got, Reservation::Granted { start: 1_000 });
        // 10 requests at 600 a minute take 1 s; 500 tokens at 60,000 a minute take 0.5 s.
        let next = next.expect("booked");
        assert_eq!(next.requests_us, 2_000_000);
        assert_eq!(next.tokens_us, 1_500_000);
    }

    #[test]
    fn a_busy_schedule_starts_where_the_later_resource_is_free() {
        let (next, _) = apply_reserve(None, &req(1_000, 10, 500));
        // Tokens now bind: 6,000 tokens take 6 s.
        let (next, got) = apply_reserve(next, &req(1_000, 1, 6_000));
        assert_eq!(got, Reservation::Granted { start: 2_000 });
        let (_, got) = apply_reserve(next, &req(1_000, 1, 10));
        assert_eq!(got, Reservation::Booked { until: 7_500 });
    }

    #[test]
    fn past_the_horizon_nothing_is_booked() {
        let (mut state, _) = apply_reserve(None, &req(0, 100, 0));
        let before = state;
        let (after, got) = apply_reserve(state.take(), &req(0, 1, 0));
        assert_eq!(got, Reservation::Booked { until: 10_000 });
        assert_eq!(after, before);
    }

    #[test]
    fn extreme_values_saturate_instead_of_overflowing() {
        let huge = ReserveRequest {
            limits: Limits { rpm: 1, tpm: 1 },
            requests: u64::MAX,
            tokens: u64::MAX,
            now: Millis::MAX / 2,
            horizon_ms: Millis::MAX,
            ..req(0, 0, 0)
        };
        let (next, got) = apply_reserve(None, &huge);
        assert!(matches!(got, Reservation::Granted { .. }));
        let next = next.expect("booked");
        assert_eq!(next.requests_us, i64::MAX);
        let (_, again) = apply_reserve(Some(next), &req(0, 1, 1));
        assert!(matches!(again, Reservation::Booked { .. }));
    }

    #[test]
    fn no_limit_costs_nothing() {
        let limits = Limits { rpm: 0, tpm: 0 };
        assert!(!limits.any());
        assert_eq!(limits.cost_us(100, 1_000_000), (0, 0));
    }
}
