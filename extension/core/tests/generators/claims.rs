//! Identity as a pooled application asserts it: `request.jwt.claims` texts and
//! `keyturn.*` setting values, each with what keyturn must read from it.
//!
//! The expectation is a model of docs/sql-api.md, "Identity": a claim is the
//! identity when it is a non-empty string that prints as itself; a missing
//! key, a non-string, an empty string, a hidden character or surrounding
//! space is missing identity. Where the documentation leaves a choice open
//! (a duplicated key, JSON a strict reader refuses), the model only says
//! what the identity may be: missing, or one of the values the text holds.

use proptest::prelude::*;
use serde_json::{json, Value};

use super::text::{clean_name, hidden_char, long_text, odd_unicode, padded, with_hidden};

/// What keyturn must read for one part of the identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expect {
    /// Exactly this (None: missing identity).
    Is(Option<String>),
    /// Missing, or one of these.
    NullOr(Vec<String>),
}

impl Expect {
    pub fn admits(&self, got: Option<&str>) -> bool {
        match (self, got) {
            (Expect::Is(want), got) => want.as_deref() == got,
            (Expect::NullOr(_), None) => true,
            (Expect::NullOr(values), Some(g)) => values.iter().any(|v| v == g),
        }
    }

    fn loosen(self) -> Expect {
        match self {
            Expect::Is(None) => Expect::NullOr(Vec::new()),
            Expect::Is(Some(v)) => Expect::NullOr(vec![v]),
            other => other,
        }
    }
}

/// The claim keys keyturn reads by default, in identity order.
pub const CLAIM_KEYS: [&str; 3] = ["tenant_id", "sub", "session_id"];

/// A claims text and what each of tenant, principal and session must read as.
#[derive(Debug, Clone)]
pub struct Claims {
    pub text: String,
    pub expect: [Expect; 3],
}

/// One claim's value as JSON text, and what it must read as.
fn claim_value() -> BoxedStrategy<(Option<String>, Expect)> {
    let string = |s: String, e: Expect| (Some(Value::from(s).to_string()), e);
    prop_oneof![
        6 => clean_name().prop_map(move |s| string(s.clone(), Expect::Is(Some(s)))),
        1 => clean_name().prop_map(|s| (Some(escaped(&s)), Expect::Is(Some(s)))),
        2 => with_hidden().prop_map(move |s| string(s, Expect::Is(None))),
        1 => hidden_char().prop_map(|c| (Some(escaped(&c.to_string())), Expect::Is(None))),
        1 => padded().prop_map(move |s| string(s, Expect::Is(None))),
        1 => Just(string(String::new(), Expect::Is(None))),
        1 => Just((None, Expect::Is(None))),
        1 => prop::sample::select(vec![json!(42), json!(1e300), json!(true), Value::Null, json!(["alice"]), json!({"sub": "alice"})])
            .prop_map(|v| (Some(v.to_string()), Expect::Is(None))),
        1 => odd_unicode().prop_map(move |s| string(s.clone(), Expect::NullOr(vec![s]))),
        1 => long_text().prop_map(move |s| string(s.clone(), Expect::Is(Some(s)))),
    ]
    .boxed()
}

/// `s` written with a JSON `\u` escape for every UTF-16 unit.
fn escaped(s: &str) -> String {
    let units: String = s.encode_utf16().map(|u| format!("\\u{u:04x}")).collect();
    format!("\"{units}\"")
}

/// Claims that are not part of the identity, as a PostgREST JWT carries them.
fn other_claims() -> BoxedStrategy<Vec<(String, String)>> {
    // Each at most once: a key written twice is the Duplicate damage's.
    prop::sample::subsequence(
        vec![
            ("role", "\"authenticated\""),
            ("exp", "1999999999"),
            ("aud", "[\"a\", \"b\"]"),
            (
                "app_metadata",
                "{\"tenant_id\": \"not-this-one\", \"x\": {\"y\": [1, 2]}}",
            ),
            ("iat", "1.5e9"),
            ("", "\"empty key\""),
            ("sub ", "\"padded key\""),
        ],
        0..4,
    )
    .prop_map(|v| {
        v.into_iter()
            .map(|(k, x)| (k.to_owned(), x.to_owned()))
            .collect()
    })
    .boxed()
}

