use pgrx::prelude::*;

#[pg_schema]
mod tests {
    use pgrx::prelude::*;

    #[pg_test]
    fn test_canonical_json_sorts_keys_and_normalizes_numbers() {
        let text = Spi::get_one::<String>(
            r#"SELECT keyturn.canonical_json('{"b": 4.50, "a": [1E30, "x"]}'::jsonb)"#,
        );
        assert_eq!(text, Ok(Some(r#"{"a":[1e+30,"x"],"b":4.5}"#.to_string())));
    }

    #[pg_test]
    fn test_params_hash_is_sha256_of_canonical_envelope() {
        let hash = Spi::get_one::<String>(
            r#"SELECT keyturn.params_hash('send_email', '{"to": "a@b.c"}'::jsonb)"#,
        );
        let expected = Spi::get_one::<String>(
            r#"SELECT encode(sha256(convert_to('{"params":{"to":"a@b.c"},"tool":"send_email"}', 'UTF8')), 'hex')"#,
        );
        assert_eq!(hash, expected);
    }

    #[pg_test(
        error = "keyturn: number 9007199254740993 cannot be represented exactly as an IEEE-754 double, so two different values would share one hash; send it as a string"
    )]
    fn test_params_hash_rejects_inexact_integer() {
        let _ = Spi::get_one::<String>(
            r#"SELECT keyturn.params_hash('t', '{"n": 9007199254740993}'::jsonb)"#,
        );
    }

    #[pg_test(error = "keyturn: JSON nesting is deeper than 64 levels; flatten the params")]
    fn test_canonical_json_refuses_deep_nesting_with_22023_not_a_panic() {
        // 200 levels: past serde_json's own limit too, which must not surface as XX000.
        let _ = Spi::get_one::<String>(&format!(
            "SELECT keyturn.canonical_json('{}1{}'::jsonb)",
            "[".repeat(200),
            "]".repeat(200)
        ));
    }

    #[pg_test]
    fn test_canonical_json_accepts_nesting_within_the_limit() {
        let ok = Spi::get_one::<String>(&format!(
            "SELECT keyturn.canonical_json('{}1{}'::jsonb)",
            "[".repeat(60),
            "]".repeat(60)
        ));
        assert_eq!(ok.unwrap().unwrap().len(), 121);
    }

    #[pg_test]
    fn test_canonical_json_is_null_on_null() {
        assert_eq!(
            Spi::get_one::<String>("SELECT keyturn.canonical_json(NULL)"),
            Ok(None)
        );
    }

    /// propose's one-parse check agrees with the three separate calls it replaced.
    #[pg_test]
    fn test_inspect_params_agrees_with_the_separate_checks() {
        let schema = r#"'{"type": "object", "properties": {"to": {"type": "string"}}, "required": ["to"], "additionalProperties": false}'"#;
        let row = |params: &str, schema: &str| {
            Spi::get_three::<String, String, String>(&format!(
                "SELECT * FROM keyturn._inspect_params('send_email', '{params}'::jsonb, {schema}::jsonb)"
            ))
            .unwrap()
        };
        let (path, hash, errors) = row(r#"{"to": "a@b.c"}"#, schema);
        assert_eq!(path, None);
        assert_eq!(
            hash,
            Spi::get_one::<String>(
                r#"SELECT keyturn.params_hash('send_email', '{"to": "a@b.c"}'::jsonb)"#
            )
            .unwrap()
        );
        assert_eq!(errors, None);

        let (_, _, errors) = row(r#"{"to": 7}"#, schema);
        let separate = Spi::get_one::<String>(&format!(
            r#"SELECT keyturn._params_errors({schema}::jsonb, '{{"to": 7}}'::jsonb)"#
        ))
        .unwrap();
        assert!(errors.is_some());
        assert_eq!(errors, separate);

        // No schema to check: JSON null.
        let (_, hash, errors) = row(r#"{"anything": [1, 2]}"#, "'null'");
        assert!(hash.is_some());
        assert_eq!(errors, None);

        // Credential material: its path, and nothing else computed.
        let (path, hash, errors) = row(r#"{"to": "a@b.c", "api_key": "x"}"#, schema);
        assert!(path.is_some());
        assert_eq!(
            path,
            Spi::get_one::<String>(
                r#"SELECT keyturn._credential_path('{"to": "a@b.c", "api_key": "x"}'::jsonb)"#
            )
            .unwrap()
        );
        assert_eq!((hash, errors), (None, None));
    }

    #[pg_test(
        error = "keyturn: number 9007199254740993 cannot be represented exactly as an IEEE-754 double, so two different values would share one hash; send it as a string"
    )]
    fn test_inspect_params_refuses_an_inexact_number_as_params_hash_does() {
        let _ = Spi::get_one::<String>(
            r#"SELECT params_hash FROM keyturn._inspect_params('t', '{"n": 9007199254740993}'::jsonb, 'null'::jsonb)"#,
        );
    }
}
