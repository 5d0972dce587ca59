//! Summary templates, rendered by the server.
//!
//! The summary is what a human reads before approving, so it must not be written
//! by the agent: the tool's administrator registers a template such as
//! `Send email to {to} about "{subject}"` and the server fills it from the params
//! that are hashed. Values come from the agent, so each is made safe to show:
//! control characters (which could fake line breaks) and Unicode bidi controls
//! (which could reorder what is displayed, "Trojan Source" style) become spaces,
//! and lengths are capped so one value cannot push the rest off the card.

use std::io;

use serde_json::Value;

use crate::CoreError;

/// Longest accepted template, in characters.
pub const MAX_TEMPLATE_CHARS: usize = 500;
/// Longest rendered placeholder value, in characters (ellipsis included).
pub const MAX_VALUE_CHARS: usize = 200;
/// Longest rendered summary, in characters (ellipsis included).
pub const MAX_SUMMARY_CHARS: usize = 1000;

const ELLIPSIS: char = '…';

/// The placeholder that renders the number of targets rather than a param.
const COUNT: &str = "count";

/// Accepts a template whose placeholders are `{dotted.identifier}` and whose
/// literal braces are doubled (`{{`, `}}`).
pub fn check_template(t: &str) -> Result<(), CoreError> {
    parse(t).map(|_| ())
}

/// Renders `t` (which should have passed [`check_template`]) against `params`.
///
/// `{count}` is `count`; other placeholders look up params by path. Strings are
/// shown as they are, numbers/booleans/null as JSON text, arrays as their
/// elements joined by ", ", objects as compact JSON, and missing values as `?`.
/// A template that does not parse is shown as sanitized text rather than failing:
/// rendering happens after registration checked it, and must not abort approval.
pub fn render(t: &str, params: &Value, count: i64) -> String {
    let Ok(segments) = parse(t) else {
        return clip(sanitize(t), MAX_SUMMARY_CHARS);
    };
    let mut out = String::with_capacity(t.len() + 64);
    for segment in segments {
        match segment {
            Segment::Text(s) => out.push_str(&sanitize(s)),
            Segment::Brace(c) => out.push(c),
            Segment::Placeholder(path) => {
                let raw = if path == COUNT {
                    count.to_string()
                } else {
                    lookup(params, path).map_or_else(|| "?".to_owned(), value_text)
                };
                out.push_str(&clip(sanitize(&raw), MAX_VALUE_CHARS));
            }
        }
    }
    clip(out, MAX_SUMMARY_CHARS)
}

#[derive(Debug, PartialEq, Eq)]
enum Segment<'a> {
    Text(&'a str),
    Brace(char),
    Placeholder(&'a str),
}

fn parse(t: &str) -> Result<Vec<Segment<'_>>, CoreError> {
    if t.chars().count() > MAX_TEMPLATE_CHARS {
        return Err(CoreError::InvalidTemplate(format!(
            "the template is longer than {MAX_TEMPLATE_CHARS} characters; shorten it"
        )));
    }
    let bytes = t.as_bytes();
    let mut segments = Vec::new();
    let mut text_start = 0;
    let mut i = 0;
    // Braces are ASCII, so every index where one is found is a char boundary.
    while i < bytes.len() {
        match (bytes[i], bytes.get(i + 1)) {
            (b'{', Some(b'{')) | (b'}', Some(b'}')) => {
                push_text(&mut segments, &t[text_start..i]);
                segments.push(Segment::Brace(char::from(bytes[i])));
                i += 2;
                text_start = i;
            }
            (b'{', _) => {
                let Some(len) = t[i + 1..].find('}') else {
                    return Err(CoreError::InvalidTemplate(format!(
                        "the '{{' at byte {i} is never closed; write '{{{{' for a literal brace"
                    )));
                };
                let path = &t[i + 1..i + 1 + len];
                if !is_valid_path(path) {
                    return Err(CoreError::InvalidTemplate(format!(
                        "placeholder {{{path}}} is not a dotted name such as {{to}} or \
                         {{set.stage}} (letters, digits and _, not starting with a digit); \
                         write '{{{{' and '}}}}' for literal braces"
                    )));
                }
                push_text(&mut segments, &t[text_start..i]);
                segments.push(Segment::Placeholder(path));
                i += len + 2;
                text_start = i;
            }
            (b'}', _) => {
                return Err(CoreError::InvalidTemplate(format!(
                    "the '}}' at byte {i} has no matching '{{'; write '}}}}' for a literal brace"
                )));
            }
            _ => i += 1,
        }
    }
    push_text(&mut segments, &t[text_start..]);
    Ok(segments)
}

