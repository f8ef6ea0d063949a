//! The item codec: a [`JobItem`] to DynamoDB attribute values and back. A missing or
//! mistyped attribute decodes as `Corrupt`, never a panic.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;

use crate::job::contract::Finish;
use crate::job::{
    AttemptEntry, AttemptOutcome, BlobRef, CallProgress, DecisionRecord, ErrorRecord, JobItem,
    JobState, Millis, NewJob, RecoveryRecord, Route, Usage, attention_key, utc_day,
};
use crate::ledger::LedgerError;

/// A stored item.
pub type Item = HashMap<String, AttributeValue>;

pub(super) fn s(v: &str) -> AttributeValue {
    AttributeValue::S(v.to_owned())
}

pub(super) fn n(v: impl ToString) -> AttributeValue {
    AttributeValue::N(v.to_string())
}

pub(super) fn encode_attempt(a: &AttemptEntry) -> AttributeValue {
    // Room for every attribute an entry can have, so the map is never grown.
    let mut m = HashMap::with_capacity(15);
    m.extend([
        ("number".to_owned(), n(a.number)),
        ("epoch".to_owned(), n(a.epoch)),
        ("owner_id".to_owned(), s(&a.owner_id)),
        ("started_at".to_owned(), n(a.started_at)),
        ("outcome".to_owned(), s(a.outcome.as_str())),
    ]);
    if let Some(r) = &a.provider_ref {
        m.insert("provider_ref".to_owned(), s(r));
    }
    if let Some(route) = &a.route {
        m.insert("provider".to_owned(), s(&route.provider));
        m.insert("model".to_owned(), s(&route.model));
        if let Some((rate, why)) = &route.path {
            m.insert("path".to_owned(), s(crate::job::path::name(*rate)));
            m.insert("path_why".to_owned(), s(why));
        }
    }
    if let Some(f) = a.finished_at {
        m.insert("finished_at".to_owned(), n(f));
    }
    if let Some(f) = a.finish {
        m.insert("finish".to_owned(), s(f.as_str()));
    }
    if !a.errors.is_empty() {
        m.insert(
            "errors".to_owned(),
            AttributeValue::L(a.errors.iter().map(|e| s(e)).collect()),
        );
    }
    if let Some(e) = &a.excerpt {
        m.insert("excerpt".to_owned(), s(e));
    }
    if let Some(u) = &a.usage {
        m.insert("usage".to_owned(), encode_usage(u));
    }
    AttributeValue::M(m)
}

/// An attempt's usage: its token counts, and `estimated` when it is an estimate.
pub(super) fn encode_usage(u: &Usage) -> AttributeValue {
    let mut m = HashMap::from([
        ("input".to_owned(), n(u.input)),
        ("output".to_owned(), n(u.output)),
        ("cache_read".to_owned(), n(u.cache_read)),
        ("cache_write".to_owned(), n(u.cache_write)),
        ("reasoning".to_owned(), n(u.reasoning)),
    ]);
    if u.estimated {
        m.insert("estimated".to_owned(), AttributeValue::Bool(true));
    }
    if let Some(cost) = u.cost_micros {
        m.insert("cost_micros".to_owned(), n(cost));
    }
    AttributeValue::M(m)
}

fn decode_usage(v: &AttributeValue) -> Option<Usage> {
    let m = v.as_m().ok()?;
    let count = |name: &str| get_n(m, name).and_then(to_u64).unwrap_or(0);
    Some(Usage {
        input: count("input"),
        output: count("output"),
        cache_read: count("cache_read"),
        cache_write: count("cache_write"),
        reasoning: count("reasoning"),
        estimated: matches!(m.get("estimated"), Some(AttributeValue::Bool(true))),
        cost_micros: get_n(m, "cost_micros").and_then(to_u64),
        tier: None,
    })
}

pub(super) fn encode_blob(b: &BlobRef) -> AttributeValue {
    AttributeValue::M(HashMap::from([
        ("bucket".to_owned(), s(&b.bucket)),
        ("key".to_owned(), s(&b.key)),
        ("size".to_owned(), n(b.size)),
        ("sha256".to_owned(), s(&b.sha256)),
    ]))
}

