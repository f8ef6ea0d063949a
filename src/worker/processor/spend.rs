//! What a call may cost: the most the next one can (the job's own spend limit checks it), and
//! the deployment's spend per day, reserved before the claim and corrected after the call.

use std::sync::Arc;

use super::{JobLedger, Processor};
use crate::clock::Clock;
use crate::job::account::account;
use crate::job::{JobMessage, Millis, NewJob};
use crate::ledger::spend::{SpendBudget, UNPRICED_MODEL};
use crate::provider::Provider;
use crate::worker::pacing::Permit;

/// How long a record whose call cannot be priced waits before it is looked at again: long
/// enough not to churn the queue, short enough that a price added in a deploy is soon used.
const UNPRICED_WAIT_MS: Millis = 15 * 60_000;

/// The model a provider's next call is counted under in the day's spend (`Ok(None)`: no
/// spend limit counts it), or `Err(model)`: a limit counts it and the price table lacks its
/// model, so no call is made.
pub(super) type NextModel = Result<Option<String>, String>;

/// The day's spend a call reserved before its claim: released in full when no call is made,
/// corrected to the call's cost once it ended.
#[derive(Debug)]
pub(super) struct Reserved {
    /// The day items it was reserved from (the deployment's, the producer's, the account's).
    days: Vec<String>,
    /// The model the call is counted under.
    model: String,
    pub(super) micros: u64,
}

/// What a delivery took for its call: the pacer's permit and what the day's spend reserved.
/// Released when no call is made, charged once the call's attempt ended (both by the
/// executor, which waits for the spend's write). Dropped before either (a delivery cut short),
/// it releases itself unless its call went: the permit at once, the spend by a task of its
/// own; a call that went keeps its reservation, as it may have run.
pub(super) struct Grant<'a> {
    permit: Permit<'a>,
    reserved: Option<Reserved>,
    spend: Option<Arc<dyn SpendBudget>>,
    /// When it was taken: a correction made on its drop is dated so.
    at: Millis,
    /// The claim holds and the call goes under it.
    used: bool,
}

impl<'a> Grant<'a> {
    pub(super) fn new(
        permit: Permit<'a>,
        reserved: Option<Reserved>,
        spend: Option<Arc<dyn SpendBudget>>,
        at: Millis,
    ) -> Grant<'a> {
        Grant {
            permit,
            reserved,
            spend,
            at,
            used: false,
        }
    }

    /// The claim holds: the call goes under this grant, and its capacity is used.
    pub(super) fn use_for_call(&mut self) {
        self.permit.spend();
        self.used = true;
    }

    /// What the day's spend reserved, taken out to be released or charged.
    pub(super) fn take_reserved(&mut self) -> Option<Reserved> {
        self.reserved.take()
    }
}

impl Drop for Grant<'_> {
    fn drop(&mut self) {
        let (Some(reserved), Some(spend)) = (self.reserved.take(), self.spend.clone()) else {
            return;
        };
        if self.used || reserved.micros == 0 {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let at = self.at;
        runtime.spawn(async move {
            for day in &reserved.days {
                let released = spend.charge(day, (&reserved.model, ""), reserved.micros, 0, at);
                if let Err(e) = released.await {
                    tracing::warn!(error = %e, "the day's spend could not be released");
                }
            }
        });
    }
}

