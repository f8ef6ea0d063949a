//! Amazon Bedrock through the `Converse` API of the AWS SDK.
//!
//! Bedrock cannot be asked about an earlier call, so a call interrupted after it was sent is
//! uncertain. The SDK's own retries are off: a retry after a timeout could run the model twice,
//! and every retry decision belongs to the ledger.

use std::time::Duration;

use aws_sdk_bedrockruntime::Client;
use aws_sdk_bedrockruntime::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_bedrockruntime::types::{
    ContentBlockDelta, ConverseOutput, ConverseStreamOutput, GuardrailConfiguration,
    GuardrailStreamConfiguration, InferenceConfiguration, JsonSchemaDefinition, OutputConfig,
    OutputFormat, OutputFormatStructure, OutputFormatType, ServiceTier, ServiceTierType,
    StopReason, TokenUsage,
};
use serde_json::{Map, Value, json};

mod content;

use super::{Answer, Provider, ProviderError, ProviderRequest};
use crate::job::Usage;
use crate::job::contract::{Contract, Finish};
use crate::vars::Vars;
use content::conversation;

/// How to reach Bedrock.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BedrockSettings {
    /// `BEDROCK_MODEL_ID`: when set, the model of every call (otherwise the job's
    /// `input.model`).
    pub model_id: Option<String>,
    /// `BEDROCK_ENDPOINT_URL`: another endpoint (a VPC endpoint, or a local server in tests).
    pub endpoint_url: Option<String>,
    /// `BEDROCK_GUARDRAIL_ID` and `BEDROCK_GUARDRAIL_VERSION`: the guardrail every call goes
    /// through (a deployment's choice, never a job's).
    pub guardrail: Option<(String, String)>,
    /// `PROVIDER_STREAMING` (`on`, the default, or `off`): answers stream (`ConverseStream`), so
    /// a long generation survives idle-connection limits and its progress is evidence.
    pub stream: bool,
}

impl BedrockSettings {
    /// Reads the `BEDROCK_*` settings; an endpoint must be `https://` (`http://` only on the
    /// loopback interface).
    pub(crate) fn from_vars(vars: &Vars<'_>) -> Result<BedrockSettings, crate::vars::ConfigError> {
        let endpoint_url = vars.get("BEDROCK_ENDPOINT_URL");
        if endpoint_url
            .as_deref()
            .is_some_and(|url| !super::trusted_url(url))
        {
            return Err(crate::vars::ConfigError::Invalid {
                name: "BEDROCK_ENDPOINT_URL",
                reason: "must be https:// (http:// only on the loopback interface)".to_owned(),
            });
        }
        let guardrail = match (
            vars.get("BEDROCK_GUARDRAIL_ID"),
            vars.get("BEDROCK_GUARDRAIL_VERSION"),
        ) {
            (Some(id), version) => Some((id, version.unwrap_or_else(|| "DRAFT".to_owned()))),
            (None, None) => None,
            (None, Some(_)) => {
                return Err(crate::vars::ConfigError::Invalid {
                    name: "BEDROCK_GUARDRAIL_VERSION",
                    reason: "names the version of no guardrail: set BEDROCK_GUARDRAIL_ID"
                        .to_owned(),
                });
            }
        };
        Ok(BedrockSettings {
            model_id: vars.get("BEDROCK_MODEL_ID"),
            endpoint_url,
            guardrail,
            stream: super::streaming(vars)?,
        })
    }
}

/// The Bedrock provider.
#[derive(Debug, Clone)]
pub struct BedrockProvider {
    client: Client,
    model_id: Option<String>,
    /// The guardrail every call goes through (id, version).
    guardrail: Option<(String, String)>,
    /// Answers stream (`ConverseStream`).
    stream: bool,
    /// The host its calls go to: the endpoint given, else the Region's.
    server: String,
}

