//! The outcome of one SQS record and the visibility its failure is given.

use super::{InvalidMessage, JobState, Millis, Next};

/// SQS keeps one receive of a message invisible for at most 12 hours from that receive: a
/// change reaching past it is refused (not shortened), extending does not restart it, and the
/// next receive starts a new 12 hours.
pub const SQS_MAX_VISIBILITY_S: i64 = 43_200;
/// Kept off the 12-hour cap, and off the earliest moment a receive can have happened: the
/// request errors rather than clamps, and the receive time is only bounded from below.
pub(crate) const SQS_CAP_MARGIN_S: i64 = 60;

/// The earliest moment this receive of a record can have happened: the event source mapping
/// received it at most `batching_window_ms` (and a margin) before the invocation began at
/// `entered_ms`, and not before its first receive (`ApproximateFirstReceiveTimestamp`).
pub fn receive_floor(
    entered_ms: Millis,
    batching_window_ms: Millis,
    first: Option<Millis>,
) -> Millis {
    let floor = entered_ms
        .saturating_sub(batching_window_ms.max(0))
        .saturating_sub(SQS_CAP_MARGIN_S * 1000);
    first.map_or(floor, |f| floor.max(f.min(entered_ms)))
}

/// The latest instant a receive dated `received_ms` (by [`receive_floor`]) may be kept
/// invisible to: 12 hours from it, less the margin.
pub fn receive_cap(received_ms: Millis) -> Millis {
    received_ms.saturating_add((SQS_MAX_VISIBILITY_S - SQS_CAP_MARGIN_S) * 1000)
}

/// What happened to one record.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum RecordOutcome {
    /// The job is terminal in the ledger: the record is a success and Lambda deletes it.
    Done(JobState),
    /// The record stays in the queue, with its visibility set on purpose.
    Failed(Failure),
    /// Poison or a conflict the worker sent to the dead-letter queue itself, with its reason:
    /// acknowledged, as it carries no job that could ever become terminal.
    DeadLettered(Failure),
}

impl RecordOutcome {
    /// True when the record is reported as a success.
    pub fn is_success(&self) -> bool {
        matches!(
            self,
            RecordOutcome::Done(_) | RecordOutcome::DeadLettered(_)
        )
    }

    /// The outcome of a delivery that decided from `next` without a write of its own. A
    /// decision to claim or settle that is not carried out here (a duplicate in the batch, a
    /// refused end of attempt) backs off.
    pub(crate) fn from_next(next: Next, message_digest: &str) -> RecordOutcome {
        match next {
            Next::Finished(state) => RecordOutcome::Done(state),
            Next::Conflict { ledger_digest } => RecordOutcome::Failed(Failure::Conflict {
                ledger_digest,
                message_digest: message_digest.to_owned(),
            }),
            Next::Defer { remaining_ms } => {
                RecordOutcome::Failed(Failure::Deferred { remaining_ms })
            }
            Next::AwaitDecision => RecordOutcome::Failed(Failure::AwaitingDecision),
            Next::AwaitRecovery => RecordOutcome::Failed(Failure::AwaitingRecovery),
            Next::Claim(_) | Next::Settle(_) => RecordOutcome::Failed(Failure::Backoff {
                retry_after_ms: None,
                cause: "retry",
            }),
        }
    }

    /// The outcome after the delivery's own write ended an attempt or settled the job in
    /// `state`: a success only when that state is terminal.
    pub(crate) fn after_write(state: JobState, retry_after_ms: Option<Millis>) -> RecordOutcome {
        match state {
            s if s.is_terminal() => RecordOutcome::Done(s),
            JobState::Unknown => RecordOutcome::Failed(Failure::AwaitingDecision),
            _ => RecordOutcome::Failed(Failure::Backoff {
                retry_after_ms,
                cause: "retry authorized",
            }),
        }
    }

    /// A short stable label for logs and summaries.
    pub fn label(&self) -> &'static str {
        match self {
            RecordOutcome::Done(state) => state.as_str(),
            RecordOutcome::Failed(failure) | RecordOutcome::DeadLettered(failure) => {
                failure.label()
            }
        }
    }
}

