//! What each path of a provider and model took, shared by every invocation: an item of the
//! ledger table per provider and model, `#paths#<provider>#<model>`, holding the last
//! [`Times::KEPT`] times of each path. An environment adds what it measured at most once a
//! minute, by a write conditional on the version it read, and takes everyone's in return, so
//! a new environment chooses from what the others measured instead of the documented bounds.

use futures::future::BoxFuture;

use super::LedgerError;
use crate::job::Millis;
use crate::job::path::Times;

/// The key prefix of the items (job ids never start with `#`).
pub(crate) const PATHS_KEY_PREFIX: &str = "#paths#";

/// Each path's times, in [`crate::job::path::ALL`]'s order, oldest first.
pub type Taken = [Vec<Millis>; 4];

/// The key of `provider`'s and `model`'s item, after [`PATHS_KEY_PREFIX`].
pub fn key(provider: &str, model: &str) -> String {
    format!("{provider}#{model}")
}

/// `kept` with `new` after it, each path's last [`Times::KEPT`] only.
pub fn merged(kept: &Taken, new: &Taken) -> Taken {
    std::array::from_fn(|i| {
        let all: Vec<Millis> = kept[i].iter().chain(&new[i]).copied().collect();
        let from = all.len().saturating_sub(Times::KEPT);
        all[from..].to_vec()
    })
}

/// Where the shared times are kept: the DynamoDB ledger table, or memory in tests.
pub trait SharedTimes: Send + Sync + std::fmt::Debug {
    /// Adds `new` to the times of `key` (nothing is written when it holds none) and returns
    /// everyone's, as [`merged`] keeps them.
    fn merge<'a>(
        &'a self,
        key: &'a str,
        new: &'a Taken,
        now: Millis,
    ) -> BoxFuture<'a, Result<Taken, LedgerError>>;
}

/// Shared times in memory, under one lock.
#[derive(Debug, Default)]
pub struct MemoryTimes {
    items: std::sync::Mutex<std::collections::HashMap<String, Taken>>,
}

impl MemoryTimes {
    /// No times yet.
    pub fn new() -> Self {
        Self::default()
    }
}

impl SharedTimes for MemoryTimes {
    fn merge<'a>(
        &'a self,
        key: &'a str,
        new: &'a Taken,
        _now: Millis,
    ) -> BoxFuture<'a, Result<Taken, LedgerError>> {
        let mut items = self.items.lock().unwrap_or_else(|p| p.into_inner());
        let all = merged(&items.get(key).cloned().unwrap_or_default(), new);
        if new.iter().any(|t| !t.is_empty()) {
            items.insert(key.to_owned(), all.clone());
        }
        Box::pin(std::future::ready(Ok(all)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_path_keeps_its_last_times_in_order() {
        let kept: Taken = [vec![1, 2], vec![], vec![5], vec![]];
        let new: Taken = [vec![3], vec![4], vec![], vec![]];
        assert_eq!(
            merged(&kept, &new),
            [vec![1, 2, 3], vec![4], vec![5], vec![]]
        );
        let many: Taken = [(0..40).collect(), vec![], vec![], vec![]];
        let all = merged(&kept, &many);
        assert_eq!(all[0].len(), Times::KEPT);
        assert_eq!((all[0][0], all[0][Times::KEPT - 1]), (8, 39));
    }
}
