//! Tools discovered on an upstream MCP server: what kind each is, the params
//! schema keyturn checks its arguments against, and the hash that binds an
//! approval to the definition the person's tool was registered from.
//!
//! **Fail closed.** An upstream tool is a read tool only when its upstream is
//! trusted *and* its definition says, explicitly and as a JSON boolean,
//! `"annotations": {"readOnlyHint": true}`. A missing `annotations`, a missing
//! hint, `false`, `null`, the string `"true"`, `1`, or a `destructiveHint`
//! that is anything but absent or `false` beside it: a write tool, which needs
//! a person's approval for every call. MCP calls these annotations hints that a
//! client must not trust from an untrusted server; keyturn trusts them only
//! where an operator said so, and only in the direction that lets a call skip
//! approval when the upstream asserted it without ambiguity.

use serde_json::{Map, Value};

use crate::schema::check_schema;
use crate::CoreError;

/// What a discovered tool is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Runs without approval; its result reaches the agent fenced.
    Read,
    /// Becomes a proposal a person approves; dispatched once after.
    Write,
}

impl Kind {
    /// The word `keyturn.tool_kind` uses.
    pub fn word(self) -> &'static str {
        match self {
            Kind::Read => "read",
            Kind::Write => "write",
        }
    }
}

/// The kind of the tool `definition` (the JSON object of one tool in an
/// upstream's `tools/list`), from an upstream whose annotations are trusted
/// or not.
/// A read-only tool that also says it is destructive contradicts itself:
/// ambiguous, so a write.
pub fn classify(definition: &Value, trust_annotations: bool) -> Kind {
    let annotations = definition.get("annotations");
    let read_only = annotations.and_then(|a| a.get("readOnlyHint"));
    let destructive = annotations.and_then(|a| a.get("destructiveHint"));
    if trust_annotations
        && read_only == Some(&Value::Bool(true))
        && destructive.is_none_or(|d| d == &Value::Bool(false))
    {
        Kind::Read
    } else {
        Kind::Write
    }
}

/// Lowercase hex SHA-256 of the RFC 8785 form of `definition`, whole, as
/// received: any change to any part of it (a description, a schema, an
/// annotation) is a different hash, so a different tool version.
pub fn definition_sha256(definition: &Value) -> Result<String, CoreError> {
    crate::canonical::sha256_hex(definition)
}

/// JSON Schema keywords that describe a value without constraining it: left
/// out of the params schema keyturn checks (they are still in the definition
/// the hash covers). Every other keyword must be one keyturn checks, or the
/// tool is refused: a constraint keyturn cannot check is never dropped.
const ANNOTATION_KEYWORDS: &[&str] = &[
    "$schema",
    "$id",
    "$comment",
    "default",
    "examples",
    "deprecated",
    "readOnly",
    "writeOnly",
];

/// The params schema of an upstream tool: its `inputSchema` without the
/// keywords that constrain nothing ([`ANNOTATION_KEYWORDS`]), then checked
/// and normalized like any tool's `params_schema` (so `additionalProperties`
/// is false unless the upstream said otherwise).
pub fn params_schema(input_schema: &Value) -> Result<Value, CoreError> {
    check_schema(&strip_annotations(input_schema))
}