impl BedrockProvider {
    /// A provider on the shared AWS configuration, with retries off.
    pub fn new(aws: &aws_config::SdkConfig, settings: &BedrockSettings) -> Self {
        let mut config = aws_sdk_bedrockruntime::config::Builder::from(aws)
            .retry_config(aws_sdk_bedrockruntime::config::retry::RetryConfig::disabled())
            .timeout_config(
                aws_sdk_bedrockruntime::config::timeout::TimeoutConfig::builder()
                    .connect_timeout(Duration::from_secs(5))
                    .build(),
            );
        if let Some(url) = &settings.endpoint_url {
            config = config.endpoint_url(url);
        }
        let region = aws.region().map_or("us-east-1", |r| r.as_ref());
        let server = match settings.endpoint_url.as_deref().and_then(super::host_of) {
            Some(host) => host.to_owned(),
            None => format!("bedrock-runtime.{region}.amazonaws.com"),
        };
        BedrockProvider {
            client: Client::from_conf(config.build()),
            model_id: settings.model_id.clone(),
            guardrail: settings.guardrail.clone(),
            stream: settings.stream,
            server,
        }
    }
}

impl Provider for BedrockProvider {
    /// Converse's `serviceTier`: `flex` and `priority` (API reference, `ServiceTier`).
    fn tiers(&self) -> &'static [crate::job::usage::Rate] {
        &[
            crate::job::usage::Rate::Flex,
            crate::job::usage::Rate::Priority,
        ]
    }

    fn name(&self) -> &'static str {
        "aws.bedrock"
    }

    fn server_address(&self) -> Option<&str> {
        Some(&self.server)
    }

    fn fixed_model(&self) -> Option<&str> {
        self.model_id.as_deref()
    }

    async fn call(&self, req: &ProviderRequest<'_>) -> Result<Answer, ProviderError> {
        let model = Provider::model(self, req.input);
        let (system, messages) =
            conversation(req.input).map_err(|reason| ProviderError::Permanent {
                reason: reason.to_owned(),
            })?;
        let system = (!system.is_empty()).then_some(system);
        let parameters = req.input.get("parameters");
        // The same request to `Converse` and `ConverseStream`, whose builders are two types;
        // only the guardrail's configuration type differs.
        macro_rules! request {
            ($builder:expr, $guardrail:ident) => {
                $builder
                    .model_id(model)
                    .set_system(system)
                    .set_messages(Some(messages))
                    .set_inference_config(inference(parameters, req.max_output_tokens))
                    .set_output_config(output_config(req.output))
                    .set_service_tier(service_tier(parameters))
                    .set_additional_model_request_fields(additional_fields(parameters))
                    .set_guardrail_config(self.guardrail.as_ref().map(|(id, version)| {
                        $guardrail::builder()
                            .guardrail_identifier(id)
                            .guardrail_version(version)
                            .build()
                    }))
                    .send()
                    .await
                    .map_err(|e| classify(&e))?
            };
        }
        if self.stream {
            let sent = request!(self.client.converse_stream(), GuardrailStreamConfiguration);
            let (text, stop, usage) = streamed(sent.stream, req.progress_rule()).await?;
            return Ok(answer(req, model, text, &stop, usage.as_ref(), None));
        }
        let out = request!(self.client.converse(), GuardrailConfiguration);
        let text: String = match out.output() {
            Some(ConverseOutput::Message(message)) => message
                .content()
                .iter()
                .filter_map(|block| block.as_text().ok())
                .map(String::as_str)
                .collect(),
            _ => {
                return Err(ProviderError::Permanent {
                    reason: "converse answered without a message".to_owned(),
                });
            }
        };
        let tier = out.service_tier().map(|t| t.r#type().as_str());
        Ok(answer(
            req,
            model,
            text,
            out.stop_reason(),
            out.usage(),
            tier,
        ))
    }
}

/// The answer recorded in the ledger: the same shape for every provider, the cache's tokens in
/// the usage, priced at the `tier` Converse says served the call.
fn answer(
    req: &ProviderRequest<'_>,
    model: &str,
    text: String,
    stop: &StopReason,
    usage: Option<&TokenUsage>,
    tier: Option<&str>,
) -> Answer {
    let recorded = usage.map_or(Value::Null, |u| {
        json!({
            "input_tokens": u.input_tokens(),
            "output_tokens": u.output_tokens(),
            "cache_read_input_tokens": u.cache_read_input_tokens(),
            "cache_write_input_tokens": u.cache_write_input_tokens(),
        })
    });
    let body = json!({
        "contract": req.contract,
        "model": model,
        "output": text,
        "stop_reason": stop.as_str(),
        "usage": recorded,
    });
    Answer {
        body: body.to_string(),
        provider_ref: None,
        finish: finish(stop),
        usage: usage.map(|u| {
            Usage::from_bedrock(
                u.input_tokens(),
                u.output_tokens(),
                u.cache_read_input_tokens().unwrap_or(0),
                u.cache_write_input_tokens().unwrap_or(0),
            )
            .served_at(tier.map(Value::from).as_ref())
        }),
        // Converse names no model in its answer: the one asked for answered.
        model: Some(model.to_owned()),
        response_id: None,
    }
}

