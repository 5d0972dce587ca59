// <keyturn-card>: the approval card. The page /card is this element alone;
// an application embeds the same element (or frames /card).
//
// It shows what the person approves in their terms (the server-written
// summary, tool, effect, blast radius, every param as text, each target's
// before and after, a live expiry), and sends exactly one decision per
// click. It decides nothing: every rule is the database's, and the card
// only reports what the database answered (docs/card.md).
//
// Input: the page's fragment, `a=<action_id>[&a=…]&c=<code>`, a link that
// carries no credential: when the person taps Open (never on load, which a
// scanner would do), the one-time code is redeemed for a short card
// session with a fresh token per action (POST /card/session), after which
// the URL holds nothing that works; a digest action's reviewed params may
// follow its `a` as `p=<base64url params JSON>`. In a tab where the person
// is signed in (their JWT in this tab's sessionStorage, as the console
// keeps it), `a=<action_id>&t=<token>` opens the card too, or `a` alone
// (a fresh token once the person asks): a token is bound to its action and
// works only with that person's JWT. Any page can load this tab's card on
// a fragment of its choosing, so in a signed-in tab nothing but `preview`
// runs until the person acts (docs/security.md, row 121). An application that embeds the element
// passes `link="a=…&t=<token>…"` as an attribute and its person's JWT as
// the `jwt` property, or leaves the JWT in sessionStorage. A JWT in the
// page's fragment (`j=`) is never read; the card takes `c`, `t`, `j` and
// `p` out of the address bar.

import { rpc, cardToken, takeJwt, redeemLink, keepCardSession, takeCardSession, explain, isMissingFunction, RpcError } from "./rpc.js";
import { decodeLinkParams } from "./jcs.js";
import { offerPush } from "./push.js";
import { el, showValue, visible, duration } from "./show.js";

const IN_FLIGHT = new Set(["queued", "leased", "executing"]);
const EFFECTS = {
  reversible: ["Reversible", "It can be undone."],
  compensatable: ["Compensatable", "It can be reversed by a later action."],
  irreversible: ["Irreversible", "It cannot be undone."],
};

/** The items and the one-time code of a link (without the leading #);
 *  `j` never counts. */
export function parseLink(fragment) {
  const items = [];
  let code = null;
  for (const [key, value] of new URLSearchParams(fragment)) {
    if (key === "a") items.push({ action_id: value, token: null, p: null });
    else if (key === "t" && items.length) items[items.length - 1].token = value;
    else if (key === "p" && items.length) items[items.length - 1].p = value;
    else if (key === "c") code = value;
  }
  return { items, code };
}

const PARAMS_KEY = "keyturn.params";

/** The digest params (`p`) this tab keeps, by action id. */
function keptParams() {
  try {
    return JSON.parse(sessionStorage.getItem(PARAMS_KEY)) || {};
  } catch (e) {
    return {};
  }
}

/** A digest action's reviewed params (`p`) for this tab: those of a link
 *  whose code was redeemed are kept in sessionStorage (keepParams), so the
 *  address bar need not keep them and a reload finds them there. They win
 *  over any a fragment without a code brings, which any page can write
 *  (docs/security.md, rows 123 and 125), and which count for that page
 *  load alone. */
function adoptKeptParams(items) {
  const kept = keptParams();
  for (const item of items) if (kept[item.action_id]) item.p = kept[item.action_id];
}

/** Keeps the `p` of a link whose code was just redeemed. */
function keepParams(items) {
  const kept = keptParams();
  const given = items.filter((item) => item.p);
  for (const item of given) kept[item.action_id] = item.p;
  if (given.length) sessionStorage.setItem(PARAMS_KEY, JSON.stringify(kept));
}

/** The page's fragment without its one-time code, which is spent once
 *  redeemed, its tokens and a JWT put there, nor (with a code) a digest's
 *  params, which this tab keeps: what stays in the address bar is the
 *  action ids, nothing that works. (The entry the browser made when the
 *  link was opened keeps what the link held: a spent code, a token that
 *  needs its person's JWT, and `p` if the application put it there.) */
function dropCode(withCode) {
  const params = new URLSearchParams(location.hash.slice(1));
  const kept = ["c", "t", "j", ...(withCode ? ["p"] : [])].filter((k) => params.has(k));
  if (kept.length) {
    for (const k of kept) params.delete(k);
    history.replaceState(history.state, "", location.pathname + "#" + params.toString());
  }
}

