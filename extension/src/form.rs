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

use crate::error::KeyturnError;
use crate::jsonb_text::{JsonbText, RawJsonb};
use crate::loose_type::Kind;

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
    let type_of = |k: &str| column_type(&types, k);
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
                keyturn_core::text::quoted(k),
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
                keyturn_core::text::quoted(k),
                set_columns.join(", ")
            ));
        }
        // A column without a type is not refused here (the plpgsql check's
        // NULL comparison); register_tool gives every column one.
        if matches!(v, Value::Object(_) | Value::Array(_)) {
            if let Some(t) = type_of(k).filter(|_| !json_column(&types, k)) {
                return Some(format!("params.set.{k} must be a scalar for a {t} column"));
            }
        }
    }
    // Values a type would store as another, or read otherwise than a person
    // reads them ([`inexact`]): the card shows what was proposed, so they
    // are refused here (docs/security.md, row 126). A sized column's, an
    // array's and an interval's are `_form_fit`'s.
    for (part, values) in [("where", wheres), ("set", sets)] {
        for (k, v) in in_jsonb_order(values) {
            let Some(t) = type_of(k).filter(|t| !t.is_empty()) else {
                continue;
            };
            let kind = crate::loose_type::loose(&t).kind;
            let items = match v {
                Value::Array(items) => items.iter().collect(),
                v => vec![v],
            };
            if let Some(why) = items.into_iter().find_map(|item| inexact(kind, item)) {
                return Some(format!("params.{part}.{k} {why} (a {t} column)"));
            }
        }
    }
    None
}

/// Why `value` would not be stored as it reads, or would be read otherwise
/// than a person reads it, in a column of `kind`. Dates and times are taken
/// in ISO 8601 form only (`2026-06-01`, `09:00:00.5`, `2026-06-01T09:00:00Z`,
/// an offset only for a type with a zone): PostgreSQL also reads words (`now`
/// when the write runs, `GMT+03:00` with the POSIX sign, a zone name a
/// `timestamp` drops) and rounds past the microsecond. Floats are taken as
/// decimal numbers the type holds exactly. Arrays and intervals are checked
/// against their printed form (`_form_fit`).
fn inexact(kind: Kind, value: &Value) -> Option<&'static str> {
    let text = match value {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        _ => return None,
    };
    let infinite = |t: &str| matches!(t, "infinity" | "-infinity");
    match kind {
        Kind::Exact | Kind::Json | Kind::Array | Kind::Interval => None,
        Kind::Date => (!infinite(&text) && iso_date(&text).is_none_or(|rest| !rest.is_empty()))
            .then_some("is no date in ISO 8601 form (2026-06-01)"),
        Kind::Time { with_zone } => (!iso_time(&text, with_zone))
            .then_some("is no time in ISO 8601 form (09:00, 09:00:00.5, with an offset such as +02:00 only for a time with a zone; at most six digits after the point)"),
        Kind::Timestamp { with_zone } => (!infinite(&text)
            && !iso_date(&text).is_some_and(|rest| {
                rest.is_empty()
                    || rest
                        .strip_prefix(['T', ' '])
                        .is_some_and(|time| iso_time(time, with_zone))
            }))
        .then_some("is no timestamp in ISO 8601 form (2026-06-01 09:00:00, with an offset such as Z or +02:00 only for a timestamp with a zone; at most six digits after the point)"),
        Kind::Float4 | Kind::Float8 => {
            if matches!(text.to_ascii_lowercase().as_str(), "nan" | "infinity" | "-infinity") {
                return None;
            }
            let Some(literal) = decimal_literal(&text) else {
                return Some("is no decimal number (digits, a point, an exponent)");
            };
            let number = literal.parse::<serde_json::Number>().ok()?;
            if keyturn_core::canonical::scalar_text(&Value::Number(number)).is_err() {
                return Some(
                    "is no double-precision number exactly, and would be stored as the nearest one",
                );
            }
            if kind == Kind::Float4 {
                let (wide, narrow) = (literal.parse::<f64>().ok()?, literal.parse::<f32>().ok()?);
                if !narrow.is_finite() || narrow.to_string().parse::<f64>().ok() != Some(wide) {
                    return Some("is no real (single-precision) number exactly, and would be stored as the nearest one");
                }
            }
            None
        }
    }
}

