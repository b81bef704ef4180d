//! Logging: JSON lines for clusters, text for a terminal.

use std::io::IsTerminal as _;

use tracing_subscriber::EnvFilter;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Json,
    Text,
}

/// Installs the global subscriber. `RUST_LOG` overrides the default level (info).
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .try_init(),
        // Colour only for a terminal: escape codes in a file or a log collector are noise.
        LogFormat::Text => builder
            .with_target(false)
            .with_ansi(std::io::stderr().is_terminal())
            .try_init(),
    };
}
