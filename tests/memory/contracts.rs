//! Output contracts without the emulator: the contract's schema reaches each OpenAI API and
//! Bedrock in its own form (a scripted server reads the requests), and the README's example job
//! is accepted under its contract and announced parsed (over the in-memory ledger).

use std::sync::Arc;

use fenced_jobs::clock::SystemClock;
use fenced_jobs::job::contract::{Contract, Finish};
use fenced_jobs::provider::openai::{OpenAiApi, OpenAiProvider, OpenAiSettings};
use fenced_jobs::provider::{
    Provider, ProviderError, ProviderRequest, SimulatedProvider, Submission,
};
use fenced_jobs::worker::processor::Processor;
use serde_json::{Map, Value, json};

use crate::support::contracts::{built_in, invoice};
use crate::support::http::{HttpStub, Reply, bedrock};
use crate::support::{self, fast_settings};

/// The built-in invoice contract, and a request held to it.
fn held_to_invoice() -> (Contract, Map<String, Value>) {
    let contract = built_in(false).for_job("invoice-extract@2");
    // A schema in the job's parameters, in either API's form, is never what is sent.
    let input = json!({"model": "m", "prompt": "Extract the invoice.", "parameters": {
        "temperature": 0,
        "text": {"format": {"type": "text"}},
        "response_format": {"type": "text"}
    }});
    (contract, input.as_object().cloned().expect("object"))
}

fn request<'a>(contract: &'a Contract, input: &'a Map<String, Value>) -> ProviderRequest<'a> {
    ProviderRequest {
        job_id: "inv-9",
        attempt: 1,
        epoch: 1,
        contract: contract.id(),
        output: contract,
        input,
        input_json: "{}",
        max_output_tokens: 0,
        idempotency_key: "inv-9/1@1".to_owned(),
        progress: None,
    }
}

fn openai(url: &str, api: OpenAiApi) -> OpenAiProvider {
    let settings = OpenAiSettings {
        base_url: format!("{url}/v1"),
        api,
        ..OpenAiSettings::default()
    };
    OpenAiProvider::new(settings, None).expect("provider")
}

#[tokio::test]
async fn the_schema_reaches_each_openai_api_in_its_own_form_and_a_fallback_translates_it() {
    // GIVEN a server without the Responses API, whose chat model runs out of tokens
    let cut_off = json!({
        "id": "chatcmpl-1", "model": "m",
        "choices": [{"index": 0, "finish_reason": "length",
                     "message": {"role": "assistant", "content": "{\"number\": \"INV-1\", \"tot"}}]
    });
    let stub = HttpStub::start(move |req, _| match req.path.as_str() {
        "/v1/chat/completions" => Reply::json(200, cut_off.clone()),
        _ => Reply::json(404, json!({"detail": "Not Found"})),
    })
    .await;
    let (contract, input) = held_to_invoice();
    let provider = openai(&stub.url, OpenAiApi::Responses);

    // WHEN an invoice extraction is submitted
    let submitted = provider.submit(&request(&contract, &input)).await;

    // THEN the Responses API was asked with `text.format`, Chat Completions with
    // `response_format`, each carrying the contract's schema in OpenAI's strict dialect,
    // under its name (the server judges each as OpenAI does: it refuses the schema as
    // written, with its length bounds, and took the lowered one)
    let whole = contract.schema().expect("schema");
    assert_eq!(
        crate::support::providers::openai_strict_refuses(whole, &mut Vec::new(), true).as_deref(),
        Some(
            "In context=('properties', 'lines', 'items', 'properties', 'description'), \
             'maxLength' is not permitted."
        )
    );
    let lowered = fenced_jobs::provider::dialect::openai(whole);
    let sent = stub.requests();
    let responses = sent[0].json();
    assert_eq!(sent[0].path, "/v1/responses");
    let format = &responses["text"]["format"];
    assert_eq!(format["type"], "json_schema");
    assert_eq!(format["name"], "invoice-extract_2");
    assert_eq!(format["strict"], true);
    assert_eq!(format["schema"], lowered);
    let chat = sent[1].json();
    assert_eq!(sent[1].path, "/v1/chat/completions");
    assert!(
        chat.get("text").is_none(),
        "the Responses form is not copied"
    );
    let format = &chat["response_format"];
    assert_eq!(format["type"], "json_schema");
    assert_eq!(format["json_schema"]["name"], "invoice-extract_2");
    assert_eq!(format["json_schema"]["strict"], true);
    assert_eq!(format["json_schema"]["schema"], lowered);
    assert_eq!(chat["temperature"], 0);
    // AND the truncated answer is refused, never accepted
    let Ok(Submission::Answered(answer)) = submitted else {
        panic!("chat answers in the exchange: {submitted:?}");
    };
    assert_eq!(answer.finish, Finish::Length);
    assert!(matches!(
        answer.judged(&contract),
        Err(ProviderError::InvalidOutput(rejected)) if rejected.finish == Finish::Length
    ));
}

