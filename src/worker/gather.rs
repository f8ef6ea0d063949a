//! The gathering of deferrable jobs' lines into provider batches: the lines of the attempts
//! claimed while records are processed wait here until every record still running waits here
//! too, the largest batch is full, or the gathering window has passed since the first line
//! came; then they go as one batch per provider.
//!
//! Each line's attempt recorded its pending reference with its claim, so a line whose batch
//! is lost on the way (the submission's answer never came) is found again by listing.

use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::{Notify, oneshot};

use crate::provider::{BatchLine, Provider, ProviderError};

/// What a line's submission came to: the batch's id, or why no batch holds it.
type Sent = Result<String, ProviderError>;

/// The lines waiting for their batch, and the records running that may still add one.
#[derive(Debug, Default)]
pub(crate) struct Gather {
    state: Mutex<State>,
    changed: Notify,
}

#[derive(Debug, Default)]
struct State {
    /// Lanes that run or may start now, in every invocation of this processor.
    running: usize,
    /// Lines waiting, each with the provider (its index in the list) it goes to.
    waiting: Vec<Waiting>,
    /// When the first line waiting came.
    opened_at: Option<tokio::time::Instant>,
    /// Lines ever gathered, to tell a line from the one that took its place.
    serial: u64,
}

#[derive(Debug)]
struct Waiting {
    serial: u64,
    link: usize,
    line: BatchLine,
    tx: oneshot::Sender<Sent>,
}

/// How lines are gathered.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Window {
    /// The longest a line waits for others.
    pub wait: Duration,
    /// The most lines in one batch.
    pub max_lines: usize,
}

/// One invocation's lanes (the records of a job, or of a FIFO group), counted while they may
/// still add a line: as many run at once as its concurrency allows, and a batch waits for
/// every one of those that runs, or may start.
pub(crate) struct Lanes<'a> {
    gather: &'a Gather,
    /// Lanes not done yet (changed under the gathering's lock).
    remaining: std::sync::atomic::AtomicUsize,
    concurrency: usize,
}

/// A lane being processed; done when dropped.
pub(crate) struct Lane<'a>(&'a Lanes<'a>);

impl Lanes<'_> {
    /// A lane starts.
    pub(crate) fn lane(&self) -> Lane<'_> {
        Lane(self)
    }

    /// The lanes of this invocation that may run at once now.
    fn slots(&self) -> usize {
        self.remaining
            .load(std::sync::atomic::Ordering::Relaxed)
            .min(self.concurrency)
    }
}

impl Drop for Lane<'_> {
    fn drop(&mut self) {
        let lanes = self.0;
        let mut state = lanes.gather.lock();
        let before = lanes.slots();
        let left = lanes.remaining.load(std::sync::atomic::Ordering::Relaxed);
        lanes
            .remaining
            .store(left.saturating_sub(1), std::sync::atomic::Ordering::Relaxed);
        state.running = state.running.saturating_sub(before - lanes.slots());
        drop(state);
        lanes.gather.changed.notify_waiters();
    }
}

impl Drop for Lanes<'_> {
    fn drop(&mut self) {
        let mut state = self.gather.lock();
        state.running = state.running.saturating_sub(self.slots());
        drop(state);
        self.gather.changed.notify_waiters();
    }
}

/// Takes a line out of the gathering if its owner stops waiting before its batch went.
struct Leave<'a> {
    gather: &'a Gather,
    serial: u64,
}

impl Drop for Leave<'_> {
    fn drop(&mut self) {
        let mut state = self.gather.lock();
        state.waiting.retain(|w| w.serial != self.serial);
        if state.waiting.is_empty() {
            state.opened_at = None;
        }
        drop(state);
        self.gather.changed.notify_waiters();
    }
}

