-- Benchmark fixture, loaded as superuser after tests/fixtures/crm.sql.
--
-- One login role, bench_app, plays the application: it holds no privileges of
-- its own (NOINHERIT) and switches with SET LOCAL ROLE to app_agent for the
-- agent's transaction and to app_human for the human's, as an app with one
-- pool and two parts would. Separation of duties still holds: approve looks at
-- current_user and the SET ROLE role, both app_human.
--
-- The "bare" schema is what a team would write by hand for the same work.

CREATE ROLE bench_app LOGIN NOINHERIT IN ROLE app_agent, app_human;
-- bench_app with keyturn.notify off, for item 7's "off" side (only a
-- superuser may set it, so it is the role's setting).
CREATE ROLE bench_quiet LOGIN NOINHERIT IN ROLE app_agent, app_human;
ALTER ROLE bench_quiet SET keyturn.notify = off;

-- 100k deals, 64 principals of tenant acme (pgbench client n acts as p<n>).
INSERT INTO crm.deal (id, tenant, owner, name, stage, amount)
SELECT i, 'acme', 'p' || (i % 64), 'Deal ' || i, 'lead', 1000 + i % 5000
  FROM generate_series(1, 100000) i;

SELECT keyturn.register_tool('deal.set_stage', $${
    "executor": "sql",
    "summary": "Set {set.stage} on {count} deal(s)",
    "effect": "reversible",
    "max_targets": 10,
    "sql": {"table": "crm.deal", "key": "id", "set": ["stage"], "where": ["id"]}
}$$);
SELECT keyturn.register_tool('email.send', $${
    "executor": "external",
    "provider": "webhook",
    "summary": "Send email to {to} about \"{subject}\"",
    "params_schema": {
        "type": "object",
        "properties": {
            "to": {"type": "string", "format": "email"},
            "subject": {"type": "string", "maxLength": 200},
            "body": {"type": "string", "maxLength": 10000}
        },
        "required": ["to", "subject"]
    }
}$$);
SELECT count(*) FROM (
    SELECT keyturn.add_member('acme', 'p' || i, 'member'),
           keyturn.grant_tool('acme', 'p' || i, 'deal.set_stage'),
           keyturn.grant_tool('acme', 'p' || i, 'email.send')
      FROM generate_series(0, 63) i) s;

-- Item chain's other side: a tenant per client (m<n>, p<n> its member, 2,000
-- deals from 200,001 + 2,000 n), so no two clients' commits share an audit
-- chain (pgbench/gate_flow_tenants.sql).
INSERT INTO crm.deal (id, tenant, owner, name, stage, amount)
SELECT 200000 + n * 2000 + j, 'm' || n, 'p' || n, 'Deal ' || j, 'lead', 1000 + j
  FROM generate_series(0, 63) n, generate_series(1, 2000) j;
SELECT count(*) FROM (
    SELECT keyturn.add_member('m' || n, 'p' || n, 'member'),
           keyturn.grant_tool('m' || n, 'p' || n, 'deal.set_stage')
      FROM generate_series(0, 63) n) s;

CREATE SCHEMA bare;
GRANT USAGE ON SCHEMA bare TO app_agent, app_human;

-- Item 1 (bare flow): proposal row + sha256 of params, claim, event.
CREATE TABLE bare.proposal (
    id           uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    tenant       text        NOT NULL,
    principal    text        NOT NULL,
    tool         text        NOT NULL,
    params       jsonb       NOT NULL,
    params_hash  text        NOT NULL,
    status       text        NOT NULL DEFAULT 'pending',
    created_at   timestamptz NOT NULL DEFAULT now(),
    approved_by  text,
    approved_at  timestamptz
);
CREATE TABLE bare.event (
    id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    proposal_id  uuid        NOT NULL,
    tenant       text        NOT NULL,
    principal    text        NOT NULL,
    to_status    text        NOT NULL,
    at           timestamptz NOT NULL DEFAULT now()
);
GRANT SELECT, INSERT ON bare.proposal TO app_agent;
GRANT SELECT, UPDATE ON bare.proposal TO app_human;
GRANT INSERT ON bare.event TO app_human;

-- Item 1b (lean flow): one login that may do all of it itself, no role
-- switching, no identity; it bypasses row-level security instead (and is in
-- none of keyturn's groups).
CREATE ROLE bench_lean LOGIN BYPASSRLS;
GRANT USAGE ON SCHEMA bare, crm TO bench_lean;
GRANT SELECT, INSERT, UPDATE ON bare.proposal TO bench_lean;
GRANT INSERT ON bare.event TO bench_lean;
GRANT SELECT, UPDATE ON crm.deal TO bench_lean;

-- Item 2 (plain INSERT): the same row keyturn.propose stores, same table shape
-- (columns, defaults, checks and all nine indexes), no function, no trigger.
CREATE TABLE bare.action (LIKE keyturn.action INCLUDING ALL);
GRANT SELECT, INSERT ON bare.action TO app_agent;

-- Item 3 (bare worker): the same 20,000 jobs as a plain queue.
CREATE TABLE bare.job (
    id               uuid        PRIMARY KEY,
    tenant           text        NOT NULL,
    tool             text        NOT NULL,
    params           jsonb       NOT NULL,
    idempotency_key  text        NOT NULL,
    status           text        NOT NULL DEFAULT 'queued',
    lease_id         uuid,
    lease_expires_at timestamptz,
    receipt          jsonb,
    updated_at       timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX job_queued_idx ON bare.job (id) WHERE status = 'queued';
GRANT SELECT, UPDATE ON bare.job TO app_dispatcher;
GRANT USAGE ON SCHEMA bare TO app_dispatcher;

-- Tokens of pre-proposed actions (items 3, 4), handed from agent to human.
CREATE TABLE bare.token (n int PRIMARY KEY, action_id uuid NOT NULL, token text NOT NULL);
GRANT SELECT, INSERT ON bare.token TO app_agent, app_human;

-- Item latency (approve alone): each client's pending proposals, made before
-- the timed run by tests/bench/latency.sh, approved in order k = 1, 2, … by
-- pgbench client <client> (side 'gate': keyturn.propose's id and token; side
-- 'lean': a bare.proposal id).
CREATE TABLE bare.pending (
    side      text NOT NULL,
    client    int  NOT NULL,
    k         int  NOT NULL,
    action_id uuid NOT NULL,
    token     text,
    PRIMARY KEY (side, client, k)
);
GRANT SELECT, INSERT ON bare.pending TO app_agent;
GRANT SELECT ON bare.pending TO app_human, bench_lean;

VACUUM ANALYZE;
