#!/usr/bin/env python
"""A rolling deploy under load, driven from outside a real cluster (issue 14, item 6).

    python bench/rolling_deploy.py [--runs 300] [--worker-nodes 3] [--rate 3] [--report bench/ROLLING_DEPLOY.md]

What it does
------------
1. Drops and re-creates its own database (default `agentrt_rolling` on the
   server of $DATABASE_URL; the name must contain `rolling` or `bench`),
   migrates it, creates a tenant, a member with an API token and one
   scripted agent: four steps — `http_post` to the effect sink, `echo`, a
   second `http_post`, a final answer — each model turn taking `--delay-ms`,
   so runs are mid-flight when a node stops.
2. Starts the effect sink (tests/sink.py in its own process: every POST
   logged with its Idempotency-Key) and `manage.py cluster` (what `make
   cluster` runs): `--worker-nodes` worker nodes, two web nodes on
   consecutive free ports, maintenance; one PostgreSQL, one Redis.
3. Submits `--runs` runs over REST at `--rate` a second, round-robin over the
   two web nodes, each with its own Idempotency-Key. A failed submit
   (connection refused or reset, timeout, 5xx) is retried on the next node
   with the same key and body, as a client behind a load balancer would.
4. Once `--roll-after` of them are submitted, rolls the cluster: for each
   worker node in turn, SIGTERM to its main process (as `systemctl restart`
   with `KillMode=mixed` does), wait until every process of the node has
   exited (its workers finish their step and yield their runs back to the
   queue: the **drain time**; a worker node is first given up to
   `--wait-busy` seconds to hold a run, so that its drain has work), wait until the supervisor has started it again
   and it is ready; then the same for each web node. `--pause` seconds
   between nodes.
5. Waits until every run is terminal (or parked), stops the cluster, snapshots the
   database and judges it with the chaos soak's checker
   (tests/chaos/checker.py: I1 every run COMPLETED — nothing here may fail a
   run; I2 every effect delivered once, none lost; I3–I7), and checks the
   client's side: each Idempotency-Key gave exactly one run, the database
   holds exactly those runs; and that no run needed a takeover after an
   expired lease (a draining node yields every run it holds).
6. Writes report.json / report.md in `--out` (and `--report PATH`): the
   drain and restart time of every node, runs held and yielded, submit
   latency percentiles before, during and after the roll, submit errors and
   retries, the verdict. Exit 1 when anything is lost, duplicated or judged a
   violation. Timings are figures, never a pass/fail criterion.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests import secret_env  # noqa: E402,F401  (a throw-away DJANGO_SECRET_KEY for this process and the cluster)
from tests.chaos.infra import EffectSink  # noqa: E402
from tests.chaos.procs import recreate_database  # noqa: E402
from tests.procfs import in_sessions  # noqa: E402

TERMINAL = ("COMPLETED", "FAILED", "CANCELLED")
SETTLED = TERMINAL + ("WAITING_FOR_APPROVAL", "WAITING_FOR_USER")  # nothing here moves a waiting run on
AGENT = "roller"


def log(msg: str) -> None:
    print(f"[roll {datetime.now().strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--runs", type=int, default=300)
    p.add_argument("--worker-nodes", type=int, default=3, help="qcluster nodes (default 3)")
    p.add_argument("--worker-processes", type=int, default=2, help="workers per node, AGENTRT_WORKERS (default 2)")
    p.add_argument("--rate", type=float, default=3.0, help="submits per second (default 3: 300 runs flow for 100 s)")
    p.add_argument("--delay-ms", type=int, default=100, help="each scripted model turn takes this long (default 100)")
    p.add_argument(
        "--roll-after", type=float, default=0.1, help="start rolling once this share of the runs is submitted"
    )
    p.add_argument("--pause", type=float, default=2.0, help="seconds between one node ready and the next SIGTERM")
    p.add_argument(
        "--wait-busy",
        type=float,
        default=10.0,
        help="before a worker node's SIGTERM, wait up to this long until it holds a run (so its drain has work)",
    )
    p.add_argument("--database-url", default=None, help="default: agentrt_rolling on $DATABASE_URL's server")
    p.add_argument("--redis-url", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"), help="'' for none")
    p.add_argument("--timeout", type=float, default=900.0, help="give up waiting for the runs after this many seconds")
    p.add_argument("--out", default=None, help="artifact folder (default artifacts/rolling/<time>)")
    p.add_argument("--report", default=None, help="also write the markdown report here")
    a = p.parse_args(argv)
    if a.runs < 1 or a.worker_nodes < 1 or a.rate <= 0:
        p.error("need --runs >= 1, --worker-nodes >= 1, --rate > 0")
    return a


def database_url(arg: str | None) -> str:
    url = arg or urlunsplit(
        urlsplit(os.environ.get("DATABASE_URL") or "postgres://postgres@127.0.0.1:5432/agentrt")._replace(
            path="/agentrt_rolling"
        )
    )
    name = urlsplit(url).path.lstrip("/")
    if "rolling" not in name and "bench" not in name:
        raise SystemExit(
            f"refusing to drop {name!r}: the rolling-deploy database's name must contain 'rolling' or 'bench'"
        )
    return url


def two_free_ports() -> int:
    """A port p such that p and p + 1 are free (the cluster's web nodes)."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            p = s.getsockname()[1]
        if p >= 65535:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", p + 1))
            except OSError:
                continue
        return p
    raise SystemExit("no two consecutive free ports")


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    v = sorted(values)
    k = min(len(v) - 1, max(0, int(round(q * (len(v) - 1)))))
    return v[k]


def dist_ms(values: list[float]) -> dict:
    ms = [x * 1e3 for x in values]
    if not ms:
        return {"n": 0}
    return {
        "n": len(ms),
        "p50": round(pct(ms, 0.5), 1),
        "p95": round(pct(ms, 0.95), 1),
        "p99": round(pct(ms, 0.99), 1),
        "max": round(max(ms), 1),
        "mean": round(statistics.mean(ms), 1),
    }


# -- the client ------------------------------------------------------------------


class Submitter:
    """Submits run i at t0 + i / rate to web node i mod 2; a failed attempt is
    retried on the next node with the same Idempotency-Key and body."""

    ATTEMPT_TIMEOUT = 10.0
    MAX_ATTEMPTS = 40

    def __init__(self, ports: list[int], token: str, runs: int, rate: float, tag: str):
        self.ports, self.token, self.runs, self.rate, self.tag = ports, token, runs, rate, tag
        self.records: list[dict | None] = [None] * runs
        self.submitted = 0
        self._lock = threading.Lock()
        self.t0 = None

    def key(self, i: int) -> str:
        return f"{self.tag}-{i:05d}"

    def post(self, port: int, i: int) -> tuple[int, dict]:
        body = json.dumps({"agent": AGENT, "input": f"rolling deploy run {i}"}).encode()
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/api/runs/",
            data=body,
            method="POST",
            headers={
                "Authorization": f"Token {self.token}",
                "Content-Type": "application/json",
                "Idempotency-Key": self.key(i),
            },
        )
        try:
            with urllib.request.urlopen(req, timeout=self.ATTEMPT_TIMEOUT) as resp:
                return resp.status, json.loads(resp.read() or b"{}")
        except urllib.error.HTTPError as exc:
            return exc.code, {"error": exc.read()[:300].decode(errors="replace")}

    def one(self, i: int) -> None:
        due = self.t0 + i / self.rate
        time.sleep(max(0.0, due - time.time()))
        rec = {"i": i, "key": self.key(i), "t_start": time.time(), "attempts": [], "run": None, "status": None}
        node = i % len(self.ports)
        for n in range(self.MAX_ATTEMPTS):
            port = self.ports[node]
            a = time.time()
            try:
                status, data = self.post(port, i)
                err = None if status in (200, 201) else f"http_{status}"
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as exc:
                status, data = None, {}
                reason = getattr(exc, "reason", exc)
                err = type(reason).__name__ if not isinstance(reason, str) else reason
            rec["attempts"].append(
                {"port": port, "t": a, "s": round(time.time() - a, 4), "status": status, "error": err}
            )
            if err is None:
                rec["run"], rec["status"] = data.get("id"), status
                break
            node = (node + 1) % len(self.ports)
            time.sleep(min(1.0, 0.1 * (n + 1)))
        rec["t_end"] = time.time()
        with self._lock:
            self.records[i] = rec
            self.submitted += 1

    def start(self) -> list[threading.Thread]:
        self.t0 = time.time()
        threads = []
        # a few threads, each taking every k-th run, so a slow attempt does not hold up the schedule
        k = 6

        def lane(j):
            for i in range(j, self.runs, k):
                self.one(i)

        for j in range(k):
            t = threading.Thread(target=lane, args=(j,), daemon=True, name=f"submit-{j}")
            t.start()
            threads.append(t)
        return threads


