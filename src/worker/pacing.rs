//! Pacing the calls of one execution environment against the provider's limits.
//!
//! Two valves, before a job is claimed (so a record that cannot get capacity soon is deferred
//! without a ledger write and without an attempt):
//!
//! - **Shared capacity** (when `PROVIDER_RPM` or `PROVIDER_TPM` is set): calls are drawn from a
//!   pool this environment leases in chunks from the schedule item all invocations share
//!   ([`crate::ledger::schedule`]). A chunk that would start beyond the horizon is not booked;
//!   the record is deferred until about when the booked capacity ends, and no other write is
//!   tried before then.
//! - **An adaptive limit** on the calls in flight, additive increase and multiplicative
//!   decrease: halved on each 429, raised by one over a window of answers, and a `Retry-After`
//!   stops every new call of the environment until it has passed.
//!
//! The event source mapping's `MaximumConcurrency` is the outer valve: it bounds how many
//! environments ask at all.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::clock::Clock;
use crate::job::Millis;
use crate::job::policy::Policy;
use crate::ledger::LedgerError;
use crate::ledger::schedule::{CallSchedule, Limits, Reservation, ReserveRequest};

/// How long leased calls stay usable once their chunk starts: capacity not used by then is
/// lost (it was the provider's for that moment).
const CREDIT_LIFE_MS: Millis = 10_000;

/// The least time between two reservations of one environment after one was refused; it
/// doubles with each refusal in a row, up to the most.
const MIN_RESERVATION_GAP_MS: Millis = 2_000;
const MAX_RESERVATION_GAP_MS: Millis = 30_000;

/// The adaptive limit is halved at most this often.
const DECREASE_EVERY_MS: Millis = 1_000;

/// How the pacer is set up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PacingSettings {
    /// The provider limits the shared schedule keeps to; none set, no schedule.
    pub limits: Limits,
    /// Which schedule (one per provider account and limit).
    pub key: String,
    /// Calls leased per reservation.
    pub chunk: u64,
    /// The longest a record waits in the invocation for capacity before it is deferred.
    pub horizon_ms: Millis,
    /// The adaptive limit's ceiling (the calls one environment may have in flight); 0 is
    /// `MAX_CONCURRENCY` (see [`crate::worker::Settings::pacing`]).
    pub max_in_flight: u32,
}

impl Default for PacingSettings {
    fn default() -> Self {
        PacingSettings {
            limits: Limits::default(),
            key: "provider".to_owned(),
            chunk: 10,
            horizon_ms: 10_000,
            max_in_flight: 0,
        }
    }
}

#[derive(Debug)]
struct State {
    /// The adaptive limit on calls in flight.
    limit: f64,
    in_flight: u32,
    /// No new call before this (the provider's `Retry-After`).
    paused_until: Millis,
    /// The last decrease: the 429s of calls sent together count as one signal.
    decreased_at: Millis,
    /// Leased calls and tokens not used yet, usable until `credit_until`. A call takes its
    /// tokens even when fewer are left (estimates vary about their mean): the next chunk pays
    /// the debt.
    credits: u64,
    tokens: i64,
    credit_until: Millis,
    /// The shared capacity is booked until then, and no reservation is tried before
    /// `next_reservation` (a refused one tells the horizon is full).
    booked_until: Millis,
    next_reservation: Millis,
    /// Reservations refused in a row: the gap before the next one doubles with each.
    refusals: u32,
    /// The tokens a call of this environment is expected to be charged, on average.
    mean_tokens: f64,
    /// Records waiting for capacity here now: a chunk is sized to them, since capacity not
    /// used at its moment is lost.
    waiting: u64,
}

/// The pacer of one execution environment (shared by its invocations and their records).
#[derive(Debug)]
pub struct Pacer {
    settings: PacingSettings,
    schedule: Option<Arc<dyn CallSchedule>>,
    state: Mutex<State>,
    /// One reservation at a time: the others wait for its chunk.
    leasing: tokio::sync::Mutex<()>,
    freed: tokio::sync::Notify,
}

