//! Test support, built only with the `test-support` feature (the tests, the examples and the fuzz
//! targets turn it on; the Lambda binaries never carry it): a local event source mapping for the
//! emulator, and a counter of the AWS requests a client sends.

pub mod event_source;
pub mod sdk_calls;
pub mod stream_source;
