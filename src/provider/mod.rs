//! The model call behind a trait, so the processor never knows which provider runs.

#[cfg(feature = "anthropic")]
pub mod anthropic;
pub mod batch;
#[cfg(feature = "bedrock")]
pub mod bedrock;
mod config;
pub mod dialect;
#[cfg(feature = "http-api")]
pub mod http;
#[cfg(feature = "http-api")]
pub mod keys;
mod models;
#[cfg(feature = "openai")]
pub mod openai;
mod progress;
pub mod simulated;

use std::future::Future;

use serde_json::{Map, Value};

#[cfg(feature = "anthropic")]
pub use anthropic::AnthropicProvider;
pub use batch::BatchLine;
#[cfg(feature = "bedrock")]
pub use bedrock::BedrockProvider;
pub use config::ProviderConfig;
#[cfg(feature = "http-api")]
pub(crate) use config::base_url;
#[cfg(any(feature = "http-api", feature = "bedrock"))]
pub(crate) use config::streaming;
pub use models::ModelMap;
#[cfg(feature = "openai")]
pub use openai::OpenAiProvider;
pub use progress::{DEFAULT_PROGRESS_TIMEOUT, Progress};
pub use simulated::SimulatedProvider;

#[cfg(feature = "http-api")]
pub use keys::{KeyRotation, KeySource, Secret};

/// The least time between two readings of a provider's key after it was refused.
#[cfg(feature = "http-api")]
pub(crate) const KEY_REREAD_INTERVAL: std::time::Duration = std::time::Duration::from_secs(60);

#[cfg(any(feature = "http-api", feature = "bedrock"))]
/// Whether a provider's base URL may carry keys and prompts: `https://`, or `http://` to the
/// loopback interface only (a local server or a test).
pub(crate) fn trusted_url(url: &str) -> bool {
    let lower = url.to_ascii_lowercase();
    if lower.starts_with("https://") {
        return true;
    }
    let Some(rest) = lower.strip_prefix("http://") else {
        return false;
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let host = match authority.rsplit_once('@') {
        Some(_) => return false,
        None => authority,
    };
    let host = if let Some(v6) = host.strip_prefix('[') {
        v6.split(']').next().unwrap_or_default()
    } else {
        host.split(':').next().unwrap_or_default()
    };
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

use std::collections::BTreeMap;

use serde_json::value::RawValue;

use crate::job::contract::{Accepted, Contract, Finish, Rejected};

/// One attempt's request to a provider.
#[derive(Debug, Clone)]
pub struct ProviderRequest<'a> {
    /// Job id.
    pub job_id: &'a str,
    /// Attempt number (cumulative, 1-based).
    pub attempt: u32,
    /// The epoch the attempt was claimed at.
    pub epoch: u64,
    /// Output-contract version.
    pub contract: &'a str,
    /// The contract itself: the format and schema the provider is asked to follow (the
    /// answer is judged against it after the call, whatever the provider did with it).
    pub output: &'a Contract,
    /// The job input.
    pub input: &'a Map<String, Value>,
    /// The same input as canonical JSON (sorted keys, no whitespace).
    pub input_json: &'a str,
    /// The answer's ceiling in tokens: the job's own, or for a job that sets none the
    /// deployment's bound, which the provider is sent in its own spelling (0: none).
    pub max_output_tokens: u64,
    /// Stable per job and attempt: a provider that deduplicates requests sees a retry of the
    /// same attempt as the same request.
    pub idempotency_key: String,
    /// The progress rule a streamed call marks (`None`: nobody watches; a provider that streams
    /// applies [`DEFAULT_PROGRESS_TIMEOUT`]).
    pub progress: Option<Progress>,
}

impl ProviderRequest<'_> {
    /// The progress rule a streamed call keeps to: the caller's, else one of
    /// [`DEFAULT_PROGRESS_TIMEOUT`].
    pub(crate) fn progress_rule(&self) -> Progress {
        self.progress
            .clone()
            .unwrap_or_else(|| Progress::new(DEFAULT_PROGRESS_TIMEOUT))
    }
}

