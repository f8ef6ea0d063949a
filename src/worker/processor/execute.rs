//! The executor: one delivery's [`Delivery`] driven to its end, each command carried out
//! against the pacer, the ledger, the provider and the results bucket, and what they said fed
//! back. The protocol decides; this file only does.

use std::time::Duration;

use super::run::{Spent, count_usage};
use super::spend::{Grant, NextModel};
use super::{AttemptWatch, Invocation, Processed, Processor};
use crate::clock::Clock;
use crate::job::{JobItem, JobMessage, JobState, Millis, NewJob};
use crate::ledger::spend::UNPRICED_MODEL;
use crate::ledger::{JobLedger, Write};
use crate::protocol::delivery::{Charge, Command, Delivery, Observation};
use crate::protocol::ending::{Closed, EndWrite};
use crate::provider::Provider;
use crate::worker::pacing::Pacer;

/// What the executor holds for one delivery beside its machine.
pub(super) struct Held<'a> {
    /// The job as its message says, for the writes that create or settle it.
    pub(super) job: NewJob,
    /// The model each provider's next call is counted under.
    pub(super) models: Vec<NextModel>,
    /// The capacity and the day's spend taken for the call.
    pub(super) grant: Option<Grant<'a>>,
    /// What the last call used, once one was made.
    pub(super) spent: Option<Spent>,
    /// When the claim's call started.
    pub(super) started: Millis,
    /// An answer that came too late to be accepted was logged.
    pub(super) late_said: bool,
}

impl<L: JobLedger, P: Provider, C: Clock> Processor<L, P, C> {
    /// Processes a delivery of `msg` from the item already read (`start`), if any: its
    /// [`Delivery`]'s commands, carried out until it ends.
    pub(super) async fn deliver(
        &self,
        msg: &JobMessage,
        start: Option<JobItem>,
        owner_id: &str,
        inv: &Invocation,
        watch: &dyn AttemptWatch,
    ) -> Processed {
        let now = self.clock.now_ms();
        let job = NewJob::from_message(msg, now, &self.settings.job_defaults);
        let (lanes, models) = self.delivery_lanes(msg, &job, inv);
        let (mut d, mut command) =
            Delivery::start(owner_id.to_owned(), msg.digest.clone(), lanes, start, now);
        // The capped shares (the producer's, the account's), taken first.
        let shares = self.share_pacers(msg);
        let mut held = Held {
            job,
            models,
            grant: None,
            spent: None,
            started: now,
            late_said: false,
        };
        // When the request a refusal or a read answers left (a look at a batch, or the input
        // kept, before a write is part of it): what they show is judged as of then.
        let (mut sent_at, mut before_write) = (now, false);
        loop {
            if !before_write {
                sent_at = self.clock.now_ms();
            }
            before_write = matches!(command, Command::LookAtBatch | Command::KeepInput);
            let said = match command {
                Command::Take => self.take(&d, &mut held, msg, inv, &shares, watch).await,
                Command::Release => {
                    let reserved = held.grant.take().and_then(|mut g| g.take_reserved());
                    self.charge_spend(reserved, 0, None).await;
                    Observation::Carried
                }
                Command::LookAtBatch => self.look_at_batch(&d, msg, watch).await,
                Command::Write(op) => self.write(&d, &held.job, &op, msg).await,
                Command::ReadBack { pause_ms } => {
                    tokio::time::sleep(Duration::from_millis(pause_ms as u64)).await;
                    match self.ledger.get(&msg.job_id).await {
                        Ok(seen) => Observation::Read(seen),
                        Err(_) => Observation::ReadFailed,
                    }
                }
                Command::Use => self.use_capacity(&d, &mut held),
                Command::LookForAnswer => self.look_for_answer(&d, &mut held, msg, watch).await,
                Command::Call(step) => {
                    // On the heap: the call's state is large, and the loop's polls stay shallow.
                    let call = Box::pin(self.call(&mut d, step, msg, (inv, watch), held.started));
                    let (next, spent) = call.await;
                    d.set_used(spent.priced(&self.settings.prices));
                    held.spent = Some(spent);
                    command = next;
                    continue;
                }
                // Kept only where SQS may drop the message, which otherwise carries it, and for
                // an attempt left unknown (an operator's decision runs it at once, by id).
                Command::KeepInput => {
                    let keep =
                        self.may_drop(msg, &held.job) || leaves_unknown(&d, self.clock.now_ms());
                    Observation::Kept(match keep {
                        true => self.kept_input(msg).await,
                        false => None,
                    })
                }
                Command::End(step) => {
                    command = self.end(&mut d, &mut held, step, msg, inv).await;
                    continue;
                }
                Command::Charge { attempt, charge } => {
                    self.charge(&d, &mut held, attempt, charge, watch).await
                }
                Command::Done(closed) => return self.ended(&d, *closed, &msg.job_id).await,
            };
            command = self.observe(&mut d, said, sent_at, &msg.job_id);
        }
    }

