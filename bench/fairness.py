#!/usr/bin/env python
"""Fair workers (issue 34 item 5): how long another tenant's run waits while
one tenant floods the workers, through a real qcluster and run_maintenance.

    python bench/fairness.py [--flood 4] [--seconds 20] [--workers 2] [--rounds 1] [--share N]

The review's scenario: tenant `flood` submits `--flood` runs, each calling the
`sleep` tool for `--seconds` then answering; once one of them is claimed,
tenant `other` submits one run that answers at once. Measured from the runs'
events: the other tenant's wait (`run.created` → `run.claimed`) and its
submit → `run.completed`; the flood's most leases held at once and its wall
time (first `run.created` → last `run.completed`).

`--share N` sets AGENTRT_TENANT_MAX_RUNNING for the cluster (0: no limit);
unset, the deployment's default (half the workers). Code from before the
share ignores it: run the script from a checkout of that code for the figure
before. Drops and re-creates its database (`…_fair_bench`). One JSON line on
stdout, a table on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import steps as bench  # noqa: E402

RELEASES = ("run.completed", "run.failed", "run.cancelled", "run.requeued", "run.waiting_for_approval")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--flood", type=int, default=4, help="the flooding tenant's runs (default 4)")
    p.add_argument("--seconds", type=float, default=20, help="each flood run's sleep (default 20, the review's)")
    p.add_argument("--workers", type=int, default=2, help="AGENTRT_WORKERS (default 2)")
    p.add_argument("--rounds", type=int, default=1, help="flood + other run, one after another (default 1)")
    p.add_argument("--share", type=int, default=None, help="AGENTRT_TENANT_MAX_RUNNING (default: unset)")
    p.add_argument(
        "--database-url",
        default=os.environ.get("DATABASE_URL") or "postgres://postgres@127.0.0.1:5432/agentrt_fair_bench",
    )
    return p.parse_args(argv)


def agent(name: str, turns: list) -> dict:
    return {"name": name, "instructions": "fairness bench", "model": {"provider": "scripted", "turns": turns}}


class Node:
    """`python manage.py <command>` in a session of its own, logged to a file."""

    def __init__(self, command: str, env: dict, log_path: Path):
        self.log = open(log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "manage.py", command],
            cwd=bench.ROOT,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.log.close()


def wait_until(condition, timeout: float, what: str, every: float = 0.02):
    end = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > end:
            raise SystemExit(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(every)


def spans(run_id) -> list[tuple]:
    """(claimed, released) of each of the run's leases, from its events."""
    # here, not at the top: the script sets Django up at run time, before the project's modules load
    from runs.models import Event

    out, start = [], None
    for kind, at in Event.objects.filter(run_id=run_id).order_by("sequence").values_list("type", "occurred_at"):
        if kind == "run.claimed":
            start = at
        elif kind in RELEASES and start is not None:
            out.append((start, at))
            start = None
    return out


def most_at_once(all_spans: list[tuple]) -> int:
    points = sorted([(a, 1) for a, _ in all_spans] + [(b, -1) for _, b in all_spans], key=lambda p: (p[0], p[1]))
    held = most = 0
    for _, step in points:
        held += step
        most = max(most, held)
    return most


