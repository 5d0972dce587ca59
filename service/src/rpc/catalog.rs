//! The functions `/rpc` may run, read from `pg_proc` once at start, and the
//! one statement each request becomes.
//!
//! A request's JSON object maps to named arguments the way PostgREST maps
//! it: `keyturn.fn(arg => …)` for exactly the keys given, so omitted
//! arguments take their SQL defaults. The statement has one parameter, the
//! body as `jsonb`; every argument is taken out of it and cast to the type
//! the catalog names (`jsonb` arguments take the JSON value, JSON `null`
//! being SQL `NULL`). Names and types are spliced from the catalog only,
//! never from the request, whose keys are merely looked up.

use std::collections::HashMap;

use serde_json::{Map, Value};

pub use crate::db::rpc::ident;
use crate::error::Error;

/// What `/rpc` exposes, and nothing else: the human's, the operator's and
/// the console's calls. `propose`, `lease` and the other agent and
/// dispatcher calls are never reachable over HTTP.
pub const EXPOSED: &[&str] = &[
    "pending",
    "preview",
    "approve",
    "approve_many",
    "reject",
    "revise",
    "action_status",
    "audit",
    "delegate",
    "revoke_delegation",
    "delegations",
    "record_request",
    "issue_token",
    "link_code",
    "uncertain_actions",
    "reconcile",
    "attempts",
    "action_counts",
    "find_actions",
    "tools",
    "standing_approvals",
    "set_tool_enabled",
    // Where the person is reached (docs/notifications.md): the card
    // subscribes a browser to Web Push with set_notify.
    "set_notify",
    "notify_channels",
    "remove_notify",
    "revoke_links",
    // An action's notifications, for the console's timeline.
    "notifications",
];

/// The exposed calls that change an action, whose tenant-explicit form
/// (`<name>_for(tenant, …)`, docs/sql-api.md) runs in their stead where
/// keyturn's tables are distributed by tenant (Citus, layout B): Citus sends
/// that form whole to the tenant's worker, where the action's row lives.
/// The forms are read with the catalog but never exposed themselves.
pub const BY_TENANT: &[(&str, TenantOf)] = &[
    ("preview", TenantOf::Caller),
    ("approve", TenantOf::Caller),
    ("approve_many", TenantOf::Caller),
    ("reject", TenantOf::Caller),
    ("revise", TenantOf::Caller),
    ("reconcile", TenantOf::UncertainAction),
];

/// Where the tenant of a [`BY_TENANT`] call comes from; the database says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TenantOf {
    /// The caller's: `keyturn.current_tenant()` under the request's claims.
    Caller,
    /// The uncertain action's that the body's `action_id` names, as
    /// `keyturn.uncertain_actions()` lists it: an operator acts across
    /// tenants.
    UncertainAction,
}

/// One input argument.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Arg {
    /// Its name (`proargnames`).
    pub name: String,
    /// Its type as `format_type` prints it (`uuid`, `jsonb`, `text[]`, …).
    pub ty: String,
    /// Whether it has a default (the last `pronargdefaults` inputs do).
    pub has_default: bool,
}

/// What a function returns, which decides the answer's shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Returns {
    /// A set (`RETURNS TABLE`/`SETOF`): a JSON array of row objects.
    Set,
    /// One value: that value as JSON.
    Scalar,
    /// Nothing: JSON `null`.
    Void,
}

/// One function of schema `keyturn`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Function {
    /// Its name.
    pub name: String,
    /// Its input arguments, in order.
    pub args: Vec<Arg>,
    /// Its answer's shape.
    pub returns: Returns,
}

/// The exposed functions present in the database.
#[derive(Clone, Debug, Default)]
pub struct Catalog {
    functions: HashMap<String, Vec<Function>>,
}

impl Catalog {
    /// A catalog of the given functions (tests build one without a database).
    pub fn from_functions(functions: impl IntoIterator<Item = Function>) -> Catalog {
        let mut catalog = Catalog::default();
        for f in functions {
            catalog.functions.entry(f.name.clone()).or_default().push(f);
        }
        catalog
    }

