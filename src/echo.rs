//! Bounds on what the webhook echoes back. An annotation value can be as large as the API
//! server allows (256 KiB for all of them together); a refusal quotes it in `status.message`,
//! in a warning and in the decision log, so the quote is cut.

use std::borrow::Cow;

/// The most of one annotation's problem that a message carries (the value it quotes included).
pub const ECHO_LIMIT: usize = 512;
/// The most a whole denial message carries, every annotation's problem together.
pub const MESSAGE_LIMIT: usize = 4096;

/// `s` cut to at most `limit` bytes (on a character boundary), ending in an ellipsis and the
/// original length when it was cut.
pub fn bounded(s: &str, limit: usize) -> Cow<'_, str> {
    if s.len() <= limit {
        return Cow::Borrowed(s);
    }
    let mut end = limit;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    Cow::Owned(format!("{}… ({} bytes in all)", &s[..end], s.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_text_is_cut_with_an_ellipsis_and_its_length() {
        assert_eq!(bounded("short", 10), "short");
        let long = "x".repeat(1 << 20);
        let cut = bounded(&long, ECHO_LIMIT);
        assert!(cut.len() < ECHO_LIMIT + 40, "{}", cut.len());
        assert!(cut.ends_with("… (1048576 bytes in all)"), "{cut}");
        // Never inside a character.
        let wide = "é".repeat(400);
        let cut = bounded(&wide, 301);
        assert!(cut.starts_with(&"é".repeat(150)) && cut.contains("… (800 bytes in all)"));
    }
}
