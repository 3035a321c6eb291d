"""Time a `/metrics` scrape on a database with N events.

    createdb -h 127.0.0.1 -U postgres bench_metrics
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/bench_metrics \\
        .venv/bin/python bench/metrics_scrape.py --runs 500 --events-per-run 20

Creates tenant `bench`, RUNS runs through the normal submit service, then adds
EVENTS_PER_RUN events to each (the hot path's mix, with the rare types the
counters read at roughly their real share: a requeue, a wait and its end, a
takeover every tenth run, a compaction every fifth), ends most runs, and
scrapes `/metrics` in-process REPEATS times; then (PostgreSQL) folds every
ended run into the metric totals, as the `metrics` sweep does, and scrapes
again. Prints the median and worst scrape and the scrape's SQL statement
count, before and after the fold. Run it on a scratch database:
it adds rows and does not remove them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agentrt_site.settings")
os.environ.setdefault("DJANGO_ALLOWED_HOSTS", "testserver")  # the in-process test client
os.environ.setdefault("AGENTRT_MAX_ACTIVE_RUNS", "0")  # the seeded runs stay QUEUED until ended by hand
os.environ.setdefault("AGENTRT_LOG_LEVEL", "WARNING")

import django

django.setup()

from django.core.management import call_command  # noqa: E402 - after django.setup()
from django.db import connection  # noqa: E402 - after django.setup()
from django.test import Client  # noqa: E402 - after django.setup()
from django.test.utils import CaptureQueriesContext  # noqa: E402 - after django.setup()

HOT = [
    "model.request.started",
    "model.response.completed",
    "run.checkpointed",
    "tool.call.proposed",
    "tool.call.authorized",
    "tool.call.started",
    "tool.call.completed",
]


def seed(runs: int, per_run: int, live_every: int = 10) -> None:
    # here, not at the top: the script sets Django up at run time, before the project's modules load
    from runs.models import Run
    from runs.services import agent_load, run_submit, tenant_create

    tenant, _ = tenant_create(name=f"bench-{int(time.time())}", username=f"bench-{int(time.time())}", password="pw")
    agent_load(
        tenant=tenant,
        definition={
            "name": "bench",
            "instructions": "",
            "tools": ["echo"],
            "model": {"provider": "scripted", "turns": [{"text": "x"}]},
        },
    )
    ids = [run_submit(tenant=tenant, agent="bench", input="x")[0].id for _ in range(runs)]
    with connection.cursor() as cur:
        for i, run_id in enumerate(ids):
            run = Run.objects.get(id=run_id)
            types = [HOT[k % len(HOT)] for k in range(per_run)]
            # The rare ones, in their place.
            types[-6:] = [
                "run.requeued",
                "run.waiting_for_approval",
                "run.requeued",
                "lease.taken_over" if i % 10 == 0 else "run.checkpointed",
                "context.compacted" if i % 5 == 0 else "run.checkpointed",
                "run.cancelled" if i % 7 == 0 else "run.completed",
            ]
            rows = [
                (
                    run.tenant_id,
                    run.session_id,
                    1000 + k,
                    run.id,
                    t,
                    '{"reason": "approval", "kind": "approval"}'
                    if t in ("run.requeued", "run.waiting_for_approval")
                    else "{}",
                    1,
                )
                for k, t in enumerate(types)
            ]
            cur.executemany(
                "INSERT INTO events (tenant_id, session_id, sequence, run_id, type, payload, lease_epoch, occurred_at)"
                " VALUES (%s, %s, %s, %s, %s, %s::jsonb, %s, now() + make_interval(secs => %s))",
                [r + (k,) for k, r in enumerate(rows)],
            )
            cur.execute(
                "UPDATE runs SET status = %s, step_count = %s WHERE id = %s",
                ["QUEUED" if i % live_every == 0 else ("CANCELLED" if i % 7 == 0 else "COMPLETED"), 1 + i % 12, run_id],
            )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=500)
    parser.add_argument("--events-per-run", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--live-every", type=int, default=10, help="every Nth seeded run stays QUEUED (live)")
    parser.add_argument("--no-seed", action="store_true")
    parser.add_argument("--no-fold", action="store_true", help="scrape only as the runs are (no fold first)")
    args = parser.parse_args()
    call_command("migrate", verbosity=0)
    if not args.no_seed:
        seed(args.runs, args.events_per_run, args.live_every)
    with connection.cursor() as cur:
        cur.execute("ANALYZE events; ANALYZE runs; ANALYZE approvals")
        cur.execute("SELECT COUNT(*) FROM events")
        events = cur.fetchone()[0]
        cur.execute("SELECT COUNT(*) FROM runs")
        runs = cur.fetchone()[0]
    client = Client()
    client.get("/metrics")  # warm: connection, imports

    def scrape(label: str) -> None:
        times = []
        for _ in range(args.repeats):
            started = time.perf_counter()
            with CaptureQueriesContext(connection) as q:
                response = client.get("/metrics")
            times.append((time.perf_counter() - started) * 1000)
            assert response.status_code == 200
        unfolded = runs
        if connection.vendor == "postgresql":
            with connection.cursor() as cur:
                cur.execute("SELECT COUNT(*) FROM metric_unfolded_runs")
                unfolded = cur.fetchone()[0]
        print(
            f"{label}: events={events} runs={runs} unfolded_runs={unfolded} scrapes={args.repeats}"
            f" statements/scrape={len(q.captured_queries)}"
            f" median={statistics.median(times):.1f} ms worst={max(times):.1f} ms bytes={len(response.content)}"
        )

    scrape("before the fold")
    if connection.vendor == "postgresql" and not args.no_fold:
        # here, not at the top: the script sets Django up at run time, before the project's modules load
        from ops import fleet

        started = time.perf_counter()
        folded = 0
        while n := fleet.fold(batch=2000, settled_seconds=0):
            folded += n
        print(f"fold: {folded} runs in {time.perf_counter() - started:.1f} s")
        # What autovacuum does after such a burst (the seed's updates, the fold's deletes).
        with connection.cursor() as cur:
            cur.execute("VACUUM ANALYZE runs, events, metric_unfolded_runs")
        scrape("after the fold")


if __name__ == "__main__":
    main()
