//! `make chaos`: the fault-injection simulation. Runs the real handler over a seeded model of
//! SQS, Lambda, DynamoDB and the provider in virtual time, checks the invariants and prints the
//! figures. A failing seed prints the command that replays it.
//!
//! `cargo run --release --example chaos -- [--seed N] [--jobs N] [--consumers N] [--seeds N]`
//!
//! `make scale` runs the scale scenario instead (`--scale`): a burst of jobs against a
//! rate-limited provider, with `--jobs`, `--concurrency`, `--rpm`, `--tpm`, `--call-ms`.

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
