// Web Push for the card (docs/notifications.md): with the person's consent,
// registers keyturnd's service worker, subscribes this browser with
// keyturnd's VAPID public key (/card/push-key), and hands the subscription
// to keyturn.set_notify('webpush', …) over /rpc as that person. Nothing here
// runs by itself: the page calls it from a button the person pressed.
//
// set_notify needs the person's own JWT (the app's sign-in), never a card
// session: a session opened from a link could otherwise point the person's
// future notifications, and their link codes, at another device.

import { rpc, explain } from "./rpc.js";
import { el } from "./show.js";

const WORKER = "/card/sw.js";
const SCOPE = "/card";

/** Whether this browser can take Web Push and keyturnd offers it: the
 *  VAPID public key (base64url), or null. */
export async function pushKey() {
  if (!("serviceWorker" in navigator) || !("PushManager" in window) || !("Notification" in window)) {
    return null;
  }
  try {
    const response = await fetch("/card/push-key", { cache: "no-store", credentials: "omit" });
    if (!response.ok) return null;
    const body = await response.json();
    return typeof body.public_key === "string" ? body.public_key : null;
  } catch (e) {
    return null;
  }
}

function bytes(base64url) {
  const padded = base64url.replace(/-/g, "+").replace(/_/g, "/") + "===".slice((base64url.length + 3) % 4);
  return Uint8Array.from(atob(padded), (c) => c.charCodeAt(0));
}

/** Subscribes this browser for the person whose `jwt` it is. Resolves to
 *  "subscribed", "denied" (the person said no, or did before) or
 *  "unavailable" (no Web Push here, or none configured); an RpcError when
 *  keyturn refuses the subscription. */
export async function subscribeToPush({ jwt, settings = {} }) {
  const key = await pushKey();
  if (!key) return "unavailable";
  const permission = await Notification.requestPermission();
  if (permission !== "granted") return "denied";
  const registration = await navigator.serviceWorker.register(WORKER, { scope: SCOPE });
  await navigator.serviceWorker.ready;
  let subscription = await registration.pushManager.getSubscription();
  if (!subscription) {
    subscription = await registration.pushManager.subscribe({
      userVisibleOnly: true,
      applicationServerKey: bytes(key),
    });
  }
  await rpc("set_notify", { channel: "webpush", target: JSON.stringify(subscription.toJSON()), settings }, { jwt });
  return "subscribed";
}

/** Ends this browser's subscription and removes the person's webpush
 *  channel. */
export async function unsubscribeFromPush({ jwt }) {
  if ("serviceWorker" in navigator) {
    const registration = await navigator.serviceWorker.getRegistration(SCOPE);
    const subscription = registration && (await registration.pushManager.getSubscription());
    if (subscription) await subscription.unsubscribe();
  }
  return rpc("remove_notify", { channel: "webpush" }, { jwt });
}

/** The "Notify me on this device" control, put in `box` (which stays hidden
 *  where this browser cannot take Web Push or keyturnd has no VAPID key). It
 *  subscribes with `jwt`, the person's own (never a card session's), after
 *  they pressed it, and says what came of it. The console's queue and the
 *  card in a signed-in tab offer it. */
export async function offerPush(box, jwt) {
  if (!(await pushKey())) return;
  const button = el("button", { type: "button", class: "kt-secondary", kt: "push-subscribe", text: "Notify me on this device" });
  const status = el("span", { class: "kt-note", kt: "push-status", role: "status", "aria-live": "polite" });
  box.replaceChildren(button, " ", status);
  box.hidden = false;
  button.addEventListener("click", async () => {
    button.disabled = true;
    try {
      const result = await subscribeToPush({ jwt });
      status.textContent = {
        subscribed: "This device is notified when an action waits for you.",
        denied: "Notifications are blocked for this site; allow them in the browser's settings, then try again.",
        unavailable: "This browser cannot take notifications from keyturn.",
      }[result];
    } catch (e) {
      status.textContent = explain(e).join(" ");
    } finally {
      button.disabled = false;
    }
  });
}
