//! The admission's adapters: the state of one delivery's admission, the capacity it takes for
//! the call, what it decides from an item it saw, and how it goes on or ends.

use super::spend::Reserved;
use super::{AttemptWatch, Invocation, Link, Processed, Processor};
use crate::clock::Clock;
use crate::job::{Failure, JobMessage, JobRecord, Millis, NewJob, RecordOutcome};
use crate::ledger::JobLedger;
use crate::protocol::admission::{Admission, Applied, Facts, Op, Step};
use crate::provider::Provider;
use crate::worker::pacing::{Pacer, Permit};

/// One delivery's admission as it goes: the provider it is routed to, the machine (with what
/// it knows of the job), what it took for the call (the pacer's permit, the day's
/// spend: handed to the call, or given back) and the last item it saw.
pub(super) struct Admitting<'a> {
    pub(super) routed: usize,
    /// The model of the next call when no spend limit can count it.
    pub(super) unpriced: Option<String>,
    pub(super) machine: Admission,
    pub(super) permit: Option<Permit<'a>>,
    pub(super) reserved: Option<Reserved>,
    pub(super) view: Option<JobRecord>,
}

impl<L: JobLedger, P: Provider, C: Clock> Processor<L, P, C> {
    /// The admission of `msg` from the item already read (`start`), routed to the provider the
    /// item names (or the first), and its first step.
    pub(super) fn admitting(
        &self,
        msg: &JobMessage,
        job: &NewJob,
        inv: &Invocation,
        start: Option<JobRecord>,
        now: Millis,
    ) -> (Admitting<'_>, Step) {
        let routed = self.next_link(start.as_ref(), msg);
        let (facts, unpriced) = self.admission_facts(msg, job, inv, &self.links[routed]);
        let (machine, step) = Admission::start(facts, start.as_ref(), &msg.digest, now);
        let admitting = Admitting {
            routed,
            unpriced,
            machine,
            permit: None,
            reserved: None,
            view: start,
        };
        (admitting, step)
    }

