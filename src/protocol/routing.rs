//! Which of the deployment's providers takes an attempt: the ordered list (`PROVIDER=openai,
//! bedrock`), each provider's model for the job's model name, and the rule that moves a job to
//! the next provider only after a definite refusal of the one before.
//!
//! Every attempt records its route (provider and model) with its claim, so the rule reads
//! nothing but the job's item: a recovery asks the provider of the attempt it recovers, and a
//! fallback knows who refused.

use serde_json::{Map, Value};

use crate::job::{AttemptEntry, AttemptOutcome, JobItem};
pub use crate::provider::ModelMap;

/// What the routing knows of one provider of the list.
#[derive(Debug, Clone, Copy)]
pub struct Stop<'a> {
    /// Its name, as attempts record it.
    pub name: &'a str,
    /// Its models by job model name.
    pub models: &'a ModelMap,
    /// Whether it calls one model whatever the job names (`OPENAI_MODEL`, say).
    pub fixed: bool,
}

impl Stop<'_> {
    /// Whether this provider, at `index` in the list, can run a job asking for `job_model`: the
    /// first takes every name as it is; the others a name their map gives a model for, or any
    /// when they call one model of their own.
    pub(crate) fn serves(&self, index: usize, job_model: &str) -> bool {
        index == 0 || self.fixed || self.models.get(job_model).is_some()
    }
}

/// The job's input with `model` set to the model `stop` is asked for (its map's, else the
/// job's own name); a provider with a model of its own uses that one whatever this says.
pub(crate) fn routed_input(
    stop: &ModelMap,
    input: &Map<String, Value>,
) -> Option<Map<String, Value>> {
    let job_model = input.get("model").and_then(Value::as_str)?;
    let mapped = stop.get(job_model)?;
    let mut input = input.clone();
    input.insert("model".to_owned(), Value::from(mapped));
    Some(input)
}

/// The latest attempt of `job`, counted or given back (the one with the highest epoch).
pub fn latest(job: &JobItem) -> Option<&AttemptEntry> {
    let counted = job.attempt_log.last();
    let given = job.given_back.last();
    match (counted, given) {
        (Some(a), Some(b)) => Some(if b.epoch > a.epoch { b } else { a }),
        (a, b) => a.or(b),
    }
}

/// Whether an attempt ended with a definite refusal of its provider, before any work: a
/// transient failure (a refusal before work, a connect failure, an overload), or a throttle
/// beyond the pacing horizon (given back). An uncertain outcome never is, nor an attempt whose
/// call answered (its usage recorded: an answer the results bucket could not take, say), nor a
/// line of a batch (a failed line may have run, and one its batch never ran waits for another
/// batch of the same provider): none of those is the provider turning the call away.
pub fn refused(attempt: &AttemptEntry) -> bool {
    matches!(
        attempt.outcome,
        AttemptOutcome::Transient | AttemptOutcome::Throttled
    ) && attempt.usage.is_none()
        && !attempt
            .provider_ref
            .as_deref()
            .is_some_and(crate::provider::batch::is_batch_ref)
}

/// Whether `job`'s latest attempt was refused definitely by its provider ([`refused`]).
pub fn last_refused(job: &JobItem) -> bool {
    latest(job).is_some_and(refused)
}

/// The index in `stops` of the provider an attempt recorded (the first when it names none, or
/// one this deployment no longer has).
pub(crate) fn index_of(attempt: Option<&AttemptEntry>, stops: &[Stop<'_>]) -> usize {
    index_named(attempt, stops.len(), |i| stops[i].name)
}

/// The index, among `n` providers named by `name`, of the provider an attempt recorded (the
/// first when it names none, or one this deployment no longer has).
pub(crate) fn index_named<'a>(
    attempt: Option<&AttemptEntry>,
    n: usize,
    name: impl Fn(usize) -> &'a str,
) -> usize {
    attempt
        .and_then(|a| a.route.as_ref())
        .and_then(|r| (0..n).find(|&i| name(i) == r.provider))
        .unwrap_or(0)
}

