//! A job's message on its queue as a `stateright` model: SQS's receive count, its redrive
//! policy and its 12 hours per receive, the event source mapping's batching window, the
//! invocation that holds the record (its heartbeat, a crash) and what each delivery comes to.
//! The visibility of every receive is the worker's own: the receive dated by
//! [`receive_floor`], the heartbeat's [`extension_s`], the final wait of
//! [`VisibilityPolicy::visibility_s`] from [`Delivery::at`], the deadline's phase from
//! [`deadline_phase`] and the first sight's [`Settings::deadline_refused`]. The world chooses
//! when the mapping invokes, how long the invocation holds the record, and what its delivery
//! comes to; the ledger protocol behind that outcome is [`crate::protocol`]'s.

use std::fmt::Write as _;

use fenced_jobs::job::decision::{DeadlinePhase, deadline_phase};
use fenced_jobs::job::outcome::{Delivery, SQS_MAX_VISIBILITY_S, receive_cap, receive_floor};
use fenced_jobs::job::{Failure, Millis, VisibilityPolicy};
use fenced_jobs::protocol::renewal::extension_s;
use fenced_jobs::worker::Settings;
use stateright::{Model, Property};

use crate::protocol::{Report, Timeline, explore};

const HOUR: Millis = 3_600_000;
/// The queue's visibility timeout (the template's default), seconds.
const QUEUE_VISIBILITY_S: i64 = 1_830;
/// The event source mapping's batching window at its largest (the template allows 300 s).
const WINDOW_MS: Millis = 300_000;
/// How long an invocation holds a record at most before its final visibility: the function's
/// timeout (the template's 300 s) less the handler's margin.
const RUN_MS: Millis = 295_000;
/// The heartbeat's interval while it holds a record.
const HEARTBEAT_MS: Millis = 100_000;
/// A live owner's lease left, for a record deferred to it.
const LEASE_MS: Millis = 60_000;

/// The bounds of one check.
#[derive(Debug, Clone)]
pub struct QueueBounds {
    /// The redrive policy's `maxReceiveCount` (the worker is told the same).
    pub max_receive_count: u32,
    /// Receives of one path that take their time (a batching wait, a whole invocation, a wait
    /// that is not the shortest); the others are as fast as the world allows.
    pub slow: u8,
    /// Invocations that crash on one path, the record left as its heartbeat left it (at most
    /// the receives the policy keeps in reserve: a tenth, at least two; a message whose
    /// invocations crash more often is what the redrive policy is there for).
    pub crashes: u8,
    /// The rule changed, if any.
    pub mutation: Option<QueueMutation>,
}

impl QueueBounds {
    /// The bound `make test` checks.
    pub fn test() -> QueueBounds {
        QueueBounds {
            max_receive_count: 10,
            slow: 2,
            crashes: 2,
            mutation: None,
        }
    }

    /// The bound `make model-check` checks.
    pub fn full() -> QueueBounds {
        QueueBounds {
            max_receive_count: 30,
            slow: 4,
            crashes: 3,
            mutation: None,
        }
    }

    /// The bounds in one line.
    pub fn describe(&self) -> String {
        format!(
            "one message, maxReceiveCount {}, deadlines {:?} h, {} slow receive(s) and {} crash(es) per path",
            self.max_receive_count,
            self.deadlines()
                .iter()
                .map(|d| format!("{:.1}", *d as f64 / HOUR as f64))
                .collect::<Vec<_>>(),
            self.slow,
            self.crashes,
        )
    }

    /// The worker's settings: the template's, with waits that take nothing of their own (no
    /// backoff, no jitter: the fewest seconds each failure may wait, the hardest case for the
    /// redrive count).
    fn settings(&self) -> Settings {
        let mut s = Settings {
            queue_visibility_s: QUEUE_VISIBILITY_S,
            batching_window_ms: WINDOW_MS,
            heartbeat_ms: HEARTBEAT_MS,
            ..Settings::default()
        };
        s.visibility = VisibilityPolicy {
            backoff_base_s: 0,
            backoff_cap_s: 0,
            defer_jitter_s: 0,
            paced_spread_s: 0,
            max_receive_count: self.max_receive_count,
            ..s.visibility
        };
        if self.mutation == Some(QueueMutation::NoReceiveFloor) {
            s.visibility.max_receive_count = 0;
        }
        s
    }

