//! One conditional write per transition. Each condition names the expected state and, for an
//! owner, the expected epoch; the comments state the invariant each one keeps.

use aws_sdk_dynamodb::types::AttributeValue;

use super::DynamoLedger;
use super::item::{
    decode, encode_attempt, encode_blob, encode_decision, encode_error, encode_progress,
    encode_recovery, encode_usage, kept_if_absent, n, new_job_values, s,
};
use crate::job::{AttemptEntry, AttemptOutcome, JobItem, JobState, RecoveryRecord, ResultBody};
use crate::ledger::transitions::{apply_claim, apply_create, apply_settle, known_after_end};
use crate::ledger::{
    AttemptEnd, CancelRequest, ClaimRequest, CreateRequest, DecideRequest, EndRequest,
    EnqueuedRequest, JobLedger, KeptInput, LedgerError, RecordRefRequest, RecoverRequest,
    RenewRequest, SettleFrom, SettleRequest, Write,
};

/// Lists a job in the due index (appended to a `SET` clause): its key, the deadline's day, is
/// copied from `due_day`, which every item has; a listed job keeps its key.
const LIST_DUE: &str = ", #due = if_not_exists(#due, #dday)";

impl JobLedger for DynamoLedger {
    async fn claim(&self, req: ClaimRequest) -> Result<Write, LedgerError> {
        // First sight: the item is most likely absent, so create it claimed, whole. Only an
        // untouched item a producer created is then claimed in place, by the write below.
        if req.first_sight
            && let Some(claimed) = apply_claim(None, &req)
        {
            match self.put_new("claim", claimed).await? {
                Write::Refused(Some(there)) if apply_claim(Some(&there), &req).is_some() => {}
                written => return Ok(written),
            }
        }
        let job = &req.job;
        // Invariant: epoch and attempts rise together with the attempt record, before any
        // provider call; the values are the expected ones plus one, so a stale expectation is
        // refused rather than applied twice.
        let mut update = String::from(
            "SET #state = :running, #epoch = :new_epoch, #attempts = :new_attempts, \
             #owner = :owner, #until = :until, #updated = :now, \
             #log = list_append(if_not_exists(#log, :empty), :attempt), \
             #digest = if_not_exists(#digest, :digest), \
             #contract = if_not_exists(#contract, :contract), \
             #deadline = if_not_exists(#deadline, :deadline), #dday = if_not_exists(#dday, :due), \
             #max = if_not_exists(#max, :max), \
             #created = if_not_exists(#created, :now), #ttl = if_not_exists(#ttl, :ttl)",
        );
        // Listed unless a first claim whose message SQS keeps (`ClaimRequest::list_due`).
        if req.list_due || req.expect.epoch > 0 {
            update.push_str(", #due = if_not_exists(#due, :due)");
        }
        // The input is kept from the second claim on, where SQS may drop the message
        // (`JobItem::keeps_input`).
        let keeps_input = req.expect.epoch > 0 && req.list_due && !job.input.is_empty();
        update.push_str(&kept_if_absent(job, keeps_input));
        let claimable = "(#state IN (:ready, :retry) AND #epoch = :epoch AND #attempts = :attempts \
             AND #digest = :digest AND #attempts < #max AND #deadline > :now)";
        let condition = if req.expect.allows_absent() {
            format!("attribute_not_exists(#id) OR {claimable}")
        } else {
            claimable.to_owned()
        };
        let attempt = AttemptEntry::claimed(
            req.expect.attempts + 1,
            req.expect.epoch + 1,
            &req.owner_id,
            req.now,
            req.provider_ref.clone(),
        )
        .routed(req.route.clone());
        let mut values = new_job_values(job);
        values.extend([
            (":running", s(JobState::Running.as_str())),
            (":ready", s(JobState::Ready.as_str())),
            (":retry", s(JobState::RetryAuthorized.as_str())),
            (":epoch", n(req.expect.epoch)),
            (":attempts", n(req.expect.attempts)),
            (":new_epoch", n(req.expect.epoch + 1)),
            (":new_attempts", n(req.expect.attempts + 1)),
            (":owner", s(&req.owner_id)),
            (":until", n(req.lease_until)),
            (":now", n(req.now)),
            (":empty", AttributeValue::L(Vec::new())),
            (
                ":attempt",
                AttributeValue::L(vec![encode_attempt(&attempt)]),
            ),
        ]);
        self.update(
            "claim",
            &job.job_id,
            &update,
            &condition,
            values,
            // Watched past the first claim where it keeps its input (`list_due`).
            Some((JobState::Running, req.expect.epoch > 0 && req.list_due)),
        )
        .await
    }

