//! The providers' batch APIs on the wire: OpenAI's Batch API and Anthropic's Message Batches,
//! and what a batch server can do wrong.

use fenced_jobs::provider::anthropic::Structured;
use fenced_jobs::provider::openai::OpenAiApi;
use fenced_jobs::provider::{Provider, ProviderError, Retrieval};
use serde_json::{Value, json};

use super::{anthropic, anthropic_error, message, openai, openai_error};
use crate::support::http::{HttpStub, Reply};
use crate::support::providers::{chat_answer, input, output_of, request};

/// The uploaded JSONL of a `POST /v1/files`: the multipart part after its headers.
fn uploaded_jsonl(body: &str) -> String {
    let start = body.find("application/jsonl\r\n\r\n").expect("file part") + 21;
    let end = body[start..]
        .find("\r\n--batch-")
        .expect("closing boundary")
        + start;
    body[start..end].to_owned()
}

/// An OpenAI Batch API server: one batch over one uploaded file, validating, then in
/// progress, finalizing, and completed with an output file (a success and a refused line) and
/// an error file (an expired line).
async fn openai_batch_server(lines: [String; 4]) -> HttpStub {
    let [ok, refused, expired, _never] = lines;
    HttpStub::start(move |req, before| {
        let looks = before
            .iter()
            .filter(|r| r.method == "GET" && r.path == "/v1/batches/batch_1")
            .count();
        let uploaded = || {
            before
                .iter()
                .find(|r| r.path == "/v1/files")
                .map(|r| uploaded_jsonl(&r.body))
                .unwrap_or_default()
        };
        match (req.method.as_str(), req.path.as_str()) {
            ("POST", "/v1/files") => Reply::json(200, json!({"id": "file-in1", "purpose": "batch"})),
            ("POST", "/v1/batches") => Reply::json(200, json!({"id": "batch_1", "status": "validating"})),
            ("GET", "/v1/batches/batch_1") => {
                let status = ["validating", "in_progress", "finalizing"]
                    .get(looks)
                    .copied()
                    .unwrap_or("completed");
                // OpenAI's Batch object counts its requests as it runs.
                let completed = 2 * looks as u64;
                Reply::json(200, json!({"id": "batch_1", "status": status, "input_file_id": "file-in1",
                    "output_file_id": "file-out1", "error_file_id": "file-err1",
                    "created_at": 1_700_000_000, "metadata": {"source": "fenced-jobs"},
                    "request_counts": {"total": 4, "completed": completed.min(3), "failed": u64::from(looks > 1)}}))
            }
            ("GET", "/v1/batches?limit=100") => Reply::json(200, json!({"data": [
                {"id": "batch_1", "created_at": 4_000_000_000_i64, "metadata": {"source": "fenced-jobs"}},
                {"id": "batch_other", "created_at": 4_000_000_000_i64, "metadata": {"source": "someone-else"}},
                {"id": "batch_staging", "created_at": 4_000_000_000_i64,
                 "metadata": {"source": "fenced-jobs", "deployment": "staging"}}
            ], "has_more": false, "last_id": "batch_staging"})),
            ("GET", "/v1/files/file-in1/content") => Reply::Json { status: 200, headers: vec![], body: uploaded() },
            ("GET", "/v1/files/file-out1/content") => {
                let answered = json!({"id": "batch_req_1", "custom_id": ok, "response": {"status_code": 200,
                    "body": chat_answer("Batched answer.")}, "error": null});
                let refused = json!({"id": "batch_req_2", "custom_id": refused, "response": {"status_code": 400,
                    "body": {"error": {"code": "invalid_value", "message": "no"}}}, "error": null});
                Reply::Json { status: 200, headers: vec![], body: format!("{answered}\n{refused}\n") }
            }
            ("GET", "/v1/files/file-err1/content") => {
                let line = json!({"id": "batch_req_3", "custom_id": expired, "response": null,
                    "error": {"code": "batch_expired", "message": "not run"}});
                Reply::Json { status: 200, headers: vec![], body: format!("{line}\n") }
            }
            _ => Reply::json(404, json!({"error": {"code": "not_found"}})),
        }
    })
    .await
}

