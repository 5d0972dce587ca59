// RFC 8785 (JSON Canonicalization Scheme) and keyturn's params hash, so the
// card can check in the browser that the fields it shows are the ones the
// proposal's hash covers: lowercase hex SHA-256 of the canonical form of
// {"params": <params>, "tool": <tool>}.
//
// RFC 8785 in ECMAScript terms: numbers are serialized as JSON.stringify
// serializes them (the RFC adopts ECMAScript's Number-to-String), strings
// with JSON.stringify's escaping (the same short escapes, lowercase \u00xx
// for other controls, everything else literal), object members sorted by
// their names' UTF-16 code units (which is what Array.prototype.sort does
// with no comparator), no whitespace. Values JSON cannot carry are refused,
// as are lone surrogates, which no JSON text keyturn accepts can hold.

const LONE_SURROGATE = /\p{Cs}/u;

/** The RFC 8785 text of `value` (a JSON.parse result). */
export function canonicalize(value) {
  if (value === null) return "null";
  switch (typeof value) {
    case "boolean":
      return value ? "true" : "false";
    case "number":
      if (!Number.isFinite(value)) throw new TypeError("RFC 8785: NaN and Infinity are not JSON");
      return JSON.stringify(value);
    case "string":
      if (LONE_SURROGATE.test(value)) throw new TypeError("RFC 8785: a string holds a lone surrogate");
      return JSON.stringify(value);
    case "object": {
      if (Array.isArray(value)) return "[" + value.map(canonicalize).join(",") + "]";
      const names = Object.keys(value).sort();
      const members = [];
      for (const name of names) {
        if (value[name] === undefined) continue;
        members.push(canonicalize(name) + ":" + canonicalize(value[name]));
      }
      return "{" + members.join(",") + "}";
    }
    default:
      throw new TypeError(`RFC 8785: a ${typeof value} is not JSON`);
  }
}

/** Lowercase hex SHA-256 of `text`'s UTF-8 bytes (WebCrypto). */
export async function sha256Hex(text) {
  const digest = await crypto.subtle.digest("SHA-256", new TextEncoder().encode(text));
  return Array.from(new Uint8Array(digest), (b) => b.toString(16).padStart(2, "0")).join("");
}

/** keyturn's params hash of `params` for `tool`. */
export function paramsHash(tool, params) {
  return sha256Hex(canonicalize({ params, tool }));
}

/** The params a link carries: base64url (no padding) of their UTF-8 JSON. */
export function decodeLinkParams(p) {
  const b64 = p.replace(/-/g, "+").replace(/_/g, "/");
  const binary = atob(b64 + "=".repeat((4 - (b64.length % 4)) % 4));
  const bytes = Uint8Array.from(binary, (c) => c.charCodeAt(0));
  return JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(bytes));
}

/** The `p` of a link for `params`. */
export function encodeLinkParams(params) {
  const bytes = new TextEncoder().encode(JSON.stringify(params));
  let binary = "";
  for (const b of bytes) binary += String.fromCharCode(b);
  return btoa(binary).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
}