/// Whole-text damage applied after the object is written.
#[derive(Debug, Clone, Copy)]
enum Damage {
    None,
    /// A key of the identity written twice, the second time with another value.
    Duplicate,
    /// The object inside an array: not an object.
    Wrapped,
    /// Cut short: not JSON.
    Truncated,
    /// A byte order mark in front.
    Bom,
    /// An extra claim nested past any reader's limit.
    Deep,
    /// An extra claim with a lone surrogate escape.
    LoneSurrogate,
    /// Whitespace around the object (still JSON).
    Spaced,
}

/// A claims text with its expectation: mostly an object with the three
/// identity claims (each clean or hostile) among others, in any order,
/// sometimes damaged as a whole.
pub fn claims() -> BoxedStrategy<Claims> {
    let damage = prop_oneof![
        8 => Just(Damage::None),
        1 => Just(Damage::Duplicate),
        1 => Just(Damage::Wrapped),
        1 => Just(Damage::Truncated),
        1 => Just(Damage::Bom),
        1 => Just(Damage::Deep),
        1 => Just(Damage::LoneSurrogate),
        1 => Just(Damage::Spaced),
    ];
    (
        [claim_value(), claim_value(), claim_value()],
        other_claims(),
        any::<prop::sample::Index>(),
        damage,
        clean_name(),
        0usize..3,
    )
        .prop_map(|(parts, others, order, damage, dup_value, dup_part)| {
            let mut entries: Vec<(String, String)> = others;
            let mut expect: Vec<Expect> = Vec::new();
            for (key, (value, e)) in CLAIM_KEYS.iter().zip(parts) {
                if let Some(v) = value {
                    entries.push(((*key).to_owned(), v));
                }
                expect.push(e);
            }
            let n = entries.len();
            if n > 1 {
                entries.rotate_left(order.index(n));
            }
            if let Damage::Duplicate = damage {
                entries.push((
                    CLAIM_KEYS[dup_part].to_owned(),
                    Value::from(dup_value.clone()).to_string(),
                ));
                // A strict reader refuses the whole text; one that keeps the
                // last occurrence reads the second value: either may be right.
                for e in expect.iter_mut() {
                    *e = std::mem::replace(e, Expect::Is(None)).loosen();
                }
                if let Expect::NullOr(v) = &mut expect[dup_part] {
                    v.push(dup_value);
                }
            }
            let body: Vec<String> = entries
                .iter()
                .map(|(k, v)| format!("{}: {v}", Value::from(k.as_str())))
                .collect();
            let object = format!("{{{}}}", body.join(", "));
            let (text, fail_closed) = match damage {
                Damage::None | Damage::Duplicate => (object, false),
                Damage::Spaced => (format!(" \n{object}\t "), false),
                Damage::Wrapped => (format!("[{object}]"), true),
                Damage::Truncated => (object[..object.len() - 1].to_owned(), true),
                Damage::Bom => (format!("\u{FEFF}{object}"), true),
                Damage::Deep => (
                    splice(&object, &format!("{}1{}", "[".repeat(200), "]".repeat(200))),
                    false,
                ),
                Damage::LoneSurrogate => (splice(&object, "\"\\ud800\""), false),
            };
            let expect: Vec<Expect> = if fail_closed {
                vec![Expect::Is(None), Expect::Is(None), Expect::Is(None)]
            } else if matches!(damage, Damage::Deep | Damage::LoneSurrogate) {
                // JSON a strict reader may refuse: missing, or as written.
                expect.into_iter().map(Expect::loosen).collect()
            } else {
                expect
            };
            let [t, p, s] = <[Expect; 3]>::try_from(expect).expect("three parts");
            Claims {
                text,
                expect: [t, p, s],
            }
        })
        .boxed()
}

/// `object` with one more claim, `"extra": <value>`, in front.
fn splice(object: &str, value: &str) -> String {
    let rest = &object[1..];
    if rest.trim_start().starts_with('}') {
        format!("{{\"extra\": {value}{rest}")
    } else {
        format!("{{\"extra\": {value}, {rest}")
    }
}

/// A value for one of the `keyturn.*` settings, with what it must read as.
pub fn setting_value() -> BoxedStrategy<(String, Expect)> {
    prop_oneof![
        6 => clean_name().prop_map(|s| (s.clone(), Expect::Is(Some(s)))),
        2 => with_hidden().prop_map(|s| (s, Expect::Is(None))),
        1 => padded().prop_map(|s| (s, Expect::Is(None))),
        1 => Just((String::new(), Expect::Is(None))),
        1 => odd_unicode().prop_map(|s| (s.clone(), Expect::NullOr(vec![s]))),
        1 => long_text().prop_map(|s| (s.clone(), Expect::Is(Some(s)))),
    ]
    .boxed()
}