#[tokio::test]
async fn openai_batches_are_uploaded_created_followed_and_read_line_by_line() {
    use fenced_jobs::provider::batch::{batch_ref, line_id, pending_ref};
    let ids = [1, 2, 3, 4].map(|a| line_id("job-7", a, 9));
    let stub = openai_batch_server(ids.clone()).await;
    let provider = openai(&stub.url, OpenAiApi::Responses);
    assert!(provider.batches());
    let inp = input(json!({"model": "gpt-test", "prompt": "Summarise.", "deferrable": true}));
    let req = request(&inp, "{}");
    let lines: Vec<_> = ids
        .iter()
        .map(|id| provider.batch_line(&req, id).expect("line"))
        .collect();
    assert_eq!(
        provider.submit_batch(&lines).await.as_deref(),
        Ok("batch_1")
    );
    let sent = stub.requests();
    let jsonl = uploaded_jsonl(&sent[0].body);
    assert!(sent[0].body.contains("name=\"purpose\"\r\n\r\nbatch\r\n"));
    let first: Value = serde_json::from_str(jsonl.lines().next().expect("line")).expect("json");
    assert_eq!(first["custom_id"], ids[0].as_str());
    assert_eq!(first["url"], "/v1/chat/completions");
    assert_eq!(first["body"]["messages"][0]["content"], "Summarise.");
    assert!(first["body"].get("deferrable").is_none());
    assert_eq!(jsonl.lines().count(), 4);
    let create = sent[1].json();
    assert_eq!(create["input_file_id"], "file-in1");
    assert_eq!(create["completion_window"], "24h");
    assert_eq!(create["endpoint"], "/v1/chat/completions");
    assert_eq!(
        create["metadata"],
        json!({"source": "fenced-jobs", "deployment": "prod"})
    );

    // Validating: running (and taken as running for ten seconds by this environment).
    let a = batch_ref("batch_1", &ids[0]);
    assert_eq!(provider.retrieve(&a, 0, &req).await, Retrieval::Running);
    assert_eq!(provider.retrieve(&a, 0, &req).await, Retrieval::Running);
    assert_eq!(stub.count("GET", "/v1/batches/batch_1"), 1);
    // Another environment, later: in progress, finalizing, then completed. A running batch's
    // request counts are kept on the call's progress, for the hand-over to write.
    let (progress, watched) = watched(&req);
    for _ in 0..2 {
        let later = openai(&stub.url, OpenAiApi::Responses);
        assert_eq!(later.retrieve(&a, 0, &watched).await, Retrieval::Running);
    }
    assert_eq!(
        progress.batch_counts(),
        Some(fenced_jobs::job::BatchCounts {
            total: 4,
            completed: 3,
            failed: 1
        })
    );
    let later = openai(&stub.url, OpenAiApi::Responses);
    let Retrieval::Completed(answer) = later.retrieve(&a, 0, &req).await else {
        panic!("the first line answered");
    };
    assert_eq!(output_of(&answer), "Batched answer.");
    // The other lines from the results read once.
    let reads = stub.count("GET", "/v1/files/file-out1/content");
    assert!(matches!(
        later
            .retrieve(&batch_ref("batch_1", &ids[1]), 0, &req)
            .await,
        Retrieval::Failed(ProviderError::Permanent { .. })
    ));
    assert!(matches!(
        later.retrieve(&batch_ref("batch_1", &ids[2]), 0, &req).await,
        Retrieval::Failed(ProviderError::Throttled { ref reason, retry_after_ms: Some(300_000) }) if reason.contains("batch_expired")
    ));
    // A line an ended batch's files do not hold was lost on the way: read them again later.
    assert!(matches!(
        later
            .retrieve(&batch_ref("batch_1", &ids[3]), 0, &req)
            .await,
        Retrieval::Unreachable { .. }
    ));
    assert_eq!(stub.count("GET", "/v1/files/file-out1/content"), reads);

    // A line whose batch id was never recorded is found by listing (ours only), then read.
    let fresh = openai(&stub.url, OpenAiApi::Responses);
    let pending = pending_ref(&ids[0]);
    assert!(matches!(
        fresh.retrieve(&pending, 4_000_000_000_000, &req).await,
        Retrieval::Completed(_)
    ));
    assert_eq!(stub.count("GET", "/v1/batches/batch_other"), 0);
    // A line no batch holds was never submitted: the provider does not know it.
    let never = pending_ref(&line_id("job-7", 5, 9));
    assert_eq!(
        fresh.retrieve(&never, 4_000_000_000_000, &req).await,
        Retrieval::NotFound
    );
    // Another deployment's batch on the same account is never looked in.
    assert_eq!(stub.count("GET", "/v1/batches/batch_staging"), 0);
    assert_eq!(
        stub.count("POST", "/v1/batches"),
        1,
        "nothing was submitted again"
    );
}

