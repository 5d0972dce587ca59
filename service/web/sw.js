// keyturn's service worker (docs/notifications.md): it shows the Web Push
// notifications keyturnd sends and, when one is tapped, opens the card it
// links to. It caches nothing and intercepts no request, so the card, its
// scripts and /rpc always come from keyturnd as they are.
//
// A push's payload is JSON keyturnd encrypted to this browser's
// subscription (RFC 8291): {title, body, url, tag}. Only a card link of
// this origin is ever opened; anything else opens the plain card.

self.addEventListener("install", () => self.skipWaiting());
self.addEventListener("activate", (event) => event.waitUntil(self.clients.claim()));

function text(value, fallback) {
  return typeof value === "string" ? value : fallback;
}

// The card link a notification carries, if it is this origin's card.
function cardLink(value) {
  try {
    const url = new URL(text(value, ""), self.location.origin);
    if (url.origin === self.location.origin && url.pathname.endsWith("/card")) return url.href;
  } catch (e) {
    // not a URL: the plain card
  }
  return new URL("/card", self.location.origin).href;
}

self.addEventListener("push", (event) => {
  let data = {};
  try {
    data = event.data ? event.data.json() : {};
  } catch (e) {
    data = {};
  }
  event.waitUntil(
    self.registration.showNotification(text(data.title, "keyturn: an action waits for you"), {
      body: text(data.body, ""),
      tag: text(data.tag, undefined),
      icon: "/card/icon.svg",
      data: { url: cardLink(data.url) },
      requireInteraction: true,
    }),
  );
});

self.addEventListener("notificationclick", (event) => {
  event.notification.close();
  const url = cardLink(event.notification.data && event.notification.data.url);
  event.waitUntil(self.clients.openWindow(url));
});