/// A provider's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// The result, as JSON text.
    pub body: String,
    /// The provider's reference for the call, when it has one.
    pub provider_ref: Option<String>,
    /// Why the model stopped writing.
    pub finish: Finish,
    /// What the call used, when the provider said.
    pub usage: Option<crate::job::Usage>,
    /// The model that answered, as the provider named it, when it did.
    pub model: Option<String>,
    /// The provider's id of this response, when it gave one this crate uses (1-128 characters
    /// of `A-Z a-z 0-9 _ -`).
    pub response_id: Option<String>,
}

impl Answer {
    /// The answer as its job's `contract` judges it: accepted (for a JSON contract, with its
    /// `output` stored parsed, as JSON, in place of the text), or an
    /// [`ProviderError::InvalidOutput`]. The body is a document this crate's providers build
    /// (`{"contract", "model", "output", "usage", ..}`), so a body that is not one is refused
    /// too, never accepted unread.
    pub fn judged(self, contract: &Contract) -> Result<Answer, ProviderError> {
        if contract.takes_unread(self.finish) {
            return Ok(self);
        }
        // The document's fields as they are written: only the output is read.
        let fields: BTreeMap<String, &RawValue> =
            serde_json::from_str(&self.body).unwrap_or_default();
        let output = fields
            .get("output")
            .and_then(|raw| serde_json::from_str::<String>(raw.get()).ok());
        let Some(output) = output else {
            let error = "the answer has no output text: output".to_owned();
            let rejected = contract.rejected(vec![error], self.finish, "");
            return Err(ProviderError::InvalidOutput(rejected));
        };
        match contract.judge(&output, self.finish) {
            Ok(Accepted::Text) => Ok(self),
            Ok(Accepted::Json) => {
                // The output is a JSON text: the document holds it as JSON, as the model wrote
                // it, in place of the string.
                let mut body = String::with_capacity(self.body.len());
                body.push('{');
                for (i, (key, raw)) in fields.iter().enumerate() {
                    if i > 0 {
                        body.push(',');
                    }
                    body.push_str(&Value::from(key.as_str()).to_string());
                    body.push(':');
                    body.push_str(if key == "output" {
                        output.trim()
                    } else {
                        raw.get()
                    });
                }
                body.push('}');
                Ok(Answer { body, ..self })
            }
            Err(rejected) => Err(ProviderError::InvalidOutput(rejected)),
        }
    }
}

/// How a call failed, as the processor must treat it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, thiserror::Error)]
pub enum ProviderError {
    /// The provider did not do the work (rate limit, 5xx before acceptance): retry later.
    #[error("transient provider error: {reason}")]
    Transient {
        /// Minimum wait the provider asked for.
        retry_after_ms: Option<i64>,
        /// Classification (never prompt or answer text).
        reason: String,
    },
    /// The provider refused the call for its rate limit before doing any work, and said so
    /// in its own words (a 429 with its error object and code, Bedrock's
    /// `ThrottlingException`): proof that nothing ran, so the attempt is given back.
    #[error("throttled: {reason}")]
    Throttled {
        /// The wait the provider asked for (capped, see [`MAX_RETRY_AFTER_MS`]).
        retry_after_ms: Option<i64>,
        /// Classification (never prompt or answer text).
        reason: String,
    },
    /// The request will never succeed (rejected input, unknown model).
    #[error("permanent provider error: {reason}")]
    Permanent {
        /// Classification.
        reason: String,
    },
    /// The request may have been processed; the outcome is not known.
    #[error("uncertain provider outcome: {evidence}")]
    Uncertain {
        /// What is known about the call.
        evidence: String,
    },
    /// The call ran and answered, but not with the answer the job's contract asks for
    /// (truncated, not JSON, invalid against the schema): a definite outcome.
    #[error("invalid output: {0}")]
    InvalidOutput(Rejected),
}

impl ProviderError {
    /// Its kind, in one word: `throttled`, `transient`, `uncertain`, `permanent`, `invalid`.
    pub fn kind(&self) -> &'static str {
        match self {
            ProviderError::Throttled { .. } => "throttled",
            ProviderError::Transient { .. } => "transient",
            ProviderError::Uncertain { .. } => "uncertain",
            ProviderError::Permanent { .. } => "permanent",
            ProviderError::InvalidOutput(_) => "invalid",
        }
    }

    #[cfg(test)]
    /// Whether the provider refused for its rate limit before any work.
    pub(crate) fn is_throttle(&self) -> bool {
        matches!(self, ProviderError::Throttled { .. })
    }
}