/// Why a record is reported as a batch item failure.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Failure {
    /// The body is not a valid job: visibility 0, so the redrive policy moves it to the DLQ.
    Poison(InvalidMessage),
    /// Same job_id, different input: visibility 0, ledger untouched.
    Conflict {
        /// Digest in the ledger.
        ledger_digest: String,
        /// Digest of this message.
        message_digest: String,
    },
    /// Another owner holds a live lease.
    Deferred {
        /// Time left on that lease.
        remaining_ms: Millis,
    },
    /// Try again later: a transient provider error, a ledger outage, a refused write.
    Backoff {
        /// A minimum wait the provider asked for.
        retry_after_ms: Option<Millis>,
        /// Short classification, for logs.
        cause: &'static str,
    },
    /// No provider capacity for the call within the pacing horizon: the ledger is untouched,
    /// and the record comes back after about `wait_ms`, spread by a short backoff.
    Paced {
        /// When the capacity booked so far ends, from now.
        wait_ms: Millis,
    },
    /// The job is `unknown`: a long wait until someone decides.
    AwaitingDecision,
    /// A lapsed lease: the job is left for recovery.
    AwaitingRecovery,
    /// FIFO: an earlier record of the same message group failed, so this one was not processed.
    Skipped,
}

impl Failure {
    /// A short stable label for logs and summaries.
    pub fn label(&self) -> &'static str {
        match self {
            Failure::Poison(_) => "poison",
            Failure::Conflict { .. } => "conflict",
            Failure::Deferred { .. } => "deferred",
            Failure::Backoff { .. } => "backoff",
            Failure::Paced { .. } => "paced",
            Failure::AwaitingDecision => "awaiting_decision",
            Failure::AwaitingRecovery => "awaiting_recovery",
            Failure::Skipped => "skipped",
        }
    }
}

/// How long failed records stay invisible.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VisibilityPolicy {
    /// Backoff for the first receive; doubled each receive.
    pub backoff_base_s: i64,
    /// Largest backoff.
    pub backoff_cap_s: i64,
    /// Largest random addition to a deferral, so deferred copies do not return together.
    pub defer_jitter_s: i64,
    /// Wait for a job awaiting a decision.
    pub awaiting_decision_s: i64,
    /// Largest spread added to a record waiting for provider capacity.
    pub paced_spread_s: i64,
    /// The redrive policy's `maxReceiveCount` (0: none): a live job's record must not reach
    /// it before the job's deadline.
    pub max_receive_count: u32,
    /// The queue's `MessageRetentionPeriod`, in seconds: SQS deletes a message this long after
    /// it was sent, delivered or not.
    pub retention_s: i64,
}

impl Default for VisibilityPolicy {
    fn default() -> Self {
        VisibilityPolicy {
            backoff_base_s: 5,
            backoff_cap_s: 900,
            defer_jitter_s: 5,
            awaiting_decision_s: 1_800,
            paced_spread_s: 60,
            max_receive_count: 300,
            // SQS's default for a queue that does not set one.
            retention_s: 345_600,
        }
    }
}

/// What is known of a record's delivery when its visibility is set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Delivery {
    /// `ApproximateReceiveCount` (1 on the first receive).
    pub receive_count: u32,
    /// Seconds since this receive, at most (since its [`receive_floor`]).
    pub since_receive_s: i64,
    /// Seconds the record stays invisible as it is, at least (0 when not known).
    pub invisible_for_s: i64,
    /// Seconds until its job's deadline, when known.
    pub deadline_left_s: Option<i64>,
}

impl Delivery {
    /// What is known at `now` of a delivery: its `ApproximateReceiveCount`, its receive dated by
    /// [`receive_floor`], when it becomes visible as it stands, and its job's deadline. The time
    /// to the deadline is rounded up, so that a wait spread over it never ends before it.
    pub fn at(
        now: Millis,
        receive_count: u32,
        received_ms: Millis,
        visible_until: Millis,
        deadline_at: Option<Millis>,
    ) -> Delivery {
        Delivery {
            receive_count,
            since_receive_s: now.saturating_sub(received_ms).max(0) / 1000,
            invisible_for_s: visible_until.saturating_sub(now).max(0) / 1000,
            deadline_left_s: deadline_at.map(|d| ceil_seconds(d.saturating_sub(now))),
        }
    }
}

