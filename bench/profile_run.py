#!/usr/bin/env python
"""Where a step's time goes: drive ONE run in-process (no qcluster) and split it.

    python bench/profile_run.py [--steps 200] [--database-url URL] [--top 35] [--no-cprofile]

Drops and re-creates a bench database (name must contain "bench", else "_bench" is
appended; default agentrt_profile_bench), submits runs with runs.services.run_submit
and drives each with runs.runtime.executor.run_drive in this process:

1. a warm-up run, then a run as users run it (its per-step ms from the events
   table), then a timed run with every SQL statement counted and timed through a
   Django execute_wrapper (round trips, time inside cursor.execute vs the rest,
   i.e. Python): with a wrapper installed the store takes its sequential path
   (no unit in flight while Python runs), so that run's step is the slower one;
2. a run under cProfile: the top functions by own time and by cumulative time.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import steps as bench


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=200)
    p.add_argument(
        "--database-url",
        default=os.environ.get("DATABASE_URL") or "postgres://postgres@127.0.0.1:5432/agentrt_profile_bench",
    )
    p.add_argument("--top", type=int, default=35)
    p.add_argument("--no-cprofile", action="store_true")
    p.add_argument("--callers", default="", help="also print who calls the functions matching this pattern")
    a = p.parse_args()
    url = bench.bench_url(a.database_url)
    name = f"bench-{a.steps}"
    tenant = bench.fresh_product(url, {name: a.steps})

    # here, not at the top: the script sets Django up at run time, before the project's modules load
    from django.db import connection

    from runs.runtime.executor import run_drive

    def one(tag: str):
        run_id = bench.submit(tenant, name, 1, tag)[0]
        t0 = time.perf_counter()
        outcome = run_drive(run_id=run_id)
        wall = time.perf_counter() - t0
        assert outcome is not None and outcome.kind.value == "completed", outcome
        return run_id, wall

    one("warm-up")

    # -- timed, with every statement counted and timed
    stats = {"n": 0, "t": 0.0, "kinds": Counter(), "kind_t": Counter()}

    def wrapper(execute, sql, params, many, context):
        t = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            dt = time.perf_counter() - t
            stats["n"] += 1
            stats["t"] += dt
            head = " ".join(sql.split()[:3]).upper()
            key = (
                ("INSERT INTO " + sql.split()[2])
                if head.startswith("INSERT")
                else ("UPDATE " + sql.split()[1])
                if head.startswith("UPDATE")
                else ("WITH...INSERT INTO events" if head.startswith("WITH") else " ".join(sql.split()[:1]).upper())
            )
            stats["kinds"][key] += 1
            stats["kind_t"][key] += dt

    run_id, wall = one("as run")
    g = bench.event_figures(url, [run_id], a.steps)["step_gap_ms"]
    print(
        f"in-process run as users run it (units in flight), {a.steps} steps: wall {wall * 1e3:.1f} ms = "
        f"{wall * 1e3 / a.steps:.3f} ms/step; step gap median {g['median']:.3f} ms, p90 {g['p90']:.3f} ms"
    )
    with connection.execute_wrapper(wrapper):
        run_id, wall = one("timed")
    g = bench.event_figures(url, [run_id], a.steps)["step_gap_ms"]
    print(
        f"in-process run with every statement timed (an execute_wrapper: the sequential path), {a.steps} steps: "
        f"wall {wall * 1e3:.1f} ms = {wall * 1e3 / a.steps:.3f} ms/step; "
        f"step gap median {g['median']:.3f} ms, p90 {g['p90']:.3f} ms"
    )
    print(
        f"cursor.execute calls: {stats['n']} ({stats['n'] / a.steps:.2f}/step; BEGIN/COMMIT are not cursor calls), "
        f"time inside execute {stats['t'] * 1e3:.1f} ms = {stats['t'] * 1e3 / a.steps:.3f} ms/step "
        f"({100 * stats['t'] / wall:.0f}% of wall); the rest is Python and commits"
    )
    for k, n in stats["kinds"].most_common():
        print(f"   {n / a.steps:6.2f}/step  {stats['kind_t'][k] * 1e3 / a.steps:7.3f} ms/step  {k}")

    # -- commit time: time spent in connection.commit (Django's atomic exit)
    from django.db.backends.base import base as dbbase

    orig_commit = dbbase.BaseDatabaseWrapper.commit
    ct = {"n": 0, "t": 0.0}

    def timed_commit(self):
        t = time.perf_counter()
        try:
            return orig_commit(self)
        finally:
            ct["n"] += 1
            ct["t"] += time.perf_counter() - t

    dbbase.BaseDatabaseWrapper.commit = timed_commit
    try:
        _, wall2 = one("commits")
    finally:
        dbbase.BaseDatabaseWrapper.commit = orig_commit
    print(
        f"commits: {ct['n']} ({ct['n'] / a.steps:.2f}/step), {ct['t'] * 1e3 / a.steps:.3f} ms/step in COMMIT "
        f"(run wall {wall2 * 1e3 / a.steps:.3f} ms/step)"
    )

    if a.no_cprofile:
        return
    prof = cProfile.Profile()
    run_id = bench.submit(tenant, name, 1, "profiled")[0]
    prof.enable()
    run_drive(run_id=run_id)
    prof.disable()
    for order in ("tottime", "cumulative"):
        buf = io.StringIO()
        st = pstats.Stats(prof, stream=buf)
        st.sort_stats(order).print_stats(a.top)
        print(f"\n==== cProfile, one {a.steps}-step run, sorted by {order} ====")
        print("\n".join(line for line in buf.getvalue().splitlines() if line.strip()))
    if a.callers:
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_callers(a.callers)
        print(f"\n==== callers of {a.callers} ====")
        print("\n".join(line for line in buf.getvalue().splitlines() if line.strip()))


if __name__ == "__main__":
    main()
