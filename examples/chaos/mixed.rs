//! `--mixed`: one backlog of jobs due from five minutes to two days, run through each way of
//! picking a job's path: everything at the standard price, `deferrable` marked by hand, and the
//! worker's chooser (without and with the provider's webhooks). Each run is the fault
//! simulation's world with the same seed, its faults off but the paths' own refusals.

use crate::sim::{self, ChaosConfig, ChaosReport, FaultRates, Mix};

/// The deployments compared, in the order printed.
const RUNS: [(&str, Mix); 4] = [
    ("everything standard", Mix::Standard),
    ("deferrable by hand (due in 25 h or more)", Mix::ByHand),
    ("the chooser", Mix::Chooser { webhooks: false }),
    (
        "the chooser, with webhooks",
        Mix::Chooser { webhooks: true },
    ),
];

/// Runs the backlog of `jobs` jobs (seed `seed`) through each deployment and prints a table;
/// returns each run's report, in [`RUNS`]' order.
pub fn run(seed: u64, jobs: usize, consumers: usize) -> Vec<ChaosReport> {
    println!(
        "A mixed backlog: {jobs} jobs sent over two hours, due 5 minutes to 2 days after \
         (log-uniform); each call 1,000 tokens in and 500 out at $1.00 / $4.00 a million (flex and \
         batch half); flex three times as slow and refused one call in five, one batch create in \
         twenty refused, one batch in ten ending after the hour (up to 24 h); seed {seed}, \
         {consumers} consumers."
    );
    println!();
    println!(
        "| deployment | model cost per million jobs | ÷ everything standard | met their deadline | paid calls by path | a batch's end to succeeded, median | invariant violations |"
    );
    println!("| --- | ---: | ---: | ---: | --- | ---: | ---: |");
    let mut reports = Vec::new();
    let mut standard = None;
    for (name, mix) in RUNS {
        let config = ChaosConfig {
            seed,
            jobs,
            consumers,
            batch_size: 10,
            faults: FaultRates::paths(),
            mix: Some(mix),
        };
        let report = sim::run_blocking(&config);
        let per_million = per_million(&report);
        let base = *standard.get_or_insert(per_million);
        println!(
            "| {name} | ${per_million:.2} | {:.3} | {} of {} ({:.2} %) | {} | {} | {} |",
            per_million / base,
            report.met_deadline,
            report.jobs,
            100.0 * report.met_deadline as f64 / report.jobs as f64,
            sim::listed(&report.paid_by_path),
            median_s(&report.batch_to_succeeded_ms)
                .map_or("–".to_owned(), |s| format!("{s:.1} s")),
            report.violations.len()
        );
        reports.push(report);
    }
    println!();
    for (report, (name, _)) in reports.iter().zip(RUNS) {
        if report.end_states.get("succeeded").copied().unwrap_or(0) < report.jobs as u64 {
            println!("- {name}: jobs ending {}", sim::listed(&report.end_states));
        }
        for v in report.violations.iter().take(10) {
            println!("- {name}: {v}");
        }
    }
    reports
}

/// The model's cost of a million such jobs, dollars: the run's micro-dollars a job.
pub fn per_million(report: &ChaosReport) -> f64 {
    report.model_cost_micros as f64 / report.jobs.max(1) as f64
}

fn median_s(ms: &[fenced_jobs::job::Millis]) -> Option<f64> {
    let mut sorted = ms.to_vec();
    sorted.sort_unstable();
    sorted.get(sorted.len() / 2).map(|m| *m as f64 / 1_000.0)
}
