//! Running a claimed attempt, or asking about a recovered one: the steps of its [`Calling`],
//! carried out against the provider, the pacer and the ledger, with ownership watched.

use std::time::Duration;

use tracing::Instrument;

use super::{AttemptWatch, Invocation, Link, Processor, StopSignal};
use crate::clock::Clock;
use crate::job::contract::Contract;
use crate::job::prices::{PriceTable, Rate};
use crate::job::{JobItem, JobMessage, Millis, Usage};
use crate::ledger::JobLedger;
use crate::protocol::calling::{Bound, CallFacts, CallStep, Calling, MIN_CALL_BUDGET_MS, Said};
use crate::protocol::delivery::{Command, Delivery, Observation, Used};
use crate::protocol::ending::Ending;
use crate::provider::batch::parse_ref;
use crate::provider::{Progress, Provider, ProviderRequest, Retrieval, Submission};
use crate::telemetry;

/// What a call used: what the provider reported with an answer, the estimate an attempt whose
/// outcome is unknown is recorded with, and the model whose prices they are paid at.
#[derive(Debug, Clone)]
pub(super) struct Spent {
    pub(super) heard: Option<Usage>,
    pub(super) estimate: Usage,
    /// The provider that ran the call, and its model.
    pub(super) provider: &'static str,
    pub(super) model: String,
    /// The rate it is paid at: a batch line's, or the service tier its job asks for.
    pub(super) rate: Rate,
    /// What the call had to show for itself when it ended (bytes streamed, a batch's counts):
    /// a hand-over writes it.
    pub(super) said: Option<crate::job::CallProgress>,
}

impl Spent {
    /// What the call used, priced by `prices`: what was heard, and the estimate.
    pub(super) fn priced(&self, prices: &PriceTable) -> Used {
        let priced = |u: Usage| Usage {
            cost_micros: self.cost(&u, prices),
            ..u
        };
        Used {
            heard: self.heard.map(priced),
            estimate: priced(self.estimate),
        }
    }

    /// What `usage` of this call cost at `prices`: at the tier its answer names, else the rate
    /// it was asked at.
    pub(super) fn cost(&self, usage: &Usage, prices: &PriceTable) -> Option<u64> {
        prices.cost_at(&self.model, usage, self.rate.served(usage.tier))
    }
}

/// Tells `watch` what the attempt numbered `attempt` (its call `spent`) recorded it used, as
/// the item its end left (`view`) shows it.
pub(super) fn count_usage(
    view: Option<&JobItem>,
    attempt: u32,
    spent: &Spent,
    watch: &dyn AttemptWatch,
) {
    let recorded = view
        .and_then(|r| r.attempt_log.get(attempt.checked_sub(1)? as usize))
        .filter(|a| a.number == attempt)
        .and_then(|a| a.usage);
    if let Some(usage) = recorded {
        watch.used(spent.provider, &spent.model, &usage);
    }
}

/// Where a call is sent: its provider, the pacer it draws on, and for a line of a batch the
/// line's id as its claim recorded it.
struct Sent<'a, P> {
    link: &'a Link<P>,
    pacer: &'a crate::worker::pacing::Pacer,
    /// A line of a batch: its id, and its job as the batch's list of its jobs keeps it.
    line: Option<(String, crate::job::BatchMember)>,
}

/// One call's provider and what watches it, as [`Processor::carry_out`] takes them.
struct Call<'a, 'r, P> {
    /// The job's message (its input, for a write that keeps it).
    msg: &'a JobMessage,
    link: &'a Link<P>,
    /// The pacer the job's calls draw on (its link's, or its urgent one).
    pacer: &'a crate::worker::pacing::Pacer,
    request: &'a ProviderRequest<'r>,
    inv: &'a Invocation,
    /// Stops the call, and says why.
    stop: &'a StopSignal,
    watch: &'a dyn AttemptWatch,
}

/// What stopped the call: an operator's cancel, or ownership lost.
fn stopped(stop: &StopSignal) -> Observation {
    match stop.withdrawn() {
        true => Observation::Withdrawn,
        false => Observation::Lost,
    }
}