    async fn end(&self, req: EndRequest) -> Result<Write, LedgerError> {
        self.end_to(&req, None).await
    }

    async fn end_known(&self, known: &JobItem, req: EndRequest) -> Result<Write, LedgerError> {
        // An accepted answer leaves a record its owner can build: the item (input and answer
        // included) need not come back.
        self.end_to(&req, known_after_end(known, &req)).await
    }

    async fn settle(&self, req: SettleRequest) -> Result<Write, LedgerError> {
        let mut values = vec![
            (":to", s(req.reason.target().as_str())),
            (":now", n(req.now)),
            (":err", encode_error(&req.error())),
        ];
        let (update, condition) = match &req.from {
            SettleFrom::Absent(_) => {
                // Invariant: a job that arrives after its deadline is recorded terminal, once.
                return match apply_settle(None, &req) {
                    Some(settled) => self.put_new("settle", settled).await,
                    None => Ok(Write::Refused(None)),
                };
            }
            SettleFrom::PastDeadline => {
                // Invariant: past its deadline no job may run or accept, so whoever owns it is
                // fenced by the state change; a terminal item is never rewritten.
                values.extend([
                    (":ready", s(JobState::Ready.as_str())),
                    (":running", s(JobState::Running.as_str())),
                    (":unknown", s(JobState::Unknown.as_str())),
                    (":retry", s(JobState::RetryAuthorized.as_str())),
                ]);
                (
                    "SET #state = :to, #updated = :now, #err = :err".to_owned() + LIST_DUE,
                    "#deadline <= :now AND #state IN (:ready, :running, :unknown, :retry)"
                        .to_owned(),
                )
            }
            SettleFrom::Seen { state, epoch } => {
                // Invariant: the writer saw this state at this epoch; anything newer wins, and a
                // terminal item is never rewritten.
                values.extend([
                    (":from", s(state.as_str())),
                    (":epoch", n(*epoch)),
                    (":ready", s(JobState::Ready.as_str())),
                    (":running", s(JobState::Running.as_str())),
                    (":unknown", s(JobState::Unknown.as_str())),
                    (":retry", s(JobState::RetryAuthorized.as_str())),
                ]);
                (
                    "SET #state = :to, #updated = :now, #err = :err".to_owned() + LIST_DUE,
                    "#state = :from AND #epoch = :epoch \
                     AND #state IN (:ready, :running, :unknown, :retry)"
                        .to_owned(),
                )
            }
        };
        let target = Some((req.reason.target(), false));
        self.update("settle", &req.job_id, &update, &condition, values, target)
            .await
    }

