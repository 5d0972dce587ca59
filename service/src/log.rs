//! keyturnd's log: one line per event, whatever the event quotes.
//!
//! Other parties' words reach the log: an upstream's error message, the
//! name it gives a tool, and, through libraries keyturnd does not format,
//! more of the same (rmcp's warnings print an upstream's JSON-RPC request
//! ids as they came). A line break in them would let the upstream write a
//! log line of its own, a terminal escape would act on whoever reads the
//! log in a terminal. So the writer escapes every control character of an
//! event but its final line break, once for all events, and cuts an event
//! longer than [`MAX_EVENT_BYTES`] (an agent chooses a JSON-RPC id of any
//! length, which rmcp logs whole); what keyturnd quotes itself is also cut
//! short ([`quote`]).

use std::borrow::Cow;
use std::io::{self, Write};

use tracing_subscriber::fmt::MakeWriter;

/// Another party's words for a log field: control characters escaped (a
/// line break reads `\n`), at most 300 characters.
pub fn quote(s: &str) -> String {
    s.escape_debug().take(300).collect()
}

/// The longest event written; a longer one is cut ([`escaped`]).
pub const MAX_EVENT_BYTES: usize = 8192;

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
    if body.len() > MAX_EVENT_BYTES {
        return Cow::Owned(escape(&bounded(&text), end).into_bytes());
    }
    if !text.chars().any(needs_escape) && matches!(text, Cow::Borrowed(_)) {
        return Cow::Borrowed(event);
    }
    Cow::Owned(escape(&text, end).into_bytes())
}

/// `text`, each character [`needs_escape`] escaped, then `end`: as JSON
/// escapes it (`\u202e`) in a JSON event, whose strings are the only place
/// such a character can be, so that the line stays JSON; else as Rust does.
fn escape(text: &str, end: &str) -> String {
    let json = text.starts_with('{');
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if !needs_escape(c) {
            out.push(c);
        } else if json {
            out.push_str(&format!("\\u{:04x}", u32::from(c)));
        } else {
            out.extend(c.escape_default());
        }
    }
    out.push_str(end);
    out
}

/// An event over [`MAX_EVENT_BYTES`], cut: a JSON event (as `--log-format
/// json` writes them) keeps every field, each string cut to a share of the
/// bound, so that it is still JSON; any other, its first bytes.
fn bounded(body: &str) -> String {
    if let Ok(mut event) = serde_json::from_str::<serde_json::Value>(body) {
        let strings = count_strings(&event).max(1);
        cut_strings(&mut event, MAX_EVENT_BYTES / 2 / strings);
        return event.to_string();
    }
    format!(
        "{} … [{} bytes cut]",
        prefix(body, MAX_EVENT_BYTES),
        body.len() - prefix(body, MAX_EVENT_BYTES).len()
    )
}

fn count_strings(v: &serde_json::Value) -> usize {
    match v {
        serde_json::Value::String(_) => 1,
        serde_json::Value::Array(items) => items.iter().map(count_strings).sum(),
        serde_json::Value::Object(members) => members.values().map(count_strings).sum(),
        _ => 0,
    }
}

fn cut_strings(v: &mut serde_json::Value, each: usize) {
    match v {
        serde_json::Value::String(s) if s.len() > each => {
            let kept = prefix(s, each).len();
            *s = format!("{} … [{} bytes cut]", &s[..kept], s.len() - kept);
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(|i| cut_strings(i, each)),
        serde_json::Value::Object(members) => {
            members.values_mut().for_each(|m| cut_strings(m, each))
        }
        _ => {}
    }
}

/// The longest start of `s` of at most `bytes` bytes that ends between
/// two characters.
fn prefix(s: &str, bytes: usize) -> &str {
    let mut end = bytes.min(s.len());
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
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

    /// Twenty-first red-team pass (docs/security.md, row 129): rmcp logs a
    /// JSON-RPC request id whole, and any agent chooses one of 900 KB; each
    /// such request wrote a line that long. An event is cut to a bound, a
    /// JSON event string by string, so that it stays JSON.
    #[test]
    fn test_an_event_has_a_bounded_length() {
        let id = "x".repeat(900_000);
        let text =
            format!("2026-12-07T00:00:00Z  WARN rmcp::service: response error id={id} tail\n");
        let mut out = Vec::new();
        Escaping(&mut out).write_all(text.as_bytes()).unwrap();
        let out = String::from_utf8(out).unwrap();
        assert!(out.len() < MAX_EVENT_BYTES + 100, "{}", out.len());
        assert!(out.starts_with("2026-12-07T00:00:00Z  WARN rmcp::service: response error id=xxx"));
        assert!(out.ends_with("bytes cut]\n"), "{}", &out[out.len() - 40..]);
        assert_eq!(out.lines().count(), 1);

        let json = format!(
            "{}\n",
            serde_json::json!({"level": "WARN", "fields": {"message": "response error", "id": id}, "target": "rmcp::service"})
        );
        let mut out = Vec::new();
        Escaping(&mut out).write_all(json.as_bytes()).unwrap();
        let out = String::from_utf8(out).unwrap();
        assert!(out.len() < MAX_EVENT_BYTES + 100, "{}", out.len());
        assert!(out.ends_with('\n') && out.lines().count() == 1);
        let read: serde_json::Value = serde_json::from_str(out.trim_end()).expect("still JSON");
        assert_eq!(read["fields"]["message"], "response error");
        assert_eq!(read["level"], "WARN");
        assert!(read["fields"]["id"]
            .as_str()
            .unwrap()
            .ends_with("bytes cut]"));

        // A JSON event stays JSON, whatever it quotes.
        let bidi = format!(
            "{}\n",
            serde_json::json!({"fields": {"name": "a\u{202e}b\u{1b}"}})
        );
        let out = String::from_utf8(escaped(bidi.as_bytes()).into_owned()).unwrap();
        let read: serde_json::Value = serde_json::from_str(out.trim_end()).expect("still JSON");
        assert_eq!(read["fields"]["name"], "a\u{202e}b\u{1b}");
        assert!(!out.contains('\u{202e}'));

        // An event within the bound passes whole.
        assert!(matches!(escaped(b"short\n"), Cow::Borrowed(_)));
    }

    #[test]
    fn test_a_quote_is_escaped_and_short() {
        assert_eq!(quote("a\nb"), "a\\nb");
        let wide = "é".repeat(400);
        assert_eq!(quote(&wide).chars().count(), 300);
    }
}
