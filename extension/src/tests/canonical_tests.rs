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

    #[pg_test(error = "keyturn: number 9007199254740993 cannot be represented exactly")]
    fn test_params_hash_rejects_inexact_integer() {
        let _ = Spi::get_one::<String>(
            r#"SELECT keyturn.params_hash('t', '{"n": 9007199254740993}'::jsonb)"#,
        );
    }
}