    /// Reads the [`EXPOSED`] functions the database has. One not there yet
    /// (an older extension) answers 404 like any unknown function.
    pub async fn load(client: &tokio_postgres::Client) -> Result<Catalog, Error> {
        let names: Vec<String> = EXPOSED
            .iter()
            .map(|n| (*n).to_owned())
            .chain(BY_TENANT.iter().map(|(n, _)| format!("{n}_for")))
            .collect();
        let rows = crate::db::rpc::functions(client, &names).await?;
        let mut functions = Vec::with_capacity(rows.len());
        for row in rows {
            let crate::db::rpc::ProcRow {
                name,
                returns_set: set,
                returns_void: void,
                defaults,
                arg_names: names,
                arg_modes: modes,
                input_types: types,
            } = row;
            let input_names = input_names(names, modes.as_deref(), types.len());
            let Some(input_names) = input_names else {
                // PostgREST cannot call an unnamed argument by name either.
                tracing::warn!(function = %name, "skipping keyturn.{name}: an input argument has no name");
                continue;
            };
            let first_default = types.len().saturating_sub(defaults.max(0) as usize);
            let args = input_names
                .into_iter()
                .zip(types)
                .enumerate()
                .map(|(i, (name, ty))| Arg {
                    name,
                    ty,
                    has_default: i >= first_default,
                })
                .collect();
            functions.push(Function {
                name,
                args,
                returns: match (set, void) {
                    (true, _) => Returns::Set,
                    (false, true) => Returns::Void,
                    (false, false) => Returns::Scalar,
                },
            });
        }
        let catalog = Catalog::from_functions(functions);
        let missing: Vec<&&str> = EXPOSED
            .iter()
            .filter(|n| !catalog.functions.contains_key(**n))
            .collect();
        if !missing.is_empty() {
            tracing::warn!(
                ?missing,
                "these /rpc functions are not in this database's pg_keyturn; calls to them answer 404"
            );
        }
        Ok(catalog)
    }

    /// The names of the exposed functions present.
    pub fn names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self
            .functions
            .keys()
            .map(String::as_str)
            .filter(|n| EXPOSED.contains(n))
            .collect();
        names.sort_unstable();
        names
    }

    /// The function `name` callable with exactly the keys of `body`, and
    /// its statement (parameter `$1`: `body` as `jsonb`). `None` in PostgREST's
    /// sense: 404 `PGRST202`.
    pub fn statement(
        &self,
        name: &str,
        body: &Map<String, Value>,
    ) -> Result<(Returns, String), Error> {
        let function = self.function(name, body)?;
        Ok((function.returns, select(function, body, None)))
    }

    /// For a [`BY_TENANT`] call with its tenant-explicit form present: that
    /// form's statement, the tenant its parameter `$2` (text), `$1` the body
    /// as in [`statement`](Self::statement), which decides what is found.
    /// Written `SELECT … FROM keyturn.<name>_for(…) AS r`, with nothing but
    /// parameters in the arguments: the form Citus delegates; with it,
    /// where its tenant comes from. `Ok(None)`: no such form; the plain
    /// statement serves.
    pub fn statement_by_tenant(
        &self,
        name: &str,
        body: &Map<String, Value>,
    ) -> Result<Option<(TenantOf, String)>, Error> {
        let plain = self.function(name, body)?;
        let Some(&(_, tenant_of)) = BY_TENANT.iter().find(|(n, _)| *n == name) else {
            return Ok(None);
        };
        let Some(by_tenant) = self
            .functions
            .get(&format!("{name}_for"))
            .and_then(|forms| {
                forms.iter().find(|f| {
                    f.args.first().is_some_and(|a| a.name == "tenant")
                        && f.args[1..] == plain.args[..]
                        && f.returns == plain.returns
                })
            })
        else {
            return Ok(None);
        };
        Ok(Some((tenant_of, select(by_tenant, body, Some("$2")))))
    }

    /// The exposed function `name` callable with exactly the keys of `body`.
    fn function(&self, name: &str, body: &Map<String, Value>) -> Result<&Function, Error> {
        let candidates = self
            .functions
            .get(name)
            .filter(|_| EXPOSED.contains(&name))
            .ok_or_else(|| not_found(name, body, None))?;
        let function = candidates
            .iter()
            .find(|f| accepts(f, body))
            .ok_or_else(|| {
                let hint = candidates.first().map(|f| {
                    let args: Vec<String> = f
                        .args
                        .iter()
                        .map(|a| {
                            let optional = if a.has_default { " (optional)" } else { "" };
                            format!("{} {}{optional}", a.name, a.ty)
                        })
                        .collect();
                    format!("keyturn.{name} takes: {}", args.join(", "))
                });
                not_found(name, body, hint)
            })?;
        if let Some(arg) = function
            .args
            .iter()
            .find(|a| !castable(a, body.get(&a.name)))
        {
            return Err(Error::BadArgument {
                name: arg.name.clone(),
                ty: arg.ty.clone(),
            });
        }
        Ok(function)
    }
}

