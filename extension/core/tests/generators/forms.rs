//! Forms of sql tools, `{"where": {col: value | [values]}, "set": {col: value}}`,
//! over the table the SQL fuzzer writes.
//!
//! The table's shape lives here, beside the generators that must agree with
//! it: the fuzzer creates the table from [`COLUMNS`], and [`form`] draws
//! values that hit its rows (ids, owners) often enough that approvals
//! really write. Hostile forms break one rule at a time, so each refusal
//! path is reached.

use proptest::prelude::*;
use serde_json::{json, Map, Value};

use super::text::{hostile_text, SQLISH};
use super::{hostile_number, json_any, respell};

/// What a column holds, which decides the values that fit it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    BigInt,
    Int,
    Text,
    /// Text under a CHECK: only [`STAGES`].
    Stage,
    Numeric,
    Bool,
    Date,
    Jsonb,
}

/// One column of the fuzzer's table.
#[derive(Debug, Clone, Copy)]
pub struct Column {
    pub name: &'static str,
    pub kind: Kind,
    pub sql_type: &'static str,
}

/// The key column; its values are [`IDS`].
pub const KEY: &str = "id";

/// The business columns (the key first; the tenant and the version column are
/// the fuzzer's own). `odd "col"` needs quoting everywhere it is named.
pub const COLUMNS: &[Column] = &[
    Column {
        name: "id",
        kind: Kind::BigInt,
        sql_type: "bigint",
    },
    Column {
        name: "owner",
        kind: Kind::Text,
        sql_type: "text",
    },
    Column {
        name: "stage",
        kind: Kind::Stage,
        sql_type: "text",
    },
    Column {
        name: "amount",
        kind: Kind::Numeric,
        sql_type: "numeric(12,2)",
    },
    Column {
        name: "qty",
        kind: Kind::Int,
        sql_type: "int",
    },
    Column {
        name: "flag",
        kind: Kind::Bool,
        sql_type: "boolean",
    },
    Column {
        name: "due",
        kind: Kind::Date,
        sql_type: "date",
    },
    Column {
        name: "meta",
        kind: Kind::Jsonb,
        sql_type: "jsonb",
    },
    Column {
        name: "odd \"col\"",
        kind: Kind::Text,
        sql_type: "text",
    },
];

/// Columns a form may filter on, and set, in the fuzzer's wide tool.
pub const WHERE: &[&str] = &["id", "owner", "qty", "flag", "due", "odd \"col\""];
pub const SET: &[&str] = &[
    "owner",
    "stage",
    "amount",
    "qty",
    "flag",
    "due",
    "meta",
    "odd \"col\"",
];

/// The CHECK constraint of `stage`.
pub const STAGES: &[&str] = &["lead", "qualified", "won", "lost"];
/// Owners the fuzzer's rows have.
pub const OWNERS: &[&str] = &["alice", "bob", "carol"];
/// Ids of the fuzzer's rows (a few beyond, so some forms match nothing).
pub const IDS: std::ops::RangeInclusive<i64> = 1..=24;

pub fn column(name: &str) -> &'static Column {
    COLUMNS
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no column {name} in forms::COLUMNS"))
}

fn id() -> BoxedStrategy<Value> {
    prop_oneof![
        6 => (*IDS.start()..=*IDS.end() + 2).prop_map(Value::from),
        1 => (1i64..25, 0usize..4).prop_map(|(n, form)| respell(n, form)),
        1 => (1i64..25).prop_map(|n| Value::from(n.to_string())),
    ]
    .boxed()
}

