"""A local fake payment gateway (the outside system of the example), in memory.

    python -m examples.payments.fake_gateway --port 8099

Charges are kept by idempotency key: a second POST with a key answers the
first charge unchanged. `mode` shapes what a new charge looks like, so the
reconciler's answers can each be reached: `normal` (succeeded), `review`
(held as `pending_review`) and `tamper` (recorded for one cent more than
asked: the world contradicts the journal).
"""

from __future__ import annotations

import argparse
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit


class FakeGateway:
    def __init__(self, host: str = "127.0.0.1", port: int = 0):
        self.charges: dict[str, dict] = {}
        self.posts: list[dict] = []  # every POST, replays included
        self.mode = "normal"
        self._lock = threading.Lock()
        gateway = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _send(self, status: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self):
                key = self.headers.get("Idempotency-Key") or ""
                body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)) or b"{}")
                if urlsplit(self.path).path != "/charges" or not key:
                    return self._send(400, {"error": "POST /charges with an Idempotency-Key"})
                with gateway._lock:
                    gateway.posts.append({"key": key, **body})
                    charge = gateway.charges.get(key)
                    if charge is None:
                        charge = {
                            "id": f"ch_{len(gateway.charges) + 1}",
                            "idempotency_key": key,
                            "customer": body.get("customer"),
                            "amount_cents": body.get("amount_cents") + (1 if gateway.mode == "tamper" else 0),
                            "currency": body.get("currency"),
                            "status": "pending_review" if gateway.mode == "review" else "succeeded",
                        }
                        gateway.charges[key] = charge
                self._send(201, charge)

            def do_GET(self):
                parts = urlsplit(self.path)
                key = (parse_qs(parts.query).get("idempotency_key") or [""])[0]
                with gateway._lock:
                    charge = gateway.charges.get(key)
                if parts.path != "/charges" or charge is None:
                    return self._send(404, {"error": "no such charge"})
                self._send(200, charge)

        class Server(ThreadingHTTPServer):
            daemon_threads = True

        self.server = Server((host, port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> FakeGateway:
        self.thread.start()
        return self

    def settle(self, key: str) -> None:
        """The reviewer lets a held charge through."""
        with self._lock:
            self.charges[key]["status"] = "succeeded"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8099)
    parser.add_argument("--mode", choices=("normal", "review", "tamper"), default="normal")
    options = parser.parse_args()
    fake = FakeGateway(port=options.port)
    fake.mode = options.mode
    print(f"fake gateway on {fake.url} (mode {fake.mode})", flush=True)
    fake.server.serve_forever()
