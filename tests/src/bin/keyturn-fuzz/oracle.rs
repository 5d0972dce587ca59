//! The fuzzer's own reading of an sql form, written independently of
//! keyturn's statements: which rows the form names (docs/sql-api.md,
//! "propose": columns from the tool's lists, values bound as their canonical
//! text and cast to the column's type, targets resolved under the caller's
//! tenant, 1 to max_targets of them), and after an approval, whether the
//! table changed exactly as the form says and nowhere else.

use std::collections::{BTreeSet, HashMap};

use keyturn_core::canonical::{params_hash, scalar_text};
use keyturn_core::credentials::find_credential;
use serde_json::Value;
use tokio_postgres::types::ToSql;
use tokio_postgres::Client;

use crate::fixture::{ident, Fixture};
use crate::generators::forms::{column, Kind};

/// Why the oracle expects propose to refuse a form (22023).
pub type Refusal = String;

/// The rows a well-formed form names, or why it must be refused.
pub async fn expected_targets(
    su: &Client,
    fx: &Fixture,
    tool: &str,
    where_cols: &[&str],
    set_cols: &[&str],
    form: &Value,
) -> Result<Vec<i64>, Refusal> {
    let Some(top) = form.as_object() else {
        return Err("not an object".into());
    };
    if top.len() != 2 || !top.contains_key("where") || !top.contains_key("set") {
        return Err("not exactly where and set".into());
    }
    let (Some(filters), Some(sets)) = (top["where"].as_object(), top["set"].as_object()) else {
        return Err("where or set is not an object".into());
    };
    if filters.is_empty() || sets.is_empty() {
        return Err("empty where or set".into());
    }
    for (col, v) in sets {
        if !set_cols.contains(&col.as_str()) {
            return Err(format!("set {col} not listed"));
        }
        if matches!(v, Value::Object(_) | Value::Array(_)) && column(col).kind != Kind::Jsonb {
            return Err(format!("set {col} is not a scalar"));
        }
        if column(col).kind == Kind::Date && !iso_dates(v) {
            return Err(format!("set {col} is no ISO 8601 date"));
        }
        // A value its sized column would store as another (rounded, cut) is
        // refused; one it cannot read or hold at all fails at approve.
        let sized = column(col).sql_type;
        if let (Some(open), Ok(Some(text))) = (sized.find('('), scalar_text(v)) {
            let sql = format!("SELECT $1::text::{sized} = $1::text::{}", &sized[..open]);
            if let Ok(row) = su.query_one(&sql, &[&text]).await {
                if !row.get::<_, bool>(0) {
                    return Err(format!("set {col} does not fit {sized}"));
                }
            }
        }
    }
    let mut clauses = Vec::new();
    let mut texts: Vec<Vec<Option<String>>> = Vec::new();
    for (col, v) in filters {
        if !where_cols.contains(&col.as_str()) {
            return Err(format!("where {col} not listed"));
        }
        if column(col).kind == Kind::Date && !iso_dates(v) {
            return Err(format!("where {col} holds no ISO 8601 date"));
        }
        let items = match v {
            Value::Array(items) if (1..=1000).contains(&items.len()) => items.clone(),
            Value::Array(_) => return Err(format!("where {col} lists no values, or too many")),
            scalar => vec![scalar.clone()],
        };
        let mut one = Vec::new();
        for item in &items {
            if !matches!(item, Value::String(_) | Value::Number(_) | Value::Bool(_)) {
                return Err(format!("where {col} holds a {item}"));
            }
            one.push(scalar_text(item).map_err(|e| e.to_string())?);
        }
        texts.push(one);
        clauses.push(format!(
            "t.{} = ANY (${}::text[]::{}[])",
            ident(col),
            texts.len() + 1,
            column(col).sql_type
        ));
    }
    if find_credential(form).is_some() {
        return Err("credential material".into());
    }
    params_hash(tool, form).map_err(|e| e.to_string())?;
    let sql = format!(
        "SELECT t.id FROM {} t WHERE t.tenant = $1 AND {} ORDER BY t.id LIMIT {}",
        fx.table,
        clauses.join(" AND "),
        fx.max_targets + 1
    );
    let mut params: Vec<&(dyn ToSql + Sync)> = vec![&fx.tenant];
    for t in &texts {
        params.push(t);
    }
    let rows = su
        .query(&sql, &params)
        .await
        .map_err(|e| format!("the filter does not fit the columns: {e}"))?;
    let ids: Vec<i64> = rows.iter().map(|r| r.get(0)).collect();
    match ids.len() {
        0 => Err("no row matches".into()),
        n if n > fx.max_targets => Err("more rows than max_targets".into()),
        _ => Ok(ids),
    }
}

