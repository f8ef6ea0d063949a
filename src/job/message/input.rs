//! The shape of a job's `input`: its model, its conversation or prompt, and the text a
//! message may carry.

use serde_json::{Map, Value};

use super::{InvalidMessage, wrong_type};

/// Checks a job's `input`: a model, `messages` or a `prompt` (not both), and the optional
/// `parameters` and `deferrable`.
pub(super) fn validate_input(input: &Map<String, Value>) -> Result<(), InvalidMessage> {
    match input.get("model") {
        None => return Err(InvalidMessage::Missing("input.model")),
        Some(Value::String(m)) if !m.is_empty() && m.len() <= 256 => {}
        Some(Value::String(_)) => {
            return Err(InvalidMessage::Invalid {
                field: "input.model",
                rule: "must be 1 to 256 bytes",
            });
        }
        Some(_) => return Err(wrong_type("input.model", "a string")),
    }
    match (input.get("messages"), input.get("prompt")) {
        (None, None) => return Err(InvalidMessage::Missing("input.messages or input.prompt")),
        (Some(_), Some(_)) => {
            return Err(InvalidMessage::Invalid {
                field: "input",
                rule: "give `messages` or `prompt`, not both",
            });
        }
        (Some(Value::Array(messages)), None) => {
            if messages.is_empty() {
                return Err(InvalidMessage::Invalid {
                    field: "input.messages",
                    rule: "must not be empty",
                });
            }
            for message in messages {
                check_message(message)?;
            }
        }
        (Some(_), None) => return Err(wrong_type("input.messages", "an array")),
        (None, Some(Value::String(p))) if !p.is_empty() => {}
        (None, Some(_)) => return Err(wrong_type("input.prompt", "a non-empty string")),
    }
    if !matches!(input.get("parameters"), None | Some(Value::Object(_))) {
        return Err(wrong_type("input.parameters", "an object"));
    }
    if !matches!(input.get("deferrable"), None | Some(Value::Bool(_))) {
        return Err(wrong_type("input.deferrable", "true or false"));
    }
    Ok(())
}

/// The roles a job's conversation may give its messages.
const ROLES: [&str; 4] = ["system", "developer", "user", "assistant"];
/// The types a part of a message's content may have: text, in either API's spelling.
const TEXT_PARTS: [&str; 3] = ["text", "input_text", "output_text"];

/// Checks one message of a job's conversation: a role of [`ROLES`] and text content, a string
/// or text parts, and nothing else. A part that names something the provider would fetch or
/// look up (a file id, an image URL, a stored item) is refused: in an account that several
/// producers share, it could name another producer's data.
fn check_message(message: &Value) -> Result<(), InvalidMessage> {
    let Value::Object(message) = message else {
        return Err(wrong_type("input.messages[]", "an object"));
    };
    if !matches!(message.get("role"), Some(Value::String(r)) if ROLES.contains(&r.as_str())) {
        return Err(InvalidMessage::Invalid {
            field: "input.messages[].role",
            rule: "must be system, developer, user or assistant",
        });
    }
    if message
        .keys()
        .any(|k| !matches!(k.as_str(), "role" | "content" | "name"))
    {
        return Err(InvalidMessage::Invalid {
            field: "input.messages[]",
            rule: "a message has role, content and name only",
        });
    }
    let text_part = |part: &Value| {
        part.as_object().is_some_and(|part| {
            matches!(part.get("text"), Some(Value::String(_)))
                && part.keys().all(|k| k == "text" || k == "type")
                && part
                    .get("type")
                    .is_none_or(|t| t.as_str().is_some_and(|t| TEXT_PARTS.contains(&t)))
        })
    };
    match message.get("content") {
        Some(Value::String(_)) => Ok(()),
        Some(Value::Array(parts)) if parts.iter().all(text_part) => Ok(()),
        Some(Value::Array(_)) => Err(InvalidMessage::Invalid {
            field: "input.messages[].content",
            rule: "parts are text only ({\"type\": \"text\", \"text\": ...})",
        }),
        _ => Err(wrong_type(
            "input.messages[].content",
            "a string or an array of parts",
        )),
    }
}
