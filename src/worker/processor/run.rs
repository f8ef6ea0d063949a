//! Running a claimed attempt, or asking about a recovered one: the steps of its [`Calling`],
//! carried out against the provider, the pacer and the ledger, with ownership watched.

use std::time::Duration;

use tracing::Instrument;

use super::{AttemptWatch, Invocation, Link, Processed, Processor, StopSignal};
use crate::clock::Clock;
use crate::job::contract::Contract;
use crate::job::prices::{PriceTable, Rate};
use crate::job::{JobMessage, JobRecord, Millis, Usage};
use crate::ledger::JobLedger;
use crate::protocol::calling::{CallFacts, CallStep, Calling, MIN_CALL_BUDGET_MS, Said};
use crate::protocol::ending::Waited;
use crate::provider::{Progress, Provider, ProviderRequest, Retrieval, Submission};
use crate::telemetry;

/// What a call used: what the provider reported with an answer, the estimate an attempt whose
/// outcome is unknown is recorded with, and the model whose prices they are paid at.
#[derive(Debug, Clone)]
pub(super) struct Spent {
    pub(super) heard: Option<Usage>,
    pub(super) estimate: Usage,
    pub(super) model: String,
    /// The rate it is paid at: a batch line's, or the service tier its job asks for.
    pub(super) rate: Rate,
}

impl Spent {
    /// The usage an attempt's end records, priced by `prices`: none for an attempt given back
    /// (nothing ran), the estimate for one whose outcome is unknown unless an answer said, else
    /// what was heard.
    pub(super) fn recorded(
        &self,
        end: &crate::ledger::AttemptEnd,
        prices: &PriceTable,
    ) -> Option<Usage> {
        use crate::ledger::AttemptEnd;
        let usage = match end {
            AttemptEnd::GivenBack { .. } => None,
            AttemptEnd::Unknown { .. } | AttemptEnd::Replay { .. } => {
                self.heard.or(Some(self.estimate).filter(|e| e.total() > 0))
            }
            _ => self.heard,
        };
        usage.map(|u| Usage {
            cost_micros: self.cost(&u, prices),
            ..u
        })
    }

    /// What `usage` of this call cost at `prices`: at the tier its answer names, else the rate
    /// it was asked at.
    pub(super) fn cost(&self, usage: &Usage, prices: &PriceTable) -> Option<u64> {
        prices.cost_at(&self.model, usage, self.rate.served(usage.tier))
    }
}

/// Tells `watch` what the attempt numbered `attempt` recorded it used, if its end was written.
pub(super) fn count_usage(
    processed: &Processed,
    attempt: u32,
    model: &str,
    watch: &dyn AttemptWatch,
) {
    let recorded = processed
        .view
        .as_ref()
        .and_then(|r| r.attempt_log.get(attempt.checked_sub(1)? as usize))
        .filter(|a| a.number == attempt)
        .and_then(|a| a.usage);
    if let Some(usage) = recorded {
        watch.used(model, &usage);
    }
}

/// Whether the item `processed` left shows the attempt claimed at `epoch` ended with nothing
/// run: refused before any work by the provider's own word (a definite failure, a rate limit
/// given back) or never sent. Such a call costs nothing, whatever it reserved.
fn ran_nothing(processed: &Processed, epoch: u64) -> bool {
    use crate::job::AttemptOutcome as O;
    processed.view.as_ref().is_some_and(|r| {
        r.attempt_log.iter().chain(&r.given_back).any(|a| {
            a.epoch == epoch
                && matches!(
                    a.outcome,
                    O::Transient | O::Permanent | O::Throttled | O::NotSent
                )
        })
    })
}

/// Where a call is sent: its provider, the pacer it draws on, and for a line of a batch the
/// line's id as its claim recorded it.
struct Sent<'a, P> {
    link: &'a Link<P>,
    pacer: &'a crate::worker::pacing::Pacer,
    line: Option<String>,
}

/// One call's provider and what watches it, as [`Processor::carry_out`] takes them.
struct Call<'a, 'r, P> {
    link: &'a Link<P>,
    /// The pacer the job's calls draw on (its link's, or its urgent one).
    pacer: &'a crate::worker::pacing::Pacer,
    request: &'a ProviderRequest<'r>,
    inv: &'a Invocation,
    /// Stops the call, and says why.
    stop: &'a StopSignal,
    watch: &'a dyn AttemptWatch,
}

/// What the call comes to when `stop` stopped it: an operator's cancel, or ownership lost.
fn stopped(machine: &mut Calling, stop: &StopSignal) -> CallStep {
    if stop.withdrawn() {
        machine.withdrawn()
    } else {
        machine.lost()
    }
}

/// The longest wait for a cancel request, however much time the invocation has.
const CANCEL_WAIT_MS: Millis = 5_000;

