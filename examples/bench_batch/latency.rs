//! The ledger's latency a fresh job waits for (claim, storing the answer, acceptance), each
//! request timed by the SDK interceptor that counts them, beside the record's CPU.

use std::time::Duration;

use super::{ROUND_MS, Shape, event_json, measure, sdk_handler, settings};

/// The time a fresh job waits on the ledger, beside its CPU: 10-record batches through the SDK
/// with a results bucket, a short answer (kept in the item) and a 10 KB one (stored in S3 first),
/// each operation's wall time as its caller waits for it; and the floor's `UpdateItem` in the
/// same run. The emulator's latency, not DynamoDB's: compare the rows with each other.
pub(super) async fn latency_table() {
    println!(
        "\nThe ledger's latency a fresh job waits for, beside its CPU (SDK + emulator, results bucket, 10 records per batch, 10 in flight): each operation's wall time from the SDK's taking the request to its answer, median / p90 in ms. The emulator's latency, not DynamoDB's: compare the rows with each other.\n"
    );
    println!(
        "| job | claim (`PutItem`) | store the answer (S3 `PutObject`) | accept (`UpdateItem`) | a job waits in all (medians) | fresh CPU/record (µs) |"
    );
    println!("| --- | ---: | ---: | ---: | ---: | ---: |");
    let (handler, floor, calls) = sdk_handler(true).await;
    let n = 10;
    let in_flight = n.min(settings().max_concurrency);
    let ms = |service, operation| quantiles(calls.took(service, operation));
    for (what, answer_bytes) in [("short answer", 0), ("10 KB answer", 10_000)] {
        let tag = format!("latency-{}", fastrand::u32(..));
        let shape = Shape {
            answer_bytes,
            ..Shape::default()
        };
        calls.reset();
        let fresh = measure(&handler, n, |r| {
            event_json(&format!("{tag}-r{r}"), n, 1, shape)
        })
        .await;
        let (claim, store, accept) = (
            ms("dynamodb", "PutItem"),
            ms("s3", "PutObject"),
            ms("dynamodb", "UpdateItem"),
        );
        let job =
            claim.map_or(0.0, |q| q.0) + store.map_or(0.0, |q| q.0) + accept.map_or(0.0, |q| q.0);
        println!(
            "| {what} | {} | {} | {} | {job:.2} | {:.1} |",
            shown(claim),
            shown(store),
            shown(accept),
            fresh.cpu_per_record_us
        );
    }
    calls.reset();
    floor.cpu_per_request_us(n, in_flight, ROUND_MS).await;
    println!(
        "| the floor: a bare conditional `UpdateItem` | – | – | {} | – | – |",
        shown(ms("dynamodb", "UpdateItem"))
    );
}

/// The median and the 90th percentile of `took`, in ms; none when it is empty.
fn quantiles(mut took: Vec<Duration>) -> Option<(f64, f64)> {
    if took.is_empty() {
        return None;
    }
    took.sort_unstable();
    let at = |q: f64| took[((took.len() - 1) as f64 * q).round() as usize].as_secs_f64() * 1e3;
    Some((at(0.5), at(0.9)))
}

fn shown(q: Option<(f64, f64)>) -> String {
    q.map_or_else(
        || "–".to_owned(),
        |(median, p90)| format!("{median:.2} / {p90:.2}"),
    )
}
