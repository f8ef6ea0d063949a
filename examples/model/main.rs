//! `make model-check`: checks the ledger protocol over every interleaving within a bound, then
//! shows that each property bites: each mutation of the protocol must produce a counterexample,
//! printed as a timeline.
//!
//! `cargo run --release --example model -- [--small | --test | --background | --resend | --world |
//! --full-world] [--queue] [--threads N] [--no-mutations]
//! [--workers N] [--deliveries N] [--deadline N] [--budget N] [--lease N] [--faults N]
//! [--upstreams blind,keyed,background,batch] [--never-replay] [--[no-]pacing] [--[no-]short]
//! [--[no-]silent] [--[no-]followers] [--[no-]invalid] [--mutation NAME]`; with `--queue`, the
//! message on its queue alone: `[--test] [--max-receives N] [--slow N] [--crashes N]`

mod protocol;
mod queue;

use protocol::{Bounds, Mutation, Report, Upstream, Verdict, check};
use queue::{QueueBounds, QueueMutation};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let flag = |name: &str| args.iter().any(|a| a == name);
    let number = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse::<i64>().ok())
    };
    let threads = number("--threads").map_or_else(
        || std::thread::available_parallelism().map_or(1, |n| n.get()),
        |n| n as usize,
    );
    let mut bounds = if flag("--small") {
        Bounds::small()
    } else if flag("--test") {
        Bounds::test()
    } else if flag("--background") {
        Bounds::background()
    } else if flag("--resend") {
        Bounds::resend()
    } else if flag("--world") {
        Bounds::world()
    } else if flag("--full-world") {
        Bounds::full_world()
    } else if flag("--spend") {
        Bounds::spend()
    } else if flag("--cancel") {
        Bounds::cancel()
    } else if flag("--full-cancel") {
        Bounds::full_cancel()
    } else if flag("--lost") {
        Bounds::lost()
    } else {
        Bounds::full()
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
                other => panic!("no upstream {other:?}: blind, keyed, background or batch"),
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
        bounds.replay = vec![fenced_jobs::worker::ReplayPolicy::Never];
    }
    let only = args
        .iter()
        .position(|a| a == "--mutation")
        .and_then(|i| args.get(i + 1));
    if let Some(name) = only {
        // One mutation alone, in its own bound.
        if let Some(mutation) = QueueMutation::ALL
            .into_iter()
            .find(|m| *name == format!("{m:?}"))
        {
            std::process::exit(i32::from(!queue_bites(mutation, threads)));
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
        std::process::exit(i32::from(!bites(mutation, threads)));
    }
    if flag("--queue") {
        // The message on its queue alone: its bound, then its mutations.
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
        let mut failed = !check_queue(&bounds, threads);
        if !flag("--no-mutations") {
            for mutation in QueueMutation::ALL {
                failed |= !queue_bites(mutation, threads);
            }
        }
        std::process::exit(i32::from(failed));
    }
    println!("{}", bounds.describe());
    let report = check(&bounds, threads, false);
    print_report(&report);
    let mut failed = !report.violated().is_empty();
    let mut unreached: Vec<&str> = report
        .verdicts
        .iter()
        .filter(|(_, v)| *v == Verdict::Unreached)
        .map(|(name, _)| *name)
        .collect();
    // The model-check bound's lease leaves a re-send no room: its own bound reaches it.
    let full = ![
        "--small",
        "--test",
        "--background",
        "--resend",
        "--world",
        "--full-world",
        "--spend",
        "--cancel",
        "--full-cancel",
        "--lost",
    ]
    .iter()
    .any(|f| flag(f));
    if full {
        // The model-check bound comes in parts: the world's pacer and short invocations, a
        // lease long enough for a re-send, a job's spend limit, an operator's cancel and a
        // message lost for good, each in a bound of its own.
        for part in [
            Bounds::full_world(),
            Bounds::resend(),
            Bounds::spend(),
            Bounds::full_cancel(),
            Bounds::lost(),
        ] {
            println!("\n{}", part.describe());
            let report = check(&part, threads, false);
            print_report(&report);
            failed |= !report.violated().is_empty();
            unreached.retain(|name| {
                report
                    .verdicts
                    .iter()
                    .any(|(n, v)| n == name && *v == Verdict::Unreached)
            });
        }
    }
    if !unreached.is_empty() {
        println!("  never reached: {unreached:?}");
        failed = true;
    }
    if full {
        println!();
        failed |= !check_queue(&QueueBounds::full(), threads);
    }
    if !flag("--no-mutations") {
        println!("\nEach property bites: one mutation of the protocol each, on the test bound");
        for mutation in Mutation::ALL {
            failed |= !bites(mutation, threads);
        }
        if full {
            for mutation in QueueMutation::ALL {
                failed |= !queue_bites(mutation, threads);
            }
        }
    }
    if failed {
        std::process::exit(1);
    }
}

/// Checks `mutation` in its own bound and prints what it breaks; whether it breaks the
/// property it is there for.
fn bites(mutation: Mutation, threads: usize) -> bool {
    let report = check(&mutation.bounds(), threads, true);
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
