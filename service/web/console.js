// The console: for a person, what waits for their decision, opened in the
// same card as a link opens (a fresh token from issue_token, no link
// needed), and a button that subscribes this device to Web Push; for the operator and the platform admin, the actions by status
// with counts and filters, an action's whole timeline (its events,
// attempts and notifications), the uncertain queue with reconciliation, the tools with the
// kill switch (admins only) and the standing approvals; for everyone, the
// dispatch counters. Like the card it decides nothing: each section is shown
// when the database answers its call for this sign-in, and every change is
// one call the database may refuse.
//
// Sign-in: a JWT pasted into the form, kept in this tab's sessionStorage
// (never in a URL); the application may also leave it there.

import { rpc, takeJwt, keepJwt, forgetJwt, explain, isMissingFunction, RpcError } from "./rpc.js";
import { el, valueText, when } from "./show.js";
import { offerPush } from "./push.js";
import "./keyturn-card.js";

const auth = { jwt: takeJwt(), base: "" };
const $ = (kt) => document.querySelector(`[data-kt="${kt}"]`);
const STATUSES = [];

function fail(err) {
  const [headline, said] = explain(err);
  const box = $("error");
  box.replaceChildren(headline, said ? el("span", { class: "kt-said", text: said }) : "");
  box.hidden = false;
}

/** Runs a section's first call; a refusal hides it (not this sign-in's). */
async function offered(section, load) {
  try {
    await load();
    $(section).hidden = false;
    return true;
  } catch (e) {
    if (!(e instanceof RpcError) || e.status === 401 || e.status >= 500 || e.status === 0) throw e;
    $(section).hidden = true;
    return false;
  }
}

// ---- counters --------------------------------------------------------------

const SHOWN = [
  ["keyturn_actions_total", "Dispatch attempts"],
  ["keyturn_uncertain", "Uncertain now"],
  ["keyturn_handbacks_total", "Hand-backs"],
  ["keyturn_sweep_total", "Moved by the sweep"],
  ["keyturn_unrecorded_outcomes_total", "Outcomes that could not be recorded"],
  ["keyturn_db_reconnects_total", "Database reconnects"],
];

/** `name{labels} value` lines of the OpenMetrics text we care about. */
function samples(text) {
  const out = [];
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const m = /^([a-z_]+)(\{[^}]*\})?\s+(\S+)/.exec(line);
    if (m && SHOWN.some(([n]) => n === m[1])) out.push({ name: m[1], labels: m[2] || "", value: m[3] });
  }
  return out;
}

async function loadMetrics() {
  const body = $("metrics").querySelector("tbody");
  try {
    const response = await fetch("/metrics", { cache: "no-store", credentials: "omit" });
    if (!response.ok) throw new Error(`HTTP ${response.status}`);
    const rows = samples(await response.text());
    body.replaceChildren(
      ...rows.map((s) => {
        const label = SHOWN.find(([n]) => n === s.name)[1];
        const row = el("tr", { kt: "metric" }, el("th", { scope: "row" }, label, s.labels ? el("span", { class: "kt-said", text: s.labels.slice(1, -1) }) : null), el("td", { text: s.value }));
        row.dataset.name = s.name + s.labels;
        return row;
      })
    );
  } catch (e) {
    body.replaceChildren(el("tr", {}, el("td", { text: `The counters cannot be read: ${e.message}` })));
  }
}

// ---- waiting for me ----------------------------------------------------------

async function loadMine() {
  const rows = await rpc("pending", {}, auth);
  $("mine").querySelector("tbody").replaceChildren(
    ...rows.map((p) => {
      const open = el("button", { type: "button", kt: "review", text: "Review" });
      open.addEventListener("click", () => review(p.action_id, open));
      const row = el(
        "tr",
        { kt: "pending-row" },
        el("td", { text: p.summary }),
        el("td", {}, el("code", { text: p.tool })),
        el("td", { class: `kt-effect-${p.effect}`, text: p.effect }),
        el("td", { text: p.principal }),
        el("td", { text: when(p.expires_at) }),
        el("td", { text: `${p.votes ?? 0} / ${p.quorum ?? 1}` }),
        el("td", {}, open)
      );
      row.dataset.actionId = p.action_id;
      return row;
    })
  );
  $("mine-empty").hidden = rows.length > 0;
}

