//! Property tests for the scope language, on the shared generators.

mod generators;

use generators::{
    float, hostile_scope, hostile_scope_text, params, respell, scalar, scalar_leaves, scope,
    set_at, string, SAFE_INTEGER,
};
use keyturn_core::canonical::canonicalize_value;
use keyturn_core::scope::{check_scope, compile, scope_violation, Reach, Scope};
use proptest::prelude::*;
use serde_json::{json, Map, Value};

/// A scope pinning every scalar leaf of `params` with `eq`; with `tight`, also
/// `in` for every leaf, `min` = `max` for numbers and `max_length` for strings,
/// so each constraint key is exercised at its boundary.
fn pinning_scope(params: &Value, tight: bool) -> Value {
    let mut paths = Map::new();
    for (path, leaf) in scalar_leaves(params) {
        let mut c = Map::new();
        c.insert("eq".to_owned(), leaf.clone());
        if tight {
            c.insert("in".to_owned(), json!([leaf.clone()]));
            match &leaf {
                Value::Number(_) => {
                    c.insert("min".to_owned(), leaf.clone());
                    c.insert("max".to_owned(), leaf.clone());
                }
                Value::String(s) => {
                    c.insert("max_length".to_owned(), json!(s.chars().count()));
                }
                _ => {}
            }
        }
        paths.insert(path, Value::Object(c));
    }
    json!({ "params": paths })
}

fn compiled(scope: &Value) -> Scope {
    match compile(scope) {
        Ok(s) => s,
        Err(e) => panic!("{scope}: {e}"),
    }
}

