#!/usr/bin/env python
"""Latency where users feel it (issue 16 item 4), through real processes.

    python bench/latency.py                         # all three parts
    python bench/latency.py --only first-call       # or ws, takeover (comma-separated)
    python bench/latency.py --samples 100 --takeovers 5 --lease 30

Drops and re-creates a bench database (its name must contain "bench", else
"_bench" is appended: agentrt_latency -> agentrt_latency_bench), loads three
scripted agents and starts the processes users run: `manage.py qcluster`
(2 workers), daphne, `manage.py run_maintenance`, with and without Redis.

1. **submit -> first model call.** One run at a time on an idle warm cluster,
   submitted alternately over REST (`POST /api/runs/` to daphne, a knox token)
   and through `runs.services.run_submit` in this process. The agent's model is
   the `openai` provider pointed (AGENTRT_MODEL_ENDPOINTS) at a chat-completions
   server in this process, which notes when each request arrives: the clock
   starts before the submit and stops when the model is called (both clocks are
   this host's CLOCK_REALTIME). Split by the run's events into submit
   (-> run.created), doorbell (run.created -> run.claimed), startup
   (run.claimed -> model.request.started) and the first commit (-> arrival).
2. **commit -> WebSocket frame**, with Redis (REDIS_URL for daphne and the
   workers: the channel layer wakes the socket) and without (the in-memory
   layer, which does not cross processes: the socket's poll of the events
   table delivers). Two measurements each: (a) the events of real runs whose
   scripted model waits 150 ms a step, from each event's `occurred_at` (taken
   just before its commit: an upper bound of commit -> frame) to the frame's
   arrival; (b) marker events this process commits through the store
   (`record_events`, whose post-commit hook is the workers'), from COMMIT's
   return to the frame's arrival.
3. **takeover after SIGKILL.** A run whose first model call hangs; at a random
   point of the heartbeat cycle the worker holding its lease (its pid is in
   `lease_owner`) is SIGKILLed; measured: kill -> `lease.taken_over` (the
   reclaim sweep of `run_maintenance`, every lease/6 s) and kill -> the next
   model call (another worker drives the run on). Target: lease + sweep interval.

Prints one JSON object on stdout and a table on stderr. Timings are reported,
never asserted. Run it with nothing else benchmarking on the machine.
"""

from __future__ import annotations

import argparse
import datetime as dt
import http.client
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import psycopg
from websockets.sync.client import connect

sys.path.insert(0, str(Path(__file__).resolve().parent))
import steps as bench

ROOT = bench.ROOT
REDIS = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
PASSWORD = "bench-latency-pw"
MODEL = "bench-model"


def log(*a) -> None:
    print(*a, file=sys.stderr, flush=True)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--only", default="first-call,ws,takeover", help="parts to run (comma-separated)")
    p.add_argument("--samples", type=int, default=100, help="submits measured for part 1 (half REST, half Python)")
    p.add_argument("--markers", type=int, default=60, help="marker commits per WebSocket mode (part 2b)")
    p.add_argument("--ws-runs", type=int, default=3, help="runs streamed per WebSocket mode (part 2a)")
    p.add_argument("--takeovers", type=int, default=5, help="SIGKILLs for part 3")
    p.add_argument("--lease", type=float, default=30.0, help="AGENTRT_LEASE_SECONDS for part 3 (default 30)")
    p.add_argument("--workers", type=int, default=2, help="qcluster workers (default 2)")
    p.add_argument(
        "--database-url",
        default=os.environ.get("DATABASE_URL") or bench.DEFAULT_URL,
        help="PostgreSQL URL; the database (name + '_bench' unless it contains 'bench') is DROPPED and re-created",
    )
    p.add_argument("--logs", default=None, help="directory for the processes' logs (default: a temp directory)")
    a = p.parse_args(argv)
    a.only = {x.strip() for x in a.only.split(",") if x.strip()}
    unknown = a.only - {"first-call", "ws", "takeover"}
    if unknown:
        p.error(f"--only: unknown part(s) {sorted(unknown)}")
    return a


# ------------------------------------------------------------------ the model


