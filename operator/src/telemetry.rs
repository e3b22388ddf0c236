//! Logging: structured `tracing` output, human-readable or JSON, filtered by `RUST_LOG`.

use std::io::IsTerminal;

use tracing_subscriber::{EnvFilter, fmt, prelude::*};

/// Log output format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Installs the global subscriber. `RUST_LOG` overrides the default filter
/// (`planner_operator=info,kube=warn,warn`).
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("planner_operator=info,kube_runtime=warn,kube=warn,warn"));
    let registry = tracing_subscriber::registry().with(filter);
    // A second init (e.g. in tests) keeps the first subscriber.
    let _ = match format {
        LogFormat::Text => registry
            .with(
                fmt::layer()
                    .with_target(false)
                    .with_ansi(std::io::stdout().is_terminal()),
            )
            .try_init(),
        LogFormat::Json => registry
            .with(fmt::layer().json().flatten_event(true).with_current_span(true))
            .try_init(),
    };
}
