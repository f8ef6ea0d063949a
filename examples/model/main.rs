//! `make model-check`: checks the ledger protocol over every interleaving within a bound, then
//! shows that each property bites: each mutation of the protocol must produce a counterexample,
//! printed as a timeline.
//!
//! With no part named it checks a whole bound in its parts, then the message on its queue, then
//! every mutation: the test bound (`make model-check`), `--quick` (what `make test` checks in
//! the debug build) or `--full` (`make model-check-full`, 2 h 6 min when last measured). One part alone:
//! `--small | --test | --background | --world | --resend | --spend | --cancel | --lost | --dead |
//! --full-providers | --full-world | --full-cancel`, narrowed by `[--workers N] [--deliveries N]
//! [--deadline N] [--budget N] [--lease N] [--faults N] [--upstreams blind,keyed,background,batch]
//! [--never-replay] [--[no-]pacing] [--[no-]short] [--[no-]silent] [--[no-]followers]
//! [--[no-]invalid]`; `--mutation NAME` checks one mutation in its own bound, narrowed the same
//! way; `--no-mutations` skips them; `--threads N`. With `--queue`, the message on its queue
//! alone: `[--test] [--max-receives N] [--slow N] [--crashes N]`.

mod protocol;
mod queue;

use protocol::{Bounds, Mutation, Report, Upstream, Verdict, check};
use queue::{QueueBounds, QueueMutation};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let flag = |name: &str| args.iter().any(|a| a == name);
    let value = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
    };
    let threads = value("--threads")
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    if let Some(name) = value("--mutation") {
        std::process::exit(i32::from(!one_mutation(name, &args, threads)));
    }
    if flag("--queue") {
        std::process::exit(i32::from(!queue_alone(&args, threads)));
    }
    // One part alone, or a whole set of parts: the test bound by default (`make model-check`),
    // the quick one (`make test`'s) or the full one (`make model-check-full`).
    let one = PARTS.iter().find(|(name, _)| flag(name));
    let (parts, queue): (Vec<Bounds>, Option<QueueBounds>) = match one {
        Some((_, part)) => (vec![narrowed(part(), &args)], None),
        None if flag("--quick") => (Bounds::quick_parts().into(), Some(QueueBounds::test())),
        None if flag("--full") => (Bounds::full_parts().into(), Some(QueueBounds::full())),
        None => (Bounds::test_parts().into(), Some(QueueBounds::full())),
    };
    let mut failed = !check_parts(&parts, threads);
    if let Some(bounds) = &queue {
        println!();
        failed |= !check_queue(bounds, threads);
    }
    if !flag("--no-mutations") {
        println!("\nEach property bites: one mutation of the protocol each, in its own bound");
        for mutation in Mutation::ALL {
            failed |= !bites(mutation.bounds(), threads);
        }
        if queue.is_some() {
            for mutation in QueueMutation::ALL {
                failed |= !queue_bites(mutation, threads);
            }
        }
    }
    if failed {
        std::process::exit(1);
    }
}

/// A part of a bound, by its constructor.
type Part = fn() -> Bounds;

/// Each part a flag names alone.
const PARTS: [(&str, Part); 12] = [
    ("--small", Bounds::small),
    ("--test", Bounds::test),
    ("--background", Bounds::background),
    ("--resend", Bounds::resend),
    ("--world", Bounds::world),
    ("--spend", Bounds::spend),
    ("--cancel", Bounds::cancel),
    ("--lost", Bounds::lost),
    ("--dead", Bounds::dead),
    ("--full-providers", Bounds::full),
    ("--full-world", Bounds::full_world),
    ("--full-cancel", Bounds::full_cancel),
];

/// Checks each of `parts`, printing each report; whether every property held in all and every
/// example was reached in one of them.
fn check_parts(parts: &[Bounds], threads: usize) -> bool {
    let mut failed = false;
    let mut unreached: Option<Vec<&str>> = None;
    for part in parts {
        println!("{}", part.describe());
        let report = check(part, threads, false);
        print_report(&report);
        println!();
        failed |= !report.violated().is_empty();
        let here: Vec<&str> = report
            .verdicts
            .iter()
            .filter(|(_, v)| *v == Verdict::Unreached)
            .map(|(name, _)| *name)
            .collect();
        unreached = Some(match unreached {
            None => here,
            Some(before) => before.into_iter().filter(|n| here.contains(n)).collect(),
        });
    }
    let unreached = unreached.unwrap_or_default();
    if !unreached.is_empty() {
        println!("  never reached: {unreached:?}");
        failed = true;
    }
    // What docs/protocol.md's state diagram draws, as these bounds reach it.
    let changes = protocol::state_changes();
    println!("changes of state explored: {}", changes.len());
    for (from, to) in changes {
        println!("  {from} --> {to}");
    }
    !failed
}

