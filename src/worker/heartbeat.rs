//! One heartbeat per invocation: while records are in flight it keeps their SQS visibility
//! extended (batched, ten handles a call) and renews the ledger lease of every claimed job
//! (conditional on its epoch). The two renewals are tracked separately; a job whose lease is
//! refused or about to lapse has its local provider call cancelled.
//!
//! Why this file is long: the record table (`Flights`), the watch each record's attempt reports
//! to, and the two renewal loops share one lock and one set of counts; apart, each part would
//! reach into the others' state.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::processor::AttemptWatch;
use super::settings::Settings;
use crate::clock::Clock;
use crate::job::outcome::receive_cap;
use crate::job::{JobState, Millis};
use crate::ledger::{JobLedger, RenewRequest, Write};
use crate::queue::{ChangeResult, VisibilityChange, VisibilityControl};
pub use crate::report::{Renewals, StatsSnapshot};

/// Retries of an uncertain renewal within one tick, while the remaining validity allows them.
const RENEWAL_RETRIES: u32 = 2;
/// First pause before such a retry; doubled each time.
const RETRY_PAUSE_MS: Millis = 100;

/// Per-invocation counts, logged with the batch and returned in its report.
#[derive(Debug, Default)]
pub struct Stats {
    heartbeat_ticks: AtomicU64,
    heartbeat_late: AtomicU64,
    visibility_calls: AtomicU64,
    visibility_renewed: AtomicU64,
    visibility_refused: AtomicU64,
    visibility_uncertain: AtomicU64,
    ownership_lost: AtomicU64,
    deadline_cutoffs: AtomicU64,
    recoveries: AtomicU64,
    provider_throttled: AtomicU64,
    spend_deferred: AtomicU64,
    uncontracted: AtomicU64,
    batch_lines: AtomicU64,
    batch_waits: AtomicU64,
    usage: std::sync::Mutex<std::collections::BTreeMap<String, crate::job::Usage>>,
    latencies: std::sync::Mutex<Vec<u64>>,
}

/// Provider latencies kept per invocation (the most one metric document takes).
pub(crate) const MAX_LATENCY_SAMPLES: usize = 100;