/// The longest wait a provider's `Retry-After` is taken for: a larger one (or one that is not a
/// number) must not stop an environment for hours, nor overflow the clock arithmetic.
pub(crate) const MAX_RETRY_AFTER_MS: i64 = 600_000;

/// What a provider says about an earlier attempt it was asked for by reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Retrieval {
    /// It finished with this answer.
    Completed(Answer),
    /// It definitely failed (a transient failure means it did not do the work).
    Failed(ProviderError),
    /// It is still running.
    Running,
    /// The provider could not be asked this time (rate limit, outage, network, timeout):
    /// nothing is known about the call. Ask again while time allows; never read as running.
    Unreachable {
        /// Minimum wait the provider asked for.
        retry_after_ms: Option<i64>,
    },
    /// The provider refused to say (401, 403): credentials, which an operator may fix. Asked
    /// again a bounded number of times, then the attempt is uncertain.
    Denied,
    /// The provider does not know it (never received, forgotten, or a 400/410 for it).
    NotFound,
    /// This provider cannot be asked.
    Unsupported,
}

/// What starting an attempt produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Submission {
    /// The provider answered in the same exchange.
    Answered(Answer),
    /// The provider runs the call in the background under this reference: the caller records
    /// it (conditionally on its epoch) before it polls [`Provider::retrieve`] for the answer.
    Started(String),
}

/// A model provider.
pub trait Provider: Send + Sync {
    /// Runs one attempt. The caller bounds it in time and treats a cut-off as uncertain.
    fn call(
        &self,
        req: &ProviderRequest<'_>,
    ) -> impl Future<Output = Result<Answer, ProviderError>> + Send;

    /// Starts one attempt: a provider with background calls returns their reference at once;
    /// the others answer as [`Provider::call`] does.
    fn submit(
        &self,
        req: &ProviderRequest<'_>,
    ) -> impl Future<Output = Result<Submission, ProviderError>> + Send {
        async move { self.call(req).await.map(Submission::Answered) }
    }

    /// Asks the provider to stop a background call nobody will collect (best effort).
    fn cancel(&self, _provider_ref: &str) -> impl Future<Output = ()> + Send {
        async {}
    }

    /// The reference the provider will know an attempt by, if the client assigns it before the
    /// call (an idempotency key). It is recorded with the claim, so it costs no extra write. It
    /// names the claim's epoch too: an attempt given back (a 429, a call never sent) is claimed
    /// again under the same number, and must not be taken for the one given back.
    fn reference(&self, _job_id: &str, _attempt: u32, _epoch: u64) -> Option<String> {
        None
    }

    /// The provider's name in traces (`gen_ai.provider.name` of the GenAI semantic conventions).
    fn name(&self) -> &'static str {
        "simulated"
    }

    /// The host its calls go to (`server.address` in traces), when they go over the network.
    fn server_address(&self) -> Option<&str> {
        None
    }

    /// The model a call for a job's `input` runs: its `input.model`, unless the provider is
    /// configured with its own ([`Provider::fixed_model`]). Its prices are what the call costs.
    fn model<'a>(&'a self, input: &'a serde_json::Map<String, serde_json::Value>) -> &'a str {
        self.fixed_model()
            .or_else(|| input.get("model").and_then(serde_json::Value::as_str))
            .unwrap_or_default()
    }

    /// The model every call runs, when the provider is configured with one of its own
    /// (`OPENAI_MODEL`, `ANTHROPIC_MODEL`, `BEDROCK_MODEL_ID`) whatever the job names.
    fn fixed_model(&self) -> Option<&str> {
        None
    }

    /// Whether [`Provider::retrieve`] can answer at all.
    fn can_retrieve(&self) -> bool {
        false
    }

    /// Whether deferrable jobs go through this provider's batch interface (half the price,
    /// answered within a day): their lines are gathered, submitted as one batch, and asked
    /// about by [`Provider::retrieve`] under their [`batch`] references.
    fn batches(&self) -> bool {
        false
    }

    /// The service tiers a request may ask it for by `parameters.service_tier`, beside the
    /// standard one: the paths ([`crate::job::path`]) it sells by tier.
    fn tiers(&self) -> &'static [crate::job::usage::Rate] {
        &[]
    }

    /// `req` as the line `line` of a batch.
    fn batch_line(
        &self,
        _req: &ProviderRequest<'_>,
        _line: &str,
    ) -> Result<BatchLine, ProviderError> {
        Err(ProviderError::Permanent {
            reason: "this provider has no batch interface".to_owned(),
        })
    }

    /// Creates one batch of `lines`, and says its id. An error that may hide a created batch
    /// is [`ProviderError::Uncertain`]: its lines are then found again by listing.
    fn submit_batch(
        &self,
        _lines: &[BatchLine],
    ) -> impl Future<Output = Result<String, ProviderError>> + Send {
        async {
            Err(ProviderError::Permanent {
                reason: "this provider has no batch interface".to_owned(),
            })
        }
    }

    /// Asks about an earlier attempt by its reference (`started_at` is when it was claimed).
    fn retrieve(
        &self,
        _provider_ref: &str,
        _started_at: crate::job::Millis,
        _req: &ProviderRequest<'_>,
    ) -> impl Future<Output = Retrieval> + Send {
        async { Retrieval::Unsupported }
    }
}

