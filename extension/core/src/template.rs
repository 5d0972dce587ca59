//! Summary templates, rendered by the server.
//!
//! The summary is what a human reads on a phone before tapping Approve, so it
//! must not be written by the agent: the tool's administrator registers a
//! template such as `Send email to {to} about "{subject}"` and the server fills
//! it from the params that are hashed. Values come from the agent, so the
//! renderer holds to these rules:
//!
//! * **Nothing invisible.** Template text and values are cleaned by
//!   [`crate::text::for_display`]: format (Cf) and Default_Ignorable characters
//!   are removed, controls, line/paragraph separators and bidi controls become
//!   spaces, runs of whitespace become one space, and values are trimmed.
//! * **A value stays inside its quoting.** When the template puts a placeholder
//!   directly between a quote pair (`"{subject}"`, `'{x}'`, `“{x}”`, `«{x}»`, ...),
//!   the closing quote and backslash are escaped inside the value (`\"`, `\\`).
//!   Anywhere else a string that contains a space or any quote character
//!   ([`crate::text::is_quote`]), or is empty, is wrapped by the renderer in
//!   ASCII `"…"` with `"` and `\` escaped the same way: ASCII because it is the
//!   one quote every keyboard and font has, so the reader can see which quote
//!   the renderer chose. Single tokens (`won`, an address, a number, `{count}`)
//!   stay bare, so `Set stage won on 3 deal(s)` reads naturally, and a run of
//!   words outside quotes on the card is the template's own text (or the
//!   renderer's "and N more").
//! * **No element of a list is hidden.** Arrays are shown element by element
//!   (each quoted by the rule above, and also when it contains a comma), joined
//!   by `, `. When they do not all fit, the leading ones are shown and the rest
//!   counted (`a@x.com, b@y.com and 3 more`); an element that is too long is
//!   clipped with `…` inside its own quotes. Nested arrays and objects are shown
//!   as compact JSON.
//! * **No blind cut.** The summary budget ([`MAX_SUMMARY_CHARS`] less the
//!   template's own text) is shared among the placeholders, fairly: none gets
//!   more than [`MAX_VALUE_CHARS`], and what a short value does not use goes to
//!   the longer ones. Every placeholder is clipped (with `…`) to its own share,
//!   so the summary always fits and its end is never cut off.
//!
//! [`render`] never fails, because it runs when a proposal is shown, after
//! registration validated the template. [`render_checked`] is the strict form:
//! it refuses params that the summary cannot show in full.

use std::io;

use serde_json::Value;

use crate::text::{display_chars, for_display, is_quote};
use crate::CoreError;

/// Longest accepted template, in characters.
pub const MAX_TEMPLATE_CHARS: usize = 500;
/// Longest rendered placeholder value, in characters (quotes, escapes and
/// ellipsis included).
pub const MAX_VALUE_CHARS: usize = 200;
/// Longest rendered summary, in characters.
pub const MAX_SUMMARY_CHARS: usize = 1000;

const ELLIPSIS: char = '…';

/// The placeholder that renders the number of targets rather than a param.
const COUNT: &str = "count";

/// The quote the renderer wraps values in (see the module docs).
const WRAP: char = '"';

/// When a list does not fit whole, each element shown gets its whole length
/// or at least this many characters: short elements (most addresses) are
/// shown whole or counted, never cut to a stub, and only longer ones are
/// clipped, so that the elements after a long one still get shown.
const MIN_ELEMENT_CHARS: usize = 40;

/// Quote pairs that, put directly around a placeholder, make the template's
/// own quoting (opening, closing).
const QUOTE_PAIRS: &[(char, char)] = &[
    ('"', '"'),
    ('\'', '\''),
    ('`', '`'),
    ('“', '”'),
    ('‘', '’'),
    ('„', '“'),
    ('„', '”'),
    ('‚', '‘'),
    ('‚', '’'),
    ('«', '»'),
    ('»', '«'),
    ('‹', '›'),
    ('›', '‹'),
    ('「', '」'),
    ('『', '』'),
    ('＂', '＂'),
];

/// Accepts a template whose placeholders are `{dotted.identifier}` and whose
/// literal braces are doubled (`{{`, `}}`).
pub fn check_template(t: &str) -> Result<(), CoreError> {
    parse(t).map(|_| ())
}

/// Renders `t` (which should have passed [`check_template`]) against `params`,
/// following the rules in the module docs.
///
/// `{count}` is `count`; other placeholders look up params by path. Numbers,
/// booleans and null are shown as JSON text, objects as compact JSON, and
/// missing values as `?`. A template that does not parse is shown as cleaned
/// text rather than failing: rendering must not abort approval.
pub fn render(t: &str, params: &Value, count: i64) -> String {
    match parse(t) {
        Ok(segments) => render_segments(&segments, params, count).text,
        Err(_) => clip_chars(for_display(t).trim(), MAX_SUMMARY_CHARS),
    }
}

