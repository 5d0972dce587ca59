//! Scopes: which params a scoped tool grant or a standing approval covers.
//!
//! A human who says "my agent may move deals 1–3 to Won, twice this hour" is
//! approving a *set* of calls in advance, so the set must be exactly what they
//! read. The database counts uses and time; this module only decides whether one
//! call's params (and the number of targets it resolves to) fall inside a scope.
//!
//! # The language
//!
//! ```json
//! {"params": {"set.stage": {"eq": "won"}, "where.id": {"in": [1, 2, 3]}}, "max_targets": 3}
//! ```
//!
//! Both keys are optional; `{}` allows everything.
//!
//! * A **path** is object keys separated by dots (`to`, `set.stage`). Segments are
//!   non-empty and there are no wildcards (`*` is refused) or array indexes: a
//!   path never reaches into an array, and a params key containing a dot cannot
//!   be named. Control characters are refused in paths, because PostgreSQL text
//!   cannot carry all of them and no real params key holds one.
//! * A **constraint** is an object with at least one of `eq`, `in`, `min`, `max`,
//!   `max_length`. Several may be combined; every one must hold. Or it is
//!   exactly `{"any": true}`: the path is free, any value passes, and the scope
//!   says so in as many words.
//!   * `{"eq": v}` — the value equals `v` (any JSON).
//!   * `{"in": [v, …]}` — a non-empty list of scalars. A scalar value must be in
//!     the list; for an array value *every element* must be (so an empty array
//!     passes `in`; add `max_length` or `eq` if that matters).
//!   * `{"min": n}`, `{"max": n}` — inclusive bounds; the value must be a number.
//!   * `{"max_length": n}` — strings count characters (code points, not bytes),
//!     arrays count elements; other values fail.
//! * A path absent from params fails its constraint: a scope never allows a call
//!   by leaving something out.
//! * What a scope leaves out, it does not bound. For a scoped grant that is
//!   enough: a person still approves what the agent proposes. A standing
//!   approval approves without anyone looking, so it **covers** a call only
//!   when it also names every path the params carry ([`Scope::check_covering`]):
//!   each leaf (a value that is not a non-empty object: a scalar, an array, an
//!   empty object) must be named, or lie under a named path. Arrays are leaves,
//!   checked element by element by `in`; a params key holding a dot can never
//!   be named, so it is never covered.
//! * `max_targets` bounds the number of targets the call resolves to (matched
//!   rows of a sql tool, the length of an external tool's targets param). The
//!   caller passes that count; with `None` this check is skipped, so the caller
//!   must pass the count whenever it has one.
//!
//! # Comparison
//!
//! There is no coercion. `eq` and `in` compare RFC 8785 canonical forms
//! ([`crate::canonical`]), which makes the number `1` differ from the string `"1"`,
//! makes `1`, `1.0` and `1e0` equal, compares strings by exact code points and
//! objects regardless of key order. A number that a double cannot hold exactly
//! is refused in a scope (as it is in hashed params) and fails any constraint it
//! meets in params, because it cannot be compared without rounding.
//!
//! # Order and messages
//!
//! Paths are checked in sorted (code point) order, each path's constraints in
//! the order eq, in, min, max, max_length, then `max_targets`; the first failure
//! is reported. Messages quote values in canonical JSON, clipped to about 100
//! characters, so a huge or hostile value cannot flood a log line.

use std::collections::BTreeSet;
use std::fmt;

use serde_json::{Map, Number, Value};

use crate::canonical::{self, MAX_DEPTH};
use crate::CoreError;

/// Largest `max_length` / `max_targets`: Number.MAX_SAFE_INTEGER, the largest
/// integer below which every integer is a double, so the bound means one thing
/// to every JSON reader.
const MAX_COUNT: u64 = (1 << 53) - 1;

/// Characters of a value (or path) quoted in a message before it is clipped.
const MAX_SHOWN_CHARS: usize = 100;

const ROOT: &str = "(root)";

/// A checked scope, ready to test params against.
#[derive(Debug, Clone)]
pub struct Scope {
    /// Sorted by path, which is the order violations are looked for in.
    params: Vec<PathConstraint>,
    max_targets: Option<u64>,
}

/// The constraint on one path; `None` fields do not apply.
#[derive(Debug, Clone)]
struct PathConstraint {
    path: String,
    segments: Vec<String>,
    eq: Option<Literal>,
    one_of: Option<OneOf>,
    min: Option<Bound>,
    max: Option<Bound>,
    max_length: Option<u64>,
    /// `{"any": true}`: a free path, named so that a standing approval covers it.
    any: bool,
}

/// A constraint value held as its canonical text: equal canonical texts are
/// equal values, with no coercion between types.
#[derive(Debug, Clone)]
struct Literal {
    canonical: String,
}

#[derive(Debug, Clone)]
struct OneOf {
    /// As given, for messages and the normalized scope.
    listed: Vec<Literal>,
    set: BTreeSet<String>,
}

#[derive(Debug, Clone)]
struct Bound {
    literal: Literal,
    value: f64,
}

/// Why params fall outside a scope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// The failing params path (`set.stage`), or `max_targets`.
    pub path: String,
    /// What was wrong, quoting the value (clipped).
    pub reason: String,
    /// Tells a params path that happens to be called `max_targets` apart from
    /// the target bound.
    on_targets: bool,
}

impl Violation {
    fn param(path: &str, reason: String) -> Self {
        Violation {
            path: path.to_owned(),
            reason,
            on_targets: false,
        }
    }

    fn targets(reason: String) -> Self {
        Violation {
            path: "max_targets".to_owned(),
            reason,
            on_targets: true,
        }
    }

    /// Whether the violation is the `max_targets` bound rather than a params path.
    pub fn is_max_targets(&self) -> bool {
        self.on_targets
    }

    fn unnamed(path: &str) -> Self {
        Violation::param(
            path,
            "is not named by the scope: a standing approval covers only the paths it \
             names ({\"any\": true} leaves one free)"
                .to_owned(),
        )
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.on_targets {
            write!(f, "max_targets: {}", self.reason)
        } else {
            write!(f, "params.{}: {}", clip(&self.path), self.reason)
        }
    }
}

/// Checks that `scope` is in the scope language and returns it normalized:
/// keys sorted, numbers in canonical form (`1.0` → `1`), an empty `params`
/// dropped. Normalizing a normalized scope returns it unchanged.
pub fn check_scope(scope: &Value) -> Result<Value, CoreError> {
    compile(scope)?.to_value()
}

