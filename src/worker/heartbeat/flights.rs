//! The records of one invocation as the heartbeat sees them, and the watch each record's
//! attempt reports to.

use std::sync::Mutex;

use super::{Renewals, Stats, StatsSnapshot};
use crate::job::Millis;
use crate::job::outcome::receive_cap;
use crate::worker::processor::{AttemptWatch, StopSignal};

/// One record of the batch, as the heartbeat sees it.
#[derive(Debug)]
pub(super) struct Flight {
    /// Where and how to extend its visibility (absent: it cannot be extended).
    pub(super) delivery: Option<(String, String)>,
    /// No visibility may be requested past this instant (12 hours from this receive, less a
    /// margin).
    pub(super) visibility_cap: Millis,
    /// When the record becomes visible unless extended (an estimate, kept conservative).
    pub(super) visible_until: Millis,
    /// SQS refused an extension: the delivery is over, stop extending.
    pub(super) visibility_stopped: bool,
    pub(super) stage: Stage,
    pub(super) renewals: Renewals,
}

#[derive(Debug)]
pub(super) enum Stage {
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
pub(super) struct Lease {
    pub(super) job_id: String,
    pub(super) epoch: u64,
    pub(super) lease_until: Millis,
    pub(super) deadline_at: Millis,
    /// Stops the call, and says why (ownership lost, or an operator's cancel).
    pub(super) stop: StopSignal,
    /// The progress rule of a streamed call: its lease is renewed only while it holds.
    pub(super) progress: Option<crate::provider::Progress>,
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

    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Flight>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers the claim of record `index`; the returned signal stops its call when ownership
    /// is lost or an operator cancels the job. An index outside the batch gets a signal nobody
    /// sends.
    pub fn running(
        &self,
        index: usize,
        job_id: &str,
        epoch: u64,
        lease_until: Millis,
        deadline_at: Millis,
    ) -> StopSignal {
        let stop = StopSignal::new();
        if let Some(flight) = self.lock().get_mut(index) {
            flight.stage = Stage::Running(Lease {
                job_id: job_id.to_owned(),
                epoch,
                lease_until,
                deadline_at,
                stop: stop.clone(),
                progress: None,
            });
        }
        stop
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

    /// What the running call of record `index` has to show for itself, said by the owner of
    /// `epoch`: its renewals carry it.
    pub(super) fn said(&self, index: usize, epoch: u64) -> Option<crate::job::CallProgress> {
        match self.lock().get(index) {
            Some(Flight {
                stage: Stage::Running(lease),
                ..
            }) => lease.progress.as_ref()?.said(epoch),
            _ => None,
        }
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

    pub(super) fn count_renewal(&self, index: usize, count: impl FnOnce(&mut Renewals)) {
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
    pub(super) fn set_lease(&self, index: usize, until: Millis, renewed: bool) {
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
    ) -> StopSignal {
        self.flights
            .running(self.index, job_id, epoch, lease_until, deadline_at)
    }

    fn progress(&self, progress: &crate::provider::Progress) {
        self.flights.progress(self.index, progress);
    }

    fn call_ended(&self) {
        self.flights.call_ended(self.index);
    }

    fn recovered(&self) {
        self.flights.stats.recovery();
    }

    fn deadline_cutoff(&self) {
        self.flights.stats.deadline_cutoff();
    }

    fn provider_latency(&self, provider: &'static str, ms: u64) {
        self.flights.stats.provider_latency(provider, ms);
    }

    fn throttled(&self, provider: &'static str) {
        self.flights.stats.throttled(provider);
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

    fn used(&self, provider: &'static str, model: &str, usage: &crate::job::Usage) {
        self.flights.stats.used(provider, model, usage);
    }
}