/// A call may go: while it is held it counts as in flight. Dropped unspent (the delivery found
/// the job finished, or held by another owner), its leased call and tokens go back to the pool.
#[derive(Debug)]
pub(crate) struct Permit<'a> {
    pacer: &'a Pacer,
    /// The leased call and tokens it took, if it took any.
    leased: Option<i64>,
    /// The permit of a capped share (a producer's, an account's) the call also holds, if any,
    /// which may hold another's: spent and released with this one.
    share: Option<Box<Permit<'a>>>,
}

impl<'a> Permit<'a> {
    /// The claim succeeded: the call is made under this permit, and its capacity is used.
    pub(crate) fn spend(&mut self) {
        self.leased = None;
        if let Some(share) = self.share.as_mut() {
            share.spend();
        }
    }

    /// This permit, holding `share`'s too.
    pub(crate) fn with_share(mut self, share: Permit<'a>) -> Permit<'a> {
        self.share = Some(Box::new(share));
        self
    }
}

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        let mut st = self.pacer.lock();
        st.in_flight = st.in_flight.saturating_sub(1);
        if let Some(tokens) = self.leased {
            st.credits += 1;
            st.tokens += tokens;
        }
        drop(st);
        self.pacer.freed.notify_one();
    }
}

impl Pacer {
    /// A pacer; with a schedule when the settings name a limit. A ceiling of 0 calls in flight
    /// is read as 1.
    pub fn new(settings: PacingSettings, schedule: Option<Arc<dyn CallSchedule>>) -> Self {
        let schedule = schedule.filter(|_| settings.limits.any());
        Pacer {
            state: Mutex::new(State {
                limit: f64::from(settings.max_in_flight.max(1)),
                in_flight: 0,
                paused_until: 0,
                decreased_at: Millis::MIN,
                credits: 0,
                tokens: 0,
                credit_until: 0,
                booked_until: 0,
                next_reservation: 0,
                refusals: 0,
                mean_tokens: 0.0,
                waiting: 0,
            }),
            settings,
            schedule,
            leasing: tokio::sync::Mutex::new(()),
            freed: tokio::sync::Notify::new(),
        }
    }

    /// The settings.
    pub fn settings(&self) -> &PacingSettings {
        &self.settings
    }