impl Gather {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// An invocation of `count` lanes, run `concurrency` at a time: until each is done, a batch
    /// waits for its line, if it makes one (up to the window).
    pub(crate) fn lanes(&self, count: usize, concurrency: usize) -> Lanes<'_> {
        let lanes = Lanes {
            gather: self,
            remaining: count.into(),
            concurrency,
        };
        self.lock().running += lanes.slots();
        lanes
    }

    /// Gathers `line` for the provider `link` of `providers`, and waits for its batch. The
    /// caller that finds the gathering due submits every line waiting, one batch per provider.
    /// A line still waiting at `give_up` leaves, not sent: a refusal before work.
    pub(crate) async fn join<P: Provider>(
        &self,
        providers: &[&P],
        link: usize,
        line: BatchLine,
        window: Window,
        give_up: tokio::time::Instant,
    ) -> Sent {
        let (tx, mut rx) = oneshot::channel();
        let serial = {
            let mut state = self.lock();
            state.serial += 1;
            let serial = state.serial;
            state.waiting.push(Waiting {
                serial,
                link,
                line,
                tx,
            });
            state
                .opened_at
                .get_or_insert_with(tokio::time::Instant::now);
            serial
        };
        // Dropped with this future: a line still waiting then leaves (one taken is gone already).
        let _leave = Leave {
            gather: self,
            serial,
        };
        self.changed.notify_waiters();
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let (due, closes) = self.due(window);
            if let Some(lines) = due {
                submit(providers, lines).await;
            }
            tokio::select! {
                sent = &mut rx => return sent.unwrap_or_else(|_| Err(abandoned())),
                () = &mut changed => {}
                () = tokio::time::sleep_until(closes) => {}
                () = tokio::time::sleep_until(give_up) => {
                    let left = {
                        let mut state = self.lock();
                        let at = state.waiting.iter().position(|w| w.serial == serial);
                        at.map(|at| state.waiting.remove(at)).is_some()
                    };
                    if left {
                        return Err(ProviderError::Transient {
                            retry_after_ms: None,
                            reason: "the batch did not go within the call's time; the line was not sent".to_owned(),
                        });
                    }
                    // Taken: its batch is being created; its answer comes.
                    return rx.await.unwrap_or_else(|_| Err(abandoned()));
                }
            }
        }
    }

    /// The lines to submit now, if the gathering is due, and when it closes otherwise.
    fn due(&self, window: Window) -> (Option<Vec<Waiting>>, tokio::time::Instant) {
        let mut state = self.lock();
        let now = tokio::time::Instant::now();
        let Some(opened) = state.opened_at else {
            return (None, now + window.wait);
        };
        let closes = opened + window.wait;
        let full = most_for_one(&state.waiting) >= window.max_lines;
        let all_wait = state.waiting.len() >= state.running;
        if !(full || all_wait || now >= closes) {
            return (None, closes);
        }
        state.opened_at = None;
        (Some(std::mem::take(&mut state.waiting)), closes)
    }
}

/// What a line's owner learns when the caller submitting its batch stopped before the answer:
/// the batch may exist (its lines are found by listing).
fn abandoned() -> ProviderError {
    ProviderError::Uncertain {
        evidence: "the batch's submission was abandoned; it may have been created".to_owned(),
    }
}

/// The most lines waiting for one provider.
fn most_for_one(waiting: &[Waiting]) -> usize {
    let mut counts = std::collections::HashMap::new();
    for w in waiting {
        *counts.entry(w.link).or_insert(0) += 1;
    }
    counts.into_values().max().unwrap_or(0)
}

