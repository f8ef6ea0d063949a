//! The queue, both ways: the visibility of records that stay in it (the worker's heartbeat and
//! its final changes) and the triggers sent to it (the producer, the reconciler and operator
//! decisions). Traits here, SQS in [`sqs`], recording fakes for tests beside each trait.

pub mod sqs;
pub mod triggers;
pub mod visibility;

pub use sqs::{SqsTriggers, SqsVisibility};
#[cfg(any(test, feature = "test-support"))]
pub use triggers::RecordingTriggers;
pub use triggers::{Outgoing, Sent, TriggerSender};
#[cfg(any(test, feature = "test-support"))]
pub use visibility::RecordingVisibility;
pub use visibility::{
    ChangeResult, ChangeResults, VisibilityChange, VisibilityControl, VisibilityReport, fingerprint,
};