    async fn recover(&self, req: RecoverRequest) -> Result<Write, LedgerError> {
        let recovery = RecoveryRecord {
            epoch: req.seen_epoch + 1,
            owner_id: req.owner_id.clone(),
            at: req.now,
            reason: req.reason.clone(),
        };
        // Invariant: a lapsed owner (or an unknown job) is fenced by raising the epoch it holds;
        // no attempt starts.
        // The first recoveries are listed, the rest counted (the list cannot grow the item
        // without bound); the recoverer knows which, from the item its expected epoch pins.
        let full = req.seen_recoveries >= crate::job::RECOVERIES_KEPT;
        // (The SET clause comes last: the index key is appended to it.)
        let update = if full {
            "ADD #rdrop :one SET #state = :running, #epoch = :new_epoch, #owner = :owner, \
             #until = :until, #updated = :now"
        } else {
            "SET #state = :running, #epoch = :new_epoch, #owner = :owner, \
             #until = :until, #updated = :now, \
             #rec = list_append(if_not_exists(#rec, :empty), :recovery)"
        };
        let condition = "#epoch = :epoch AND \
                         ((#state = :running AND #until <= :cutoff) OR #state = :unknown)";
        let mut values = vec![
            (":new_epoch", n(req.seen_epoch + 1)),
            (":epoch", n(req.seen_epoch)),
            (":owner", s(&req.owner_id)),
            (":until", n(req.lease_until)),
            (":now", n(req.now)),
            (":cutoff", n(req.lapsed_before)),
            (":running", s(JobState::Running.as_str())),
            (":unknown", s(JobState::Unknown.as_str())),
        ];
        if full {
            values.push((":one", n(1)));
        } else {
            values.push((":empty", AttributeValue::L(Vec::new())));
            values.push((
                ":recovery",
                AttributeValue::L(vec![encode_recovery(&recovery)]),
            ));
        }
        let (update, values) = kept_input(req.input.as_ref(), update.to_owned() + LIST_DUE, values);
        let target = Some((JobState::Running, req.input.is_some()));
        self.update("recover", &req.job_id, &update, condition, values, target)
            .await
    }

    async fn renew(&self, req: RenewRequest) -> Result<Write, LedgerError> {
        // Invariant: only the current owner moves its lease, and a renewal only extends the
        // lease it knows (never one its own hand-over ended).
        let mut update = String::from("SET #until = :until, #updated = :now");
        let mut condition = String::from("#state = :running AND #epoch = :epoch");
        let mut values = vec![
            (":until", n(req.lease_until)),
            (":now", n(req.now)),
            (":running", s(JobState::Running.as_str())),
            (":epoch", n(req.epoch)),
        ];
        // What the owner says of its call rides on the write it makes anyway.
        if let Some(progress) = &req.progress {
            update.push_str(", #progress = :progress");
            values.push((":progress", encode_progress(progress)));
        }
        // A heartbeat's renewal is refused by a cancel request, which its owner then sees.
        if let Some(expected) = req.expected_until {
            condition.push_str(" AND #until = :expected_until AND attribute_not_exists(#cancel)");
            values.push((":expected_until", n(expected)));
        }
        self.update("renew", &req.job_id, &update, &condition, values, None)
            .await
    }

    async fn create(&self, req: CreateRequest) -> Result<Write, LedgerError> {
        // Invariant: a job is created once; its input, digest, deadline and budget never change.
        match apply_create(None, &req) {
            Some(created) => self.put_new("create", created).await,
            None => Ok(Write::Refused(None)),
        }
    }

    async fn mark_enqueued(&self, req: EnqueuedRequest) -> Result<Write, LedgerError> {
        let values = vec![
            (":now", n(req.now)),
            (":ready", s(JobState::Ready.as_str())),
            (":retry", s(JobState::RetryAuthorized.as_str())),
            (":running", s(JobState::Running.as_str())),
            (":unknown", s(JobState::Unknown.as_str())),
        ];
        let condition = "#state IN (:ready, :retry, :running, :unknown)";
        self.update(
            "mark_enqueued",
            &req.job_id,
            "SET #enq = :now",
            condition,
            values,
            None,
        )
        .await
    }

    async fn record_ref(&self, req: RecordRefRequest) -> Result<Write, LedgerError> {
        // Invariant: only the owner at the current epoch attaches a reference to its attempt.
        let index = req.attempt.saturating_sub(1);
        let update = format!("SET #log[{index}].#ref = :ref, #updated = :now");
        let condition = "#state = :running AND #epoch = :epoch AND #attempts = :attempt";
        let values = vec![
            (":ref", s(&req.provider_ref)),
            (":now", n(req.now)),
            (":running", s(JobState::Running.as_str())),
            (":epoch", n(req.epoch)),
            (":attempt", n(req.attempt)),
        ];
        let (update, values) = kept_input(req.input.as_ref(), update, values);
        self.update("record_ref", &req.job_id, &update, condition, values, None)
            .await
    }

