"""A webhook receiver on loopback, as a subscriber would write one: it
verifies the signature, dedupes on X-Agentrt-Delivery, and answers as the
test scripts it. Every request is recorded (headers, raw body, arrival
order), so tests can count attempts per delivery id."""

from __future__ import annotations

import hashlib
import hmac
import http.server
import json
import threading
import time


def verify(secret: str, header: str, body: bytes, tolerance: float | None = 300) -> bool:
    """The README's five lines, as a receiver runs them."""
    parts = dict(p.split("=", 1) for p in header.split(","))
    expected = hmac.new(secret.encode(), f"{parts['t']}.".encode() + body, hashlib.sha256).hexdigest()
    fresh = tolerance is None or abs(time.time() - int(parts["t"])) <= tolerance
    return hmac.compare_digest(expected, parts["v1"]) and fresh


class Receiver:
    def __init__(self, secret: str | None = None):
        self.secret = secret
        self.requests: list[dict] = []
        self.processed: dict[str, dict] = {}  # delivery id -> the event, once (the receiver's dedupe)
        self.script: list[str] = []  # consumed one per request: "200", "500", "redirect:<url>", "hold"
        self.held = threading.Event()  # set when a "hold" request arrived
        self.release = threading.Event()  # ends every hold (the connection is then closed without an answer)
        self._lock = threading.Lock()
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with receiver._lock:
                    answer = receiver.script.pop(0) if receiver.script else "200"
                    record = {
                        "path": self.path,
                        "headers": {k.lower(): v for k, v in self.headers.items()},
                        "body": body,
                        "answer": answer,
                        "at": time.monotonic(),
                        "wall": time.time(),
                    }
                    receiver.requests.append(record)
                if answer == "hold":
                    receiver.held.set()
                    receiver.release.wait(60)
                    self.close_connection = True
                    return
                if answer.startswith("redirect:"):
                    self.send_response(302)
                    self.send_header("Location", answer.split(":", 1)[1])
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                code = int(answer)
                if code == 200:
                    delivery = self.headers.get("X-Agentrt-Delivery")
                    with receiver._lock:
                        receiver.processed.setdefault(delivery, json.loads(body))
                out = b"{}"
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args):
                pass

        class Server(http.server.ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request, client_address):
                pass  # a sender killed mid-request: expected here

        self.server = Server(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.host = f"127.0.0.1:{self.port}"
        self.url = f"http://{self.host}/hook"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def types(self) -> list[str]:
        with self._lock:
            return [json.loads(r["body"])["type"] for r in self.requests]

    def of_type(self, event_type: str) -> list[dict]:
        with self._lock:
            return [r for r in self.requests if json.loads(r["body"])["type"] == event_type]

    def close(self):
        self.release.set()
        self.server.shutdown()
        self.server.server_close()