    /// Feeds `said` to `d`, as of `sent_at` for a refusal or a read (else now), and says what
    /// it came to that an operator should know: our write seen applied after its answer was
    /// lost, or the next provider taking the job.
    fn observe(
        &self,
        d: &mut Delivery,
        said: Observation,
        sent_at: Millis,
        job_id: &str,
    ) -> Command {
        let hop = d.hop();
        let ours = matches!(
            &said,
            Observation::Read(Some(_)) | Observation::Refused(Some(_))
        );
        let at = match &said {
            Observation::Refused(_) | Observation::Read(_) => sent_at,
            _ => self.clock.now_ms(),
        };
        let command = d.observe(said, at);
        if ours && d.owner().is_some() {
            tracing::info!(job_id, "our write was applied though its answer was lost");
        }
        if d.hop() != hop {
            tracing::info!(
                job_id,
                "the provider refused before any work; the next one takes the job"
            );
        }
        command
    }

    /// The claim holds: the pacer's permit goes to its call, which starts now.
    fn use_capacity(&self, d: &Delivery, held: &mut Held<'_>) -> Observation {
        if let Some(grant) = &mut held.grant {
            grant.use_for_call();
        }
        tracing::Span::current().record("epoch", d.owner().map(|o| o.owner_epoch));
        held.started = self.clock.now_ms();
        Observation::Carried
    }

    /// The provider's answer to whether the batch of the line the delivery's item shows still
    /// runs (a record that waits for it is counted).
    async fn look_at_batch(
        &self,
        d: &Delivery,
        msg: &JobMessage,
        watch: &dyn AttemptWatch,
    ) -> Observation {
        let runs = match d.view() {
            Some(seen) => self.batch_runs(msg, seen).await,
            None => false,
        };
        if runs {
            watch.batch_waiting();
        }
        Observation::BatchRunning(runs)
    }

    /// After a recovery claim fenced a lapsed owner: the answer it stored in the results bucket
    /// and never accepted, if any (what its attempt is counted at when nothing is asked, too).
    async fn look_for_answer(
        &self,
        d: &Delivery,
        held: &mut Held<'_>,
        msg: &JobMessage,
        watch: &dyn AttemptWatch,
    ) -> Observation {
        watch.recovered();
        let Some(fenced) = d.owner() else {
            return Observation::Found(None);
        };
        tracing::warn!(
            job_id = %msg.job_id,
            // A recovery claim raises the epoch it fenced by one.
            lapsed_epoch = fenced.owner_epoch.saturating_sub(1),
            epoch = fenced.owner_epoch,
            "recovered a job whose lease lapsed"
        );
        held.spent = None;
        let stored = self.stored_answer(fenced).await;
        if stored.is_some() {
            let lapsed_epoch = fenced.owner_epoch.saturating_sub(1);
            tracing::info!(job_id = %msg.job_id, lapsed_epoch, "the lapsed owner's stored answer is accepted");
        }
        Observation::Found(stored)
    }

