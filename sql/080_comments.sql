-- What a DBA sees in \d+ and \df+: every schema, table, type, public
-- function and role of keyturn says what it is for. The reference is
-- docs/sql-api.md; these are the one-line reminders.

COMMENT ON SCHEMA keyturn IS
    'keyturn: a human-approval gate for AI-agent writes. Agents propose, people approve exactly what was proposed, once; state changes only through these functions (docs/sql-api.md).';
COMMENT ON SCHEMA keyturn_secret IS
    'keyturn''s approval key. No role but the extension owner may read it; keyturn.check_deployment() reports any grant.';
COMMENT ON TYPE keyturn.status IS
    'The status of an action. Legal changes: keyturn.transition. Final: keyturn._is_final().';

COMMENT ON TABLE keyturn.transition IS 'Every legal status change of an action; the status guard refuses any other.';
COMMENT ON TABLE keyturn.tool IS 'Registered tools (global): the current version and whether it is enabled.';
COMMENT ON TABLE keyturn.tool_version IS 'Every registered version of every tool, immutable; proposals are bound to one.';
COMMENT ON TABLE keyturn.member IS 'Who belongs to which tenant, as member, approver or admin.';
COMMENT ON TABLE keyturn.tool_grant IS 'Which principal may propose (and approve) which tool, with an optional scope, end and number of uses.';
COMMENT ON TABLE keyturn.auth_epoch IS 'Per principal, bumped on every real membership or grant change; a changed epoch invalidates proposals.';
COMMENT ON TABLE keyturn.cancelled_origin IS 'Conversations that ended (cancelled or archived): they start no new actions.';
COMMENT ON TABLE keyturn.request IS 'Human messages recorded by the human side: the approval of task tools'' calls.';
COMMENT ON TABLE keyturn.action IS 'Immutable proposals and their lifecycle. Columns fixed at propose time never change.';
COMMENT ON TABLE keyturn.open_action IS 'The work list: one narrow row per action that is not final, kept by the lifecycle trigger.';
COMMENT ON TABLE keyturn.action_target IS 'sql tools: each target''s key and before-state version, fixed at propose time.';
COMMENT ON TABLE keyturn.staged_payload IS 'Digest-retained external actions: the approved params, from approve until a final status.';
COMMENT ON TABLE keyturn.vote IS 'Quorum votes, one per principal and action.';
COMMENT ON TABLE keyturn.delegation IS 'Standing approvals: what a person approves in advance, within a scope, uses and time.';
COMMENT ON TABLE keyturn.staged_file IS 'Private attachments: the bytes, bound to one action, deleted with its final status.';
COMMENT ON TABLE keyturn.stager IS 'One row per principal that staged a file: the lock its stagings take to count the quota.';
COMMENT ON TABLE keyturn.card_link IS 'One-time codes of card links (digests only) and the card sessions they were redeemed for.';
COMMENT ON TABLE keyturn.audit_chain IS 'Each tenant''s audit chain head: its event count and last hash (sql/059_audit.sql).';
COMMENT ON TABLE keyturn.evidence IS 'Evidence recorded by the trusted side (a person, or keyturn.fence): kind, reference and SHA-256, which proposals cite.';
COMMENT ON TABLE keyturn.projection IS 'Read-side projections: the current version per provider.';
COMMENT ON TABLE keyturn.projection_version IS 'Every registered projection spec: which fields of a provider''s data may reach a prompt.';
COMMENT ON TABLE keyturn.attempt IS 'One row per provider attempt; kept after reconciliation.';
COMMENT ON TABLE keyturn.event IS 'The audit log: one row per status change (and per quorum vote), hash-chained per tenant; append-only, even for the owner.';
COMMENT ON TABLE keyturn.usage IS 'Metering: one row per action that reached succeeded; append-only.';
COMMENT ON TABLE keyturn_secret.approval_key IS 'The key of the approval binding (an HMAC proving an approval, not a table write, moved an action on).';