#[tokio::test]
async fn the_schema_reaches_bedrock_as_structured_output_and_text_contracts_send_none() {
    // GIVEN a Converse endpoint that answers with the JSON its schema asked for
    let answer = json!({
        "output": {"message": {"role": "assistant", "content": [{"text": invoice().to_string()}]}},
        "stopReason": "end_turn",
        "usage": {"inputTokens": 9, "outputTokens": 90, "totalTokens": 99}
    });
    let stub = HttpStub::start(move |_, _| Reply::json(200, answer.clone())).await;
    let provider = bedrock(&stub.url);
    let (contract, input) = held_to_invoice();

    // WHEN an invoice extraction is called, then a free-text job
    let answered = provider
        .call(&request(&contract, &input))
        .await
        .expect("answer");
    let free = Contract::free_text("summary.v1");
    provider
        .call(&request(&free, &input))
        .await
        .expect("answer");

    // THEN the schema went as `outputConfig.textFormat`, as a JSON string, under its name, in
    // the dialect Claude's constrained decoding takes; the free-text job sent no output format;
    // the answer is accepted (by the whole schema) and stored parsed
    let sent = stub.requests();
    let format = &sent[0].json()["outputConfig"]["textFormat"];
    assert_eq!(format["type"], "json_schema");
    let definition = &format["structure"]["jsonSchema"];
    assert_eq!(definition["name"], "invoice-extract_2");
    let schema: Value =
        serde_json::from_str(definition["schema"].as_str().expect("a string")).expect("JSON");
    let whole = contract.schema().expect("a schema");
    assert_eq!(schema, fenced_jobs::provider::dialect::anthropic(whole));
    assert_eq!(
        crate::support::providers::anthropic_refuses(&schema, "textFormat"),
        None
    );
    assert!(sent[1].json().get("outputConfig").is_none());
    assert_eq!(answered.finish, Finish::Stop);
    let accepted = answered.judged(&contract).expect("valid");
    let body: Value = serde_json::from_str(&accepted.body).expect("JSON");
    assert_eq!(body["output"], invoice());
}

#[tokio::test]
async fn the_readmes_example_job_is_accepted_under_its_contract_and_announced_parsed() {
    use fenced_jobs::events::CompletionEvent;
    use fenced_jobs::ledger::JobLedger;
    use fenced_jobs::ledger::memory::InMemoryLedger;
    use fenced_jobs::worker::processor::Invocation;
    // GIVEN the README's example job, held to the built-in review-verdict@1 contract
    let body = std::fs::read_to_string("events/job-verdict.json").expect("the example job");
    let msg = fenced_jobs::job::parse_body(Some(&body)).expect("a valid job");
    let processor = Processor::new(
        InMemoryLedger::new(),
        SimulatedProvider::new(),
        SystemClock,
        fast_settings(),
    )
    .with_contracts(Arc::new(built_in(false)));

    // WHEN it is processed
    let inv = Invocation {
        id: "readme".into(),
        deadline: None,
    };
    processor
        .process(&msg, "readme/1", &inv, &support::NoWatch)
        .await;

    // THEN it succeeded, and its completion event carries the verdict as JSON
    let record = processor
        .ledger()
        .get(&msg.job_id)
        .await
        .expect("get")
        .expect("item");
    let event = CompletionEvent::of(&record).expect("announced");
    println!(
        "{}",
        serde_json::to_string_pretty(&event.detail).expect("json")
    );
    assert_eq!(event.detail["result"]["output"]["verdict"], "fail");
    // The README shows this event: its id follows from the job, its epoch and its state.
    assert_eq!(event.detail["event_id"], "165c0b118ab109efe06eadf1d37126ae");
    assert_eq!(event.detail["result"]["usage"]["input_tokens"], 70);
    assert_eq!(event.detail["metadata"]["tenant"], "acme");
    // And what the job used and cost, in the ledger's vocabulary, priced at sim-1's $1 a
    // million tokens in and $4 out.
    let usage = &event.detail["usage"];
    assert_eq!(usage["input"], 70);
    assert_eq!(
        usage["cost_micros"],
        70 + 4 * usage["output"].as_u64().expect("output tokens")
    );
}

#[tokio::test]
async fn a_schema_strict_mode_cannot_take_goes_unenforced_and_is_named_at_start_up() {
    // GIVEN a contract with an optional property (strict mode has none), beside the built-in
    // ones, for a worker whose provider is OpenAI
    let loose = Contract::parse(
        "note@1",
        r#"{"format": "json", "schema": {"type": "object", "required": ["title"],
            "properties": {"title": {"type": "string", "maxLength": 80},
                           "tags": {"type": "array", "items": {"type": "string"}}}}}"#,
    )
    .expect("contract");
    let stub = HttpStub::start(|_, _| {
        Reply::json(
            200,
            crate::support::providers::chat_answer(r#"{"title": "T"}"#),
        )
    })
    .await;
    let mut contracts: Vec<Contract> = built_in(false).iter().cloned().collect();
    contracts.push(loose.clone());
    let processor = Processor::new(
        fenced_jobs::ledger::memory::InMemoryLedger::new(),
        openai(&stub.url, OpenAiApi::Chat),
        SystemClock,
        fast_settings(),
    )
    .with_contracts(Arc::new(fenced_jobs::job::contract::Contracts::new(
        contracts, false,
    )));

    // WHEN the worker starts, and a job under it is submitted
    let named = processor.loose_contracts();
    let input = json!({"model": "m", "prompt": "Title this."});
    let input = input.as_object().cloned().expect("object");
    let submitted = processor.provider().submit(&request(&loose, &input)).await;

    // THEN start-up names it alone, with its reason, and OpenAI takes it as guidance
    // (strict false, in its dialect) where strict mode would have refused it
    assert_eq!(
        named,
        [(
            "note@1".to_owned(),
            "openai",
            "property 'tags' is optional".to_owned()
        )]
    );
    assert!(
        matches!(submitted, Ok(Submission::Answered(_))),
        "{submitted:?}"
    );
    let format = &stub.requests()[0].json()["response_format"]["json_schema"];
    assert_eq!(format["strict"], false);
    assert_eq!(
        format["schema"]["properties"]["title"],
        json!({"type": "string", "description": "{maxLength: 80}"})
    );
}
