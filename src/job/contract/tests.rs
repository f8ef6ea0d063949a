use serde_json::json;

use super::*;

/// An invoice extraction contract: twenty fields and nested line items.
pub(crate) const INVOICE: &str = include_str!("../../../contracts/invoice-extract@2.json");

fn invoice() -> Contract {
    Contract::parse("invoice-extract@2", INVOICE).expect("the sample contract compiles")
}

/// An answer the invoice contract accepts.
fn valid_invoice() -> Value {
    let party =
        |name: &str| json!({"name": name, "vat_id": null, "address": null, "country": "DE"});
    json!({
        "number": "INV-1", "issued": "2026-11-30", "due": null, "currency": "EUR",
        "seller": party("A"), "buyer": party("B"), "purchase_order": null,
        "lines": [{"description": "d", "quantity": 2, "unit_price": 1.5, "amount": 3.0,
                   "tax_rate": 0.2, "sku": null}],
        "subtotal": 3.0, "tax": 0.6, "total": 3.6, "paid": false,
        "payment_terms": null, "notes": null
    })
}

#[test]
fn a_valid_json_answer_is_accepted_parsed() {
    let answer = valid_invoice();
    let judged = invoice().judge(&answer.to_string(), Finish::Stop);
    assert_eq!(judged, Ok(Accepted::Json));
}