COMMENT ON FUNCTION keyturn.current_tenant() IS 'The calling tenant, from request.jwt.claims or keyturn.tenant (transaction-local only); NULL if missing.';
COMMENT ON FUNCTION keyturn.current_principal() IS 'The calling principal, from request.jwt.claims or keyturn.principal (transaction-local only); NULL if missing.';
COMMENT ON FUNCTION keyturn.current_session() IS 'The calling session, from request.jwt.claims or keyturn.session (transaction-local only); NULL if missing.';
COMMENT ON FUNCTION keyturn.canonical_json(jsonb) IS 'The RFC 8785 canonical text keyturn hashes; 22023 for numbers a double cannot hold exactly.';
COMMENT ON FUNCTION keyturn.params_hash(text, jsonb) IS 'Lowercase hex SHA-256 of the canonical form of {"params": params, "tool": tool}.';
COMMENT ON FUNCTION keyturn.classify(text) IS 'read, write or unsupported; never errors.';
COMMENT ON FUNCTION keyturn.issue_token(uuid) IS 'Human: a fresh token for a pending action the caller may decide (from the queue); the previous token stops working.';
COMMENT ON FUNCTION keyturn.link_code(uuid[], interval) IS 'Human and dispatcher: a one-time code for a card link to these actions, for a person who may decide them all; no credential in any URL.';
COMMENT ON FUNCTION keyturn.redeem_link_code(text, uuid[]) IS 'Dispatcher (keyturnd): redeems a link code once for a 15-minute card session with fresh tokens; no rows for a used, expired or unknown code.';
COMMENT ON FUNCTION keyturn.card_session(text) IS 'Dispatcher (keyturnd): the role, claims and actions of a live card session''s bearer; no rows otherwise.';
COMMENT ON FUNCTION keyturn.action_counts(text, text, timestamptz, timestamptz) IS 'Operator, admin: how many actions are in each status (every status, zeros included), by tenant, tool and creation time.';
COMMENT ON FUNCTION keyturn.find_actions(text, text, text, timestamptz, timestamptz, uuid, int) IS 'Operator, admin: the actions that match (status, tenant, tool, creation time, or one id), newest first; never a param value or a summary.';
COMMENT ON FUNCTION keyturn.tools() IS 'Operator, admin: every tool with its current version''s class and whether it is enabled.';
COMMENT ON FUNCTION keyturn.standing_approvals(text) IS 'Operator, admin: every standing approval (of one tenant), with why it ended.';
COMMENT ON FUNCTION keyturn.verify_audit(text) IS 'Operator, admin: recomputes a tenant''s hash chain; false and the first event that no longer verifies when any was changed, deleted, reordered or inserted.';
COMMENT ON FUNCTION keyturn.audit_export(text, timestamptz) IS 'Operator, admin: a tenant''s events since a time, each one JSON object of all its columns, for keyturnd audit-verify.';
COMMENT ON FUNCTION keyturn.audit_head(text) IS 'Operator, admin: a tenant''s chain head (events, last hash), to anchor elsewhere.';
COMMENT ON FUNCTION keyturn.record_evidence(text, text, text) IS 'Human: records evidence the person saw (kind, reference, SHA-256) for proposals to cite; an agent never records evidence.';
COMMENT ON FUNCTION keyturn.revoke_evidence(uuid) IS 'The principal that recorded it: ends a piece of evidence and invalidates the pending proposals that cite it.';
COMMENT ON FUNCTION keyturn.register_tool(text, jsonb) IS 'Admin: creates or replaces a tool from its spec; returns the new version.';
COMMENT ON FUNCTION keyturn.set_tool_enabled(text, boolean) IS 'Admin: enables or disables a tool; returns whether it changed.';
COMMENT ON FUNCTION keyturn.add_member(text, text, text) IS 'Admin (platform, or the tenant''s own admin): adds or changes a member; returns whether it changed.';
COMMENT ON FUNCTION keyturn.remove_member(text, text) IS 'Admin (platform, or the tenant''s own admin): removes a member and its grants.';
COMMENT ON FUNCTION keyturn.grant_tool(text, text, text, jsonb, timestamptz, int) IS 'Admin: sets a grant to exactly this scope, end and number of uses; returns whether it changed.';
COMMENT ON FUNCTION keyturn.revoke_tool(text, text, text) IS 'Admin: revokes a grant; returns whether it changed.';
COMMENT ON FUNCTION keyturn.propose(text, jsonb, jsonb) IS 'Agent: stores an immutable proposal; returns its one-time token (and status, when a standing approval or task request approved it).';
COMMENT ON FUNCTION keyturn.approve(uuid, text, jsonb) IS 'Human: approves exactly what was proposed, once; a replay returns the stored outcome.';
COMMENT ON FUNCTION keyturn.propose_for(text, text, jsonb, jsonb) IS 'Agent: propose, naming the caller''s own tenant (another: 42501; none: 22023), so that Citus can run the whole call on the tenant''s worker.';
COMMENT ON FUNCTION keyturn.reject_for(text, uuid, text, text) IS 'Human: reject, naming the caller''s own tenant (another: 42501; none: 22023), so that Citus can run the whole call on the tenant''s worker.';
COMMENT ON FUNCTION keyturn.approve_for(text, uuid, text, jsonb) IS 'Human: approve, naming the caller''s own tenant (another: 42501; none: 22023), so that Citus can run the whole call on the tenant''s worker.';
COMMENT ON FUNCTION keyturn.preview_for(text, uuid, text, jsonb) IS 'Human: preview, naming the caller''s own tenant (another: 42501; none: 22023), so that Citus can run the whole call on the tenant''s worker.';
COMMENT ON FUNCTION keyturn.approve_many(jsonb) IS 'Human: one card for several proposals; each element exactly approve.';
COMMENT ON FUNCTION keyturn.preview(uuid, text, jsonb) IS 'Human: the approval card''s data; with params (a digest action''s reviewed fields) also whether they are the proposed ones, ending the proposal rejected_tampered when they are not.';
COMMENT ON FUNCTION keyturn.reject(uuid, text, text) IS 'Human: declines a pending proposal (a veto for quorum tools).';
COMMENT ON FUNCTION keyturn.revise(uuid, text, jsonb) IS 'Human: edit before approve; the old proposal is superseded by a new one with its own hash and token.';
COMMENT ON FUNCTION keyturn.pending(int) IS 'Human: the caller''s queue of pending actions, soonest expiry first. Never a token.';
COMMENT ON FUNCTION keyturn.delegate(text, jsonb, int, interval) IS 'Human: a standing approval of the caller''s own proposals of a tool, within a scope, uses and time.';
COMMENT ON FUNCTION keyturn.revoke_delegation(uuid) IS 'Human: ends a standing approval.';
COMMENT ON FUNCTION keyturn.delegations() IS 'Human: the visible standing approvals, with their uses, the tool version each was given for, and why one no longer covers (ended).';
COMMENT ON FUNCTION keyturn.record_request(text, text, text, text) IS 'Human side: records the person''s message of a turn, the approval of the task tool calls it asks for.';
COMMENT ON FUNCTION keyturn.end_session(text) IS 'Logout: cancels the caller''s pending, queued and leased actions of a session.';
COMMENT ON FUNCTION keyturn.end_session_for(text, text) IS 'end_session, naming the caller''s own tenant (another: 42501; none: 22023), so that Citus can run the whole call on the tenant''s worker.';
COMMENT ON FUNCTION keyturn.cancel_origin_for(text, text) IS 'cancel_origin, naming the caller''s own tenant (another: 42501; none: 22023), so that Citus can run the whole call on the tenant''s worker.';
COMMENT ON FUNCTION keyturn.archive_conversation_for(text, text) IS 'archive_conversation, naming the caller''s own tenant (another: 42501; none: 22023), so that Citus can run the whole call on the tenant''s worker.';
COMMENT ON FUNCTION keyturn.approve_many_for(text, jsonb) IS 'Human: approve_many, naming the caller''s own tenant (another: 42501; none: 22023), so that Citus can run the whole call on the tenant''s worker.';
COMMENT ON FUNCTION keyturn.revise_for(text, uuid, text, jsonb) IS 'Human: revise, naming the caller''s own tenant (another: 42501; none: 22023), so that Citus can run the whole call on the tenant''s worker.';
COMMENT ON FUNCTION keyturn.cancel_origin(text) IS 'Stops a conversation: cancels its actions and refuses later ones.';
COMMENT ON FUNCTION keyturn.archive_conversation(text) IS 'Ends a conversation normally: cancels its actions not yet executing and refuses later ones.';
COMMENT ON FUNCTION keyturn.action_status(uuid) IS 'An action''s status and result, if visible to the caller.';
COMMENT ON FUNCTION keyturn.audit(uuid) IS 'An action''s events in order (operators: every action; others: what their identity may see).';
COMMENT ON FUNCTION keyturn.stage_file(bytea, text, text) IS 'Stages an attachment''s bytes for the caller''s principal; returns its id, SHA-256 and size.';
COMMENT ON FUNCTION keyturn.attachments(uuid, uuid) IS 'Dispatcher: the files an action sends (from its approved params, in their order), while it is leased or executing under that lease.';
COMMENT ON FUNCTION keyturn.file_content(uuid, uuid, uuid) IS 'Dispatcher: an attachment''s bytes, only while its action is executing under that lease.';
COMMENT ON FUNCTION keyturn.register_projection(text, jsonb) IS 'Admin: which fields of a provider''s data may reach a prompt; returns the new version.';
COMMENT ON FUNCTION keyturn.fence(text, jsonb) IS 'A provider''s data as a fenced, projected reference block, with a fresh marker, the guard that names it, and the evidence id of what was fenced.';
COMMENT ON FUNCTION keyturn.lease(text, int, interval, text[]) IS 'Dispatcher: takes due queued actions (FOR UPDATE SKIP LOCKED) under a lease.';
COMMENT ON FUNCTION keyturn.begin_dispatch(uuid, uuid) IS 'Dispatcher: rechecks everything and commits executing before any provider call; false: invalidated.';
COMMENT ON FUNCTION keyturn.begin_dispatch_many(uuid[], uuid[]) IS 'Dispatcher: begin_dispatch for a batch, one answer per element.';
COMMENT ON FUNCTION keyturn.complete(uuid, uuid, text, jsonb, interval) IS 'Dispatcher: records a provider call''s outcome (succeeded, failed, retry, unknown).';
COMMENT ON FUNCTION keyturn.complete_many(uuid[], uuid[], text[], jsonb[], interval[]) IS 'Dispatcher: complete for a batch, one answer per element.';
COMMENT ON FUNCTION keyturn.sweep() IS 'Expires pending actions, requeues lapsed leases, marks lapsed calls uncertain, deletes unbound files.';
COMMENT ON FUNCTION keyturn.reconcile(uuid, text, text) IS 'Operator: settles an uncertain action as succeeded or failed, with a note.';
COMMENT ON FUNCTION keyturn.uncertain_actions() IS 'Operator: the actions waiting for a person to decide what happened, when it is safe to decide, and whether keyturnd says it sent nothing.';
COMMENT ON FUNCTION keyturn.record_not_sent(uuid, uuid, jsonb) IS 'Dispatcher: keyturnd''s account that the attempt under this lease sent nothing, for an action the sweep made uncertain first; decides nothing.';
COMMENT ON FUNCTION keyturn.record_not_sent_for(text, uuid, uuid, jsonb) IS 'Dispatcher: record_not_sent for the tenant named.';
COMMENT ON FUNCTION keyturn.attempts(uuid) IS 'Operator: an action''s provider attempts, with their receipts.';
COMMENT ON FUNCTION keyturn.dispatch_by_tenant() IS 'Dispatcher: whether keyturn''s tables are distributed by tenant (Citus), so that the dispatcher must use the _for calls, tenant by tenant.';
COMMENT ON FUNCTION keyturn.dispatch_nodes() IS 'Dispatcher: the other nodes whose wake-ups keyturnd must LISTEN to when it dispatches by tenant; empty otherwise.';
COMMENT ON FUNCTION keyturn.tenants_due(text[], int) IS 'Dispatcher: the tenants with queued actions due (to_lease) or sweep work (to_sweep), oldest first; a hint, read without locks.';
COMMENT ON FUNCTION keyturn.lease_for(text, text, int, interval, text[]) IS 'Dispatcher: lease, limited to the tenant named, so that Citus can run it on the tenant''s worker.';
COMMENT ON FUNCTION keyturn.begin_dispatch_for(text, uuid, uuid) IS 'Dispatcher: begin_dispatch in the tenant named.';
COMMENT ON FUNCTION keyturn.begin_dispatch_many_for(text, uuid[], uuid[]) IS 'Dispatcher: begin_dispatch_many in the tenant named; an element of another tenant is refused (55000).';
COMMENT ON FUNCTION keyturn.complete_for(text, uuid, uuid, text, jsonb, interval) IS 'Dispatcher: complete in the tenant named.';
COMMENT ON FUNCTION keyturn.complete_many_for(text, uuid[], uuid[], text[], jsonb[], interval[]) IS 'Dispatcher: complete_many in the tenant named; an element of another tenant is refused (55000).';
COMMENT ON FUNCTION keyturn.sweep_for(text) IS 'The sweep, of the tenant named only.';
COMMENT ON FUNCTION keyturn.attachments_for(text, uuid, uuid) IS 'Dispatcher: attachments in the tenant named.';
COMMENT ON FUNCTION keyturn.file_content_for(text, uuid, uuid, uuid) IS 'Dispatcher: file_content in the tenant named.';
COMMENT ON FUNCTION keyturn.reconcile_for(text, uuid, text, text) IS 'Operator: reconcile in the tenant named.';
COMMENT ON FUNCTION keyturn.citus_distribute(regclass) IS 'Superuser, on Citus: distributes keyturn''s tables by tenant, colocated with the business table named, and registers the _for calls for delegation (layout B).';
COMMENT ON FUNCTION keyturn.check_deployment() IS 'Superuser or admin: what a live database gets wrong for keyturn''s guarantees, one row per problem.';