# -- the bench -------------------------------------------------------------------


class Rolling:
    def __init__(self, args):
        self.args = args
        self.db_url = database_url(args.database_url)
        stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
        self.out = Path(args.out) if args.out else ROOT / "artifacts" / "rolling" / stamp
        self.out.mkdir(parents=True, exist_ok=True)
        self.state_path = self.out / "cluster-state.json"
        self.cluster: subprocess.Popen | None = None
        self.sink: subprocess.Popen | None = None
        self.roll: list[dict] = []

    # setup
    def setup(self) -> None:
        log(f"database {self.db_url}: drop, create, migrate; artifacts in {self.out}")
        recreate_database(self.db_url)
        env = dict(os.environ, DATABASE_URL=self.db_url)
        with open(self.out / "migrate.log", "wb") as fh:
            subprocess.run(
                [sys.executable, "manage.py", "migrate", "--noinput"],
                cwd=ROOT,
                env=env,
                stdout=fh,
                stderr=subprocess.STDOUT,
                check=True,
            )
        os.environ["DATABASE_URL"] = self.db_url
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agentrt_site.settings")
        os.environ.pop("REDIS_URL", None)  # this process only seeds and reads
        # here, not at the top: Django reads DATABASE_URL and the settings module, set just above
        import django

        django.setup()
        self.start_sink()
        # here, not at the top: the script sets Django up at run time, before the project's modules load
        from knox.models import AuthToken

        from runs.services import agent_load, tenant_create

        tenant, user = tenant_create(name="rolling", username="rolling-client")
        _, self.token = AuthToken.objects.create(user=user)
        d = self.args.delay_ms

        def post(n: int) -> dict:
            return {"name": "http_post", "arguments": {"url": f"http://{self.sink_host}/effect", "json": {"effect": n}}}

        agent_load(
            tenant=tenant,
            definition={
                "name": AGENT,
                "instructions": "rolling-deploy agent",
                "tools": ["echo", "http_post"],
                "policy": {"default": "allow"},
                "model": {
                    "provider": "scripted",
                    "turns": [
                        {"tool_calls": [post(1)], "delay_ms": d},
                        {"tool_calls": [{"name": "echo", "arguments": {"text": "between the effects"}}], "delay_ms": d},
                        {"tool_calls": [post(2)], "delay_ms": d},
                        {"text": "deployed", "delay_ms": d},
                    ],
                },
            },
        )
        # here, not at the top: the script sets Django up at run time, before the project's modules load
        from django.db import connections

        connections.close_all()

    def start_sink(self) -> None:
        """The soak's effect sink (its own process, a log of every POST), answering every call at once."""
        sink = EffectSink(self.out, seed=0, drop=0.0, delay=0.0, delay_s=0.0).start()
        self.sink = sink.proc
        self.sink_host = sink.host
        log(f"sink on {self.sink_host}")

    def start_cluster(self) -> None:
        a = self.args
        self.port = two_free_ports()
        env = dict(os.environ)
        env.update(
            DATABASE_URL=self.db_url,
            AGENTRT_HTTP_TOOL_ALLOWED_HOSTS=self.sink_host,
            PYTHONUNBUFFERED="1",
            AGENTRT_LOG_LEVEL="INFO",
            AGENTRT_THROTTLE_RUNS_CREATE="100000/min",
        )
        env.pop("AGENTRT_ENABLE_FAULTPOINTS", None)
        if a.redis_url:
            env["REDIS_URL"] = a.redis_url
        else:
            env.pop("REDIS_URL", None)
        self.cluster_log = open(self.out / "cluster.log", "wb")
        argv = [
            sys.executable,
            "manage.py",
            "cluster",
            "--workers",
            str(a.worker_nodes),
            "--worker-processes",
            str(a.worker_processes),
            "--web",
            "2",
            "--port",
            str(self.port),
            "--log-dir",
            str(self.out / "nodes"),
            "--state-file",
            str(self.state_path),
        ]
        self.cluster = subprocess.Popen(
            argv, cwd=ROOT, env=env, stdout=self.cluster_log, stderr=subprocess.STDOUT, start_new_session=True
        )
        deadline = time.time() + 180
        while time.time() < deadline:
            if self.cluster.poll() is not None:
                raise SystemExit(
                    f"the cluster exited ({self.cluster.returncode}):\n{(self.out / 'cluster.log').read_text()[-3000:]}"
                )
            if "agentrt cluster is running" in (self.out / "cluster.log").read_text(errors="replace"):
                log(
                    f"cluster up: {a.worker_nodes} worker nodes x {a.worker_processes}, "
                    f"web on {self.port} and {self.port + 1}"
                )
                return
            time.sleep(0.2)
        raise SystemExit("the cluster did not become ready in 180 s")

    def nodes(self) -> dict[str, dict]:
        for _ in range(50):
            try:
                return {n["name"]: n for n in json.loads(self.state_path.read_text())["nodes"]}
            except (OSError, ValueError):
                time.sleep(0.05)  # replaced under us: read again
        raise SystemExit("cannot read the cluster's state file")

    # the roll
    def held_runs(self, pids: set[int]) -> list[str]:
        with self.conn.cursor() as cur:
            cur.execute("SELECT id, lease_owner FROM runs WHERE status = 'RUNNING'")
            return [
                str(i)
                for i, owner in cur.fetchall()
                if owner and owner.split(":")[-2].isdigit() and int(owner.split(":")[-2]) in pids
            ]

    def drain_requeues(self, t_a: float, t_b: float) -> int:
        with self.conn.cursor() as cur:
            cur.execute(
                "SELECT count(*) FROM events WHERE type = 'run.requeued' AND payload->>'reason' = 'drain'"
                " AND occurred_at BETWEEN to_timestamp(%s) AND to_timestamp(%s)",
                [t_a, t_b + 0.5],
            )
            return cur.fetchone()[0]

    def restart_node(self, name: str) -> dict:
        # here, not at the top: the script sets Django up at run time, before the project's modules load
        from ops.supervise import descendants

        node = self.nodes()[name]
        pid = node["pid"]
        held: list[str] = []
        if node["role"] == "worker":
            until = time.time() + self.args.wait_busy
            while True:
                held = self.held_runs({pid, *descendants(pid)})
                if held or time.time() >= until:
                    break
                time.sleep(0.02)
        submitted_before = self.submitter.submitted
        t_term = time.time()
        os.kill(pid, signal.SIGTERM)
        t_main = t_gone = None
        while t_gone is None:
            now = time.time()
            live = in_sessions({pid})
            if t_main is None and pid not in live:
                t_main = now
            if not live:
                t_gone = now
            if now - t_term > 300:
                raise SystemExit(f"{name} did not stop within 300 s of SIGTERM")
            time.sleep(0.01)
        while True:
            n = self.nodes()[name]
            if n["pid"] != pid and n["ready_at"]:
                break
            if time.time() - t_term > 300:
                raise SystemExit(f"{name} was not ready again within 300 s")
            time.sleep(0.05)
        t_ready = time.time()
        step = {
            "node": name,
            "role": node["role"],
            "old_pid": pid,
            "new_pid": n["pid"],
            "t_sigterm": t_term,
            "main_exit_s": round(t_main - t_term, 3),
            "drain_s": round(t_gone - t_term, 3),
            "back_ready_s": round(t_ready - t_term, 3),
            "held_at_sigterm": len(held),
            "submitted_during": self.submitter.submitted - submitted_before,
            "t_ready": t_ready,
        }
        if node["role"] == "worker":
            step["yielded_by_drain"] = self.drain_requeues(t_term, t_gone)
        log(
            f"{name}: SIGTERM -> gone {step['drain_s']:.2f} s (held {len(held)} runs), "
            f"ready again after {step['back_ready_s']:.2f} s"
        )
        self.roll.append(step)
        return step

    def do_roll(self) -> None:
        names = self.nodes()
        order = sorted(n for n in names if names[n]["role"] == "worker") + sorted(
            n for n in names if names[n]["role"] == "web"
        )
        for k, name in enumerate(order):
            if k:
                time.sleep(self.args.pause)
            self.restart_node(name)

    # run
    def run(self) -> int:
        self.load_before = os.getloadavg()
        try:
            self.setup()
            self.start_cluster()
            self.conn = psycopg.connect(self.db_url, autocommit=True)
            tag = f"roll-{secrets.token_hex(4)}"
            self.submitter = Submitter([self.port, self.port + 1], self.token, self.args.runs, self.args.rate, tag)
            threads = self.submitter.start()
            self.t_first_submit = self.submitter.t0
            want = max(1, int(self.args.roll_after * self.args.runs))
            while self.submitter.submitted < want:
                time.sleep(0.05)
            self.t_roll_start = time.time()
            self.do_roll()
            self.t_roll_end = time.time()
            self.runs_submitted_at_roll_end = self.submitter.submitted
            for t in threads:
                t.join()
            self.t_last_submit = max(r["t_end"] for r in self.submitter.records)
            self.wait_terminal()
        except BaseException:
            self.shutdown()
            raise
        self.shutdown()
        return self.finish()

    def wait_terminal(self) -> None:
        ids = [r["run"] for r in self.submitter.records if r and r["run"]]
        deadline = time.time() + self.args.timeout
        last = 0.0
        while True:
            with self.conn.cursor() as cur:
                cur.execute("SELECT status, count(*) FROM runs WHERE id = ANY(%s::uuid[]) GROUP BY status", [ids])
                counts = dict(cur.fetchall())
            done = sum(counts.get(s, 0) for s in SETTLED)
            if done >= len(ids):
                self.t_end = time.time()
                log(f"every run is terminal or waiting: {counts}")
                return
            if time.time() - last > 10:
                log(f"waiting: {counts}")
                last = time.time()
            if time.time() > deadline:
                self.t_end = time.time()
                log(f"timed out with {counts}")
                return
            time.sleep(0.2)

    def shutdown(self) -> None:
        if self.cluster is not None and self.cluster.poll() is None:
            self.cluster.send_signal(signal.SIGTERM)
            try:
                self.cluster.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.cluster.kill()
                self.cluster.wait()
        if self.sink is not None and self.sink.poll() is None:
            self.sink.terminate()
            self.sink.wait(timeout=10)

    # the verdict
    def finish(self) -> int:
        # here, not at the top: the script sets Django up at run time, before the project's modules load
        from runs.runtime.resume import MAX_LEASE_EXPIRATIONS
        from tests.chaos.checker import check
        from tests.chaos.snapshot import take_snapshot

        recs = [r for r in self.submitter.records if r]
        run_ids = [r["run"] for r in recs if r["run"]]
        snap = take_snapshot(
            meta={
                "runs_submitted": len(set(run_ids)),
                "t_first_submit": self.t_first_submit,
                "t_end": self.t_end,
                "max_lease_expirations": MAX_LEASE_EXPIRATIONS,
                "reconciler": False,
            }
        )
        snap["meta"]["process_logs"] = self.log_summary()
        (self.out / "snapshot.json").write_text(json.dumps(snap, default=str))
        (self.out / "submits.json").write_text(json.dumps(recs))
        sink = (
            [json.loads(line) for line in (self.out / "sink.jsonl").read_text().splitlines() if line.strip()]
            if (self.out / "sink.jsonl").exists()
            else []
        )
        verdict = check(snap, sink, [], [])

        # the client's side: one run per key, the database holds exactly those runs, nothing sent twice
        problems = []
        unsubmitted = [r["key"] for r in recs if not r["run"]] + [
            f"#{i}" for i, r in enumerate(self.submitter.records) if r is None
        ]
        if unsubmitted:
            problems.append(f"{len(unsubmitted)} submit(s) never succeeded: {unsubmitted[:5]}")
        if len(set(run_ids)) != len(run_ids):
            problems.append(f"{len(run_ids) - len(set(run_ids))} Idempotency-Keys share a run")
        db_runs = {r["id"] for r in snap["runs"]}
        if db_runs != set(run_ids):
            problems.append(
                f"the database holds {len(db_runs)} runs, the client got {len(set(run_ids))} "
                f"({len(db_runs - set(run_ids))} unknown to the client, {len(set(run_ids) - db_runs)} missing)"
            )
        statuses = Counter(r["status"] for r in snap["runs"])
        if statuses.get("COMPLETED", 0) != self.args.runs:
            problems.append(f"not every run COMPLETED: {dict(statuses)}")
        sends = Counter(s["key"] for s in sink)
        twice = {k: n for k, n in sends.items() if n > 1}
        if twice:
            problems.append(f"{len(twice)} effect(s) sent more than once: {list(twice.items())[:5]}")
        if len(sends) != 2 * self.args.runs:
            problems.append(f"{len(sends)} distinct effects at the sink, {2 * self.args.runs} expected (two per run)")
        web_exc = self.web_log_exceptions()
        other = {k: n for k, n in web_exc.items() if not k.endswith("django.core.exceptions.RequestAborted")}
        if other:
            problems.append(f"web node logs show exceptions other than a request aborted by the stop: {other}")
        takeovers = sum(1 for e in snap["events"] if e["type"] == "lease.taken_over")
        if takeovers:
            problems.append(
                f"{takeovers} run(s) taken over after an expired lease: a draining node must yield every run it holds"
            )
        violations = verdict["violations"]

        report = self.figures(recs, snap, sink, statuses)
        report.update(
            web_log_exceptions=web_exc,
            violations=violations,
            problems=problems,
            checker={k: verdict.get(k) for k in ("outcomes", "sends", "statuses", "fencing")},
        )
        (self.out / "report.json").write_text(json.dumps(report, indent=2, default=str))
        md = render(report)
        (self.out / "report.md").write_text(md)
        if self.args.report:
            Path(self.args.report).write_text(md)
        print(md)
        log(f"report: {self.out / 'report.md'}")
        return 1 if (violations or problems) else 0

    def figures(self, recs, snap, sink, statuses) -> dict:
        a = self.args
        worker_steps = [s for s in self.roll if s["role"] == "worker"]
        web_steps = [s for s in self.roll if s["role"] == "web"]

        def window(steps):
            return (min(s["t_sigterm"] for s in steps), max(s["t_ready"] for s in steps)) if steps else (0, 0)

        wk, wb = window(worker_steps), window(web_steps)

        def phase(t):
            if wk[0] <= t <= wk[1]:
                return "worker roll"
            if wb[0] <= t <= wb[1]:
                return "web roll"
            return "before roll" if t < self.t_roll_start else "after roll"

        lat: dict[str, list[float]] = {}
        for r in recs:
            if r["run"]:
                lat.setdefault(phase(r["t_start"]), []).append(r["t_end"] - r["t_start"])
        errors = Counter(at["error"] for r in recs for at in r["attempts"] if at["error"])
        retried = sum(1 for r in recs if len(r["attempts"]) > 1)
        replays = sum(1 for r in recs if r["status"] == 200)
        created = {r["id"]: r["created_at"] for r in snap["runs"]}
        done = {}
        for e in snap["events"]:
            if e["type"] == "run.completed":
                done[e["run_id"]] = e["occurred_at"]
        e2e = [done[i] - created[i] for i in done if i in created]
        t_first_created, t_last_done = min(created.values()), max(done.values()) if done else None
        requeues = Counter(e["payload"].get("reason") for e in snap["events"] if e["type"] == "run.requeued")
        takeovers = sum(1 for e in snap["events"] if e["type"] == "lease.taken_over")
        return {
            "bench": "rolling_deploy",
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
            "command": "python bench/rolling_deploy.py " + " ".join(sys.argv[1:]),
            "machine": {
                "cores": os.cpu_count(),
                "loadavg_1m_before": round(self.load_before[0], 2),
                "loadavg_1m_after": round(os.getloadavg()[0], 2),
            },
            "config": {
                "runs": a.runs,
                "worker_nodes": a.worker_nodes,
                "workers_per_node": a.worker_processes,
                "web_nodes": 2,
                "rate_per_s": a.rate,
                "delay_ms": a.delay_ms,
                "steps_per_run": 4,
                "effects_per_run": 2,
                "redis": bool(a.redis_url),
                "database": urlsplit(self.db_url).path.lstrip("/"),
                "artifacts": str(self.out),
            },
            "roll": self.roll,
            "roll_window_s": round(self.t_roll_end - self.t_roll_start, 2),
            "submits_during_roll": self.runs_submitted_at_roll_end
            - sum(1 for r in recs if r["t_end"] < self.t_roll_start),
            "roll_ended_before_last_submit": self.t_roll_end < self.t_last_submit,
            "submit_latency_ms": {k: dist_ms(v) for k, v in sorted(lat.items())},
            "submit_errors": dict(errors),
            "submits_retried": retried,
            "idempotent_replays": replays,
            "statuses": dict(statuses),
            "requeues": dict(requeues),
            "takeovers": takeovers,
            "sink_posts": len(sink),
            "distinct_effects": len({s["key"] for s in sink}),
            "run_latency_ms": dist_ms(e2e),
            "throughput_runs_per_s": round(len(done) / (t_last_done - t_first_created), 2) if done else None,
        }

    def log_summary(self) -> dict:
        """What the checker judges: the worker nodes' and maintenance's logs (as the soak does).
        Web nodes are summarised apart (`web_log_exceptions`): daphne, stopped, aborts the
        requests in flight and asyncio logs each abort's traceback; the client sees a
        dropped connection and retries (counted under submit errors)."""
        out = {}
        for path in sorted((self.out / "nodes").glob("*.log")):
            if path.stem.startswith("web-"):
                continue
            lines = path.read_text(errors="replace").splitlines()
            out[path.stem] = {
                "tracebacks": sum(1 for line in lines if line.startswith("Traceback")),
                "errors": sum(1 for line in lines if " ERROR " in line or " CRITICAL " in line),
                "unhandled_run_errors": sum(1 for line in lines if "unhandled error" in line),
            }
        return out

    def web_log_exceptions(self) -> dict:
        """The exception each traceback in a web node's log ends with, counted. Only
        `RequestAborted` (a request cut by the node's own stop) is expected."""
        found: Counter = Counter()
        for path in sorted((self.out / "nodes").glob("web-*.log")):
            lines = path.read_text(errors="replace").splitlines()
            for k, line in enumerate(lines):
                if line.startswith("Traceback"):
                    j = k + 1
                    while j < len(lines) and (lines[j].startswith(" ") or not lines[j].strip()):
                        j += 1
                    found[f"{path.stem}: {lines[j].strip() if j < len(lines) else '?'}"] += 1
        return dict(found)


