//! Proptest strategies for scopes and the params they are checked against.
//!
//! Shared so a SQL-level fuzzer can drive the extension with the same inputs the
//! core's property tests use. Two families:
//!
//! * well-formed: [`params`], [`scope`], [`constraint`] — values drawn from small
//!   pools, so random params and random scopes often meet (both verdicts occur);
//! * hostile: [`hostile_key`], [`hostile_number`], [`json_any`], [`deep`],
//!   [`hostile_scope`], [`hostile_scope_text`] — empty and dotted keys, NULs,
//!   astral characters, numbers no double holds, nesting past the limit.
//!
//! Values are built through `canonical::parse_bounded`, as the extension builds
//! them, so number spellings such as `1.0` and `1e0` survive into the `Value`.
//!
//! The submodules cover the rest of what the SQL fuzzer (tests/src/bin/
//! keyturn-fuzz, which includes this module) sends: [`text`] hostile strings,
//! [`forms`] sql tool forms over the fuzzer's table, [`schemas`] params
//! schemas with params for them, [`specs`] templates, names and tool specs,
//! [`claims`] identity claims and settings with what keyturn must read.

// Each test binary that includes this module uses a different subset.
#![allow(dead_code)]

pub mod claims;
pub mod forms;
pub mod schemas;
pub mod specs;
pub mod text;

use keyturn_core::canonical::{parse_bounded, MAX_DEPTH};
use proptest::prelude::*;
use serde_json::{Map, Number, Value};

/// Integers a double holds exactly (|n| ≤ 2^53).
pub const SAFE_INTEGER: i64 = 1 << 53;

/// Parses JSON text the way the extension does; panics on text the generators
/// should never produce.
pub fn parse(text: &str) -> Value {
    match parse_bounded(text) {
        Ok(v) => v,
        Err(e) => panic!("generator produced unparsable JSON {text:?}: {e}"),
    }
}

/// The integer `n` in one of four spellings of the same value: `n`, `n.0`,
/// `ne0`, `n0e-1` (`0e-1` for zero).
pub fn respell(n: i64, form: usize) -> Value {
    let text = match form % 4 {
        0 => n.to_string(),
        1 => format!("{n}.0"),
        2 => format!("{n}e0"),
        // JSON forbids a leading zero before another digit ("00e-1").
        _ if n == 0 => "0e-1".to_owned(),
        _ => format!("{n}0e-1"),
    };
    parse(&text)
}

/// A finite double as a JSON number (shortest round-trip digits, so exact).
pub fn float(f: f64) -> Option<Value> {
    Number::from_f64(f).map(Value::Number)
}

/// Numbers every double-based reader agrees on: small and safe integers, finite
/// doubles, and integers in several spellings.
pub fn exact_number() -> BoxedStrategy<Value> {
    prop_oneof![
        (-3i64..4).prop_map(Value::from),
        (-SAFE_INTEGER..=SAFE_INTEGER).prop_map(Value::from),
        any::<f64>().prop_filter_map("finite", float),
        (-1000i64..1000, 0usize..4).prop_map(|(n, form)| respell(n, form)),
    ]
    .boxed()
}

/// Number literals canonical refuses: inexact (2^53 + 1, 0.1 with too many
/// digits, underflow) and out of range.
pub fn hostile_number() -> BoxedStrategy<Value> {
    prop::sample::select(vec![
        "9007199254740993",
        "1152921504606846976",
        "0.10000000000000001",
        "123456789012345678901234567890.5",
        "1e-400",
        "1e400",
        "-1e400",
        "1e99999999999999999999",
    ])
    .prop_map(parse)
    .boxed()
}

/// Strings: pool members (so eq/in hit), arbitrary Unicode, and look-alikes
/// (combining marks, NUL, a number's text).
pub fn string() -> BoxedStrategy<String> {
    prop_oneof![
        3 => prop::sample::select(vec!["", "a", "b", "won", "lost", "1", "é", "e\u{301}", "a\u{0}b"])
            .prop_map(str::to_owned),
        1 => any::<String>(),
        1 => "[\u{0}-\u{1f}\u{7f}\u{e9}\u{301}\u{1f602}]{0,6}",
    ]
    .boxed()
}

/// Scalars from a small pool that [`constraint`] also draws from.
pub fn pool_scalar() -> BoxedStrategy<Value> {
    prop::sample::select(vec![
        "null", "true", "false", "0", "1", "1.0", "2", "2.5", "-1", "\"a\"", "\"b\"", "\"1\"",
        "\"\"",
    ])
    .prop_map(parse)
    .boxed()
}

/// Any exact scalar.
pub fn scalar() -> BoxedStrategy<Value> {
    prop_oneof![
        2 => pool_scalar(),
        1 => Just(Value::Null),
        1 => any::<bool>().prop_map(Value::Bool),
        1 => exact_number(),
        1 => string().prop_map(Value::String),
    ]
    .boxed()
}

