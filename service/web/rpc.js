// Calls keyturnd's /rpc with the person's JWT, the way a PostgREST client
// would. The JWT comes from the link's fragment (`j`), which no browser sends
// to a server, and is kept only in this tab's sessionStorage; the fragment
// loses it at once, so it neither lingers in the address bar nor in history.

const STORAGE_KEY = "keyturn.jwt";

/** The person's JWT: `j` of the fragment (then stored and removed from the
 *  address bar) or what this tab stored before; null when there is none. */
export function takeJwt() {
  const params = new URLSearchParams(location.hash.slice(1));
  const fromLink = params.get("j");
  if (fromLink) {
    sessionStorage.setItem(STORAGE_KEY, fromLink);
    params.delete("j");
    const rest = params.toString();
    history.replaceState(history.state, "", location.pathname + (rest ? "#" + rest : ""));
  }
  return sessionStorage.getItem(STORAGE_KEY);
}

/** Forgets a JWT the server refused, so the next link must bring a new one. */
export function forgetJwt() {
  sessionStorage.removeItem(STORAGE_KEY);
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
  let response;
  try {
    response = await fetch(`${base}/rpc/${encodeURIComponent(fn)}`, {
      method: "POST",
      headers: { "Content-Type": "application/json", Authorization: `Bearer ${jwt}` },
      body: JSON.stringify(args),
      cache: "no-store",
      credentials: "omit",
      referrerPolicy: "no-referrer",
    });
  } catch (e) {
    throw new RpcError(0, { message: "keyturn could not be reached" });
  }
  const text = await response.text();
  let body = null;
  try {
    body = text ? JSON.parse(text) : null;
  } catch (e) {
    body = { message: text };
  }
  if (!response.ok) {
    if (response.status === 401) forgetJwt();
    throw new RpcError(response.status, body || {});
  }
  return body;
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
      return ["Your sign-in is missing, expired or not accepted here. Sign in again and reopen the link.", said];
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
