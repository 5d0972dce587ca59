//! Input checks the state machine calls: credential material, receipts,
//! summary templates, the params-schema subset and notification targets.
//! The logic lives in keyturn-core; these are its SQL entry points.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use keyturn_core::{credentials, notify, schema, scope, template};
use pgrx::prelude::*;
use pgrx::JsonB;
use serde_json::Value;

use crate::error::OrRaise;
use crate::jsonb_text::JsonbText;

fn parse(json: &JsonbText) -> Value {
    // Bounded parse (depth and size): 22023 on anything unusable.
    keyturn_core::canonical::parse_bounded(&json.0).or_raise()
}

/// A notification channel's target, checked and normalized (keyturn-core
/// `notify`): 22023 for one outside its channel's rule.
#[pg_extern(name = "_notify_target", immutable, strict, parallel_safe)]
fn notify_target(channel: &str, target: &str) -> String {
    notify::normalize_target(channel, target).or_raise()
}

/// What a person is shown of a stored target (no URL path, no secret).
#[pg_extern(name = "_notify_target_hint", immutable, strict, parallel_safe)]
fn notify_target_hint(channel: &str, target: &str) -> String {
    notify::target_hint(channel, target)
}

/// A webhook channel's own secret: 22023 unless it is a `whsec_` secret.
#[pg_extern(name = "_check_webhook_secret", immutable, strict, parallel_safe)]
fn check_webhook_secret(secret: &str) {
    notify::check_webhook_secret(secret).or_raise()
}

/// Why `name` cannot name a staged file (keyturn-core `text`), or NULL.
#[pg_extern(name = "_filename_problem", immutable, strict, parallel_safe)]
fn filename_problem(name: &str) -> Option<String> {
    keyturn_core::text::filename_problem(name)
}

/// An agent's string (a tool name, an origin key or id, a path of params
/// keys) as a refusal names it: one line, clipped, in quotes
/// (`keyturn_core::text::quoted`).
#[pg_extern(name = "_quoted", immutable, strict, parallel_safe)]
fn quoted(value: &str) -> String {
    keyturn_core::text::quoted(value)
}

/// The path of the first credential-shaped key or value, or NULL.
#[pg_extern(name = "_credential_path", immutable, strict, parallel_safe)]
fn credential_path(params: JsonbText) -> Option<String> {
    credentials::find_credential(&parse(&params))
}

/// A receipt with every credential-shaped key's value and credential-shaped
/// string replaced by "[redacted]".
#[pg_extern(name = "_redact", immutable, strict, parallel_safe)]
fn redact(receipt: JsonbText) -> JsonB {
    JsonB(credentials::redact(&parse(&receipt)))
}

/// Why keyturn cannot store `receipt` (what `_redact` would raise), or NULL:
/// asked first, so that a batch answers it for its element alone.
#[pg_extern(name = "_receipt_problem", immutable, strict, parallel_safe)]
fn receipt_problem(receipt: JsonbText) -> Option<String> {
    keyturn_core::canonical::parse_bounded(&receipt.0)
        .err()
        .map(|e| format!("keyturn: the receipt cannot be stored: {e}"))
}

/// Raises 22023 unless `template` is a valid summary template.
#[pg_extern(name = "_check_template", immutable, strict, parallel_safe)]
fn check_template(template: &str) {
    template::check_template(template).or_raise()
}

/// The server-written summary: the template rendered over params.
#[pg_extern(name = "_render_summary", immutable, strict, parallel_safe)]
fn render_summary(template: &str, params: JsonbText, count: i32) -> String {
    template::render(template, &parse(&params), i64::from(count))
}

/// Validates a params_schema against the supported subset and returns it
/// normalized (additionalProperties defaulting to false).
#[pg_extern(name = "_check_params_schema", immutable, strict, parallel_safe)]
fn check_params_schema(params_schema: JsonbText) -> JsonB {
    JsonB(schema::check_schema(&parse(&params_schema)).or_raise())
}

thread_local! {
    // Compiled validators by schema text: tool versions are immutable, so a
    // backend compiles each schema once instead of once per proposal.
    static COMPILED: RefCell<HashMap<String, Rc<schema::CompiledSchema>>> = RefCell::new(HashMap::new());
}
const COMPILED_CACHE_MAX: usize = 128;

fn compiled_schema(params_schema: &JsonbText) -> Rc<schema::CompiledSchema> {
    COMPILED.with(|cache| {
        if let Some(hit) = cache.borrow().get(&params_schema.0) {
            return Rc::clone(hit);
        }
        let compiled = Rc::new(schema::compile(&parse(params_schema)).or_raise());
        let mut cache = cache.borrow_mut();
        if cache.len() >= COMPILED_CACHE_MAX {
            cache.clear();
        }
        cache.insert(params_schema.0.clone(), Rc::clone(&compiled));
        compiled
    })
}

