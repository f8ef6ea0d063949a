//! A provider's own name for each job model name, for the providers of an ordered list.

use std::collections::BTreeMap;

use crate::vars::ConfigError;

/// A provider's model for each job model name (`<PROVIDER>_MODELS`: `gpt-5-mini=anthropic.
/// claude-haiku-4-5-v1:0,*=...`); `*` maps any name the list does not.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ModelMap(BTreeMap<String, String>);

impl ModelMap {
    /// Parses `name=model` pairs, comma-separated (`name` may be `*`).
    pub fn parse(name: &'static str, text: &str) -> Result<ModelMap, ConfigError> {
        let mut map = BTreeMap::new();
        for pair in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let Some((from, to)) = pair.split_once('=') else {
                return Err(ConfigError::Invalid {
                    name,
                    reason: format!("{pair:?} is not job-model=provider-model"),
                });
            };
            let (from, to) = (from.trim(), to.trim());
            if from.is_empty() || to.is_empty() {
                return Err(ConfigError::Invalid {
                    name,
                    reason: format!("{pair:?} names no model on one side"),
                });
            }
            map.insert(from.to_owned(), to.to_owned());
        }
        Ok(ModelMap(map))
    }

    /// Every provider model the map names.
    pub fn targets(&self) -> impl Iterator<Item = &str> {
        self.0.values().map(String::as_str)
    }

    /// Whether the map names a model for every job model (`*=model`).
    pub(crate) fn maps_all(&self) -> bool {
        self.0.contains_key("*")
    }

    /// The model this map names for `job_model`, if any.
    pub fn get(&self, job_model: &str) -> Option<&str> {
        self.0
            .get(job_model)
            .or_else(|| self.0.get("*"))
            .map(String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_parse_pairs_and_a_wildcard() {
        let map = ModelMap::parse("X", " a = b , *=c ").expect("map");
        assert_eq!(map.get("a"), Some("b"));
        assert_eq!(map.get("z"), Some("c"));
        assert!(ModelMap::parse("X", "a").is_err());
        assert!(ModelMap::parse("X", "a=").is_err());
    }
}