impl VisibilityPolicy {
    /// The longest time from a job's first receive to its deadline that `max_receive_count`
    /// receives carry (`None`: no redrive count, no limit). Past the first half of the
    /// receives, each wait is at least the time left spread over the receives left, or one
    /// receive's 12 hours (less the margins and the batching window, by which the receive is
    /// dated early); a deadline within that many 12 hours, less the reserve, is reached before
    /// the redrive count even if the reserve's receives come back at once. A job whose
    /// deadline is further away could be dead-lettered alive.
    pub fn reach_ms(&self, batching_window_ms: Millis) -> Option<Millis> {
        let max = self.max_receive_count;
        if max == 0 {
            return None;
        }
        let spread = max - max / 2;
        let waits = spread - self.reserve().min(spread);
        let per_receive_ms =
            (SQS_MAX_VISIBILITY_S - 2 * SQS_CAP_MARGIN_S) * 1000 - batching_window_ms.max(0);
        Some(i64::from(waits) * per_receive_ms.max(0))
    }

    /// Whether SQS may drop a message before its job can end: the message of a delivery
    /// within the receives kept back ([`Self::reserve`]; the redrive policy dead-letters it
    /// after the last, and a dead letter of a live job may be dropped), or one whose retention
    /// ends before the job's deadline, one more receive's 12 hours and [`BACKLOG_MARGIN_MS`]
    /// for a queue that is behind (sent at `sent_at`, when SQS said). Such a message may not
    /// bring its job back if its owner dies.
    pub fn may_drop(
        &self,
        receive_count: u32,
        sent_at: Option<Millis>,
        deadline_at: Millis,
    ) -> bool {
        let max = self.max_receive_count;
        let last_receives = max > 0 && receive_count.saturating_add(self.reserve()) >= max;
        let kept_until =
            sent_at.map(|at| at.saturating_add(self.retention_s.saturating_mul(1_000)));
        let needed = SQS_MAX_VISIBILITY_S * 1_000 + BACKLOG_MARGIN_MS;
        let outlived = kept_until.is_none_or(|until| until < deadline_at.saturating_add(needed));
        last_receives || outlived
    }

    /// The receives kept back for a job's last steps: a tenth, at least two.
    fn reserve(&self) -> u32 {
        (self.max_receive_count / 10).max(2)
    }

    /// Full-jitter exponential backoff: uniform in `0..=min(cap, base * 2^(count-1))` seconds.
    pub(crate) fn backoff_s(&self, receive_count: u32, rng: &mut fastrand::Rng) -> i64 {
        let exponent = receive_count.saturating_sub(1).min(30);
        let ceiling = self
            .backoff_base_s
            .saturating_mul(1_i64 << exponent)
            .min(self.backoff_cap_s)
            .max(0);
        rng.i64(0..=ceiling)
    }

    /// The least wait that keeps a live job's record from reaching `max_receive_count` before
    /// the job's deadline: none while the record has used at most half its receives (ordinary
    /// backoffs, hand-overs and paced deferrals), then the time left spread over the receives
    /// left, less a tenth kept for the job's last steps.
    pub(crate) fn receive_floor_s(&self, delivery: Delivery) -> i64 {
        let max = self.max_receive_count;
        let Some(left_s) = delivery.deadline_left_s else {
            return 0;
        };
        if max == 0 || delivery.receive_count <= max / 2 {
            return 0;
        }
        let reserve = self.reserve();
        let receives = max
            .saturating_sub(delivery.receive_count)
            .saturating_sub(reserve)
            .max(1);
        let receives = i64::from(receives);
        left_s.max(0).saturating_add(receives - 1) / receives
    }

