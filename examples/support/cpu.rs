//! What the benchmarks measure CPU with, shared by `bench_batch` and `bench_heartbeat`.

/// CPU time of every live thread of this process, in nanoseconds (Linux schedstat): the
/// runtime's threads included, the emulator (another process) not.
pub fn process_cpu_ns() -> u64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    tasks
        .filter_map(|task| {
            let stat = std::fs::read_to_string(task.ok()?.path().join("schedstat")).ok()?;
            stat.split_whitespace().next()?.parse::<u64>().ok()
        })
        .sum()
}

/// The median of `values` (the upper one of an even count).
pub fn median<T: PartialOrd + Copy>(mut values: Vec<T>) -> T {
    values.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    values[values.len() / 2]
}
