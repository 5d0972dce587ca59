//! What is wrong with an sql tool's form, `{"where": {col: value | [values]},
//! "set": {col: value}}`, for the tool version's columns: checked at propose
//! and again at approve (sql/050_propose.sql, `keyturn._form_error`). A
//! problem is returned, not raised, so approve's recheck needs no
//! subtransaction to record it.
//!
//! Rust, not plpgsql: it runs in every propose and every approve of an sql
//! tool, and as plpgsql each run started the executor for six statements
//! over the form's keys.

use pgrx::prelude::*;
use serde_json::{Map, Value};

use crate::jsonb_text::JsonbText;

/// The first problem of `form`, or NULL; the keys of `where` and `set` are
/// taken in jsonb's order (shorter first, then by bytes), so the problem
/// named is the one the plpgsql check named.
///
/// Not strict: a tool version missing its columns (only a hand edit of the
/// catalog makes one) lets no key through, rather than every form.
#[pg_extern(name = "_form_problem", immutable, parallel_safe)]
fn form_problem(
    tool: Option<&str>,
    where_columns: Option<Vec<Option<String>>>,
    set_columns: Option<Vec<Option<String>>>,
    types: Option<JsonbText>,
    form: Option<JsonbText>,
) -> Option<String> {
    let form = form?;
    let tool = tool.unwrap_or_default();
    // Beyond the bounds no proposal's params can be hashed within either:
    // refused, never let through unread.
    let form = match keyturn_core::canonical::parse_bounded(&form.0) {
        Ok(form) => form,
        Err(e) => return Some(format!("params of sql tool {tool} cannot be read: {e}")),
    };
    let types = match types.map(|t| keyturn_core::canonical::parse_bounded(&t.0)) {
        None => Value::Null,
        Some(Ok(types)) => types,
        Some(Err(_)) => return Some(format!("tool {tool} has column types keyturn cannot read")),
    };
    // A type as `sql_types ->> k` gives it: a string's text, else the JSON.
    let type_of = |k: &str| {
        types.get(k).and_then(|t| match t {
            Value::Null => None,
            Value::String(s) => Some(s.clone()),
            other => Some(other.to_string()),
        })
    };
    let listed = |cols: Option<Vec<Option<String>>>| {
        cols.into_iter().flatten().flatten().collect::<Vec<_>>()
    };
    let (where_columns, set_columns) = (listed(where_columns), listed(set_columns));

    let Some(object) = form.as_object() else {
        return Some(shape(tool));
    };
    if !object.contains_key("where")
        || !object.contains_key("set")
        || object.keys().any(|k| k != "where" && k != "set")
    {
        return Some(shape(tool));
    }
    let (Some(wheres), Some(sets)) = (non_empty(&object["where"]), non_empty(&object["set"]))
    else {
        return Some("params.where and params.set must be non-empty objects".into());
    };
    for (k, v) in in_jsonb_order(wheres) {
        if !where_columns.iter().any(|c| c == k) {
            return Some(format!(
                "tool {tool} may not filter on {} (filterable columns: {})",
                quote_ident(k),
                where_columns.join(", ")
            ));
        }
        match v {
            Value::Array(items) => {
                if !(1..=1000).contains(&items.len()) || !items.iter().all(scalar) {
                    return Some(format!(
                        "params.where.{k} must list 1 to 1000 strings, numbers or booleans"
                    ));
                }
            }
            v if scalar(v) => {}
            _ => {
                return Some(format!(
                    "params.where.{k} must be a string, number, boolean or a list of them"
                ))
            }
        }
    }
    for (k, v) in in_jsonb_order(sets) {
        if !set_columns.iter().any(|c| c == k) {
            return Some(format!(
                "tool {tool} may not set {} (settable columns: {})",
                quote_ident(k),
                set_columns.join(", ")
            ));
        }
        // A column without a type is not refused here (the plpgsql check's
        // NULL comparison); register_tool gives every column one.
        if matches!(v, Value::Object(_) | Value::Array(_)) {
            if let Some(t) = type_of(k).filter(|t| t != "json" && t != "jsonb") {
                return Some(format!("params.set.{k} must be a scalar for a {t} column"));
            }
        }
    }
    None
}

fn shape(tool: &str) -> String {
    format!(r#"params of sql tool {tool} must be exactly {{"where": {{...}}, "set": {{...}}}}"#)
}

fn non_empty(v: &Value) -> Option<&Map<String, Value>> {
    v.as_object().filter(|o| !o.is_empty())
}

fn scalar(v: &Value) -> bool {
    matches!(v, Value::String(_) | Value::Number(_) | Value::Bool(_))
}

/// An object's members in the order jsonb keeps keys: by length, then by
/// bytes.
fn in_jsonb_order(o: &Map<String, Value>) -> Vec<(&String, &Value)> {
    let mut members: Vec<_> = o.iter().collect();
    members.sort_by(|a, b| (a.0.len(), a.0.as_bytes()).cmp(&(b.0.len(), b.0.as_bytes())));
    members
}

/// PostgreSQL's quote_ident.
fn quote_ident(name: &str) -> String {
    let Ok(c) = std::ffi::CString::new(name) else {
        return name.to_owned();
    };
    // SAFETY: quote_identifier reads a NUL-terminated string and returns it
    // or a palloc'd quoted copy, read here before the memory context ends.
    unsafe {
        std::ffi::CStr::from_ptr(pg_sys::quote_identifier(c.as_ptr()))
            .to_string_lossy()
            .into_owned()
    }
}
