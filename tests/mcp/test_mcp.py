"""The mcp test layer (docs/testing.md): keyturnd's /mcp driven by the official
Python SDK client (PyPI `mcp`), with a small upstream MCP server
(tests/mcp/upstream.py) started here, against the private cluster of
tests/run-all.

Environment: KT_PGPORT (the cluster), KT_PSQL (psql), KEYTURND (the binary),
KT_MCP_DIR (a scratch directory); KT_MCP_CHECKS, names of checks to run
alone (the others print SKIPPED). Prints one line per check and ends with
`N passed, N failed`; exits non-zero when a check failed. Nothing waits for a
time: every wait is for a state, with a bound that only ends a run gone
wrong.
"""

import asyncio
import hashlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import traceback
import urllib.parse
import uuid

import httpx2
from mcp import types
from mcp.client.client import Client
from mcp.client.streamable_http import streamable_http_client
import mcp.client.session as client_session

PORT = os.environ["KT_PGPORT"]
PSQL = os.environ["KT_PSQL"]
KEYTURND = os.environ["KEYTURND"]
DIR = os.environ["KT_MCP_DIR"]
HERE = os.path.dirname(os.path.abspath(__file__))
SECRET = "mcp-layer-jwt-secret-0123456789abcdef"
UPSTREAM_TOKEN = "upstream-bearer-" + uuid.uuid4().hex
CALLS = os.path.join(DIR, "calls.jsonl")
DRIFT = os.path.join(DIR, "drift")
LATE = os.path.join(DIR, "late")
TENANT = "mcpt"
BOUND = 60  # seconds: ends a wait only when a run has gone wrong

results = []
responses = []  # the JSON of every response a client got


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def psql(sql, user="postgres"):
    out = subprocess.run(
        [PSQL, "-X", "-q", "-t", "-A", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1", "-p", PORT, "-U", user,
         "-d", "keyturn", "-c", sql],
        capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"psql as {user} failed: {out.stderr.strip()}\n{sql}")
    return out.stdout.strip()


def as_person(sql, principal="alice"):
    return psql(f"BEGIN; SET LOCAL keyturn.tenant = '{TENANT}'; SET LOCAL keyturn.principal = '{principal}'; "
                f"SET LOCAL keyturn.session = 's1'; {sql}; COMMIT;", user="app_human")


def wait_for(what, probe, bound=BOUND):
    end = time.monotonic() + bound
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.1)


def status_of(action_id):
    return psql(f"SELECT status FROM keyturn.action WHERE id = '{action_id}'")


def calls(tool=None):
    if not os.path.exists(CALLS):
        return []
    with open(CALLS) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [r for r in rows if tool is None or r["tool"] == tool]


def check(name):
    def wrap(fn):
        async def run():
            try:
                await fn()
                results.append((name, True))
                print(f"ok      {name}", flush=True)
            except Skip as why:
                print(f"SKIPPED {name}: {why}", flush=True)
            except Exception:
                results.append((name, False))
                print(f"FAILED  {name}\n{traceback.format_exc()}", flush=True)
        run.__name__ = name
        CHECKS.append(run)
        return run
    return wrap


CHECKS = []


class Skip(Exception):
    """A check that cannot run here, and why: printed, never counted as passed."""


# ---- the world: roles, tenant, tools, the upstream, keyturnd ----

ROLES = ["kt_mcp_login", "kt_mcp_rpc", "kt_mcp_agent", "kt_mcp_human", "kt_mcp_both"]


def drop_roles():
    for r in ROLES:
        psql(f"DO $$ BEGIN IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{r}') THEN "
             f"EXECUTE 'DROP OWNED BY {r}'; EXECUTE 'DROP ROLE {r}'; END IF; END $$")


def setup_database():
    drop_roles()
    psql("""
CREATE ROLE kt_mcp_agent NOLOGIN IN ROLE keyturn_agent;
CREATE ROLE kt_mcp_login LOGIN NOINHERIT IN ROLE kt_mcp_agent;
CREATE ROLE kt_mcp_human NOLOGIN IN ROLE keyturn_approver;
CREATE ROLE kt_mcp_rpc LOGIN NOINHERIT IN ROLE kt_mcp_human;
CREATE ROLE kt_mcp_both NOLOGIN IN ROLE keyturn_agent, keyturn_approver;
GRANT USAGE ON SCHEMA crm TO kt_mcp_agent, kt_mcp_human;
GRANT SELECT ON crm.deal TO kt_mcp_agent;
GRANT SELECT, UPDATE ON crm.deal TO kt_mcp_human;
DELETE FROM crm.deal WHERE tenant = 'mcpt';
-- A run against a cluster an earlier run used: its discovered tools start
-- disabled again, as a fresh discovery registers them.
UPDATE keyturn.tool SET enabled = false WHERE name LIKE 'chat.%';
INSERT INTO crm.deal (id, tenant, owner, name, stage) VALUES
  (9101, 'mcpt', 'alice', 'Northwind renewal', 'qualified'),
  (9102, 'mcpt', 'alice', 'Contoso pilot', 'qualified'),
  (9103, 'mcpt', 'bob', 'Fabrikam', 'won');
""")
    psql("""
SELECT keyturn.add_member('mcpt', 'alice', 'member'), keyturn.add_member('mcpt', 'bob', 'member');
SELECT keyturn.register_tool('mcp_deal_stage', '{"executor": "sql", "effect": "reversible",
  "summary": "Set stage {set.stage} on {count} deal(s)",
  "sql": {"table": "crm.deal", "key": "id", "version": "xmin", "set": ["stage"], "where": ["id", "owner"]}}');
SELECT keyturn.register_tool('mcp_deals', '{"kind": "read", "executor": "sql", "projection": "mcp.deals",
  "description": "Your deals", "sql": {"table": "crm.deal", "key": "id", "select": ["id", "name", "stage"],
  "where": ["stage"], "max_rows": 10}}');
SELECT keyturn.register_tool('mcp_unprojected', '{"kind": "read", "executor": "sql", "projection": "mcp.nothing",
  "sql": {"table": "crm.deal", "key": "id", "select": ["id"]}}');
SELECT keyturn.register_projection('mcp.deals', '{"fields": {"rows[].id": {"max_length": 20},
  "rows[].name": {"max_length": 60}, "rows[].stage": {"max_length": 20}}}');
SELECT keyturn.register_projection('chat.history', '{"fields": {"messages[].from": {"max_length": 40},
  "messages[].text": {"max_length": 200}}}');
SELECT keyturn.grant_tool('mcpt', p, t) FROM unnest(ARRAY['alice', 'bob']) p,
       unnest(ARRAY['mcp_deal_stage', 'mcp_deals', 'mcp_unprojected']) t;
""", user="app_admin")


upstream_proc = None
keyturnd_proc = None
UPSTREAM_PORT = free_port()
KEYTURND_PORT = free_port()
BASE = f"http://127.0.0.1:{KEYTURND_PORT}"
LOG = os.path.join(DIR, "keyturnd.log")


def start_upstream():
    global upstream_proc
    env = dict(os.environ, KT_UPSTREAM_CALLS=CALLS, KT_UPSTREAM_TOKEN=UPSTREAM_TOKEN, KT_UPSTREAM_DRIFT=DRIFT,
               KT_UPSTREAM_LATE=LATE)
    upstream_proc = subprocess.Popen([sys.executable, os.path.join(HERE, "upstream.py"), str(UPSTREAM_PORT)],
                                     env=env, stdout=subprocess.DEVNULL, stderr=open(os.path.join(DIR, "upstream.log"), "a"))

    def up():
        try:
            return httpx2.post(f"http://127.0.0.1:{UPSTREAM_PORT}/mcp", timeout=1).status_code == 401
        except Exception:
            return False
    wait_for("the upstream to listen", up)