/// Compiles a scope, checking it exactly as [`check_scope`] does, so a stored
/// scope altered after it was checked cannot widen what is allowed.
pub fn compile(scope: &Value) -> Result<Scope, CoreError> {
    let Some(top) = scope.as_object() else {
        return Err(invalid(
            ROOT,
            "a scope must be a JSON object such as {\"params\": {\"set.stage\": {\"eq\": \"won\"}}, \
             \"max_targets\": 1}; send {} to allow everything",
        ));
    };
    for key in sorted_keys(top) {
        if !matches!(key.as_str(), "params" | "max_targets") {
            return Err(invalid(
                ROOT,
                &format!(
                    "unknown key {}; a scope has only \"params\" and \"max_targets\"",
                    quote(key)
                ),
            ));
        }
    }
    let params = match top.get("params") {
        None => Vec::new(),
        Some(Value::Object(paths)) => {
            let mut out = Vec::with_capacity(paths.len());
            for path in sorted_keys(paths) {
                out.push(PathConstraint::compile(path, &paths[path])?);
            }
            out
        }
        Some(other) => {
            return Err(invalid(
                "params",
                &format!(
                    "must be an object mapping paths to constraints, e.g. \
                     {{\"set.stage\": {{\"eq\": \"won\"}}}}, not {}",
                    kind(other)
                ),
            ))
        }
    };
    let max_targets = match top.get("max_targets") {
        None => None,
        Some(v) => Some(count(
            v,
            "max_targets",
            1,
            "(the most rows or targets one call may touch), e.g. {\"max_targets\": 1}",
        )?),
    };
    Ok(Scope {
        params,
        max_targets,
    })
}

impl Scope {
    /// Ok(()) when params (and the target count, when known) are inside the scope;
    /// Err(violation) naming the first failing path, in a stable order (sorted
    /// paths, then max_targets). With `target_count` `None` the `max_targets`
    /// bound is not checked: pass the count whenever it is known.
    pub fn check(&self, params: &Value, target_count: Option<i64>) -> Result<(), Violation> {
        for c in &self.params {
            let Some(value) = lookup(params, &c.segments) else {
                return Err(Violation::param(
                    &c.path,
                    "is missing, and the scope requires it".to_owned(),
                ));
            };
            c.check(value)
                .map_err(|reason| Violation::param(&c.path, reason))?;
        }
        if let (Some(limit), Some(count)) = (self.max_targets, target_count) {
            match u64::try_from(count) {
                Err(_) => {
                    return Err(Violation::targets(format!(
                        "the target count {count} is negative, so it cannot be checked"
                    )))
                }
                Ok(n) if n > limit => {
                    return Err(Violation::targets(format!(
                        "the call would touch {n} targets; the scope allows at most {limit}"
                    )))
                }
                Ok(_) => {}
            }
        }
        Ok(())
    }

    /// As [`Scope::check`], and then every path the params carry must be
    /// named by the scope (or lie under a named path): what a standing
    /// approval approves with nobody looking is only what its scope names.
    pub fn check_covering(
        &self,
        params: &Value,
        target_count: Option<i64>,
    ) -> Result<(), Violation> {
        self.check(params, target_count)?;
        let named: BTreeSet<&[String]> =
            self.params.iter().map(|c| c.segments.as_slice()).collect();
        let mut prefix = Vec::new();
        uncovered(params, &named, &mut prefix).map_or(Ok(()), |path| Err(Violation::unnamed(&path)))
    }

    fn to_value(&self) -> Result<Value, CoreError> {
        // Inserted in sorted order so the result is sorted even if serde_json's
        // `preserve_order` is switched on by another crate in the build.
        let mut top = Map::new();
        if let Some(n) = self.max_targets {
            top.insert("max_targets".to_owned(), Value::from(n));
        }
        if !self.params.is_empty() {
            let mut paths = Map::new();
            for c in &self.params {
                paths.insert(c.path.clone(), c.to_value()?);
            }
            top.insert("params".to_owned(), Value::Object(paths));
        }
        Ok(Value::Object(top))
    }
}

/// The first path (in sorted key order, depth first) that `value` carries
/// below `prefix` and that no named path covers, or `None`.
fn uncovered(
    value: &Value,
    named: &BTreeSet<&[String]>,
    prefix: &mut Vec<String>,
) -> Option<String> {
    if named.contains(prefix.as_slice()) {
        return None;
    }
    match value {
        Value::Object(map) if !map.is_empty() => {
            for key in sorted_keys(map) {
                prefix.push(key.clone());
                let found = uncovered(&map[key], named, prefix);
                prefix.pop();
                if found.is_some() {
                    return found;
                }
            }
            None
        }
        // A leaf, or the params object itself when empty.
        _ if prefix.is_empty() => None,
        _ => Some(prefix.join(".")),
    }
}

/// How much of the params a scope must account for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reach {
    /// A scoped grant: the paths it names are bounded, the rest is left to
    /// the person who approves.
    Bounds,
    /// A standing approval: it must also name every path the params carry.
    Covers,
}

/// Parses both texts (bounded as in [`canonical::parse_bounded`]), compiles the
/// scope and checks the params: `Ok(None)` inside, `Ok(Some(message))` outside,
/// `Err` for a malformed scope or unparsable text.
pub fn scope_violation(
    scope_text: &str,
    params_text: &str,
    target_count: Option<i64>,
    reach: Reach,
) -> Result<Option<String>, CoreError> {
    let scope = compile(&canonical::parse_bounded(scope_text)?)?;
    let params = canonical::parse_bounded(params_text)?;
    let checked = match reach {
        Reach::Bounds => scope.check(&params, target_count),
        Reach::Covers => scope.check_covering(&params, target_count),
    };
    Ok(checked.err().map(|v| v.to_string()))
}

