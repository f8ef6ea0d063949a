//! The processor's pacers: the provider's, urgent jobs' share of it, and each tenant's cap.

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

/// The pacers of the tenants this environment has seen, on the shared schedule.
#[derive(Debug, Default)]
pub(super) struct TenantPacers {
    schedule: Option<Arc<dyn crate::ledger::schedule::CallSchedule>>,
    pacers: std::sync::Mutex<std::collections::HashMap<String, Arc<Pacer>>>,
}

/// Tenant pacers one environment keeps; past it they start again (a tenant's schedule item
/// holds its share, not the pacer).
const TENANT_PACERS_KEPT: usize = 256;

impl<L: JobLedger, P: Provider, C: Clock> Processor<L, P, C> {
    /// Paces calls against the (first) provider's limits (see [`Pacer`]); without it, only
    /// the adaptive limit and `Retry-After` apply, at their defaults.
    pub fn with_pacer(mut self, pacer: Pacer) -> Self {
        self.links[0].pacer = pacer;
        self
    }

    /// Caps each tenant's normal jobs at `TENANT_PACING_PERCENT` of the paced capacity, on a
    /// schedule item per tenant in `schedule` ([`Settings::tenant_pacing`]).
    pub fn with_tenant_schedule(
        mut self,
        schedule: Arc<dyn crate::ledger::schedule::CallSchedule>,
    ) -> Self {
        self.tenants.schedule = Some(schedule);
        self
    }

    /// The pacer of `msg`'s account (its producer's and its tenant's: [`account`]) when
    /// tenants are capped, for an urgent job too: the urgent share is a right of way, not a
    /// way past the tenant's cap.
    pub(super) fn tenant_pacer(&self, msg: &JobMessage) -> Option<Arc<Pacer>> {
        let schedule = self.tenants.schedule.as_ref()?;
        let tenant = &account(&msg.job_id, msg.class.tenant.as_deref());
        let settings = self.settings.tenant_pacing(tenant)?;
        let mut pacers = self
            .tenants
            .pacers
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if pacers.len() >= TENANT_PACERS_KEPT && !pacers.contains_key(tenant) {
            pacers.clear();
        }
        let pacer = pacers
            .entry(tenant.to_owned())
            .or_insert_with(|| Arc::new(Pacer::new(settings, Some(Arc::clone(schedule)))));
        Some(Arc::clone(pacer))
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