pub(super) fn decode_blob(v: &AttributeValue) -> Option<BlobRef> {
    let m = v.as_m().ok()?;
    Some(BlobRef {
        bucket: get_s(m, "bucket")?.to_owned(),
        key: get_s(m, "key")?.to_owned(),
        size: to_u64(get_n(m, "size")?)?,
        sha256: get_s(m, "sha256")?.to_owned(),
    })
}

pub(super) fn encode_recovery(r: &RecoveryRecord) -> AttributeValue {
    AttributeValue::M(HashMap::from([
        ("epoch".to_owned(), n(r.epoch)),
        ("owner_id".to_owned(), s(&r.owner_id)),
        ("at".to_owned(), n(r.at)),
        ("reason".to_owned(), s(&r.reason)),
    ]))
}

pub(super) fn encode_decision(d: &DecisionRecord) -> AttributeValue {
    let mut m = HashMap::from([
        ("epoch".to_owned(), n(d.epoch)),
        ("action".to_owned(), s(&d.action)),
        ("by".to_owned(), s(&d.by)),
        ("reason".to_owned(), s(&d.reason)),
        ("at".to_owned(), n(d.at)),
    ]);
    if let Some(caller) = &d.caller {
        m.insert("caller".to_owned(), s(caller));
    }
    AttributeValue::M(m)
}

pub(super) fn decode_decision(v: &AttributeValue) -> Option<DecisionRecord> {
    let m = v.as_m().ok()?;
    Some(DecisionRecord {
        epoch: to_u64(get_n(m, "epoch")?)?,
        action: get_s(m, "action")?.to_owned(),
        by: get_s(m, "by")?.to_owned(),
        caller: get_s(m, "caller").map(str::to_owned),
        reason: get_s(m, "reason")?.to_owned(),
        at: get_n(m, "at")?,
    })
}

pub(super) fn encode_error(e: &ErrorRecord) -> AttributeValue {
    AttributeValue::M(HashMap::from([
        ("kind".to_owned(), s(&e.kind)),
        ("message".to_owned(), s(&e.message)),
        ("at".to_owned(), n(e.at)),
    ]))
}

/// What an owner said of its call: `{epoch, bytes}`.
pub(super) fn encode_progress(p: &CallProgress) -> AttributeValue {
    AttributeValue::M(HashMap::from([
        ("epoch".to_owned(), n(p.epoch)),
        ("bytes".to_owned(), n(p.streamed_bytes)),
    ]))
}

/// The progress an item holds; a malformed one reads as none (it is only ever shown).
fn decode_progress(v: &AttributeValue) -> Option<CallProgress> {
    let m = v.as_m().ok()?;
    Some(CallProgress {
        epoch: get_n(m, "epoch").and_then(to_u64)?,
        streamed_bytes: get_n(m, "bytes").and_then(to_u64)?,
    })
}

