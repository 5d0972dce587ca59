use pgrx::prelude::*;

#[pg_schema]
mod tests {
    use pgrx::prelude::*;

    fn rounds(ids: &str) -> Option<Vec<Option<i32>>> {
        Spi::get_one::<Vec<Option<i32>>>(&format!("SELECT keyturn._batch_rounds({ids}::uuid[])"))
            .unwrap()
    }

    #[pg_test]
    fn test_batch_rounds_is_null_when_every_action_occurs_once() {
        assert_eq!(rounds("'{}'"), None);
        assert_eq!(
            rounds("ARRAY['00000000-0000-0000-0000-000000000001', '00000000-0000-0000-0000-000000000002']"),
            None
        );
    }

    #[pg_test]
    fn test_batch_rounds_counts_each_occurrence_and_nulls_as_one_action() {
        let a = "'00000000-0000-0000-0000-00000000000a'";
        let b = "'00000000-0000-0000-0000-00000000000b'";
        assert_eq!(
            rounds(&format!("ARRAY[{a}, {b}, {a}, NULL, {a}, NULL]")),
            Some([1, 1, 2, 1, 3, 2].map(Some).to_vec())
        );
    }

    #[pg_test]
    fn test_batch_check_arrays_returns_the_length() {
        assert_eq!(
            Spi::get_one::<i32>("SELECT keyturn._batch_check_arrays(1000, 1000, 'x')"),
            Ok(Some(1000))
        );
    }

    #[pg_test(error = "keyturn: action_ids and outcomes must be arrays of equal length")]
    fn test_batch_check_arrays_refuses_a_null_array() {
        let _ = Spi::run("SELECT keyturn._batch_check_arrays(2, NULL, 'action_ids and outcomes')");
    }

    #[pg_test(error = "keyturn: at most 1000 elements per batch, not 1001")]
    fn test_batch_check_arrays_refuses_more_than_1000() {
        let _ = Spi::run("SELECT keyturn._batch_check_arrays(1001, 1001, 'x')");
    }

    #[pg_test]
    fn test_require_text_returns_the_value() {
        assert_eq!(
            Spi::get_one::<String>("SELECT keyturn._require_text(' acme ', 'tenant')"),
            Ok(Some(" acme ".to_owned()))
        );
    }

    #[pg_test(error = "keyturn: tenant must be a non-empty string")]
    fn test_require_text_refuses_null() {
        let _ = Spi::run("SELECT keyturn._require_text(NULL, 'tenant')");
    }

    #[pg_test]
    fn test_lease_args_accept_the_bounds() {
        Spi::run("SELECT keyturn._check_lease_args('w', 1, '1 second'), keyturn._check_lease_args('w', 1000, '1 hour')")
            .unwrap();
    }

    #[pg_test(error = "keyturn: lease_for must be from 1 second to 1 hour, not 1 day")]
    fn test_lease_args_compare_intervals_as_postgresql_does() {
        // One day is past an hour though its microseconds field is zero.
        let _ = Spi::run("SELECT keyturn._check_lease_args('w', 1, '1 day')");
    }

    #[pg_test(error = "keyturn: worker must be a non-empty string")]
    fn test_lease_args_refuse_a_blank_worker() {
        let _ = Spi::run("SELECT keyturn._check_lease_args('  ', 1, '30 seconds')");
    }

    #[pg_test(error = "keyturn: max_jobs must be from 1 to 1000, not NULL")]
    fn test_lease_args_refuse_a_null_max_jobs() {
        let _ = Spi::run("SELECT keyturn._check_lease_args('w', NULL, '30 seconds')");
    }
}
