//! Each conditional write of the ledger as a pure function: the item before (if any) and the
//! request in, the item after out, or `None` when the condition refuses the write. The
//! in-memory ledger applies them under its lock; the DynamoDB ledger uses them where it writes
//! a whole item (a fresh claim), so both keep one contract.

use super::{
    CancelRequest, ClaimRequest, CreateRequest, DecideRequest, EndRequest, EnqueuedRequest,
    RecordRefRequest, RecoverRequest, RenewRequest, SettleFrom, SettleRequest,
};
use crate::job::decision::Expect;
use crate::job::{AttemptEntry, AttemptOutcome, JobItem, JobState, RecoveryRecord};

/// Claim: see [`ClaimRequest`].
pub fn apply_claim(current: Option<&JobItem>, req: &ClaimRequest) -> Option<JobItem> {
    let allowed = match current {
        None => req.expect.allows_absent(),
        Some(r) => {
            r.state.is_claimable()
                && r.owner_epoch == req.expect.epoch
                && r.attempts == req.expect.attempts
                && r.input_digest == req.job.input_digest
                && r.attempts < r.max_attempts
                && r.deadline_at > req.now
        }
    };
    if !allowed {
        return None;
    }
    let first = req.expect.epoch == 0;
    let mut next = match current {
        Some(r) => r.clone(),
        None => req.job.clone().into_record(JobState::Ready, req.now),
    };
    // The input is kept from the second claim on, where SQS may drop the message (`list_due`):
    // the message stays in the queue until the job is terminal and carries it to every delivery
    // (see [`JobItem::keeps_input`]). As
    // DynamoDB's `if_not_exists`: an input, metadata and an input reference the item lacks are
    // taken from the message (the reference names the same content: its key is the digest).
    if current.is_none() && first {
        next.input.clear();
    }
    if !first && req.list_due && next.input.is_empty() && !req.job.input.is_empty() {
        next.input = req.job.input.clone();
    }
    if next.input_ref.is_none() {
        next.input_ref = req.job.input_ref.clone();
    }
    if next.metadata.is_none() {
        next.metadata = req.job.metadata.clone();
    }
    if next.class.tenant.is_none() {
        next.class.tenant = req.job.class.tenant.clone();
    }
    next.class.urgent |= req.job.class.urgent;
    if next.max_cost_micros.is_none() {
        next.max_cost_micros = req.job.max_cost_micros;
    }
    // Every claim but a first one whose message SQS keeps lists the job (a later claim's
    // item is listed already, by the write that made it claimable again).
    next.due_listed |= req.list_due || !first;
    // Watched past the first claim where it keeps its input (`list_due`).
    next.watched = !first && req.list_due;
    next.state = JobState::Running;
    next.owner_epoch = req.expect.epoch + 1;
    next.attempts = req.expect.attempts + 1;
    next.owner_id = Some(req.owner_id.clone());
    next.owner_until = Some(req.lease_until);
    next.updated_at = req.now;
    next.attempt_log.push(
        AttemptEntry::claimed(
            next.attempts,
            next.owner_epoch,
            &req.owner_id,
            req.now,
            req.provider_ref.clone(),
        )
        .routed(req.route.clone()),
    );
    Some(next)
}

/// End of attempt: see [`EndRequest`].
pub fn apply_end(current: Option<&JobItem>, req: &EndRequest) -> Option<JobItem> {
    let r = current?;
    let accepting = matches!(req.end, super::AttemptEnd::Succeeded { .. });
    let cancelled = matches!(req.end, super::AttemptEnd::Cancelled);
    if r.state != JobState::Running
        || r.owner_epoch != req.epoch
        || r.attempts != req.attempt
        || (accepting && r.deadline_at <= req.now)
        || (r.cancel_requested.is_some() && !req.end.allowed_after_cancel())
        || (cancelled && r.cancel_requested.is_none())
    {
        return None;
    }
    let mut next = r.clone();
    next.state = req.end.target();
    next.updated_at = req.now;
    // Only the acceptance of a first claim leaves a job out of the due index as it is.
    next.due_listed |= !(accepting && r.owner_epoch <= 1);
    // Watched while it keeps its input (the end carries it) or waits for a decision.
    next.watched =
        !next.state.is_terminal() && (req.input.is_some() || next.state == JobState::Unknown);
    if let super::AttemptEnd::GivenBack {
        why, given_back, ..
    } = &req.end
    {
        // Nothing ran: the attempt is given back, its entry kept apart, and counted.
        next.attempts = next.attempts.saturating_sub(1);
        next.attempt_log.truncate(next.attempts as usize);
        next.given_back.clone_from(given_back);
        if *why == AttemptOutcome::Throttled {
            next.throttles += 1;
        } else {
            next.not_sent += 1;
        }
    } else if let Some(attempt) = req
        .attempt
        .checked_sub(1)
        .and_then(|i| next.attempt_log.get_mut(i as usize))
    {
        attempt.outcome = req.end.attempt_outcome();
        attempt.finished_at = Some(req.now);
        attempt.usage = req.usage;
        match &req.end {
            super::AttemptEnd::Succeeded { finish, .. } => attempt.finish = Some(*finish),
            super::AttemptEnd::Invalid { rejected, .. } => {
                attempt.finish = Some(rejected.finish);
                attempt.errors.clone_from(&rejected.errors);
                attempt.excerpt = Some(rejected.excerpt.clone());
            }
            _ => {}
        }
    }
    if let super::AttemptEnd::Succeeded { result, .. } = &req.end {
        match result {
            crate::job::ResultBody::Inline(text) => next.result = Some(text.clone()),
            crate::job::ResultBody::Stored(blob) => next.result_ref = Some(blob.clone()),
        }
    }
    if let Some(error) = req.end.error(req.now) {
        next.last_error = Some(error);
    }
    next.decisions.extend(req.decision());
    if !next.state.is_terminal() {
        keep_input(&mut next, req.input.as_ref());
    }
    Some(next)
}

