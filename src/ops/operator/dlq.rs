//! The dead-letter queue as an operator reads it: each message judged against the ledger (what
//! a redrive would do with it), and the redrivable ones sent back to the work queue.

use crate::blobs::BlobStore;
use crate::job::scope::{Producers, Sender};
use crate::job::{Failure, InvalidMessage, JobItem, JobState, Trigger};
use crate::ledger::JobLedger;
use crate::queue::reader::RECEIVE_LIMIT;
use crate::queue::triggers::dedup_id;
use crate::queue::{Message, QueueReader};

use super::OperatorError;

/// What a redrive would do with one dead-lettered message, judged from its body and the ledger.
#[derive(Debug, Clone, PartialEq)]
pub enum DlqVerdict {
    /// The body is not a valid job: it would be poison again.
    Poison(String),
    /// Same job_id, other input: a conflict again.
    Conflict,
    /// The job is terminal: a redelivery would only be acknowledged.
    Terminal(JobState),
    /// The job is not terminal (or not in the ledger yet): a redrive gives it another delivery.
    Redrive(Option<JobState>),
    /// An Extended Client pointer whose payload cannot be read now (no access, the store
    /// unreachable): left in the DLQ, to be judged again.
    Unreadable(String),
}

impl DlqVerdict {
    /// A short label for tables.
    pub fn label(&self) -> String {
        match self {
            DlqVerdict::Poison(reason) => format!("poison ({reason})"),
            DlqVerdict::Conflict => "conflict".to_owned(),
            DlqVerdict::Terminal(state) => format!("terminal ({state}): nothing to redrive"),
            DlqVerdict::Redrive(Some(state)) => format!("redrive ({state})"),
            DlqVerdict::Redrive(None) => "redrive (not in the ledger)".to_owned(),
            DlqVerdict::Unreadable(why) => format!("unreadable ({why}): left in the DLQ"),
        }
    }
}

/// Judges a trigger against the ledger's item for its job; `refused`: the worker dead-lettered
/// the message as poison, with this detail (a job it refused at its first sight, such as one
/// due further away than it can carry, is refused again on a redrive while it has no item).
fn verdict_of(trigger: &Trigger, record: Option<&JobItem>, refused: Option<&str>) -> DlqVerdict {
    match (record, trigger) {
        (Some(r), Trigger::Job(msg)) if r.input_digest != msg.digest => DlqVerdict::Conflict,
        (Some(r), _) if r.state.is_terminal() => DlqVerdict::Terminal(r.state),
        (Some(r), _) => DlqVerdict::Redrive(Some(r.state)),
        (None, Trigger::Ref(_)) => DlqVerdict::Poison(InvalidMessage::UnknownJob.to_string()),
        (None, Trigger::Job(_)) => match refused {
            Some(detail) => DlqVerdict::Poison(detail.to_owned()),
            None => DlqVerdict::Redrive(None),
        },
    }
}

/// The trigger a dead-lettered body stands for, as the worker reads it: an Extended Client
/// pointer followed to its payload, and one whose payload is gone taken for the job its
/// message names (`fenced-jobs.job-id`).
async fn dead_trigger(
    blobs: Option<&dyn BlobStore>,
    body: &str,
    named: Option<&str>,
) -> Result<Trigger, DlqVerdict> {
    match crate::blobs::body::resolve_body(blobs, Some(body)).await {
        Ok(trigger) => Ok(trigger),
        Err(Failure::Poison(InvalidMessage::PayloadMissing)) => {
            crate::job::pointer::named_job(named)
                .ok_or_else(|| DlqVerdict::Poison(InvalidMessage::PayloadMissing.to_string()))
        }
        Err(Failure::Poison(invalid)) => Err(DlqVerdict::Poison(invalid.to_string())),
        Err(_) => Err(DlqVerdict::Unreadable(
            "the pointer's payload cannot be read now".to_owned(),
        )),
    }
}

/// The whole id of the job a dead letter's trigger names: a producer's body names its job by
/// its own id, the worker's letter (`named`) by its whole id.
fn whole_id(trigger: &Trigger, named: Option<&str>) -> String {
    named
        .filter(|whole| crate::job::scope::whole_id(trigger.job_id(), whole).is_some())
        .unwrap_or(trigger.job_id())
        .to_owned()
}

/// The attributes the worker adds to a dead letter: a redrive sends the others back.
const DEAD_LETTER_ATTRIBUTES: [&str; 3] = [
    crate::queue::dead_letters::REASON_ATTRIBUTE,
    crate::queue::dead_letters::DETAIL_ATTRIBUTE,
    crate::queue::dead_letters::SOURCE_ATTRIBUTE,
];

/// One dead-lettered message and its verdict.
#[derive(Clone)]
pub struct DlqEntry {
    /// The DLQ message id.
    pub message_id: Option<String>,
    /// The job id, when the body names one.
    pub job_id: Option<String>,
    /// What a redrive would do.
    pub verdict: DlqVerdict,
    body: String,
    /// The message's string attributes, the worker's own left out (a pointer's payload size,
    /// the job it names).
    attributes: Vec<(String, String)>,
    receipt_handle: String,
}