impl<L: JobLedger, P: Provider, C: Clock> Processor<L, P, C> {
    /// The most the next call of `msg`'s job can cost, when a spend limit counts it (the job's
    /// `max_cost`, a day's: the deployment's, the producer's, the account's): its input and its
    /// whole answer ceiling, at the prices of the model it runs at the service tier it asks
    /// for; 0 when no limit counts it, so that a deployment with none never parses the input.
    /// `Err(model)`: a limit counts the call and the price table lacks its model (or that tier
    /// of it), which only `ALLOW_UNPRICED_MODELS` lets through (costed at 0): no limit can hold
    /// a call it cannot price. With it, the model a day's spend counts the call under.
    pub(super) fn next_call_micros(
        &self,
        msg: &JobMessage,
        job: &NewJob,
        link: &super::Link<P>,
    ) -> Result<(u64, Option<String>), String> {
        let s = &self.settings;
        let day_limit = s.daily_spend_limit_micros.is_some()
            || s.producer_daily_spend_limit_micros.is_some()
            || s.tenant_daily_spend_limit_micros.is_some();
        if job.max_cost_micros.is_none() && !day_limit {
            return Ok((0, None));
        }
        let input = self.routed_input(link, msg);
        let estimate =
            crate::job::Usage::estimate(msg.input_canonical.len(), s.policy.output_tokens(&input));
        let model = link.provider.model(&input);
        let rate = crate::job::prices::Rate::of(false, &input);
        match s.prices.cost_at(model, &estimate, rate) {
            Some(micros) => Ok((micros, Some(model.to_owned()))),
            None if s.allow_unpriced_models => Ok((0, Some(UNPRICED_MODEL.to_owned()))),
            None => Err(model.to_owned()),
        }
    }

    /// The models this deployment's calls may run that the price table lacks, each once: each
    /// provider's own model, else what the jobs may name (`ALLOWED_MODELS`) as its map has
    /// them, and its map's models; and whether jobs may name any model (`ALLOWED_MODELS=*`
    /// with a provider that runs the model named), among which some may lack a price too.
    pub fn unpriced_models(&self) -> (Vec<String>, bool) {
        use crate::job::policy::Models;
        let mut models: Vec<&str> = Vec::new();
        let mut open = false;
        for link in &self.links {
            if let Some(fixed) = link.provider.fixed_model() {
                models.push(fixed);
                continue;
            }
            match &self.settings.policy.models {
                Models::Only(named) => models.extend(
                    named
                        .iter()
                        .map(|m| link.models.get(m).unwrap_or(m.as_str())),
                ),
                Models::Any => {
                    models.extend(link.models.targets());
                    open |= !link.models.maps_all();
                }
            }
        }
        let prices = &self.settings.prices;
        let mut unpriced: Vec<String> = models
            .into_iter()
            .filter(|m| prices.price(m).is_none())
            .map(str::to_owned)
            .collect();
        unpriced.sort();
        unpriced.dedup();
        (unpriced, open)
    }

    /// The wait of a record whose next call of `model` no spend limit can count: none is made,
    /// and the record comes back for a price (or its deadline), said and counted each time.
    pub(super) fn unpriced_wait(
        &self,
        msg: &JobMessage,
        model: &str,
        watch: &dyn super::AttemptWatch,
    ) -> Millis {
        tracing::error!(job_id = %msg.job_id, model = %model,
            "the model has no price (at its service tier) and a spend limit applies: no call is \
             made (PRICES_FILE, or ALLOW_UNPRICED_MODELS=true)");
        watch.spend_deferred();
        UNPRICED_WAIT_MS
    }

    /// Reserves `micros`, the most `msg`'s next call (of `model`) can cost, from each day item
    /// that limits it ([`day_items`]: the deployment's, its producer's, its account's):
    /// `Ok(None)` without a limit, `Err(wait)` when a day cannot take it (until the next day;
    /// what the other reserved is given back) or a budget cannot be read (a minute: never a
    /// call not counted).
    pub(super) async fn reserve_spend(
        &self,
        msg: &JobMessage,
        micros: u64,
        model: &str,
    ) -> Result<Option<Reserved>, Millis> {
        let Some(spend) = &self.spend else {
            return Ok(None);
        };
        let now = self.clock.now_ms();
        let day = crate::ledger::spend::day_of(now);
        let limits = day_items(&self.settings, &day, msg);
        let mut reserved = Reserved {
            days: Vec::new(),
            model: model.to_owned(),
            micros,
        };
        for (day, limit) in limits.into_iter().flatten() {
            let refused = match spend.reserve(&day, model, micros, limit, now).await {
                Ok(true) => {
                    reserved.days.push(day);
                    continue;
                }
                Ok(false) => {
                    tracing::warn!(job_id = %msg.job_id, day = %day, "the day's spend limit is reached; the record waits for the next day");
                    crate::ledger::spend::until_next_day(now)
                }
                Err(e) => {
                    tracing::warn!(job_id = %msg.job_id, error = %e, "the day's spend could not be read");
                    60_000
                }
            };
            // No call: what was reserved goes back.
            self.charge_spend(Some(reserved), 0, None).await;
            return Err(refused);
        }
        Ok((!reserved.days.is_empty()).then_some(reserved))
    }