#[tokio::test]
async fn anthropic_message_batches_are_created_followed_and_read_line_by_line() {
    use fenced_jobs::provider::batch::{batch_ref, line_id, pending_ref};
    let ids = [1, 2, 3, 4, 5].map(|a| line_id("job-7", a, 9));
    let lines = ids.clone();
    let stub = HttpStub::start(move |req, before| {
        let looks = before
            .iter()
            .filter(|r| r.method == "GET" && r.path == "/v1/messages/batches/msgbatch_1")
            .count();
        let batch = |status: &str| {
            json!({"id": "msgbatch_1", "type": "message_batch", "processing_status": status,
                   "created_at": "2096-01-01T00:00:00Z", "results_url": null,
                   "request_counts": {"processing": 2, "succeeded": 1, "errored": 1,
                                      "canceled": 0, "expired": 1}})
        };
        match (req.method.as_str(), req.path.as_str()) {
            ("POST", "/v1/messages/batches") => Reply::json(200, batch("in_progress")),
            ("GET", "/v1/messages/batches/msgbatch_1") if looks == 0 => {
                Reply::json(200, batch("in_progress"))
            }
            ("GET", "/v1/messages/batches/msgbatch_1") => Reply::json(200, batch("ended")),
            ("GET", "/v1/messages/batches?limit=100") => Reply::json(
                200,
                json!({"data": [batch("ended")], "has_more": false, "last_id": "msgbatch_1"}),
            ),
            ("GET", "/v1/messages/batches/msgbatch_1/results") => {
                let results = [
                    json!({"custom_id": lines[0], "result": {"type": "succeeded", "message":
                        message(json!([{"type": "text", "text": "Batched."}]), "end_turn")}}),
                    json!({"custom_id": lines[1], "result": {"type": "errored", "error":
                        {"type": "error", "error": {"type": "invalid_request_error", "message": "no"}}}}),
                    json!({"custom_id": lines[2], "result": {"type": "errored", "error":
                        {"type": "error", "error": {"type": "overloaded_error", "message": "busy"}}}}),
                    json!({"custom_id": lines[3], "result": {"type": "expired"}}),
                ];
                let body: Vec<String> = results.iter().map(Value::to_string).collect();
                Reply::Json {
                    status: 200,
                    headers: vec![],
                    body: body.join("\n"),
                }
            }
            _ => anthropic_error(404, "not_found_error"),
        }
    })
    .await;
    let provider = anthropic(&stub.url, Structured::Format);
    assert!(provider.batches());
    let inp =
        input(json!({"model": "claude-test", "prompt": "Summarise this.", "deferrable": true}));
    let req = request(&inp, "{}");
    let batch: Vec<_> = ids[..4]
        .iter()
        .map(|id| provider.batch_line(&req, id).expect("line"))
        .collect();
    assert_eq!(
        provider.submit_batch(&batch).await.as_deref(),
        Ok("msgbatch_1")
    );
    let created = stub.requests()[0].clone();
    assert_eq!(created.header("anthropic-version"), Some("2023-06-01"));
    assert_eq!(created.header("x-api-key"), Some("sk-ant-test-secret"));
    let sent = created.json();
    assert_eq!(sent["requests"].as_array().map(Vec::len), Some(4));
    assert_eq!(sent["requests"][0]["custom_id"], ids[0].as_str());
    assert_eq!(sent["requests"][0]["params"]["model"], "claude-test");
    assert_eq!(sent["requests"][0]["params"]["max_tokens"], 4_096);
    assert!(sent["requests"][0]["params"].get("stream").is_none());

    let a = batch_ref("msgbatch_1", &ids[0]);
    let (progress, watched) = watched(&req);
    assert_eq!(provider.retrieve(&a, 0, &watched).await, Retrieval::Running);
    // Anthropic's five counts, in the common form: errored and expired failed.
    assert_eq!(
        progress.batch_counts(),
        Some(fenced_jobs::job::BatchCounts {
            total: 5,
            completed: 1,
            failed: 2
        })
    );
    let later = anthropic(&stub.url, Structured::Format);
    let Retrieval::Completed(answer) = later.retrieve(&a, 0, &req).await else {
        panic!("the first line answered");
    };
    assert_eq!(output_of(&answer), "Batched.");
    let failed = |i: usize| {
        let later = &later;
        let line = batch_ref("msgbatch_1", &ids[i]);
        let req = req.clone();
        async move { later.retrieve(&line, 0, &req).await }
    };
    assert!(matches!(
        failed(1).await,
        Retrieval::Failed(ProviderError::Permanent { .. })
    ));
    assert!(matches!(
        failed(2).await,
        Retrieval::Failed(ProviderError::Transient { .. })
    ));
    assert!(matches!(
        failed(3).await,
        Retrieval::Failed(ProviderError::Throttled { ref reason, retry_after_ms: Some(300_000) }) if reason.contains("expired")
    ));
    assert!(matches!(failed(4).await, Retrieval::Unreachable { .. }));
    assert_eq!(
        stub.count("GET", "/v1/messages/batches/msgbatch_1/results"),
        1
    );

    // Found again by listing its ended batch; a line no batch holds is not known.
    let fresh = anthropic(&stub.url, Structured::Format);
    assert!(matches!(
        fresh.retrieve(&pending_ref(&ids[0]), 0, &req).await,
        Retrieval::Completed(_)
    ));
    assert_eq!(
        fresh.retrieve(&pending_ref(&ids[4]), 0, &req).await,
        Retrieval::NotFound
    );
    assert_eq!(stub.count("POST", "/v1/messages/batches"), 1);
}

