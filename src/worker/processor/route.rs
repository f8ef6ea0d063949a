//! Which provider of the deployment's list takes an attempt (see [`routing`]), and the
//! fallback to the next one in the same delivery after a definite refusal.
//!
//! [`routing`]: crate::protocol::routing

use super::{AttemptWatch, Invocation, Link, Processed, Processor};
use crate::clock::Clock;
use crate::job::{JobMessage, JobRecord, JobState};
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

    /// The provider that takes the next attempt of `msg`'s job, as `view` shows it.
    pub(super) fn next_link(&self, view: Option<&JobRecord>, msg: &JobMessage) -> usize {
        if self.links.len() == 1 {
            return 0;
        }
        let input = msg.input();
        let model = input.get("model").and_then(serde_json::Value::as_str);
        routing::next(view, model.unwrap_or_default(), &self.stops())
    }

    /// The provider of `job`'s current attempt.
    pub(super) fn link_of(&self, job: &JobRecord) -> &Link<P> {
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

    /// Processes a delivery from the item already read (`start`), if any; when its attempt was
    /// refused definitely and the next provider of the list takes the job, that provider's
    /// attempt is claimed in the same delivery (once per other provider at most), under the
    /// job's same budget and deadline.
    pub(super) async fn deliver(
        &self,
        msg: &JobMessage,
        start: Option<JobRecord>,
        owner_id: &str,
        inv: &Invocation,
        watch: &dyn AttemptWatch,
    ) -> Processed {
        let mut processed = self.process_from(msg, start, owner_id, inv, watch).await;
        let mut owner = owner_id.to_owned();
        for hop in 1..self.links.len() {
            let view = processed.view.as_ref();
            let Some(view) = view.filter(|v| self.falls_back(v, msg, &owner)) else {
                break;
            };
            tracing::info!(job_id = %msg.job_id, "the provider refused before any work; the next one takes the job");
            let start = Some(view.clone());
            owner = format!("{owner_id}+{hop}");
            processed = self.process_from(msg, start, &owner, inv, watch).await;
        }
        processed
    }

    /// Whether `job`, as this delivery left it, goes on at once with another provider: its
    /// latest attempt is this delivery's own claim (`owner`), refused definitely, and the next
    /// attempt is another provider's.
    fn falls_back(&self, job: &JobRecord, msg: &JobMessage, owner: &str) -> bool {
        let stops = self.stops();
        job.state == JobState::RetryAuthorized
            && routing::latest(job).is_some_and(|a| a.owner_id == owner)
            && routing::last_refused(job)
            && self.next_link(Some(job), msg) != routing::current(job, &stops)
    }
}
