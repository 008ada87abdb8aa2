//! Bounds on what the webhook echoes back. An annotation value can be as large as the API
//! server allows (256 KiB for all of them together); a refusal quotes it in `status.message`,
//! in a warning and in the decision log, so the quote is cut: each value a message quotes is
//! cut where it is quoted ([`quoted`]), so that a reason is never cut away with it.

use std::borrow::Cow;

/// The most of one value that a message quotes.
pub const VALUE_LIMIT: usize = 96;
/// The most a whole denial message carries, every problem together (a safety net: with every
/// quoted value cut, it takes dozens of problems to reach it).
pub const MESSAGE_LIMIT: usize = 4096;

/// A message of reasons joined by `"; "`, cut after the last whole reason that fits in `limit`
/// bytes, saying how many more there were.
pub fn reasons(message: &str, limit: usize) -> Cow<'_, str> {
    if message.len() <= limit {
        return Cow::Borrowed(message);
    }
    let total = message.split("; ").count();
    let mut kept = 0;
    let mut end = 0;
    for (i, _) in message.match_indices("; ") {
        if i > limit {
            break;
        }
        end = i;
        kept += 1;
    }
    if kept == 0 {
        return bounded(message, limit);
    }
    Cow::Owned(format!(
        "{}; … and {} more problems ({} bytes in all)",
        &message[..end],
        total - kept,
        message.len()
    ))
}

/// `s` quoted as Rust debug-quotes it (`"a\"b"`), cut to [`VALUE_LIMIT`] bytes first.
pub fn quoted(s: &str) -> String {
    if s.len() <= VALUE_LIMIT {
        format!("{s:?}")
    } else {
        format!("{:?}… ({} bytes in all)", head(s, VALUE_LIMIT), s.len())
    }
}

/// The longest warning sent: the API server shortens longer ones, and keeps at most 4 KiB of
/// them in all.
pub const WARNING_LIMIT: usize = 512;

/// The most names a message lists (the containers a pod has, the names it lists that are
/// missing); the rest are counted.
pub const LIST_LIMIT: usize = 20;

/// `items` joined by `", "`, at most [`LIST_LIMIT`] of them, each cut to [`VALUE_LIMIT`] bytes,
/// and how many more there were; `None` for none.
pub fn list<S: AsRef<str>>(items: &[S]) -> Option<String> {
    let (shown, rest) = items.split_at(items.len().min(LIST_LIMIT));
    if shown.is_empty() {
        return None;
    }
    let mut out = String::new();
    for (i, item) in shown.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        out.push_str(&bounded(item.as_ref(), VALUE_LIMIT));
    }
    if !rest.is_empty() {
        out.push_str(&format!(" and {} more", rest.len()));
    }
    Some(out)
}

/// The longest user string (a name, a namespace, a uid) a log line carries.
pub const LOG_VALUE_LIMIT: usize = 256;

/// A value for a log line: control characters escaped (`\n`, `\u{1b}`), so that a newline in
/// a pod's `generateName` cannot forge a line of the text log, and cut after `limit` bytes
/// with `…`. Names the API server has not validated yet (admission comes first) can be as long
/// as the request allows.
pub struct ForLog<'a, T: ?Sized>(pub &'a T, pub usize);

impl<'a, T: std::fmt::Display + ?Sized> ForLog<'a, T> {
    /// A name, a namespace or a uid: cut at [`LOG_VALUE_LIMIT`].
    pub fn name(value: &'a T) -> Self {
        ForLog(value, LOG_VALUE_LIMIT)
    }
}

impl<T: std::fmt::Display + ?Sized> std::fmt::Display for ForLog<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use std::fmt::Write as _;
        /// Escapes and counts what passes through, and stops at the limit.
        struct Escaping<'f, 'g> {
            out: &'f mut std::fmt::Formatter<'g>,
            left: usize,
            cut: bool,
        }
        impl std::fmt::Write for Escaping<'_, '_> {
            fn write_str(&mut self, s: &str) -> std::fmt::Result {
                for c in s.chars() {
                    if self.cut {
                        return Ok(());
                    }
                    if c.len_utf8() > self.left {
                        self.cut = true;
                        return self.out.write_char('…');
                    }
                    self.left -= c.len_utf8();
                    if is_unsafe(c) {
                        write!(self.out, "{}", c.escape_default())?;
                    } else {
                        self.out.write_char(c)?;
                    }
                }
                Ok(())
            }
        }
        let mut w = Escaping {
            out: f,
            left: self.1,
            cut: false,
        };
        write!(w, "{}", self.0)
    }
}

/// Whether a character must not reach a message, a warning, an annotation or a log line as
/// it is: control characters, and those that break a line or reorder text in a terminal,
/// an editor or a log viewer without being control characters (U+2028, U+2029, the
/// bidirectional marks and overrides).
pub fn is_unsafe(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{2028}' | '\u{2029}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}'
        )
}

