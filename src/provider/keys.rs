//! A provider's API key: where it comes from (never the template's own text), read once at
//! start-up, and held so that it cannot reach a log.

use serde_json::Value;

use super::SetupError;
use crate::vars::{ConfigError, Vars};

/// Where a provider's API key comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySource {
    /// No key (a local server that needs none).
    None,
    /// `<PROVIDER>_API_KEY`: the key itself, from the environment (local use).
    Value(Secret),
    /// `<PROVIDER>_API_KEY_SECRET_ID`: a Secrets Manager secret (the key, or JSON with
    /// `api_key`).
    SecretsManager(String),
    /// `<PROVIDER>_API_KEY_PARAMETER`: an SSM `SecureString` parameter.
    Parameter(String),
}

/// The variables that name a provider's key: the key itself, a secret, a parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct KeyVars {
    /// The field a JSON secret holds it under, before the variable's own name.
    pub(crate) json: &'static str,
    pub(crate) value: &'static str,
    pub(crate) secret: &'static str,
    pub(crate) parameter: &'static str,
}

impl KeyVars {
    #[cfg(feature = "openai")]
    /// OpenAI's: `OPENAI_API_KEY`, `OPENAI_API_KEY_SECRET_ID`, `OPENAI_API_KEY_PARAMETER`.
    pub(crate) const OPENAI: KeyVars = KeyVars {
        json: "api_key",
        value: "OPENAI_API_KEY",
        secret: "OPENAI_API_KEY_SECRET_ID",
        parameter: "OPENAI_API_KEY_PARAMETER",
    };
    #[cfg(feature = "openai")]
    /// OpenAI's webhooks' signing secret: `OPENAI_WEBHOOK_SECRET`,
    /// `OPENAI_WEBHOOK_SECRET_ID`, `OPENAI_WEBHOOK_SECRET_PARAMETER`.
    pub(crate) const OPENAI_WEBHOOK: KeyVars = KeyVars {
        json: "webhook_secret",
        value: "OPENAI_WEBHOOK_SECRET",
        secret: "OPENAI_WEBHOOK_SECRET_ID",
        parameter: "OPENAI_WEBHOOK_SECRET_PARAMETER",
    };
    #[cfg(feature = "anthropic")]
    /// Anthropic's: `ANTHROPIC_API_KEY`, `ANTHROPIC_API_KEY_SECRET_ID`,
    /// `ANTHROPIC_API_KEY_PARAMETER`.
    pub(crate) const ANTHROPIC: KeyVars = KeyVars {
        json: "api_key",
        value: "ANTHROPIC_API_KEY",
        secret: "ANTHROPIC_API_KEY_SECRET_ID",
        parameter: "ANTHROPIC_API_KEY_PARAMETER",
    };
}

impl KeyVars {
    /// The fields of a JSON secret that hold the key, in order: the generic one, then the
    /// variable's own name (never another provider's or another credential's).
    pub(crate) fn fields(&self) -> Fields {
        [self.json, self.value]
    }
}

/// The fields of a JSON secret that may hold a credential, in order ([`KeyVars::fields`]).
pub(crate) type Fields = [&'static str; 2];

impl KeySource {
    /// The one key source the variables `names` name (none, or more than one, is refused).
    pub(crate) fn from_vars(vars: &Vars<'_>, names: KeyVars) -> Result<KeySource, ConfigError> {
        let sources = [
            vars.get(names.value)
                .map(|v| KeySource::Value(Secret::new(v))),
            vars.get(names.secret).map(KeySource::SecretsManager),
            vars.get(names.parameter).map(KeySource::Parameter),
        ];
        let mut given = sources.into_iter().flatten();
        let key = given.next().unwrap_or(KeySource::None);
        if given.next().is_some() {
            return Err(ConfigError::Invalid {
                name: names.value,
                reason: format!(
                    "give one of {}, {} and {}",
                    names.value, names.secret, names.parameter
                ),
            });
        }
        Ok(key)
    }
}

/// A credential. Its `Debug` shows nothing of it, so it cannot reach a log by accident.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a credential.
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }

    /// The credential, for the one place that sends it.
    pub(crate) fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

/// The key `source` names: from the environment, a Secrets Manager secret (the key itself, or
/// JSON with an `api_key` field) or an SSM `SecureString` parameter. Errors name the source,
/// never the value.
pub(crate) async fn resolve(
    source: &KeySource,
    field: Fields,
    aws: &aws_config::SdkConfig,
) -> Result<Option<Secret>, SetupError> {
    match source {
        KeySource::None => Ok(None),
        KeySource::Value(secret) => Ok(Some(secret.clone())),
        KeySource::SecretsManager(id) => {
            let out = aws_sdk_secretsmanager::Client::new(aws)
                .get_secret_value()
                .secret_id(id)
                .send()
                .await
                .map_err(|e| {
                    SetupError(format!(
                        "secret {id}: {}",
                        aws_smithy_types::error::display::DisplayErrorContext(&e)
                    ))
                })?;
            let text = out
                .secret_string()
                .ok_or_else(|| SetupError(format!("secret {id} has no string value")))?;
            non_empty(key_of(text, field), || {
                format!("secret {id} holds no API key")
            })
        }
        KeySource::Parameter(name) => {
            let out = aws_sdk_ssm::Client::new(aws)
                .get_parameter()
                .name(name)
                .with_decryption(true)
                .send()
                .await
                .map_err(|e| {
                    SetupError(format!(
                        "parameter {name}: {}",
                        aws_smithy_types::error::display::DisplayErrorContext(&e)
                    ))
                })?;
            let value = out
                .parameter()
                .and_then(|p| p.value())
                .ok_or_else(|| SetupError(format!("parameter {name} has no value")))?;
            non_empty(value.trim().to_owned(), || {
                format!("parameter {name} is empty")
            })
        }
    }
}