/// `bounds` with what the command line changes.
fn narrowed(mut bounds: Bounds, args: &[String]) -> Bounds {
    let number = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse::<i64>().ok())
    };
    if let Some(names) = args
        .iter()
        .position(|a| a == "--upstreams")
        .and_then(|i| args.get(i + 1))
    {
        bounds.upstreams = names
            .split(',')
            .map(|name| match name {
                "blind" => Upstream::Blind,
                "keyed" => Upstream::Keyed,
                "background" => Upstream::Background,
                "batch" => Upstream::Batch,
                "flex" => Upstream::Flex,
                other => panic!("no upstream {other:?}: blind, keyed, background, batch or flex"),
            })
            .collect();
    }
    if let Some(n) = number("--workers") {
        bounds.workers = n as usize;
    }
    if let Some(n) = number("--deliveries") {
        bounds.deliveries = n as u8;
    }
    if let Some(n) = number("--deadline") {
        bounds.deadline = n;
    }
    if let Some(n) = number("--budget") {
        bounds.max_attempts = n as u32;
    }
    if let Some(n) = number("--lease") {
        bounds.lease = n;
    }
    if let Some(n) = number("--faults") {
        bounds.faults = n as u8;
    }
    // `--NAME` turns a part of the world on, `--no-NAME` off.
    let flag = |name: &str| args.iter().any(|a| a == name);
    let switch = |name: &str, on: &mut bool| {
        if flag(&format!("--{name}")) {
            *on = true;
        }
        if flag(&format!("--no-{name}")) {
            *on = false;
        }
    };
    switch("pacing", &mut bounds.pacing);
    switch("short", &mut bounds.short_invocations);
    switch("silent", &mut bounds.silent_retrievals);
    switch("followers", &mut bounds.followers);
    switch("invalid", &mut bounds.invalid_answers);
    if flag("--never-replay") {
        bounds.replay = vec![fenced_jobs::protocol::ReplayPolicy::Never];
    }
    bounds
}

/// Checks the mutation `name` alone, in its own bound as the command line narrows it; whether it
/// broke the property it is there for.
fn one_mutation(name: &str, args: &[String], threads: usize) -> bool {
    if let Some(mutation) = QueueMutation::ALL
        .into_iter()
        .find(|m| *name == format!("{m:?}"))
    {
        return queue_bites(mutation, threads);
    }
    let Some(mutation) = Mutation::ALL
        .into_iter()
        .find(|m| *name == format!("{m:?}"))
    else {
        panic!(
            "no mutation {name:?}: one of {:?} or {:?}",
            Mutation::ALL,
            QueueMutation::ALL
        );
    };
    bites(narrowed(mutation.bounds(), args), threads)
}

/// The message on its queue alone: its bound (the test one with `--test`), then its mutations
/// unless `--no-mutations`; whether all held and bit.
fn queue_alone(args: &[String], threads: usize) -> bool {
    let flag = |name: &str| args.iter().any(|a| a == name);
    let number = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse::<i64>().ok())
    };
    let mut bounds = if flag("--test") {
        QueueBounds::test()
    } else {
        QueueBounds::full()
    };
    if let Some(n) = number("--max-receives") {
        bounds.max_receive_count = n as u32;
    }
    if let Some(n) = number("--slow") {
        bounds.slow = n as u8;
    }
    if let Some(n) = number("--crashes") {
        bounds.crashes = n as u8;
    }
    let mut passed = check_queue(&bounds, threads);
    if !flag("--no-mutations") {
        for mutation in QueueMutation::ALL {
            passed &= queue_bites(mutation, threads);
        }
    }
    passed
}

/// Checks `mutation` in its own bound and prints what it breaks; whether it breaks the
/// property it is there for.
fn bites(bounds: Bounds, threads: usize) -> bool {
    let mutation = bounds.mutation.expect("a mutation's bound");
    let report = check(&bounds, threads, true);
    println!(
        "\n{mutation:?} ({}): {} states, {:.1} s; breaks {:?}",
        mutation.describe(),
        report.unique,
        report.seconds,
        report.violated()
    );
    let mut bites = true;
    if let Some(expected) = mutation.breaks()
        && !report.violated().contains(&expected)
    {
        println!("  EXPECTED to break: {expected}");
        bites = false;
    }
    if let Some(timeline) = &report.counterexample {
        print!("{timeline}");
    }
    bites
}

/// Checks the message on its queue under `bounds` and prints the report; whether every property
/// held and every example was reached.
fn check_queue(bounds: &QueueBounds, threads: usize) -> bool {
    println!("{}", bounds.describe());
    let report = queue::check(bounds, threads, false);
    print_report(&report);
    report
        .verdicts
        .iter()
        .all(|(_, v)| matches!(v, Verdict::Holds | Verdict::Reached))
}

/// Checks a mutation of the queue's rules in its own bound and prints what it breaks; whether it
/// breaks the property it is there for.
fn queue_bites(mutation: QueueMutation, threads: usize) -> bool {
    let report = queue::check(&mutation.bounds(), threads, true);
    println!(
        "\n{mutation:?} ({}): {} states, {:.1} s; breaks {:?}",
        mutation.describe(),
        report.unique,
        report.seconds,
        report.violated()
    );
    let expected = mutation.breaks();
    let bites = report.violated().contains(&expected);
    if !bites {
        println!("  EXPECTED to break: {expected}");
    }
    if let Some(timeline) = &report.counterexample {
        print!("{timeline}");
    }
    bites
}

fn print_report(report: &Report) {
    println!(
        "  {} states explored ({} distinct), depth {}, {:.1} s",
        report.states, report.unique, report.depth, report.seconds
    );
    for (name, verdict) in &report.verdicts {
        println!("  {:<10} {name}", format!("{verdict:?}").to_lowercase());
    }
    if let Some(timeline) = &report.counterexample {
        print!("{timeline}");
    }
}
