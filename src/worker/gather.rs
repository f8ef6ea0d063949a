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

use crate::job::BatchMember;
use crate::provider::{BatchLine, Provider, ProviderError};

/// What a line's submission came to: the batch's id, or what the provider said instead.
type Sent = Result<String, ProviderError>;

/// What the owner of a line learns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Joined {
    /// The batch `.0` holds the line.
    In(String),
    /// The line may be in a batch whose creation went unseen: its owner keeps the pending
    /// reference, and whoever looks next finds the batch by listing.
    Unseen,
    /// No batch holds the line (why): nothing ran, and the attempt is given back.
    NotSent(String),
    /// The provider refused the batch for good (a 4xx): nothing ran, but the same lines would
    /// be refused again, so the attempt is spent (transient), within the job's budget.
    Refused(String),
}

impl From<Sent> for Joined {
    fn from(sent: Sent) -> Joined {
        match sent {
            Ok(batch) => Joined::In(batch),
            Err(ProviderError::Uncertain { .. }) => Joined::Unseen,
            Err(ProviderError::Permanent { reason }) => {
                Joined::Refused(format!("the batch was refused: {reason}"))
            }
            // Refused for now (a 429, an upload that failed): nothing was created. (A 5xx may
            // have created it: the provider makes that uncertain.)
            Err(refused) => Joined::NotSent(format!("the batch was refused: {refused}")),
        }
    }
}

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
    /// Batches created whose jobs are to be listed ([`Window::lists_members`]), until an owner
    /// takes them ([`Gather::take_created`]).
    created: Vec<(String, Vec<BatchMember>)>,
}

/// One attempt's line, and the job it is for.
#[derive(Debug, Clone)]
pub(crate) struct Line {
    /// The line.
    pub line: BatchLine,
    /// Its job, listed with the batch that holds it when the window asks for it.
    pub member: BatchMember,
}

#[derive(Debug)]
struct Waiting {
    serial: u64,
    /// The provider (its index in the list) and the model: one batch each.
    group: (usize, String),
    line: BatchLine,
    member: BatchMember,
    tx: oneshot::Sender<Sent>,
}

/// How lines are gathered.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Window {
    /// The longest a line waits for others.
    pub wait: Duration,
    /// The most lines in one batch.
    pub max_lines: usize,
    /// The most bytes of lines in one batch.
    pub max_bytes: usize,
    /// Each batch created is kept with its jobs until an owner takes it, to be listed (for
    /// the webhooks that say when it ends).
    pub lists_members: bool,
}

/// When a line's owner stops waiting.
#[derive(Debug, Clone)]
pub(crate) struct Until {
    /// A line still waiting then leaves, not sent.
    pub give_up: tokio::time::Instant,
    /// A line taken into a batch whose creation has not answered by then is left to listing.
    pub stop: tokio::time::Instant,
    /// Cancelled when the owner loses the job (or an operator cancels it): a line still
    /// waiting then leaves, not sent, as at `give_up`.
    pub lost: tokio_util::sync::CancellationToken,
}

