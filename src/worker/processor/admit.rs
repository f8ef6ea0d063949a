//! What a delivery's machine knows of each provider before anything is read, and the capacity
//! it takes for the call.

use std::sync::Arc;

use super::spend::{NextModel, Reserved};
use super::{AttemptWatch, Invocation, Link, Processor};
use crate::clock::Clock;
use crate::job::{JobMessage, Millis, NewJob};
use crate::ledger::JobLedger;
use crate::protocol::admission::Facts;
use crate::protocol::delivery::Lane;
use crate::provider::Provider;
use crate::worker::pacing::{Pacer, Permit};

impl<L: JobLedger, P: Provider, C: Clock> Processor<L, P, C> {
    /// What the delivery of `msg` (its job `job`, in `inv`) knows of each provider of the list,
    /// and the model each one's next call is counted under (see [`NextModel`]).
    pub(super) fn delivery_lanes(
        &self,
        msg: &JobMessage,
        job: &NewJob,
        inv: &Invocation,
    ) -> (Vec<Lane>, Vec<NextModel>) {
        let input = (self.links.len() > 1).then(|| msg.input());
        let job_model = input
            .as_ref()
            .and_then(|i| i.get("model"))
            .and_then(serde_json::Value::as_str)
            .unwrap_or_default();
        let stops = self.stops();
        self.links
            .iter()
            .zip(&stops)
            .enumerate()
            .map(|(i, (link, stop))| {
                let (admission, model) = self.admission_facts(msg, job, inv, link);
                let lane = Lane {
                    name: stop.name.to_owned(),
                    serves: stop.serves(i, job_model),
                    admission,
                    call: self.call_facts(inv, link),
                    end: self.end_facts(inv, link),
                };
                (lane, model)
            })
            .unzip()
    }

    /// Capacity for the call of `msg` on `link`: each capped share's first (`shares`: its
    /// producer's, its account's), then the provider's, then `micros` of the day's spend (a
    /// record a pacer turns away reserves nothing; without room for the spend the permits go
    /// back unspent). Without capacity, the wait before asking again.
    pub(super) async fn take_capacity<'a>(
        &'a self,
        msg: &JobMessage,
        inv: &Invocation,
        link: &'a Link<P>,
        shares: &'a [Arc<Pacer>],
        (micros, model): (u64, &str),
        watch: &dyn AttemptWatch,
    ) -> Result<(Permit<'a>, Option<Reserved>), Millis> {
        let latest = self.latest_call_start(inv, link);
        let policy = &self.settings.policy;
        let mut held: Option<Permit<'a>> = None;
        for share in shares {
            let tokens = share.estimated_tokens(&msg.input_canonical, policy);
            let permit = share.admit(tokens, &self.clock, latest).await?;
            held = Some(match held {
                Some(before) => permit.with_share(before),
                None => permit,
            });
        }
        let pacer = link.pacer_for(msg);
        let tokens = pacer.estimated_tokens(&msg.input_canonical, policy);
        let permit = pacer.admit(tokens, &self.clock, latest).await?;
        let permit = match held {
            Some(shares) => permit.with_share(shares),
            None => permit,
        };
        match self.reserve_spend(msg, micros, model).await {
            Ok(reserved) => Ok((permit, reserved)),
            Err(wait_ms) => {
                watch.spend_deferred();
                Err(wait_ms)
            }
        }
    }

    /// What the admission machine knows of this delivery before anything is read, and the model
    /// its next call is counted under (see [`Processor::next_call_micros`]).
    fn admission_facts(
        &self,
        msg: &JobMessage,
        job: &NewJob,
        inv: &Invocation,
        link: &Link<P>,
    ) -> (Facts, NextModel) {
        let next_call = self.next_call_micros(msg, job, link);
        let facts = Facts {
            deadline_at: job.deadline_at,
            skew: self.settings.skew_ms,
            latest_call_start: self.latest_call_start(inv, link),
            can_retrieve: link.provider.can_retrieve(),
            in_ledger: msg.in_ledger,
            next_call_micros: next_call.as_ref().map_or(0, |(micros, _)| *micros),
            max_cost_micros: job.max_cost_micros,
            carries_input: msg.keeps_input(),
        };
        (facts, next_call.map(|(_, model)| model))
    }
}