/// `new` if it differs in value from `old`, otherwise something that does.
fn different(old: &Value, new: Value) -> Value {
    if canonicalize_value(old).ok() == canonicalize_value(&new).ok() {
        Value::Array(vec![new])
    } else {
        new
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn test_pinning_every_leaf_passes(p in params(), tight in any::<bool>()) {
        let scope = compiled(&pinning_scope(&p, tight));
        prop_assert_eq!(scope.check(&p, None), Ok(()));
    }

    #[test]
    fn test_changing_one_pinned_leaf_fails_at_its_path(
        p in params(),
        pick in any::<prop::sample::Index>(),
        replacement in scalar(),
        tight in any::<bool>(),
    ) {
        let leaves = scalar_leaves(&p);
        prop_assume!(!leaves.is_empty());
        let scope = compiled(&pinning_scope(&p, tight));
        let (path, old) = &leaves[pick.index(leaves.len())];
        let mut changed = p.clone();
        set_at(&mut changed, path, different(old, replacement));
        let v = scope.check(&changed, None).unwrap_err();
        prop_assert_eq!(&v.path, path);
        prop_assert!(!v.is_max_targets());
        let prefix = format!("params.{path}: ");
        prop_assert!(v.to_string().starts_with(&prefix), "{}", v);
    }

    #[test]
    fn test_removing_one_pinned_leaf_fails_as_missing(
        p in params(),
        pick in any::<prop::sample::Index>(),
    ) {
        let leaves = scalar_leaves(&p);
        prop_assume!(!leaves.is_empty());
        let scope = compiled(&pinning_scope(&p, false));
        let (path, _) = &leaves[pick.index(leaves.len())];
        let mut removed = p.clone();
        let (parent, key) = match path.rsplit_once('.') {
            Some((parent, key)) => (Some(parent), key),
            None => (None, path.as_str()),
        };
        let mut cur = &mut removed;
        for k in parent.into_iter().flat_map(|p| p.split('.')) {
            cur = cur.get_mut(k).unwrap();
        }
        cur.as_object_mut().unwrap().remove(key);
        let v = scope.check(&removed, None).unwrap_err();
        prop_assert_eq!(&v.path, path);
        prop_assert!(v.reason.contains("missing"), "{}", v);
    }

    #[test]
    fn test_check_scope_is_idempotent(s in scope()) {
        let once = check_scope(&s).unwrap();
        prop_assert_eq!(check_scope(&once).unwrap(), once);
    }

    #[test]
    fn test_normalizing_keeps_the_meaning(
        s in scope(),
        p in params(),
        count in prop::option::of(-1i64..8),
    ) {
        let normalized = check_scope(&s).unwrap();
        prop_assert_eq!(
            compiled(&s).check(&p, count),
            compiled(&normalized).check(&p, count)
        );
    }

    #[test]
    fn test_text_helper_agrees_with_check(
        s in scope(),
        p in params(),
        count in prop::option::of(0i64..8),
    ) {
        let direct = compiled(&s).check(&p, count).err().map(|v| v.to_string());
        let via_text = scope_violation(&s.to_string(), &p.to_string(), count, Reach::Bounds).unwrap();
        prop_assert_eq!(direct, via_text);
    }

    #[test]
    fn test_violation_messages_are_bounded(
        s in scope(),
        p in params(),
        count in prop::option::of(0i64..8),
    ) {
        if let Err(v) = compiled(&s).check(&p, count) {
            let msg = v.to_string();
            prop_assert!(msg.chars().count() < 600, "{}", msg);
            prop_assert!(!msg.contains('\0'), "{}", msg);
        }
    }

    #[test]
    fn test_hostile_scopes_are_refused_cleanly_or_normalize_stably(
        s in hostile_scope(),
        p in params(),
    ) {
        match check_scope(&s) {
            Err(e) => {
                prop_assert_eq!(e.sqlstate(), "22023");
                let msg = e.to_string();
                prop_assert!(msg.chars().count() < 1000, "{}", msg);
                prop_assert!(!msg.contains('\0'), "{}", msg);
                prop_assert!(compile(&s).is_err());
            }
            Ok(normalized) => {
                prop_assert_eq!(check_scope(&normalized).unwrap(), normalized.clone());
                prop_assert_eq!(
                    compiled(&s).check(&p, Some(1)),
                    compiled(&normalized).check(&p, Some(1))
                );
            }
        }
    }

    #[test]
    fn test_hostile_scope_text_never_panics(text in hostile_scope_text(), p in params()) {
        if let Err(e) = scope_violation(&text, &p.to_string(), Some(1), Reach::Bounds) {
            prop_assert_eq!(e.sqlstate(), "22023");
        }
    }

    #[test]
    fn test_numbers_never_equal_their_text(n in -SAFE_INTEGER..=SAFE_INTEGER, use_in in any::<bool>()) {
        let key = if use_in { "in" } else { "eq" };
        let pin = |v: Value| if use_in { json!([v]) } else { v };
        let number = json!({"params": {"n": {key: pin(json!(n))}}});
        let text = json!({"params": {"n": {key: pin(json!(n.to_string()))}}});
        let as_number = json!({"n": n});
        let as_text = json!({"n": n.to_string()});
        prop_assert!(compiled(&number).check(&as_text, None).is_err());
        prop_assert!(compiled(&text).check(&as_number, None).is_err());
        prop_assert_eq!(compiled(&number).check(&as_number, None), Ok(()));
        prop_assert_eq!(compiled(&text).check(&as_text, None), Ok(()));
    }

    #[test]
    fn test_spellings_of_one_number_are_equal(
        n in -1000i64..1000,
        a in 0usize..4,
        b in 0usize..4,
    ) {
        let scope = compiled(&json!({"params": {
            "n": {"eq": respell(n, a), "in": [respell(n, b)], "min": respell(n, b), "max": respell(n, a)}
        }}));
        prop_assert_eq!(scope.check(&json!({"n": respell(n, b)}), None), Ok(()));
        let next = json!({"n": respell(n + 1, b)});
        prop_assert!(scope.check(&next, None).is_err());
    }

    #[test]
    fn test_min_max_bounds_are_inclusive_to_the_last_double(x in any::<f64>()) {
        prop_assume!(x.is_finite() && x.next_up().is_finite() && x.next_down().is_finite());
        let v = float(x).unwrap();
        let scope = compiled(&json!({"params": {"n": {"min": v.clone(), "max": v.clone()}}}));
        prop_assert_eq!(scope.check(&json!({"n": v}), None), Ok(()));
        let above = scope.check(&json!({"n": float(x.next_up()).unwrap()}), None).unwrap_err();
        prop_assert!(above.reason.contains("greater than the maximum"), "{}", above);
        let below = scope.check(&json!({"n": float(x.next_down()).unwrap()}), None).unwrap_err();
        prop_assert!(below.reason.contains("less than the minimum"), "{}", below);
    }

    #[test]
    fn test_max_length_counts_characters(s in string()) {
        let chars = s.chars().count();
        let at = compiled(&json!({"params": {"s": {"max_length": chars}}}));
        prop_assert_eq!(at.check(&json!({"s": s.clone()}), None), Ok(()));
        if chars > 0 {
            let under = compiled(&json!({"params": {"s": {"max_length": chars - 1}}}));
            let params = json!({"s": s});
            prop_assert!(under.check(&params, None).is_err());
        }
    }

    #[test]
    fn test_in_checks_every_element(
        allowed in prop::collection::btree_set(-5i64..5, 1..5),
        items in prop::collection::vec(-5i64..5, 0..6),
    ) {
        let scope = compiled(&json!({"params": {"ids": {"in": allowed.iter().collect::<Vec<_>>()}}}));
        let inside = items.iter().all(|i| allowed.contains(i));
        prop_assert_eq!(scope.check(&json!({"ids": items}), None).is_ok(), inside);
    }

    #[test]
    fn test_max_targets_bounds_the_count(limit in 1u64..10, count in -3i64..15) {
        let scope = compiled(&json!({"max_targets": limit}));
        let inside = u64::try_from(count).is_ok_and(|c| c <= limit);
        let got = scope.check(&json!({}), Some(count));
        prop_assert_eq!(got.is_ok(), inside);
        if let Err(v) = got {
            prop_assert!(v.is_max_targets());
            prop_assert_eq!(v.path, "max_targets");
        }
        prop_assert_eq!(scope.check(&json!({}), None), Ok(()));
    }
}

/// The case the hostile property found: an `eq` value keyed as serde_json's
/// own number token canonicalizes, but its text does not read back, so
/// `check_scope` refused it while `compile` took it. Both refuse it now.
#[test]
fn test_compile_refuses_a_literal_check_scope_refuses() {
    for bad in [
        json!({"params": {"a": {"eq": {"$serde_json::private::Number": null}}}}),
        json!({"params": {"a": {"eq": [{"$serde_json::private::Number": "1"}]}}}),
    ] {
        let checked = check_scope(&bad).expect_err("check_scope refuses it");
        let Err(compiled) = compile(&bad) else {
            panic!("compile refuses it: {bad}");
        };
        assert_eq!(checked.sqlstate(), "22023", "{bad}");
        assert_eq!(compiled.to_string(), checked.to_string(), "{bad}");
    }
}
