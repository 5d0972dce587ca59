use pgrx::prelude::*;

#[pg_schema]
mod tests {
    use pgrx::prelude::*;

    #[pg_test(
        error = "keyturn: current_user is a member of keyturn_agent (or a superuser) and may not approve"
    )]
    fn test_superuser_never_approves() {
        Spi::run("SELECT * FROM keyturn.approve(gen_random_uuid(), 'token')").unwrap();
    }

    #[pg_test(
        error = "keyturn: current_user is a member of keyturn_agent (or a superuser) and may not preview"
    )]
    fn test_agent_member_never_previews() {
        Spi::run("CREATE ROLE kt_test_both IN ROLE keyturn_agent, keyturn_approver; SET LOCAL ROLE kt_test_both").unwrap();
        Spi::run("SELECT keyturn.preview(gen_random_uuid(), 'token')").unwrap();
    }

    #[pg_test]
    fn test_token_binding_detects_each_changed_field() {
        let binds = |sql: &str| Spi::get_one::<bool>(sql).unwrap().unwrap();
        let base = "keyturn._token_binding('tok', '00000000-0000-0000-0000-000000000001', 'h', '2030-01-01Z', '{\"turn_id\": \"t\"}')";
        assert!(binds(&format!(
            "SELECT keyturn._token_binds('tok', '00000000-0000-0000-0000-000000000001', 'h', '2030-01-01Z', '{{\"turn_id\":\"t\"}}', {base})"
        )));
        assert!(!binds(&format!(
            "SELECT keyturn._token_binds('tok', '00000000-0000-0000-0000-000000000001', 'h', '2030-01-01Z', '{{\"turn_id\":\"u\"}}', {base})"
        )));
        for (tok, id, hash, exp) in [
            (
                "tok2",
                "00000000-0000-0000-0000-000000000001",
                "h",
                "2030-01-01Z",
            ),
            (
                "tok",
                "00000000-0000-0000-0000-000000000002",
                "h",
                "2030-01-01Z",
            ),
            (
                "tok",
                "00000000-0000-0000-0000-000000000001",
                "h2",
                "2030-01-01Z",
            ),
            (
                "tok",
                "00000000-0000-0000-0000-000000000001",
                "h",
                "2030-01-02Z",
            ),
        ] {
            assert!(!binds(&format!(
                "SELECT keyturn._token_binds('{tok}', '{id}', '{hash}', '{exp}', '{{\"turn_id\":\"t\"}}', {base})"
            )));
        }
    }

    #[pg_test]
    fn test_tokens_are_fresh_and_url_safe() {
        let (a, b) =
            Spi::get_two::<String, String>("SELECT keyturn._token_new(), keyturn._token_new()")
                .unwrap();
        let (a, b) = (a.unwrap(), b.unwrap());
        assert_ne!(a, b);
        assert_eq!(a.len(), 43);
        assert!(a
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'));
    }

    #[pg_test(
        error = "keyturn: this role bypasses row-level security; keyturn runs business reads and writes only under RLS"
    )]
    fn test_exec_as_refuses_rls_bypassing_roles() {
        Spi::run("SELECT keyturn._exec_as('postgres'::regrole, 'SELECT NULL::jsonb', '{}')")
            .unwrap();
    }
}
