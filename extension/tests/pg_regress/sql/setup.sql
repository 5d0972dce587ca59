-- Run once after the regression database is (re)created.
CREATE EXTENSION pg_keyturn;
SELECT rolname, rolcanlogin FROM pg_roles WHERE rolname LIKE 'keyturn\_%' ORDER BY rolname;
-- The roles of the gate test: an agent role, a human role, an admin role,
-- and the login that switches between them per request, as a PostgREST
-- authenticator does. It must be NOINHERIT: a login that inherits the agent's
-- role may not approve.
CREATE ROLE rg_agent IN ROLE keyturn_agent;
CREATE ROLE rg_human IN ROLE keyturn_approver;
CREATE ROLE rg_admin IN ROLE keyturn_admin;
CREATE ROLE rg_auth LOGIN NOINHERIT IN ROLE rg_agent, rg_human, rg_admin;
CREATE TABLE public.rg_deal (id int PRIMARY KEY, tenant text NOT NULL, stage text NOT NULL);
ALTER TABLE public.rg_deal ENABLE ROW LEVEL SECURITY;
CREATE POLICY rg_deal_tenant ON public.rg_deal USING (tenant = keyturn.current_tenant());
GRANT SELECT ON public.rg_deal TO rg_agent;
GRANT SELECT, UPDATE ON public.rg_deal TO rg_human;
INSERT INTO public.rg_deal VALUES (1, 'acme', 'lead'), (2, 'acme', 'lead'), (3, 'globex', 'lead');
