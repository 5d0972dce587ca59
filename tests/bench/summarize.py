#!/usr/bin/env python3
"""Turns a tests/bench/run results directory into summary.md (stdout).

Every pair is reported as the median of the per-round ratios A/B (A and B ran
back to back in each round), with the lowest and highest round ratio as the
spread, beside each side's median flows/s and WAL bytes per flow.
"""
import collections
import csv
import glob
import os
import re
import statistics
import sys

out = sys.argv[1]
rows = list(csv.DictReader(open(os.path.join(out, "results.tsv")), delimiter="\t"))


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def approve_latency_ms(log):
    """Sum of the per-statement latencies after the second BEGIN (pgbench -r)."""
    try:
        text = open(log).read()
    except OSError:
        return None
    lines = text.split("statement latencies in milliseconds")[-1].splitlines()[1:]
    stmts = []
    for line in lines:
        m = re.match(r"^\s+([0-9.]+)\s+(?:[0-9]+\s+)?(\S.*)$", line)
        if m:
            stmts.append((float(m.group(1)), m.group(2)))
    begins = [i for i, (_, s) in enumerate(stmts) if s.startswith("BEGIN")]
    if len(begins) < 2:
        return None
    tail = stmts[begins[1]:]
    commit = tail[-1][0] if tail and tail[-1][1].startswith("COMMIT") else None
    return sum(x for x, _ in tail), commit


pairs = collections.OrderedDict()
for r in rows:
    if r["variant"] not in ("A", "B"):
        continue
    key = (r["item"], int(r["clients"]))
    pairs.setdefault(key, {}).setdefault(int(r["round"]), {})[r["variant"]] = r

TITLES = {
    "flow": "1. Gate flow (propose + approve, sql tool) vs bare flow",
    "lean": "1b. Gate flow vs the lean flow (no role switching, no identity)",
    "chain": "1c. Gate flow of one tenant (A: one audit chain) vs a tenant per client (B)",
    "chainheld": "1d. Gate flow of one tenant, the chain held until the WAL flush (A: keyturn.chain_early_release = off) vs released at the commit record (B: on, the default)",
    "propose": "2. propose alone vs plain INSERT of the same row",
    "notify": "7. External approve flow with NOTIFY (A) vs keyturn.notify = off (B)",
    "drain": "3. Drain: keyturnd (A) vs bare worker (B), the same slots each (clients = slots); flows = actions",
    "exp-e1": "E1. Gate flow as installed (A) vs helpers without SET search_path (B)",
    "exp-e2": "E2. Gate flow as installed (A) vs _invalid_reason with its FOR KEY SHARE put back (B)",
    "lib-flow": "L. Gate flow, this tree's library (A) vs KT_BENCH_LIBRARY_B (B)",
    "lib-step32": "L. A dispatch step of 32 jobs, rolled back (flows = steps), this tree's library (A) vs KT_BENCH_LIBRARY_B (B)",
    "lib-step1": "L. A dispatch step of 1 job, rolled back (flows = steps), this tree's library (A) vs KT_BENCH_LIBRARY_B (B)",
}

print("# keyturn benchmark summary\n")
machine = os.path.join(out, "machine.md")
if os.path.exists(machine):
    print(open(machine).read())

if pairs:
    print("## Ratios (A ÷ B, median of rounds; spread = lowest–highest round)\n")
    print("| item | clients | rounds | A flows/s | B flows/s | ratio A/B | spread | A WAL B/flow | B WAL B/flow | checkpoints in runs |")
    print("|---|---:|---:|---:|---:|---:|---|---:|---:|---:|")
