//! What DynamoDB bills for a write of the ledger, by its documented rules, since the emulator
//! bills nothing: an item's size (attribute names and values), the write units of a write (one
//! per KB of the larger of the item before and after it, rounded up; a refused conditional
//! write is billed the same), and the writes each global secondary index adds (one to put or
//! delete an entry, two when an entry's key changes, none when the item is in the index neither
//! before nor after; the indexes project keys only, so a write that changes no key of an index
//! costs it nothing).

use aws_sdk_dynamodb::types::AttributeValue;

use super::index::{INDEXES, IndexKeys};
use super::item::Item;

/// What one write cost, in DynamoDB's units.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriteCost {
    /// Write request units of the table write.
    pub table: u64,
    /// Writes to the indexes (each entry is under 1 KB: one unit each).
    pub index: u64,
}

impl WriteCost {
    /// All the write units.
    pub fn units(&self) -> u64 {
        self.table + self.index
    }
}

/// What a write that found `before` and left `after` (`None`: no item) is billed; a refused
/// write leaves `after` as `before`.
pub(crate) fn write_cost(before: Option<&Item>, after: Option<&Item>) -> WriteCost {
    let larger = before
        .map(item_bytes)
        .max(after.map(item_bytes))
        .unwrap_or(0);
    let index = INDEXES
        .iter()
        .map(
            |i| match (index_key(before, i).as_ref(), index_key(after, i).as_ref()) {
                (None, None) => 0,
                (Some(old), Some(new)) if old == new => 0,
                (Some(_), Some(_)) => 2,
                _ => 1,
            },
        )
        .sum();
    WriteCost {
        table: larger.div_ceil(1024).max(1) as u64,
        index,
    }
}

/// The item's entry key in `index`, when it has both key attributes (else it is not there).
fn index_key(item: Option<&Item>, index: &IndexKeys) -> Option<(AttributeValue, AttributeValue)> {
    let item = item?;
    Some((
        item.get(index.partition)?.clone(),
        item.get(index.sort)?.clone(),
    ))
}

/// An item's size as DynamoDB counts it: each attribute's name and value.
pub(crate) fn item_bytes(item: &Item) -> usize {
    item.iter()
        .map(|(name, value)| name.len() + value_bytes(value))
        .sum()
}

fn value_bytes(value: &AttributeValue) -> usize {
    match value {
        AttributeValue::S(s) => s.len(),
        AttributeValue::N(n) => number_bytes(n),
        AttributeValue::B(b) => b.as_ref().len(),
        AttributeValue::Bool(_) | AttributeValue::Null(_) => 1,
        // A list or map: 3 bytes, and 1 byte for each element (a map's names count too).
        AttributeValue::L(list) => 3 + list.iter().map(|v| 1 + value_bytes(v)).sum::<usize>(),
        AttributeValue::M(map) => {
            3 + map
                .iter()
                .map(|(k, v)| 1 + k.len() + value_bytes(v))
                .sum::<usize>()
        }
        AttributeValue::Ss(set) => set.iter().map(String::len).sum(),
        AttributeValue::Ns(set) => set.iter().map(|n| number_bytes(n)).sum(),
        AttributeValue::Bs(set) => set.iter().map(|b| b.as_ref().len()).sum(),
        _ => 0,
    }
}