impl std::fmt::Debug for DlqEntry {
    // The body (a prompt, perhaps) and the receipt handle never reach a log.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DlqEntry")
            .field("message_id", &self.message_id)
            .field("job_id", &self.job_id)
            .field("verdict", &self.verdict)
            .finish_non_exhaustive()
    }
}

/// Reads up to `max` messages of the DLQ (each stays there, invisible for `hold_s` seconds; with
/// 0 it stays visible, and a message received twice is judged once) and judges each against the
/// ledger, an Extended Client pointer by its payload (read through `blobs`). Reading stops after
/// three receives in a row that bring nothing new (an empty one among them).
pub async fn dlq_inspect<L: JobLedger>(
    ledger: &L,
    blobs: Option<&dyn BlobStore>,
    producers: &Producers,
    queue: &impl QueueReader,
    dlq_url: &str,
    max: usize,
    hold_s: i32,
) -> Result<Vec<DlqEntry>, OperatorError> {
    let mut entries: Vec<DlqEntry> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let mut quiet_rounds = 0;
    while entries.len() < max && quiet_rounds < 3 {
        let received = queue
            .receive(dlq_url, (max - entries.len()).min(RECEIVE_LIMIT), hold_s)
            .await?;
        // SQS samples its servers on a short receive: an empty one is a quiet round, not the
        // end of the queue.
        if received.is_empty() {
            quiet_rounds += 1;
            continue;
        }
        let before = entries.len();
        for m in received {
            // A message read twice (a visibility of 0) is judged once; one without an id (SQS
            // always gives one) is never taken for another.
            let repeated = m
                .message_id
                .as_ref()
                .is_some_and(|id| !seen.insert(id.clone()));
            if repeated || entries.len() == max {
                continue;
            }
            let letter = judge_letter(ledger, blobs, producers, &m).await?;
            entries.push(DlqEntry::of(m, letter));
        }
        quiet_rounds = if entries.len() == before {
            quiet_rounds + 1
        } else {
            0
        };
    }
    Ok(entries)
}

/// A dead letter as jobctl judges it: its job's whole id, the verdict, and the attributes a
/// redrive sends it with.
pub(super) struct Judged {
    pub(super) job_id: Option<String>,
    pub(super) verdict: DlqVerdict,
    /// The job's deadline, when the ledger holds it.
    pub(super) deadline_at: Option<crate::job::Millis>,
    pub(super) attributes: Vec<(String, String)>,
}

impl Judged {
    /// A letter whose job could not be read: it stays in the DLQ.
    fn unread(verdict: DlqVerdict) -> Judged {
        Judged {
            job_id: None,
            verdict,
            deadline_at: None,
            attributes: Vec::new(),
        }
    }
}

/// Judges one dead letter. A letter whose sender (`SenderId`) is one of `producers` is that
/// producer's own message, moved by the redrive policy ([`judge_senders_letter`]). A letter from
/// one of the trusted senders (`TRUSTED_SENDERS`: the worker's role, the reconciler's, the
/// operators') is the worker's and is believed. Any other letter is a stranger's: with
/// producers kept apart it is poison, and without them it is judged as the one producer's own
/// message, whatever its `fenced-jobs.*` attributes say.
pub(super) async fn judge_letter<L: JobLedger>(
    ledger: &L,
    blobs: Option<&dyn BlobStore>,
    producers: &Producers,
    m: &crate::queue::reader::Received,
) -> Result<Judged, OperatorError> {
    use crate::queue::dead_letters::{DETAIL_ATTRIBUTE, REASON_ATTRIBUTE};
    if let Ok(sender @ Sender::Producer(_)) = producers.sender(m.sender_id.as_deref()) {
        return judge_senders_letter(ledger, blobs, producers, sender, m).await;
    }
    let named = attribute(m, crate::job::pointer::NAMED_JOB_ATTRIBUTE);
    if !producers.scoped() && named.is_some_and(|n| n.contains('/')) {
        return Ok(Judged::unread(DlqVerdict::Unreadable(
            "names a producer's job: give jobctl the deployment's PRODUCERS, so that it can \
             tell the worker's letters from a producer's"
                .to_owned(),
        )));
    }
    if !producers.trusts(m.sender_id.as_deref()) {
        if producers.scoped() {
            return Ok(Judged::unread(DlqVerdict::Poison(
                "sent by neither the worker, a trusted sender (TRUSTED_SENDERS) nor a producer"
                    .to_owned(),
            )));
        }
        return judge_senders_letter(ledger, blobs, producers, Sender::Anyone, m).await;
    }
    let own = |name: &str| attribute(m, name);
    let named = own(crate::job::pointer::NAMED_JOB_ATTRIBUTE);
    let refused = own(REASON_ATTRIBUTE)
        .filter(|reason| *reason == "poison")
        .map(|_| own(DETAIL_ATTRIBUTE).unwrap_or_default());
    let trigger = dead_trigger(blobs, &m.body, named).await;
    let job_id = trigger.as_ref().ok().map(|t| whole_id(t, named));
    let record = match &job_id {
        Some(id) => ledger.get(id).await?,
        None => None,
    };
    let verdict = match &trigger {
        Ok(trigger) => verdict_of(trigger, record.as_ref(), refused),
        Err(verdict) => verdict.clone(),
    };
    let attributes = m
        .attributes
        .iter()
        .filter(|(name, _)| !DEAD_LETTER_ATTRIBUTES.contains(&name.as_str()))
        .cloned()
        .collect();
    Ok(Judged {
        deadline_at: record.map(|r| r.deadline_at),
        job_id,
        verdict,
        attributes,
    })
}