/// `text` as a JSON number literal when it is a plain decimal number
/// (`-12.5e3`; also `+1`, `.5`, `1.` and leading zeros, which PostgreSQL's
/// float input reads alike); None for anything else (hex, words, spaces).
fn decimal_literal(text: &str) -> Option<String> {
    let (sign, rest) = match text.strip_prefix('-') {
        Some(rest) => ("-", rest),
        None => ("", text.strip_prefix('+').unwrap_or(text)),
    };
    let (mantissa, exponent) = match rest.split_once(['e', 'E']) {
        Some((m, e)) => (m, Some(e)),
        None => (rest, None),
    };
    let (whole, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    let exponent_ok = exponent.is_none_or(|e| {
        let e = e.strip_prefix(['+', '-']).unwrap_or(e);
        !e.is_empty() && digits(e)
    });
    if (whole.is_empty() && fraction.is_empty())
        || !digits(whole)
        || !digits(fraction)
        || !exponent_ok
    {
        return None;
    }
    let whole = whole.trim_start_matches('0');
    let mut literal = format!("{sign}{}", if whole.is_empty() { "0" } else { whole });
    if !fraction.is_empty() {
        literal = format!("{literal}.{fraction}");
    }
    if let Some(e) = exponent {
        literal = format!("{literal}e{e}");
    }
    Some(literal)
}

/// After an ISO 8601 date at the start of `text` (`YYYY-MM-DD`), the rest.
fn iso_date(text: &str) -> Option<&str> {
    let b = text.as_bytes();
    let digits =
        |r: std::ops::Range<usize>| b.get(r).is_some_and(|s| s.iter().all(u8::is_ascii_digit));
    (digits(0..4)
        && b.get(4) == Some(&b'-')
        && digits(5..7)
        && b.get(7) == Some(&b'-')
        && digits(8..10))
    .then(|| &text[10..])
}

/// Whether `text` is an ISO 8601 time (`HH:MM`, `HH:MM:SS`, `HH:MM:SS.ffffff`),
/// with an offset (`Z`, `+HH`, `+HH:MM`, `+HHMM`) only when `with_zone`.
fn iso_time(text: &str, with_zone: bool) -> bool {
    let (time, offset) = match text.find(['Z', '+', '-']) {
        Some(at) => text.split_at(at),
        None => (text, ""),
    };
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let two = |s: &str| s.len() == 2 && digits(s);
    let mut parts = time.splitn(3, ':');
    let (Some(h), Some(m)) = (parts.next(), parts.next()) else {
        return false;
    };
    let seconds_ok = match parts.next() {
        None => true,
        Some(s) => match s.split_once('.') {
            Some((whole, fraction)) => two(whole) && digits(fraction) && fraction.len() <= 6,
            None => two(s),
        },
    };
    let offset_ok = match offset {
        "" => true,
        "Z" => with_zone,
        o => {
            let o = &o[1..];
            with_zone
                && (two(o)
                    || (o.len() == 4 && digits(o))
                    || o.split_once(':').is_some_and(|(a, b)| two(a) && two(b)))
        }
    };
    two(h) && two(m) && seconds_ok && offset_ok
}

/// The WHERE clause of an sql tool's form over the row alias `t`, as propose
/// and approve splice it into their statements: each column of `where`, in
/// byte order (as COLLATE "C"), compared with its value read from the jsonb
/// parameter `$1` (never from the statement text); a list with `= ANY`.
/// Column names come only from a form `_form_problem` has passed.
///
/// Rust, not plpgsql: the loop over the keys was a statement the executor
/// started and ended in every propose and every approve.
#[pg_extern(name = "_where_clause", immutable, parallel_safe)]
fn where_clause(types: Option<JsonbText>, form: Option<JsonbText>) -> String {
    let types = read("the tool's column types", types);
    let form = read("the form", form);
    let Some(wheres) = form.get("where").and_then(Value::as_object) else {
        return String::new();
    };
    let mut keys: Vec<&String> = wheres.keys().collect();
    keys.sort();
    keys.iter()
        .map(|&k| {
            if wheres[k].is_array() {
                let t = value_type(&types, k);
                format!(
                    "t.{} = ANY (ARRAY(SELECT jsonb_array_elements_text($1->'where'->{}))::{t}[])",
                    quote_ident(k),
                    quote_literal(k)
                )
            } else {
                format!("t.{} = {}", quote_ident(k), form_value(&types, "where", k))
            }
        })
        .collect::<Vec<_>>()
        .join(" AND ")
}

/// The parts of an sql tool's UPDATE made of its form's `set`, each column
/// in byte order: the SET list, the postcondition over the updated row `u`,
/// and the columns RETURNING names (`{sets, checks, columns}`).
#[pg_extern(name = "_set_clauses", immutable, parallel_safe)]
fn set_clauses(types: Option<JsonbText>, form: Option<JsonbText>) -> Vec<String> {
    let types = read("the tool's column types", types);
    let form = read("the form", form);
    let mut keys: Vec<&String> = form
        .get("set")
        .and_then(Value::as_object)
        .map(|sets| sets.keys().collect())
        .unwrap_or_default();
    keys.sort();
    let each = |f: &dyn Fn(&str) -> String, sep: &str| {
        keys.iter().map(|k| f(k)).collect::<Vec<_>>().join(sep)
    };
    vec![
        each(
            &|k| format!("{} = {}", quote_ident(k), form_value(&types, "set", k)),
            ", ",
        ),
        each(
            &|k| {
                // Compared as what the person saw: an interval's `=` counts a
                // month as 30 days, json has no `=`.
                let cast = match column_type(&types, k).filter(|t| !t.is_empty()) {
                    Some(t) => match crate::loose_type::loose(&t).kind {
                        Kind::Json => "::pg_catalog.jsonb",
                        Kind::Time { .. }
                        | Kind::Timestamp { .. }
                        | Kind::Interval
                        | Kind::Array => "::pg_catalog.text",
                        _ => "",
                    },
                    None => "",
                };
                format!(
                    "(u.{}{cast} IS NOT DISTINCT FROM {}{cast})",
                    quote_ident(k),
                    form_value(&types, "set", k)
                )
            },
            " AND ",
        ),
        each(&|k| format!("t.{}", quote_ident(k)), ", "),
    ]
}

/// The `key` of each row an sql tool's write returned (`[{"key", "ok"}]`),
/// or of those whose postcondition failed (`failed_only`); NULL for none.
#[pg_extern(name = "_written_keys", immutable, parallel_safe)]
fn written_keys(rows: Option<JsonbText>, failed_only: bool) -> Option<RawJsonb> {
    let rows = read("the written rows", rows);
    let keys: Vec<&Value> = rows
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| !failed_only || r.get("ok") == Some(&Value::Bool(false)))
        .map(|r| r.get("key").unwrap_or(&Value::Null))
        .collect();
    if keys.is_empty() {
        return None;
    }
    Some(RawJsonb::parse(
        &Value::from(keys.into_iter().cloned().collect::<Vec<_>>()).to_string(),
    ))
}

