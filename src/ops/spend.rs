//! The day's spend as `jobctl spend` prints it: each day item (the deployment's, each
//! producer's, each account's) with what its limit sees, what of it calls not charged yet hold,
//! its limit, its count by model and what its calls were charged by path. A day is counted at the levels a limit is set for
//! (`DAILY_SPEND_LIMIT`, `PRODUCER_DAILY_SPEND_LIMIT`, `TENANT_DAILY_SPEND_LIMIT`).

use std::collections::BTreeMap;

use serde_json::json;

use super::operator::dollars;
use crate::ledger::LedgerError;
use crate::ledger::spend::{DayCount, SpendBudget};

/// The day `at` falls on (UTC), as the day items name it.
pub fn day_of(at: crate::job::Millis) -> String {
    crate::ledger::spend::day_of(at)
}

/// Whether `day` names a day as the day items do (`YYYY-MM-DD`).
pub fn is_day(day: &str) -> bool {
    crate::job::message::parse_rfc3339_ms(&format!("{day}T00:00:00Z"))
        .is_some_and(|midnight| day_of(midnight) == day)
}

/// Who a day item counts for.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// The whole deployment (`DAILY_SPEND_LIMIT`).
    Deployment,
    /// One producer (`PRODUCER_DAILY_SPEND_LIMIT`); the unnamed producer's name is empty.
    Producer(String),
    /// One account, a producer's tenant (`TENANT_DAILY_SPEND_LIMIT`).
    Account(String),
}

impl Level {
    /// The level of the item keyed `item` (after `#spend#`) of `day`, if it is one of that day.
    fn of(day: &str, item: &str) -> Option<Level> {
        let rest = item.strip_prefix(day)?;
        if rest.is_empty() {
            return Some(Level::Deployment);
        }
        let rest = rest.strip_prefix('#')?;
        Some(match rest.strip_prefix("producer#") {
            Some(producer) => Level::Producer(producer.to_owned()),
            None => Level::Account(rest.to_owned()),
        })
    }

    fn kind(&self) -> &'static str {
        match self {
            Level::Deployment => "deployment",
            Level::Producer(_) => "producer",
            Level::Account(_) => "account",
        }
    }

    fn name(&self) -> &str {
        match self {
            Level::Deployment => "",
            Level::Producer(name) if name.is_empty() => "(unnamed)",
            Level::Producer(name) | Level::Account(name) => name,
        }
    }
}

/// One day item, and who it counts for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    /// Who it counts for.
    pub level: Level,
    /// What it counts.
    pub count: DayCount,
}

/// `day`'s items (`YYYY-MM-DD`, UTC): the deployment's first, then the producers' and the
/// accounts', each by name.
pub async fn day(budget: &dyn SpendBudget, day: &str) -> Result<Vec<Line>, LedgerError> {
    let mut lines: Vec<Line> = budget
        .count(day)
        .await?
        .into_iter()
        .filter_map(|count| {
            let level = Level::of(day, &count.item)?;
            Some(Line { level, count })
        })
        .collect();
    lines.sort_by(|a, b| a.level.cmp(&b.level));
    Ok(lines)
}

/// Whether `month` names a month as `YYYY-MM`.
pub fn is_month(month: &str) -> bool {
    month.len() == 7 && is_day(&format!("{month}-01"))
}

/// `month`'s items (`YYYY-MM`, UTC) summed by level over its days up to `last_day`
/// (`YYYY-MM-DD`, that day included): one day's reads a day. What is held is what each day
/// still holds; a month has no limit of its own.
pub async fn month(
    budget: &dyn SpendBudget,
    month: &str,
    last_day: &str,
) -> Result<Vec<Line>, LedgerError> {
    let mut summed: BTreeMap<Level, DayCount> = BTreeMap::new();
    let days = (1..=31)
        .map(|d| format!("{month}-{d:02}"))
        .filter(|d| is_day(d) && d.as_str() <= last_day);
    for d in days {
        for Line { level, count } in day(budget, &d).await? {
            let sum = summed.entry(level).or_default();
            sum.counted += count.counted;
            sum.held += count.held;
            sum.calls += count.calls;
            for (into, from) in [
                (&mut sum.models, count.models),
                (&mut sum.paths, count.paths),
            ] {
                for (name, micros) in from {
                    *into.entry(name).or_insert(0) += micros;
                }
            }
        }
    }
    Ok(summed
        .into_iter()
        .map(|(level, count)| Line { level, count })
        .collect())
}

