#!/usr/bin/env python
"""Takeover of a dead or stalled worker's run, through a real qcluster and run_maintenance.

    python bench/takeover.py [--kills 10] [--stops 3] [--lease 30] [--probe 1]

Each round submits a run whose model answers after `--hold` seconds (so a worker is mid-step), waits for its
lease, then SIGKILLs the worker process named by the lease owner (`<host>:<pid>:<id>`), or SIGSTOPs it (and
SIGCONTs it after the takeover). Measured from the database: the signal → the run's `lease.taken_over` event,
and where that fell against the lease the worker held. With `--probe 0` (AGENTRT_DEAD_OWNER_PROBE_SECONDS=0)
the figure is the lease rule's alone. Drops and re-creates its database (`…_takeover_bench`). One JSON line on
stdout, a table on stderr. Figures, never assertions; the load average is printed beside them.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import steps as bench  # noqa: E402
from fairness import Node, wait_until  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kills", type=int, default=10, help="rounds ending in a SIGKILL of the worker (default 10)")
    p.add_argument("--stops", type=int, default=3, help="rounds ending in a SIGSTOP of the worker (default 3)")
    p.add_argument("--lease", type=float, default=30, help="AGENTRT_LEASE_SECONDS (default 30, production's)")
    p.add_argument("--probe", type=float, default=1, help="AGENTRT_DEAD_OWNER_PROBE_SECONDS (default 1; 0: off)")
    p.add_argument("--hold", type=float, default=600, help="seconds the model takes to answer (default 600)")
    p.add_argument(
        "--database-url",
        default=os.environ.get("DATABASE_URL") or "postgres://postgres@127.0.0.1:5432/agentrt_takeover_bench",
    )
    return p.parse_args(argv)


def summary(xs: list[float]) -> dict:
    if not xs:
        return {"n": 0}
    xs = sorted(xs)
    return {
        "n": len(xs),
        "p50": round(statistics.median(xs), 3),
        "p95": round(xs[min(len(xs) - 1, int(0.95 * len(xs)))], 3),
        "max": round(xs[-1], 3),
    }


def main(argv=None) -> dict:
    a = parse_args(argv)
    url = bench.bench_url(a.database_url)
    logs = Path(tempfile.mkdtemp(prefix="agentrt-takeover-bench-"))
    load_before = os.getloadavg()
    bench.recreate_database(url)
    bench.django_setup(url)
    # here, not at the top: the script sets Django up at run time, before the project's modules load
    from django.core.management import call_command

    from runs.models import Event, Run
    from runs.services import agent_load, run_submit, tenant_create
    from runs.services.lifecycle import run_cancel

    call_command("migrate", verbosity=0, interactive=False)
    tenant, _ = tenant_create(name="takeover", username="takeover")
    turns = [{"text": "slow", "delay_ms": int(a.hold * 1000)}]
    agent_load(tenant=tenant, definition={"name": "slow", "model": {"provider": "scripted", "turns": turns}})
    bench.close_django()
    env = dict(
        os.environ,
        DATABASE_URL=url,
        AGENTRT_WORKERS="2",
        AGENTRT_LEASE_SECONDS=str(a.lease),
        AGENTRT_DEAD_OWNER_PROBE_SECONDS=str(a.probe),
        PYTHONUNBUFFERED="1",
    )
    env.setdefault("AGENTRT_LOG_LEVEL", "WARNING")
    nodes = [Node("qcluster", env, logs / "qcluster.log"), Node("run_maintenance", env, logs / "maintenance.log")]

    def leased(run_id):
        row = Run.objects.filter(id=run_id).values("status", "lease_owner", "lease_expires_at", "lease_epoch").get()
        return row if row["status"] == "RUNNING" and row["lease_owner"] else None

    def taken(run_id, epoch):
        return (
            Event.objects.filter(run_id=run_id, type="lease.taken_over", payload__previous_epoch=epoch)
            .values_list("occurred_at", flat=True)
            .first()
        )

    rounds = {"kill": [], "stop": []}
    try:
        for kind in ["kill"] * a.kills + ["stop"] * a.stops:
            run_id = run_submit(tenant=tenant, agent="slow", input=kind)[0].id
            held = wait_until(lambda run_id=run_id: leased(run_id), 120, "a worker to lease the run")
            pid = int(held["lease_owner"].split(":")[1])
            t0 = time.time()
            os.kill(pid, signal.SIGKILL if kind == "kill" else signal.SIGSTOP)
            try:
                at = wait_until(
                    lambda run_id=run_id, e=held["lease_epoch"]: taken(run_id, e), 4 * a.lease + 60, "the takeover"
                )
            finally:
                if kind == "stop":
                    os.kill(pid, signal.SIGCONT)
            run_cancel(run=Run.objects.get(id=run_id), by="bench", via="cli")  # frees its worker for the next
            rounds[kind].append(
                {
                    "signal_to_takeover_s": round(at.timestamp() - t0, 3),
                    "before_lease_expiry_s": round((held["lease_expires_at"] - at).total_seconds(), 3),
                }
            )
            bench.close_django()
    finally:
        for n in nodes:
            n.stop()
        bench.close_django()
    load_after = os.getloadavg()
    result = {
        "bench": "takeover",
        "lease_s": a.lease,
        "probe_s": a.probe,
        "load_1min_before": round(load_before[0], 2),
        "load_1min_after": round(load_after[0], 2),
        "after_sigkill": summary([r["signal_to_takeover_s"] for r in rounds["kill"]]),
        "after_sigstop": summary([r["signal_to_takeover_s"] for r in rounds["stop"]]),
        "sigkill_taken_before_lease_expiry": sum(r["before_lease_expiry_s"] > 0 for r in rounds["kill"]),
        "sigstop_taken_before_lease_expiry": sum(r["before_lease_expiry_s"] > 0 for r in rounds["stop"]),
        "rounds": rounds,
        "logs": str(logs),
    }
    print(json.dumps(result))
    print(
        f"takeover: lease {a.lease:g} s, probe {a.probe:g} s (load {load_before[0]:.2f} -> {load_after[0]:.2f}); "
        f"after SIGKILL {result['after_sigkill']}; after SIGSTOP {result['after_sigstop']}",
        file=sys.stderr,
    )
    return result


if __name__ == "__main__":
    main()
