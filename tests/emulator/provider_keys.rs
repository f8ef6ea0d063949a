//! A provider's API key on the emulator: read from Secrets Manager or SSM and sent, and a key
//! rotated in SSM taken up after the server refuses the old one, without spending an attempt.

use fenced_jobs::provider::ProviderError;
use fenced_jobs::provider::openai::{OpenAiApi, OpenAiSettings};
use fenced_jobs::provider::{AnyProvider, Provider};
use fenced_jobs::provider::{KeySource, ProviderConfig};
use serde_json::json;

use crate::support::http::{HttpStub, Reply};
use crate::support::providers::openai_settings;
use crate::support::providers::{chat_answer, input, output_of, request};
use crate::support::{self, emulator};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_key_is_read_from_secrets_manager_or_ssm_and_sent() {
    let aws = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .region(aws_config::Region::new("us-east-1"))
        .load()
        .await;
    let _ = emulator().await; // asserts the endpoint is local
    let secret_id = support::unique("openai-key");
    aws_sdk_secretsmanager::Client::new(&aws)
        .create_secret()
        .name(&secret_id)
        .secret_string(r#"{"api_key":"sk-from-secrets-manager"}"#)
        .send()
        .await
        .expect("create secret");
    let parameter = format!("/{}", support::unique("openai-key"));
    aws_sdk_ssm::Client::new(&aws)
        .put_parameter()
        .name(&parameter)
        .value("sk-from-ssm")
        .r#type(aws_sdk_ssm::types::ParameterType::SecureString)
        .send()
        .await
        .expect("put parameter");
    let server =
        HttpStub::start(|_, _| Reply::json(200, json!({"id": "resp_k", "status": "queued"}))).await;
    for (key, expected) in [
        (
            KeySource::SecretsManager(secret_id),
            "sk-from-secrets-manager",
        ),
        (KeySource::Parameter(parameter), "sk-from-ssm"),
    ] {
        let config = ProviderConfig::OpenAi {
            settings: openai_settings(&server.url),
            key,
        };
        let provider = AnyProvider::from_config(&config, &aws)
            .await
            .expect("provider");
        let input = json!({"model": "m", "prompt": "p"});
        let input = input.as_object().expect("object");
        let req = fenced_jobs::provider::ProviderRequest {
            job_id: "k",
            attempt: 1,
            epoch: 1,
            contract: "c",
            output: &fenced_jobs::job::contract::Contract::free_text("c"),
            input,
            input_json: "{}",
            max_output_tokens: 0,
            idempotency_key: "k/1".to_owned(),
            progress: None,
        };
        provider.submit(&req).await.expect("submitted");
        let last = server.requests().pop().expect("request");
        assert_eq!(
            last.header("authorization"),
            Some(format!("Bearer {expected}").as_str())
        );
    }
    let missing = ProviderConfig::OpenAi {
        settings: openai_settings(&server.url),
        key: KeySource::Parameter("/no/such/parameter".to_owned()),
    };
    let err = AnyProvider::from_config(&missing, &aws)
        .await
        .expect_err("missing parameter");
    assert!(err.0.contains("/no/such/parameter"), "{err}");

    // A secret without the key field is a start-up error, not a run of 401s.
    let keyless = support::unique("openai-key");
    aws_sdk_secretsmanager::Client::new(&aws)
        .create_secret()
        .name(&keyless)
        .secret_string(r#"{"user":"someone"}"#)
        .send()
        .await
        .expect("create secret");
    let config = ProviderConfig::OpenAi {
        settings: openai_settings(&server.url),
        key: KeySource::SecretsManager(keyless.clone()),
    };
    let err = AnyProvider::from_config(&config, &aws)
        .await
        .expect_err("keyless secret");
    assert!(err.0.contains(&keyless), "{err}");
}

/// A key rotated in SSM is taken up after the server refuses the old one: the call is sent
/// again at once with the new key, and no attempt is spent; a second refusal within the
/// minute does not read the parameter again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_key_is_read_again_after_a_401() {
    use fenced_jobs::provider::{AnyProvider, KeySource, ProviderConfig};
    let aws = support::emulator().await;
    let ssm = aws_sdk_ssm::Client::new(&aws.config);
    let name = format!("/{}/openai-key", support::unique("keys"));
    let put = |value: &'static str| {
        ssm.put_parameter()
            .name(&name)
            .value(value)
            .r#type(aws_sdk_ssm::types::ParameterType::SecureString)
            .overwrite(true)
            .send()
    };
    put("sk-old").await.expect("put");
    let accepted = std::sync::Arc::new(std::sync::Mutex::new("Bearer sk-new".to_owned()));
    let accepts = accepted.clone();
    let stub = HttpStub::start(move |request, _| {
        let good = accepts.lock().expect("lock").clone();
        if request.header("authorization") == Some(good.as_str()) {
            Reply::json(200, chat_answer("done"))
        } else {
            Reply::json(
                401,
                json!({"error": {"code": "invalid_api_key", "type": "invalid_request_error"}}),
            )
        }
    })
    .await;
    let config = ProviderConfig::OpenAi {
        settings: OpenAiSettings {
            base_url: format!("{}/v1", stub.url),
            api: OpenAiApi::Chat,
            ..OpenAiSettings::default()
        },
        key: KeySource::Parameter(name.clone()),
    };
    let provider = AnyProvider::from_config(&config, &aws.config)
        .await
        .expect("provider");
    // GIVEN the key was rotated after the environment read it
    put("sk-new").await.expect("rotate");
    let inp = input(json!({"model": "gpt-test", "prompt": "Summarise this."}));
    let answer = provider.call(&request(&inp, "{}")).await.expect("answered");
    assert_eq!(output_of(&answer), "done");
    let auth: Vec<Option<String>> = stub
        .requests()
        .iter()
        .map(|r| r.header("authorization").map(str::to_owned))
        .collect();
    assert_eq!(
        auth,
        [Some("Bearer sk-old".into()), Some("Bearer sk-new".into())]
    );
    // AND a key rotated again within the minute is not read again: the 401 is the answer
    put("sk-newer").await.expect("rotate");
    *accepted.lock().expect("lock") = "Bearer sk-newer".to_owned();
    let refused = provider.call(&request(&inp, "{}")).await;
    assert!(
        matches!(&refused, Err(ProviderError::Transient { reason, .. }) if reason.contains("401")),
        "{refused:?}"
    );
    assert_eq!(stub.requests().len(), 3);
    // AND calls refused together while the key is replaced wait for the one that reads it,
    // and are sent again with the new key rather than failing on the minute's rule
    put("sk-third").await.expect("rotate");
    *accepted.lock().expect("lock") = "Bearer sk-third".to_owned();
    let provider = AnyProvider::from_config(
        &ProviderConfig::OpenAi {
            settings: OpenAiSettings {
                base_url: format!("{}/v1", stub.url),
                api: OpenAiApi::Chat,
                ..OpenAiSettings::default()
            },
            key: KeySource::Parameter(name.clone()),
        },
        &aws.config,
    )
    .await
    .expect("provider");
    put("sk-new").await.expect("rotate");
    *accepted.lock().expect("lock") = "Bearer sk-new".to_owned();
    let before = stub.requests().len();
    let req = request(&inp, "{}");
    let calls = (0..4).map(|_| provider.call(&req));
    for answer in futures::future::join_all(calls).await {
        assert_eq!(output_of(&answer.expect("answered")), "done");
    }
    let resent = stub.requests()[before..]
        .iter()
        .filter(|r| r.header("authorization") == Some("Bearer sk-new"))
        .count();
    assert_eq!((stub.requests().len() - before, resent), (8, 4));
}
