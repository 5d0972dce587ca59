//! The params_schema subset for external tools (docs/sql-api.md, "Tools").
//!
//! External tools hand params to a provider outside the database, so the schema
//! is the only thing standing between an agent and, say, an extra `bcc` field.
//! We accept a deliberately small, closed subset of JSON Schema:
//!
//! * every keyword outside the subset is refused rather than ignored — an
//!   unknown keyword (`pattern`, `$ref`, `oneOf`, a typo such as `requried`) would
//!   otherwise silently validate nothing;
//! * keywords must fit the declared `type`, and every subschema declares a `type`
//!   or an `enum`, because an untyped subschema accepts any value, including an
//!   object with arbitrary keys;
//! * objects default to `"additionalProperties": false`, keyturn's default,
//!   made explicit in the normalized schema so the validator and anyone reading
//!   the stored schema see the same rule.
//!
//! Validation itself is the `jsonschema` crate (draft 2020-12) with format
//! checking switched on, since `format` is an annotation only by default and
//! `"format": "email"` would otherwise accept anything. `email` is our own
//! check, [`crate::email::is_bare_addr_spec`], not the crate's: that one
//! follows RFC 5322 and so accepts display names, quoted local parts and IP
//! literals, each a way to show one address on the approval card and deliver
//! to another.

use std::fmt;

use serde_json::{json, Map, Value};

use crate::canonical::MAX_DEPTH;
use crate::CoreError;

const TYPES: &[&str] = &["object", "string", "number", "integer", "boolean", "array"];

/// At most this many failures are reported; past it, a count is appended, so a
/// huge invalid array cannot turn into a huge error message.
const MAX_REPORTED_ERRORS: usize = 32;
/// Longest single failure message, in characters (they may quote the instance).
const MAX_ERROR_CHARS: usize = 300;

/// Checks that `schema` stays inside the subset and returns it normalized:
/// `{}` becomes the "no params" schema, and every object schema without
/// `additionalProperties` gets `false`.
pub fn check_schema(schema: &Value) -> Result<Value, CoreError> {
    let Some(top) = schema.as_object() else {
        return Err(invalid("", "params_schema must be a JSON object"));
    };
    if top.is_empty() {
        return Ok(json!({"type": "object", "properties": {}, "additionalProperties": false}));
    }
    if top.get("type").and_then(Value::as_str) != Some("object") {
        return Err(invalid(
            "",
            "the top level must be {\"type\": \"object\", ...} (or {} for a tool without params)",
        ));
    }
    normalize(schema, &mut String::new(), 0)
}

/// A normalized params_schema ready to validate params.
pub struct CompiledSchema {
    validator: jsonschema::Validator,
}

impl fmt::Debug for CompiledSchema {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CompiledSchema").finish_non_exhaustive()
    }
}

/// Compiles a schema. It is checked (and normalized) again first, so a stored
/// schema that was altered after registration cannot widen what is accepted.
pub fn compile(normalized: &Value) -> Result<CompiledSchema, CoreError> {
    let schema = check_schema(normalized)?;
    let validator = jsonschema::options()
        .with_draft(jsonschema::Draft::Draft202012)
        .should_validate_formats(true)
        .with_format("email", crate::email::is_bare_addr_spec)
        .build(&schema)
        .map_err(|e| CoreError::InvalidSchema(e.to_string()))?;
    Ok(CompiledSchema { validator })
}

impl CompiledSchema {
    /// Validates params, reporting every failure (up to a cap) with the JSON
    /// pointer of the offending value (`(root)` for the params object itself).
    pub fn validate(&self, params: &Value) -> Result<(), CoreError> {
        self.report(params, |e| e.to_string())
    }

    /// [`validate`](Self::validate) naming each failure's path and keyword
    /// but never the value: for a digest-retention tool, whose values stay
    /// out of everything people other than its author read, the server log
    /// (where every error message goes) included.
    pub fn validate_without_values(&self, params: &Value) -> Result<(), CoreError> {
        self.report(params, |e| {
            format!(
                "fails the schema's {} (value withheld: digest retention)",
                e.kind().keyword()
            )
        })
    }