/// As DynamoDB's `if_not_exists`: the input a write carries, if the item keeps none.
fn keep_input(next: &mut JobItem, input: Option<&super::KeptInput>) {
    match input {
        Some(super::KeptInput::Inline(input)) if next.input.is_empty() => {
            next.input.clone_from(input);
        }
        Some(super::KeptInput::Stored(blob)) if next.input_ref.is_none() => {
            next.input_ref = Some((**blob).clone());
        }
        _ => {}
    }
}

/// The record an applied end leaves, as an owner holding `known` (the record its claim or
/// recovery returned) can build it without reading: only when the end accepts an answer (see
/// [`super::JobLedger::end_known`]).
pub fn known_after_end(known: &JobItem, req: &EndRequest) -> Option<JobItem> {
    match req.end {
        super::AttemptEnd::Succeeded { .. } => apply_end(Some(known), req),
        _ => None,
    }
}

/// Settle: see [`SettleRequest`].
pub fn apply_settle(current: Option<&JobItem>, req: &SettleRequest) -> Option<JobItem> {
    let mut next = match (&req.from, current) {
        (SettleFrom::Absent(job), None) => {
            job.as_ref().clone().into_record(JobState::Ready, req.now)
        }
        (SettleFrom::PastDeadline, Some(r))
            if !r.state.is_terminal() && r.deadline_at <= req.now =>
        {
            r.clone()
        }
        (SettleFrom::Seen { state, epoch }, Some(r))
            if !r.state.is_terminal() && r.state == *state && r.owner_epoch == *epoch =>
        {
            r.clone()
        }
        _ => return None,
    };
    next.state = req.reason.target();
    next.updated_at = req.now;
    next.last_error = Some(req.error());
    next.due_listed = true;
    next.watched = false;
    Some(next)
}

/// Recover: see [`RecoverRequest`].
pub fn apply_recover(current: Option<&JobItem>, req: &RecoverRequest) -> Option<JobItem> {
    let r = current?;
    // A missing lease is not a lapsed one (DynamoDB compares nothing with a missing attribute).
    let lapsed = r.state == JobState::Running
        && r.owner_until
            .is_some_and(|until| until <= req.lapsed_before);
    if r.owner_epoch != req.seen_epoch || !(lapsed || r.state == JobState::Unknown) {
        return None;
    }
    let mut next = r.clone();
    next.state = JobState::Running;
    next.owner_epoch += 1;
    next.owner_id = Some(req.owner_id.clone());
    next.owner_until = Some(req.lease_until);
    next.updated_at = req.now;
    next.due_listed = true;
    next.watched = req.input.is_some();
    if req.seen_recoveries >= crate::job::RECOVERIES_KEPT {
        next.recoveries_dropped += 1;
    } else {
        next.recoveries.push(RecoveryRecord {
            epoch: next.owner_epoch,
            owner_id: req.owner_id.clone(),
            at: req.now,
            reason: req.reason.clone(),
        });
    }
    keep_input(&mut next, req.input.as_ref());
    Some(next)
}