/// Longest text of a value `/rpc` casts to its argument's type.
const MAX_CAST_CHARS: usize = 100;

/// Whether `value` may go to the database's cast into `arg`'s type: for
/// any type but text and JSON, a scalar (for an array type, an array of
/// them) whose text is at most [`MAX_CAST_CHARS`] printable ASCII
/// characters. No value of such a type is longer, and PostgreSQL's refusal
/// of one (`22P02`, `22007`, `22003`) quotes it whole into its log, where a
/// person's or an operator's request wrote 900 KB of terminal escapes and
/// forged lines (thirty-first and thirty-second red-team passes,
/// docs/security.md row 141): an object or an array is cast as its JSON
/// text, of any length.
fn castable(arg: &Arg, value: Option<&Value>) -> bool {
    let (element, array) = match arg.ty.strip_suffix("[]") {
        Some(element) => (element, true),
        None => (arg.ty.as_str(), false),
    };
    if matches!(
        element,
        "text" | "jsonb" | "json" | "character varying" | "varchar" | "name"
    ) {
        return true;
    }
    let fits = |v: &Value| match v {
        Value::String(s) => {
            s.len() <= MAX_CAST_CHARS && s.bytes().all(|b| (b' '..=b'~').contains(&b))
        }
        Value::Number(n) => n.to_string().len() <= MAX_CAST_CHARS,
        Value::Bool(_) | Value::Null => true,
        Value::Array(_) | Value::Object(_) => false,
    };
    match value {
        Some(Value::Array(items)) if array => items.iter().all(fits),
        Some(v) => fits(v),
        None => true,
    }
}

/// The statement that calls `function` with the keys of `body` (and first
/// `tenant => <tenant>` when given) and answers its result as one `jsonb`.
/// Always `SELECT <one expression> FROM keyturn.<function>(…) AS r`, the form
/// in which Citus sends a call whole to a worker, provided the expression is
/// not itself a function call (Citus reads `SELECT f(…) FROM g(…)` as two
/// calls and delegates neither): so a scalar's value is the first element
/// of the aggregate of its one row, the operator `->` on top. A scalar or
/// void function in FROM yields its one row.
fn select(function: &Function, body: &Map<String, Value>, tenant: Option<&str>) -> String {
    let call = call(function, body, tenant);
    match function.returns {
        Returns::Set => format!(
            "SELECT coalesce(pg_catalog.jsonb_agg(pg_catalog.to_jsonb(r.*)), '[]'::pg_catalog.jsonb) FROM {call} AS r"
        ),
        Returns::Scalar => {
            format!("SELECT pg_catalog.jsonb_agg(pg_catalog.to_jsonb(r)) -> 0 FROM {call} AS r")
        }
        Returns::Void => format!("SELECT NULL::pg_catalog.jsonb FROM {call} AS r"),
    }
}

/// `keyturn.<function>(<arg> => …)` for the keys of `body`, and first
/// `tenant => <tenant>` when given.
fn call(function: &Function, body: &Map<String, Value>, tenant: Option<&str>) -> String {
    let args: Vec<String> = tenant
        .map(|t| format!("\"tenant\" => {t}::pg_catalog.text"))
        .into_iter()
        .chain(
            function
                .args
                .iter()
                .filter(|a| body.contains_key(&a.name))
                .map(|a| format!("{} => {}", ident(&a.name), value_of(a))),
        )
        .collect();
    format!("keyturn.{}({})", ident(&function.name), args.join(", "))
}

