//! What judging an answer against its contract costs: the same invoice accepted as free text
//! and held to `invoice-extract@2`, alternated.

use fenced_jobs::clock::SystemClock;
use fenced_jobs::ledger::JobLedger;
use fenced_jobs::provider::SimulatedProvider;
use fenced_jobs::queue::VisibilityControl;
use fenced_jobs::worker::handler::BatchHandler;

use super::cpu::median;
use super::{ALTERNATIONS, SLICE_MS, Shape, event_json, measure_for, memory_handler, sdk_handler};

/// What judging an answer against its contract costs: fresh invoice extractions (100 records a
/// batch) asked for under `summary.v1`, where the answer is accepted as text, and under
/// `invoice-extract@2`, where it is parsed, validated and stored as JSON; alternated, medians.
/// In memory, or through the SDK on the emulator when `sdk`.
pub(super) async fn contract_row(sdk: bool) {
    let [free, held] = if sdk {
        let (handler, _, _) = sdk_handler(false).await;
        alternate_invoices(&handler).await
    } else {
        alternate_invoices(&memory_handler()).await
    };
    let adapters = if sdk { "SDK + emulator" } else { "in memory" };
    println!(
        "| {adapters} | {free:.1} | {held:.1} | ×{:.2} |",
        held / free
    );
}

/// Fresh invoice extractions' CPU per record through `handler`, asked for as free text and
/// held to `invoice-extract@2`, alternated [`ALTERNATIONS`] times: the medians.
async fn alternate_invoices<L: JobLedger, V: VisibilityControl>(
    handler: &BatchHandler<L, SimulatedProvider, SystemClock, V>,
) -> [f64; 2] {
    const N: usize = 100;
    let held = Shape {
        invoice: true,
        ..Shape::default()
    };
    let free = Shape {
        as_text: true,
        ..held
    };
    let tag = fastrand::u32(..);
    let (mut free_us, mut held_us) = (vec![], vec![]);
    for round in 0..ALTERNATIONS {
        for (shape, side, us) in [(free, "free", &mut free_us), (held, "held", &mut held_us)] {
            let jobs = |r: usize| event_json(&format!("c{tag}-{round}-{side}-{r}"), N, 1, shape);
            let m = measure_for(handler, N, SLICE_MS, 0, jobs).await;
            us.push(m.cpu_per_record_us);
        }
    }
    [free_us, held_us].map(median)
}
