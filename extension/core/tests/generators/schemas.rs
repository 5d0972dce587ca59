//! params schemas for external tools, inside the subset keyturn-core's
//! `schema` takes and outside it, and params built to fit a schema (or to
//! break it in a way whose verdict is certain).

use proptest::prelude::*;
use serde_json::{json, Map, Value};

use super::{hostile_key, hostile_number, json_any};

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

/// Longest string and array [`fitting`] makes. A schema the generators made
/// stays far below; a stored one (a hostile spec keyturn took) may allow
/// billions, and fitting it then is best effort.
const MOST: usize = 24;

/// Most values [`fitting`] puts in one params document. Arrays nest: a
/// stored schema of twenty arrays, each up to four items, would otherwise
/// ask for 4^20 values (a fuzz run was killed for memory at 24 GB).
pub const BUDGET: usize = 256;

/// Params that pass `schema` (a subschema [`subschema`] or [`params_schema`]
/// made), built by walking it.
pub fn fitting(schema: &Value) -> BoxedStrategy<Value> {
    fitting_within(schema, BUDGET)
}

/// [`fitting`] with at most about `budget` values below this one: an array
/// shares it among its items, an object among its properties. Required
/// properties are drawn even with nothing left (the schema's depth, which
/// keyturn bounds, bounds them), arrays are then empty.
fn fitting_within(schema: &Value, budget: usize) -> BoxedStrategy<Value> {
    if let Some(values) = schema.get("enum").and_then(Value::as_array) {
        return prop::sample::select(values.clone()).boxed();
    }
    match schema.get("type").and_then(Value::as_str) {
        Some("string") if schema.get("format").is_some() => "[a-z]{1,8}@[a-z]{1,8}\\.example"
            .prop_map(Value::from)
            .boxed(),
        Some("string") => {
            let min = schema["minLength"]
                .as_u64()
                .map_or(0, |m| m.min(MOST as u64) as usize);
            let max = schema["maxLength"]
                .as_u64()
                .map_or(min + 12, |m| m.min(MOST as u64) as usize)
                .max(min);
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
            let max = schema["maxItems"]
                .as_u64()
                .map_or(4, |m| m.min(MOST as u64) as usize)
                .min(budget);
            let each = budget.saturating_sub(max) / max.max(1);
            prop::collection::vec(fitting_within(&schema["items"], each), 0..=max)
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
            let each = budget.saturating_sub(props.len()) / props.len().max(1);
            let entries: Vec<_> = props
                .into_iter()
                .map(|(name, sub)| {
                    let must = required.contains(&name);
                    (fitting_within(&sub, each), any::<bool>())
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