/** What an outcome means, in words. */
export function outcomeWords(status, result) {
  const reason = result && typeof result === "object" ? result.reason || result.message : null;
  const why = reason ? `: ${reason}` : ".";
  switch (status) {
    case "pending":
      return "Waiting for your decision.";
    case "queued":
    case "leased":
      return "Approved. Sending it now…";
    case "executing":
      return "Approved. It is being carried out…";
    case "succeeded":
      return "Done: approved and carried out.";
    case "failed":
      return `Approved, but it failed${why}`;
    case "uncertain":
      return "Approved, but it is not known whether it happened; an operator will check and settle it.";
    case "rejected":
      return `Rejected${why}`;
    case "rejected_tampered":
      return "Refused: what was submitted does not match what was proposed, so nothing ran.";
    case "expired":
      return "Expired: the proposal ran out of time before it was approved. Ask again.";
    case "cancelled":
      return `Cancelled${why}`;
    case "conflict":
      return "The record changed since the proposal; ask again.";
    case "invalidated":
      return `No longer valid${why}`;
    case "superseded":
      return "Replaced by a revised proposal.";
    case "refused":
      return `Refused${why}`;
    default:
      return `Status: ${status}.`;
  }
}

/** Whether an outcome is a success, a failure or neither, for styling. */
function tone(status) {
  if (status === "succeeded") return "good";
  if (status === "pending" || IN_FLIGHT.has(status)) return "wait";
  return "bad";
}

/** Whether `e` is the database's "wrong token for this action". */
function isWrongToken(e) {
  return e instanceof RpcError && e.code === "55000" && /wrong token/.test(e.message || "");
}

function plural(n, one, many) {
  return `${n} ${n === 1 ? one : many}`;
}

/** One action on the card. */
class Item {
  constructor(card, { action_id, token, p }, index) {
    this.card = card;
    this.actionId = action_id;
    this.token = token;
    // A token the card was given, by the page's URL or a kept card session,
    // not one the person's act in this page load took: any page can load
    // the card with it, so the card never replaces it by itself
    // (withToken; docs/security.md, rows 123 and 125).
    this.given = Boolean(token) && card.getAttribute("link") === null;
    this.linkParams = undefined;
    this.linkParamsError = null;
    if (p) {
      try {
        this.linkParams = decodeLinkParams(p);
      } catch (e) {
        this.linkParamsError = "The link's fields cannot be read.";
      }
    }
    this.preview = null;
    this.status = null;
    this.busy = false;
    this.hashOk = null;
    this.editing = false;
    this.revisedFrom = null;
    this.id = `kt-item-${index}`;
    this.root = el("section", { class: "kt-item", kt: "item", "aria-labelledby": `${this.id}-summary` });
    this.root.dataset.actionId = action_id;
  }

  get params() {
    if (!this.preview) return undefined;
    return this.preview.retain === "digest" ? this.linkParams : this.preview.params;
  }

  get expired() {
    return this.preview && Date.parse(this.preview.expires_at) <= Date.now();
  }

  /** Whether Approve may be pressed: the card's own checks, before the
   *  database makes its own. */
  get approvable() {
    return (
      !!this.preview &&
      this.status === "pending" &&
      !this.busy &&
      !this.editing &&
      !this.expired &&
      (this.preview.retain !== "digest" || this.hashOk === true || (this.hashOk === null && !this.card.redeemed))
    );
  }

  async load() {
    this.root.replaceChildren(el("p", { class: "kt-loading", text: "Loading the proposal…" }));
    if (!this.token && this.card.signedIn) return this.offerOpen();
    if (!this.token) {
      this.renderError(["This action can no longer be decided from this link: it was decided already, or you may not decide it.", ""]);
      return;
    }
    try {
      this.preview = await this.withToken(() => rpc("preview", { action_id: this.actionId, token: this.token }, this.card.auth));
    } catch (e) {
      if (isWrongToken(e) && this.given) {
        // The token given is not the action's (any more): the person may
        // take a fresh one.
        this.token = null;
        return this.offerOpen();
      }
      this.preview = null;
      this.renderError(explain(e));
      this.card.refresh();
      return;
    }
    this.status = this.preview.status;
    this.render();
    if (this.preview.retain === "digest") {
      if (this.card.redeemed) await this.checkHash();
      else this.deferHashCheck();
    }
    if (IN_FLIGHT.has(this.status)) this.follow();
    this.card.refresh();
  }

