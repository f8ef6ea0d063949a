//! How deferrable jobs go through the providers' batch interfaces, and the paths chosen.

use crate::job::Millis;
use crate::vars::{ConfigError, Vars};

/// How deferrable jobs go through a provider's batch interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Batching {
    /// `DEFERRABLE` (`off`, the default, or `on`): whether a job that does not say
    /// (`input.deferrable`) may wait for a batch.
    pub default_deferrable: bool,
    /// `BATCH_GATHER_SECONDS` (5): the longest a claimed line waits for others before its
    /// batch goes; it goes earlier once every record of the invocation waits or is done.
    pub gather_ms: Millis,
    /// `BATCH_MAX_LINES` (10,000): the most lines in one batch.
    pub max_lines: usize,
    /// `BATCH_POLL_SECONDS` (600; 3,600 with `BATCH_WEBHOOKS=on`): how long a record whose
    /// batch runs stays invisible before its next look at the batch.
    pub poll_ms: Millis,
    /// `BATCH_WEBHOOKS` (`off`, the default, or `on`): the provider's webhooks say when a batch
    /// ends (the webhook function), so each batch created lists its jobs for them, and the
    /// looks at a running batch are only the fallback.
    pub webhooks: bool,
    /// `PATHS` (unset: none): the paths the worker chooses among for a job by price within its
    /// deadline ([`crate::job::path`]); unset, each job takes the one it asks for.
    pub paths: crate::job::path::Paths,
    /// `PATH_TIMES_SHARE_SECONDS` (60): how often an environment shares the times it measured
    /// of each path and reads everyone's (per provider and model); 0: at every claim.
    pub share_times_ms: Millis,
}

impl Default for Batching {
    fn default() -> Self {
        Batching {
            default_deferrable: false,
            gather_ms: 5_000,
            max_lines: 10_000,
            poll_ms: 600_000,
            webhooks: false,
            paths: crate::job::path::Paths::default(),
            share_times_ms: 60_000,
        }
    }
}

impl Batching {
    /// Whether the job of `input` may wait for a batch: its own `deferrable`, else the default.
    pub fn deferrable(&self, input: &serde_json::Map<String, serde_json::Value>) -> bool {
        input
            .get("deferrable")
            .and_then(serde_json::Value::as_bool)
            .unwrap_or(self.default_deferrable)
    }
}

/// Deferrable jobs' batches and the paths: `DEFERRABLE`, `BATCH_GATHER_SECONDS`,
/// `BATCH_MAX_LINES`, `BATCH_WEBHOOKS`, `BATCH_POLL_SECONDS`, `PATHS`,
/// `PATH_TIMES_SHARE_SECONDS`.
pub(super) fn batching_from(vars: &Vars<'_>) -> Result<Batching, ConfigError> {
    let number = |name, default, min, max| vars.integer(name, default, min, max);
    let on_off = [("off", false), ("on", true)];
    let webhooks = vars.choice("BATCH_WEBHOOKS", false, &on_off)?;
    // With webhooks a look is the fallback for one lost: an hour apart, not ten minutes.
    let poll_default = if webhooks { 3_600_000 } else { 600_000 };
    Ok(Batching {
        default_deferrable: vars.choice("DEFERRABLE", false, &on_off)?,
        gather_ms: vars.seconds("BATCH_GATHER_SECONDS", 5_000, 0, 300)?,
        max_lines: number("BATCH_MAX_LINES", 10_000, 1, 50_000)? as usize,
        poll_ms: vars.seconds("BATCH_POLL_SECONDS", poll_default, 1, 43_200)?,
        webhooks,
        share_times_ms: vars.seconds("PATH_TIMES_SHARE_SECONDS", 60_000, 0, 3_600)?,
        paths: crate::job::path::Paths::parse(&vars.get("PATHS").unwrap_or_default()).map_err(
            |reason| ConfigError::Invalid {
                name: "PATHS",
                reason,
            },
        )?,
    })
}
