//! What a JSON document costs to hold once parsed, counted from its text before it is parsed.
//!
//! A body's bytes say little about its parsed size: `[{"a":0},...]` is 8 bytes a value in text
//! and about 700 in a `serde_json::Value` (a map's node is allocated whole), so a valid 1 MiB
//! body can parse to about 90 MiB. [`document_cost`] walks the text once, counting the values,
//! the maps and their members, the strings, and the arrays' elements, and prices each as
//! serde_json (with its default `BTreeMap` maps) and the system allocator hold them. A document
//! whose cost is past [`MAX_DOCUMENT_COST`] is refused before it is parsed.

/// The most a document may cost parsed: with the largest payload's bytes (16 MiB) beside it
/// and the runtime's reserve (48 MiB), within a 128 MB function.
pub const MAX_DOCUMENT_COST: usize = 32 * 1_048_576;

/// A map's first leaf node (eleven keys and values, its parent link and length) and its
/// allocation's overhead.
const MAP_NODE_BYTES: usize = 656;
/// A map member beyond the node: its slot's share when the node splits, and the key's
/// allocation (a heap block of at least 32 bytes).
const MEMBER_BYTES: usize = 96;
/// An array element: its `Value` (32 bytes) in a vector that may have doubled past it.
const ELEMENT_BYTES: usize = 64;
/// A string value's allocation beyond its bytes.
const STRING_BYTES: usize = 32;
/// Any container's own header and allocation.
const CONTAINER_BYTES: usize = 32;
/// How deep the scan tracks which container it is in (serde_json refuses past 128).
const MAX_TRACKED_DEPTH: usize = 256;

/// The bytes a parsed `serde_json::Value` of `text` takes, at least: an upper bound for the
/// shapes that cost most per byte (many small maps, long arrays of numbers), within a few times
/// the truth for ordinary documents. Text that is not JSON is priced as far as it reads.
pub fn document_cost(text: &str) -> usize {
    let mut cost = text.len();
    // Whether each open container is a map (true) or an array.
    let mut open: Vec<bool> = Vec::new();
    let mut in_string = false;
    let mut escaped = false;
    // Whether the next token starts a value (not a key) in the innermost container.
    let mut value_next = true;
    let element = |open: &[bool], value_next: bool| {
        if value_next && open.last() == Some(&false) {
            ELEMENT_BYTES
        } else {
            0
        }
    };
    for &b in text.as_bytes() {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => {
                in_string = true;
                cost += element(&open, value_next);
                // A key's allocation is counted with its member.
                if value_next {
                    cost += STRING_BYTES;
                }
                value_next = false;
            }
            b'{' | b'[' => {
                cost += element(&open, value_next) + CONTAINER_BYTES;
                if b == b'{' {
                    cost += MAP_NODE_BYTES;
                }
                if open.len() < MAX_TRACKED_DEPTH {
                    open.push(b == b'{');
                }
                value_next = b == b'[';
            }
            b'}' | b']' => {
                open.pop();
                value_next = false;
            }
            b':' => {
                cost += MEMBER_BYTES;
                value_next = true;
            }
            b',' => value_next = open.last() != Some(&true),
            b' ' | b'\t' | b'\n' | b'\r' => {}
            // The first byte of a number or a literal starts a value; the rest are free.
            _ => {
                cost += element(&open, value_next);
                value_next = false;
            }
        }
    }
    cost
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_maps_cost_far_more_than_their_bytes() {
        let hostile = format!("[{}]", vec![r#"{"a":0}"#; 100_000].join(","));
        let per_value = document_cost(&hostile) / 100_000;
        assert!(per_value > 700, "{per_value}");
        // A prompt of the same size costs about its bytes.
        let prose = format!(r#"{{"prompt":"{}"}}"#, "x".repeat(hostile.len()));
        let cost = document_cost(&prose);
        assert!(cost < prose.len() + 2_000, "{cost}");
    }

    #[test]
    fn strings_hide_their_brackets_and_escapes() {
        let tricky = r#"{"a":"{[,:\"]}","b":[1,2,3]}"#;
        let plain = r#"{"a":"xxxxxxxx","b":[1,2,3]}"#;
        assert_eq!(document_cost(tricky), document_cost(plain));
    }

    #[test]
    fn numbers_in_arrays_are_elements_and_in_maps_members() {
        let array = document_cost("[1,2,3,4]");
        assert_eq!(array, 9 + CONTAINER_BYTES + 4 * ELEMENT_BYTES);
        let map = document_cost(r#"{"a":1,"b":2}"#);
        assert_eq!(
            map,
            13 + CONTAINER_BYTES + MAP_NODE_BYTES + 2 * MEMBER_BYTES
        );
    }
}