/// The index of the provider that runs `job`'s current (latest) attempt.
pub fn current(job: &JobItem, stops: &[Stop<'_>]) -> usize {
    index_of(latest(job), stops)
}

/// The index of the provider that takes the next attempt of a job asking for `job_model`: the
/// first that serves the model for a job with no attempt yet; else the one of its latest
/// attempt, unless that provider refused it definitely ([`refused`]), in which case the next
/// in order that serves the model, round to the first again (the attempt budget and the
/// deadline bound the rounds).
pub fn next(job: Option<&JobItem>, job_model: &str, stops: &[Stop<'_>]) -> usize {
    next_serving(
        job,
        stops.len(),
        |i| stops[i].name,
        |i| stops[i].serves(i, job_model),
    )
}

/// [`next`] among `n` providers named by `name`, of which `serves` says whether one can run
/// the job's model.
pub(crate) fn next_serving<'a>(
    job: Option<&JobItem>,
    n: usize,
    name: impl Fn(usize) -> &'a str,
    serves: impl Fn(usize) -> bool,
) -> usize {
    let Some(last) = job.and_then(latest) else {
        return 0;
    };
    let at = index_named(Some(last), n, name);
    if !refused(last) {
        return at;
    }
    (1..n)
        .map(|step| (at + step) % n)
        .find(|&i| serves(i))
        .unwrap_or(at)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::Route;

    fn attempt(epoch: u64, provider: &str, outcome: AttemptOutcome) -> AttemptEntry {
        AttemptEntry {
            outcome,
            ..AttemptEntry::claimed(epoch as u32, epoch, "w", 1_000, None).routed(Some(Route {
                provider: provider.to_owned(),
                model: "m".to_owned(),
                path: None,
            }))
        }
    }

    fn job(log: Vec<AttemptEntry>, given_back: Vec<AttemptEntry>) -> JobItem {
        let mut job = crate::job::NewJob::example("j", 10_000)
            .into_record(crate::job::JobState::RetryAuthorized, 1_000);
        job.attempt_log = log;
        job.given_back = given_back;
        job
    }

    #[test]
    fn a_mapped_input_asks_for_the_providers_model() {
        let map = ModelMap::parse("X", "a=b").expect("map");
        let input = serde_json::json!({"model": "a", "prompt": "p"});
        let routed = routed_input(&map, input.as_object().expect("object")).expect("mapped");
        assert_eq!(routed["model"], "b");
        let other = serde_json::json!({"model": "z", "prompt": "p"});
        assert!(routed_input(&map, other.as_object().expect("object")).is_none());
    }

    #[test]
    fn only_a_definite_refusal_moves_a_job_to_the_next_provider() {
        let mapped = ModelMap::parse("X", "gpt-5-mini=claude-haiku").expect("map");
        let none = ModelMap::default();
        let stops = [
            Stop {
                name: "openai",
                models: &none,
                fixed: false,
            },
            Stop {
                name: "anthropic",
                models: &mapped,
                fixed: false,
            },
        ];
        let model = "gpt-5-mini";
        assert_eq!(next(None, model, &stops), 0);
        let refused_by_openai = job(
            vec![attempt(1, "openai", AttemptOutcome::Transient)],
            vec![],
        );
        assert_eq!(next(Some(&refused_by_openai), model, &stops), 1);
        // A model the second has no mapping for stays with the first.
        assert_eq!(next(Some(&refused_by_openai), "o3", &stops), 0);
        // Uncertain, invalid or not sent: the same provider.
        for outcome in [
            AttemptOutcome::Uncertain,
            AttemptOutcome::InvalidOutput,
            AttemptOutcome::NotSent,
        ] {
            let j = job(vec![attempt(1, "openai", outcome)], vec![]);
            assert_eq!(next(Some(&j), model, &stops), 0, "{outcome:?}");
        }
        // A throttle beyond the horizon, given back after a counted attempt, is the latest.
        let throttled = job(
            vec![attempt(1, "openai", AttemptOutcome::InvalidOutput)],
            vec![attempt(2, "openai", AttemptOutcome::Throttled)],
        );
        assert_eq!(next(Some(&throttled), model, &stops), 1);
        // A failed line of a batch, or a transient end after an answer came (its usage
        // recorded), was not a refusal before work: the same provider.
        let line = |outcome| AttemptEntry {
            provider_ref: Some(crate::provider::batch::pending_ref("j1-a1-e1")),
            ..attempt(1, "openai", outcome)
        };
        let answered = AttemptEntry {
            usage: Some(crate::job::Usage::default()),
            ..attempt(1, "openai", AttemptOutcome::Transient)
        };
        for not_refused in [
            job(vec![line(AttemptOutcome::Transient)], vec![]),
            job(vec![], vec![line(AttemptOutcome::Throttled)]),
            job(vec![answered], vec![]),
        ] {
            assert_eq!(next(Some(&not_refused), model, &stops), 0);
        }
        // Refused by the last: round to the first.
        let refused_by_anthropic = job(
            vec![attempt(1, "anthropic", AttemptOutcome::Transient)],
            vec![],
        );
        assert_eq!(next(Some(&refused_by_anthropic), model, &stops), 0);
        assert_eq!(current(&refused_by_anthropic, &stops), 1);
        // An attempt that names no provider, or one no longer listed, was the first's.
        let old = job(
            vec![AttemptEntry::claimed(1, 1, "w", 1, None)],
            vec![attempt(0, "gone", AttemptOutcome::Throttled)],
        );
        assert_eq!(current(&old, &stops), 0);
    }
}