impl PathConstraint {
    fn compile(path: &str, constraint: &Value) -> Result<Self, CoreError> {
        let at = format!("params[{}]", quote(path));
        let segments = parse_path(path, &at)?;
        let Some(obj) = constraint.as_object() else {
            return Err(invalid(
                &at,
                &format!(
                    "a constraint must be an object using eq, in, min, max or max_length, \
                     e.g. {{\"eq\": \"won\"}}, not {}",
                    kind(constraint)
                ),
            ));
        };
        if obj.is_empty() {
            return Err(invalid(
                &at,
                "the constraint is empty; give at least one of eq, in, min, max, max_length, \
                 or {\"any\": true} for a free path",
            ));
        }
        if let Some(any) = obj.get("any") {
            if any != &Value::Bool(true) || obj.len() > 1 {
                return Err(invalid(
                    &at,
                    "\"any\" marks a free path and stands alone: write exactly {\"any\": true}, \
                     or constrain the path with eq, in, min, max or max_length",
                ));
            }
            return Ok(PathConstraint {
                path: path.to_owned(),
                segments,
                eq: None,
                one_of: None,
                min: None,
                max: None,
                max_length: None,
                any: true,
            });
        }
        let mut c = PathConstraint {
            path: path.to_owned(),
            segments,
            eq: None,
            one_of: None,
            min: None,
            max: None,
            max_length: None,
            any: false,
        };
        for key in sorted_keys(obj) {
            let value = &obj[key];
            let at_key = format!("{at}.{key}");
            match key.as_str() {
                "eq" => c.eq = Some(literal(value, &at_key)?),
                "in" => c.one_of = Some(one_of(value, &at_key)?),
                "min" => c.min = Some(bound(value, &at_key, "min")?),
                "max" => c.max = Some(bound(value, &at_key, "max")?),
                "max_length" => {
                    c.max_length = Some(count(
                        value,
                        &at_key,
                        0,
                        "(characters of a string, elements of an array), \
                         e.g. {\"max_length\": 100}",
                    )?);
                }
                _ => {
                    return Err(invalid(
                        &at,
                        &format!(
                            "unknown constraint {}; use eq, in, min, max or max_length \
                             (several may be combined, and all must hold), or {{\"any\": true}}",
                            quote(key)
                        ),
                    ))
                }
            }
        }
        if let (Some(min), Some(max)) = (&c.min, &c.max) {
            if min.value > max.value {
                return Err(invalid(
                    &at,
                    &format!(
                        "min {} is greater than max {}, so no value could pass",
                        min.literal.canonical, max.literal.canonical
                    ),
                ));
            }
        }
        Ok(c)
    }

    /// The reason `value` fails, if it does.
    fn check(&self, value: &Value) -> Result<(), String> {
        if let Some(eq) = &self.eq {
            let got = canonical_of(value)?;
            if got != eq.canonical {
                return Err(format!(
                    "{} is not equal to {}",
                    clip(&got),
                    clip(&eq.canonical)
                ));
            }
        }
        if let Some(one_of) = &self.one_of {
            if let Value::Array(items) = value {
                for (i, item) in items.iter().enumerate() {
                    let got = canonical_of(item)?;
                    if !one_of.set.contains(&got) {
                        return Err(format!(
                            "element {i}, {}, is not one of {}",
                            clip(&got),
                            one_of.shown()
                        ));
                    }
                }
            } else {
                let got = canonical_of(value)?;
                if !one_of.set.contains(&got) {
                    return Err(format!("{} is not one of {}", clip(&got), one_of.shown()));
                }
            }
        }
        if self.min.is_some() || self.max.is_some() {
            let Value::Number(n) = value else {
                let which = if self.min.is_some() { "min" } else { "max" };
                return Err(format!(
                    "{} is {}, not a number, and {which} applies to numbers only",
                    show(value),
                    kind(value)
                ));
            };
            let (text, x) = number_value(n).map_err(|e| incomparable(&e))?;
            if let Some(min) = self.min.as_ref().filter(|m| x < m.value) {
                return Err(format!(
                    "{text} is less than the minimum {}",
                    min.literal.canonical
                ));
            }
            if let Some(max) = self.max.as_ref().filter(|m| x > m.value) {
                return Err(format!(
                    "{text} is greater than the maximum {}",
                    max.literal.canonical
                ));
            }
        }
        if let Some(limit) = self.max_length {
            let (len, unit) = match value {
                Value::String(s) => (s.chars().count(), "characters"),
                Value::Array(items) => (items.len(), "elements"),
                _ => {
                    return Err(format!(
                        "{} is {}, and max_length applies to strings and arrays only",
                        show(value),
                        kind(value)
                    ))
                }
            };
            // usize fits in u64 on every supported target.
            if u64::try_from(len).unwrap_or(u64::MAX) > limit {
                return Err(format!(
                    "{} has {len} {unit}, more than max_length {limit}",
                    show(value)
                ));
            }
        }
        Ok(())
    }

    fn to_value(&self) -> Result<Value, CoreError> {
        // Keys in sorted order: any; or eq, in, max, max_length, min.
        let mut out = Map::new();
        if self.any {
            out.insert("any".to_owned(), Value::Bool(true));
        }
        if let Some(eq) = &self.eq {
            out.insert("eq".to_owned(), eq.to_value()?);
        }
        if let Some(one_of) = &self.one_of {
            let items = one_of
                .listed
                .iter()
                .map(Literal::to_value)
                .collect::<Result<Vec<_>, _>>()?;
            out.insert("in".to_owned(), Value::Array(items));
        }
        if let Some(max) = &self.max {
            out.insert("max".to_owned(), max.literal.to_value()?);
        }
        if let Some(n) = self.max_length {
            out.insert("max_length".to_owned(), Value::from(n));
        }
        if let Some(min) = &self.min {
            out.insert("min".to_owned(), min.literal.to_value()?);
        }
        Ok(Value::Object(out))
    }
}

impl Literal {
    fn to_value(&self) -> Result<Value, CoreError> {
        // Canonical text reparses to the same value, and with arbitrary_precision
        // its numbers keep their canonical spelling, which makes normalizing
        // idempotent.
        canonical::parse_bounded(&self.canonical)
    }
}

impl OneOf {
    /// The list as a message shows it: canonical elements, as many as fit.
    fn shown(&self) -> String {
        let mut out = String::from("[");
        let mut used = 0;
        for (i, item) in self.listed.iter().enumerate() {
            let text = clip(&item.canonical);
            let len = text.chars().count();
            if i > 0 && used + len > MAX_SHOWN_CHARS {
                out.push_str(&format!(", … {} more", self.listed.len() - i));
                break;
            }
            if i > 0 {
                out.push(',');
            }
            out.push_str(&text);
            used += len;
        }
        out.push(']');
        out
    }
}

fn parse_path(path: &str, at: &str) -> Result<Vec<String>, CoreError> {
    if path.is_empty() {
        return Err(invalid(
            at,
            "the path is empty; name a params key, e.g. \"to\" or \"set.stage\"",
        ));
    }
    let segments: Vec<String> = path.split('.').map(str::to_owned).collect();
    if segments.iter().any(String::is_empty) {
        return Err(invalid(
            at,
            "the path has an empty segment (a leading, trailing or doubled dot); \
             write object keys separated by single dots, e.g. \"set.stage\"",
        ));
    }
    if path.contains('*') {
        return Err(invalid(
            at,
            "wildcards are not supported; name each path in full, e.g. \"set.stage\"",
        ));
    }
    if let Some(c) = path.chars().find(|c| c.is_control()) {
        return Err(invalid(
            at,
            &format!(
                "the path contains the control character U+{:04X}; \
                 scopes can only name printable params keys",
                u32::from(c)
            ),
        ));
    }
    if segments.len() > MAX_DEPTH {
        return Err(invalid(
            at,
            &format!("the path has more than {MAX_DEPTH} segments, deeper than params may nest"),
        ));
    }
    Ok(segments)
}