/// Values that fit a column of this kind (as PostgreSQL casts text to it),
/// mostly; a few that PostgreSQL refuses are mixed in, so definite failures
/// of the write (a CHECK, a bad date) happen too.
pub fn value_for(kind: Kind) -> BoxedStrategy<Value> {
    match kind {
        Kind::BigInt => id(),
        Kind::Int => prop_oneof![
            4 => (-3i64..10).prop_map(Value::from),
            1 => Just(json!("7")),
            1 => Just(json!(2147483648i64)),
        ]
        .boxed(),
        Kind::Text => prop_oneof![
            4 => prop::sample::select(OWNERS).prop_map(Value::from),
            1 => prop::sample::select(SQLISH).prop_map(Value::from),
            1 => hostile_text().prop_map(Value::from),
        ]
        .boxed(),
        Kind::Stage => prop_oneof![
            6 => prop::sample::select(STAGES).prop_map(Value::from),
            1 => Just(json!("Won")),
            1 => Just(json!("won ")),
        ]
        .boxed(),
        Kind::Numeric => prop_oneof![
            3 => (-100_000i64..100_000).prop_map(|c| parse_number(&format!("{}.{:02}", c / 100, (c % 100).abs()))),
            1 => Just(json!("12.345")),
            1 => Just(json!(1.005)),
            1 => Just(parse_number("1e10")),
            1 => Just(json!("NaN")),
        ]
        .boxed(),
        Kind::Bool => prop_oneof![
            4 => any::<bool>().prop_map(Value::Bool),
            1 => prop::sample::select(vec!["t", "yes", "off", "0", "maybe"]).prop_map(Value::from),
            1 => Just(json!(1)),
        ]
        .boxed(),
        Kind::Date => prop_oneof![
            4 => (2020i32..2030, 1u32..13, 1u32..29).prop_map(|(y, m, d)| Value::from(format!("{y}-{m:02}-{d:02}"))),
            1 => prop::sample::select(vec!["2023-02-29", "infinity", "epoch", "2024-01-01T10:00:00Z", "01/02/03", "9999999-01-01"])
                .prop_map(Value::from),
            1 => Just(json!(20240101)),
        ]
        .boxed(),
        Kind::Jsonb => prop_oneof![
            3 => json_any(),
            1 => Just(json!({"k": [1, "two", null]})),
        ]
        .boxed(),
    }
}

fn parse_number(text: &str) -> Value {
    super::parse(text)
}

/// One where entry: a value, or a list of them (for the key, mostly a list).
fn where_value(col: &'static Column) -> BoxedStrategy<Value> {
    let one = value_for(col.kind);
    prop_oneof![
        3 => one.clone(),
        2 => prop::collection::vec(one, 1..5).prop_map(Value::Array),
    ]
    .boxed()
}

/// A well-formed form: one or two filters and one to three columns set,
/// all from the tool's lists. Well-formed is not always writable: a value may
/// not cast, or break the CHECK, or the filter may match no row.
pub fn form(
    where_cols: &'static [&'static str],
    set_cols: &'static [&'static str],
) -> BoxedStrategy<Value> {
    let filters =
        prop::sample::subsequence(where_cols, 1..=where_cols.len().min(2)).prop_flat_map(|names| {
            names
                .into_iter()
                .map(|n| where_value(column(n)).prop_map(move |v| (n.to_owned(), v)))
                .collect::<Vec<_>>()
        });
    let sets =
        prop::sample::subsequence(set_cols, 1..=set_cols.len().min(3)).prop_flat_map(|names| {
            names
                .into_iter()
                .map(|n| value_for(column(n).kind).prop_map(move |v| (n.to_owned(), v)))
                .collect::<Vec<_>>()
        });
    (filters, sets)
        .prop_map(|(w, s)| {
            json!({
                "where": Value::Object(w.into_iter().collect::<Map<_, _>>()),
                "set": Value::Object(s.into_iter().collect::<Map<_, _>>()),
            })
        })
        .boxed()
}

/// Keys a form must not use: the tenant, the version, system columns,
/// columns that do not exist, SQL in a key.
fn forbidden_column() -> BoxedStrategy<String> {
    prop_oneof![
        prop::sample::select(vec![
            "tenant", "revision", "xmin", "ctid", "tableoid", "nope", "ID", "id ", "\"id\"",
            "id; --", ""
        ])
        .prop_map(str::to_owned),
        hostile_text(),
    ]
    .boxed()
}

