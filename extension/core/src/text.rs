//! Which characters can fool a reader, decided in one place.
//!
//! Three readers see text that an agent or a connected app wrote: the person
//! approving a summary ([`crate::template`]), the credential detector
//! ([`crate::credentials`]) and the model reading fenced data ([`crate::fence`]).
//! Each must be blind to the same tricks, so the character classes live here and
//! every module asks this one:
//!
//! * **invisible** ([`is_invisible`]): every format character (general category
//!   Cf: zero-width space and joiners, soft hyphen, word joiner, BOM, bidi
//!   controls, Unicode TAG characters, ...) and every Default_Ignorable_Code_Point
//!   (which adds the Hangul fillers, variation selectors, the combining grapheme
//!   joiner and reserved ranges that future versions may fill with more of the
//!   same). A renderer may draw them as nothing, so they can hide text, glue two
//!   words into what looks like one, or split a secret so it matches no pattern;
//! * **bidi controls** ([`is_bidi_control`]), a subset of the invisible ones that
//!   also reorders what follows ("Trojan Source");
//! * **breaks and controls** ([`is_break_or_control`]): C0/C1 controls (line
//!   feeds, tabs, terminal escapes) and the line/paragraph separators, which fake
//!   line breaks;
//! * **space look-alikes** ([`is_space_lookalike`]): what draws as an empty
//!   space and is not U+0020, the odd White_Space characters and blanks such
//!   as U+2800 BRAILLE PATTERN BLANK, which read as a word break;
//! * **quotes** ([`is_quote`]): characters a reader takes for the start or end of
//!   a quotation.
//!
//! The general category comes from `unicode-properties` (unicode-rs);
//! Default_Ignorable_Code_Point is a short range table, checked against
//! `unicode-security`'s copy of the same Unicode data by a test.

use std::borrow::Cow;

use unicode_normalization::UnicodeNormalization;
use unicode_properties::{GeneralCategory, UnicodeGeneralCategory};

/// True for characters that may render as nothing: general category Cf and
/// Default_Ignorable_Code_Point.
pub fn is_invisible(c: char) -> bool {
    // Every invisible character is outside printable ASCII and Latin-1 except
    // the soft hyphen, so the common case skips the table lookups.
    if c < '\u{AD}' {
        return false;
    }
    c.general_category() == GeneralCategory::Format || is_default_ignorable(c)
}

/// Default_Ignorable_Code_Point (DerivedCoreProperties.txt). The Cf members
/// are listed too, so the table is the property as published and can be
/// compared with other copies of it.
fn is_default_ignorable(c: char) -> bool {
    matches!(
        c,
        '\u{00AD}'
            | '\u{034F}'
            | '\u{061C}'
            | '\u{115F}'..='\u{1160}'
            | '\u{17B4}'..='\u{17B5}'
            | '\u{180B}'..='\u{180F}'
            | '\u{200B}'..='\u{200F}'
            | '\u{202A}'..='\u{202E}'
            | '\u{2060}'..='\u{206F}'
            | '\u{3164}'
            | '\u{FE00}'..='\u{FE0F}'
            | '\u{FEFF}'
            | '\u{FFA0}'
            | '\u{FFF0}'..='\u{FFF8}'
            | '\u{1BCA0}'..='\u{1BCA3}'
            | '\u{1D173}'..='\u{1D17A}'
            | '\u{E0000}'..='\u{E0FFF}'
    )
}

/// Bidi embedding, override, isolate and mark characters (UAX #9).
pub fn is_bidi_control(c: char) -> bool {
    matches!(
        c,
        '\u{061C}' | '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}'
    )
}

/// C0 and C1 controls (including DEL, tab, CR, LF, NEL) and the line and
/// paragraph separators U+2028/U+2029.
pub fn is_break_or_control(c: char) -> bool {
    c.is_control() || matches!(c, '\u{2028}' | '\u{2029}')
}

/// Characters that draw as an empty space and are not the ASCII space: the
/// other Unicode White_Space characters that are not breaks or controls
/// (no-break, en, em, thin, ideographic spaces, ...), and characters that
/// draw as blank without being White_Space or invisible, so that no other
/// class catches them: U+2800 BRAILLE PATTERN BLANK and U+1D159 MUSICAL
/// SYMBOL NULL NOTEHEAD. Shown, they read as a word break; a summary that
/// kept them as they are would quote no value holding them, and the agent's
/// words would read as the template's (twelfth red-team pass).
pub fn is_space_lookalike(c: char) -> bool {
    (!c.is_ascii() && c.is_whitespace() && !is_break_or_control(c))
        || matches!(c, '\u{2800}' | '\u{1D159}')
}

