//! Property tests for the identity generators the SQL fuzzer drives: the
//! claims texts say what the model expects them to say, and the text classes
//! keyturn's identity check is built on (keyturn_core::text) see every hidden
//! character the generators hide, and none in a clean name.

mod generators;

use generators::claims::{claims, Expect, CLAIM_KEYS};
use generators::text::{clean_name, hidden_char, padded, with_hidden};
use keyturn_core::text::{is_bidi_control, is_break_or_control, is_invisible};
use proptest::prelude::*;
use serde_json::Value;

fn hidden(c: char) -> bool {
    is_invisible(c) || is_bidi_control(c) || is_break_or_control(c)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn test_every_hidden_character_is_hidden_to_keyturn(c in hidden_char(), s in with_hidden()) {
        prop_assert!(hidden(c), "{:?}", c);
        prop_assert!(s.chars().any(hidden), "{:?}", s);
    }

    #[test]
    fn test_clean_names_print_as_themselves(s in clean_name(), p in padded()) {
        prop_assert!(!s.is_empty());
        prop_assert!(!s.chars().any(hidden), "{:?}", s);
        prop_assert_eq!(s.trim(), s.as_str());
        prop_assert_ne!(p.trim(), p.as_str());
    }

    #[test]
    fn test_claims_hold_the_values_the_model_expects(c in claims()) {
        for (key, expect) in CLAIM_KEYS.iter().zip(&c.expect) {
            if let Expect::Is(Some(want)) = expect {
                let v: Value = serde_json::from_str(&c.text)
                    .map_err(|e| TestCaseError::fail(format!("{:?}: {e}", c.text)))?;
                prop_assert_eq!(v.get(*key).and_then(Value::as_str), Some(want.as_str()), "{}", c.text);
            }
        }
    }
}