/// A `ConverseStream` read whole within the progress rule: its text deltas joined, its stop
/// reason, and the usage of its metadata event, once the stream ended after `messageStop`. No
/// event for the rule's timeout is a hung call; an error in the stream, or an end before
/// `messageStop`, is uncertain: the model was running, and a part of an answer is never taken
/// for one. An answer past 1 MiB could never be stored: permanent.
async fn streamed(
    mut stream: aws_sdk_bedrockruntime::primitives::event_stream::EventReceiver<
        ConverseStreamOutput,
        aws_sdk_bedrockruntime::types::error::ConverseStreamOutputError,
    >,
    progress: super::Progress,
) -> Result<(String, StopReason, Option<TokenUsage>), ProviderError> {
    let cut = |what: &str| ProviderError::Uncertain {
        evidence: format!("{what} after the request was sent; it may have run"),
    };
    progress.mark();
    let (mut text, mut stop, mut usage) = (String::new(), None, None);
    loop {
        let wait = progress.timeout();
        let event = match tokio::time::timeout(wait, stream.recv()).await {
            Err(_) => {
                return Err(ProviderError::Uncertain {
                    evidence: format!(
                        "no bytes for {} s: the call is hung, cancelled; it may have run",
                        wait.as_secs()
                    ),
                });
            }
            Ok(Err(e)) => {
                let code = e
                    .as_service_error()
                    .and_then(|s| s.code())
                    .unwrap_or("lost");
                return Err(cut(&format!("stream error {}", code_text(code))));
            }
            Ok(Ok(None)) => break,
            Ok(Ok(Some(event))) => event,
        };
        progress.mark();
        match event {
            ConverseStreamOutput::ContentBlockDelta(delta) => {
                if let Some(ContentBlockDelta::Text(more)) = delta.delta() {
                    if text.len() + more.len() > MAX_ANSWER_BYTES {
                        return Err(ProviderError::Permanent {
                            reason: format!("answer larger than {MAX_ANSWER_BYTES} bytes"),
                        });
                    }
                    text.push_str(more);
                    // The text's bytes: the event stream's framing is the SDK's.
                    progress.streamed(more.len());
                }
            }
            ConverseStreamOutput::MessageStop(end) => stop = Some(end.stop_reason().clone()),
            ConverseStreamOutput::Metadata(meta) => usage = meta.usage().cloned(),
            _ => {}
        }
    }
    let stop = stop.ok_or_else(|| cut("the stream ended before the answer did"))?;
    Ok((text, stop, usage))
}

/// The most of an answer a stream is read for: one larger could not be stored.
const MAX_ANSWER_BYTES: usize = 1_048_576;

/// The contract's JSON Schema as Converse structured output (`outputConfig.textFormat`); none
/// for a text contract or one without a schema (its answer is still parsed and judged).
fn output_config(contract: &Contract) -> Option<OutputConfig> {
    let schema = contract.schema().filter(|_| contract.wants_json())?;
    // Converse's structured output takes the subset Anthropic's models decode by; the whole
    // schema still judges the answer.
    let schema = crate::provider::dialect::anthropic(schema);
    let definition = JsonSchemaDefinition::builder()
        .schema(schema.to_string())
        .name(contract.schema_name())
        .build()
        .ok()?;
    let format = OutputFormat::builder()
        .r#type(OutputFormatType::JsonSchema)
        .structure(OutputFormatStructure::JsonSchema(definition))
        .build()
        .ok()?;
    Some(OutputConfig::builder().text_format(format).build())
}

/// A Converse stop reason in the one vocabulary of finish reasons.
fn finish(reason: &StopReason) -> Finish {
    match reason {
        StopReason::EndTurn | StopReason::StopSequence => Finish::Stop,
        StopReason::MaxTokens | StopReason::ModelContextWindowExceeded => Finish::Length,
        StopReason::ContentFiltered | StopReason::GuardrailIntervened => Finish::ContentFilter,
        StopReason::ToolUse => Finish::ToolUse,
        _ => Finish::Unknown,
    }
}

