-- keyturn 0.1.0: the five group roles (docs/sql-api.md, "Roles").
-- Roles are cluster-wide, so they may predate this database's install (another
-- database, or a previous install). Create only what is missing; never alter.
DO $$
DECLARE
    r text;
BEGIN
    FOREACH r IN ARRAY ARRAY['keyturn_agent', 'keyturn_approver', 'keyturn_dispatcher',
                             'keyturn_operator', 'keyturn_admin']
    LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = r) THEN
            EXECUTE pg_catalog.format('CREATE ROLE %I NOLOGIN', r);
        END IF;
    END LOOP;
END
$$;
