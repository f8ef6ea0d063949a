//! The deployment's spend per day, against `DAILY_SPEND_LIMIT`, `PRODUCER_DAILY_SPEND_LIMIT`
//! and `TENANT_DAILY_SPEND_LIMIT`: one item of the ledger table a day and level (`job_id`
//! `#spend#<YYYY-MM-DD>`, then `#producer#<name>` or `#<account>`, UTC), to which each call adds
//! the most it can cost before it is claimed, with a write conditional on the sum staying within
//! the limit, and from which what it did not cost is taken back once it ended. A call the day
//! cannot take waits for the next day; nothing is failed for it. Each item also says how much of
//! its count is still held for calls not charged yet, the limit it was last held to, and its
//! count by model (`jobctl spend`).

use std::collections::BTreeMap;

use futures::future::BoxFuture;

use super::LedgerError;
use crate::job::Millis;

/// The prefix of the day items' keys (job ids never start with `#`).
pub(crate) const SPEND_KEY_PREFIX: &str = "#spend#";

/// The model a call is counted under when the price table lacks it and `ALLOW_UNPRICED_MODELS`
/// costs it at 0: one name for all of them, so that what jobs name cannot grow an item.
pub const UNPRICED_MODEL: &str = "(unpriced)";

/// The day `now` falls on (UTC), as a day item names it.
pub(crate) fn day_of(now: Millis) -> String {
    crate::job::utc_day(now)
}

/// Milliseconds from `now` to the start of the next day (UTC).
pub(crate) fn until_next_day(now: Millis) -> Millis {
    const DAY_MS: Millis = 86_400_000;
    DAY_MS - now.rem_euclid(DAY_MS)
}

/// What one day item counts, in micro-dollars.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DayCount {
    /// The item's key after `#spend#`: `<day>`, `<day>#producer#<name>` or `<day>#<account>`.
    pub item: String,
    /// What its limit sees: what calls were charged, and what is held for calls not charged yet.
    pub counted: i64,
    /// Of `counted`, what was reserved for calls not charged yet: calls running, and calls
    /// whose worker stopped before it charged them (counted in full, as they may have run).
    pub held: i64,
    /// The limit its last reservation was held to.
    pub limit: Option<u64>,
    /// `counted` by model (the price table's name, or [`UNPRICED_MODEL`]).
    pub models: BTreeMap<String, i64>,
    /// What calls were charged, by the path they went by ([`crate::job::path`]): holds are
    /// not counted here until charged.
    pub paths: BTreeMap<String, i64>,
    /// How many calls were charged something (a release is not).
    pub calls: i64,
}

/// The day's spend.
pub trait SpendBudget: Send + Sync + std::fmt::Debug {
    /// Adds `micros`, the most a call of `model` can cost, to `day`'s count if the sum stays
    /// within `limit`, and holds it for that call: `true` when added, `false` when it would
    /// pass it (nothing written).
    fn reserve<'a>(
        &'a self,
        day: &'a str,
        model: &'a str,
        micros: u64,
        limit: u64,
        now: Millis,
    ) -> BoxFuture<'a, Result<bool, LedgerError>>;

    /// Charges a call of `model` that reserved `reserved` from `day` with what it cost (`cost`;
    /// 0 releases a reservation whose call was never made): the count moves by the difference
    /// and the hold is let go, and what it cost is counted under its `path` (`""`: none).
    fn charge<'a>(
        &'a self,
        day: &'a str,
        model_path: (&'a str, &'a str),
        reserved: u64,
        cost: u64,
        now: Millis,
    ) -> BoxFuture<'a, Result<(), LedgerError>>;

    /// Every item of `day` (`YYYY-MM-DD`) anything was reserved from, in key order.
    fn count<'a>(&'a self, day: &'a str) -> BoxFuture<'a, Result<Vec<DayCount>, LedgerError>>;
}

/// A count in micro-dollars as a signed sum.
fn signed(micros: u64) -> i64 {
    i64::try_from(micros).unwrap_or(i64::MAX)
}