fn push_text<'a>(segments: &mut Vec<Segment<'a>>, s: &'a str) {
    if !s.is_empty() {
        segments.push(Segment::Text(s));
    }
}

/// `[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*`
fn is_valid_path(path: &str) -> bool {
    path.split('.').all(|ident| {
        let mut bytes = ident.bytes();
        bytes
            .next()
            .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
            && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
    })
}

fn lookup<'v>(params: &'v Value, path: &str) -> Option<&'v Value> {
    path.split('.')
        .try_fold(params, |v, key| v.as_object()?.get(key))
}

fn value_text(v: &Value) -> String {
    let mut out = String::new();
    push_value(&mut out, v);
    out
}

/// Enough bytes to hold more than [`MAX_VALUE_CHARS`] characters of any width, so
/// stopping here never changes what survives the later clip.
const VALUE_BYTE_BUDGET: usize = 4 * (MAX_VALUE_CHARS + 1);

fn push_value(out: &mut String, v: &Value) {
    if out.len() > VALUE_BYTE_BUDGET {
        return;
    }
    match v {
        Value::String(s) => out.push_str(s),
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => out.push_str(n.as_str()),
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                if out.len() > VALUE_BYTE_BUDGET {
                    break;
                }
                if i > 0 {
                    out.push_str(", ");
                }
                push_value(out, item);
            }
        }
        Value::Object(_) => {
            // A large object is cut off as it is written instead of serialized whole.
            let mut sink = BoundedSink {
                buf: Vec::new(),
                limit: VALUE_BYTE_BUDGET,
            };
            // An Err only means the budget was reached; the prefix is what we want.
            let _ = serde_json::to_writer(&mut sink, v);
            out.push_str(&String::from_utf8_lossy(&sink.buf));
        }
    }
}

/// A writer that keeps at most `limit` bytes and then refuses more.
struct BoundedSink {
    buf: Vec<u8>,
    limit: usize,
}