/// The longest wait for a cancel request, however much time the invocation has.
const CANCEL_WAIT_MS: Millis = 5_000;

impl<L: JobLedger, P: Provider, C: Clock> Processor<L, P, C> {
    /// What the call's machine knows of this invocation and the settings.
    pub(super) fn call_facts(&self, inv: &Invocation, link: &Link<P>) -> CallFacts {
        let s = &self.settings;
        CallFacts {
            skew: s.skew_ms,
            provider_timeout_ms: s.provider_timeout_ms,
            min_call_ms: MIN_CALL_BUDGET_MS,
            invocation_end: inv
                .deadline
                .map_or(Millis::MAX, |d| d - s.deadline_margin_ms),
            latest_call_start: self.latest_call_start(inv, link),
            renewed: s.heartbeat_ms > 0,
            poll_ms: s.poll_ms,
            horizon_ms: link.pacer.settings().horizon_ms,
            replay: s.replay,
        }
    }

    /// Carries out the call's steps, from `step`, until the delivery `d` leaves its call, the
    /// owner's lease kept by `watch` meanwhile. Returns the delivery's next command and what
    /// the call used.
    pub(super) async fn call(
        &self,
        d: &mut Delivery,
        step: CallStep,
        msg: &JobMessage,
        (inv, watch): (&Invocation, &dyn AttemptWatch),
        started: Millis,
    ) -> (Command, Spent) {
        let Some(owner) = d.owner() else {
            let spent = self.estimated(msg, d);
            return (d.observe(Observation::Lost, self.clock.now_ms()), spent);
        };
        // Sent when ownership is lost (a renewal refused, or the lease about to lapse), or an
        // operator cancelled the job.
        let epoch = owner.owner_epoch;
        let stop = watch.running(
            &msg.job_id,
            epoch,
            owner.owner_until.unwrap_or_else(|| self.clock.now_ms()),
            owner.deadline_at,
        );
        let link = &self.links[d.lane()];
        // The tier of the path chosen at the claim, if one was.
        let input =
            super::paths::on_path(self.routed_input(link, msg), crate::job::path::of(owner));
        let contract = self.contracts.for_job(&msg.contract);
        let mut request = self.request(msg, owner, &input, &contract);
        // The progress rule: a streamed call that shows no bytes for the timeout is hung.
        let progress = Progress::new(Duration::from_millis(
            self.settings.progress_timeout_ms.max(1) as u64,
        ));
        watch.progress(&progress);
        request.progress = Some(progress.clone());
        let mut spent = Spent {
            heard: None,
            estimate: Usage::estimate(request.input_json.len(), request.max_output_tokens),
            provider: link.provider.name(),
            model: link.provider.model(request.input).to_owned(),
            rate: Rate::of(super::batches::in_batch(owner), &input),
            said: None,
        };
        let call = Call {
            msg,
            link,
            pacer: link.pacer_for(msg),
            request: &request,
            inv,
            stop: &stop,
            watch,
        };
        let mut step = step;
        let next = loop {
            let said = self.carry_out(&call, d, step, &mut spent.heard).await;
            // A call that took all the invocation left it was cut off.
            if said == Observation::Said(Said::TimedOut)
                && d.calling().is_some_and(|c| c.bound() == Bound::Invocation)
            {
                watch.deadline_cutoff();
            }
            match d.observe(said, self.clock.now_ms()) {
                Command::Call(next) => step = next,
                next => break next,
            }
        };
        watch.call_ended();
        spent.said = progress.said(epoch);
        self.after_call(d, &spent, started, watch, &msg.job_id);
        (next, spent)
    }