fn strip_annotations(schema: &Value) -> Value {
    let Some(obj) = schema.as_object() else {
        return schema.clone();
    };
    let mut out = Map::new();
    for (key, value) in obj {
        if ANNOTATION_KEYWORDS.contains(&key.as_str()) {
            continue;
        }
        let value = match key.as_str() {
            "properties" => match value.as_object() {
                Some(props) => Value::Object(
                    props
                        .iter()
                        .map(|(name, sub)| (name.clone(), strip_annotations(sub)))
                        .collect(),
                ),
                None => value.clone(),
            },
            "items" => strip_annotations(value),
            "anyOf" => match value.as_array() {
                Some(branches) => Value::Array(branches.iter().map(strip_annotations).collect()),
                None => value.clone(),
            },
            _ => value.clone(),
        };
        out.insert(key.clone(), value);
    }
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;
    use sha2::{Digest, Sha256};

    #[test]
    fn test_only_an_explicit_true_from_a_trusted_upstream_reads() {
        let read = json!({"name": "t", "annotations": {"readOnlyHint": true}});
        assert_eq!(classify(&read, true), Kind::Read);
        assert_eq!(classify(&read, false), Kind::Write, "untrusted upstream");
        for annotations in [
            json!(null),
            json!({}),
            json!({"readOnlyHint": false}),
            json!({"readOnlyHint": null}),
            json!({"readOnlyHint": "true"}),
            json!({"readOnlyHint": 1}),
            json!({"readOnlyHint": [true]}),
            json!({"readOnlyHint": true, "destructiveHint": true}),
            json!({"readOnlyHint": true, "destructiveHint": "false"}),
            json!({"readOnlyHint": true, "destructiveHint": null}),
            json!({"readonlyhint": true}),
            json!([{"readOnlyHint": true}]),
            json!("readOnlyHint"),
        ] {
            let d = json!({"name": "t", "annotations": annotations});
            assert_eq!(classify(&d, true), Kind::Write, "{annotations}");
        }
        assert_eq!(classify(&json!({"name": "t"}), true), Kind::Write);
        assert_eq!(
            classify(&json!({"name": "t", "readOnlyHint": true}), true),
            Kind::Write,
            "the hint counts only inside annotations"
        );
    }

    fn any_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i32>().prop_map(|n| json!(n)),
            "[a-zA-Z ]{0,6}".prop_map(Value::String),
        ];
        leaf.prop_recursive(3, 16, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::btree_map("[a-zA-Z]{1,12}", inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        /// Any definition whose readOnlyHint is not exactly the boolean true
        /// (missing, another type, false) is a write, trusted or not.
        #[test]
        fn prop_anything_but_an_explicit_true_is_a_write(
            hint in any_json(),
            other in any_json(),
            trust in any::<bool>(),
            with_hint in any::<bool>(),
        ) {
            prop_assume!(hint != Value::Bool(true));
            let mut annotations = Map::new();
            annotations.insert("destructiveHint".into(), other);
            if with_hint {
                annotations.insert("readOnlyHint".into(), hint);
            }
            let d = json!({"name": "t", "annotations": annotations});
            prop_assert_eq!(classify(&d, trust), Kind::Write);
        }

        /// An untrusted upstream's tools are writes whatever they say.
        #[test]
        fn prop_an_untrusted_upstream_has_no_reads(definition in any_json()) {
            prop_assert_eq!(classify(&definition, false), Kind::Write);
            let mut d = definition;
            if let Some(o) = d.as_object_mut() {
                o.insert("annotations".into(), json!({"readOnlyHint": true}));
            }
            prop_assert_eq!(classify(&d, false), Kind::Write);
        }

        /// Whatever else the annotations hold, an explicit true from a
        /// trusted upstream is a read.
        #[test]
        fn prop_an_explicit_true_reads(others in prop::collection::btree_map("[a-zA-Z]{1,8}", any_json(), 0..4)) {
            let mut annotations: Map<String, Value> = others.into_iter().collect();
            annotations.insert("readOnlyHint".into(), Value::Bool(true));
            let d = json!({"name": "t", "annotations": annotations});
            prop_assert_eq!(classify(&d, true), Kind::Read);
        }
    }

    #[test]
    fn test_the_hash_is_of_the_canonical_form() {
        let a = json!({"name": "t", "inputSchema": {"type": "object", "properties": {}}});
        let b: Value = serde_json::from_str(
            r#"{ "inputSchema" : {"properties":{}, "type":"object"}, "name":"t" }"#,
        )
        .unwrap();
        assert_eq!(
            definition_sha256(&a).unwrap(),
            definition_sha256(&b).unwrap()
        );
        // sha256 of {"inputSchema":{"properties":{},"type":"object"},"name":"t"}
        let expected = hex::encode(Sha256::digest(
            br#"{"inputSchema":{"properties":{},"type":"object"},"name":"t"}"#,
        ));
        assert_eq!(definition_sha256(&a).unwrap(), expected);
        let c = json!({"name": "t", "description": "x", "inputSchema": {"type": "object", "properties": {}}});
        assert_ne!(
            definition_sha256(&a).unwrap(),
            definition_sha256(&c).unwrap()
        );
    }

    #[test]
    fn test_params_schema_drops_annotations_and_refuses_unchecked_constraints() {
        let fastmcp = json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "title": "send_messageArguments",
            "type": "object",
            "properties": {
                "channel": {"title": "Channel", "type": "string"},
                "text": {"title": "Text", "type": "string", "default": "hi", "examples": ["x"]}
            },
            "required": ["channel"]
        });
        let normalized = params_schema(&fastmcp).expect("fits");
        assert!(normalized.get("$schema").is_none());
        assert!(normalized["properties"]["text"].get("default").is_none());
        assert_eq!(normalized["additionalProperties"], json!(false));
        // An optional argument as Pydantic writes it (`cc: str | None = None`):
        // a value that may be null, which keyturn checks.
        let optional = json!({
            "type": "object",
            "properties": {"cc": {"anyOf": [{"type": "string", "title": "x"}, {"type": "null"}],
                                  "default": null, "title": "Cc"}}
        });
        let normalized = params_schema(&optional).expect("a nullable value fits");
        assert_eq!(
            normalized["properties"]["cc"],
            json!({"anyOf": [{"type": "string", "title": "x"}, {"type": "null"}], "title": "Cc"})
        );
        let compiled = crate::schema::compile(&normalized).unwrap();
        assert!(compiled.validate(&json!({})).is_ok());
        assert!(compiled.validate(&json!({"cc": null})).is_ok());
        assert!(compiled.validate(&json!({"cc": "a"})).is_ok());
        assert!(compiled.validate(&json!({"cc": 1})).is_err());
        for unchecked in [
            json!({"type": "object", "properties": {"a": {"anyOf": [{"type": "string"}, {"type": "integer"}]}}}),
            json!({"type": "object", "properties": {"a": {"anyOf": [{"type": "string"}, {"type": "null"}, {"type": "null"}]}}}),
            json!({"type": "object", "properties": {"a": {"type": "string", "anyOf": [{"type": "string"}, {"type": "null"}]}}}),
            json!({"type": "object", "properties": {"a": {"anyOf": [{"type": "string", "pattern": "x"}, {"type": "null"}]}}}),
            json!({"type": "object", "properties": {"a": {"oneOf": [{"type": "string"}, {"type": "null"}]}}}),
            json!({"type": "object", "properties": {"a": {"type": "string", "pattern": "^x"}}}),
            json!({"type": "object", "additionalProperties": {"type": "string"}}),
        ] {
            assert!(params_schema(&unchecked).is_err(), "{unchecked}");
        }
    }
}