impl<L: JobLedger, P: Provider, C: Clock> Processor<L, P, C> {
    /// Sends the call of the attempt `claimed` holds, follows it to its end and ends the attempt.
    pub(super) async fn run_attempt(
        &self,
        msg: &JobMessage,
        claimed: JobRecord,
        inv: &Invocation,
        watch: &dyn AttemptWatch,
        reserved: Option<super::Reserved>,
    ) -> Processed {
        tracing::Span::current().record("epoch", claimed.owner_epoch);
        let started = self.clock.now_ms();
        let facts = self.call_facts(inv, self.link_of(&claimed));
        let (machine, step) = Calling::start(facts, claimed, started);
        let sent = matches!(step, CallStep::Submit { .. });
        let (owner, waited, spent) = self.call(msg, machine, step, inv, watch).await;
        if sent {
            let took = self.clock.now_ms() - started;
            watch.provider_latency(u64::try_from(took).unwrap_or(0));
        }
        // The day's spend: what the call cost when the provider said; else nothing when the
        // attempt's end shows nothing ran (refused before any work, by the provider's own word,
        // or never sent), else all it reserved (an outcome unknown, or an end not written);
        // corrected once the attempt's end is written, so that the acceptance waits for no
        // other write.
        let heard = spent
            .heard
            .and_then(|u| spent.cost(&u, &self.settings.prices));
        let (attempt, epoch, model) = (owner.attempts, owner.owner_epoch, spent.model.clone());
        let processed = self.end_attempt(owner, waited, spent, msg, inv).await;
        let actual = heard
            .or(reserved
                .as_ref()
                .filter(|_| sent && !ran_nothing(&processed, epoch))
                .map(|r| r.micros))
            .unwrap_or(0);
        self.settle_spend(reserved, actual).await;
        count_usage(&processed, attempt, &model, watch);
        processed
    }

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

    /// Carries out the steps of `machine` from `step` until the call comes to its end, the
    /// owner's lease kept by `watch` meanwhile. Returns the owner's item, what the call came
    /// to, and what it used.
    pub(super) async fn call(
        &self,
        msg: &JobMessage,
        machine: Calling,
        step: CallStep,
        inv: &Invocation,
        watch: &dyn AttemptWatch,
    ) -> (JobRecord, Waited, Spent) {
        let owner = machine.owner();
        // Sent when ownership is lost (a renewal refused, or the lease about to lapse), or an
        // operator cancelled the job.
        let stop = watch.running(
            &msg.job_id,
            owner.owner_epoch,
            owner.owner_until.unwrap_or_else(|| self.clock.now_ms()),
            owner.deadline_at,
        );
        let link = self.link_of(owner);
        let input = self.routed_input(link, msg);
        let contract = self.contracts.for_job(&msg.contract);
        let mut request = self.request(msg, owner, &input, &contract);
        // The progress rule: a streamed call that shows no bytes for the timeout is hung.
        let progress = Progress::new(Duration::from_millis(
            self.settings.progress_timeout_ms.max(1) as u64,
        ));
        watch.progress(&progress);
        request.progress = Some(progress);
        let mut spent = Spent {
            heard: None,
            estimate: Usage::estimate(request.input_json.len(), request.max_output_tokens),
            model: link.provider.model(request.input).to_owned(),
            rate: Rate::of(
                self.batched(link, &input) || super::batches::in_batch(owner),
                &input,
            ),
        };
        let call = Call {
            link,
            pacer: link.pacer_for(msg),
            request: &request,
            inv,
            stop: &stop,
            watch,
        };
        let (owner, waited) = self.carry_out(call, machine, step, &mut spent.heard).await;
        watch.call_ended();
        (owner, waited, spent)
    }

