//! Amazon SQS Extended Client pointer bodies: a producer using the Extended Client libraries
//! (Java, Python) puts a large body in S3 and sends a pointer to it instead.

use serde_json::Value;

use super::InvalidMessage;

/// The class names an Amazon SQS Extended Client pointer body starts with (the payload
/// offloading library's, and the Java client's before it).
const POINTER_CLASSES: [&str; 2] = [
    "software.amazon.payloadoffloading.PayloadS3Pointer",
    "com.amazon.sqs.javamessaging.MessageS3Pointer",
];
/// Where an Amazon SQS Extended Client pointer body says its payload is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PayloadPointer {
    /// S3 bucket.
    pub bucket: String,
    /// Object key.
    pub key: String,
}

/// The message attribute a pointer's producer may name its job in (the worker's dead letters
/// carry it too): a pointer whose payload is gone then stands for that job.
pub(crate) const NAMED_JOB_ATTRIBUTE: &str = "fenced-jobs.job-id";

/// The job a pointer's message names in [`NAMED_JOB_ATTRIBUTE`], as a bare reference, when the
/// value is a valid job id.
pub(crate) fn named_job(value: Option<&str>) -> Option<super::Trigger> {
    let body = serde_json::json!({ "job_id": value? }).to_string();
    match super::parse_trigger(Some(&body)) {
        Ok(trigger @ super::Trigger::Ref(_)) => Some(trigger),
        _ => None,
    }
}

/// Reads `body` as an Extended Client pointer (`["<class>", {"s3BucketName": ..,
/// "s3Key": ..}]`): `None` when it is not one, an error when it has the pointer's class but not
/// its shape.
pub fn parse_pointer(body: &str) -> Option<Result<PayloadPointer, InvalidMessage>> {
    // A pointer is short and is a JSON array: anything else is left to the job parser.
    if body.len() > 4_096 || !body.trim_start().starts_with('[') {
        return None;
    }
    let Ok(Value::Array(parts)) = serde_json::from_str::<Value>(body) else {
        return None;
    };
    let class = parts.first()?.as_str()?;
    if !POINTER_CLASSES.contains(&class) {
        return None;
    }
    let shape = || InvalidMessage::Invalid {
        field: "pointer",
        rule: "must be [class, {\"s3BucketName\": string, \"s3Key\": string}]",
    };
    let fields = match parts.as_slice() {
        [_, Value::Object(fields)] => fields,
        _ => return Some(Err(shape())),
    };
    let text = |name: &str| {
        fields
            .get(name)
            .and_then(Value::as_str)
            .filter(|v| !v.is_empty() && v.len() <= 1_024)
            .map(str::to_owned)
    };
    Some(match (text("s3BucketName"), text("s3Key")) {
        (Some(bucket), Some(key)) => Ok(PayloadPointer { bucket, key }),
        _ => Err(shape()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_pointer_classes_are_read_and_anything_else_is_left_alone() {
        for class in POINTER_CLASSES {
            let body = format!(r#"["{class}",{{"s3BucketName":"b","s3Key":"k/1"}}]"#);
            let pointer = parse_pointer(&body).expect("a pointer").expect("valid");
            assert_eq!(
                (pointer.bucket.as_str(), pointer.key.as_str()),
                ("b", "k/1")
            );
        }
        assert_eq!(parse_pointer(r#"{"job_id":"j"}"#), None);
        assert_eq!(
            parse_pointer(r#"["other.Class",{"s3BucketName":"b","s3Key":"k"}]"#),
            None
        );
        assert_eq!(parse_pointer("[1,2"), None);
    }

    #[test]
    fn a_pointer_of_the_wrong_shape_is_invalid() {
        let class = POINTER_CLASSES[0];
        for body in [
            format!(r#"["{class}"]"#),
            format!(r#"["{class}",{{"s3BucketName":"b"}}]"#),
            format!(r#"["{class}",{{"s3BucketName":"","s3Key":"k"}}]"#),
            format!(r#"["{class}",{{"s3BucketName":"b","s3Key":7}}]"#),
        ] {
            assert!(
                matches!(
                    parse_pointer(&body),
                    Some(Err(InvalidMessage::Invalid { .. }))
                ),
                "{body}"
            );
        }
    }
}
