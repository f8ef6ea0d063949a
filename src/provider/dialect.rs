//! A contract's JSON Schema in the dialect a provider's constrained decoding takes. A provider
//! that compiles the schema into a grammar accepts a subset of JSON Schema and answers 400 for
//! the rest; what its dialect cannot say moves into the node's `description` (the model may
//! still follow it), as the vendors' own SDKs do, and the contract's whole schema still judges
//! every answer locally.

use serde_json::{Map, Value};

/// What one provider's constrained decoding takes of JSON Schema, beyond what every dialect
/// here keeps (`$defs` and `$ref`, `type`, `enum`, `anyOf` (`oneOf` becomes `anyOf`),
/// `description`, `title`; an object's `properties` and `required`, closed with
/// `additionalProperties: false`; an array's `items`).
struct Dialect {
    /// The string formats it takes.
    formats: &'static [&'static str],
    /// Whether a node of type `kind` keeps `keyword` with `value` (a bound, a pattern).
    keeps: fn(kind: &str, keyword: &str, value: &Value) -> bool,
    /// Keywords of any node it takes besides those every dialect keeps.
    also: &'static [&'static str],
}

/// Anthropic's structured outputs (`output_config.format`) and tool input schemas, for Claude
/// on Anthropic's API or Bedrock (Anthropic's docs, "JSON Schema limitations": no numeric or
/// length bounds, `minItems` 0 or 1 only, `additionalProperties` false; rules as the official
/// Python SDK's `transform_schema` applies them, anthropic-sdk-python
/// `src/anthropic/lib/_parse/_transform.py`, commit 00f1c336), with `allOf`.
const ANTHROPIC: Dialect = Dialect {
    // The official Python SDK's `SupportedStringFormats`.
    formats: &[
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
    ],
    keeps: |kind, keyword, value| {
        kind == "array" && keyword == "minItems" && value.as_u64().is_some_and(|m| m <= 1)
    },
    also: &["allOf"],
};

/// OpenAI's Structured Outputs in strict mode (docs, "Structured Outputs", "Supported
/// schemas", as of 2025-08: strings `pattern` and `format`, numbers `minimum`, `maximum`,
/// `exclusiveMinimum`, `exclusiveMaximum`, `multipleOf`, arrays `minItems` and `maxItems`;
/// composition by `allOf`, `not`, `if`/`then`/`else`, `dependentRequired`,
/// `dependentSchemas` not supported; lengths (`minLength`, `maxLength`) not listed, and
/// refused for fine-tuned models, so said in the description here), with `const`.
const OPENAI: Dialect = Dialect {
    formats: &[
        "date-time",
        "time",
        "date",
        "duration",
        "email",
        "hostname",
        "ipv4",
        "ipv6",
        "uuid",
    ],
    keeps: |kind, keyword, _| match kind {
        "string" => keyword == "pattern",
        "number" | "integer" => [
            "minimum",
            "maximum",
            "exclusiveMinimum",
            "exclusiveMaximum",
            "multipleOf",
        ]
        .contains(&keyword),
        "array" => keyword == "minItems" || keyword == "maxItems",
        _ => false,
    },
    also: &["const"],
};

/// OpenAI's strict mode limits on one schema (docs, "Structured Outputs", "Objects have
/// limitations on nesting depth and size"): properties in all, levels of nesting, enum values
/// in all, and characters in every property name, definition name, enum and const value.
const OPENAI_MAX_PROPERTIES: usize = 5_000;
const OPENAI_MAX_DEPTH: usize = 10;
const OPENAI_MAX_ENUM_VALUES: usize = 1_000;
const OPENAI_MAX_NAME_CHARS: usize = 120_000;

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

/// `schema` as Anthropic's structured outputs and tool input schemas take it ([`ANTHROPIC`]).
/// A type list becomes an `anyOf` of its types, each with its own keywords. Annotations
/// (`$schema`, `$id`, `$comment`) are dropped; any other keyword is said in the description,
/// as `{keyword: value, ...}`.
pub fn anthropic(schema: &Value) -> Value {
    lower(schema, &ANTHROPIC)
}

/// `schema` as OpenAI's strict Structured Outputs take it ([`OPENAI`]), lowered as for
/// Anthropic. Whether strict mode takes the result at all is [`openai_not_strict`]'s to say.
pub fn openai(schema: &Value) -> Value {
    lower(schema, &OPENAI)
}