/// Where a key can be read again, and when it last was after a refusal.
#[derive(Debug)]
pub struct KeyRotation {
    source: KeySource,
    /// The provider's own field in a JSON secret, after `api_key`.
    field: Fields,
    aws: aws_config::SdkConfig,
    last_read: std::sync::Mutex<Option<std::time::Instant>>,
    min_interval: std::time::Duration,
}

impl KeyRotation {
    /// A rotation for `source` (a Secrets Manager secret or an SSM parameter; `None` for a key
    /// that cannot change while the environment lives), read again at most once per
    /// `min_interval`.
    pub fn new(
        source: &KeySource,
        field: Fields,
        aws: &aws_config::SdkConfig,
        min_interval: std::time::Duration,
    ) -> Option<KeyRotation> {
        matches!(
            source,
            KeySource::SecretsManager(_) | KeySource::Parameter(_)
        )
        .then(|| KeyRotation {
            source: source.clone(),
            field,
            aws: aws.clone(),
            last_read: std::sync::Mutex::new(None),
            min_interval,
        })
    }

    /// The key read again after the server refused `current`, when it differs; `None` when it
    /// is the same, cannot be read, or was read again less than the interval ago.
    pub(crate) async fn read_again(&self, current: Option<&Secret>) -> Option<Secret> {
        {
            let mut last = self.last_read.lock().unwrap_or_else(|p| p.into_inner());
            if last.is_some_and(|at| at.elapsed() < self.min_interval) {
                return None;
            }
            *last = Some(std::time::Instant::now());
        }
        match resolve(&self.source, self.field, &self.aws).await {
            Ok(Some(key)) if Some(&key) != current => {
                tracing::info!("the provider refused the API key; a new one was read");
                Some(key)
            }
            Ok(_) => None,
            Err(e) => {
                tracing::warn!(error = %e, "the API key could not be read again");
                None
            }
        }
    }
}

/// A key that was read: an empty one is a start-up error, not a run of 401s.
fn non_empty(key: String, why: impl FnOnce() -> String) -> Result<Option<Secret>, SetupError> {
    if key.trim().is_empty() {
        return Err(SetupError(why()));
    }
    Ok(Some(Secret::new(key)))
}

/// The key in a secret's text: the first of `field` a JSON object holds (its generic field,
/// `api_key` or `webhook_secret`, then the variable's own name: `OPENAI_API_KEY`,
/// `ANTHROPIC_API_KEY`, never another provider's or another credential's), or the whole text.
fn key_of(text: &str, field: Fields) -> String {
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(fields)) => field
            .iter()
            .find_map(|k| fields.get(*k).and_then(Value::as_str))
            .unwrap_or_default()
            .to_owned(),
        _ => text.trim().to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_holds_the_key_or_json_with_it() {
        assert_eq!(key_of("sk-1\n", ["api_key", "OPENAI_API_KEY"]), "sk-1");
        assert_eq!(
            key_of(
                r#"{"api_key":"sk-2","other":1}"#,
                ["api_key", "OPENAI_API_KEY"]
            ),
            "sk-2"
        );
        assert_eq!(
            key_of(
                r#"{"OPENAI_API_KEY":"sk-3"}"#,
                ["api_key", "OPENAI_API_KEY"]
            ),
            "sk-3"
        );
        // One secret holding both providers' keys: each takes its own, never the other's.
        let both = r#"{"OPENAI_API_KEY":"sk-3","ANTHROPIC_API_KEY":"sk-ant-4"}"#;
        assert_eq!(key_of(both, ["api_key", "ANTHROPIC_API_KEY"]), "sk-ant-4");
        assert_eq!(
            key_of(
                r#"{"OPENAI_API_KEY":"sk-3"}"#,
                ["api_key", "ANTHROPIC_API_KEY"]
            ),
            ""
        );
        // A webhook's signing secret beside the API key: each takes its own.
        let keys = r#"{"api_key":"sk-5","webhook_secret":"whsec_AAAA"}"#;
        assert_eq!(
            key_of(keys, ["webhook_secret", "OPENAI_WEBHOOK_SECRET"]),
            "whsec_AAAA"
        );
        assert_eq!(key_of(keys, ["api_key", "OPENAI_API_KEY"]), "sk-5");
        assert_eq!(
            key_of(
                r#"{"api_key":"sk-5"}"#,
                ["webhook_secret", "OPENAI_WEBHOOK_SECRET"]
            ),
            ""
        );
    }

    #[test]
    fn an_empty_key_is_a_start_up_error() {
        assert!(
            non_empty(
                key_of(r#"{"other":"x"}"#, ["api_key", "OPENAI_API_KEY"]),
                || "no key".to_owned()
            )
            .is_err()
        );
        assert!(non_empty("  ".to_owned(), || "empty".to_owned()).is_err());
        assert!(matches!(
            non_empty("sk-1".to_owned(), String::new),
            Ok(Some(_))
        ));
    }
}
