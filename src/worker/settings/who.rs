//! Who may send jobs and what they may ask for: the producers, the labels each may put on its
//! jobs, and the models and parameters every job is held to.

use crate::job::account::Labels;
use crate::job::policy::Policy;
use crate::job::scope::Producers;
use crate::vars::{ConfigError, Vars};

/// The producers this deployment knows (`PRODUCERS`, `TRUSTED_SENDERS`).
pub(super) fn producers_from(vars: &Vars<'_>) -> Result<Producers, ConfigError> {
    Producers::parse(
        &vars.get("PRODUCERS").unwrap_or_default(),
        &vars.get("TRUSTED_SENDERS").unwrap_or_default(),
    )
    .map_err(|reason| ConfigError::Invalid {
        name: "PRODUCERS",
        reason,
    })
}

/// What each producer may label its jobs with (`PRODUCER_TENANTS`, `URGENT_PRODUCERS`), of
/// the producers `PRODUCERS` names.
pub(super) fn labels_from(vars: &Vars<'_>, producers: &Producers) -> Result<Labels, ConfigError> {
    Labels::parse(
        &vars.get("PRODUCER_TENANTS").unwrap_or_default(),
        &vars.get("URGENT_PRODUCERS").unwrap_or_default(),
        &producers.names(),
    )
    .map_err(|reason| ConfigError::Invalid {
        name: "PRODUCER_TENANTS",
        reason,
    })
}

/// What producers may ask for: `ALLOWED_MODELS`, `ALLOWED_PARAMETERS`, `MAX_ATTEMPTS_LIMIT`,
/// `MAX_DEADLINE_SECONDS`.
pub(super) fn policy_from(vars: &Vars<'_>, d: &Policy) -> Result<Policy, ConfigError> {
    let invalid = |name: &'static str| move |reason: String| ConfigError::Invalid { name, reason };
    Ok(Policy {
        models: match vars.get("ALLOWED_MODELS") {
            None => d.models.clone(),
            Some(list) => Policy::parse_models(&list).map_err(invalid("ALLOWED_MODELS"))?,
        },
        parameters: match vars
            .get("ALLOWED_PARAMETERS")
            .filter(|l| !l.trim().is_empty())
        {
            None => d.parameters.clone(),
            Some(list) => Policy::parse_parameters(&list).map_err(invalid("ALLOWED_PARAMETERS"))?,
        },
        max_attempts: vars.integer(
            "MAX_ATTEMPTS_LIMIT",
            i64::from(d.max_attempts),
            1,
            i64::from(crate::job::message::MAX_ATTEMPTS_LIMIT),
        )? as u32,
        max_deadline_ms: vars.seconds("MAX_DEADLINE_SECONDS", d.max_deadline_ms, 1, 31_536_000)?,
    })
}