    /// The admission's capacity for the call (see [`Processor::take_capacity`]): taken into
    /// `a`, or the wait before asking again; a model without a price waits as its rule says.
    pub(super) async fn admit<'a>(
        &'a self,
        a: &mut Admitting<'a>,
        msg: &JobMessage,
        inv: &Invocation,
        tenant: Option<&'a Pacer>,
        watch: &dyn AttemptWatch,
    ) -> Step {
        if let Some(model) = &a.unpriced {
            return a.machine.no_capacity(self.unpriced_wait(msg, model, watch));
        }
        let link = &self.links[a.routed];
        let micros = a.machine.facts().next_call_micros;
        match self
            .take_capacity(msg, inv, link, tenant, micros, watch)
            .await
        {
            Ok((permit, reserved)) => {
                (a.permit, a.reserved) = (Some(permit), reserved);
                // The wait for capacity may have used the time the call needed.
                a.machine.admitted(self.clock.now_ms())
            }
            Err(wait_ms) => a.machine.no_capacity(wait_ms),
        }
    }

    /// The next step from what a refusal or a read showed (`seen`, at `now`): decided afresh
    /// with another provider's facts when the item routes the claim elsewhere (the capacity
    /// and spend taken given back), else by the machine.
    pub(super) async fn decide_from(
        &self,
        a: &mut Admitting<'_>,
        seen: Option<JobRecord>,
        msg: &JobMessage,
        job: &NewJob,
        inv: &Invocation,
        now: Millis,
    ) -> Step {
        let rerouted = seen.as_ref().map(|s| self.next_link(Some(s), msg));
        let step = match rerouted.filter(|r| *r != a.routed) {
            Some(other) => {
                a.permit = None;
                self.settle_spend(a.reserved.take(), 0).await;
                a.routed = other;
                let facts;
                (facts, a.unpriced) = self.admission_facts(msg, job, inv, &self.links[other]);
                let step;
                (a.machine, step) = Admission::start(facts, seen.as_ref(), &msg.digest, now);
                step
            }
            None => a.machine.seen(seen.as_ref(), &msg.digest, now),
        };
        a.view = seen.or(a.view.take());
        step
    }

    /// Goes on from our own write, applied and leaving `record`, with what the admission took.
    pub(super) async fn go_on_from(
        &self,
        mut a: Admitting<'_>,
        record: JobRecord,
        msg: &JobMessage,
        inv: &Invocation,
        watch: &dyn AttemptWatch,
    ) -> Processed {
        let applied = a.machine.applied(&record);
        let taken = (a.permit.as_mut(), a.reserved);
        // On the heap: the call's state is large, and the admission's polls stay shallow.
        Box::pin(self.go_on(applied, record, msg, taken, inv, watch)).await
    }

    /// The admission ended with `outcome` and no call: what it reserved of the day's spend given
    /// back.
    pub(super) async fn admission_ended(
        &self,
        a: Admitting<'_>,
        outcome: RecordOutcome,
        job_id: &str,
    ) -> Processed {
        self.settle_spend(a.reserved, 0).await;
        if a.machine.unconfirmed() {
            tracing::error!(
                job_id,
                "a write and every read after it went unanswered; if the write was applied, the job waits for its lease to lapse"
            );
        }
        Processed {
            outcome,
            view: a.view,
        }
    }

    /// Capacity for the call of `msg` on `link`: the `tenant`'s share first when tenants are
    /// capped, then the provider's, then `micros` of the day's spend (a record the pacer turns
    /// away reserves nothing; without room for the spend the permits go back unspent). Without
    /// capacity, the wait before asking again.
    async fn take_capacity<'a>(
        &'a self,
        msg: &JobMessage,
        inv: &Invocation,
        link: &'a Link<P>,
        tenant: Option<&'a Pacer>,
        micros: u64,
        watch: &dyn AttemptWatch,
    ) -> Result<(Permit<'a>, Option<Reserved>), Millis> {
        let latest = self.latest_call_start(inv, link);
        let policy = &self.settings.policy;
        let tenant_permit = match tenant {
            Some(tenant) => {
                let tokens = tenant.estimated_tokens(&msg.input_canonical, policy);
                Some(tenant.admit(tokens, &self.clock, latest).await?)
            }
            None => None,
        };
        let pacer = link.pacer_for(msg);
        let tokens = pacer.estimated_tokens(&msg.input_canonical, policy);
        let permit = pacer.admit(tokens, &self.clock, latest).await?;
        let permit = match tenant_permit {
            Some(tenant) => permit.with_tenant(tenant),
            None => permit,
        };
        match self.reserve_spend(msg, micros).await {
            Ok(reserved) => Ok((permit, reserved)),
            Err(wait_ms) => {
                watch.spend_deferred();
                Err(wait_ms)
            }
        }
    }

    /// Whether the recovery `op` would take is of a line whose batch still runs: then the record
    /// waits, nothing written.
    pub(super) async fn batch_waits(
        &self,
        msg: &JobMessage,
        op: &Op,
        view: Option<&JobRecord>,
        watch: &dyn AttemptWatch,
    ) -> Option<Failure> {
        let (Op::Recover { .. }, Some(seen)) = (op, view) else {
            return None;
        };
        let remaining_ms = self.batch_still_running(msg, seen).await?;
        watch.batch_waiting();
        Some(Failure::Deferred { remaining_ms })
    }

    /// What the admission machine knows of this delivery before anything is read, and the model
    /// of its next call when no spend limit can count it (see [`Processor::next_call_micros`]).
    fn admission_facts(
        &self,
        msg: &JobMessage,
        job: &NewJob,
        inv: &Invocation,
        link: &Link<P>,
    ) -> (Facts, Option<String>) {
        let next_call = self.next_call_micros(msg, job, link);
        let facts = Facts {
            deadline_at: job.deadline_at,
            skew: self.settings.skew_ms,
            latest_call_start: self.latest_call_start(inv, link),
            can_retrieve: link.provider.can_retrieve(),
            in_ledger: msg.in_ledger,
            next_call_micros: *next_call.as_ref().unwrap_or(&0),
            max_cost_micros: job.max_cost_micros,
            carries_input: msg.keeps_input(),
        };
        (facts, next_call.err())
    }

    /// Goes on from our own write, applied and leaving `record`, with what the admission took
    /// for the call (the pacer's permit, the day's spend): spent on the call, or given back.
    async fn go_on(
        &self,
        applied: Applied,
        record: JobRecord,
        msg: &JobMessage,
        (permit, reserved): (Option<&mut Permit<'_>>, Option<Reserved>),
        inv: &Invocation,
        watch: &dyn AttemptWatch,
    ) -> Processed {
        match applied {
            Applied::Call => {
                if let Some(permit) = permit {
                    permit.spend();
                }
                self.run_attempt(msg, record, inv, watch, reserved).await
            }
            // No call under these writes: the day's spend is given back.
            Applied::Investigate { seen_epoch } => {
                self.settle_spend(reserved, 0).await;
                watch.recovered();
                self.after_recovery(msg, record, seen_epoch, inv, watch)
                    .await
            }
            Applied::End(outcome) => {
                self.settle_spend(reserved, 0).await;
                Processed {
                    outcome,
                    view: Some(record),
                }
            }
        }
    }
}
