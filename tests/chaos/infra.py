"""What the soak's deployment talks to besides PostgreSQL, each a process of
the soak's own that it restarts under load (issue 33 item 6):

- `EffectSink`: the HTTP effect sink (tests/sink.py) in its own process on a
  fixed port, logging every POST to sink.jsonl. `restart()` SIGKILLs it — the
  connections it holds are cut mid-request, so the calls waiting on them end
  with an unknown outcome — and starts it again on the same port, appending to
  the same log. Before a restart the soak arms it (SIGUSR1): the next POST is
  logged with `held_for_restart` and never answered, so at least one request
  is in flight when the sink dies.
- `PrivateRedis`: a `redis-server` on a free port (never the machine's shared
  one at 6379: other tests use it), the deployment's REDIS_URL (channel layer
  wake-ups, the throttles' cache). `restart()` SIGKILLs it and starts it again
  empty on the same port.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.chaos.procs import ROOT
from tests.conftest import free_port

SINK_SCRIPT = """
import json, random, signal, sys, threading, time
import http.server
from pathlib import Path
sys.path.insert(0, sys.argv[2])
cfg = json.loads(sys.argv[3])
_bind = http.server.HTTPServer.server_bind

def server_bind(self):  # tests/sink.py binds port 0; the soak's sink keeps its port across restarts
    self.server_address = (self.server_address[0], cfg["port"])
    _bind(self)

http.server.HTTPServer.server_bind = server_bind
from tests.sink import Sink
s = Sink(Path(sys.argv[1]))
hold = threading.Event()
signal.signal(signal.SIGUSR1, lambda *_: hold.set())  # armed for a restart: hold the next POST

def choose(record):
    if hold.is_set():
        hold.clear()
        record["held_for_restart"] = True
        return "delay:3600"
    if not (cfg["drop"] or cfg["delay"]):
        return None
    # seeded per (content, attempt), not per arrival order nor key (run ids are random), so a seed gives the
    # same POSTs the same fate whatever the timing
    u = random.Random(f"{cfg['seed']}:sink:{record.get('body_sha256')}:{record.get('attempt')}").random()
    if u < cfg["drop"]:
        return "close"
    if u < cfg["drop"] + cfg["delay"]:
        return f"delay:{cfg['delay_s']}"
    return None

s.choose = choose
print(s.port, flush=True)
while True:
    time.sleep(3600)
"""


class EffectSink:
    def __init__(self, out: Path, *, seed: int, drop: float, delay: float, delay_s: float):
        self.log_path = out / "sink.jsonl"
        self.stderr_path = out / "sink.stderr"
        self.port = free_port()
        self.host = f"127.0.0.1:{self.port}"
        self.cfg = {"seed": seed, "drop": drop, "delay": delay, "delay_s": delay_s, "port": self.port}
        self.proc: subprocess.Popen | None = None
        self.restarts: list[dict] = []
        self._offset = 0  # how far `new_records` has read the log

    def start(self) -> EffectSink:
        with open(self.stderr_path, "ab") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", SINK_SCRIPT, str(self.log_path), str(ROOT), json.dumps(self.cfg)],
                stdout=subprocess.PIPE,
                stderr=err,
                start_new_session=True,
            )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().decode().strip()  # printed once it listens
        if not line.isdigit():
            raise RuntimeError(f"the effect sink did not start (see {self.stderr_path})")
        return self

    def arm(self) -> None:
        """The next POST is held unanswered (and logged `held_for_restart`)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGUSR1)

    def new_records(self) -> list[dict]:
        """Records appended to the log since the last call (whole lines only)."""
        try:
            with open(self.log_path, "rb") as fh:
                fh.seek(self._offset)
                data = fh.read()
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n") + 1
        self._offset += end
        out = []
        for line in data[:end].splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out

    def restart(self) -> dict:
        """SIGKILL (every connection it holds is cut) and start again on the same port."""
        assert self.proc is not None
        t_kill = time.time()
        self.proc.kill()
        self.proc.wait()
        t_dead = time.time()
        for attempt in range(50):  # the port is ours (free_port picks below the ephemeral range); retry a bind race
            try:
                self.start()
                break
            except RuntimeError:
                if attempt == 49:
                    raise
                time.sleep(0.1)
        entry = {"t_kill": t_kill, "t_dead": t_dead, "t_ready": time.time()}
        self.restarts.append(entry)
        return entry

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class PrivateRedis:
    """redis-server on a free port, no persistence: a restart starts it empty."""

    def __init__(self, out: Path, binary: str = "redis-server"):
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.binary = binary
        self.dir = Path(tempfile.mkdtemp(prefix="agentrt-soak-redis-"))
        self.log_path = out / "redis.log"
        self.proc: subprocess.Popen | None = None
        self.restarts: list[dict] = []

    def start(self) -> PrivateRedis:
        argv = [
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(self.dir),
            "--logfile",
            str(self.log_path),
        ]
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.time() + 30
        while time.time() < deadline:
            if self.info("server") is not None:
                return self
            if self.proc.poll() is not None:
                break
            time.sleep(0.02)
        raise RuntimeError(f"redis-server did not start on port {self.port} (see {self.log_path})")

    def info(self, section: str = "clients") -> dict | None:
        """`INFO section` as a dict, or None when Redis does not answer."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                s.sendall(f"INFO {section}\r\n".encode())
                data = b""
                while True:
                    chunk = s.recv(65536)
                    if not chunk:
                        break
                    data += chunk
                    head, _, rest = data.partition(b"\r\n")
                    if head.startswith(b"$") and len(rest) >= int(head[1:]):
                        break
        except OSError:
            return None
        if not data.startswith(b"$"):
            return None
        out = {}
        for line in data.partition(b"\r\n")[2].decode(errors="replace").splitlines():
            k, sep, v = line.partition(":")
            if sep:
                out[k] = v
        return out

    def restart(self) -> dict:
        """SIGKILL and start again, empty, on the same port."""
        assert self.proc is not None
        before = {**(self.info("clients") or {}), **(self.info("stats") or {})}
        t_kill = time.time()
        self.proc.kill()
        self.proc.wait()
        self.start()
        entry = {
            "t_kill": t_kill,
            "t_ready": time.time(),
            "connected_clients_before": int(before.get("connected_clients") or 0),
            "commands_before": int(before.get("total_commands_processed") or 0),
        }
        self.restarts.append(entry)
        return entry

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for p in self.dir.glob("*"):
            p.unlink(missing_ok=True)
        try:
            os.rmdir(self.dir)
        except OSError:
            pass
