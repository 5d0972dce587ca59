"""A mail sink for the demo: an SMTP server (aiosmtpd) on loopback that
accepts every message keyturnd sends and prints one line per message: the
envelope recipients, the subject, and each attachment's name, type, size and
SHA-256, read back with Python's own MIME parser, the way a mail client would;
for a keyturn notification, the card link it carried.

    python mailsink.py --listen 127.0.0.1:2525

Bodies are not printed; it is a demo's window on what was delivered.
"""
import argparse
import asyncio
import email
import email.policy
import hashlib
import sys

from aiosmtpd.controller import Controller


class Sink:
    async def handle_DATA(self, server, session, envelope):
        msg = email.message_from_bytes(envelope.content, policy=email.policy.default)
        files = []
        for part in msg.iter_attachments():
            data = part.get_payload(decode=True) or b""
            files.append(
                f"{part.get_filename()} ({part.get_content_type()}, {len(data)} bytes, "
                f"sha256 {hashlib.sha256(data).hexdigest()[:16]}…)"
            )
        print(
            f"mail to {', '.join(envelope.rcpt_tos)}: {msg['subject']!r}, "
            f"Message-ID {msg['message-id']}, "
            f"{len(files)} attachment(s){': ' + '; '.join(files) if files else ''}",
            flush=True,
        )
        # A keyturn notification: the card link it carried.
        text = msg.get_body(preferencelist=("plain",))
        for line in (text.get_content() if text else "").splitlines():
            if line.startswith("Open the card: "):
                print(f"  card link: {line.removeprefix('Open the card: ')}", flush=True)
        return "250 OK"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--listen", required=True, help="host:port")
    args = parser.parse_args()
    host, port = args.listen.rsplit(":", 1)
    controller = Controller(Sink(), hostname=host, port=int(port))
    controller.start()
    print(f"mail sink listening on {host}:{port}", flush=True)
    try:
        asyncio.get_event_loop().run_forever()
    except KeyboardInterrupt:
        pass
    finally:
        controller.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