/// Encodes a whole record as the item its writes leave: every field (an absent option or an
/// empty history is no attribute), and the index keys: `attention` while the state carries one,
/// and `due_on`, the deadline's day, while the job is listed in the due index (`due_day`, the
/// same day, is on every item, so that a write can list a job without knowing its deadline).
pub fn encode(r: &JobItem) -> Item {
    // Room for every attribute a record can have (12 always, up to 23 more), so the map is
    // never grown.
    let mut item = Item::with_capacity(35);
    item.extend([
        ("job_id".to_owned(), s(&r.job_id)),
        ("state".to_owned(), s(r.state.as_str())),
        ("owner_epoch".to_owned(), n(r.owner_epoch)),
        ("attempts".to_owned(), n(r.attempts)),
        ("max_attempts".to_owned(), n(r.max_attempts)),
        ("input_digest".to_owned(), s(&r.input_digest)),
        ("contract".to_owned(), s(&r.contract)),
        ("deadline_at".to_owned(), n(r.deadline_at)),
        (
            "attempt_log".to_owned(),
            AttributeValue::L(r.attempt_log.iter().map(encode_attempt).collect()),
        ),
        ("created_at".to_owned(), n(r.created_at)),
        ("updated_at".to_owned(), n(r.updated_at)),
        ("expires_at".to_owned(), n(r.expires_at)),
    ]);
    let optional = [
        ("input", (!r.input.is_empty()).then(|| s(&r.input))),
        ("input_ref", r.input_ref.as_ref().map(encode_blob)),
        ("metadata", r.metadata.as_deref().map(s)),
        ("max_cost_micros", r.max_cost_micros.map(n)),
        ("owner_id", r.owner_id.as_deref().map(s)),
        ("owner_until", r.owner_until.map(n)),
        ("result", r.result.as_deref().map(s)),
        ("result_ref", r.result_ref.as_ref().map(encode_blob)),
        ("last_error", r.last_error.as_ref().map(encode_error)),
        ("enqueued_at", r.enqueued_at.map(n)),
        ("cancel_requested", r.cancel_requested.map(n)),
        ("progress", r.call_progress.as_ref().map(encode_progress)),
        ("tenant", r.class.tenant.as_deref().map(s)),
        ("priority", r.class.urgent.then(|| s("urgent"))),
        ("throttles", (r.throttles > 0).then(|| n(r.throttles))),
        ("not_sent", (r.not_sent > 0).then(|| n(r.not_sent))),
        (
            "recoveries_dropped",
            (r.recoveries_dropped > 0).then(|| n(r.recoveries_dropped)),
        ),
        (
            "given_back",
            (!r.given_back.is_empty())
                .then(|| AttributeValue::L(r.given_back.iter().map(encode_attempt).collect())),
        ),
        (
            "recoveries",
            (!r.recoveries.is_empty())
                .then(|| AttributeValue::L(r.recoveries.iter().map(encode_recovery).collect())),
        ),
        (
            "decisions",
            (!r.decisions.is_empty())
                .then(|| AttributeValue::L(r.decisions.iter().map(encode_decision).collect())),
        ),
        (
            "attention",
            attention_key(r.state, r.owner_epoch, r.watched, &r.job_id).map(|k| s(&k)),
        ),
        ("due_on", r.due_listed.then(|| s(&utc_day(r.deadline_at)))),
        ("due_day", Some(s(&utc_day(r.deadline_at)))),
    ];
    for (name, value) in optional {
        if let Some(value) = value {
            item.insert(name.to_owned(), value);
        }
    }
    item
}

/// Decodes a stored item. A missing or mistyped attribute is `Corrupt`, never a panic.
pub fn decode(item: &Item) -> Result<JobItem, LedgerError> {
    let job_id = get_s(item, "job_id").unwrap_or("?").to_owned();
    let corrupt = |detail: String| LedgerError::Corrupt {
        job_id: job_id.clone(),
        detail,
    };
    let req_s = |name: &str| {
        get_s(item, name)
            .map(str::to_owned)
            .ok_or_else(|| corrupt(format!("missing string `{name}`")))
    };
    let req_n =
        |name: &str| get_n(item, name).ok_or_else(|| corrupt(format!("missing number `{name}`")));
    let state: JobState = req_s("state")?
        .parse()
        .map_err(|e: crate::job::state::UnknownState| corrupt(e.to_string()))?;
    let attempt_log = decode_list(item, "attempt_log", decode_attempt).map_err(&corrupt)?;
    let given_back = decode_list(item, "given_back", decode_attempt).map_err(&corrupt)?;
    let recoveries = decode_list(item, "recoveries", decode_recovery).map_err(&corrupt)?;
    let decisions = decode_list(item, "decisions", decode_decision).map_err(&corrupt)?;
    Ok(JobItem {
        state,
        owner_epoch: to_u64(req_n("owner_epoch")?).ok_or_else(|| corrupt("owner_epoch".into()))?,
        attempts: to_u32(req_n("attempts")?).ok_or_else(|| corrupt("attempts".into()))?,
        max_attempts: to_u32(req_n("max_attempts")?)
            .ok_or_else(|| corrupt("max_attempts".into()))?,
        max_cost_micros: get_n(item, "max_cost_micros").and_then(to_u64),
        throttles: get_n(item, "throttles").and_then(to_u32).unwrap_or(0),
        not_sent: get_n(item, "not_sent").and_then(to_u32).unwrap_or(0),
        recoveries_dropped: get_n(item, "recoveries_dropped")
            .and_then(to_u32)
            .unwrap_or(0),
        given_back,
        input_digest: req_s("input_digest")?,
        contract: req_s("contract")?,
        // Absent while the job's first claim runs (`JobItem::keeps_input`).
        input: get_s(item, "input").unwrap_or_default().to_owned(),
        input_ref: optional_blob(item, "input_ref").map_err(&corrupt)?,
        metadata: get_s(item, "metadata").map(str::to_owned),
        deadline_at: req_n("deadline_at")?,
        owner_id: get_s(item, "owner_id").map(str::to_owned),
        owner_until: get_n(item, "owner_until"),
        attempt_log,
        recoveries,
        decisions,
        result: get_s(item, "result").map(str::to_owned),
        result_ref: optional_blob(item, "result_ref").map_err(corrupt)?,
        last_error: item.get("last_error").and_then(decode_error),
        created_at: req_n("created_at")?,
        updated_at: req_n("updated_at")?,
        expires_at: req_n("expires_at")?,
        enqueued_at: get_n(item, "enqueued_at"),
        cancel_requested: get_n(item, "cancel_requested"),
        call_progress: item.get("progress").and_then(decode_progress),
        due_listed: item.contains_key("due_on"),
        watched: item.contains_key("attention"),
        class: crate::job::JobClass {
            tenant: get_s(item, "tenant").map(str::to_owned),
            urgent: get_s(item, "priority") == Some("urgent"),
        },
        job_id: job_id.clone(),
    })
}

