//! Tool specs for `register_tool`: summary templates, tool names, and whole
//! external and sql specs, well formed and hostile (params schemas are in
//! [`super::schemas`]).
//!
//! Hostile specs are well-formed ones with one key replaced by junk, so the
//! validator's every branch is reached rather than its first refusal only.

use proptest::prelude::*;
use serde_json::{json, Map, Value};

use super::forms::{SET, WHERE};
use super::schemas::{hostile_params_schema, params_schema};
use super::text::hostile_text;
use super::{hostile_key, hostile_number, json_any, nest};

/// A summary template: placeholders into params, `{count}`, literal braces.
pub fn template() -> BoxedStrategy<String> {
    prop::collection::vec(
        prop::sample::select(vec![
            "Send ",
            "{count}",
            "{set.stage}",
            "{where.id}",
            "{channel}",
            "{text}",
            "{{",
            "}}",
            " to ",
            "{to}",
            "{a.b}",
            "é",
            "\u{1F602}",
        ]),
        // An empty summary is refused; a tool without one shows its name.
        1..8,
    )
    .prop_map(|parts| parts.concat())
    .boxed()
}

/// Templates the validator must refuse or survive: unbalanced braces, empty
/// or odd placeholders, over 500 characters, hidden characters.
pub fn hostile_template() -> BoxedStrategy<String> {
    prop_oneof![
        prop::sample::select(vec![
            "{",
            "}",
            "{ }",
            "{}",
            "{set..x}",
            "{count",
            "}{",
            "{{{",
            "{\u{200B}count}",
            "{.}",
            "{set.}"
        ])
        .prop_map(str::to_owned),
        (1usize..200).prop_map(|n| "{count}".repeat(n)),
        (490usize..520).prop_map(|n| "x".repeat(n)),
        hostile_text(),
    ]
    .boxed()
}

/// A tool name: valid (dotted parts of letters in either case, digits, `_`
/// and `-`) or not (look-alikes, empty parts, a leading digit, hyphen or
/// underscore, too long, hidden characters, SQL).
pub fn hostile_tool_name() -> BoxedStrategy<String> {
    prop_oneof![
        prop::sample::select(vec![
            "Deal",
            "deal-stage",
            "-deal",
            "deal.-x",
            "deal/x",
            "deal..x",
            ".deal",
            "deal.",
            "1deal",
            "dеal",
            "deal\u{200B}",
            "_x"
        ])
        .prop_map(str::to_owned),
        (64usize..80).prop_map(|n| "d".repeat(n)),
        hostile_text(),
    ]
    .boxed()
}

fn options() -> BoxedStrategy<Map<String, Value>> {
    (
        prop::option::of(prop::sample::select(vec![
            "reversible",
            "compensatable",
            "irreversible",
        ])),
        prop::option::of(prop::sample::select(vec![
            "1 second",
            "5 minutes",
            "15 minutes",
            "7 days",
        ])),
        prop::option::of(1u64..10_001),
        prop::option::of(template()),
        prop::option::of((
            1u64..100,
            prop::sample::select(vec!["1 minute", "1 day", "366 days"]),
        )),
        prop::option::of(any::<bool>()),
    )
        .prop_map(|(effect, expires, max_targets, summary, rate, delegable)| {
            let mut m = Map::new();
            if let Some(e) = effect {
                m.insert("effect".into(), json!(e));
            }
            if let Some(e) = expires {
                m.insert("expires_in".into(), json!(e));
            }
            if let Some(n) = max_targets {
                m.insert("max_targets".into(), json!(n));
            }
            if let Some(s) = summary {
                m.insert("summary".into(), json!(s));
            }
            if let Some((max, per)) = rate {
                m.insert("rate_limit".into(), json!({"max": max, "per": per}));
            }
            if let Some(d) = delegable {
                m.insert("delegable".into(), json!(d));
            }
            m
        })
        .boxed()
}

/// A well-formed external spec for `provider`.
pub fn external_spec(provider: &'static str) -> BoxedStrategy<Value> {
    (
        params_schema(),
        options(),
        prop::option::of(prop::sample::select(vec!["full", "digest"])),
        0u8..4,
    )
        .prop_map(move |(schema, mut m, retain, approval)| {
            m.insert("executor".into(), json!("external"));
            m.insert("provider".into(), json!(provider));
            m.insert("params_schema".into(), schema);
            if let Some(r) = retain {
                m.insert("retain".into(), json!(r));
            }
            match approval {
                0 => {
                    m.insert("approval".into(), json!("independent"));
                    m.insert("quorum".into(), json!(2));
                }
                1 => {
                    m.insert("approval".into(), json!("self"));
                }
                _ => {}
            }
            Value::Object(m)
        })
        .boxed()
}

/// A well-formed sql spec over `table` (the fuzzer's, [`super::forms`]).
pub fn sql_spec(table: String) -> BoxedStrategy<Value> {
    (
        options(),
        prop::sample::subsequence(SET, 1..=SET.len()),
        prop::sample::subsequence(WHERE, 1..=WHERE.len()),
        prop::sample::select(vec!["xmin", "revision"]),
        prop::option::of(prop::sample::select(vec!["self", "independent", "task"])),
    )
        .prop_map(move |(mut m, set, filters, version, approval)| {
            m.insert("executor".into(), json!("sql"));
            m.insert("sql".into(), json!({"table": table, "key": "id", "version": version, "set": set, "where": filters}));
            if let Some(a) = approval {
                m.insert("approval".into(), json!(a));
            }
            Value::Object(m)
        })
        .boxed()
}