scale_ratio = {}
pair_ratio = {}
for (item, clients), rounds in pairs.items():
    ratios, a_tps, b_tps, a_wal, b_wal, ckpt = [], [], [], [], [], 0
    for rnd, ab in sorted(rounds.items()):
        if "A" not in ab or "B" not in ab:
            continue
        a, b = ab["A"], ab["B"]
        ta, tb = float(a["flows_per_s"] or 0), float(b["flows_per_s"] or 0)
        if tb > 0:
            ratios.append(ta / tb)
        a_tps.append(ta)
        b_tps.append(tb)
        a_wal.append(int(a["wal_bytes"]) / max(1, int(a["flows"] or 1)))
        b_wal.append(int(b["wal_bytes"]) / max(1, int(b["flows"] or 1)))
        ckpt += int(a["checkpoints"]) + int(b["checkpoints"])
    if not ratios:
        continue
    pair_ratio[(item, clients)] = (med(ratios), min(ratios), max(ratios), med(a_tps), med(b_tps))
    title = TITLES.get(item, item)
    if item.startswith("scale-"):
        title = f"5. Gate vs bare flow with {int(item[6:]):,} rows of history"
        scale_ratio[int(item[6:])] = (med(ratios), min(ratios), max(ratios))
    print(f"| {title} | {clients} | {len(ratios)} | {med(a_tps):.1f} | {med(b_tps):.1f} | "
          f"**{med(ratios):.3f}** | {min(ratios):.3f}–{max(ratios):.3f} | {med(a_wal):.0f} | {med(b_wal):.0f} | {ckpt} |")
print()

# Item 3, keyturnd's two sides in the same rounds: its settings at their
# defaults but the workers, which are the slots (A) and with the environment its A1 rows name (KEYTURN_LEASE_STEPS=1, one
# lease step at a time, unless DRAIN_A1_ENV said otherwise).
steps = collections.defaultdict(dict)
a1_env = {}
for r in rows:
    if r["item"] == "drain" and r["variant"] in ("A", "A1"):
        steps[int(r["clients"])].setdefault(int(r["round"]), {})[r["variant"]] = float(r["flows_per_s"] or 0)
        m = re.search(r"env=(\S*)", r["extra"] or "")
        if r["variant"] == "A1" and m:
            a1_env[int(r["clients"])] = m.group(1).replace(",", " ")
for c, rs in sorted(steps.items()):
    both = [x for x in rs.values() if x.get("A") and x.get("A1")]
    if both:
        ratios = [x["A"] / x["A1"] for x in both]
        print(f"**Drain at {c} slots, keyturnd with its other settings at their defaults (A) ÷ with "
              f"{a1_env.get(c) or 'KEYTURN_LEASE_STEPS=1'} (A1): {med(ratios):.3f}** ({min(ratios):.3f}–{max(ratios):.3f}, "
              f"{len(both)} rounds; {med([x['A'] for x in both]):.0f} against {med([x['A1'] for x in both]):.0f} actions/s)\n")

# Item 7: approve transaction latency from pgbench -r.
notify_logs = sorted(glob.glob(os.path.join(out, "pgbench", "notify-*.log")))
if notify_logs:
    print("### 7. Approve transaction latency (pgbench -r, ms, median of rounds)\n")
    print("| clients | variant | approve tx (SET ROLE … COMMIT) | of which COMMIT |")
    print("|---:|---|---:|---:|")
    by = collections.defaultdict(list)
    for log in notify_logs:
        m = re.search(r"notify-([AB])-c(\d+)-r(\d+)\.log$", log)
        lat = approve_latency_ms(log)
        if m and lat:
            by[(int(m.group(2)), m.group(1))].append(lat)
    for (c, v), lats in sorted(by.items()):
        label = "NOTIFY" if v == "A" else "no NOTIFY"
        print(f"| {c} | {label} | {med([x for x, _ in lats]):.3f} | {med([y for _, y in lats if y is not None]):.3f} |")
    print()

if len(scale_ratio) == 2:
    (small, (rs, _, _)), (big, (rb, lo, hi)) = sorted(scale_ratio.items())
    print(f"**Scale:** gate/bare ratio at {big:,} rows ÷ at {small:,} rows = **{rb / rs:.3f}** "
          f"(target ≥ 0.85, i.e. within 15 %).\n")