/// The list attribute `name` of `item`, each entry decoded by `entry`: empty when absent, and
/// what is wrong with it (not a list, an entry malformed) otherwise.
fn decode_list<T>(
    item: &Item,
    name: &str,
    entry: impl Fn(&AttributeValue) -> Option<T>,
) -> Result<Vec<T>, String> {
    match item.get(name) {
        None => Ok(Vec::new()),
        Some(AttributeValue::L(entries)) => entries
            .iter()
            .map(|e| entry(e).ok_or_else(|| format!("malformed entry of {name}")))
            .collect(),
        Some(_) => Err(format!("{name} is not a list")),
    }
}

fn optional_blob(item: &Item, name: &str) -> Result<Option<BlobRef>, String> {
    match item.get(name) {
        None => Ok(None),
        Some(v) => decode_blob(v)
            .map(Some)
            .ok_or_else(|| format!("malformed `{name}`")),
    }
}

pub(super) fn decode_attempt(v: &AttributeValue) -> Option<AttemptEntry> {
    let m = v.as_m().ok()?;
    Some(AttemptEntry {
        number: to_u32(get_n(m, "number")?)?,
        epoch: to_u64(get_n(m, "epoch")?)?,
        owner_id: get_s(m, "owner_id")?.to_owned(),
        started_at: get_n(m, "started_at")?,
        provider_ref: get_s(m, "provider_ref").map(str::to_owned),
        outcome: AttemptOutcome::parse(get_s(m, "outcome")?),
        finished_at: get_n(m, "finished_at"),
        finish: get_s(m, "finish").map(Finish::parse),
        errors: m
            .get("errors")
            .and_then(|v| v.as_l().ok())
            .map(|l| l.iter().filter_map(|e| e.as_s().ok().cloned()).collect())
            .unwrap_or_default(),
        excerpt: get_s(m, "excerpt").map(str::to_owned),
        usage: m.get("usage").and_then(decode_usage),
        route: get_s(m, "provider").map(|provider| Route {
            provider: provider.to_owned(),
            model: get_s(m, "model").unwrap_or_default().to_owned(),
            path: get_s(m, "path")
                .and_then(crate::job::path::parse)
                .map(|rate| (rate, get_s(m, "path_why").unwrap_or_default().to_owned())),
        }),
    })
}

pub(super) fn decode_recovery(v: &AttributeValue) -> Option<RecoveryRecord> {
    let m = v.as_m().ok()?;
    Some(RecoveryRecord {
        epoch: to_u64(get_n(m, "epoch")?)?,
        owner_id: get_s(m, "owner_id")?.to_owned(),
        at: get_n(m, "at")?,
        reason: get_s(m, "reason")?.to_owned(),
    })
}

