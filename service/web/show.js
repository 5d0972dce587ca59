// Building what the person reads, as text only. Nothing here ever parses
// markup: every node is made with createElement and filled with
// textContent, so a param value such as <img onerror=…> stays text.

import { INVISIBLE, SPACES } from "./invisible.js";

// Characters that print as nothing or as something else: every character
// the server calls invisible (format characters, Default_Ignorable code
// points: INVISIBLE) or a space look-alike (the odd spaces and the blanks
// such as U+2800: SPACES), both made by keyturnd from keyturn-core's one
// definition; and on top of those, for the reader: controls (but tab and
// newline), separators, unassigned and private-use code points, and lone
// surrogates.
const HIDDEN = new RegExp(
  `[${INVISIBLE}${SPACES}\\p{Cc}\\p{Zl}\\p{Zp}\\p{Co}\\p{Cn}\\p{Cs}]`,
  "gu"
);

/** `s` with every hidden character shown as ⟨U+XXXX⟩. */
export function visible(s) {
  return String(s).replace(HIDDEN, (ch) => {
    if (ch === "\n" || ch === "\t") return ch;
    const cp = ch.codePointAt(0);
    return `⟨U+${cp.toString(16).toUpperCase().padStart(4, "0")}⟩`;
  });
}

/** A param or column value as the person reads it: strings as they are,
 *  anything else as JSON; hidden characters shown either way. */
export function valueText(v) {
  if (typeof v === "string") return visible(v);
  if (v === undefined) return "(none)";
  return visible(JSON.stringify(v, null, 2));
}

/** What a value is when it is not plain text, as the card labels it beside
 *  the value (styled, from the element's data-kind: no text can imitate
 *  it), or undefined for text: empty text, and text with spaces at an end,
 *  are labelled too. A text field holding "null", "false" or "12" reads
 *  the same as the JSON value, which may write something else (SQL NULL
 *  against the text 'null'). */
export function valueKind(v) {
  if (v === "") return "empty text";
  // Spaces at an end show as nothing: say they are there.
  if (typeof v === "string") return v.trim() === v ? undefined : "spaces at an end";
  if (v === undefined) return undefined;
  if (v === null) return "null: no value";
  if (typeof v === "number") return "number";
  if (typeof v === "boolean") return "true/false";
  return "JSON";
}

/** `node` showing `v`: its text, and its kind when it is not text. */
export function showValue(node, v) {
  node.textContent = valueText(v);
  const kind = valueKind(v);
  if (kind) node.dataset.kind = kind;
  else delete node.dataset.kind;
  return node;
}

/** A new element: `attrs` may set class, data-kt (kt), text, and any
 *  attribute; `children` are nodes or strings (as text). */
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "text") node.textContent = visible(v);
    else if (k === "kt") node.dataset.kt = v;
    else if (k === "class") node.className = v;
    else node.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    node.append(typeof c === "string" ? document.createTextNode(visible(c)) : c);
  }
  return node;
}

/** "3 min 12 s" for a number of seconds. */
export function duration(seconds) {
  const s = Math.max(0, Math.floor(seconds));
  const d = Math.floor(s / 86400);
  const h = Math.floor((s % 86400) / 3600);
  const m = Math.floor((s % 3600) / 60);
  const parts = [];
  if (d) parts.push(`${d} d`);
  if (h) parts.push(`${h} h`);
  if (m && !d) parts.push(`${m} min`);
  if (!d && !h) parts.push(`${s % 60} s`);
  return parts.join(" ");
}

/** A timestamp in the reader's locale, with its ISO form for the title. */
export function when(iso) {
  if (!iso) return "—";
  const t = new Date(iso);
  return Number.isNaN(t.getTime()) ? String(iso) : t.toLocaleString();
}
