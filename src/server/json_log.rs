//! The JSON log line (`--log-format json`), written straight into the line's buffer.
//!
//! The same line as `tracing-subscriber`'s JSON format with flattened fields — `timestamp`,
//! `level`, the event's fields in the order they were recorded, `target` — but each value is
//! escaped as it is written, with no intermediate `String` for the timestamp and no
//! serializer writing through a UTF-8-checking adaptor piece by piece: the decision line is
//! written once per review.

use std::fmt::{self, Write as _};

use tracing::{
    Event, Subscriber,
    field::{Field, Visit},
};
use tracing_log::NormalizeEvent as _;
use tracing_subscriber::{
    fmt::{
        FmtContext, FormatEvent, FormatFields,
        format::Writer,
        time::{FormatTime as _, SystemTime},
    },
    registry::LookupSpan,
};

/// One JSON object per event and line.
#[derive(Debug, Clone, Copy, Default)]
pub struct JsonLines;

impl<S, N> FormatEvent<S, N> for JsonLines
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &FmtContext<'_, S, N>,
        mut w: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        // A `log` crate record (rustls, hyper's dependencies) under its own target.
        let normalized = event.normalized_metadata();
        let meta = normalized.as_ref().unwrap_or_else(|| event.metadata());
        w.write_str("{\"timestamp\":\"")?;
        SystemTime.format_time(&mut w)?;
        w.write_str("\",\"level\":\"")?;
        w.write_str(meta.level().as_str())?;
        w.write_char('"')?;
        let mut fields = Fields {
            w: &mut w,
            result: Ok(()),
        };
        event.record(&mut fields);
        fields.result?;
        w.write_str(",\"target\":")?;
        string(&mut w, format_args!("{}", meta.target()))?;
        w.write_str("}\n")
    }
}

/// Writes each field as `,"name":value`.
struct Fields<'a, 'w> {
    w: &'a mut Writer<'w>,
    result: fmt::Result,
}

impl Fields<'_, '_> {
    fn entry(&mut self, field: &Field, value: impl FnOnce(&mut Writer<'_>) -> fmt::Result) {
        if self.result.is_ok() {
            self.result = (|| {
                self.w.write_char(',')?;
                string(self.w, format_args!("{}", field.name()))?;
                self.w.write_char(':')?;
                value(self.w)
            })();
        }
    }
}

impl Visit for Fields<'_, '_> {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        // `%value` fields arrive here too, their Debug being their Display.
        self.entry(field, |w| string(w, format_args!("{value:?}")));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.entry(field, |w| string(w, format_args!("{value}")));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.entry(field, |w| w.write_str(if value { "true" } else { "false" }));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.entry(field, |w| write!(w, "{value}"));
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.entry(field, |w| write!(w, "{value}"));
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        // JSON has no NaN or infinity: null, as serde_json writes them. `{:?}` keeps the
        // decimal point or exponent (`1.0`, `1e-7`).
        self.entry(field, |w| match value.is_finite() {
            true => write!(w, "{value:?}"),
            false => w.write_str("null"),
        });
    }
}

/// `text` as a JSON string, escaped as it is formatted.
fn string(w: &mut Writer<'_>, text: fmt::Arguments<'_>) -> fmt::Result {
    w.write_char('"')?;
    Escaped(w).write_fmt(text)?;
    w.write_char('"')
}

/// Escapes what is written through it for the inside of a JSON string (RFC 8259: the quote,
/// the backslash and the control characters; and U+2028 and U+2029, which JSON allows raw but
/// which end a line for JavaScript and many log viewers).
struct Escaped<'a, 'w>(&'a mut Writer<'w>);