pub(super) fn decode_error(v: &AttributeValue) -> Option<ErrorRecord> {
    let m = v.as_m().ok()?;
    Some(ErrorRecord {
        kind: get_s(m, "kind")?.to_owned(),
        message: get_s(m, "message")?.to_owned(),
        at: get_n(m, "at")?,
    })
}

pub(super) fn get_s<'a>(item: &'a Item, name: &str) -> Option<&'a str> {
    item.get(name)?.as_s().ok().map(String::as_str)
}

pub(super) fn get_n(item: &Item, name: &str) -> Option<Millis> {
    item.get(name)?.as_n().ok()?.parse().ok()
}

pub(super) fn to_u64(v: i64) -> Option<u64> {
    u64::try_from(v).ok()
}

pub(super) fn to_u32(v: i64) -> Option<u32> {
    u32::try_from(v).ok()
}

/// An item from its DynamoDB JSON form (`{"state": {"S": "ready"}, ...}`), as a stream record
/// in a Lambda event carries it. `None` when a value is not DynamoDB JSON.
pub fn from_json_image(image: &serde_json::Map<String, serde_json::Value>) -> Option<Item> {
    image
        .iter()
        .map(|(name, v)| Some((name.clone(), value_from_json(v)?)))
        .collect()
}

fn value_from_json(v: &serde_json::Value) -> Option<AttributeValue> {
    use serde_json::Value;
    let (tag, inner) = v.as_object()?.iter().next()?;
    let strings = |v: &Value| -> Option<Vec<String>> {
        v.as_array()?
            .iter()
            .map(|s| s.as_str().map(str::to_owned))
            .collect()
    };
    Some(match tag.as_str() {
        "S" => AttributeValue::S(inner.as_str()?.to_owned()),
        "N" => AttributeValue::N(inner.as_str()?.to_owned()),
        "BOOL" => AttributeValue::Bool(inner.as_bool()?),
        "NULL" => AttributeValue::Null(true),
        "M" => AttributeValue::M(from_json_image(inner.as_object()?)?),
        "L" => AttributeValue::L(
            inner
                .as_array()?
                .iter()
                .map(value_from_json)
                .collect::<Option<_>>()?,
        ),
        "SS" => AttributeValue::Ss(strings(inner)?),
        "NS" => AttributeValue::Ns(strings(inner)?),
        "B" => AttributeValue::B(aws_smithy_types::Blob::new(
            aws_smithy_types::base64::decode(inner.as_str()?).ok()?,
        )),
        _ => return None,
    })
}

/// An item in DynamoDB JSON, the form a Lambda event carries.
pub fn to_json_image(item: &Item) -> serde_json::Value {
    use serde_json::{Value, json};
    fn value(v: &AttributeValue) -> Value {
        match v {
            AttributeValue::S(s) => json!({ "S": s }),
            AttributeValue::N(n) => json!({ "N": n }),
            AttributeValue::Bool(b) => json!({ "BOOL": b }),
            AttributeValue::M(m) => json!({ "M": to_json_image(m) }),
            AttributeValue::L(l) => json!({ "L": l.iter().map(value).collect::<Vec<_>>() }),
            AttributeValue::Ss(ss) => json!({ "SS": ss }),
            AttributeValue::Ns(ns) => json!({ "NS": ns }),
            AttributeValue::B(b) => json!({ "B": aws_smithy_types::base64::encode(b.as_ref()) }),
            _ => json!({ "NULL": true }),
        }
    }
    Value::Object(item.iter().map(|(k, v)| (k.clone(), value(v))).collect())
}

