//! The scale scenario at a small size: a burst against a provider that enforces requests and
//! tokens per minute. With the shared schedule the limit is used and hardly exceeded; without
//! it, 429s are many, and still no job fails for them alone (`make scale` runs the full size).

// The scenario of `make scale`, on the simulation at the crate root (its `crate::sim`).
#[allow(dead_code)]
#[path = "../../examples/chaos/scale.rs"]
mod scenario;

fn small(seed: u64) -> scenario::ScaleConfig {
    scenario::ScaleConfig {
        jobs: 2_000,
        concurrency: 50,
        rpm: 300,
        tpm: 180_000,
        ..scenario::ScaleConfig::burst(seed)
    }
}

#[test]
fn with_the_shared_schedule_the_limit_is_used_and_hardly_exceeded() {
    let config = small(1);
    let report = scenario::run_blocking(&config);
    assert_eq!(
        report.end_states.get("succeeded"),
        Some(&2_000),
        "{report:?}"
    );
    assert_eq!(report.failed_by_throttling, 0);
    assert!(report.throttled_share() <= 0.05, "{report:?}");
    assert!(
        report.goodput(&config) >= 0.85,
        "{:.3}",
        report.goodput(&config)
    );
    // Chunks: far fewer reservations than calls.
    assert!(report.reservations.0 * 2 < report.executed, "{report:?}");
}

#[test]
fn without_it_429s_are_many_and_no_job_fails_for_them_alone() {
    let config = scenario::ScaleConfig {
        schedule_share: None,
        ..small(2)
    };
    let report = scenario::run_blocking(&config);
    assert!(report.throttled_share() > 0.2, "{report:?}");
    assert_eq!(
        report.end_states.get("succeeded"),
        Some(&2_000),
        "{report:?}"
    );
    assert_eq!(report.failed_by_throttling, 0);
}

#[test]
fn a_backlog_of_hours_dead_letters_no_live_job() {
    // GIVEN a backlog of well over an hour of calls (1,000 jobs, 10 calls a minute, with the
    // shared schedule) on a queue that dead-letters at 100 receives, so that the jobs at the
    // back are deferred for capacity far more often than that
    let config = scenario::ScaleConfig {
        jobs: 1_000,
        concurrency: 20,
        rpm: 10,
        tpm: 1_000_000,
        max_receive: 100,
        ..scenario::ScaleConfig::burst(3)
    };
    let report = scenario::run_blocking(&config);
    // THEN no message is dead-lettered, and every job ran
    assert_eq!(report.dead_lettered, 0, "{report:?}");
    assert_eq!(
        report.end_states.get("succeeded"),
        Some(&1_000),
        "{report:?}"
    );
}
