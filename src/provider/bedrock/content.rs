//! The job's conversation as Converse blocks: system blocks and messages, text, images,
//! documents, and cache points where parts carry `cache_control`.

use aws_sdk_bedrockruntime::types::{
    CachePointBlock, CachePointType, ContentBlock, ConversationRole, DocumentBlock, DocumentFormat,
    DocumentSource, ImageBlock, ImageFormat, ImageSource, Message, S3Location, SystemContentBlock,
};
use serde_json::{Map, Value};

/// One content part as Converse blocks: text (`text`, `input_text`, `output_text`); an image
/// (`image_url` as a `data:` URL, or an `s3://` one; Anthropic's base64 `image`); a document
/// (Anthropic's `document`, base64 or plain text); each followed by a `cachePoint` when the part
/// carries `cache_control`.
fn blocks(part: &Value, index: usize) -> Result<Vec<ContentBlock>, &'static str> {
    let block = match part.get("type").and_then(Value::as_str) {
        Some("text" | "input_text" | "output_text") => match part.get("text") {
            Some(Value::String(t)) => ContentBlock::Text(t.clone()),
            _ => return Err("text part without text"),
        },
        Some("image_url") => {
            let url = part
                .pointer("/image_url/url")
                .or_else(|| part.get("image_url"))
                .and_then(Value::as_str)
                .ok_or("image part without a URL")?;
            ContentBlock::Image(image_from_url(url)?)
        }
        Some("image") => {
            let source = part.get("source").ok_or("image part without a source")?;
            let media = source
                .get("media_type")
                .and_then(Value::as_str)
                .unwrap_or("");
            let data = source.get("data").and_then(Value::as_str).unwrap_or("");
            ContentBlock::Image(image_block(media, data)?)
        }
        Some("document") => ContentBlock::Document(document_block(part, index)?),
        _ => return Err("a content part this provider does not take"),
    };
    let mut out = vec![block];
    if part.get("cache_control").is_some() {
        out.push(ContentBlock::CachePoint(cache_point()?));
    }
    Ok(out)
}

fn cache_point() -> Result<CachePointBlock, &'static str> {
    CachePointBlock::builder()
        .r#type(CachePointType::Default)
        .build()
        .map_err(|_| "cache point could not be built")
}

/// An image from a `data:<media type>;base64,<data>` or `s3://bucket/key` URL.
fn image_from_url(url: &str) -> Result<ImageBlock, &'static str> {
    if let Some(uri) = url.strip_prefix("s3://").map(|_| url) {
        let format = url.rsplit('.').next().unwrap_or("");
        let location = S3Location::builder()
            .uri(uri)
            .build()
            .map_err(|_| "image location could not be built")?;
        return ImageBlock::builder()
            .format(ImageFormat::from(
                format.to_ascii_lowercase().replace("jpg", "jpeg").as_str(),
            ))
            .source(ImageSource::S3Location(location))
            .build()
            .map_err(|_| "image could not be built");
    }
    let data = url
        .strip_prefix("data:")
        .ok_or("an image URL must be a data: or s3:// URL for this provider")?;
    let (media, data) = data
        .split_once(";base64,")
        .ok_or("an image data URL must be base64")?;
    image_block(media, data)
}

/// An image from its media type (`image/png`) and base64 data.
fn image_block(media: &str, data: &str) -> Result<ImageBlock, &'static str> {
    let format = media
        .strip_prefix("image/")
        .ok_or("an image needs an image/ media type")?;
    let bytes = aws_smithy_types::base64::decode(data).map_err(|_| "image data is not base64")?;
    ImageBlock::builder()
        .format(ImageFormat::from(format))
        .source(ImageSource::Bytes(bytes.into()))
        .build()
        .map_err(|_| "image could not be built")
}

/// A document part in Anthropic's form (`source`: base64 `data` with its `media_type`, or
/// `text`), named by its `title` (Converse requires a name).
fn document_block(part: &Value, index: usize) -> Result<DocumentBlock, &'static str> {
    let source = part.get("source").ok_or("document part without a source")?;
    let media = source
        .get("media_type")
        .and_then(Value::as_str)
        .unwrap_or("");
    let data = source.get("data").and_then(Value::as_str).unwrap_or("");
    let (format, source) = match source.get("type").and_then(Value::as_str) {
        Some("text") => (DocumentFormat::Txt, DocumentSource::Text(data.to_owned())),
        Some("base64") => {
            let format = match media {
                "application/pdf" => DocumentFormat::Pdf,
                "text/csv" => DocumentFormat::Csv,
                "text/html" => DocumentFormat::Html,
                "text/markdown" => DocumentFormat::Md,
                "text/plain" => DocumentFormat::Txt,
                _ => return Err("a document media type this provider does not take"),
            };
            let bytes = aws_smithy_types::base64::decode(data)
                .map_err(|_| "document data is not base64")?;
            (format, DocumentSource::Bytes(bytes.into()))
        }
        _ => return Err("a document source this provider does not take"),
    };
    let name = part
        .get("title")
        .and_then(Value::as_str)
        .map_or_else(|| format!("document-{index}"), str::to_owned);
    DocumentBlock::builder()
        .format(format)
        .name(name)
        .source(source)
        .build()
        .map_err(|_| "document could not be built")
}

/// The job's conversation as Converse system blocks and messages. System messages become
/// system blocks; content parts become Converse blocks ([`blocks`]), with a `cachePoint` after
/// each part that carries `cache_control`.
pub(super) fn conversation(
    input: &Map<String, Value>,
) -> Result<(Vec<SystemContentBlock>, Vec<Message>), &'static str> {
    let user = |text: &str| {
        Message::builder()
            .role(ConversationRole::User)
            .content(ContentBlock::Text(text.to_owned()))
            .build()
            .map_err(|_| "message could not be built")
    };
    if let Some(Value::String(prompt)) = input.get("prompt") {
        return Ok((Vec::new(), vec![user(prompt)?]));
    }
    let Some(Value::Array(entries)) = input.get("messages") else {
        return Err("no prompt or messages");
    };
    let mut system = Vec::new();
    let mut messages = Vec::new();
    let mut parts_seen = 0;
    for entry in entries {
        let content: Vec<ContentBlock> = match entry.get("content") {
            Some(Value::String(s)) => vec![ContentBlock::Text(s.clone())],
            Some(Value::Array(parts)) => {
                let mut content = Vec::new();
                for part in parts {
                    parts_seen += 1;
                    content.extend(blocks(part, parts_seen)?);
                }
                content
            }
            _ => return Err("message without content"),
        };
        let role = match entry.get("role").and_then(Value::as_str) {
            Some("system" | "developer") => {
                for block in content {
                    system.push(match block {
                        ContentBlock::Text(t) => SystemContentBlock::Text(t),
                        ContentBlock::CachePoint(c) => SystemContentBlock::CachePoint(c),
                        _ => return Err("a system message takes text only"),
                    });
                }
                continue;
            }
            Some("user") => ConversationRole::User,
            Some("assistant") => ConversationRole::Assistant,
            _ => return Err("message role must be system, user or assistant"),
        };
        let message = Message::builder()
            .role(role)
            .set_content(Some(content))
            .build()
            .map_err(|_| "message could not be built")?;
        messages.push(message);
    }
    Ok((system, messages))
}
