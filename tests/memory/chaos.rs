//! The fault-injection simulation at a small size for a fixed set of seeds: every fault kind
//! enabled, every invariant checked (`make chaos` runs the full size).

use crate::sim;

#[test]
fn fixed_seeds_keep_every_invariant_under_every_fault() {
    // Every edge the worker guards against must be met: the rarer ones (a failed store of an
    // answer is 5 % of the few large answers) on the first four seeds or on up to four more.
    const EDGES: [&str; 49] = [
        "batch_answer_lost",
        "batch_refused",
        "batch_results_cut",
        "gateway_error",
        "oversized_answer",
        "ddb_stall",
        "ddb_timeout",
        "retrieval_stall",
        "retrieval_error",
        "short_invocation",
        "lapse_alone",
        "large_answer",
        "store_error",
        "store_slow",
        "store_lost_answer",
        "poison_message",
        "dlq_send_failure",
        "pause_after_claim",
        "pause_before_stored_accept",
        "provider_throttle",
        "reconciler_resent",
        "large_input",
        "input_expired",
        "claim_and_read_lost",
        "event_sized_answer",
        "event_publish_failure",
        "dead_letter_too_large",
        "document_too_costly",
        "trigger_never_sent",
        "reconciler_walk_past",
        "deadline_past_reach",
        "invalid_answer",
        "truncated_answer",
        "foreign_job_id",
        "planted_job_attribute",
        "operator_cancel",
        "cancel_running",
        "cancel_idle",
        "message_lost",
        "retention_passed",
        "reconciler_message_lost",
        "crash_loop",
        "reconciler_redriven",
        "flex_refused",
        "long_deadline",
        "webhook_lost",
        "webhook_again",
        "webhook_forged",
        "webhook_cut_off",
    ];
    let mut pushed_runs = 0;
    let mut seen = std::collections::BTreeSet::new();
    for seed in 1..=8 {
        if seed > 4 && EDGES.iter().all(|kind| seen.contains(kind)) {
            break;
        }
        let config = sim::ChaosConfig {
            seed,
            jobs: 400,
            consumers: 8,
            batch_size: 10,
            faults: sim::FaultRates::all(),
            mix: None,
        };
        let report = sim::run_blocking(&config);
        seen.extend(report.faults.keys().copied());
        assert!(
            report.violations.is_empty(),
            "seed {seed}: {:#?}\nreplay: cargo run --release --example chaos -- --seed {seed} --jobs 400 --consumers 8",
            report.violations
        );
        assert_eq!(report.end_states.values().sum::<u64>(), 400);
        // The run really was faulty, and most jobs still succeeded.
        assert!(report.faults.len() >= 8, "seed {seed}: {:?}", report.faults);
        assert!(
            report.end_states.get("succeeded").copied().unwrap_or(0) > 300,
            "seed {seed}: {:?}",
            report.end_states
        );
        // With webhooks, most batch jobs succeed within a minute of their batch's end; the looks
        // alone (ten minutes apart here) take about five on the median.
        let mut waits = report.batch_to_succeeded_ms.clone();
        waits.sort_unstable();
        if report.webhooks && !waits.is_empty() {
            pushed_runs += 1;
            let median = waits[waits.len() / 2];
            assert!(
                median < 60_000,
                "seed {seed}: median {median} ms over {waits:?}"
            );
        }
    }
    assert!(pushed_runs > 0, "no run took webhooks");
    for kind in EDGES {
        assert!(seen.contains(kind), "{kind} never injected: {seen:?}");
    }
}

#[test]
fn the_same_seed_replays_the_same_run() {
    let config = sim::ChaosConfig {
        seed: 11,
        jobs: 200,
        consumers: 4,
        batch_size: 10,
        faults: sim::FaultRates::all(),
        mix: None,
    };
    let a = sim::run_blocking(&config);
    let b = sim::run_blocking(&config);
    assert_eq!(a.faults, b.faults);
    assert_eq!(a.end_states, b.end_states);
    assert_eq!(a.deliveries, b.deliveries);
}

#[test]
fn in_a_mixed_backlog_the_chooser_pays_less_than_standard_and_meets_as_many_deadlines() {
    // GIVEN one backlog of jobs due from five minutes to two days, flex and batches refused at
    // random, some batches taking most of a day
    let run = |mix| {
        sim::run_blocking(&sim::ChaosConfig {
            seed: 3,
            jobs: 200,
            consumers: 8,
            batch_size: 10,
            faults: sim::FaultRates::paths(),
            mix: Some(mix),
        })
    };
    // WHEN it runs everything at the standard price, and then through the chooser
    let standard = run(sim::Mix::Standard);
    let chosen = run(sim::Mix::Chooser { webhooks: false });
    // THEN every invariant holds in both, and the standard run paid only standard calls
    for report in [&standard, &chosen] {
        assert!(report.violations.is_empty(), "{:#?}", report.violations);
        assert!(report.met_deadline >= 195, "{:?}", report.end_states);
    }
    assert_eq!(
        standard.paid_by_path.keys().copied().collect::<Vec<_>>(),
        ["standard"]
    );
    // AND the chooser took the cheaper paths, flex and batches, for well under the standard
    // bill, and missed no more deadlines than the standard path did
    assert!(
        chosen.paid_by_path.get("flex") > Some(&100) && chosen.paid_by_path.contains_key("batch"),
        "{:?}",
        chosen.paid_by_path
    );
    assert!(
        chosen.model_cost_micros * 10 < standard.model_cost_micros * 8,
        "{} against {}",
        chosen.model_cost_micros,
        standard.model_cost_micros
    );
    assert!(
        chosen.met_deadline >= standard.met_deadline,
        "{} against {}: {:?}",
        chosen.met_deadline,
        standard.met_deadline,
        chosen.end_states
    );
}