/** Opens a pending action in the card: a fresh token from the database
 *  (the link's, if there was one, stops working), kept in memory only. */
async function review(actionId, button) {
  button.disabled = true;
  const box = $("mine-card");
  try {
    const token = await rpc("issue_token", { action_id: actionId }, auth);
    const card = document.createElement("keyturn-card");
    card.jwt = auth.jwt;
    card.setAttribute("link", new URLSearchParams([["a", actionId], ["t", token]]).toString());
    const back = el("button", { type: "button", class: "kt-secondary", kt: "back", text: "Back to the queue" });
    back.addEventListener("click", async () => {
      box.replaceChildren();
      await loadMine().catch(fail);
    });
    box.replaceChildren(card, back);
    box.scrollIntoView({ block: "start" });
  } catch (e) {
    box.replaceChildren(el("p", { class: "kt-error", role: "alert", text: explain(e).join(" ") }));
  } finally {
    button.disabled = false;
  }
}

// ---- uncertain -------------------------------------------------------------

async function loadAttempts(actionId, box) {
  try {
    const attempts = await rpc("attempts", { action_id: actionId }, auth);
    const list = el("ol", { class: "kt-attempts" });
    for (const a of attempts) {
      list.append(
        el(
          "li",
          { kt: "attempt" },
          el("strong", { text: `Attempt ${a.attempt}` }),
          ` by ${a.worker || "?"}, ${when(a.started_at)} → ${a.finished_at ? when(a.finished_at) : "not finished"}: `,
          el("span", { class: "kt-outcome", text: a.outcome || "no outcome recorded" }),
          a.receipt ? el("pre", { class: "kt-value", kt: "receipt", text: valueText(a.receipt) }) : null
        )
      );
    }
    box.replaceChildren(el("h4", { text: "Attempts" }), attempts.length ? list : el("p", { text: "No attempt recorded." }));
  } catch (e) {
    const text = isMissingFunction(e) ? "This keyturn does not list attempts yet." : explain(e).join(" ");
    box.replaceChildren(el("p", { class: "kt-note", text }));
  }
}

