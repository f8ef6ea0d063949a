//! The ledger protocol checked over every interleaving within the smallest bound (`make
//! model-check` checks a larger one), and each property shown to bite: a mutation of the
//! protocol produces a counterexample, whose timeline the test prints.

#[allow(dead_code)]
#[path = "../examples/model/protocol.rs"]
mod protocol;

use protocol::{Bounds, Mutation, Verdict, check};

fn threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

#[test]
fn every_property_holds_in_the_test_bound_and_every_example_is_reached() {
    let bounds = Bounds::test();
    let report = check(&bounds, threads(), false);
    println!(
        "{}: {} distinct states, depth {}, {:.1} s",
        bounds.describe(),
        report.unique,
        report.depth,
        report.seconds
    );
    if let Some(timeline) = &report.counterexample {
        println!("{timeline}");
    }
    for (name, verdict) in &report.verdicts {
        assert!(
            matches!(verdict, Verdict::Holds | Verdict::Reached),
            "{name}: {verdict:?}"
        );
    }
    // The bound is not vacuous: the checker went through a real number of interleavings.
    assert!(report.unique > 10_000, "{} states", report.unique);
}

#[test]
fn each_property_is_broken_by_its_mutation_with_a_printed_counterexample() {
    for mutation in Mutation::ALL {
        let Some(expected) = mutation.breaks() else {
            continue;
        };
        let report = check(&mutation.bounds(), threads(), true);
        println!("{mutation:?}: breaks {:?}", report.violated());
        if let Some(timeline) = &report.counterexample {
            println!("{timeline}");
        }
        assert!(
            report.violated().contains(&expected),
            "{mutation:?} ({}) should break \"{expected}\", broke {:?}",
            mutation.describe(),
            report.violated()
        );
        assert!(report.counterexample.is_some());
    }
}