fn literal(value: &Value, at: &str) -> Result<Literal, CoreError> {
    let canonical = canonical::canonicalize_value(value).map_err(|e| unrepresentable(at, &e))?;
    // A literal is held as its canonical text, which `check_scope` reads back
    // (`Literal::to_value`). A value whose text does not read back (an object
    // keyed `$serde_json::private::Number`, serde_json's own number token) is
    // refused here too, so `compile` refuses exactly what `check_scope` does;
    // no params text could carry such a value either.
    canonical::parse_bounded(&canonical).map_err(|e| unrepresentable(at, &e))?;
    Ok(Literal { canonical })
}

fn one_of(value: &Value, at: &str) -> Result<OneOf, CoreError> {
    let Some(items) = value.as_array().filter(|items| !items.is_empty()) else {
        return Err(invalid(
            at,
            "must be a non-empty array of strings, numbers, booleans or null, \
             e.g. {\"in\": [\"won\", \"lost\"]}",
        ));
    };
    let mut listed = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let at_item = format!("{at}[{i}]");
        if item.is_array() || item.is_object() {
            return Err(invalid(
                &at_item,
                "list elements must be strings, numbers, booleans or null; \
                 to match a whole array or object use eq",
            ));
        }
        listed.push(literal(item, &at_item)?);
    }
    let set = listed.iter().map(|l| l.canonical.clone()).collect();
    Ok(OneOf { listed, set })
}

fn bound(value: &Value, at: &str, key: &str) -> Result<Bound, CoreError> {
    let Value::Number(n) = value else {
        return Err(invalid(
            at,
            &format!(
                "must be a number, not {} {}; send e.g. {{\"{key}\": 10}}",
                kind(value),
                show(value)
            ),
        ));
    };
    let (canonical, value) = number_value(n).map_err(|e| unrepresentable(at, &e))?;
    Ok(Bound {
        literal: Literal { canonical },
        value,
    })
}

/// An integer from `least` to [`MAX_COUNT`]; integral spellings such as `3.0`
/// count, since numbers compare by value.
fn count(value: &Value, at: &str, least: u64, what: &str) -> Result<u64, CoreError> {
    let bad = || {
        invalid(
            at,
            &format!(
                "must be an integer from {least} to {MAX_COUNT} {what}, not {}",
                show(value)
            ),
        )
    };
    let Value::Number(n) = value else {
        return Err(bad());
    };
    // The canonical form of an integral double below 1e21 is its plain digits,
    // so anything with a sign, point or exponent is negative, fractional or huge.
    let (text, _) = number_value(n).map_err(|_| bad())?;
    match text.parse::<u64>() {
        Ok(k) if (least..=MAX_COUNT).contains(&k) => Ok(k),
        _ => Err(bad()),
    }
}

/// A number's canonical text and its exact double value.
fn number_value(n: &Number) -> Result<(String, f64), CoreError> {
    let text = canonical::canonicalize_value(&Value::Number(n.clone()))?;
    let value = text
        .parse()
        .map_err(|_| CoreError::InvalidJson(format!("malformed number {}", clip(&text))))?;
    Ok((text, value))
}

/// The canonical text of a params value, or why it cannot be compared.
fn canonical_of(value: &Value) -> Result<String, String> {
    canonical::canonicalize_value(value).map_err(|e| incomparable(&e))
}

fn incomparable(e: &CoreError) -> String {
    match e {
        CoreError::InexactNumber(n) | CoreError::NonFiniteNumber(n) => format!(
            "holds the number {}, which no IEEE-754 double represents exactly, \
             so it cannot be compared",
            clip(n)
        ),
        other => format!("cannot be compared: {other}"),
    }
}

/// A scope value the canonical form refuses, reworded for someone writing a
/// scope rather than sending params.
fn unrepresentable(at: &str, e: &CoreError) -> CoreError {
    let what = match e {
        CoreError::InexactNumber(n) => format!(
            "number {} cannot be represented exactly as an IEEE-754 double, so no params \
             could carry it; use a number a double holds exactly",
            clip(n)
        ),
        CoreError::NonFiniteNumber(n) => format!(
            "number {} is outside the range of an IEEE-754 double; use a finite number",
            clip(n)
        ),
        other => other.to_string(),
    };
    invalid(at, &what)
}

fn lookup<'a>(mut value: &'a Value, segments: &[String]) -> Option<&'a Value> {
    for segment in segments {
        value = value.as_object()?.get(segment)?;
    }
    Some(value)
}

/// Keys in code point order whatever order the map keeps, so errors and
/// violations do not depend on serde_json's features.
fn sorted_keys(map: &Map<String, Value>) -> Vec<&String> {
    let mut keys: Vec<&String> = map.keys().collect();
    keys.sort_unstable();
    keys
}

