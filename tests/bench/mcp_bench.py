#!/usr/bin/env python3
"""The client side of tests/bench/run's item `mcp` (tests/bench/mcp.sh):
keyturnd's /mcp driven by the official MCP Python SDK (PyPI `mcp` 2.x, the
venv of tests/harness.sh's kt_mcp_python), in the handshake-era mode
(`mode="legacy"`, the 2025-11-25 initialize handshake) that today's agents
speak, without elicitation (so keyturnd mints no card link during a call).

Not named mcp.py: run as a script, its directory comes first on sys.path and
`import mcp` would import this file.

    mcp_bench.py call      C clients call a write tool for S seconds; latencies
    mcp_bench.py sessions  keyturnd's VmRSS idle, with N sessions open, after
    mcp_bench.py notify    propose over MCP -> the webhook's arrival, A/B rounds
    mcp_bench.py latency   p50/p99 of pgbench -l logs (no SDK needed)

Every figure goes to stdout as `key=value` words for tests/bench/mcp.sh.
"""

import argparse
import asyncio
import json
import math
import multiprocessing
import os
import random
import re
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

BODY = "Hi Ann, the Q3 numbers are attached. Best, Bob"


def params(n):
    """The params of tests/bench/pgbench/propose.sql, the SQL side's script."""
    return {"to": f"ann{n}@example.com", "subject": "Q3 numbers", "body": BODY}


def percentile(xs, q):
    """Nearest rank, the same for every side of every pair."""
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[max(0, math.ceil(q * len(s)) - 1)]


def summary(lat_ms):
    return f"n={len(lat_ms)} p50_ms={percentile(lat_ms, 0.50):.3f} p99_ms={percentile(lat_ms, 0.99):.3f}"


def jwt(keyturnd, secret, sub, tenant, session):
    out = subprocess.run([keyturnd, "jwt", "--role", "app_agent", "--sub", sub, "--tenant", tenant,
                          "--session", session, "--ttl", "7200"],
                         env=dict(os.environ, KEYTURN_JWT_SECRET=secret, DATABASE_URL="postgres://x"),
                         capture_output=True, text=True, check=True)
    return out.stdout.strip()


def client(url, token):
    # Imported here so that `latency` runs on a Python without the SDK.
    import httpx2
    from mcp.client.client import Client
    from mcp.client.streamable_http import streamable_http_client
    # One HTTP client per session, as separate agents would have.
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=30)
    return Client(streamable_http_client(url, http_client=http), mode="legacy", cache=None)


# ---- call: latency of a write tool's tools/call ----

async def call_clients(url, tool, tokens, seconds, barrier):
    """Opens one session per token, waits for every process's sessions
    (barrier), then calls `tool` in a closed loop for `seconds`."""
    from contextlib import AsyncExitStack
    async with AsyncExitStack() as stack:
        sessions = [await stack.enter_async_context(client(url, t)) for t in tokens]
        for c in sessions:  # one call each before the clock: the session's first-call costs
            await c.call_tool(tool, params(random.randint(1, 1000000)))
        await asyncio.to_thread(barrier.wait)
        end = time.perf_counter() + seconds
        lat, errors = [], 0

        async def loop(c):
            nonlocal errors
            while time.perf_counter() < end:
                t0 = time.perf_counter()
                r = await c.call_tool(tool, params(random.randint(1, 1000000)))
                dt = (time.perf_counter() - t0) * 1000
                if r.is_error or (r.structured_content or {}).get("status") != "pending":
                    errors += 1
                else:
                    lat.append(dt)
        t0, cpu0 = time.perf_counter(), time.process_time()
        await asyncio.gather(*(loop(c) for c in sessions))
        return lat, errors, time.perf_counter() - t0, time.process_time() - cpu0


def call_process(url, tool, tokens, seconds, barrier, queue):
    queue.put(asyncio.run(call_clients(url, tool, tokens, seconds, barrier)))