  /** Without a token the card may use (none given, or a given one that is
   *  not the action's any more): any page can load this tab's card on a
   *  fragment of its choosing, so a fresh token (which ends the one anyone
   *  else holds) is taken only when the person says so: issue_token when
   *  signed in, the card session's /card/token in one. */
  offerOpen() {
    this.awaiting = true;
    const open = el("button", { type: "button", kt: "open-signed-in", class: "kt-secondary", text: "Review this action" });
    open.addEventListener("click", async () => {
      open.disabled = true;
      try {
        this.token = this.card.session
          ? await cardToken(this.actionId, this.card.auth)
          : await rpc("issue_token", { action_id: this.actionId }, this.card.auth);
      } catch (e) {
        this.renderError(explain(e));
        this.card.refresh();
        return;
      }
      this.given = false;
      this.awaiting = false;
      await this.load();
    });
    this.root.replaceChildren(
      el("p", { class: "kt-note", text: "This card holds no token for the action that still works. Review it as yourself: any other card or link open for it stops working." }),
      open
    );
  }

  /** Unless this page load redeemed the link's code: a digest action's
   *  fields are checked by the approval the person makes, never on load (a
   *  guess ends the proposal, and any page can load this tab's card, signed
   *  in or in a kept card session, with a fragment of its choosing). */
  deferHashCheck() {
    const hashLine = this.root.querySelector('[data-kt="hash"]');
    if (this.linkParams === undefined) {
      this.hashOk = false;
      hashLine.textContent = this.linkParamsError || "This link does not carry the fields to review, so it cannot be approved here. Ask for a new link.";
      hashLine.className = "kt-hash kt-bad";
    } else {
      this.hashOk = null;
      hashLine.textContent = "keyturn checks these fields when you approve: if they are not exactly the ones proposed, the proposal ends and nothing runs.";
      hashLine.className = "kt-hash";
    }
    hashLine.dataset.match = String(this.hashOk);
    this.sync();
  }

  /** A digest action's fields from the link, checked by the database:
   *  it keeps only a keyed digest of them, which no browser can recompute.
   *  Fields that are not the proposed ones end the proposal there and then
   *  (rejected_tampered), as approving with them would. */
  async checkHash() {
    const hashLine = this.root.querySelector('[data-kt="hash"]');
    if (this.linkParams === undefined) {
      this.hashOk = false;
      hashLine.textContent = this.linkParamsError || "This link does not carry the fields to review, so it cannot be approved here. Ask for a new link.";
    } else {
      try {
        const checked = await this.withToken(() => rpc("preview", { action_id: this.actionId, token: this.token, params: this.linkParams }, this.card.auth));
        this.hashOk = checked.params_match === true;
        if (!this.hashOk) this.showStatus(checked.status, checked.result);
      } catch (e) {
        this.hashOk = false;
      }
      hashLine.textContent = this.hashOk
        ? "✓ These fields are exactly the ones proposed (keyturn checked them)."
        : "✗ These fields are not the ones proposed, so keyturn ended the proposal. Do not act on this link; ask again.";
    }
    hashLine.dataset.match = String(this.hashOk);
    hashLine.className = `kt-hash ${this.hashOk ? "kt-good" : "kt-bad"}`;
    this.sync();
  }

  renderError([headline, said]) {
    this.root.replaceChildren(
      el("p", { class: "kt-error", kt: "error", role: "alert" }, headline, said ? el("span", { class: "kt-said", text: said }) : null)
    );
  }