    /// What the call the delivery `d` left (`spent`, sent at `started`) says of its provider
    /// and path: its latency, and, for an answer, how long its path took from the claim.
    fn after_call(
        &self,
        d: &Delivery,
        spent: &Spent,
        started: Millis,
        watch: &dyn AttemptWatch,
        job_id: &str,
    ) {
        if d.sent() {
            let took = self.clock.now_ms() - started;
            let took = u64::try_from(took).unwrap_or(0);
            watch.provider_latency(spent.provider, took);
        }
        // From its claim, for the chooser (a batch line's is not kept: decision 167): an
        // answer's time, or a call's that ended uncertain, which took at least as long (a path's
        // slowest calls are cut off, never answered, and would otherwise go unseen).
        let cut_off = d.ending().is_some_and(Ending::uncertain);
        if (spent.heard.is_some() || cut_off)
            && let Some(claimed) = d.owner().and_then(|o| o.attempt_log.last())
        {
            let took = self.clock.now_ms() - claimed.started_at;
            self.path_took(spent.provider, &spent.model, spent.rate, took);
        }
        if d.ending().is_some_and(Ending::hands_over) {
            tracing::info!(%job_id, "call still running upstream; handing it over to the next delivery");
        }
    }

    /// Carries out one step of the call, and what the world said to it. `heard`: the usage the
    /// provider reported with an answer, whatever its contract said of it.
    async fn carry_out(
        &self,
        call: &Call<'_, '_, P>,
        d: &Delivery,
        step: CallStep,
        heard: &mut Option<Usage>,
    ) -> Observation {
        let (request, watch) = (call.request, call.watch);
        let Some(machine) = d.calling() else {
            return Observation::Lost;
        };
        match step {
            CallStep::Submit { budget_ms } => {
                self.submit_step(call, machine, budget_ms, heard).await
            }
            CallStep::Throttled { retry_after_ms } => {
                watch.throttled(call.link.provider.name());
                call.pacer.throttled(self.clock.now_ms(), retry_after_ms);
                Observation::Paced {
                    paused_until: call.pacer.paused_until(),
                }
            }
            CallStep::Resend { at } => self.resend_step(call, at).await,
            CallStep::Record => {
                let mut req = machine.record(self.clock.now_ms());
                // A line of a batch a webhook will announce is collected by a trigger by id:
                // the record of its batch keeps the input the trigger cannot carry.
                let announced = parse_ref(&req.provider_ref).is_some_and(|(b, _)| b.is_some());
                if self.settings.batching.webhooks && announced && !machine.owner().keeps_input() {
                    req.input = self.kept_input(call.msg).await;
                }
                match self.ledger.record_ref(req).await {
                    Ok(write) => Observation::Recorded(Some(write)),
                    Err(e) => {
                        tracing::warn!(job_id = %request.job_id, error = %e, "recording the reference failed");
                        Observation::Recorded(None)
                    }
                }
            }
            CallStep::Retrieve { wait_ms } => {
                self.retrieve_step(call, machine, wait_ms, heard).await
            }
            CallStep::Pause { ms } => tokio::select! {
                biased;
                _ = call.stop.stopped() => stopped(call.stop),
                _ = tokio::time::sleep(Duration::from_millis(ms as u64)) => Observation::Paused,
            },
            CallStep::CancelUpstream => {
                if let Some((reference, _)) = machine.reference() {
                    tracing::info!(job_id = %request.job_id, "cancelling the background call: its answer would not be accepted");
                    self.cancel(&call.link.provider, reference, call.inv).await;
                }
                Observation::CancelledUpstream
            }
            // The delivery never asks for a call's end: it takes it over.
            CallStep::Done(_) => Observation::Lost,
        }
    }

    /// The call sent, within `budget_ms`, and what it said.
    async fn submit_step(
        &self,
        call: &Call<'_, '_, P>,
        machine: &Calling,
        budget_ms: Millis,
        heard: &mut Option<Usage>,
    ) -> Observation {
        // A line of a batch goes by the id its claim recorded.
        let owner = machine.owner();
        let line = owner
            .last_provider_ref()
            .and_then(crate::provider::batch::parse_ref)
            .map(|(_, line)| {
                let member = crate::job::BatchMember {
                    job_id: owner.job_id.clone(),
                    class: owner.class.clone(),
                };
                (line.to_owned(), member)
            });
        let sent = Sent {
            link: call.link,
            pacer: call.pacer,
            line,
        };
        let mut said = self
            .submit(sent, call.request, budget_ms, call.stop, heard)
            .await;
        // An operator's cancel: the call stops (one sent) or never goes (a line still
        // gathering).
        if matches!(said, Said::Lost | Said::NotSent(_)) && call.stop.withdrawn() {
            said = Said::Withdrawn;
        }
        if matches!(&said, Said::Started(r) if crate::provider::batch::is_batch_ref(r)) {
            call.watch.batched();
        }
        Observation::Said(said)
    }