/// Whether an identity value (a tenant, a principal, a session) would
/// print as another: space at either end, a control, break, bidi or
/// invisible character, or a form that Unicode normalization (NFKC) changes
/// (a decomposed accent, a fullwidth or compatibility letter), which looks
/// like the normalized name and is not it.
pub fn prints_as_another(value: &str) -> bool {
    value.trim() != value
        || value.chars().any(|c| {
            is_break_or_control(c) || is_bidi_control(c) || is_invisible(c) || is_space_lookalike(c)
        })
        || value.nfkc().ne(value.chars())
}

/// Whether a JSON document holds the NUL character (U+0000) in a string or
/// a key. PostgreSQL's jsonb cannot store it, and its error quotes the
/// document up to that point into the server log, values included (a
/// digest-retained tool's among them): keyturnd refuses such a document
/// before it reaches the database.
pub fn holds_nul(value: &serde_json::Value) -> bool {
    match value {
        serde_json::Value::String(s) => s.contains('\0'),
        serde_json::Value::Array(items) => items.iter().any(holds_nul),
        serde_json::Value::Object(members) => members_hold_nul(members),
        _ => false,
    }
}

/// [`holds_nul`] of an object's members (an MCP call's `_meta`).
pub fn members_hold_nul(members: &serde_json::Map<String, serde_json::Value>) -> bool {
    members
        .iter()
        .any(|(k, v)| k.contains('\0') || holds_nul(v))
}

/// Why `name` cannot be a staged file's name, or `None`: a name the person
/// reads on the card and a mail client shows must be the bytes it is, so
/// no path separator, control, bidi control or invisible character (which
/// would let `invoice\u{202E}fdp.exe` read as `invoiceexe.pdf`), nothing
/// empty, `.` or `..`, and at most 255 bytes.
pub fn filename_problem(name: &str) -> Option<String> {
    if name.is_empty() || name.len() > 255 || name == "." || name == ".." {
        return Some("must be 1 to 255 bytes, and not . or ..".to_owned());
    }
    if let Some(c) = name.chars().find(|&c| c == '/' || c == '\\') {
        return Some(format!("holds the path separator {c:?}"));
    }
    // A mail client decodes an RFC 2047 encoded word (`=?utf-8?b?…?=`) in a
    // filename and shows its text: the card's name would not be the one the
    // recipient reads (seventh red-team pass, docs/security.md row 91).
    if name.contains("=?") {
        return Some(
            "holds \"=?\", which mail clients read as an encoded word (RFC 2047) and show as other text"
                .to_owned(),
        );
    }
    let bad = name
        .chars()
        .find(|&c| is_break_or_control(c) || is_invisible(c));
    bad.map(|c| {
        let what = if is_bidi_control(c) {
            "a bidi control"
        } else if is_break_or_control(c) {
            "a control character"
        } else {
            "an invisible character"
        };
        format!(
            "holds {what} (U+{:04X}), which would make it read as another name",
            u32::from(c)
        )
    })
}

/// Characters read as opening or closing a quotation: the Unicode
/// Quotation_Mark property (PropList.txt), plus look-alikes that are not in it
/// but pass for quotes on a small screen (backtick, acute accent, primes,
/// modifier apostrophes, Hebrew geresh/gershayim, ornamental quotes).
pub fn is_quote(c: char) -> bool {
    matches!(
        c,
        // Quotation_Mark
        '"' | '\''
            | '\u{00AB}'
            | '\u{00BB}'
            | '\u{2018}'..='\u{201F}'
            | '\u{2039}'
            | '\u{203A}'
            | '\u{2E42}'
            | '\u{300C}'..='\u{300F}'
            | '\u{301D}'..='\u{301F}'
            | '\u{FE41}'..='\u{FE44}'
            | '\u{FF02}'
            | '\u{FF07}'
            | '\u{FF62}'
            | '\u{FF63}'
            // look-alikes
            | '`'
            | '\u{00B4}'
            | '\u{02B9}'..='\u{02BC}'
            | '\u{02DD}'
            | '\u{02EE}'
            | '\u{05F3}'
            | '\u{05F4}'
            | '\u{2032}'..='\u{2037}'
            | '\u{275B}'..='\u{275E}'
            | '\u{FF40}'
            | '\u{1F676}'..='\u{1F678}'
    )
}

