//! keyturnd's log: one line per event, whatever the event quotes.
//!
//! Other parties' words reach the log: an upstream's error message, the
//! name it gives a tool, and, through libraries keyturnd does not format,
//! more of the same (rmcp's warnings print an upstream's JSON-RPC request
//! ids as they came). A line break in them would let the upstream write a
//! log line of its own, a terminal escape would act on whoever reads the
//! log in a terminal. So the writer escapes every control character of an
//! event but its final line break, once for all events; what keyturnd
//! quotes itself is also cut short ([`quote`]).

use std::borrow::Cow;
use std::io::{self, Write};

use tracing_subscriber::fmt::MakeWriter;

/// Another party's words for a log field: control characters escaped (a
/// line break reads `\n`), at most 300 characters.
pub fn quote(s: &str) -> String {
    s.escape_debug().take(300).collect()
}

/// Makes the writer of each log event: standard error, escaped.
#[derive(Debug, Clone, Copy, Default)]
pub struct OneLinePerEvent;

impl<'a> MakeWriter<'a> for OneLinePerEvent {
    type Writer = Escaping<io::Stderr>;

    fn make_writer(&'a self) -> Self::Writer {
        Escaping(io::stderr())
    }
}

/// A writer that escapes what [`escaped`] escapes. tracing's formatter
/// writes each event whole in one `write_all`.
pub struct Escaping<W>(pub W);

impl<W: Write> Write for Escaping<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.write_all(&escaped(buf))?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}

/// `event` with each control character (C0, DEL, C1) and each bidi
/// override or isolate written as `\u{…}` (`\n`, `\r`, `\t` as such), but
/// a line break that ends it.
pub fn escaped(event: &[u8]) -> Cow<'_, [u8]> {
    let (body, end) = match event.strip_suffix(b"\n") {
        Some(body) => (body, "\n"),
        None => (event, ""),
    };
    let text = String::from_utf8_lossy(body);
    if !text.chars().any(needs_escape) && matches!(text, Cow::Borrowed(_)) {
        return Cow::Borrowed(event);
    }
    let mut out = String::with_capacity(event.len() + 16);
    for c in text.chars() {
        if needs_escape(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out.push_str(end);
    Cow::Owned(out.into_bytes())
}

fn needs_escape(c: char) -> bool {
    c.is_control() || matches!(c, '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Seventeenth red-team pass (docs/security.md, row 120): an upstream's
    /// request id, which rmcp logs as it came, wrote a line of its own and
    /// a terminal escape into keyturnd's log.
    #[test]
    fn test_an_event_is_one_line_whatever_it_quotes() {
        let forged = "WARN rmcp::service: response error id=x\n2026-12-07T00:00:00Z ERROR keyturnd::worker: FORGED \u{1b}[31mred\r\u{9b}2J \u{202e}olleh\n";
        let mut out = Vec::new();
        Escaping(&mut out).write_all(forged.as_bytes()).unwrap();
        let out = String::from_utf8(out).unwrap();
        assert_eq!(
            out,
            "WARN rmcp::service: response error id=x\\n2026-12-07T00:00:00Z ERROR keyturnd::worker: FORGED \\u{1b}[31mred\\r\\u{9b}2J \\u{202e}olleh\n"
        );
        assert_eq!(out.lines().count(), 1);
        // An event without a control character passes as it is, its own
        // line break kept; one without any is not given one.
        assert!(matches!(
            escaped(b"plain \xc3\xa9 text\n"),
            Cow::Borrowed(_)
        ));
        assert_eq!(&*escaped(b"no end"), b"no end");
        // Bytes that are not UTF-8 cannot smuggle a control character.
        assert_eq!(&*escaped(b"a\xff\x1bb\n"), "a\u{fffd}\\u{1b}b\n".as_bytes());
    }

    #[test]
    fn test_a_quote_is_escaped_and_short() {
        assert_eq!(quote("a\nb"), "a\\nb");
        let wide = "é".repeat(400);
        assert_eq!(quote(&wide).chars().count(), 300);
    }
}