    /// The visibility timeout, in seconds, to give a failed record, or `None` to leave it as it
    /// is. A live job's record waits at least its [`Self::receive_floor_s`]. A wait that reaches past 12 hours from this receive (which SQS would refuse) keeps
    /// the record invisible as far as it may, and never makes it visible sooner than it
    /// already is: only poison, conflicts and skipped FIFO records are meant to get 0, and the
    /// next receive starts a new 12 hours.
    pub fn visibility_s(
        &self,
        failure: &Failure,
        delivery: Delivery,
        rng: &mut fastrand::Rng,
    ) -> Option<i32> {
        let wanted = match failure {
            // A skipped FIFO record may be visible at once: SQS returns no record of its group
            // while the failed one before it is invisible, so order is kept.
            Failure::Poison(_) | Failure::Conflict { .. } | Failure::Skipped => 0,
            Failure::Deferred { remaining_ms } => {
                ceil_seconds(*remaining_ms) + rng.i64(0..=self.defer_jitter_s.max(0))
            }
            Failure::Backoff { retry_after_ms, .. } => {
                let backoff = self.backoff_s(delivery.receive_count, rng);
                backoff.max(retry_after_ms.map_or(0, ceil_seconds))
            }
            Failure::AwaitingRecovery => self.backoff_s(delivery.receive_count, rng),
            // Spread, but never far: a record that waits longer than the capacity it waits for
            // leaves the provider idle.
            Failure::Paced { wait_ms } => {
                let spread = self.backoff_s(delivery.receive_count, rng);
                ceil_seconds(*wait_ms) + spread.min(rng.i64(0..=self.paced_spread_s.max(0)))
            }
            Failure::AwaitingDecision => self.awaiting_decision_s,
        };
        let live = !matches!(
            failure,
            Failure::Poison(_) | Failure::Conflict { .. } | Failure::Skipped
        );
        let wanted = if live {
            wanted.max(self.receive_floor_s(delivery))
        } else {
            wanted
        };
        let cap = (SQS_MAX_VISIBILITY_S - SQS_CAP_MARGIN_S)
            .saturating_sub(delivery.since_receive_s.max(0))
            .max(0);
        let wanted = wanted.max(0);
        if wanted <= cap {
            return Some(wanted as i32);
        }
        (cap > delivery.invisible_for_s).then_some(cap as i32)
    }
}

/// How long a message made visible again may wait in a queue that is behind before it is
/// received: a day.
pub const BACKLOG_MARGIN_MS: Millis = 86_400_000;

