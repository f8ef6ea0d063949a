//! The batch response, decided in one place.
//!
//! A record is left out of `batchItemFailures` (and so deleted by Lambda) only when its job is
//! terminal. A failed record is named by its real `messageId`; a failed record without one
//! cannot be named, and an empty identifier would fail the whole batch anyway, so the whole
//! batch is failed on purpose instead (see `docs/protocol.md`).

pub use crate::report::UnnamedFailure;

/// The ids to report as failures, from `(message_id, succeeded)` per record.
pub fn failures<'a>(
    records: impl IntoIterator<Item = (Option<&'a str>, bool)>,
) -> Result<Vec<String>, UnnamedFailure> {
    let mut failed = Vec::new();
    for (index, (message_id, succeeded)) in records.into_iter().enumerate() {
        if succeeded {
            continue;
        }
        match message_id.filter(|id| !id.is_empty()) {
            Some(id) => failed.push(id.to_owned()),
            None => return Err(UnnamedFailure { index }),
        }
    }
    Ok(failed)
}

/// A batch response Lambda would reject, failing the whole batch.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidResponse {
    /// An `itemIdentifier` is empty.
    #[error("empty itemIdentifier")]
    EmptyIdentifier,
    /// An `itemIdentifier` names no record of the batch.
    #[error("itemIdentifier names no record of the batch")]
    UnknownIdentifier,
}

/// What the event source mapping makes of a response: the message ids to delete, or an error
/// when the response is invalid and the whole batch counts as failed.
pub fn successes<'a>(
    batch_ids: &[&'a str],
    reported_failures: &[&str],
) -> Result<Vec<&'a str>, InvalidResponse> {
    for failure in reported_failures {
        if failure.is_empty() {
            return Err(InvalidResponse::EmptyIdentifier);
        }
        if !batch_ids.contains(failure) {
            return Err(InvalidResponse::UnknownIdentifier);
        }
    }
    Ok(batch_ids
        .iter()
        .copied()
        .filter(|id| !reported_failures.contains(id))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_failed_records_are_named_in_order() {
        let got = failures([(Some("a"), true), (Some("b"), false), (Some("c"), false)]);
        assert_eq!(got, Ok(vec!["b".to_owned(), "c".to_owned()]));
        assert_eq!(failures([(Some("a"), true)]), Ok(vec![]));
    }

    #[test]
    fn an_unnamed_failure_fails_the_batch_but_an_unnamed_success_does_not() {
        assert_eq!(
            failures([(Some("a"), false), (None, true)]),
            Ok(vec!["a".to_owned()])
        );
        assert_eq!(
            failures([(Some("a"), true), (Some(""), false)]),
            Err(UnnamedFailure { index: 1 })
        );
        assert_eq!(failures([(None, false)]), Err(UnnamedFailure { index: 0 }));
    }

    #[test]
    fn the_event_source_rejects_empty_or_foreign_identifiers() {
        let ids = ["m1", "m2", "m3"];
        assert_eq!(successes(&ids, &["m2"]), Ok(vec!["m1", "m3"]));
        assert_eq!(
            successes(&ids, &[""]),
            Err(InvalidResponse::EmptyIdentifier)
        );
        assert_eq!(
            successes(&ids, &["zz"]),
            Err(InvalidResponse::UnknownIdentifier)
        );
    }
}