function uncertainRow(u) {
  const id = u.action_id;
  const noteId = `kt-note-${id}`;
  const outcomeId = `kt-outcome-${id}`;
  const attempts = el("div", { class: "kt-attempts-box" }, el("p", { text: "Loading attempts…" }));
  const outcome = el("select", { id: outcomeId, kt: "outcome" }, el("option", { value: "succeeded", text: "It happened (succeeded)" }), el("option", { value: "failed", text: "It did not happen (failed)" }));
  const note = el("textarea", { id: noteId, kt: "note", rows: 2, required: true, maxlength: 1000 });
  const button = el("button", { type: "submit", kt: "reconcile", disabled: true, text: "Record the outcome" });
  const status = el("p", { class: "kt-status", kt: "status", role: "status", "aria-live": "polite" });
  note.addEventListener("input", () => (button.disabled = !note.value.trim()));
  const form = el(
    "form",
    { class: "kt-reconcile" },
    el("label", { for: outcomeId, text: "What the provider did" }),
    outcome,
    el("label", { for: noteId, text: "Note for the audit trail (required): how you know" }),
    note,
    button
  );
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    if (button.disabled || !note.value.trim()) return;
    button.disabled = true;
    try {
      const result = await rpc("reconcile", { action_id: id, outcome: outcome.value, note: note.value.trim() }, auth);
      status.dataset.status = result;
      status.textContent = `Recorded: ${result}.`;
      form.remove();
      await showTimeline(id);
    } catch (e) {
      button.disabled = false;
      status.textContent = explain(e).join(" ");
    }
  });
  const auditButton = el("button", { type: "button", class: "kt-secondary", text: "Show timeline" });
  auditButton.addEventListener("click", () => showTimeline(id));
  const row = el(
    "article",
    { class: "kt-item", kt: "uncertain-row" },
    el("h3", {}, el("code", { text: id })),
    el("p", { class: "kt-meta" }, el("span", { text: `Tenant ${u.tenant}` }), el("span", {}, "Tool ", el("code", { text: u.tool })), el("span", { text: `${u.attempts} attempt(s)` }), el("span", { text: `Last dispatched ${when(u.dispatched_at)}` }), u.safe_to_decide_after ? el("span", { kt: "safe-after", text: `Safe to decide after ${when(u.safe_to_decide_after)}` }) : null),
    // keyturnd's own account (docs/operations.md): it knew the call never
    // started, but the sweep made the action uncertain before its retry.
    u.not_sent_by_dispatcher === true ? el("p", { class: "kt-notice", kt: "not-sent", text: "Not sent, by keyturnd's own account: the call never started, so nothing of this attempt reached the provider." }) : null,
    u.receipt ? el("div", {}, el("h4", { text: "Last receipt" }), el("pre", { class: "kt-value", text: valueText(u.receipt) })) : null,
    attempts,
    form,
    status,
    auditButton
  );
  row.dataset.actionId = id;
  loadAttempts(id, attempts);
  return row;
}

async function loadUncertain() {
  const rows = await rpc("uncertain_actions", {}, auth);
  $("uncertain").replaceChildren(...rows.map(uncertainRow));
  $("uncertain-empty").hidden = rows.length > 0;
}

// ---- actions -----------------------------------------------------------------

/** The filter form as find_actions' and action_counts' arguments. */
function filters() {
  const form = $("filters");
  const value = (name) => form.elements[name].value.trim();
  const time = (name) => (value(name) ? new Date(value(name)).toISOString() : undefined);
  const args = {};
  if (value("tenant")) args.tenant = value("tenant");
  if (value("tool")) args.tool = value("tool");
  if (time("since")) args.since = time("since");
  if (time("until")) args.until = time("until");
  return { args, status: value("status"), id: value("id") };
}

async function loadCounts() {
  const { args } = filters();
  const rows = await rpc("action_counts", args, auth);
  if (!STATUSES.length) {
    STATUSES.push(...rows.map((r) => r.status));
    $("filter-status").append(...STATUSES.map((s) => el("option", { value: s, text: s })));
  }
  $("counts").replaceChildren(
    ...rows.map((r) => {
      const b = el("button", { type: "button", class: "kt-count kt-secondary", kt: "count", "aria-pressed": String($("filter-status").value === r.status) }, el("span", { text: r.status }), " ", el("strong", { text: String(r.actions) }));
      b.dataset.status = r.status;
      b.dataset.count = String(r.actions);
      b.addEventListener("click", () => {
        $("filter-status").value = $("filter-status").value === r.status ? "" : r.status;
        loadActions().catch(fail);
      });
      return b;
    })
  );
}

async function loadList() {
  const { args, status, id } = filters();
  const body = $("actions").querySelector("tbody");
  const query = id ? { id } : { ...args, ...(status ? { status } : {}), max_rows: 100 };
  try {
    const rows = await rpc("find_actions", query, auth);
    body.replaceChildren(
      ...rows.map((a) => {
        const link = el("button", { type: "button", class: "kt-link", kt: "action-open" }, el("code", { text: a.action_id }));
        link.addEventListener("click", () => showTimeline(a.action_id));
        const row = el(
          "tr",
          { kt: "action-row" },
          el("td", { text: when(a.created_at) }),
          el("td", {}, link),
          el("td", { text: a.tenant }),
          el("td", {}, el("code", { text: `${a.tool} v${a.tool_version}` })),
          el("td", { class: "kt-status-word", text: a.status }),
          el("td", { text: a.principal }),
          el("td", { text: String(a.attempts) }),
          el("td", { text: when(a.expires_at) })
        );
        row.dataset.actionId = a.action_id;
        row.dataset.status = a.status;
        return row;
      })
    );
    $("actions-caption").textContent = rows.length ? `${rows.length} action(s), newest first` : "No action matches.";
  } catch (e) {
    body.replaceChildren();
    $("actions-caption").textContent = explain(e).join(" ");
  }
}

