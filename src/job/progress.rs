//! What a running call shows of itself: the bytes it streamed, its batch's request counts.

/// What an owner last said of its running call, carried by the writes it makes anyway (the
/// heartbeat's renewals, a hand-over): nothing is written for it alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct CallProgress {
    /// The epoch of the owner that said it: a later claim's call has its own.
    pub epoch: u64,
    /// Bytes of the answer streamed so far.
    pub streamed_bytes: u64,
}

/// A provider batch's request counts, as a look at the running batch last read them (kept on
/// the batch's own item, not on each job's): OpenAI's `request_counts` (`total`, `completed`,
/// `failed`) and Anthropic's `request_counts` (`processing`, `succeeded`, `errored`, `canceled`,
/// `expired`), in one form.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct BatchCounts {
    /// Requests in the batch.
    pub total: u64,
    /// Requests answered.
    pub completed: u64,
    /// Requests that failed (errored, cancelled or expired).
    pub failed: u64,
}

/// One job with a line in a provider batch, as the batch's list of its jobs keeps it: enough
/// to send the job's trigger by id to its queue and message group when the batch ends.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct BatchMember {
    /// The job.
    pub job_id: String,
    /// Its tenant and priority: its trigger's message group and queue.
    pub class: super::JobClass,
}