/// The claim's `SET` clauses for what the message carries and the item may lack: each set
/// only where the item has none (its input, when `input`).
pub(super) fn kept_if_absent(job: &NewJob, input: bool) -> String {
    let fields = [
        (input, "#input", ":input"),
        (job.metadata.is_some(), "#meta", ":meta"),
        (job.class.tenant.is_some(), "#tenant", ":tenant"),
        (job.class.urgent, "#prio", ":prio"),
        (job.input_ref.is_some(), "#inref", ":inref"),
        (job.max_cost_micros.is_some(), "#maxcost", ":maxcost"),
    ];
    fields
        .iter()
        .filter(|(carried, ..)| *carried)
        .map(|(_, name, value)| format!(", {name} = if_not_exists({name}, {value})"))
        .collect()
}

/// The values of a claim's or a creation's write that come from the job's message.
pub(super) fn new_job_values(job: &NewJob) -> Vec<(&'static str, AttributeValue)> {
    let mut values = vec![
        (":input", s(&job.input)),
        (":digest", s(&job.input_digest)),
        (":contract", s(&job.contract)),
        (":deadline", n(job.deadline_at)),
        (":due", s(&crate::job::utc_day(job.deadline_at))),
        (":max", n(job.max_attempts)),
        (":ttl", n(job.expires_at)),
    ];
    if let Some(meta) = &job.metadata {
        values.push((":meta", s(meta)));
    }
    if let Some(tenant) = &job.class.tenant {
        values.push((":tenant", s(tenant)));
    }
    if job.class.urgent {
        values.push((":prio", s("urgent")));
    }
    if let Some(blob) = &job.input_ref {
        values.push((":inref", encode_blob(blob)));
    }
    if let Some(max) = job.max_cost_micros {
        values.push((":maxcost", n(max)));
    }
    values
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_malformed_item_is_corrupt_not_a_panic() {
        let item = HashMap::from([
            ("job_id".to_owned(), s("j")),
            ("state".to_owned(), s("dancing")),
        ]);
        assert!(matches!(decode(&item), Err(LedgerError::Corrupt { .. })));
        let item = HashMap::from([
            ("job_id".to_owned(), s("j")),
            ("state".to_owned(), s("ready")),
        ]);
        assert!(matches!(decode(&item), Err(LedgerError::Corrupt { .. })));
    }

    fn blob(key: &str) -> BlobRef {
        BlobRef {
            bucket: "b".into(),
            key: key.into(),
            size: 7,
            sha256: "ab".repeat(32),
        }
    }

    /// A record with every field set, in `state`.
    fn full_record(state: JobState) -> JobItem {
        JobItem {
            job_id: "job-1".into(),
            state,
            owner_epoch: 3,
            attempts: 2,
            max_attempts: 4,
            input_digest: "cd".repeat(32),
            contract: "summary.v1".into(),
            input: "{}".into(),
            input_ref: Some(blob("inputs/job-1/cd")),
            metadata: Some(r#"{"tenant":"t"}"#.into()),
            max_cost_micros: Some(250_000),
            deadline_at: 9_000,
            owner_id: Some("owner".into()),
            owner_until: Some(8_000),
            attempt_log: vec![AttemptEntry {
                number: 2,
                epoch: 3,
                owner_id: "owner".into(),
                started_at: 1_000,
                provider_ref: Some("ref".into()),
                outcome: AttemptOutcome::InvalidOutput,
                finished_at: Some(2_000),
                finish: Some(Finish::Length),
                errors: vec!["the answer is cut off: finish length".into()],
                excerpt: Some("{\"total\": 1".into()),
                usage: Some(Usage {
                    input: 1_200,
                    output: 300,
                    cache_read: 64,
                    cache_write: 8,
                    reasoning: 100,
                    estimated: true,
                    cost_micros: Some(5_100),
                    tier: None,
                }),
                route: Some(Route {
                    provider: "anthropic".into(),
                    model: "claude-haiku-4-5".into(),
                    path: Some((
                        crate::job::usage::Rate::Batch,
                        "the cheapest of 2 that ends in time".into(),
                    )),
                }),
            }],
            recoveries: vec![RecoveryRecord {
                epoch: 2,
                owner_id: "owner".into(),
                at: 900,
                reason: "lease lapsed".into(),
            }],
            decisions: vec![DecisionRecord {
                epoch: 2,
                action: "retry".into(),
                by: "operator".into(),
                caller: Some("arn:aws:sts::123456789012:assumed-role/Ops/alice".into()),
                reason: "checked".into(),
                at: 950,
            }],
            result: Some("answer".into()),
            result_ref: Some(blob("results/job-1/3/ab")),
            last_error: Some(ErrorRecord {
                kind: "transient".into(),
                message: "timeout".into(),
                at: 800,
            }),
            created_at: 100,
            updated_at: 86_400_000 * 3 + 5,
            expires_at: 99,
            enqueued_at: Some(150),
            cancel_requested: Some(160),
            call_progress: Some(CallProgress {
                epoch: 3,
                streamed_bytes: 2_048,
            }),
            due_listed: true,
            watched: true,
            class: crate::job::JobClass {
                tenant: Some("acme".into()),
                urgent: true,
            },
            throttles: 4,
            not_sent: 1,
            recoveries_dropped: 2,
            given_back: vec![AttemptEntry {
                number: 2,
                epoch: 2,
                owner_id: "earlier".into(),
                started_at: 500,
                outcome: AttemptOutcome::Throttled,
                finished_at: Some(600),
                ..AttemptEntry::claimed(2, 2, "earlier", 500, None)
            }],
        }
    }

    #[test]
    fn an_encoded_record_decodes_as_itself_with_its_index_keys() {
        let live = full_record(JobState::Running);
        let item = encode(&live);
        assert_eq!(decode(&item).expect("decodes"), live);
        assert_eq!(
            get_s(&item, "attention"),
            attention_key(JobState::Running, live.owner_epoch, true, "job-1").as_deref()
        );
        assert_eq!(
            get_s(&item, "due_on"),
            Some(utc_day(live.deadline_at).as_str())
        );

        // (A terminal job is watched by nobody.)
        let done = JobItem {
            watched: false,
            ..full_record(JobState::Succeeded)
        };
        let item = encode(&done);
        assert_eq!(decode(&item).expect("decodes"), done);
        assert!(!item.contains_key("attention"));
        // The due index's key is the deadline's, whatever the state.
        assert_eq!(get_s(&item, "due_on"), get_s(&encode(&live), "due_on"));

        // A job left out of the due index has no key there, and keeps its day for the write
        // that lists it.
        let unlisted = JobItem {
            due_listed: false,
            ..done.clone()
        };
        let item = encode(&unlisted);
        assert_eq!(decode(&item).expect("decodes"), unlisted);
        assert!(!item.contains_key("due_on"));
        assert_eq!(get_s(&item, "due_day"), get_s(&encode(&live), "due_on"));

        // Absent options and empty histories are no attribute at all.
        let mut bare = full_record(JobState::Ready);
        (
            bare.input_ref,
            bare.metadata,
            bare.owner_id,
            bare.owner_until,
        ) = (None, None, None, None);
        (
            bare.result,
            bare.result_ref,
            bare.last_error,
            bare.enqueued_at,
        ) = (None, None, None, None);
        (bare.recoveries, bare.decisions) = (Vec::new(), Vec::new());
        bare.max_cost_micros = None;
        let item = encode(&bare);
        for name in [
            "input_ref",
            "metadata",
            "max_cost_micros",
            "owner_id",
            "result",
            "recoveries",
            "decisions",
        ] {
            assert!(!item.contains_key(name), "{name}");
        }
        assert_eq!(decode(&item).expect("decodes"), bare);
    }

    #[test]
    fn the_json_image_of_an_item_reads_back_as_the_item() {
        let item = HashMap::from([
            ("job_id".to_owned(), s("j")),
            ("owner_epoch".to_owned(), n(3)),
            ("flag".to_owned(), AttributeValue::Bool(true)),
            (
                "log".to_owned(),
                AttributeValue::L(vec![AttributeValue::M(HashMap::from([(
                    "x".to_owned(),
                    AttributeValue::Ss(vec!["a".into()]),
                )]))]),
            ),
        ]);
        let image = to_json_image(&item);
        assert_eq!(
            from_json_image(image.as_object().expect("object")),
            Some(item)
        );
        let bad = serde_json::json!({ "state": { "Q": "x" } });
        assert_eq!(from_json_image(bad.as_object().expect("object")), None);
    }
}