/// `s` as a person may be shown it: breaks, controls and bidi controls become
/// a space, other invisible characters are removed, and every run of
/// whitespace and of what draws as it ([`is_space_lookalike`]) becomes one
/// ASCII space. Leading and trailing space is kept, so
/// pieces of a larger text can be cleaned one at a time; trim values yourself.
///
/// Bidi controls become a space rather than nothing because they sit at the
/// boundary between two runs of text: a space shows the reader that boundary
/// instead of silently joining the runs into one word.
pub fn for_display(s: &str) -> String {
    display_chars(s).collect()
}

/// [`for_display`] as an iterator, so a caller that needs only the first few
/// hundred characters of a long value does not clean all of it.
pub fn display_chars(s: &str) -> impl Iterator<Item = char> + '_ {
    let mut last_space = false;
    s.chars().filter_map(move |c| {
        let c = if is_break_or_control(c)
            || is_bidi_control(c)
            || c.is_whitespace()
            || is_space_lookalike(c)
        {
            ' '
        } else if is_invisible(c) {
            return None;
        } else {
            c
        };
        let space = c == ' ';
        if space && last_space {
            return None;
        }
        last_space = space;
        Some(c)
    })
}

/// `s` cut after `max` characters, with `…` where it was cut: what a message
/// shows of a value it names.
pub fn clip(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        None => s.to_owned(),
        Some((cut, _)) => format!("{}…", &s[..cut]),
    }
}

/// How many characters of a caller's string a message quotes.
pub const QUOTED_CHARS: usize = 64;

/// `s` as a message may quote it: [`for_display`]'s characters, at most
/// [`QUOTED_CHARS`] of them (then `…`), in single quotes doubled inside, as `quote_literal`
/// spells it. PostgreSQL writes every error message to its log, so a refusal
/// that names an agent's string this way carries no terminal escape, no line
/// it forges and no megabyte there (docs/security.md rows 133 and 141).
pub fn quoted(s: &str) -> String {
    let mut out = String::with_capacity(s.len().min(QUOTED_CHARS) + 2);
    out.push('\'');
    for (n, c) in display_chars(s).enumerate() {
        if n == QUOTED_CHARS {
            out.push('…');
            break;
        }
        if c == '\'' {
            out.push('\'');
        }
        out.push(c);
    }
    out.push('\'');
    out
}

/// `s` as the credential detector compares it: NFKC (fullwidth and other
/// compatibility forms become their plain letters, odd spaces become U+0020),
/// then without invisible characters, so a zero-width space cannot split
/// `Bearer` or a key prefix. ASCII input is returned as it is: NFKC leaves it
/// unchanged and it holds no invisible character.
pub fn for_matching(s: &str) -> Cow<'_, str> {
    if s.is_ascii() {
        return Cow::Borrowed(s);
    }
    // Stripping after NFKC also catches what NFKC produces: U+3164 HANGUL
    // FILLER decomposes to U+1160, which is itself ignorable.
    Cow::Owned(s.nfkc().filter(|&c| !is_invisible(c)).collect())
}

