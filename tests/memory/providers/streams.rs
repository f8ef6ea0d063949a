//! Streamed answers are taken only whole, and a stream that goes silent is hung: Anthropic's
//! Messages, Chat Completions and Bedrock's ConverseStream.

use std::time::Duration;

use fenced_jobs::job::contract::Finish;
use fenced_jobs::provider::anthropic::{AnthropicProvider, AnthropicSettings};
use fenced_jobs::provider::openai::{OpenAiApi, OpenAiProvider, OpenAiSettings};
use fenced_jobs::provider::{Answer, Provider, ProviderError, ProviderRequest};
use serde_json::{Value, json};

use crate::support;
use crate::support::http::{HttpStub, Reply};
use crate::support::providers::{chat_answer, input, output_of, request};

/// Server-sent events: `event: <name>` and its JSON data, each sent after `pause`.
fn sse(events: &[(&str, Value)], pause: Duration) -> Vec<(Duration, String)> {
    events
        .iter()
        .map(|(name, data)| (pause, format!("event: {name}\ndata: {data}\n\n")))
        .collect()
}

fn message_events(stop: bool) -> Vec<(&'static str, Value)> {
    let mut events = vec![
        (
            "message_start",
            json!({"type": "message_start", "message": {"id": "msg_1",
            "type": "message", "role": "assistant", "model": "claude-test", "content": [],
            "usage": {"input_tokens": 9, "output_tokens": 1, "cache_read_input_tokens": 100,
                      "cache_creation_input_tokens": 20}}}),
        ),
        (
            "content_block_start",
            json!({"type": "content_block_start", "index": 0,
            "content_block": {"type": "text", "text": ""}}),
        ),
        ("ping", json!({"type": "ping"})),
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0,
            "delta": {"type": "text_delta", "text": "Brief"}}),
        ),
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0,
            "delta": {"type": "text_delta", "text": "."}}),
        ),
        (
            "content_block_stop",
            json!({"type": "content_block_stop", "index": 0}),
        ),
        (
            "message_delta",
            json!({"type": "message_delta",
            "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 4}}),
        ),
    ];
    if stop {
        events.push(("message_stop", json!({"type": "message_stop"})));
    }
    events
}

/// A streamed Messages call against a server that sends `reply`, under a progress rule of
/// `timeout`.
async fn streamed_message(reply: Reply, timeout: Duration) -> Result<Answer, ProviderError> {
    let stub = HttpStub::start(move |_, _| reply.clone()).await;
    let settings = AnthropicSettings {
        base_url: stub.url.clone(),
        connect_timeout_ms: 1_000,
        ..AnthropicSettings::default()
    };
    let provider = AnthropicProvider::new(settings, None).expect("client");
    let inp = input(json!({"model": "claude-test", "prompt": "Summarise this."}));
    let req = ProviderRequest {
        progress: Some(fenced_jobs::provider::Progress::new(timeout)),
        ..request(&inp, "{}")
    };
    let answer = provider.call(&req).await;
    let sent = stub.requests()[0].json();
    assert_eq!(sent["stream"], true, "the answer streams");
    assert_eq!(
        sent["max_tokens"], 4096,
        "neither the job nor the deployment sets a ceiling: the default"
    );
    answer
}