/// Why OpenAI's strict mode refuses the lowered schema `lowered` whatever its keywords, if it
/// does: a root that is not an object (or is an `anyOf`), an object whose properties are not
/// all `required` (strict mode has no optional property: the docs ask for a union with null,
/// which would change what the contract accepts), or a schema past the limits. Such a contract
/// is sent to OpenAI with `strict: false`, its schema guidance only, and judged here.
pub(crate) fn openai_not_strict(lowered: &Value) -> Option<String> {
    if lowered.get("type").and_then(Value::as_str) != Some("object") {
        return Some("its root is not an object".to_owned());
    }
    let mut walk = Walk::default();
    walk.visit(lowered, 0);
    if let Some(optional) = walk.optional {
        return Some(format!("property '{optional}' is optional"));
    }
    let limits = [
        (walk.properties, OPENAI_MAX_PROPERTIES, "properties"),
        (walk.depth, OPENAI_MAX_DEPTH, "levels of nesting"),
        (walk.enum_values, OPENAI_MAX_ENUM_VALUES, "enum values"),
        (
            walk.name_chars,
            OPENAI_MAX_NAME_CHARS,
            "characters of names and enum values",
        ),
    ];
    limits
        .iter()
        .find(|(n, most, _)| n > most)
        .map(|(n, most, what)| format!("{n} {what}, past strict mode's {most}"))
}

/// What [`openai_not_strict`] counts over a lowered schema.
#[derive(Default)]
struct Walk {
    properties: usize,
    depth: usize,
    enum_values: usize,
    name_chars: usize,
    optional: Option<String>,
}

impl Walk {
    fn visit(&mut self, node: &Value, depth: usize) {
        let Value::Object(node) = node else {
            return;
        };
        self.depth = self.depth.max(depth);
        if let Some(Value::Array(values)) = node.get("enum") {
            self.enum_values += values.len();
            self.name_chars += values
                .iter()
                .filter_map(Value::as_str)
                .map(str::len)
                .sum::<usize>();
        }
        if let Some(Value::Object(properties)) = node.get("properties") {
            let required: Vec<&str> = node
                .get("required")
                .and_then(Value::as_array)
                .map(|r| r.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            for (name, child) in properties {
                self.properties += 1;
                self.name_chars += name.len();
                if !required.contains(&name.as_str()) && self.optional.is_none() {
                    self.optional = Some(name.clone());
                }
                self.visit(child, depth + 1);
            }
        }
        if let Some(Value::Object(defs)) = node.get("$defs") {
            for (name, child) in defs {
                self.name_chars += name.len();
                self.visit(child, depth);
            }
        }
        if let Some(items) = node.get("items") {
            self.visit(items, depth + 1);
        }
        if let Some(Value::Array(branches)) = node.get("anyOf") {
            for branch in branches {
                self.visit(branch, depth);
            }
        }
    }
}

/// `schema` lowered to `dialect`.
fn lower(schema: &Value, dialect: &Dialect) -> Value {
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
            .map(|(k, v)| (k.clone(), lower(v, dialect)))
            .collect();
        out.insert("$defs".into(), Value::Object(lowered));
    }
    if let Some(reference) = rest.remove("$ref") {
        // A reference stands alone: OpenAI refuses keywords beside it.
        out.insert("$ref".into(), reference);
        return Value::Object(out);
    }
    for keep in ["description", "title", "enum"]
        .iter()
        .chain(dialect.also.iter().filter(|k| **k != "allOf"))
    {
        if let Some(value) = rest.remove(*keep) {
            out.insert((*keep).into(), value);
        }
    }
    let lower_all = |list: Value| match list {
        Value::Array(items) => Value::Array(items.iter().map(|i| lower(i, dialect)).collect()),
        other => other,
    };
    if let Some(any) = rest.remove("anyOf").or_else(|| rest.remove("oneOf")) {
        out.insert("anyOf".into(), lower_all(any));
    }
    if dialect.also.contains(&"allOf")
        && let Some(all) = rest.remove("allOf")
    {
        out.insert("allOf".into(), lower_all(all));
    }
    match rest.remove("type") {
        Some(Value::Array(kinds)) if kinds.len() == 1 => {
            typed(&kinds[0], &mut rest, &mut out, dialect);
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
                    lower(&Value::Object(own), dialect)
                })
                .collect();
            for kind in &kinds {
                for keyword in keywords_of(kind.as_str().unwrap_or_default()) {
                    rest.remove(*keyword);
                }
            }
            out.insert("anyOf".into(), Value::Array(branches));
        }
        Some(kind) => typed(&kind, &mut rest, &mut out, dialect),
        None => {}
    }
    if !rest.is_empty() {
        describe(&rest, &mut out);
    }
    Value::Object(out)
}