def render(r: dict) -> str:
    c, m = r["config"], r["machine"]
    ok = not r["violations"] and not r["problems"]
    lines = [
        "# Rolling deploy under load",
        "",
        f"{r['date']}: `{r['command']}`",
        "",
        f"{c['runs']} runs submitted over REST at {c['rate_per_s']:g}/s, round-robin to {c['web_nodes']} web "
        "nodes, each with its own Idempotency-Key (a failed submit retried on the other node with the same key); "
        f"{c['worker_nodes']} worker nodes x {c['workers_per_node']} workers, maintenance, one PostgreSQL"
        f"{', one Redis' if c['redis'] else ''} (`manage.py cluster`). Each run: {c['steps_per_run']} steps, "
        f"{c['effects_per_run']} `http_post` side effects to a sink that logs every delivery, {c['delay_ms']} ms "
        "per model turn. While they flowed, each worker node and then each web node was sent SIGTERM (main process "
        "only, as systemd's `KillMode=mixed`), left to drain, restarted by the supervisor, and waited for until "
        "ready before the next.",
        "",
        f"Machine: {m['cores']} cores; 1-minute load average {m['loadavg_1m_before']} before, "
        f"{m['loadavg_1m_after']} after (more than the cores means other work competed with the deployment). "
        "Timings are figures, not limits.",
        "",
        f"## Verdict: {'nothing lost, nothing sent twice' if ok else 'FAILED'}",
        "",
        f"- runs: {r['statuses']} (client got "
        f"{c['runs'] - sum(1 for p in r['problems'] if 'never succeeded' in p)} runs for "
        f"{c['runs']} keys; {r['idempotent_replays']} answered by an idempotent replay)",
        f"- effects: {r['sink_posts']} deliveries of {r['distinct_effects']} distinct effects "
        f"(expected {c['effects_per_run'] * c['runs']}, each once)",
        f"- checker (tests/chaos/checker.py, I1–I7): {len(r['violations'])} violations",
        f"- requeues: {r['requeues']}; takeovers after an expired lease: {r['takeovers']}",
    ]
    for p in r["problems"]:
        lines.append(f"- **problem**: {p}")
    for v in r["violations"][:20]:
        lines.append(f"- **violation** {v.get('invariant')}: {v.get('detail')}")
    lines += [
        "",
        "## The roll",
        "",
        "| node | held runs at SIGTERM | main process exited | drained (every process gone) | yielded by drain "
        "| ready again | submits meanwhile |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in r["roll"]:
        lines.append(
            f"| {s['node']} | {s['held_at_sigterm'] if s['role'] == 'worker' else '–'} | {s['main_exit_s']:.2f} s | "
            f"{s['drain_s']:.2f} s | {s.get('yielded_by_drain', '–')} | {s['back_ready_s']:.2f} s | "
            f"{s['submitted_during']} |"
        )
    lines += [
        "",
        f"Roll: {r['roll_window_s']:.1f} s; {r['submits_during_roll']} runs submitted during it; the roll "
        f"{'ended before' if r['roll_ended_before_last_submit'] else 'ended after'} the last submit.",
        "",
        "## Submit latency (first attempt to success, retries included)",
        "",
        "| phase | n | p50 ms | p95 ms | p99 ms | max ms |",
        "|---|---|---|---|---|---|",
    ]
    order = ["before roll", "worker roll", "web roll", "after roll"]
    for phase, d in sorted(r["submit_latency_ms"].items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else 9):
        if d["n"]:
            lines.append(f"| {phase} | {d['n']} | {d['p50']} | {d['p95']} | {d['p99']} | {d['max']} |")
    errs = ", ".join(f"{k} x{n}" for k, n in sorted(r["submit_errors"].items())) or "none"
    web = ", ".join(f"{k} x{n}" for k, n in sorted(r["web_log_exceptions"].items())) or "none"
    lat = r["run_latency_ms"]
    lines += [
        "",
        f"Failed submit attempts: {errs}; {r['submits_retried']} submits needed a retry (each on the other node, same "
        "Idempotency-Key). `ConnectionRefusedError`: the node was down; `RemoteDisconnected`: a request in flight when "
        "daphne stopped — daphne aborts those on SIGTERM rather than finishing them. "
        f"Tracebacks in the web nodes' logs: {web}.",
        "",
        f"Run latency (created → completed): p50 {lat.get('p50')} ms, p95 {lat.get('p95')} ms, "
        f"max {lat.get('max')} ms; "
        f"throughput {r['throughput_runs_per_s']} runs/s over the whole test.",
        "",
    ]
    return "\n".join(lines)


def main(argv=None) -> int:
    if argv is None and len(sys.argv) == 3 and sys.argv[1] == "--render":  # re-render a report.json
        print(render(json.loads(Path(sys.argv[2]).read_text())))
        return 0
    return Rolling(parse_args(argv)).run()


if __name__ == "__main__":
    sys.exit(main())