impl io::Write for BoundedSink {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let room = self.limit.saturating_sub(self.buf.len());
        if room == 0 {
            return Err(io::Error::other("summary value budget reached"));
        }
        let n = room.min(data.len());
        self.buf.extend_from_slice(&data[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Characters that must not reach the approval card: C0/C1 controls (line
/// breaks, tabs, escape sequences), line/paragraph separators and the bidi
/// embedding, override, isolate and mark characters.
fn is_unsafe_char(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{061C}'
                | '\u{200E}'
                | '\u{200F}'
                | '\u{2028}'
                | '\u{2029}'
                | '\u{202A}'..='\u{202E}'
                | '\u{2066}'..='\u{2069}'
        )
}

fn sanitize(s: &str) -> String {
    s.chars()
        .map(|c| if is_unsafe_char(c) { ' ' } else { c })
        .collect()
}

/// At most `max` characters; a cut string ends in "…" (counted in `max`).
fn clip(s: String, max: usize) -> String {
    match s.char_indices().nth(max) {
        None => s,
        Some(_) => {
            let cut = s.char_indices().nth(max - 1).map_or(s.len(), |(i, _)| i);
            let mut out = String::with_capacity(cut + ELLIPSIS.len_utf8());
            out.push_str(&s[..cut]);
            out.push(ELLIPSIS);
            out
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    macro_rules! template_ok {
        ($($name:ident: $t:expr,)*) => {$(
            #[test]
            fn $name() {
                assert_eq!(check_template($t), Ok(()));
            }
        )*};
    }

    template_ok! {
        test_ok_email_example: r#"Send email to {to} about "{subject}""#,
        test_ok_stage_example: "Set {set.stage} on {count} deal(s)",
        test_ok_plain_text: "Archive the report",
        test_ok_empty: "",
        test_ok_literal_braces: "JSON looks like {{\"a\": {a_1}}}",
        test_ok_underscore_start: "{_x.y_2.Z}",
        test_ok_max_length: &"x".repeat(MAX_TEMPLATE_CHARS),
    }

    macro_rules! template_err {
        ($($name:ident: $t:expr => $needle:expr,)*) => {$(
            #[test]
            fn $name() {
                match check_template($t) {
                    Err(CoreError::InvalidTemplate(msg)) => {
                        assert!(msg.contains($needle), "{msg}")
                    }
                    other => panic!("{:?}: {other:?}", $t),
                }
            }
        )*};
    }

    template_err! {
        test_err_unclosed: "Send to {to" => "never closed",
        test_err_lone_close: "Send } now" => "no matching",
        test_err_empty_placeholder: "a {} b" => "placeholder {}",
        test_err_space_in_path: "{ to}" => "placeholder { to}",
        test_err_leading_digit: "{1a}" => "placeholder {1a}",
        test_err_double_dot: "{a..b}" => "placeholder {a..b}",
        test_err_trailing_dot: "{a.}" => "placeholder {a.}",
        test_err_hyphen: "{first-name}" => "placeholder {first-name}",
        test_err_nested_open: "{a{b}}" => "placeholder {a{b}",
        test_err_too_long: &"x".repeat(MAX_TEMPLATE_CHARS + 1) => "longer than 500",
    }

    #[test]
    fn test_render_email_example() {
        let params = json!({"to": "ann@example.com", "subject": "Q3 numbers"});
        assert_eq!(
            render(r#"Send email to {to} about "{subject}""#, &params, 1),
            r#"Send email to ann@example.com about "Q3 numbers""#
        );
    }

    #[test]
    fn test_render_stage_example_with_count() {
        let params = json!({"set": {"stage": "won"}, "where": {"id": [1, 2, 3]}});
        assert_eq!(
            render("Set {set.stage} on {count} deal(s)", &params, 3),
            "Set won on 3 deal(s)"
        );
    }

    #[test]
    fn test_render_value_kinds() {
        // Parsed from text so the number keeps the literal the agent sent.
        let params: Value = serde_json::from_str(
            r#"{"n": 4.50, "i": -7, "t": true, "f": false, "z": null,
                "arr": ["a", 1, [2, 3], {"k": "v"}], "obj": {"b": 1, "a": [true]}}"#,
        )
        .unwrap();
        assert_eq!(
            render(
                "{n}|{i}|{t}|{f}|{z}|{arr}|{obj}|{missing}|{n.deeper}",
                &params,
                0
            ),
            r#"4.50|-7|true|false|null|a, 1, 2, 3, {"k":"v"}|{"a":[true],"b":1}|?|?"#
        );
    }

    #[test]
    fn test_render_literal_braces() {
        assert_eq!(render("{{{x}}}", &json!({"x": "y"}), 0), "{y}");
    }

    #[test]
    fn test_render_count_wins_over_param_named_count() {
        assert_eq!(render("{count}", &json!({"count": 99}), 2), "2");
    }

    #[test]
    fn test_render_replaces_controls_and_bidi_with_spaces() {
        let params = json!({"s": "a\nb\tc\r\u{1b}[31m\u{7f}\u{85}d\u{202E}e\u{2066}f\u{2069}\u{200F}g\u{2028}h"});
        assert_eq!(render("<{s}>", &params, 0), "<a b c  [31m  d e f  g h>");
    }

    #[test]
    fn test_render_sanitizes_template_text_too() {
        assert_eq!(render("a\nb\u{202E}c", &json!({}), 0), "a b c");
    }

    #[test]
    fn test_render_truncates_each_value_to_200_chars() {
        let long = "é".repeat(500);
        let out = render("[{s}]", &json!({"s": long}), 0);
        let inner: String = out.trim_start_matches('[').trim_end_matches(']').to_owned();
        assert_eq!(inner.chars().count(), MAX_VALUE_CHARS);
        assert!(inner.ends_with('…'));
        assert_eq!(
            inner.chars().filter(|&c| c == 'é').count(),
            MAX_VALUE_CHARS - 1
        );
    }

    #[test]
    fn test_render_keeps_value_of_exactly_200_chars() {
        let exact = "x".repeat(MAX_VALUE_CHARS);
        assert_eq!(render("{s}", &json!({"s": exact.clone()}), 0), exact);
    }

    #[test]
    fn test_render_truncates_large_arrays_and_objects() {
        let arr: Vec<u32> = (0..100_000).collect();
        let out = render("{a}", &json!({"a": arr}), 0);
        assert_eq!(out.chars().count(), MAX_VALUE_CHARS);
        assert!(out.starts_with("0, 1, 2, ") && out.ends_with('…'));

        let obj: serde_json::Map<String, Value> = (0..10_000)
            .map(|i| (format!("k{i:05}"), json!(i)))
            .collect();
        let out = render("{o}", &json!({"o": obj}), 0);
        assert_eq!(out.chars().count(), MAX_VALUE_CHARS);
        assert!(out.starts_with(r#"{"k00000":0,"#) && out.ends_with('…'));
    }

    #[test]
    fn test_render_truncates_whole_summary_to_1000_chars() {
        let t = "{a}{a}{a}{a}{a}{a}";
        let out = render(t, &json!({"a": "y".repeat(300)}), 0);
        assert_eq!(out.chars().count(), MAX_SUMMARY_CHARS);
        assert!(out.ends_with('…'));
    }

    #[test]
    fn test_render_invalid_template_shows_text() {
        assert_eq!(render("Send {to", &json!({"to": "x"}), 0), "Send {to");
    }
}
