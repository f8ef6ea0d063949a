//! Deferrable jobs' calls as lines of provider batches: which attempts go in one, their
//! submission through the gathering, and a look at a running batch that writes nothing.

use serde_json::{Map, Value};

use super::{Link, Processor};
use crate::clock::Clock;
use crate::job::{JobMessage, JobRecord, Millis};
use crate::ledger::JobLedger;
use crate::provider::batch::{batch_ref, is_batch_ref, line_id, parse_ref, pending_ref};
use crate::provider::{Provider, ProviderError, ProviderRequest, Retrieval, Submission};
use crate::worker::gather::Window;

impl<L: JobLedger, P: Provider, C: Clock> Processor<L, P, C> {
    /// Whether an attempt of the job of `input` through `link` is a line of a batch: the job is
    /// deferrable (its own `deferrable`, else `DEFERRABLE`) and the provider has batches.
    pub(super) fn batched(&self, link: &Link<P>, input: &Map<String, Value>) -> bool {
        link.provider.batches() && self.settings.batching.deferrable(input)
    }

    /// Sends `request` as a line of the next batch of `link`'s provider and waits for the
    /// batch to be created, within `budget_ms`. A batch whose creation may have happened unseen
    /// leaves the line's pending reference: the owner records it, and whoever looks next finds
    /// the batch by listing before anything is sent again.
    pub(super) async fn submit_line(
        &self,
        link: &Link<P>,
        request: &ProviderRequest<'_>,
        budget_ms: Millis,
    ) -> Result<Submission, ProviderError> {
        let line = line_id(request.job_id, request.attempt, request.epoch);
        let body = link.provider.batch_line(request, &line)?;
        let index = self
            .links
            .iter()
            .position(|l| std::ptr::eq(l, link))
            .unwrap_or(0);
        let providers: Vec<&P> = self.links.iter().map(|l| &l.provider).collect();
        let window = Window {
            wait: std::time::Duration::from_millis(self.settings.batching.gather_ms as u64),
            max_lines: self.settings.batching.max_lines,
        };
        // A line that cannot go within its call's budget leaves unsent, a tenth of the budget
        // (at most a second) before it, so that its attempt is given back, not left uncertain.
        let spare = (budget_ms / 10).clamp(1, 1_000);
        let give_up = tokio::time::Instant::now()
            + std::time::Duration::from_millis(budget_ms.saturating_sub(spare).max(0) as u64);
        match self
            .gather
            .join(&providers, index, body, window, give_up)
            .await
        {
            Ok(batch) => Ok(Submission::Started(batch_ref(&batch, &line))),
            Err(ProviderError::Uncertain { .. }) => Ok(Submission::Started(pending_ref(&line))),
            Err(error) => Err(error),
        }
    }

    /// For a job handed over with its line in a batch whose id is recorded: whether that batch
    /// is still running (asked at most once in ten seconds per batch in this environment). If so, the
    /// record waits for the next look and nothing is written; otherwise the lapsed owner is
    /// fenced as any other and its line read.
    pub(super) async fn batch_still_running(
        &self,
        msg: &JobMessage,
        seen: &JobRecord,
    ) -> Option<Millis> {
        let attempt = seen.attempt_log.last()?;
        let reference = attempt.provider_ref.as_deref()?;
        // A pending reference needs a listing: the recovery that follows does it.
        parse_ref(reference)?.0?;
        let link = self.link_of(seen);
        let input = self.routed_input(link, msg);
        let contract = self.contracts.for_job(&msg.contract);
        let request = self.request(msg, seen, &input, &contract);
        let found = link
            .provider
            .retrieve(reference, attempt.started_at, &request)
            .await;
        if found != Retrieval::Running {
            return None;
        }
        let now = self.clock.now_ms();
        let left = seen.deadline_at - now;
        Some(
            self.settings
                .batching
                .poll_ms
                .min(left)
                .max(self.settings.skew_ms),
        )
    }
}

/// Whether the job's last attempt is a line of a batch.
pub(super) fn in_batch(job: &JobRecord) -> bool {
    job.last_provider_ref().is_some_and(is_batch_ref)
}