/// Batches no provider takes more of: OpenAI's file holds 200 MB, Anthropic's batch 256 MB.
pub(crate) const MAX_BATCH_BYTES: usize = 100 * 1_048_576;

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

    /// Gathers `line` for the provider and model `group` (the provider's index in
    /// `providers`), and waits for its batch. The caller that finds the gathering due submits
    /// every line waiting, one batch per provider and model, within its own `until.stop`. A
    /// line still waiting at `until.give_up` leaves, not sent.
    pub(crate) async fn join<P: Provider>(
        &self,
        providers: &[&P],
        group: (usize, String),
        line: Line,
        window: Window,
        until: Until,
    ) -> Joined {
        let (tx, mut rx) = oneshot::channel();
        let serial = {
            let mut state = self.lock();
            state.serial += 1;
            let serial = state.serial;
            state.waiting.push(Waiting {
                serial,
                group,
                line: line.line,
                member: line.member,
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
                // The submission is this caller's, bounded by its own time.
                let created = submit(providers, lines, window, until.stop).await;
                if window.lists_members {
                    self.lock().created.extend(created);
                }
            }
            // In this order whatever is ready at once, so a seeded run replays the same way:
            // an answer, then a change, then the window's close, then giving up.
            tokio::select! {
                biased;
                sent = &mut rx => return sent.map_or(Joined::Unseen, Joined::from),
                () = &mut changed => {}
                () = tokio::time::sleep_until(closes) => {}
                () = until.lost.cancelled() => {
                    if self.leave(serial) {
                        return Joined::NotSent("the job was lost before its batch went".to_owned());
                    }
                    return match tokio::time::timeout_at(until.stop, rx).await {
                        Ok(Ok(sent)) => Joined::from(sent),
                        _ => Joined::Unseen,
                    };
                }
                () = tokio::time::sleep_until(until.give_up) => {
                    if self.leave(serial) {
                        return Joined::NotSent(
                            "the batch did not go within the call's time".to_owned(),
                        );
                    }
                    // Taken: its batch is being created; its answer comes, or listing finds it.
                    return match tokio::time::timeout_at(until.stop, rx).await {
                        Ok(Ok(sent)) => Joined::from(sent),
                        _ => Joined::Unseen,
                    };
                }
            }
        }
    }

    /// The batches created since the last take, each with its jobs, to be listed (only when
    /// the window [`Window::lists_members`]).
    pub(crate) fn take_created(&self) -> Vec<(String, Vec<BatchMember>)> {
        std::mem::take(&mut self.lock().created)
    }

    /// Takes the line `serial` out of the gathering: `false` when it was taken into a batch
    /// already.
    fn leave(&self, serial: u64) -> bool {
        let mut state = self.lock();
        let at = state.waiting.iter().position(|w| w.serial == serial);
        at.map(|at| state.waiting.remove(at)).is_some()
    }

    /// The lines to submit now, if the gathering is due, and when it closes otherwise.
    fn due(&self, window: Window) -> (Option<Vec<Waiting>>, tokio::time::Instant) {
        let mut state = self.lock();
        let now = tokio::time::Instant::now();
        let Some(opened) = state.opened_at else {
            return (None, now + window.wait);
        };
        let closes = opened + window.wait;
        let full = fullest(&state.waiting, window);
        let all_wait = state.waiting.len() >= state.running;
        if !(full || all_wait || now >= closes) {
            return (None, closes);
        }
        state.opened_at = None;
        (Some(std::mem::take(&mut state.waiting)), closes)
    }
}

/// Whether one provider and model has a batch's worth of lines waiting.
fn fullest(waiting: &[Waiting], window: Window) -> bool {
    let mut sizes: std::collections::HashMap<&(usize, String), (usize, usize)> =
        std::collections::HashMap::new();
    waiting.iter().any(|w| {
        let size = sizes.entry(&w.group).or_default();
        *size = (size.0 + 1, size.1 + w.line.body.len());
        size.0 >= window.max_lines || size.1 >= window.max_bytes
    })
}

