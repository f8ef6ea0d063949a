//! The OpenAI provider's settings, from its variables.

use crate::job::Millis;
use crate::vars::{ConfigError, Vars};

/// Which OpenAI API the provider speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenAiApi {
    /// The Responses API in background mode (retrievable); falls back to Chat Completions when
    /// the server has no `/responses`.
    Responses,
    /// Chat Completions only (no retrieval: an interrupted call is uncertain).
    Chat,
}

/// How to reach an OpenAI-compatible server.
#[derive(Debug, Clone, PartialEq)]
pub struct OpenAiSettings {
    /// `OPENAI_BASE_URL`, up to and including the version (`https://api.openai.com/v1`).
    pub base_url: String,
    /// `OPENAI_API`: `responses` (default) or `chat`.
    pub api: OpenAiApi,
    /// `OPENAI_MODEL`: when set, the model of every call (otherwise the job's `input.model`).
    pub model: Option<String>,
    /// `OPENAI_CONNECT_TIMEOUT_MS`.
    pub connect_timeout_ms: Millis,
    /// `OPENAI_REQUEST_TIMEOUT_SECONDS`: one background request (submit, poll, cancel). A Chat
    /// Completions call is bounded by the processor's provider timeout instead.
    pub request_timeout_ms: Millis,
    /// `OPENAI_QUEUED_TIMEOUT_SECONDS`: a background response still `queued` this long after
    /// its claim is cancelled and its attempt ends refused before work (nothing ran), so the
    /// job may go to another attempt, or another provider.
    pub queued_timeout_ms: Millis,
    /// `PROVIDER_STREAMING` (`on`, the default, or `off`): Chat Completions answers stream, so
    /// a long generation survives idle-connection limits and its progress is evidence.
    pub stream: bool,
    /// `OPENAI_BATCHES` (`on`, the default, or `off`): deferrable jobs go through the Batch
    /// API (a server without it: `off`).
    pub batches: bool,
    /// What sets this deployment's batches apart on a shared account (the scope of
    /// `DEPLOYMENT_ID`, as the idempotency keys have it): in each batch's metadata, and the
    /// only batches a listing looks in. Empty: none said, and any of ours looked in.
    pub deployment: String,
}

impl Default for OpenAiSettings {
    fn default() -> Self {
        OpenAiSettings {
            base_url: "https://api.openai.com/v1".to_owned(),
            api: OpenAiApi::Responses,
            model: None,
            connect_timeout_ms: 5_000,
            request_timeout_ms: 30_000,
            queued_timeout_ms: 600_000,
            stream: true,
            batches: true,
            deployment: String::new(),
        }
    }
}

impl OpenAiSettings {
    /// Reads the `OPENAI_*` settings (the key is read by [`super::keys::KeySource`]).
    pub(crate) fn from_vars(vars: &Vars<'_>) -> Result<OpenAiSettings, ConfigError> {
        let o = OpenAiSettings::default();
        Ok(OpenAiSettings {
            base_url: crate::provider::base_url(vars, "OPENAI_BASE_URL", o.base_url)?,
            api: vars.choice(
                "OPENAI_API",
                OpenAiApi::Responses,
                &[
                    ("responses", OpenAiApi::Responses),
                    ("chat", OpenAiApi::Chat),
                ],
            )?,
            model: vars.get("OPENAI_MODEL"),
            connect_timeout_ms: vars.integer(
                "OPENAI_CONNECT_TIMEOUT_MS",
                o.connect_timeout_ms,
                1,
                60_000,
            )?,
            request_timeout_ms: vars.seconds(
                "OPENAI_REQUEST_TIMEOUT_SECONDS",
                o.request_timeout_ms,
                1,
                900,
            )?,
            queued_timeout_ms: vars.seconds(
                "OPENAI_QUEUED_TIMEOUT_SECONDS",
                o.queued_timeout_ms,
                1,
                86_400,
            )?,
            stream: crate::provider::streaming(vars)?,
            batches: vars.choice("OPENAI_BATCHES", true, &[("on", true), ("off", false)])?,
            deployment: vars.deployment_scope(),
        })
    }
}