/// A streamed answer is taken only whole: its text and usage once `message_stop` came; a
/// stream that ends before, or an error event in it, is uncertain; and a stream that stops
/// sending bytes is hung: cancelled within the progress timeout, uncertain.
#[tokio::test]
async fn anthropic_streams_are_taken_whole_and_a_stalled_one_is_hung() {
    let minute = Duration::from_secs(60);
    let whole = Reply::Events {
        parts: sse(&message_events(true), Duration::ZERO),
        stall: false,
    };
    let answer = streamed_message(whole, minute).await.expect("answer");
    assert_eq!(output_of(&answer), "Brief.");
    assert_eq!(answer.finish, Finish::Stop);
    let usage = answer.usage.expect("usage");
    assert_eq!(
        (
            usage.input,
            usage.output,
            usage.cache_read,
            usage.cache_write
        ),
        (9, 4, 100, 20)
    );

    let cut = Reply::Events {
        parts: sse(&message_events(false), Duration::ZERO),
        stall: false,
    };
    let result = streamed_message(cut, minute).await;
    assert!(
        matches!(&result, Err(ProviderError::Uncertain { evidence }) if evidence.contains("ended before")),
        "{result:?}"
    );

    let mut events = message_events(false);
    events.truncate(4);
    events.push((
        "error",
        json!({"type": "error", "error": {"type": "overloaded_error", "message": "x"}}),
    ));
    let failed = Reply::Events {
        parts: sse(&events, Duration::ZERO),
        stall: false,
    };
    let result = streamed_message(failed, minute).await;
    assert!(
        matches!(&result, Err(ProviderError::Uncertain { evidence }) if evidence.contains("overloaded_error")),
        "{result:?}"
    );

    // A delta for a block that never started: a part of the answer would be lost.
    let mut events = message_events(true);
    events.remove(1);
    let orphan = Reply::Events {
        parts: sse(&events, Duration::ZERO),
        stall: false,
    };
    let result = streamed_message(orphan, minute).await;
    assert!(
        matches!(&result, Err(ProviderError::Uncertain { evidence }) if evidence.contains("never started")),
        "{result:?}"
    );

    // Bytes every 300 ms keep a 1 s rule satisfied; then silence.
    let mut events = message_events(false);
    events.truncate(5);
    let stalled = Reply::Events {
        parts: sse(&events, Duration::from_millis(300)),
        stall: true,
    };
    let started = std::time::Instant::now();
    let result = streamed_message(stalled, Duration::from_secs(1)).await;
    let took = started.elapsed();
    assert!(
        matches!(&result, Err(ProviderError::Uncertain { evidence }) if evidence.contains("no bytes for 1 s")),
        "{result:?}"
    );
    assert!(
        took >= Duration::from_millis(2_400) && took < Duration::from_secs(5),
        "cancelled one timeout after the last bytes: {took:?}"
    );
}