/// Submits `lines` as one batch per provider and model (more when one would pass the window's
/// lines or bytes), by `stop`, and tells each line's owner what came of it: a batch not begun
/// by then was not sent (its lines' attempts are given back), and a create still unanswered
/// then may have made its batch (its lines are left to listing). The batches created, each
/// with its jobs.
async fn submit<P: Provider>(
    providers: &[&P],
    mut lines: Vec<Waiting>,
    window: Window,
    stop: tokio::time::Instant,
) -> Vec<(String, Vec<BatchMember>)> {
    let mut created = Vec::new();
    lines.sort_by(|a, b| a.group.cmp(&b.group));
    while !lines.is_empty() {
        let group = lines[0].group.clone();
        let mut bytes = 0;
        let split = lines
            .iter()
            .position(|w| {
                bytes += w.line.body.len();
                w.group != group || bytes > window.max_bytes
            })
            .unwrap_or(lines.len())
            .clamp(1, window.max_lines.max(1));
        let rest = lines.split_off(split.min(lines.len()));
        let batch: Vec<BatchLine> = lines.iter().map(|w| w.line.clone()).collect();
        let sent = match providers.get(group.0) {
            // Nothing left of the submitter's time: nothing was sent.
            Some(_) if tokio::time::Instant::now() >= stop => Err(ProviderError::Transient {
                retry_after_ms: None,
                reason: "the batch did not go within the call's time".to_owned(),
            }),
            Some(provider) => tokio::time::timeout_at(stop, provider.submit_batch(&batch))
                .await
                .unwrap_or_else(|_| {
                    Err(ProviderError::Uncertain {
                        evidence: "the batch's create did not answer in the call's time".to_owned(),
                    })
                }),
            None => Err(ProviderError::Permanent {
                reason: "no such provider".to_owned(),
            }),
        };
        match &sent {
            Ok(id) => tracing::info!(batch = %id, lines = batch.len(), "batch submitted"),
            Err(e) => tracing::warn!(error = %e, lines = batch.len(), "batch not submitted"),
        }
        if let (Ok(id), true) = (&sent, window.lists_members) {
            created.push((id.clone(), lines.iter().map(|w| w.member.clone()).collect()));
        }
        for w in lines {
            // An owner that stopped waiting finds its line by listing.
            let _ = w.tx.send(sent.clone());
        }
        lines = rest;
    }
    created
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::SimulatedProvider;

    fn line(id: &str) -> Line {
        Line {
            line: BatchLine {
                id: id.to_owned(),
                body: format!(r#"{{"job_id":"{id}","latency_ms":0}}"#),
            },
            member: BatchMember {
                job_id: format!("job-{id}"),
                class: crate::job::JobClass::default(),
            },
        }
    }

    /// A line's owner that waits until `at`, and never loses its job.
    fn until(at: tokio::time::Instant) -> Until {
        Until {
            give_up: at,
            stop: at,
            lost: tokio_util::sync::CancellationToken::new(),
        }
    }

    fn never() -> Until {
        until(tokio::time::Instant::now() + Duration::from_secs(86_400))
    }

    fn group() -> (usize, String) {
        (0, "m".to_owned())
    }

    #[tokio::test(start_paused = true)]
    async fn a_line_still_waiting_when_its_call_runs_out_of_time_leaves_unsent() {
        let provider = SimulatedProvider::new().with_batches();
        let providers = [&provider];
        let gather = Gather::default();
        let _lanes = gather.lanes(2, 16);
        let give_up = tokio::time::Instant::now() + Duration::from_secs(3);
        let sent = gather
            .join(&providers, group(), line("late"), WINDOW, until(give_up))
            .await;
        assert!(matches!(&sent, Joined::NotSent(_)), "{sent:?}");
        assert!(provider.batch_sizes().is_empty(), "nothing was sent");
    }

    #[tokio::test(start_paused = true)]
    async fn lines_taken_by_a_submitter_out_of_time_are_not_sent_and_say_so() {
        let provider = SimulatedProvider::new().with_batches();
        let providers = [&provider];
        let gather = Gather::default();
        let _lanes = gather.lanes(2, 16);
        // The second line comes when the gathering is due, from a record with no time left:
        // it takes both lines, and neither batch may begin.
        let waiting = gather.join(&providers, (0, "m1".to_owned()), line("a"), WINDOW, never());
        let spent = until(tokio::time::Instant::now());
        let late = gather.join(&providers, (0, "m2".to_owned()), line("b"), WINDOW, spent);
        let (a, b) = futures::join!(waiting, late);
        assert!(matches!(&a, Joined::NotSent(_)), "{a:?}");
        assert!(matches!(&b, Joined::NotSent(_)), "{b:?}");
        assert!(provider.batch_sizes().is_empty(), "nothing was sent");
    }

    #[tokio::test(start_paused = true)]
    async fn a_line_whose_job_is_lost_while_it_waits_leaves_unsent() {
        let provider = SimulatedProvider::new().with_batches();
        let providers = [&provider];
        let gather = Gather::default();
        let _lanes = gather.lanes(2, 16);
        let until = never();
        let lost = until.lost.clone();
        let waiting = gather.join(&providers, group(), line("a"), WINDOW, until);
        let cancel = async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            lost.cancel();
        };
        let (sent, ()) = futures::join!(waiting, cancel);
        assert!(matches!(&sent, Joined::NotSent(_)), "{sent:?}");
        // The other record's line, alone now, goes alone.
        let other = gather
            .join(&providers, group(), line("b"), WINDOW, never())
            .await;
        assert!(matches!(&other, Joined::In(_)), "{other:?}");
        assert_eq!(provider.batch_sizes(), vec![1]);
    }

    #[tokio::test(start_paused = true)]
    async fn each_model_goes_in_a_batch_of_its_own_and_a_refusal_is_told_apart() {
        let provider = SimulatedProvider::new().with_batches();
        let providers = [&provider];
        let gather = Gather::default();
        let _lanes = gather.lanes(3, 16);
        let joins = [("a", "m1"), ("b", "m2"), ("c", "m1")].map(|(id, model)| {
            gather.join(&providers, (0, model.to_owned()), line(id), WINDOW, never())
        });
        let sent = futures::future::join_all(joins).await;
        assert_eq!(provider.batch_sizes(), vec![2, 1]);
        assert_eq!(sent[0], sent[2]);
        assert_ne!(sent[0], sent[1]);
        // What the provider said of a batch, for its lines: refused for now, nothing ran;
        // refused for good, the attempt is spent; an answer lost, the line is found by listing.
        let said = |e: ProviderError| Joined::from(Err(e));
        let reason = || "HTTP 400".to_owned();
        assert!(matches!(
            said(ProviderError::Throttled {
                retry_after_ms: None,
                reason: reason()
            }),
            Joined::NotSent(_)
        ));
        assert!(matches!(
            said(ProviderError::Permanent { reason: reason() }),
            Joined::Refused(_)
        ));
        assert_eq!(
            said(ProviderError::Uncertain { evidence: reason() }),
            Joined::Unseen
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_gathering_past_the_bytes_a_batch_holds_goes_as_several() {
        let provider = SimulatedProvider::new().with_batches();
        let providers = [&provider];
        let gather = Gather::default();
        let _lanes = gather.lanes(3, 16);
        // Each line is 29 bytes: two fit in 60, the third goes in a batch of its own.
        let small = Window {
            max_bytes: 60,
            ..WINDOW
        };
        let joins =
            ["a", "b", "c"].map(|id| gather.join(&providers, group(), line(id), small, never()));
        let sent = futures::future::join_all(joins).await;
        assert!(sent.iter().all(|s| matches!(s, Joined::In(_))));
        assert_eq!(provider.batch_sizes(), vec![2, 1]);
        // Nobody asked for the batches' jobs: none are kept.
        assert!(gather.take_created().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn each_batch_created_is_kept_with_its_jobs_until_taken_when_the_window_lists_them() {
        let provider = SimulatedProvider::new().with_batches();
        let providers = [&provider];
        let gather = Gather::default();
        let _lanes = gather.lanes(3, 16);
        let listed = Window {
            max_bytes: 60,
            lists_members: true,
            ..WINDOW
        };
        let joins =
            ["a", "b", "c"].map(|id| gather.join(&providers, group(), line(id), listed, never()));
        let sent = futures::future::join_all(joins).await;
        let ids: Vec<String> = sent
            .iter()
            .map(|s| match s {
                Joined::In(batch) => batch.clone(),
                other => panic!("{other:?}"),
            })
            .collect();
        let created = gather.take_created();
        let jobs = |batch: &str| -> Vec<String> {
            let (_, members) = created.iter().find(|(b, _)| b == batch).expect("listed");
            members.iter().map(|m| m.job_id.clone()).collect()
        };
        assert_eq!(created.len(), 2, "{created:?}");
        assert_eq!(jobs(&ids[0]), ["job-a", "job-b"]);
        assert_eq!(jobs(&ids[2]), ["job-c"]);
        // Taken once.
        assert!(gather.take_created().is_empty());
    }

    const WINDOW: Window = Window {
        wait: Duration::from_secs(60),
        max_lines: 100,
        max_bytes: MAX_BATCH_BYTES,
        lists_members: false,
    };

    #[tokio::test(start_paused = true)]
    async fn lines_go_as_one_batch_once_every_running_record_waits() {
        let provider = SimulatedProvider::new().with_batches();
        let providers = [&provider];
        let gather = Gather::default();
        let lanes = gather.lanes(3, 16);
        let joins = (0..3)
            .map(|i| gather.join(&providers, group(), line(&format!("l{i}")), WINDOW, never()));
        let started = tokio::time::Instant::now();
        let sent = futures::future::join_all(joins).await;
        assert!(
            sent.iter()
                .all(|s| *s == Joined::In("simbatch-1".to_owned()))
        );
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
        let joins = (0..4)
            .map(|i| gather.join(&providers, group(), line(&format!("l{i}")), WINDOW, never()));
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
        let join = gather.join(&providers, group(), line("l1"), WINDOW, never());
        let done_later = async {
            tokio::time::sleep(Duration::from_secs(5)).await;
            drop(other);
        };
        let (sent, ()) = tokio::join!(join, done_later);
        assert_eq!(sent, Joined::In("simbatch-1".to_owned()));
        let waited = started.elapsed();
        assert!(waited >= Duration::from_secs(5) && waited < Duration::from_secs(6));
        // A record that never comes: the window closes the batch.
        let hung = gather.lanes(2, 16);
        let started = tokio::time::Instant::now();
        let sent = gather
            .join(&providers, group(), line("l2"), WINDOW, never())
            .await;
        assert_eq!(sent, Joined::In("simbatch-2".to_owned()));
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
            gather.join(&providers, group(), line("gone"), small, never()),
        )
        .await;
        assert!(left.is_err());
        let joins = (0..2)
            .map(|i| gather.join(&providers, group(), line(&format!("l{i}")), small, never()));
        let sent = futures::future::join_all(joins).await;
        assert!(sent.iter().all(|s| matches!(s, Joined::In(_))));
        assert_eq!(provider.batch_sizes(), vec![2]);
    }
}
