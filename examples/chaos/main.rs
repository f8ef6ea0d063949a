//! `make chaos`: the fault-injection simulation. Runs the real handler over a seeded model of
//! SQS, Lambda, DynamoDB and the provider in virtual time, checks the invariants and prints the
//! figures. A failing seed prints the command that replays it.
//!
//! `cargo run --release --example chaos -- [--seed N] [--jobs N] [--consumers N] [--seeds N]`
//!
//! `make scale` runs the scale scenario instead (`--scale`): a burst of jobs against a
//! rate-limited provider, with `--jobs`, `--concurrency`, `--rpm`, `--tpm`, `--call-ms`;
//! `--tenants` and `--urgent` run its fairness and priority scenarios (a burst of `--jobs`,
//! default 50,000, and a trickle whose latency is measured), and `--producers` a producer's
//! trickle behind another producer that rotates a thousand tenants and message groups (a burst
//! of `--jobs`, default 10,000). `--mixed` runs a backlog of jobs due from minutes to two days
//! through each way of picking their paths (`--jobs`, default 10,000).

mod mixed;
mod scale;
mod sim;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str, default: u64| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let first = arg("--seed", 1);
    let seeds = arg("--seeds", 1);
    // The fairness and priority runs: each scenario unloaded, loaded without its remedy, and
    // loaded with it, the trickle's latency compared (goal: p99 within twice the unloaded).
    let tenants = args.iter().any(|a| a == "--tenants");
    let producers = args.iter().any(|a| a == "--producers");
    if tenants || producers || args.iter().any(|a| a == "--urgent") {
        // The producers' runs keep a share pacer per account in each environment: a burst of
        // 50,000 over a thousand accounts takes a quarter of an hour of wall time a run.
        let burst = arg("--jobs", if producers { 10_000 } else { 50_000 }) as usize;
        use scale::ScaleConfig;
        let runs = if producers {
            vec![
                ("unloaded", ScaleConfig::producers(first, 0, 100)),
                (
                    "behind another producer's burst rotating 1,000 tenants and groups, fair queue, each account at most 50 %",
                    ScaleConfig::producers(first, burst, 100),
                ),
                (
                    "the same, each producer at most 50 % of the pace",
                    ScaleConfig::producers(first, burst, 50),
                ),
            ]
        } else if tenants {
            vec![
                ("unloaded", ScaleConfig::tenants(first, 0, false, 100)),
                (
                    "behind a burst, one queue order",
                    ScaleConfig::tenants(first, burst, false, 100),
                ),
                (
                    "behind a burst, fair queue",
                    ScaleConfig::tenants(first, burst, true, 100),
                ),
                (
                    "behind a burst, fair queue, each tenant at most 50 % of the pace",
                    ScaleConfig::tenants(first, burst, true, 50),
                ),
            ]
        } else {
            vec![
                ("unloaded", ScaleConfig::urgent(first, 0, true)),
                (
                    "behind a backlog, same queue",
                    ScaleConfig::urgent(first, burst, false),
                ),
                (
                    "behind a backlog, urgent queue",
                    ScaleConfig::urgent(first, burst, true),
                ),
            ]
        };
        let mut unloaded = 0.0;
        for (name, config) in runs {
            let started = std::time::Instant::now();
            let report = scale::run_blocking(&config);
            println!("== {name}");
            report.print(&config);
            println!("  wall time: {:.1} s", started.elapsed().as_secs_f64());
            let p99 = report.trickle_quantile(0.99);
            if name == "unloaded" {
                unloaded = p99;
            } else {
                println!(
                    "  p99 {:.1} s = {:.2} x unloaded (goal: at most 2)",
                    p99,
                    p99 / unloaded.max(0.001)
                );
            }
        }
        return;
    }
    if args.iter().any(|a| a == "--mixed") {
        let started = std::time::Instant::now();
        let reports = mixed::run(
            first,
            arg("--jobs", 10_000) as usize,
            arg("--consumers", 40) as usize,
        );
        println!("- wall time: {:.1} s", started.elapsed().as_secs_f64());
        if reports.iter().any(|r| !r.violations.is_empty()) {
            std::process::exit(1);
        }
        return;
    }
    if args.iter().any(|a| a == "--scale") {
        for seed in first..first + seeds {
            let mut config = scale::ScaleConfig::burst(seed);
            config.jobs = arg("--jobs", config.jobs as u64) as usize;
            config.concurrency = arg("--concurrency", config.concurrency as u64) as usize;
            config.rpm = arg("--rpm", config.rpm);
            config.tpm = arg("--tpm", config.tpm);
            config.paced_spread_s = arg("--spread-s", config.paced_spread_s as u64) as i64;
            config.pacing.horizon_ms = arg("--horizon-ms", config.pacing.horizon_ms as u64) as i64;
            if args.iter().any(|a| a == "--no-schedule") {
                config.schedule_share = None;
            } else if args.iter().any(|a| a == "--share") {
                config.schedule_share = Some(arg("--share", 100) as f64 / 100.0);
            }
            if let Some(ms) = args
                .iter()
                .position(|a| a == "--call-ms")
                .map(|_| arg("--call-ms", 0))
            {
                config.call_ms = (ms, ms);
            }
            let started = std::time::Instant::now();
            let report = scale::run_blocking(&config);
            report.print(&config);
            println!("  wall time: {:.1} s", started.elapsed().as_secs_f64());
            // `make bench` draws the burst minute by minute from this file.
            if let Some(i) = args.iter().position(|a| a == "--series") {
                let path = args.get(i + 1).expect("--series FILE");
                let json = serde_json::to_string(&report.minutes).expect("minutes as JSON");
                std::fs::write(path, json).expect("write the series");
            }
        }
        return;
    }
    let jobs = arg("--jobs", 10_000) as usize;
    let consumers = arg("--consumers", 40) as usize;
    let mut failed = false;
    for seed in first..first + seeds {
        let config = sim::ChaosConfig {
            seed,
            jobs,
            consumers,
            batch_size: 10,
            faults: sim::FaultRates::all(),
            mix: None,
        };
        let started = std::time::Instant::now();
        let report = sim::run_blocking(&config);
        report.print(&config);
        println!("  wall time: {:.1} s", started.elapsed().as_secs_f64());
        if !report.violations.is_empty() {
            failed = true;
            println!(
                "  replay: cargo run --release --example chaos -- --seed {seed} --jobs {jobs} --consumers {consumers}"
            );
        }
    }
    if failed {
        std::process::exit(1);
    }
}
