//! Logging: JSON lines for clusters, text for a terminal.
//!
//! The one line per review is batched: written to stderr at most every
//! [`FLUSH_INTERVAL`], or as soon as 64 KiB are waiting. One `write(2)` per review, and a
//! wake-up of whatever reads the pipe (the container runtime), cost about 4% of the
//! server's CPU under load. Every other line (start-up, reloads, warnings, shutdown) is
//! written at once, after what is waiting, so lines keep their order and nothing an
//! operator waits for is held back. [`flush`] runs at exit and on a panic; only a SIGKILL
//! loses what is waiting (at most [`FLUSH_INTERVAL`] of review lines).

use std::io::{IsTerminal as _, Write};
use std::sync::Mutex;
use std::time::Duration;

use tracing::{Level, Metadata};
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::EnvFilter;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Json,
    Text,
}

/// How long a review line may wait before it is written.
pub const FLUSH_INTERVAL: Duration = Duration::from_millis(100);

/// Above this, waiting lines are written at once.
const BATCH_BYTES: usize = 64 * 1024;

static WAITING: Mutex<Vec<u8>> = Mutex::new(Vec::new());

/// Installs the global subscriber. `RUST_LOG` overrides the default level (info).
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(Stderr);
    let installed = match format {
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
    if installed.is_ok() {
        let _ = std::thread::Builder::new()
            .name("log-flush".into())
            .spawn(|| loop {
                std::thread::sleep(FLUSH_INTERVAL);
                flush();
            });
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            // try_lock: the panic may come from a thread that holds the lock.
            if let Ok(mut w) = WAITING.try_lock() {
                write_out(&mut w);
            }
            previous(info);
        }));
    }
}

/// Writes every waiting log line to stderr.
pub fn flush() {
    write_out(&mut lock());
}

fn lock() -> std::sync::MutexGuard<'static, Vec<u8>> {
    WAITING
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn write_out(waiting: &mut Vec<u8>) {
    if !waiting.is_empty() {
        let _ = std::io::stderr().write_all(waiting);
        waiting.clear();
    }
}

/// stderr, with review lines batched.
struct Stderr;

/// One event's writer: `batch` for a review line.
struct EventWriter {
    batch: bool,
}

impl<'a> MakeWriter<'a> for Stderr {
    type Writer = EventWriter;

    fn make_writer(&'a self) -> EventWriter {
        EventWriter { batch: false }
    }

    fn make_writer_for(&'a self, meta: &Metadata<'_>) -> EventWriter {
        // The lines of a review (the review itself, an opt-out) carry its uid.
        let batch = *meta.level() == Level::INFO && meta.fields().field("uid").is_some();
        EventWriter { batch }
    }
}

impl Write for EventWriter {
    fn write(&mut self, line: &[u8]) -> std::io::Result<usize> {
        let mut waiting = lock();
        if self.batch {
            waiting.extend_from_slice(line);
            if waiting.len() >= BATCH_BYTES {
                write_out(&mut waiting);
            }
        } else {
            write_out(&mut waiting);
            std::io::stderr().write_all(line)?;
        }
        Ok(line.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