sweeps = [r for r in rows if r["item"] == "scale" and r["variant"] == "sweep"]
if sweeps:
    print("### 5. sweep() with one due row (psql \\timing, ms)\n")
    by = collections.defaultdict(list)
    for r in sweeps:
        by[int(r["extra"])].append(float(r["flows_per_s"]))
    for label, ts in sorted(by.items()):
        print(f"- {label:,} rows of history: median {med(ts):.2f} ms, max {max(ts):.2f} ms over {len(ts)} calls "
              f"(first call {ts[0]:.2f} ms)")
    print()


def words(extra):
    """The key=value words tests/bench/mcp.sh keeps in a row's extra."""
    return {k: float(v) for k, v in re.findall(r"(\w+)=(-?[0-9.]+)(?:\s|$)", extra or "")}


def by_round(item, a, b):
    """{clients: {round: (words of a, words of b)}} of the rounds that have both."""
    got = collections.defaultdict(dict)
    for r in rows:
        if r["item"] == item and r["variant"] in (a, b):
            got[int(r["clients"])].setdefault(int(r["round"]), {})[r["variant"]] = words(r["extra"])
    return {c: {n: (x[a], x[b]) for n, x in rs.items() if a in x and b in x} for c, rs in got.items()}


def ratio_cells(ab, key):
    """Median of each side, the median of the per-round ratios and its spread."""
    ab = [(x, y) for x, y in ab if x.get(key) is not None and y.get(key)]
    ratios = [x[key] / y[key] for x, y in ab]
    if not ratios:
        return "–", "–", "–", "–"
    return (f"{med([x[key] for x, _ in ab]):.2f}", f"{med([y[key] for _, y in ab]):.2f}",
            f"**{med(ratios):.2f}**", f"{min(ratios):.2f}–{max(ratios):.2f}")


calls = by_round("mcp-call", "mcp", "sql")
if calls:
    print("### 9a. An MCP write call (tools/call through /mcp, Python SDK) ÷ the same propose in SQL (pgbench)\n")
    print("Latency in ms; medians of rounds; ratio = MCP ÷ SQL, median of per-round ratios (spread).\n")
    print("| clients | rounds | MCP p50 | SQL p50 | **p50 ratio** | spread | MCP p99 | SQL p99 | **p99 ratio** | spread | MCP calls/s | SQL calls/s | CPU ms a call, SDK / keyturnd | MCP errors |")
    print("|---:|---:|---:|---:|---:|---|---:|---:|---:|---|---:|---:|---|---:|")
    for c, rs in sorted(calls.items()):
        ab = [rs[n] for n in sorted(rs)]
        p50, p99 = ratio_cells(ab, "p50_ms"), ratio_cells(ab, "p99_ms")
        print(f"| {c} | {len(ab)} | {' | '.join(p50)} | {' | '.join(p99)} | "
              f"{med([x['per_s'] for x, _ in ab]):.0f} | {med([y['per_s'] for _, y in ab]):.0f} | "
              f"{med([x['client_cpu_ms'] for x, _ in ab]):.2f} / {med([x['keyturnd_cpu_ms'] for x, _ in ab]):.2f} | "
              f"{sum(x.get('errors', 0) for x, _ in ab):.0f} |")
    print()
rss = [(int(r["clients"]), words(r["extra"])) for r in rows if r["item"] == "mcp-rss"]
rss = [(n, w) for n, w in rss if "open_kib" in w]
if rss:
    n = rss[0][0]
    print(f"### 9b. keyturnd VmRSS with {n} MCP sessions open (initialized, one tools/list each)\n")
    print(f"| rounds | idle | {n} sessions open | difference per session | after closing them |")
    print("|---:|---:|---:|---:|---:|")
    ws = [w for _, w in rss]
    print(f"| {len(ws)} | {med([w['idle_kib'] for w in ws]) / 1024:.1f} MiB | {med([w['open_kib'] for w in ws]) / 1024:.1f} MiB | "
          f"**{med([w['per_session_kib'] for w in ws]):.0f} KiB** ({min(w['per_session_kib'] for w in ws):.0f}–"
          f"{max(w['per_session_kib'] for w in ws):.0f}) | {med([w['closed_kib'] for w in ws]) / 1024:.1f} MiB |")
    print()