/// What a batch server can do wrong: a results file cut off, a list that goes on past what is
/// read, no Batch API at all.
#[tokio::test]
async fn a_cut_results_file_a_long_list_and_a_server_without_batches_are_never_taken_for_answers() {
    use fenced_jobs::provider::batch::{batch_ref, line_id, pending_ref};
    let line = line_id("job-7", 1, 9);
    let stub = HttpStub::start(|req, before| {
        match (req.method.as_str(), req.path.as_str()) {
            ("GET", "/v1/batches/batch_1") => Reply::json(
                200,
                json!({"id": "batch_1",
                "status": "completed", "output_file_id": "file-out1", "error_file_id": null}),
            ),
            // The output file announces more than it sends.
            ("GET", "/v1/files/file-out1/content") => Reply::Cut {
                status: 200,
                body: format!("{}\n", "x".repeat(4_000)),
                sent: 100,
            },
            // Every page full of other people's batches, and more to come.
            ("GET", path) if path.starts_with("/v1/batches?") => {
                let page = before
                    .iter()
                    .filter(|r| r.path.starts_with("/v1/batches?"))
                    .count();
                let data: Vec<Value> = (0..100)
                    .map(|i| {
                        json!({"id": format!("batch_p{page}_{i}"), "created_at": 4_000_000_000_i64,
                                    "metadata": {"source": "someone-else"}})
                    })
                    .collect();
                Reply::json(
                    200,
                    json!({"data": data, "has_more": true, "last_id": format!("batch_p{page}_99")}),
                )
            }
            ("POST", "/v1/files") => Reply::json(404, json!({"error": {"code": "not_found"}})),
            _ => Reply::json(404, json!({})),
        }
    })
    .await;
    let provider = openai(&stub.url, OpenAiApi::Responses);
    let inp = input(json!({"model": "gpt-test", "prompt": "Summarise."}));
    let req = request(&inp, "{}");
    // A file cut off: nothing is concluded, and it is read again next time.
    for _ in 0..2 {
        assert!(matches!(
            provider
                .retrieve(&batch_ref("batch_1", &line), 0, &req)
                .await,
            Retrieval::Unreachable { .. }
        ));
    }
    assert_eq!(stub.count("GET", "/v1/files/file-out1/content"), 2);
    // Ten pages and still more: the line may be further on, so it is not "never sent".
    assert_eq!(
        provider
            .retrieve(&pending_ref(&line), 4_000_000_000_000, &req)
            .await,
        Retrieval::Running
    );
    assert_eq!(stub.count("GET", "/v1/batches?"), 10);
    // No Batch API: the lines were not sent, and deferrable jobs are called directly.
    assert!(provider.batches());
    let lines = vec![provider.batch_line(&req, &line).expect("line")];
    assert!(matches!(
        provider.submit_batch(&lines).await,
        Err(ProviderError::Transient { ref reason, .. }) if reason.contains("no Batch API")
    ));
    assert!(!provider.batches());
}

