use super::*;
use crate::clock::ManualClock;
use crate::ledger::schedule::MemorySchedule;

const T: Millis = 1_800_000_000_000;

fn sixteen() -> PacingSettings {
    PacingSettings {
        max_in_flight: 16,
        ..PacingSettings::default()
    }
}

#[tokio::test]
async fn a_retry_after_stops_every_new_call_of_the_environment_until_it_passes() {
    let pacer = Pacer::new(sixteen(), None);
    let clock = ManualClock::at(T);
    pacer.throttled(T, Some(30_000));
    // Past the horizon: the record is deferred for the rest of the wait.
    assert_eq!(
        pacer.admit(0, &clock, Millis::MAX).await.err(),
        Some(30_000)
    );
    clock.advance(30_000);
    assert!(pacer.admit(0, &clock, Millis::MAX).await.is_ok());
}

#[tokio::test]
async fn calls_refused_together_are_sent_again_no_more_than_the_lowered_limit_allows() {
    // GIVEN ten calls in flight under a limit of ten, all refused for the rate limit with
    // a one-second Retry-After (the limit halves to five)
    let settings = PacingSettings {
        max_in_flight: 10,
        ..PacingSettings::default()
    };
    let pacer = Pacer::new(settings, None);
    let clock = ManualClock::at(T);
    let mut permits = Vec::new();
    for _ in 0..10 {
        permits.push(pacer.admit(0, &clock, Millis::MAX).await.expect("room"));
    }
    pacer.throttled(T, Some(1_000));
    assert_eq!(pacer.limit(), 5.0);
    // WHEN the pause is over and all ask to send again at once, with no answer in between
    let clock = crate::clock::SystemClock;
    let now = clock.now_ms();
    pacer.lock().paused_until = now;
    let asks = (0..10).map(|_| pacer.resend(&clock, now, now + 200));
    let resent = futures::future::join_all(asks)
        .await
        .into_iter()
        .filter(|sent| *sent)
        .count();
    // THEN five go, and the other five wait for answers: the limit holds for re-sends
    assert_eq!(resent, 5);
    // AND every permit still counts as in flight until it is dropped
    assert_eq!(pacer.lock().in_flight, 10);
    drop(permits);
    assert_eq!(pacer.lock().in_flight, 0);
}

/// A schedule whose table throttles every request, counting them.
#[derive(Debug, Default)]
struct ThrottledSchedule {
    asked: std::sync::atomic::AtomicU32,
}

impl CallSchedule for ThrottledSchedule {
    fn reserve(
        &self,
        _: ReserveRequest,
    ) -> futures::future::BoxFuture<'_, Result<Reservation, LedgerError>> {
        self.asked.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Box::pin(async {
            Err(LedgerError::Throttled {
                operation: "reserve",
            })
        })
    }
    fn peek<'a>(
        &'a self,
        _: &'a str,
    ) -> futures::future::BoxFuture<'a, Result<Option<crate::ledger::schedule::Booked>, LedgerError>>
    {
        self.asked.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Box::pin(async { Err(LedgerError::Throttled { operation: "peek" }) })
    }
}

#[tokio::test(start_paused = true)]
async fn a_throttled_schedule_defers_the_record_instead_of_calling_unpaced() {
    // GIVEN a pacer whose shared schedule is throttled by the table (as it would be for
    // every environment of the fleet at once)
    let schedule = Arc::new(ThrottledSchedule::default());
    let settings = PacingSettings {
        limits: Limits { rpm: 60, tpm: 0 },
        ..sixteen()
    };
    let pacer = Pacer::new(settings, Some(schedule.clone() as Arc<dyn CallSchedule>));
    let clock = ManualClock::at(T);
    // WHEN a record asks for capacity
    let first = pacer.admit(0, &clock, Millis::MAX).await;
    // THEN it waits (no call without the schedule's say), and a second record at the same
    // moment does not ask the table again
    assert!(first.is_err(), "called unpaced");
    let asked = schedule.asked.load(std::sync::atomic::Ordering::SeqCst);
    assert!(pacer.admit(0, &clock, Millis::MAX).await.is_err());
    assert_eq!(
        schedule.asked.load(std::sync::atomic::Ordering::SeqCst),
        asked
    );
}