/// The keywords of a node of one type `kind` that `dialect` takes, moved from `rest` to `out`.
fn typed(
    kind: &Value,
    rest: &mut Map<String, Value>,
    out: &mut Map<String, Value>,
    dialect: &Dialect,
) {
    out.insert("type".into(), kind.clone());
    let name = kind.as_str().unwrap_or_default();
    match name {
        "object" => {
            let properties = match rest.remove("properties") {
                Some(Value::Object(p)) => p
                    .iter()
                    .map(|(k, v)| (k.clone(), lower(v, dialect)))
                    .collect(),
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
        "string" => {
            if let Some(Value::String(format)) = rest.get("format")
                && dialect.formats.contains(&format.as_str())
            {
                out.insert("format".into(), Value::String(format.clone()));
                rest.remove("format");
            }
        }
        "array" => {
            if let Some(items) = rest.remove("items") {
                out.insert("items".into(), lower(&items, dialect));
            }
        }
        _ => {}
    }
    for keyword in keywords_of(name) {
        if let Some(value) = rest.get(*keyword)
            && (dialect.keeps)(name, keyword, value)
        {
            out.insert((*keyword).into(), value.clone());
            rest.remove(*keyword);
        }
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

    /// The built-in invoice contract's schema, as `contracts/invoice-extract@2.json` has it.
    fn invoice() -> Value {
        let file: Value =
            serde_json::from_str(include_str!("../../contracts/invoice-extract@2.json"))
                .expect("contract");
        file["schema"].clone()
    }

    #[test]
    fn openais_strict_dialect_keeps_its_bounds_and_says_the_rest() {
        let lowered = openai(&invoice());
        assert_eq!(openai_not_strict(&lowered), None, "every property required");
        // Lengths are said; patterns, numeric bounds and item counts kept.
        assert_eq!(
            lowered["properties"]["number"],
            json!({"type": "string", "description": "{maxLength: 64, minLength: 1}"})
        );
        assert_eq!(
            lowered["properties"]["issued"]["pattern"],
            "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"
        );
        assert_eq!(
            lowered["properties"]["lines"]["maxItems"], 200,
            "array bounds are OpenAI's to keep"
        );
        let line = &lowered["properties"]["lines"]["items"];
        assert_eq!(line["properties"]["quantity"]["exclusiveMinimum"], 0);
        assert_eq!(
            line["properties"]["tax_rate"],
            json!({"anyOf": [{"type": "number", "minimum": 0, "maximum": 1}, {"type": "null"}]})
        );
        // A reference stands alone, and the definitions are closed.
        assert_eq!(
            lowered["properties"]["seller"],
            json!({"$ref": "#/$defs/party"})
        );
        assert_eq!(lowered["$defs"]["party"]["additionalProperties"], false);
    }

    #[test]
    fn a_schema_strict_mode_cannot_take_is_named_with_its_reason() {
        let optional = json!({"type": "object", "required": ["a"],
                              "properties": {"a": {"type": "string"}, "b": {"type": "string"}}});
        assert_eq!(
            openai_not_strict(&openai(&optional)).as_deref(),
            Some("property 'b' is optional")
        );
        let list = json!({"type": "array", "items": {"type": "string"}});
        assert_eq!(
            openai_not_strict(&openai(&list)).as_deref(),
            Some("its root is not an object")
        );
        let mut deep = json!({"type": "object", "required": [], "properties": {}});
        for _ in 0..11 {
            deep = json!({"type": "object", "required": ["x"], "properties": {"x": deep}});
        }
        assert_eq!(
            openai_not_strict(&openai(&deep)).as_deref(),
            Some("11 levels of nesting, past strict mode's 10")
        );
    }
}
