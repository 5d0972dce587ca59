"""A loopback receiver for keyturnd's notifications, checked with libraries
that are not keyturnd's: the published Standard Webhooks library (PyPI
`standardwebhooks`) for webhooks, and for Web Push `py_vapid` (the VAPID
signature) and `http_ece` (the aes128gcm body, decrypted with the
subscription's own private key, which only this script holds).

    python notify_receiver.py <whsec_ secret> <webhook|push|both>

Listens on 127.0.0.1 (a free port) and prints one JSON line per event on
stdout: first {"port": N, "subscription": {...}} (a PushSubscription's JSON
whose endpoint is this server, with "push" or "both"), then for every
request one of

  {"kind": "webhook", "path", "verified", "error", "slack", "headers", "body"}
      POST /hook...: Webhook(secret).verify(body, headers); "slack" is the
      list of what makes the body not a Slack incoming-webhook message with
      one "Open the card" button (empty: it is one). 200 if verified, else 401.
  {"kind": "push", "path", "vapid", "claims", "error", "payload", "headers"}
      POST /push/...: the Authorization header's VAPID JWT verified against
      its k= key (py_vapid), its claims; the body decrypted (http_ece) and
      parsed as JSON. 201 if both hold, else 400.
"""

import base64
import json
import os
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SECRET = sys.argv[1]
MODE = sys.argv[2] if len(sys.argv) > 2 else "webhook"

if MODE in ("webhook", "both"):
    from standardwebhooks import Webhook

    WEBHOOK = Webhook(SECRET)

if MODE in ("push", "both"):
    import http_ece
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from py_vapid import Vapid02

    PRIVATE = ec.generate_private_key(ec.SECP256R1())
    PUBLIC = PRIVATE.public_key().public_bytes(
        serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint
    )
    AUTH = os.urandom(16)


def b64url(raw):
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def unb64url(text):
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def slack_problems(body):
    """What keeps `body` from being a Slack incoming-webhook message whose
    one link is an "Open the card" button (Block Kit's rules for what is
    used here)."""
    problems = []
    if not isinstance(body.get("text"), str) or not body["text"]:
        problems.append("no fallback text")
    blocks = body.get("blocks")
    if not isinstance(blocks, list) or not blocks or len(blocks) > 50:
        return problems + ["blocks must be a list of 1 to 50 blocks"]
    buttons = []
    for block in blocks:
        kind = block.get("type")
        if kind == "section":
            text = block.get("text") or {}
            if text.get("type") not in ("plain_text", "mrkdwn") or not isinstance(text.get("text"), str):
                problems.append("a section without a text object")
            elif not 1 <= len(text["text"]) <= 3000:
                problems.append("a section's text is not 1 to 3000 characters")
        elif kind == "actions":
            for element in block.get("elements") or []:
                if element.get("type") != "button":
                    problems.append("an actions element that is not a button")
                    continue
                label = element.get("text") or {}
                if label.get("type") != "plain_text" or not label.get("text"):
                    problems.append("a button without a plain_text label")
                if not isinstance(element.get("url"), str) or len(element["url"]) > 3000:
                    problems.append("a button without a url")
                buttons.append(element)
        elif kind == "context":
            for element in block.get("elements") or []:
                if element.get("type") not in ("plain_text", "mrkdwn", "image"):
                    problems.append("a context element of another type")
        else:
            problems.append(f"a block of type {kind!r}")
    if len(buttons) != 1 or (buttons and buttons[0].get("text", {}).get("text") != "Open the card"):
        problems.append("not exactly one 'Open the card' button")
    return problems


def vapid(header, endpoint_origin):
    """(verified, claims, error) of an RFC 8292 `vapid t=…, k=…` header."""
    scheme, _, params = (header or "").partition(" ")
    if scheme.lower() != "vapid":
        return False, None, "not a vapid Authorization header"
    parts = dict(p.strip().split("=", 1) for p in params.split(",") if "=" in p)
    if "t" not in parts or "k" not in parts:
        return False, None, "t= or k= missing"
    signed, _, signature = parts["t"].rpartition(".")
    key = Vapid02.from_raw_public(parts["k"].encode())
    if not key.verify_token(validation_token=signed.encode(), verification_token=signature):
        return False, None, "the JWT signature does not verify"
    header_b64, payload_b64 = signed.split(".")
    if json.loads(unb64url(header_b64)).get("alg") != "ES256":
        return False, None, "the JWT is not ES256"
    claims = json.loads(unb64url(payload_b64))
    if claims.get("aud") != endpoint_origin:
        return False, claims, f"aud {claims.get('aud')!r} is not {endpoint_origin!r}"
    return True, claims, None


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        headers = {k.lower(): v for k, v in self.headers.items()}
        if self.path.startswith("/push/"):
            self.push(body, headers)
        else:
            self.webhook(body, headers)

    def webhook(self, body, headers):
        try:
            WEBHOOK.verify(body, headers)
            verified, error = True, None
        except Exception as e:  # the library's refusal is the result
            verified, error = False, f"{type(e).__name__}: {e}"
        try:
            slack = slack_problems(json.loads(body))
        except Exception as e:
            slack = [f"not JSON: {e}"]
        self.emit(
            {"kind": "webhook", "path": self.path, "verified": verified, "error": error,
             "slack": slack, "headers": headers, "body": body.decode()},
            200 if verified else 401,
        )

    def push(self, body, headers):
        origin = f"http://127.0.0.1:{self.server.server_address[1]}"
        ok, claims, error = vapid(headers.get("authorization"), origin)
        payload = None
        try:
            if headers.get("content-encoding") != "aes128gcm":
                raise ValueError(f"content-encoding {headers.get('content-encoding')!r}")
            plain = http_ece.decrypt(body, private_key=PRIVATE, auth_secret=AUTH, version="aes128gcm")
            payload = json.loads(plain)
        except Exception as e:
            error = error or f"decrypt: {type(e).__name__}: {e}"
        self.emit(
            {"kind": "push", "path": self.path, "vapid": ok, "claims": claims, "error": error,
             "payload": payload, "headers": headers},
            201 if ok and payload is not None else 400,
        )

    def emit(self, event, status):
        print(json.dumps(event), flush=True)
        self.send_response(status)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
port = server.server_address[1]
first = {"port": port}
if MODE in ("push", "both"):
    first["subscription"] = {
        "endpoint": f"http://127.0.0.1:{port}/push/{b64url(os.urandom(12))}",
        "expirationTime": None,
        "keys": {"p256dh": b64url(PUBLIC), "auth": b64url(AUTH)},
    }
print(json.dumps(first), flush=True)
server.serve_forever()