/// The input arguments' names: all of `proargnames` when there are no
/// modes, else those of mode in, inout or variadic.
fn input_names(
    names: Option<Vec<String>>,
    modes: Option<&[String]>,
    inputs: usize,
) -> Option<Vec<String>> {
    let names = names.unwrap_or_default();
    let picked: Vec<String> = match modes {
        None => names.into_iter().take(inputs).collect(),
        Some(modes) => names
            .into_iter()
            .zip(modes)
            .filter(|(_, m)| matches!(m.as_str(), "i" | "b" | "v"))
            .map(|(n, _)| n)
            .collect(),
    };
    (picked.len() == inputs && picked.iter().all(|n| !n.is_empty())).then_some(picked)
}

fn accepts(f: &Function, body: &Map<String, Value>) -> bool {
    body.keys().all(|k| f.args.iter().any(|a| &a.name == k))
        && f.args
            .iter()
            .all(|a| a.has_default || body.contains_key(&a.name))
}

fn not_found(name: &str, body: &Map<String, Value>, hint: Option<String>) -> Error {
    let mut keys: Vec<&str> = body.keys().map(String::as_str).collect();
    keys.sort_unstable();
    Error::NoSuchFunction {
        message: format!(
            "Could not find the function keyturn.{name}({}) in the schema cache",
            keys.join(", ")
        ),
        hint,
    }
}

/// `$1`'s member for `arg`, as the argument's type.
fn value_of(arg: &Arg) -> String {
    let key = literal(&arg.name);
    match arg.ty.as_str() {
        "jsonb" => format!("NULLIF($1 -> {key}, 'null'::pg_catalog.jsonb)"),
        "json" => {
            format!("NULLIF($1 -> {key}, 'null'::pg_catalog.jsonb)::pg_catalog.json")
        }
        ty if ty.ends_with("[]") => format!(
            "CASE WHEN pg_catalog.jsonb_typeof($1 -> {key}) = 'array' \
             THEN ARRAY(SELECT pg_catalog.jsonb_array_elements_text($1 -> {key}))::{ty} \
             ELSE ($1 ->> {key})::{ty} END"
        ),
        ty => format!("($1 ->> {key})::{ty}"),
    }
}