impl fmt::Write for Escaped<'_, '_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let mut plain = 0;
        for (i, b) in s.bytes().enumerate() {
            // What to write instead, and how many bytes it replaces.
            let (escape, len) = match b {
                b'"' => ("\\\"", 1),
                b'\\' => ("\\\\", 1),
                b'\n' => ("\\n", 1),
                b'\r' => ("\\r", 1),
                b'\t' => ("\\t", 1),
                0..=0x1f => ("", 1),
                // The first byte of U+2028 (E2 80 A8) or U+2029 (E2 80 A9).
                0xe2 => match s.as_bytes().get(i + 1..i + 3) {
                    Some([0x80, 0xa8]) => ("\\u2028", 3),
                    Some([0x80, 0xa9]) => ("\\u2029", 3),
                    _ => continue,
                },
                _ => continue,
            };
            // Each escaped character starts with an ASCII byte or 0xE2: `i` is always on a
            // character boundary.
            self.0.write_str(&s[plain..i])?;
            match escape {
                "" => write!(self.0, "\\u{b:04x}")?,
                e => self.0.write_str(e)?,
            }
            plain = i + len;
        }
        self.0.write_str(&s[plain..])
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use serde_json::{Value, json};

    use super::*;

    /// The text written while `f` runs, with our format or the library's JSON format.
    fn raw(ours: bool, f: impl FnOnce()) -> String {
        let out = Arc::new(Mutex::new(Vec::<u8>::new()));
        let sink = out.clone();
        let writer = move || Sink(sink.clone());
        let builder = tracing_subscriber::fmt()
            .with_writer(writer)
            .with_max_level(tracing::Level::DEBUG);
        if ours {
            tracing::subscriber::with_default(builder.event_format(JsonLines).finish(), f);
        } else {
            let library = builder
                .json()
                .flatten_event(true)
                .with_current_span(false)
                .with_span_list(false)
                .finish();
            tracing::subscriber::with_default(library, f);
        }
        String::from_utf8(out.lock().unwrap().clone()).unwrap()
    }

    /// Each line written while `f` runs, parsed.
    fn lines(ours: bool, f: impl FnOnce()) -> Vec<Value> {
        raw(ours, f)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect()
    }

    struct Sink(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Sink {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn events() {
        let odd = "quote \" backslash \\ newline \n tab \t bell \u{7} é 😀";
        tracing::info!(uid = "u-1", namespace = %"nf", pod = %odd, dry_run = false, volumes = %"a,b", "mutated");
        tracing::warn!(
            count = 3u64,
            delta = -2i64,
            ratio = 0.5f64,
            nan = f64::NAN,
            whole = 1.0f64,
            "numbers {}",
            7
        );
        tracing::debug!(error = %std::io::Error::other("broken \"pipe\""), "bad request");
    }

    #[test]
    fn lines_are_the_librarys_json_lines_with_the_same_keys_and_values() {
        let ours = lines(true, events);
        let library = lines(false, events);
        assert_eq!(ours.len(), 3);
        for (a, b) in ours.iter().zip(&library) {
            let (mut a, mut b) = (a.clone(), b.clone());
            // Written a moment apart.
            for line in [&a, &b] {
                let t = line["timestamp"].as_str().unwrap();
                assert!(t.ends_with('Z') && t.len() >= 20, "{t}");
            }
            a["timestamp"] = Value::Null;
            b["timestamp"] = Value::Null;
            assert_eq!(a, b);
        }
        assert_eq!(
            ours[0]["pod"],
            "quote \" backslash \\ newline \n tab \t bell \u{7} é 😀"
        );
        assert_eq!(ours[1]["message"], "numbers 7");
        assert_eq!(ours[1]["nan"], Value::Null);
        assert_eq!(ours[1]["whole"], json!(1.0));
        assert_eq!(ours[2]["level"], "DEBUG");
        assert_eq!(ours[2]["target"], module_path!());
    }

    #[test]
    fn line_and_paragraph_separators_are_escaped_like_control_characters() {
        let text = raw(true, || {
            tracing::info!(name = "a\u{2028}b\u{2029}c\nd", "mutated\u{2028}")
        });
        assert!(
            !text.trim_end().contains(['\n', '\u{2028}', '\u{2029}']),
            "{text:?}"
        );
        assert!(text.contains(r#""name":"a\u2028b\u2029c\nd""#), "{text}");
        let line: Value = serde_json::from_str(text.trim_end()).unwrap();
        assert_eq!(line["name"], "a\u{2028}b\u{2029}c\nd");
    }

    #[test]
    fn fields_keep_the_order_they_were_recorded_in() {
        let text = raw(true, || {
            tracing::info!(uid = "u", namespace = "nf", "mutated")
        });
        let order: Vec<usize> = [
            "\"timestamp\"",
            "\"level\"",
            "\"message\"",
            "\"uid\"",
            "\"namespace\"",
            "\"target\"",
        ]
        .iter()
        .map(|k| text.find(k).unwrap_or_else(|| panic!("{k} in {text}")))
        .collect();
        assert!(order.windows(2).all(|w| w[0] < w[1]), "{text}");
        assert!(
            text.ends_with("}\n") && text.matches('\n').count() == 1,
            "{text}"
        );
    }

    #[test]
    fn a_log_crate_record_is_under_its_own_target() {
        let line = lines(true, || {
            let record = log::Record::builder()
                .args(format_args!("from the log crate"))
                .level(log::Level::Warn)
                .target("rustls::server")
                .build();
            tracing_log::format_trace(&record).unwrap();
        })
        .remove(0);
        assert_eq!(line["target"], "rustls::server", "{line}");
        assert_eq!(line["level"], "WARN");
        assert_eq!(line["message"], "from the log crate");
    }
}
