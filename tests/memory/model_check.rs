//! The ledger protocol checked over every interleaving within the quick bound (`make
//! model-check` checks the test bound in the release build, `make model-check-full` the full
//! one), and each property shown to bite: a mutation of the protocol produces a counterexample,
//! whose timeline the test prints.

// The queue's model of `make model-check`, over the protocol at the crate root (its
// `crate::protocol`).
#[allow(dead_code)]
#[path = "../../examples/model/queue.rs"]
mod queue;

use std::collections::BTreeSet;

use protocol::{Bounds, Mutation, Verdict, check};
use queue::{QueueBounds, QueueMutation};

use crate::protocol;

fn threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

fn print(bounds: &str, report: &protocol::Report) {
    println!(
        "{bounds}: {} distinct states, depth {}, {:.1} s",
        report.unique, report.depth, report.seconds
    );
    if let Some(timeline) = &report.counterexample {
        println!("{timeline}");
    }
}

#[test]
fn every_property_holds_in_the_quick_bound_and_every_example_is_reached() {
    // The quick bound comes in the test bound's seven parts with one worker, and two workers
    // racing without faults (`Bounds::quick_parts` says what each adds).
    let mut reached = BTreeSet::new();
    let mut examples = BTreeSet::new();
    for bounds in Bounds::quick_parts() {
        let report = check(&bounds, threads(), false);
        print(&bounds.describe(), &report);
        for (name, verdict) in &report.verdicts {
            match verdict {
                Verdict::Holds => {}
                Verdict::Reached => {
                    reached.insert(*name);
                    examples.insert(*name);
                }
                Verdict::Unreached => {
                    examples.insert(*name);
                }
                Verdict::Violated => panic!("{name}: violated in {}", bounds.describe()),
            }
        }
        // The bound is not vacuous: the checker went through a real number of interleavings.
        assert!(report.unique > 10_000, "{} states", report.unique);
    }
    let unreached: Vec<_> = examples.difference(&reached).collect();
    assert!(unreached.is_empty(), "never reached: {unreached:?}");
    // The diagram of the job's states in docs/protocol.md is every change the checker made.
    let drawn = drawn_changes(include_str!("../../docs/protocol.md"));
    let explored: BTreeSet<(String, String)> = protocol::state_changes()
        .into_iter()
        .map(|(from, to)| (from.to_owned(), to.to_owned()))
        .collect();
    assert_eq!(
        drawn, explored,
        "docs/protocol.md's state diagram against the model"
    );
}

/// The arrows (`from --> to`) of the first `stateDiagram-v2` in `doc`.
fn drawn_changes(doc: &str) -> BTreeSet<(String, String)> {
    let diagram = doc
        .split("```mermaid\nstateDiagram-v2\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("a state diagram");
    diagram
        .lines()
        .filter_map(|line| {
            let (from, to) = line.split_once("-->")?;
            let to = to.split(':').next()?;
            Some((from.trim().to_owned(), to.trim().to_owned()))
        })
        .collect()
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
        let timeline = report.counterexample.expect("a counterexample");
        assert!(
            timeline.contains(&format!("VIOLATED: {expected}")),
            "{mutation:?}: the timeline ends elsewhere:\n{timeline}"
        );
    }
}

#[test]
fn a_live_jobs_message_is_never_dead_lettered_and_no_visibility_passes_its_receive() {
    let bounds = QueueBounds::test();
    let report = queue::check(&bounds, threads(), false);
    print(&bounds.describe(), &report);
    for (name, verdict) in &report.verdicts {
        assert!(
            matches!(verdict, Verdict::Holds | Verdict::Reached),
            "{name}: {verdict:?}"
        );
    }
    // Past the first half of its receives, the message waits: the path is as long as the count.
    assert_eq!(report.depth as u32, bounds.max_receive_count + 2);
    assert!(report.unique > 1_000, "{} states", report.unique);
}

#[test]
fn each_rule_of_the_queue_is_broken_by_its_mutation_with_a_printed_counterexample() {
    for mutation in QueueMutation::ALL {
        let expected = mutation.breaks();
        let report = queue::check(&mutation.bounds(), threads(), true);
        println!("{mutation:?}: breaks {:?}", report.violated());
        let timeline = report.counterexample.clone().expect("a counterexample");
        println!("{timeline}");
        assert!(
            report.violated().contains(&expected),
            "{mutation:?} ({}) should break \"{expected}\", broke {:?}",
            mutation.describe(),
            report.violated()
        );
        assert!(
            timeline.contains(&format!("VIOLATED: {expected}")),
            "{mutation:?}: the timeline ends elsewhere:\n{timeline}"
        );
    }
}