class ModelServer:
    """A chat-completions endpoint that answers every request at once with a
    streamed "done", and notes when each request arrived, by the text of its
    last user message (the run's input)."""

    def __init__(self):
        self.arrivals: dict[str, float] = {}
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_POST(self):
                at = time.time()
                body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)))
                users = [m.get("content") for m in body.get("messages", []) if m.get("role") == "user"]
                with server.lock:
                    server.arrivals.setdefault(str(users[-1]) if users else "", at)
                events = [
                    {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]},
                    {"choices": [{"index": 0, "delta": {"content": "done"}, "finish_reason": None}]},
                    {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
                    {"choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 11}},
                ]
                data = "".join(f"data: {json.dumps({'object': 'chat.completion.chunk', **e})}\n\n" for e in events)
                data = (data + "data: [DONE]\n\n").encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Content-Length", str(len(data)))
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(data)
                self.close_connection = True

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def env(self) -> dict:
        port = self.httpd.server_address[1]
        return {
            "AGENTRT_MODEL_ENDPOINTS": json.dumps(
                {"bench": {"provider": "openai", "base_url": f"http://127.0.0.1:{port}/v1", "api_key_env": "BENCH_KEY"}}
            ),
            "AGENTRT_MODEL_PRICES": json.dumps({MODEL: {"input_per_mtok": 0, "output_per_mtok": 0}}),
            "BENCH_KEY": "bench-not-a-secret",
        }

    def arrival(self, text: str) -> float | None:
        with self.lock:
            return self.arrivals.get(text)

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


# ------------------------------------------------------------------ processes


def child_env(url: str, *, redis: bool, **extra) -> dict:
    env = dict(os.environ)
    env.pop("REDIS_URL", None)
    env.update(
        {
            "DATABASE_URL": url,
            "AGENTRT_LOG_LEVEL": os.environ.get("AGENTRT_LOG_LEVEL", "WARNING"),
            "PYTHONUNBUFFERED": "1",
            "DJANGO_ALLOWED_HOSTS": "127.0.0.1,localhost",
        }
    )
    if redis:
        env["REDIS_URL"] = REDIS
        env["AGENTRT_CACHE_PREFIX"] = f"agentrt-latency-bench-{os.getpid()}"
    env.update({k: str(v) for k, v in extra.items()})
    return env


class Proc:
    """One child process in its own session, logged to a file."""

    def __init__(self, args: list[str], env: dict, log_path: Path):
        self.log_path = log_path
        self.log = open(log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, *args],
            cwd=ROOT,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        """SIGTERM to the main process (qcluster's sentinel then stops its
        children in order), then SIGKILL to whatever is left of the session."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        self.log.close()

    def tail(self, n: int = 30) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(condition, timeout: float, what: str, every: float = 0.01, procs=()):
    end = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        for p in procs:
            if not p.alive():
                raise SystemExit(f"{what}: a process exited (rc={p.proc.returncode}):\n{p.tail()}")
        if time.monotonic() > end:
            raise SystemExit(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(every)


class Deployment:
    """qcluster + daphne (+ run_maintenance) on the bench database, with or without Redis."""

    def __init__(self, url: str, logs: Path, *, redis: bool, workers: int, maintenance: bool = False, **extra):
        tag = "redis" if redis else "noredis"
        env = child_env(url, redis=redis, AGENTRT_WORKERS=workers, **extra)
        self.port = free_port()
        self.procs = [
            Proc(["manage.py", "qcluster"], env, logs / f"qcluster-{tag}.log"),
            Proc(
                ["-m", "daphne", "-b", "127.0.0.1", "-p", str(self.port), "agentrt_site.asgi:application"],
                env,
                logs / f"daphne-{tag}.log",
            ),
        ]
        if maintenance:
            self.procs.append(Proc(["manage.py", "run_maintenance"], env, logs / f"maintenance-{tag}.log"))

        def listening():
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return True
            except OSError:
                return False

        wait_until(listening, 60, "daphne to listen", every=0.1, procs=self.procs)

    def stop(self) -> None:
        for p in self.procs:
            p.stop()


# ------------------------------------------------------------------ the product


def agents() -> dict:
    limits = {"max_steps": 50, "max_model_calls": 60, "max_tool_calls": 60, "deadline_seconds": 3600}
    return {
        # part 2a: a model that takes 150 ms a step, so commits are spread out
        # (each step's arguments differ: identical calls would trip the tool-loop breaker at the third)
        "ticker": [
            {"tool_calls": [{"name": "echo", "arguments": {"text": f"tick {i}"}}], "delay_ms": 150} for i in range(12)
        ]
        + [{"text": "done"}],
        # part 3: the first attempt of the first call hangs (the worker is killed in it); the retry answers
        "hang": [{"attempts": [{"text": "never", "delay_ms": 600_000}, {"text": "done"}]}],
    }, limits


def setup(url: str, model: ModelServer):
    bench.recreate_database(url)
    os.environ.update(model.env())  # this process validates the agents' endpoint and price
    bench.django_setup(url)
    # here, not at the top: the script sets Django up at run time, before the project's modules load
    from django.core.management import call_command
    from knox.models import AuthToken

    from runs.services import agent_load, tenant_create

    call_command("migrate", verbosity=0, interactive=False)
    tenant, user = tenant_create(name="bench", username="bench", password=PASSWORD)
    turns, limits = agents()
    for name, script in turns.items():
        agent_load(
            tenant=tenant,
            definition={
                "name": name,
                "instructions": "latency benchmark agent",
                "model": {"provider": "scripted", "turns": script},
                "tools": ["echo"],
                "limits": limits,
            },
        )
    # part 1: the model is an HTTP endpoint that answers at once
    agent_load(
        tenant=tenant,
        definition={
            "name": "first",
            "instructions": "latency benchmark agent",
            "model": {"provider": "openai", "endpoint": "bench", "model": MODEL},
            "tools": [],
            "limits": limits,
        },
    )
    token = AuthToken.objects.create(user=user)[1]
    bench.close_django()
    return tenant, token


class DB:
    """Reads on one autocommit connection of this process (not Django's)."""

    def __init__(self, url: str):
        self.conn = psycopg.connect(url, autocommit=True)

    def one(self, sql: str, params=()):
        return self.conn.execute(sql, params).fetchone()

    def events(self, run_id, types) -> dict[str, list[float]]:
        out: dict[str, list[float]] = {}
        for typ, at in self.conn.execute(
            "SELECT type, occurred_at FROM events WHERE run_id = %s AND type = ANY(%s) ORDER BY sequence",
            [run_id, list(types)],
        ).fetchall():
            out.setdefault(typ, []).append(at.timestamp())
        return out

    def status(self, run_id) -> str:
        return self.one("SELECT status FROM runs WHERE id = %s", [run_id])[0]

    def close(self) -> None:
        self.conn.close()


def rest_submit(port: int, token: str, agent: str, text: str) -> tuple[str, float]:
    body = json.dumps({"agent": agent, "input": text})
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        c.request(
            "POST",
            "/api/runs/",
            body=body,
            headers={"Content-Type": "application/json", "Authorization": f"Token {token}"},
        )
        r = c.getresponse()
        data = r.read()
        if r.status != 201:
            raise SystemExit(f"POST /api/runs/ answered {r.status}: {data[:300]!r}")
        return json.loads(data)["id"], time.time()
    finally:
        c.close()


def stats(values: list[float]) -> dict | None:
    if not values:
        return None
    return {
        "p50": round(statistics.median(values), 1),
        "p95": round(bench.pct(values, 0.95), 1),
        "min": round(min(values), 1),
        "max": round(max(values), 1),
        "n": len(values),
    }


# ------------------------------------------------------------------ 1. submit -> first model call


def part_first_call(args, url: str, tenant, token: str, logs: Path, model: ModelServer) -> dict:
    # here, not at the top: the script sets Django up at run time, before the project's modules load
    from runs.services import run_submit

    dep = Deployment(url, logs, redis=True, workers=args.workers)
    db = DB(url)
    parts = ("total", "submit", "doorbell", "startup", "first_commit", "answer")
    samples: dict[str, dict[str, list[float]]] = {v: {k: [] for k in parts} for v in ("rest", "python")}
    tag = f"{os.getpid()}-{int(time.time())}"
    try:
        # warm-up: every worker has imported the runtime and holds its connections
        for i in range(2 * args.workers):
            rid, _ = rest_submit(dep.port, token, "first", f"warm {tag} {i}")
            wait_until(lambda rid=rid: db.status(rid) == "COMPLETED", 120, "the warm-up run", procs=dep.procs)
        time.sleep(1.0)
        for i in range(args.samples):
            via = "rest" if i % 2 == 0 else "python"
            text = f"sample {tag} {i}"
            time.sleep(random.uniform(0.2, 0.8))  # a random phase of the pusher's fallback wait
            if via == "python":  # a caller in a Django process holds its connection (CONN_MAX_AGE): not timed
                # here, not at the top: the script sets Django up at run time, before the project's modules load
                from django.db import connection

                connection.ensure_connection()
            t0 = time.time()
            if via == "rest":
                rid, t_answer = rest_submit(dep.port, token, "first", text)
            else:
                run, _ = run_submit(tenant=tenant, agent="first", input=text)
                rid, t_answer = str(run.id), time.time()
                bench.close_django()
            wait_until(lambda rid=rid: db.status(rid) == "COMPLETED", 120, f"run {rid}", procs=dep.procs)
            called = model.arrival(text)
            ev = db.events(rid, ("run.created", "run.claimed", "model.request.started"))
            created, claimed, started = ev["run.created"][0], ev["run.claimed"][0], ev["model.request.started"][0]
            s = samples[via]
            s["total"].append((called - t0) * 1e3)
            s["submit"].append((created - t0) * 1e3)
            s["doorbell"].append((claimed - created) * 1e3)
            s["startup"].append((started - claimed) * 1e3)
            s["first_commit"].append((called - started) * 1e3)
            s["answer"].append((t_answer - t0) * 1e3)
    finally:
        db.close()
        dep.stop()
    return {
        "target_ms": 50,
        "total_ms": stats(samples["rest"]["total"] + samples["python"]["total"]),
        **{via: {k: stats(v) for k, v in s.items()} for via, s in samples.items()},
        "note": (
            "total = request sent (REST) or run_submit called (python) -> the model server received the call; "
            "submit = -> run.created (its occurred_at, inside the submit's transaction); doorbell = run.created -> "
            "run.claimed; startup = run.claimed -> model.request.started (taken before the step's first commit); "
            "first_commit = -> the call arrived; answer = until the submit returned"
        ),
    }


# ------------------------------------------------------------------ 2. commit -> WebSocket frame


class Socket:
    """A real WebSocket client on `ws/runs/{id}/`, recording each frame's arrival."""

    def __init__(self, port: int, token: str, run_id: str, after: int = 0):
        self.ws = connect(
            f"ws://127.0.0.1:{port}/ws/runs/{run_id}/?after={after}",
            origin=f"http://127.0.0.1:{port}",
            additional_headers={"Authorization": f"Token {token}"},
            open_timeout=15,
        )
        self.frames: list[tuple[float, dict]] = []
        self.cond = threading.Condition()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        try:
            for text in self.ws:
                at = time.time()
                with self.cond:
                    self.frames.append((at, json.loads(text)))
                    self.cond.notify_all()
        except Exception:
            pass

    def wait_for(self, pred, timeout: float):
        end = time.monotonic() + timeout
        with self.cond:
            while True:
                for at, f in self.frames:
                    if pred(f):
                        return at, f
                left = end - time.monotonic()
                if left <= 0:
                    raise SystemExit("timed out waiting for a WebSocket frame")
                self.cond.wait(left)

    def close(self) -> None:
        self.ws.close()
        self.thread.join(timeout=5)


def _commit_marker(run, i: int) -> tuple[int, float]:
    # here, not at the top: the script sets Django up at run time, before the project's modules load
    from django.db import transaction

    from runs.clock import CLOCK
    from runs.domain.writes import EventWrite
    from runs.store.events import record_events

    with transaction.atomic(durable=True):
        seq = record_events(
            tenant_id=run.tenant_id,
            session_id=run.session_id,
            run_id=run.id,
            epoch=run.lease_epoch,
            events=[EventWrite("bench.marker", {"i": i}, CLOCK.now())],
        )[0]
    return seq, time.time()


def part_ws(args, url: str, tenant, token: str, logs: Path) -> dict:
    # here, not at the top: the script sets Django up at run time, before the project's modules load
    from django.test import override_settings

    from agentrt_site.settings import redis_channel_layer
    from runs.models import Run
    from runs.services import run_submit

    out = {}
    for mode in ("redis", "no_redis"):
        redis = mode == "redis"
        dep = Deployment(url, logs, redis=redis, workers=args.workers)
        db = DB(url)
        layers = (
            {"default": redis_channel_layer(REDIS)}
            if redis
            else {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
        )
        try:
            # (a) real runs driven by the workers
            run_lat: list[float] = []
            for r in range(args.ws_runs):
                run, _ = run_submit(tenant=tenant, agent="ticker", input=f"ws {mode} {r}")
                bench.close_django()
                sock = Socket(dep.port, token, str(run.id))
                t_open = time.time()
                try:
                    sock.wait_for(lambda f: f["type"] == "run.completed", 120)
                    # the frames the socket saw live: after it had replayed what existed when it opened
                    frames = sock.frames
                finally:
                    sock.close()
                for at, f in frames:
                    occurred = dt.datetime.fromisoformat(f["occurred_at"]).timestamp()
                    if occurred > t_open:  # committed while the socket was open: a live frame, not the replay
                        run_lat.append((at - occurred) * 1e3)
            # (b) markers committed here through the store, on a finished run
            marker_lat: list[float] = []
            run_obj = Run.objects.get(id=run.id)
            with override_settings(CHANNEL_LAYERS=layers, AGENTRT_NOTIFY_LIVE=redis):
                last = db.one("SELECT max(sequence) FROM events WHERE run_id = %s", [run.id])[0]
                sock = Socket(dep.port, token, str(run.id), after=last)
                try:
                    time.sleep(0.5)
                    for i in range(args.markers):
                        time.sleep(random.uniform(0.05, 0.3))
                        seq, t_commit = _commit_marker(run_obj, i)
                        at, _ = sock.wait_for(lambda f, seq=seq: f["sequence"] == seq, 30)
                        marker_lat.append((at - t_commit) * 1e3)
                finally:
                    sock.close()
                    bench.close_django()
            out[mode] = {
                "run_events_occurred_to_frame_ms": stats(run_lat),
                "marker_commit_to_frame_ms": stats(marker_lat),
            }
        finally:
            db.close()
            dep.stop()
    out["target_ms_with_redis"] = 50
    out["note"] = (
        "run events: occurred_at (set just before the worker's commit) -> frame received, events of "
        f"{args.ws_runs} runs of 12 steps with a 150 ms model; markers: this process's COMMIT returned -> frame "
        "received (the store's post-commit wake, as in a worker)"
    )
    return out


# ------------------------------------------------------------------ 3. takeover after SIGKILL


def part_takeover(args, url: str, tenant, token: str, logs: Path) -> dict:
    # here, not at the top: the script sets Django up at run time, before the project's modules load
    from runs.services import run_submit

    lease = args.lease
    sweep = lease / 6  # maintenance/runner.py: reclaim every lease/6 s
    dep = Deployment(url, logs, redis=True, workers=args.workers, maintenance=True, AGENTRT_LEASE_SECONDS=lease)
    db = DB(url)
    rows = []
    try:
        for k in range(args.takeovers):
            run, _ = run_submit(tenant=tenant, agent="hang", input=f"takeover {k}")
            bench.close_django()
            rid = str(run.id)
            wait_until(
                lambda rid=rid: db.events(rid, ("model.request.started",)).get("model.request.started"),
                120,
                "the first model call",
                procs=dep.procs,
            )
            time.sleep(random.uniform(0, lease / 3))  # a random point of the heartbeat cycle
            owner, remaining = db.one(
                "SELECT lease_owner, extract(epoch FROM lease_expires_at - now()) FROM runs WHERE id = %s", [rid]
            )
            pid = int(owner.split(":")[1])
            os.kill(pid, signal.SIGKILL)
            t_kill = time.time()
            wait_until(
                lambda rid=rid: db.events(rid, ("lease.taken_over",)).get("lease.taken_over"),
                3 * lease + 60,
                "lease.taken_over",
                every=0.05,
                procs=dep.procs,
            )
            wait_until(lambda rid=rid: db.status(rid) == "COMPLETED", 3 * lease + 60, "the run to complete", every=0.05)
            ev = db.events(rid, ("lease.taken_over", "model.request.started"))
            t_over = ev["lease.taken_over"][0]
            t_next = ev["model.request.started"][1]
            rows.append(
                {
                    "lease_left_at_kill_s": round(float(remaining), 2),
                    "kill_to_takeover_s": round(t_over - t_kill, 2),
                    "kill_to_next_model_call_s": round(t_next - t_kill, 2),
                    "expiry_to_takeover_s": round(t_over - t_kill - float(remaining), 2),
                }
            )
            log(f"  takeover {k + 1}/{args.takeovers}: {rows[-1]}")
    finally:
        db.close()
        dep.stop()
    return {
        "lease_s": lease,
        "sweep_interval_s": round(sweep, 2),
        "target_s": round(lease + sweep, 2),
        "kill_to_takeover_s": stats([r["kill_to_takeover_s"] for r in rows]),
        "kill_to_next_model_call_s": stats([r["kill_to_next_model_call_s"] for r in rows]),
        "expiry_to_takeover_s": stats([r["expiry_to_takeover_s"] for r in rows]),
        "samples": rows,
    }


# ------------------------------------------------------------------ main


def main(argv=None) -> dict:
    args = parse_args(argv)
    url = bench.bench_url(args.database_url)
    logs = Path(args.logs) if args.logs else Path(tempfile.mkdtemp(prefix="agentrt-latency-"))
    logs.mkdir(parents=True, exist_ok=True)
    log(f"bench database: {bench.db_name(url)} (dropped and re-created); logs: {logs}")
    load_before = os.getloadavg()
    model = ModelServer()
    tenant, token = setup(url, model)
    probe = bench.floor_probe(url)
    result: dict = {
        "bench": "agentrt_latency",
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.argv[0]).name] + sys.argv[1:]) if argv is None else " ".join(argv),
        "floor_probe_before": probe,
        "loadavg_1m_before": round(load_before[0], 2),
        "params": {"workers": args.workers, "database": bench.db_name(url)},
    }
    if "first-call" in args.only:
        log("part 1: submit -> first model call")
        result["first_call"] = part_first_call(args, url, tenant, token, logs, model)
    if "ws" in args.only:
        log("part 2: commit -> WebSocket frame, with and without Redis")
        result["ws"] = part_ws(args, url, tenant, token, logs)
    if "takeover" in args.only:
        log(f"part 3: takeover after SIGKILL (lease {args.lease:g} s)")
        result["takeover"] = part_takeover(args, url, tenant, token, logs)
    model.close()
    result["loadavg_1m_after"] = round(os.getloadavg()[0], 2)
    print(json.dumps(result), flush=True)
    print_table(result)
    return result


