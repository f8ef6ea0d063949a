//! One job delivery: claim or classify, call the provider, end the attempt, all through traits.
//!
//! The processor never writes unconditionally and never calls the provider without a claim made
//! in the same delivery. A refused write is answered by re-deciding from the item the refusal
//! returned. It knows nothing of batches: whoever keeps a running attempt alive (the heartbeat)
//! is an [`AttemptWatch`].
//!
//! - this file: the entry points (a message, a trigger by id) and what is refused at first
//!   sight;
//! - [`execute`](self::execute): the executor, which carries out the commands of the
//!   protocol's [`Delivery`](crate::protocol::delivery::Delivery) and feeds back what the
//!   world said;
//! - [`admit`](self::admit): what the delivery knows of each provider, and the capacity it
//!   takes for the call;
//! - [`build`](self::build): a processor put together from its parts, and what it holds;
//! - [`route`](self::route): which provider of the list runs an attempt;
//! - [`writes`](self::writes): the writes before the call (the claim, a settle, a recovery
//!   claim, a create);
//! - [`run`](self::run): the call and a background call's polling;
//! - [`end`](self::end): the writes that end an attempt.

mod admit;
mod batches;
mod build;
mod end;
mod execute;
mod pacers;
mod paths;
mod payload;
mod route;
mod run;
mod spend;
mod stop;
mod writes;

use payload::InputError;

use std::sync::Arc;

use super::pacing::Pacer;
use super::settings::Settings;
use crate::blobs::BlobStore;
use crate::clock::Clock;
use crate::job::contract::Contracts;
use crate::job::{Failure, InvalidMessage, JobItem, JobMessage, Millis, RecordOutcome, Trigger};
use crate::ledger::spend::SpendBudget;
use crate::ledger::{JobLedger, LedgerError};
use crate::protocol::routing::ModelMap;
use crate::provider::Provider;
use pacers::TenantPacers;
pub use stop::{StopSignal, Stopped};

/// The invocation a record is processed in.
#[derive(Debug, Clone)]
pub struct Invocation {
    /// Lambda request id (or the local driver's invocation id).
    pub id: String,
    /// When the invocation must have returned, if known.
    pub deadline: Option<Millis>,
}

/// What processing one record produced.
#[derive(Debug, Clone, PartialEq)]
pub struct Processed {
    /// The record's outcome.
    pub outcome: RecordOutcome,
    /// The last ledger item this delivery saw, for later records of the same job.
    pub view: Option<JobItem>,
}

/// One provider of the deployment's ordered list, with its models and its pacing.
#[derive(Debug)]
struct Link<P> {
    provider: P,
    /// Its model for each job model name.
    models: ModelMap,
    /// Its own limits and adaptive state: one provider's refusals never slow another's calls.
    pacer: Pacer,
    /// Urgent jobs' pacer, on the share of the limits kept for them (the first provider's,
    /// under `URGENT_PACING_PERCENT`); without it they pace with the others.
    urgent: Option<Pacer>,
}

