//! What jobctl prints, as the AWS CLI prints it: `--output json|text|table` and `--query`, a
//! JMESPath expression over the JSON form of each result.
//!
//! Every result has a JSON form; `text` is the lines jobctl has always printed for people, and
//! `table` the JSON form (after `--query`) as a table. A command that prints as it goes (`watch`,
//! `export`) prints each line so: a JSON line each, or its text line.

use clap::ValueEnum;
use serde_json::Value;

/// How results are printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Format {
    /// One JSON document a result (one line each, for a command that prints as it goes).
    Json,
    /// Lines for people to read.
    Text,
    /// The JSON form as a table.
    Table,
}

/// The printer of one run: its format and query.
pub(crate) struct Out {
    format: Format,
    query: Option<jmespath::Expression<'static>>,
}

impl Out {
    /// A printer in `format`, applying `query` (checked here: a query that does not parse is a
    /// usage error before any AWS call). With a query and no format asked, JSON.
    pub(crate) fn new(format: Option<Format>, query: Option<&str>) -> Result<Out, String> {
        let query = query
            .map(|q| jmespath::compile(q).map_err(|e| format!("--query: {e}")))
            .transpose()?;
        let format = format.unwrap_or(if query.is_some() {
            Format::Json
        } else {
            Format::Text
        });
        Ok(Out { format, query })
    }

    /// Prints one result: its JSON form `value`, or `text` for people.
    pub(crate) fn emit(&self, value: Value, text: impl FnOnce() -> String) {
        print!("{}", self.render(value, text));
    }

    /// What [`Out::emit`] prints.
    pub(crate) fn render(&self, value: Value, text: impl FnOnce() -> String) -> String {
        if self.format == Format::Text && self.query.is_none() {
            let mut text = text();
            if !text.ends_with('\n') {
                text.push('\n');
            }
            return text;
        }
        let value = match &self.query {
            Some(query) => search(query, value),
            None => value,
        };
        match self.format {
            Format::Json => format!("{value}\n"),
            Format::Table => table(&value),
            Format::Text => plain(&value),
        }
    }
}

/// `query` applied to `value`; a query that fails on this value gives `null`, as the AWS CLI's.
fn search(query: &jmespath::Expression<'static>, value: Value) -> Value {
    let Ok(variable) = jmespath::Variable::from_json(&value.to_string()) else {
        return Value::Null;
    };
    query
        .search(variable)
        .ok()
        .and_then(|found| serde_json::to_value(&*found).ok())
        .unwrap_or(Value::Null)
}

/// A query's answer as text: a scalar bare, a list of scalars tab-separated, a list of lists or
/// objects a line each (an object's values in its keys' order); `null` prints nothing.
fn plain(value: &Value) -> String {
    fn cell(v: &Value) -> String {
        match v {
            Value::Null => String::new(),
            Value::String(s) => s.clone(),
            Value::Array(items) => items.iter().map(cell).collect::<Vec<_>>().join("\t"),
            Value::Object(map) => map.values().map(cell).collect::<Vec<_>>().join("\t"),
            other => other.to_string(),
        }
    }
    match value {
        Value::Null => String::new(),
        Value::Array(items) if items.iter().any(|i| i.is_array() || i.is_object()) => {
            items.iter().map(|i| cell(i) + "\n").collect()
        }
        other => cell(other) + "\n",
    }
}