/// Days in memory, for tests.
#[derive(Debug, Default)]
pub struct MemorySpend {
    days: std::sync::Mutex<BTreeMap<String, DayCount>>,
}

impl MemorySpend {
    /// Nothing spent.
    pub fn new() -> Self {
        Self::default()
    }

    /// What `day` (an item's key: `<day>`, `<day>#<account>`, `<day>#producer#<name>`) counts,
    /// in micro-dollars.
    pub fn spent(&self, day: &str) -> i64 {
        self.lock().get(day).map_or(0, |d| d.counted)
    }

    /// Every day item anything was reserved from or charged to (`<day>`, `<day>#<account>`,
    /// `<day>#producer#<name>`).
    pub fn items(&self) -> Vec<String> {
        self.lock().keys().cloned().collect()
    }

    /// The item `day` of `days`, counting nothing when it is new.
    fn item<'d>(days: &'d mut BTreeMap<String, DayCount>, day: &str) -> &'d mut DayCount {
        days.entry(day.to_owned()).or_insert_with(|| DayCount {
            item: day.to_owned(),
            ..DayCount::default()
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, DayCount>> {
        self.days.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl SpendBudget for MemorySpend {
    fn reserve<'a>(
        &'a self,
        day: &'a str,
        model: &'a str,
        micros: u64,
        limit: u64,
        _now: Millis,
    ) -> BoxFuture<'a, Result<bool, LedgerError>> {
        Box::pin(async move {
            let mut days = self.lock();
            let count = Self::item(&mut days, day);
            if count.counted.saturating_add(signed(micros)) > signed(limit) {
                return Ok(false);
            }
            count.counted += signed(micros);
            count.held += signed(micros);
            count.limit = Some(limit);
            *count.models.entry(model.to_owned()).or_insert(0) += signed(micros);
            Ok(true)
        })
    }

    fn charge<'a>(
        &'a self,
        day: &'a str,
        (model, path): (&'a str, &'a str),
        reserved: u64,
        cost: u64,
        _now: Millis,
    ) -> BoxFuture<'a, Result<(), LedgerError>> {
        Box::pin(async move {
            let mut days = self.lock();
            let count = Self::item(&mut days, day);
            let delta = signed(cost) - signed(reserved);
            count.counted += delta;
            count.held -= signed(reserved);
            *count.models.entry(model.to_owned()).or_insert(0) += delta;
            if cost > 0 && !path.is_empty() {
                *count.paths.entry(path.to_owned()).or_insert(0) += signed(cost);
            }
            if cost > 0 {
                count.calls += 1;
            }
            Ok(())
        })
    }

    fn count<'a>(&'a self, day: &'a str) -> BoxFuture<'a, Result<Vec<DayCount>, LedgerError>> {
        Box::pin(async move {
            Ok(self
                .lock()
                .values()
                .filter(|c| c.item.split('#').next() == Some(day))
                .cloned()
                .collect())
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
        assert!(days.reserve(&today, "m", 600, 1_000, 0).await.expect("ok"));
        assert!(!days.reserve(&today, "m", 500, 1_000, 0).await.expect("ok"));
        assert_eq!(days.spent(&today), 600);
        // The call cost 100 of its 600: the rest is given back, and the next one fits.
        days.charge(&today, ("m", "flex"), 600, 100, 0)
            .await
            .expect("ok");
        assert!(days.reserve(&today, "n", 500, 1_000, 0).await.expect("ok"));
        assert!(
            days.reserve("2026-12-02", "m", 1_000, 1_000, 0)
                .await
                .expect("ok")
        );
        let counted = days.count(&today).await.expect("ok");
        assert_eq!(counted.len(), 1);
        assert_eq!((counted[0].counted, counted[0].held), (600, 500));
        assert_eq!(counted[0].models["m"], 100);
        assert_eq!(counted[0].models["n"], 500);
        assert_eq!(
            until_next_day(1_796_083_200_000 + 3_600_000),
            23 * 3_600_000
        );
    }
}