/// A key a scope path can name: non-empty, without `.`, `*` or control
/// characters. Mostly from a small pool so scope paths find params.
pub fn path_key() -> BoxedStrategy<String> {
    prop_oneof![
        3 => prop::sample::select(vec!["a", "b", "id", "set", "stage", "to", "é", "\u{1f602}"])
            .prop_map(str::to_owned),
        1 => "[^.*\\p{Cc}]{1,6}",
    ]
    .boxed()
}

/// A scope path: one to three [`path_key`]s joined by dots.
pub fn path() -> BoxedStrategy<String> {
    prop::collection::vec(path_key(), 1..4)
        .prop_map(|keys| keys.join("."))
        .boxed()
}

/// Keys no path can name, or that mean something elsewhere in a scope.
pub fn hostile_key() -> BoxedStrategy<String> {
    prop_oneof![
        prop::sample::select(vec![
            "",
            ".",
            "..",
            "a.",
            ".a",
            "*",
            "a.*",
            "**",
            "\u{0}",
            "a\u{0}b",
            "\n",
            "params",
            "max_targets",
            "eq",
            "in",
            "min",
            "max",
            "max_length",
            "$serde_json::private::Number",
        ])
        .prop_map(str::to_owned),
        any::<String>(),
        "\\PC{0,4}",
        (200usize..400).prop_map(|n| "k".repeat(n)),
    ]
    .boxed()
}

/// Params: an object whose keys are [`path_key`]s, nesting up to four objects,
/// with scalars and short arrays of scalars at the leaves.
pub fn params() -> BoxedStrategy<Value> {
    let leaf = prop_oneof![
        4 => scalar(),
        1 => prop::collection::vec(scalar(), 0..4).prop_map(Value::Array),
    ];
    let tree = leaf.prop_recursive(3, 32, 5, |inner| {
        prop::collection::btree_map(path_key(), inner, 0..5)
            .prop_map(|m| Value::Object(m.into_iter().collect()))
    });
    prop::collection::btree_map(path_key(), tree, 0..6)
        .prop_map(|m| Value::Object(m.into_iter().collect()))
        .boxed()
}

/// Any JSON, hostile keys and numbers included (no nesting past the limit).
pub fn json_any() -> BoxedStrategy<Value> {
    let leaf = prop_oneof![scalar(), hostile_number()];
    leaf.prop_recursive(4, 32, 5, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            prop::collection::vec((hostile_key(), inner), 0..5)
                .prop_map(|entries| Value::Object(entries.into_iter().collect::<Map<_, _>>())),
        ]
    })
    .boxed()
}

/// `levels` nested containers (alternating array and object) around `1`.
pub fn nest(levels: usize) -> Value {
    let mut v = Value::from(1);
    for i in 0..levels {
        v = if i % 2 == 0 {
            Value::Array(vec![v])
        } else {
            Value::Object(Map::from_iter([("k".to_owned(), v)]))
        };
    }
    v
}

/// Nesting from shallow to well past [`MAX_DEPTH`].
pub fn deep() -> BoxedStrategy<Value> {
    (0..=MAX_DEPTH + 8).prop_map(nest).boxed()
}

/// A well-formed constraint: a non-empty combination of eq, in, min, max and
/// max_length, with min ≤ max.
pub fn constraint() -> BoxedStrategy<Value> {
    let eq = prop_oneof![
        3 => pool_scalar(),
        1 => prop::collection::vec(pool_scalar(), 0..3).prop_map(Value::Array),
    ];
    let bound = prop_oneof![
        (-2i64..4, 0usize..4).prop_map(|(n, form)| respell(n, form)),
        exact_number(),
    ];
    (
        prop::option::weighted(0.5, eq),
        prop::option::weighted(0.4, prop::collection::vec(pool_scalar(), 1..4)),
        prop::option::weighted(0.3, bound.clone()),
        prop::option::weighted(0.3, bound),
        prop::option::weighted(0.3, 0u64..5),
    )
        .prop_filter_map(
            "non-empty, min <= max",
            |(eq, one_of, min, max, max_length)| {
                if let (Some(lo), Some(hi)) = (&min, &max) {
                    if lo.as_f64()? > hi.as_f64()? {
                        return None;
                    }
                }
                let mut c = Map::new();
                let entries = [
                    ("eq", eq),
                    ("in", one_of.map(Value::Array)),
                    ("min", min),
                    ("max", max),
                    ("max_length", max_length.map(Value::from)),
                ];
                for (key, value) in entries {
                    if let Some(value) = value {
                        c.insert(key.to_owned(), value);
                    }
                }
                (!c.is_empty()).then_some(Value::Object(c))
            },
        )
        .boxed()
}

