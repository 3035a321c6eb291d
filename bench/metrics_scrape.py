"""Time a `/metrics` scrape on a database with N events.

    createdb -h 127.0.0.1 -U postgres bench_metrics
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/bench_metrics \\
        .venv/bin/python bench/metrics_scrape.py --runs 500 --events-per-run 20

Creates tenant `bench`, RUNS runs through the normal submit service, then adds
EVENTS_PER_RUN events to each (the hot path's mix, with the rare types the
counters read at roughly their real share: a requeue, a wait and its end, a
takeover every tenth run, a compaction every fifth), ends most runs, and
scrapes `/metrics` in-process REPEATS times. Prints the median and worst
scrape and the scrape's SQL statement count. Run it on a scratch database:
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

import django  # noqa: E402

django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402
from django.test import Client  # noqa: E402
from django.test.utils import CaptureQueriesContext  # noqa: E402

HOT = [
    "model.request.started",
    "model.response.completed",
    "run.checkpointed",
    "tool.call.proposed",
    "tool.call.authorized",
    "tool.call.started",
    "tool.call.completed",
]


def seed(runs: int, per_run: int) -> None:
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
                ["CANCELLED" if i % 7 == 0 else ("COMPLETED" if i % 10 else "QUEUED"), 1 + i % 12, run_id],
            )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=500)
    parser.add_argument("--events-per-run", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--no-seed", action="store_true")
    args = parser.parse_args()
    call_command("migrate", verbosity=0)
    if not args.no_seed:
        seed(args.runs, args.events_per_run)
    with connection.cursor() as cur:
        cur.execute("ANALYZE events; ANALYZE runs; ANALYZE approvals")
        cur.execute("SELECT COUNT(*) FROM events")
        events = cur.fetchone()[0]
        cur.execute("SELECT COUNT(*) FROM runs")
        runs = cur.fetchone()[0]
    client = Client()
    client.get("/metrics")  # warm: connection, imports
    times = []
    for _ in range(args.repeats):
        started = time.perf_counter()
        with CaptureQueriesContext(connection) as q:
            response = client.get("/metrics")
        times.append((time.perf_counter() - started) * 1000)
        assert response.status_code == 200
    print(
        f"events={events} runs={runs} scrapes={args.repeats} statements/scrape={len(q.captured_queries)}"
        f" median={statistics.median(times):.1f} ms worst={max(times):.1f} ms bytes={len(response.content)}"
    )


if __name__ == "__main__":
    main()