    async fn decide(&self, req: DecideRequest) -> Result<Write, LedgerError> {
        // Invariant: an `unknown` job leaves that state only by a recorded decision, which
        // raises the epoch so nothing holding the old one can write again.
        let update = format!(
            "SET #state = :to, #epoch = :new_epoch, #owner = :by, #updated = :now, \
             #dec = list_append(if_not_exists(#dec, :empty), :decision){LIST_DUE}"
        );
        let condition = "#state = :unknown AND #epoch = :epoch";
        let values = vec![
            (":to", s(req.action.target().as_str())),
            (":new_epoch", n(req.epoch + 1)),
            (":by", s(&req.by)),
            (":now", n(req.now)),
            (":empty", AttributeValue::L(Vec::new())),
            (
                ":decision",
                AttributeValue::L(vec![encode_decision(&req.decision())]),
            ),
            (":unknown", s(JobState::Unknown.as_str())),
            (":epoch", n(req.epoch)),
        ];
        let to = req.action.target();
        let target = Some((to, !to.is_terminal()));
        self.update("decide", &req.job_id, &update, condition, values, target)
            .await
    }

    async fn cancel(&self, req: CancelRequest) -> Result<Write, LedgerError> {
        let mut values = vec![
            (":now", n(req.now)),
            (":seen", s(req.seen.as_str())),
            (":epoch", n(req.epoch)),
            (":empty", AttributeValue::L(Vec::new())),
            (
                ":decision",
                AttributeValue::L(vec![encode_decision(&req.decision())]),
            ),
        ];
        let decision = "#dec = list_append(if_not_exists(#dec, :empty), :decision)";
        if !req.immediate() {
            // Invariant: a running job's cancel is a request its owner carries out; the epoch
            // and lease stay the owner's, and a second request changes nothing.
            values.push((":running", s(JobState::Running.as_str())));
            let update = format!("SET #cancel = :now, #updated = :now, {decision}{LIST_DUE}");
            let condition =
                "#state = :running AND #epoch = :epoch AND attribute_not_exists(#cancel)";
            return self
                .update("cancel", &req.job_id, &update, condition, values, None)
                .await;
        }
        // Invariant: a job nobody runs ends at once, fencing anything that holds its epoch; a
        // terminal item is never rewritten (`:seen` is never a terminal state).
        values.extend([
            (":to", s(JobState::Cancelled.as_str())),
            (":new_epoch", n(req.epoch + 1)),
            (":by", s(&req.by)),
            (":err", encode_error(&req.error())),
            (":ready", s(JobState::Ready.as_str())),
            (":retry", s(JobState::RetryAuthorized.as_str())),
            (":unknown", s(JobState::Unknown.as_str())),
        ]);
        let update = format!(
            "SET #state = :to, #epoch = :new_epoch, #owner = :by, #updated = :now, \
             #err = :err, {decision}{LIST_DUE}"
        );
        let condition =
            "#state = :seen AND #epoch = :epoch AND #state IN (:ready, :retry, :unknown)";
        let target = Some((JobState::Cancelled, false));
        self.update("cancel", &req.job_id, &update, condition, values, target)
            .await
    }

    async fn get(&self, job_id: &str) -> Result<Option<JobItem>, LedgerError> {
        let item = self.get_item("get", job_id, true).await?;
        item.as_ref().map(decode).transpose()
    }

    async fn note_batch(
        &self,
        batch_id: &str,
        counts: crate::job::BatchCounts,
        now: crate::job::Millis,
    ) -> Result<(), LedgerError> {
        self.put_batch_note(batch_id, counts, now).await
    }

    async fn note_batch_members(
        &self,
        batch_id: &str,
        members: &[crate::job::BatchMember],
        now: crate::job::Millis,
    ) -> Result<(), LedgerError> {
        self.put_batch_members(batch_id, members, now).await
    }
}