def print_table(r: dict) -> None:
    def f(s):
        return (
            "-"
            if not s
            else f"p50 {s['p50']:.1f}  p95 {s['p95']:.1f}  (min {s['min']:.1f}, max {s['max']:.1f}, n={s['n']})"
        )

    rows = []
    fc = r.get("first_call")
    if fc:
        rows.append(("submit -> first model call ms", f(fc["total_ms"])))
        for via in ("rest", "python"):
            for k in ("total", "submit", "doorbell", "startup", "first_commit"):
                rows.append((f"  {via} {k}", f(fc[via][k])))
    ws = r.get("ws")
    if ws:
        for mode in ("redis", "no_redis"):
            rows.append((f"ws {mode}: run event -> frame ms", f(ws[mode]["run_events_occurred_to_frame_ms"])))
            rows.append((f"ws {mode}: commit -> frame ms", f(ws[mode]["marker_commit_to_frame_ms"])))
    to = r.get("takeover")
    if to:
        rows.append((f"takeover (lease {to['lease_s']:g} s, target {to['target_s']:g} s)", ""))
        rows.append(("  kill -> lease.taken_over s", f(to["kill_to_takeover_s"])))
        rows.append(("  kill -> next model call s", f(to["kill_to_next_model_call_s"])))
        rows.append(("  lease expiry -> takeover s", f(to["expiry_to_takeover_s"])))
    p = r["floor_probe_before"]
    rows.append(("floor", f"SELECT 1 {p['select1_txn_ms']:.3f} ms, BEGIN+INSERT+COMMIT {p['insert_commit_ms']:.3f} ms"))
    rows.append(("load average (1 min)", f"{r['loadavg_1m_before']:.2f} before, {r['loadavg_1m_after']:.2f} after"))
    w = max(len(k) for k, _ in rows)
    log("")
    for k, v in rows:
        log(f"  {k.ljust(w)}  {v}")
    log("")


if __name__ == "__main__":
    main()