/// What the rest of a day will cost at the rate it has gone: what the deployment's item
/// counts, and the jobs still queued each at what its charged calls cost on average.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Forecast {
    /// Jobs waiting in the queues (visible and in flight).
    pub queued: u64,
    /// What a charged call cost on average today, micro-dollars.
    pub per_call: u64,
    /// What the day will have cost once they ran, micro-dollars.
    pub total: u64,
    /// The deployment's daily limit, if one is set.
    pub limit: Option<u64>,
}

/// The day's forecast from its `lines` and `queued` jobs; `None` before any call was charged
/// (nothing to average) or without a deployment limit's item.
pub fn forecast(lines: &[Line], queued: u64) -> Option<Forecast> {
    let count = &lines.iter().find(|l| l.level == Level::Deployment)?.count;
    let calls = u64::try_from(count.calls).ok().filter(|c| *c > 0)?;
    // What the charged calls cost: the day's count less what it still holds for calls not
    // charged yet (a charge counts one call whether or not it names a path).
    let charged = shown(count.counted.saturating_sub(count.held));
    let per_call = charged.div_ceil(calls);
    Some(Forecast {
        queued,
        per_call,
        total: shown(count.counted).saturating_add(queued.saturating_mul(per_call)),
        limit: count.limit,
    })
}

/// Today's forecast (the day `now` falls on) with `queued` jobs waiting, in percent of the
/// deployment's daily limit: `None` without a limit or a charged call to go by.
pub async fn today_percent(
    budget: &dyn SpendBudget,
    queued: u64,
    now: crate::job::Millis,
) -> Result<Option<u64>, LedgerError> {
    let lines = day(budget, &day_of(now)).await?;
    Ok(forecast(&lines, queued).and_then(|f| {
        let limit = f.limit.filter(|l| *l > 0)?;
        Some(f.total.saturating_mul(100) / limit)
    }))
}

/// A figure as shown: a repeated charge may take a hold below zero, and nothing is shown
/// below it.
fn shown(micros: i64) -> u64 {
    u64::try_from(micros).unwrap_or(0)
}

/// `lines` of `day` as a table, each item's models under it.
pub fn text(day: &str, lines: &[Line]) -> String {
    if lines.is_empty() {
        return format!(
            "Nothing was counted on {day} (UTC): a day is counted only at the levels a limit \
             is set for (DAILY_SPEND_LIMIT, PRODUCER_DAILY_SPEND_LIMIT, \
             TENANT_DAILY_SPEND_LIMIT).\n"
        );
    }
    let mut out = format!(
        "Spend on {day} (UTC). counted: what the limit sees; held: its part reserved for calls \
         not charged yet.\n{:<12} {:<32} {:>16} {:>16} {:>16}\n",
        "level", "name", "counted", "held", "limit"
    );
    for Line { level, count } in lines {
        let limit = count.limit.map_or_else(|| "-".to_owned(), dollars);
        out.push_str(&format!(
            "{:<12} {:<32} {:>16} {:>16} {:>16}\n",
            level.kind(),
            level.name(),
            dollars(shown(count.counted)),
            dollars(shown(count.held)),
            limit
        ));
        let models = count.models.iter().map(|(name, m)| ("model", name, m));
        let paths = count.paths.iter().map(|(name, m)| ("path", name, m));
        for (kind, name, micros) in models.chain(paths) {
            out.push_str(&format!(
                "  {:<10} {:<32} {:>16}\n",
                kind,
                name,
                dollars(shown(*micros))
            ));
        }
    }
    out
}

