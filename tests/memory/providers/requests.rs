//! What a request carries: the contract's schema as Anthropic's structured output or a forced
//! tool, and Bedrock's cache points, media, service tiers, model fields and guardrail.

use fenced_jobs::job::contract::{Contract, Finish};
use fenced_jobs::provider::anthropic::Structured;
use fenced_jobs::provider::{Provider, ProviderError, ProviderRequest};
use serde_json::{Value, json};

use super::{anthropic, message};
use crate::support::http::{HttpStub, Reply, bedrock};
use crate::support::providers::{input, request};

/// The contract's schema reaches Anthropic in its own form: structured output, or a tool the
/// model is made to call whose input is the answer.
#[tokio::test]
async fn anthropic_carries_the_contract_as_structured_output_or_a_forced_tool() {
    let schema = json!({"type": "object", "properties": {"title": {"type": "string"}},
                        "required": ["title"], "additionalProperties": false});
    let contract =
        Contract::parse("invoice@2", &json!({"schema": schema}).to_string()).expect("contract");
    let inp = input(
        json!({"model": "claude-test", "messages": [{"role": "user", "content": [
            {"type": "text", "text": "Long document", "cache_control": {"type": "ephemeral"}},
            {"type": "text", "text": "Extract."}
        ]}]}),
    );
    let req = ProviderRequest {
        output: &contract,
        max_output_tokens: 2_048,
        ..request(&inp, "{}")
    };

    let reply = message(
        json!([{"type": "text", "text": "{\"title\": \"T\"}"}]),
        "end_turn",
    );
    let stub = HttpStub::start(move |_, _| Reply::json(200, reply.clone())).await;
    let answer = anthropic(&stub.url, Structured::Format)
        .call(&req)
        .await
        .expect("answer")
        .judged(&contract)
        .expect("accepted");
    let body: Value = serde_json::from_str(&answer.body).expect("json");
    assert_eq!(body["output"], json!({"title": "T"}));
    let sent = stub.requests()[0].json();
    assert_eq!(
        sent["output_config"],
        json!({"format": {"type": "json_schema", "schema": schema}})
    );
    assert_eq!(sent["max_tokens"], 2_048, "the deployment's ceiling");
    assert_eq!(
        sent["messages"][0]["content"][0]["cache_control"],
        json!({"type": "ephemeral"})
    );

    let reply = message(
        json!([{"type": "tool_use", "id": "toolu_1", "name": "invoice_2",
                "input": {"title": "T"}}]),
        "tool_use",
    );
    let stub = HttpStub::start(move |_, _| Reply::json(200, reply.clone())).await;
    let answer = anthropic(&stub.url, Structured::Tool)
        .call(&req)
        .await
        .expect("answer");
    assert_eq!(
        answer.finish,
        Finish::Stop,
        "the forced tool's call is the answer"
    );
    let body: Value =
        serde_json::from_str(&answer.judged(&contract).expect("ok").body).expect("json");
    assert_eq!(body["output"], json!({"title": "T"}));
    let sent = stub.requests()[0].json();
    assert_eq!(sent["tools"][0]["name"], "invoice_2");
    assert_eq!(sent["tools"][0]["input_schema"], schema);
    assert_eq!(
        sent["tool_choice"],
        json!({"type": "tool", "name": "invoice_2"})
    );
    assert!(sent.get("output_config").is_none());

    // An answer that breaks the contract is refused after the call, whatever was asked.
    let reply = message(
        json!([{"type": "text", "text": "{\"title\": 7}"}]),
        "end_turn",
    );
    let stub = HttpStub::start(move |_, _| Reply::json(200, reply.clone())).await;
    let answer = anthropic(&stub.url, Structured::Format).call(&req).await;
    assert!(matches!(
        answer.expect("answer").judged(&contract),
        Err(ProviderError::InvalidOutput(_))
    ));
}

/// The built-in invoice contract (bounds, lengths, type lists, `$defs`) reaches Anthropic in
/// its dialect: a scripted Messages API that refuses what Anthropic refuses takes it, and the
/// contract's whole schema still judges the answer.
#[tokio::test]
async fn the_invoice_contract_reaches_anthropic_in_its_dialect_and_is_judged_whole() {
    use crate::support::contracts::{built_in, invoice};
    use crate::support::providers::{anthropic_invalid, anthropic_refuses};
    let contract = built_in(true).for_job("invoice-extract@2");
    let whole = contract.schema().expect("a schema");
    // As written, the contract's schema is one Anthropic refuses.
    assert!(anthropic_refuses(whole, "output_config.format.schema").is_some());
    let inp = input(json!({"model": "claude-test", "prompt": "Extract."}));
    let req = ProviderRequest {
        output: &contract,
        ..request(&inp, "{}")
    };
    // A seller's name past the contract's 200 characters: nothing in the lowered schema
    // forbids it, the whole schema does.
    let mut long = invoice();
    long["seller"]["name"] = json!("x".repeat(201));
    for (answer, accepted) in [(invoice(), true), (long, false)] {
        let reply = message(
            json!([{"type": "text", "text": answer.to_string()}]),
            "end_turn",
        );
        let stub = HttpStub::start(move |req, _| {
            let at = "output_config.format.schema";
            match anthropic_refuses(&req.json()["output_config"]["format"]["schema"], at) {
                Some(why) => anthropic_invalid(&why),
                None => Reply::json(200, reply.clone()),
            }
        })
        .await;
        let said = anthropic(&stub.url, Structured::Format)
            .call(&req)
            .await
            .expect("taken: the schema in Anthropic's dialect");
        let sent = stub.requests()[0].json();
        let lowered = &sent["output_config"]["format"]["schema"];
        assert_eq!(lowered["properties"]["lines"]["minItems"], 1);
        assert!(
            lowered["properties"]["number"]["description"]
                .as_str()
                .is_some_and(|d| d.contains("maxLength: 64")),
            "{lowered}"
        );
        assert_eq!(said.judged(&contract).is_ok(), accepted);
    }
}