    /// The tokens a provider is expected to charge a call with this input when it arrives: its
    /// size at four bytes a token, and the answer's ceiling the call is sent with (`policy`'s
    /// reading of the job's `parameters`: the largest of [`crate::job::OUTPUT_CEILINGS`],
    /// else the deployment's bound). Read only when a token limit is set.
    pub(crate) fn estimated_tokens(&self, input_canonical: &str, policy: &Policy) -> u64 {
        if self.settings.limits.tpm == 0 {
            return 0;
        }
        let input: serde_json::Map<String, serde_json::Value> =
            serde_json::from_str(input_canonical).unwrap_or_default();
        (input_canonical.len() as u64).div_ceil(4) + policy.output_tokens(&input)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits for capacity for one call charged about `tokens`, at most until `latest` (and the
    /// horizon). Returns the permit, or how long the record should wait before it is
    /// delivered again.
    pub(crate) async fn admit(
        &self,
        tokens: u64,
        clock: &dyn Clock,
        latest: Millis,
    ) -> Result<Permit<'_>, Millis> {
        // Counted while it waits, however the wait ends (a batch cut short drops it).
        struct Waiting<'a>(&'a Pacer);
        impl Drop for Waiting<'_> {
            fn drop(&mut self) {
                let mut st = self.0.lock();
                st.waiting = st.waiting.saturating_sub(1);
            }
        }
        self.lock().waiting += 1;
        let _waiting = Waiting(self);
        self.admit_one(tokens, clock, latest).await
    }

    async fn admit_one(
        &self,
        tokens: u64,
        clock: &dyn Clock,
        latest: Millis,
    ) -> Result<Permit<'_>, Millis> {
        let until = latest.min(clock.now_ms().saturating_add(self.settings.horizon_ms));
        loop {
            let now = clock.now_ms();
            let (wait_for, need_credit) = {
                let mut st = self.lock();
                if st.credit_until <= now {
                    st.credits = 0;
                    st.tokens = st.tokens.min(0);
                }
                let credit = self.schedule.is_none() || st.credits >= 1;
                let room = f64::from(st.in_flight) < st.limit.floor().max(1.0);
                if st.paused_until <= now && credit && room {
                    let leased = self.schedule.is_some().then_some(tokens as i64);
                    if let Some(tokens) = leased {
                        st.credits -= 1;
                        st.tokens -= tokens;
                    }
                    st.in_flight += 1;
                    return Ok(Permit {
                        pacer: self,
                        leased,
                        share: None,
                    });
                }
                if st.paused_until > until {
                    return Err(st.paused_until - now);
                }
                if !credit && st.next_reservation > now {
                    return Err(st.booked_until.saturating_sub(now).max(1));
                }
                (st.paused_until.max(now), !credit)
            };
            if now >= until {
                return Err(1_000);
            }
            if wait_for > now {
                sleep_until(clock, wait_for).await;
            } else if need_credit {
                self.lease(tokens, clock, until).await?;
            } else {
                let left = Duration::from_millis((until - now).max(1) as u64);
                let _ = tokio::time::timeout(left, self.freed.notified()).await;
            }
        }
    }

    /// Leases a chunk from the shared schedule, waiting for its start. A reservation the table
    /// throttled or did not answer defers the record like a refusal; a schedule that cannot be
    /// used at all lets the call go (the provider's own 429 and the adaptive limit protect it).
    async fn lease(&self, tokens: u64, clock: &dyn Clock, until: Millis) -> Result<(), Millis> {
        let Some(schedule) = &self.schedule else {
            return Ok(());
        };
        let _one = self.leasing.lock().await;
        // The other records of the batch, started at the same time, say they wait too.
        tokio::task::yield_now().await;
        let now = clock.now_ms();
        let Some((chunk, chunk_tokens, refused_before)) = self.chunk(tokens, now)? else {
            // Another record leased while we waited for the lock.
            return Ok(());
        };
        let horizon_end = until.max(now);
        if refused_before {
            // Refused last time: a read tells whether a write could succeed now, at a tenth
            // of a refused write's price.
            if let Ok(Some(booked)) = schedule.peek(&self.settings.key).await {
                let start = booked.start_at(now);
                if start > horizon_end {
                    return Err(self.refused(now, start));
                }
            }
        }
        let req = ReserveRequest {
            key: self.settings.key.clone(),
            limits: self.settings.limits,
            requests: chunk,
            tokens: chunk_tokens,
            now,
            horizon_ms: (until - now).max(0),
        };
        match schedule.reserve(req).await {
            Ok(Reservation::Granted { start }) => {
                sleep_until(clock, start).await;
                let mut st = self.lock();
                st.refusals = 0;
                st.credits += chunk;
                st.tokens += chunk_tokens as i64;
                st.credit_until = start.saturating_add(CREDIT_LIFE_MS);
                Ok(())
            }
            Ok(Reservation::Booked { until: booked }) => Err(self.refused(now, booked)),
            // The table throttled or did not answer: the same for every environment at once,
            // so none may take it as leave to call unpaced. The record waits, and the next
            // reservation backs off as after a refusal.
            Err(e @ (LedgerError::Throttled { .. } | LedgerError::Unavailable { .. })) => {
                tracing::warn!(error = %e, "reserving provider capacity failed; the record waits");
                Err(self.refused(now, now.saturating_add(MIN_RESERVATION_GAP_MS)))
            }
            // The schedule item itself is refused or unreadable (a configuration to fix, said
            // loudly): calls go on under the adaptive limit and the provider's own 429s
            // rather than every job waiting until it expires.
            Err(e) => {
                tracing::error!(error = %e, "the provider schedule cannot be used; calling without it");
                let mut st = self.lock();
                st.credits += 1;
                st.credit_until = now + CREDIT_LIFE_MS;
                Ok(())
            }
        }
    }

    /// The chunk of calls to lease, with the tokens calls here are charged on average, less what
    /// is left (or plus the debt), and whether the last reservation was refused; `None` when
    /// another record leased meanwhile, the wait when one was just refused.
    fn chunk(&self, tokens: u64, now: Millis) -> Result<Option<(u64, u64, bool)>, Millis> {
        let mut st = self.lock();
        let chunk = st.waiting.clamp(1, self.settings.chunk.max(1));
        if st.credit_until <= now {
            st.credits = 0;
            st.tokens = st.tokens.min(0);
        }
        if st.credits >= 1 {
            return Ok(None);
        }
        if st.next_reservation > now {
            // Another record was just refused: so would we be.
            return Err(st.booked_until.saturating_sub(now).max(1));
        }
        st.mean_tokens = if st.mean_tokens == 0.0 {
            tokens as f64
        } else {
            0.9 * st.mean_tokens + 0.1 * tokens as f64
        };
        let tokens = ((st.mean_tokens * chunk as f64) as i64 - st.tokens).max(0) as u64;
        Ok(Some((chunk, tokens, st.refusals > 0)))
    }

    /// The capacity is booked until `booked`, past the horizon: no reservation is tried again
    /// before some of it has passed, and less often while the refusals go on (others are
    /// getting the capacity meanwhile). Returns the record's wait.
    fn refused(&self, now: Millis, booked: Millis) -> Millis {
        let mut st = self.lock();
        st.booked_until = booked;
        let backoff = (MIN_RESERVATION_GAP_MS << st.refusals.min(5)).min(MAX_RESERVATION_GAP_MS);
        st.refusals += 1;
        let wait = booked.saturating_sub(now).max(1);
        st.next_reservation =
            now.saturating_add(wait.saturating_sub(self.settings.horizon_ms).max(backoff));
        wait
    }

    /// The provider answered a call: the limit grows by one over a window of answers.
    pub fn answered(&self) {
        let mut st = self.lock();
        let ceiling = f64::from(self.settings.max_in_flight.max(1));
        st.limit = (st.limit + 1.0 / st.limit).min(ceiling);
    }

    /// The provider refused a call for its rate limit: the limit is halved (once a second at
    /// most: the refusals of calls sent together are one signal), and no new call starts
    /// before its `Retry-After`.
    pub fn throttled(&self, now: Millis, retry_after_ms: Option<Millis>) {
        let mut st = self.lock();
        if now.saturating_sub(st.decreased_at) >= DECREASE_EVERY_MS {
            st.limit = (st.limit / 2.0).max(1.0);
            st.decreased_at = now;
        }
        if let Some(wait) = retry_after_ms {
            let wait = wait.clamp(0, crate::provider::MAX_RETRY_AFTER_MS);
            st.paused_until = st.paused_until.max(now.saturating_add(wait));
        }
    }

    /// A call refused for the rate limit gives up its place among the calls in flight while it
    /// waits to be sent again (at `not_before` at the earliest), and takes one again only once
    /// the pause is over and the adaptive limit (halved by the refusal) has room: so the limit
    /// holds for re-sends too, and those beyond it go one at a time as answers free room.
    /// `false` when there was no room before `until` (the caller gives its attempt back). The
    /// call's permit counts as in flight again however the wait ends.
    pub async fn resend(&self, clock: &dyn Clock, not_before: Millis, until: Millis) -> bool {
        struct Parked<'a>(&'a Pacer);
        impl Drop for Parked<'_> {
            fn drop(&mut self) {
                self.0.lock().in_flight += 1;
            }
        }
        {
            let mut st = self.lock();
            st.in_flight = st.in_flight.saturating_sub(1);
        }
        self.freed.notify_one();
        let _parked = Parked(self);
        loop {
            let now = clock.now_ms();
            let start = {
                let st = self.lock();
                let room = f64::from(st.in_flight) < st.limit.floor().max(1.0);
                let start = st.paused_until.max(not_before);
                if start <= now && room {
                    return true;
                }
                if now >= until {
                    return false;
                }
                start
            };
            if start > now {
                sleep_until(clock, start.min(until)).await;
            } else {
                let left = Duration::from_millis((until - now).max(1) as u64);
                let _ = tokio::time::timeout(left, self.freed.notified()).await;
            }
        }
    }

    /// When a new call may start at the earliest (a `Retry-After` in force).
    pub(crate) fn paused_until(&self) -> Millis {
        self.lock().paused_until
    }

    /// The adaptive limit now (metrics, tests).
    pub fn limit(&self) -> f64 {
        self.lock().limit
    }
}

async fn sleep_until(clock: &dyn Clock, at: Millis) {
    let wait = at - clock.now_ms();
    if wait > 0 {
        tokio::time::sleep(Duration::from_millis(wait as u64)).await;
    }
}

#[cfg(test)]
mod tests;