    /// The attempt numbered `attempt` ended: the day's spend corrected to what its call cost
    /// (`charge`: what the provider said, else nothing or all it reserved), and the usage its
    /// end recorded counted.
    async fn charge(
        &self,
        d: &Delivery,
        held: &mut Held<'_>,
        attempt: u32,
        charge: Charge,
        watch: &dyn AttemptWatch,
    ) -> Observation {
        let reserved = held.grant.take().and_then(|mut g| g.take_reserved());
        let spent = held.spent.take();
        let heard = d.used().heard.and_then(|u| u.cost_micros);
        let actual = match charge {
            Charge::Heard => heard,
            Charge::HeardOrReserved => heard.or(reserved.as_ref().map(|r| r.micros)),
        };
        let path = spent.as_ref().map(|s| s.rate);
        self.charge_spend(reserved, actual.unwrap_or(0), path).await;
        if let Some(spent) = spent {
            count_usage(d.view(), attempt, &spent, watch);
        }
        Observation::Carried
    }

    /// The delivery's end: a refusal said, a refused answer's object removed once nobody can
    /// accept it (what nobody accepts otherwise is the orphan sweep's, or the lifecycle rule's).
    async fn ended(&self, d: &Delivery, closed: Closed, job_id: &str) -> Processed {
        if d.admission().is_some_and(|a| a.unconfirmed()) {
            tracing::error!(
                job_id,
                "a write and every read after it went unanswered; if the write was applied, the job waits for its lease to lapse"
            );
        }
        if closed.refused {
            tracing::warn!(
                job_id,
                current_epoch = closed.view.as_ref().map(|s| s.owner_epoch),
                current_state = closed.view.as_ref().map(|s| s.state.as_str()),
                "end of attempt refused; result not published"
            );
        }
        if let Some(blob) = &closed.discard
            && let Some(store) = self.blobs()
            && let Err(e) = store.delete(&blob.key).await
        {
            tracing::warn!(error = %e, "removing a refused answer's object failed");
        }
        Processed {
            outcome: closed.outcome,
            view: closed.view,
        }
    }

    /// The write the admission asks for, as the delivery's owner, and what it came to.
    async fn write(
        &self,
        d: &Delivery,
        job: &NewJob,
        op: &crate::protocol::admission::Op,
        msg: &JobMessage,
    ) -> Observation {
        let owner = d.owner_id();
        let recovery = d.recovery(self.clock.now_ms());
        let write = self.write_op(msg, (job, op), (&owner, d.lane()), d.view(), recovery);
        match write.await {
            Ok(Write::Applied(record)) => Observation::Applied(record),
            Ok(Write::Refused(seen)) => Observation::Refused(seen),
            Err((e, sent)) => {
                tracing::warn!(job_id = %job.job_id, error = %e, "ledger call failed");
                match sent {
                    true => Observation::Unanswered,
                    false => Observation::WriteFailed,
                }
            }
        }
    }

    /// Capacity for the call on the delivery's provider (see [`Processor::take_capacity`]),
    /// held in `held`; a model without a price waits as its rule says.
    async fn take<'a>(
        &'a self,
        d: &Delivery,
        held: &mut Held<'a>,
        msg: &JobMessage,
        inv: &Invocation,
        shares: &'a [std::sync::Arc<Pacer>],
        watch: &dyn AttemptWatch,
    ) -> Observation {
        let lane = d.lane();
        let model = match &held.models[lane] {
            Ok(model) => model.as_deref().unwrap_or(UNPRICED_MODEL),
            Err(model) => {
                let wait_ms = self.unpriced_wait(msg, model, watch);
                return Observation::NoCapacity { wait_ms };
            }
        };
        let micros = d.admission().map_or(0, |a| a.facts().next_call_micros);
        let link = &self.links[lane];
        match self
            .take_capacity(msg, inv, link, shares, (micros, model), watch)
            .await
        {
            Ok((permit, reserved)) => {
                let spend = self.spend.clone();
                held.grant = Some(Grant::new(permit, reserved, spend, self.clock.now_ms()));
                Observation::Taken
            }
            Err(wait_ms) => Observation::NoCapacity { wait_ms },
        }
    }
}

/// Whether the write `d` is about to make leaves its job `unknown`.
fn leaves_unknown(d: &Delivery, now: Millis) -> bool {
    matches!(
        d.end_write(now),
        Some(EndWrite::End(req)) if req.end.target() == JobState::Unknown
    )
}