/// Why `table` cannot be a tool's table now, or NULL: it must be an
/// ordinary or partitioned table (a view or a name that is gone is not),
/// owned by a role that is no agent's (crate::privilege::owned_by_agent).
/// Catalog cache lookups, no statement: propose, approve and read ask it
/// at every use.
#[pg_extern(name = "_table_problem", stable, parallel_safe)]
fn table_problem(table: Option<pg_sys::Oid>) -> Option<&'static str> {
    let Some(table) = table else {
        return Some("does not exist");
    };
    // SAFETY: a syscache lookup; '\0' for an OID that names no relation.
    let kind = unsafe { pg_sys::get_rel_relkind(table) } as u8;
    if kind != pg_sys::RELKIND_RELATION && kind != pg_sys::RELKIND_PARTITIONED_TABLE {
        return Some("does not exist (or is no table)");
    }
    crate::privilege::owned_by_agent(table).then_some(
        "is owned by an agent's role, whose code would run inside the approved write and read past row-level security",
    )
}

/// [`form_value`] for SQL (`keyturn._form_value`).
#[pg_extern(name = "_value_expr", immutable, parallel_safe)]
fn value_expr(types: Option<JsonbText>, part: &str, column: &str) -> String {
    form_value(&read("the tool's column types", types), part, column)
}

/// A form's value as the column's type without its size (crate::loose_type),
/// read from `$1` (the canonical form `_form_arg` made of what was hashed):
/// `->` for a json or jsonb column.
fn form_value(types: &Value, part: &str, column: &str) -> String {
    let arrow = if json_column(types, column) {
        "->"
    } else {
        "->>"
    };
    format!(
        "($1->{}{arrow}{})::{}",
        quote_literal(part),
        quote_literal(column),
        value_type(types, column)
    )
}