-- Roles are cluster-wide; they may predate this install.
COMMENT ON ROLE keyturn_agent IS 'keyturn: the AI agent''s side. Proposes; never approves.';
COMMENT ON ROLE keyturn_approver IS 'keyturn: the person''s side. Approves, rejects, revises; a tenant''s admin administers it through this role.';
COMMENT ON ROLE keyturn_dispatcher IS 'keyturn: keyturnd. Dispatches approved external actions; reads nothing directly.';
COMMENT ON ROLE keyturn_operator IS 'keyturn: reconciles uncertain outcomes; reads nothing directly.';
COMMENT ON ROLE keyturn_admin IS 'keyturn: the platform administrator. Registers tools; manages every tenant.';

-- keyturn over MCP (sql/063_mcp.sql).
COMMENT ON FUNCTION keyturn.mcp_tools() IS 'Agent: the tools its principal may call over MCP (enabled, granted, runnable), each with its MCP description, inputSchema and annotations.';
COMMENT ON FUNCTION keyturn.read(text, jsonb) IS 'Agent: runs an sql read tool as the caller under its RLS (at most max_rows rows) and returns fence(projection, {"rows": [...]}); no approval.';
COMMENT ON FUNCTION keyturn.upstream_read(text, jsonb) IS 'Agent: whether the caller may call this upstream MCP read tool with these arguments, and the upstream, its tool name there and the projection that fences the answer.';
COMMENT ON FUNCTION keyturn.mcp_action_status(uuid) IS 'Agent: the status (and, once final, the result) of an action of the calling principal; no row for anything else.';
COMMENT ON FUNCTION keyturn.register_discovered_tool(text, jsonb, boolean) IS 'Dispatcher (keyturnd): registers a tool of an upstream MCP server as <upstream>.<tool>, disabled, read only when trusted and readOnlyHint is true; a changed definition is a new version.';
COMMENT ON FUNCTION keyturn.check_upstream_tool(uuid, uuid, jsonb) IS 'Dispatcher (keyturnd), right before an upstream MCP call: true when the live definition is the approved one; else the action becomes invalidated and nothing may be sent.';
COMMENT ON FUNCTION keyturn.check_upstream_tool_for(text, uuid, uuid, jsonb) IS 'Dispatcher: check_upstream_tool for the tenant named, so that Citus runs it on the tenant''s worker.';
