//! Tool specs for `register_tool`: params schemas (with params that fit
//! them, or not), summary templates, and whole external and sql specs, well
//! formed and hostile.
//!
//! Hostile specs are well-formed ones with one key replaced by junk, so the
//! validator's every branch is reached rather than its first refusal only.

use proptest::prelude::*;
use serde_json::{json, Map, Value};

use super::forms::{SET, WHERE};
use super::text::hostile_text;
use super::{hostile_key, hostile_number, json_any, nest};

/// Property names, from a small pool so `required` and `targets_param` find them.
fn prop_name() -> BoxedStrategy<String> {
    prop::sample::select(vec![
        "channel", "text", "to", "ids", "n", "flag", "meta", "é",
    ])
    .prop_map(str::to_owned)
    .boxed()
}

/// A subschema inside the subset, `depth` levels of objects and arrays at most.
pub fn subschema(depth: u32) -> BoxedStrategy<Value> {
    let string =
        (0u64..3, prop::option::of(3u64..20), 0u8..10).prop_map(|(min, max, shape)| match shape {
            // A format or an enum alone: lengths beside them would make the
            // fitting values harder to draw, and add nothing to the subset.
            0 => json!({"type": "string", "format": "email"}),
            1 => json!({"type": "string", "enum": ["sales", "support", "ops"]}),
            _ => {
                let mut s = json!({"type": "string", "minLength": min});
                if let Some(max) = max {
                    s["maxLength"] = json!(max.max(min));
                }
                s
            }
        });
    let number = (
        prop::sample::select(vec!["number", "integer"]),
        prop::option::of(-10i64..10),
        0i64..50,
    )
        .prop_map(|(ty, min, span)| {
            let mut s = json!({"type": ty});
            if let Some(min) = min {
                s["minimum"] = json!(min);
                s["maximum"] = json!(min + span);
            }
            s
        });
    let leaf = prop_oneof![
        3 => string,
        2 => number,
        1 => Just(json!({"type": "boolean"})),
        1 => Just(json!({"enum": ["a", 1, true]})),
    ];
    leaf.prop_recursive(depth, 12, 4, |inner| {
        prop_oneof![
            (inner.clone(), prop::option::of(0u64..5)).prop_map(|(items, max)| {
                let mut s = json!({"type": "array", "items": items});
                if let Some(max) = max {
                    s["maxItems"] = json!(max);
                }
                s
            }),
            object_schema(inner),
        ]
    })
    .boxed()
}

fn object_schema(inner: impl Strategy<Value = Value> + 'static) -> BoxedStrategy<Value> {
    (
        prop::collection::btree_map(prop_name(), inner, 0..4),
        any::<u64>(),
        prop::option::weighted(0.3, any::<bool>()),
    )
        .prop_map(|(props, mask, extra)| {
            let names: Vec<String> = props.keys().cloned().collect();
            let required: Vec<String> = names
                .iter()
                .enumerate()
                .filter(|(i, _)| (mask >> (i % 64)) & 1 == 1)
                .map(|(_, n)| n.clone())
                .collect();
            let mut s = json!({"type": "object", "properties": props, "required": required});
            if let Some(extra) = extra {
                s["additionalProperties"] = json!(extra);
            }
            s
        })
        .boxed()
}

/// A top-level params schema: `{}` (no params) or an object schema.
pub fn params_schema() -> BoxedStrategy<Value> {
    prop_oneof![
        1 => Just(json!({})),
        1 => Just(json!({"type": "object", "additionalProperties": true})),
        6 => object_schema(subschema(2)),
    ]
    .boxed()
}

