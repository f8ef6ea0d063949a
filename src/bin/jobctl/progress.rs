//! A progress line for an operation that takes a while (`reconcile`, `dlq`, `events replay`,
//! the listing of `cancel --tenant`): on a terminal, what is being done and for how long, on
//! standard error, rewritten in place, and cleared when it ends. Off a terminal nothing is
//! written, so scripts read only the results.

use std::future::Future;
use std::io::Write;
use std::time::{Duration, Instant};

/// How often the line is rewritten.
const TICK: Duration = Duration::from_millis(500);

/// Runs `work`, showing `what` with the time it has taken on standard error when that is a
/// terminal.
pub(crate) async fn shown<T>(what: &str, work: impl Future<Output = T>) -> T {
    use std::io::IsTerminal;
    if !std::io::stderr().is_terminal() {
        return work.await;
    }
    on(&mut std::io::stderr(), what, TICK, work).await
}

/// [`shown`], writing to `out` every `tick`.
async fn on<T>(
    out: &mut impl Write,
    what: &str,
    tick: Duration,
    work: impl Future<Output = T>,
) -> T {
    let started = Instant::now();
    let mut ticks = tokio::time::interval(tick);
    tokio::pin!(work);
    let done = loop {
        tokio::select! {
            done = &mut work => break done,
            _ = ticks.tick() => {
                let _ = write!(out, "\r{what}: {:.1} s", started.elapsed().as_secs_f64());
                let _ = out.flush();
            }
        }
    };
    // The line is cleared: what comes next (the results) starts on a clean one.
    let _ = write!(out, "\r{}\r", " ".repeat(what.len() + 12));
    let _ = out.flush();
    done
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_long_operation_shows_what_it_does_and_clears_its_line_when_done() {
        let mut out = Vec::new();
        let work = async {
            tokio::time::sleep(Duration::from_millis(60)).await;
            7
        };
        let done = on(&mut out, "reconciling", Duration::from_millis(10), work).await;
        assert_eq!(done, 7);
        let text = String::from_utf8(out).expect("text");
        assert!(text.matches("\rreconciling: ").count() >= 2, "{text:?}");
        assert!(text.ends_with('\r'), "cleared: {text:?}");
    }
}