/// Judges a letter `sender` sent (a producer, or the one producer when none are named), moved
/// to the DLQ by the redrive policy: what it says in attributes named like the worker's is not
/// believed (a producer could name another's job there), its job is in the producer's
/// namespace, a pointer must be under the producer's prefix, and the redrive names the job by
/// its whole id.
async fn judge_senders_letter<L: JobLedger>(
    ledger: &L,
    blobs: Option<&dyn BlobStore>,
    producers: &Producers,
    sender: Sender<'_>,
    m: &crate::queue::reader::Received,
) -> Result<Judged, OperatorError> {
    use crate::job::pointer::NAMED_JOB_ATTRIBUTE;
    use crate::queue::dead_letters::OWN_ATTRIBUTE_PREFIX;
    let poison = |invalid: InvalidMessage| Judged::unread(DlqVerdict::Poison(invalid.to_string()));
    if let Some(Ok(pointer)) = crate::job::message::parse_pointer(&m.body)
        && !producers.may_read(sender, &pointer.key, None)
    {
        return Ok(poison(InvalidMessage::NotAllowed {
            field: "s3Key".to_owned(),
            rule: "outside the producer's prefix (PRODUCERS), or a key the worker keeps its own under",
        }));
    }
    // A pointer's producer may name its own job (its own id) in the attribute.
    let trigger = match dead_trigger(blobs, &m.body, attribute(m, NAMED_JOB_ATTRIBUTE)).await {
        Ok(trigger) => trigger,
        Err(verdict) => return Ok(Judged::unread(verdict)),
    };
    let whole = match producers.job_id(sender, trigger.job_id(), None) {
        Ok(whole) => whole,
        Err(invalid) => return Ok(poison(invalid)),
    };
    let record = ledger.get(&whole).await?;
    let mut attributes: Vec<(String, String)> = m
        .attributes
        .iter()
        .filter(|(name, _)| !name.starts_with(OWN_ATTRIBUTE_PREFIX))
        .cloned()
        .collect();
    attributes.push((NAMED_JOB_ATTRIBUTE.to_owned(), whole.clone()));
    Ok(Judged {
        verdict: verdict_of(&trigger, record.as_ref(), None),
        deadline_at: record.map(|r| r.deadline_at),
        job_id: Some(whole),
        attributes,
    })
}

/// The value of a received message's string attribute `name`.
pub(super) fn attribute<'m>(m: &'m crate::queue::reader::Received, name: &str) -> Option<&'m str> {
    m.attributes
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

/// Sends the redrivable entries back to the work queue, then deletes them from the DLQ; the
/// others stay in the DLQ. Returns how many were moved.
pub async fn dlq_redrive(
    queue: &impl QueueReader,
    dlq_url: &str,
    queue_url: &str,
    entries: &[DlqEntry],
) -> Result<usize, OperatorError> {
    let mut moved = 0;
    for entry in entries
        .iter()
        .filter(|e| matches!(e.verdict, DlqVerdict::Redrive(_)))
    {
        send_back(queue, (dlq_url, queue_url), entry).await?;
        moved += 1;
    }
    Ok(moved)
}

/// Sends one letter back to the work queue with its attributes, then deletes it from the DLQ.
pub(super) async fn send_back(
    queue: &impl QueueReader,
    (dlq_url, queue_url): (&str, &str),
    entry: &DlqEntry,
) -> Result<(), OperatorError> {
    // The producer's FIFO policy: each job its own group; a redrive of this dead letter is
    // deduplicated by its message id.
    let group = entry.job_id.as_deref().unwrap_or("unnamed");
    let suffix = format!("redrive-{}", entry.message_id.as_deref().unwrap_or(""));
    let dedup = dedup_id(group, &suffix);
    let message = Message {
        body: &entry.body,
        attributes: &entry.attributes,
        fifo: queue_url
            .ends_with(".fifo")
            .then_some((group, dedup.as_str())),
    };
    queue.send(queue_url, message).await?;
    queue.delete(dlq_url, &entry.receipt_handle).await?;
    Ok(())
}

impl DlqEntry {
    /// A letter received as `m`, as `judged`.
    pub(super) fn of(m: crate::queue::reader::Received, judged: Judged) -> DlqEntry {
        DlqEntry {
            message_id: m.message_id,
            job_id: judged.job_id,
            verdict: judged.verdict,
            body: m.body,
            attributes: judged.attributes,
            receipt_handle: m.receipt_handle,
        }
    }
}