/// The provider chosen by configuration.
#[derive(Debug)]
pub enum AnyProvider {
    /// See [`SimulatedProvider`].
    Simulated(SimulatedProvider),
    /// See [`OpenAiProvider`].
    #[cfg(feature = "openai")]
    OpenAi(OpenAiProvider),
    /// See [`AnthropicProvider`].
    #[cfg(feature = "anthropic")]
    Anthropic(AnthropicProvider),
    /// See [`BedrockProvider`].
    #[cfg(feature = "bedrock")]
    Bedrock(BedrockProvider),
}

/// A provider that could not be set up (its key could not be read, say).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("provider setup failed: {0}")]
pub struct SetupError(pub String);

impl AnyProvider {
    /// The provider `config` names; its key, if any, read once from where the config says.
    #[cfg_attr(
        not(any(feature = "http-api", feature = "bedrock")),
        allow(unused_variables)
    )]
    pub async fn from_config(
        config: &ProviderConfig,
        aws: &aws_config::SdkConfig,
    ) -> Result<Self, SetupError> {
        Ok(match config {
            ProviderConfig::Simulated => AnyProvider::Simulated(SimulatedProvider::new()),
            #[cfg(feature = "openai")]
            ProviderConfig::OpenAi { settings, key } => {
                let (key, rotation) = keyed(key, keys::KeyVars::OPENAI.fields(), aws).await?;
                let mut provider =
                    OpenAiProvider::new(settings.clone(), key).map_err(SetupError)?;
                if let Some(rotation) = rotation {
                    provider = provider.with_rotation(rotation);
                }
                AnyProvider::OpenAi(provider)
            }
            #[cfg(feature = "anthropic")]
            ProviderConfig::Anthropic { settings, key } => {
                let (key, rotation) = keyed(key, keys::KeyVars::ANTHROPIC.fields(), aws).await?;
                let mut provider =
                    AnthropicProvider::new(settings.clone(), key).map_err(SetupError)?;
                if let Some(rotation) = rotation {
                    provider = provider.with_rotation(rotation);
                }
                AnyProvider::Anthropic(provider)
            }
            #[cfg(feature = "bedrock")]
            ProviderConfig::Bedrock(settings) => {
                AnyProvider::Bedrock(BedrockProvider::new(aws, settings))
            }
        })
    }
}

/// The key `source` names (`field`: the provider's own field in a JSON secret), read once, and
/// where it can be read again after a 401.
#[cfg(feature = "http-api")]
async fn keyed(
    source: &KeySource,
    field: keys::Fields,
    aws: &aws_config::SdkConfig,
) -> Result<(Option<Secret>, Option<KeyRotation>), SetupError> {
    let key = keys::resolve(source, field, aws).await?;
    if key.is_none() {
        tracing::warn!(
            key = field[1],
            "no API key configured; requests go unauthenticated"
        );
    }
    let rotation = KeyRotation::new(source, field, aws, KEY_REREAD_INTERVAL);
    Ok((key, rotation))
}