/// An end's update (its `SET` clause last) keeping the job's input, when it carries one for a
/// job it leaves live.
fn keep_input(
    req: &EndRequest,
    update: String,
    values: Vec<(&'static str, AttributeValue)>,
) -> (String, Vec<(&'static str, AttributeValue)>) {
    let input = req
        .input
        .as_ref()
        .filter(|_| !req.end.target().is_terminal());
    kept_input(input, update, values)
}

/// An update (its `SET` clause last) keeping `input`, unless the item keeps one already.
fn kept_input(
    input: Option<&KeptInput>,
    mut update: String,
    mut values: Vec<(&'static str, AttributeValue)>,
) -> (String, Vec<(&'static str, AttributeValue)>) {
    match input {
        Some(KeptInput::Inline(input)) => {
            update.push_str(", #input = if_not_exists(#input, :input)");
            values.push((":input", s(input)));
        }
        Some(KeptInput::Stored(blob)) => {
            update.push_str(", #inref = if_not_exists(#inref, :inref)");
            values.push((":inref", encode_blob(blob)));
        }
        None => {}
    }
    (update, values)
}

impl DynamoLedger {
    /// An end of attempt; when the record it leaves is known (`rebuilt`), nothing comes back.
    async fn end_to(
        &self,
        req: &EndRequest,
        rebuilt: Option<JobItem>,
    ) -> Result<Write, LedgerError> {
        let (update, condition, values) = end_write(req);
        let to = req.end.target();
        // Watched while it keeps its input (the end carries it) or waits for a decision.
        let watched = !to.is_terminal() && (req.input.is_some() || to == JobState::Unknown);
        let target = Some((to, watched));
        self.update_to(
            "end",
            &req.job_id,
            &update,
            &condition,
            values,
            target,
            rebuilt,
        )
        .await
    }
}

/// An update expression, its condition and its values.
type UpdateParts = (String, String, Vec<(&'static str, AttributeValue)>);

/// The update, condition and values of an end of attempt: a give-back moves the attempt's log
/// entry ([`give_back_write`]); any other end records it.
fn end_write(req: &EndRequest) -> UpdateParts {
    let index = req.attempt.saturating_sub(1);
    if let (
        AttemptEnd::GivenBack {
            why, given_back, ..
        },
        Some(error),
    ) = (&req.end, req.end.error(req.now))
    {
        return give_back_write(req, *why, given_back, &error);
    }
    let mut update = format!(
        "SET #state = :to, #updated = :now, #log[{index}].#outcome = :outcome, \
         #log[{index}].#finished = :now"
    );
    // Invariant: only the owner at the current epoch, still running, ends its attempt; a
    // result is accepted only before the deadline.
    // The attempt ended is the current one, so its entry in the log exists.
    let mut condition =
        String::from("#state = :running AND #epoch = :epoch AND #attempts = :attempt");
    let mut values = vec![
        (":to", s(req.end.target().as_str())),
        (":now", n(req.now)),
        (":outcome", s(req.end.attempt_outcome().as_str())),
        (":running", s(JobState::Running.as_str())),
        (":epoch", n(req.epoch)),
        (":attempt", n(req.attempt)),
    ];
    record_answer(req, &mut update, &mut values);
    if matches!(req.end, AttemptEnd::Succeeded { .. }) {
        condition.push_str(" AND #deadline > :now");
    }
    // A cancel request leaves the owner two ends: cancelled, or expired.
    if matches!(req.end, AttemptEnd::Cancelled) {
        condition.push_str(" AND attribute_exists(#cancel)");
    } else if !req.end.allowed_after_cancel() {
        condition.push_str(" AND attribute_not_exists(#cancel)");
    }
    if let Some(error) = req.end.error(req.now) {
        update.push_str(", #err = :err");
        values.push((":err", encode_error(&error)));
    }
    // Only the acceptance of a first claim leaves a job out of the due index as it is.
    if !(matches!(req.end, AttemptEnd::Succeeded { .. }) && req.epoch <= 1) {
        update.push_str(LIST_DUE);
    }
    let (mut update, mut values) = keep_input(req, update, values);
    if let Some(decision) = req.decision() {
        update.push_str(", #dec = list_append(if_not_exists(#dec, :empty), :decision)");
        values.push((":empty", AttributeValue::L(Vec::new())));
        values.push((
            ":decision",
            AttributeValue::L(vec![encode_decision(&decision)]),
        ));
    }
    (update, condition, values)
}

/// The write of an attempt given back (`why`: throttled or not sent), with the attempts given
/// back before it (`given_back`) and the `error` it records.
fn give_back_write(
    req: &EndRequest,
    why: AttemptOutcome,
    given_back: &[crate::job::AttemptEntry],
    error: &crate::job::ErrorRecord,
) -> UpdateParts {
    let index = req.attempt.saturating_sub(1);
    // Invariant: as any end of attempt, only the running owner at its epoch gives its
    // attempt back; the attempt's log entry (the last one) moves to `given_back`, which
    // the owner writes whole (nobody else writes it while the owner holds the epoch).
    let counter = if why == AttemptOutcome::Throttled {
        "#thr"
    } else {
        "#unsent"
    };
    let update = format!(
        "REMOVE #log[{index}] ADD {counter} :one \
         SET #state = :to, #updated = :now, #attempts = :prev, #err = :err, #gb = :gb{LIST_DUE}"
    );
    let condition = "#state = :running AND #epoch = :epoch AND #attempts = :attempt \
                     AND attribute_not_exists(#cancel)";
    let values = vec![
        (":to", s(req.end.target().as_str())),
        (":now", n(req.now)),
        (":one", n(1)),
        (":prev", n(index)),
        (":err", encode_error(error)),
        (
            ":gb",
            AttributeValue::L(given_back.iter().map(encode_attempt).collect()),
        ),
        (":running", s(JobState::Running.as_str())),
        (":epoch", n(req.epoch)),
        (":attempt", n(req.attempt)),
    ];
    let (update, values) = keep_input(req, update, values);
    (update, condition.to_owned(), values)
}

/// What an end records of the answer on its attempt: the answer (inline or by reference) or
/// the evidence of one its contract refused, the finish reason and the usage.
fn record_answer(
    req: &EndRequest,
    update: &mut String,
    values: &mut Vec<(&'static str, AttributeValue)>,
) {
    let index = req.attempt.saturating_sub(1);
    match &req.end {
        AttemptEnd::Succeeded {
            result: ResultBody::Inline(result),
            ..
        } => {
            update.push_str(", #result = :result");
            values.push((":result", s(result)));
        }
        AttemptEnd::Succeeded {
            result: ResultBody::Stored(blob),
            ..
        } => {
            update.push_str(", #rref = :rref");
            values.push((":rref", encode_blob(blob)));
        }
        AttemptEnd::Invalid { rejected, .. } => {
            // The evidence of an answer its contract refused, on its attempt.
            update.push_str(&format!(
                ", #log[{index}].#errors = :errors, #log[{index}].#excerpt = :excerpt"
            ));
            values.push((
                ":errors",
                AttributeValue::L(rejected.errors.iter().map(|e| s(e)).collect()),
            ));
            values.push((":excerpt", s(&rejected.excerpt)));
        }
        _ => {}
    }
    let finish = match &req.end {
        AttemptEnd::Succeeded { finish, .. } => Some(*finish),
        AttemptEnd::Invalid { rejected, .. } => Some(rejected.finish),
        _ => None,
    };
    if let Some(finish) = finish {
        update.push_str(&format!(", #log[{index}].#finish = :finish"));
        values.push((":finish", s(finish.as_str())));
    }
    if let Some(usage) = &req.usage {
        update.push_str(&format!(", #log[{index}].#usage = :usage"));
        values.push((":usage", encode_usage(usage)));
    }
}