notes = by_round("mcp-notify", "notice", "approved").get(1)
if notes:
    ab = [notes[n] for n in sorted(notes)]
    print("### 9c. Propose over MCP → its notification at a webhook receiver ÷ → an approved action's webhook\n")
    print(f"Latency in ms, {ab[0][0]['n']:.0f} proposals a side in each of {len(ab)} rounds, one at a time, "
          "each waiting for its POST; B: a standing approval approves the same proposal at propose and "
          "keyturnd's webhook adapter sends it. Ratio = notice ÷ approved, median of per-round ratios (spread). "
          f"Lost (no POST within the bound): {sum(x['lost'] + y['lost'] for x, y in ab):.0f}.\n")
    print("| measured | notice p50 | approved p50 | **p50 ratio** | spread | notice p99 | approved p99 | **p99 ratio** | spread |")
    print("|---|---:|---:|---:|---|---:|---:|---:|---|")
    for label, prefix in [("**tools/call → the POST arrives**", ""),
                          ("the MCP call alone (to its answer)", "call_"),
                          ("from the call's answer to the POST", "after_answer_")]:
        print(f"| {label} | {' | '.join(ratio_cells(ab, prefix + 'p50_ms'))} | "
              f"{' | '.join(ratio_cells(ab, prefix + 'p99_ms'))} |")
    print()

chain = os.path.join(out, "chain.txt")
if os.path.exists(chain) and open(chain).read().strip():
    runs = [line.split("\t") for line in open(chain).read().split("\n") if line.strip()]
    print("### 1c. The audit hash chain's share of a gate flow, one tenant\n")
    print("pg_stat_statements over each run: the chain's statements, which run at commit "
          "(the head, the id, the hashed insert of each event), as a share of all top-level time "
          "(a wait for the chain's lock is in neither).\n")
    print("| clients | round | top-level ms | chain ms | **chain share** | flows/s |")
    print("|---:|---:|---:|---:|---:|---:|")
    tps = {(r["clients"], r["round"]): r["flows_per_s"] for r in rows if r["item"] == "chain"}
    for c, rnd, top, ch, share in runs:
        print(f"| {c} | {rnd} | {top} | {ch} | **{share} %** | {tps.get((c, rnd), '')} |")
    print()

lat = {item: by_round(item, "gate", "lean") for item in ("lat-propose", "lat-approve")}
if any(lat.values()):
    print("### 10. propose alone and approve alone: keyturn ÷ the lean flow's transaction (pgbench -l)\n")
    print("Per-transaction latency in ms (each client's first transaction left out); medians of rounds; "
          "ratio = keyturn ÷ lean, median of per-round ratios (spread). propose: the gate flow's first "
          "transaction (gate_propose.sql) ÷ the lean flow's insert of the proposal (lean_propose.sql); "
          "approve: the gate flow's second transaction (gate_approve.sql) ÷ the lean flow's claim and "
          "write (lean_approve.sql), each approving proposals made before the run. "
          "Target: approve p50 at 1 client ≤ 2× the lean claim-and-write.\n")
    print("| transaction | clients | rounds | keyturn p50 | lean p50 | **p50 ratio** | spread | keyturn p99 | lean p99 | **p99 ratio** | spread | keyturn tx/s | lean tx/s |")
    print("|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---|---:|---:|")
    for item, label in [("lat-propose", "propose"), ("lat-approve", "approve")]:
        for c, rs in sorted(lat[item].items()):
            ab = [rs[n] for n in sorted(rs)]
            print(f"| {label} | {c} | {len(ab)} | {' | '.join(ratio_cells(ab, 'p50_ms'))} | "
                  f"{' | '.join(ratio_cells(ab, 'p99_ms'))} | "
                  f"{med([x['per_s'] for x, _ in ab]):.0f} | {med([y['per_s'] for _, y in ab]):.0f} |")
    print()
    ap = lat["lat-approve"].get(1)
    if ap:
        ab = [ap[n] for n in sorted(ap)]
        r = med([x["p50_ms"] / y["p50_ms"] for x, y in ab if y.get("p50_ms")])
        print(f"**approve p50 at 1 client ÷ the lean claim-and-write: {r:.2f}×** (target ≤ 2×: "
              f"{'met' if r <= 2 else f'missed, {100 * (r / 2 - 1):.0f} % over'}).\n")