fn ceil_seconds(ms: Millis) -> i64 {
    ms.max(0).saturating_add(999) / 1_000
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delivery(count: u32) -> Delivery {
        Delivery {
            receive_count: count,
            since_receive_s: 0,
            invisible_for_s: 30,
            deadline_left_s: None,
        }
    }

    #[test]
    fn backoff_is_full_jitter_under_a_doubling_ceiling_and_the_cap() {
        let policy = VisibilityPolicy::default();
        let mut rng = fastrand::Rng::with_seed(7);
        for (count, ceiling) in [
            (1, 5),
            (2, 10),
            (3, 20),
            (5, 80),
            (8, 640),
            (9, 900),
            (40, 900),
        ] {
            let samples: Vec<i64> = (0..2_000)
                .map(|_| policy.backoff_s(count, &mut rng))
                .collect();
            assert!(
                samples.iter().all(|s| (0..=ceiling).contains(s)),
                "count {count}"
            );
            assert_eq!(
                samples.iter().max(),
                Some(&ceiling),
                "count {count} reaches its ceiling"
            );
            assert_eq!(samples.iter().min(), Some(&0), "count {count} reaches zero");
        }
    }

    #[test]
    fn poison_and_conflict_become_visible_at_once() {
        let policy = VisibilityPolicy::default();
        let mut rng = fastrand::Rng::with_seed(1);
        let poison = Failure::Poison(InvalidMessage::NotObject);
        let conflict = Failure::Conflict {
            ledger_digest: "a".into(),
            message_digest: "b".into(),
        };
        assert_eq!(policy.visibility_s(&poison, delivery(4), &mut rng), Some(0));
        assert_eq!(
            policy.visibility_s(&conflict, delivery(4), &mut rng),
            Some(0)
        );
    }

    #[test]
    fn a_deferral_waits_out_the_lease_plus_bounded_jitter() {
        let policy = VisibilityPolicy::default();
        let mut rng = fastrand::Rng::with_seed(3);
        for _ in 0..500 {
            let v = policy.visibility_s(
                &Failure::Deferred {
                    remaining_ms: 4_001,
                },
                delivery(1),
                &mut rng,
            );
            assert!(v.is_some_and(|v| (5..=10).contains(&v)), "{v:?}");
        }
    }

    #[test]
    fn retry_after_is_a_floor_and_the_twelve_hour_cap_of_this_receive_is_never_exceeded() {
        let policy = VisibilityPolicy::default();
        let mut rng = fastrand::Rng::with_seed(5);
        let rate_limited = Failure::Backoff {
            retry_after_ms: Some(30_000),
            cause: "transient",
        };
        assert!(policy.visibility_s(&rate_limited, delivery(1), &mut rng) >= Some(30));

        let long = Failure::Deferred {
            remaining_ms: 3_600_000,
        };
        // Near the end of this receive's 12 hours: as far as the cap allows.
        let late = Delivery {
            receive_count: 1,
            since_receive_s: 43_000,
            invisible_for_s: 30,
            deadline_left_s: None,
        };
        assert_eq!(policy.visibility_s(&long, late, &mut rng), Some(140));
        // Past it: the record is left as it is, never made visible at once.
        let past = Delivery {
            since_receive_s: 50_000,
            ..late
        };
        assert_eq!(policy.visibility_s(&long, past, &mut rng), None);
        // And never shortened when it already has more than the cap allows.
        let kept = Delivery {
            invisible_for_s: 600,
            ..late
        };
        assert_eq!(policy.visibility_s(&long, kept, &mut rng), None);
    }

    #[test]
    fn a_message_may_be_dropped_in_its_last_receives_or_past_its_retention() {
        let policy = VisibilityPolicy {
            max_receive_count: 100,
            retention_s: 4 * 86_400,
            ..VisibilityPolicy::default()
        };
        let sent = Some(1_000_000);
        let day = 86_400_000;
        // Early receives of a message kept three days past its deadline.
        assert!(!policy.may_drop(1, sent, 1_000_000 + day));
        assert!(!policy.may_drop(89, sent, 1_000_000 + day));
        // The tenth kept back: the redrive policy dead-letters the message after the last.
        assert!(policy.may_drop(90, sent, 1_000_000 + day));
        // Retention that ends before the deadline's next 12 hours and a day of backlog, or
        // not known.
        assert!(!policy.may_drop(1, sent, 1_000_000 + 2 * day + day / 2));
        assert!(policy.may_drop(1, sent, 1_000_000 + 2 * day + day / 2 + 1));
        assert!(policy.may_drop(1, None, 1_000_000 + day));
        // No redrive policy: only retention.
        let none = VisibilityPolicy {
            max_receive_count: 0,
            ..policy
        };
        assert!(!none.may_drop(1_000, sent, 1_000_000 + day));
    }

    #[test]
    fn the_redrive_count_carries_twelve_hours_a_wait_past_its_first_half_and_reserve() {
        let hours = |p: VisibilityPolicy, window_ms| {
            p.reach_ms(window_ms).map(|ms| ms as f64 / 3_600_000.0)
        };
        let count = |max_receive_count| VisibilityPolicy {
            max_receive_count,
            ..VisibilityPolicy::default()
        };
        // 300: 150 past the first half, 30 kept back; 120 waits of 12 hours less two margins.
        assert_eq!(count(300).reach_ms(0), Some(120 * 43_080_000));
        // The batching window dates the receive earlier, and so shortens each wait.
        assert_eq!(count(300).reach_ms(300_000), Some(120 * 42_780_000));
        // 5: 3 past the first half, 2 kept back: one wait.
        assert!(hours(count(5), 0).is_some_and(|h| (11.9..12.0).contains(&h)));
        // Too few to spread anything: a job can be dead-lettered alive at any deadline.
        assert_eq!(count(1).reach_ms(0), Some(0));
        assert_eq!(count(0).reach_ms(0), None);
    }

    #[test]
    fn the_time_to_the_deadline_is_rounded_up_so_a_spread_wait_never_ends_before_it() {
        let d = Delivery::at(10_000, 3, 4_000, 12_500, Some(10_000 + 7_200_001));
        assert_eq!(
            (d.receive_count, d.since_receive_s, d.invisible_for_s),
            (3, 6, 2)
        );
        assert_eq!(d.deadline_left_s, Some(7_201));
        // Past it, nothing is left; and whatever the times hold, nothing overflows.
        assert_eq!(
            Delivery::at(10_000, 1, 0, 0, Some(0)).deadline_left_s,
            Some(0)
        );
        let wild = Delivery::at(i64::MIN, 1, i64::MAX, i64::MIN, Some(i64::MAX));
        assert_eq!((wild.since_receive_s, wild.invisible_for_s), (0, 0));
    }

    #[test]
    fn the_receive_is_dated_from_the_invocation_less_the_batching_window() {
        let entered = 100_000_000;
        // Within the window (and a margin) before the invocation began.
        assert_eq!(receive_floor(entered, 20_000, None), entered - 80_000);
        // A message first received 13 hours ago starts a new chain on this receive: its first
        // receive bounds nothing here.
        let long_ago = entered - 13 * 3_600_000;
        assert_eq!(receive_floor(entered, 0, Some(long_ago)), entered - 60_000);
        // A first receive inside the window is a tighter bound.
        assert_eq!(
            receive_floor(entered, 300_000, Some(entered - 1_000)),
            entered - 1_000
        );
        // Whatever the event holds.
        assert_eq!(receive_floor(entered, 0, Some(i64::MAX)), entered);
        assert_eq!(receive_floor(i64::MIN, i64::MAX, Some(i64::MIN)), i64::MIN);
    }

    #[test]
    fn a_job_waiting_for_a_decision_past_twelve_hours_keeps_its_long_wait() {
        // GIVEN a record of a job waiting for an operator, first received 13 hours ago and
        // received again now (so this receive is new)
        let policy = VisibilityPolicy::default();
        let mut rng = fastrand::Rng::with_seed(9);
        let entered = 200_000_000;
        let floor = receive_floor(entered, 0, Some(entered - 13 * 3_600_000));
        let now = entered + 2_000;
        let d = Delivery {
            receive_count: 40,
            since_receive_s: (now - floor) / 1000,
            invisible_for_s: 1_800,
            deadline_left_s: Some(86_400),
        };
        // THEN it waits the long wait again, not 0 (which would loop it into the DLQ)
        assert_eq!(
            policy.visibility_s(&Failure::AwaitingDecision, d, &mut rng),
            Some(1_800)
        );
        let backoff = Failure::Backoff {
            retry_after_ms: None,
            cause: "transient",
        };
        assert!(policy.visibility_s(&backoff, d, &mut rng).is_some());
    }

    #[test]
    fn a_paced_record_never_reaches_the_redrive_count_before_its_deadline() {
        // GIVEN a record of a job that waits for capacity, with four hours to its deadline, on a
        // queue that dead-letters at 300 receives
        let policy = VisibilityPolicy::default();
        let mut rng = fastrand::Rng::with_seed(11);
        let paced = Failure::Paced { wait_ms: 10_000 };
        // WHEN it is deferred again and again, each deferral as long as the policy gives
        let (mut now_s, deadline_s) = (0_i64, 4 * 3_600_i64);
        let mut count = 1;
        while now_s < deadline_s {
            let d = Delivery {
                receive_count: count,
                since_receive_s: 0,
                invisible_for_s: 30,
                deadline_left_s: Some(deadline_s - now_s),
            };
            let v = policy
                .visibility_s(&paced, d, &mut rng)
                .expect("a visibility");
            now_s += i64::from(v.max(1));
            count += 1;
        }
        // THEN its deadline comes before its 300th receive: the job expires in the ledger, it is
        // never dead-lettered alive
        assert!(count < 300, "{count} receives");
        // AND the first half of its receives come as fast as the capacity does
        let early = Delivery {
            receive_count: 10,
            since_receive_s: 0,
            invisible_for_s: 30,
            deadline_left_s: Some(deadline_s),
        };
        assert!(policy.visibility_s(&paced, early, &mut rng) <= Some(70));
        // AND poison is never held back
        let poison = Failure::Poison(InvalidMessage::NotObject);
        assert_eq!(
            policy.visibility_s(
                &poison,
                Delivery {
                    receive_count: 299,
                    ..early
                },
                &mut rng
            ),
            Some(0)
        );
    }
}