    /// The jobs' deadlines, from the first receive: a short one, the longest the redrive count
    /// carries ([`VisibilityPolicy::reach_ms`]), and one well past what its receives could
    /// wait through even with none of them wasted.
    pub fn deadlines(&self) -> Vec<Millis> {
        let mut policy = self.settings().visibility;
        policy.max_receive_count = self.max_receive_count;
        let reach = policy.reach_ms(WINDOW_MS).unwrap_or(0);
        let spread = i64::from(self.max_receive_count - self.max_receive_count / 2);
        vec![2 * HOUR, reach, (spread + 1) * SQS_MAX_VISIBILITY_S * 1000]
    }
}

/// A rule changed on purpose, each to show that a property bites.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QueueMutation {
    /// The worker is not told the redrive count: its waits never stretch.
    NoReceiveFloor,
    /// The 12 hours are counted from the message's first receive (the rule before), so a
    /// message older than that gets no wait at all.
    CapFromFirstReceive,
    /// The receive is dated at the invocation's start, not before the batching window.
    ReceiveAtInvocationStart,
    /// A job is taken whatever its deadline, even one its receives cannot carry.
    NoReachCheck,
}

impl QueueMutation {
    /// Every mutation.
    pub const ALL: [QueueMutation; 4] = [
        QueueMutation::NoReceiveFloor,
        QueueMutation::CapFromFirstReceive,
        QueueMutation::ReceiveAtInvocationStart,
        QueueMutation::NoReachCheck,
    ];

    /// What it changes.
    pub fn describe(self) -> &'static str {
        match self {
            QueueMutation::NoReceiveFloor => "the worker's waits never stretch",
            QueueMutation::CapFromFirstReceive => "the 12 hours count from the first receive",
            QueueMutation::ReceiveAtInvocationStart => "the receive is dated at the invocation",
            QueueMutation::NoReachCheck => "a deadline past the redrive count's reach is taken",
        }
    }

    /// The property it breaks.
    pub fn breaks(self) -> &'static str {
        match self {
            QueueMutation::ReceiveAtInvocationStart => WITHIN_CAP,
            _ => NOT_DEAD_LETTERED,
        }
    }

    /// The bound it is checked in.
    pub fn bounds(self) -> QueueBounds {
        QueueBounds {
            mutation: Some(self),
            crashes: 0,
            ..QueueBounds::test()
        }
    }
}

/// A live job's message reached the redrive count.
pub const NOT_DEAD_LETTERED: &str = "a live job's message is never dead-lettered";
/// SQS refused a visibility the worker asked for.
pub const WITHIN_CAP: &str =
    "every visibility the worker asks for ends within 12 hours of its receive";

/// How the message's story ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum End {
    /// A delivery found the job past its deadline and ended it: acknowledged.
    Ended,
    /// Refused at its first sight for its deadline: the worker dead-lettered it itself, with
    /// its reason, before anything was written.
    Refused,
    /// The redrive policy moved it to the dead-letter queue; `live`: before its job's deadline.
    DeadLettered {
        /// The job's deadline had not passed.
        live: bool,
    },
}

/// The message and its job.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct QueueState {
    /// True time.
    pub now: Millis,
    /// The job's deadline.
    pub deadline: Millis,
    /// `ApproximateReceiveCount`.
    pub count: u32,
    /// When SQS makes the message visible again.
    pub visible_at: Millis,
    /// Receives that took their time so far.
    pub slow: u8,
    /// Invocations that crashed so far.
    pub crashes: u8,
    /// How it ended, if it did.
    pub end: Option<End>,
    /// SQS refused a visibility change past the 12 hours of its receive.
    pub refused: bool,
}

/// What one delivery of the record came to, when the job is still open.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Came {
    /// A transient failure, a refused write, the invocation's end: a backoff.
    Backoff,
    /// Another owner holds a live lease.
    Deferred,
    /// The job is `unknown`, waiting for a decision.
    AwaitingDecision,
    /// The invocation crashed: no final visibility.
    Crash,
}

/// One receive, from SQS's hand-over to the record's final visibility.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Receive {
    /// How long after the receive the mapping invoked the worker (its batching window).
    pub waited: Millis,
    /// How long the invocation held the record before its final visibility.
    pub ran: Millis,
    /// What the delivery came to.
    pub came: Came,
}

impl Receive {
    fn slow(&self) -> bool {
        self.waited > 0 || self.ran > 0 || !matches!(self.came, Came::Backoff | Came::Crash)
    }
}