    /// Carries out the steps of `machine` from `step`, each the I/O it names and the answer it
    /// feeds back, until the call comes to its end. `heard`: the usage the provider reported
    /// with an answer, whatever its contract said of it.
    async fn carry_out(
        &self,
        call: Call<'_, '_, P>,
        mut machine: Calling,
        mut step: CallStep,
        heard: &mut Option<Usage>,
    ) -> (JobRecord, Waited) {
        let (request, watch) = (call.request, call.watch);
        loop {
            step = match step {
                CallStep::Submit { budget_ms } => {
                    self.submit_step(&call, &mut machine, budget_ms, heard)
                        .await
                }
                CallStep::Throttled { retry_after_ms } => {
                    watch.throttled();
                    let now = self.clock.now_ms();
                    call.pacer.throttled(now, retry_after_ms);
                    machine.paced(call.pacer.paused_until(), now)
                }
                CallStep::Resend { at } => self.resend_step(&call, &mut machine, at).await,
                CallStep::Record => {
                    let req = machine.record(self.clock.now_ms());
                    let answer = match self.ledger.record_ref(req).await {
                        Ok(write) => Some(write),
                        Err(e) => {
                            tracing::warn!(job_id = %request.job_id, error = %e, "recording the reference failed");
                            None
                        }
                    };
                    machine.recorded(answer, self.clock.now_ms())
                }
                CallStep::Retrieve { wait_ms } => {
                    self.retrieve_step(&call, &mut machine, wait_ms, heard)
                        .await
                }
                CallStep::Pause { ms } => tokio::select! {
                    biased;
                    _ = call.stop.stopped() => stopped(&mut machine, call.stop),
                    _ = tokio::time::sleep(Duration::from_millis(ms as u64)) => {
                        machine.paused(self.clock.now_ms())
                    }
                },
                CallStep::Cancel => {
                    if let Some((reference, _)) = machine.reference() {
                        let reference = reference.to_owned();
                        tracing::info!(job_id = %request.job_id, "cancelling the background call: its answer would not be accepted");
                        self.cancel(&call.link.provider, &reference, call.inv).await;
                    }
                    machine.cancelled(self.clock.now_ms())
                }
                CallStep::Done(waited) => {
                    if machine.cut_off() {
                        watch.deadline_cutoff();
                    }
                    if waited == Waited::Running {
                        tracing::info!(job_id = %request.job_id, "call still running upstream; handing it over to the next delivery");
                    }
                    return (machine.into_owner(), waited);
                }
            }
        }
    }

    /// The call sent, within `budget_ms`, and what it said.
    async fn submit_step(
        &self,
        call: &Call<'_, '_, P>,
        machine: &mut Calling,
        budget_ms: Millis,
        heard: &mut Option<Usage>,
    ) -> CallStep {
        // A line of a batch goes by the id its claim recorded.
        let line = machine
            .owner()
            .last_provider_ref()
            .and_then(crate::provider::batch::parse_ref)
            .map(|(_, line)| line.to_owned());
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
        machine.submitted(said, self.clock.now_ms())
    }

    /// The re-send of a call the provider refused for its rate limit, at `at`: out of the calls
    /// in flight while it waits, and back only when the adaptive limit the refusal lowered has
    /// room.
    async fn resend_step(
        &self,
        call: &Call<'_, '_, P>,
        machine: &mut Calling,
        at: Millis,
    ) -> CallStep {
        let latest = self.latest_call_start(call.inv, call.link);
        let resent = tokio::select! {
            // Ownership lost first whatever is ready at once, so a seeded simulation replays
            // the same way.
            biased;
            _ = call.stop.stopped() => false,
            resent = call.pacer.resend(&self.clock, at, latest) => resent,
        };
        if call.stop.withdrawn() {
            machine.withdrawn()
        } else {
            machine.resent(resent, self.clock.now_ms())
        }
    }

    /// The provider asked about the call by its reference, waiting at most `wait_ms`; an answer
    /// is judged against the job's contract before anything reads it.
    async fn retrieve_step(
        &self,
        call: &Call<'_, '_, P>,
        machine: &mut Calling,
        wait_ms: Millis,
        heard: &mut Option<Usage>,
    ) -> CallStep {
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
            _ = call.stop.stopped() => stopped(machine, call.stop),
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
                machine.retrieved(found, self.clock.now_ms())
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
        );
        if self.batched(link, request.input) {
            // A line waits for its batch within its budget, whoever else loses ownership
            // meanwhile: the record of its batch's reference is fenced, and a line taken into
            // a batch is found again by whoever owns the job next.
            let Some(line) = line else {
                return Said::NotSent("the claim recorded no line".to_owned());
            };
            return self
                .submit_line(link, request, &line, budget_ms, stop)
                .instrument(span)
                .await;
        }
        let sent = tokio::time::timeout(
            Duration::from_millis(budget_ms as u64),
            link.provider.submit(request).instrument(span.clone()),
        );
        tokio::select! {
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
                            telemetry::record_call(&span, answer.usage.as_ref(), answer.finish, cost);
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
        }
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

    /// What a call of `msg`'s job is counted at when nothing was heard of it: its estimate, at
    /// the model it runs.
    pub(super) fn estimated(&self, msg: &JobMessage, owner: &JobRecord) -> Spent {
        let link = self.link_of(owner);
        let input = self.routed_input(link, msg);
        Spent {
            heard: None,
            estimate: Usage::estimate(
                msg.input_canonical.len(),
                self.settings.policy.output_tokens(&input),
            ),
            model: link.provider.model(&input).to_owned(),
            rate: Rate::of(super::batches::in_batch(owner), &input),
        }
    }

    /// The provider request of the owner's current attempt.
    pub(super) fn request<'a>(
        &self,
        msg: &'a JobMessage,
        owner: &JobRecord,
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