/// Junk for one spec key, chosen to sit just outside what that key takes.
fn junk_for(key: &'static str) -> BoxedStrategy<Value> {
    let fixed: Vec<Value> = match key {
        "executor" => vec![
            json!("SQL"),
            json!(""),
            json!("shell"),
            json!(1),
            Value::Null,
        ],
        "provider" => vec![
            json!("Webhook"),
            json!("web hook"),
            json!(""),
            json!("../x"),
            json!(5),
        ],
        "effect" | "retain" | "approval" | "kind" => {
            vec![json!("Reversible"), json!(""), json!(true), json!(["self"])]
        }
        "expires_in" => vec![
            json!("0"),
            json!("-1 minute"),
            json!("8 days"),
            json!("1e400 seconds"),
            json!("forever"),
            json!(15),
            json!("P1D"),
            json!("1 month"),
            json!("infinity"),
            json!("100000000 years"),
            json!("99999999999999999999 seconds"),
        ],
        "quorum" => vec![
            json!(0),
            json!(6),
            json!(2.5),
            json!("2"),
            json!(-1),
            json!(2),
            json!(1e300),
        ],
        "max_targets" | "max_attachment_bytes" => vec![
            json!(0),
            json!(10_001),
            json!(1.5),
            json!("5"),
            json!(-3),
            json!(26_214_401),
        ],
        "rate_limit" => vec![
            json!({"max": 0, "per": "1 day"}),
            json!({"max": 1}),
            json!({"per": "1 day"}),
            json!({"max": 5, "per": "400 days"}),
            json!([1]),
            json!("x"),
            json!({"max": 1, "per": "1 day", "x": 1}),
            json!({"max": 1, "per": "yesterday"}),
        ],
        "sql" => vec![
            json!({"table": "crm.nope", "key": "id", "set": ["stage"], "where": ["id"]}),
            json!({"table": "pg_catalog.pg_authid", "key": "oid", "set": ["rolname"], "where": ["oid"]}),
            json!({"table": "keyturn.action", "key": "id", "set": ["status"], "where": ["id"]}),
            json!("crm.deal"),
            json!({}),
        ],
        "targets_param" | "attachments_param" => {
            vec![json!("nope"), json!(""), json!(["to"]), json!("to")]
        }
        "attachment_types" => vec![
            json!([]),
            json!(["PDF"]),
            json!("application/pdf"),
            json!(["application/pdf", 1]),
        ],
        "delegable" => vec![json!("yes"), json!(1), Value::Null],
        _ => vec![Value::Null],
    };
    prop_oneof![
        3 => prop::sample::select(fixed),
        1 => hostile_text().prop_map(Value::from),
        1 => hostile_number(),
        1 => json_any(),
    ]
    .boxed()
}

const SPEC_KEYS: &[&str] = &[
    "executor",
    "provider",
    "effect",
    "retain",
    "approval",
    "kind",
    "expires_in",
    "quorum",
    "max_targets",
    "rate_limit",
    "sql",
    "targets_param",
    "attachments_param",
    "attachment_types",
    "max_attachment_bytes",
    "delegable",
];

/// Mostly-wrong specs: a well-formed one with one key replaced by junk, or
/// its schema, template or sql part made hostile, or an unknown key added,
/// or no spec at all.
pub fn hostile_spec(provider: &'static str, table: String) -> BoxedStrategy<Value> {
    let base = prop_oneof![external_spec(provider), sql_spec(table.clone())];
    let one_key = (base.clone(), prop::sample::select(SPEC_KEYS))
        .prop_flat_map(|(spec, key)| (Just(spec), Just(key), junk_for(key)))
        .prop_map(|(mut spec, key, junk)| {
            spec[key] = junk;
            spec
        });
    let parts = (
        base.clone(),
        hostile_params_schema(),
        hostile_template(),
        0u8..3,
        prop::sample::subsequence(WHERE, 0..3),
    )
        .prop_map(|(mut spec, schema, summary, which, filters)| {
            match which {
                0 => spec["params_schema"] = schema,
                1 => spec["summary"] = json!(summary),
                _ => {
                    if let Some(sql) = spec.get_mut("sql") {
                        sql["where"] = json!(filters);
                        sql["set"] = json!(["id", "xmin", "tenant"]);
                    }
                }
            }
            spec
        });
    let sql_columns = (
        prop::sample::select(vec!["key", "version", "set", "where", "table"]),
        hostile_text(),
        base.clone(),
    )
        .prop_map(move |(which, text, mut spec)| {
            if let Some(sql) = spec.get_mut("sql") {
                sql[which] = match which {
                    "set" | "where" => json!([text]),
                    _ => json!(text),
                };
            }
            spec
        });
    let unknown = (base, hostile_key(), json_any()).prop_map(|(mut spec, key, v)| {
        spec[key.as_str()] = v;
        spec
    });
    prop_oneof![
        4 => one_key,
        2 => parts,
        1 => sql_columns,
        1 => unknown,
        1 => json_any(),
        1 => (60usize..70).prop_map(nest),
    ]
    .boxed()
}
