//! Dead letters against a scripted SQS: an entry SQS failed on its side is sent again alone and
//! one it took never, and on a FIFO dead-letter queue a dead letter is deduplicated by its
//! original message id.

use crate::support;

/// A dead-letter request in which SQS failed some entries on its side: only those are sent
/// again, once, alone; an entry it took is never sent twice, and one it refused as the
/// sender's fault is not repeated.
#[tokio::test]
async fn a_dead_letter_sqs_failed_is_sent_again_alone_and_a_taken_one_never() {
    use fenced_jobs::queue::{DeadLetter, DeadLetterQueue};
    use serde_json::json;
    use support::http::{HttpStub, Reply};
    let server = HttpStub::start(|req, before| {
        let entries = req.json()["Entries"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let ok =
            |id: &str| json!({"Id": id, "MessageId": format!("m-{id}"), "MD5OfMessageBody": "x"});
        if before.is_empty() {
            // Of three: the first taken, the second failed by SQS, the third the sender's fault.
            return Reply::json(
                200,
                json!({
                    "Successful": [ok("0")],
                    "Failed": [
                        {"Id": "1", "SenderFault": false, "Code": "InternalError"},
                        {"Id": "2", "SenderFault": true, "Code": "InvalidParameterValue"}
                    ]
                }),
            );
        }
        let ids: Vec<_> = entries
            .iter()
            .map(|e| ok(e["Id"].as_str().unwrap_or_default()))
            .collect();
        Reply::json(200, json!({"Successful": ids, "Failed": []}))
    })
    .await;
    let queue = dead_letters_at(&server.url, "dlq").await;
    let letter = |body: &str| DeadLetter {
        body: body.into(),
        reason: "poison",
        detail: "body is not JSON (line 1, column 1)".into(),
        job_id: None,
        message_id: Some(format!("src-{body}")),
        group_id: None,
        attributes: Vec::new(),
    };
    let taken = queue
        .send(&[letter("first"), letter("second"), letter("third")])
        .await;
    assert_eq!(taken, [true, true, false]);
    let requests = server.requests();
    assert_eq!(
        requests.len(),
        2,
        "one request, and one for the entry SQS failed"
    );
    let again = requests[1].json()["Entries"].clone();
    assert_eq!(again.as_array().map(Vec::len), Some(1), "{again}");
    assert_eq!(again[0]["MessageBody"], "second");
}

/// On a FIFO DLQ a dead letter is deduplicated by the original message id, so a later
/// delivery's send of the same message (its acknowledgement lost) is dropped by the queue.
#[tokio::test]
async fn a_fifo_dead_letter_is_deduplicated_by_its_original_message_id() {
    use fenced_jobs::queue::{DeadLetter, DeadLetterQueue};
    use serde_json::json;
    use support::http::{HttpStub, Reply};
    let server = HttpStub::start(|req, _| {
        let ok: Vec<_> = req.json()["Entries"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .map(|e| json!({"Id": e["Id"], "MessageId": "m", "MD5OfMessageBody": "x"}))
            .collect();
        Reply::json(200, json!({"Successful": ok, "Failed": []}))
    })
    .await;
    let queue = dead_letters_at(&server.url, "dlq.fifo").await;
    let letter = DeadLetter {
        body: "{not json".into(),
        reason: "poison",
        detail: "body is not JSON (line 1, column 1)".into(),
        job_id: Some("j-9".into()),
        message_id: Some("src-17".into()),
        group_id: None,
        attributes: Vec::new(),
    };
    assert_eq!(queue.send(&[letter.clone(), letter]).await, [true, true]);
    let entries = server.requests()[0].json()["Entries"].clone();
    for entry in entries.as_array().expect("entries") {
        assert_eq!(entry["MessageDeduplicationId"], "src-17");
        assert_eq!(entry["MessageGroupId"], "j-9");
    }
}

/// The worker's dead letters to the queue `name` of a scripted SQS at `url`, signed with test
/// credentials (the tests need no emulator and no account).
async fn dead_letters_at(url: &str, name: &str) -> fenced_jobs::queue::SqsDeadLetters {
    let config = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .region(aws_config::Region::new("us-east-1"))
        .endpoint_url(url)
        .credentials_provider(aws_sdk_sqs::config::Credentials::for_tests())
        .load()
        .await;
    fenced_jobs::queue::SqsDeadLetters::new(
        aws_sdk_sqs::Client::new(&config),
        format!("{url}/123456789012/{name}"),
    )
}