/// Renew: see [`RenewRequest`].
pub fn apply_renew(current: Option<&JobItem>, req: &RenewRequest) -> Option<JobItem> {
    let r = current?;
    if r.state != JobState::Running
        || r.owner_epoch != req.epoch
        || req
            .expected_until
            .is_some_and(|until| r.owner_until != Some(until) || r.cancel_requested.is_some())
    {
        return None;
    }
    let mut next = r.clone();
    next.owner_until = Some(req.lease_until);
    next.updated_at = req.now;
    if req.progress.is_some() {
        next.call_progress = req.progress;
    }
    Some(next)
}

/// Create: see [`CreateRequest`].
pub fn apply_create(current: Option<&JobItem>, req: &CreateRequest) -> Option<JobItem> {
    match current {
        Some(_) => None,
        None => {
            let mut created = req.job.clone().into_record(JobState::Ready, req.now);
            created.enqueued_at = req.enqueued.then_some(req.now);
            created.due_listed = true;
            created.watched = true;
            Some(created)
        }
    }
}

/// Mark enqueued: see [`EnqueuedRequest`].
pub(crate) fn apply_mark_enqueued(
    current: Option<&JobItem>,
    req: &EnqueuedRequest,
) -> Option<JobItem> {
    let r = current?;
    if !(r.state.is_claimable() || matches!(r.state, JobState::Running | JobState::Unknown)) {
        return None;
    }
    let mut next = r.clone();
    next.enqueued_at = Some(req.now);
    Some(next)
}

/// Record a reference: see [`RecordRefRequest`].
pub fn apply_record_ref(current: Option<&JobItem>, req: &RecordRefRequest) -> Option<JobItem> {
    let r = current?;
    if r.state != JobState::Running || r.owner_epoch != req.epoch || r.attempts != req.attempt {
        return None;
    }
    let mut next = r.clone();
    let attempt = next
        .attempt_log
        .get_mut(req.attempt.checked_sub(1)? as usize)?;
    attempt.provider_ref = Some(req.provider_ref.clone());
    next.updated_at = req.now;
    keep_input(&mut next, req.input.as_ref());
    Some(next)
}

/// Decide: see [`DecideRequest`].
pub fn apply_decide(current: Option<&JobItem>, req: &DecideRequest) -> Option<JobItem> {
    let r = current?;
    if r.state != JobState::Unknown || r.owner_epoch != req.epoch {
        return None;
    }
    let mut next = r.clone();
    next.state = req.action.target();
    next.owner_epoch += 1;
    next.owner_id = Some(req.by.clone());
    next.updated_at = req.now;
    next.decisions.push(req.decision());
    next.due_listed = true;
    next.watched = !next.state.is_terminal();
    Some(next)
}

/// Cancel: see [`CancelRequest`].
pub fn apply_cancel(current: Option<&JobItem>, req: &CancelRequest) -> Option<JobItem> {
    let r = current?;
    if r.state.is_terminal()
        || r.state != req.seen
        || r.owner_epoch != req.epoch
        || r.cancel_requested.is_some()
    {
        return None;
    }
    let mut next = r.clone();
    next.updated_at = req.now;
    next.decisions.push(req.decision());
    next.due_listed = true;
    if req.immediate() {
        next.state = JobState::Cancelled;
        next.watched = false;
        next.owner_epoch += 1;
        next.owner_id = Some(req.by.clone());
        next.last_error = Some(req.error());
    } else {
        next.cancel_requested = Some(req.now);
    }
    Some(next)
}

/// Whether `seen` shows the cancel `req` applied (its answer lost): the same decision, last.
pub(crate) fn shows_cancel(seen: &JobItem, req: &CancelRequest) -> bool {
    seen.decisions.last() == Some(&req.decision())
}

/// Whether `seen` shows the claim of `owner_id`, made expecting `expect`, applied: how a claimant
/// recognises its own write whose answer was lost (the owner id is unique to each delivery).
pub(crate) fn shows_claim(seen: &JobItem, expect: Expect, owner_id: &str) -> bool {
    seen.state == JobState::Running
        && seen.owner_epoch == expect.epoch + 1
        && seen.owner_id.as_deref() == Some(owner_id)
}

/// Whether `seen` shows the recovery claim of `owner_id` from `seen_epoch` applied.
pub(crate) fn shows_recovery(seen: &JobItem, seen_epoch: u64, owner_id: &str) -> bool {
    seen.owner_epoch == seen_epoch + 1 && seen.owner_id.as_deref() == Some(owner_id)
}

/// Whether `seen` shows the owner at `epoch` ended its attempt in `target` (an end of attempt
/// keeps the epoch, and only that owner writes that state at that epoch).
pub(crate) fn shows_end(seen: &JobItem, epoch: u64, target: JobState) -> bool {
    seen.owner_epoch == epoch && seen.state == target
}