/// Runs deliveries against a ledger and a provider, or an ordered list of providers of which
/// the next takes a job only after a definite refusal of the one before ([`routing`]).
///
/// [`routing`]: crate::protocol::routing
#[derive(Debug)]
pub struct Processor<L, P, C> {
    ledger: L,
    /// The providers, in order; never empty.
    links: Vec<Link<P>>,
    clock: C,
    settings: Settings,
    blobs: Option<Arc<dyn BlobStore>>,
    contracts: Arc<Contracts>,
    /// The deployment's spend per day, when `DAILY_SPEND_LIMIT` is set.
    spend: Option<Arc<dyn SpendBudget>>,
    /// Each tenant's pacer, under `TENANT_PACING_PERCENT`.
    tenants: TenantPacers,
    /// Deferrable jobs' lines waiting for their batch.
    gather: super::gather::Gather,
    /// The request counts this environment last noted for each running batch: a look notes
    /// only counts that changed.
    noted: std::sync::Mutex<std::collections::HashMap<String, crate::job::BatchCounts>>,
    /// How long attempts took on each path, by provider and model: as this environment
    /// measured them, or everyone's as last read from the shared store.
    path_times: std::sync::Mutex<
        std::collections::HashMap<(&'static str, String), crate::job::path::Times>,
    >,
    /// Where every environment's path times are shared (the ledger table), if anywhere.
    shared_times: Option<Arc<dyn crate::ledger::path_times::SharedTimes>>,
    /// This environment's times not shared yet, and when each was last shared, by provider
    /// and model.
    unshared: std::sync::Mutex<std::collections::HashMap<(&'static str, String), paths::Unshared>>,
}

/// What the processor tells whoever keeps a running attempt alive (the invocation's heartbeat)
/// about one record, and the events it counts. The processor knows nothing of batches.
pub trait AttemptWatch: Sync {
    /// A provider call starts under this claim; the signal stops it, and says why: ownership
    /// lost (a renewal refused, or the lease about to lapse) or an operator's cancel (a
    /// renewal's refusal showed the request; the owner ends the attempt `cancelled`).
    fn running(
        &self,
        job_id: &str,
        epoch: u64,
        lease_until: Millis,
        deadline_at: Millis,
    ) -> StopSignal;
    /// The call streams under the progress rule `progress`: its lease is renewed only while the
    /// call shows progress.
    fn progress(&self, _progress: &crate::provider::Progress) {}
    /// The call ended: its lease is no longer renewed.
    fn call_ended(&self);
    /// A recovery claim fenced a lapsed owner.
    fn recovered(&self);
    /// The call was cut short by the invocation's deadline.
    fn deadline_cutoff(&self);
    /// The call, to `provider`, took `ms` from its start to its answer or failure.
    fn provider_latency(&self, provider: &'static str, ms: u64);
    /// `provider` refused the call for its rate limit or quota.
    fn throttled(&self, _provider: &'static str) {}
    /// The record waits: the day's spend limit cannot take its call.
    fn spend_deferred(&self) {}
    /// A new job names a contract the lenient registry does not hold: it is held to free text.
    fn uncontracted(&self) {}
    /// The call went as a line of a provider batch.
    fn batched(&self) {}
    /// The record looked at its running batch and waits, nothing written.
    fn batch_waiting(&self) {}
    /// An attempt of `model` at `provider` ended, recording `usage`.
    fn used(&self, _provider: &'static str, _model: &str, _usage: &crate::job::Usage) {}
}

impl<L: JobLedger, P: Provider, C: Clock> Processor<L, P, C> {
    /// Processes one delivery of `msg`. `owner_id` must be unique to this delivery.
    pub async fn process(
        &self,
        msg: &JobMessage,
        owner_id: &str,
        inv: &Invocation,
        watch: &dyn AttemptWatch,
    ) -> Processed {
        self.deliver(msg, None, owner_id, inv, watch).await
    }

    /// Processes one delivery of a trigger. A trigger that carries only a job id costs one
    /// consistent read, then goes on from the item it found; one for a job the ledger does not
    /// hold is poison.
    pub(crate) async fn process_trigger(
        &self,
        trigger: &Trigger,
        owner_id: &str,
        inv: &Invocation,
        watch: &dyn AttemptWatch,
    ) -> Processed {
        let job_id = match trigger {
            Trigger::Job(msg) => {
                if let Some(refused) = self.refused_at_first_sight(msg, watch).await {
                    return failed(refused, None);
                }
                return match self.offload_input(msg).await {
                    Ok(None) => self.process(msg, owner_id, inv, watch).await,
                    Ok(Some(stored)) => self.process(&stored, owner_id, inv, watch).await,
                    Err(failure) => failed(failure, None),
                };
            }
            Trigger::Ref(job_id) => job_id,
        };
        match self.ledger.get(job_id).await {
            Ok(Some(item)) => match self.stored_input(&item).await {
                Ok(msg) => self.deliver(&msg, Some(item), owner_id, inv, watch).await,
                Err(InputError::Lost(how)) => self.input_lost(item, how).await,
                Err(InputError::Unavailable(failure)) => failed(failure, Some(item)),
            },
            Ok(None) => failed(Failure::Poison(InvalidMessage::UnknownJob), None),
            Err(e) => ledger_failure(job_id, &e, None),
        }
    }

    /// Why a job seen for the first time is refused, before anything is written: a model, a
    /// parameter, a budget or a deadline the deployment does not allow its producers
    /// ([`Settings::policy`]), a tenant or a priority its producer may not label it with
    /// ([`Settings::labels`]), a contract a strict registry does not hold, or a deadline further
    /// away than the worker can see it through ([`Settings::deadline_refused`]); what a read
    /// of a message that says the ledger may hold it decides is
    /// [`crate::protocol::admission::refused_at_first_sight`]'s.
    async fn refused_at_first_sight(
        &self,
        msg: &JobMessage,
        watch: &dyn AttemptWatch,
    ) -> Option<Failure> {
        let now = self.clock.now_ms();
        let stores = self.blobs().is_some_and(|b| b.bucket().is_some());
        let s = &self.settings;
        let invalid =
            crate::job::account::refusal(&s.policy, &s.labels, msg, now).or_else(|| {
                match self.contracts.admits(&msg.contract) {
                    Err(_) => {
                        return Some(InvalidMessage::Invalid {
                            field: "contract",
                            rule: "names no contract in the registry (CONTRACTS_STRICT)",
                        });
                    }
                    Ok(false) => {
                        // A lenient registry: a typo in an id is free text, said for each job.
                        tracing::warn!(job_id = %msg.job_id, contract = %msg.contract,
                        "no contract in the registry: held to free text (CONTRACTS_STRICT=false)");
                        watch.uncontracted();
                    }
                    Ok(true) => {}
                }
                self.settings
                    .deadline_refused(msg.deadline_at?, now, stores)
            })?;
        let read = match msg.may_be_in_ledger() {
            true => Some(match self.ledger.get(&msg.job_id).await {
                Ok(item) => Ok(item.is_some()),
                Err(e) => {
                    tracing::warn!(job_id = %msg.job_id, error = %e, "ledger call failed");
                    Err(())
                }
            }),
            false => None,
        };
        crate::protocol::admission::refused_at_first_sight(invalid, read)
    }

    /// The latest moment a call may start in this invocation: the least useful call time for
    /// this provider (shorter when the call can be asked about later and handed over), never
    /// more than the provider timeout, before the invocation's margin.
    fn latest_call_start(&self, inv: &Invocation, link: &Link<P>) -> Millis {
        let Some(deadline) = inv.deadline else {
            return Millis::MAX;
        };
        let s = &self.settings;
        let least = if link.provider.can_retrieve() {
            s.min_background_call_ms
        } else {
            s.min_call_ms
        };
        deadline - s.deadline_margin_ms - least.min(s.provider_timeout_ms)
    }

    /// The outcome of a later record of the same job in the same batch, decided from what the
    /// first record left in the ledger, with no ledger or provider call.
    pub fn follow(&self, msg: &JobMessage, view: &JobItem) -> RecordOutcome {
        crate::protocol::admission::follow(
            view,
            &msg.digest,
            self.clock.now_ms(),
            self.settings.skew_ms,
        )
    }
}

fn ledger_failure(job_id: &str, e: &LedgerError, view: Option<JobItem>) -> Processed {
    tracing::warn!(job_id, error = %e, "ledger call failed");
    failed(backoff("ledger"), view)
}

fn backoff(cause: &'static str) -> Failure {
    Failure::Backoff {
        retry_after_ms: None,
        cause,
    }
}

fn failed(failure: Failure, view: Option<JobItem>) -> Processed {
    Processed {
        outcome: RecordOutcome::Failed(failure),
        view,
    }
}
