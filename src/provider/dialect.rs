//! A contract's JSON Schema in the dialect a provider's constrained decoding takes. A provider
//! that compiles the schema into a grammar accepts a subset of JSON Schema and answers 400 for
//! the rest; what its dialect cannot say moves into the node's `description` (the model may
//! still follow it), as the vendors' own SDKs do, and the contract's whole schema still judges
//! every answer locally.

use serde_json::{Map, Value};

/// The string formats Anthropic's structured outputs take (docs, "Structured outputs", "JSON
/// Schema limitations"; the official Python SDK's `SupportedStringFormats`).
const ANTHROPIC_FORMATS: [&str; 10] = [
    "date-time",
    "time",
    "date",
    "duration",
    "email",
    "hostname",
    "uri",
    "ipv4",
    "ipv6",
    "uuid",
];

/// The keywords of a type list's members: each member of `"type": ["string", "null"]` takes
/// the node's keywords for its own type.
fn keywords_of(kind: &str) -> &'static [&'static str] {
    match kind {
        "string" => &["minLength", "maxLength", "pattern", "format"],
        "number" | "integer" => &[
            "minimum",
            "maximum",
            "exclusiveMinimum",
            "exclusiveMaximum",
            "multipleOf",
        ],
        "array" => &[
            "items",
            "prefixItems",
            "minItems",
            "maxItems",
            "uniqueItems",
            "contains",
        ],
        "object" => &[
            "properties",
            "required",
            "additionalProperties",
            "patternProperties",
            "propertyNames",
            "minProperties",
            "maxProperties",
        ],
        _ => &[],
    }
}

/// `schema` as Anthropic's structured outputs (`output_config.format`) and tool input schemas
/// take it, for Claude on Anthropic's API or Bedrock (Anthropic's docs, "JSON Schema
/// limitations": no numeric or length bounds, `minItems` 0 or 1 only, `additionalProperties`
/// false; rules as the official Python SDK's `transform_schema` applies them,
/// anthropic-sdk-python `src/anthropic/lib/_parse/_transform.py`, commit 00f1c336). Kept:
/// `$defs` and `$ref`, `type`, `enum`, `anyOf` (`oneOf` becomes `anyOf`), `allOf`,
/// `description`, `title`; an object's `properties` and `required`, with
/// `additionalProperties: false`; a string's `format` among those listed; an array's `items`
/// and a `minItems` of 0 or 1. A type list becomes an `anyOf` of its types, each with its own
/// keywords. Annotations (`$schema`, `$id`, `$comment`) are dropped; any other keyword is said
/// in the description, as `{keyword: value, ...}`.
pub fn anthropic(schema: &Value) -> Value {
    let Value::Object(node) = schema else {
        return schema.clone();
    };
    let mut rest = node.clone();
    for annotation in ["$schema", "$id", "$comment"] {
        rest.remove(annotation);
    }
    let mut out = Map::new();
    let defs = rest.remove("$defs").or_else(|| rest.remove("definitions"));
    if let Some(Value::Object(defs)) = defs {
        let lowered = defs
            .iter()
            .map(|(k, v)| (k.clone(), anthropic(v)))
            .collect();
        out.insert("$defs".into(), Value::Object(lowered));
    }
    if let Some(reference) = rest.remove("$ref") {
        out.insert("$ref".into(), reference);
        return Value::Object(out);
    }
    for keep in ["description", "title", "enum"] {
        if let Some(value) = rest.remove(keep) {
            out.insert(keep.into(), value);
        }
    }
    let lower_all = |list: Value| match list {
        Value::Array(items) => Value::Array(items.iter().map(anthropic).collect()),
        other => other,
    };
    if let Some(any) = rest.remove("anyOf").or_else(|| rest.remove("oneOf")) {
        out.insert("anyOf".into(), lower_all(any));
    }
    if let Some(all) = rest.remove("allOf") {
        out.insert("allOf".into(), lower_all(all));
    }
    match rest.remove("type") {
        Some(Value::Array(kinds)) if kinds.len() == 1 => {
            typed(&kinds[0], &mut rest, &mut out);
        }
        Some(Value::Array(kinds)) => {
            // One branch per type, each with the keywords of its type.
            let branches: Vec<Value> = kinds
                .iter()
                .map(|kind| {
                    let mut own = Map::new();
                    own.insert("type".into(), kind.clone());
                    for keyword in keywords_of(kind.as_str().unwrap_or_default()) {
                        if let Some(value) = rest.get(*keyword) {
                            own.insert((*keyword).into(), value.clone());
                        }
                    }
                    anthropic(&Value::Object(own))
                })
                .collect();
            for kind in &kinds {
                for keyword in keywords_of(kind.as_str().unwrap_or_default()) {
                    rest.remove(*keyword);
                }
            }
            out.insert("anyOf".into(), Value::Array(branches));
        }
        Some(kind) => typed(&kind, &mut rest, &mut out),
        None => {}
    }
    if !rest.is_empty() {
        describe(&rest, &mut out);
    }
    Value::Object(out)
}