/// Bedrock with all a job may ask of `Converse`: cache points where parts carry
/// `cache_control`, an image and a document, the service tier and the model's own fields, the
/// deployment's guardrail, the contract's schema; the cache's tokens kept in the usage.
#[tokio::test]
async fn bedrock_carries_cache_points_media_tiers_fields_guardrails_and_the_schema() {
    let reply = json!({
        "output": {"message": {"role": "assistant", "content": [{"text": "{\"title\": \"T\"}"}]}},
        "stopReason": "end_turn",
        "usage": {"inputTokens": 9, "outputTokens": 3, "totalTokens": 132,
                  "cacheReadInputTokens": 100, "cacheWriteInputTokens": 20}
    });
    let stub = HttpStub::start(move |_, _| Reply::json(200, reply.clone())).await;
    let schema = json!({"type": "object", "properties": {"title": {"type": "string"}},
                        "required": ["title"], "additionalProperties": false});
    let contract =
        Contract::parse("invoice@2", &json!({"schema": schema}).to_string()).expect("contract");
    let inp = input(json!({"model": "anthropic.claude-test", "messages": [
        {"role": "system", "content": [{"type": "text", "text": "Rules.",
            "cache_control": {"type": "ephemeral"}}]},
        {"role": "user", "content": [
            {"type": "text", "text": "A long document.", "cache_control": {"type": "ephemeral"}},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
            {"type": "document", "title": "contract",
             "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0="}},
            {"type": "text", "text": "Extract the title."}
        ]}
    ], "parameters": {"service_tier": "flex",
                      "additionalModelRequestFields": {"top_k": 40}}}));
    let req = ProviderRequest {
        output: &contract,
        ..request(&inp, "{}")
    };
    let answer = bedrock(&stub.url).call(&req).await.expect("answer");
    let usage = answer.usage.expect("usage");
    assert_eq!((usage.cache_read, usage.cache_write), (100, 20));
    let sent = stub.requests()[0].json();
    assert_eq!(
        sent["system"],
        json!([{"text": "Rules."}, {"cachePoint": {"type": "default"}}])
    );
    let content = &sent["messages"][0]["content"];
    assert_eq!(content[0], json!({"text": "A long document."}));
    assert_eq!(content[1], json!({"cachePoint": {"type": "default"}}));
    assert_eq!(
        content[2],
        json!({"image": {"format": "png", "source": {"bytes": "iVBORw0KGgo="}}})
    );
    assert_eq!(
        content[3],
        json!({"document": {"format": "pdf", "name": "contract",
                            "source": {"bytes": "JVBERi0="}}})
    );
    assert_eq!(sent["serviceTier"], json!({"type": "flex"}));
    assert_eq!(sent["additionalModelRequestFields"], json!({"top_k": 40}));
    assert_eq!(
        sent["guardrailConfig"],
        json!({"guardrailIdentifier": "gr-1", "guardrailVersion": "2", "trace": "disabled"})
    );
    assert_eq!(
        sent["outputConfig"]["textFormat"]["structure"]["jsonSchema"]["name"],
        "invoice_2"
    );
    assert!(answer.judged(&contract).is_ok());
}

/// The scripted OpenAI server judges each body by OpenAI's published request schema: a
/// parameter out of its range, or one the API does not define, is refused with OpenAI's 400,
/// which the provider reads as permanent (keeping OpenAI's reason where it names a parameter
/// of the request's form).
#[tokio::test]
async fn openais_scripted_server_refuses_what_its_published_schema_refuses() {
    let stub = HttpStub::start(|_, _| {
        Reply::json(200, crate::support::providers::chat_answer("A summary."))
    })
    .await;
    let provider = fenced_jobs::provider::OpenAiProvider::new(
        fenced_jobs::provider::openai::OpenAiSettings {
            api: fenced_jobs::provider::openai::OpenAiApi::Chat,
            ..crate::support::providers::openai_settings(&stub.url)
        },
        None,
    )
    .expect("client");
    let taken = input(json!({"model": "gpt-test", "prompt": "Summarise.",
                             "parameters": {"temperature": 1.5}}));
    assert!(provider.call(&request(&taken, "{}")).await.is_ok());
    for (parameters, named) in [
        (json!({"temperature": 5}), "temperature"),
        (json!({"top_p": 1, "frequency_penalty": 3}), "HTTP 400"),
        (json!({"reasoning_effort": "extreme"}), "HTTP 400"),
    ] {
        let refused = input(json!({"model": "gpt-test", "prompt": "Summarise.",
                                   "parameters": parameters}));
        let result = provider.call(&request(&refused, "{}")).await;
        assert!(
            matches!(&result, Err(ProviderError::Permanent { reason }) if reason.contains(named)),
            "{parameters}: {result:?}"
        );
    }
    // A field the API does not define: refused by the closed entry.
    let body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "foo": 1});
    let refused =
        crate::support::providers::openai_refuses("/v1/chat/completions", &body.to_string());
    assert!(refused.is_some(), "an undefined field is refused");
}
