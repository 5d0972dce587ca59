use pgrx::prelude::*;

#[pg_schema]
mod tests {
    use pgrx::prelude::*;

    fn identity() -> (Option<String>, Option<String>, Option<String>) {
        Spi::get_three::<String, String, String>(
            "SELECT keyturn.current_tenant(), keyturn.current_principal(), keyturn.current_session()",
        )
        .expect("identity query")
    }

    #[pg_test]
    fn test_identity_from_gucs() {
        Spi::run("SET LOCAL keyturn.tenant = 'acme'; SET LOCAL keyturn.principal = 'alice'; SET LOCAL keyturn.session = 's1'").unwrap();
        assert_eq!(
            identity(),
            (Some("acme".into()), Some("alice".into()), Some("s1".into()))
        );
    }

    #[pg_test]
    fn test_claims_win_and_are_never_mixed_with_gucs() {
        Spi::run("SET LOCAL keyturn.tenant = 'guc_t'; SET LOCAL keyturn.principal = 'guc_p'; SET LOCAL keyturn.session = 'guc_s'").unwrap();
        Spi::run(r#"SET LOCAL request.jwt.claims = '{"tenant_id": "jwt_t", "sub": "jwt_p"}'"#)
            .unwrap();
        // session_id is missing from the claims: missing, not taken from the GUC.
        assert_eq!(
            identity(),
            (Some("jwt_t".into()), Some("jwt_p".into()), None)
        );
    }

    #[pg_test]
    fn test_malformed_claims_are_missing_identity() {
        Spi::run("SET LOCAL keyturn.tenant = 'guc_t'").unwrap();
        for claims in [
            "{}",
            "[1]",
            "not json",
            r#"{"tenant_id": 7}"#,
            r#"{"tenant_id": ""}"#,
        ] {
            Spi::run(&format!(
                "SET LOCAL request.jwt.claims = {}",
                pgrx::spi::quote_literal(claims)
            ))
            .unwrap();
            assert_eq!(
                identity().0,
                None,
                "claims {claims:?} must not yield a tenant"
            );
        }
    }

    #[pg_test]
    fn test_empty_claims_fall_back_to_gucs_and_empty_gucs_are_missing() {
        Spi::run("SET LOCAL request.jwt.claims = ''; SET LOCAL keyturn.tenant = 'guc_t'; SET LOCAL keyturn.principal = ''").unwrap();
        let (tenant, principal, _) = identity();
        assert_eq!(tenant, Some("guc_t".into()));
        assert_eq!(principal, None);
    }

    #[pg_test(
        error = "keyturn: missing identity (tenant=<missing>, principal=<missing>, session=<missing>)"
    )]
    fn test_propose_without_identity_is_refused() {
        Spi::run("SELECT * FROM keyturn.propose('any_tool', '{}')").unwrap();
    }
}
