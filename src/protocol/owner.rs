//! The owner of a job, as its writes name it: the claim or recovery that raised the item to its
//! epoch, and the attempt it runs. Every write an owner makes is built here, each conditional on
//! that epoch: a lease renewed (the heartbeat's, or the end's between two tries), the lease
//! handed over while the call still runs, the reference of a background call, the end of its
//! attempt (a given-back attempt is one way it ends). Nothing else builds an owner's write.

use crate::job::{JobItem, Millis};
use crate::ledger::{AttemptEnd, EndRequest, RecordRefRequest, RenewRequest};

/// The owner of one job at one epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Owner<'a> {
    job_id: &'a str,
    epoch: u64,
    attempt: u32,
}

impl<'a> Owner<'a> {
    /// The owner whose claim or recovery left `item`.
    pub fn of(item: &'a JobItem) -> Owner<'a> {
        Owner {
            job_id: &item.job_id,
            epoch: item.owner_epoch,
            attempt: item.attempts,
        }
    }

    /// The owner of `job_id` at `epoch`, as a running call's watch knows it (its attempt is
    /// not needed to renew).
    pub fn at(job_id: &'a str, epoch: u64) -> Owner<'a> {
        Owner {
            job_id,
            epoch,
            attempt: 0,
        }
    }

    /// Its lease renewed at `now` until `lease_until`; `expected_until`: the lease it last
    /// wrote, which the renewal must find (`None`: any lease of its epoch).
    pub fn renew(
        &self,
        expected_until: Option<Millis>,
        now: Millis,
        lease_until: Millis,
    ) -> RenewRequest {
        RenewRequest {
            job_id: self.job_id.to_owned(),
            epoch: self.epoch,
            expected_until,
            now,
            lease_until,
            progress: None,
        }
    }

    /// Its lease ended at `now` while the call still runs upstream: the next delivery takes
    /// the job over and collects the same call.
    pub fn hand_over(&self, now: Millis) -> RenewRequest {
        // Ending our own lease needs no particular lease to be current.
        self.renew(None, now, now)
    }

    /// The reference of its background call, recorded at `now`.
    pub fn record_ref(&self, provider_ref: String, now: Millis) -> RecordRefRequest {
        RecordRefRequest {
            job_id: self.job_id.to_owned(),
            epoch: self.epoch,
            attempt: self.attempt,
            provider_ref,
            now,
            input: None,
        }
    }

    /// Its attempt ended so at `now` (the usage and the kept input are the executor's to add).
    pub fn end(&self, end: AttemptEnd, now: Millis) -> EndRequest {
        EndRequest {
            job_id: self.job_id.to_owned(),
            epoch: self.epoch,
            attempt: self.attempt,
            now,
            end,
            usage: None,
            input: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::transitions::{apply_end, apply_renew};

    #[test]
    fn every_write_of_an_owner_is_on_its_epoch_and_a_stale_one_is_refused() {
        let claimed = crate::protocol::claimed_example(600_000, 1_000, None);
        let owner = Owner::of(&claimed);
        let renewed = apply_renew(
            Some(&claimed),
            &owner.renew(claimed.owner_until, 2_000, 40_000),
        )
        .expect("the owner renews its lease");
        assert_eq!(renewed.owner_until, Some(40_000));
        let handed = apply_renew(Some(&renewed), &owner.hand_over(3_000)).expect("handed over");
        assert_eq!(handed.owner_until, Some(3_000));
        let end = owner.end(AttemptEnd::Expired, 3_000);
        assert_eq!(
            (end.epoch, end.attempt),
            (claimed.owner_epoch, claimed.attempts)
        );
        // A later epoch fences this owner: none of its writes applies.
        let fenced = JobItem {
            owner_epoch: claimed.owner_epoch + 1,
            ..renewed
        };
        assert_eq!(apply_renew(Some(&fenced), &owner.hand_over(3_000)), None);
        assert_eq!(apply_end(Some(&fenced), &end), None);
        let stale = Owner::at(&claimed.job_id, claimed.owner_epoch);
        assert_eq!(
            apply_renew(Some(&fenced), &stale.renew(None, 3_000, 9_000)),
            None
        );
    }
}