/// `s` with every [unsafe](is_unsafe) character written as its escape (`\n`, `\u{2028}`):
/// what a pod put in an annotation key or value cannot forge a line or hide text in what the
/// webhook answers.
pub fn printable(s: &str) -> Cow<'_, str> {
    if !s.chars().any(is_unsafe) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 16);
    for c in s.chars() {
        if is_unsafe(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// An annotation's text with the value of every `attr.<key>` pair (`=` or `:`) written as
/// `…`: a CSI volume's attributes can carry credentials, which no message or log repeats.
pub fn without_attributes(text: &str) -> Cow<'_, str> {
    if !text.contains("attr.") {
        return Cow::Borrowed(text);
    }
    let parts: Vec<String> = text
        .split(',')
        .map(|part| {
            let start = part.len() - part.trim_start_matches([' ', '[', '{']).len();
            let body = &part[start..];
            match body.find(['=', ':']) {
                Some(at) if body.trim_start_matches('"').starts_with("attr.") => {
                    format!("{}{}…", &part[..start], &body[..=at])
                }
                _ => part.to_owned(),
            }
        })
        .collect();
    Cow::Owned(parts.join(","))
}

/// `s` cut to at most `limit` bytes (on a character boundary), ending in an ellipsis and the
/// original length when it was cut.
pub fn bounded(s: &str, limit: usize) -> Cow<'_, str> {
    if s.len() <= limit {
        return Cow::Borrowed(s);
    }
    Cow::Owned(format!("{}… ({} bytes in all)", head(s, limit), s.len()))
}

/// The longest start of `s` of at most `limit` bytes that ends on a character boundary.
fn head(s: &str, limit: usize) -> &str {
    let mut end = limit.min(s.len());
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_text_is_cut_with_an_ellipsis_and_its_length() {
        assert_eq!(bounded("short", 10), "short");
        let long = "x".repeat(1 << 20);
        let cut = bounded(&long, MESSAGE_LIMIT);
        assert!(cut.len() < MESSAGE_LIMIT + 40, "{}", cut.len());
        assert!(cut.ends_with("… (1048576 bytes in all)"), "{cut}");
        // Never inside a character.
        let wide = "é".repeat(400);
        let cut = bounded(&wide, 301);
        assert!(cut.starts_with(&"é".repeat(150)) && cut.contains("… (800 bytes in all)"));
    }

    #[test]
    fn a_long_message_keeps_whole_reasons_and_counts_the_rest() {
        let message = (0..100)
            .map(|i| format!("reason {i}"))
            .collect::<Vec<_>>()
            .join("; ");
        let cut = reasons(&message, 40);
        assert_eq!(
            cut,
            format!(
                "reason 0; reason 1; reason 2; reason 3; … and 96 more problems ({} bytes in all)",
                message.len()
            )
        );
        assert_eq!(reasons("a; b", 40), "a; b");
    }

    #[test]
    fn a_long_list_shows_its_first_names_and_counts_the_rest() {
        assert_eq!(list::<&str>(&[]), None);
        assert_eq!(list(&["a", "b"]).as_deref(), Some("a, b"));
        let many: Vec<String> = (0..1000).map(|i| format!("c{i}")).collect();
        let shown = list(&many).unwrap();
        assert!(
            shown.starts_with("c0, c1, ") && shown.ends_with("c19 and 980 more"),
            "{shown}"
        );
    }

    #[test]
    fn a_log_value_has_no_raw_control_character_and_is_cut() {
        let forged = "nf-\n2026-12-04T00:00:00Z INFO fake line\u{1b}[31m";
        let shown = ForLog::name(forged).to_string();
        assert!(!shown.chars().any(char::is_control), "{shown:?}");
        assert!(shown.starts_with("nf-\\n2026"), "{shown}");
        let long = "a".repeat(10_000);
        let shown = ForLog::name(long.as_str()).to_string();
        assert_eq!(shown, format!("{}…", "a".repeat(LOG_VALUE_LIMIT)));
        assert_eq!(ForLog::name("plain").to_string(), "plain");
    }

    #[test]
    fn attribute_values_are_never_repeated() {
        assert_eq!(without_attributes("type=csi,driver=d"), "type=csi,driver=d");
        assert_eq!(
            without_attributes("[type:csi, attr.token:s3cr3t, mountPath:/m]"),
            "[type:csi, attr.token:…, mountPath:/m]"
        );
        assert_eq!(
            without_attributes("type=csi,attr.password=hunter2"),
            "type=csi,attr.password=…"
        );
    }

    #[test]
    fn a_quoted_value_is_cut_after_its_closing_quote() {
        assert_eq!(quoted("a\"b"), "\"a\\\"b\"");
        let q = quoted(&"v".repeat(1000));
        assert_eq!(
            q,
            format!("{:?}… (1000 bytes in all)", "v".repeat(VALUE_LIMIT))
        );
    }
}
