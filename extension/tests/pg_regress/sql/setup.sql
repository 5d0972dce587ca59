-- Run once after the regression database is (re)created.
CREATE EXTENSION pg_keyturn;
SELECT rolname, rolcanlogin FROM pg_roles WHERE rolname LIKE 'keyturn\_%' ORDER BY rolname;
