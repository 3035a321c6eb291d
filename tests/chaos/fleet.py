"""The soak's deployment as a set of roles to kill, and its web clients.

Roles to kill (issue 14, item 2 — no carve-outs): a worker holding a lease,
an idle worker, django-q2's pusher, monitor and sentinel, the `qcluster` main
process, `run_maintenance`, a web node (daphne serving submits) and a
PostgreSQL backend of the deployment (`pg_terminate_backend`), from the
moment each is started (issue 33 item 6: no grace period after a start).
Roles to stop (SIGSTOP, then SIGCONT after a while): a worker holding a
lease, an idle worker, or a whole qcluster node. The cluster's processes are
told apart by their kernel names (runs/qheal.py names them qc-sentinel,
qc-worker, qc-pusher, qc-monitor).

Runs submitted over HTTP go to the web nodes with an `Idempotency-Key`; a
submit that got no answer (its node was killed, a backend terminated, the
database restarting) is sent again with the same key, to any web node, until
one answers: the replay answers 200 with the original run, so nothing is
created twice (the checker counts the runs in the database against the
submits).
"""

from __future__ import annotations

import json
import random
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import Future, ThreadPoolExecutor

from tests.procfs import children, comm

ROLES = ("busy_worker", "idle_worker", "pusher", "monitor", "sentinel", "main", "maintenance", "web", "backend")
DEFAULT_MIX = "busy_worker=28,idle_worker=20,pusher=12,monitor=12,sentinel=4,main=4,maintenance=5,web=5,backend=10"
# what a random SIGSTOP freezes: a worker holding a lease, an idle worker, or a whole qcluster node (its main
# process, sentinel, pusher, monitor and workers at once, as a paused VM or a stalled host would)
STOP_ROLES = ("busy_worker", "idle_worker", "node")
STOP_MIX = "busy_worker=2,idle_worker=1,node=1"


def parse_mix(text: str, known: tuple[str, ...] = ROLES) -> dict[str, float]:
    mix = {}
    for part in text.split(","):
        if not part.strip():
            continue
        name, _, weight = part.partition("=")
        name = name.strip()
        if name not in known:
            raise SystemExit(f"unknown role {name!r} in the mix; known: {', '.join(known)}")
        mix[name] = float(weight or 1)
    if not any(mix.values()):
        raise SystemExit("the mix gives every role weight 0")
    return mix


def node_roles(main_pid: int) -> dict[str, list[int]]:
    """{kernel name: [pids]} of the live processes under a qcluster main process."""
    out: dict[str, list[int]] = {}
    for sentinel in children(main_pid):
        out.setdefault(comm(sentinel), []).append(sentinel)
        for pid in children(sentinel):
            out.setdefault(comm(pid), []).append(pid)
    return out


class WebSubmitter:
    """Submits runs over HTTP to the web nodes from a few threads, retrying
    with the same Idempotency-Key until some node answers."""

    def __init__(
        self,
        ports: list[int],
        token: str,
        seed: int,
        threads: int = 4,
        timeout: float = 10.0,
        give_up_after: float = 300.0,
    ):
        self.ports = ports
        self.token = token
        self.seed = seed
        self.timeout = timeout
        self.give_up_after = give_up_after
        self.pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="soak-web")
        self.lock = threading.Lock()
        self.in_flight: dict[int, int] = {p: 0 for p in ports}  # node index -> requests in flight
        self.log: list[dict] = []

    def submit(self, index: int, agent: str, text: str, key: str) -> Future:
        return self.pool.submit(self._post, index, agent, text, key)

    def busy(self, node: int) -> bool:
        with self.lock:
            return self.in_flight.get(node, 0) > 0

    def _post(self, index: int, agent: str, text: str, key: str) -> dict:
        rng = random.Random(f"{self.seed}:web:{index}")
        body = json.dumps({"agent": agent, "input": text}).encode()
        attempts = []
        t0 = time.time()
        while True:
            node = rng.randrange(len(self.ports))
            req = urllib.request.Request(
                f"http://127.0.0.1:{self.ports[node]}/api/runs/",
                data=body,
                method="POST",
                headers={
                    "Content-Type": "application/json",
                    "Authorization": f"Token {self.token}",
                    "Idempotency-Key": key,
                },
            )
            with self.lock:
                self.in_flight[node] = self.in_flight.get(node, 0) + 1
            t = time.time()
            try:
                with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                    status, payload = resp.status, json.loads(resp.read() or b"{}")
            except urllib.error.HTTPError as exc:
                status, payload = exc.code, _json(exc.read())
            except (OSError, ValueError) as exc:  # refused, reset, timed out, cut mid-answer: no answer
                status, payload = None, {"error": type(exc).__name__}
            finally:
                with self.lock:
                    self.in_flight[node] -= 1
            attempts.append({"node": node, "status": status, "t": t, "s": round(time.time() - t, 3)})
            if status in (200, 201):
                entry = {
                    "index": index,
                    "run": payload["id"],
                    "created": status == 201,
                    "attempts": attempts,
                    "key": key,
                }
                with self.lock:
                    self.log.append(entry)
                return entry
            if status is not None and status < 500 and status != 429:
                entry = {"index": index, "run": None, "error": payload, "attempts": attempts, "key": key}
                with self.lock:
                    self.log.append(entry)
                return entry  # a refusal is an answer: the soak reports it (it would be a bug here)
            if time.time() - t0 > self.give_up_after:
                entry = {"index": index, "run": None, "error": "no web node answered", "attempts": attempts, "key": key}
                with self.lock:
                    self.log.append(entry)
                return entry
            time.sleep(0.3)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


def _json(data: bytes) -> dict:
    try:
        return json.loads(data or b"{}")
    except ValueError:
        return {"body": data[:200].decode(errors="replace")}
