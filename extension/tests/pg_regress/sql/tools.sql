-- Tool registration and classification, the admin's view.
BEGIN;
CREATE TABLE public.ticket (id int PRIMARY KEY, tenant text, status text, assignee text);
SELECT keyturn.register_tool('list_tickets', '{"kind": "read"}');
SELECT keyturn.register_tool('close_ticket', '{"executor": "sql", "summary": "Close {count} ticket(s)",
  "sql": {"table": "public.ticket", "key": "id", "set": ["status"], "where": ["id", "assignee"]}}');
SELECT keyturn.register_tool('close_ticket', '{"executor": "sql", "effect": "reversible",
  "sql": {"table": "public.ticket", "key": "id", "set": ["status"], "where": ["id"]}}') AS new_version;
SELECT keyturn.register_tool('send_email', '{"executor": "external", "provider": "smtp", "retain": "digest",
  "targets_param": "to", "max_targets": 5,
  "params_schema": {"type": "object", "properties": {"to": {"type": "array", "items": {"type": "string", "format": "email"}},
                    "subject": {"type": "string"}}, "required": ["to", "subject"]}}');
SELECT name, version, enabled FROM keyturn.tool ORDER BY name;
SELECT spec FROM keyturn.tool_version WHERE tool = 'send_email';
SELECT t, keyturn.classify(t) FROM unnest(ARRAY['list_tickets', 'close_ticket', 'send_email', 'nope', NULL]) AS t;
SELECT keyturn.set_tool_enabled('list_tickets', false);
SELECT keyturn.classify('list_tickets');
-- Fail closed on anything the spec does not say exactly.
SAVEPOINT s;
SELECT keyturn.register_tool('bad', '{"executor": "sql", "confirm": true}');
ROLLBACK TO s;
SELECT keyturn.register_tool('bad', '{"kind": "write"}');
ROLLBACK TO s;
SELECT keyturn.register_tool('bad', '{"executor": "external", "provider": "webhook", "expires_in": "8 days"}');
ROLLBACK TO s;
SELECT keyturn.register_tool('bad', '{"executor": "sql", "retain": "digest", "sql": {"table": "public.ticket", "key": "id", "set": ["status"], "where": ["id"]}}');
ROLLBACK TO s;
SELECT keyturn.register_tool('bad', '{"executor": "sql", "sql": {"table": "public.ticket", "key": "id", "set": ["status; DROP TABLE ticket"], "where": ["id"]}}');
ROLLBACK TO s;
SELECT keyturn.register_tool('bad', '{"executor": "sql", "sql": {"table": "public.nope", "key": "id", "set": ["status"], "where": ["id"]}}');
ROLLBACK TO s;
SELECT keyturn.register_tool('sеnd_email', '{"executor": "external", "provider": "smtp"}');
ROLLBACK TO s;
SELECT keyturn.register_tool('bad', '{"executor": "external", "provider": "webhook", "params_schema": {"type": "object", "patternProperties": {}}}');
ROLLBACK TO s;
SELECT keyturn.set_tool_enabled('nope', true);
ROLLBACK;