/// Submits `lines` as one batch per provider, and tells each line's owner what came of it.
async fn submit<P: Provider>(providers: &[&P], mut lines: Vec<Waiting>) {
    lines.sort_by_key(|w| w.link);
    while !lines.is_empty() {
        let link = lines[0].link;
        let split = lines
            .iter()
            .position(|w| w.link != link)
            .unwrap_or(lines.len());
        let rest = lines.split_off(split);
        let batch: Vec<BatchLine> = lines.iter().map(|w| w.line.clone()).collect();
        let sent = match providers.get(link) {
            Some(provider) => provider.submit_batch(&batch).await,
            None => Err(ProviderError::Permanent {
                reason: "no such provider".to_owned(),
            }),
        };
        match &sent {
            Ok(id) => tracing::info!(batch = %id, lines = batch.len(), "batch submitted"),
            Err(e) => tracing::warn!(error = %e, lines = batch.len(), "batch not submitted"),
        }
        for w in lines {
            // An owner that stopped waiting finds its line by listing.
            let _ = w.tx.send(sent.clone());
        }
        lines = rest;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::SimulatedProvider;

    fn line(id: &str) -> BatchLine {
        BatchLine {
            id: id.to_owned(),
            body: format!(r#"{{"job_id":"{id}","latency_ms":0}}"#),
        }
    }

    fn never() -> tokio::time::Instant {
        tokio::time::Instant::now() + Duration::from_secs(86_400)
    }

    #[tokio::test(start_paused = true)]
    async fn a_line_still_waiting_when_its_call_runs_out_of_time_leaves_unsent() {
        let provider = SimulatedProvider::new().with_batches();
        let providers = [&provider];
        let gather = Gather::default();
        let _lanes = gather.lanes(2, 16);
        let give_up = tokio::time::Instant::now() + Duration::from_secs(3);
        let sent = gather
            .join(&providers, 0, line("late"), WINDOW, give_up)
            .await;
        assert!(
            matches!(&sent, Err(ProviderError::Transient { reason, .. }) if reason.contains("not sent")),
            "{sent:?}"
        );
        assert!(provider.batch_sizes().is_empty(), "nothing was sent");
    }

    const WINDOW: Window = Window {
        wait: Duration::from_secs(60),
        max_lines: 100,
    };

    #[tokio::test(start_paused = true)]
    async fn lines_go_as_one_batch_once_every_running_record_waits() {
        let provider = SimulatedProvider::new().with_batches();
        let providers = [&provider];
        let gather = Gather::default();
        let lanes = gather.lanes(3, 16);
        let joins =
            (0..3).map(|i| gather.join(&providers, 0, line(&format!("l{i}")), WINDOW, never()));
        let started = tokio::time::Instant::now();
        let sent = futures::future::join_all(joins).await;
        assert!(sent.iter().all(|s| s.as_deref() == Ok("simbatch-1")));
        assert_eq!(provider.batch_sizes(), vec![3]);
        // Nobody waited for the window.
        assert!(started.elapsed() < Duration::from_secs(1));
        drop(lanes);
    }

    #[tokio::test(start_paused = true)]
    async fn a_batch_waits_only_for_the_lanes_the_concurrency_lets_run() {
        let provider = SimulatedProvider::new().with_batches();
        let providers = [&provider];
        let gather = Gather::default();
        // 100 lanes, 4 at a time: four lines waiting fill every slot.
        let _lanes = gather.lanes(100, 4);
        let started = tokio::time::Instant::now();
        let joins =
            (0..4).map(|i| gather.join(&providers, 0, line(&format!("l{i}")), WINDOW, never()));
        futures::future::join_all(joins).await;
        assert_eq!(provider.batch_sizes(), vec![4]);
        assert!(started.elapsed() < Duration::from_secs(1));
    }

    #[tokio::test(start_paused = true)]
    async fn a_record_still_running_holds_the_batch_until_it_is_done_or_the_window_closes() {
        let provider = SimulatedProvider::new().with_batches();
        let providers = [&provider];
        let gather = Gather::default();
        let lanes = gather.lanes(2, 16);
        let other = lanes.lane();
        let started = tokio::time::Instant::now();
        let join = gather.join(&providers, 0, line("l1"), WINDOW, never());
        let done_later = async {
            tokio::time::sleep(Duration::from_secs(5)).await;
            drop(other);
        };
        let (sent, ()) = tokio::join!(join, done_later);
        assert_eq!(sent.as_deref(), Ok("simbatch-1"));
        let waited = started.elapsed();
        assert!(waited >= Duration::from_secs(5) && waited < Duration::from_secs(6));
        // A record that never comes: the window closes the batch.
        let hung = gather.lanes(2, 16);
        let started = tokio::time::Instant::now();
        let sent = gather
            .join(&providers, 0, line("l2"), WINDOW, never())
            .await;
        assert_eq!(sent.as_deref(), Ok("simbatch-2"));
        assert_eq!(started.elapsed(), WINDOW.wait);
        drop(hung);
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_batch_goes_at_once_and_a_line_that_left_is_not_sent() {
        let provider = SimulatedProvider::new().with_batches();
        let providers = [&provider];
        let gather = Gather::default();
        let _lanes = gather.lanes(10, 16);
        let small = Window {
            max_lines: 2,
            ..WINDOW
        };
        // A line whose owner stops waiting leaves the gathering.
        let left = tokio::time::timeout(
            Duration::from_secs(1),
            gather.join(&providers, 0, line("gone"), small, never()),
        )
        .await;
        assert!(left.is_err());
        let joins =
            (0..2).map(|i| gather.join(&providers, 0, line(&format!("l{i}")), small, never()));
        let sent = futures::future::join_all(joins).await;
        assert!(sent.iter().all(Result::is_ok));
        assert_eq!(provider.batch_sizes(), vec![2]);
    }
}
