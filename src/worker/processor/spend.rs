//! What a call may cost: the most the next one can (the job's own spend limit checks it), and
//! the deployment's spend per day, reserved before the claim and corrected after the call.

use super::{JobLedger, Processor};
use crate::clock::Clock;
use crate::job::{JobMessage, Millis};
use crate::provider::Provider;

/// The day's spend a call reserved before its claim: given back in full when no call is made,
/// corrected to the call's cost once it ended.
#[derive(Debug)]
pub(super) struct Reserved {
    /// The days it was reserved from: the deployment's, the tenant's, or both.
    days: Vec<String>,
    pub(super) micros: u64,
}

impl<L: JobLedger, P: Provider, C: Clock> Processor<L, P, C> {
    /// The most the next call of `msg`'s job can cost: its input and its whole answer
    /// ceiling, at the prices of the model it runs (0 when the table does not price it).
    pub(super) fn next_call_micros(&self, msg: &JobMessage, link: &super::Link<P>) -> u64 {
        let input = self.routed_input(link, msg);
        let estimate = crate::job::Usage::estimate(
            msg.input_canonical.len(),
            self.settings.policy.output_tokens(&input),
        );
        let model = link.provider.model(&input);
        self.settings
            .prices
            .cost_micros(model, &estimate, false)
            .unwrap_or(0)
    }

    /// Reserves `micros`, the most `msg`'s next call can cost, from the day's spend, when the
    /// deployment limits it, and from its tenant's day item, when tenants are limited:
    /// `Ok(None)` without a limit, `Err(wait)` when a day cannot take it (until the next day;
    /// what the other reserved is given back) or a budget cannot be read (a minute: never a
    /// call not counted).
    pub(super) async fn reserve_spend(
        &self,
        msg: &JobMessage,
        micros: u64,
    ) -> Result<Option<Reserved>, Millis> {
        let Some(spend) = &self.spend else {
            return Ok(None);
        };
        let now = self.clock.now_ms();
        let day = crate::ledger::spend::day_of(now);
        // The deployment's day, then the tenant's (`<day>#<tenant>`: a tenant never holds `#`).
        let limits = [
            self.settings
                .daily_spend_limit_micros
                .map(|l| (day.clone(), l)),
            msg.class
                .tenant
                .as_ref()
                .zip(self.settings.tenant_daily_spend_limit_micros)
                .map(|(tenant, l)| (format!("{day}#{tenant}"), l)),
        ];
        let mut reserved = Reserved {
            days: Vec::new(),
            micros,
        };
        for (day, limit) in limits.into_iter().flatten() {
            let refused = match spend.reserve(&day, micros, limit, now).await {
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
            self.settle_spend(Some(reserved), 0).await;
            return Err(refused);
        }
        Ok((!reserved.days.is_empty()).then_some(reserved))
    }

    /// Corrects the day's spend by `actual` less what `reserved` took (`actual` 0: no call).
    pub(super) async fn settle_spend(&self, reserved: Option<Reserved>, actual: u64) {
        let (Some(reserved), Some(spend)) = (reserved, &self.spend) else {
            return;
        };
        let delta = i64::try_from(actual).unwrap_or(i64::MAX)
            - i64::try_from(reserved.micros).unwrap_or(i64::MAX);
        if delta == 0 {
            return;
        }
        for day in &reserved.days {
            if let Err(e) = spend.adjust(day, delta, self.clock.now_ms()).await {
                // The day counts the reservation in full: more than was spent, never less.
                tracing::warn!(error = %e, "the day's spend could not be corrected");
            }
        }
    }
}
