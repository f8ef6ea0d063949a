//! Which provider of the deployment's list takes an attempt (see [`routing`]), and whether the
//! provider of an attempt can be asked about it.
//!
//! [`routing`]: crate::protocol::routing

use super::{Link, Processor};
use crate::clock::Clock;
use crate::job::{JobItem, JobMessage};
use crate::ledger::JobLedger;
use crate::protocol::routing::{self, Stop};
use crate::provider::Provider;

impl<L: JobLedger, P: Provider, C: Clock> Processor<L, P, C> {
    /// What the routing knows of the providers.
    pub(super) fn stops(&self) -> Vec<Stop<'_>> {
        self.links
            .iter()
            .map(|l| Stop {
                name: l.provider.name(),
                models: &l.models,
                fixed: l.provider.fixed_model().is_some(),
            })
            .collect()
    }

    /// The provider of `job`'s current attempt.
    pub(super) fn link_of(&self, job: &JobItem) -> &Link<P> {
        &self.links[routing::current(job, &self.stops())]
    }

    /// The input `link` is sent for `msg`'s job: with its model for the job's, when it maps it.
    pub(super) fn routed_input(
        &self,
        link: &Link<P>,
        msg: &JobMessage,
    ) -> serde_json::Map<String, serde_json::Value> {
        let input = msg.input();
        routing::routed_input(&link.models, &input).unwrap_or(input)
    }

    /// Whether the provider of the job's last attempt can be asked about it (a line of a batch
    /// always can).
    pub(super) fn can_ask_about(&self, job: &JobItem) -> bool {
        job.last_provider_ref().is_some_and(|r| {
            self.link_of(job).provider.can_retrieve() || crate::provider::batch::is_batch_ref(r)
        })
    }
}