async def upstream_definition(tool, port=None, version="2025-06-18", token=True):
    """The JSON object of `tool` in an upstream's tools/list (the Python
    one's by default), as served in protocol revision `version`: read over
    plain HTTP, so no SDK model re-serializes it."""
    def rpc(http, session, body):
        headers = {"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": version}
        if token:
            headers["Authorization"] = f"Bearer {UPSTREAM_TOKEN}"
        if session:
            headers["Mcp-Session-Id"] = session
        r = http.post(f"http://127.0.0.1:{port or UPSTREAM_PORT}/mcp", json=body, headers=headers)
        assert r.status_code in (200, 202), (r.status_code, r.text)
        return r.headers.get("mcp-session-id", session), rpc_answer(r)

    def go():
        with httpx2.Client(timeout=BOUND) as http:
            session, _ = rpc(http, None, {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": version, "capabilities": {},
                "clientInfo": {"name": "raw", "version": "1"}}})
            rpc(http, session, {"jsonrpc": "2.0", "method": "notifications/initialized"})
            _, listed = rpc(http, session, {"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
            return next(t for t in listed["result"]["tools"] if t["name"] == tool)
    return await asyncio.to_thread(go)


def rpc_answer(r):
    """The JSON-RPC message of an HTTP answer, in a plain JSON body or as the
    first event of a stream that carries data (not a priming event); None
    for an empty body."""
    text = r.text
    if r.headers.get("content-type", "").startswith("text/event-stream"):
        text = next((line[5:] for line in text.splitlines() if line.startswith("data:") and line[5:].strip()),
                    "null")
    return json.loads(text) if text.strip() else None


def canonical(value):
    """RFC 8785 for what a tool definition holds here (ASCII keys, no
    fractional numbers): sorted keys, no whitespace, UTF-8 as is."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def keyturnd_env():
    config = os.path.join(DIR, "keyturnd.toml")
    with open(config, "w") as f:
        f.write(f'[[mcp_upstream]]\nname = "chat"\nurl = "http://127.0.0.1:{UPSTREAM_PORT}/mcp"\n'
                f'headers = {{ Authorization = "env:KT_TEST_UPSTREAM_AUTH" }}\ntrust_annotations = true\n')
    return dict(
        os.environ,
        DATABASE_URL=f"postgres://app_dispatcher@127.0.0.1:{PORT}/keyturn",
        KEYTURN_LISTEN=f"127.0.0.1:{KEYTURND_PORT}",
        KEYTURN_JWT_SECRET=SECRET,
        KEYTURN_JWT_ROLES="kt_mcp_human",
        KEYTURN_RPC_DATABASE_URL=f"postgres://kt_mcp_rpc@127.0.0.1:{PORT}/keyturn",
        KEYTURN_MCP_ROLES="kt_mcp_agent",
        KEYTURN_MCP_DATABASE_URL=f"postgres://kt_mcp_login@127.0.0.1:{PORT}/keyturn",
        KEYTURN_PUBLIC_URL=BASE,
        KEYTURN_CONFIG=config,
        KT_TEST_UPSTREAM_AUTH=f"Bearer {UPSTREAM_TOKEN}",
        KEYTURN_LEASE_SECONDS="6",
        KEYTURN_HTTP_TIMEOUT_SECONDS="3",
        KEYTURN_SWEEP_SECONDS="1",
        KEYTURN_SHUTDOWN_SECONDS="5",
        KEYTURN_JOURNAL_DIR=os.path.join(DIR, "journal"),
        RUST_LOG="info,keyturnd=debug",
    )


def start_keyturnd(**extra):
    global keyturnd_proc
    keyturnd_proc = subprocess.Popen([KEYTURND], env=dict(keyturnd_env(), **extra), stdout=subprocess.DEVNULL,
                                     stderr=open(LOG, "a"))

    def ready():
        if keyturnd_proc.poll() is not None:
            raise AssertionError(f"keyturnd exited ({keyturnd_proc.returncode}); see {LOG}")
        try:
            return httpx2.get(f"{BASE}/readyz", timeout=1).status_code == 200
        except Exception:
            return False
    wait_for("keyturnd to be ready", ready)


def jwt(role="kt_mcp_agent", sub="alice", session="s1", tenant=TENANT, ttl=900):
    out = subprocess.run([KEYTURND, "jwt", "--role", role, "--sub", sub, "--tenant", tenant, "--session", session,
                          "--ttl", str(ttl)],
                         env=dict(os.environ, KEYTURN_JWT_SECRET=SECRET, DATABASE_URL="postgres://x"),
                         capture_output=True, text=True, check=True)
    return out.stdout.strip()


AGENT = None


def client(token=None, mode="legacy", version=None, elicitation=None):
    """An MCP client of keyturnd's /mcp, as the agent; `version` pins a
    handshake-era revision, `mode` a modern one."""
    if version is not None:
        client_session.LATEST_HANDSHAKE_VERSION = version
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token or AGENT}"}, timeout=30)
    kwargs = {"mode": mode, "cache": None}
    if elicitation is not None:
        kwargs["elicitation_callback"] = elicitation
    return Client(streamable_http_client(f"{BASE}/mcp", http_client=http), **kwargs)


def keep(result):
    responses.append(result.model_dump_json(by_alias=True))
    return result


async def call(c, name, arguments, meta=None):
    r = await c.call_tool(name, arguments, meta=meta) if meta else await c.call_tool(name, arguments)
    return keep(r)


def approve(action_id, principal="alice"):
    return as_person(f"SELECT status FROM keyturn.approve('{action_id}', keyturn.issue_token('{action_id}'))",
                     principal)


# ---- the checks ----

@check("jwt_missing_or_bad_is_401_a_person_role_403")
async def _():
    r = httpx2.post(f"{BASE}/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
    assert r.status_code == 401 and r.headers.get("www-authenticate") == "Bearer", (r.status_code, r.headers)
    r = httpx2.post(f"{BASE}/mcp", json={}, headers={"Authorization": "Bearer not.a.jwt"})
    assert r.status_code == 401 and r.headers.get("www-authenticate") == "Bearer"
    forged = AGENT[:-4] + ("AAAA" if not AGENT.endswith("AAAA") else "BBBB")
    r = httpx2.post(f"{BASE}/mcp", json={}, headers={"Authorization": f"Bearer {forged}"})
    assert r.status_code == 401
    r = httpx2.post(f"{BASE}/mcp", json={}, headers={"Authorization": f"Bearer {jwt(role='kt_mcp_human')}"})
    assert r.status_code == 403, r.status_code
    r = httpx2.post(f"{BASE}/mcp", json={}, headers={"Authorization": f"Bearer {jwt(role='app_dispatcher')}"})
    assert r.status_code == 403, r.status_code
    try:
        async with client(token=jwt(role="kt_mcp_human")) as c:
            await c.list_tools()
        raise AssertionError("a person's role was served")
    except AssertionError:
        raise
    except Exception:
        pass


@check("a_session_works_only_for_the_identity_that_opened_it")
async def _():
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                       "clientInfo": {"name": "t", "version": "1"}}}
    accept = {"Accept": "application/json, text/event-stream"}
    r = httpx2.post(f"{BASE}/mcp", json=init, headers={"Authorization": f"Bearer {AGENT}", **accept})
    sid = r.headers.get("mcp-session-id")
    assert r.status_code == 200 and sid, (r.status_code, r.headers)
    lst = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
    r = httpx2.post(f"{BASE}/mcp", json=lst, headers={"Authorization": f"Bearer {jwt(sub='bob')}",
                                                        "Mcp-Session-Id": sid, "MCP-Protocol-Version": "2025-06-18",
                                                        **accept})
    assert r.status_code == 404, r.status_code
    # A renewed JWT of the same agent (another expiry) keeps its session.
    renewed = jwt(ttl=1200)
    assert renewed != AGENT
    r = httpx2.post(f"{BASE}/mcp", json={"jsonrpc": "2.0", "method": "notifications/initialized"},
                    headers={"Authorization": f"Bearer {renewed}", "Mcp-Session-Id": sid,
                             "MCP-Protocol-Version": "2025-06-18", **accept})
    assert r.status_code in (200, 202), r.status_code
    # Its owner ends it: 204, as the SDKs expect; then it is gone.
    end = {"Authorization": f"Bearer {AGENT}", "Mcp-Session-Id": sid, "MCP-Protocol-Version": "2025-06-18"}
    r = httpx2.delete(f"{BASE}/mcp", headers=end)
    assert r.status_code == 204, r.status_code
    r = httpx2.post(f"{BASE}/mcp", json=lst, headers={**end, **accept})
    assert r.status_code == 404, r.status_code


@check("a_foreign_origin_is_refused_keyturnds_own_and_loopback_served")
async def _():
    # Red-team pass of 0.3.0: the Host was checked, the Origin was not (the
    # MCP transport requires both, against DNS rebinding).
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                       "clientInfo": {"name": "t", "version": "1"}}}
    base = {"Authorization": f"Bearer {AGENT}", "Accept": "application/json, text/event-stream"}
    for origin in ["https://evil.example", f"http://evil.example:{KEYTURND_PORT}", "null"]:
        r = httpx2.post(f"{BASE}/mcp", json=init, headers={**base, "Origin": origin})
        assert r.status_code == 403 and not r.headers.get("mcp-session-id"), (origin, r.status_code, r.headers)
    for origin in [BASE, "http://localhost:6274", None]:
        headers = {**base, **({"Origin": origin} if origin else {})}
        r = httpx2.post(f"{BASE}/mcp", json=init, headers=headers)
        assert r.status_code == 200 and r.headers.get("mcp-session-id"), (origin, r.status_code)
        httpx2.delete(f"{BASE}/mcp", headers={"Authorization": f"Bearer {AGENT}",
                                              "Mcp-Session-Id": r.headers["mcp-session-id"],
                                              "MCP-Protocol-Version": "2025-06-18"})


@check("keyturnd_refuses_to_start_with_a_wrong_mcp_setup")
async def _():
    cases = [
        ({"KEYTURN_MCP_ROLES": "kt_mcp_human"}, "is not a member of keyturn_agent"),
        ({"KEYTURN_MCP_ROLES": "kt_mcp_agent,kt_mcp_both"}, "is a member of keyturn_approver"),
        ({"KEYTURN_MCP_DATABASE_URL": f"postgres://app_dispatcher@127.0.0.1:{PORT}/keyturn"},
         "login of its own"),
        ({"KEYTURN_MCP_DATABASE_URL": f"postgres://app_agent@127.0.0.1:{PORT}/keyturn"}, "NOINHERIT"),
    ]
    for i, (override, needle) in enumerate(cases):
        env = keyturnd_env()
        env.update(override, KEYTURN_LISTEN=f"127.0.0.1:{free_port()}",
                   KEYTURN_JOURNAL_DIR=os.path.join(DIR, f"journal-refused-{i}"))
        p = subprocess.run([KEYTURND], env=env, capture_output=True, text=True, timeout=BOUND)
        assert p.returncode != 0 and needle in p.stderr, (override, p.returncode, p.stderr[-600:])


EXPECTED = {
    "mcp_deal_stage": {"readOnlyHint": False, "destructiveHint": False, "idempotentHint": False, "openWorldHint": False},
    "mcp_deals": {"readOnlyHint": True, "openWorldHint": False},
    "mcp_unprojected": {"readOnlyHint": True, "openWorldHint": False},
    "chat.send_message": {"readOnlyHint": False, "destructiveHint": True, "idempotentHint": False, "openWorldHint": True},
    "chat.post_reply": {"readOnlyHint": False, "destructiveHint": True, "idempotentHint": False, "openWorldHint": True},
    "chat.open_channel": {"readOnlyHint": False, "destructiveHint": True, "idempotentHint": False, "openWorldHint": True},
    "chat.set-Topic": {"readOnlyHint": False, "destructiveHint": True, "idempotentHint": False, "openWorldHint": True},
    "chat.history": {"readOnlyHint": True, "openWorldHint": True},
    "chat.fail_send": {"readOnlyHint": False, "destructiveHint": True, "idempotentHint": False, "openWorldHint": True},
    "chat.drop_send": {"readOnlyHint": False, "destructiveHint": True, "idempotentHint": False, "openWorldHint": True},
    "chat.slow_send": {"readOnlyHint": False, "destructiveHint": True, "idempotentHint": False, "openWorldHint": True},
    "chat.rename_channel": {"readOnlyHint": False, "destructiveHint": True, "idempotentHint": False, "openWorldHint": True},
    "keyturn_action_status": {"readOnlyHint": True, "openWorldHint": False},
}


@check("tools_list_exact_with_annotations_in_every_revision")
async def _():
    for version, mode in [("2025-03-26", "legacy"), ("2025-06-18", "legacy"), ("2025-11-25", "legacy"),
                          (None, "2026-07-28")]:
        async with client(version=version, mode=mode) as c:
            listed = keep(await c.list_tools())
            got = {t.name: t.annotations.model_dump(by_alias=True, exclude_none=True) for t in listed.tools}
            assert got == EXPECTED, (version or mode, got)
            schema = next(t for t in listed.tools if t.name == "mcp_deal_stage").input_schema
            assert schema["required"] == ["where", "set"] and set(schema["properties"]["where"]["properties"]) == {"id", "owner"}
            assert set(schema["properties"]["set"]["properties"]) == {"stage"}
            assert next(t for t in listed.tools if t.name == "chat.send_message").input_schema["required"] == ["channel", "text"]
    # Each handshake revision is answered in itself.
    for version in ["2025-03-26", "2025-06-18", "2025-11-25"]:
        r = await asyncio.to_thread(raw_initialize, AGENT, version)
        assert r.status_code == 200, (version, r.status_code, r.text)
        assert rpc_answer(r)["result"]["protocolVersion"] == version, (version, r.text)
        await asyncio.to_thread(httpx2.delete, f"{BASE}/mcp", timeout=BOUND, headers={
            "Authorization": f"Bearer {AGENT}", "Mcp-Session-Id": r.headers["mcp-session-id"]})
    # bob holds no grant for the upstream tools: they are not listed for him.
    async with client(token=jwt(sub="bob")) as c:
        names = {t.name for t in keep(await c.list_tools()).tools}
        assert names == {"mcp_deal_stage", "mcp_deals", "mcp_unprojected", "keyturn_action_status"}, names


@check("read_is_fenced_and_under_rls")
async def _():
    async with client() as c:
        r = await call(c, "mcp_deals", {"where": {"stage": "qualified"}})
        assert not r.is_error
        text = r.content[0].text
        lines = text.split("\n")
        assert len(lines) == 3 and lines[0].startswith("\u27e6kt-") and lines[2].startswith("\u27e6/kt-"), text
        rows = json.loads(lines[1])["rows"]
        assert sorted(x["id"] for x in rows) == [9101, 9102], rows
        meta = r.meta or {}
        assert lines[0] in meta["guard"] and lines[2] in meta["guard"]
        uuid.UUID(meta["evidence_id"])
        r = await call(c, "mcp_deals", {"where": {"stage": "won"}})
        assert json.loads(r.content[0].text.split("\n")[1])["rows"] == [{"id": 9103, "name": "Fabrikam", "stage": "won"}]
        r = await call(c, "mcp_unprojected", {})
        assert r.is_error and "22023" in r.content[0].text, r
        r = await call(c, "chat.history", {"channel": "general"})
        assert not r.is_error, r
        assert r.structured_content is None, r
        block = r.content[0].text.split("\n")
        assert block[0].startswith("\u27e6kt-") and "mallory" in block[1], r
        assert block[0] in (r.meta or {}).get("guard", ""), r


WRITE_KEYS = {"action_id", "status", "summary", "expires_at"}


@check("write_proposes_and_refusals_carry_the_sqlstate")
async def _():
    async with client() as c:
        r = await call(c, "mcp_deal_stage", {"where": {"owner": "alice"}, "set": {"stage": "negotiation"}},
                       meta={"conversation_id": "c-mcp-1"})
        assert not r.is_error, r
        s = r.structured_content
        assert set(s) == WRITE_KEYS and s["status"] == "pending", s
        assert s["summary"] == "Set stage negotiation on 2 deal(s)"
        assert len(r.content) == 1 and r.content[0].text.count(".") >= 1
        origin = psql(f"SELECT origin ->> 'conversation_id' FROM keyturn.action WHERE id = '{s['action_id']}'")
        assert origin == "c-mcp-1", origin
        assert approve(s["action_id"]) == "succeeded"
        st = await call(c, "keyturn_action_status", {"action_id": s["action_id"]})
        assert st.structured_content["status"] == "succeeded" and st.structured_content["result"]["rows"] == 2
        r = await call(c, "mcp_deal_stage", {"where": {"name": "x"}, "set": {"stage": "won"}})
        assert r.is_error and "22023" in r.content[0].text, r
        r = await call(c, "no_such_tool", {})
        assert r.is_error and "42704" in r.content[0].text, r


@check("action_status_reveals_nothing_not_ones_own")
async def _():
    async with client(token=jwt(sub="bob")) as c:
        r = await call(c, "mcp_deal_stage", {"where": {"owner": "bob"}, "set": {"stage": "lost"}})
        bobs = r.structured_content["action_id"]
    async with client() as c:
        answers = []
        for aid in [bobs, str(uuid.uuid4()), "not-a-uuid"]:
            r = await call(c, "keyturn_action_status", {"action_id": aid})
            assert r.is_error
            answers.append(r.model_dump_json(by_alias=True))
        assert len(set(answers)) == 1, answers


def propose_upstream(tool, arguments):
    async def go():
        async with client() as c:
            r = await call(c, tool, arguments)
            assert not r.is_error and r.structured_content["status"] == "pending", r
            return r.structured_content["action_id"]
    return go()


@check("upstream_optional_arguments_are_checked_and_sent_as_given")
async def _():
    # The SDK's schema for optional arguments (a default; anyOf with null)
    # is registered and checked, not refused; the hash is of the tool's
    # definition as the upstream serves it.
    async with client() as c:
        listed = keep(await c.list_tools())
        schema = next(t for t in listed.tools if t.name == "chat.post_reply").input_schema
        assert schema["required"] == ["channel", "text"], schema
        assert {"type": "null"} in schema["properties"]["thread"]["anyOf"], schema
        assert schema["additionalProperties"] is False, schema
        for bad in [{"channel": "general", "text": "t", "urgent": "yes"},
                    {"channel": "general", "text": "t", "thread": 7},
                    {"channel": "general", "text": "t", "bcc": "ceo@example.com"}]:
            r = await call(c, "chat.post_reply", bad)
            assert r.is_error and "22023" in r.content[0].text, (bad, r)
    served = await upstream_definition("post_reply")
    stored = psql("SELECT upstream_schema_sha256 FROM keyturn.tool t JOIN keyturn.tool_version v "
                  "ON v.tool = t.name AND v.version = t.version WHERE t.name = 'chat.post_reply'")
    assert stored == hashlib.sha256(canonical(served).encode()).hexdigest(), (stored, served)
    for args in [{"channel": "general", "text": "in a thread", "thread": None, "urgent": True},
                 {"channel": "general", "text": "tagged", "tags": ["a", "b"]}]:
        aid = await propose_upstream("chat.post_reply", args)
        assert approve(aid) == "queued"
        wait_for("the action to succeed", lambda: status_of(aid) == "succeeded")
        assert [x["arguments"] for x in calls("post_reply")].count(args) == 1, calls("post_reply")


@check("upstream_tool_names_keep_their_case_and_hyphens")
async def _():
    # set-Topic is chat.set-Topic in keyturn, listed, proposed and approved
    # under that name, and sent to the upstream under its own.
    args = {"channel": "general", "topic": "Q3 launch"}
    aid = await propose_upstream("chat.set-Topic", args)
    assert psql(f"SELECT tool FROM keyturn.action WHERE id = '{aid}'") == "chat.set-Topic"
    assert approve(aid) == "queued"
    wait_for("the action to succeed", lambda: status_of(aid) == "succeeded")
    assert [x["arguments"] for x in calls("set-Topic")] == [args], calls("set-Topic")
    async with client() as c:
        r = await call(c, "chat.set-topic", args)
        assert r.is_error and "42704" in r.content[0].text, r


def registered(tool):
    return psql(f"SELECT count(*) FROM keyturn.tool WHERE name = '{tool}'") == "1"


@check("upstream_list_changed_is_discovered_at_once")
async def _():
    # keyturnd discovers again every 300 s here: a tool registered within
    # seconds was found because the upstream said its list changed.
    assert not registered("chat.post_to_news")
    aid = await propose_upstream("chat.open_channel", {"name": "news"})
    assert approve(aid) == "queued"
    wait_for("the action to succeed", lambda: status_of(aid) == "succeeded")
    wait_for("chat.post_to_news to be registered", lambda: registered("chat.post_to_news"), bound=15)
    assert psql("SELECT enabled FROM keyturn.tool WHERE name = 'chat.post_to_news'") == "f"


@check("upstream_tools_are_discovered_again_every_refresh")
async def _():
    # A second keyturnd that discovers every second; the upstream adds a
    # tool and says nothing.
    env = dict(keyturnd_env(), KEYTURN_LISTEN=f"127.0.0.1:{free_port()}", KEYTURN_MCP_REFRESH_SECONDS="1",
               KEYTURN_JOURNAL_DIR=os.path.join(DIR, "journal-refresh"))
    second = subprocess.Popen([KEYTURND], env=env, stdout=subprocess.DEVNULL, stderr=open(LOG, "a"))
    try:
        assert not registered("chat.late_refresh")
        open(LATE, "w").close()
        wait_for("chat.late_refresh to be registered", lambda: registered("chat.late_refresh"), bound=20)
        assert second.poll() is None, "the second keyturnd exited"
    finally:
        second.terminate()
        second.wait(timeout=BOUND)


@check("upstream_write_approved_is_exactly_one_call")
async def _():
    args = {"channel": "general", "text": "Ship it \u2713 \"quoted\" {\"a\": 1}"}
    aid = await propose_upstream("chat.send_message", args)
    assert calls("send_message") == []
    assert approve(aid) == "queued"
    wait_for("the action to succeed", lambda: status_of(aid) == "succeeded")
    sent = calls("send_message")
    assert len(sent) == 1, sent
    # _meta is exactly the key: nothing that could differ between attempts
    # (rmcp's own progressToken is taken out).
    assert sent[0]["arguments"] == args and sent[0]["_meta"] == {"idempotency_key": f"keyturn-{aid}"}, sent[0]
    params = psql(f"SELECT params::text FROM keyturn.action WHERE id = '{aid}'")
    assert json.loads(params) == sent[0]["arguments"]
    receipt = psql(f"SELECT receipt::text FROM keyturn.action WHERE id = '{aid}'")
    assert "posted" not in receipt and UPSTREAM_TOKEN not in receipt, receipt


@check("upstream_iserror_is_failed")
async def _():
    aid = await propose_upstream("chat.fail_send", {"channel": "old", "text": "hi"})
    approve(aid)
    wait_for("the action to fail", lambda: status_of(aid) == "failed")
    assert len(calls("fail_send")) == 1


@check("schema_drift_is_invalidated_with_zero_calls")
async def _():
    aid = await propose_upstream("chat.rename_channel", {"channel": "general", "name": "town-square"})
    open(DRIFT, "w").close()
    assert approve(aid) == "queued"
    wait_for("the action to be invalidated", lambda: status_of(aid) == "invalidated")
    assert calls("rename_channel") == [], calls("rename_channel")


@check("dropped_connection_is_uncertain_one_call_never_retried")
async def _():
    aid = await propose_upstream("chat.drop_send", {"channel": "general", "text": "drop"})
    approve(aid)
    wait_for("the action to be uncertain", lambda: status_of(aid) == "uncertain")
    upstream_proc.wait(timeout=BOUND)
    start_upstream()
    assert len(calls("drop_send")) == 1
    # Retries would be leased again: the action is terminal, with one attempt.
    assert psql(f"SELECT attempts FROM keyturn.action WHERE id = '{aid}'") == "1"


@check("kill_9_between_the_call_and_its_record_sends_no_second_call")
async def _():
    aid = await propose_upstream("chat.slow_send", {"channel": "general", "text": "slow"})
    approve(aid)
    wait_for("the upstream to receive the call", lambda: len(calls("slow_send")) == 1)
    keyturnd_proc.send_signal(signal.SIGKILL)
    keyturnd_proc.wait()
    start_keyturnd()
    wait_for("the action to be uncertain", lambda: status_of(aid) == "uncertain")
    assert len(calls("slow_send")) == 1, calls("slow_send")


@check("elicitation_carries_the_card_link_and_no_result_does")
async def _():
    seen = []

    async def elicit(context, params):
        seen.append(params)
        return types.ElicitResult(action="accept")

    async with client(elicitation=elicit) as c:
        r = await call(c, "chat.send_message", {"channel": "general", "text": "please approve"})
        aid = r.structured_content["action_id"]
    assert len(seen) == 1, seen
    url = seen[0].url
    m = re.fullmatch(re.escape(BASE) + r"/card#a=([0-9a-f-]+)&c=(\S+)", url)
    assert m and m.group(1) == aid, url
    code = urllib.parse.unquote(m.group(2))
    for body in responses:
        assert code not in body and "/card#" not in body, body
    # The person opens it: keyturnd redeems the code, once, at POST
    # /card/session (no KEYTURN_CARD_ROLE is set: the session runs as the
    # one human-side role of KEYTURN_JWT_ROLES), and approves through /rpc
    # with the session's bearer and the fresh token.
    opened = httpx2.post(f"{BASE}/card/session", json={"code": code, "action_ids": [aid]}, timeout=BOUND)
    assert opened.status_code == 200, (opened.status_code, opened.text)
    session = opened.json()
    assert list(session["tokens"]) == [aid], session
    again = httpx2.post(f"{BASE}/card/session", json={"code": code, "action_ids": [aid]}, timeout=BOUND)
    assert again.status_code == 401, (again.status_code, again.text)
    approved = httpx2.post(f"{BASE}/rpc/approve", json={"action_id": aid, "token": session["tokens"][aid]},
                           headers={"Authorization": f"Bearer {session['session']}"}, timeout=BOUND)
    assert approved.status_code == 200, (approved.status_code, approved.text)
    assert status_of(aid) != "pending", status_of(aid)


@check("mrtr_2026_07_28_carries_the_card_link_and_the_retry_gets_the_one_proposal")
async def _():
    """2026-07-28 has no requests to the client: the write call's answer is
    input_required with the card link's elicitation, and the SDK's retry of
    the call (its request state echoed) gets the proposal; nothing is
    proposed twice, and a forged or altered retry is refused."""
    seen = []

    async def elicit(context, params):
        seen.append(params)
        return types.ElicitResult(action="accept")

    text = "approve over multi-round-trip " + uuid.uuid4().hex
    args = {"channel": "general", "text": text}
    count = f"SELECT count(*) FROM keyturn.action WHERE tenant = '{TENANT}' AND params ->> 'text' = '{text}'"
    async with client(mode="2026-07-28", elicitation=elicit) as c:
        r = await call(c, "chat.send_message", args)
        assert not r.is_error, r
        aid = r.structured_content["action_id"]
        assert r.structured_content["status"] == "pending" and "send_message" in r.structured_content["summary"], r
        assert psql(count) == "1", psql(count)
        assert len(seen) == 1 and seen[0].mode == "url" and seen[0].elicitation_id == aid, seen
        m = re.fullmatch(re.escape(BASE) + r"/card#a=([0-9a-f-]+)&c=(\S+)", seen[0].url)
        assert m and m.group(1) == aid, seen[0].url
        code = urllib.parse.unquote(m.group(2))

        # The first answer itself, driven by hand: input_required, the
        # elicitation inside it, the action's id as the state.
        first = await c.session.call_tool("chat.send_message", {"channel": "general", "text": text + " 2"},
                                          allow_input_required=True)
        responses.append(first.model_dump_json(by_alias=True))
        assert isinstance(first, types.InputRequiredResult), first
        state = first.request_state
        asked = first.input_requests["keyturn_card"]
        assert asked.method == "elicitation/create" and asked.params.mode == "url", asked
        assert asked.params.elicitation_id == state and status_of(state) == "pending", (asked, state)

        async def refused(name, arguments, request_state, session=c.session):
            try:
                await session.call_tool(name, arguments, request_state=request_state,
                                        input_responses={"keyturn_card": {"action": "accept"}},
                                        allow_input_required=True)
            except Exception as e:  # the SDK raises the JSON-RPC error
                assert "requestState does not name a proposal of this call" in str(e), e
                return
            raise AssertionError(f"a retry with state {request_state!r} was answered")

        # Other params, another tool, a state that is no action, one that
        # is not a uuid: refused, and nothing proposed.
        await refused("chat.send_message", {"channel": "general", "text": "something else"}, state)
        await refused("chat.rename_channel", {"channel": "general", "name": "x"}, state)
        await refused("chat.send_message", {"channel": "general", "text": text + " 2"}, str(uuid.uuid4()))
        await refused("chat.send_message", {"channel": "general", "text": text + " 2"}, "not-a-uuid")
        # The right retry: the proposal, as it stands.
        again = await c.session.call_tool("chat.send_message", {"channel": "general", "text": text + " 2"},
                                          request_state=state,
                                          input_responses={"keyturn_card": {"action": "decline"}})
        keep(again)
        assert again.structured_content["action_id"] == state and again.structured_content["status"] == "pending"
    # Another principal's retry with alice's state: refused.
    async with client(token=jwt(sub="bob"), mode="2026-07-28") as c:
        await refused("chat.send_message", {"channel": "general", "text": text + " 2"}, state, c.session)
    assert psql(count) == "1" and psql(count.replace(f"'{text}'", f"'{text} 2'")) == "1"
    for body in responses:
        assert code not in body, body
    # Once decided, the retry carries the outcome.
    assert approve(aid) == "queued"
    wait_for("the multi-round-trip proposal to succeed", lambda: status_of(aid) == "succeeded")
    async with client(mode="2026-07-28") as c:
        done = await c.session.call_tool("chat.send_message", args, request_state=aid)
        assert done.structured_content["status"] == "succeeded" and "result" in done.structured_content, done
    assert [x["arguments"] for x in calls("send_message")].count(args) == 1


@check("typescript_sdk_client_lists_proposes_and_gets_the_link")
async def _():
    """The official TypeScript SDK client (npm @modelcontextprotocol/sdk,
    tests/mcp/ts/), installed by tests/run-all into KT_MCP_TS_DIR."""
    ts_dir = os.environ.get("KT_MCP_TS_DIR")
    if not ts_dir:
        raise Skip(os.environ.get("KT_MCP_TS_UNAVAILABLE", "KT_MCP_TS_DIR is not set"))
    args = {"channel": "general", "text": "from TypeScript"}
    # Run from the install (ES modules resolve packages beside the script).
    out = subprocess.run(["node", os.path.join(ts_dir, "ts_agent.mjs"), BASE, "chat.send_message",
                          json.dumps(args)],
                         cwd=ts_dir, env=dict(os.environ, KT_AGENT_JWT=AGENT),
                         capture_output=True, text=True, timeout=BOUND)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    responses.append(json.dumps(got["listed"]))
    responses.append(json.dumps(got["called"]))
    assert "chat.send_message" in got["tools"] and "keyturn_action_status" in got["tools"], got["tools"]
    called = got["called"]
    assert not called.get("isError"), called
    aid = called["structuredContent"]["action_id"]
    assert called["structuredContent"]["status"] == "pending" and status_of(aid) == "pending", called
    # The card link went to the client application, for the person.
    assert len(got["elicited"]) == 1 and got["elicited"][0].startswith(f"{BASE}/card#a={aid}&c="), got["elicited"]
    assert calls("send_message") == [] or all(c["arguments"] != args for c in calls("send_message"))
    assert approve(aid) == "queued"
    wait_for("the TypeScript client's proposal to succeed", lambda: status_of(aid) == "succeeded")
    assert [c["arguments"] for c in calls("send_message")].count(args) == 1


class keyturnd_with:
    """keyturnd restarted with settings `extra` for a block, then as before."""

    def __init__(self, **extra):
        self.extra = extra

    def __enter__(self):
        keyturnd_proc.terminate()
        keyturnd_proc.wait(timeout=BOUND)
        start_keyturnd(**self.extra)

    def __exit__(self, *exc):
        keyturnd_proc.terminate()
        keyturnd_proc.wait(timeout=BOUND)
        start_keyturnd()


def raw_initialize(token, version="2025-11-25"):
    """A legacy initialize, by hand."""
    body = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}}
    return httpx2.post(f"{BASE}/mcp", json=body, timeout=BOUND, headers={
        "Authorization": f"Bearer {token}", "Accept": "application/json, text/event-stream"})


def open_session(token):
    """A legacy session's id, initialized."""
    r = raw_initialize(token)
    assert r.status_code == 200, (r.status_code, r.text)
    sid = r.headers["mcp-session-id"]
    done = httpx2.post(f"{BASE}/mcp", json={"jsonrpc": "2.0", "method": "notifications/initialized"}, timeout=BOUND,
                       headers={"Authorization": f"Bearer {token}", "Mcp-Session-Id": sid,
                                "MCP-Protocol-Version": "2025-11-25", "Accept": "application/json, text/event-stream"})
    assert done.status_code in (200, 202), (done.status_code, done.text)
    return sid


def session_status(token, sid):
    """The HTTP status of a tools/list in session `sid` as `token`."""
    r = httpx2.post(f"{BASE}/mcp", json={"jsonrpc": "2.0", "id": 2, "method": "tools/list"}, timeout=BOUND,
                    headers={"Authorization": f"Bearer {token}", "Mcp-Session-Id": sid,
                             "MCP-Protocol-Version": "2025-11-25", "Accept": "application/json, text/event-stream"})
    return r.status_code


def raw_tasks_get(token, task_id):
    """tasks/get as revision 2026-07-28 frames it, by hand."""
    body = {"jsonrpc": "2.0", "id": 1, "method": "tasks/get", "params": {"taskId": task_id, "_meta": {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "1"},
        "io.modelcontextprotocol/clientCapabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}}}}}
    r = httpx2.post(f"{BASE}/mcp", json=body, timeout=BOUND, headers={
        "Authorization": f"Bearer {token}", "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "tasks/get", "Mcp-Name": task_id})
    assert r.status_code == 200, (r.status_code, r.text)
    text = r.text
    if "text/event-stream" in r.headers.get("content-type", ""):
        text = next(line[5:] for line in text.splitlines() if line.startswith("data:") and line[5:].strip())
    answer = json.loads(text)
    responses.append(json.dumps(answer.get("result", {})))
    assert "result" in answer, answer
    return answer["result"]


@check("tasks_extension_client_gets_a_task_that_follows_the_action")
async def _():
    """The official Tasks extension client (npm @modelcontextprotocol/ext-tasks
    with @modelcontextprotocol/client 2.x, tests/mcp/ts/tasks_agent.mjs) on
    2026-07-28: the write call is a task whose id is the action's,
    input_required with the card link while the person has not decided,
    completed with the outcome once they have; another's task id, a cancel
    and an input keyturn never asked for are refused."""
    ts_dir = os.environ.get("KT_MCP_TS_DIR")
    if not ts_dir:
        raise Skip(os.environ.get("KT_MCP_TS_UNAVAILABLE", "KT_MCP_TS_DIR is not set"))
    args = {"channel": "general", "text": "a task " + uuid.uuid4().hex}
    agent = subprocess.Popen(["node", os.path.join(ts_dir, "tasks_agent.mjs"), BASE, "chat.send_message",
                              json.dumps(args)],
                             cwd=ts_dir, env=dict(os.environ, KT_AGENT_JWT=AGENT),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = await asyncio.wait_for(asyncio.to_thread(agent.stdout.readline), BOUND)
        assert first, agent.stderr.read()
        asked = json.loads(first)
        # What keyturnd answered (the elicited link is the client's to show).
        responses.append(json.dumps({k: v for k, v in asked.items() if k != "elicited"}))
        aid = asked["taskId"]
        assert asked["kind"] == "task" and not asked["settledFirst"] and status_of(aid) == "pending", asked
        # The person is asked through the task: the card link, once.
        assert len(asked["elicited"]) == 1, asked
        link = asked["elicited"][0]
        assert link["mode"] == "url" and link["url"].startswith(f"{BASE}/card#a={aid}&c="), link
        # Refusals: another's (no such) task, a cancel, an input never asked for.
        assert asked["foreign"]["kind"] == "error" and asked["foreign"]["error"]["code"] == -32602, asked
        assert asked["cancel"]["kind"] == "error" and "does not let an agent cancel" in asked["cancel"]["error"]["message"]
        assert asked["update"]["kind"] == "error" and asked["update"]["error"]["code"] == -32602, asked
        # The link is the proposing session's: the same principal in
        # another session sees the task working, with no link.
        mine = raw_tasks_get(AGENT, aid)
        assert mine["status"] == "input_required" and mine["inputRequests"]["keyturn_card"]["params"]["url"] == link["url"]
        theirs = raw_tasks_get(jwt(session="s2"), aid)
        assert theirs["status"] == "working" and "inputRequests" not in theirs, theirs
        assert status_of(aid) == "pending"
        assert approve(aid) == "queued"
        second = await asyncio.wait_for(asyncio.to_thread(agent.stdout.readline), BOUND)
        assert second, agent.stderr.read()
        responses.append(second)
        settled = json.loads(second)
        assert agent.wait(timeout=BOUND) == 0, agent.stderr.read()
    finally:
        if agent.poll() is None:
            agent.kill()
    outcome = settled["outcome"]
    assert outcome["status"] == "completed", outcome
    assert outcome["result"]["structuredContent"]["status"] == "succeeded", outcome
    assert outcome["result"]["structuredContent"]["action_id"] == aid and not outcome["result"].get("isError")
    # The task followed the action: input_required while it waited for the
    # person (the client may also have seen working after the approval).
    assert "input_required" in settled["statuses"], settled["statuses"]
    assert status_of(aid) == "succeeded"
    assert [c["arguments"] for c in calls("send_message")].count(args) == 1


@check("mcp_inspector_cli_lists_and_follows_a_task_to_its_outcome")
async def _():
    """MCP Inspector's CLI (npm @modelcontextprotocol/inspector 2.x, installed
    with the TypeScript clients), which declares the Tasks extension: it lists
    keyturn's tools; a write call is a task over a proposal (legacy era: the
    CLI prints the task; modern era: it follows the task until the person
    decides, then prints the outcome)."""
    ts_dir = os.environ.get("KT_MCP_TS_DIR")
    if not ts_dir:
        raise Skip(os.environ.get("KT_MCP_TS_UNAVAILABLE", "KT_MCP_TS_DIR is not set"))
    inspector = os.path.join(ts_dir, "node_modules", ".bin", "mcp-inspector")

    def command(*args):
        return [inspector, "--cli", f"{BASE}/mcp", "--transport", "http", "--format", "json", "--quiet",
                "--header", f"Authorization: Bearer {AGENT}", *args]

    def answer(out):
        responses.append(out)
        return json.loads(out)["result"]

    def run(*args):
        out = subprocess.run(command(*args), cwd=ts_dir, capture_output=True, text=True, timeout=BOUND)
        assert out.returncode == 0, (args, out.stdout, out.stderr)
        return answer(out.stdout)

    def send(era, text):
        return ["--protocol-era", era, "--method", "tools/call", "--tool-name", "chat.send_message",
                "--tool-arg", "channel=general", f"text={text}"]

    listed = run("--method", "tools/list")
    names = {t["name"] for t in listed["tools"]}
    assert {"chat.send_message", "mcp_deal_stage", "keyturn_action_status"} <= names, names

    text = "from Inspector " + uuid.uuid4().hex
    task = run(*send("legacy", text))
    assert task["status"] == "working" and status_of(task["taskId"]) == "pending", task
    assert psql(f"SELECT params ->> 'text' FROM keyturn.action WHERE id = '{task['taskId']}'") == text

    text = "from Inspector, followed " + uuid.uuid4().hex
    follower = subprocess.Popen(command(*send("modern", text)), cwd=ts_dir,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        find = f"SELECT id FROM keyturn.action WHERE tenant = '{TENANT}' AND params ->> 'text' = '{text}'"
        wait_for("Inspector's proposal", lambda: psql(find) != "")
        aid = psql(find)
        assert follower.poll() is None, "Inspector did not wait for the person"
        assert approve(aid) == "queued"
        out, err = follower.communicate(timeout=BOUND)
        assert follower.returncode == 0, (out, err)
    finally:
        if follower.poll() is None:
            follower.kill()
    done = answer(out)
    assert done["structuredContent"]["action_id"] == aid and done["structuredContent"]["status"] == "succeeded", done
    assert [c["arguments"].get("text") for c in calls("send_message")].count(text) == 1


@check("elicitation_off_sends_the_client_no_link")
async def _():
    """KEYTURN_MCP_ELICITATION=false: for MCP clients not trusted with a card
    link (often the agent's own process); the person's queue and
    notifications reach them."""
    with keyturnd_with(KEYTURN_MCP_ELICITATION="false"):
        seen = []

        async def elicit(context, params):
            seen.append(params)
            return types.ElicitResult(action="accept")

        aids = []
        for mode in ["legacy", "2026-07-28"]:
            async with client(mode=mode, elicitation=elicit) as c:
                r = await call(c, "chat.send_message", {"channel": "general", "text": f"no link, please ({mode})"})
                assert r.result_type == "complete", r
                aids.append(r.structured_content["action_id"])
        assert seen == [], seen
        for aid in aids:
            assert status_of(aid) == "pending"
            links = psql(f"SELECT count(*) FROM keyturn.card_link WHERE '{aid}' = ANY (action_ids)")
            assert links == "0", links


@check("sessions_are_bound_to_their_identity_and_bounded")
async def _():
    """A legacy session works only for the identity that opened it, only
    while keyturnd binds it: one identity holds at most 8 (a ninth ends its
    oldest, which then answers 404 to anyone, never bound to the next
    caller), keyturnd at most KEYTURN_MCP_MAX_SESSIONS (past it 503), and
    no session id is in keyturnd's log (red-team pass: an evicted binding
    let another agent take over a session, whose id rmcp logged)."""
    alice, bob = jwt(session="cap-a"), jwt(sub="bob", session="cap-b")
    opened = [open_session(alice) for _ in range(9)]
    assert all(opened) and len(set(opened)) == 9, opened
    assert session_status(alice, opened[0]) == 404, "the oldest of nine still works"
    assert session_status(bob, opened[0]) == 404, "an ended session was bound to another identity"
    assert session_status(alice, opened[8]) == 200 and session_status(bob, opened[8]) == 404
    log = open(LOG).read()
    assert not any(sid in log for sid in opened), "a session id is in keyturnd's log"
    with keyturnd_with(KEYTURN_MCP_MAX_SESSIONS="3"):
        mine = [open_session(alice) for _ in range(3)]
        r = raw_initialize(bob)
        assert r.status_code == 503 and r.json()["code"] == "KT503", (r.status_code, r.text)
        assert all(session_status(alice, sid) == 200 for sid in mine)
        ended = httpx2.delete(f"{BASE}/mcp", timeout=BOUND,
                              headers={"Authorization": f"Bearer {alice}", "Mcp-Session-Id": mine[0]})
        assert ended.status_code == 204, ended.status_code
        assert open_session(bob), "a session ended, and none could be opened"


@check("a_client_that_never_answers_holds_no_database_connection")
async def _():
    """A legacy client that declares URL elicitation and never answers it
    keeps its call waiting, but not a connection of the /mcp pool: with a
    pool of one, another agent's read still runs (red-team pass: eight such
    calls took the default pool of eight from every agent)."""
    with keyturnd_with(KEYTURN_MCP_CONNECTIONS="1"):
        never = asyncio.Event()

        async def silent(context, params):
            await never.wait()
            return types.ElicitResult(action="cancel")

        text = "never answered " + uuid.uuid4().hex
        find = f"SELECT count(*) FROM keyturn.action WHERE tenant = '{TENANT}' AND params ->> 'text' = '{text}'"

        async def stalled():
            async with client(elicitation=silent) as c:
                await c.call_tool("chat.send_message", {"channel": "general", "text": text})

        waiting = asyncio.create_task(stalled())
        try:
            for _ in range(BOUND * 10):
                if psql(find) == "1":
                    break
                await asyncio.sleep(0.1)
            assert psql(find) == "1", "the stalled client's proposal was not made"
            assert not waiting.done(), "the stalled call ended"
            async with client(token=jwt(session="other")) as c:
                r = await asyncio.wait_for(call(c, "mcp_deals", {"where": {"stage": "qualified"}}), BOUND)
                assert not r.is_error, r
        finally:
            never.set()
            waiting.cancel()
            try:
                await waiting
            except BaseException:
                pass


@check("an_upstream_read_holds_no_database_connection_while_it_waits")
async def _():
    """Red-team pass of 0.3.0 (docs/security.md, row 77): an upstream
    read kept its /mcp pool connection, in an open transaction, for the
    whole upstream call, so eight slow reads took the default pool from
    every agent. The call is now checked, committed, and the connection
    given back before the upstream is called; the answer is fenced in a
    transaction of its own."""
    with keyturnd_with(KEYTURN_MCP_CONNECTIONS="1"):
        before = len(calls("history"))

        async def slow():
            async with client() as c:
                return await call(c, "chat.history", {"channel": "slow"})

        reading = asyncio.create_task(slow())
        for _ in range(BOUND * 10):
            if len(calls("history")) > before:
                break
            await asyncio.sleep(0.05)
        assert len(calls("history")) > before, "the upstream never received the read"
        assert not reading.done(), "the upstream answered before it could be looked at"
        held = psql("SELECT count(*) FROM pg_stat_activity WHERE usename = 'kt_mcp_login' "
                    "AND state LIKE 'idle in transaction%'")
        assert held == "0", f"{held} /mcp connection(s) held open while the upstream works"
        async with client(token=jwt(session="other")) as c:
            r = await asyncio.wait_for(call(c, "mcp_deals", {"where": {"stage": "qualified"}}), BOUND)
            assert not r.is_error, r
        r = await asyncio.wait_for(reading, BOUND)
        assert not r.is_error and "mallory" in r.content[0].text, r
        assert (r.meta or {}).get("evidence_id"), r


@check("upstream_reads_in_flight_are_bounded_and_checked_again_before_the_answer")
async def _():
    """Row 77's fix let an upstream read hold no connection, so the pool no
    longer bounded them (red-team pass: one agent could spend the shared
    upstream's quota for every tenant): at most KEYTURN_MCP_CONNECTIONS run
    at once. And the call is checked again before its answer is fenced: a
    tool turned off while the upstream worked returns nothing."""
    with keyturnd_with(KEYTURN_MCP_CONNECTIONS="1"):
        before = len(calls("history"))

        async def slow():
            async with client() as c:
                return await call(c, "chat.history", {"channel": "slow"})

        first = asyncio.create_task(slow())
        for _ in range(BOUND * 10):
            if len(calls("history")) > before:
                break
            await asyncio.sleep(0.05)
        assert len(calls("history")) == before + 1, "the first read never reached the upstream"
        second = asyncio.create_task(slow())
        # The second waits for the first's slot: while the first is still
        # at the upstream, the upstream has seen one read.
        await asyncio.sleep(0.5)
        assert not first.done(), "the first read ended too soon to look"
        assert len(calls("history")) == before + 1, "two upstream reads ran at once"
        psql("SELECT keyturn.set_tool_enabled('chat.history', false)")
        try:
            r = await asyncio.wait_for(first, BOUND)
            assert r.is_error and "mallory" not in r.content[0].text, r
            await asyncio.wait_for(second, BOUND)
        finally:
            psql("SELECT keyturn.set_tool_enabled('chat.history', true)")


def raw_stream(token, sid):
    """A standalone stream (GET /mcp) of session `sid`, opened by hand and
    never read past its status line: (socket, HTTP status; 0 when keyturnd
    closed the connection at once)."""
    s = socket.create_connection(("127.0.0.1", KEYTURND_PORT), timeout=BOUND)
    s.sendall((f"GET /mcp HTTP/1.1\r\nHost: 127.0.0.1:{KEYTURND_PORT}\r\n"
               f"Authorization: Bearer {token}\r\nAccept: text/event-stream\r\n"
               f"Mcp-Session-Id: {sid}\r\nMCP-Protocol-Version: 2025-11-25\r\n\r\n").encode())
    head = b""
    while b"\r\n" not in head:
        try:
            byte = s.recv(1)
        except OSError:
            byte = b""
        if not byte:
            return s, 0
        head += byte
    return s, int(head.split()[1])


@check("idle_streams_hold_at_most_half_the_connections")
async def _():
    """Fifth red-team pass (docs/security.md, row 84): a standalone stream
    (GET /mcp) is the one request the request timeout does not end, and
    rmcp kept up to 32 per session, so one agent's eight sessions held
    every connection keyturnd serves: cards, /rpc and /healthz were refused
    at accept for as long as it liked. One stream per session (409), at
    most half of KEYTURN_SERVER_CONNECTIONS in all (503)."""
    with keyturnd_with(KEYTURN_SERVER_CONNECTIONS="8"):
        token = jwt(session="streams")
        sids = [open_session(token) for _ in range(5)]
        held, statuses = [], []
        try:
            for sid in sids:
                s, status = raw_stream(token, sid)
                statuses.append(status)
                if status == 200:
                    held.append(s)
                else:
                    s.close()
            again, second = raw_stream(token, sids[0])
            again.close()
            assert statuses == [200, 200, 200, 200, 503], statuses
            assert second == 409, f"a session's second stream: {second}"
            r = httpx2.get(f"{BASE}/healthz", timeout=BOUND)
            assert r.status_code == 200, r.status_code
        finally:
            for s in held:
                s.close()


@check("a_nul_in_a_call_is_refused_before_the_database_logs_its_values")
async def _():
    """Fifth red-team pass (docs/security.md, row 85): a NUL character
    (U+0000) is valid JSON that PostgreSQL's jsonb refuses, and its error
    quotes the document, values and all, into the server log. keyturnd
    refuses such a call itself (-32602), in the arguments or in _meta."""
    secret = "NULSECRET" + uuid.uuid4().hex[:12]
    log = os.environ["KT_PGLOG"]
    before = os.path.getsize(log)
    before_actions = psql("SELECT count(*) FROM keyturn.action WHERE tenant = 'mcpt'")
    async with client() as c:
        for arguments, meta in (({"channel": secret + "\u0000", "text": "x"}, None),
                                ({"channel": "general", "text": "x"}, {"conversation_id": secret + "\u0000"})):
            try:
                r = await call(c, "chat.send_message", arguments, meta)
            except Exception as e:  # the SDK raises the JSON-RPC error
                assert "NUL character" in str(e), e
                continue
            raise AssertionError(f"a call with a NUL was answered: {r}")
    assert psql("SELECT count(*) FROM keyturn.action WHERE tenant = 'mcpt'") == before_actions
    with open(log, errors="replace") as f:
        f.seek(before)
        assert secret not in f.read(), "the value reached the server log"


@check("no_token_link_code_or_jwt_in_any_response")
async def _():
    assert responses, "no response was kept"
    strings = set()
    for body in responses:
        assert AGENT not in body and SECRET not in body and UPSTREAM_TOKEN not in body
        structured = json.loads(body).get("structuredContent") or {}
        assert "token" not in structured, structured
        strings.update(re.findall(r"[A-Za-z0-9_\-]{20,}", body))
    found = psql("SELECT count(*) FROM keyturn.action a, unnest(ARRAY[" +
                 ",".join("'" + s + "'" for s in strings) +
                 "]::text[]) s WHERE a.token_digest = keyturn._token_digest(s)")
    assert found == "0", found
    log = open(LOG).read()
    assert UPSTREAM_TOKEN not in log and SECRET not in log
    # What an upstream names its tool reaches the log escaped, on its line.
    assert "bad\\nname" in log, "the refused tool's line is missing"
    assert not any(line.startswith("name 2026-12-07") or "FORGED LINE" in line and "bad\\nname" not in line
                   for line in log.splitlines()), "an upstream wrote a line into keyturnd's log"


@check("typescript_sdk_upstream_is_taken_as_it_serves_its_tools")
async def _():
    """An upstream on the official TypeScript SDK (tests/mcp/ts/ts_upstream.mjs,
    installed by tests/run-all into KT_MCP_TS_DIR): discovered and registered
    under the name it gives its tool (board.pin-Message), its stored hash that
    of the definition exactly as served, `execution` and a vendor `_meta` key
    included (the Rust SDK's Tool keeps neither), and an approved call sent to
    it once, with the idempotency key."""
    ts_dir = os.environ.get("KT_MCP_TS_DIR")
    if not ts_dir:
        raise Skip(os.environ.get("KT_MCP_TS_UNAVAILABLE", "KT_MCP_TS_DIR is not set"))
    port = free_port()
    ts_calls = os.path.join(DIR, "ts-upstream-calls.jsonl")
    up = subprocess.Popen(["node", os.path.join(ts_dir, "ts_upstream.mjs"), str(port)], cwd=ts_dir,
                          env=dict(os.environ, KT_TS_UPSTREAM_CALLS=ts_calls), stdout=subprocess.DEVNULL,
                          stderr=open(os.path.join(DIR, "ts-upstream.log"), "a"))
    tool = "board.pin-Message"
    try:
        wait_for("the TypeScript upstream to listen", lambda: listening(port))
        config = os.path.join(DIR, "keyturnd-board.toml")
        with open(os.path.join(DIR, "keyturnd.toml")) as base, open(config, "w") as f:
            f.write(base.read() + f'[[mcp_upstream]]\nname = "board"\nurl = "http://127.0.0.1:{port}/mcp"\n')
        with keyturnd_with(KEYTURN_CONFIG=config):
            wait_for(f"{tool} to be registered", lambda: registered(tool), bound=20)
            # The definition as this SDK serves it, in the revision it
            # answers keyturnd's initialize with.
            served = await upstream_definition("pin-Message", port=port, version="2025-11-25", token=False)
            assert served.get("execution") == {"taskSupport": "forbidden"}, served
            assert served.get("_meta") == {"com.example/audience": "ops"}, served
            stored = psql("SELECT upstream_schema_sha256 FROM keyturn.tool t JOIN keyturn.tool_version v "
                          f"ON v.tool = t.name AND v.version = t.version WHERE t.name = '{tool}'")
            assert stored == hashlib.sha256(canonical(served).encode()).hexdigest(), (stored, served)
            psql(f"SELECT keyturn.set_tool_enabled('{tool}', true), keyturn.grant_tool('mcpt', 'alice', '{tool}')",
                 user="app_admin")
            args = {"board": "ops", "text": "Deploy at 5"}
            aid = await propose_upstream(tool, args)
            assert approve(aid) == "queued"
            wait_for("the action to succeed", lambda: status_of(aid) == "succeeded")
            with open(ts_calls) as f:
                sent = [json.loads(line) for line in f if line.strip()]
            assert [(c["arguments"], c["_meta"]) for c in sent] == [(args, {"idempotency_key": f"keyturn-{aid}"})], sent
    finally:
        if registered(tool):  # as for bob: nothing of it is listed by the checks after
            psql(f"SELECT keyturn.set_tool_enabled('{tool}', false)", user="app_admin")
        up.terminate()
        up.wait(timeout=BOUND)


@check("a_rogue_upstream_gets_each_call_once_and_cannot_end_another_or_write_the_log")
async def _():
    """The seventeenth red-team pass (docs/security.md, rows 118-120), with an
    upstream that misbehaves on purpose (tests/mcp/rogue_upstream.py):
    - an approved call answered HTTP 404 ("session expired") is not sent
      again on a new session: one tools/call, `uncertain`;
    - an agent's read that times out does not end an approved call in flight
      on the same session: it succeeds, sent once;
    - a request id the upstream writes with a line break and terminal
      escapes reaches keyturnd's log escaped, on its line;
    - a read answered with a NUL character (U+0000) is an error before the
      database sees it, whose error would quote the answer into the server
      log (the twenty-first pass, row 131)."""
    port = free_port()
    mode, rogue_calls, requests = (os.path.join(DIR, f"rogue-{x}") for x in ("mode.json", "calls.jsonl",
                                                                            "requests.jsonl"))
    for f in (mode, rogue_calls, requests):
        if os.path.exists(f):
            os.remove(f)

    def set_mode(m):
        with open(mode, "w") as f:
            json.dump(m, f)

    def sent(tool, text):
        if not os.path.exists(rogue_calls):
            return []
        with open(rogue_calls) as f:
            rows = [json.loads(line) for line in f if line.strip()]
        return [r for r in rows if r["tool"] == tool and r["arguments"] == {"text": text}]

    up = subprocess.Popen([sys.executable, os.path.join(HERE, "rogue_upstream.py"), str(port)],
                          env=dict(os.environ, KT_ROGUE_MODE=mode, KT_ROGUE_CALLS=rogue_calls,
                                   KT_ROGUE_REQUESTS=requests),
                          stdout=subprocess.DEVNULL, stderr=open(os.path.join(DIR, "rogue.log"), "a"))
    tools = ["rogue.post", "rogue.lookup"]
    try:
        wait_for("the rogue upstream to listen", lambda: listening(port))
        config = os.path.join(DIR, "keyturnd-rogue.toml")
        with open(os.path.join(DIR, "keyturnd.toml")) as base, open(config, "w") as f:
            f.write(base.read() + f'[[mcp_upstream]]\nname = "rogue"\nurl = "http://127.0.0.1:{port}/mcp"\n'
                                  'trust_annotations = true\n')
        log_from = os.path.getsize(LOG)
        with keyturnd_with(KEYTURN_CONFIG=config):
            for tool in tools:
                wait_for(f"{tool} to be registered", lambda: registered(tool), bound=20)
            psql("SELECT keyturn.register_projection('rogue.lookup', '{\"fields\": {\"text\": {\"max_length\": 40}}}'); "
                 "SELECT keyturn.set_tool_enabled(t, true), keyturn.grant_tool('mcpt', 'alice', t) "
                 "FROM unnest(ARRAY['rogue.post', 'rogue.lookup']) t", user="app_admin")

            # 1. A 404 to an approved call: unknown, and never sent twice.
            set_mode({"http404": ["post"]})
            aid = await propose_upstream("rogue.post", {"text": "answered 404"})
            assert approve(aid) == "queued"
            wait_for("the 404 to be recorded", lambda: status_of(aid) not in ("queued", "leased", "executing"))
            assert status_of(aid) == "uncertain", status_of(aid)
            assert len(sent("post", "answered 404")) == 1, sent("post", "answered 404")

            # 2. An agent's read times out (3 s) while an approved call is
            # in flight on the same session (sent 1 s after the read, it
            # answers 2.5 s after it is sent).
            set_mode({"stall": {"lookup": 6, "post": 2.5}})
            aid = await propose_upstream("rogue.post", {"text": "in flight"})
            async with client() as c:
                read = asyncio.create_task(call(c, "rogue.lookup", {"text": "slow"}))
                await asyncio.to_thread(wait_for, "the read to reach the upstream", lambda: sent("lookup", "slow"))
                await asyncio.sleep(1)  # staging, not a measure: the overlap is asserted below
                assert approve(aid) == "queued"
                r = await read
                assert r.is_error, r
            wait_for("the approved call to end", lambda: status_of(aid) not in ("queued", "leased", "executing"))
            t_read, t_post = sent("lookup", "slow")[0]["at"], sent("post", "in flight")[0]["at"]
            assert t_post < t_read + 3 < t_post + 2.5, ("the read's timeout did not fall inside the call", t_read, t_post)
            assert status_of(aid) == "succeeded", status_of(aid)
            assert len(sent("post", "in flight")) == 1, sent("post", "in flight")

            # 3. A NUL in a read's answer: an error, and nothing of the
            # answer in the server log.
            secret = "UPSTREAMSECRET" + uuid.uuid4().hex[:12]
            set_mode({"nul": ["lookup"], "secret": secret})
            pg_from = os.path.getsize(os.environ["KT_PGLOG"])
            async with client() as c:
                r = await call(c, "rogue.lookup", {"text": "nul"})
            assert r.is_error and "NUL" in r.content[0].text, r
            with open(os.environ["KT_PGLOG"], errors="replace") as f:
                f.seek(pg_from)
                assert secret not in f.read(), "the upstream's answer reached the server log"

        # 4. What the upstream wrote as a request id is on one line, escaped.
        with open(LOG, encoding="utf-8", errors="replace") as f:
            f.seek(log_from)
            log = f.read()
        assert "id=x\\n2026-12-07T00:00:00.000000Z ERROR keyturnd::worker: FORGED BY THE UPSTREAM \\u{1b}[31mred" in log, \
            "the upstream's request id is not in the log as rmcp writes it, escaped"
        assert not any(line.startswith("2026-12-07T00:00:00.000000Z") for line in log.splitlines()), \
            "the upstream wrote a line into keyturnd's log"
        assert "\x1b" not in log, "a terminal escape reached the log"
    finally:
        for tool in tools:  # nothing of it is listed by the checks after
            if registered(tool):
                psql(f"SELECT keyturn.set_tool_enabled('{tool}', false)", user="app_admin")
        up.terminate()
        up.wait(timeout=BOUND)


@check("an_upstream_that_says_its_list_changed_at_every_turn_is_discovered_at_a_pace")
async def _():
    """The thirtieth red-team pass (docs/security.md, row 142): an upstream
    that sends notifications/tools/list_changed before every tools/list
    answer, listing new names each time and names keyturn refuses, had
    keyturnd discover it without pause (81 times in 8 s), growing the tool
    catalog by thousands of rows and its log by a line a refused tool.
    keyturnd discovers it again at most every 10 s, and names three refused
    tools a discovery."""
    port = free_port()
    mode, requests = (os.path.join(DIR, f"flood-{x}") for x in ("mode.json", "requests.jsonl"))
    for f in (mode, requests):
        if os.path.exists(f):
            os.remove(f)
    with open(mode, "w") as f:
        json.dump({"flood": 20}, f)

    def lists():
        if not os.path.exists(requests):
            return 0
        with open(requests) as f:
            return sum(1 for line in f if json.loads(line)["method"] == "tools/list")

    up = subprocess.Popen([sys.executable, os.path.join(HERE, "rogue_upstream.py"), str(port)],
                          env=dict(os.environ, KT_ROGUE_MODE=mode, KT_ROGUE_CALLS=os.path.join(DIR, "flood-calls"),
                                   KT_ROGUE_REQUESTS=requests),
                          stdout=subprocess.DEVNULL, stderr=open(os.path.join(DIR, "rogue.log"), "a"))
    try:
        wait_for("the flooding upstream to listen", lambda: listening(port))
        config = os.path.join(DIR, "keyturnd-flood.toml")
        with open(os.path.join(DIR, "keyturnd.toml")) as base, open(config, "w") as f:
            f.write(base.read() + f'[[mcp_upstream]]\nname = "flood"\nurl = "http://127.0.0.1:{port}/mcp"\n')
        log_from = os.path.getsize(LOG)
        with keyturnd_with(KEYTURN_CONFIG=config):
            wait_for("the first discovery", lambda: registered("flood.f1x0"), bound=20)
            time.sleep(6)
            listed = lists()
        with open(LOG, encoding="utf-8", errors="replace") as f:
            f.seek(log_from)
            refusals = sum(1 for line in f if "upstream tool not registered" in line and "flood" in line)
        assert 1 <= listed <= 2, f"{listed} discoveries in about 6 s"
        assert refusals <= 3 * listed, f"{refusals} lines for refused tools in {listed} discoveries"
    finally:
        up.terminate()
        up.wait(timeout=BOUND)


def listening(port):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def hs256(payload):
    """An HS256 JWT of exactly `payload`, signed with the layer's secret."""
    import base64
    import hmac

    def b64(b):
        return base64.urlsafe_b64encode(b).rstrip(b"=").decode()
    head = b64(b'{"alg":"HS256","typ":"JWT"}') + "." + b64(payload.encode())
    return head + "." + b64(hmac.new(SECRET.encode(), head.encode(), hashlib.sha256).digest())


@check("what_keyturn_would_read_otherwise_is_refused_and_the_log_stays_short")
async def _():
    """The twenty-first red-team pass (docs/security.md, rows 128 to 130):
    - arguments that repeat a key, or hold serde_json's reserved number key,
      which the MCP SDK read one way and keyturn's strict reader another,
      are refused (400) and propose nothing;
    - a JWT whose payload repeats a claim (the last tenant won here; the
      database reads none) is refused (401);
    - a request id of 900 KB, which rmcp logs whole, writes a short line."""
    sid = open_session(AGENT)
    headers = {"Authorization": f"Bearer {AGENT}", "Mcp-Session-Id": sid, "MCP-Protocol-Version": "2025-11-25",
               "Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    text = "read apart " + uuid.uuid4().hex
    for arguments in ['{"channel": "general", "text": "%s", "text": "%s, again"}' % (text, text),
                      '{"channel": "general", "text": "%s", "n": {"$serde_json::private::Number": "7"}}' % text]:
        body = ('{"jsonrpc": "2.0", "id": 3, "method": "tools/call", '
                '"params": {"name": "chat.send_message", "arguments": %s}}' % arguments)
        r = httpx2.post(f"{BASE}/mcp", content=body, headers=headers, timeout=BOUND)
        assert r.status_code == 400, (r.status_code, r.text[:300])
    found = f"SELECT count(*) FROM keyturn.action WHERE tenant = '{TENANT}' AND params ->> 'text' LIKE '{text}%'"
    assert psql(found) == "0", psql(found)

    claims = ('{"role": "kt_mcp_agent", "sub": "alice", "session_id": "s1", "tenant_id": "elsewhere", '
              '"tenant_id": "%s", "exp": %d}' % (TENANT, int(time.time()) + 300))
    r = httpx2.post(f"{BASE}/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, timeout=BOUND,
                    headers={"Authorization": f"Bearer {hs256(claims)}", "Accept": "application/json, text/event-stream"})
    assert r.status_code == 401, (r.status_code, r.text[:300])

    log_from = os.path.getsize(LOG)
    for _ in range(3):
        body = ('{"jsonrpc": "2.0", "id": "%s", "method": "tools/call", '
                '"params": {"name": "a\\u0000b", "arguments": {}}}' % ("x" * 900_000))
        httpx2.post(f"{BASE}/mcp", content=body, headers=headers, timeout=BOUND)
    time.sleep(0.5)
    grown = os.path.getsize(LOG) - log_from
    assert grown < 60_000, f"the log grew by {grown} bytes"


async def main():
    global AGENT
    os.makedirs(DIR, exist_ok=True)
    for f in (CALLS, DRIFT, LATE):
        if os.path.exists(f):
            os.remove(f)
    try:
        setup_database()
        start_upstream()
        start_keyturnd()
        AGENT = jwt()
        chat = "ARRAY['chat.drop_send', 'chat.fail_send', 'chat.history', 'chat.open_channel', " \
               "'chat.post_reply', 'chat.rename_channel', 'chat.send_message', 'chat.set-Topic', " \
               "'chat.slow_send']"
        wait_for("keyturnd to register the upstream's tools",
                 lambda: psql(f"SELECT count(*) FROM keyturn.tool WHERE name = ANY ({chat})") == "9")
        assert psql(f"SELECT bool_or(enabled) FROM keyturn.tool WHERE name = ANY ({chat})") == "f", \
            "discovered tools must be registered disabled"
        assert psql("SELECT string_agg(name || ':' || v.kind, ' ' ORDER BY name) FROM keyturn.tool t "
                    "JOIN keyturn.tool_version v ON v.tool = t.name AND v.version = t.version "
                    f"WHERE name = ANY ({chat})") == \
            "chat.drop_send:write chat.fail_send:write chat.history:read chat.open_channel:write " \
            "chat.post_reply:write " \
            "chat.rename_channel:write " \
            "chat.send_message:write chat.set-Topic:write chat.slow_send:write"
        psql("SELECT keyturn.set_tool_enabled(name, true), keyturn.grant_tool('mcpt', 'alice', name) "
             f"FROM unnest({chat}) AS name", user="app_admin")
        only = os.environ.get("KT_MCP_CHECKS", "").split()
        for run in CHECKS:
            if only and run.__name__ not in only:
                print(f"SKIPPED {run.__name__}: not in KT_MCP_CHECKS", flush=True)
                continue
            await run()
    finally:
        for p in (keyturnd_proc, upstream_proc):
            if p and p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    p.kill()
        if keyturnd_proc is not None and keyturnd_proc.returncode not in (0, None):
            print(f"keyturnd ended with {keyturnd_proc.returncode}")
        psql("DELETE FROM crm.deal WHERE tenant = 'mcpt'")
        drop_roles()
    passed = sum(1 for _, ok in results if ok)
    failed = len(results) - passed
    print(f"{passed} passed, {failed} failed")
    return 1 if failed or not results else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