#[tokio::test]
async fn a_batch_create_the_server_failed_may_have_created_the_batch() {
    use fenced_jobs::provider::batch::line_id;
    // Each create answered in the provider's own word: a 5xx (500, 503, Anthropic's 529) may
    // come after the batch was made, so its lines are looked for, never sent again; a rate
    // limit made nothing.
    let openai_answers = [
        (500, "server_error", "uncertain"),
        (503, "service_unavailable", "uncertain"),
        (429, "rate_limit_exceeded", "throttled"),
    ];
    for (status, code, kind) in openai_answers {
        let stub = HttpStub::start(
            move |req, _| match (req.method.as_str(), req.path.as_str()) {
                ("POST", "/v1/files") => {
                    Reply::json(200, json!({"id": "file-in1", "purpose": "batch"}))
                }
                ("POST", "/v1/batches") => openai_error(
                    status,
                    json!({"error": {"code": code, "message": "failed"}}),
                ),
                _ => Reply::json(404, json!({"error": {"code": "not_found"}})),
            },
        )
        .await;
        let provider = openai(&stub.url, OpenAiApi::Responses);
        let inp = input(json!({"model": "gpt-test", "prompt": "Summarise.", "deferrable": true}));
        let req = request(&inp, "{}");
        let line = provider
            .batch_line(&req, &line_id("job-7", 1, 9))
            .expect("line");
        let said = provider.submit_batch(&[line]).await.expect_err("refused");
        assert_eq!(said.kind(), kind, "OpenAI {status}: {said}");
    }
    let anthropic_answers = [
        (500, "api_error", "uncertain"),
        (529, "overloaded_error", "uncertain"),
        (429, "rate_limit_error", "throttled"),
    ];
    for (status, error, kind) in anthropic_answers {
        let stub = HttpStub::start(
            move |req, _| match (req.method.as_str(), req.path.as_str()) {
                ("POST", "/v1/messages/batches") => anthropic_error(status, error),
                _ => Reply::json(404, json!({})),
            },
        )
        .await;
        let provider = anthropic(&stub.url, Structured::Format);
        let inp = input(json!({"model": "claude-test", "prompt": "Summarise."}));
        let req = request(&inp, "{}");
        let line = provider
            .batch_line(&req, &line_id("job-7", 1, 9))
            .expect("line");
        let said = provider.submit_batch(&[line]).await.expect_err("refused");
        assert_eq!(said.kind(), kind, "Anthropic {status}: {said}");
    }
}

#[tokio::test]
async fn a_batch_failed_for_the_accounts_batch_queue_gives_its_lines_attempts_back() {
    use fenced_jobs::provider::batch::{batch_ref, line_id};
    // OpenAI fails a batch as a whole when the organisation's enqueued tokens for the model are
    // used up (`token_limit_exceeded`): nothing ran, and a later batch will go. Any other
    // failure of a whole batch (its input refused) spends the attempt, as before.
    let stub = HttpStub::start(|req, _| {
        let failed = |code: &str| {
            Reply::json(
                200,
                json!({"id": "batch_x", "status": "failed", "errors": {"object": "list",
                       "data": [{"code": code, "message": "Enqueued token limit reached", "line": null}]}}),
            )
        };
        match (req.method.as_str(), req.path.as_str()) {
            ("GET", "/v1/batches/batch_quota") => failed("token_limit_exceeded"),
            ("GET", "/v1/batches/batch_bad") => failed("invalid_json_line"),
            _ => Reply::json(404, json!({"error": {"code": "not_found"}})),
        }
    })
    .await;
    let provider = openai(&stub.url, OpenAiApi::Responses);
    let inp = input(json!({"model": "gpt-test", "prompt": "Summarise.", "deferrable": true}));
    let req = request(&inp, "{}");
    let line = line_id("job-7", 1, 9);
    let quota = provider
        .retrieve(&batch_ref("batch_quota", &line), 0, &req)
        .await;
    assert!(
        matches!(
            &quota,
            Retrieval::Failed(ProviderError::Throttled { reason, retry_after_ms: Some(300_000) })
                if reason.contains("token_limit_exceeded")
        ),
        "{quota:?}"
    );
    let bad = provider
        .retrieve(&batch_ref("batch_bad", &line), 0, &req)
        .await;
    assert!(
        matches!(&bad, Retrieval::Failed(ProviderError::Transient { .. })),
        "{bad:?}"
    );
}