def cpu_seconds(pid):
    """utime + stime of a process, from /proc/<pid>/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cmd_call(a):
    # The clients spread over as many processes as pgbench's threads on the
    # SQL side (-j: 1 for one client, else 2), so neither client library
    # runs on fewer cores than the other.
    procs = 1 if a.clients < 2 else 2
    tokens = [jwt(a.keyturnd, a.secret, f"p{i}", a.tenant, f"s{i}") for i in range(a.clients)]
    # Bounds that only end a run gone wrong (a worker that died would
    # otherwise leave the other at the barrier, and this one at the queue).
    barrier, queue = multiprocessing.Barrier(procs, timeout=120), multiprocessing.Queue()
    workers = [multiprocessing.Process(target=call_process,
                                       args=(a.url, a.tool, tokens[i::procs], a.seconds, barrier, queue))
               for i in range(procs)]
    for w in workers:
        w.start()
    server0 = cpu_seconds(a.pid)
    results = [queue.get(timeout=a.seconds + 300) for _ in workers]
    server = cpu_seconds(a.pid) - server0
    for w in workers:
        w.join()
    lat = [x for r in results for x in r[0]]
    errors = sum(r[1] for r in results)
    elapsed = max(r[2] for r in results)
    client_cpu = sum(r[3] for r in results)
    with open(a.out, "w") as f:
        f.writelines(f"{x:.3f}\n" for x in lat)
    # Where an MCP call's time goes besides the database: the SDK's CPU and
    # keyturnd's, per call (keyturnd's includes the sessions' set-up, a
    # few calls' worth).
    n = max(1, len(lat))
    print(f"{summary(lat)} errors={errors} per_s={len(lat) / elapsed:.1f} "
          f"client_cpu_ms={client_cpu * 1000 / n:.3f} keyturnd_cpu_ms={server * 1000 / n:.3f}")


# ---- sessions: keyturnd's memory per open MCP session ----

def vmrss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


async def cmd_sessions_async(a):
    from contextlib import AsyncExitStack
    # A JWT a session, as separate agents would have (keyturnd keeps at most
    # 8 sessions of one identity open).
    tokens = [jwt(a.keyturnd, a.secret, "p0", a.tenant, f"s{i}") for i in range(a.n)]
    idle = vmrss_kib(a.pid)
    async with AsyncExitStack() as stack:
        for token in tokens:
            c = await stack.enter_async_context(client(a.url, token))
            await c.list_tools()
        # Open sessions idle, as agents between turns; a moment for
        # keyturnd's tasks to finish what the last requests started.
        await asyncio.sleep(1)
        opened = vmrss_kib(a.pid)
    await asyncio.sleep(1)
    closed = vmrss_kib(a.pid)
    print(f"idle_kib={idle} open_kib={opened} closed_kib={closed} "
          f"per_session_kib={(opened - idle) / a.n:.1f}")


# ---- notify: propose -> a webhook's arrival at a receiver of our own ----

class Arrivals:
    """Arrival times (perf_counter, the clock the proposals are timed with)
    by action id, recorded by the receiver's threads."""

    def __init__(self):
        self.at, self.cv = {}, threading.Condition()

    def record(self, action_id, t):
        with self.cv:
            self.at.setdefault(action_id, t)
            self.cv.notify_all()

    def wait(self, action_id, bound):
        with self.cv:
            self.cv.wait_for(lambda: action_id in self.at, timeout=bound)
            return self.at.get(action_id)


def receiver(port, arrivals):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as a chat server answers

        def do_POST(self):
            t = time.perf_counter()  # the request head is in: it has arrived
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            # An approved action's webhook names its action; a notification
            # links its card, /card#a=<action_id>&c=<code>.
            action_id = body.get("action_id")
            if action_id is None:
                m = re.search(r"[#&]a=([0-9a-f-]{36})", (body.get("data") or {}).get("link", ""))
                action_id = m and m.group(1)
            if action_id:
                arrivals.record(action_id, t)
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


async def propose_and_wait(c, tool, arrivals, n, bound, status):
    """n proposals one after another, each waiting for its webhook: latency
    from the call to the arrival, the call's own, from its answer to the
    arrival (negative when the POST came first), and how many never came."""
    to_arrival, call, after, lost = [], [], [], 0
    for _ in range(n):
        t0 = time.perf_counter()
        r = await c.call_tool(tool, params(random.randint(1, 1000000)))
        t1 = time.perf_counter()
        action_id = (r.structured_content or {}).get("action_id")
        if r.is_error or not action_id:
            raise RuntimeError(f"the proposal was refused: {r.content[0].text if r.content else r}")
        if r.structured_content.get("status") != status:
            raise RuntimeError(f"a proposal is {r.structured_content.get('status')}, not {status}: "
                               "the setup of this side is not what it measures")
        t = await asyncio.to_thread(arrivals.wait, action_id, bound)
        if t is None:
            lost += 1
            continue
        to_arrival.append((t - t0) * 1000)
        call.append((t1 - t0) * 1000)
        after.append((t - t1) * 1000)
    return to_arrival, call, after, lost


