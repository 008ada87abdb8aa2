//! A bound on how deep a YAML text's flow collections (`[…]`, `{…}`) nest, checked in one pass
//! before the YAML reader sees the text. The reader gives up on deep nesting only after a time
//! that grows with the square of the depth (40 KB of `[` took 15 s), and `mutate`,
//! `check-config` and `policies` read files a user may not have written. Block collections
//! (indented) cannot nest deeply without a line of that indentation for each level, so their
//! cost stays linear.

/// The deepest flow nesting read: far beyond any manifest or configuration (a pod nests ~10
/// deep), far below where the reader's cost shows.
pub const MAX_FLOW_DEPTH: usize = 128;

/// A text nested deeper than [`MAX_FLOW_DEPTH`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "line {line}, column {column}: flow collections ([…] or {{…}}) nested more than {MAX_FLOW_DEPTH} deep; no manifest or configuration needs that"
)]
pub struct TooDeep {
    /// 1-based line of the bracket past the bound.
    pub line: usize,
    /// 1-based column (in characters) of that bracket.
    pub column: usize,
}

/// Whether a quote after `previous` starts a quoted scalar.
fn opens(previous: char) -> bool {
    previous.is_whitespace() || matches!(previous, '[' | '{' | ',' | ':' | '-' | '?')
}

/// Checks `text`'s flow nesting: brackets inside quoted strings and comments do not count.
/// Plain text that merely holds a bracket (`see [1]`) counts, which can only make the depth
/// seem larger, never hide it; closing brackets past zero are ignored.
pub fn check(text: &str) -> Result<(), TooDeep> {
    #[derive(Clone, Copy, PartialEq)]
    enum In {
        Plain,
        Single,
        Double,
        Comment,
    }
    let mut state = In::Plain;
    let mut depth = 0usize;
    let (mut line, mut column) = (1usize, 0usize);
    let mut previous = '\n';
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        column += 1;
        match (state, c) {
            (_, '\n') => {
                if state == In::Comment {
                    state = In::Plain;
                }
                line += 1;
                column = 0;
            }
            (In::Plain, '#') if previous.is_whitespace() => state = In::Comment,
            // A quote opens a string only where a scalar can start (`it's` is plain text).
            (In::Plain, '\'') if opens(previous) => state = In::Single,
            (In::Plain, '"') if opens(previous) => state = In::Double,
            (In::Plain, '[' | '{') => {
                depth += 1;
                if depth > MAX_FLOW_DEPTH {
                    return Err(TooDeep { line, column });
                }
            }
            (In::Plain, ']' | '}') => depth = depth.saturating_sub(1),
            // '' is a quote inside a single-quoted string.
            (In::Single, '\'') if chars.peek() == Some(&'\'') => {
                chars.next();
                column += 1;
            }
            (In::Single, '\'') | (In::Double, '"') => state = In::Plain,
            // An escaped character, unless the escape ends the line.
            (In::Double, '\\') if chars.next_if(|&n| n != '\n').is_some() => column += 1,
            _ => {}
        }
        previous = c;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deep_flow_nesting_is_refused_where_it_passes_the_bound() {
        let deep = format!("a:\n  b: {}", "[".repeat(MAX_FLOW_DEPTH + 1));
        assert_eq!(
            check(&deep),
            Err(TooDeep {
                line: 2,
                column: 6 + MAX_FLOW_DEPTH
            })
        );
        let mixed = "{a: [".repeat(MAX_FLOW_DEPTH / 2) + "{";
        assert!(check(&mixed).is_err());
        let at_the_bound = "[".repeat(MAX_FLOW_DEPTH) + &"]".repeat(MAX_FLOW_DEPTH);
        assert_eq!(check(&at_the_bound), Ok(()));
        // Siblings do not add up.
        let wide = "[[1], [2]], ".repeat(10_000);
        assert_eq!(check(&wide), Ok(()));
    }

    #[test]
    fn brackets_in_strings_and_comments_do_not_count() {
        let many = "[".repeat(MAX_FLOW_DEPTH * 2);
        for text in [
            format!("a: '{many}'"),
            format!("a: 'it''s {many}'"),
            format!("a: \"{many}\""),
            format!("a: \"\\\" {many}\""),
            format!("a: 1 # {many}\nb: 2"),
        ] {
            assert_eq!(check(&text), Ok(()), "{text}");
        }
        // A comment ends with its line; a quote inside a comment opens nothing.
        let after = format!("a: 1 # it's\nb: {many}");
        assert!(check(&after).is_err());
        // An apostrophe inside a plain word opens no string.
        let word = format!("a: it's {many}");
        assert!(check(&word).is_err());
        // `#` inside a plain word is not a comment.
        let word = format!("a: b#{many}");
        assert!(check(&word).is_err());
    }
}