/// The scripted servers refuse a batch as the vendors do: OpenAI's file with a repeated
/// `custom_id`, two endpoints or a body its request schema refuses; Anthropic's batch with a
/// `custom_id` outside its pattern or a schema its structured outputs refuse.
#[test]
fn the_scripted_batch_servers_refuse_what_the_vendors_refuse() {
    use crate::support::http::Request;
    use crate::support::providers::vendor_refuses;
    let upload = |lines: &[Value]| {
        let jsonl: Vec<String> = lines.iter().map(Value::to_string).collect();
        let body = format!(
            "--b\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n--b\r\n\
             Content-Disposition: form-data; name=\"file\"; filename=\"batch.jsonl\"\r\n\
             Content-Type: application/jsonl\r\n\r\n{}\r\n--b--\r\n",
            jsonl.join("\n")
        );
        Request {
            method: "POST".into(),
            path: "/v1/files".into(),
            headers: vec![(
                "content-type".into(),
                "multipart/form-data; boundary=b".into(),
            )],
            raw: body.clone().into_bytes(),
            body,
        }
    };
    let line = |id: &str, url: &str, body: Value| json!({"custom_id": id, "method": "POST", "url": url, "body": body});
    let chat = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
    let taken = upload(&[
        line("a", "/v1/chat/completions", chat.clone()),
        line("b", "/v1/chat/completions", chat.clone()),
    ]);
    assert!(vendor_refuses(&taken).is_none());
    for refused in [
        upload(&[
            line("a", "/v1/chat/completions", chat.clone()),
            line("a", "/v1/chat/completions", chat.clone()),
        ]),
        upload(&[
            line("a", "/v1/chat/completions", chat.clone()),
            line("b", "/v1/responses", json!({"model": "m", "input": "hi"})),
        ]),
        upload(&[line(
            "a",
            "/v1/chat/completions",
            json!({"model": "m", "messages": [], "temperature": 9}),
        )]),
    ] {
        assert!(vendor_refuses(&refused).is_some(), "{}", refused.body);
    }
    let batch = |id: &str, schema: Value| {
        let body = json!({"requests": [{"custom_id": id, "params": {
            "model": "claude", "max_tokens": 10, "messages": [],
            "output_config": {"format": {"type": "json_schema", "schema": schema}}}}]})
        .to_string();
        Request {
            method: "POST".into(),
            path: "/v1/messages/batches".into(),
            headers: Vec::new(),
            raw: body.clone().into_bytes(),
            body,
        }
    };
    let closed = json!({"type": "object", "properties": {}, "additionalProperties": false});
    assert!(vendor_refuses(&batch("line-1", closed.clone())).is_none());
    assert!(vendor_refuses(&batch("line/1", closed)).is_some());
    let bounded = json!({"type": "object", "additionalProperties": false,
                         "properties": {"n": {"type": "integer", "minimum": 1}}});
    assert!(vendor_refuses(&batch("line-1", bounded)).is_some());
}

/// `req` with a progress of its own, which a batch's look leaves the batch's counts on.
fn watched<'a>(
    req: &fenced_jobs::provider::ProviderRequest<'a>,
) -> (
    fenced_jobs::provider::Progress,
    fenced_jobs::provider::ProviderRequest<'a>,
) {
    let progress = fenced_jobs::provider::Progress::new(std::time::Duration::from_secs(60));
    let req = fenced_jobs::provider::ProviderRequest {
        progress: Some(progress.clone()),
        ..req.clone()
    };
    (progress, req)
}