/// Forwards a call to whichever provider is configured.
macro_rules! each {
    ($self:expr, $p:ident => $body:expr) => {
        match $self {
            AnyProvider::Simulated($p) => $body,
            #[cfg(feature = "openai")]
            AnyProvider::OpenAi($p) => $body,
            #[cfg(feature = "anthropic")]
            AnyProvider::Anthropic($p) => $body,
            #[cfg(feature = "bedrock")]
            AnyProvider::Bedrock($p) => $body,
        }
    };
}

impl Provider for AnyProvider {
    async fn call(&self, req: &ProviderRequest<'_>) -> Result<Answer, ProviderError> {
        each!(self, p => p.call(req).await)
    }

    async fn submit(&self, req: &ProviderRequest<'_>) -> Result<Submission, ProviderError> {
        each!(self, p => p.submit(req).await)
    }

    async fn cancel(&self, provider_ref: &str) {
        each!(self, p => p.cancel(provider_ref).await)
    }

    fn reference(&self, job_id: &str, attempt: u32, epoch: u64) -> Option<String> {
        each!(self, p => p.reference(job_id, attempt, epoch))
    }

    fn can_retrieve(&self) -> bool {
        each!(self, p => p.can_retrieve())
    }

    fn batches(&self) -> bool {
        each!(self, p => p.batches())
    }

    fn tiers(&self) -> &'static [crate::job::usage::Rate] {
        each!(self, p => p.tiers())
    }

    fn batch_line(
        &self,
        req: &ProviderRequest<'_>,
        line: &str,
    ) -> Result<BatchLine, ProviderError> {
        each!(self, p => p.batch_line(req, line))
    }

    async fn submit_batch(&self, lines: &[BatchLine]) -> Result<String, ProviderError> {
        each!(self, p => p.submit_batch(lines).await)
    }

    fn name(&self) -> &'static str {
        each!(self, p => p.name())
    }

    fn server_address(&self) -> Option<&str> {
        each!(self, p => p.server_address())
    }

    fn model<'a>(&'a self, input: &'a serde_json::Map<String, serde_json::Value>) -> &'a str {
        each!(self, p => p.model(input))
    }

    fn fixed_model(&self) -> Option<&str> {
        each!(self, p => p.fixed_model())
    }

    async fn retrieve(
        &self,
        provider_ref: &str,
        started_at: crate::job::Millis,
        req: &ProviderRequest<'_>,
    ) -> Retrieval {
        each!(self, p => p.retrieve(provider_ref, started_at, req).await)
    }
}

/// The host of a base URL (`https://api.openai.com/v1` gives `api.openai.com`).
pub(crate) fn host_of(url: &str) -> Option<&str> {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let host = rest.split(['/', '?', '#']).next()?;
    // A port, or an IPv6 literal's brackets, are not the host's name.
    let host = match host.strip_prefix('[') {
        Some(v6) => v6.split(']').next()?,
        None => host.rsplit_once(':').map_or(host, |(name, _)| name),
    };
    (!host.is_empty()).then_some(host)
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_base_urls_host_is_its_server_address() {
        assert_eq!(host_of("https://api.openai.com/v1"), Some("api.openai.com"));
        assert_eq!(host_of("http://127.0.0.1:8080/v1"), Some("127.0.0.1"));
        assert_eq!(host_of("https://[::1]:443"), Some("::1"));
        assert_eq!(host_of("https://"), None);
    }

    #[test]
    fn throttles_are_their_own_kind_not_a_reason_read_back() {
        let throttled = ProviderError::Throttled {
            retry_after_ms: None,
            reason: "HTTP 429 rate_limit_exceeded".to_owned(),
        };
        assert!(throttled.is_throttle());
        // A reason that merely reads like one is not: a gateway's 429 is classified apart.
        let transient = ProviderError::Transient {
            retry_after_ms: None,
            reason: "HTTP 429 insufficient_quota".to_owned(),
        };
        assert!(!transient.is_throttle());
        let permanent = ProviderError::Permanent {
            reason: "HTTP 429".into(),
        };
        assert!(!permanent.is_throttle());
    }
}