def main(argv=None) -> dict:
    a = parse_args(argv)
    url = bench.bench_url(a.database_url)
    logs = Path(tempfile.mkdtemp(prefix="agentrt-fair-bench-"))
    load = os.getloadavg()
    bench.recreate_database(url)
    bench.django_setup(url)
    # here, not at the top: the script sets Django up at run time, before the project's modules load
    from django.core.management import call_command

    from runs.models import Event, Run
    from runs.services import agent_load, run_submit, tenant_create

    call_command("migrate", verbosity=0, interactive=False)
    flooder, _ = tenant_create(name="flood", username="flood")
    other, _ = tenant_create(name="other", username="other")
    sleep = [{"tool_calls": [{"name": "sleep", "arguments": {"seconds": a.seconds}}]}, {"text": "slept"}]
    agent_load(tenant=flooder, definition={**agent("sleeper", sleep), "tools": ["sleep"]})
    agent_load(tenant=flooder, definition=agent("quick", [{"text": "hi"}]))
    agent_load(tenant=other, definition=agent("quick", [{"text": "hi"}]))
    bench.close_django()

    env = dict(os.environ, DATABASE_URL=url, AGENTRT_WORKERS=str(a.workers), PYTHONUNBUFFERED="1")
    env.setdefault("AGENTRT_LOG_LEVEL", "WARNING")
    env.setdefault("AGENTRT_MAX_SLEEP_SECONDS", str(max(60, int(a.seconds) + 1)))
    if a.share is not None:
        env["AGENTRT_TENANT_MAX_RUNNING"] = str(a.share)
    else:
        env.pop("AGENTRT_TENANT_MAX_RUNNING", None)
    nodes = [Node("qcluster", env, logs / "qcluster.log"), Node("run_maintenance", env, logs / "maintenance.log")]

    def status(run_id) -> str:
        return Run.objects.filter(id=run_id).values_list("status", flat=True).get()

    def ended(ids) -> bool:
        return all(status(i) in ("COMPLETED", "FAILED", "CANCELLED") for i in ids)

    def claimed_at(run_id):
        return (
            Event.objects.filter(run_id=run_id, type="run.claimed")
            .order_by("sequence")
            .values_list("occurred_at", flat=True)
            .first()
        )

    rounds = []
    try:
        warm = [run_submit(tenant=t, agent="quick", input="warm")[0].id for t in (flooder, other)]
        wait_until(lambda: ended(warm), 120, "the warm-up runs")
        for r in range(a.rounds):
            flood = [run_submit(tenant=flooder, agent="sleeper", input=f"flood {r}.{i}")[0].id for i in range(a.flood)]
            wait_until(lambda flood=flood: any(status(i) == "RUNNING" for i in flood), 60, "the flood to start")
            t_submit = time.time()
            theirs = run_submit(tenant=other, agent="quick", input=f"other {r}")[0].id
            wait_until(
                lambda theirs=theirs: status(theirs) == "COMPLETED", 20 * a.seconds * a.flood + 60, "the other run"
            )
            t_done = time.time()
            flood_running_then = sum(status(i) != "COMPLETED" for i in flood)
            wait_until(lambda flood=flood: ended(flood), 4 * a.seconds * a.flood + 120, "the flood to end")
            row = Run.objects.filter(id=theirs).values("created_at").get()
            flood_spans = [s for i in flood for s in spans(i)]
            flood_rows = list(Run.objects.filter(id__in=flood).values_list("created_at", flat=True))
            flood_end = max(b for _, b in flood_spans)
            rounds.append(
                {
                    "other_wait_s": round((claimed_at(theirs) - row["created_at"]).total_seconds(), 3),
                    "other_submit_to_completed_s": round(t_done - t_submit, 3),
                    "flood_runs_not_done_when_other_completed": flood_running_then,
                    "flood_most_leases_at_once": most_at_once(flood_spans),
                    "flood_wall_s": round((flood_end - min(flood_rows)).total_seconds(), 2),
                }
            )
            bench.close_django()
    finally:
        for n in nodes:
            n.stop()
        bench.close_django()

    result = {
        "bench": "fairness",
        "flood": a.flood,
        "seconds": a.seconds,
        "workers": a.workers,
        "share": a.share,
        "load_1min_before": round(load[0], 2),
        "logs": str(logs),
        "rounds": rounds,
    }
    print(json.dumps(result))
    print(
        f"fairness: {a.flood} runs of sleep({a.seconds:g}) by one tenant on {a.workers} workers, share "
        f"{'default' if a.share is None else a.share} (load {load[0]:.2f})",
        file=sys.stderr,
    )
    for i, f in enumerate(rounds, 1):
        print(
            f"  round {i}: other tenant waited {f['other_wait_s']:.3f} s (submit -> completed "
            f"{f['other_submit_to_completed_s']:.3f} s, {f['flood_runs_not_done_when_other_completed']} flood runs "
            f"not done then); flood: at most {f['flood_most_leases_at_once']} leases, {f['flood_wall_s']:.1f} s",
            file=sys.stderr,
        )
    return result


if __name__ == "__main__":
    main()