/// The statements that check `form`'s values against their columns, one a
/// value a cast must check: each answers one jsonb row, `part.column` when
/// the value would be stored as another (cut, padded past what compares
/// equal, rounded) or, for an array or an interval, is not written as
/// PostgreSQL prints it (one printed form, which the card then shows); NULL
/// when it fits. None for a form with no such value. A cast may also raise
/// (a value too large for its column, a bit string of another length): its
/// statement alone fails, and propose runs each in a block of its own, so a
/// value that raises hides no other. Run by propose
/// (`keyturn._resolve_targets`), as the proposer, with `_form_arg`'s argument.
#[pg_extern(name = "_form_fit", immutable, parallel_safe)]
fn form_fit(types: Option<JsonbText>, form: Option<JsonbText>) -> Option<Vec<String>> {
    let types = read("the tool's column types", types);
    let form = read("the form", form);
    let mut checks = Vec::new();
    for part in ["where", "set"] {
        let Some(values) = form.get(part).and_then(Value::as_object) else {
            continue;
        };
        let mut keys: Vec<&String> = values.keys().collect();
        keys.sort();
        for k in keys {
            let declared = column_type(&types, k).unwrap_or_default();
            if declared.is_empty() {
                continue;
            }
            let loose = crate::loose_type::loose(&declared);
            let same = match loose.kind {
                Kind::Json => continue,
                // One printed form: an interval's `=` counts a month as 30
                // days (an `interval year` that dropped 11 months and -330
                // days compares equal), and an array's elements are read by
                // their own rules.
                Kind::Array | Kind::Interval => |v: &str, declared: &str, _: &str| {
                    format!("({v})::{declared}::pg_catalog.text IS NOT DISTINCT FROM ({v})")
                },
                _ if !loose.sized => continue,
                Kind::Time { .. } | Kind::Timestamp { .. } => {
                    |v: &str, declared: &str, loose: &str| {
                        format!("({v})::{declared}::pg_catalog.text IS NOT DISTINCT FROM ({v})::{loose}::pg_catalog.text")
                    }
                }
                _ => |v: &str, declared: &str, loose: &str| {
                    format!("({v})::{declared} IS NOT DISTINCT FROM ({v})::{loose}")
                },
            };
            let (part_q, k_q) = (quote_literal(part), quote_literal(k));
            let fits = if values[k].is_array() {
                format!(
                    "(SELECT pg_catalog.bool_and({}) \
                       FROM pg_catalog.jsonb_array_elements_text($1->{part_q}->{k_q}) AS e)",
                    same("e", &declared, &loose.name)
                )
            } else {
                format!(
                    "({})",
                    same(&format!("$1->{part_q}->>{k_q}"), &declared, &loose.name)
                )
            };
            checks.push(format!(
                "SELECT pg_catalog.to_jsonb(CASE WHEN NOT {fits} THEN {} END)",
                quote_literal(&format!("{part}.{k}"))
            ));
        }
    }
    (!checks.is_empty()).then_some(checks)
}

fn json_column(types: &Value, column: &str) -> bool {
    column_type(types, column)
        .filter(|t| !t.is_empty())
        .is_some_and(|t| crate::loose_type::loose(&t).kind == Kind::Json)
}

/// The type a form's value is read in: its column's, without the size.
fn value_type(types: &Value, column: &str) -> String {
    match column_type(types, column) {
        Some(t) if !t.is_empty() => crate::loose_type::loose(&t).name,
        _ => String::new(),
    }
}

/// A column's type as `sql_types ->> column` gives it: a string's text, else
/// the JSON; None when it has none.
fn column_type(types: &Value, column: &str) -> Option<String> {
    types.get(column).and_then(|t| match t {
        Value::Null => None,
        Value::String(s) => Some(s.clone()),
        other => Some(other.to_string()),
    })
}

/// A jsonb argument keyturn itself made or admitted (NULL reads as null).
fn read(what: &str, j: Option<JsonbText>) -> Value {
    match j.map(|j| keyturn_core::canonical::parse_bounded(&j.0)) {
        None => Value::Null,
        Some(Ok(v)) => v,
        Some(Err(e)) => KeyturnError::InvalidArgument {
            message: format!("{what} cannot be read: {e}"),
            hint: "The form is checked at propose; this one was not.",
        }
        .raise(),
    }
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

/// jsonb holds no NUL, so only a hand-made call gets here; a name is
/// never let through unquoted.
fn nul_in_name() -> ! {
    KeyturnError::InvalidArgument {
        message: "a column name or value holds a NUL character".into(),
        hint: "Column names and form keys are text without NUL.",
    }
    .raise()
}

/// PostgreSQL's quote_literal.
fn quote_literal(text: &str) -> String {
    // SAFETY: quote_literal_cstr reads a NUL-terminated string and returns a
    // palloc'd quoted copy.
    quoted(text, |c| unsafe { pg_sys::quote_literal_cstr(c) })
}

/// PostgreSQL's quote_ident.
fn quote_ident(name: &str) -> String {
    // SAFETY: quote_identifier reads a NUL-terminated string and returns it
    // or a palloc'd quoted copy.
    quoted(name, |c| unsafe { pg_sys::quote_identifier(c) })
}

/// `text` as one of PostgreSQL's quoting functions returns it, read before
/// the memory context that holds the copy ends.
fn quoted(
    text: &str,
    quote: impl FnOnce(*const std::ffi::c_char) -> *const std::ffi::c_char,
) -> String {
    let c = std::ffi::CString::new(text).unwrap_or_else(|_| nul_in_name());
    // SAFETY: `quote` returns a NUL-terminated string that lives in the
    // current memory context, which outlasts this read.
    unsafe { std::ffi::CStr::from_ptr(quote(c.as_ptr())) }
        .to_string_lossy()
        .into_owned()
}