/// The model under `bounds`.
#[derive(Debug, Clone)]
pub struct Queue {
    /// The bounds.
    pub bounds: QueueBounds,
    settings: Settings,
}

impl Queue {
    /// The model.
    pub fn new(bounds: QueueBounds) -> Queue {
        let settings = bounds.settings();
        Queue { bounds, settings }
    }

    fn mutated(&self, m: QueueMutation) -> bool {
        self.bounds.mutation == Some(m)
    }

    /// The effect of one receive, with a line saying what happened.
    pub fn step(&self, state: &QueueState, r: &Receive) -> Option<(QueueState, String)> {
        let mut next = state.clone();
        let mut note = String::new();
        if state.end.is_some() {
            return None;
        }
        if r.slow() {
            next.slow += 1;
        }
        if r.came == Came::Crash {
            next.crashes += 1;
        }
        if next.slow > self.bounds.slow || next.crashes > self.bounds.crashes {
            return None;
        }
        // SQS hands the message over as soon as it is visible.
        let received = state.now.max(state.visible_at);
        next.count += 1;
        let _ = write!(note, "receive {}", next.count);
        if next.count > self.bounds.max_receive_count {
            let live = received < state.deadline;
            next.end = Some(End::DeadLettered { live });
            next.now = received;
            let _ = write!(
                note,
                ": past maxReceiveCount, moved to the dead-letter queue{}",
                if live { " while its job lives" } else { "" }
            );
            return Some((next, note));
        }
        next.visible_at = received + QUEUE_VISIBILITY_S * 1000;
        // The mapping invokes the worker; its handler dates the receive and sets the cap.
        let entered = received + r.waited;
        let first = 0;
        let dated = if self.mutated(QueueMutation::CapFromFirstReceive) {
            first
        } else if self.mutated(QueueMutation::ReceiveAtInvocationStart) {
            entered
        } else {
            receive_floor(entered, self.settings.batching_window_ms, Some(first))
        };
        let cap = receive_cap(dated);
        let mut believed = dated + self.settings.queue_visibility_s * 1000;
        if r.waited > 0 {
            let _ = write!(note, ", invoked {} s later", r.waited / 1000);
        }
        if next.count == 1
            && !self.mutated(QueueMutation::NoReachCheck)
            && self
                .settings
                .deadline_refused(state.deadline, entered, false)
                .is_some()
        {
            next.end = Some(End::Refused);
            next.now = entered;
            note.push_str(": its deadline is past the redrive count's reach; refused and dead-lettered with its reason");
            return Some((next, note));
        }
        if deadline_phase(state.deadline, entered, self.settings.skew_ms) == DeadlinePhase::Passed {
            next.end = Some(End::Ended);
            next.now = entered;
            note.push_str(": the job is past its deadline and expires; acknowledged");
            return Some((next, note));
        }
        // The heartbeat keeps the record invisible while the invocation holds it.
        let mut stopped = false;
        let mut tick = entered + HEARTBEAT_MS;
        while tick < entered + r.ran && !stopped {
            if let Some(s) =
                extension_s(tick, self.settings.queue_visibility_s, cap, believed, None)
            {
                let until = tick + i64::from(s) * 1000;
                stopped = !self.change(&mut next, received, until);
                believed = until;
            }
            tick += HEARTBEAT_MS;
        }
        let now = entered + r.ran;
        next.now = now;
        if r.ran > 0 {
            let _ = write!(note, ", held {} s", r.ran / 1000);
        }
        let failure = match deadline_phase(state.deadline, now, self.settings.skew_ms) {
            DeadlinePhase::Passed => {
                next.end = Some(End::Ended);
                note.push_str(": the job passed its deadline meanwhile and expires; acknowledged");
                return Some((next, note));
            }
            DeadlinePhase::Closing { remaining_ms } => Failure::Deferred { remaining_ms },
            DeadlinePhase::Open => match r.came {
                Came::Crash => {
                    let _ = write!(
                        note,
                        ": the invocation crashed; visible again at {}",
                        clock(next.visible_at)
                    );
                    return Some((next, note));
                }
                Came::Backoff => Failure::Backoff {
                    retry_after_ms: None,
                    cause: "transient",
                },
                Came::Deferred => Failure::Deferred {
                    remaining_ms: LEASE_MS,
                },
                Came::AwaitingDecision => Failure::AwaitingDecision,
            },
        };
        let delivery = Delivery::at(now, next.count, dated, believed, Some(state.deadline));
        let mut rng = fastrand::Rng::with_seed(0);
        let seconds = (!stopped)
            .then(|| {
                self.settings
                    .visibility
                    .visibility_s(&failure, delivery, &mut rng)
            })
            .flatten();
        let _ = write!(note, ": {}", failure.label());
        match seconds {
            Some(s) => {
                let until = now + i64::from(s) * 1000;
                if self.change(&mut next, received, until) {
                    let _ = write!(note, ", waits {s} s");
                } else {
                    let _ = write!(note, ", asks {s} s: refused by SQS");
                }
            }
            None => note.push_str(", left as it is"),
        }
        let _ = write!(note, "; visible again at {}", clock(next.visible_at));
        Some((next, note))
    }

