"""A webhook receiver that verifies with the published Standard Webhooks
library (PyPI `standardwebhooks`), for keyturnd's end-to-end test.

    python standard_webhooks_receiver.py <whsec_ secret>

Listens on 127.0.0.1 (a free port) and prints one JSON line per event on
stdout: first {"port": N}, then for every request
{"path", "verified", "error", "headers", "body"}.

POST /                   Webhook(secret).verify(body, headers): 200, else 401
POST /later?seconds=N    the same, with the library's clock N seconds ahead:
                         a replay of the same request that much later
"""

import datetime
import json
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer
from urllib.parse import parse_qs, urlparse

import standardwebhooks.webhooks as library
from standardwebhooks import Webhook


class LaterClock(datetime.datetime):
    """The library reads the time through its module's `datetime`."""

    ahead = 0.0

    @classmethod
    def now(cls, tz=None):
        return datetime.datetime.now(tz) + datetime.timedelta(seconds=cls.ahead)


library.datetime = LaterClock
WEBHOOK = Webhook(sys.argv[1])


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        url = urlparse(self.path)
        LaterClock.ahead = 0.0
        if url.path == "/later":
            LaterClock.ahead = float(parse_qs(url.query).get("seconds", ["0"])[0])
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        headers = {k.lower(): v for k, v in self.headers.items()}
        try:
            WEBHOOK.verify(body, headers)
            verified, error = True, None
        except Exception as e:  # the library's refusal is the result
            verified, error = False, f"{type(e).__name__}: {e}"
        finally:
            LaterClock.ahead = 0.0
        print(json.dumps({"path": url.path, "verified": verified, "error": error,
                          "headers": headers, "body": body.decode()}), flush=True)
        self.send_response(200 if verified else 401)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


server = HTTPServer(("127.0.0.1", 0), Handler)
print(json.dumps({"port": server.server_address[1]}), flush=True)
server.serve_forever()
