#!/usr/bin/env python
"""agentrt step benchmark: what a durable step costs, end to end, through a real qcluster.

    python bench/steps.py [--runs K] [--steps N] [--workers W] [--database-url URL]
    python bench/steps.py --single          # 1 run x 200 steps, 1 worker (the peers' scenario)
    python bench/steps.py --single --repeats 5   # ... five times, one after another (as the peers' BENCH_REPEATS)
    python bench/steps.py ... --trace       # + an untimed pass with log_statement=all
    python bench/steps.py --long            # 1 run x 400 steps with 8 KiB results vs 10-step runs, per 50-step bucket

What it does (see bench/README.md for how to read the output):

1. drops and re-creates a dedicated database (its name must contain "bench";
   otherwise "_bench" is appended, so `make bench` never drops the test database),
   runs `migrate`, creates a tenant (runs.services.tenant_create) and loads agents
   (runs.services.agent_load) whose scripted model makes N-1 steps with one `echo`
   call each and then answers with text;
2. submits W warm-up runs with no cluster running (this measures the submit side:
   commits per run_submit), then starts a real `manage.py qcluster`
   (AGENTRT_WORKERS=W) which drains them: the cluster is then warm;
3. waits until the idle workers have flushed their statistics, measures the idle
   cluster's commit rate (django-q2's pusher waits on LISTEN and re-reads its
   table every AGENTRT_Q_FALLBACK_POLL seconds; AGENTRT_Q_DOORBELL=0: polls every AGENTRT_Q_POLL);
4. snapshots pg_stat_database, submits K runs through runs.services.run_submit
   (the path users take), polls the runs table until all K are COMPLETED,
   stops the cluster (so every backend flushes its counters) and snapshots again;
5. reads the per-step times from the events table (gaps between consecutive
   `model.request.started` events of one run) and prints one JSON line on stdout
   and a human table on stderr.

Counters: pg_stat_database.xact_commit (every committed transaction of this
database, read-only ones included) and the next transaction id
(pg_snapshot_xmax(pg_current_snapshot()), real time, cluster-wide: write
transactions only). Statements come from pg_stat_statements when the server
preloads it, and otherwise only from `--trace` (the server log).
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.metadata as md
import itertools
import json
import os
import platform
import re
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/agentrt_bench"
PG_LOG = os.environ.get("BENCH_PG_LOG", "/var/log/postgresql/postgresql-15-main.log")


def log(*a) -> None:
    print(*a, file=sys.stderr, flush=True)


# ------------------------------------------------------------------ arguments, database


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--runs", type=int, default=20, help="K runs (default 20)")
    p.add_argument(
        "--steps", type=int, default=50, help="N steps per run: N-1 echo steps + a final text turn (default 50)"
    )
    p.add_argument("--workers", type=int, default=2, help="W qcluster workers, AGENTRT_WORKERS (default 2)")
    p.add_argument(
        "--database-url",
        default=os.environ.get("DATABASE_URL") or DEFAULT_URL,
        help=f"PostgreSQL URL of the bench database (default $DATABASE_URL, else {DEFAULT_URL}); it is DROPPED and "
        "re-created",
    )
    p.add_argument(
        "--single", action="store_true", help="1 run x 200 steps with 1 worker (overrides --runs/--steps/--workers)"
    )
    p.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="submit the K runs R times, each time once the previous ones completed; per_run_step_ms is then the "
        "median over all runs of each run's median step, the statistic the peers' scripts report over BENCH_REPEATS "
        "(default 1)",
    )
    p.add_argument(
        "--idle-seconds", type=float, default=10.0, help="window for the idle cluster's commit rate (default 10)"
    )
    p.add_argument(
        "--settle-seconds",
        type=float,
        default=11.0,
        help="wait after warm-up so idle backends flush their stats (PostgreSQL flushes idle ones within 10 s)",
    )
    p.add_argument("--timeout", type=float, default=600.0, help="give up waiting for the runs after this many seconds")
    p.add_argument(
        "--trace",
        action="store_true",
        help="add an untimed pass with log_statement=all on the bench database and count statements per step from the "
        "server log",
    )
    p.add_argument("--pg-log", default=PG_LOG, help=f"server log file for --trace (default {PG_LOG})")
    p.add_argument(
        "--long",
        action="store_true",
        help="flat in run length: one long run with large tool results against short runs, per 50-step bucket "
        "(bench/long_run.py)",
    )
    p.add_argument("--long-steps", type=int, default=400, help="--long: steps of the long run (default 400)")
    p.add_argument("--result-bytes", type=int, default=8192, help="--long: tool result size (default 8192)")
    p.add_argument("--short-runs", type=int, default=20, help="--long: 10-step reference runs (default 20)")
    p.add_argument("--bucket", type=int, default=50, help="--long: steps per bucket (default 50)")
    p.add_argument("--cluster-log", default=None, help="where the qcluster's output goes (default: a temp file)")
    a = p.parse_args(argv)
    if a.single:
        a.runs, a.steps, a.workers = 1, 200, 1
    if a.runs < 1 or a.steps < 2 or a.workers < 1 or a.repeats < 1:
        p.error("need --runs >= 1, --steps >= 2, --workers >= 1, --repeats >= 1")
    return a


def bench_url(url: str) -> str:
    """The database this script may drop: its name must contain 'bench'."""
    parts = urlsplit(url)
    name = parts.path.lstrip("/") or "agentrt"
    if "bench" not in name:
        new = name + "_bench"
        log(f"note: database {name!r} is not a bench database; using {new!r} instead (it is dropped and re-created)")
        name = new
    return urlunsplit(parts._replace(path="/" + name))


def db_name(url: str) -> str:
    return urlsplit(url).path.lstrip("/")


def with_db(url: str, name: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path="/" + name))


def recreate_database(url: str) -> None:
    name = db_name(url)
    with psycopg.connect(with_db(url, "postgres"), autocommit=True) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        c.execute(f'CREATE DATABASE "{name}"')


# ------------------------------------------------------------------ counters


class Counters:
    """Server-side counters read on a fresh connection (which is closed again, so
    its own commit is flushed before the next read; `overhead` is calibrated)."""

    def __init__(self, url: str):
        self.url = url
        self.overhead = 0  # commits one snapshot adds to the next delta
        self.pgss = None  # None: unavailable; else True

    def read(self) -> dict:
        with psycopg.connect(self.url, autocommit=True) as c:
            row = c.execute(
                "SELECT d.xact_commit, d.xact_rollback, d.tup_inserted, d.tup_updated, d.tup_deleted,"
                " w.wal_records, w.wal_bytes, w.wal_sync, pg_snapshot_xmax(pg_current_snapshot())::text::bigint"
                " FROM pg_stat_database d, pg_stat_wal w WHERE d.datname = current_database()"
            ).fetchone()
            out = dict(
                zip(
                    [
                        "xact_commit",
                        "xact_rollback",
                        "tup_inserted",
                        "tup_updated",
                        "tup_deleted",
                        "wal_records",
                        "wal_bytes",
                        "wal_sync",
                        "next_xid",
                    ],
                    [int(x) for x in row],
                    strict=True,
                )
            )
            if self.pgss:
                out["pgss_calls"] = int(
                    c.execute(
                        "SELECT coalesce(sum(calls), 0) FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid"
                        " WHERE d.datname = current_database()"
                    ).fetchone()[0]
                )
        out["t"] = time.time()
        time.sleep(0.3)  # let the backend exit and flush its own counters
        return out

    def calibrate(self) -> None:
        a = self.read()
        b = self.read()
        c = self.read()
        self.overhead = c["xact_commit"] - b["xact_commit"]
        if b["xact_commit"] - a["xact_commit"] != self.overhead:
            log(f"note: snapshot overhead unstable ({b['xact_commit'] - a['xact_commit']} vs {self.overhead} commits)")

    def try_pg_stat_statements(self) -> str | None:
        """Return None when pg_stat_statements works, else why it does not."""
        try:
            with psycopg.connect(self.url, autocommit=True) as c:
                c.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
                c.execute("SELECT 1 FROM pg_stat_statements LIMIT 1").fetchall()
        except Exception as exc:  # typically: must be loaded via shared_preload_libraries
            self.pgss = None
            return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0]}"
        self.pgss = True
        return None


def delta(a: dict, b: dict) -> dict:
    return {k: b[k] - a[k] for k in a if k in b}


def floor_probe(url: str, n: int = 300) -> dict:
    """The same probe the peers run first: median SELECT 1 round trip and
    BEGIN; INSERT; COMMIT on one connection (a WAL-logged table)."""
    with psycopg.connect(url) as c:
        c.execute("CREATE TABLE IF NOT EXISTS bench_probe(id bigserial primary key, v jsonb)")
        c.commit()
        rt, cm = [], []
        for _ in range(n):
            a = time.perf_counter()
            c.execute("SELECT 1").fetchone()
            c.commit()
            rt.append(time.perf_counter() - a)
        for _ in range(n):
            a = time.perf_counter()
            c.execute("INSERT INTO bench_probe(v) VALUES ('{\"a\": 1}')")
            c.commit()
            cm.append(time.perf_counter() - a)
        c.execute("DROP TABLE bench_probe")
        c.commit()
    return {
        "select1_txn_ms": round(statistics.median(rt) * 1e3, 3),
        "insert_commit_ms": round(statistics.median(cm) * 1e3, 3),
    }


def checkpoint(url: str) -> None:
    try:
        with psycopg.connect(url, autocommit=True) as c:
            c.execute("CHECKPOINT")
    except Exception as exc:
        log(f"note: CHECKPOINT failed ({type(exc).__name__}); continuing")


# ------------------------------------------------------------------ the cluster


class Cluster:
    """A real `manage.py qcluster` process group (as tests/conftest.py's Cluster)."""

    def __init__(self, url: str, workers: int, log_path: Path):
        env = dict(os.environ)
        env.update(
            {
                "DATABASE_URL": url,
                "AGENTRT_WORKERS": str(workers),
                "AGENTRT_LOG_LEVEL": os.environ.get("AGENTRT_LOG_LEVEL", "WARNING"),
                "PYTHONUNBUFFERED": "1",
            }
        )
        # The bench's runs are one tenant's: a share of every worker, so that K runs use W workers as
        # before the share existed (issue 34 item 5). The claim still counts; bench/fairness.py measures it.
        env.setdefault("AGENTRT_TENANT_MAX_RUNNING", str(workers))
        self.log_path = log_path
        self.log = open(log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "manage.py", "qcluster"],
            cwd=ROOT,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def _signal(self, sig) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        """SIGTERM to the qcluster process only: its Sentinel stops the pusher,
        workers and monitor in order (well under a second). SIGTERM to the whole
        process group instead leaves the Sentinel waiting forever."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
                self.proc.wait(timeout=10)
        # children of that session left behind (own process group, started above)
        try:
            os.killpg(self.proc.pid, 0)
            time.sleep(1)
            self._signal(signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.log.close()

    def tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


# ------------------------------------------------------------------ product calls


def django_setup(url: str) -> None:
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agentrt_site.settings")
    os.environ.setdefault("AGENTRT_LOG_LEVEL", "WARNING")
    # A throw-away key for a throw-away database (settings refuse to start without one).
    os.environ.setdefault("DJANGO_SECRET_KEY", "bench-" + secrets.token_urlsafe(50))
    sys.path.insert(0, str(ROOT))
    # here, not at the top: Django reads DATABASE_URL and the settings module, set just above
    import django

    django.setup()


def agent_definition(name: str, steps: int) -> dict:
    turns = [{"tool_calls": [{"name": "echo", "arguments": {"text": f"step {i}"}}]} for i in range(1, steps)]
    turns.append({"text": "done"})
    return {
        "name": name,
        "instructions": "benchmark agent: echo once per step, then answer",
        "model": {"provider": "scripted", "turns": turns},
        "tools": ["echo"],
        "limits": {
            "max_steps": steps + 5,
            "max_model_calls": steps + 10,
            "max_tool_calls": steps + 10,
            "deadline_seconds": 3600,
        },
    }


def setup_product(agents: dict[str, int]):
    # here, not at the top: the script sets Django up at run time, before the project's modules load
    from django.core.management import call_command

    from runs.services import agent_load, tenant_create

    call_command("migrate", verbosity=0, interactive=False)
    tenant, _ = tenant_create(name="bench", username="bench")
    for name, steps in agents.items():
        agent_load(tenant=tenant, definition=agent_definition(name, steps))
    return tenant


def fresh_product(url: str, agents: dict[str, int]):
    """The in-process benchmarks' start: drop and re-create the bench database
    at `url`, set Django up on it, migrate, and load `agents` (name -> steps);
    return the tenant."""
    recreate_database(url)
    django_setup(url)
    return setup_product(agents)


def submit(tenant, agent: str, k: int, tag: str) -> list:
    # here, not at the top: the script sets Django up at run time, before the project's modules load
    from runs.services import run_submit

    ids = []
    for i in range(k):
        run, created = run_submit(tenant=tenant, agent=agent, input=f"{tag} {i}")
        assert created
        ids.append(run.id)
    return ids


class Poller:
    """Polls the runs table on its own autocommit connection; counts its queries
    (each is one committed transaction) so they can be subtracted."""

    def __init__(self, url: str):
        self.conn = psycopg.connect(url, autocommit=True)
        self.queries = 0

    def wait(self, ids: list, timeout: float, cluster: Cluster | None, every: float = 0.05) -> float:
        t_end = time.time() + timeout
        ids_s = [str(i) for i in ids]
        while True:
            self.queries += 1
            done, bad = self.conn.execute(
                "SELECT count(*) FILTER (WHERE status = 'COMPLETED'),"
                " count(*) FILTER (WHERE status IN ('FAILED', 'CANCELLED'))"
                " FROM runs WHERE id = ANY(%s::uuid[])",
                [ids_s],
            ).fetchone()
            if done == len(ids):
                return time.time()
            if bad:
                rows = self.conn.execute(
                    "SELECT id, status, failure FROM runs WHERE id = ANY(%s::uuid[])"
                    " AND status IN ('FAILED', 'CANCELLED') LIMIT 3",
                    [ids_s],
                ).fetchall()
                raise SystemExit(f"benchmark runs ended badly: {rows}\n{cluster.tail() if cluster else ''}")
            if cluster is not None and not cluster.alive():
                raise SystemExit(f"qcluster exited (rc={cluster.proc.returncode}):\n{cluster.tail()}")
            if time.time() > t_end:
                raise SystemExit(
                    f"timed out: {done}/{len(ids)} runs COMPLETED after {timeout}s\n{cluster.tail() if cluster else ''}"
                )
            time.sleep(every)

    def close(self) -> None:
        self.conn.close()


def close_django() -> None:
    # here, not at the top: the script sets Django up at run time, before the project's modules load
    from django.db import connections

    connections.close_all()


# ------------------------------------------------------------------ figures from the events table


def pct(values: list, q: float) -> float:
    v = sorted(values)
    if len(v) == 1:
        return v[0]
    pos = (len(v) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def event_figures(url: str, ids: list, steps: int) -> dict:
    with psycopg.connect(url, autocommit=True) as c:
        rows = c.execute(
            "SELECT run_id, type, occurred_at FROM events WHERE run_id = ANY(%s::uuid[])"
            " AND type IN ('run.created', 'run.claimed', 'run.started', 'model.request.started', 'run.completed')"
            " ORDER BY run_id, sequence",
            [[str(i) for i in ids]],
        ).fetchall()
        step_counts = [
            r[0]
            for r in c.execute(
                "SELECT step_count FROM runs WHERE id = ANY(%s::uuid[])", [[str(i) for i in ids]]
            ).fetchall()
        ]
    per_run: dict = {}
    for run_id, typ, at in rows:
        per_run.setdefault(run_id, []).append((typ, at.timestamp()))
    gaps, queue, startup, finish, e2e, created, completed = [], [], [], [], [], [], []
    run_medians = []  # each run's median step
    for evs in per_run.values():
        starts = [t for typ, t in evs if typ == "model.request.started"]
        mine = [(b - a) * 1e3 for a, b in itertools.pairwise(starts)]
        gaps += mine
        if mine:
            run_medians.append(statistics.median(mine))
        first = {typ: t for typ, t in reversed(evs)}  # first occurrence of each type
        last = {typ: t for typ, t in evs}
        if {"run.created", "run.claimed", "run.completed"} <= first.keys() and starts:
            queue.append((first["run.claimed"] - first["run.created"]) * 1e3)
            startup.append((starts[0] - first["run.claimed"]) * 1e3)
            finish.append((last["run.completed"] - starts[-1]) * 1e3)
            e2e.append((last["run.completed"] - first["run.created"]) * 1e3)
            created.append(first["run.created"])
            completed.append(last["run.completed"])

    def s(v):
        return (
            {
                "median": round(statistics.median(v), 3),
                "p90": round(pct(v, 0.9), 3),
                "min": round(min(v), 3),
                "max": round(max(v), 3),
                "n": len(v),
            }
            if v
            else None
        )

    return {
        "step_gap_ms": s(gaps),
        "run_step_median_ms": s(run_medians),  # over runs: each run's median step
        "run_queue_wait_ms": s(queue),  # run.created -> run.claimed (doorbell + waiting for a free worker)
        "run_startup_ms": s(
            startup
        ),  # run.claimed -> first model.request.started (build_context, supervisor, commit 1)
        "run_finish_ms": s(finish),  # last model.request.started -> run.completed (final turn + finalize)
        "run_created_to_completed_ms": s(e2e),
        "first_created": min(created) if created else None,
        "last_completed": max(completed) if completed else None,
        "step_counts_ok": all(n == steps for n in step_counts) and len(step_counts) == len(ids),
    }


# ------------------------------------------------------------------ the statement trace (server log)

_LINE = re.compile(r"^\S+ \S+ \S+ \[(\d+)\] (\S*)@(\S*) (?:LOG|STATEMENT):\s+(statement|execute [^:]*):\s?(.*)$")
_ANY = re.compile(r"^\S+ \S+ \S+ \[\d+\] ")


def read_statements(path: str, start: int, db: str) -> list:
    """(pid, text) of every statement logged for database `db` after byte `start`."""
    with open(path, "rb") as f:
        f.seek(start)
        data = f.read().decode("utf-8", "replace")
    out: list = []
    cont = False
    for line in data.splitlines():
        m = _LINE.match(line)
        if m:
            cont = m.group(3) == db
            if cont:
                out.append([int(m.group(1)), m.group(5).strip()])
        elif cont and not _ANY.match(line):
            out[-1][1] += " " + line.strip()
        else:
            cont = False
    return [(p, t) for p, t in out]


def _kind(text: str) -> str:
    t = text.lstrip("( ").upper()
    if t in ("", ";"):
        return "ping"
    if t.startswith("WITH") and re.search(r"\b(INSERT|UPDATE|DELETE)\b", t):
        return "write"
    for k, prefixes in (
        ("begin", ("BEGIN", "START TRANSACTION")),
        ("commit", ("COMMIT",)),
        ("rollback", ("ROLLBACK",)),
        ("read", ("SELECT", "WITH", "SHOW")),
        ("write", ("INSERT", "UPDATE", "DELETE")),
        ("set", ("SET",)),
    ):
        if t.startswith(prefixes):
            return k
    return "other"


_NO_TABLE = re.compile(r"^\s*(SELECT 1\s*;?$|SELECT set_config\(|SELECT pg_backend_pid\(\)|SET |SHOW )", re.I)


def classify(stmts: list, exclude_pids: set) -> dict:
    """Split statements into transactions per backend; a transaction is `djq` when
    every statement in it touches only django-q2's tables, `other` when it touches
    no table (Django's CONN_HEALTH_CHECKS `SELECT 1`, set_config), else `runtime`."""
    out = {
        c: {"statements": 0, "txns": 0, "write_txns": 0, "reads": 0, "writes": 0} for c in ("runtime", "djq", "other")
    }
    open_txn: dict = {}

    def close(pid, items):
        body = [(k, t) for k, t in items if k not in ("begin", "commit", "rollback")]
        if body and all("django_q_" in t for _, t in body):
            cat = "djq"
        elif all(_NO_TABLE.match(t) for _, t in body):
            cat = "other"
        else:
            cat = "runtime"
        o = out[cat]
        o["statements"] += len(items)
        o["txns"] += 1
        o["reads"] += sum(1 for k, _ in body if k == "read")
        o["writes"] += sum(1 for k, _ in body if k == "write")
        if any(k == "write" for k, _ in body):
            o["write_txns"] += 1

    for pid, text in stmts:
        if pid in exclude_pids or "BENCH_MARK" in text:
            continue
        k = _kind(text)
        if k == "begin":
            open_txn[pid] = [(k, text)]
        elif pid in open_txn:
            open_txn[pid].append((k, text))
            if k in ("commit", "rollback"):
                close(pid, open_txn.pop(pid))
        elif k != "ping":
            close(pid, [(k, text)])
    return out


def segment(stmts: list, a: str, b: str) -> list:
    i = next(n for n, (_, t) in enumerate(stmts) if f"BENCH_MARK {a}" in t)
    j = next(n for n, (_, t) in enumerate(stmts) if f"BENCH_MARK {b}" in t)
    return stmts[i + 1 : j]


def trace_pass(args, url: str, tenant, agents: dict, log_path: Path) -> dict:
    """Fresh cluster with log_statement=all on the bench database (ALTER DATABASE:
    the settings' libpq `options` would override PGOPTIONS). Two batches that differ
    only in steps per run give the marginal cost of one step."""
    if not os.access(args.pg_log, os.R_OK):
        return {"error": f"cannot read the server log {args.pg_log}"}
    name = db_name(url)
    k = 1 if args.single else min(args.runs, 4)
    small, big = agents["small"], agents["main"]
    n_small, n_big = 5, args.steps
    admin = with_db(url, "postgres")
    with psycopg.connect(admin, autocommit=True) as c:
        c.execute(f"ALTER DATABASE \"{name}\" SET log_statement = 'all'")
    close_django()
    start = os.path.getsize(args.pg_log)
    cluster = Cluster(url, args.workers, log_path)
    poller = None
    try:
        warm = submit(tenant, "warm", args.workers, "trace-warm")
        close_django()
        poller = Poller(url)
        mine = {poller.conn.execute("SELECT pg_backend_pid()").fetchone()[0]}
        poller.wait(warm, 120, cluster)

        def mark(label):
            poller.conn.execute(f"SELECT 'BENCH_MARK {label}'")

        # here, not at the top: the script sets Django up at run time, before the project's modules load
        from django.db import connection

        results = {}
        for label, agent in (("S", small), ("B", big)):
            mark(label + "0")
            with connection.cursor() as cur:
                cur.execute("SELECT pg_backend_pid()")
                mine.add(cur.fetchone()[0])
            ids = submit(tenant, agent, k, f"trace-{label}")
            poller.wait(ids, args.timeout, cluster)
            time.sleep(0.2)
            mark(label + "1")
            results[label] = ids
    finally:
        if poller:
            poller.close()
        cluster.stop()
        close_django()
        with psycopg.connect(admin, autocommit=True) as c:
            c.execute(f'ALTER DATABASE "{name}" RESET log_statement')
    time.sleep(0.5)
    stmts = read_statements(args.pg_log, start, name)
    s = classify(segment(stmts, "S0", "S1"), mine)
    b = classify(segment(stmts, "B0", "B1"), mine)
    dn = k * (n_big - n_small)
    rt_s, rt_b = s["runtime"], b["runtime"]
    marginal = {key: round((rt_b[key] - rt_s[key]) / dn, 2) for key in rt_b} if dn > 0 else None
    average = {key: round(rt_b[key] / (k * n_big), 2) for key in rt_b}
    per_run_fixed = {key: round((rt_b[key] - marginal[key] * k * n_big) / k, 1) for key in rt_b} if marginal else None
    # a sample of one step's statements from the middle of one run (worker backends only)
    seg = [x for x in segment(stmts, "B0", "B1") if x[0] not in mine and "django_q_" not in x[1]]
    by_pid: dict = {}
    for pid, t in seg:
        by_pid.setdefault(pid, []).append(t)
    longest = max(by_pid.values(), key=len) if by_pid else []
    mid = len(longest) // 2
    sample = []
    # align on the fenced UPDATE that starts a step's commit
    idx = [i for i, t in enumerate(longest) if t.upper().startswith("BEGIN")]
    if idx:
        i0 = min(idx, key=lambda i: abs(i - mid))
        sample = [re.sub(r"\s+", " ", t)[:150] for t in longest[i0 : i0 + 16]]
    return {
        "runs_per_batch": k,
        "steps_small": n_small,
        "steps_big": n_big,
        "runtime_per_step_marginal": marginal,
        "runtime_per_step_average": average,
        "runtime_per_run_fixed": per_run_fixed,
        "djq_side_big_batch": b["djq"],
        "no_table_big_batch": b["other"],
        "sample_step_statements": sample,
        "note": (
            "runtime = transactions that touch agentrt tables (worker + heartbeat backends; "
            "the bench's own submits excluded); "
            "djq = transactions on django-q2 tables only (pusher polling, result saves); "
            "no_table = SELECT 1 health checks and set_config. statements include BEGIN/COMMIT."
        ),
    }


# ------------------------------------------------------------------ main


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.long:
        import long_run  # the sibling script (bench/ is on sys.path when this one runs)

        return long_run.main(args)
    url = bench_url(args.database_url)
    cluster_log = (
        Path(args.cluster_log)
        if args.cluster_log
        else Path(tempfile.mkstemp(prefix="agentrt-bench-qcluster-", suffix=".log")[1])
    )
    log(f"bench database: {db_name(url)} (dropped and re-created); qcluster log: {cluster_log}")
    load_before = os.getloadavg()
    recreate_database(url)
    django_setup(url)
    agents = {"main": f"bench-{args.steps}", "small": "bench-5", "warm": "warm"}
    tenant = setup_product({agents["main"]: args.steps, "bench-5": 5, "warm": 3})
    close_django()

    counters = Counters(url)
    pgss_error = counters.try_pg_stat_statements()
    probe = floor_probe(url)
    counters.calibrate()

    # -- submit side, measured with no cluster running: W warm-up runs
    s0 = counters.read()
    warm = submit(tenant, "warm", args.workers, "warm")
    close_django()
    time.sleep(0.3)
    s1 = counters.read()
    d = delta(s0, s1)
    submit_commits = (d["xact_commit"] - counters.overhead) / args.workers
    submit_xids = d["next_xid"] / args.workers

    checkpoint(url)
    cluster = Cluster(url, args.workers, cluster_log)
    t_start = time.time()
    poller = Poller(url)
    try:
        poller.wait(warm, 120, cluster)
        ready_s = time.time() - t_start
        poller.close()
        log(
            f"cluster warm after {ready_s:.1f}s; settling {args.settle_seconds:.0f}s, then {args.idle_seconds:.0f}s "
            "idle window"
        )
        time.sleep(args.settle_seconds)
        i0 = counters.read()
        time.sleep(args.idle_seconds)
        i1 = counters.read()
        di = delta(i0, i1)
        idle_s = i1["t"] - i0["t"]
        idle_rate = (di["xact_commit"] - counters.overhead) / idle_s
        idle_xid_rate = di["next_xid"] / idle_s

        # -- the measured window
        m0 = i1
        poller = Poller(url)
        t0 = time.time()
        ids: list = []
        for r in range(args.repeats):
            batch = submit(tenant, agents["main"], args.runs, f"bench {r}")
            if r == 0:
                t_submitted = time.time()
            poller.wait(batch, args.timeout, cluster)
            ids += batch
        poller.close()
        close_django()
        t_term = time.time()
    finally:
        cluster.stop()
        poller.close()
    t_stop = time.time()
    time.sleep(0.5)
    m1 = counters.read()
    dm = delta(m0, m1)

    ev = event_figures(url, ids, args.steps)
    if not ev["step_counts_ok"]:
        log("WARNING: some runs did not take exactly N steps")
    steps_total = args.runs * args.steps * args.repeats
    wall = ev["last_completed"] - t0
    window = t_term - m0["t"]  # the idle pollers ran this long inside the window (then SIGTERM)
    commits_raw = dm["xact_commit"] - counters.overhead - poller.queries
    commits_adj = commits_raw - idle_rate * window - submit_commits * len(ids)
    xids_raw = dm["next_xid"]
    xids_adj = xids_raw - submit_xids * len(ids) - idle_xid_rate * window

    stmts = None
    if counters.pgss and "pgss_calls" in dm:
        stmts = {"raw_per_step": round((dm["pgss_calls"] - poller.queries) / steps_total, 2)}
    trace = trace_pass(args, url, tenant, agents, cluster_log) if args.trace else None

    result = {
        "bench": "agentrt_steps",
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.argv[0]).name] + sys.argv[1:]) if argv is None else " ".join(argv),
        "mode": "single" if args.single else "batch",
        "floor_probe_before": probe,
        "versions": {
            "python": platform.python_version(),
            **{k: md.version(k) for k in ("django", "django-q2", "psycopg")},
        },
        "loadavg_1m": {"before": round(load_before[0], 2), "after": round(os.getloadavg()[0], 2)},
        "params": {
            "K": args.runs,
            "N": args.steps,
            "repeats": args.repeats,
            "W": args.workers,
            "database": db_name(url),
            "poll_s": float(os.environ.get("AGENTRT_Q_POLL", "0.02")),
            "doorbell": os.environ.get("AGENTRT_Q_DOORBELL", "1") == "1",
            "fallback_poll_s": float(os.environ.get("AGENTRT_Q_FALLBACK_POLL", "0.5")),
            "cluster_ready_s": round(ready_s, 2),
        },
        "results": {
            "total_steps": steps_total,
            "wall_s": round(wall, 3),
            "steps_per_sec": round(steps_total / wall, 1),
            "wall_ms_per_step": round(wall * 1e3 / steps_total, 3),
            "per_step_ms": ev["step_gap_ms"],
            "per_run_step_ms": ev["run_step_median_ms"],
            "per_run_ms": {
                "queue_wait": ev["run_queue_wait_ms"],
                "startup": ev["run_startup_ms"],
                "finish": ev["run_finish_ms"],
                "created_to_completed": ev["run_created_to_completed_ms"],
            },
            "submit_s": round(t_submitted - t0, 3),
            "commits_per_step": {
                "raw": round(commits_raw / steps_total, 3),
                "idle_adjusted": round(commits_adj / steps_total, 3),
            },
            "commits_detail": {
                "window_delta": dm["xact_commit"],
                "snapshot_overhead": counters.overhead,
                "bench_polls": poller.queries,
                "idle_commits_per_s": round(idle_rate, 1),
                "idle_window_s": round(idle_s, 2),
                "measured_window_s": round(window, 2),
                "cluster_stop_s": round(t_stop - t_term, 2),
                "submit_commits_per_run": round(submit_commits, 2),
                "note": (
                    "raw = window delta - snapshot overhead - the bench's own polls "
                    "(includes the submits, the idle polling and the cluster's shutdown); "
                    "idle_adjusted = raw - idle rate x window - submit commits: "
                    "the workers' commits for the runs only. "
                    "Precision about +-1 s of idle polling (PostgreSQL flushes busy backends' counters once a second)."
                ),
            },
            "write_txns_per_step": {
                "raw": round(xids_raw / steps_total, 3),
                "adjusted": round(xids_adj / steps_total, 3),
                "submit_per_run": round(submit_xids, 2),
                "idle_per_s": round(idle_xid_rate, 2),
                "note": "transaction ids assigned (cluster-wide: exact only if nothing else writes meanwhile)",
            },
            "wal_per_step": {
                "wal_records": round(dm["wal_records"] / steps_total, 2),
                "wal_bytes": round(dm["wal_bytes"] / steps_total, 1),
                "wal_sync": round(dm["wal_sync"] / steps_total, 3),
            },
            "tuples_per_step": {
                "inserted": round(dm["tup_inserted"] / steps_total, 2),
                "updated": round(dm["tup_updated"] / steps_total, 2),
            },
            "statements_per_step": stmts
            if stmts
            else {
                "available": False,
                "reason": pgss_error or "no pg_stat_statements counts",
                "hint": (
                    "pg_stat_statements needs shared_preload_libraries (server restart); "
                    "--trace counts them from the server log"
                ),
            },
        },
    }
    if trace is not None:
        result["trace"] = trace
    print(json.dumps(result), flush=True)
    print_table(result)
    return result


