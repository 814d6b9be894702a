//! Logging: `tracing` to the configured log file (append) and to stderr, never stdout.

use std::{fs::OpenOptions, path::Path, sync::Mutex};

use tracing_subscriber::{fmt, layer::SubscriberExt, util::SubscriberInitExt, EnvFilter, Layer};

/// Installs the subscriber. The file gets `level`; stderr gets warnings and errors only,
/// so a runtime that captures stderr sees what matters. A log file that cannot be opened
/// is reported on stderr and otherwise ignored: logging must not fail an operation.
pub fn init(level: &str, file: Option<&Path>) {
    let stderr = fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_target(false)
        .with_filter(EnvFilter::new("warn"));
    let file_layer =
        file.and_then(
            |path| match OpenOptions::new().create(true).append(true).open(path) {
                Ok(f) => Some(
                    fmt::layer()
                        .with_writer(Mutex::new(f))
                        .with_ansi(false)
                        .with_target(false)
                        .with_filter(EnvFilter::new(level)),
                ),
                Err(e) => {
                    eprintln!("cni-ebpf: cannot open log file {}: {e}", path.display());
                    None
                }
            },
        );
    // A second init (tests) is harmless.
    let _ = tracing_subscriber::registry()
        .with(stderr)
        .with(file_layer)
        .try_init();
}