#[test]
fn a_truncated_json_answer_is_never_accepted_and_says_so() {
    let rejected = invoice()
        .judge(r#"{"number": "INV-1", "tot"#, Finish::Length)
        .expect_err("a truncated answer breaks a JSON contract");
    assert_eq!(rejected.finish, Finish::Length);
    assert_eq!(rejected.errors, ["the answer is cut off: finish length"]);
    assert!(!rejected.terminal);
    // The same text with no finish reason given is still not JSON.
    let unfinished = invoice()
        .judge(r#"{"number": "INV-1", "tot"#, Finish::Unknown)
        .expect_err("not JSON");
    assert!(unfinished.errors[0].ends_with(": json"), "{unfinished:?}");
    // A whole JSON answer shows itself whole, whatever the provider said of its end.
    let whole = invoice().judge(&valid_invoice().to_string(), Finish::Unknown);
    assert_eq!(whole, Ok(Accepted::Json));
}

#[test]
fn validation_errors_name_paths_and_keywords_never_values() {
    let mut answer = valid_invoice();
    answer["number"] = json!("SECRET-VALUE");
    answer["total"] = json!("lots");
    answer["lines"][0]["quantity"] = json!(-1);
    answer["seller"].as_object_mut().map(|s| s.remove("name"));
    let rejected = invoice()
        .judge(&answer.to_string(), Finish::Stop)
        .expect_err("invalid");
    assert!(rejected.errors.len() <= ERRORS_KEPT);
    assert!(
        rejected.errors.iter().any(|e| e == "/total: type"),
        "{:?}",
        rejected.errors
    );
    assert!(
        rejected
            .errors
            .iter()
            .any(|e| e == "/seller: required name"),
        "{:?}",
        rejected.errors
    );
    let shown = rejected.to_string();
    assert!(
        !shown.contains("SECRET") && !shown.contains("lots"),
        "{shown}"
    );
    assert!(
        rejected
            .errors
            .iter()
            .any(|e| e == "/lines/0/quantity: exclusiveMinimum"),
        "{:?}",
        rejected.errors
    );
    assert!(rejected.errors.iter().all(|e| !e.contains("SECRET")));
    // The excerpt keeps the answer's first bytes, as evidence on the attempt only.
    assert!(rejected.excerpt.contains("SECRET-VALUE"));
}

#[test]
fn the_excerpt_is_bounded_at_a_character_boundary() {
    let long = format!("\"{}\"", "é".repeat(EXCERPT_BYTES));
    let rejected = invoice().judge(&long, Finish::Stop).expect_err("a string");
    assert!(rejected.excerpt.len() <= EXCERPT_BYTES);
    assert!(rejected.excerpt.len() > EXCERPT_BYTES - 4);
}

#[test]
fn text_contracts_take_truncation_only_where_their_policy_allows() {
    let strict = Contract::parse("summary@1", r#"{"format": "text"}"#).expect("compiles");
    assert_eq!(strict.judge("half a sum", Finish::Stop), Ok(Accepted::Text));
    assert!(strict.judge("half a sum", Finish::Length).is_err());
    let lenient = Contract::parse("notes@1", r#"{"format": "text", "accept_truncated": true}"#)
        .expect("compiles");
    assert_eq!(
        lenient.judge("half a sum", Finish::Length),
        Ok(Accepted::Text)
    );
    // A filtered answer is never the whole answer.
    assert!(lenient.judge("half", Finish::ContentFilter).is_err());
    let small = Contract::parse(
        "tweet@1",
        r#"{"max_answer_bytes": 5, "on_invalid": "fail"}"#,
    )
    .expect("compiles");
    let too_long = small.judge("123456", Finish::Stop).expect_err("too long");
    assert!(too_long.terminal);
}

#[test]
fn a_contract_file_that_does_not_compile_says_why() {
    let cases = [
        ("not json", "not JSON"),
        ("[]", "not a JSON object"),
        (r#"{"format": "xml"}"#, "format must be"),
        (
            r#"{"format": "text", "schema": {}}"#,
            "a text contract has no schema",
        ),
        (
            r#"{"schema": {"type": "object"}, "accept_truncated": true}"#,
            "never accepts",
        ),
        (r#"{"schema": {"type": 12}}"#, "schema does not compile"),
        (
            r#"{"schema": {"$ref": "https://example.com/s.json"}}"#,
            "schema does not compile",
        ),
        (r#"{"schema": "object"}"#, "schema must be"),
        (r#"{"on_invalid": "ignore"}"#, "on_invalid must be"),
        (r#"{"max_answer_bytes": 0}"#, "max_answer_bytes must be"),
        (r#"{"shcema": {}}"#, "unknown field \"shcema\""),
    ];
    for (text, reason) in cases {
        let error = Contract::parse("x@1", text).expect_err(text);
        assert_eq!(error.id, "x@1");
        assert!(error.reason.contains(reason), "{text}: {}", error.reason);
    }
}

#[test]
fn a_lenient_registry_holds_unknown_contracts_to_free_text_and_a_strict_one_refuses_them() {
    let lenient = Contracts::compile([("invoice-extract@2", INVOICE)], false).expect("compiles");
    assert_eq!(lenient.len(), 1);
    let known = lenient.for_job("invoice-extract@2");
    assert_eq!(known.format(), Format::Json);
    assert!(known.schema().is_some() && !known.takes_unread(Finish::Stop));
    assert_eq!(lenient.admits("summary.v1"), Ok(false));
    let free = lenient.for_job("summary.v1");
    assert!(free.takes_unread(Finish::Stop) && free.schema().is_none());
    // Free text takes any answer the model finished, and none it was cut off from, or that
    // stopped for no reason the provider gave.
    assert_eq!(free.judge("anything", Finish::Stop), Ok(Accepted::Text));
    for cut in [Finish::Length, Finish::ContentFilter, Finish::Unknown] {
        assert!(!free.takes_unread(cut));
        let refused = free.judge("half an answ", cut).expect_err("cut off");
        assert_eq!((refused.finish, refused.terminal), (cut, false));
    }
    let strict = Contracts::compile([("invoice-extract@2", INVOICE)], true).expect("compiles");
    assert_eq!(strict.admits("invoice-extract@2"), Ok(true));
    assert_eq!(
        strict.admits("summary.v1"),
        Err(UnknownContract("summary.v1".into()))
    );
    // A job a strict registry took before its file went accepts no answer.
    let gone = strict
        .for_job("summary.v1")
        .judge("an answer", Finish::Stop);
    assert!(gone.is_err_and(|r| r.terminal));
    assert!(Contracts::compile([("bad@1", "{")], false).is_err());
}

#[test]
fn finish_reasons_round_trip() {
    for finish in [
        Finish::Stop,
        Finish::Length,
        Finish::ContentFilter,
        Finish::ToolUse,
        Finish::Unknown,
    ] {
        assert_eq!(Finish::parse(finish.as_str()), finish);
    }
    assert_eq!(Finish::parse("something new"), Finish::Unknown);
}

#[test]
fn the_readmes_summary_contract_is_built_in_and_refuses_a_cut_off_answer() {
    // A deployment's default registry: the built-in contracts, strict.
    let registry = Contracts::with_built_in(&[], true).expect("compiles");
    assert_eq!(registry.admits("summary.v1"), Ok(true));
    assert_eq!(
        registry.admits("summary.v2"),
        Err(UnknownContract("summary.v2".into()))
    );
    let summary = registry.for_job("summary.v1");
    assert_eq!(summary.format(), Format::Text);
    assert_eq!(
        summary.judge("A summary.", Finish::Stop),
        Ok(Accepted::Text)
    );
    // Cut off, or stopped for no reason the provider gave: nothing shows a text whole.
    for cut in [Finish::Length, Finish::ContentFilter, Finish::Unknown] {
        let refused = summary.judge("A summ", cut).expect_err("cut off");
        assert!(!refused.terminal, "another attempt");
    }
}