    fn report(
        &self,
        params: &Value,
        describe: impl Fn(&jsonschema::ValidationError<'_>) -> String,
    ) -> Result<(), CoreError> {
        let mut errors = Vec::new();
        let mut total = 0usize;
        for e in self.validator.iter_errors(params) {
            total += 1;
            if errors.len() < MAX_REPORTED_ERRORS {
                let path = e.instance_path().as_str();
                let path = if path.is_empty() { "(root)" } else { path };
                // One line: the path and the message may quote an agent's
                // keys and values, and the server log keeps every message.
                let line = crate::text::for_display(&format!("{path}: {}", describe(&e)));
                errors.push(crate::text::clip(&line, MAX_ERROR_CHARS));
            }
        }
        if total > errors.len() {
            errors.push(format!("and {} more", total - errors.len()));
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(CoreError::InvalidParams(errors))
        }
    }
}

fn invalid(path: &str, what: &str) -> CoreError {
    let at = if path.is_empty() { "(root)" } else { path };
    // One short line: the path and the keyword are the schema's author's,
    // an upstream's for a discovered tool, and the server log keeps every
    // message (thirty-first red-team pass, docs/security.md row 141).
    let line = crate::text::for_display(&format!("at {at}: {what}"));
    CoreError::InvalidSchema(crate::text::clip(&line, MAX_ERROR_CHARS))
}

/// Which `type` a keyword belongs to.
fn keyword_type(keyword: &str) -> Option<&'static [&'static str]> {
    Some(match keyword {
        "properties" | "required" | "additionalProperties" => &["object"],
        "items" | "maxItems" => &["array"],
        "minLength" | "maxLength" | "format" => &["string"],
        "minimum" | "maximum" => &["number", "integer"],
        _ => return None,
    })
}

/// Checks one subschema at `path` (a JSON pointer into the schema) and returns
/// its normalized copy.
fn normalize(schema: &Value, path: &mut String, depth: usize) -> Result<Value, CoreError> {
    if depth >= MAX_DEPTH {
        return Err(invalid(path, "the schema is nested too deeply"));
    }
    let Some(obj) = schema.as_object() else {
        return Err(invalid(path, "a schema must be a JSON object"));
    };
    let ty =
        match obj.get("type") {
            None => None,
            Some(Value::String(t)) if TYPES.contains(&t.as_str()) => Some(t.as_str()),
            Some(_) => return Err(invalid(
                path,
                "\"type\" must be one string among object, string, number, integer, boolean, array",
            )),
        };
    let mut out = Map::new();
    for (key, value) in obj {
        if let Some(types) = keyword_type(key) {
            if !ty.is_some_and(|t| types.contains(&t)) {
                return Err(invalid(
                    path,
                    &format!(
                        "\"{key}\" applies only to \"type\": \"{}\"",
                        types.join("\" or \"")
                    ),
                ));
            }
        }
        let normalized = match key.as_str() {
            "type" => value.clone(),
            "description" | "title" => {
                if !value.is_string() {
                    return Err(invalid(path, &format!("\"{key}\" must be a string")));
                }
                value.clone()
            }
            "properties" => {
                let Some(props) = value.as_object() else {
                    return Err(invalid(path, "\"properties\" must be an object of schemas"));
                };
                let mut normalized = Map::new();
                for (name, sub) in props {
                    let len = path.len();
                    path.push_str("/properties/");
                    push_pointer_escaped(path, name);
                    normalized.insert(name.clone(), normalize(sub, path, depth + 1)?);
                    path.truncate(len);
                }
                Value::Object(normalized)
            }
            "items" => {
                let len = path.len();
                path.push_str("/items");
                let normalized = normalize(value, path, depth + 1)?;
                path.truncate(len);
                normalized
            }
            "required" => {
                check_required(obj, value, path)?;
                value.clone()
            }
            "additionalProperties" => {
                if !value.is_boolean() {
                    return Err(invalid(
                        path,
                        "\"additionalProperties\" must be true or false (schemas are not supported)",
                    ));
                }
                value.clone()
            }
            "enum" => {
                if value.as_array().is_none_or(Vec::is_empty) {
                    return Err(invalid(path, "\"enum\" must be a non-empty array"));
                }
                value.clone()
            }
            "minLength" | "maxLength" | "maxItems" => {
                if value.as_u64().is_none() {
                    return Err(invalid(
                        path,
                        &format!("\"{key}\" must be a non-negative integer"),
                    ));
                }
                value.clone()
            }
            "minimum" | "maximum" => {
                if !value.as_f64().is_some_and(f64::is_finite) {
                    return Err(invalid(path, &format!("\"{key}\" must be a finite number")));
                }
                value.clone()
            }
            "anyOf" => nullable(obj, value, path, depth)?,
            "format" => {
                if value.as_str() != Some("email") {
                    return Err(invalid(path, "the only supported \"format\" is \"email\""));
                }
                value.clone()
            }
            other => {
                return Err(invalid(
                    path,
                    &format!(
                        "unsupported keyword \"{other}\"; supported: type, properties, required, \
                         items, enum, minLength, maxLength, minimum, maximum, maxItems, \
                         format (email), additionalProperties (boolean), anyOf (a value that may \
                         be null), description, title"
                    ),
                ))
            }
        };
        out.insert(key.clone(), normalized);
    }

    // Checked after the keywords, so a schema like {"$ref": ...} is told about
    // the unsupported keyword rather than about its missing type.
    if ty.is_none() && !obj.contains_key("enum") && !obj.contains_key("anyOf") {
        return Err(invalid(
            path,
            "declare a \"type\" (or an \"enum\"): an untyped schema accepts any value",
        ));
    }
    check_range(obj, "minLength", "maxLength", path)?;
    check_range(obj, "minimum", "maximum", path)?;
    if ty == Some("object") && !out.contains_key("additionalProperties") {
        out.insert("additionalProperties".to_owned(), Value::Bool(false));
    }
    Ok(Value::Object(out))
}