/// Values no column of a form takes as they are.
fn junk_value() -> BoxedStrategy<Value> {
    prop_oneof![
        json_any(),
        hostile_number(),
        Just(Value::Null),
        Just(json!({"nested": {"deeper": 1}})),
        Just(json!([])),
        Just(Value::Array((0..1001).map(Value::from).collect())),
        hostile_text().prop_map(Value::from),
    ]
    .boxed()
}

/// A form with one thing wrong: an extra or missing part, a part that is not
/// an object or is empty, a column outside the tool's lists, a value of the
/// wrong shape (objects, empty or over-long lists, nulls), or hostile text.
pub fn hostile_form(
    where_cols: &'static [&'static str],
    set_cols: &'static [&'static str],
) -> BoxedStrategy<Value> {
    (
        form(where_cols, set_cols),
        0usize..9,
        forbidden_column(),
        junk_value(),
    )
        .prop_map(|(mut f, which, key, junk)| {
            let top = f.as_object_mut().expect("form() builds objects");
            match which {
                0 => {
                    top.insert(if key.is_empty() { "extra".into() } else { key }, junk);
                }
                1 => {
                    top.remove(if junk.is_null() { "where" } else { "set" });
                }
                2 => {
                    top.insert("where".into(), junk);
                }
                3 => {
                    top.insert("set".into(), junk);
                }
                4 => {
                    top.insert("where".into(), json!({}));
                }
                5 => {
                    put(top, "where", key, Value::from(1));
                }
                6 => {
                    put(top, "set", key, Value::from("won"));
                }
                7 => {
                    let col = top["where"]
                        .as_object()
                        .and_then(|m| m.keys().next().cloned())
                        .unwrap_or_default();
                    put(top, "where", col, junk);
                }
                _ => {
                    let col = top["set"]
                        .as_object()
                        .and_then(|m| m.keys().next().cloned())
                        .unwrap_or_default();
                    put(top, "set", col, junk);
                }
            }
            f
        })
        .boxed()
}

fn put(top: &mut Map<String, Value>, part: &str, key: String, value: Value) {
    if let Some(m) = top.get_mut(part).and_then(Value::as_object_mut) {
        m.insert(key, value);
    }
}

/// A form that is not even an object, or is a form of another shape.
pub fn not_a_form() -> BoxedStrategy<Value> {
    prop_oneof![
        json_any(),
        Just(json!([{"where": {"id": 1}, "set": {"stage": "won"}}])),
        Just(json!({"where": {"id": 1}, "set": {"stage": "won"}, "returning": "*"})),
        Just(json!({"WHERE": {"id": 1}, "SET": {"stage": "won"}})),
    ]
    .boxed()
}

/// A form's JSON text with one key written twice, the first time with junk:
/// `{"where": …, "set": {"stage": "x"}, "set": {…}}` or a column repeated
/// inside a part. A reader that keeps the first occurrence sees another form
/// than one that keeps the last (PostgreSQL's jsonb keeps the last).
pub fn with_duplicate_key(
    where_cols: &'static [&'static str],
    set_cols: &'static [&'static str],
) -> BoxedStrategy<String> {
    (form(where_cols, set_cols), junk_value(), any::<bool>())
        .prop_map(|(f, junk, top)| {
            let text = f.to_string();
            if top {
                // The whole part twice: junk first.
                format!("{{\"set\": {junk}, {}", &text[1..])
            } else {
                let set = &f["set"];
                let (col, _) = set
                    .as_object()
                    .and_then(|m| m.iter().next())
                    .expect("form() sets a column");
                let inner = set.to_string();
                let doubled = format!("{{{}: {junk}, {}", Value::from(col.as_str()), &inner[1..]);
                let filters = json!({"where": f["where"]}).to_string();
                let open = filters.strip_suffix('}').expect("an object ends in }");
                format!("{open}, \"set\": {doubled}}}")
            }
        })
        .boxed()
}
