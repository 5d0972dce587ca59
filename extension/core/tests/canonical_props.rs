//! Property tests for the canonical form: random JSON trees with arbitrary Unicode
//! (astral characters, controls), safe integers and finite doubles.

use keyturn_core::canonical::{canonicalize_str, canonicalize_value, params_hash};
use proptest::prelude::*;
use serde_json::{Map, Number, Value};

/// Integers a double holds exactly (|n| ≤ 2^53).
const SAFE: i64 = 1 << 53;

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        (-SAFE..=SAFE).prop_map(|n| Value::Number(n.into())),
        // serde_json builds these from the shortest round-trip digits, which are
        // exact by construction, so canonicalization must accept every one.
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| Number::from_f64(f).map_or(Value::Null, Value::Number)),
        any::<String>().prop_map(Value::String),
        "[\\x00-\\x1f\"\\\\\u{7f}\u{e000}-\u{ffff}\u{10000}-\u{10ffff}]{0,8}"
            .prop_map(Value::String),
    ]
}

fn json_tree() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(5, 64, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..8).prop_map(Value::Array),
            prop::collection::vec((any::<String>(), inner), 0..8)
                .prop_map(|entries| Value::Object(entries.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

/// An object given as entries, so insertion order can be permuted.
fn object_entries() -> impl Strategy<Value = Vec<(String, Value)>> {
    prop::collection::btree_map(any::<String>(), json_tree(), 1..10)
        .prop_map(|m| m.into_iter().collect())
}

/// Writes an object with keys in the given order (serde_json's Map would sort them).
fn object_text(entries: &[(String, Value)]) -> String {
    let members: Vec<String> = entries
        .iter()
        .map(|(k, v)| format!("{}:{}", Value::String(k.clone()), v))
        .collect();
    format!("{{{}}}", members.join(","))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn test_canonical_form_is_a_fixed_point(v in json_tree()) {
        let text = serde_json::to_string(&v).unwrap();
        let once = canonicalize_str(&text).unwrap();
        prop_assert_eq!(&canonicalize_str(&once).unwrap(), &once);
        prop_assert_eq!(&canonicalize_value(&v).unwrap(), &once);
    }

    #[test]
    fn test_agrees_with_serde_jcs(v in json_tree()) {
        let ours = canonicalize_value(&v).unwrap();
        let theirs = serde_jcs::to_string(&v).unwrap();
        prop_assert_eq!(ours, theirs);
    }

    #[test]
    fn test_key_order_never_changes_the_hash(
        entries in object_entries(),
        seed in any::<u64>(),
    ) {
        let mut shuffled = entries.clone();
        // Deterministic Fisher-Yates driven by the generated seed.
        let mut state = seed | 1;
        for i in (1..shuffled.len()).rev() {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let j = usize::try_from(state % (i as u64 + 1)).unwrap();
            shuffled.swap(i, j);
        }
        let a: Value = serde_json::from_str(&object_text(&entries)).unwrap();
        let b: Value = serde_json::from_str(&object_text(&shuffled)).unwrap();
        prop_assert_eq!(params_hash("t", &a).unwrap(), params_hash("t", &b).unwrap());
        prop_assert_eq!(
            keyturn_core::canonical::params_hash_str("t", &object_text(&shuffled)).unwrap(),
            params_hash("t", &a).unwrap()
        );
    }
}