def print_table(r: dict) -> None:
    p, res = r["params"], r["results"]
    g = res["per_step_ms"] or {}
    c = res["commits_per_step"]
    cd = res["commits_detail"]
    rows = [
        (
            "mode",
            f"{r['mode']}: K={p['K']} runs x N={p['N']} steps, W={p['W']} workers, {p['repeats']} time(s) "
            f"(db {p['database']})",
        ),
        ("total steps", f"{res['total_steps']}"),
        ("wall time", f"{res['wall_s']:.2f} s  (first run_submit -> last run.completed)"),
        ("steps/s", f"{res['steps_per_sec']:.1f}   ({res['wall_ms_per_step']:.2f} ms/step wall)"),
        (
            "per-step ms",
            f"median {g.get('median', float('nan')):.2f}   p90 {g.get('p90', float('nan')):.2f}   "
            f"(gaps between model.request.started, n={g.get('n', 0)})",
        ),
        (
            "per-run step ms",
            "median {:.2f}   min {:.2f}   max {:.2f}   (each run's median step, n={})".format(
                *((res["per_run_step_ms"] or {}).get(k, float("nan")) for k in ("median", "min", "max")),
                (res["per_run_step_ms"] or {}).get("n", 0),
            ),
        ),
        (
            "per-run ms",
            "startup {:.1f}  finish {:.1f}  queue wait {:.1f} (medians)".format(
                *(
                    ((res["per_run_ms"][k] or {}).get("median", float("nan")))
                    for k in ("startup", "finish", "queue_wait")
                )
            ),
        ),
        (
            "commits/step",
            f"raw {c['raw']:.2f}   idle-adjusted {c['idle_adjusted']:.2f}   "
            f"(idle cluster {cd['idle_commits_per_s']:.1f}/s, submit {cd['submit_commits_per_run']:.1f}/run)",
        ),
        ("write txns/step", f"{res['write_txns_per_step']['adjusted']:.2f}   (xid delta, cluster-wide)"),
        ("WAL fsyncs/step", f"{res['wal_per_step']['wal_sync']:.2f}"),
    ]
    st = res["statements_per_step"]
    rows.append(
        (
            "statements/step",
            f"{st['raw_per_step']:.2f}" if "raw_per_step" in st else f"unavailable ({st['reason'][:90]})",
        )
    )
    tr = r.get("trace")
    if tr and tr.get("runtime_per_step_marginal"):
        m = tr["runtime_per_step_marginal"]
        rows.append(
            (
                "trace: per step",
                f"{m['statements']:.1f} statements, {m['txns']:.2f} txns ({m['write_txns']:.2f} writing), "
                f"{m['reads']:.1f} reads, {m['writes']:.1f} writes (marginal, log_statement)",
            )
        )
        f = tr["runtime_per_run_fixed"]
        rows.append(("trace: per run", f"{f['statements']:.0f} statements, {f['txns']:.0f} txns fixed"))
    elif tr:
        rows.append(("trace", json.dumps(tr)[:120]))
    rows.append(
        (
            "load average",
            f"{r['loadavg_1m']['before']:.2f} before, {r['loadavg_1m']['after']:.2f} after (2 cores: > 0.5 means "
            "someone else was busy)",
        )
    )
    rows.append(
        (
            "floor",
            f"SELECT 1 {r['floor_probe_before']['select1_txn_ms']:.3f} ms, "
            f"BEGIN+INSERT+COMMIT {r['floor_probe_before']['insert_commit_ms']:.3f} ms",
        )
    )
    w = max(len(k) for k, _ in rows)
    log("")
    for k, v in rows:
        log(f"  {k.ljust(w)}  {v}")
    log("")


if __name__ == "__main__":
    main()
