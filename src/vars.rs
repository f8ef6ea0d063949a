//! Settings from the environment: one lookup, one rule for integers and choices, one error type.
//! Each module reads its own settings with these (a `from_vars` beside the type); `config`
//! only assembles them.

/// A configuration value that is missing or wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// A required variable is unset or empty.
    #[error("{0} must be set")]
    Missing(&'static str),
    /// A variable does not parse or is out of range.
    #[error("{name} is invalid: {reason}")]
    Invalid {
        /// The variable.
        name: &'static str,
        /// Why.
        reason: String,
    },
}

/// Variables by name: the process environment, or a map in tests. A blank value counts as
/// unset.
pub(crate) struct Vars<'a> {
    lookup: &'a dyn Fn(&str) -> Option<String>,
}

impl<'a> Vars<'a> {
    /// Variables read through `lookup`.
    pub(crate) fn new(lookup: &'a dyn Fn(&str) -> Option<String>) -> Self {
        Vars { lookup }
    }

    /// The variable `name`, if set and not blank.
    pub(crate) fn get(&self, name: &str) -> Option<String> {
        (self.lookup)(name).filter(|v| !v.trim().is_empty())
    }

    /// The variable `name`, which must be set.
    pub(crate) fn required(&self, name: &'static str) -> Result<String, ConfigError> {
        self.get(name).ok_or(ConfigError::Missing(name))
    }

    /// The integer variable `name`, `default` when unset, refused outside `min..=max`.
    pub(crate) fn integer(
        &self,
        name: &'static str,
        default: i64,
        min: i64,
        max: i64,
    ) -> Result<i64, ConfigError> {
        match self.get(name) {
            None => Ok(default),
            Some(raw) => match raw.trim().parse::<i64>() {
                Ok(v) if (min..=max).contains(&v) => Ok(v),
                _ => Err(ConfigError::Invalid {
                    name,
                    reason: format!("expected an integer from {min} to {max}"),
                }),
            },
        }
    }

    /// The variable `name` in whole seconds, as milliseconds: `default_ms` when unset, refused
    /// outside `min_s..=max_s` seconds.
    pub(crate) fn seconds(
        &self,
        name: &'static str,
        default_ms: i64,
        min_s: i64,
        max_s: i64,
    ) -> Result<i64, ConfigError> {
        Ok(self.integer(name, default_ms / 1000, min_s, max_s)? * 1000)
    }

    /// The variable `name` as one of `options` (its value, then what it means), `default` when
    /// unset.
    /// What sets this deployment apart from every other using the same provider account: 16
    /// hex characters of SHA-256 over `DEPLOYMENT_ID` (the template sets the account, Region
    /// and stack), else over `JOBS_TABLE`; empty when neither is set (tests).
    pub(crate) fn deployment_scope(&self) -> String {
        use sha2::{Digest, Sha256};
        self.get("DEPLOYMENT_ID")
            .or_else(|| self.get("JOBS_TABLE"))
            .map(|scope| {
                let digest = Sha256::digest(scope.as_bytes());
                digest[..8].iter().map(|b| format!("{b:02x}")).collect()
            })
            .unwrap_or_default()
    }

    pub(crate) fn choice<T: Copy>(
        &self,
        name: &'static str,
        default: T,
        options: &[(&str, T)],
    ) -> Result<T, ConfigError> {
        let Some(raw) = self.get(name) else {
            return Ok(default);
        };
        match options.iter().find(|(word, _)| *word == raw) {
            Some((_, value)) => Ok(*value),
            None => {
                let words: Vec<&str> = options.iter().map(|(word, _)| *word).collect();
                Err(ConfigError::Invalid {
                    name,
                    reason: format!("expected {}", words.join(" or ")),
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blank_is_unset_and_ranges_and_choices_are_enforced() {
        let lookup = |name: &str| match name {
            "BLANK" => Some("  ".to_owned()),
            "N" => Some(" 7 ".to_owned()),
            "WORD" => Some("b".to_owned()),
            _ => None,
        };
        let vars = Vars::new(&lookup);
        assert_eq!(vars.get("BLANK"), None);
        assert_eq!(vars.required("BLANK"), Err(ConfigError::Missing("BLANK")));
        assert_eq!(vars.integer("N", 1, 0, 10), Ok(7));
        assert_eq!(vars.integer("UNSET", 3, 0, 10), Ok(3));
        assert!(matches!(
            vars.integer("N", 1, 8, 10),
            Err(ConfigError::Invalid { name: "N", .. })
        ));
        assert_eq!(vars.choice("WORD", 0, &[("a", 1), ("b", 2)]), Ok(2));
        assert_eq!(
            vars.choice("WORD", 0, &[("a", 1), ("c", 3)]),
            Err(ConfigError::Invalid {
                name: "WORD",
                reason: "expected a or c".to_owned()
            })
        );
    }
}
