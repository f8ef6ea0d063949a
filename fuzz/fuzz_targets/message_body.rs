//! Any bytes as a message body: a classified outcome, never a panic; a valid job keeps its
//! digest when its canonical form is parsed again.

#![no_main]

use fenced_jobs::job::Trigger;
use fenced_jobs::provider::parse_trigger;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    match parse_trigger(Some(&text)) {
        Err(e) => {
            // Errors name fields and rules, never values: bounded length.
            assert!(e.to_string().len() < 200, "error text too long");
        }
        Ok(Trigger::Ref(id)) => assert!(!id.is_empty() && id.len() <= 128),
        Ok(Trigger::Job(msg)) => {
            assert!(!msg.job_id.is_empty() && msg.job_id.len() <= 128);
            let again = serde_json::json!({
                "job_id": msg.job_id,
                "contract": msg.contract,
                "input": msg.input(),
            });
            match parse_trigger(Some(&again.to_string())) {
                Ok(Trigger::Job(m2)) => assert_eq!(m2.digest, msg.digest, "digest not stable"),
                other => panic!("a valid job did not parse again: {other:?}"),
            }
        }
    }
});
