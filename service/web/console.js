// The operator console: the uncertain queue with each attempt's receipt,
// reconciliation with a required note, an action's audit timeline, the
// tenant's pending queue (view only, when the JWT's role may read it) and
// the dispatch counters. Like the card it decides nothing: the database
// answers every call, and a role that may not make one is told so.

import { rpc, takeJwt, explain, isMissingFunction, RpcError } from "./rpc.js";
import { el, valueText, when } from "./show.js";

const auth = { jwt: takeJwt(), base: "" };
const $ = (kt) => document.querySelector(`[data-kt="${kt}"]`);

function fail(err) {
  const [headline, said] = explain(err);
  const box = $("error");
  box.replaceChildren(headline, said ? el("span", { class: "kt-said", text: said }) : "");
  box.hidden = false;
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
      await showAudit(id);
    } catch (e) {
      button.disabled = false;
      status.textContent = explain(e).join(" ");
    }
  });
  const auditButton = el("button", { type: "button", class: "kt-secondary", text: "Show audit" });
  auditButton.addEventListener("click", () => showAudit(id));
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
  try {
    const rows = await rpc("uncertain_actions", {}, auth);
    $("uncertain").replaceChildren(...rows.map(uncertainRow));
    $("uncertain-empty").hidden = rows.length > 0;
  } catch (e) {
    $("uncertain").replaceChildren(el("p", { class: "kt-error", role: "alert", text: explain(e).join(" ") }));
  }
}

// ---- audit -------------------------------------------------------------------

async function showAudit(actionId) {
  $("audit-id").value = actionId;
  const table = $("audit");
  try {
    const events = await rpc("audit", { action_id: actionId }, auth);
    table.querySelector("tbody").replaceChildren(
      ...events.map((e) =>
        el(
          "tr",
          { kt: "audit-row" },
          el("td", { text: when(e.at) }),
          el("td", { text: e.db_role || "" }),
          el("td", { text: e.principal || "—" }),
          el("td", { text: `${e.from_status || "—"} → ${e.to_status}` }),
          el("td", {}, e.detail && Object.keys(e.detail).length ? el("pre", { class: "kt-value", text: valueText(e.detail) }) : "")
        )
      )
    );
    $("audit-caption").textContent = `${events.length} event(s) of ${actionId}`;
    table.hidden = false;
  } catch (e) {
    $("audit-caption").textContent = explain(e).join(" ");
    table.querySelector("tbody").replaceChildren();
    table.hidden = false;
  }
}

// ---- pending -----------------------------------------------------------------

async function loadPending() {
  try {
    const rows = await rpc("pending", {}, auth);
    $("pending").querySelector("tbody").replaceChildren(
      ...rows.map((p) => {
        const row = el(
          "tr",
          { kt: "pending-row" },
          el("td", { text: p.summary }),
          el("td", {}, el("code", { text: p.tool })),
          el("td", { class: `kt-effect-${p.effect}`, text: p.effect }),
          el("td", { text: p.principal }),
          el("td", { text: when(p.expires_at) }),
          el("td", { text: `${p.votes ?? 0} / ${p.quorum ?? 1}` })
        );
        row.dataset.actionId = p.action_id;
        return row;
      })
    );
    $("pending-section").hidden = false;
  } catch (e) {
    // Not this role's to see (or not offered here): the section stays hidden.
    if (!(e instanceof RpcError)) throw e;
  }
}

// ---- start ---------------------------------------------------------------------

$("audit-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const id = $("audit-id").value.trim();
  if (id) showAudit(id);
});

async function start() {
  loadMetrics();
  setInterval(loadMetrics, 10000);
  if (!auth.jwt) {
    fail(new RpcError(401, { message: "no JWT in this tab" }));
    document.querySelectorAll("section").forEach((s) => (s.hidden = true));
    document.body.dataset.loaded = "true";
    return;
  }
  try {
    // One call first: a refused JWT shows one message and nothing else.
    await rpc("uncertain_actions", {}, auth);
  } catch (e) {
    fail(e);
    document.querySelectorAll("section").forEach((s) => (s.hidden = true));
    document.body.dataset.loaded = "true";
    return;
  }
  await Promise.all([loadUncertain(), loadPending()]);
  const fromLink = new URLSearchParams(location.hash.slice(1)).get("a");
  if (fromLink) showAudit(fromLink);
  document.body.dataset.loaded = "true";
}

start();