/// NULL when params satisfy the (normalized) schema, else every violation.
#[pg_extern(name = "_params_errors", immutable, strict, parallel_safe)]
fn params_errors(params_schema: JsonbText, params: JsonbText) -> Option<String> {
    compiled_schema(&params_schema)
        .validate(&parse(&params))
        .err()
        .map(|e| e.to_string())
}

/// Everything propose checks on the params, from one parse instead of three:
/// the first credential-shaped path (when there is one, nothing else is
/// computed: propose refuses the params), the params hash (22023 as
/// `params_hash` raises it), and the violations of `params_schema` (NULL when
/// they pass, or when the schema is JSON `null`: no schema to check).
#[pg_extern(name = "_inspect_params", immutable, strict, parallel_safe)]
fn inspect_params(
    tool: &str,
    params: JsonbText,
    params_schema: JsonbText,
) -> TableIterator<
    'static,
    (
        name!(credential_path, Option<String>),
        name!(params_hash, Option<String>),
        name!(schema_errors, Option<String>),
    ),
> {
    TableIterator::once(inspect(tool, &params, &params_schema, false))
}

/// [`inspect_params`] as propose asks it, `{credential_path, params_hash,
/// schema_errors}` in one array, whose violations name no value when
/// `withhold_values` (a digest-retention tool's: the server log keeps every
/// error message). An array, so that plpgsql assigns it: `SELECT … FROM` a
/// function was a statement of every propose. Another name, not an
/// overload: until `ALTER EXTENSION UPDATE` runs, the previous version's SQL
/// calls the one above with three arguments.
#[pg_extern(name = "_inspected", immutable, strict, parallel_safe)]
fn inspected(
    tool: &str,
    params: JsonbText,
    params_schema: JsonbText,
    withhold_values: bool,
) -> Vec<Option<String>> {
    let (path, hash, errors) = inspect(tool, &params, &params_schema, withhold_values);
    vec![path, hash, errors]
}

fn inspect(
    tool: &str,
    params: &JsonbText,
    params_schema: &JsonbText,
    withhold_values: bool,
) -> (Option<String>, Option<String>, Option<String>) {
    let value = parse(params);
    if let Some(path) = credentials::find_credential(&value) {
        return (Some(path), None, None);
    }
    let hash = keyturn_core::canonical::params_hash(tool, &value).or_raise();
    let errors = if params_schema.0 == "null" {
        None
    } else {
        let schema = compiled_schema(params_schema);
        if withhold_values {
            schema.validate_without_values(&value)
        } else {
            schema.validate(&value)
        }
        .err()
        .map(|e| e.to_string())
    };
    (None, Some(hash), errors)
}

/// Raises 22023 unless `scope` is a valid scope; returns it normalized.
#[pg_extern(name = "_check_scope", immutable, strict, parallel_safe)]
fn check_scope(scope: JsonbText) -> JsonB {
    JsonB(scope::check_scope(&parse(&scope)).or_raise())
}

/// NULL when params (and the target count) are inside the scope, else the
/// first failing path and why.
#[pg_extern(name = "_scope_violation", immutable, parallel_safe)]
fn scope_violation(
    scope: Option<JsonbText>,
    params: Option<JsonbText>,
    target_count: Option<i32>,
) -> Option<String> {
    // No scope allows everything; params are never NULL by the time a scope
    // is checked, and if they were, nothing would be inside it.
    let scope = scope?;
    let Some(params) = params else {
        return Some("params are missing".into());
    };
    scope::scope_violation(
        &scope.0,
        &params.0,
        target_count.map(i64::from),
        scope::Reach::Bounds,
    )
    .or_raise()
}

/// As `_scope_violation`, for a standing approval: NULL only when the scope
/// also names every path the params carry (keyturn-core `scope`, "covers").
#[pg_extern(name = "_scope_uncovered", immutable, parallel_safe)]
fn scope_cover_violation(
    scope: Option<JsonbText>,
    params: Option<JsonbText>,
    target_count: Option<i32>,
) -> Option<String> {
    let Some(scope) = scope else {
        return Some("there is no scope".into());
    };
    let Some(params) = params else {
        return Some("params are missing".into());
    };
    scope::scope_violation(
        &scope.0,
        &params.0,
        target_count.map(i64::from),
        scope::Reach::Covers,
    )
    .or_raise()
}
