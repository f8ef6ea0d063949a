//! The deployment's spend per day, against `DAILY_SPEND_LIMIT`: one item of the ledger table a
//! day (`job_id` `#spend#<YYYY-MM-DD>`, UTC), to which each call adds the most it can cost
//! before it is claimed, with a write conditional on the sum staying within the limit, and from
//! which what it did not cost is taken back once it ended. A call the day cannot take waits
//! for the next day; nothing is failed for it.

use futures::future::BoxFuture;

use super::LedgerError;
use crate::job::Millis;

/// The prefix of the day items' keys (job ids never start with `#`).
pub(crate) const SPEND_KEY_PREFIX: &str = "#spend#";

/// The day `now` falls on (UTC), as a day item names it.
pub(crate) fn day_of(now: Millis) -> String {
    crate::job::utc_day(now)
}

/// Milliseconds from `now` to the start of the next day (UTC).
pub(crate) fn until_next_day(now: Millis) -> Millis {
    const DAY_MS: Millis = 86_400_000;
    DAY_MS - now.rem_euclid(DAY_MS)
}

/// The day's spend.
pub trait SpendBudget: Send + Sync + std::fmt::Debug {
    /// Adds `micros` to `day`'s spend if the sum stays within `limit`: `true` when added,
    /// `false` when it would pass it (nothing written).
    fn reserve<'a>(
        &'a self,
        day: &'a str,
        micros: u64,
        limit: u64,
        now: Millis,
    ) -> BoxFuture<'a, Result<bool, LedgerError>>;

    /// Corrects `day`'s spend by `delta` micro-dollars (a call's cost less what it reserved;
    /// minus the reservation of a call never made).
    fn adjust<'a>(
        &'a self,
        day: &'a str,
        delta: i64,
        now: Millis,
    ) -> BoxFuture<'a, Result<(), LedgerError>>;
}

/// Days in memory, for tests.
#[derive(Debug, Default)]
pub struct MemorySpend {
    days: std::sync::Mutex<std::collections::HashMap<String, i64>>,
}

impl MemorySpend {
    /// Nothing spent.
    pub fn new() -> Self {
        Self::default()
    }

    /// What `day` has spent, in micro-dollars.
    pub fn spent(&self, day: &str) -> i64 {
        self.lock().get(day).copied().unwrap_or(0)
    }

    /// Every day item anything was reserved from or charged to (`<day>`, `<day>#<account>`,
    /// `<day>#producer#<name>`).
    pub fn items(&self) -> Vec<String> {
        let mut items: Vec<String> = self.lock().keys().cloned().collect();
        items.sort_unstable();
        items
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, i64>> {
        self.days.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl SpendBudget for MemorySpend {
    fn reserve<'a>(
        &'a self,
        day: &'a str,
        micros: u64,
        limit: u64,
        _now: Millis,
    ) -> BoxFuture<'a, Result<bool, LedgerError>> {
        Box::pin(async move {
            let mut days = self.lock();
            let spent = days.entry(day.to_owned()).or_insert(0);
            let micros = i64::try_from(micros).unwrap_or(i64::MAX);
            if spent.saturating_add(micros) > i64::try_from(limit).unwrap_or(i64::MAX) {
                return Ok(false);
            }
            *spent += micros;
            Ok(true)
        })
    }

    fn adjust<'a>(
        &'a self,
        day: &'a str,
        delta: i64,
        _now: Millis,
    ) -> BoxFuture<'a, Result<(), LedgerError>> {
        Box::pin(async move {
            *self.lock().entry(day.to_owned()).or_insert(0) += delta;
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_day_takes_calls_up_to_its_limit_and_the_next_day_starts_afresh() {
        let days = MemorySpend::new();
        let today = day_of(1_796_083_200_000);
        assert_eq!(today, "2026-12-01");
        assert!(days.reserve(&today, 600, 1_000, 0).await.expect("ok"));
        assert!(!days.reserve(&today, 500, 1_000, 0).await.expect("ok"));
        assert_eq!(days.spent(&today), 600);
        // The call cost 100 of its 600: the rest is given back, and the next one fits.
        days.adjust(&today, -500, 0).await.expect("ok");
        assert!(days.reserve(&today, 500, 1_000, 0).await.expect("ok"));
        assert!(
            days.reserve("2026-12-02", 1_000, 1_000, 0)
                .await
                .expect("ok")
        );
        assert_eq!(
            until_next_day(1_796_083_200_000 + 3_600_000),
            23 * 3_600_000
        );
    }
}