    /// Charges what `reserved` took with `actual` (0: no call; the reservation is released),
    /// counted under the path the call went by (`path`).
    pub(super) async fn charge_spend(
        &self,
        reserved: Option<Reserved>,
        actual: u64,
        path: Option<crate::job::usage::Rate>,
    ) {
        let (Some(reserved), Some(spend)) = (reserved, &self.spend) else {
            return;
        };
        if reserved.micros == 0 && actual == 0 {
            return;
        }
        for day in &reserved.days {
            let now = self.clock.now_ms();
            let path = path.map_or("", crate::job::path::name);
            let charged = spend.charge(day, (&reserved.model, path), reserved.micros, actual, now);
            if let Err(e) = charged.await {
                // The day counts the reservation in full: more than was spent, never less.
                tracing::warn!(error = %e, "the day's spend could not be corrected");
            }
        }
    }
}

/// The day items `msg`'s calls are counted in, each with its limit, in the order they are
/// reserved from: the deployment's (`<day>`), its producer's (`<day>#producer#<name>`, the
/// unnamed producer's name empty) and its account's (`<day>#<producer>/<tenant>`, see
/// [`account`]). Neither a producer's name nor an account holds `#`, so no two meet.
fn day_items(
    s: &crate::worker::Settings,
    day: &str,
    msg: &JobMessage,
) -> [Option<(String, u64)>; 3] {
    let producer = crate::job::scope::producer_of(&msg.job_id).unwrap_or("");
    let account = account(&msg.job_id, msg.class.tenant.as_deref());
    [
        s.daily_spend_limit_micros.map(|l| (day.to_owned(), l)),
        s.producer_daily_spend_limit_micros
            .map(|l| (format!("{day}#producer#{producer}"), l)),
        s.tenant_daily_spend_limit_micros
            .map(|l| (format!("{day}#{account}"), l)),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::ledger::spend::MemorySpend;
    use crate::worker::pacing::{Pacer, PacingSettings};

    const T: Millis = 1_800_000_000_000;

    /// A grant of 100 micro-dollars of `day` on `pacer`, reserved from `spend`.
    async fn grant<'a>(pacer: &'a Pacer, spend: &Arc<MemorySpend>, day: &str) -> Grant<'a> {
        let permit = pacer.admit(0, &ManualClock::at(T), Millis::MAX).await;
        assert!(
            spend
                .reserve(day, "m", 100, 1_000, T)
                .await
                .expect("reserved")
        );
        let reserved = Reserved {
            days: vec![day.to_owned()],
            model: "m".to_owned(),
            micros: 100,
        };
        let budget: Arc<dyn SpendBudget> = spend.clone();
        Grant::new(permit.expect("room"), Some(reserved), Some(budget), T)
    }

    #[tokio::test]
    async fn a_grant_dropped_before_its_call_gives_itself_back_and_one_whose_call_went_keeps_its_spend()
     {
        let one = PacingSettings {
            max_in_flight: 1,
            ..PacingSettings::default()
        };
        let pacer = Pacer::new(one, None);
        let spend = Arc::new(MemorySpend::new());
        // A delivery cut short before its claim: the spend and the permit come back.
        drop(grant(&pacer, &spend, "d1").await);
        tokio::task::yield_now().await;
        assert_eq!(spend.spent("d1"), 0);
        // One cut short once its call went (the pacer lets one call in flight: the first
        // grant's came back): the call may have run, and its spend stays.
        let mut used = grant(&pacer, &spend, "d2").await;
        used.use_for_call();
        drop(used);
        tokio::task::yield_now().await;
        assert_eq!(spend.spent("d2"), 100);
    }
}