/// `lines` of `day` as JSON, in micro-dollars.
pub fn to_json(day: &str, lines: &[Line]) -> serde_json::Value {
    let items: Vec<serde_json::Value> = lines
        .iter()
        .map(|Line { level, count }| {
            let by = |counts: &BTreeMap<String, i64>| -> BTreeMap<String, u64> {
                counts
                    .iter()
                    .map(|(name, micros)| (name.clone(), shown(*micros)))
                    .collect()
            };
            json!({
                "level": level.kind(),
                "name": level.name(),
                "counted_micros": shown(count.counted),
                "held_micros": shown(count.held),
                "limit_micros": count.limit,
                "models": by(&count.models),
                "paths": by(&count.paths),
            })
        })
        .collect();
    // A month's sums say so.
    let key = if is_month(day) { "month" } else { "day" };
    json!({key: day, "items": items})
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::spend::MemorySpend;

    #[tokio::test]
    async fn the_forecast_averages_every_charged_call_and_leaves_out_what_is_held() {
        // GIVEN a day with a limit: a call charged on a path, one charged without one (its
        // reservation, no call having reported), and a reservation still held
        let spend = MemorySpend::new();
        let day = "2026-12-05";
        for (path, cost) in [("standard", 300), ("", 100)] {
            assert!(spend.reserve(day, "m", 400, 10_000, 0).await.expect("ok"));
            spend
                .charge(day, ("m", path), 400, cost, 0)
                .await
                .expect("ok");
        }
        assert!(spend.reserve(day, "m", 5_000, 10_000, 0).await.expect("ok"));
        // WHEN today is forecast with three jobs queued
        let lines = super::day(&spend, day).await.expect("read");
        let f = forecast(&lines, 3).expect("a forecast");
        // THEN a call costs what the two charged calls cost together, halved; the held
        // reservation is in the total once, and not in the average
        assert_eq!(f.per_call, 200);
        assert_eq!(f.total, 300 + 100 + 5_000 + 3 * 200);
    }

    #[tokio::test]
    async fn a_day_is_shown_by_level_and_model_and_other_days_are_left_out() {
        let spend = MemorySpend::new();
        let day = "2026-12-05";
        for item in [
            format!("{day}#billing/acme"),
            format!("{day}#producer#billing"),
            format!("{day}#producer#"),
            day.to_owned(),
        ] {
            assert!(spend.reserve(&item, "m", 300, 1_000, 0).await.expect("ok"));
            spend
                .charge(&item, ("m", "standard"), 300, 200, 0)
                .await
                .expect("ok");
            assert!(spend.reserve(&item, "n", 50, 1_000, 0).await.expect("ok"));
        }
        assert!(spend.reserve("2026-12-04", "m", 1, 9, 0).await.expect("ok"));
        let lines = super::day(&spend, day).await.expect("read");
        let levels: Vec<_> = lines
            .iter()
            .map(|l| (l.level.kind(), l.level.name()))
            .collect();
        assert_eq!(
            levels,
            [
                ("deployment", ""),
                ("producer", "(unnamed)"),
                ("producer", "billing"),
                ("account", "billing/acme")
            ]
        );
        let acme = &lines[3].count;
        assert_eq!(
            (acme.counted, acme.held, acme.limit),
            (250, 50, Some(1_000))
        );
        assert_eq!(
            acme.models,
            BTreeMap::from([("m".into(), 200), ("n".into(), 50)])
        );
        let drawn = text(day, &lines);
        assert!(drawn.contains("billing/acme"), "{drawn}");
        assert!(drawn.contains("$0.000250"), "{drawn}");
        assert_eq!(to_json(day, &lines)["items"][3]["models"]["n"], 50);
        // What was charged, by the path its call went by: the hold of `n` is not.
        assert_eq!(acme.paths, BTreeMap::from([("standard".into(), 200)]));
        assert!(drawn.contains("path       standard"), "{drawn}");
        assert_eq!(to_json(day, &lines)["items"][3]["paths"]["standard"], 200);
        assert!(text(day, &[]).contains("DAILY_SPEND_LIMIT"));
        // The month to this day: the days summed by level, a day of another month left out.
        assert!(spend.reserve("2026-11-30", "m", 7, 9, 0).await.expect("ok"));
        let month = super::month(&spend, "2026-12", day).await.expect("read");
        assert_eq!(month.len(), 4);
        assert_eq!(month[0].count.counted, 250 + 1, "the 5th and the 4th");
        assert_eq!(month[0].count.paths["standard"], 200);
        assert!(is_month("2026-12") && !is_month("2026-13") && !is_month("2026-12-01"));
        // Four calls charged 200 each across the levels, one of them the deployment's: with
        // three jobs queued, the day will count 251 + 3 x 200.
        let lines = super::day(&spend, day).await.expect("read");
        let expected = Forecast {
            queued: 3,
            per_call: 200,
            total: 250 + 3 * 200,
            limit: Some(1_000),
        };
        assert_eq!(forecast(&lines, 3), Some(expected));
        assert_eq!(forecast(&lines[1..], 3), None, "no deployment item");
        // A charge repeated after its first try landed takes the hold below zero: shown as 0.
        let twice = format!("{day}#producer#twice");
        assert!(spend.reserve(&twice, "m", 10, 1_000, 0).await.expect("ok"));
        for _ in 0..2 {
            spend
                .charge(&twice, ("m", "standard"), 10, 20, 0)
                .await
                .expect("ok");
        }
        let lines = super::day(&spend, day).await.expect("read");
        let json = to_json(day, &lines);
        let item = &json["items"][3];
        assert_eq!(
            (item["name"].as_str(), item["held_micros"].as_u64()),
            (Some("twice"), Some(0))
        );
        assert_eq!(lines[3].count.held, -10, "kept as counted");
        assert!(text(day, &lines).contains("$0.000000"));
        assert!(is_day(day));
        assert!(!is_day("2026-12-5") && !is_day("2026-02-30") && !is_day("2026-12-05#x"));
    }
}