stmts = os.path.join(out, "statements.txt")
wide = sorted(c for (item, c) in pair_ratio if item == "flow" and c >= 32)
if wide or os.path.exists(stmts):
    print("### 10b. The gate flow at many clients, and statements per gate flow\n")
    for c in wide:
        m, lo, hi, ta, tb = pair_ratio[("flow", c)]
        print(f"- **gate flow ÷ hand-written flow at {c} clients: {m:.3f}** ({lo:.3f}–{hi:.3f}; "
              f"{ta:.0f} against {tb:.0f} flows/s)")
    if os.path.exists(stmts):
        w = words(open(stmts).read())
        if w.get("flows"):
            print(f"- **statements executed per gate flow: {w['per_flow']:.2f}** (pg_stat_statements, track = all, "
                  f"sum of calls ÷ {w['flows']:.0f} flows of one 4-client run, -M extended: {w['top_per_flow']:.2f} top level, "
                  f"{w['nested_per_flow']:.2f} nested; entries deallocated: {w['deallocated']:.0f}); target ≤ 12"
                  + ("" if w["per_flow"] <= 12 else f", missed by {w['per_flow'] - 12:.1f} ({w['per_flow'] / 12:.1f}×)"))
    print()
    spf = os.path.join(out, "statements-per-flow.txt")
    if os.path.exists(spf):
        print(f"Statements per gate flow, each (calls ÷ flows, at least 0.1 a flow):\n\n```\n{open(spf).read().rstrip()}\n```\n")

for name, title in [("drain.txt", "3/6. Dispatch drain and keyturnd peak RSS"),
                    ("step.txt", "3b. A dispatch step's price by its size"),
                    ("wakeup.txt", "4. Wake-up latency"),
                    ("mcp.txt", "9. MCP and notifications: each run (or why the item skipped)"),
                    ("flow-outcomes.txt", "Gate flow outcomes (sanity)")]:
    path = os.path.join(out, name)
    if os.path.exists(path):
        print(f"### {title}\n\n```\n{open(path).read().rstrip()}\n```\n")

crit = os.path.join(out, "criterion.txt")
if os.path.exists(crit):
    print("### 8. Canonicalize + hash (criterion, median time per call)\n")
    text = open(crit).read()
    times = {}
    for m in re.finditer(r"^params/(\S+)/(\S+)\s*\n?\s*time:\s+\[\S+ \S+ (\S+) (\S+) \S+ \S+\]", text, re.M):
        unit = m.group(4)
        v = float(m.group(3)) * {"ns": 1, "µs": 1e3, "us": 1e3, "ms": 1e6, "s": 1e9}[unit]
        times[(m.group(1), m.group(2))] = v
    sizes = ["64B", "1KiB", "16KiB"]
    print("| size | sha256 raw | canonicalize_str | params_hash_str (parse + JCS + sha256) | params_hash_str ÷ raw |")
    print("|---|---:|---:|---:|---:|")
    for s in sizes:
        raw = times.get(("sha256_raw", s))
        can = times.get(("canonicalize_str", s))
        ph = times.get(("params_hash_str", s))
        if raw and ph:
            print(f"| {s} | {raw/1e3:.3f} µs | {can/1e3:.3f} µs | {ph/1e3:.3f} µs | {ph/raw:.1f}× |")
    print()

for name, title in [("profile-statements.txt", "Profile: pg_stat_statements, track = all (top by total time)"),
                    ("perf-dso.txt", "Profile: perf, self time by object"),
                    ("perf-self.txt", "Profile: perf, self time by symbol")]:
    path = os.path.join(out, name)
    if os.path.exists(path):
        print(f"### {title}\n\n```\n{open(path).read().rstrip()}\n```\n")
