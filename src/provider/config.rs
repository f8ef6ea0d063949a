//! Which providers a deployment names, in order, and how each is reached (`PROVIDER`, each
//! provider's own variables).

#[cfg(feature = "anthropic")]
use super::anthropic::AnthropicSettings;
#[cfg(feature = "bedrock")]
use super::bedrock::BedrockSettings;
#[cfg(feature = "http-api")]
use super::keys::{self, KeySource};
use super::models::ModelMap;
#[cfg(feature = "openai")]
use super::openai::{self, OpenAiSettings};
#[cfg(feature = "http-api")]
use super::trusted_url;
use crate::vars::{ConfigError, Vars};

/// The model providers this build knows, and how to reach the one chosen.
#[derive(Debug, Clone, PartialEq)]
pub enum ProviderConfig {
    /// `simulated`: the deterministic, network-free provider.
    Simulated,
    /// `openai`: an OpenAI-compatible HTTP server.
    #[cfg(feature = "openai")]
    OpenAi {
        /// Where and how.
        settings: OpenAiSettings,
        /// Where the API key comes from.
        key: KeySource,
    },
    /// `anthropic`: Anthropic's Messages API.
    #[cfg(feature = "anthropic")]
    Anthropic {
        /// Where and how.
        settings: AnthropicSettings,
        /// Where the API key comes from.
        key: KeySource,
    },
    /// `bedrock`: Amazon Bedrock `Converse`.
    #[cfg(feature = "bedrock")]
    Bedrock(BedrockSettings),
}

impl ProviderConfig {
    /// Whether the provider can run calls in the background (OpenAI's Responses API).
    pub(crate) fn runs_in_background(&self) -> bool {
        match self {
            #[cfg(feature = "openai")]
            ProviderConfig::OpenAi { settings, .. } => settings.api == openai::OpenAiApi::Responses,
            _ => false,
        }
    }

    /// Whether calls go to the model each job names (any real provider, unless Bedrock's
    /// `BEDROCK_MODEL_ID` fixes one for every call).
    pub(crate) fn names_model(&self) -> bool {
        match self {
            ProviderConfig::Simulated => false,
            #[cfg(feature = "openai")]
            ProviderConfig::OpenAi { .. } => true,
            #[cfg(feature = "anthropic")]
            ProviderConfig::Anthropic { settings, .. } => settings.model.is_none(),
            #[cfg(feature = "bedrock")]
            ProviderConfig::Bedrock(settings) => settings.model_id.is_none(),
        }
    }

    /// The providers `PROVIDER` names, in order (`openai,bedrock`: the second takes a job after
    /// a definite refusal of the first), each with its own settings and its model for each job
    /// model name (`<PROVIDER>_MODELS`). A name given twice is refused.
    pub(crate) fn list_from_vars(
        vars: &Vars<'_>,
    ) -> Result<Vec<(ProviderConfig, ModelMap)>, ConfigError> {
        let text = vars
            .get("PROVIDER")
            .unwrap_or_else(|| "simulated".to_owned());
        let names: Vec<&str> = text.split(',').map(str::trim).collect();
        let mut list = Vec::new();
        for (i, name) in names.iter().enumerate() {
            if names[..i].contains(name) {
                return Err(ConfigError::Invalid {
                    name: "PROVIDER",
                    reason: format!("{name:?} is named twice"),
                });
            }
            let models_var = match *name {
                "openai" => "OPENAI_MODELS",
                "anthropic" => "ANTHROPIC_MODELS",
                "bedrock" => "BEDROCK_MODELS",
                _ => "SIMULATED_MODELS",
            };
            let models = match vars.get(models_var) {
                Some(text) => ModelMap::parse(models_var, &text)?,
                None => ModelMap::default(),
            };
            list.push((ProviderConfig::named(vars, name)?, models));
        }
        Ok(list)
    }

    /// The provider called `name`, with its own settings.
    fn named(vars: &Vars<'_>, name: &str) -> Result<ProviderConfig, ConfigError> {
        Ok(match name {
            "simulated" => ProviderConfig::Simulated,
            #[cfg(feature = "openai")]
            "openai" => ProviderConfig::OpenAi {
                settings: OpenAiSettings::from_vars(vars)?,
                key: KeySource::from_vars(vars, keys::KeyVars::OPENAI)?,
            },
            #[cfg(feature = "anthropic")]
            "anthropic" => ProviderConfig::Anthropic {
                settings: AnthropicSettings::from_vars(vars)?,
                key: KeySource::from_vars(vars, keys::KeyVars::ANTHROPIC)?,
            },
            #[cfg(feature = "bedrock")]
            "bedrock" => ProviderConfig::Bedrock(BedrockSettings::from_vars(vars)?),
            #[cfg(not(feature = "openai"))]
            "openai" => return Err(not_built("openai")),
            #[cfg(not(feature = "anthropic"))]
            "anthropic" => return Err(not_built("anthropic")),
            #[cfg(not(feature = "bedrock"))]
            "bedrock" => return Err(not_built("bedrock")),
            other => {
                return Err(ConfigError::Invalid {
                    name: "PROVIDER",
                    reason: format!(
                        "unknown provider {other:?} (known: simulated, openai, anthropic, bedrock)"
                    ),
                });
            }
        })
    }
}

/// The base URL variable `name` sets (else `default`): `https://`, or `http://` on the loopback
/// interface only, since the API key and the prompts go there.
#[cfg(feature = "http-api")]
pub(crate) fn base_url(
    vars: &Vars<'_>,
    name: &'static str,
    default: String,
) -> Result<String, ConfigError> {
    let url = vars.get(name).unwrap_or(default);
    if !trusted_url(&url) {
        return Err(ConfigError::Invalid {
            name,
            reason: "must be https:// (http:// only on the loopback interface): the API key and the prompts go there".to_owned(),
        });
    }
    Ok(url)
}

/// `PROVIDER_STREAMING`: whether chat-style calls stream their answers (`on`, the default).
#[cfg(any(feature = "http-api", feature = "bedrock"))]
pub(crate) fn streaming(vars: &Vars<'_>) -> Result<bool, ConfigError> {
    vars.choice("PROVIDER_STREAMING", true, &[("on", true), ("off", false)])
}

/// A provider this build was compiled without.
#[cfg(not(all(feature = "openai", feature = "anthropic", feature = "bedrock")))]
fn not_built(name: &str) -> ConfigError {
    ConfigError::Invalid {
        name: "PROVIDER",
        reason: format!("this build has no {name} provider (cargo feature {name})"),
    }
}
