use super::*;

fn body(extra: &str) -> String {
    format!(
        r#"{{"job_id":"job-1","contract":"summary.v1","input":{{"model":"m","prompt":"hello"}}{extra}}}"#
    )
}

#[test]
fn key_order_does_not_change_the_digest_but_content_and_contract_do() {
    let a = parse_body(Some(
        r#"{"job_id":"j","contract":"c1","input":{"model":"m","prompt":"p","parameters":{"t":0.2,"max_tokens":5}}}"#,
    ))
    .expect("valid");
    let b = parse_body(Some(
        r#"{"input":{"parameters":{"max_tokens":5,"t":0.2},"prompt":"p","model":"m"},"contract":"c1","job_id":"j"}"#,
    ))
    .expect("valid");
    assert_eq!(a.digest, b.digest);
    assert_eq!(a.input_canonical, b.input_canonical);
    assert_eq!(
        a.input_canonical,
        r#"{"model":"m","parameters":{"max_tokens":5,"t":0.2},"prompt":"p"}"#
    );

    let other_prompt = input_digest("c1", r#"{"model":"m","prompt":"q"}"#);
    let other_contract = input_digest("c2", &a.input_canonical);
    assert_ne!(a.digest, other_prompt);
    assert_ne!(a.digest, other_contract);
    assert_eq!(a.digest.len(), 64);
}

#[test]
fn a_job_rebuilt_from_its_canonical_input_keeps_its_digest() {
    // Found by fuzzing: a number too large for an integer was parsed to a slightly
    // different float the second time, so a job re-sent from the ledger (as
    // `authorize-retry` does) became a conflict with itself.
    let first = parse_body(Some(
        r#"{"job_id":"j","contract":"c","input":{"model":"m","prompt":"p","parameters":{"max_tokens":22222222222222222222222222222222222222222222222222222222222222222222222222222300,"t":0.1}}}"#,
    ))
    .expect("valid");
    let again = parse_body(Some(&format!(
        r#"{{"job_id":"j","contract":"c","input":{}}}"#,
        first.input_canonical
    )))
    .expect("valid");
    assert_eq!(again.input_canonical, first.input_canonical);
    assert_eq!(again.digest, first.digest);
}

#[test]
fn metadata_is_not_part_of_the_digest() {
    let plain = parse_body(Some(&body(""))).expect("valid");
    let tagged = parse_body(Some(&body(r#","metadata":{"trace":"abc"}"#))).expect("valid");
    assert_eq!(plain.digest, tagged.digest);
    assert_eq!(tagged.metadata.as_deref(), Some(r#"{"trace":"abc"}"#));
}

#[test]
fn optional_fields_are_parsed() {
    let job = parse_body(Some(&body(
        r#","deadline_at":"2026-12-01T00:00:00Z","max_attempts":5"#,
    )))
    .expect("valid");
    assert_eq!(job.deadline_at, Some(1_796_083_200_000));
    assert_eq!(job.max_attempts, Some(5));
    assert_eq!(job.max_cost_micros, None);
    // A spend limit in USD, kept in micro-dollars; not part of the digest.
    let capped = parse_body(Some(&body(r#","max_cost":0.25"#))).expect("valid");
    assert_eq!(capped.max_cost_micros, Some(250_000));
    assert_eq!(capped.digest, job.digest);
    for (bad, rule) in [
        ("0", true),
        ("-1", true),
        ("1e9", true),
        (r#""0.25""#, false),
    ] {
        let err = parse_body(Some(&body(&format!(r#","max_cost":{bad}"#)))).expect_err(bad);
        match rule {
            true => assert_eq!(
                err,
                InvalidMessage::Invalid {
                    field: "max_cost",
                    rule: "must be a number of USD above 0, at most 1000000"
                }
            ),
            false => assert_eq!(
                err,
                InvalidMessage::WrongType {
                    field: "max_cost",
                    expected: "a number"
                }
            ),
        }
    }
}

#[test]
fn every_contract_violation_is_classified_without_echoing_values() {
    // A conversation of text, in either API's spelling, is a job.
    let conversation = r#"{"job_id":"j","contract":"c","input":{"model":"m","messages":[
        {"role":"developer","content":"Be brief."},
        {"role":"user","name":"ana","content":[{"type":"input_text","text":"a"},{"text":"b"}]},
        {"role":"assistant","content":[{"type":"output_text","text":"c"}]}]}}"#;
    assert!(parse_body(Some(conversation)).is_ok());
    let secret = "TOP-SECRET-PROMPT";
    let cases: Vec<(String, InvalidMessage)> = vec![
        ("not json".into(), InvalidMessage::NotJson { line: 1, column: 2 }),
        ("[1,2]".into(), InvalidMessage::NotObject),
        (body(r#","jobid":"x""#), InvalidMessage::UnknownField("jobid".into())),
        // Found by fuzzing: a field name with control characters was echoed, escaped, at
        // six times its length; a name that is not an identifier is never shown.
        (
            format!(
                r#"{{"job_id":"j","contract":"c","input":{{}},"deadline{}_at":"x"}}"#,
                "\\u007f".repeat(47)
            ),
            InvalidMessage::UnknownField("<58 bytes, not shown>".into()),
        ),
        (
            body(r#","Summarise the secret memo for Alice":1"#),
            InvalidMessage::UnknownField("<35 bytes, not shown>".into()),
        ),
        (
            r#"{"contract":"c","input":{"model":"m","prompt":"p"}}"#.into(),
            InvalidMessage::Missing("job_id"),
        ),
        (
            r#"{"job_id":"has space","contract":"c","input":{"model":"m","prompt":"p"}}"#.into(),
            InvalidMessage::Invalid { field: "job_id", rule: "character outside the allowed set" },
        ),
        (
            r#"{"job_id":"..","contract":"c","input":{"model":"m","prompt":"p"}}"#.into(),
            InvalidMessage::Invalid { field: "job_id", rule: "must not be made only of dots" },
        ),
        (
            r#"{"job_id":"a/.","contract":"c","input":{"model":"m","prompt":"p"}}"#.into(),
            InvalidMessage::Invalid { field: "job_id", rule: "must not be made only of dots" },
        ),
        (
            r#"{"job_id":"a/b/c","contract":"c","input":{"model":"m","prompt":"p"}}"#.into(),
            InvalidMessage::Invalid { field: "job_id", rule: "at most one `/`, between a producer and its own id" },
        ),
        (
            r#"{"job_id":"/b","contract":"c","input":{"model":"m","prompt":"p"}}"#.into(),
            InvalidMessage::Invalid { field: "job_id", rule: "at most one `/`, between a producer and its own id" },
        ),
        (
            format!(r#"{{"job_id":"{}","contract":"c","input":{{"model":"m","prompt":"p"}}}}"#, "a".repeat(129)),
            InvalidMessage::Invalid { field: "job_id", rule: "length out of range" },
        ),
        (
            format!(r#"{{"job_id":"j","contract":"c","input":"{secret}"}}"#),
            InvalidMessage::WrongType { field: "input", expected: "an object" },
        ),
        (
            r#"{"job_id":"j","contract":"c","input":{"prompt":"p"}}"#.into(),
            InvalidMessage::Missing("input.model"),
        ),
        (
            r#"{"job_id":"j","contract":"c","input":{"model":"m"}}"#.into(),
            InvalidMessage::Missing("input.messages or input.prompt"),
        ),
        (
            r#"{"job_id":"j","contract":"c","input":{"model":"m","messages":[{"role":"user"}]}}"#.into(),
            InvalidMessage::WrongType { field: "input.messages[].content", expected: "a string or an array of parts" },
        ),
        (
            r#"{"job_id":"j","contract":"c","input":{"model":"m","messages":[{"role":"tool","content":"x"}]}}"#.into(),
            InvalidMessage::Invalid { field: "input.messages[].role", rule: "must be system, developer, user or assistant" },
        ),
        (
            r#"{"job_id":"j","contract":"c","input":{"model":"m","messages":[{"role":"user","content":[{"type":"input_file","file_id":"file-theirs"}]}]}}"#.into(),
            InvalidMessage::Invalid { field: "input.messages[].content", rule: "parts are text only ({\"type\": \"text\", \"text\": ...})" },
        ),
        (
            r#"{"job_id":"j","contract":"c","input":{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"x","image_url":"http://169.254.169.254/"}]}]}}"#.into(),
            InvalidMessage::Invalid { field: "input.messages[].content", rule: "parts are text only ({\"type\": \"text\", \"text\": ...})" },
        ),
        (
            r#"{"job_id":"j","contract":"c","input":{"model":"m","messages":[{"type":"item_reference","id":"msg_theirs","role":"user","content":"x"}]}}"#.into(),
            InvalidMessage::Invalid { field: "input.messages[]", rule: "a message has role, content and name only" },
        ),
        (
            body(r#","max_attempts":0"#),
            InvalidMessage::Invalid { field: "max_attempts", rule: "must be an integer from 1 to 100" },
        ),
        (
            body(r#","max_attempts":"3""#),
            InvalidMessage::WrongType { field: "max_attempts", expected: "an integer" },
        ),
        (
            body(r#","deadline_at":"tomorrow""#),
            InvalidMessage::Invalid { field: "deadline_at", rule: "not an RFC 3339 date-time" },
        ),
    ];
    for (text, expected) in cases {
        let err = parse_body(Some(&text)).expect_err(&text);
        assert_eq!(err, expected, "{text}");
        assert!(!err.to_string().contains(secret));
    }
    assert_eq!(parse_body(None), Err(InvalidMessage::MissingBody));
    let deep = format!(
        r#"{{"job_id":"j","input":{}{}}}"#,
        "[".repeat(200),
        "]".repeat(200)
    );
    assert!(
        matches!(parse_body(Some(&deep)), Err(InvalidMessage::TooDeep { .. })),
        "{:?}",
        parse_body(Some(&deep))
    );
    let huge = body(&format!(
        r#","metadata":{{"pad":"{}"}}"#,
        "x".repeat(MAX_BODY_BYTES)
    ));
    assert!(matches!(
        parse_body(Some(&huge)),
        Err(InvalidMessage::TooLarge { .. })
    ));
}

#[test]
fn a_tenant_and_a_priority_are_read_and_checked_and_stay_out_of_the_digest() {
    let plain = parse_body(Some(&body(""))).expect("valid");
    let classed =
        parse_body(Some(&body(r#","tenant":"acme-eu.1","priority":"urgent""#))).expect("valid");
    assert_eq!(classed.class.tenant.as_deref(), Some("acme-eu.1"));
    assert!(classed.class.urgent);
    assert_eq!(classed.digest, plain.digest);
    assert_eq!(plain.class, crate::job::JobClass::default());
    let normal = parse_body(Some(&body(r#","priority":"normal""#))).expect("valid");
    assert!(!normal.class.urgent);
    for bad in [
        r#","tenant":"""#,
        r#","tenant":"a b""#,
        r#","tenant":7"#,
        r#","priority":"high""#,
        r#","priority":1"#,
    ] {
        assert!(parse_body(Some(&body(bad))).is_err(), "{bad}");
    }
    let long = format!(r#","tenant":"{}""#, "t".repeat(MAX_TENANT_LEN + 1));
    assert!(parse_body(Some(&body(&long))).is_err());
}

#[test]
fn the_input_head_reads_the_model_and_parameters_the_whole_input_holds() {
    // (A valid input names its model as a string and its parameters as an object.)
    for input in [
        r#"{"model":"m","prompt":"p","parameters":{"max_tokens":5,"temperature":0.2}}"#,
        r#"{"model":"m","messages":[{"role":"user","content":"hello"}]}"#,
        r#"{"model":"m","prompt":"p","parameters":{}}"#,
    ] {
        let msg = parse_body(Some(&format!(
            r#"{{"job_id":"j","contract":"c","input":{input}}}"#
        )))
        .expect("valid");
        let (head, whole) = (msg.input_head(), msg.input());
        assert_eq!(head.model.as_ref(), whole.get("model"), "{input}");
        assert_eq!(head.parameters.as_ref(), whole.get("parameters"), "{input}");
    }
}