/// Chat Completions streams too: the deltas joined, the usage of the last chunk, taken only
/// once `[DONE]` came; and a server that ignores `stream` answers whole, which is read as is.
#[tokio::test]
async fn chat_completions_streams_are_taken_whole() {
    let chunk = |delta: Value, finish: Value| {
        json!({"id": "c1", "object": "chat.completion.chunk", "model": "gpt-test",
               "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
    };
    let mut parts: Vec<String> = [
        chunk(json!({"role": "assistant", "content": ""}), Value::Null),
        chunk(json!({"content": "From "}), Value::Null),
        chunk(json!({"content": "a stream."}), Value::Null),
        chunk(json!({}), json!("stop")),
        json!({"id": "c1", "object": "chat.completion.chunk", "model": "gpt-test",
               "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 3}}),
    ]
    .iter()
    .map(|c| format!("data: {c}\n\n"))
    .collect();
    let call = |parts: Vec<String>| async move {
        let reply = Reply::Events {
            parts: parts.into_iter().map(|p| (Duration::ZERO, p)).collect(),
            stall: false,
        };
        let stub = HttpStub::start(move |_, _| reply.clone()).await;
        let settings = OpenAiSettings {
            stream: true,
            ..OpenAiSettings {
                base_url: format!("{}/v1", stub.url),
                api: OpenAiApi::Chat,
                ..OpenAiSettings::default()
            }
        };
        let provider = OpenAiProvider::new(settings, None).expect("client");
        let inp = input(json!({"model": "gpt-test", "prompt": "p"}));
        let answer = provider.call(&request(&inp, "{}")).await;
        let sent = stub.requests()[0].json();
        assert_eq!(sent["stream"], true);
        assert_eq!(sent["stream_options"]["include_usage"], true);
        answer
    };
    // Without `[DONE]`, the answer may be cut: uncertain.
    let result = call(parts.clone()).await;
    assert!(
        matches!(result, Err(ProviderError::Uncertain { .. })),
        "{result:?}"
    );
    parts.push("data: [DONE]\n\n".to_owned());
    // vLLM's `abort` (the server stopped the generation): the answer is cut off.
    let mut aborted = parts.clone();
    aborted[3] = format!("data: {}\n\n", chunk(json!({}), json!("abort")));
    assert_eq!(call(aborted).await.expect("answer").finish, Finish::Length);
    let answer = call(parts).await.expect("answer");
    assert_eq!(output_of(&answer), "From a stream.");
    assert_eq!(answer.finish, Finish::Stop);
    let usage = answer.usage.expect("usage");
    assert_eq!((usage.input, usage.output), (5, 3));
    // A server that ignores `stream` answers whole: read as is.
    let (result, _) = {
        let stub = HttpStub::start(|_, _| Reply::json(200, chat_answer("Whole."))).await;
        let settings = OpenAiSettings {
            base_url: format!("{}/v1", stub.url),
            api: OpenAiApi::Chat,
            ..OpenAiSettings::default()
        };
        let provider = OpenAiProvider::new(settings, None).expect("client");
        let inp = input(json!({"model": "gpt-test", "prompt": "p"}));
        (provider.call(&request(&inp, "{}")).await, stub)
    };
    assert_eq!(output_of(&result.expect("answer")), "Whole.");
}

/// One `ConverseStream` event as Bedrock frames it: the event's type in its headers, its JSON
/// payload.
fn converse_event(kind: &str, payload: Value) -> Vec<u8> {
    use aws_smithy_types::event_stream::{Header, HeaderValue, Message};
    let message = Message::new(payload.to_string().into_bytes())
        .add_header(Header::new(
            ":message-type",
            HeaderValue::String("event".into()),
        ))
        .add_header(Header::new(
            ":event-type",
            HeaderValue::String(kind.to_owned().into()),
        ))
        .add_header(Header::new(
            ":content-type",
            HeaderValue::String("application/json".into()),
        ));
    let mut bytes = Vec::new();
    aws_smithy_eventstream::frame::write_message_to(&message, &mut bytes).expect("frame");
    bytes
}

/// A streamed Converse call against a server that sends these events (then stalls, with
/// `stall`), under a progress rule of `timeout`.
async fn converse_streamed(
    events: Vec<Vec<u8>>,
    pause: Duration,
    stall: bool,
    timeout: Duration,
) -> (Result<Answer, ProviderError>, HttpStub) {
    let reply = Reply::Bytes {
        content_type: "application/vnd.amazon.eventstream",
        parts: events.into_iter().map(|e| (pause, e)).collect(),
        stall,
    };
    let stub = HttpStub::start(move |_, _| reply.clone()).await;
    let provider = support::http::bedrock_with(&stub.url, true);
    let inp = input(json!({"model": "anthropic.claude-test", "prompt": "Summarise."}));
    let req = ProviderRequest {
        progress: Some(fenced_jobs::provider::Progress::new(timeout)),
        ..request(&inp, "{}")
    };
    (provider.call(&req).await, stub)
}

/// Bedrock streams through `ConverseStream` (its event-stream frames): the answer taken whole
/// once the stream ended after `messageStop`, its usage from the metadata; a stream that ends
/// before is uncertain, and one that goes silent is hung within the progress timeout.
#[tokio::test]
async fn bedrock_converse_streams_are_taken_whole_and_a_stalled_one_is_hung() {
    let delta = |text: &str| {
        converse_event(
            "contentBlockDelta",
            json!({"contentBlockIndex": 0, "delta": {"text": text}}),
        )
    };
    let start = converse_event("messageStart", json!({"role": "assistant"}));
    let stop = converse_event("messageStop", json!({"stopReason": "end_turn"}));
    let meta = converse_event(
        "metadata",
        json!({"usage": {"inputTokens": 9, "outputTokens": 2, "totalTokens": 11,
                         "cacheReadInputTokens": 4}, "metrics": {"latencyMs": 5}}),
    );
    let minute = Duration::from_secs(60);
    let whole = vec![start.clone(), delta("Brief"), delta("."), stop, meta];
    let (answer, stub) = converse_streamed(whole, Duration::ZERO, false, minute).await;
    let answer = answer.expect("answer");
    assert_eq!(output_of(&answer), "Brief.");
    assert_eq!(answer.finish, Finish::Stop);
    let usage = answer.usage.expect("usage");
    assert_eq!((usage.input, usage.output, usage.cache_read), (9, 2, 4));
    assert_eq!(
        stub.requests()[0].path,
        "/model/anthropic.claude-test/converse-stream"
    );

    let cut = vec![start.clone(), delta("Bri")];
    let (result, _) = converse_streamed(cut, Duration::ZERO, false, minute).await;
    assert!(
        matches!(&result, Err(ProviderError::Uncertain { evidence }) if evidence.contains("ended before")),
        "{result:?}"
    );

    let stalled = vec![start, delta("Bri")];
    let began = std::time::Instant::now();
    let (result, _) = converse_streamed(
        stalled,
        Duration::from_millis(300),
        true,
        Duration::from_secs(1),
    )
    .await;
    assert!(
        matches!(&result, Err(ProviderError::Uncertain { evidence }) if evidence.contains("no bytes for 1 s")),
        "{result:?}"
    );
    let took = began.elapsed();
    assert!(
        took >= Duration::from_millis(1_500) && took < Duration::from_secs(5),
        "{took:?}"
    );
}