/// Every row of the table (both tenants), as its jsonb text, and the
/// number of writes the trigger logged.
pub struct Snapshot {
    rows: HashMap<i64, String>,
    writes: i64,
}

pub async fn snapshot(su: &Client, fx: &Fixture) -> Snapshot {
    let rows = su
        .query(
            &format!("SELECT t.id, to_jsonb(t)::text FROM {} t", fx.table),
            &[],
        )
        .await
        .expect("snapshot");
    let writes: i64 = su
        .query_one(&format!("SELECT count(*) FROM {}", fx.writes), &[])
        .await
        .expect("writes")
        .get(0);
    Snapshot {
        rows: rows.iter().map(|r| (r.get(0), r.get(1))).collect(),
        writes,
    }
}

/// What is wrong with how the table changed between `before` and now, given
/// the action's status, its stored targets and its form; None when nothing.
pub async fn check_write(
    su: &Client,
    fx: &Fixture,
    before: &Snapshot,
    status: &str,
    targets: &BTreeSet<i64>,
    form: &Value,
) -> Option<String> {
    let after = snapshot(su, fx).await;
    let changed: BTreeSet<i64> = after
        .rows
        .iter()
        .filter(|(id, row)| before.rows.get(id) != Some(row))
        .map(|(id, _)| *id)
        .collect();
    let expected = if status == "succeeded" {
        targets.clone()
    } else {
        BTreeSet::new()
    };
    if changed != expected {
        return Some(format!(
            "status {status}: rows {changed:?} changed, the approval names {expected:?}"
        ));
    }
    let writes = after.writes - before.writes;
    if writes != expected.len() as i64 {
        return Some(format!(
            "status {status}: {writes} writes logged for {} target(s)",
            expected.len()
        ));
    }
    let sets = form["set"].as_object()?;
    let set_keys: Vec<String> = sets.keys().cloned().collect();
    for id in &expected {
        let mut conds = vec![
            "t.tenant = $2".to_owned(),
            "t.revision = ($3::text::jsonb ->> 'revision')::int + 1".to_owned(),
        ];
        conds.push(
            "(to_jsonb(t) - $4::text[] - 'revision') = ($3::text::jsonb - $4::text[] - 'revision')"
                .to_owned(),
        );
        let mut values: Vec<Option<String>> = Vec::new();
        for (col, v) in sets {
            let c = column(col);
            let text = if c.kind == Kind::Jsonb {
                Some(keyturn_core::canonical::canonicalize_value(v).ok()?)
            } else {
                scalar_text(v).ok()?
            };
            values.push(text);
            conds.push(format!(
                "t.{} IS NOT DISTINCT FROM ${}::text::{}",
                ident(col),
                values.len() + 4,
                c.sql_type
            ));
        }
        let sql = format!(
            "SELECT count(*) FROM {} t WHERE t.id = $1 AND {}",
            fx.table,
            conds.join(" AND ")
        );
        let before_row = &before.rows[id];
        let mut params: Vec<&(dyn ToSql + Sync)> = vec![id, &fx.tenant, before_row, &set_keys];
        for v in &values {
            params.push(v);
        }
        match su.query_one(&sql, &params).await {
            Ok(r) if r.get::<_, i64>(0) == 1 => {}
            Ok(_) => {
                return Some(format!(
                    "row {id} does not hold exactly the approved values (or changed elsewhere)"
                ))
            }
            Err(e) => {
                return Some(format!(
                    "row {id}: the approved values do not read back: {e}"
                ))
            }
        }
    }
    None
}

/// Whether every date `v` holds (one, or a list's) is written `YYYY-MM-DD`
/// (or `infinity`): docs/sql-api.md, propose, takes dates in ISO 8601 form
/// only, since PostgreSQL also reads `20240101`, `01/02/03` or `epoch`.
fn iso_dates(v: &Value) -> bool {
    let items = match v {
        Value::Array(items) => items.iter().collect(),
        v => vec![v],
    };
    items.into_iter().all(|item| match scalar_text(item) {
        Ok(Some(t)) => {
            let b = t.as_bytes();
            matches!(t.as_str(), "infinity" | "-infinity")
                || (b.len() == 10
                    && b.iter().enumerate().all(|(i, c)| {
                        if i == 4 || i == 7 {
                            *c == b'-'
                        } else {
                            c.is_ascii_digit()
                        }
                    }))
        }
        _ => true,
    })
}
