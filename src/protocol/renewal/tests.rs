use super::*;
use crate::job::{JobItem, NewJob};

const NOW: Millis = 1_000_000;
const PAUSE_MS: Millis = 100;
const TICKS: RenewalTicks = RenewalTicks {
    now: NOW,
    skew_ms: 2_000,
    heartbeat_ms: 10_000,
    first_pause_ms: PAUSE_MS,
};

fn running(epoch: u64, until: Millis) -> JobItem {
    let mut r = NewJob::example("j", NOW + 600_000).into_record(JobState::Running, NOW);
    r.owner_epoch = epoch;
    r.owner_until = Some(until);
    r
}

#[test]
fn an_applied_renewal_extends_to_the_lease_the_item_holds() {
    let answer = Write::Applied(running(3, NOW + 60_000));
    assert_eq!(
        after_renewal(Some(&answer), 3, 0, NOW + 20_000, TICKS),
        Renewed::Extended {
            until: NOW + 60_000
        }
    );
}

#[test]
fn an_extension_reaches_the_queue_timeout_but_never_the_cap_the_deadline_or_backwards() {
    // The queue's timeout from now, when the record has less.
    assert_eq!(
        extension_s(NOW, 30, NOW + 60_000, NOW + 10_000, None),
        Some(30)
    );
    // Never past 12 hours from the receive, nor the deadline of the call it carries.
    assert_eq!(extension_s(NOW, 30, NOW + 12_000, NOW, None), Some(12));
    assert_eq!(
        extension_s(NOW, 30, NOW + 60_000, NOW, Some(NOW + 5_500)),
        Some(5)
    );
    // Nothing when that would not reach past what the record has, or not a whole second.
    assert_eq!(extension_s(NOW, 30, NOW + 60_000, NOW + 30_000, None), None);
    assert_eq!(extension_s(NOW, 30, NOW + 900, NOW, None), None);
}

#[test]
fn our_own_lease_is_adopted_while_tries_remain_and_any_other_refusal_loses_the_call() {
    let ours = Write::Refused(Some(running(3, NOW + 45_000)));
    for attempt in 0..RENEWAL_RETRIES {
        assert_eq!(
            after_renewal(Some(&ours), 3, attempt, NOW + 20_000, TICKS),
            Renewed::Adopted {
                until: NOW + 45_000
            }
        );
    }
    assert_eq!(
        after_renewal(Some(&ours), 3, RENEWAL_RETRIES, NOW + 20_000, TICKS),
        Renewed::Lost
    );
    let fenced = Write::Refused(Some(running(4, NOW + 45_000)));
    assert_eq!(
        after_renewal(Some(&fenced), 3, 0, NOW + 20_000, TICKS),
        Renewed::Lost
    );
    let gone = Write::Refused(None);
    assert_eq!(
        after_renewal(Some(&gone), 3, 0, NOW + 20_000, TICKS),
        Renewed::Lost
    );
}

#[test]
fn a_refusal_that_shows_a_cancel_request_on_our_epoch_withdraws_the_call() {
    let mut marked = running(3, NOW + 45_000);
    marked.cancel_requested = Some(NOW);
    let refused = Write::Refused(Some(marked.clone()));
    assert_eq!(
        after_renewal(Some(&refused), 3, 0, NOW + 20_000, TICKS),
        Renewed::Withdrawn
    );
    // A cancel request under another owner's epoch is that owner's: ours is lost.
    marked.owner_epoch = 4;
    let fenced = Write::Refused(Some(marked));
    assert_eq!(
        after_renewal(Some(&fenced), 3, 0, NOW + 20_000, TICKS),
        Renewed::Lost
    );
}

#[test]
fn a_failed_renewal_retries_while_the_lease_holds_and_cancels_only_before_it_lapses() {
    // Ample lease: a retry after the first pause.
    assert_eq!(
        after_renewal(None, 3, 0, NOW + 20_000, TICKS),
        Renewed::Retry { pause_ms: PAUSE_MS }
    );
    assert_eq!(
        after_renewal(None, 3, 1, NOW + 20_000, TICKS),
        Renewed::Retry {
            pause_ms: 2 * PAUSE_MS
        }
    );
    // Out of tries: the lease outlasts the next heartbeat, so the call goes on.
    assert_eq!(
        after_renewal(None, 3, RENEWAL_RETRIES, NOW + 20_000, TICKS),
        Renewed::Uncertain { cancel: false }
    );
    // No room for the pause before the lease (less the margin) lapses, nor for the next
    // heartbeat: the call is cancelled.
    assert_eq!(
        after_renewal(None, 3, 0, NOW + 2_050, TICKS),
        Renewed::Uncertain { cancel: true }
    );
}