/// A name folded so that look-alikes compare equal: [`for_matching`], then
/// lowercase, then the UTS #39 confusable skeleton (Cyrillic `р` and `а` read
/// `p` and `a`, digit `0` reads `O`), then lowercase again because skeletons map
/// onto either case. Meant for comparing names with names, not for display.
pub fn fold_confusables(s: &str) -> String {
    let lower = for_matching(s).to_lowercase();
    unicode_security::skeleton(&lower)
        .flat_map(char::to_lowercase)
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn test_a_quoted_string_is_one_clipped_line() {
        assert_eq!(quoted("it's"), "'it''s'");
        assert_eq!(quoted("ab\u{1b}[2J\ncd\u{202e}e"), "'ab [2J cd e'");
        let x = "x".repeat(QUOTED_CHARS);
        assert_eq!(quoted(&x.repeat(1000)), format!("'{x}…'"));
        assert_eq!(quoted(&x), format!("'{x}'"));
    }

    #[test]
    fn test_holds_nul_finds_it_in_a_nested_string_or_key() {
        use serde_json::json;
        assert!(!super::holds_nul(&json!({"a": ["b", {"c": 1}]})));
        assert!(super::holds_nul(&json!({"a": ["b", {"c": "x\u{0}"}]})));
        assert!(super::holds_nul(&json!({"k\u{0}": 1})));
    }

    use super::*;

    /// Every code point, for checking tables against the Unicode data.
    fn all_chars() -> impl Iterator<Item = char> {
        // A char range skips the surrogates by itself.
        '\0'..=char::MAX
    }

    #[test]
    fn test_default_ignorable_table_matches_unicode_security() {
        // unicode-security's skeleton drops exactly the Default_Ignorable code
        // points after NFD; none of them decomposes, so a lone one yields nothing.
        let mismatches: Vec<String> = all_chars()
            .filter(|&c| {
                let s = c.to_string();
                let dropped = unicode_security::skeleton(&s).next().is_none();
                is_default_ignorable(c) != dropped
            })
            .map(|c| format!("U+{:04X}", u32::from(c)))
            .collect();
        assert!(mismatches.is_empty(), "{mismatches:?}");
    }

    #[test]
    fn test_an_identity_that_prints_as_another() {
        for ok in [
            "alice",
            "ann.o'neil@acme.example",
            "ań",
            "ü",
            "山田",
            "web-1",
        ] {
            assert!(!prints_as_another(ok), "{ok:?}");
        }
        for bad in [
            "an\u{0301}",    // a decomposed accent: looks like "ań"
            "\u{FF41}nn",    // fullwidth a: looks like "ann"
            "\u{FB01}le",    // the fi ligature
            "alice\u{200B}", // invisible
            " alice",
            "al\u{0000}ice",
            "\u{202E}ecila",
        ] {
            assert!(prints_as_another(bad), "{bad:?}");
        }
    }

    #[test]
    fn test_filenames_that_read_as_another_are_refused() {
        for bad in [
            "",
            ".",
            "..",
            "a/b",
            "a\\b",
            "a\u{0}b",
            "a\nb",
            "invoice\u{202E}fdp.exe",
            "in\u{200B}voice.pdf",
            "a\u{2066}b",
            "x\u{FEFF}",
            "\u{E0041}.pdf",
            "a\u{00AD}b",
            "a\u{17B4}b",
            "a\u{E0100}b",
            "=?utf-8?b?cXVvdGXigK5mZHAuZXhl?=.pdf",
            "quote =?x?q?y?= .pdf",
        ] {
            assert!(filename_problem(bad).is_some(), "{bad:?}");
        }
        assert!(filename_problem(&"x".repeat(256)).is_some());
        for good in [
            "report.pdf",
            "Q3 résumé (final).pdf",
            "報告.pdf",
            "a-b_c.tar.gz",
        ] {
            assert_eq!(filename_problem(good), None, "{good:?}");
        }
    }

    #[test]
    fn test_space_lookalikes_are_the_odd_spaces_and_the_blanks() {
        let listed: Vec<char> = all_chars().filter(|&c| is_space_lookalike(c)).collect();
        let mut want = vec!['\u{A0}', '\u{1680}'];
        want.extend('\u{2000}'..='\u{200A}');
        want.extend(['\u{202F}', '\u{205F}', '\u{2800}', '\u{3000}', '\u{1D159}']);
        assert_eq!(listed, want);
        // Each is shown as a plain space, and a value holding one is no identity.
        assert_eq!(
            for_display("ops\u{2800}(test\u{2800}only)"),
            "ops (test only)"
        );
        assert_eq!(for_display("a\u{2800} \u{1D159}b"), "a b");
        assert!(prints_as_another("alice\u{2800}"));
        assert!(prints_as_another("al\u{2800}ice"));
    }

    #[test]
    fn test_invisible_includes_the_reported_characters() {
        for c in [
            '\u{200B}',
            '\u{200C}',
            '\u{200D}',
            '\u{00AD}',
            '\u{2060}',
            '\u{FEFF}',
            '\u{115F}',
            '\u{1160}',
            '\u{3164}',
            '\u{FFA0}',
            '\u{E0000}',
            '\u{E0041}',
            '\u{E007F}',
            '\u{FE0F}',
            '\u{E0100}',
            '\u{180E}',
            '\u{034F}',
            '\u{202E}',
            '\u{2066}',
            '\u{061C}',
            '\u{0600}',
        ] {
            assert!(is_invisible(c), "U+{:04X}", u32::from(c));
        }
    }

    #[test]
    fn test_latin1_fast_path_skips_no_invisible_character() {
        for c in all_chars() {
            let want = c.general_category() == GeneralCategory::Format || is_default_ignorable(c);
            assert_eq!(is_invisible(c), want, "U+{:04X}", u32::from(c));
        }
    }

    #[test]
    fn test_visible_characters_are_not_invisible() {
        for c in [
            'a', 'Z', '0', ' ', '-', 'é', 'ж', '中', '😀', '…', '\u{A0}', '\u{3000}',
        ] {
            assert!(!is_invisible(c), "{c:?}");
        }
    }

    #[test]
    fn test_bidi_controls_are_invisible_too() {
        for c in all_chars().filter(|&c| is_bidi_control(c)) {
            assert!(is_invisible(c), "U+{:04X}", u32::from(c));
        }
    }

    #[test]
    fn test_breaks_and_controls() {
        for c in [
            '\n', '\r', '\t', '\u{0}', '\u{1b}', '\u{7f}', '\u{85}', '\u{9f}', '\u{2028}',
            '\u{2029}',
        ] {
            assert!(is_break_or_control(c), "U+{:04X}", u32::from(c));
        }
        for c in [' ', 'a', '\u{A0}', '\u{200B}'] {
            assert!(!is_break_or_control(c), "U+{:04X}", u32::from(c));
        }
    }

    #[test]
    fn test_quotes() {
        for c in [
            '"', '\'', '`', '“', '”', '‘', '’', '„', '«', '»', '‹', '›', '「', '」', '＂', '″',
        ] {
            assert!(is_quote(c), "{c:?}");
        }
        for c in ['a', '<', '>', '(', '[', '\\', '-'] {
            assert!(!is_quote(c), "{c:?}");
        }
    }

    macro_rules! display {
        ($($name:ident: $input:expr => $want:expr,)*) => {$(
            #[test]
            fn $name() {
                assert_eq!(for_display($input), $want);
            }
        )*};
    }

    display! {
        test_display_keeps_plain_text: "Send email to ann" => "Send email to ann",
        test_display_collapses_whitespace_runs: "a   b\t\t c\u{3000}\u{A0}d" => "a b c d",
        test_display_breaks_become_one_space: "a\r\n\r\nb\u{2028}c\u{85}d" => "a b c d",
        test_display_keeps_edge_spaces_for_the_caller: "  a  " => " a ",
        test_display_bidi_becomes_space: "a\u{202E}b\u{2066}c\u{2069}" => "a b c ",
        test_display_removes_invisible: "a\u{200B}b\u{00AD}c\u{2060}d\u{FEFF}e\u{115F}\u{1160}\u{3164}\u{FFA0}f\u{E0041}\u{E007F}g\u{FE0F}h" => "abcdefgh",
        test_display_invisible_between_spaces_still_collapses: "a \u{200B} b" => "a b",
        test_display_padding_with_fillers_collapses: "ann@acme.com\u{3164}\u{3164} \u{200B}\u{200B} x" => "ann@acme.com x",
    }

    #[test]
    fn test_matching_form() {
        assert_eq!(for_matching("Bear\u{200B}er"), "Bearer");
        assert_eq!(for_matching("ｐａｓｓｗｏｒｄ"), "password");
        assert_eq!(for_matching("Bearer\u{A0}x"), "Bearer x");
        assert_eq!(for_matching("a\u{3164}b"), "ab");
        assert!(matches!(for_matching("plain"), Cow::Borrowed("plain")));
    }

    #[test]
    fn test_fold_confusables() {
        assert_eq!(fold_confusables("password"), fold_confusables("раssword"));
        assert_eq!(
            fold_confusables("PASSWORD"),
            fold_confusables("ｐａｓｓｗｏｒｄ")
        );
        assert_eq!(fold_confusables("token"), fold_confusables("t0ken"));
        assert_ne!(fold_confusables("token"), fold_confusables("taken"));
    }
}