/// Params that pass `schema` (a subschema [`subschema`] or [`params_schema`]
/// made), built by walking it.
pub fn fitting(schema: &Value) -> BoxedStrategy<Value> {
    if let Some(values) = schema.get("enum").and_then(Value::as_array) {
        return prop::sample::select(values.clone()).boxed();
    }
    match schema.get("type").and_then(Value::as_str) {
        Some("string") if schema.get("format").is_some() => "[a-z]{1,8}@[a-z]{1,8}\\.example"
            .prop_map(Value::from)
            .boxed(),
        Some("string") => {
            let min = schema["minLength"].as_u64().unwrap_or(0) as usize;
            let max = schema["maxLength"]
                .as_u64()
                .map_or(min + 12, |m| m as usize);
            prop::collection::vec(
                prop::sample::select(vec!['a', 'é', ' ', '\u{1F602}', '\'']),
                min..=max,
            )
            .prop_map(|cs| Value::from(cs.into_iter().collect::<String>()))
            .boxed()
        }
        Some(ty @ ("number" | "integer")) => {
            let min = schema["minimum"].as_i64().unwrap_or(-1000);
            let max = schema["maximum"].as_i64().unwrap_or(1000);
            if ty == "integer" {
                (min..=max).prop_map(Value::from).boxed()
            } else {
                // Quarters are exact in binary, so the JSON text is the value.
                (min..=max, 0u32..4)
                    .prop_map(move |(n, q)| clamp(json!(n as f64 + f64::from(q) * 0.25), min, max))
                    .boxed()
            }
        }
        Some("boolean") => any::<bool>().prop_map(Value::Bool).boxed(),
        Some("array") => {
            let max = schema["maxItems"].as_u64().map_or(4, |m| m as usize);
            prop::collection::vec(fitting(&schema["items"]), 0..=max)
                .prop_map(Value::Array)
                .boxed()
        }
        Some("object") => {
            let props = schema
                .get("properties")
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default();
            let required: Vec<String> = schema
                .get("required")
                .and_then(Value::as_array)
                .map(|r| {
                    r.iter()
                        .filter_map(|v| v.as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default();
            let entries: Vec<_> = props
                .into_iter()
                .map(|(name, sub)| {
                    let must = required.contains(&name);
                    (fitting(&sub), any::<bool>())
                        .prop_map(move |(v, keep)| (must || keep).then(|| (name.clone(), v)))
                })
                .collect();
            entries
                .prop_map(|e| Value::Object(e.into_iter().flatten().collect::<Map<_, _>>()))
                .boxed()
        }
        _ => Just(json!({})).boxed(),
    }
}

fn clamp(v: Value, min: i64, max: i64) -> Value {
    match v.as_f64() {
        Some(f) if f > max as f64 => json!(max),
        Some(f) if f < min as f64 => json!(min),
        _ => v,
    }
}

/// A params schema and params for it: fitting ones (`Some(true)`), ones with
/// an extra key the schema forbids (`Some(false)`), or arbitrary JSON (`None`:
/// the verdict is the validator's).
pub fn schema_and_params() -> BoxedStrategy<(Value, Value, Option<bool>)> {
    params_schema()
        .prop_flat_map(|schema| {
            let closed = schema.get("additionalProperties") != Some(&json!(true));
            let fit = fitting(&schema);
            let extra = fitting(&schema).prop_map(move |mut p| {
                if let Some(m) = p.as_object_mut() {
                    m.insert("bcc".into(), json!("someone@evil.example"));
                }
                p
            });
            let any_params = super::params();
            (
                Just(schema),
                prop_oneof![
                    4 => fit.prop_map(|p| (p, Some(true))),
                    1 => extra.prop_map(move |p| (p, closed.then_some(false))),
                    1 => any_params.prop_map(|p| (p, None)),
                ],
            )
        })
        .prop_map(|(schema, (params, verdict))| (schema, params, verdict))
        .boxed()
}

/// A schema with one thing outside the subset: an unknown keyword, an
/// untyped subschema, a keyword of the wrong type or range, nesting past the
/// limit.
pub fn hostile_params_schema() -> BoxedStrategy<Value> {
    let junk = prop_oneof![
        Just(json!({"type": "object", "properties": {"a": {"type": "string", "pattern": ".*"}}})),
        Just(json!({"type": "object", "properties": {"a": {"$ref": "#"}}})),
        Just(json!({"type": "object", "oneOf": [{"type": "object"}]})),
        Just(json!({"type": "object", "requried": ["a"]})),
        Just(json!({"type": "object", "properties": {"a": {}}})),
        Just(json!({"type": "object", "properties": {"a": {"type": ["string", "null"]}}})),
        Just(json!({"type": "object", "properties": {"a": {"type": "null"}}})),
        Just(json!({"type": "object", "additionalProperties": {"type": "string"}})),
        Just(json!({"type": "object", "required": "a"})),
        Just(json!({"type": "object", "properties": {"a": {"type": "string", "minLength": -1}}})),
        Just(json!({"type": "object", "properties": {"a": {"type": "string", "maxLength": 1.5}}})),
        Just(json!({"type": "object", "properties": {"a": {"type": "number", "minimum": "5"}}})),
        Just(
            json!({"type": "object", "properties": {"a": {"type": "number", "minimum": 5, "maximum": 1}}})
        ),
        Just(json!({"type": "object", "properties": {"a": {"type": "string", "format": "uri"}}})),
        Just(json!({"type": "object", "properties": {"a": {"enum": []}}})),
        Just(json!({"type": "object", "properties": {"a": {"type": "string", "maxItems": 3}}})),
        Just(json!({"type": "object", "properties": []})),
        Just(json!({"type": "string"})),
        Just(json!([])),
        Just(json!("object")),
        hostile_number().prop_map(
            |n| json!({"type": "object", "properties": {"a": {"type": "string", "maxLength": n}}})
        ),
        (60usize..80).prop_map(|depth| {
            let mut s = json!({"type": "string"});
            for _ in 0..depth {
                s = json!({"type": "array", "items": s});
            }
            json!({"type": "object", "properties": {"a": s}})
        }),
        (hostile_key(), json_any()).prop_map(
            |(k, v)| json!({"type": "object", "properties": {"a": {"type": "string", k: v}}})
        ),
    ];
    prop_oneof![
        4 => junk,
        1 => params_schema(),
    ]
    .boxed()
}

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

/// A tool name: valid (dotted lowercase) or not (upper case, look-alikes,
/// too long, hidden characters, SQL).
pub fn hostile_tool_name() -> BoxedStrategy<String> {
    prop_oneof![
        prop::sample::select(vec![
            "Deal",
            "deal-stage",
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
