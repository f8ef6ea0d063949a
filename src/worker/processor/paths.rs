//! The path of each attempt ([`crate::job::path`]): the offers of its provider and model under
//! the deployment's `PATHS`, the choice at the claim, and the tier the call then asks for.

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::{Map, Value};

use super::{Link, Processor};
use crate::clock::Clock;
use crate::job::path::{self, Choice, Offer, Times, Wants};
use crate::job::usage::Rate;
use crate::job::{AttemptOutcome, JobItem, JobMessage, Millis, NewJob, Usage};
use crate::ledger::JobLedger;
use crate::ledger::path_times::{SharedTimes, merged};
use crate::provider::Provider;

/// How long a batch line is expected to take, whatever was measured (decision 167): the
/// providers' completion window (OpenAI's `completion_window` takes `24h` only; Anthropic ends a
/// message batch within 24 hours), to which the worker's look at the batch is added.
const BATCH_TAKES_MS: Millis = 24 * 3_600_000;
/// How long a flex call is expected to take: OpenAI's flex processing guide has clients wait
/// up to 15 minutes for one.
const FLEX_TAKES_MS: Millis = 15 * 60_000;
/// How long after a refusal a path is left out of an attempt's offers.
const REFUSED_FOR_MS: Millis = 15 * 60_000;
/// An environment's path times for one provider and model not shared yet, and when it last
/// shared (and read) them.
#[derive(Debug, Default)]
pub(super) struct Unshared {
    taken: Times,
    shared_at: Option<Millis>,
}

impl<L: JobLedger, P: Provider, C: Clock> Processor<L, P, C> {
    /// The path of the attempt about to be claimed for `job` (of `msg`) through `link`
    /// (`input`: its input as routed there; `seen`: its item, if read), at `now`; `None` when
    /// the deployment lets the worker choose none (`PATHS` unset).
    pub(super) fn choose_path(
        &self,
        (link, input): (&Link<P>, &Map<String, Value>),
        (msg, job): (&JobMessage, &NewJob),
        seen: Option<&JobItem>,
        now: Millis,
    ) -> Option<Choice> {
        let allowed = self.settings.batching.paths;
        if !allowed.any() {
            return None;
        }
        let model = link.provider.model(input);
        let usage = Usage::estimate(
            msg.input_canonical.len(),
            self.settings.policy.output_tokens(input),
        );
        let price = self.settings.prices.price(model);
        let measured = self
            .times()
            .get(&(link.provider.name(), model.to_owned()))
            .cloned();
        let sold = |rate: Rate| match rate {
            Rate::Standard => true,
            Rate::Batch => link.provider.batches(),
            tier => link.provider.tiers().contains(&tier),
        };
        let offers: Vec<Offer> = path::ALL
            .into_iter()
            .filter(|r| allowed.allows(*r) && sold(*r) && !refused(seen, *r, now))
            .filter_map(|rate| {
                // A path is offered only where the price table prices it for the model (a
                // tier without rows of its own is one its provider does not sell for it).
                let priced = match rate {
                    Rate::Flex => price.is_some_and(|p| p.flex.is_some()),
                    Rate::Priority => price.is_some_and(|p| p.priority.is_some()),
                    _ => price.is_some() || rate == Rate::Standard,
                };
                priced.then(|| Offer {
                    rate,
                    cost_micros: price.and_then(|p| p.cost_at(&usage, rate)).unwrap_or(0),
                    takes_ms: measured
                        .as_ref()
                        .and_then(|t| t.expected(rate))
                        .unwrap_or_else(|| self.takes_ms(rate)),
                })
            })
            .collect();
        let wants = Wants {
            // The item's deadline, fixed at its creation: a message without one would give
            // each delivery a later default.
            left_ms: seen.map_or(job.deadline_at, |s| s.deadline_at) - now - self.settings.skew_ms,
            urgent: job.class.urgent,
            asked: asked(&self.settings.batching, input),
        };
        Some(path::choose(&offers, wants))
    }

    /// Shares the path times of `provider`'s `model` through `store` (every environment's, in
    /// the ledger table): what this environment measured is added at most once a minute, and
    /// everyone's taken in return.
    pub fn with_shared_times(mut self, store: Arc<dyn SharedTimes>) -> Self {
        self.shared_times = Some(store);
        self
    }

    /// An attempt of `model` through `provider` on `rate` took `ms` from its claim to its
    /// answer: the chooser expects as much of the next ones.
    pub(super) fn path_took(&self, provider: &'static str, model: &str, rate: Rate, ms: Millis) {
        // A batch is expected to take its window whatever its lines took (decision 167).
        if rate == Rate::Batch {
            return;
        }
        let key = (provider, model.to_owned());
        // Shared only where paths are chosen (the share comes with a claim that chooses one);
        // each path's last kept only, however long the store fails.
        if self.shared_times.is_some() && self.settings.batching.paths.any() {
            let mut unshared = self.unshared.lock().unwrap_or_else(|p| p.into_inner());
            unshared
                .entry(key.clone())
                .or_default()
                .taken
                .record(rate, ms);
        }
        self.times().entry(key).or_default().record(rate, ms);
    }