/// The keywords of a node of one type `kind` that Anthropic takes, moved from `rest` to `out`.
fn typed(kind: &Value, rest: &mut Map<String, Value>, out: &mut Map<String, Value>) {
    out.insert("type".into(), kind.clone());
    match kind.as_str() {
        Some("object") => {
            let properties = match rest.remove("properties") {
                Some(Value::Object(p)) => {
                    p.iter().map(|(k, v)| (k.clone(), anthropic(v))).collect()
                }
                _ => Map::new(),
            };
            out.insert("properties".into(), Value::Object(properties));
            // Only `false` is taken: an object the schema left open is closed for decoding,
            // and judged locally by its own rule.
            if rest.get("additionalProperties") == Some(&Value::Bool(false)) {
                rest.remove("additionalProperties");
            }
            out.insert("additionalProperties".into(), Value::Bool(false));
            if let Some(required) = rest.remove("required") {
                out.insert("required".into(), required);
            }
        }
        Some("string") => {
            if let Some(Value::String(format)) = rest.get("format")
                && ANTHROPIC_FORMATS.contains(&format.as_str())
            {
                out.insert("format".into(), Value::String(format.clone()));
                rest.remove("format");
            }
        }
        Some("array") => {
            if let Some(items) = rest.remove("items") {
                out.insert("items".into(), anthropic(&items));
            }
            if let Some(min) = rest
                .get("minItems")
                .filter(|m| m.as_u64().is_some_and(|m| m <= 1))
            {
                out.insert("minItems".into(), min.clone());
                rest.remove("minItems");
            }
        }
        _ => {}
    }
}

/// Says the keywords left in `rest` in the node's description: `{keyword: value, ...}`, after
/// what the description said.
fn describe(rest: &Map<String, Value>, out: &mut Map<String, Value>) {
    let mut said: Vec<String> = rest.iter().map(|(k, v)| format!("{k}: {v}")).collect();
    said.sort();
    let extra = format!("{{{}}}", said.join(", "));
    let description = match out.get("description").and_then(Value::as_str) {
        Some(own) => format!("{own}\n\n{extra}"),
        None => extra,
    };
    out.insert("description".into(), Value::String(description));
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn bounds_move_into_the_description_and_type_lists_become_any_of() {
        let schema = json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object",
            "required": ["n", "due", "lines"],
            "properties": {
                "n": {"type": "integer", "minimum": 1, "maximum": 10, "description": "A number"},
                "due": {"type": ["string", "null"], "pattern": "^[0-9]{4}$", "format": "date"},
                "lines": {"type": "array", "minItems": 1, "maxItems": 200,
                          "items": {"$ref": "#/$defs/line"}},
                "kind": {"oneOf": [{"type": "string", "maxLength": 3}, {"type": "null"}]}
            },
            "$defs": {"line": {"type": "object", "properties": {"q": {"type": "number",
                                "exclusiveMinimum": 0}}}}
        });
        let lowered = anthropic(&schema);
        assert!(lowered.get("$schema").is_none());
        assert_eq!(lowered["additionalProperties"], false);
        assert_eq!(
            lowered["properties"]["n"],
            json!({"type": "integer", "description": "A number\n\n{maximum: 10, minimum: 1}"})
        );
        assert_eq!(
            lowered["properties"]["due"],
            json!({"anyOf": [
                {"type": "string", "format": "date", "description": "{pattern: \"^[0-9]{4}$\"}"},
                {"type": "null"}
            ]})
        );
        assert_eq!(
            lowered["properties"]["lines"],
            json!({"type": "array", "items": {"$ref": "#/$defs/line"}, "minItems": 1,
                   "description": "{maxItems: 200}"})
        );
        assert_eq!(
            lowered["properties"]["kind"]["anyOf"][0],
            json!({"type": "string", "description": "{maxLength: 3}"})
        );
        // Every object closed, in the definitions too.
        let line = &lowered["$defs"]["line"];
        assert_eq!(line["additionalProperties"], false);
        assert_eq!(
            line["properties"]["q"],
            json!({"type": "number", "description": "{exclusiveMinimum: 0}"})
        );
    }
}