async function loadActions() {
  await loadCounts();
  await loadList();
}

// ---- timeline ----------------------------------------------------------------

/** An action's events, attempts and notifications, in time order. */
async function showTimeline(actionId) {
  $("audit-id").value = actionId;
  $("timeline-section").hidden = false;
  const table = $("audit");
  try {
    const [events, attempts, notices] = await Promise.all([
      rpc("audit", { action_id: actionId }, auth),
      rpc("attempts", { action_id: actionId }, auth).catch(() => []),
      // Not every keyturn has notifications, and only the operator reads them.
      rpc("notifications", { action_id: actionId }, auth).catch(() => []),
    ]);
    const lines = [
      ...events.map((e) => ({
        at: e.at,
        row: el(
          "tr",
          { kt: "audit-row" },
          el("td", { text: when(e.at) }),
          el("td", { text: "event" }),
          el("td", { text: e.db_role || "" }),
          el("td", { text: e.principal || "—" }),
          el("td", { text: `${e.from_status || "—"} → ${e.to_status}` }),
          el("td", {}, e.detail && Object.keys(e.detail).length ? el("pre", { class: "kt-value", text: valueText(e.detail) }) : "")
        ),
      })),
      ...attempts.map((a) => ({
        at: a.started_at,
        row: el(
          "tr",
          { kt: "timeline-attempt" },
          el("td", { text: when(a.started_at) }),
          el("td", { text: `attempt ${a.attempt}` }),
          el("td", { text: a.worker || "" }),
          el("td", { text: "—" }),
          el("td", { text: a.outcome || "no outcome recorded" }),
          el("td", {}, a.receipt ? el("pre", { class: "kt-value", text: valueText(a.receipt) }) : "")
        ),
      })),
      ...notices.map((n) => ({
        at: n.dispatched_at || n.created_at,
        row: el(
          "tr",
          { kt: "timeline-notification" },
          el("td", { text: when(n.dispatched_at || n.created_at) }),
          el("td", { text: `${n.kind} by ${n.channel}` }),
          el("td", { text: "keyturnd" }),
          el("td", { text: n.principal || "—" }),
          el("td", { text: n.status }),
          el("td", {}, n.receipt || n.result ? el("pre", { class: "kt-value", text: valueText(n.receipt || n.result) }) : "")
        ),
      })),
    ].sort((x, y) => Date.parse(x.at) - Date.parse(y.at));
    table.querySelector("tbody").replaceChildren(...lines.map((l) => l.row));
    $("audit-caption").textContent = `${events.length} event(s), ${attempts.length} attempt(s) and ${notices.length} notification(s) of ${actionId}`;
    table.hidden = false;
  } catch (e) {
    $("audit-caption").textContent = explain(e).join(" ");
    table.querySelector("tbody").replaceChildren();
    table.hidden = false;
  }
}

// ---- tools -------------------------------------------------------------------