    /// The re-send of a call the provider refused for its rate limit, at `at`: out of the calls
    /// in flight while it waits, and back only when the adaptive limit the refusal lowered has
    /// room.
    async fn resend_step(&self, call: &Call<'_, '_, P>, at: Millis) -> Observation {
        let latest = self.latest_call_start(call.inv, call.link);
        let resent = tokio::select! {
            // Ownership lost first whatever is ready at once, so a seeded simulation replays
            // the same way.
            biased;
            _ = call.stop.stopped() => false,
            resent = call.pacer.resend(&self.clock, at, latest) => resent,
        };
        match call.stop.withdrawn() {
            true => Observation::Withdrawn,
            false => Observation::Resent(resent),
        }
    }

    /// The provider asked about the call by its reference, waiting at most `wait_ms`; an answer
    /// is judged against the job's contract before anything reads it.
    async fn retrieve_step(
        &self,
        call: &Call<'_, '_, P>,
        machine: &Calling,
        wait_ms: Millis,
        heard: &mut Option<Usage>,
    ) -> Observation {
        let (reference, started_at) = machine
            .reference()
            .map(|(r, at)| (r.to_owned(), at))
            .unwrap_or_default();
        let asked = tokio::time::timeout(
            Duration::from_millis(wait_ms as u64),
            call.link
                .provider
                .retrieve(&reference, started_at, call.request),
        );
        tokio::select! {
            biased;
            _ = call.stop.stopped() => stopped(call.stop),
            found = asked => {
                let found = match found {
                    Ok(Retrieval::Completed(answer)) => {
                        *heard = answer.usage.or(*heard);
                        match answer.judged(call.request.output) {
                            Ok(answer) => Retrieval::Completed(answer),
                            Err(invalid) => Retrieval::Failed(invalid),
                        }
                    }
                    Ok(found) => found,
                    Err(_) => Retrieval::Unreachable { retry_after_ms: None },
                };
                Observation::Retrieved(found)
            }
        }
    }

    /// Sends the request, waiting at most `budget_ms`; `stop` ends the wait (the answer could
    /// not be accepted anyway). An answer's usage is put in `heard`.
    async fn submit(
        &self,
        sent: Sent<'_, P>,
        request: &ProviderRequest<'_>,
        budget_ms: Millis,
        stop: &StopSignal,
        heard: &mut Option<Usage>,
    ) -> Said {
        let Sent { link, pacer, line } = sent;
        // A GenAI client span (`chat {model}`), its figures recorded once answered.
        let model = link.provider.model(request.input);
        let span = tracing::debug_span!(
            "provider",
            otel.name = %format_args!("chat {model}"),
            otel.kind = "client",
            job_id = %request.job_id,
            epoch = request.epoch,
            attempt = request.attempt,
            gen_ai.operation.name = "chat",
            gen_ai.provider.name = link.provider.name(),
            gen_ai.request.model = model,
            gen_ai.request.max_tokens = i64::try_from(request.max_output_tokens).unwrap_or(i64::MAX),
            gen_ai.output.type = request.output.format().as_str(),
            server.address = link.provider.server_address(),
        );
        // The claim decided: a line's pending reference recorded (the job's own ask, or the
        // path the worker chose) makes the attempt a line of a batch, and nothing else does.
        if let Some((line, member)) = line {
            // A line waits for its batch within its budget, whoever else loses ownership
            // meanwhile: the record of its batch's reference is fenced, and a line taken into
            // a batch is found again by whoever owns the job next.
            return self
                .submit_line(link, (request, &member), &line, budget_ms, stop)
                .instrument(span)
                .await;
        }
        let sent = tokio::time::timeout(
            Duration::from_millis(budget_ms as u64),
            link.provider.submit(request).instrument(span.clone()),
        );
        let said = tokio::select! {
            biased;
            _ = stop.stopped() => Said::Lost,
            called = sent => match called {
                Ok(Ok(submission)) => {
                    pacer.answered();
                    match submission {
                        // Judged against the job's contract before anything reads it.
                        Submission::Answered(answer) => {
                            *heard = answer.usage.or(*heard);
                            let cost = answer
                                .usage
                                .and_then(|u| {
                                    let rate = Rate::of(false, request.input).served(u.tier);
                                    self.settings.prices.cost_at(model, &u, rate)
                                });
                            telemetry::record_call(&span, &answer, cost);
                            match answer.judged(request.output) {
                                Ok(answer) => Said::Answered(answer),
                                Err(invalid) => Said::Failed(invalid),
                            }
                        }
                        Submission::Started(reference) => Said::Started(reference),
                    }
                }
                Ok(Err(error)) => Said::Failed(error),
                Err(_) => Said::TimedOut,
            },
        };
        if let Some(error_type) = error_type(&said) {
            telemetry::record_failure(&span, error_type);
        }
        said
    }

