//! A processor put together from its parts (the ledger, the providers in order with their
//! models, the clock, the settings; the pacers, day budgets, contracts and blobs it is given),
//! and what it holds, for its callers.

use std::sync::Arc;

use super::{Link, Processor, TenantPacers};
use crate::blobs::BlobStore;
use crate::clock::Clock;
use crate::job::contract::Contracts;
use crate::ledger::JobLedger;
use crate::ledger::spend::SpendBudget;
use crate::protocol::routing::ModelMap;
use crate::provider::Provider;
use crate::worker::pacing::Pacer;
use crate::worker::settings::Settings;

impl<L: JobLedger, P: Provider, C: Clock> Processor<L, P, C> {
    /// A processor over these parts.
    pub fn new(ledger: L, provider: P, clock: C, settings: Settings) -> Self {
        let first = Link {
            provider,
            models: ModelMap::default(),
            pacer: Pacer::new(settings.pacing(), None),
            urgent: settings.urgent_pacing().map(|p| Pacer::new(p, None)),
        };
        Processor {
            ledger,
            links: vec![first],
            clock,
            settings,
            blobs: None,
            contracts: Arc::default(),
            spend: None,
            tenants: TenantPacers::default(),
            gather: crate::worker::gather::Gather::default(),
            noted: Default::default(),
            path_times: Default::default(),
            shared_times: None,
            unshared: Default::default(),
        }
    }

    /// Keeps the deployment's calls within `DAILY_SPEND_LIMIT` a day, counted in `spend` (the
    /// ledger table's day items); without a limit set it is never asked.
    pub fn with_spend_budget(mut self, spend: Arc<dyn SpendBudget>) -> Self {
        self.spend = Some(spend);
        self
    }

    /// Holds each job to its output contract in `contracts` (without, to none: every answer is
    /// accepted as it comes).
    pub fn with_contracts(mut self, contracts: Arc<Contracts>) -> Self {
        self.contracts = contracts;
        self
    }

    /// The output contracts jobs are held to.
    pub fn contracts(&self) -> &Contracts {
        &self.contracts
    }

    /// The contracts a configured provider takes only loosely, each with the provider and the
    /// reason: a schema OpenAI's strict mode cannot take, even lowered to its dialect
    /// ([`crate::provider::dialect::openai_not_strict`]), goes to OpenAI with `strict: false`
    /// (the schema as guidance, not enforced by decoding), and is judged here as every answer
    /// is. Anthropic's and Bedrock's forms take every schema this crate lowers.
    pub fn loose_contracts(&self) -> Vec<(String, &'static str, String)> {
        use crate::provider::dialect;
        let openai = self.links.iter().any(|l| l.provider.name() == "openai");
        if !openai {
            return Vec::new();
        }
        self.contracts
            .iter()
            .filter_map(|c| {
                let lowered = dialect::openai(c.schema()?);
                let why = dialect::openai_not_strict(&lowered)?;
                Some((c.id().to_owned(), "openai", why))
            })
            .collect()
    }

    /// Gives the first provider its model for each job model name.
    pub fn with_models(mut self, models: ModelMap) -> Self {
        self.links[0].models = models;
        self
    }

    /// Adds `provider` to the end of the list, with its model for each job model name: it
    /// takes a job after a definite refusal of the one before it. Its pacing is its own: the
    /// adaptive limit and `Retry-After`, kept apart from the others' (the deployment's shared
    /// limits, `PROVIDER_RPM` and `PROVIDER_TPM`, are the first provider's).
    pub fn with_fallback(mut self, provider: P, models: ModelMap) -> Self {
        let mut pacing = self.settings.pacing();
        pacing.limits = Default::default();
        pacing.key = format!("{}#{}", pacing.key, provider.name());
        self.links.push(Link {
            provider,
            models,
            pacer: Pacer::new(pacing, None),
            urgent: None,
        });
        self
    }

    /// Adds an object store: answers and inputs above `INLINE_MAX_BYTES` (or too large for the
    /// item) are written to its bucket, and stored inputs and Extended Client payloads read.
    pub fn with_blobs(mut self, blobs: Arc<dyn BlobStore>) -> Self {
        self.blobs = Some(blobs);
        self
    }

    /// The object store, if any.
    pub fn blobs(&self) -> Option<&dyn BlobStore> {
        self.blobs.as_deref()
    }

    /// The ledger.
    pub fn ledger(&self) -> &L {
        &self.ledger
    }

    /// The (first) provider.
    pub fn provider(&self) -> &P {
        &self.links[0].provider
    }

    /// Every provider, in order.
    pub fn providers(&self) -> impl Iterator<Item = &P> {
        self.links.iter().map(|l| &l.provider)
    }

    /// An invocation's `count` lanes, run `concurrency` at a time: a batch of deferrable jobs'
    /// lines waits (within the gathering window) for those that run or may start.
    pub(crate) fn lanes(
        &self,
        count: usize,
        concurrency: usize,
    ) -> crate::worker::gather::Lanes<'_> {
        self.gather.lanes(count, concurrency)
    }

    /// The settings.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The clock.
    pub fn clock(&self) -> &C {
        &self.clock
    }
}