/// `parameters.service_tier` (`default`, `flex`, `priority`, `reserved`) as Converse's
/// `serviceTier`.
fn service_tier(parameters: Option<&Value>) -> Option<ServiceTier> {
    let tier = parameters?.get("service_tier")?.as_str()?;
    ServiceTier::builder()
        .r#type(ServiceTierType::from(tier))
        .build()
        .ok()
}

/// `parameters.additionalModelRequestFields` (or `additional_model_request_fields`): the
/// model's own fields (`top_k`, `thinking`), sent as they are.
fn additional_fields(parameters: Option<&Value>) -> Option<aws_smithy_types::Document> {
    let p = parameters?;
    let fields = p
        .get("additionalModelRequestFields")
        .or_else(|| p.get("additional_model_request_fields"))?;
    fields.is_object().then(|| document(fields))
}

/// A JSON value as a Smithy document.
fn document(value: &Value) -> aws_smithy_types::Document {
    use aws_smithy_types::{Document, Number};
    match value {
        Value::Null => Document::Null,
        Value::Bool(b) => Document::Bool(*b),
        Value::Number(n) => Document::Number(match (n.as_u64(), n.as_i64()) {
            (Some(u), _) => Number::PosInt(u),
            (None, Some(i)) => Number::NegInt(i),
            _ => Number::Float(n.as_f64().unwrap_or(0.0)),
        }),
        Value::String(s) => Document::String(s.clone()),
        Value::Array(items) => Document::Array(items.iter().map(document).collect()),
        Value::Object(fields) => Document::Object(
            fields
                .iter()
                .map(|(k, v)| (k.clone(), document(v)))
                .collect(),
        ),
    }
}

/// Inference parameters from the job's `parameters` (both OpenAI and Bedrock spellings), the
/// answer's ceiling `max_tokens` when the job sets none.
fn inference(parameters: Option<&Value>, max_tokens: u64) -> Option<InferenceConfiguration> {
    let empty = Map::new();
    let p = parameters.and_then(Value::as_object).unwrap_or(&empty);
    if p.is_empty() && max_tokens == 0 {
        return None;
    }
    let number = |names: &[&str]| names.iter().find_map(|n| p.get(*n)?.as_f64());
    // The job's ceiling in any provider's spelling, else the deployment's.
    let ceiling = crate::job::OUTPUT_CEILINGS
        .iter()
        .filter_map(|n| p.get(*n)?.as_u64())
        .max()
        .unwrap_or(max_tokens);
    let stop = match p.get("stop").or_else(|| p.get("stopSequences")) {
        Some(Value::String(s)) => Some(vec![s.clone()]),
        Some(Value::Array(a)) => Some(
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect(),
        ),
        _ => None,
    };
    Some(
        InferenceConfiguration::builder()
            .set_max_tokens((ceiling > 0).then(|| i32::try_from(ceiling).unwrap_or(i32::MAX)))
            .set_temperature(number(&["temperature"]).map(|v| v as f32))
            .set_top_p(number(&["top_p", "topP"]).map(|v| v as f32))
            .set_stop_sequences(stop)
            .build(),
    )
}

/// A failed `Converse`, classified by what it says about the work.
fn classify<E: ProvideErrorMetadata, R>(e: &SdkError<E, R>) -> ProviderError {
    match e {
        SdkError::ServiceError(service) => code_error(service.err().code().unwrap_or("unknown")),
        SdkError::ConstructionFailure(_) => ProviderError::Permanent {
            reason: "request could not be built".to_owned(),
        },
        SdkError::DispatchFailure(d) if d.as_connector_error().is_some_and(refused_connection) => {
            ProviderError::Transient {
                retry_after_ms: None,
                reason: "connection failed".to_owned(),
            }
        }
        SdkError::TimeoutError(_) => ProviderError::Uncertain {
            evidence: "timeout after the request was sent; it may have run".to_owned(),
        },
        _ => ProviderError::Uncertain {
            evidence: "connection lost after the request was sent; it may have run".to_owned(),
        },
    }
}

