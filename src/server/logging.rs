//! Logging: a background writer to stderr, flushed on every exit.

use super::args::{LogFormat, ServeArgs};

/// The log writer's guard: dropping it flushes the lines still buffered. Kept here so that
/// the second-signal exit, which skips every destructor, can flush the log first.
pub(super) static LOG_GUARD: std::sync::Mutex<Option<super::log_writer::WriterGuard>> =
    std::sync::Mutex::new(None);

/// Writes out the lines still buffered.
pub(super) fn flush_log() {
    let guard = LOG_GUARD.lock().map(|mut g| g.take()).unwrap_or_default();
    drop(guard);
}

/// Logs go to stderr through a background writer: a decision line costs a copy into its
/// buffer on the request path, the writes are batched (log_writer.rs). Lines are never
/// dropped. `None` if the writer's thread cannot be started: the lines then go to stderr
/// directly.
pub(super) fn init_logging(args: &ServeArgs) -> Option<super::log_writer::WriterGuard> {
    let filter = tracing_subscriber::EnvFilter::try_new(&args.log_level)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let (writer, guard) = match super::log_writer::spawn(
        std::io::stderr(),
        super::log_writer::PERIOD,
        super::log_writer::LIMIT,
    ) {
        Ok((writer, guard)) => (writer, Some(guard)),
        Err(e) => {
            eprintln!("cannot start the log writer's thread ({e}): logging to stderr directly");
            (super::log_writer::LogWriter::direct(), None)
        }
    };
    // Colours only for a person at a terminal, never in a file or a log collector.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(writer);
    let _ = match args.log_format {
        // One JSON object per line, written straight into the line (json_log.rs); the
        // webhook opens no spans, so the lines carry none.
        LogFormat::Json => builder.event_format(super::json_log::JsonLines).try_init(),
        LogFormat::Text => builder.try_init(),
    };
    guard
}
