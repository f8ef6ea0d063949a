//! One heartbeat per invocation: while records are in flight it keeps their SQS visibility
//! extended (batched, ten handles a call) and renews the ledger lease of every claimed job
//! (conditional on its epoch). The two renewals are tracked separately; a job whose lease is
//! refused or about to lapse has its local provider call cancelled.
//!
//! The record table and the watch each record's attempt reports to are [`Flights`]; the counts
//! are [`Stats`]; the rules of an extension and a renewal's answer are the protocol's
//! ([`crate::protocol::renewal`]).

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::settings::Settings;
use crate::clock::Clock;
use crate::job::Millis;
use crate::ledger::{JobLedger, RenewRequest, Write};
use crate::protocol::owner::Owner;
use crate::protocol::renewal::{
    RENEWAL_RETRIES, RenewalTicks, Renewed, after_renewal, extension_s,
};
use crate::queue::{ChangeResult, VisibilityChange, VisibilityControl};
pub use crate::report::{Renewals, StatsSnapshot};

mod flights;
mod stats;

pub use flights::{Delivered, Flights, RecordSlot};
use flights::{Flight, Stage};
pub use stats::Stats;
use stats::bump;

/// First pause before a retry of an uncertain renewal; doubled each time.
const RETRY_PAUSE_MS: Millis = 100;

/// The heartbeat of one invocation.
#[derive(Debug)]
pub struct Heartbeat<'a, L, V, C> {
    /// The invocation's records.
    pub flights: &'a Flights,
    /// Where leases are renewed.
    pub ledger: &'a L,
    /// Where visibility is extended.
    pub visibility: &'a V,
    /// The clock.
    pub clock: &'a C,
    /// Interval, extension and lease lengths.
    pub settings: &'a Settings,
}