impl Stats {
    /// Counts a cut-off by the Lambda deadline.
    pub fn deadline_cutoff(&self) {
        self.deadline_cutoffs.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a provider call refused for its rate limit or quota.
    pub fn throttled(&self) {
        self.provider_throttled.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a record that waits for the next day's spend.
    pub fn spend_deferred(&self) {
        self.spend_deferred.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a new job naming a contract the lenient registry does not hold.
    pub fn uncontracted(&self) {
        self.uncontracted.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a line submitted in a provider batch.
    pub fn batch_line(&self) {
        self.batch_lines.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a record that looked at its running batch and waits, nothing written.
    pub fn batch_wait(&self) {
        self.batch_waits.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a recovery claim.
    pub fn recovery(&self) {
        self.recoveries.fetch_add(1, Ordering::Relaxed);
    }

    /// Records how long one provider call took (from its start to its answer or failure); the
    /// first [`MAX_LATENCY_SAMPLES`] of an invocation are kept.
    pub fn provider_latency(&self, ms: u64) {
        let mut samples = self.latencies.lock().unwrap_or_else(|p| p.into_inner());
        if samples.len() < MAX_LATENCY_SAMPLES {
            samples.push(ms);
        }
    }

    /// Adds what an ended attempt of `model` used to that model's sum.
    pub fn used(&self, model: &str, usage: &crate::job::Usage) {
        let mut sums = self.usage.lock().unwrap_or_else(|p| p.into_inner());
        let sum = sums.entry(model.to_owned()).or_default();
        *sum = sum.plus(usage);
    }

    /// What the attempts ended so far used, by model.
    pub(crate) fn usage_by_model(&self) -> Vec<(String, crate::job::Usage)> {
        let sums = self.usage.lock().unwrap_or_else(|p| p.into_inner());
        sums.iter().map(|(m, u)| (m.clone(), *u)).collect()
    }

    /// The provider latencies recorded so far, in milliseconds.
    pub(crate) fn latencies(&self) -> Vec<u64> {
        self.latencies
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The counts so far, without the lease renewals (they are kept per record: see
    /// [`Flights::snapshot`]).
    fn counts(&self) -> StatsSnapshot {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        StatsSnapshot {
            heartbeat_ticks: get(&self.heartbeat_ticks),
            heartbeat_late: get(&self.heartbeat_late),
            visibility_calls: get(&self.visibility_calls),
            visibility_renewed: get(&self.visibility_renewed),
            visibility_refused: get(&self.visibility_refused),
            visibility_uncertain: get(&self.visibility_uncertain),
            ownership_lost: get(&self.ownership_lost),
            deadline_cutoffs: get(&self.deadline_cutoffs),
            recoveries: get(&self.recoveries),
            provider_throttled: get(&self.provider_throttled),
            spend_deferred: get(&self.spend_deferred),
            uncontracted: get(&self.uncontracted),
            batch_lines: get(&self.batch_lines),
            batch_waits: get(&self.batch_waits),
            ..StatsSnapshot::default()
        }
    }
}

fn bump(counter: &AtomicU64, by: u64) {
    counter.fetch_add(by, Ordering::Relaxed);
}

/// One record of the batch, as the heartbeat sees it.
#[derive(Debug)]
struct Flight {
    /// Where and how to extend its visibility (absent: it cannot be extended).
    delivery: Option<(String, String)>,
    /// No visibility may be requested past this instant (12 hours from this receive, less a
    /// margin).
    visibility_cap: Millis,
    /// When the record becomes visible unless extended (an estimate, kept conservative).
    visible_until: Millis,
    /// SQS refused an extension: the delivery is over, stop extending.
    visibility_stopped: bool,
    stage: Stage,
    renewals: Renewals,
}

#[derive(Debug)]
enum Stage {
    /// Received, not yet decided.
    Pending,
    /// Claimed: a provider call runs under this lease.
    Running(Lease),
    /// Decided: nothing more to extend.
    Done,
    /// Succeeded: kept invisible until the invocation returns and Lambda deletes it, so a long
    /// batch does not hand it to another receiver in the meantime.
    Acknowledging,
}

#[derive(Debug)]
struct Lease {
    job_id: String,
    epoch: u64,
    lease_until: Millis,
    deadline_at: Millis,
    cancel: CancellationToken,
    /// The token was cancelled because an operator cancelled the job, not because ownership
    /// was lost.
    withdrawn: bool,
    /// The progress rule of a streamed call: its lease is renewed only while it holds.
    progress: Option<crate::provider::Progress>,
}

/// The records of one invocation and their renewal state, shared by the processor (which
/// registers claims) and the heartbeat (which renews them).
#[derive(Debug, Default)]
pub struct Flights {
    // A std mutex: held only to copy or update entries, never across an await.
    entries: Mutex<Vec<Flight>>,
    /// The invocation's counts.
    pub stats: Stats,
}

/// A record as the batch delivers it to the heartbeat.
#[derive(Debug, Clone, Default)]
pub struct Delivered {
    /// `eventSourceARN`.
    pub queue_arn: Option<String>,
    /// The receipt handle of this delivery.
    pub receipt_handle: Option<String>,
    /// The earliest moment this receive can have happened (see
    /// [`crate::job::outcome::receive_floor`]), Unix ms.
    pub received_at: Millis,
}

impl Flights {
    /// Flights for a batch from a queue whose visibility timeout is `queue_visibility_s`.
    pub fn new(records: Vec<Delivered>, queue_visibility_s: i64) -> Self {
        let entries = records
            .into_iter()
            .map(|d| {
                // Saturating: the times come from the event, whatever it holds. Both err early.
                let visibility_cap = receive_cap(d.received_at);
                let visible_until = d.received_at.saturating_add(queue_visibility_s * 1000);
                Flight {
                    delivery: d.queue_arn.zip(d.receipt_handle),
                    visibility_cap,
                    visible_until,
                    visibility_stopped: false,
                    stage: Stage::Pending,
                    renewals: Renewals::default(),
                }
            })
            .collect();
        Flights {
            entries: Mutex::new(entries),
            stats: Stats::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Flight>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers the claim of record `index`; the returned token is cancelled if ownership is
    /// lost. An index outside the batch gets a token nobody cancels.
    pub fn running(
        &self,
        index: usize,
        job_id: &str,
        epoch: u64,
        lease_until: Millis,
        deadline_at: Millis,
    ) -> CancellationToken {
        let cancel = CancellationToken::new();
        if let Some(flight) = self.lock().get_mut(index) {
            flight.stage = Stage::Running(Lease {
                job_id: job_id.to_owned(),
                epoch,
                lease_until,
                deadline_at,
                cancel: cancel.clone(),
                withdrawn: false,
                progress: None,
            });
        }
        cancel
    }

    /// The running call of record `index` streams under the progress rule `progress`.
    pub fn progress(&self, index: usize, progress: &crate::provider::Progress) {
        if let Some(Flight {
            stage: Stage::Running(lease),
            ..
        }) = self.lock().get_mut(index)
        {
            lease.progress = Some(progress.clone());
        }
    }

    /// Whether the running call of record `index` was stopped by an operator's cancel.
    pub fn withdrawn(&self, index: usize) -> bool {
        matches!(
            self.lock().get(index).map(|f| &f.stage),
            Some(Stage::Running(lease)) if lease.withdrawn
        )
    }

    /// The provider call of record `index` ended: its lease is no longer renewed, its
    /// visibility still is until the record is decided.
    pub fn call_ended(&self, index: usize) {
        if let Some(flight) = self.lock().get_mut(index)
            && matches!(flight.stage, Stage::Running(_))
        {
            flight.stage = Stage::Pending;
        }
    }

    /// The invocation's counts so far, lease renewals summed over its records.
    pub fn snapshot(&self) -> StatsSnapshot {
        let mut snapshot = self.stats.counts();
        for flight in self.lock().iter() {
            snapshot.lease_renewed += u64::from(flight.renewals.renewed);
            snapshot.lease_refused += u64::from(flight.renewals.refused);
            snapshot.lease_uncertain += u64::from(flight.renewals.uncertain);
        }
        snapshot
    }

    /// The lease renewals of record `index` so far.
    pub fn renewals(&self, index: usize) -> Renewals {
        self.lock()
            .get(index)
            .map(|f| f.renewals)
            .unwrap_or_default()
    }

    fn count_renewal(&self, index: usize, count: impl FnOnce(&mut Renewals)) {
        if let Some(flight) = self.lock().get_mut(index) {
            count(&mut flight.renewals);
        }
    }

    /// Record `index` is decided: no more lease renewals for it, and no more visibility
    /// extensions unless it `succeeded` (then it stays invisible until the batch returns).
    pub fn done(&self, index: usize, succeeded: bool) {
        if let Some(flight) = self.lock().get_mut(index) {
            flight.stage = if succeeded {
                Stage::Acknowledging
            } else {
                Stage::Done
            };
        }
    }

    /// When record `index` becomes visible as it stands, at the earliest, or `None` when it
    /// must be left alone (SQS refused an extension: its delivery is over).
    pub(crate) fn visible_until(&self, index: usize) -> Option<Millis> {
        self.lock()
            .get(index)
            .filter(|f| !f.visibility_stopped)
            .map(|f| f.visible_until)
    }

    /// The current lease end of record `index`, if it is running.
    pub fn lease_until(&self, index: usize) -> Option<Millis> {
        match self.lock().get(index).map(|f| &f.stage) {
            Some(Stage::Running(lease)) => Some(lease.lease_until),
            _ => None,
        }
    }

    /// The lease of record `index`'s running call now holds until `until`; `renewed`: by a
    /// renewal of this heartbeat (counted).
    fn set_lease(&self, index: usize, until: Millis, renewed: bool) {
        if let Some(Flight {
            stage: Stage::Running(lease),
            renewals,
            ..
        }) = self.lock().get_mut(index)
        {
            lease.lease_until = until;
            renewals.renewed += u32::from(renewed);
        }
    }
}

/// One record of the batch, as the processor sees it: the [`AttemptWatch`] of its attempt.
#[derive(Debug, Clone, Copy)]
pub struct RecordSlot<'a> {
    flights: &'a Flights,
    index: usize,
}

impl Flights {
    /// The watch of record `index`.
    pub fn slot(&self, index: usize) -> RecordSlot<'_> {
        RecordSlot {
            flights: self,
            index,
        }
    }
}

impl AttemptWatch for RecordSlot<'_> {
    fn running(
        &self,
        job_id: &str,
        epoch: u64,
        lease_until: Millis,
        deadline_at: Millis,
    ) -> CancellationToken {
        self.flights
            .running(self.index, job_id, epoch, lease_until, deadline_at)
    }

    fn progress(&self, progress: &crate::provider::Progress) {
        self.flights.progress(self.index, progress);
    }

    fn call_ended(&self) {
        self.flights.call_ended(self.index);
    }

    fn withdrawn(&self) -> bool {
        self.flights.withdrawn(self.index)
    }

    fn recovered(&self) {
        self.flights.stats.recovery();
    }

    fn deadline_cutoff(&self) {
        self.flights.stats.deadline_cutoff();
    }

    fn provider_latency(&self, ms: u64) {
        self.flights.stats.provider_latency(ms);
    }

    fn throttled(&self) {
        self.flights.stats.throttled();
    }

    fn spend_deferred(&self) {
        self.flights.stats.spend_deferred();
    }

    fn uncontracted(&self) {
        self.flights.stats.uncontracted();
    }

    fn batched(&self) {
        self.flights.stats.batch_line();
    }

    fn batch_waiting(&self) {
        self.flights.stats.batch_wait();
    }

    fn used(&self, model: &str, usage: &crate::job::Usage) {
        self.flights.stats.used(model, usage);
    }
}

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
                            && !l.cancel.is_cancelled()
                        {
                            l.cancel.cancel();
                            bump(&self.flights.stats.ownership_lost, 1);
                        }
                        None
                    }
                    Stage::Running(l) if !l.cancel.is_cancelled() && l.lease_until <= ample => {
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
            let req = RenewRequest {
                job_id: job_id.clone(),
                epoch,
                expected_until: Some(expected),
                now,
                lease_until: now + self.settings.lease_ms,
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

    /// An operator's cancel: the call's token is cancelled as for a lost lease, the flight
    /// marked first so that the owner ends the attempt `cancelled` instead of walking away.
    fn withdraw(&self, index: usize) {
        if let Some(Flight {
            stage: Stage::Running(lease),
            ..
        }) = self.flights.lock().get_mut(index)
        {
            lease.withdrawn = true;
            lease.cancel.cancel();
        }
    }

    fn cancel(&self, index: usize) {
        if let Some(Flight {
            stage: Stage::Running(lease),
            ..
        }) = self.flights.lock().get(index)
            && !lease.cancel.is_cancelled()
        {
            lease.cancel.cancel();
            bump(&self.flights.stats.ownership_lost, 1);
        }
    }
}

/// The clocks a renewal's answer is read against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RenewalTicks {
    /// The worker's clock when the answer came.
    pub now: Millis,
    /// The clock-skew margin.
    pub skew_ms: Millis,
    /// The heartbeat's interval: the next renewal comes this much later.
    pub heartbeat_ms: Millis,
    /// The pause before the first retry of a failed renewal; doubled for each one after.
    pub first_pause_ms: Millis,
}

/// The seconds a heartbeat asks for a record at `now`: its visibility extended to the queue's
/// visibility timeout from now, but never past `cap` (12 hours from its receive, less the
/// margin: [`receive_cap`]) nor the `deadline_at` of the job whose call it carries, and only
/// when that reaches past `visible_until`, what the record already has. `None`: no change.
pub fn extension_s(
    now: Millis,
    queue_visibility_s: i64,
    cap: Millis,
    visible_until: Millis,
    deadline_at: Option<Millis>,
) -> Option<i32> {
    let until = now
        .saturating_add(queue_visibility_s.saturating_mul(1000))
        .min(cap)
        .min(deadline_at.unwrap_or(Millis::MAX));
    if until <= visible_until {
        return None;
    }
    let seconds = (until - now) / 1000;
    (seconds >= 1).then_some(seconds.min(i64::from(i32::MAX)) as i32)
}

/// What one answer to a running call's lease renewal means.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Renewed {
    /// Applied: the lease runs to `until`.
    Extended {
        /// The lease's new end.
        until: Millis,
    },
    /// Refused with the job still ours under another lease: an earlier renewal of ours was
    /// applied and its answer lost. Renew again from `until`.
    Adopted {
        /// The lease as it stands.
        until: Millis,
    },
    /// Refused: ownership is lost, and the call is cancelled.
    Lost,
    /// Refused: the job is still ours, and an operator asked to cancel it. The call is
    /// stopped (and cancelled upstream where the provider can) and the attempt ends
    /// `cancelled`.
    Withdrawn,
    /// No answer: try again after `pause_ms`, which still leaves the lease holding.
    Retry {
        /// The pause before the next try.
        pause_ms: Millis,
    },
    /// No answer and no time for another try; `cancel`: the lease lapses (less the margin)
    /// before the next heartbeat, so the call is cancelled rather than left running unowned.
    Uncertain {
        /// Cancel the call.
        cancel: bool,
    },
}

/// What the answer to try `attempt` (from 0) at renewing the lease of a call of `epoch`, which
/// held until `lease_until`, means (`answer`: `None` when the request failed). The heartbeat
/// acts on it and the model checker explores it.
pub fn after_renewal(
    answer: Option<&Write>,
    epoch: u64,
    attempt: u32,
    lease_until: Millis,
    ticks: RenewalTicks,
) -> Renewed {
    match answer {
        Some(Write::Applied(record)) => Renewed::Extended {
            until: record.owner_until.unwrap_or(lease_until),
        },
        Some(Write::Refused(Some(seen)))
            if seen.state == JobState::Running
                && seen.owner_epoch == epoch
                && seen.cancel_requested.is_some() =>
        {
            Renewed::Withdrawn
        }
        Some(Write::Refused(Some(seen)))
            if seen.state == JobState::Running
                && seen.owner_epoch == epoch
                && attempt < RENEWAL_RETRIES =>
        {
            Renewed::Adopted {
                until: seen.owner_until.unwrap_or(lease_until),
            }
        }
        Some(Write::Refused(_)) => Renewed::Lost,
        None => {
            let pause_ms = ticks.first_pause_ms << attempt;
            if attempt < RENEWAL_RETRIES && ticks.now + pause_ms < lease_until - ticks.skew_ms {
                Renewed::Retry { pause_ms }
            } else {
                Renewed::Uncertain {
                    cancel: lease_until - ticks.skew_ms <= ticks.now + ticks.heartbeat_ms,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::{JobRecord, NewJob};
    use crate::ledger::memory::InMemoryLedger;
    use crate::queue::RecordingVisibility;

    const NOW: Millis = 1_000_000;
    const TICKS: RenewalTicks = RenewalTicks {
        now: NOW,
        skew_ms: 2_000,
        heartbeat_ms: 10_000,
        first_pause_ms: RETRY_PAUSE_MS,
    };

    fn running(epoch: u64, until: Millis) -> JobRecord {
        let mut r = NewJob::example("j", NOW + 600_000).into_record(JobState::Running, NOW);
        r.owner_epoch = epoch;
        r.owner_until = Some(until);
        r
    }

    #[test]
    fn an_applied_renewal_extends_to_the_lease_the_item_holds() {
        let answer = Write::Applied(running(3, NOW + 60_000));
        assert_eq!(
            after_renewal(Some(&answer), 3, 0, NOW + 20_000, TICKS),
            Renewed::Extended {
                until: NOW + 60_000
            }
        );
    }

    #[test]
    fn an_extension_reaches_the_queue_timeout_but_never_the_cap_the_deadline_or_backwards() {
        // The queue's timeout from now, when the record has less.
        assert_eq!(
            extension_s(NOW, 30, NOW + 60_000, NOW + 10_000, None),
            Some(30)
        );
        // Never past 12 hours from the receive, nor the deadline of the call it carries.
        assert_eq!(extension_s(NOW, 30, NOW + 12_000, NOW, None), Some(12));
        assert_eq!(
            extension_s(NOW, 30, NOW + 60_000, NOW, Some(NOW + 5_500)),
            Some(5)
        );
        // Nothing when that would not reach past what the record has, or not a whole second.
        assert_eq!(extension_s(NOW, 30, NOW + 60_000, NOW + 30_000, None), None);
        assert_eq!(extension_s(NOW, 30, NOW + 900, NOW, None), None);
    }

    #[test]
    fn our_own_lease_is_adopted_while_tries_remain_and_any_other_refusal_loses_the_call() {
        let ours = Write::Refused(Some(running(3, NOW + 45_000)));
        for attempt in 0..RENEWAL_RETRIES {
            assert_eq!(
                after_renewal(Some(&ours), 3, attempt, NOW + 20_000, TICKS),
                Renewed::Adopted {
                    until: NOW + 45_000
                }
            );
        }
        assert_eq!(
            after_renewal(Some(&ours), 3, RENEWAL_RETRIES, NOW + 20_000, TICKS),
            Renewed::Lost
        );
        let fenced = Write::Refused(Some(running(4, NOW + 45_000)));
        assert_eq!(
            after_renewal(Some(&fenced), 3, 0, NOW + 20_000, TICKS),
            Renewed::Lost
        );
        let gone = Write::Refused(None);
        assert_eq!(
            after_renewal(Some(&gone), 3, 0, NOW + 20_000, TICKS),
            Renewed::Lost
        );
    }

    #[test]
    fn a_refusal_that_shows_a_cancel_request_on_our_epoch_withdraws_the_call() {
        let mut marked = running(3, NOW + 45_000);
        marked.cancel_requested = Some(NOW);
        let refused = Write::Refused(Some(marked.clone()));
        assert_eq!(
            after_renewal(Some(&refused), 3, 0, NOW + 20_000, TICKS),
            Renewed::Withdrawn
        );
        // A cancel request under another owner's epoch is that owner's: ours is lost.
        marked.owner_epoch = 4;
        let fenced = Write::Refused(Some(marked));
        assert_eq!(
            after_renewal(Some(&fenced), 3, 0, NOW + 20_000, TICKS),
            Renewed::Lost
        );
    }

    #[test]
    fn a_failed_renewal_retries_while_the_lease_holds_and_cancels_only_before_it_lapses() {
        // Ample lease: a retry after the first pause.
        assert_eq!(
            after_renewal(None, 3, 0, NOW + 20_000, TICKS),
            Renewed::Retry {
                pause_ms: RETRY_PAUSE_MS
            }
        );
        assert_eq!(
            after_renewal(None, 3, 1, NOW + 20_000, TICKS),
            Renewed::Retry {
                pause_ms: 2 * RETRY_PAUSE_MS
            }
        );
        // Out of tries: the lease outlasts the next heartbeat, so the call goes on.
        assert_eq!(
            after_renewal(None, 3, RENEWAL_RETRIES, NOW + 20_000, TICKS),
            Renewed::Uncertain { cancel: false }
        );
        // No room for the pause before the lease (less the margin) lapses, nor for the next
        // heartbeat: the call is cancelled.
        assert_eq!(
            after_renewal(None, 3, 0, NOW + 2_050, TICKS),
            Renewed::Uncertain { cancel: true }
        );
    }

    /// Tokio's clock as Unix ms, so the heartbeat's sums and its ticks share one paused time.
    struct PausedClock {
        base: Millis,
        start: tokio::time::Instant,
    }

    impl Clock for PausedClock {
        fn now_ms(&self) -> Millis {
            self.base + self.start.elapsed().as_millis() as Millis
        }
    }

    /// A heartbeat's world in paused time: one record of a claimed job (epoch 1, the default
    /// 60 s lease) in flight, on an in-memory ledger and a recording queue, default settings.
    struct Rig {
        clock: PausedClock,
        ledger: InMemoryLedger,
        visibility: RecordingVisibility,
        flights: Flights,
        settings: Settings,
    }

    impl Rig {
        async fn one_running() -> Rig {
            let clock = PausedClock {
                base: NOW,
                start: tokio::time::Instant::now(),
            };
            let ledger = InMemoryLedger::new();
            let now = clock.now_ms();
            let claim = crate::ledger::ClaimRequest {
                job: NewJob::example("j", now + 3_600_000),
                expect: crate::job::Expect::FRESH,
                owner_id: "w".into(),
                now,
                lease_until: now + 60_000,
                provider_ref: None,
                route: None,
                first_sight: false,
            };
            ledger.claim(claim).await.expect("claim");
            let flights = Flights::new(
                vec![Delivered {
                    queue_arn: Some("arn:q".into()),
                    receipt_handle: Some("h".into()),
                    received_at: now,
                }],
                30,
            );
            flights.running(0, "j", 1, now + 60_000, now + 3_600_000);
            Rig {
                clock,
                ledger,
                visibility: RecordingVisibility::new(),
                flights,
                settings: Settings::default(),
            }
        }

        fn beat(&self) -> Heartbeat<'_, InMemoryLedger, RecordingVisibility, PausedClock> {
            Heartbeat {
                flights: &self.flights,
                ledger: &self.ledger,
                visibility: &self.visibility,
                clock: &self.clock,
                settings: &self.settings,
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_heartbeat_ticks_on_its_interval_renews_the_lease_before_it_runs_short_and_stops_when_told()
     {
        // GIVEN a record in flight whose job holds a 60 s lease, and a 10 s heartbeat
        let rig = Rig::one_running().await;
        let stop = CancellationToken::new();
        // WHEN it runs for 35 s of paused time, then is stopped, and 60 s more pass
        let run = rig.beat().run(stop.clone());
        let watch = async {
            tokio::time::sleep(Duration::from_millis(35_000)).await;
            stop.cancel();
        };
        tokio::join!(run, watch);
        tokio::time::sleep(Duration::from_millis(60_000)).await;
        // THEN it ticked at 10, 20 and 30 s and never after: one visibility call a tick, each
        // to the queue's timeout from then
        let stats = rig.flights.snapshot();
        assert_eq!(stats.heartbeat_ticks, 3);
        assert_eq!(stats.heartbeat_late, 0);
        let changes = rig.visibility.changes();
        assert_eq!(changes.len(), 3);
        assert!(changes.iter().all(|(_, c)| c.seconds == 30));
        // AND the lease was renewed once it would no longer outlast three more ticks (at 30 s,
        // not at 10 or 20), to a full lease from then
        assert_eq!(stats.lease_renewed, 1);
        let item = rig.ledger.get("j").await.expect("get").expect("item");
        assert_eq!(item.owner_until, Some(NOW + 30_000 + 60_000));
        assert_eq!(rig.flights.lease_until(0), Some(NOW + 30_000 + 60_000));
    }

    #[tokio::test(start_paused = true)]
    async fn a_tick_held_up_by_a_blocked_thread_is_counted_late() {
        // GIVEN a running heartbeat of 10 s
        let rig = Rig::one_running().await;
        let stop = CancellationToken::new();
        // WHEN the clock jumps 16 s past a tick without the runtime polling (a step that held
        // the thread), then the heartbeat is stopped
        let watch = async {
            tokio::time::sleep(Duration::from_millis(1_000)).await;
            tokio::time::advance(Duration::from_millis(25_000)).await;
            tokio::time::sleep(Duration::from_millis(1)).await;
            stop.cancel();
        };
        tokio::join!(rig.beat().run(stop.clone()), watch);
        // THEN that tick ran, late, and was counted
        let stats = rig.flights.snapshot();
        assert!(stats.heartbeat_ticks >= 1, "{stats:?}");
        assert!(stats.heartbeat_late >= 1, "{stats:?}");
    }
}