  render() {
    const pv = this.preview;
    const effect = EFFECTS[pv.effect] || [pv.effect || "unknown effect", ""];
    const parts = [];
    if (this.revisedFrom) {
      parts.push(el("p", { class: "kt-revised", kt: "revised", text: `Revised proposal: it replaces ${this.revisedFrom}, which can no longer be approved.` }));
    }
    if (pv.revised_via === "card_session") {
      // Whoever held a link wrote it, in the person's name: the link may
      // have been read in a shared channel (docs/security.md, row 80).
      parts.push(el("p", { class: "kt-revised kt-bad", kt: "revised-by-link", role: "note", text: "This revision was written in a card opened from a link, in your name. Check every field: anyone who saw that link could have written it." }));
    }
    parts.push(el("h2", { class: "kt-summary", kt: "summary", id: `${this.id}-summary`, text: pv.summary }));
    const meta = el(
      "p",
      { class: "kt-meta" },
      el("span", { kt: "tool", class: "kt-tool" }, "Tool: ", el("code", { text: pv.tool })),
      el("span", { kt: "effect", class: `kt-effect kt-effect-${pv.effect}` }, el("strong", { text: effect[0] }), effect[1] ? ` — ${effect[1]}` : "")
    );
    if (pv.target_count !== undefined && pv.target_count !== null) {
      meta.append(el("span", { kt: "blast", class: "kt-blast", text: `Affects ${plural(pv.target_count, "record", "records")}` }));
    }
    if (pv.approval === "independent") meta.append(el("span", { class: "kt-approval", text: "Needs an approver other than the requester" }));
    parts.push(meta);
    parts.push(el("p", { class: "kt-expires", kt: "expires" }));
    parts.push(this.renderParams());
    if (Array.isArray(pv.targets) && pv.targets.length) parts.push(this.renderTargets(pv.targets));
    if (Array.isArray(pv.evidence) && pv.evidence.length) parts.push(this.renderEvidence(pv.evidence));
    if (pv.retain === "digest") parts.push(el("p", { class: "kt-hash", kt: "hash", "aria-live": "polite", text: "Checking the fields against the proposal…" }));
    parts.push(this.renderActions());
    parts.push(el("p", { class: "kt-status", kt: "status", role: "status", "aria-live": "polite" }));
    parts.push(el("p", { class: "kt-error", kt: "error", role: "alert", hidden: true }));
    this.root.replaceChildren(...parts);
    this.showStatus(this.status, pv.result);
    this.tick();
  }

  renderParams() {
    const params = this.params;
    const box = el("div", { class: "kt-params" }, el("h3", { text: "What it will do, field by field" }));
    if (params && typeof params === "object" && !Array.isArray(params)) {
      const list = el("dl", { kt: "params" });
      for (const key of Object.keys(params).sort()) {
        const dd = el("dd", { kt: "param", class: "kt-value" });
        dd.dataset.key = key;
        showValue(dd, params[key]);
        list.append(el("dt", { text: key }), dd);
      }
      box.append(list);
    } else if (params !== undefined) {
      const dd = el("pre", { kt: "param", class: "kt-value" });
      showValue(dd, params);
      box.append(dd);
    } else {
      const keys = this.preview.param_keys || [];
      box.append(el("p", { class: "kt-note", text: `keyturn keeps only a digest of this action's fields (${keys.map(visible).join(", ") || "none"}); the link brings the values.` }));
    }
    return box;
  }

  /** What the proposal cites, as the trusted side recorded it (fence or
   *  record_evidence): kind, reference and hash; revoked ones marked. */
  renderEvidence(evidence) {
    const list = el("ul", { class: "kt-evidence", kt: "evidence" });
    for (const e of evidence) {
      const item = el(
        "li",
        { kt: "evidence-item", class: e.revoked ? "kt-revoked" : "" },
        el("strong", { text: e.kind }),
        " ",
        el("span", { class: "kt-value", text: e.ref }),
        " ",
        el("code", { class: "kt-said", title: e.sha256, text: `sha256 ${String(e.sha256).slice(0, 12)}…` }),
        e.by_agent ? el("span", { kt: "evidence-by-agent", class: "kt-note", text: " recorded at the agent's own call: it shows what was fenced for the agent, not where that came from" }) : null,
        e.revoked ? el("span", { class: "kt-bad", text: " revoked: the proposal can no longer be approved" }) : null
      );
      item.dataset.evidenceId = e.evidence_id;
      list.append(item);
    }
    return el("div", { class: "kt-evidence-box" }, el("h3", { text: "What the agent cites, as keyturn recorded it" }), list);
  }

  renderTargets(targets) {
    const table = el("table", { class: "kt-targets", kt: "targets" });
    table.append(
      el("caption", { text: `Each record, before → after (${plural(targets.length, "record", "records")})` }),
      el("thead", {}, el("tr", {}, el("th", { scope: "col", text: "Record" }), el("th", { scope: "col", text: "Change" })))
    );
    const body = el("tbody");
    for (const t of targets) {
      const change = el("td");
      const after = t.after || {};
      for (const col of Object.keys(after).sort()) {
        const before = t.before ? t.before[col] : undefined;
        change.append(
          el(
            "div",
            { class: "kt-change" },
            el("span", { class: "kt-col", text: col }),
            ": ",
            t.before ? showValue(el("span", { class: "kt-before" }), before) : el("span", { class: "kt-before", text: "(not visible to you)" }),
            " → ",
            showValue(el("span", { class: "kt-after" }), after[col])
          )
        );
      }
      const row = el("tr", { kt: "target" }, el("th", { scope: "row", text: String(t.key) }), change);
      row.dataset.key = String(t.key);
      body.append(row);
    }
    table.append(body);
    return el("div", { class: "kt-table-wrap" }, table);
  }