    /// SQS's answer to a visibility change that ends at `until`, for the receive made at
    /// `received`: refused past its 12 hours, otherwise the message is visible from `until`.
    fn change(&self, next: &mut QueueState, received: Millis, until: Millis) -> bool {
        if until > received + SQS_MAX_VISIBILITY_S * 1000 {
            next.refused = true;
            return false;
        }
        next.visible_at = until;
        true
    }

    fn receives(&self) -> Vec<Receive> {
        let mut all = Vec::new();
        for waited in [0, WINDOW_MS] {
            for ran in [0, RUN_MS] {
                for came in [
                    Came::Backoff,
                    Came::Deferred,
                    Came::AwaitingDecision,
                    Came::Crash,
                ] {
                    all.push(Receive { waited, ran, came });
                }
            }
        }
        all
    }
}

/// A time as hours, minutes and seconds from the first receive.
fn clock(ms: Millis) -> String {
    let s = ms / 1000;
    format!("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
}

impl Model for Queue {
    type State = QueueState;
    type Action = Receive;

    fn init_states(&self) -> Vec<QueueState> {
        self.bounds
            .deadlines()
            .into_iter()
            .map(|deadline| QueueState {
                now: 0,
                deadline,
                count: 0,
                visible_at: 0,
                slow: 0,
                crashes: 0,
                end: None,
                refused: false,
            })
            .collect()
    }

    fn actions(&self, state: &QueueState, actions: &mut Vec<Receive>) {
        if state.end.is_none() {
            actions.extend(self.receives());
        }
    }

    fn next_state(&self, state: &QueueState, action: Receive) -> Option<QueueState> {
        self.step(state, &action).map(|(next, _)| next)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(NOT_DEAD_LETTERED, |_, s: &QueueState| {
                s.end != Some(End::DeadLettered { live: true })
            }),
            Property::always(WITHIN_CAP, |_, s: &QueueState| !s.refused),
            Property::sometimes(
                "a job more than 12 hours away waits past half its receives and ends at its deadline",
                |m: &Queue, s: &QueueState| {
                    s.end == Some(End::Ended)
                        && s.deadline > SQS_MAX_VISIBILITY_S * 1000
                        && s.count > m.bounds.max_receive_count / 2
                },
            ),
            Property::sometimes(
                "a job whose deadline its receives cannot carry is refused at its first sight",
                |_, s: &QueueState| s.end == Some(End::Refused),
            ),
        ]
    }
}

impl Timeline for Queue {
    fn timeline(&self, path: &[(QueueState, Option<Receive>)]) -> String {
        let mut out = String::new();
        let first = &path[0].0;
        let _ = writeln!(
            out,
            "  maxReceiveCount {}, the job's deadline at {}",
            self.bounds.max_receive_count,
            clock(first.deadline)
        );
        for window in path.windows(2) {
            let (state, Some(action)) = (&window[0].0, &window[0].1) else {
                continue;
            };
            let Some((after, note)) = self.step(state, action) else {
                continue;
            };
            // The time of the receive; what follows on the line happens after it.
            let received = state.now.max(state.visible_at);
            let _ = writeln!(out, "  {:>9}  {note}", clock(received));
            for p in self.properties() {
                if p.expectation == stateright::Expectation::Always
                    && (p.condition)(self, state)
                    && !(p.condition)(self, &after)
                {
                    let _ = writeln!(out, "  {:>9}  VIOLATED: {}", "", p.name);
                }
            }
        }
        out
    }
}

/// Checks the queue model under `bounds`, as [`crate::protocol::check`] does the protocol.
pub fn check(bounds: &QueueBounds, threads: usize, first_failure: bool) -> Report {
    let meant = bounds.mutation.map(QueueMutation::breaks);
    explore(Queue::new(bounds.clone()), threads, first_failure, meant)
}
