//! Text for the SQL boundary: strings that look like something else.
//!
//! Everything here is free of NUL, since PostgreSQL refuses NUL in text
//! before keyturn ever sees it; the fuzzer wants keyturn's own answers.
//! Hostile text is JSON-safe (serde_json escapes what it must), so it can go
//! anywhere a string goes: params, forms, specs, scopes, claims, settings.

use proptest::prelude::*;

/// Characters that render as nothing or as something else, one per class
/// keyturn_core::text knows: format characters, default-ignorables, bidi
/// controls, C0/C1 controls (no NUL) and the line separators.
pub const HIDDEN: &[char] = &[
    '\u{00AD}',
    '\u{034F}',
    '\u{061C}',
    '\u{115F}',
    '\u{180E}',
    '\u{200B}',
    '\u{200C}',
    '\u{200D}',
    '\u{200E}',
    '\u{200F}',
    '\u{202A}',
    '\u{202E}',
    '\u{2060}',
    '\u{2066}',
    '\u{2069}',
    '\u{3164}',
    '\u{FE0F}',
    '\u{FEFF}',
    '\u{E0041}',
    '\u{1}',
    '\t',
    '\n',
    '\r',
    '\u{1B}',
    '\u{7F}',
    '\u{85}',
    '\u{2028}',
    '\u{2029}',
];

/// Strings that mean something to SQL, to printf-style formatting, to
/// keyturn's own templates and paths, or to a JSON reader.
pub const SQLISH: &[&str] = &[
    "'; DROP TABLE crm.deal; --",
    "' OR '1'='1",
    "1 OR 1=1",
    "1; SELECT pg_sleep(5)",
    "$1",
    "$$ || current_user || $$",
    "E'\\\\x41'",
    "\\",
    "\"",
    "\"\"",
    "%s%s%n",
    "%I",
    "*/ SELECT 1 /*",
    "NULL",
    "null",
    "DEFAULT",
    "current_user",
    "{set.stage}",
    "{{",
    "}}",
    "a.b.c",
    "..",
    "$serde_json::private::Number",
    "\\u0000",
    "\u{FFFD}",
    "x'::regclass::text||'",
    "ctid",
    "xmin",
    "pg_catalog.pg_authid",
];

/// One hidden character.
pub fn hidden_char() -> BoxedStrategy<char> {
    prop::sample::select(HIDDEN).boxed()
}

/// A name that prints as itself: lowercase ASCII mostly, sometimes visible
/// non-ASCII letters, emoji or CJK. Never empty, never padded.
pub fn clean_name() -> BoxedStrategy<String> {
    prop_oneof![
        4 => "[a-z][a-z0-9_]{0,11}",
        1 => prop::sample::select(vec!["é", "ø", "名前", "\u{1F602}", "İstanbul", "ß", "Ω", "a-b", "a.b", "a@b"])
            .prop_map(str::to_owned),
    ]
    .boxed()
}

/// Arbitrary Unicode without NUL: any scalar value elsewhere, astral and
/// private-use characters included.
pub fn odd_unicode() -> BoxedStrategy<String> {
    prop_oneof![
        2 => any::<String>().prop_map(|s| s.replace('\0', "\u{FFFD}")),
        1 => "[\u{300}-\u{36F}\u{591}-\u{5C7}\u{E000}\u{FFFF}\u{10FFFF}\u{1F600}-\u{1F64F}]{1,8}",
        1 => "[\u{1}-\u{1F}\u{7F}-\u{9F}]{1,4}",
    ]
    .boxed()
}

/// A clean name with a hidden character put somewhere in it (start, middle
/// or end), so it prints as the clean name.
pub fn with_hidden() -> BoxedStrategy<String> {
    (clean_name(), hidden_char(), any::<prop::sample::Index>())
        .prop_map(|(name, c, at)| {
            let chars: Vec<char> = name.chars().collect();
            let at = at.index(chars.len() + 1);
            chars[..at]
                .iter()
                .chain([c].iter())
                .chain(chars[at..].iter())
                .collect()
        })
        .boxed()
}

/// A clean name with spaces around it.
pub fn padded() -> BoxedStrategy<String> {
    (
        clean_name(),
        prop::sample::select(vec![" ", "  ", "\u{A0}", "\u{3000}"]),
        0u8..3,
    )
        .prop_map(|(name, pad, side)| match side {
            0 => format!("{pad}{name}"),
            1 => format!("{name}{pad}"),
            _ => format!("{pad}{name}{pad}"),
        })
        .boxed()
}

/// A long string: from just under to well over the limits keyturn enforces
/// (200-character origin ids, 255-byte file names, 500-character templates).
pub fn long_text() -> BoxedStrategy<String> {
    (
        prop::sample::select(vec!["a", "é", "\u{1F602}", "{x}", "'"]),
        150usize..2_100,
    )
        .prop_map(|(unit, n)| unit.repeat(n))
        .boxed()
}

/// Any hostile string: SQL-ish, odd Unicode, hidden characters, padding,
/// long, empty, or clean (so the valid path stays in the mix).
pub fn hostile_text() -> BoxedStrategy<String> {
    prop_oneof![
        2 => prop::sample::select(SQLISH).prop_map(str::to_owned),
        2 => odd_unicode(),
        2 => with_hidden(),
        1 => padded(),
        1 => long_text(),
        1 => Just(String::new()),
        2 => clean_name(),
    ]
    .boxed()
}
