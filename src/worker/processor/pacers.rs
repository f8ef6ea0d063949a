//! The processor's pacers: the provider's, urgent jobs' share of it, and each producer's and
//! each account's cap.

use std::sync::Arc;

use super::{JobLedger, JobMessage, Link, Pacer, Processor};
use crate::clock::Clock;
use crate::job::account::account;
use crate::provider::Provider;

impl<P> Link<P> {
    /// The pacer `msg`'s calls draw on.
    pub(super) fn pacer_for(&self, msg: &JobMessage) -> &Pacer {
        match &self.urgent {
            Some(urgent) if msg.class.urgent => urgent,
            _ => &self.pacer,
        }
    }
}

/// The pacers of the producers and accounts this environment has seen, on the shared schedule.
#[derive(Debug, Default)]
pub(super) struct TenantPacers {
    schedule: Option<Arc<dyn crate::ledger::schedule::CallSchedule>>,
    pacers: std::sync::Mutex<std::collections::HashMap<String, Arc<Pacer>>>,
}

/// Share pacers one environment keeps; past it they start again (a share's schedule item holds
/// it, not the pacer).
const TENANT_PACERS_KEPT: usize = 256;

impl<L: JobLedger, P: Provider, C: Clock> Processor<L, P, C> {
    /// Paces calls against the (first) provider's limits (see [`Pacer`]); without it, only
    /// the adaptive limit and `Retry-After` apply, at their defaults.
    pub fn with_pacer(mut self, pacer: Pacer) -> Self {
        self.links[0].pacer = pacer;
        self
    }

    /// Caps each producer's calls at `PRODUCER_PACING_PERCENT` and each account's at
    /// `TENANT_PACING_PERCENT` of the paced capacity, on a schedule item each in `schedule`
    /// ([`Settings::producer_pacing`], [`Settings::tenant_pacing`]).
    pub fn with_tenant_schedule(
        mut self,
        schedule: Arc<dyn crate::ledger::schedule::CallSchedule>,
    ) -> Self {
        self.tenants.schedule = Some(schedule);
        self
    }

    /// The pacers of the shares `msg`'s calls are capped to, in the order they are taken: its
    /// producer's (`PRODUCER_PACING_PERCENT`) and its account's (its producer's and its
    /// tenant's: [`account`], `TENANT_PACING_PERCENT`), each when capped, for an urgent job
    /// too: the urgent share is a right of way, not a way past a cap.
    pub(super) fn share_pacers(&self, msg: &JobMessage) -> Vec<Arc<Pacer>> {
        let Some(schedule) = self.tenants.schedule.as_ref() else {
            return Vec::new();
        };
        let producer = crate::job::scope::producer_of(&msg.job_id).unwrap_or("");
        let account = account(&msg.job_id, msg.class.tenant.as_deref());
        let shares = [
            (
                format!("producer#{producer}"),
                self.settings.producer_pacing(producer),
            ),
            (
                format!("tenant#{account}"),
                self.settings.tenant_pacing(&account),
            ),
        ];
        let mut pacers = self
            .tenants
            .pacers
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let mut taken = Vec::new();
        for (key, settings) in shares {
            let Some(settings) = settings else { continue };
            if pacers.len() >= TENANT_PACERS_KEPT && !pacers.contains_key(&key) {
                pacers.clear();
            }
            let pacer = pacers
                .entry(key)
                .or_insert_with(|| Arc::new(Pacer::new(settings, Some(Arc::clone(schedule)))));
            taken.push(Arc::clone(pacer));
        }
        taken
    }

    /// Paces urgent jobs' calls on the share of the (first) provider's limits kept for them
    /// ([`Settings::urgent_pacing`]).
    pub fn with_urgent_pacer(mut self, pacer: Pacer) -> Self {
        self.links[0].urgent = Some(pacer);
        self
    }

    /// The (first) provider's pacer.
    pub fn pacer(&self) -> &Pacer {
        &self.links[0].pacer
    }
}