/// [`render`], but refusing params that the summary cannot show faithfully.
///
/// "Faithfully" here means in full: a value clipped to its share of the
/// summary, a list element clipped, or list elements counted instead of shown
/// all make this return [`CoreError::UnfaithfulSummary`] naming the
/// placeholders. There is no partial credit for a long prefix, because the
/// part a clip hides is the part an attacker pads toward (the domain after a
/// long local part, the recipient after a long first one). Whitespace that was
/// collapsed and invisible characters that were removed do not count as loss:
/// the person sees everything that can be seen. A template that does not parse
/// is [`CoreError::InvalidTemplate`].
pub fn render_checked(t: &str, params: &Value, count: i64) -> Result<String, CoreError> {
    let rendered = render_segments(&parse(t)?, params, count);
    if rendered.losses.is_empty() {
        Ok(rendered.text)
    } else {
        Err(CoreError::UnfaithfulSummary(rendered.losses))
    }
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

/// The template as text runs (literal braces folded in, already cleaned for
/// display) and placeholders.
enum Part<'a> {
    Text(String),
    Placeholder(&'a str),
}

struct Rendered {
    text: String,
    /// One message per placeholder that could not be shown in full.
    losses: Vec<String>,
}

fn render_segments(segments: &[Segment<'_>], params: &Value, count: i64) -> Rendered {
    let parts = parts(segments);
    let template_chars: usize = parts
        .iter()
        .map(|p| match p {
            Part::Text(s) => s.chars().count(),
            Part::Placeholder(_) => 0,
        })
        .sum();

    let count_text = count.to_string();
    let mut values = Vec::new();
    for (i, part) in parts.iter().enumerate() {
        if let Part::Placeholder(path) = part {
            let source = if *path == COUNT {
                Source::Atom(&count_text)
            } else {
                lookup(params, path).map_or(Source::Atom("?"), Source::Value)
            };
            values.push((path, source, template_quote(&parts, i)));
        }
    }

    // Measured at the largest share a value can get, so shorter values can
    // leave the rest of the budget to longer ones.
    let needs: Vec<usize> = values
        .iter()
        .map(|(_, source, quote)| {
            show(source, *quote, MAX_VALUE_CHARS)
                .chars
                .min(MAX_VALUE_CHARS)
        })
        .collect();
    let shares = fair_shares(&needs, MAX_SUMMARY_CHARS.saturating_sub(template_chars));

    let mut text = String::with_capacity(template_chars + shares.iter().sum::<usize>());
    let mut losses = Vec::new();
    let mut shown = values.iter().zip(&shares);
    for part in &parts {
        match part {
            Part::Text(s) => text.push_str(s),
            Part::Placeholder(_) => {
                let Some(((path, source, quote), &share)) = shown.next() else {
                    break;
                };
                let value = show(source, *quote, share);
                text.push_str(&value.text);
                if let Some(loss) = value.loss {
                    losses.push(loss.describe(path, share));
                }
            }
        }
    }
    let trimmed = text.trim();
    if trimmed.len() != text.len() {
        text = trimmed.to_owned();
    }
    debug_assert!(text.chars().count() <= MAX_SUMMARY_CHARS);
    Rendered { text, losses }
}

fn parts<'a>(segments: &[Segment<'a>]) -> Vec<Part<'a>> {
    let mut parts = Vec::new();
    let mut raw = String::new();
    for segment in segments {
        match segment {
            Segment::Text(s) => raw.push_str(s),
            Segment::Brace(c) => raw.push(*c),
            Segment::Placeholder(path) => {
                if !raw.is_empty() {
                    parts.push(Part::Text(for_display(&raw)));
                    raw.clear();
                }
                parts.push(Part::Placeholder(path));
            }
        }
    }
    if !raw.is_empty() {
        parts.push(Part::Text(for_display(&raw)));
    }
    parts
}

/// The closing quote of the pair the template puts directly around the
/// placeholder at `parts[i]`, if it does.
fn template_quote(parts: &[Part<'_>], i: usize) -> Option<char> {
    let before = match parts.get(i.checked_sub(1)?)? {
        Part::Text(s) => s.chars().next_back()?,
        Part::Placeholder(_) => return None,
    };
    let after = match parts.get(i + 1)? {
        Part::Text(s) => s.chars().next()?,
        Part::Placeholder(_) => return None,
    };
    QUOTE_PAIRS.contains(&(before, after)).then_some(after)
}

/// Max-min fair division of `budget`: nobody gets more than they need, and
/// what the small needs leave is split evenly among the larger ones.
fn fair_shares(needs: &[usize], budget: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..needs.len()).collect();
    order.sort_by_key(|&i| needs[i]);
    let mut shares = vec![0; needs.len()];
    let mut left = budget;
    for (done, &i) in order.iter().enumerate() {
        let share = needs[i].min(left / (needs.len() - done));
        shares[i] = share;
        left -= share;
    }
    shares
}

