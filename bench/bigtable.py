#!/usr/bin/env python
"""Flat in table size and waiting runs (issue 16 item 5).

    python bench/bigtable.py fill    [--waiting 10000] [--events 10000000]   # build the big database (minutes)
    python bench/bigtable.py steps   [--rounds 3] [--steps 200]              # step cost: empty vs big, A/B/A/B
    python bench/bigtable.py explain [--json PATH]                           # EXPLAIN (ANALYZE, BUFFERS) of the reads
    python bench/bigtable.py rss     [--runs 10000] [--every 500]            # worker RSS over many small runs
    python bench/bigtable.py drop                                            # drop the databases it made

Databases (on `--database-url`'s server; every name carries that URL's
database name, e.g. agentrt_latency): `<name>_big` (filled once by `fill`,
reused by every other command until `drop`) and `<name>_empty_bench` (made
by `steps` when missing).

`fill` migrates the big database and writes real rows first: in this process
it drives three template runs through the product (`run_submit`, `run_drive`):
a completed 14-step echo run, the same with its checkpoint chain pruned, and a
run that waits on a policy approval of an `http_post` call. Then it clones
them in SQL (`INSERT ... SELECT` over `generate_series`, in chunks): every
row of a template run (runs, sessions, events, model_calls, tool_invocations,
checkpoints, approvals) with fresh ids and times shifted over the last 30
days, until the events table holds `--events` rows, with `--waiting` runs
WAITING_FOR_APPROVAL with a pending approval (in the tenant the measured runs
use; its quota raised). Completed runs are spread over four tenants; one in
ten keeps its whole checkpoint chain (the prune sweep's work). Secondary
indexes of the cloned tables are dropped during the load and rebuilt after
it (same definitions); the ended runs are folded into `metric_totals` (the
`metrics` sweep, until nothing is left, as a deployment's maintenance would
have done as they ended), then the tables are ANALYZEd.

`steps` measures what `bench/steps.py --single` does — one run of `--steps`
echo steps on a real `qcluster` with one worker, per-step time from the gaps
between its `model.request.started` events — alternately on the empty and
the big database, `--rounds` times each, with the buffer reads and hits per
step from pg_stat_database.

`explain` runs the reads users and the maintenance sweeps make, on the big
database, with the parameters a real caller would pass (a waiting run with
history, the live socket's cursor, ...), under EXPLAIN (ANALYZE, BUFFERS),
and says for each whether the plan scans a whole table.

`rss` runs `--runs` small runs (one echo step and an answer) through a real
`qcluster` with one worker on the big database and samples the worker
process's VmRSS from /proc every `--every` completed runs.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
import steps as bench

ROOT = bench.ROOT
DAY = 86400


def log(*a) -> None:
    print(*a, file=sys.stderr, flush=True)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("command", choices=["fill", "steps", "explain", "rss", "drop"])
    p.add_argument(
        "--database-url",
        default=os.environ.get("DATABASE_URL") or "postgres://postgres@127.0.0.1:5432/agentrt",
        help="server and name prefix: the databases are <name>_big and <name>_empty_bench",
    )
    p.add_argument("--waiting", type=int, default=10_000, help="runs waiting on an approval (fill)")
    p.add_argument("--events", type=int, default=10_000_000, help="rows in the events table after fill")
    p.add_argument("--chunk", type=int, default=5_000, help="runs cloned per INSERT (fill)")
    p.add_argument("--rounds", type=int, default=3, help="A/B rounds (steps)")
    p.add_argument("--steps", type=int, default=200, help="steps of the measured run (steps)")
    p.add_argument("--runs", type=int, default=10_000, help="runs (rss)")
    p.add_argument("--every", type=int, default=100, help="sample RSS every N completed runs (rss)")
    p.add_argument("--in-process", action="store_true", help="rss: drive the runs in this process (no recycling)")
    p.add_argument("--json", default=None, help="also write the result here")
    return p.parse_args(argv)


def names(url: str) -> tuple[str, str]:
    base = urlsplit(url).path.lstrip("/") or "agentrt"
    return bench.with_db(url, base + "_big"), bench.with_db(url, base + "_empty_bench")


def connect(url: str, **kw):
    return psycopg.connect(url, autocommit=True, **kw)


def exists(url: str) -> bool:
    with connect(bench.with_db(url, "postgres")) as c:
        return bool(c.execute("SELECT 1 FROM pg_database WHERE datname = %s", [bench.db_name(url)]).fetchone())


def create(url: str) -> None:
    with connect(bench.with_db(url, "postgres")) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{bench.db_name(url)}" WITH (FORCE)')
        c.execute(f'CREATE DATABASE "{bench.db_name(url)}"')


# ------------------------------------------------------------------ agents


def echo_agent(name: str, steps: int) -> dict:
    return bench.agent_definition(name, steps)


WAITER = {
    "name": "waiter",
    "instructions": "two lookups, then a post an operator must approve",
    "model": {
        "provider": "scripted",
        "turns": [
            {"tool_calls": [{"name": "echo", "arguments": {"text": "look up the release"}}]},
            {"tool_calls": [{"name": "echo", "arguments": {"text": "check the change log"}}]},
            {
                "tool_calls": [
                    {
                        "name": "http_post",
                        "arguments": {"url": "http://127.0.0.1:9/hook", "json": {"release": "1.4.2", "amount": 250}},
                    }
                ]
            },
            {"text": "Deployed."},
        ],
    },
    "tools": ["echo", "http_post"],
    "policy": {"default": "allow", "rules": [{"tool": "http_post", "decision": "require_approval"}]},
    "limits": {"max_steps": 10, "deadline_seconds": 30 * DAY},
}


def product_setup(url: str, tenants: list[str], quota: int) -> dict:
    """Migrate; tenants with the same agents; returns {tenant name: tenant}."""
    bench.django_setup(url)
    # here, not at the top: the script sets Django up at run time, before the project's modules load
    from django.core.management import call_command

    from runs.services import agent_load, tenant_configure, tenant_create

    call_command("migrate", verbosity=0, interactive=False)
    out = {}
    for i, name in enumerate(tenants):
        tenant, _ = tenant_create(name=name, username=f"{name}-user")
        if i == 0:
            tenant_configure(tenant=tenant, max_active_runs=quota)
        for definition in (echo_agent("echo14", 14), echo_agent("small", 2), echo_agent("bench-200", 200), WAITER):
            agent_load(tenant=tenant, definition=definition)
        out[name] = tenant
    return out


# ------------------------------------------------------------------ fill

CLONED = ("sessions", "runs", "model_calls", "tool_invocations", "checkpoints", "events", "approvals")


def columns(c, table: str) -> list[tuple[str, str]]:
    return c.execute(
        "SELECT column_name, data_type FROM information_schema.columns WHERE table_name = %s ORDER BY ordinal_position",
        [table],
    ).fetchall()


def clone_sql(c, table: str, where: str, overrides: dict[str, str]) -> str:
    """INSERT INTO table SELECT <template row with overrides> FROM g (the
    generated runs: n, run_id, session_id, tenant_id, agent_id, shift),
    t (the template rows: `where`). Timestamps move by g.shift; ids are
    md5(new run id || template id), so a row that names another cloned row
    (an approval's invocation) can compute its id the same way."""
    cols, exprs = [], []
    for name, typ in columns(c, table):
        if table == "events" and name == "id":
            continue  # bigserial
        cols.append(f'"{name}"')
        if name in overrides:
            exprs.append(overrides[name])
        elif name in ("id", "invocation_id") and typ == "uuid":
            exprs.append(f"CASE WHEN t.{name} IS NULL THEN NULL ELSE md5(g.run_id::text || t.{name}::text)::uuid END")
        elif name == "run_id":
            exprs.append("g.run_id")
        elif name == "session_id":
            exprs.append("g.session_id")
        elif name == "tenant_id":
            exprs.append("g.tenant_id")
        elif name == "agent_id":
            exprs.append("g.agent_id")
        elif typ.startswith("timestamp"):
            exprs.append(f"t.{name} + g.shift")
        else:
            exprs.append(f"t.{name}")
    return f"INSERT INTO {table} ({', '.join(cols)}) SELECT {', '.join(exprs)} FROM g, {table} t WHERE {where}"


def secondary_indexes(c, table: str) -> list[tuple[str, str, str | None]]:
    """(name, CREATE statement, constraint name or None) of every index but the primary key."""
    return c.execute(
        "SELECT i.relname, pg_get_indexdef(i.oid), con.conname"
        " FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid JOIN pg_class t ON t.oid = x.indrelid"
        " LEFT JOIN pg_constraint con ON con.conindid = i.oid AND con.contype = 'u'"
        " WHERE t.relname = %s AND NOT x.indisprimary",
        [table],
    ).fetchall()


def make_templates(tenant) -> dict:
    # here, not at the top: the script sets Django up at run time, before the project's modules load
    from checkpoints.models import Checkpoint
    from runs.models import Run
    from runs.runtime.executor import run_drive
    from runs.services import run_submit

    done, _ = run_submit(tenant=tenant, agent="echo14", input="template: a finished run")
    assert run_drive(run_id=done.id).kind.value == "completed"
    waiting, _ = run_submit(tenant=tenant, agent="waiter", input="template: a run waiting on an approval")
    assert run_drive(run_id=waiting.id).kind.value == "suspended"
    assert Run.objects.get(id=waiting.id).status == "WAITING_FOR_APPROVAL"
    final = Checkpoint.objects.filter(run_id=done.id, full=True).order_by("-version").values_list("version", flat=True)
    return {"done": done.id, "final_version": final.first(), "waiting": waiting.id}


def fill(args, url: str) -> dict:
    t_start = time.time()
    create(url)
    tenants = product_setup(url, ["bench", "big-1", "big-2", "big-3"], quota=args.waiting * 2 + 1000)
    tmpl = make_templates(tenants["bench"])
    bench.close_django()
    c = connect(url)
    c.execute("SET maintenance_work_mem = '512MB'")
    c.execute("SET synchronous_commit = off")  # this session's own commits only: the load, not the product
    per_done = c.execute("SELECT count(*) FROM events WHERE run_id = %s", [tmpl["done"]]).fetchone()[0]
    per_wait = c.execute("SELECT count(*) FROM events WHERE run_id = %s", [tmpl["waiting"]]).fetchone()[0]
    have = c.execute("SELECT count(*) FROM events").fetchone()[0]
    n_done = max(0, (args.events - have - args.waiting * per_wait + per_done - 1) // per_done)
    log(f"templates: {per_done} events a finished run, {per_wait} a waiting one; cloning {n_done} + {args.waiting}")
    dropped = []
    for table in CLONED:
        for name, ddl, constraint in secondary_indexes(c, table):
            dropped.append((table, name, ddl, constraint))
            if constraint:
                c.execute(f'ALTER TABLE {table} DROP CONSTRAINT "{constraint}"')
            else:
                c.execute(f'DROP INDEX "{name}"')
    tenant_ids = [str(t.id) for t in tenants.values()]
    bench_tenant = tenant_ids[0]
    now = time.time()

    def clone(kind: str, total: int, template, where_ckpt: str, t_from: float, t_to: float):
        done = 0
        while done < total:
            k = min(args.chunk, total - done)
            c.execute("DROP TABLE IF EXISTS g")
            # g: the runs of this chunk; `shift` moves the template's times to the new run's
            ids = tenant_ids if kind == "done" else [bench_tenant]
            c.execute(
                """
                CREATE TEMP TABLE g AS
                SELECT s.n, gen_random_uuid() AS run_id, gen_random_uuid() AS session_id, tn.tenant_id,
                       a.id AS agent_id,
                       to_timestamp(%(t_from)s + (%(t_to)s - %(t_from)s) * (s.n::float / %(total)s::int))
                         - (SELECT created_at FROM runs WHERE id = %(tmpl)s) AS shift
                FROM generate_series(%(lo)s::int, %(hi)s::int) AS s(n)
                CROSS JOIN LATERAL (SELECT (%(tenants)s::uuid[])[1 + s.n %% %(nt)s::int] AS tenant_id) tn
                JOIN agents a ON a.tenant_id = tn.tenant_id AND a.name = %(agent)s
                """,
                {
                    "t_from": t_from,
                    "t_to": t_to,
                    "total": total,
                    "tmpl": template,
                    "lo": done + 1,
                    "hi": done + k,
                    "tenants": ids,
                    "nt": len(ids),
                    "agent": "echo14" if kind == "done" else "waiter",
                },
            )
            tw = f"t.id = '{template}'"
            tr = f"t.run_id = '{template}'"
            c.execute(
                clone_sql(
                    c,
                    "sessions",
                    f"t.id = (SELECT session_id FROM runs WHERE id = '{template}')",
                    {"id": "g.session_id"},
                )
            )
            c.execute(clone_sql(c, "runs", tw, {"id": "g.run_id", "idempotency_key": "NULL"}))
            c.execute(clone_sql(c, "model_calls", tr, {}))
            c.execute(
                clone_sql(
                    c,
                    "tool_invocations",
                    tr,
                    {"idempotency_key": f"replace(t.idempotency_key, '{template}', g.run_id::text)"},
                )
            )
            c.execute(clone_sql(c, "checkpoints", f"{tr} AND ({where_ckpt})", {}))
            c.execute(clone_sql(c, "events", tr, {}) + " ORDER BY g.n, t.sequence")
            c.execute(clone_sql(c, "approvals", tr, {}))
            done += k
            log(f"  {kind}: {done}/{total} runs ({time.time() - t_start:.0f} s)")

    # finished runs over the last 30 days; one in ten keeps its whole checkpoint chain
    final = tmpl["final_version"]
    clone(
        "done",
        n_done,
        tmpl["done"],
        f"t.version = {final} OR g.n % 10 = 0",
        now - 30 * DAY,
        now - 2 * DAY,
    )
    # waiting runs over the last two days, their approvals pending (expiry and deadline weeks ahead)
    clone("waiting", args.waiting, tmpl["waiting"], "true", now - 2 * DAY, now - 600)
    c.execute("DROP TABLE IF EXISTS g")
    c.execute("UPDATE approvals SET expires_at = now() + interval '30 days' WHERE status = 'pending'")
    c.execute("UPDATE runs SET deadline_at = now() + interval '60 days' WHERE status = 'WAITING_FOR_APPROVAL'")
    log(f"rows written ({time.time() - t_start:.0f} s); rebuilding {len(dropped)} indexes")
    for table, name, ddl, constraint in dropped:
        if constraint:
            c.execute(ddl)
            c.execute(f'ALTER TABLE {table} ADD CONSTRAINT "{constraint}" UNIQUE USING INDEX "{name}"')
        else:
            c.execute(ddl)
    # A deployment's maintenance folds each ended run into metric_totals once it has settled (the `metrics`
    # sweep); the clones were written behind its back, so they are folded here, as the sweep would have.
    t_fold = time.time()
    folded = fold_history()
    log(f"folded {folded} ended runs into metric_totals ({time.time() - t_fold:.0f} s)")
    c.execute("VACUUM ANALYZE")
    counts = {t: c.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in CLONED}
    counts["waiting_runs"] = c.execute("SELECT count(*) FROM runs WHERE status = 'WAITING_FOR_APPROVAL'").fetchone()[0]
    counts["pending_approvals"] = c.execute("SELECT count(*) FROM approvals WHERE status = 'pending'").fetchone()[0]
    size = c.execute("SELECT pg_size_pretty(pg_database_size(current_database()))").fetchone()[0]
    c.close()
    out = {"database": bench.db_name(url), "rows": counts, "size": size, "fill_s": round(time.time() - t_start)}
    log(json.dumps(out))
    return out


# ------------------------------------------------------------------ steps: empty vs big, A/B/A/B


def manage(url: str, *args: str, timeout: float = 900) -> str:
    env = dict(os.environ, DATABASE_URL=url, AGENTRT_LOG_LEVEL="WARNING")
    env.pop("REDIS_URL", None)
    out = subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )
    if out.returncode != 0:
        raise SystemExit(f"manage.py {' '.join(args)} failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    return out.stdout.strip().splitlines()[-1]


def db_counters(url: str) -> dict:
    with connect(url) as c:
        row = c.execute(
            "SELECT blks_read, blks_hit, xact_commit, tup_inserted FROM pg_stat_database"
            " WHERE datname = current_database()"
        ).fetchone()
    time.sleep(0.3)
    return dict(zip(("blks_read", "blks_hit", "xact_commit", "tup_inserted"), row, strict=True))


def one_run(url: str, steps: int, logs: Path, label: str) -> dict:
    """A warm-up run and then one `bench-<steps>` run on a fresh 1-worker qcluster."""
    cluster = bench.Cluster(url, 1, logs / f"qcluster-{label}.log")
    try:
        warm = manage(url, "submit_run", "--agent", "small", "--input", f"warm {label}", "--tenant", "bench", "--wait")
        if warm != "COMPLETED":
            raise SystemExit(f"warm-up run ended {warm}:\n{cluster.tail()}")
        before = db_counters(url)
        t0 = time.time()
        out = subprocess.run(
            [
                sys.executable,
                "manage.py",
                "submit_run",
                "--agent",
                f"bench-{steps}",
                "--input",
                f"measured {label}",
                "--tenant",
                "bench",
                "--wait",
            ],
            cwd=ROOT,
            env=dict(os.environ, DATABASE_URL=url, AGENTRT_LOG_LEVEL="WARNING"),
            capture_output=True,
            text=True,
            timeout=900,
        )
        lines = out.stdout.strip().splitlines()
        if out.returncode != 0 or lines[-1] != "COMPLETED":
            raise SystemExit(f"measured run failed: {out.stdout[-1000:]} {out.stderr[-1000:]}\n{cluster.tail()}")
        run_id = lines[0]
        wall = time.time() - t0
    finally:
        cluster.stop()
    time.sleep(0.5)
    after = db_counters(url)
    ev = bench.event_figures(url, [run_id], steps)
    d = {k: after[k] - before[k] for k in before}
    return {
        "step_ms": ev["step_gap_ms"],
        "startup_ms": ev["run_startup_ms"],
        "wall_s": round(wall, 2),
        "blocks_read_per_step": round(d["blks_read"] / steps, 2),
        "blocks_hit_per_step": round(d["blks_hit"] / steps, 1),
        "rows_inserted_per_step": round(d["tup_inserted"] / steps, 2),
    }


def steps_ab(args, big: str, empty: str) -> dict:
    if not exists(big):
        raise SystemExit(f"{bench.db_name(big)} does not exist: run `bench/bigtable.py fill` first")
    if not exists(empty):
        create(empty)
        product_setup(empty, ["bench"], quota=1000)
        bench.close_django()
    logs = Path(tempfile.mkdtemp(prefix="agentrt-bigtable-"))
    log(f"logs: {logs}")
    sizes = {}
    for url in (empty, big):
        with connect(url) as c:
            sizes[bench.db_name(url)] = {
                "events": c.execute("SELECT reltuples::bigint FROM pg_class WHERE relname = 'events'").fetchone()[0],
                "waiting_runs": c.execute("SELECT count(*) FROM runs WHERE status = 'WAITING_FOR_APPROVAL'").fetchone()[
                    0
                ],
            }
    rounds = []
    for r in range(1, args.rounds + 1):
        for label, url in (("empty", empty), ("big", big)):
            bench.checkpoint(url)
            probe = bench.floor_probe(url, n=100)
            load = os.getloadavg()[0]
            res = one_run(url, args.steps, logs, f"{label}-{r}")
            res.update({"round": r, "db": label, "floor": probe, "loadavg_1m": round(load, 2)})
            rounds.append(res)
            log(
                f"  round {r} {label:5}: step median {res['step_ms']['median']:.2f} ms"
                f" (p90 {res['step_ms']['p90']:.2f}), blocks read/step {res['blocks_read_per_step']},"
                f" hit/step {res['blocks_hit_per_step']}, load {load:.2f}"
            )
    med = {
        label: statistics.median(x["step_ms"]["median"] for x in rounds if x["db"] == label)
        for label in ("empty", "big")
    }
    per_round = [
        round(b["step_ms"]["median"] / a["step_ms"]["median"], 3)
        for a, b in zip(rounds[0::2], rounds[1::2], strict=True)
    ]
    return {
        "steps": args.steps,
        "databases": sizes,
        "rounds": rounds,
        "median_step_ms": {k: round(v, 3) for k, v in med.items()},
        "ratio_big_over_empty": round(med["big"] / med["empty"], 3),
        "ratio_per_round": per_round,
        "target_ratio": 1.1,
    }


# ------------------------------------------------------------------ explain: the reads on the big database

SCANNED = ("events", "runs", "approvals", "checkpoints", "model_calls", "tool_invocations", "sessions")


class Capture:
    """An execute_wrapper that EXPLAINs every statement before running it:
    (ANALYZE, BUFFERS) for reads, a plain EXPLAIN for writes (ANALYZE would
    run the write twice)."""

    def __init__(self):
        self.label = ""
        self.rows: list[dict] = []

    def __call__(self, execute, sql, params, many, context):
        head = sql.lstrip().split(None, 1)[0].upper() if sql.strip() else ""
        if head in ("SELECT", "WITH", "UPDATE", "DELETE", "INSERT") and not many:
            read = head == "SELECT" or (head == "WITH" and not re.search(r"\b(UPDATE|INSERT|DELETE)\b", sql, re.I))
            opts = "ANALYZE, BUFFERS, TIMING OFF" if read else "COSTS"
            cursor = context["cursor"]
            try:
                cursor.execute(f"EXPLAIN ({opts}) {sql}", params)
                plan = "\n".join(r[0] for r in cursor.fetchall())
            except Exception as exc:  # a statement EXPLAIN cannot take (e.g. NOTIFY): noted, not fatal
                plan = f"(no plan: {type(exc).__name__}: {str(exc).splitlines()[0]})"
            seq = sorted({t for t in re.findall(r"Seq Scan on (\w+)", plan) if t in SCANNED})
            m = re.search(r"Execution Time: ([\d.]+) ms", plan)
            self.rows.append(
                {
                    "label": self.label,
                    "sql": re.sub(r"\s+", " ", sql)[:400],
                    "analyzed": read,
                    "seq_scans": seq,
                    "execution_ms": float(m.group(1)) if m else None,
                    "plan": plan,
                }
            )
        return execute(sql, params, many, context)


def explain(args, big: str) -> dict:
    if not exists(big):
        raise SystemExit(f"{bench.db_name(big)} does not exist: run `bench/bigtable.py fill` first")
    copy = bench.with_db(big, bench.db_name(big) + "_x")
    t0 = time.time()
    with connect(bench.with_db(big, "postgres")) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{bench.db_name(copy)}" WITH (FORCE)')
        c.execute(f'CREATE DATABASE "{bench.db_name(copy)}" TEMPLATE "{bench.db_name(big)}" STRATEGY FILE_COPY')
    log(f"working on a copy, {bench.db_name(copy)} ({time.time() - t0:.0f} s to copy); the sweeps really run there")
    try:
        return _explain(copy)
    finally:
        bench.close_django()
        with connect(bench.with_db(big, "postgres")) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{bench.db_name(copy)}" WITH (FORCE)')


def fold_history() -> int:
    """The `metrics` sweep, again and again, until it folds nothing more."""
    # here, not at the top: the script sets Django up at run time, before the project's modules load
    from maintenance.sweeps.metrics import sweep_metrics

    total = 0
    while n := sweep_metrics().get("folded_runs", 0):
        total += n
    return total


def _explain(url: str) -> dict:
    bench.django_setup(url)
    # here, not at the top: the script sets Django up at run time, before the project's modules load
    from asgiref.sync import async_to_sync
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.test import Client

    from maintenance.sweeps.deliveries import sweep_deliveries
    from maintenance.sweeps.expiry import sweep_expiry
    from maintenance.sweeps.metrics import sweep_metrics
    from maintenance.sweeps.prune import sweep_prune
    from maintenance.sweeps.reclaim import sweep_reclaim
    from runs.models import Event, Run, Tenant
    from runs.services import run_submit
    from runs.web.consumers import RunEventsConsumer, RunsConsumer

    with connection.cursor() as cur:
        cur.execute("SELECT reltuples::bigint FROM pg_class WHERE relname = 'events'")
        events = cur.fetchone()[0]
    tenant = Tenant.objects.get(name="bench")
    waiting = Run.objects.filter(tenant=tenant, status="WAITING_FOR_APPROVAL").order_by("created_at").first()
    done = Run.objects.filter(tenant=tenant, status="COMPLETED").order_by("-created_at").first()
    user = get_user_model().objects.get(username="bench-user")
    last = Event.objects.filter(tenant_id=tenant.id).order_by("-id").values_list("id", flat=True).first()
    client = Client(HTTP_HOST="127.0.0.1")
    client.force_login(user)
    cap = Capture()

    def run(label, fn):
        cap.label = label
        with connection.execute_wrapper(cap):
            return fn()

    def get(path):
        r = client.get(path)
        assert r.status_code == 200, (path, r.status_code, r.content[:300])

    def events_consumer(cursor):
        c = RunEventsConsumer()
        c.run_id, c.cursor = done.id, cursor
        return async_to_sync(c._fetch)()

    def runs_consumer():
        c = RunsConsumer()
        c.tenant_id = tenant.id
        start = async_to_sync(c._start_cursor)()
        c.cursor = last - 2000  # a socket that was away for a while
        return start, async_to_sync(c._fetch)()

    run(
        "REST events page: GET /api/runs/{id}/events/?after=0 (a finished run)",
        lambda: get(f"/api/runs/{done.id}/events/"),
    )
    run("REST events page: ?after=40&limit=20", lambda: get(f"/api/runs/{done.id}/events/?after=40&limit=20"))
    run("WebSocket replay: ws/runs/{id}/?after=0 (the consumer's read)", lambda: events_consumer(0))
    run("WebSocket replay: ws/runs/{id}/?after=60", lambda: events_consumer(60))
    run("WebSocket ws/runs/: start cursor and a read 2,000 events behind", runs_consumer)
    run("run page GET /runs/{id}/ (a waiting run)", lambda: get(f"/runs/{waiting.id}/"))
    run("runs list page GET /runs/", lambda: get("/runs/"))
    run("REST GET /api/runs/ (first page)", lambda: get("/api/runs/"))
    run("REST GET /api/approvals/?status=pending", lambda: get("/api/approvals/?status=pending"))
    run(
        "submit (run_submit, tenant with the waiting runs)", lambda: run_submit(tenant=tenant, agent="small", input="x")
    )
    run("sweep: reclaim", sweep_reclaim)
    run("sweep: expiry", sweep_expiry)
    run("sweep: prune", sweep_prune)
    run("sweep: deliveries", sweep_deliveries)
    run("sweep: metrics (fold)", sweep_metrics)
    run("GET /metrics", lambda: client.get("/metrics"))
    scans = [r for r in cap.rows if r["seq_scans"]]
    out = {
        "database": bench.db_name(url),
        "events_estimate": events,
        "statements": len(cap.rows),
        "with_seq_scan_of_a_big_table": [
            {"label": r["label"], "sql": r["sql"][:200], "seq_scans": r["seq_scans"], "ms": r["execution_ms"]}
            for r in scans
        ],
        "rows": cap.rows,
    }
    shapes: dict[tuple[str, str], list[dict]] = {}
    for r in cap.rows:  # one line per statement shape of each caller (the prune repeats its per-run reads)
        shapes.setdefault((r["label"], re.sub(r"'[^']*'|\b\d+\b", "?", r["sql"])[:110]), []).append(r)
    for (label, shape), rows in shapes.items():
        seq = sorted({t for r in rows for t in r["seq_scans"]})
        flag = f"SEQ SCAN {','.join(seq)}" if seq else "no seq scan"
        times = [r["execution_ms"] for r in rows if r["execution_ms"] is not None]
        ms = f"max {max(times):.2f} ms" if times else "(not analyzed)"
        log(f"  [{flag:>22}] {ms:>16} x{len(rows):<4} {label}: {shape}")
    return out


# ------------------------------------------------------------------ rss: worker memory over many runs


def vmrss_kb(pid: int | str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def rss(args, big: str) -> dict:
    """Worker memory over `--runs` small runs on the big database: in a real
    qcluster worker (django-q2 replaces a worker after `recycle` = 500 tasks,
    so each worker process is followed from its first sample to its last),
    or with --in-process in this one process through run_drive, never
    replaced (what the runtime itself keeps, without django-q2's recycling)."""
    if not exists(big):
        raise SystemExit(f"{bench.db_name(big)} does not exist: run `bench/bigtable.py fill` first")
    bench.django_setup(big)
    # here, not at the top: the script sets Django up at run time, before the project's modules load
    from runs.models import Tenant

    tenant = Tenant.objects.get(name="bench")
    return _rss_in_process(args, tenant) if args.in_process else _rss_worker(args, big, tenant)


def _rss_in_process(args, tenant) -> dict:
    # here, not at the top: the script sets Django up at run time, before the project's modules load
    from runs.runtime.executor import run_drive
    from runs.services import run_submit

    samples = []
    t0 = time.time()
    for n in range(1, args.runs + 1):
        run, _ = run_submit(tenant=tenant, agent="small", input=f"rss {n}")
        outcome = run_drive(run_id=run.id)
        if outcome is None or outcome.kind.value != "completed":
            raise SystemExit(f"run {run.id} ended {outcome}")
        if n % args.every == 0 or n == 1:
            gc.collect()  # count what is alive, not the cyclic garbage the oldest generation has not collected yet
            samples.append(
                {
                    "runs": n,
                    "rss_kb": vmrss_kb("self"),
                    "gc_objects": len(gc.get_objects()),
                    "t_s": round(time.time() - t0),
                }
            )
            log(f"  {n} runs: RSS {samples[-1]['rss_kb']} kB, {samples[-1]['gc_objects']} objects")
    bench.close_django()
    return {"mode": "in-process", "runs": args.runs, "every": args.every, "samples": samples, **_growth(samples)}


def _growth(samples: list[dict]) -> dict:
    """RSS growth after the warm-up (the first tenth of the samples), per 1,000 runs."""
    if len(samples) < 4:
        return {}
    warm = samples[max(1, len(samples) // 10)]
    last = samples[-1]
    per_k = (last["rss_kb"] - warm["rss_kb"]) * 1000 / max(1, last["runs"] - warm["runs"])
    return {
        "rss_kb_after_warmup": warm["rss_kb"],
        "rss_kb_last": last["rss_kb"],
        "growth_kb_per_1000_runs": round(per_k, 1),
    }


def _rss_worker(args, big: str, tenant) -> dict:
    # here, not at the top: the script sets Django up at run time, before the project's modules load
    from runs.services import run_submit

    logs = Path(tempfile.mkdtemp(prefix="agentrt-rss-"))
    bench.close_django()
    cluster = bench.Cluster(big, 1, logs / "qcluster.log")
    poller = connect(big)
    samples: list[dict] = []
    t0 = time.time()

    def worker_pids() -> list[int]:
        out = subprocess.run(
            ["ps", "-o", "pid=,comm=", "--ppid", str(cluster.proc.pid)], capture_output=True, text=True
        )
        sentinels = [int(line.split()[0]) for line in out.stdout.splitlines()]
        pids = []
        for s in sentinels:
            out = subprocess.run(["ps", "-o", "pid=,comm=", "--ppid", str(s)], capture_output=True, text=True)
            pids += [int(line.split()[0]) for line in out.stdout.splitlines() if "worker" in line]
        return pids

    try:
        submitted = completed = 0
        pending: set[str] = set()
        while completed < args.runs:
            while submitted < args.runs and len(pending) < 4:  # a few queued: the worker never idles
                run, _ = run_submit(tenant=tenant, agent="small", input=f"rss {submitted}")
                pending.add(str(run.id))
                submitted += 1
            done = poller.execute(
                "SELECT id::text, status FROM runs WHERE id = ANY(%s::uuid[])"
                " AND status IN ('COMPLETED', 'FAILED', 'CANCELLED')",
                [list(pending)],
            ).fetchall()
            if not done:
                if not cluster.alive():
                    raise SystemExit(f"qcluster exited:\n{cluster.tail()}")
                time.sleep(0.005)
                continue
            if any(status != "COMPLETED" for _, status in done):
                raise SystemExit(f"a run did not complete: {done}\n{cluster.tail()}")
            before = completed
            completed += len(done)
            pending -= {run_id for run_id, _ in done}
            if completed // args.every > before // args.every or before == 0:
                for pid in worker_pids():
                    try:
                        kb = vmrss_kb(pid)
                    except OSError:
                        kb = 0
                    if kb:  # 0: the worker was just recycled (no VmRSS once it exits)
                        samples.append({"runs": completed, "pid": pid, "rss_kb": kb, "t_s": round(time.time() - t0)})
                        log(f"  {completed} runs: worker {pid} RSS {kb} kB")
    finally:
        bench.close_django()
        poller.close()
        cluster.stop()
    by_pid: dict[int, list[dict]] = {}
    for s in samples:
        by_pid.setdefault(s["pid"], []).append(s)
    workers = [
        {
            "pid": pid,
            "first": ss[0],
            "last": ss[-1],
            "samples": len(ss),
            "growth_kb": ss[-1]["rss_kb"] - ss[0]["rss_kb"],
        }
        for pid, ss in by_pid.items()
    ]
    return {"mode": "qcluster worker", "runs": args.runs, "every": args.every, "samples": samples, "workers": workers}


# ------------------------------------------------------------------ main


def main(argv=None) -> dict:
    args = parse_args(argv)
    big, empty = names(args.database_url)
    os.environ.setdefault("DJANGO_SECRET_KEY", "bench-bigtable-throwaway")
    load = os.getloadavg()[0]
    if args.command == "drop":
        with connect(bench.with_db(big, "postgres")) as c:
            for url in (big, empty, bench.with_db(big, bench.db_name(big) + "_x")):
                c.execute(f'DROP DATABASE IF EXISTS "{bench.db_name(url)}" WITH (FORCE)')
        log("dropped")
        return {}
    started = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    if args.command == "fill":
        out = fill(args, big)
    elif args.command == "steps":
        out = steps_ab(args, big, empty)
    elif args.command == "explain":
        out = explain(args, big)
    else:
        out = rss(args, big)
    result = {
        "bench": f"agentrt_bigtable_{args.command}",
        "date": started,
        "command": " ".join([Path(sys.argv[0]).name] + sys.argv[1:]) if argv is None else " ".join(argv),
        "loadavg_1m": {"before": round(load, 2), "after": round(os.getloadavg()[0], 2)},
        **out,
    }
    text = json.dumps(result, default=str)
    if args.json:
        Path(args.json).write_text(text)
    print(
        text if args.command != "explain" else json.dumps({k: v for k, v in result.items() if k != "rows"}, default=str)
    )
    return result


if __name__ == "__main__":
    main()