/// `anyOf` in the one form keyturn checks: a value that may also be null,
/// `[<schema>, {"type": "null"}]` in either order, with no `type` or `enum`
/// beside it (the form Pydantic and the MCP SDKs give an optional argument).
/// Any other union is refused: it is a constraint keyturn would not check.
fn nullable(
    obj: &Map<String, Value>,
    value: &Value,
    path: &mut String,
    depth: usize,
) -> Result<Value, CoreError> {
    let null = json!({"type": "null"});
    let refuse = || {
        invalid(
            path,
            "\"anyOf\" is supported only as [<schema>, {\"type\": \"null\"}] (a value that may be null), \
             without \"type\" or \"enum\" beside it",
        )
    };
    let Some(branches) = value.as_array() else {
        return Err(refuse());
    };
    if branches.len() != 2
        || obj.contains_key("type")
        || obj.contains_key("enum")
        || branches.iter().filter(|b| **b == null).count() != 1
    {
        return Err(refuse());
    }
    let mut out = Vec::with_capacity(2);
    for (i, branch) in branches.iter().enumerate() {
        if *branch == null {
            out.push(null.clone());
            continue;
        }
        let len = path.len();
        path.push_str(&format!("/anyOf/{i}"));
        let normalized = normalize(branch, path, depth + 1)?;
        path.truncate(len);
        out.push(normalized);
    }
    Ok(Value::Array(out))
}

fn check_required(obj: &Map<String, Value>, value: &Value, path: &str) -> Result<(), CoreError> {
    let Some(names) = value.as_array() else {
        return Err(invalid(
            path,
            "\"required\" must be an array of property names",
        ));
    };
    let props = obj.get("properties").and_then(Value::as_object);
    for (i, name) in names.iter().enumerate() {
        let Some(name) = name.as_str() else {
            return Err(invalid(
                path,
                "\"required\" must be an array of property names",
            ));
        };
        if !props.is_some_and(|p| p.contains_key(name)) {
            return Err(invalid(
                path,
                &format!("required property \"{name}\" is not declared in \"properties\""),
            ));
        }
        if names[..i].iter().any(|n| n.as_str() == Some(name)) {
            return Err(invalid(
                path,
                &format!("\"{name}\" is listed twice in \"required\""),
            ));
        }
    }
    Ok(())
}

fn check_range(
    obj: &Map<String, Value>,
    min: &str,
    max: &str,
    path: &str,
) -> Result<(), CoreError> {
    let bound = |k: &str| obj.get(k).and_then(Value::as_f64);
    if let (Some(lo), Some(hi)) = (bound(min), bound(max)) {
        if lo > hi {
            return Err(invalid(
                path,
                &format!("\"{min}\" is greater than \"{max}\""),
            ));
        }
    }
    Ok(())
}

