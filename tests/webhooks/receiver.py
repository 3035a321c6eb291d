"""A webhook receiver on loopback, as a subscriber would write one: it
verifies the signature, dedupes on X-Agentrt-Delivery, and answers as the
test scripts it. Every request is recorded (headers, raw body, arrival
order), so tests can count attempts per delivery id."""

from __future__ import annotations

import hashlib
import hmac
import http.server
import json
import select
import socket
import ssl
import threading
import time

TRICKLE_BYTES = 600  # at TRICKLE_INTERVAL: half a minute, far beyond the timeouts the tests set
TRICKLE_INTERVAL = 0.05


def verify(secret: str, headers: dict, body: bytes, tolerance: float | None = 300) -> bool:
    """The README's lines (scheme v2), as a receiver runs them: `headers` as
    recorded here (lower-case names)."""
    parts = dict(p.split("=", 1) for p in headers["x-agentrt-signature"].split(","))
    fields = (parts["t"], headers["x-agentrt-delivery"], headers["x-agentrt-event"], headers["x-agentrt-attempt"])
    signed = "".join(f"{value}\n" for value in fields).encode() + body
    expected = hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()
    fresh = tolerance is None or abs(time.time() - int(parts["t"])) <= tolerance
    return "v2" in parts and hmac.compare_digest(expected, parts["v2"]) and fresh


class Receiver:
    def __init__(self, secret: str | None = None, tls: ssl.SSLContext | None = None):
        self.secret = secret
        self.requests: list[dict] = []
        self.processed: dict[str, dict] = {}  # delivery id -> the event, once (the receiver's dedupe)
        # Consumed one per request: "200", "500", "redirect:<url>", "hold", "slow", "trickle", "trickle-headers".
        self.script: list[str] = []
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
                if answer == "slow":  # answer 200 only once the sender has given up on this request
                    record["sender_left"] = receiver.sender_leaves(self.connection)
                    receiver.answer_raw(self.connection, b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
                    self.close_connection = True
                    return
                if answer in ("trickle", "trickle-headers"):
                    # A 200 whose headers (or body) come one byte at a time, each byte well within any socket
                    # timeout, for up to TRICKLE_BYTES bytes; until the sender hangs up.
                    if answer == "trickle":
                        start = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % TRICKLE_BYTES
                    else:
                        start = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-Trickle: "
                    left = not receiver.answer_raw(self.connection, start)
                    sent = 0
                    while not left and sent < TRICKLE_BYTES and not receiver.release.is_set():
                        receiver.release.wait(TRICKLE_INTERVAL)  # the trickle's pace
                        left = not receiver.answer_raw(self.connection, b"a")
                        sent += 1
                    if not left and answer == "trickle-headers":
                        receiver.answer_raw(self.connection, b"\r\n\r\n{}")  # the sender waited it out
                    record["trickled"] = sent
                    record["sender_left"] = left  # set last: a test waits for it
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
        if tls is not None:  # HTTPS: each accepted connection's handshake (a failed one drops the connection)
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        self.host = f"127.0.0.1:{self.port}"
        self.url = f"{'https' if tls else 'http'}://{self.host}/hook"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    @staticmethod
    def sender_leaves(sock: socket.socket, within: float = 60) -> bool:
        """Wait until the sender closes its end of `sock` (True), or `within` seconds pass (False)."""
        ready, _, _ = select.select([sock], [], [], within)
        if not ready:
            return False
        try:
            return sock.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True  # reset: gone too

    @staticmethod
    def answer_raw(sock: socket.socket, data: bytes) -> bool:
        """Send `data` as is; False when the sender has hung up."""
        try:
            sock.sendall(data)
            return True
        except OSError:
            return False

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
