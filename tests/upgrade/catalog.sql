-- Everything pg_keyturn puts in a database, one sorted line per fact, for
-- comparing an upgraded database with a fresh install (tests/upgrade-check).
-- Column order is left out on purpose: ALTER TABLE ADD COLUMN appends, and
-- keyturn's code never depends on column positions.
WITH ext AS (SELECT oid FROM pg_extension WHERE extname = 'pg_keyturn'),
schemas AS (SELECT oid, nspname FROM pg_namespace WHERE nspname IN ('keyturn', 'keyturn_secret')),
facts (line) AS (
    SELECT 'member ' || pg_describe_object(d.classid, d.objid, d.objsubid)
      FROM pg_depend d, ext WHERE d.refclassid = 'pg_extension'::regclass AND d.refobjid = ext.oid AND d.deptype = 'e'
    UNION ALL
    SELECT 'config ' || c::regclass::text FROM pg_extension e, ext, unnest(e.extconfig) c WHERE e.oid = ext.oid
    UNION ALL
    SELECT format('schema %s acl=%s', s.nspname, n.nspacl) FROM schemas s JOIN pg_namespace n ON n.oid = s.oid
    UNION ALL
    SELECT format('relation %I.%I kind=%s rls=%s force=%s options=%s acl=%s', s.nspname, c.relname, c.relkind,
                  c.relrowsecurity, c.relforcerowsecurity, c.reloptions, c.relacl)
      FROM pg_class c JOIN schemas s ON s.oid = c.relnamespace
     WHERE c.relkind IN ('r', 'p', 'S', 'v', 'm')
    UNION ALL
    SELECT format('column %I.%I.%I %s notnull=%s default=%s storage=%s identity=%s', s.nspname, c.relname, a.attname,
                  format_type(a.atttypid, a.atttypmod), a.attnotnull, pg_get_expr(ad.adbin, ad.adrelid),
                  a.attstorage, a.attidentity)
      FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid JOIN schemas s ON s.oid = c.relnamespace
      LEFT JOIN pg_attrdef ad ON ad.adrelid = a.attrelid AND ad.adnum = a.attnum
     WHERE c.relkind IN ('r', 'p') AND a.attnum > 0 AND NOT a.attisdropped
    UNION ALL
    SELECT format('constraint %s %s', conrelid::regclass, pg_get_constraintdef(oid))
      FROM pg_constraint WHERE connamespace IN (SELECT oid FROM schemas)
    UNION ALL
    SELECT 'index ' || pg_get_indexdef(i.indexrelid)
      FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid WHERE c.relnamespace IN (SELECT oid FROM schemas)
    UNION ALL
    SELECT format('trigger %s %s', t.tgrelid::regclass, pg_get_triggerdef(t.oid))
      FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
     WHERE c.relnamespace IN (SELECT oid FROM schemas) AND NOT t.tgisinternal
    UNION ALL
    SELECT format('policy %s %s %s using=%s check=%s roles=%s', p.polrelid::regclass, p.polname, p.polcmd,
                  pg_get_expr(p.polqual, p.polrelid), pg_get_expr(p.polwithcheck, p.polrelid), p.polroles::regrole[])
      FROM pg_policy p JOIN pg_class c ON c.oid = p.polrelid WHERE c.relnamespace IN (SELECT oid FROM schemas)
    UNION ALL
    SELECT format('function %s acl=%s', p.oid::regprocedure, p.proacl) || E'\n' || pg_get_functiondef(p.oid)
      FROM pg_proc p WHERE p.pronamespace IN (SELECT oid FROM schemas)
    UNION ALL
    SELECT format('type %s %s', t.oid::regtype, (SELECT string_agg(e.enumlabel, ',' ORDER BY e.enumsortorder)
                                                  FROM pg_enum e WHERE e.enumtypid = t.oid))
      FROM pg_type t WHERE t.typnamespace IN (SELECT oid FROM schemas) AND t.typtype = 'e'
    UNION ALL
    SELECT 'transition ' || from_status || ' -> ' || to_status FROM keyturn.transition
)
SELECT line FROM facts ORDER BY line;
