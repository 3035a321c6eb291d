"""A small HTTP effect sink on loopback: records every POST by Idempotency-Key.
It is the ground truth for duplicate side effects.

Each record carries when it arrived and what it carried, so a checker can
order deliveries against decisions and compare them by content:
- `t_ns`: time.time_ns() (CLOCK_REALTIME), the clock the runtime's
  timestamps (approvals.decided_at, events.occurred_at) are written with;
  every process of a test or soak runs on this one machine, so one kernel
  clock. Comparable with the database as long as the clock is not stepped.
- `mono_ns`: CLOCK_MONOTONIC, system-wide on Linux (not per process, unlike
  what time.monotonic's docs allow in general): orders the sends among
  themselves even across a clock step.
- `body_sha256`: SHA-256 of the canonical JSON body (sorted keys), or of the
  raw bytes when the body is not JSON."""

from __future__ import annotations

import hashlib
import http.server
import json
import threading
import time
from pathlib import Path


class Sink:
    def __init__(self, log_path: Path | None = None):
        self.sends: list[dict] = []
        self.gets = 0
        self.behaviours: list[str] = []  # consumed one per request: "ok", "close", "delay:SECONDS"
        self.status = 200  # the status of a normal POST answer
        self.on_request = None  # called with the path when a request arrives (before any behaviour)
        # when no queued behaviour is left: called with a POST's record, returns its behaviour (None = "ok");
        # the chaos soak's seeded drops and delays (tests/chaos/soak.py)
        self.choose = None
        self.release = threading.Event()  # ends every pending delay at once
        self._lock = threading.Lock()
        self.log_path = log_path
        sink = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                t_ns, mono_ns = time.time_ns(), time.clock_gettime_ns(time.CLOCK_MONOTONIC)
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    body = json.loads(raw or b"null")
                    digest = hashlib.sha256(
                        json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
                    ).hexdigest()
                except ValueError:
                    body, digest = raw.decode("utf-8", "replace"), hashlib.sha256(raw).hexdigest()
                record = {
                    "key": self.headers.get("Idempotency-Key"),
                    "attempt": self.headers.get("X-Agentrt-Attempt"),
                    "path": self.path,
                    "body": body,
                    "body_sha256": digest,
                    "t_ns": t_ns,
                    "mono_ns": mono_ns,
                }
                behaviour = self._next_behaviour(record)
                if behaviour != "ok":
                    record["behaviour"] = behaviour  # what the client got: the checker counts dropped / late answers
                with sink._lock:
                    sink.sends.append(record)
                    if sink.log_path:
                        with open(sink.log_path, "a") as fh:
                            fh.write(json.dumps(record) + "\n")
                            fh.flush()
                if not self._play(behaviour):
                    return
                out = b'{"ok": true}'
                self.send_response(sink.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def _next_behaviour(self, record: dict | None = None) -> str:
                with sink._lock:
                    if sink.behaviours:
                        return sink.behaviours.pop(0)
                if record is not None and sink.choose is not None:
                    return sink.choose(record) or "ok"
                return "ok"

            def _misbehave(self) -> bool:
                return self._play(self._next_behaviour())

            def _play(self, behaviour: str) -> bool:
                """Play a behaviour; return whether to answer normally.
                `close`: the request arrived, the connection closes with no answer;
                `delay:S`: the answer comes only after S seconds (or `release`)."""
                if sink.on_request is not None:
                    sink.on_request(self.path)
                if behaviour == "close":
                    self.close_connection = True
                    return False
                if behaviour.startswith("delay:"):
                    sink.release.wait(float(behaviour.split(":", 1)[1]))
                return True

            def do_GET(self):
                with sink._lock:
                    sink.gets += 1
                if not self._misbehave():
                    return
                out = b'{"pong": true}'
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args):
                pass

        class Server(http.server.ThreadingHTTPServer):
            def handle_error(self, request, client_address):
                pass  # a client that gave up on a delayed answer: expected, not news

        self.server = Server(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.host = f"127.0.0.1:{self.port}"
        self.url = f"http://{self.host}/effect"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def count(self, key: str | None = None) -> int:
        with self._lock:
            return sum(1 for s in self.sends if key is None or s["key"] == key)

    def close(self):
        self.release.set()
        self.server.shutdown()
        self.server.server_close()