/// What a placeholder stands for.
enum Source<'v> {
    /// Text shown as it is (`{count}`, `?` for a missing value).
    Atom(&'v str),
    Value(&'v Value),
}

/// Characters to escape with a backslash. At most two (a closing quote and
/// the backslash itself), so a fixed array avoids allocating.
#[derive(Clone, Copy)]
struct Escapes([Option<char>; 2]);

impl Escapes {
    const NONE: Self = Self([None, None]);

    fn for_quote(close: char) -> Self {
        Self([Some(close), Some('\\')])
    }

    fn contains(self, c: char) -> bool {
        self.0.contains(&Some(c))
    }

    fn push(self, out: &mut String, c: char) {
        if self.contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
}

/// Why a shown value is not the whole value.
enum Loss {
    Clipped,
    /// Some list elements were counted instead of shown (and perhaps some
    /// shown ones clipped).
    Counted {
        shown: usize,
        total: usize,
    },
}

impl Loss {
    fn describe(&self, path: &str, share: usize) -> String {
        match self {
            Loss::Clipped => format!(
                "{{{path}}} cannot be shown faithfully: it is longer than the {share} characters \
                 the summary has room for"
            ),
            Loss::Counted { shown, total } => format!(
                "{{{path}}} cannot be shown faithfully: only {shown} of its {total} elements fit \
                 in the {share} characters the summary has room for"
            ),
        }
    }
}

/// A value as rendered for the card.
struct Shown {
    text: String,
    chars: usize,
    loss: Option<Loss>,
}

impl Shown {
    fn new(text: String, loss: Option<Loss>) -> Self {
        Self {
            chars: text.chars().count(),
            text,
            loss,
        }
    }
}

/// Renders a placeholder's value in at most `budget` characters (at least
/// one). `quote` is the closing quote of the template's own quoting around
/// it, if any: that quote and the backslash are then escaped throughout.
fn show(source: &Source<'_>, quote: Option<char>, budget: usize) -> Shown {
    let budget = budget.max(1);
    let outer = quote.map_or(Escapes::NONE, Escapes::for_quote);
    match source {
        Source::Atom(s) => Piece::bare(s.chars(), outer, budget).fit(budget),
        Source::Value(Value::Array(items)) => show_list(items, outer, budget),
        // The template quotes it already: escape, never wrap.
        Source::Value(Value::String(s)) if quote.is_some() => {
            Piece::bare(trimmed(s), outer, budget).fit(budget)
        }
        Source::Value(v) => Piece::of(v, outer, false, budget).fit(budget),
    }
}

/// A list, element by element, counting the elements that do not fit.
fn show_list(items: &[Value], outer: Escapes, budget: usize) -> Shown {
    if items.is_empty() {
        return Piece::bare("[]".chars(), outer, budget).fit(budget);
    }
    // Every shown element costs at least one character and a ", ".
    let most = items.len().min(budget / 3 + 1);
    let pieces: Vec<Piece> = items[..most]
        .iter()
        .map(|v| Piece::of(v, outer, true, budget))
        .collect();
    let needs: Vec<usize> = pieces.iter().map(Piece::need).collect();
    for k in (1..=most).rev() {
        let rest = items.len() - k;
        let suffix = if rest > 0 {
            format!(" and {rest} more")
        } else {
            String::new()
        };
        let Some(room) = budget.checked_sub(suffix.chars().count() + 2 * (k - 1)) else {
            continue;
        };
        let shares = fair_shares(&needs[..k], room);
        let readable = shares
            .iter()
            .zip(&needs)
            .all(|(&share, &need)| share >= need.min(MIN_ELEMENT_CHARS));
        if room == 0 || (k > 1 && !readable) {
            continue;
        }
        let mut text = String::new();
        let mut clipped = false;
        for (i, (piece, &share)) in pieces.iter().zip(&shares).enumerate() {
            if i > 0 {
                text.push_str(", ");
            }
            let shown = piece.fit(share);
            clipped |= shown.loss.is_some();
            text.push_str(&shown.text);
        }
        text.push_str(&suffix);
        let loss = if rest > 0 {
            Some(Loss::Counted {
                shown: k,
                total: items.len(),
            })
        } else {
            clipped.then_some(Loss::Clipped)
        };
        return Shown::new(text, loss);
    }
    // Only reachable with a budget too small for one element and its count.
    let total = format!("({} items)", items.len());
    let text = if total.chars().count() <= budget {
        total
    } else {
        ELLIPSIS.to_string()
    };
    Shown::new(
        text,
        Some(Loss::Counted {
            shown: 0,
            total: items.len(),
        }),
    )
}

/// A value's display text, built so that it can be clipped without splitting
/// an escape and without losing its quotes: `open` + `body` + `close`.
struct Piece {
    open: String,
    body: String,
    /// Byte length and character count of `body` after each source
    /// character; a clip ends at one of these.
    ends: Vec<(usize, usize)>,
    close: String,
    /// The source itself was cut before it reached the body (a large object).
    source_cut: bool,
}

impl Piece {
    /// Shown as it is, escapes aside.
    fn bare(chars: impl Iterator<Item = char>, outer: Escapes, limit: usize) -> Self {
        let mut piece = Self::empty();
        piece.extend(chars, Escapes::NONE, outer, limit);
        piece
    }

    /// A param value (not an array at the top level, which [`show_list`]
    /// handles) or a list element.
    fn of(v: &Value, outer: Escapes, in_list: bool, limit: usize) -> Self {
        match v {
            Value::String(s) => {
                if needs_wrap(s, in_list) {
                    let mut piece = Self::empty();
                    outer.push(&mut piece.open, WRAP);
                    outer.push(&mut piece.close, WRAP);
                    piece.extend(trimmed(s), Escapes::for_quote(WRAP), outer, limit);
                    piece
                } else {
                    Self::bare(trimmed(s), outer, limit)
                }
            }
            Value::Null => Self::bare("null".chars(), outer, limit),
            Value::Bool(b) => Self::bare(if *b { "true" } else { "false" }.chars(), outer, limit),
            Value::Number(n) => Self::bare(n.as_str().chars(), outer, limit),
            Value::Array(_) | Value::Object(_) => {
                let (json, cut) = bounded_json(v, limit);
                let mut piece = Self::bare(display_chars(&json), outer, limit);
                piece.source_cut |= cut;
                piece
            }
        }
    }

    fn empty() -> Self {
        Self {
            open: String::new(),
            body: String::new(),
            ends: Vec::new(),
            close: String::new(),
            source_cut: false,
        }
    }

    /// Appends source characters, each escaped by `inner` and the result by
    /// `outer`, stopping once the body is known to be longer than `limit`.
    fn extend(
        &mut self,
        chars: impl Iterator<Item = char>,
        inner: Escapes,
        outer: Escapes,
        limit: usize,
    ) {
        let mut count = self.ends.last().map_or(0, |&(_, n)| n);
        for c in chars {
            if count > limit {
                self.source_cut = true;
                return;
            }
            let mut unit = String::new();
            inner.push(&mut unit, c);
            for u in unit.chars() {
                outer.push(&mut self.body, u);
            }
            count += unit
                .chars()
                .map(|u| 1 + usize::from(outer.contains(u)))
                .sum::<usize>();
            self.ends.push((self.body.len(), count));
        }
    }

    fn frame_chars(&self) -> usize {
        self.open.chars().count() + self.close.chars().count()
    }

    fn body_chars(&self) -> usize {
        self.ends.last().map_or(0, |&(_, n)| n)
    }

    /// Characters needed to show it whole; one more than it has when the
    /// source was cut, so that no share is ever mistaken for enough.
    fn need(&self) -> usize {
        self.frame_chars() + self.body_chars() + usize::from(self.source_cut)
    }

    /// At most `budget` characters: whole, or clipped inside its quotes.
    fn fit(&self, budget: usize) -> Shown {
        if !self.source_cut && self.need() <= budget {
            return Shown::new(format!("{}{}{}", self.open, self.body, self.close), None);
        }
        let Some(room) = budget.checked_sub(self.frame_chars() + 1) else {
            return Shown::new(ELLIPSIS.to_string(), Some(Loss::Clipped));
        };
        let end = self
            .ends
            .iter()
            .take_while(|&&(_, n)| n <= room)
            .last()
            .map_or(0, |&(byte, _)| byte);
        let text = format!(
            "{}{}{ELLIPSIS}{}",
            self.open,
            self.body[..end].trim_end(),
            self.close
        );
        Shown::new(text, Some(Loss::Clipped))
    }
}

/// A string's display characters, trimmed. Whitespace runs are already one
/// space, so a space is trailing exactly when nothing follows it.
fn trimmed(s: &str) -> impl Iterator<Item = char> + '_ {
    let mut chars = display_chars(s).skip_while(|&c| c == ' ').peekable();
    std::iter::from_fn(move || {
        let c = chars.next()?;
        (c != ' ' || chars.peek().is_some()).then_some(c)
    })
}

/// Whether a string must be wrapped in quotes to be read as one value: it is
/// empty or holds a space or a quote character, or, in a list, a comma (which
/// would read as two elements).
fn needs_wrap(s: &str, in_list: bool) -> bool {
    let mut chars = trimmed(s).peekable();
    chars.peek().is_none() || chars.any(|c| c == ' ' || is_quote(c) || (in_list && c == ','))
}

/// Compact JSON of `v`, written only as far as a display of `limit`
/// characters can use (escapes and removed invisible characters included),
/// and whether it was cut.
fn bounded_json(v: &Value, limit: usize) -> (String, bool) {
    let mut sink = BoundedSink {
        buf: Vec::new(),
        limit: 16 * (limit + 1),
    };
    // An Err only means the budget was reached; the prefix is what we want.
    let cut = serde_json::to_writer(&mut sink, v).is_err();
    (String::from_utf8_lossy(&sink.buf).into_owned(), cut)
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

/// At most `max` characters; a cut string ends in "…" (counted in `max`).
fn clip_chars(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        None => s.to_owned(),
        Some(_) => {
            let cut = s.char_indices().nth(max - 1).map_or(s.len(), |(i, _)| i);
            format!("{}{ELLIPSIS}", &s[..cut])
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
        // A nested array is one element of its list, so it is shown as JSON
        // ([2,3]) rather than flattened into elements of the outer one.
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
            r#"4.50|-7|true|false|null|a, 1, [2,3], {"k":"v"}|{"a":[true],"b":1}|?|?"#
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
        // The spaces collapse, and a value with spaces in it is quoted.
        let params = json!({"s": "a\nb\tc\r\u{1b}[31m\u{7f}\u{85}d\u{202E}e\u{2066}f\u{2069}\u{200F}g\u{2028}h"});
        assert_eq!(render("<{s}>", &params, 0), r#"<"a b c [31m d e f g h">"#);
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
        // A list is cut between elements and the rest counted, never cut
        // through an element.
        let arr: Vec<u32> = (0..100_000).collect();
        let out = render("{a}", &json!({"a": arr}), 0);
        assert!(out.chars().count() <= MAX_VALUE_CHARS, "{out}");
        let (shown, rest) = out.split_once(" and ").unwrap();
        let shown: Vec<&str> = shown.split(", ").collect();
        assert_eq!(shown[..3], ["0", "1", "2"]);
        assert_eq!(shown.last(), Some(&(shown.len() - 1).to_string().as_str()));
        assert_eq!(rest, format!("{} more", 100_000 - shown.len()));

        let obj: serde_json::Map<String, Value> = (0..10_000)
            .map(|i| (format!("k{i:05}"), json!(i)))
            .collect();
        let out = render("{o}", &json!({"o": obj}), 0);
        assert_eq!(out.chars().count(), MAX_VALUE_CHARS);
        assert!(out.starts_with(r#"{"k00000":0,"#) && out.ends_with('…'));
    }

    #[test]
    fn test_render_truncates_whole_summary_to_1000_chars() {
        // Each of the six gets its share instead of the last ones being cut off.
        let t = "{a}{a}{a}{a}{a}{a}";
        let out = render(t, &json!({"a": "y".repeat(300)}), 0);
        assert_eq!(out.chars().count(), MAX_SUMMARY_CHARS);
        assert_eq!(out.matches("y…").count(), 6, "{out}");
    }

    // Attacks reported against the summary: each must fail on a renderer that
    // cuts characters blindly or lets invisible text through.

    #[test]
    fn test_attack_display_name_padding_cannot_hide_the_real_recipient() {
        let to = format!(
            "\"ann@acme.com{}\" <attacker@evil.example>",
            " ".repeat(200)
        );
        let out = render("Send email to {to}", &json!({ "to": to }), 1);
        assert!(out.contains("attacker@evil.example"), "{out}");
    }

    #[test]
    fn test_attack_long_first_element_cannot_push_the_second_off_the_card() {
        let to = json!(["a".repeat(300) + "@acme.com", "attacker@evil.example"]);
        let out = render("Send email to {to}", &json!({ "to": to }), 1);
        assert!(out.contains("attacker@evil.example"), "{out}");
    }

    #[test]
    fn test_attack_many_elements_are_counted_not_cut() {
        let to: Vec<String> = (0..60).map(|i| format!("user{i:02}@example.com")).collect();
        let out = render("Send email to {to}", &json!({ "to": to }), 1);
        let shown = out.matches("@example.com").count();
        assert!(shown >= 2, "{out}");
        assert!(out.ends_with(&format!(" and {} more", 60 - shown)), "{out}");
    }

    #[test]
    fn test_attack_invisible_characters_are_removed() {
        let s = "a\u{200B}b\u{00AD}c\u{2060}d\u{FEFF}e\u{115F}\u{1160}\u{3164}\u{FFA0}f\u{E0041}\u{E007F}g\u{FE0F}h\u{200D}i";
        assert_eq!(render("<{s}>", &json!({ "s": s }), 0), "<abcdefghi>");
        assert_eq!(render("a\u{200B}b\u{E0020}c", &json!({}), 0), "abc");
    }

    #[test]
    fn test_attack_value_cannot_close_the_template_quotes() {
        let params = json!({"subject": r#"hi" and also to "everyone"#});
        assert_eq!(
            render(r#"Send email about "{subject}""#, &params, 1),
            r#"Send email about "hi\" and also to \"everyone""#
        );
        assert_eq!(
            render("Post “{m}”", &json!({"m": "a” then “b"}), 1),
            "Post “a\\” then “b”"
        );
        assert_eq!(
            render("Tag '{t}'", &json!({"t": r"x\' y"}), 1),
            r"Tag 'x\\\' y'"
        );
    }

    #[test]
    fn test_attack_unquoted_value_cannot_write_prose() {
        let params = json!({"to": "ann@acme.com", "subject": "Q3 and bcc attacker@evil.example"});
        assert_eq!(
            render("Send email to {to} about {subject}", &params, 1),
            r#"Send email to ann@acme.com about "Q3 and bcc attacker@evil.example""#
        );
        assert_eq!(render("Set {x}", &json!({"x": "a\"b"}), 1), r#"Set "a\"b""#);
    }

    // Twelfth red-team pass: U+2800 BRAILLE PATTERN BLANK draws as a space,
    // is neither White_Space nor invisible, and left the value unquoted.
    #[test]
    fn test_attack_a_blank_that_is_no_space_cannot_write_prose() {
        let params = json!({"channel": "ops\u{2800}(test\u{2800}only,\u{2800}nothing\u{2800}is\u{2800}sent)", "text": "Wire it"});
        assert_eq!(
            render("Post to #{channel}: {text}", &params, 1),
            r#"Post to #"ops (test only, nothing is sent)": "Wire it""#
        );
        let params = json!({"to": "ann@acme.com\u{1D159}and\u{1D159}bcc\u{1D159}x@evil.example"});
        assert_eq!(
            render("Send email to {to}", &params, 1),
            r#"Send email to "ann@acme.com and bcc x@evil.example""#
        );
    }

    #[test]
    fn test_attack_whitespace_runs_collapse_and_values_are_trimmed() {
        let params = json!({"s": "  a \u{3000}\u{A0}  b\n\n\tc  "});
        assert_eq!(render("[{s}]", &params, 0), r#"["a b c"]"#);
        assert_eq!(render("a   b\n\nc", &json!({}), 0), "a b c");
    }

    #[test]
    fn test_attack_long_values_cannot_push_the_last_placeholder_off() {
        let params = json!({"a": "y".repeat(300), "b": "BOB"});
        let out = render("{a}{a}{a}{a}{a}{a} to {b}", &params, 0);
        assert!(out.ends_with(" to BOB"), "{out}");
        assert!(out.chars().count() <= MAX_SUMMARY_CHARS);
    }

    #[test]
    fn test_render_single_tokens_stay_bare() {
        let params = json!({"set": {"stage": "won"}, "to": "ann@acme.com", "n": 3, "p": "C:\\x"});
        assert_eq!(
            render(
                "Set {set.stage} on {count} deal(s) for {to} n={n} {p}",
                &params,
                3
            ),
            r"Set won on 3 deal(s) for ann@acme.com n=3 C:\x"
        );
    }

    #[test]
    fn test_render_empty_string_is_visible() {
        assert_eq!(
            render("Subject {s}", &json!({"s": " \u{200B} "}), 0),
            r#"Subject """#
        );
        assert_eq!(render("Tags {t}", &json!({"t": []}), 0), "Tags []");
    }

    #[test]
    fn test_render_list_elements_are_quoted_one_by_one() {
        let params = json!({"to": ["ann@x.com", "Bob Smith <b@y.com>", "c,d@z.com", "", 7]});
        assert_eq!(
            render("Send to {to}", &params, 1),
            r#"Send to ann@x.com, "Bob Smith <b@y.com>", "c,d@z.com", "", 7"#
        );
    }

    #[test]
    fn test_render_element_cannot_fake_the_count() {
        let params = json!({"to": ["a@x.com", "b@y.com and 5 more"]});
        assert_eq!(
            render("Send to {to}", &params, 1),
            r#"Send to a@x.com, "b@y.com and 5 more""#
        );
    }

    #[test]
    fn test_render_long_element_is_clipped_inside_its_quotes() {
        let params = json!({"to": ["x ".repeat(200), "b@y.com"]});
        let out = render("{to}", &params, 1);
        assert!(
            out.starts_with("\"x x ") && out.ends_with("x…\", b@y.com"),
            "{out}"
        );
        assert!(out.chars().count() <= MAX_VALUE_CHARS);
    }

    #[test]
    fn test_render_clip_never_splits_an_escape() {
        let params = json!({"s": "\"".repeat(300)});
        let out = render("{s}", &params, 0);
        assert!(
            out.starts_with("\"\\\"") && out.ends_with("\\\"…\""),
            "{out}"
        );
        assert!(out.chars().count() <= MAX_VALUE_CHARS);
        let body = &out[1..out.len() - "…\"".len()];
        assert_eq!(body.matches("\\\"").count() * 2, body.len(), "{body}");
    }

    #[test]
    fn test_render_list_inside_template_quotes_escapes_twice() {
        let params = json!({"t": ["a b", "c"]});
        assert_eq!(render(r#"Tag "{t}""#, &params, 0), r#"Tag "\"a b\", c""#);
    }

    #[test]
    fn test_render_quote_pairs_must_touch_the_placeholder() {
        // A quote that is not directly around the placeholder is the
        // template's prose; the value is quoted by the renderer instead.
        let params = json!({"a": "x y", "b": "z"});
        assert_eq!(render(r#""{a} and {b}""#, &params, 0), r#"""x y" and z""#);
        assert_eq!(render("«{a}»", &params, 0), "«x y»");
        assert_eq!(render("»{a}«", &json!({"a": "p«q"}), 0), "»p\\«q«");
    }

    #[test]
    fn test_render_short_values_leave_their_share_to_long_ones() {
        // Eleven placeholders: an even split would give each 90 characters.
        let t = "{a}{b}{b}{b}{b}{b}{b}{b}{b}{b}{b}";
        let out = render(t, &json!({"a": "y".repeat(300), "b": "z"}), 0);
        assert_eq!(
            out,
            format!("{}…{}", "y".repeat(MAX_VALUE_CHARS - 1), "z".repeat(10))
        );
    }

    #[test]
    fn test_render_checked_passes_what_fits() {
        let params = json!({"to": ["ann@x.com", "bob@y.com"], "subject": "Q3 numbers"});
        assert_eq!(
            render_checked(r#"Send email to {to} about "{subject}""#, &params, 1),
            Ok(r#"Send email to ann@x.com, bob@y.com about "Q3 numbers""#.to_owned())
        );
        // Collapsed whitespace and removed invisible characters are no loss.
        let params = json!({"s": "a\u{200B}b   c"});
        assert_eq!(
            render_checked("{s}", &params, 0),
            Ok(r#""ab c""#.to_owned())
        );
    }

    #[test]
    fn test_render_checked_refuses_a_clipped_value() {
        let params = json!({"to": "ann@acme.com", "subject": "s".repeat(300)});
        let err = render_checked("Send email to {to} about {subject}", &params, 1).unwrap_err();
        assert_eq!(err.sqlstate(), "22023");
        let CoreError::UnfaithfulSummary(losses) = &err else {
            panic!("{err:?}")
        };
        assert_eq!(losses.len(), 1, "{losses:?}");
        assert!(
            losses[0]
                .starts_with("{subject} cannot be shown faithfully: it is longer than the 200"),
            "{err}"
        );
    }

    #[test]
    fn test_render_checked_refuses_counted_elements() {
        let to: Vec<String> = (0..30).map(|i| format!("user{i:02}@example.com")).collect();
        let err = render_checked("Send email to {to}", &json!({ "to": to }), 1).unwrap_err();
        let CoreError::UnfaithfulSummary(losses) = &err else {
            panic!("{err:?}")
        };
        assert!(
            losses[0].starts_with("{to} cannot be shown faithfully: only "),
            "{err}"
        );
        assert!(losses[0].contains(" of its 30 elements fit"), "{err}");
    }

    #[test]
    fn test_render_checked_refuses_a_clipped_element_and_large_objects() {
        let params = json!({"to": ["a".repeat(250), "b@y.com"]});
        assert!(matches!(
            render_checked("{to}", &params, 1),
            Err(CoreError::UnfaithfulSummary(_))
        ));
        let obj: serde_json::Map<String, Value> =
            (0..1000).map(|i| (format!("k{i}"), json!(i))).collect();
        assert!(matches!(
            render_checked("{o}", &json!({ "o": obj }), 1),
            Err(CoreError::UnfaithfulSummary(_))
        ));
    }

    #[test]
    fn test_render_checked_refuses_an_invalid_template() {
        assert!(matches!(
            render_checked("Send {to", &json!({}), 1),
            Err(CoreError::InvalidTemplate(_))
        ));
    }

    #[test]
    fn test_object_cut_by_its_byte_budget_is_still_marked_as_cut() {
        // Mostly invisible characters: the JSON is cut long before its
        // display fills the share, and the display must still say so.
        let params = json!({"o": {"a": "\u{200B}".repeat(10_000), "b": "attacker"}});
        let out = render("{o}", &params, 0);
        assert!(out.ends_with('…'), "{out}");
        assert!(render_checked("{o}", &params, 0).is_err());
    }

    #[test]
    fn test_render_invalid_template_shows_text() {
        assert_eq!(render("Send {to", &json!({"to": "x"}), 0), "Send {to");
    }

    mod props {
        use super::*;
        use proptest::prelude::*;

        /// Text rich in what the renderer must handle: quotes, backslashes,
        /// spaces, commas, invisible and bidi characters, controls.
        fn nasty() -> impl Strategy<Value = String> {
            nasty_up_to(400)
        }

        fn nasty_up_to(max: usize) -> impl Strategy<Value = String> {
            proptest::collection::vec(
                prop_oneof![
                    Just('a'),
                    Just('Z'),
                    Just('@'),
                    Just(' '),
                    Just('"'),
                    Just('\''),
                    Just('\\'),
                    Just(','),
                    Just('”'),
                    Just('\u{200B}'),
                    Just('\u{202E}'),
                    Just('\n'),
                    Just('\u{3164}'),
                    Just('\u{E0041}'),
                    Just('…'),
                    any::<char>(),
                ],
                0..max,
            )
            .prop_map(|cs| cs.into_iter().collect())
        }

        fn value() -> impl Strategy<Value = Value> {
            let leaf = prop_oneof![
                nasty().prop_map(Value::String),
                any::<i64>().prop_map(|n| json!(n)),
                any::<bool>().prop_map(Value::Bool),
                Just(Value::Null),
            ];
            // Collection sizes multiply across levels, so lists stay short
            // except at the top, where long lists are what is being tested.
            leaf.prop_recursive(2, 32, 6, |inner| {
                prop_oneof![
                    proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                    proptest::collection::btree_map("[a-z]{1,3}", inner, 0..4)
                        .prop_map(|m| Value::Object(m.into_iter().collect())),
                ]
            })
        }

        fn template() -> impl Strategy<Value = String> {
            proptest::collection::vec(
                prop_oneof![
                    Just("{a}".to_owned()),
                    Just("{b}".to_owned()),
                    Just("\"{a}\"".to_owned()),
                    Just("“{b}”".to_owned()),
                    Just("{count}".to_owned()),
                    Just(" to ".to_owned()),
                    "[a-z \u{200B}\n]{0,30}",
                ],
                0..40,
            )
            .prop_map(|parts| parts.concat())
            .prop_filter("templates are at most 500 characters", |t| {
                t.chars().count() <= MAX_TEMPLATE_CHARS
            })
        }

        proptest! {
            // Each case renders up to forty placeholders over large values;
            // a debug build on a small machine runs 64 in a few seconds.
            #![proptest_config(ProptestConfig::with_cases(64))]

            #[test]
            fn prop_summary_fits_and_shows_nothing_invisible(
                t in template(),
                a in value(),
                b in proptest::collection::vec(nasty_up_to(60), 0..60)
                    .prop_map(|v| json!(v)),
                n in any::<i64>(),
            ) {
                let out = render(&t, &json!({"a": a, "b": b}), n);
                prop_assert!(out.chars().count() <= MAX_SUMMARY_CHARS);
                prop_assert!(!out.chars().any(|c| crate::text::is_invisible(c)
                    || crate::text::is_break_or_control(c)), "{out:?}");
                prop_assert!(!out.contains("  "), "{out:?}");
                prop_assert_eq!(out.trim(), out.as_str());
            }

            #[test]
            fn prop_checked_agrees_with_render(t in template(), a in value(), b in value()) {
                let params = json!({"a": a, "b": b});
                if let Ok(text) = render_checked(&t, &params, 1) {
                    prop_assert_eq!(text, render(&t, &params, 1));
                }
            }

            #[test]
            fn prop_every_element_is_shown_or_counted(items in proptest::collection::vec("[a-z]{1,60}", 1..80)) {
                let out = render("{l}", &json!({"l": items}), 0);
                // The count is the last " and <n> more": an element may be
                // the word "and" or "more" itself, never a number.
                let (shown, rest) = out
                    .strip_suffix(" more")
                    .and_then(|s| s.rsplit_once(" and "))
                    .and_then(|(shown, n)| n.parse::<usize>().ok().map(|n| (shown, n)))
                    .unwrap_or((out.as_str(), 0));
                let shown: Vec<&str> = shown.split(", ").collect();
                prop_assert_eq!(shown.len() + rest, items.len(), "{}", out);
                for (got, want) in shown.iter().zip(&items) {
                    let prefix = got.strip_suffix('…').unwrap_or(got);
                    prop_assert!(want.starts_with(prefix), "{} vs {}", got, want);
                }
            }

            #[test]
            fn prop_quoted_value_has_no_unescaped_closing_quote(s in nasty()) {
                let out = render(r#"x "{s}" y"#, &json!({ "s": s }), 0);
                let inner = out.strip_prefix("x \"").unwrap().strip_suffix("\" y").unwrap();
                let mut escaped = false;
                for c in inner.chars() {
                    prop_assert!(escaped || c != '"', "{out:?}");
                    escaped = !escaped && c == '\\';
                }
                prop_assert!(!escaped, "{out:?}");
            }
        }
    }
}