/// A well-formed scope: up to four constrained paths and an optional
/// `max_targets`; an empty `params` is sometimes written, sometimes left out.
pub fn scope() -> BoxedStrategy<Value> {
    (
        prop::collection::btree_map(path(), constraint(), 0..5),
        prop::option::of(1u64..6),
        any::<bool>(),
    )
        .prop_map(|(paths, max_targets, write_empty)| {
            let mut top = Map::new();
            if !paths.is_empty() || write_empty {
                top.insert(
                    "params".to_owned(),
                    Value::Object(paths.into_iter().collect()),
                );
            }
            if let Some(n) = max_targets {
                top.insert("max_targets".to_owned(), Value::from(n));
            }
            Value::Object(top)
        })
        .boxed()
}

/// Scopes that are mostly wrong: a well-formed scope with one part replaced by
/// junk, arbitrary JSON, deep `eq` values, or a valid scope untouched.
pub fn hostile_scope() -> BoxedStrategy<Value> {
    let corrupted = (scope(), hostile_key(), json_any(), 0usize..5).prop_map(
        |(mut scope, key, junk, which)| {
            let top = scope.as_object_mut().expect("scope() builds objects");
            match which {
                0 => {
                    top.insert(key, junk);
                }
                1 => {
                    top.insert("max_targets".to_owned(), junk);
                }
                2 => {
                    top.insert("params".to_owned(), junk);
                }
                3 => {
                    let params = top
                        .entry("params")
                        .or_insert_with(|| Value::Object(Map::new()));
                    if let Some(paths) = params.as_object_mut() {
                        paths.insert(key, junk);
                    }
                }
                _ => {
                    let params = top
                        .entry("params")
                        .or_insert_with(|| Value::Object(Map::new()));
                    if let Some(paths) = params.as_object_mut() {
                        paths.insert("a".to_owned(), Value::Object(Map::from_iter([(key, junk)])));
                    }
                }
            }
            scope
        },
    );
    let deep_eq = deep().prop_map(|v| {
        let eq = Value::Object(Map::from_iter([("eq".to_owned(), v)]));
        let params = Value::Object(Map::from_iter([("a".to_owned(), eq)]));
        Value::Object(Map::from_iter([("params".to_owned(), params)]))
    });
    prop_oneof![
        3 => corrupted,
        2 => json_any(),
        1 => deep_eq,
        1 => scope(),
    ]
    .boxed()
}

/// Scope *text* for the SQL boundary: serialized [`hostile_scope`]s, plus text
/// no `Value` can hold (duplicate keys, the reserved number key, truncation,
/// nesting past the limit).
pub fn hostile_scope_text() -> BoxedStrategy<String> {
    let fixed = prop::sample::select(vec![
        r#"{"params": {}, "params": {}}"#.to_owned(),
        r#"{"params": {"a": {"eq": 1, "eq": 2}}}"#.to_owned(),
        r#"{"params": {"a": {"eq": {"$serde_json::private::Number": "1"}}}}"#.to_owned(),
        r#"{"params": {"a": {"eq": "\u0000"}}}"#.to_owned(),
        r#"{"params": {"a": {"in": [1e400]}}}"#.to_owned(),
        r#"{"params": {"#.to_owned(),
        "".to_owned(),
        "[".repeat(MAX_DEPTH + 1) + &"]".repeat(MAX_DEPTH + 1),
    ]);
    prop_oneof![
        3 => hostile_scope().prop_map(|v| v.to_string()),
        1 => fixed,
    ]
    .boxed()
}

/// The scalar leaves of `v` a scope path can reach — through objects only, by
/// keys a path can name — as (dotted path, value), in sorted path order.
pub fn scalar_leaves(v: &Value) -> Vec<(String, Value)> {
    fn walk(v: &Value, prefix: &mut Vec<String>, out: &mut Vec<(String, Value)>) {
        match v {
            Value::Object(map) => {
                for (key, item) in map {
                    if key.is_empty()
                        || key.contains(['.', '*'])
                        || key.chars().any(char::is_control)
                    {
                        continue;
                    }
                    prefix.push(key.clone());
                    walk(item, prefix, out);
                    prefix.pop();
                }
            }
            Value::Array(_) => {}
            scalar if !prefix.is_empty() => out.push((prefix.join("."), scalar.clone())),
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(v, &mut Vec::new(), &mut out);
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// Replaces the value at a dotted path (which must exist).
pub fn set_at(v: &mut Value, path: &str, new: Value) {
    let mut cur = v;
    for key in path.split('.') {
        cur = cur
            .get_mut(key)
            .unwrap_or_else(|| panic!("no {key} on the way to {path}"));
    }
    *cur = new;
}