  renderActions() {
    const reasonId = `${this.id}-reason`;
    this.approveButton = el("button", { type: "button", kt: "approve", class: "kt-approve", text: "Approve" });
    this.approveButton.addEventListener("click", () => this.approve());
    this.rejectButton = el("button", { type: "button", kt: "reject", class: "kt-reject", text: "Reject" });
    this.rejectButton.addEventListener("click", () => this.reject());
    this.reason = el("textarea", { id: reasonId, kt: "reason", rows: 2, maxlength: 500 });
    this.editButton = el("button", { type: "button", kt: "edit", class: "kt-secondary", text: "Edit fields…" });
    this.editButton.addEventListener("click", () => this.edit());
    return el(
      "div",
      { class: "kt-actions" },
      el("div", { class: "kt-row" }, this.approveButton, this.editButton),
      el(
        "div",
        { class: "kt-reject-box" },
        el("label", { for: reasonId, text: "Reason for rejecting (optional)" }),
        this.reason,
        this.rejectButton
      )
    );
  }

  /** Enables what may be pressed now. */
  sync() {
    if (!this.approveButton) return;
    const pending = this.status === "pending" && !this.expired;
    this.approveButton.disabled = !this.approvable;
    this.rejectButton.disabled = !pending || this.busy || this.editing;
    this.reason.disabled = this.rejectButton.disabled;
    this.editButton.disabled = !pending || this.busy || this.editing || this.params === undefined;
    this.editButton.hidden = this.params === undefined;
    this.root.dataset.status = this.status || "";
    this.card.refresh();
  }

  /** Updates the countdown; called every second. */
  tick() {
    const line = this.root.querySelector('[data-kt="expires"]');
    if (!line || !this.preview) return;
    const left = (Date.parse(this.preview.expires_at) - Date.now()) / 1000;
    if (this.status !== "pending") {
      line.textContent = "";
      line.hidden = true;
    } else if (left > 0) {
      line.hidden = false;
      line.textContent = `Expires in ${duration(left)}`;
      line.classList.toggle("kt-soon", left < 60);
      delete line.dataset.expired;
    } else {
      line.hidden = false;
      line.textContent = "Expired: this proposal can no longer be approved. Ask again.";
      line.dataset.expired = "true";
    }
    this.sync();
  }

  showStatus(status, result) {
    this.status = status;
    const line = this.root.querySelector('[data-kt="status"]');
    if (line) {
      line.dataset.status = status;
      line.className = `kt-status kt-${tone(status)}`;
      line.textContent = outcomeWords(status, result);
    }
    this.tick();
  }

  showError(err) {
    const line = this.root.querySelector('[data-kt="error"]');
    if (!line) return;
    const [headline, said] = Array.isArray(err) ? err : explain(err);
    line.replaceChildren(headline, said ? el("span", { class: "kt-said", text: said }) : "");
    line.hidden = false;
  }

  clearError() {
    const line = this.root.querySelector('[data-kt="error"]');
    if (line) line.hidden = true;
  }

  /** Runs `call`, which reads this.token. Each card opened for an action
   *  takes a fresh token, so one opened after this one (another approver's,
   *  for a quorum, or this person's other device) leaves this card's token
   *  dead: then it takes a fresh one for its person and runs `call` once
   *  more. A wrong token uses nothing up, so nothing is spent by trying. */
  async withToken(call) {
    try {
      return await call();
    } catch (e) {
      if (!isWrongToken(e) || this.given) throw e;
      this.token = this.card.session
        ? await cardToken(this.actionId, this.card.auth)
        : await rpc("issue_token", { action_id: this.actionId }, this.card.auth);
      return await call();
    }
  }

  /** The approve call's arguments: a digest action resubmits its params. */
  approveArgs() {
    const args = { action_id: this.actionId, token: this.token };
    if (this.preview.retain === "digest") args.params = this.linkParams;
    return args;
  }

  setBusy(busy) {
    this.busy = busy;
    this.root.setAttribute("aria-busy", String(busy));
    this.sync();
  }

  async approve() {
    // The guard and the disabled button hold from this line on, before any
    // await: a second click meets a disabled button. The database's replay
    // answer covers whatever gets through anyway (another tab, a retry).
    if (!this.approvable) return;
    this.setBusy(true);
    this.clearError();
    try {
      const rows = await this.withToken(() => rpc("approve", this.approveArgs(), this.card.auth));
      const row = rows[0];
      this.showStatus(row.status, row.result);
      if (IN_FLIGHT.has(row.status)) this.follow();
    } catch (e) {
      this.showError(e);
    } finally {
      this.setBusy(false);
    }
  }

