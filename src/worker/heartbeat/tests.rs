use super::*;
use crate::job::NewJob;
use crate::ledger::memory::InMemoryLedger;
use crate::queue::RecordingVisibility;

const NOW: Millis = 1_000_000;

/// Tokio's clock as Unix ms, so the heartbeat's sums and its ticks share one paused time.
struct PausedClock {
    base: Millis,
    start: tokio::time::Instant,
}

impl Clock for PausedClock {
    fn now_ms(&self) -> Millis {
        self.base + self.start.elapsed().as_millis() as Millis
    }
}

/// A heartbeat's world in paused time: one record of a claimed job (epoch 1, the default
/// 60 s lease) in flight, on an in-memory ledger and a recording queue, default settings.
struct Rig {
    clock: PausedClock,
    ledger: InMemoryLedger,
    visibility: RecordingVisibility,
    flights: Flights,
    settings: Settings,
}

impl Rig {
    async fn one_running() -> Rig {
        let clock = PausedClock {
            base: NOW,
            start: tokio::time::Instant::now(),
        };
        let ledger = InMemoryLedger::new();
        let now = clock.now_ms();
        let claim = crate::ledger::ClaimRequest {
            job: NewJob::example("j", now + 3_600_000),
            expect: crate::job::Expect::FRESH,
            owner_id: "w".into(),
            now,
            lease_until: now + 60_000,
            provider_ref: None,
            route: None,
            first_sight: false,
            list_due: false,
        };
        ledger.claim(claim).await.expect("claim");
        let flights = Flights::new(
            vec![Delivered {
                queue_arn: Some("arn:q".into()),
                receipt_handle: Some("h".into()),
                received_at: now,
            }],
            30,
        );
        flights.running(0, "j", 1, now + 60_000, now + 3_600_000);
        Rig {
            clock,
            ledger,
            visibility: RecordingVisibility::new(),
            flights,
            settings: Settings::default(),
        }
    }

    fn beat(&self) -> Heartbeat<'_, InMemoryLedger, RecordingVisibility, PausedClock> {
        Heartbeat {
            flights: &self.flights,
            ledger: &self.ledger,
            visibility: &self.visibility,
            clock: &self.clock,
            settings: &self.settings,
        }
    }
}

#[tokio::test(start_paused = true)]
async fn the_heartbeat_ticks_on_its_interval_renews_the_lease_before_it_runs_short_and_stops_when_told()
 {
    // GIVEN a record in flight whose job holds a 60 s lease, and a 10 s heartbeat
    let rig = Rig::one_running().await;
    let stop = CancellationToken::new();
    // WHEN it runs for 35 s of paused time, then is stopped, and 60 s more pass
    let run = rig.beat().run(stop.clone());
    let watch = async {
        tokio::time::sleep(Duration::from_millis(35_000)).await;
        stop.cancel();
    };
    tokio::join!(run, watch);
    tokio::time::sleep(Duration::from_millis(60_000)).await;
    // THEN it ticked at 10, 20 and 30 s and never after: one visibility call a tick, each
    // to the queue's timeout from then
    let stats = rig.flights.snapshot();
    assert_eq!(stats.heartbeat_ticks, 3);
    assert_eq!(stats.heartbeat_late, 0);
    let changes = rig.visibility.changes();
    assert_eq!(changes.len(), 3);
    assert!(changes.iter().all(|(_, c)| c.seconds == 30));
    // AND the lease was renewed once it would no longer outlast three more ticks (at 30 s,
    // not at 10 or 20), to a full lease from then
    assert_eq!(stats.lease_renewed, 1);
    let item = rig.ledger.get("j").await.expect("get").expect("item");
    assert_eq!(item.owner_until, Some(NOW + 30_000 + 60_000));
    assert_eq!(rig.flights.lease_until(0), Some(NOW + 30_000 + 60_000));
}

#[tokio::test(start_paused = true)]
async fn a_tick_held_up_by_a_blocked_thread_is_counted_late() {
    // GIVEN a running heartbeat of 10 s
    let rig = Rig::one_running().await;
    let stop = CancellationToken::new();
    // WHEN the clock jumps 16 s past a tick without the runtime polling (a step that held
    // the thread), then the heartbeat is stopped
    let watch = async {
        tokio::time::sleep(Duration::from_millis(1_000)).await;
        tokio::time::advance(Duration::from_millis(25_000)).await;
        tokio::time::sleep(Duration::from_millis(1)).await;
        stop.cancel();
    };
    tokio::join!(rig.beat().run(stop.clone()), watch);
    // THEN that tick ran, late, and was counted
    let stats = rig.flights.snapshot();
    assert!(stats.heartbeat_ticks >= 1, "{stats:?}");
    assert!(stats.heartbeat_late >= 1, "{stats:?}");
}
