//! The queue, both ways: the visibility of records that stay in it (the worker's heartbeat and
//! its final changes), the triggers sent to it (the producer, the reconciler and operator
//! decisions), the worker's own dead letters, and an operator's reading of a queue (the DLQ,
//! the dispatcher's failure queue). Traits here, SQS in [`sqs`] (the operator's reader in
//! [`reader`], apart from the worker's calls), recording fakes for tests beside each trait.

pub mod dead_letters;
pub mod reader;
pub mod sqs;
pub mod triggers;
pub mod visibility;

#[cfg(any(test, feature = "test-support"))]
pub use dead_letters::RecordingDeadLetters;
pub use dead_letters::{DeadLetter, DeadLetterQueue, JOB_ID_ATTRIBUTE};
#[cfg(any(test, feature = "test-support"))]
pub use reader::MemoryQueue;
pub use reader::{Message, QueueError, QueueReader, Received, SqsReader};
pub use sqs::{SqsDeadLetters, SqsTriggers, SqsVisibility};
#[cfg(any(test, feature = "test-support"))]
pub use triggers::RecordingTriggers;
pub use triggers::{IN_LEDGER_ATTRIBUTE, Outgoing, Sent, TriggerSender};
#[cfg(any(test, feature = "test-support"))]
pub use visibility::RecordingVisibility;
pub use visibility::{
    ChangeResult, ChangeResults, VisibilityChange, VisibilityControl, VisibilityReport,
};