  /** Shows one row of approve_many (or of approve, one by one). */
  settle(row) {
    if (row.status === "refused") {
      this.showStatus("refused", row.result);
      this.showError(["The database refused this one; nothing ran for it.", (row.result && row.result.message) || ""]);
    } else {
      this.showStatus(row.status, row.result);
      if (IN_FLIGHT.has(row.status)) this.follow();
    }
  }

  async reject() {
    if (this.busy || this.status !== "pending") return;
    this.setBusy(true);
    this.clearError();
    try {
      const reason = this.reason.value.trim();
      const status = await this.withToken(() => rpc(
        "reject",
        reason ? { action_id: this.actionId, token: this.token, reason } : { action_id: this.actionId, token: this.token },
        this.card.auth
      ));
      this.showStatus(status, reason ? { reason } : null);
    } catch (e) {
      this.showError(e);
    } finally {
      this.setBusy(false);
    }
  }

  /** Polls the action's status until it is no longer on its way: with
   *  action_status, or in a card session (which may only preview and
   *  decide) with preview, whose token stays good after the decision. */
  async follow() {
    if (this.following) return;
    this.following = true;
    let delay = 500;
    try {
      while (IN_FLIGHT.has(this.status)) {
        await new Promise((r) => setTimeout(r, delay));
        delay = Math.min(delay * 1.5, 5000);
        try {
          if (this.card.session) {
            const now = await rpc("preview", { action_id: this.actionId, token: this.token }, this.card.auth);
            if (now) this.showStatus(now.status, now.result);
          } else {
            const rows = await rpc("action_status", { action_id: this.actionId }, this.card.auth);
            if (rows && rows[0]) this.showStatus(rows[0].status, rows[0].result);
          }
        } catch (e) {
          if (e instanceof RpcError && e.status >= 400 && e.status < 500) {
            this.showError(e);
            return;
          }
        }
      }
    } finally {
      this.following = false;
    }
  }

  /** Turns the fields into inputs; saving calls revise. */
  edit() {
    if (this.params === undefined || this.status !== "pending") return;
    this.editing = true;
    const params = this.params;
    const form = el("form", { class: "kt-edit", kt: "edit-form", novalidate: true });
    form.append(el("h3", { text: "Edit the fields: saving makes a new proposal and retires this one" }));
    const inputs = [];
    const keys = params && typeof params === "object" && !Array.isArray(params) ? Object.keys(params).sort() : [];
    keys.forEach((key, i) => {
      const id = `${this.id}-field-${i}`;
      const value = params[key];
      const isText = typeof value === "string";
      const input = el(isText && !value.includes("\n") ? "input" : "textarea", { id, kt: "field", class: "kt-field" });
      input.dataset.key = key;
      input.dataset.json = String(!isText);
      input.value = isText ? value : JSON.stringify(value, null, 2);
      if (input.tagName === "INPUT") input.type = "text";
      else input.rows = 4;
      inputs.push(input);
      form.append(el("label", { for: id, text: isText ? key : `${key} (JSON)` }), input);
    });
    const save = el("button", { type: "submit", kt: "revise", text: "Save as a new proposal" });
    const cancel = el("button", { type: "button", kt: "edit-cancel", class: "kt-secondary", text: "Cancel" });
    cancel.addEventListener("click", () => {
      form.remove();
      this.editing = false;
      this.sync();
    });
    form.append(el("div", { class: "kt-row" }, save, cancel));
    form.addEventListener("submit", (ev) => {
      ev.preventDefault();
      this.revise(inputs, save);
    });
    this.root.querySelector(".kt-actions").before(form);
    this.sync();
    if (inputs[0]) inputs[0].focus();
  }