async def cmd_notify_async(a):
    arrivals = Arrivals()
    server = receiver(a.port, arrivals)
    try:
        for r in range(1, a.rounds + 1):
            # A: the proposer is waited for and has a webhook channel, so the
            # proposal records a notification. B: a standing approval covers
            # the proposal, so propose queues it for the webhook provider.
            for variant, who, status in (("notice", f"n{r}", "pending"), ("approved", f"d{r}", "queued")):
                async with client(a.url, jwt(a.keyturnd, a.secret, who, a.tenant, "s1")) as c:
                    await propose_and_wait(c, a.tool, arrivals, a.warmup, a.bound, status)
                    lat, call, after, lost = await propose_and_wait(c, a.tool, arrivals, a.n, a.bound, status)
                print(f"round={r} variant={variant} {summary(lat)} lost={lost} "
                      f"call_p50_ms={percentile(call, 0.5):.3f} call_p99_ms={percentile(call, 0.99):.3f} "
                      f"after_answer_p50_ms={percentile(after, 0.5):.3f} after_answer_p99_ms={percentile(after, 0.99):.3f}",
                      flush=True)
    finally:
        server.shutdown()


# ---- latency: pgbench -l logs ----

def cmd_latency(a):
    lat = []
    seen = set()
    for path in a.logs:
        with open(path) as f:
            for line in f:
                fields = line.split()
                # client, transaction, latency in µs ("failed" when it failed), …
                # Each client's first transaction is left out, as each MCP
                # session's first call is: a new backend's first propose
                # compiles and plans what keyturnd's pooled ones have kept.
                # (pgbench numbers a client's transactions from 1 or 0 by
                # version; a client's lines are in order in one file, so its
                # first line is its first transaction.)
                if len(fields) < 3:
                    continue
                if fields[0] not in seen:
                    seen.add(fields[0])
                    continue
                if fields[2].isdigit():
                    lat.append(int(fields[2]) / 1000)
    print(summary(lat))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--url", required=True, help="keyturnd's /mcp")
    common.add_argument("--keyturnd", required=True, help="the binary, to mint agent JWTs (keyturnd jwt)")
    common.add_argument("--secret", required=True, help="KEYTURN_JWT_SECRET")
    common.add_argument("--tenant", required=True)
    common.add_argument("--tool", default="email.send")
    c = sub.add_parser("call", parents=[common])
    c.add_argument("--clients", type=int, required=True)
    c.add_argument("--seconds", type=float, required=True)
    c.add_argument("--out", required=True, help="the latencies, ms, one a line")
    c.add_argument("--pid", type=int, required=True, help="keyturnd's, for its CPU time")
    s = sub.add_parser("sessions", parents=[common])
    s.add_argument("--pid", type=int, required=True, help="keyturnd's")
    s.add_argument("--n", type=int, default=100)
    n = sub.add_parser("notify", parents=[common])
    n.add_argument("--port", type=int, required=True, help="the receiver's, as in the people's channels")
    n.add_argument("--rounds", type=int, required=True)
    n.add_argument("--n", type=int, required=True, help="proposals per side and round")
    n.add_argument("--warmup", type=int, default=5)
    n.add_argument("--bound", type=float, default=10, help="seconds before a webhook counts as lost")
    lt = sub.add_parser("latency")
    lt.add_argument("logs", nargs="+")
    a = p.parse_args()
    if a.cmd == "call":
        cmd_call(a)
    elif a.cmd == "sessions":
        asyncio.run(cmd_sessions_async(a))
    elif a.cmd == "notify":
        asyncio.run(cmd_notify_async(a))
    else:
        cmd_latency(a)


if __name__ == "__main__":
    main()
