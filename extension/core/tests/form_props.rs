//! Property tests for the sql form generators the SQL fuzzer drives: what the
//! core does with a form at propose (hash it, scan it for credentials, render
//! the card's summary from it) never panics, refuses only with 22023, and
//! renders a bounded summary that hides nothing.

mod generators;

use generators::forms::{form, hostile_form, not_a_form, SET, WHERE};
use generators::specs::{hostile_template, template};
use keyturn_core::canonical::{canonicalize_str, canonicalize_value, params_hash, parse_bounded};
use keyturn_core::credentials::find_credential;
use keyturn_core::template::{check_template, render, MAX_SUMMARY_CHARS};
use keyturn_core::text::{is_bidi_control, is_invisible};
use proptest::prelude::*;
use serde_json::Value;

fn any_form() -> impl Strategy<Value = Value> {
    prop_oneof![
        2 => form(WHERE, SET),
        2 => hostile_form(WHERE, SET),
        1 => not_a_form(),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn test_well_formed_forms_name_only_listed_columns(f in form(WHERE, SET)) {
        let parts = f.as_object().unwrap();
        prop_assert_eq!(parts.len(), 2);
        for (part, allowed) in [("where", WHERE), ("set", SET)] {
            let cols = parts[part].as_object().unwrap();
            prop_assert!(!cols.is_empty(), "{} is empty in {}", part, f);
            for col in cols.keys() {
                prop_assert!(allowed.contains(&col.as_str()), "{} is not a {} column", col, part);
            }
        }
    }

    #[test]
    fn test_forms_hash_the_same_from_their_text_or_are_refused_cleanly(f in any_form()) {
        match params_hash("tool", &f) {
            Ok(h) => {
                prop_assert!(canonicalize_value(&f).is_ok());
                // keyturn reads text, and its reader is stricter than a Value:
                // it refuses serde_json's reserved number key.
                match parse_bounded(&f.to_string()) {
                    Ok(again) => prop_assert_eq!(params_hash("tool", &again).unwrap(), h),
                    Err(e) => prop_assert!(e.to_string().contains("reserved"), "{}", e),
                }
            }
            Err(e) => prop_assert_eq!(e.sqlstate(), "22023"),
        }
        // The credential scan runs on every form; only its answer matters.
        let _ = find_credential(&f);
    }

    #[test]
    fn test_summaries_of_any_form_are_bounded_and_show_nothing_hidden(
        t in prop_oneof![template(), hostile_template()],
        f in any_form(),
        count in -1i64..2000,
    ) {
        let checked = check_template(&t);
        if let Err(e) = &checked {
            prop_assert_eq!(e.sqlstate(), "22023");
        }
        let summary = render(&t, &f, count);
        prop_assert!(summary.chars().count() <= MAX_SUMMARY_CHARS, "{} chars", summary.chars().count());
        let hidden = summary.chars().find(|&c| is_invisible(c) || is_bidi_control(c) || c.is_control());
        prop_assert!(hidden.is_none(), "{:?} in {:?}", hidden, summary);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// The duplicate is really there: keyturn's strict reader refuses the
    /// text for it (or for the reserved key junk may hold, which comes first).
    #[test]
    fn test_duplicate_key_texts_hold_a_duplicate(text in generators::forms::with_duplicate_key(WHERE, SET)) {
        let e = canonicalize_str(&text).expect_err("a duplicate key is refused");
        let msg = e.to_string();
        prop_assert!(msg.contains("duplicate object key") || msg.contains("reserved"), "{}: {}", text, msg);
    }
}