  async revise(inputs, save) {
    if (this.busy) return;
    const params = {};
    try {
      for (const input of inputs) {
        params[input.dataset.key] = input.dataset.json === "true" ? JSON.parse(input.value) : input.value;
      }
    } catch (e) {
      this.showError(["A JSON field does not parse; fix it and save again.", String(e.message || e)]);
      return;
    }
    save.disabled = true;
    this.setBusy(true);
    this.clearError();
    try {
      const rows = await this.withToken(() => rpc("revise", { action_id: this.actionId, token: this.token, params }, this.card.auth));
      const next = rows[0];
      if (this.card.session) {
        // A link's card session decides what the link named: what it
        // writes is decided where the person is signed in (keyturn makes
        // no link for it, and this session may not approve it).
        this.status = "superseded";
        this.editing = false;
        this.busy = false;
        this.root.replaceChildren(el("p", {
          class: "kt-revised", kt: "revised-elsewhere", role: "status",
          text: `Saved as a new proposal (${next.action_id}); this one can no longer be approved. A proposal changed from a link is decided where you are signed in: open it from your queue.`,
        }));
        this.card.refresh();
        return;
      }
      this.revisedFrom = this.actionId;
      // The new token lives only here, in memory: it is never written to
      // the address bar or to storage.
      this.actionId = next.action_id;
      this.token = next.token;
      this.root.dataset.actionId = next.action_id;
      if (this.preview.retain === "digest") this.linkParams = params;
      this.editing = false;
      this.busy = false;
      await this.load();
    } catch (e) {
      save.disabled = false;
      this.showError(isMissingFunction(e) ? ["This keyturn cannot revise proposals yet.", ""] : e);
    } finally {
      this.setBusy(false);
    }
  }
}

class KeyturnCard extends HTMLElement {
  connectedCallback() {
    if (this.started) return;
    this.started = true;
    const ownLink = this.getAttribute("link");
    if (ownLink === null) {
      // Another link opened in this tab changes only the fragment, which
      // reloads nothing by itself: start over with it.
      window.addEventListener("hashchange", () => location.reload());
    }
    const { items, code } = parseLink(ownLink ?? location.hash.slice(1));
    if (ownLink === null) {
      if (!code) adoptKeptParams(items);
      this.linkItems = items;
      // A code leaves the address bar once redeemed (start); all else now.
      if (!code) dropCode(false);
    }
    // An embedding page hands its person's JWT over as a property, or leaves
    // it in sessionStorage; a link brings a one-time code instead.
    this.code = code;
    this.auth = { jwt: code ? null : this.jwt || takeJwt(), base: this.getAttribute("endpoint") || "" };
    this.classList.add("kt-card");
    this.dataset.kt = "card";
    this.globalError = el("p", { class: "kt-error", kt: "error", role: "alert", hidden: true });
    this.list = el("div", { class: "kt-items" });
    this.items = items.map((it, i) => new Item(this, it, i));
    const header = el("header", { class: "kt-header" }, el("h1", { text: this.items.length > 1 ? `${this.items.length} actions wait for your decision` : "An action waits for your decision" }));
    this.replaceChildren(header, this.globalError, this.list);
    if (!items.length) return this.fail(["This link holds no action to review.", ""]);
    if (!code && !this.auth.jwt && !takeCardSession(items.map((i) => i.action_id))) return this.fail(["This link holds no code to open it with: open the newest link from your notification or your app again.", ""]);
    if (this.items.length > 1) {
      this.approveAll = el("button", { type: "button", kt: "approve-all", class: "kt-approve", text: "Approve all" });
      this.approveAll.addEventListener("click", () => this.approveEvery());
      this.batchStatus = el("p", { kt: "batch-status", class: "kt-status", role: "status", "aria-live": "polite" });
      header.append(el("p", { class: "kt-note", text: "Review each one below. You can decide on each alone, or approve all that can be approved in one step." }), this.approveAll, this.batchStatus);
    }
    for (const item of this.items) this.list.append(item.root);
    this.timer = setInterval(() => this.items.forEach((i) => i.tick()), 1000);
    const begin = () => this.start().then(() => Promise.all(this.items.map((i) => i.load()))).then(() => this.afterLoad());
    if (!code || ownLink !== null) return void begin();
    // A link's code is spent by the person's tap, never by loading the page:
    // a mail scanner or a chat preview that runs the page would spend it,
    // and the person's link would answer "already used" (docs/security.md,
    // row 139).
    const open = el("button", { type: "button", kt: "open", class: "kt-approve", text: this.items.length > 1 ? "Open these actions" : "Open this action" });
    const gate = el("div", { class: "kt-open", kt: "open-gate" },
      el("p", { class: "kt-note", text: "This link opens the card once, for a short time." }), open);
    this.list.hidden = true;
    if (this.approveAll) this.approveAll.hidden = true;
    this.insertBefore(gate, this.list);
    open.addEventListener("click", () => {
      gate.remove();
      this.list.hidden = false;
      if (this.approveAll) this.approveAll.hidden = false;
      begin();
    }, { once: true });
  }