impl<L: JobLedger, V: VisibilityControl, C: Clock> Heartbeat<'_, L, V, C> {
    /// Ticks every `settings.heartbeat_ms` until `stop` is cancelled: the visibility
    /// extensions and the lease renewals each on their own schedule, so that a stalled
    /// `ChangeMessageVisibilityBatch` never holds up a lease renewal, nor a slow ledger an
    /// extension. A tick in progress is finished first, so no extension can land after the
    /// caller's final visibility changes.
    pub async fn run(self, stop: CancellationToken) {
        let interval = self.settings.heartbeat_ms;
        if interval <= 0 {
            return;
        }
        tokio::join!(
            self.every(interval, &stop, "visibility", || async {
                bump(&self.flights.stats.heartbeat_ticks, 1);
                self.extend_visibility().await;
            }),
            self.every(interval, &stop, "lease", || self.renew_leases()),
        );
    }

    /// Runs `step` `interval` after the end of its previous run until `stop` is cancelled. A
    /// tick that starts more than half an interval late (a synchronous step held the thread,
    /// or the runtime was starved) is logged and counted: the renewals it stands for came late.
    async fn every<F, Fut>(&self, interval: Millis, stop: &CancellationToken, kind: &str, step: F)
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = ()>,
    {
        let period = Duration::from_millis(interval as u64);
        let mut due = tokio::time::Instant::now() + period;
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep_until(due) => {}
            }
            let late = tokio::time::Instant::now().saturating_duration_since(due);
            if late > period / 2 {
                bump(&self.flights.stats.heartbeat_late, 1);
                tracing::warn!(
                    kind,
                    late_ms = u64::try_from(late.as_millis()).unwrap_or(u64::MAX),
                    "heartbeat tick late: something held the thread"
                );
            }
            step().await;
            due = tokio::time::Instant::now() + period;
        }
    }

    /// One round of both renewals at once (the benchmark's unit).
    pub async fn tick(&self) {
        bump(&self.flights.stats.heartbeat_ticks, 1);
        tokio::join!(self.extend_visibility(), self.renew_leases());
    }

    async fn extend_visibility(&self) {
        let stats = &self.flights.stats;
        let mut pending: Vec<usize> = {
            let entries = self.flights.lock();
            (0..entries.len())
                .filter(|&i| {
                    let f = &entries[i];
                    f.delivery.is_some() && !f.visibility_stopped
                })
                .collect()
        };
        for attempt in 0..=RENEWAL_RETRIES {
            let now = self.clock.now_ms();
            let mut uncertain = Vec::new();
            for (arn, list) in self.extensions(&pending, now) {
                let (indices, changes): (Vec<usize>, Vec<VisibilityChange>) =
                    list.into_iter().unzip();
                let seconds: Vec<i32> = changes.iter().map(|c| c.seconds).collect();
                let results = self.visibility.change(&arn, changes).await;
                bump(&stats.visibility_calls, u64::from(results.calls));
                let mut entries = self.flights.lock();
                for ((i, secs), result) in indices.into_iter().zip(seconds).zip(results.results) {
                    match result {
                        ChangeResult::Changed => {
                            bump(&stats.visibility_renewed, 1);
                            entries[i].visible_until = now + i64::from(secs) * 1000;
                        }
                        ChangeResult::Refused => {
                            bump(&stats.visibility_refused, 1);
                            entries[i].visibility_stopped = true;
                        }
                        ChangeResult::Uncertain => uncertain.push(i),
                    }
                }
            }
            if uncertain.is_empty() {
                return;
            }
            // Retry only records whose current visibility outlasts the pause.
            let pause = RETRY_PAUSE_MS << attempt;
            let now = self.clock.now_ms();
            let retryable: Vec<usize> = {
                let entries = self.flights.lock();
                uncertain
                    .iter()
                    .copied()
                    .filter(|&i| {
                        attempt < RENEWAL_RETRIES && entries[i].visible_until > now + pause
                    })
                    .collect()
            };
            bump(
                &stats.visibility_uncertain,
                (uncertain.len() - retryable.len()) as u64,
            );
            if retryable.is_empty() {
                return;
            }
            pending = retryable;
            tokio::time::sleep(Duration::from_millis(pause as u64)).await;
        }
    }

    /// The extensions due now for the `pending` records, grouped by queue, with the seconds
    /// each record may be given.
    fn extensions(
        &self,
        pending: &[usize],
        now: Millis,
    ) -> Vec<(String, Vec<(usize, VisibilityChange)>)> {
        let mut by_queue: Vec<(String, Vec<(usize, VisibilityChange)>)> = Vec::new();
        let entries = self.flights.lock();
        for &i in pending {
            let f = &entries[i];
            let Some(seconds) = self.extension_s(f, now) else {
                continue;
            };
            let Some((arn, handle)) = &f.delivery else {
                continue;
            };
            let change = VisibilityChange {
                receipt_handle: handle.clone(),
                seconds,
            };
            match by_queue.iter_mut().find(|(a, _)| a == arn) {
                Some((_, list)) => list.push((i, change)),
                None => by_queue.push((arn.clone(), vec![(i, change)])),
            }
        }
        by_queue
    }

    /// Seconds to request for a record now, or `None` when it must not be extended: never past
    /// 12 hours from this receive, never past a running job's deadline, and never when it would
    /// not reach past what the record already has. A record not yet started (its body still
    /// being read, or waiting for the memory budget), or already decided (its final visibility
    /// is set when the batch ends), is held until then like the others, so no other consumer
    /// receives it while this invocation still holds it.
    fn extension_s(&self, f: &Flight, now: Millis) -> Option<i32> {
        let deadline_at = match &f.stage {
            Stage::Running(lease) => Some(lease.deadline_at),
            Stage::Pending | Stage::Acknowledging | Stage::Done => None,
        };
        extension_s(
            now,
            self.settings.queue_visibility_s,
            f.visibility_cap,
            f.visible_until,
            deadline_at,
        )
    }

    async fn renew_leases(&self) {
        // A lease that still holds past three more ticks (and the skew margin) is left for a
        // later tick: it would survive two renewals in a row going wrong meanwhile. A call
        // claimed just before a tick costs no renewal then.
        let now = self.clock.now_ms();
        let s = self.settings;
        let ample = now.saturating_add(3 * s.heartbeat_ms + s.skew_ms);
        let leases: Vec<(usize, String, u64)> = {
            let entries = self.flights.lock();
            entries
                .iter()
                .enumerate()
                .filter_map(|(i, f)| match &f.stage {
                    // A streamed call that shows no progress is hung: a healthy heartbeat must
                    // not keep its lease, so another owner may recover the job; once the lease
                    // is about to lapse, the call is cancelled here too (its provider should
                    // have cancelled it already).
                    Stage::Running(l) if l.progress.as_ref().is_some_and(|p| p.stalled()) => {
                        tracing::warn!(job_id = %l.job_id, epoch = l.epoch, "the call shows no progress; its lease is not renewed");
                        if l.lease_until - s.skew_ms <= now + s.heartbeat_ms
                            && l.stop.why().is_none()
                        {
                            l.stop.lose();
                            bump(&self.flights.stats.ownership_lost, 1);
                        }
                        None
                    }
                    Stage::Running(l) if l.stop.why().is_none() && l.lease_until <= ample => {
                        Some((i, l.job_id.clone(), l.epoch))
                    }
                    _ => None,
                })
                .collect()
        };
        let renewals = leases
            .into_iter()
            .map(|(index, job_id, epoch)| self.renew_one(index, job_id, epoch));
        futures::future::join_all(renewals).await;
    }

    async fn renew_one(&self, index: usize, job_id: String, epoch: u64) {
        let skew = self.settings.skew_ms;
        for attempt in 0..=RENEWAL_RETRIES {
            let now = self.clock.now_ms();
            let Some(expected) = self.flights.lease_until(index) else {
                return; // the call ended meanwhile
            };
            let owner = Owner::at(&job_id, epoch);
            let req = RenewRequest {
                progress: self.flights.said(index, epoch),
                ..owner.renew(Some(expected), now, now + self.settings.lease_ms)
            };
            let result = self.ledger.renew(req).await;
            let answer = result.as_ref().ok();
            // The call ended while the renewal was on its way: a refusal is our own final
            // write, not a lost lease, and a failure no longer matters.
            let Some(lease_until) = self.flights.lease_until(index) else {
                return;
            };
            let ticks = RenewalTicks {
                now: self.clock.now_ms(),
                skew_ms: skew,
                heartbeat_ms: self.settings.heartbeat_ms,
                first_pause_ms: RETRY_PAUSE_MS,
            };
            match after_renewal(answer, epoch, attempt, lease_until, ticks) {
                Renewed::Extended { until } => {
                    self.flights.set_lease(index, until, true);
                    return;
                }
                Renewed::Adopted { until } => self.flights.set_lease(index, until, false),
                Renewed::Lost => {
                    self.flights.count_renewal(index, |r| r.refused += 1);
                    let current_epoch = match answer {
                        Some(Write::Refused(seen)) => seen.as_ref().map(|s| s.owner_epoch),
                        _ => None,
                    };
                    tracing::warn!(
                        job_id = %job_id,
                        epoch,
                        current_epoch,
                        "lease renewal refused: ownership lost, cancelling the call"
                    );
                    self.cancel(index);
                    return;
                }
                Renewed::Withdrawn => {
                    tracing::info!(job_id = %job_id, epoch, "cancel requested: stopping the call");
                    self.withdraw(index);
                    return;
                }
                Renewed::Retry { pause_ms } => {
                    tokio::time::sleep(Duration::from_millis(pause_ms as u64)).await;
                }
                Renewed::Uncertain { cancel } => {
                    self.flights.count_renewal(index, |r| r.uncertain += 1);
                    let error = result.err().map(|e| e.to_string());
                    tracing::warn!(job_id = %job_id, epoch, error, "lease renewal uncertain");
                    if cancel {
                        self.cancel(index);
                    }
                    return;
                }
            }
        }
    }

    /// An operator's cancel: the call is stopped as for a lost lease, saying why, so that the
    /// owner ends the attempt `cancelled` instead of walking away.
    fn withdraw(&self, index: usize) {
        if let Some(Flight {
            stage: Stage::Running(lease),
            ..
        }) = self.flights.lock().get(index)
        {
            lease.stop.withdraw();
        }
    }

    fn cancel(&self, index: usize) {
        if let Some(Flight {
            stage: Stage::Running(lease),
            ..
        }) = self.flights.lock().get(index)
            && lease.stop.why().is_none()
        {
            lease.stop.lose();
            bump(&self.flights.stats.ownership_lost, 1);
        }
    }
}

#[cfg(test)]
mod tests;