    /// Asks the provider to cancel a background call, waiting at most until this invocation's
    /// margin: a cancel that stalls must not delay the batch response. A cancel not sent is
    /// harmless; the call's answer is never accepted.
    pub(super) async fn cancel(&self, provider: &P, provider_ref: &str, inv: &Invocation) {
        let left = inv.deadline.map_or(CANCEL_WAIT_MS, |d| {
            d - self.settings.deadline_margin_ms - self.clock.now_ms()
        });
        let wait = Duration::from_millis(left.clamp(1, CANCEL_WAIT_MS) as u64);
        if tokio::time::timeout(wait, provider.cancel(provider_ref))
            .await
            .is_err()
        {
            tracing::warn!("cancel request abandoned: no time left to wait for it");
        }
    }

    /// What a call of `msg`'s job in the delivery `d` is counted at when nothing was heard of
    /// it: its estimate, at the model it runs.
    pub(super) fn estimated(&self, msg: &JobMessage, d: &Delivery) -> Spent {
        let link = &self.links[d.lane()];
        let input = super::paths::on_path(
            self.routed_input(link, msg),
            d.owner().and_then(crate::job::path::of),
        );
        Spent {
            heard: None,
            estimate: Usage::estimate(
                msg.input_canonical.len(),
                self.settings.policy.output_tokens(&input),
            ),
            provider: link.provider.name(),
            model: link.provider.model(&input).to_owned(),
            rate: Rate::of(d.owner().is_some_and(super::batches::in_batch), &input),
            said: None,
        }
    }

    /// The provider request of the owner's current attempt.
    pub(super) fn request<'a>(
        &self,
        msg: &'a JobMessage,
        owner: &JobItem,
        input: &'a serde_json::Map<String, serde_json::Value>,
        output: &'a Contract,
    ) -> ProviderRequest<'a> {
        let attempt = owner.attempts;
        ProviderRequest {
            job_id: &msg.job_id,
            attempt,
            epoch: owner.owner_epoch,
            contract: &msg.contract,
            output,
            input,
            input_json: &msg.input_canonical,
            max_output_tokens: self.settings.policy.output_tokens(input),
            // Stable for the re-sends of this claim; a claim of the same number after a
            // give-back is another request.
            idempotency_key: self
                .settings
                .idempotency_key(&msg.job_id, attempt, owner.owner_epoch),
            progress: None,
        }
    }
}

/// What a call that did not answer is in its trace's `error.type`: the
/// [`crate::provider::ProviderError::kind`] of a refusal or a failure, `timeout` for a call the
/// invocation stopped waiting for, `ownership_lost` for one whose claim was taken over; `None`
/// for one that answered, started or was withdrawn.
fn error_type(said: &Said) -> Option<&'static str> {
    match said {
        Said::Failed(error) => Some(error.kind()),
        Said::TimedOut => Some("timeout"),
        Said::Lost => Some("ownership_lost"),
        _ => None,
    }
}