/// `value` as a table: a list of objects a row each under the union of their keys, an object
/// as key and value rows, a list of scalars a row each; nested values as compact JSON.
fn table(value: &Value) -> String {
    let scalar = |v: &Value| match v {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let (head, rows): (Vec<String>, Vec<Vec<String>>) = match value {
        Value::Array(items) if items.iter().all(Value::is_object) && !items.is_empty() => {
            let mut keys: Vec<String> = Vec::new();
            for item in items.iter().filter_map(Value::as_object) {
                for key in item.keys() {
                    if !keys.contains(key) {
                        keys.push(key.clone());
                    }
                }
            }
            let rows = items
                .iter()
                .map(|item| keys.iter().map(|k| scalar(&item[k.as_str()])).collect())
                .collect();
            (keys, rows)
        }
        Value::Array(items) => (Vec::new(), items.iter().map(|i| vec![scalar(i)]).collect()),
        Value::Object(map) => (
            Vec::new(),
            map.iter()
                .map(|(k, v)| vec![k.clone(), scalar(v)])
                .collect(),
        ),
        Value::Null => return String::new(),
        other => (Vec::new(), vec![vec![scalar(other)]]),
    };
    let columns = head.len().max(rows.iter().map(Vec::len).max().unwrap_or(0));
    let mut widths = vec![0; columns];
    for row in std::iter::once(&head).chain(&rows) {
        for (i, cell) in row.iter().enumerate() {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let rule: String = widths
        .iter()
        .map(|w| format!("+{}", "-".repeat(w + 2)))
        .collect::<String>()
        + "+\n";
    let line = |row: &[String]| {
        let cells: String = widths
            .iter()
            .enumerate()
            .map(|(i, w)| {
                let cell = row.get(i).map_or("", String::as_str);
                format!("| {cell}{} ", " ".repeat(w - cell.chars().count()))
            })
            .collect();
        cells + "|\n"
    };
    let mut out = rule.clone();
    if !head.is_empty() {
        out += &line(&head);
        out += &rule;
    }
    for row in &rows {
        out += &line(row);
    }
    out + &rule
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn out(format: Option<Format>, query: Option<&str>) -> Out {
        Out::new(format, query).expect("a valid query")
    }

    #[test]
    fn text_is_the_peoples_lines_and_json_the_document() {
        let doc = json!([{"job_id": "a", "state": "unknown"}]);
        let text = || "a unknown".to_owned();
        assert_eq!(out(None, None).render(doc.clone(), text), "a unknown\n");
        let json = out(Some(Format::Json), None).render(doc.clone(), text);
        assert_eq!(serde_json::from_str::<Value>(&json).expect("json"), doc);
    }

    #[test]
    fn a_query_picks_from_the_json_form_in_every_format() {
        let doc =
            json!({"items": [{"job_id": "a", "attempts": 1}, {"job_id": "b", "attempts": 3}]});
        let never = || unreachable!("a query never prints the people's lines");
        let ids = out(None, Some("items[?attempts > `1`].job_id"));
        assert_eq!(ids.render(doc.clone(), never), "[\"b\"]\n");
        let text = out(Some(Format::Text), Some("items[].job_id"));
        assert_eq!(text.render(doc.clone(), never), "a\tb\n");
        let rows = out(Some(Format::Text), Some("items[].[job_id, attempts]"));
        assert_eq!(rows.render(doc.clone(), never), "a\t1\nb\t3\n");
        let missing = out(Some(Format::Json), Some("nothing.here"));
        assert_eq!(missing.render(doc, never), "null\n");
        assert!(Out::new(None, Some("items[")).is_err());
    }

    #[test]
    fn a_table_has_a_column_for_each_key_and_a_row_for_each_item() {
        let doc = json!([{"job_id": "a", "state": "unknown"}, {"job_id": "bb", "extra": {"x": 1}}]);
        let shown = out(Some(Format::Table), None).render(doc, String::new);
        assert_eq!(
            shown,
            "+--------+---------+---------+\n\
             | job_id | state   | extra   |\n\
             +--------+---------+---------+\n\
             | a      | unknown |         |\n\
             | bb     |         | {\"x\":1} |\n\
             +--------+---------+---------+\n"
        );
        let pairs = out(Some(Format::Table), None).render(json!({"k": "v"}), String::new);
        assert_eq!(pairs, "+---+---+\n| k | v |\n+---+---+\n");
    }
}