#[test]
fn the_limit_halves_on_each_429_and_grows_back_by_one_over_a_window_of_answers() {
    let pacer = Pacer::new(sixteen(), None);
    assert_eq!(pacer.limit(), 16.0);
    pacer.throttled(T, None);
    // The refusals of calls sent together are one signal.
    pacer.throttled(T + 10, None);
    assert_eq!(pacer.limit(), 8.0);
    pacer.throttled(T + 1_000, None);
    assert_eq!(pacer.limit(), 4.0);
    for _ in 0..4 {
        pacer.answered();
    }
    assert!((pacer.limit() - 5.0).abs() < 0.2, "{}", pacer.limit());
    for _ in 0..1_000 {
        pacer.answered();
    }
    assert_eq!(pacer.limit(), 16.0);
}

#[tokio::test(start_paused = true)]
async fn a_full_schedule_defers_the_record_and_is_not_asked_again_at_once() {
    let schedule = Arc::new(MemorySchedule::new());
    let limits = Limits { rpm: 60, tpm: 0 };
    // Somebody booked the next two minutes.
    let booked = ReserveRequest {
        key: "provider".into(),
        limits,
        requests: 120,
        tokens: 0,
        now: T,
        horizon_ms: 0,
    };
    assert!(matches!(
        schedule.reserve(booked.clone()).await,
        Ok(Reservation::Granted { .. })
    ));
    let settings = PacingSettings {
        limits,
        ..sixteen()
    };
    let pacer = Pacer::new(settings, Some(schedule.clone() as Arc<dyn CallSchedule>));
    let clock = ManualClock::at(T);
    assert_eq!(
        pacer.admit(0, &clock, Millis::MAX).await.err(),
        Some(120_000)
    );
    assert_eq!(schedule.writes(), 2);
    // The next record learns it from the environment, with no write.
    assert_eq!(
        pacer.admit(0, &clock, Millis::MAX).await.err(),
        Some(120_000)
    );
    assert_eq!(schedule.writes(), 2);
    // Meanwhile others book two more minutes. Having been refused, the environment reads
    // before it writes again, and finds the capacity still booked: no write.
    let more = ReserveRequest {
        now: T + 1_000,
        horizon_ms: 3_600_000,
        ..booked
    };
    assert!(schedule.reserve(more).await.is_ok());
    clock.advance(115_000);
    let later = pacer.admit(0, &clock, Millis::MAX).await;
    assert_eq!(later.err(), Some(125_000));
    assert_eq!(schedule.writes(), 3);
    // Once the booked time is within the horizon, a chunk is reserved and used.
    clock.advance(120_000);
    let permit = pacer.admit(0, &clock, Millis::MAX).await;
    assert!(permit.is_ok());
    assert_eq!(schedule.writes(), 4);
}

#[tokio::test(start_paused = true)]
async fn a_permit_not_spent_gives_its_call_back_to_the_pool() {
    let schedule = Arc::new(MemorySchedule::new());
    let settings = PacingSettings {
        limits: Limits { rpm: 600, tpm: 0 },
        chunk: 1,
        ..sixteen()
    };
    let pacer = Pacer::new(settings, Some(schedule.clone() as Arc<dyn CallSchedule>));
    let clock = ManualClock::at(T);
    // A delivery that finds its job finished makes no call: its capacity is not lost.
    drop(pacer.admit(0, &clock, Millis::MAX).await.expect("admitted"));
    let mut permit = pacer.admit(0, &clock, Millis::MAX).await.expect("admitted");
    assert_eq!(schedule.writes(), 1);
    permit.spend();
    drop(permit);
    assert!(pacer.admit(0, &clock, Millis::MAX).await.is_ok());
    assert_eq!(schedule.writes(), 2);
}

#[test]
fn the_token_estimate_is_the_input_and_the_answers_ceiling() {
    let settings = PacingSettings {
        limits: Limits { rpm: 0, tpm: 1_000 },
        ..PacingSettings::default()
    };
    let pacer = Pacer::new(settings, None);
    let policy = Policy::default();
    // The ceiling is read from the parameters, where the providers read it, in any spelling.
    let input = r#"{"parameters":{"max_tokens":300},"prompt":"abcdefgh"}"#;
    assert_eq!(pacer.estimated_tokens(input, &policy), 14 + 300);
    let bedrock = r#"{"parameters":{"maxTokens":300},"prompt":"abcdefgh"}"#;
    assert_eq!(pacer.estimated_tokens(bedrock, &policy), 13 + 300);
    // A key of that name outside the parameters reaches no provider: the call is sent,
    // and counted, with the deployment's bound.
    let outside = r#"{"max_tokens":300,"prompt":"abcdefghijklmnopqrstuvwxyzabcdefgh"}"#;
    assert_eq!(pacer.estimated_tokens(outside, &policy), 16 + 16_384);
    // No token limit: nothing is parsed.
    assert_eq!(
        Pacer::new(sixteen(), None).estimated_tokens(input, &policy),
        0
    );
}