async function loadTools() {
  const rows = await rpc("tools", {}, auth);
  $("kill-note").hidden = !rows.some((t) => t.may_switch);
  $("tools").querySelector("tbody").replaceChildren(
    ...rows.map((t) => {
      const state = el("td", { kt: "tool-state", text: t.enabled ? "enabled" : "disabled" });
      if (t.may_switch) {
        const button = el("button", { type: "button", kt: "kill-switch", class: t.enabled ? "kt-danger" : "", text: t.enabled ? "Disable" : "Enable" });
        button.addEventListener("click", async () => {
          if (t.enabled && !window.confirm(`Disable ${t.tool}? Its pending proposals can no longer be approved and nothing of it is dispatched until it is enabled again.`)) return;
          button.disabled = true;
          try {
            await rpc("set_tool_enabled", { name: t.tool, enabled: !t.enabled }, auth);
            await loadTools();
          } catch (e) {
            button.disabled = false;
            fail(e);
          }
        });
        state.append(" ", button);
      }
      const row = el(
        "tr",
        { kt: "tool-row" },
        el("td", {}, el("code", { text: t.tool })),
        el("td", { text: String(t.version) }),
        el("td", { text: t.executor || t.kind }),
        el("td", { class: `kt-effect-${t.effect}`, text: t.effect }),
        el("td", { text: t.quorum > 1 ? `${t.approval}, ${t.quorum} votes` : t.approval }),
        el("td", { text: t.retain }),
        state
      );
      row.dataset.tool = t.tool;
      row.dataset.enabled = String(t.enabled);
      return row;
    })
  );
}

// ---- standing approvals ------------------------------------------------------

async function loadStanding() {
  const rows = await rpc("standing_approvals", {}, auth);
  $("standing").querySelector("tbody").replaceChildren(
    ...rows.map((d) => {
      const row = el(
        "tr",
        { kt: "standing-row" },
        el("td", { text: d.tenant }),
        el("td", { text: d.principal }),
        el("td", {}, el("code", { text: `${d.tool} v${d.tool_version}` })),
        el("td", {}, el("pre", { class: "kt-value", text: valueText(d.scope) })),
        el("td", { text: `${d.uses} / ${d.max_uses}` }),
        el("td", { text: when(d.expires_at) }),
        el("td", { kt: "standing-state", text: d.ended ? `ended: ${d.ended}` : "live" })
      );
      row.dataset.delegationId = d.delegation_id;
      return row;
    })
  );
  $("standing-empty").hidden = rows.length > 0;
}

// ---- start ---------------------------------------------------------------------

$("audit-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const id = $("audit-id").value.trim();
  if (id) showTimeline(id);
});
$("filters").addEventListener("submit", (ev) => {
  ev.preventDefault();
  loadActions().catch(fail);
});
$("filters").addEventListener("reset", () => setTimeout(() => loadActions().catch(fail)));
$("signin").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const jwt = $("jwt").value.trim();
  $("jwt").value = "";
  if (!jwt) return;
  keepJwt(jwt);
  location.reload();
});
$("sign-out").addEventListener("click", () => {
  forgetJwt();
  location.reload();
});

function signIn(err) {
  document.querySelectorAll("section[data-kt]").forEach((s) => (s.hidden = true));
  $("signin-section").hidden = false;
  $("sign-out").hidden = true;
  if (err) fail(err);
}

async function start() {
  loadMetrics();
  setInterval(loadMetrics, 10000);
  if (!auth.jwt) {
    signIn(null);
    document.body.dataset.loaded = "true";
    return;
  }
  $("sign-out").hidden = false;
  try {
    const shown = await Promise.all([
      offered("mine-section", loadMine),
      offered("uncertain-section", loadUncertain),
      offered("actions-section", loadActions),
      offered("tools-section", loadTools),
      offered("standing-section", loadStanding),
    ]);
    if (!shown.some(Boolean)) {
      fail(new RpcError(403, { message: "this sign-in may not use any part of the console" }));
    }
    // A person's queue: their own sign-in, so this device may subscribe.
    if (!$("mine-section").hidden) await offerPush($("push-box"), auth.jwt);
  } catch (e) {
    if (e instanceof RpcError && e.status === 401) signIn(e);
    else fail(e);
  }
  const fromLink = new URLSearchParams(location.hash.slice(1)).get("a");
  if (fromLink && $("signin-section").hidden) showTimeline(fromLink);
  document.body.dataset.loaded = "true";
}

start();
