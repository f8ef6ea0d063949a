//! Deferrable jobs' calls as lines of provider batches: which attempts go in one, their
//! submission through the gathering, and a look at a running batch that writes nothing.

use serde_json::{Map, Value};

use super::{Link, Processor};
use crate::clock::Clock;
use crate::job::{BatchCounts, BatchMember};
use crate::job::{JobItem, JobMessage, Millis};
use crate::ledger::JobLedger;
use crate::provider::Progress;
use crate::provider::batch::{batch_ref, is_batch_ref, parse_ref, pending_ref};
use std::time::Duration;

use crate::protocol::calling::Said;
use crate::provider::{Provider, ProviderError, ProviderRequest, Retrieval};
use crate::worker::gather::{Joined, Line, MAX_BATCH_BYTES, Until, Window};

/// The most batches one environment remembers noting.
const NOTED_KEPT: usize = 1_000;

impl<L: JobLedger, P: Provider, C: Clock> Processor<L, P, C> {
    /// Whether an attempt of the job of `input` through `link` is a line of a batch: the job is
    /// deferrable (its own `deferrable`, else `DEFERRABLE`) and the provider has batches.
    pub(super) fn batched(&self, link: &Link<P>, input: &Map<String, Value>) -> bool {
        link.provider.batches() && self.settings.batching.deferrable(input)
    }

    /// Sends `request` as the line `line` of the next batch of `link`'s provider and waits for the
    /// batch to be created, within `budget_ms`: the batch's reference, or the line's pending
    /// one when the creation went unseen (the owner records it, and whoever looks next finds
    /// the batch by listing before anything is sent again); not sent (the attempt given back);
    /// or refused for good (the attempt spent). A line whose job is lost (`lost`: ownership
    /// gone, or an operator's cancel) while it still waits leaves unsent.
    pub(super) async fn submit_line(
        &self,
        link: &Link<P>,
        (request, member): (&ProviderRequest<'_>, &BatchMember),
        line: &str,
        budget_ms: Millis,
        stop: &super::StopSignal,
    ) -> Said {
        let body = match link.provider.batch_line(request, line) {
            Ok(body) => body,
            Err(e) => return Said::Failed(e),
        };
        let Some(index) = self.links.iter().position(|l| std::ptr::eq(l, link)) else {
            return Said::NotSent("no such provider".to_owned());
        };
        let providers: Vec<&P> = self.links.iter().map(|l| &l.provider).collect();
        let window = Window {
            wait: Duration::from_millis(self.settings.batching.gather_ms as u64),
            max_lines: self.settings.batching.max_lines,
            max_bytes: MAX_BATCH_BYTES,
            lists_members: self.settings.batching.webhooks,
        };
        // The line leaves unsent a tenth of the budget (at most a second) before it, and a
        // submission taken but unanswered is left to listing a quarter of that before it: the
        // call's own bound never cuts the wait off, so nothing is left uncertain for want of
        // time.
        let spare = (budget_ms / 10).clamp(4, 1_000) as u64;
        let end = tokio::time::Instant::now() + Duration::from_millis(budget_ms.max(0) as u64);
        let until = Until {
            give_up: end - Duration::from_millis(spare),
            stop: end - Duration::from_millis(spare / 4),
            lost: stop.token().clone(),
        };
        let group = (index, link.provider.model(request.input).to_owned());
        let entry = Line {
            line: body,
            member: member.clone(),
        };
        let joined = self
            .gather
            .join(&providers, group, entry, window, until)
            .await;
        if window.lists_members {
            self.list_members().await;
        }
        match joined {
            Joined::In(batch) => Said::Started(batch_ref(&batch, line)),
            Joined::Unseen => Said::Started(pending_ref(line)),
            Joined::NotSent(why) => Said::NotSent(why),
            Joined::Refused(reason) => Said::Failed(ProviderError::Transient {
                retry_after_ms: None,
                reason,
            }),
        }
    }

    /// Whether the batch of the line `seen`'s last attempt records still runs (asked at most
    /// once in ten seconds per batch in this environment): then the record waits for the next
    /// look and nothing is written to the job. Counts the provider reported that this
    /// environment has not noted yet go on the batch's own item ([`JobLedger::note_batch`]).
    pub(super) async fn batch_runs(&self, msg: &JobMessage, seen: &JobItem) -> bool {
        let Some(attempt) = seen.attempt_log.last() else {
            return false;
        };
        let Some(reference) = attempt.provider_ref.as_deref() else {
            return false;
        };
        let link = self.link_of(seen);
        let input = self.routed_input(link, msg);
        let contract = self.contracts.for_job(&msg.contract);
        let mut request = self.request(msg, seen, &input, &contract);
        let progress = Progress::new(Duration::from_secs(1));
        request.progress = Some(progress.clone());
        let found = link
            .provider
            .retrieve(reference, attempt.started_at, &request)
            .await;
        let running = found == Retrieval::Running;
        if let (true, Some(counts), Some((Some(batch), _))) =
            (running, progress.batch_counts(), parse_ref(reference))
        {
            self.note_batch(batch, counts).await;
        }
        running
    }

    /// Lists the jobs of each batch this environment created that no owner has listed yet
    /// ([`JobLedger::note_batch_members`]), for the webhooks that say when it ends. A list
    /// that fails is only logged: its jobs' records still look at the batch, later.
    async fn list_members(&self) {
        for (batch, members) in self.gather.take_created() {
            let now = self.clock.now_ms();
            match self.ledger.note_batch_members(&batch, &members, now).await {
                Ok(()) => tracing::debug!(%batch, jobs = members.len(), "batch's jobs listed"),
                Err(e) => {
                    tracing::warn!(%batch, error = %e, "the batch's jobs were not listed: its webhook will find none")
                }
            }
        }
    }

    /// Notes `counts` of `batch` unless this environment noted them already. A note that
    /// fails is only logged: it is shown, never relied on.
    async fn note_batch(&self, batch: &str, counts: BatchCounts) {
        {
            let mut noted = self.noted.lock().unwrap_or_else(|p| p.into_inner());
            if noted.get(batch) == Some(&counts) {
                return;
            }
            // One entry a batch this environment looked at: a day's batches at most.
            if noted.len() >= NOTED_KEPT {
                noted.clear();
            }
            noted.insert(batch.to_owned(), counts);
        }
        let now = self.clock.now_ms();
        if let Err(e) = self.ledger.note_batch(batch, counts, now).await {
            tracing::debug!(%batch, error = %e, "the batch's counts were not noted");
        }
    }
}

/// Whether the job's last attempt is a line of a batch.
pub(super) fn in_batch(job: &JobItem) -> bool {
    job.last_provider_ref().is_some_and(is_batch_ref)
}