    /// Shares what this environment measured of `provider`'s `model` and reads everyone's, if
    /// a minute passed since it last did (nothing when no store is set). Times a failed share
    /// carried are dropped, as their write may have landed (counted twice they would skew the
    /// percentile; lost, they are a few of many); the chooser goes on with what it knows.
    pub(super) async fn share_path_times(&self, provider: &'static str, model: &str) {
        let Some(store) = &self.shared_times else {
            return;
        };
        let now = self.clock.now_ms();
        let key = (provider, model.to_owned());
        let new = {
            let mut unshared = self.unshared.lock().unwrap_or_else(|p| p.into_inner());
            let entry = unshared.entry(key.clone()).or_default();
            let every = self.settings.batching.share_times_ms;
            if entry.shared_at.is_some_and(|at| now - at < every) {
                return;
            }
            entry.shared_at = Some(now);
            std::mem::take(&mut entry.taken).lists()
        };
        let stored = crate::ledger::path_times::key(provider, model);
        match store.merge(&stored, &new, now).await {
            Ok(all) => {
                // Everyone's, and what this environment measured while the store answered.
                let since = self.unshared.lock().unwrap_or_else(|p| p.into_inner());
                let recent = since.get(&key).map(|u| u.taken.lists()).unwrap_or_default();
                drop(since);
                let known = Times::from_lists(&merged(&all, &recent));
                self.times().insert(key, known);
            }
            Err(e) => {
                tracing::debug!(provider, model, error = %e, "the path times were not shared");
            }
        }
    }

    fn times(&self) -> std::sync::MutexGuard<'_, HashMap<(&'static str, String), path::Times>> {
        self.path_times.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How long an attempt on `rate` is expected to take before any was measured: its
    /// documented bound.
    fn takes_ms(&self, rate: Rate) -> Millis {
        match rate {
            Rate::Batch => BATCH_TAKES_MS + self.settings.batching.poll_ms,
            Rate::Flex => FLEX_TAKES_MS,
            // The longest a call may take.
            Rate::Standard | Rate::Priority => self.settings.provider_timeout_ms,
        }
    }
}

/// The path the job of `input` asks for itself: a batch when it is deferrable (its own
/// `deferrable`, else `DEFERRABLE`), a tier its `parameters.service_tier` names.
fn asked(batching: &crate::worker::settings::Batching, input: &Map<String, Value>) -> Option<Rate> {
    match Rate::of(batching.deferrable(input), input) {
        Rate::Standard => None,
        rate => Some(rate),
    }
}

/// Whether `rate`, flex or a batch, refused one of the job's attempts within the last
/// [`REFUSED_FOR_MS`] before `now` (an attempt given back for its capacity on that path). The
/// standard and priority paths are never left out for a 429: it is the account's rate limit,
/// which another path would not escape, and the standard path is where a job goes when
/// nothing else fits.
fn refused(seen: Option<&JobItem>, rate: Rate, now: Millis) -> bool {
    if matches!(rate, Rate::Standard | Rate::Priority) {
        return false;
    }
    seen.is_some_and(|job| {
        job.given_back.iter().any(|a| {
            a.outcome == AttemptOutcome::Throttled
                && a.finished_at.unwrap_or(a.started_at) > now - REFUSED_FOR_MS
                && a.route
                    .as_ref()
                    .and_then(|r| r.path.as_ref())
                    .is_some_and(|(r, _)| *r == rate)
        })
    })
}

/// `input` as the call of an attempt on `path` sends it: the tier it names in
/// `parameters.service_tier`; on the standard path or a batch's, no tier a path is (a value
/// that names none, Anthropic's `auto` or `standard_only`, is the job's and stays). An attempt
/// with no path chosen sends the input as the job gave it.
pub(super) fn on_path(mut input: Map<String, Value>, path: Option<Rate>) -> Map<String, Value> {
    match path {
        Some(rate @ (Rate::Flex | Rate::Priority)) => {
            let parameters = input
                .entry("parameters")
                .or_insert_with(|| Value::Object(Map::new()));
            if let Value::Object(parameters) = parameters {
                parameters.insert("service_tier".into(), Value::from(path::name(rate)));
            }
        }
        // The job asked for a tier the worker did not choose.
        Some(Rate::Standard | Rate::Batch) if Rate::of(false, &input) != Rate::Standard => {
            if let Some(Value::Object(parameters)) = input.get_mut("parameters") {
                parameters.remove("service_tier");
            }
        }
        Some(Rate::Standard | Rate::Batch) => {}
        None => {}
    }
    input
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn input(value: Value) -> Map<String, Value> {
        value.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn a_path_sets_its_tier_and_takes_away_only_a_tier_it_did_not_choose() {
        let flex = on_path(input(json!({"model": "m"})), Some(Rate::Flex));
        assert_eq!(flex["parameters"]["service_tier"], "flex");
        // The job asked for flex; the worker chose the standard path.
        let asked = input(json!({"parameters": {"service_tier": "flex", "seed": 1}}));
        let standard = on_path(asked, Some(Rate::Standard));
        assert_eq!(standard["parameters"], json!({"seed": 1}));
        // A value that names no path is the job's own; nothing is added where nothing was.
        let auto = input(json!({"parameters": {"service_tier": "auto"}}));
        assert_eq!(on_path(auto.clone(), Some(Rate::Batch)), auto);
        let bare = input(json!({"model": "m"}));
        assert_eq!(on_path(bare.clone(), Some(Rate::Standard)), bare);
        assert_eq!(on_path(bare.clone(), None), bare);
    }
}