fn invalid(at: &str, what: &str) -> CoreError {
    CoreError::InvalidScope(format!("at {at}: {what}"))
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// A value for a message: canonical JSON (which escapes every control character
/// a message must not carry raw), clipped.
fn show(value: &Value) -> String {
    let text = canonical::canonicalize_value(value)
        .or_else(|_| serde_json::to_string(value))
        .unwrap_or_default();
    clip(&text)
}

/// A key or path for a message: a JSON string, clipped.
fn quote(key: &str) -> String {
    show(&Value::String(key.to_owned()))
}

fn clip(s: &str) -> String {
    crate::text::clip(s, MAX_SHOWN_CHARS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn value(text: &str) -> Value {
        match canonical::parse_bounded(text) {
            Ok(v) => v,
            Err(e) => panic!("{text}: {e}"),
        }
    }

    fn compiled(scope: &str) -> Scope {
        match compile(&value(scope)) {
            Ok(s) => s,
            Err(e) => panic!("{scope}: {e}"),
        }
    }

    /// `name: scope, params, target count;` — params are inside the scope.
    /// Scope and params are JSON text, so number spellings such as `1.0` survive.
    macro_rules! inside {
        ($($name:ident: $scope:expr, $params:expr, $count:expr;)*) => {$(
            #[test]
            fn $name() {
                let got = compiled($scope).check(&value($params), $count);
                assert_eq!(got, Ok(()), "{} / {}", $scope, $params);
            }
        )*};
    }

    /// `name: scope, params, target count => path, message;` — the first
    /// violation has this path and displays as this message.
    macro_rules! outside {
        ($($name:ident: $scope:expr, $params:expr, $count:expr => $path:expr, $msg:expr;)*) => {$(
            #[test]
            fn $name() {
                let got = compiled($scope).check(&value($params), $count);
                let Err(v) = got else { panic!("{} / {} passed", $scope, $params) };
                assert_eq!(v.path, $path);
                assert_eq!(v.to_string(), $msg);
            }
        )*};
    }

    /// `name: scope => place, remedy;` — refused with a message at `place`
    /// that contains `remedy`.
    macro_rules! refused {
        ($($name:ident: $scope:expr => $place:expr, $remedy:expr;)*) => {$(
            #[test]
            fn $name() {
                let err = match compile(&value($scope)) {
                    Ok(_) => panic!("{} compiled", $scope),
                    Err(e) => e,
                };
                assert_eq!(err.sqlstate(), "22023");
                let msg = err.to_string();
                let prefix = format!("invalid scope: at {}: ", $place);
                assert!(msg.starts_with(&prefix), "{msg}");
                assert!(msg.contains($remedy), "{msg}");
                assert_eq!(check_scope(&value($scope)), Err(err));
            }
        )*};
    }

    inside! {
        test_empty_scope_allows_anything: "{}", r#"{"anything": [1, {"x": null}]}"#, Some(1_000_000);
        test_empty_params_allow_anything: r#"{"params": {}}"#, r#"{"a": 1}"#, None;
        test_eq_nested_path: r#"{"params": {"set.stage": {"eq": "won"}}}"#, r#"{"set": {"stage": "won", "x": 1}}"#, None;
        test_unconstrained_keys_are_free: r#"{"params": {"to": {"eq": "a@x"}}}"#, r#"{"to": "a@x", "cc": ["b@x"]}"#, None;
        test_in_scalar: r#"{"params": {"where.id": {"in": [1, 2, 3]}}}"#, r#"{"where": {"id": 3}}"#, None;
        test_in_checks_every_array_element: r#"{"params": {"ids": {"in": [1, 2, 3]}}}"#, r#"{"ids": [3, 1, 1]}"#, None;
        test_in_empty_array_passes_vacuously: r#"{"params": {"ids": {"in": [1]}}}"#, r#"{"ids": []}"#, None;
        test_eq_one_and_one_point_zero: r#"{"params": {"n": {"eq": 1}}}"#, r#"{"n": 1.0}"#, None;
        test_eq_exponent_spelling: r#"{"params": {"n": {"eq": 1.0}}}"#, r#"{"n": 1e0}"#, None;
        test_in_number_spellings: r#"{"params": {"n": {"in": [250, "x"]}}}"#, r#"{"n": 2.5e2}"#, None;
        test_negative_zero_is_zero: r#"{"params": {"n": {"eq": 0}}}"#, r#"{"n": -0.0}"#, None;
        test_min_is_inclusive: r#"{"params": {"n": {"min": 1.5}}}"#, r#"{"n": 1.50}"#, None;
        test_max_is_inclusive: r#"{"params": {"n": {"max": 10}}}"#, r#"{"n": 10}"#, None;
        test_min_max_between: r#"{"params": {"n": {"min": -1, "max": 1}}}"#, r#"{"n": 0.999}"#, None;
        test_min_equal_max: r#"{"params": {"n": {"min": 2, "max": 2}}}"#, r#"{"n": 2}"#, None;
        test_max_length_counts_characters_not_bytes: r#"{"params": {"s": {"max_length": 3}}}"#, r#"{"s": "é😂ü"}"#, None;
        test_max_length_counts_elements: r#"{"params": {"a": {"max_length": 2}}}"#, r#"{"a": [[1, 2, 3], "long string"]}"#, None;
        test_max_length_zero_empty_string: r#"{"params": {"s": {"max_length": 0}}}"#, r#"{"s": ""}"#, None;
        test_max_targets_at_limit: r#"{"max_targets": 3}"#, "{}", Some(3);
        test_max_targets_zero_targets: r#"{"max_targets": 1}"#, "{}", Some(0);
        test_max_targets_skipped_without_count: r#"{"max_targets": 1}"#, "{}", None;
        test_eq_object_ignores_key_order: r#"{"params": {"o": {"eq": {"a": 1, "b": [true, null]}}}}"#, r#"{"o": {"b": [true, null], "a": 1.0}}"#, None;
        test_eq_array_whole: r#"{"params": {"a": {"eq": [1, "x"]}}}"#, r#"{"a": [1, "x"]}"#, None;
        test_eq_null: r#"{"params": {"n": {"eq": null}}}"#, r#"{"n": null}"#, None;
        test_in_with_null_and_bool: r#"{"params": {"f": {"in": [null, false]}}}"#, r#"{"f": [false, null]}"#, None;
        test_combined_keys_all_hold: r#"{"params": {"to": {"in": ["a@x", "b@x"], "max_length": 2}}}"#, r#"{"to": ["b@x", "a@x"]}"#, None;
        test_overlapping_paths: r#"{"params": {"set": {"eq": {"stage": "won"}}, "set.stage": {"in": ["won"]}}}"#, r#"{"set": {"stage": "won"}}"#, None;
        test_unicode_path: r#"{"params": {"données.été": {"eq": "ok"}}}"#, r#"{"données": {"été": "ok"}}"#, None;
        test_string_exact_code_points: r#"{"params": {"s": {"eq": "\u00e9"}}}"#, r#"{"s": "é"}"#, None;
        test_the_deal_example: r#"{"params": {"set.stage": {"eq": "won"}, "where.id": {"in": [1, 2, 3]}}, "max_targets": 3}"#, r#"{"set": {"stage": "won"}, "where": {"id": 2}}"#, Some(1);
    }

    outside! {
        test_in_scalar_message: r#"{"params": {"set.stage": {"in": ["won"]}}}"#, r#"{"set": {"stage": "lost"}}"#, None
            => "set.stage", r#"params.set.stage: "lost" is not one of ["won"]"#;
        test_missing_leaf: r#"{"params": {"set.stage": {"eq": "won"}}}"#, r#"{"set": {}}"#, None
            => "set.stage", "params.set.stage: is missing, and the scope requires it";
        test_missing_because_parent_is_not_an_object: r#"{"params": {"set.stage": {"eq": "won"}}}"#, r#"{"set": "won"}"#, None
            => "set.stage", "params.set.stage: is missing, and the scope requires it";
        test_missing_when_params_not_object: r#"{"params": {"a": {"eq": 1}}}"#, "[1]", None
            => "a", "params.a: is missing, and the scope requires it";
        test_paths_do_not_index_arrays: r#"{"params": {"items.0": {"eq": 1}}}"#, r#"{"items": [1]}"#, None
            => "items.0", "params.items.0: is missing, and the scope requires it";
        test_string_never_equals_number: r#"{"params": {"n": {"eq": 1}}}"#, r#"{"n": "1"}"#, None
            => "n", r#"params.n: "1" is not equal to 1"#;
        test_number_never_equals_string: r#"{"params": {"n": {"eq": "1"}}}"#, r#"{"n": 1}"#, None
            => "n", r#"params.n: 1 is not equal to "1""#;
        test_in_no_coercion: r#"{"params": {"id": {"in": [1, 2]}}}"#, r#"{"id": "2"}"#, None
            => "id", r#"params.id: "2" is not one of [1,2]"#;
        test_bool_is_not_one: r#"{"params": {"b": {"eq": 1}}}"#, r#"{"b": true}"#, None
            => "b", "params.b: true is not equal to 1";
        test_null_is_not_missing_but_not_equal: r#"{"params": {"b": {"eq": 0}}}"#, r#"{"b": null}"#, None
            => "b", "params.b: null is not equal to 0";
        test_in_array_element_fails: r#"{"params": {"to": {"in": ["a@x"]}}}"#, r#"{"to": ["a@x", "b@x"]}"#, None
            => "to", r#"params.to: element 1, "b@x", is not one of ["a@x"]"#;
        test_in_nested_array_element_fails: r#"{"params": {"ids": {"in": [1]}}}"#, r#"{"ids": [[1]]}"#, None
            => "ids", "params.ids: element 0, [1], is not one of [1]";
        test_in_on_object_fails: r#"{"params": {"o": {"in": [1]}}}"#, r#"{"o": {"a": 1}}"#, None
            => "o", r#"params.o: {"a":1} is not one of [1]"#;
        test_eq_array_differs: r#"{"params": {"a": {"eq": [1, 2]}}}"#, r#"{"a": [2, 1]}"#, None
            => "a", "params.a: [2,1] is not equal to [1,2]";
        test_below_min: r#"{"params": {"n": {"min": 1}}}"#, r#"{"n": 0.50}"#, None
            => "n", "params.n: 0.5 is less than the minimum 1";
        test_above_max: r#"{"params": {"n": {"max": 1e3}}}"#, r#"{"n": 1000.001}"#, None
            => "n", "params.n: 1000.001 is greater than the maximum 1000";
        test_min_on_string: r#"{"params": {"n": {"min": 1}}}"#, r#"{"n": "5"}"#, None
            => "n", r#"params.n: "5" is a string, not a number, and min applies to numbers only"#;
        test_max_on_null: r#"{"params": {"n": {"max": 1}}}"#, r#"{"n": null}"#, None
            => "n", "params.n: null is null, not a number, and max applies to numbers only";
        test_max_length_string_over: r#"{"params": {"s": {"max_length": 3}}}"#, r#"{"s": "éééé"}"#, None
            => "s", r#"params.s: "éééé" has 4 characters, more than max_length 3"#;
        test_max_length_array_over: r#"{"params": {"a": {"max_length": 1}}}"#, r#"{"a": [1, 2]}"#, None
            => "a", "params.a: [1,2] has 2 elements, more than max_length 1";
        test_max_length_on_number: r#"{"params": {"a": {"max_length": 1}}}"#, r#"{"a": 7}"#, None
            => "a", "params.a: 7 is a number, and max_length applies to strings and arrays only";
        test_max_length_on_object: r#"{"params": {"a": {"max_length": 5}}}"#, r#"{"a": {}}"#, None
            => "a", "params.a: {} is an object, and max_length applies to strings and arrays only";
        test_max_targets_over: r#"{"max_targets": 3}"#, "{}", Some(4)
            => "max_targets", "max_targets: the call would touch 4 targets; the scope allows at most 3";
        test_negative_count_fails_closed: r#"{"max_targets": 3}"#, "{}", Some(-1)
            => "max_targets", "max_targets: the target count -1 is negative, so it cannot be checked";
        test_first_sorted_path_reported: r#"{"params": {"b": {"eq": 1}, "a": {"eq": 1}}}"#, r#"{"a": 2, "b": 2}"#, None
            => "a", "params.a: 2 is not equal to 1";
        test_paths_before_max_targets: r#"{"params": {"z": {"eq": 1}}, "max_targets": 1}"#, r#"{"z": 2}"#, Some(9)
            => "z", "params.z: 2 is not equal to 1";
        test_eq_checked_before_min: r#"{"params": {"n": {"min": 5, "eq": 5}}}"#, r#"{"n": 1}"#, None
            => "n", "params.n: 1 is not equal to 5";
        test_inexact_param_number_fails_closed: r#"{"params": {"n": {"min": 0}}}"#, r#"{"n": 9007199254740993}"#, None
            => "n", "params.n: holds the number 9007199254740993, which no IEEE-754 double represents exactly, so it cannot be compared";
        test_inexact_number_inside_array_fails_closed: r#"{"params": {"a": {"eq": [1]}}}"#, r#"{"a": [1e400]}"#, None
            => "a", "params.a: holds the number 1e+400, which no IEEE-754 double represents exactly, so it cannot be compared";
        test_string_code_points_differ: r#"{"params": {"s": {"eq": "\u00e9"}}}"#, r#"{"s": "e\u0301"}"#, None
            => "s", "params.s: \"e\u{301}\" is not equal to \"\u{e9}\"";
        test_control_characters_escaped_in_message: r#"{"params": {"s": {"eq": "x"}}}"#, r#"{"s": "a\u0000b"}"#, None
            => "s", r#"params.s: "a\u0000b" is not equal to "x""#;
    }

    #[test]
    fn test_params_key_named_max_targets_is_a_path() {
        let scope = compiled(r#"{"params": {"max_targets": {"eq": 1}}, "max_targets": 1}"#);
        let v = scope
            .check(&json!({"max_targets": 2}), Some(1))
            .unwrap_err();
        assert!(!v.is_max_targets());
        assert_eq!(v.to_string(), "params.max_targets: 2 is not equal to 1");
        let v = scope
            .check(&json!({"max_targets": 1}), Some(2))
            .unwrap_err();
        assert!(v.is_max_targets());
    }

    #[test]
    fn test_long_values_are_clipped_in_messages() {
        let scope = compiled(r#"{"params": {"s": {"eq": "short"}, "t": {"max_length": 1}}}"#);
        let long = "x".repeat(10_000);
        let v = scope.check(&json!({"s": long}), None).unwrap_err();
        assert!(v.reason.contains('…'), "{v}");
        assert!(v.to_string().chars().count() < 200, "{v}");
        let v = scope
            .check(&json!({"s": "short", "t": [long.clone(), long]}), None)
            .unwrap_err();
        assert!(v.to_string().chars().count() < 200, "{v}");
    }

    #[test]
    fn test_long_in_list_is_shortened_in_messages() {
        let list: Vec<String> = (0..1000).map(|i| format!("value-{i}")).collect();
        let scope = compile(&json!({"params": {"s": {"in": list}}})).unwrap();
        let v = scope.check(&json!({"s": "nope"}), None).unwrap_err();
        let msg = v.to_string();
        assert!(
            msg.starts_with(r#"params.s: "nope" is not one of ["value-0","value-1","#),
            "{msg}"
        );
        assert!(msg.ends_with(" more]"), "{msg}");
        assert!(msg.chars().count() < 200, "{msg}");
    }

    #[test]
    fn test_long_path_is_clipped_in_messages() {
        let path = "k".repeat(500);
        let scope = compile(&json!({"params": {path.clone(): {"eq": 1}}})).unwrap();
        let v = scope.check(&json!({}), None).unwrap_err();
        assert_eq!(v.path, path);
        assert!(v.to_string().chars().count() < 200, "{v}");
    }

    refused! {
        test_scope_not_an_object: "[]" => "(root)", "send {} to allow everything";
        test_scope_null: "null" => "(root)", "a scope must be a JSON object";
        test_unknown_top_key: r#"{"maxTargets": 1}"# => "(root)", r#"unknown key "maxTargets"; a scope has only "params" and "max_targets""#;
        test_params_not_object: r#"{"params": [["to", {"eq": 1}]]}"# => "params", "must be an object mapping paths to constraints";
        test_params_null: r#"{"params": null}"# => "params", "not null";
        test_empty_path: r#"{"params": {"": {"eq": 1}}}"# => r#"params[""]"#, "the path is empty";
        test_leading_dot: r#"{"params": {".a": {"eq": 1}}}"# => r#"params[".a"]"#, "empty segment";
        test_trailing_dot: r#"{"params": {"a.": {"eq": 1}}}"# => r#"params["a."]"#, "empty segment";
        test_double_dot: r#"{"params": {"a..b": {"eq": 1}}}"# => r#"params["a..b"]"#, "single dots";
        test_wildcard: r#"{"params": {"items.*": {"eq": 1}}}"# => r#"params["items.*"]"#, "wildcards are not supported";
        test_glob_in_segment: r#"{"params": {"set.st*": {"eq": 1}}}"# => r#"params["set.st*"]"#, "wildcards are not supported";
        test_nul_in_path: r#"{"params": {"a\u0000b": {"eq": 1}}}"# => r#"params["a\u0000b"]"#, "control character U+0000";
        test_newline_in_path: r#"{"params": {"a\nb": {"eq": 1}}}"# => r#"params["a\nb"]"#, "U+000A";
        test_constraint_not_object: r#"{"params": {"set.stage": "won"}}"# => r#"params["set.stage"]"#, r#"e.g. {"eq": "won"}, not a string"#;
        test_empty_constraint: r#"{"params": {"a": {}}}"# => r#"params["a"]"#, "the constraint is empty";
        test_unknown_constraint: r#"{"params": {"a": {"maximum": 3}}}"# => r#"params["a"]"#, r#"unknown constraint "maximum"; use eq, in, min, max or max_length"#;
        test_unknown_constraint_beside_known: r#"{"params": {"a": {"eq": 1, "ne": 2}}}"# => r#"params["a"]"#, r#"unknown constraint "ne""#;
        test_in_not_array: r#"{"params": {"a": {"in": "won"}}}"# => r#"params["a"].in"#, "must be a non-empty array";
        test_in_empty: r#"{"params": {"a": {"in": []}}}"# => r#"params["a"].in"#, r#"e.g. {"in": ["won", "lost"]}"#;
        test_in_object_element: r#"{"params": {"a": {"in": [1, {"b": 2}]}}}"# => r#"params["a"].in[1]"#, "use eq";
        test_in_array_element: r#"{"params": {"a": {"in": [[1]]}}}"# => r#"params["a"].in[0]"#, "must be strings, numbers, booleans or null";
        test_in_inexact_element: r#"{"params": {"a": {"in": [1, 9007199254740993]}}}"# => r#"params["a"].in[1]"#, "number 9007199254740993 cannot be represented exactly";
        test_min_string: r#"{"params": {"a": {"min": "5"}}}"# => r#"params["a"].min"#, r#"must be a number, not a string "5"; send e.g. {"min": 10}"#;
        test_max_bool: r#"{"params": {"a": {"max": true}}}"# => r#"params["a"].max"#, r#"send e.g. {"max": 10}"#;
        test_min_inexact: r#"{"params": {"a": {"min": 9007199254740993}}}"# => r#"params["a"].min"#, "a double holds exactly";
        test_max_too_large: r#"{"params": {"a": {"max": 1e400}}}"# => r#"params["a"].max"#, "outside the range of an IEEE-754 double";
        test_eq_inexact: r#"{"params": {"a": {"eq": {"x": [0.10000000000000001]}}}}"# => r#"params["a"].eq"#, "cannot be represented exactly";
        test_min_above_max: r#"{"params": {"a": {"min": 5, "max": 3}}}"# => r#"params["a"]"#, "min 5 is greater than max 3, so no value could pass";
        test_max_length_negative: r#"{"params": {"a": {"max_length": -1}}}"# => r#"params["a"].max_length"#, "must be an integer from 0 to 9007199254740991";
        test_max_length_fraction: r#"{"params": {"a": {"max_length": 2.5}}}"# => r#"params["a"].max_length"#, "not 2.5";
        test_max_length_string: r#"{"params": {"a": {"max_length": "3"}}}"# => r#"params["a"].max_length"#, r#"not "3""#;
        test_max_length_huge: r#"{"params": {"a": {"max_length": 1e300}}}"# => r#"params["a"].max_length"#, "not 1e+300";
        test_max_length_past_safe: r#"{"params": {"a": {"max_length": 9007199254740992}}}"# => r#"params["a"].max_length"#, "e.g. {\"max_length\": 100}";
        test_max_targets_zero: r#"{"max_targets": 0}"# => "max_targets", "must be an integer from 1 to";
        test_max_targets_fraction: r#"{"max_targets": 1.5}"# => "max_targets", r#"e.g. {"max_targets": 1}"#;
        test_max_targets_string: r#"{"max_targets": "2"}"# => "max_targets", r#"not "2""#;
        test_max_targets_null: r#"{"max_targets": null}"# => "max_targets", "not null";
        test_max_targets_negative: r#"{"max_targets": -3}"# => "max_targets", "not -3";
        test_hostile_key_is_quoted_and_clipped: r#"{"params": {"a": {"\u0000\u0001xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx": 1}}}"# => r#"params["a"]"#, r#"unknown constraint "\u0000\u0001xxx"#;
    }

    #[test]
    fn test_too_many_segments_refused() {
        let path = vec!["k"; MAX_DEPTH + 1].join(".");
        let err = compile(&json!({"params": {path: {"eq": 1}}})).unwrap_err();
        assert!(err.to_string().contains("more than 64 segments"), "{err}");
        let path = vec!["k"; MAX_DEPTH].join(".");
        assert!(compile(&json!({"params": {path: {"eq": 1}}})).is_ok());
    }

    #[test]
    fn test_normalized_form() {
        let got = check_scope(&value(
            r#"{"params": {"b": {"min": 1.0, "eq": 1e0, "max_length": 3.0},
                            "a": {"in": [2.50, "x", null], "max": 1E30}},
                "max_targets": 3.0}"#,
        ))
        .unwrap();
        assert_eq!(
            canonical::canonicalize_value(&got).unwrap(),
            r#"{"max_targets":3,"params":{"a":{"in":[2.5,"x",null],"max":1e+30},"b":{"eq":1,"max_length":3,"min":1}}}"#
        );
        assert_eq!(check_scope(&got).unwrap(), got);
    }

    #[test]
    fn test_normalized_numbers_keep_canonical_spelling() {
        let got = check_scope(&value(r#"{"params": {"a": {"eq": [1.50, {"z": 1e21}]}}}"#)).unwrap();
        assert_eq!(got["params"]["a"]["eq"][0].to_string(), "1.5");
        assert_eq!(got["params"]["a"]["eq"][1]["z"].to_string(), "1e+21");
    }

    #[test]
    fn test_empty_params_normalize_away() {
        assert_eq!(check_scope(&json!({"params": {}})).unwrap(), json!({}));
        assert_eq!(check_scope(&json!({})).unwrap(), json!({}));
    }

    #[test]
    fn test_scope_violation_helper() {
        let scope = r#"{"params": {"set.stage": {"in": ["won"]}}, "max_targets": 3}"#;
        assert_eq!(
            scope_violation(
                scope,
                r#"{"set": {"stage": "won"}}"#,
                Some(3),
                Reach::Bounds
            ),
            Ok(None)
        );
        assert_eq!(
            scope_violation(
                scope,
                r#"{"set": {"stage": "lost"}}"#,
                Some(3),
                Reach::Bounds
            ),
            Ok(Some(
                r#"params.set.stage: "lost" is not one of ["won"]"#.to_owned()
            ))
        );
        assert_eq!(
            scope_violation(
                scope,
                r#"{"set": {"stage": "won"}}"#,
                Some(4),
                Reach::Bounds
            ),
            Ok(Some(
                "max_targets: the call would touch 4 targets; the scope allows at most 3"
                    .to_owned()
            ))
        );
        assert!(matches!(
            scope_violation(scope, "{", None, Reach::Bounds),
            Err(CoreError::InvalidJson(_))
        ));
        assert!(matches!(
            scope_violation(r#"{"a": 1, "a": 2}"#, "{}", None, Reach::Bounds),
            Err(CoreError::InvalidJson(_))
        ));
        assert!(matches!(
            scope_violation(r#"{"params": 1}"#, "{}", None, Reach::Bounds),
            Err(CoreError::InvalidScope(_))
        ));
    }

    /// A standing approval covers only what its scope names: the mail that
    /// adds a cc, the sql form that adds an amount (the attacks of
    /// docs/security.md row 18).
    #[test]
    fn test_covering_needs_every_path_named() {
        let mail = compile(&json!({"params": {"to": {"in": ["boss@acme.example"]}}})).unwrap();
        let to_boss = json!({"to": ["boss@acme.example"]});
        assert_eq!(mail.check_covering(&to_boss, None), Ok(()));
        let with_cc = json!({"to": ["boss@acme.example"], "cc": ["mallory@evil.example"]});
        assert_eq!(
            mail.check(&with_cc, None),
            Ok(()),
            "a grant bounds what it names"
        );
        let v = mail.check_covering(&with_cc, None).unwrap_err();
        assert_eq!(v.path, "cc");
        assert!(v.to_string().contains("not named by the scope"), "{v}");

        let stage =
            compile(&json!({"params": {"set.stage": {"eq": "won"}, "where.id": {"any": true}}}))
                .unwrap();
        let form = json!({"where": {"id": 7}, "set": {"stage": "won"}});
        assert_eq!(stage.check_covering(&form, Some(1)), Ok(()));
        let amount = json!({"where": {"id": 7}, "set": {"stage": "won", "amount": 0.01}});
        assert_eq!(
            stage.check_covering(&amount, Some(1)).unwrap_err().path,
            "set.amount"
        );
        // A named path covers everything below it; an empty object is a leaf.
        let whole =
            compile(&json!({"params": {"set": {"any": true}, "where": {"any": true}}})).unwrap();
        assert_eq!(whole.check_covering(&amount, None), Ok(()));
        assert_eq!(
            mail.check_covering(&json!({"to": [], "x": {}}), None)
                .unwrap_err()
                .path,
            "x"
        );
        // A key with a dot can never be named.
        assert_eq!(
            whole
                .check_covering(&json!({"set": {}, "where": {}, "a.b": 1}), None)
                .unwrap_err()
                .path,
            "a.b"
        );
        // {} covers only params that carry nothing.
        let empty = compile(&json!({})).unwrap();
        assert_eq!(empty.check_covering(&json!({}), None), Ok(()));
        assert_eq!(
            empty
                .check_covering(&json!({"n": 1}), None)
                .unwrap_err()
                .path,
            "n"
        );
        assert_eq!(
            scope_violation(r#"{"params": {"to": {"any": true}}}"#, r#"{"to": 1, "cc": 2}"#, None, Reach::Covers)
                .unwrap()
                .unwrap(),
            "params.cc: is not named by the scope: a standing approval covers only the paths it names ({\"any\": true} leaves one free)"
        );
    }

    #[test]
    fn test_any_stands_alone_and_round_trips() {
        let scope = json!({"params": {"cc": {"any": true}}});
        assert_eq!(check_scope(&scope).unwrap(), scope);
        for bad in [
            json!({"params": {"cc": {"any": false}}}),
            json!({"params": {"cc": {"any": 1}}}),
            json!({"params": {"cc": {"any": true, "eq": 1}}}),
        ] {
            assert!(
                matches!(check_scope(&bad), Err(CoreError::InvalidScope(_))),
                "{bad}"
            );
        }
        // Any value passes a free path, arrays and objects included.
        let s = compile(&scope).unwrap();
        for v in [json!(null), json!([1, {"a": 2}]), json!({"deep": {"x": 1}})] {
            assert_eq!(s.check_covering(&json!({"cc": v}), None), Ok(()));
        }
    }

    #[test]
    fn test_violation_display_format() {
        let v = Violation::param("set.stage", r#""lost" is not one of ["won"]"#.to_owned());
        assert_eq!(
            v.to_string(),
            r#"params.set.stage: "lost" is not one of ["won"]"#
        );
        assert_eq!(
            Violation::targets("x".to_owned()).to_string(),
            "max_targets: x"
        );
    }
}
