-- pg_keyturn 0.1.0 -> 0.2.0: after the code (hand-written; runs last).

-- Actions approved under 0.1.0 carry no approval MAC, which lease and
-- begin_dispatch now require: the upgrade vouches for the approvals it
-- finds (0.1.0 gave those statuses only through approve) and binds them.
UPDATE keyturn.action a
   SET approved_via = 'approve',
       approval_mac = keyturn._approval_mac(a.id, a.params_hash, a.approved_by, a.approved_role,
                                            a.approved_at, 'approve')
 WHERE a.approved_at IS NOT NULL AND a.approved_by IS NOT NULL AND a.approved_role IS NOT NULL
   AND a.approval_mac IS NULL;