  /** With a link's code: redeem it for a card session and the actions'
   *  fresh tokens, then drop it from the address bar. */
  async start() {
    const ids = this.items.map((i) => i.actionId);
    const use = (opened) => {
      this.auth.jwt = opened.session;
      this.session = true;
      for (const item of this.items) {
        item.token = (opened.tokens || {})[item.actionId] || null;
        item.given = !this.redeemed;
      }
    };
    try {
      if (!this.code) {
        // Signed in, or reloaded: the code is spent, but this tab's session
        // may go on.
        const kept = this.auth.jwt ? null : takeCardSession(ids);
        if (kept) use(kept);
        return;
      }
      const opened = await redeemLink(this.code, ids, this.auth);
      // This load's link came with its code: its tokens may be taken again
      // (withToken) and its digest fields are checked now (checkHash); any
      // later load's wait for the person.
      this.redeemed = true;
      if (this.getAttribute("link") === null) {
        keepCardSession(opened, ids);
        keepParams(this.linkItems);
      }
      use(opened);
    } catch (e) {
      this.fail(e instanceof RpcError && e.status === 401
        ? ["This link was already used or has expired: links work once, for a short time. Open the newest notification, or the action from your queue.", ""]
        : explain(e));
      this.items = [];
    } finally {
      if (this.getAttribute("link") === null) dropCode(Boolean(this.code));
    }
  }

  /** Signed in with the person's own JWT (a tab's sessionStorage, or an
   *  embedding page's property), not in a card session a code opened. */
  get signedIn() {
    return Boolean(this.auth.jwt) && !this.session;
  }

  disconnectedCallback() {
    clearInterval(this.timer);
  }

  afterLoad() {
    // When nothing could be shown because of the sign-in, say so once.
    const denied = this.items.every((i) => !i.preview && !i.awaiting);
    // The page /card in a tab signed in with the person's own JWT (never a
    // card session, which a link's holder opened; an embedding page offers
    // what it will, as the console does): this device may be notified.
    if (this.getAttribute("link") === null && this.signedIn && !denied) {
      const box = el("p", { class: "kt-row", kt: "push-box", hidden: true });
      this.querySelector(".kt-header").append(box);
      offerPush(box, this.auth.jwt);
    }
    this.dataset.loaded = "true";
    if (denied && this.items.length > 1) this.fail(["None of these actions can be shown to you.", ""], false);
  }

  fail(message, clear = true) {
    const [headline, said] = message;
    this.globalError.replaceChildren(headline, said ? el("span", { class: "kt-said", text: said }) : "");
    this.globalError.hidden = false;
    if (clear) this.list.replaceChildren();
    this.dataset.loaded = "true";
  }

  refresh() {
    if (!this.approveAll) return;
    const ready = this.items.filter((i) => i.approvable);
    this.approveAll.disabled = ready.length === 0 || this.items.some((i) => i.busy);
    this.approveAll.textContent = ready.length ? `Approve all ${ready.length}` : "Approve all";
  }

  async approveEvery() {
    const ready = this.items.filter((i) => i.approvable);
    if (!ready.length) return;
    ready.forEach((i) => i.setBusy(true));
    this.approveAll.disabled = true;
    try {
      let rows;
      try {
        // A card session decides its actions one call each (it may not call
        // approve_many); a JWT approves them as one batch.
        if (this.session) throw new RpcError(404, { code: "PGRST202" });
        rows = await rpc("approve_many", { items: ready.map((i) => i.approveArgs()) }, this.auth);
      } catch (e) {
        if (!isMissingFunction(e)) throw e;
        // An older keyturn without approve_many: the same calls one by one,
        // each answered as approve answers it.
        rows = [];
        for (const item of ready) {
          try {
            const [row] = await rpc("approve", item.approveArgs(), this.auth);
            rows.push(row);
          } catch (err) {
            rows.push({ action_id: item.actionId, status: "refused", result: { sqlstate: err.code, message: err.message } });
          }
        }
      }
      for (const row of rows) {
        const item = ready.find((i) => i.actionId === row.action_id);
        if (item) item.settle(row);
      }
      const done = rows.filter((r) => r.status !== "refused").length;
      this.batchStatus.textContent = `${plural(done, "action", "actions")} approved, ${rows.length - done} refused. Each outcome is shown below.`;
    } catch (e) {
      const [headline, said] = explain(e);
      this.batchStatus.textContent = `${headline} ${said}`;
    } finally {
      ready.forEach((i) => i.setBusy(false));
      this.refresh();
    }
  }
}

customElements.define("keyturn-card", KeyturnCard);
