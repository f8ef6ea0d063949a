//! JSON log lines for the Lambda functions, filtered by `RUST_LOG` (default `info`).

/// Installs the process's log subscriber: one JSON object a line on stdout, with the event's
/// fields and no span or target noise.
pub fn init() {
    tracing_subscriber::fmt()
        .json()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_target(false)
        .with_current_span(false)
        .init();
}
