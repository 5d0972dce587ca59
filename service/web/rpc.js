// Calls keyturnd's /rpc the way a PostgREST client would, with a bearer:
// the person's JWT, which an application puts in this tab's sessionStorage
// (never in a URL: browsers keep every URL in their history), or a card
// session that a link's one-time code was redeemed for (redeemLink).

const STORAGE_KEY = "keyturn.jwt";

/** The person's JWT the application left in this tab's sessionStorage, or
 *  null. A JWT in the link's fragment (`j=`) is never read: links carry no
 *  credential. */
export function takeJwt() {
  return sessionStorage.getItem(STORAGE_KEY);
}

/** Keeps a JWT the operator pasted, for this tab only. */
export function keepJwt(jwt) {
  sessionStorage.setItem(STORAGE_KEY, jwt);
}

/** Forgets a JWT the server refused, so the next page must bring a new one. */
export function forgetJwt() {
  sessionStorage.removeItem(STORAGE_KEY);
}

const CARD_KEY = "keyturn.card";

/** Keeps a redeemed card session for this tab only, so reloading the card
 *  (whose URL no longer holds the spent code) goes on within the session. */
export function keepCardSession(opened, actionIds) {
  sessionStorage.setItem(CARD_KEY, JSON.stringify({ ...opened, action_ids: [...actionIds].sort() }));
}

/** This tab's card session for exactly these actions, while it lasts. */
export function takeCardSession(actionIds) {
  try {
    const kept = JSON.parse(sessionStorage.getItem(CARD_KEY));
    const same = JSON.stringify(kept.action_ids) === JSON.stringify([...actionIds].sort());
    return same && Date.parse(kept.expires_at) > Date.now() ? kept : null;
  } catch (e) {
    return null;
  }
}

/** Redeems a link's one-time code (`c`) for a card session:
 *  {session, expires_at, tokens: {action_id: token}}, or an RpcError (401
 *  for a used, expired or unknown code). The code works once, so the URL
 *  that carried it holds nothing that works afterwards. */
export async function redeemLink(code, actionIds, { base = "" } = {}) {
  return post(`${base}/card/session`, { code, action_ids: actionIds }, null);
}

/** A fresh token for one of a card session's actions (`issue_token`, at
 *  POST /card/token: a card session's /rpc is for its four calls alone). */
export async function cardToken(actionId, { jwt, base = "" } = {}) {
  return post(`${base}/card/token`, { action_id: actionId }, jwt);
}

async function post(url, body, bearer) {
  let response;
  const headers = { "Content-Type": "application/json" };
  if (bearer) headers.Authorization = `Bearer ${bearer}`;
  try {
    response = await fetch(url, {
      method: "POST",
      headers,
      body: JSON.stringify(body),
      cache: "no-store",
      credentials: "omit",
      referrerPolicy: "no-referrer",
    });
  } catch (e) {
    throw new RpcError(0, { message: "keyturn could not be reached" });
  }
  const text = await response.text();
  let parsed = null;
  try {
    parsed = text ? JSON.parse(text) : null;
  } catch (e) {
    parsed = { message: text };
  }
  if (!response.ok) {
    if (response.status === 401 && bearer && bearer === takeJwt()) forgetJwt();
    if (response.status === 401 && bearer && bearer.startsWith("kts_")) sessionStorage.removeItem(CARD_KEY);
    throw new RpcError(response.status, parsed || {});
  }
  return parsed;
}

/** A refusal: the HTTP status and PostgREST's {code, message, details, hint}. */
export class RpcError extends Error {
  constructor(status, body) {
    super((body && body.message) || `HTTP ${status}`);
    this.status = status;
    this.code = body && body.code;
    this.details = body && body.details;
    this.hint = body && body.hint;
  }
}

/** POST /rpc/<fn> with named arguments; the JSON answer, or an RpcError. */
export async function rpc(fn, args, { jwt, base = "" }) {
  return post(`${base}/rpc/${encodeURIComponent(fn)}`, args, jwt);
}

/** Whether the server does not offer `fn` (an older keyturn). */
export function isMissingFunction(err) {
  return err instanceof RpcError && err.status === 404 && err.code === "PGRST202";
}

/** A refusal in the person's words: [headline, the server's own words]. */
export function explain(err) {
  if (!(err instanceof RpcError)) return ["Something went wrong in this page.", String(err)];
  const said = [err.message, err.details, err.hint].filter(Boolean).join(" ");
  switch (err.status) {
    case 0:
      return ["keyturn could not be reached. Check your connection and try again.", ""];
    case 401:
      return ["This link or sign-in does not work (any more): links work once, for a short time. Open the newest notification, or ask for a new link from your queue.", said];
    case 403:
      return ["You are not allowed to do this.", said];
    case 404:
      return ["This is not available here.", said];
    case 409:
      return ["This link does not work: the token is wrong, or the proposal is not visible to you, or it is in another state.", said];
    case 400:
      return ["The request was not accepted.", said];
    case 413:
      return ["The request is too large.", said];
    case 429:
      return ["Too many requests at once. Wait a moment and try again.", said];
    default:
      return ["keyturn had a problem answering. Try again in a moment.", said];
  }
}
