//! Property tests for the tool spec generators the SQL fuzzer drives: the
//! params schemas they make are inside the subset (or, when hostile, refused
//! with 22023 or normalized stably), and the params made to fit a schema do,
//! in a size that stays bounded whatever the schema nests.

mod generators;

use generators::schemas::{
    fitting, hostile_params_schema, params_schema, schema_and_params, BUDGET,
};
use keyturn_core::schema::{check_schema, compile};
use proptest::prelude::*;
use serde_json::Value;

/// Values in a JSON document, itself included.
fn values(v: &Value) -> usize {
    1 + match v {
        Value::Array(a) => a.iter().map(values).sum(),
        Value::Object(o) => o.values().map(values).sum(),
        _ => 0,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn test_generated_schemas_are_in_the_subset_and_normalize_stably(s in params_schema()) {
        let normalized = check_schema(&s).map_err(|e| TestCaseError::fail(format!("{s}: {e}")))?;
        prop_assert_eq!(check_schema(&normalized).unwrap(), normalized);
    }

    #[test]
    fn test_params_the_generator_says_fit_do_and_extra_keys_are_refused(
        (schema, params, verdict) in schema_and_params()
    ) {
        let compiled = compile(&check_schema(&schema).unwrap()).unwrap();
        let got = compiled.validate(&params);
        if let Err(e) = &got {
            prop_assert_eq!(e.sqlstate(), "22023");
        }
        if let Some(fits) = verdict {
            prop_assert_eq!(got.is_ok(), fits, "schema {} params {}: {:?}", schema, params, got);
        }
    }

    #[test]
    fn test_hostile_schemas_are_refused_cleanly_or_normalize_stably(s in hostile_params_schema()) {
        match check_schema(&s) {
            Err(e) => {
                prop_assert_eq!(e.sqlstate(), "22023");
                let msg = e.to_string();
                prop_assert!(msg.chars().count() < 1000, "{}", msg);
            }
            Ok(normalized) => {
                prop_assert_eq!(check_schema(&normalized).unwrap(), normalized.clone());
                prop_assert!(compile(&normalized).is_ok());
            }
        }
    }

    // The fuzzer fits params to whatever schema keyturn stored (normalized),
    // hostile ones too: 60 nested arrays took its generator past 24 GB once.
    #[test]
    fn test_params_fitted_to_any_schema_stay_within_the_budget(
        (schema, params) in hostile_params_schema()
            .prop_filter_map("refused", |s| check_schema(&s).ok())
            .prop_flat_map(|s| (Just(s.clone()), fitting(&s)))
    ) {
        prop_assert!(
            values(&params) <= BUDGET + values(&schema),
            "{} values for schema {}", values(&params), schema
        );
    }
}
