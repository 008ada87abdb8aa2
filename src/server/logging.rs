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
        LogFormat::Text => builder.fmt_fields(OneLineFields).try_init(),
    };
    guard
}

/// The text format's fields as the library writes them (`message`, then `name=value`), but
/// with every line break in a value written as `\n`: an event is one line however many lines
/// its values have (a refused configuration's problems, one per line in its error), so that
/// `grep` and log collectors see all of it.
pub(super) struct OneLineFields;

impl<'w> tracing_subscriber::fmt::FormatFields<'w> for OneLineFields {
    fn format_fields<R: tracing_subscriber::field::RecordFields>(
        &self,
        writer: tracing_subscriber::fmt::format::Writer<'w>,
        fields: R,
    ) -> std::fmt::Result {
        let mut visitor = OneLineVisitor {
            writer,
            first: true,
            result: Ok(()),
        };
        fields.record(&mut visitor);
        visitor.result
    }
}

struct OneLineVisitor<'w> {
    writer: tracing_subscriber::fmt::format::Writer<'w>,
    first: bool,
    result: std::fmt::Result,
}

/// Writes through to the line, a line break as `\n`.
struct Escaped<'a, 'w>(&'a mut tracing_subscriber::fmt::format::Writer<'w>);

impl std::fmt::Write for Escaped<'_, '_> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let mut parts = s.split('\n');
        if let Some(first) = parts.next() {
            self.0.write_str(first)?;
        }
        for part in parts {
            self.0.write_str("\\n")?;
            self.0.write_str(part)?;
        }
        Ok(())
    }
}

impl tracing::field::Visit for OneLineVisitor<'_> {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        if field.name() == "message" {
            self.record_debug(field, &format_args!("{value}"));
        } else {
            self.record_debug(field, &value);
        }
    }

    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        use std::fmt::Write as _;
        let name = field.name();
        // The `log` crate's metadata, already written as the event's target and location.
        if self.result.is_err() || name.starts_with("log.") {
            return;
        }
        if !std::mem::take(&mut self.first) {
            self.result = self.writer.write_char(' ');
        }
        let mut out = Escaped(&mut self.writer);
        self.result = self.result.and_then(|()| match name {
            "message" => write!(out, "{value:?}"),
            name => write!(out, "{}={value:?}", name.trim_start_matches("r#")),
        });
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::OneLineFields;

    struct Sink(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Sink {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// The text written while `f` runs, in the text format with or without our fields.
    fn text(ours: bool, f: impl FnOnce()) -> String {
        let out = Arc::new(Mutex::new(Vec::<u8>::new()));
        let sink = out.clone();
        let builder = tracing_subscriber::fmt()
            .with_writer(move || Sink(sink.clone()))
            .with_ansi(false)
            .without_time();
        if ours {
            tracing::subscriber::with_default(builder.fmt_fields(OneLineFields).finish(), f);
        } else {
            tracing::subscriber::with_default(builder.finish(), f);
        }
        let bytes = out.lock().unwrap_or_else(|p| p.into_inner()).clone();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    #[test]
    fn a_text_event_is_one_line_whatever_its_values_hold() {
        let problems =
            "rules[0].sizee: unknown field\nrules[1]: missing field name\npolicy.maxSize: bad";
        let log = |ours| {
            text(ours, || {
                tracing::error!(config = %"/etc/evi/config.yaml", reason = "invalid", error = %problems, "new configuration refused; the old one stays in force");
                tracing::info!(pod = "a\nb", count = 3u64, "mutated");
            })
        };
        let (library, ours) = (log(false), log(true));
        // The library's own format spans lines: the problems after the first are lost to grep.
        assert!(library.lines().count() > 2, "{library}");
        let lines: Vec<&str> = ours.lines().collect();
        assert_eq!(lines.len(), 2, "{ours}");
        assert!(
            lines[0].contains("new configuration refused; the old one stays in force config=/etc/evi/config.yaml reason=\"invalid\" error=rules[0].sizee: unknown field\\nrules[1]: missing field name\\npolicy.maxSize: bad"),
            "{}",
            lines[0]
        );
        // Otherwise the library's text: the same line with the line breaks as they were.
        assert_eq!(
            lines[1],
            library
                .lines()
                .last()
                .unwrap_or_default()
                .replace('\n', "\\n")
        );
        assert!(
            lines[1].ends_with(r#"mutated pod="a\nb" count=3"#),
            "{}",
            lines[1]
        );
    }
}