/// A number: one byte per two significant digits (leading and trailing zeros trimmed), plus one.
fn number_bytes(n: &str) -> usize {
    let digits: String = n.chars().filter(char::is_ascii_digit).collect();
    let significant = digits.trim_start_matches('0').trim_end_matches('0').len();
    significant.div_ceil(2) + 1
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn item(pairs: &[(&str, AttributeValue)]) -> Item {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.clone()))
            .collect()
    }

    fn s(v: &str) -> AttributeValue {
        AttributeValue::S(v.to_owned())
    }

    fn n(v: &str) -> AttributeValue {
        AttributeValue::N(v.to_owned())
    }

    #[test]
    fn sizes_follow_dynamodbs_rules() {
        assert_eq!(item_bytes(&item(&[("job_id", s("abc"))])), 6 + 3);
        // 1700000000000: two significant digits (17), so 1 + 1 bytes.
        assert_eq!(number_bytes("1700000000000"), 2);
        assert_eq!(number_bytes("123.45"), 4);
        assert_eq!(number_bytes("-0.001"), 2);
        let nested = AttributeValue::M(HashMap::from([("a".to_owned(), s("xy"))]));
        // 3 for the map, 1 for its element, 1 for the name, 2 for the value.
        assert_eq!(value_bytes(&nested), 7);
        assert_eq!(
            value_bytes(&AttributeValue::L(vec![n("5"), n("50")])),
            3 + 2 + 2 + 2
        );
    }

    #[test]
    fn a_write_is_billed_on_the_larger_image_by_the_kilobyte() {
        let small = item(&[("job_id", s("j")), ("input", s(&"x".repeat(100)))]);
        let large = item(&[("job_id", s("j")), ("input", s(&"x".repeat(1_500)))]);
        assert_eq!(write_cost(None, Some(&small)).table, 1);
        assert_eq!(write_cost(Some(&large), Some(&small)).table, 2);
        assert_eq!(write_cost(Some(&small), Some(&large)).table, 2);
    }

    #[test]
    fn index_writes_count_entries_put_deleted_and_moved() {
        let due = ("due_on", s("1970-01-01"));
        let open = item(&[
            ("job_id", s("j")),
            ("attention", s("unknown#01")),
            ("updated_at", n("1")),
            ("deadline_at", n("9")),
            due.clone(),
        ]);
        let renewed = item(&[
            ("job_id", s("j")),
            ("attention", s("unknown#01")),
            ("updated_at", n("2")),
            ("deadline_at", n("9")),
            due.clone(),
        ]);
        let done = item(&[
            ("job_id", s("j")),
            ("updated_at", n("3")),
            ("deadline_at", n("9")),
            due.clone(),
        ]);
        let first_claim = item(&[
            ("job_id", s("j")),
            ("updated_at", n("1")),
            ("deadline_at", n("9")),
            due,
        ]);
        let quiet = item(&[("job_id", s("j")), ("updated_at", n("1"))]);
        // Into both attention-keyed indexes and the due index.
        assert_eq!(write_cost(None, Some(&open)).index, 3);
        // The attention index's sort key moves (delete and put); the others' stay.
        assert_eq!(write_cost(Some(&open), Some(&renewed)).index, 2);
        // Out of both attention-keyed indexes; the due index's entry stays.
        assert_eq!(write_cost(Some(&renewed), Some(&done)).index, 2);
        // A first claim whose message SQS may drop: into the due index at the claim, and
        // nothing at the acceptance.
        assert_eq!(write_cost(None, Some(&first_claim)).index, 1);
        assert_eq!(write_cost(Some(&first_claim), Some(&done)).index, 0);
        // The happy path: a first claim whose message SQS keeps has no entry at all, nor its
        // acceptance.
        let unlisted = |at: &str| {
            item(&[
                ("job_id", s("j")),
                ("updated_at", n(at)),
                ("deadline_at", n("9")),
            ])
        };
        assert_eq!(write_cost(None, Some(&unlisted("1"))).index, 0);
        assert_eq!(
            write_cost(Some(&unlisted("1")), Some(&unlisted("3"))).index,
            0
        );
        // In none before or after.
        assert_eq!(write_cost(None, Some(&quiet)).index, 0);
    }

    #[test]
    fn the_indexes_are_the_templates() {
        let template = include_str!("../../../template.yaml");
        for keys in INDEXES {
            let at = template
                .find(&format!("IndexName: {}", keys.name))
                .unwrap_or_else(|| panic!("{} is not in template.yaml", keys.name));
            let named: Vec<&str> = template[at..]
                .lines()
                .filter_map(|l| l.trim().strip_prefix("- AttributeName: "))
                .take(2)
                .collect();
            assert_eq!(named, [keys.partition, keys.sort], "{}", keys.name);
        }
        assert_eq!(template.matches("IndexName:").count(), INDEXES.len());
    }
}