/// RFC 6901: `~` → `~0`, `/` → `~1`.
fn push_pointer_escaped(path: &mut String, name: &str) {
    for c in name.chars() {
        match c {
            '~' => path.push_str("~0"),
            '/' => path.push_str("~1"),
            c => path.push(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn email_schema() -> Value {
        json!({
            "type": "object",
            "properties": {
                "to": {"type": "string", "format": "email"},
                "subject": {"type": "string", "minLength": 1, "maxLength": 10},
                "priority": {"enum": ["low", "high"]},
                "count": {"type": "integer", "minimum": 1, "maximum": 5},
                "ratio": {"type": "number", "minimum": 0, "maximum": 1},
                "urgent": {"type": "boolean"},
                "cc": {"type": "array", "maxItems": 2, "items": {"type": "string", "format": "email"}},
                "meta": {"type": "object", "properties": {"k": {"type": "string"}}}
            },
            "required": ["to", "subject"],
            "description": "send an email"
        })
    }

    fn compiled() -> CompiledSchema {
        compile(&check_schema(&email_schema()).unwrap()).unwrap()
    }

    macro_rules! schema_invalid {
        ($($name:ident: $schema:expr => $needle:expr,)*) => {$(
            #[test]
            fn $name() {
                match check_schema(&$schema) {
                    Err(CoreError::InvalidSchema(msg)) => assert!(msg.contains($needle), "{msg}"),
                    other => panic!("{other:?}"),
                }
            }
        )*};
    }

    schema_invalid! {
        test_schema_not_object: json!([]) => "must be a JSON object",
        test_top_not_object_type: json!({"type": "string"}) => "top level",
        test_top_without_type: json!({"properties": {}}) => "top level",
        test_unknown_keyword: json!({"type": "object", "pattern": "x"}) => "unsupported keyword \"pattern\"",
        test_ref_refused: json!({"type": "object", "properties": {"a": {"$ref": "#"}}}) => "at /properties/a: unsupported keyword \"$ref\"",
        test_union_refused: json!({"type": "object", "properties": {"a": {"anyOf": [{"type": "string"}, {"type": "integer"}]}}}) => "at /properties/a: \"anyOf\" is supported only as",
        test_nullable_branch_checked: json!({"type": "object", "properties": {"a": {"anyOf": [{"type": "null"}, {"type": "string", "pattern": "x"}]}}}) => "at /properties/a/anyOf/1: unsupported keyword \"pattern\"",
        test_one_of_refused: json!({"type": "object", "oneOf": []}) => "\"oneOf\"",
        test_type_array_refused: json!({"type": "object", "properties": {"a": {"type": ["string", "null"]}}}) => "one string",
        test_type_unknown: json!({"type": "object", "properties": {"a": {"type": "null"}}}) => "one string",
        test_untyped_subschema: json!({"type": "object", "properties": {"a": {}}}) => "at /properties/a: declare a \"type\"",
        test_properties_not_object: json!({"type": "object", "properties": []}) => "\"properties\" must be an object",
        test_required_undeclared: json!({"type": "object", "properties": {}, "required": ["x"]}) => "\"x\" is not declared",
        test_required_not_strings: json!({"type": "object", "properties": {}, "required": [1]}) => "array of property names",
        test_required_twice: json!({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a", "a"]}) => "listed twice",
        test_items_tuple_refused: json!({"type": "object", "properties": {"a": {"type": "array", "items": [{"type": "string"}]}}}) => "at /properties/a/items: a schema must be a JSON object",
        test_enum_empty: json!({"type": "object", "properties": {"a": {"enum": []}}}) => "non-empty array",
        test_negative_max_length: json!({"type": "object", "properties": {"a": {"type": "string", "maxLength": -1}}}) => "non-negative integer",
        test_fractional_max_items: json!({"type": "object", "properties": {"a": {"type": "array", "maxItems": 1.5}}}) => "non-negative integer",
        test_min_length_above_max: json!({"type": "object", "properties": {"a": {"type": "string", "minLength": 5, "maxLength": 2}}}) => "\"minLength\" is greater",
        test_minimum_above_maximum: json!({"type": "object", "properties": {"a": {"type": "number", "minimum": 5, "maximum": 2}}}) => "\"minimum\" is greater",
        test_minimum_not_number: json!({"type": "object", "properties": {"a": {"type": "number", "minimum": "1"}}}) => "finite number",
        test_format_not_email: json!({"type": "object", "properties": {"a": {"type": "string", "format": "uri"}}}) => "only supported \"format\"",
        test_additional_properties_schema: json!({"type": "object", "additionalProperties": {"type": "string"}}) => "true or false",
        test_keyword_wrong_type: json!({"type": "object", "properties": {"a": {"type": "string", "minimum": 1}}}) => "\"minimum\" applies only to \"type\": \"number\" or \"integer\"",
        test_max_items_on_object: json!({"type": "object", "maxItems": 1}) => "\"maxItems\" applies only",
        test_description_not_string: json!({"type": "object", "description": 1}) => "\"description\" must be a string",
        test_pointer_escaping_in_path: json!({"type": "object", "properties": {"a/b": {"type": "x"}}}) => "at /properties/a~1b:",
    }

    #[test]
    fn test_failures_without_values_name_the_path_and_keyword_only() {
        let c = compile(
            &check_schema(&json!({"type": "object", "properties": {
                "code": {"type": "string", "enum": ["1111", "2222"]},
                "to": {"type": "string", "format": "email"}}}))
            .unwrap(),
        )
        .unwrap();
        let params = json!({"code": "47219999", "to": "secret-list@x.example y"});
        let loud = c.validate(&params).unwrap_err().to_string();
        assert!(
            loud.contains("47219999"),
            "validate quotes the value: {loud}"
        );
        let quiet = c.validate_without_values(&params).unwrap_err().to_string();
        for secret in ["47219999", "secret-list"] {
            assert!(!quiet.contains(secret), "{secret} is withheld: {quiet}");
        }
        assert!(quiet.contains("/code: fails the schema's enum"), "{quiet}");
        assert!(quiet.contains("/to: fails the schema's format"), "{quiet}");
    }

    #[test]
    fn test_empty_schema_means_no_params() {
        let s = check_schema(&json!({})).unwrap();
        assert_eq!(
            s,
            json!({"type": "object", "properties": {}, "additionalProperties": false})
        );
        let c = compile(&s).unwrap();
        assert!(c.validate(&json!({})).is_ok());
        assert!(c.validate(&json!({"x": 1})).is_err());
    }

    #[test]
    fn test_additional_properties_defaults_to_false_at_every_level() {
        let s = check_schema(&email_schema()).unwrap();
        assert_eq!(s["additionalProperties"], json!(false));
        assert_eq!(
            s["properties"]["meta"]["additionalProperties"],
            json!(false)
        );
        assert_eq!(s["properties"]["to"].get("additionalProperties"), None);
        let c = compile(&s).unwrap();
        let err = c
            .validate(&json!({"to": "a@example.com", "subject": "hi", "bcc": "x@example.com"}))
            .unwrap_err();
        assert!(
            matches!(&err, CoreError::InvalidParams(v) if v.len() == 1 && v[0].starts_with("(root): ") && v[0].contains("bcc")),
            "{err}"
        );
        let err = c
            .validate(&json!({"to": "a@example.com", "subject": "hi", "meta": {"k": "v", "z": 1}}))
            .unwrap_err();
        assert!(
            matches!(&err, CoreError::InvalidParams(v) if v[0].starts_with("/meta: ")),
            "{err}"
        );
    }

    #[test]
    fn test_explicit_additional_properties_true_is_kept() {
        let s = check_schema(&json!({"type": "object", "additionalProperties": true})).unwrap();
        assert!(compile(&s)
            .unwrap()
            .validate(&json!({"anything": 1}))
            .is_ok());
    }

    #[test]
    fn test_normalization_is_idempotent() {
        let once = check_schema(&email_schema()).unwrap();
        assert_eq!(check_schema(&once).unwrap(), once);
    }

    #[test]
    fn test_compile_renormalizes_a_stripped_schema() {
        // A stored schema that lost its additionalProperties must not widen.
        let c = compile(&json!({"type": "object", "properties": {}})).unwrap();
        assert!(c.validate(&json!({"x": 1})).is_err());
    }

    #[test]
    fn test_valid_params_pass() {
        let c = compiled();
        for params in [
            json!({"to": "ann@example.com", "subject": "hi"}),
            json!({"to": "a.b+c@sub.example.org", "subject": "0123456789", "priority": "low",
                   "count": 5, "ratio": 0.5, "urgent": false, "cc": ["x@example.com"], "meta": {"k": "v"}}),
            json!({"to": "ann@example.com", "subject": "x", "count": 1.0}),
        ] {
            assert_eq!(c.validate(&params), Ok(()), "{params}");
        }
    }

    /// `name: params => JSON pointer that must be reported`.
    macro_rules! params_invalid {
        ($($name:ident: $params:expr => $pointer:expr,)*) => {$(
            #[test]
            fn $name() {
                match compiled().validate(&$params) {
                    Err(CoreError::InvalidParams(errors)) => assert!(
                        errors.iter().any(|e| e.starts_with(concat!($pointer, ": "))),
                        "{errors:?}"
                    ),
                    other => panic!("{other:?}"),
                }
            }
        )*};
    }

    params_invalid! {
        test_params_not_object: json!([1]) => "(root)",
        test_missing_required: json!({"to": "ann@example.com"}) => "(root)",
        test_wrong_type_string: json!({"to": "ann@example.com", "subject": 5}) => "/subject",
        test_format_email_rejects_non_email: json!({"to": "not an email", "subject": "hi"}) => "/to",
        test_format_email_rejects_missing_domain: json!({"to": "ann@", "subject": "hi"}) => "/to",
        test_attack_format_email_rejects_display_name: json!({"to": "\"ann@acme.com   \" <attacker@evil.example>", "subject": "hi"}) => "/to",
        test_attack_format_email_rejects_name_addr: json!({"to": "Ann <ann@acme.com>", "subject": "hi"}) => "/to",
        test_attack_format_email_rejects_quoted_local_part: json!({"to": "\"ann smith\"@acme.com", "subject": "hi"}) => "/to",
        test_attack_format_email_rejects_ip_literal: json!({"to": "ann@[127.0.0.1]", "subject": "hi"}) => "/to",
        test_attack_format_email_rejects_look_alike_letters: json!({"to": "ann@\u{0430}cme.com", "subject": "hi"}) => "/to",
        test_attack_format_email_rejects_bad_item: json!({"to": "ann@acme.com", "subject": "hi", "cc": ["Bob <b@acme.com>"]}) => "/cc/0",
        test_min_length: json!({"to": "ann@example.com", "subject": ""}) => "/subject",
        test_max_length: json!({"to": "ann@example.com", "subject": "01234567890"}) => "/subject",
        test_enum: json!({"to": "ann@example.com", "subject": "hi", "priority": "urgent"}) => "/priority",
        test_integer_rejects_fraction: json!({"to": "ann@example.com", "subject": "hi", "count": 1.5}) => "/count",
        test_minimum: json!({"to": "ann@example.com", "subject": "hi", "count": 0}) => "/count",
        test_maximum: json!({"to": "ann@example.com", "subject": "hi", "ratio": 1.01}) => "/ratio",
        test_boolean: json!({"to": "ann@example.com", "subject": "hi", "urgent": "yes"}) => "/urgent",
        test_max_items: json!({"to": "ann@example.com", "subject": "hi", "cc": ["a@example.com", "b@example.com", "c@example.com"]}) => "/cc",
        test_items_format: json!({"to": "ann@example.com", "subject": "hi", "cc": ["a@example.com", "nope"]}) => "/cc/1",
        test_big_integer_over_maximum: json!({"to": "ann@example.com", "subject": "hi", "count": 18446744073709551616u128}) => "/count",
    }

    #[test]
    fn test_every_failure_is_reported() {
        let err = compiled()
            .validate(&json!({"to": "nope", "subject": "", "urgent": 1}))
            .unwrap_err();
        let CoreError::InvalidParams(errors) = err else {
            panic!("{err:?}")
        };
        let mut pointers: Vec<&str> = errors.iter().filter_map(|e| e.split(": ").next()).collect();
        pointers.sort_unstable();
        assert_eq!(pointers, ["/subject", "/to", "/urgent"]);
    }

    #[test]
    fn test_failure_report_is_capped() {
        let s = check_schema(&json!({"type": "object", "properties": {
            "a": {"type": "array", "items": {"type": "string"}}}}))
        .unwrap();
        let params = json!({"a": vec![1; 1000]});
        let Err(CoreError::InvalidParams(errors)) = compile(&s).unwrap().validate(&params) else {
            panic!("expected InvalidParams")
        };
        assert_eq!(errors.len(), MAX_REPORTED_ERRORS + 1);
        assert_eq!(errors.last().map(String::as_str), Some("and 968 more"));
    }

    #[test]
    fn test_long_messages_are_clipped() {
        let s = check_schema(&json!({"type": "object", "properties": {"a": {"type": "integer"}}}))
            .unwrap();
        let Err(CoreError::InvalidParams(errors)) = compile(&s)
            .unwrap()
            .validate(&json!({"a": "x".repeat(10_000)}))
        else {
            panic!("expected InvalidParams")
        };
        assert_eq!(errors[0].chars().count(), MAX_ERROR_CHARS + 1);
        assert!(errors[0].ends_with('…'));
    }
}