fn literal(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn approve() -> Function {
        Function {
            name: "approve".into(),
            args: vec![
                Arg {
                    name: "action_id".into(),
                    ty: "uuid".into(),
                    has_default: false,
                },
                Arg {
                    name: "token".into(),
                    ty: "text".into(),
                    has_default: false,
                },
                Arg {
                    name: "params".into(),
                    ty: "jsonb".into(),
                    has_default: true,
                },
            ],
            returns: Returns::Set,
        }
    }

    fn body(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => unreachable!(),
        }
    }

    #[test]
    fn test_named_arguments_only_for_the_keys_given() {
        let c = Catalog::from_functions([approve()]);
        let (returns, sql) = c
            .statement("approve", &body(json!({"action_id": "x", "token": "t"})))
            .expect("found");
        assert_eq!(returns, Returns::Set);
        assert!(sql.contains(r#"keyturn."approve"("action_id" => ($1 ->> 'action_id')::uuid, "token" => ($1 ->> 'token')::text)"#), "{sql}");
        let (_, sql) = c
            .statement(
                "approve",
                &body(json!({"action_id": "x", "token": "t", "params": {}})),
            )
            .expect("found");
        assert!(
            sql.contains(r#""params" => NULLIF($1 -> 'params', 'null'::pg_catalog.jsonb)"#),
            "{sql}"
        );
    }

    #[test]
    fn test_unknown_or_missing_arguments_and_unexposed_functions_are_not_found() {
        let mut propose = approve();
        propose.name = "propose".into();
        let c = Catalog::from_functions([approve(), propose]);
        for (name, b) in [
            (
                "approve",
                json!({"action_id": "x", "token": "t", "tokn": 1}),
            ),
            ("approve", json!({"token": "t"})),
            ("propose", json!({"action_id": "x", "token": "t"})),
            ("lease", json!({})),
        ] {
            match c.statement(name, &body(b.clone())) {
                Err(Error::NoSuchFunction { message, .. }) => {
                    assert!(
                        message
                            .starts_with(&format!("Could not find the function keyturn.{name}(")),
                        "{message}"
                    )
                }
                other => panic!("{name} {b}: {other:?}"),
            }
        }
    }

    #[test]
    fn test_scalar_void_and_array_arguments() {
        let c = Catalog::from_functions([
            Function {
                name: "preview".into(),
                args: vec![],
                returns: Returns::Scalar,
            },
            Function {
                name: "delegations".into(),
                args: vec![Arg {
                    name: "tools".into(),
                    ty: "text[]".into(),
                    has_default: true,
                }],
                returns: Returns::Void,
            },
        ]);
        let (_, sql) = c.statement("preview", &Map::new()).expect("found");
        assert_eq!(
            sql,
            r#"SELECT pg_catalog.jsonb_agg(pg_catalog.to_jsonb(r)) -> 0 FROM keyturn."preview"() AS r"#
        );
        let (_, sql) = c
            .statement("delegations", &body(json!({"tools": ["a"]})))
            .expect("found");
        assert!(
            sql.starts_with(
                "SELECT NULL::pg_catalog.jsonb FROM keyturn.\"delegations\"(\"tools\" => CASE"
            ),
            "{sql}"
        );
        assert!(sql.ends_with(") AS r"), "{sql}");
    }

    #[test]
    fn test_the_tenant_explicit_form_takes_the_tenant_and_the_plain_call_s_arguments() {
        let tenant = Arg {
            name: "tenant".into(),
            ty: "text".into(),
            has_default: false,
        };
        let mut approve_for = approve();
        approve_for.name = "approve_for".into();
        approve_for.args.insert(0, tenant.clone());
        let c = Catalog::from_functions([
            approve(),
            approve_for,
            Function {
                name: "pending".into(),
                args: vec![],
                returns: Returns::Set,
            },
        ]);
        let (tenant_of, sql) = c
            .statement_by_tenant("approve", &body(json!({"action_id": "x", "token": "t"})))
            .expect("found")
            .expect("a tenant-explicit form");
        assert_eq!(tenant_of, TenantOf::Caller);
        assert_eq!(
            sql,
            "SELECT coalesce(pg_catalog.jsonb_agg(pg_catalog.to_jsonb(r.*)), '[]'::pg_catalog.jsonb) \
             FROM keyturn.\"approve_for\"(\"tenant\" => $2::pg_catalog.text, \"action_id\" => ($1 ->> 'action_id')::uuid, \
             \"token\" => ($1 ->> 'token')::text) AS r"
        );
        // The body names the plain call's arguments only: a tenant of the
        // caller's choosing is not one of them.
        assert!(matches!(
            c.statement_by_tenant(
                "approve",
                &body(json!({"action_id": "x", "token": "t", "tenant": "globex"}))
            ),
            Err(Error::NoSuchFunction { .. })
        ));
        // Neither exposed itself nor listed.
        assert!(matches!(
            c.statement(
                "approve_for",
                &body(json!({"tenant": "acme", "action_id": "x", "token": "t"}))
            ),
            Err(Error::NoSuchFunction { .. })
        ));
        assert_eq!(c.names(), ["approve", "pending"]);
        // A call without such a form: the plain statement serves.
        assert!(c
            .statement_by_tenant("pending", &Map::new())
            .expect("found")
            .is_none());
        // An older extension without the form: likewise.
        let plain_only = Catalog::from_functions([approve()]);
        assert!(plain_only
            .statement_by_tenant("approve", &body(json!({"action_id": "x", "token": "t"})))
            .expect("found")
            .is_none());
    }

    #[test]
    fn test_input_names_skip_out_and_table_columns() {
        let names = Some(vec![
            "action_id".to_owned(),
            "status".to_owned(),
            "result".to_owned(),
        ]);
        let modes = vec!["i".to_owned(), "t".to_owned(), "t".to_owned()];
        assert_eq!(
            input_names(names, Some(&modes), 1),
            Some(vec!["action_id".to_owned()])
        );
        assert_eq!(input_names(None, None, 1), None, "unnamed input");
        assert_eq!(input_names(None, None, 0), Some(vec![]));
    }
}