/// A Bedrock error code, classified. Throttled: `ThrottlingException`, the account's rate
/// quotas, refused before any work (the attempt is given back). Transient: refused before any
/// work (a service quota, which waiting does not clear, capacity, access), or a definite
/// failure the service reports (the model timed out or failed and will give no answer).
/// Permanent: the request itself is wrong, so a retry gives the same. Any other code may have
/// run the model: uncertain, never permanent, since a terminal state cannot be taken back.
fn code_error(code: &str) -> ProviderError {
    if code == "ThrottlingException" {
        return ProviderError::Throttled {
            retry_after_ms: None,
            reason: code_text(code),
        };
    }
    const TRANSIENT: [&str; 7] = [
        "ServiceQuotaExceededException",
        "ServiceUnavailableException",
        "InternalServerException",
        "ModelNotReadyException",
        "ModelTimeoutException",
        "ModelErrorException",
        "AccessDeniedException",
    ];
    const PERMANENT: [&str; 2] = ["ValidationException", "ResourceNotFoundException"];
    let reason = code_text(code);
    if TRANSIENT.contains(&code) {
        ProviderError::Transient {
            retry_after_ms: None,
            reason,
        }
    } else if PERMANENT.contains(&code) {
        ProviderError::Permanent { reason }
    } else {
        ProviderError::Uncertain {
            evidence: format!("{reason} after the request was sent; it may have run"),
        }
    }
}

/// A service's error code, made safe to record: short, identifier characters only.
fn code_text(code: &str) -> String {
    code.chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
        .take(64)
        .collect()
}

/// Whether the connection was refused, so that nothing was sent.
fn refused_connection(e: &aws_smithy_runtime_api::client::result::ConnectorError) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = source {
        if let Some(io) = err.downcast_ref::<std::io::Error>()
            && io.kind() == std::io::ErrorKind::ConnectionRefused
        {
            return true;
        }
        source = err.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_sdk_bedrockruntime::types::ConversationRole;

    #[test]
    fn error_codes_are_never_permanent_unless_the_request_is_wrong() {
        assert!(code_error("ThrottlingException").is_throttle());
        for code in ["ServiceQuotaExceededException", "AccessDeniedException"] {
            assert!(
                matches!(code_error(code), ProviderError::Transient { .. }),
                "{code}"
            );
        }
        for code in ["ValidationException", "ResourceNotFoundException"] {
            assert!(
                matches!(code_error(code), ProviderError::Permanent { .. }),
                "{code}"
            );
        }
        for code in [
            "ModelStreamErrorException",
            "SomethingNewException",
            "unknown",
        ] {
            assert!(
                matches!(code_error(code), ProviderError::Uncertain { .. }),
                "{code}"
            );
        }
    }

    #[test]
    fn messages_map_to_system_blocks_and_turns() {
        let input = json!({"model": "m", "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": "ok"},
        ]});
        let (system, messages) = conversation(input.as_object().expect("object")).expect("valid");
        assert_eq!(system.len(), 1);
        assert_eq!(messages.len(), 2);
        assert_eq!(messages[0].content().len(), 2);
        assert_eq!(messages[1].role(), &ConversationRole::Assistant);
        let audio = json!({"model": "m", "messages": [
            {"role": "user", "content": [{"type": "input_audio", "input_audio": "x"}]}
        ]});
        assert!(conversation(audio.as_object().expect("object")).is_err());
        let link = json!({"model": "m", "messages": [
            {"role": "user", "content": [{"type": "image_url", "image_url": "https://x/y.png"}]}
        ]});
        assert!(conversation(link.as_object().expect("object")).is_err());
    }

    #[test]
    fn parameters_take_either_spelling() {
        let config = inference(
            Some(&json!({"max_tokens": 50, "temperature": 0.5, "topP": 0.9, "stop": "END"})),
            16_384,
        )
        .expect("config");
        assert_eq!(config.max_tokens(), Some(50));
        assert_eq!(config.temperature(), Some(0.5));
        assert_eq!(config.top_p(), Some(0.9));
        assert_eq!(config.stop_sequences(), ["END"]);
        assert!(inference(None, 0).is_none());
        // Every spelling of the answer's ceiling is read; a job that sets none is sent the
        // deployment's.
        let ceiling = |parameters: Value| {
            inference(Some(&parameters), 16_384)
                .expect("config")
                .max_tokens()
        };
        assert_eq!(ceiling(json!({"max_output_tokens": 70})), Some(70));
        assert_eq!(ceiling(json!({"max_completion_tokens": 80})), Some(80));
        assert_eq!(ceiling(json!({"maxTokens": 90})), Some(90));
        assert_eq!(ceiling(json!({"temperature": 0.5})), Some(16_384));
        assert_eq!(
            inference(None, 512).expect("config").max_tokens(),
            Some(512)
        );
    }
}
