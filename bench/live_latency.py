#!/usr/bin/env python
"""Start and live latency through real processes: commit -> WebSocket frame
with Redis, on PostgreSQL alone (LISTEN/NOTIFY) and by the poll alone, and
submit -> first model call beside its floor.

    python bench/live_latency.py                       # all parts
    python bench/live_latency.py --only ws --markers 100
    python bench/live_latency.py --only first-call,floor --samples 60

Builds on bench/latency.py (its model server, processes and sockets): drops
and re-creates a bench database, starts `manage.py qcluster` (2 workers) and
daphne per mode, and a chat-completions server in this process.

1. **ws**: three deployments, one after another: `redis` (REDIS_URL for
   daphne, the workers and this process: the channel layer wakes the socket),
   `pg` (no Redis: the statement appending the events sends
   NOTIFY agentrt_live, daphne's one listener wakes the socket) and `poll`
   (no Redis, AGENTRT_LIVE_PG_NOTIFY=0: only the consumer's 0.5 s poll).
   Per mode (a) the events of real runs driven by the workers (a scripted model
   taking 150 ms a step), from `occurred_at` (taken just before the worker's
   commit: an upper bound) to the frame's arrival, and (b) marker events this
   process commits through the store (`record_events`, the same statement and
   hooks as a worker's), from COMMIT's return to the frame's arrival.
2. **first-call**: bench/latency.py's part 1 (REST and Python submits, one
   at a time, on an idle warm cluster, with Redis), split by the run's events.
3. **floor**: what submit -> first model call cannot go below: (a) a NOTIFY
   round trip (one connection LISTENs, another sends NOTIFY in autocommit:
   from the send to the listener's receipt) and (b) one claim transaction
   (`runs.runtime.queue.run_claim` on a QUEUED run, in this process, no
   cluster running), each sampled and reported as p50/p95; floor = a + b.

Prints one JSON object on stdout and a table on stderr. Timings are reported,
never asserted; say how loaded the machine was (the load average is printed).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
import latency as lat
import steps as bench

PARTS = {"ws", "first-call", "floor"}
MODES = ("redis", "pg", "poll")


def loadavg() -> str:
    return Path("/proc/loadavg").read_text().strip()


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--only", default="ws,first-call,floor", help="parts to run (comma-separated)")
    p.add_argument("--modes", default=",".join(MODES), help="ws modes (comma-separated: redis, pg, poll)")
    p.add_argument("--markers", type=int, default=60, help="marker commits per ws mode")
    p.add_argument("--ws-runs", type=int, default=3, help="runs streamed per ws mode")
    p.add_argument("--samples", type=int, default=60, help="submits for first-call (half REST, half Python)")
    p.add_argument("--floor-samples", type=int, default=200, help="samples of each floor probe")
    p.add_argument("--workers", type=int, default=2, help="qcluster workers (default 2)")
    p.add_argument(
        "--database-url",
        default=os.environ.get("DATABASE_URL") or bench.DEFAULT_URL,
        help="PostgreSQL URL; the database (name + '_bench' unless it contains 'bench') is DROPPED and re-created",
    )
    p.add_argument("--logs", default=None, help="directory for the processes' logs (default: a temp directory)")
    a = p.parse_args(argv)
    a.only = {x.strip() for x in a.only.split(",") if x.strip()}
    a.modes = [x.strip() for x in a.modes.split(",") if x.strip()]
    if a.only - PARTS:
        p.error(f"--only: unknown part(s) {sorted(a.only - PARTS)}")
    if set(a.modes) - set(MODES):
        p.error(f"--modes: unknown mode(s) {sorted(set(a.modes) - set(MODES))}")
    return a


# ------------------------------------------------------------------ 1. commit -> frame


def part_ws(args, url: str, tenant, token: str, logs: Path) -> dict:
    # here, not at the top: the script sets Django up at run time, before the project's modules load
    from django.test import override_settings

    from agentrt_site.settings import redis_channel_layer
    from runs.models import Run
    from runs.services import run_submit

    out: dict = {}
    for mode in args.modes:
        redis = mode == "redis"
        pg = "1" if mode == "pg" else "0"
        dep = lat.Deployment(url, logs / mode, redis=redis, workers=args.workers, AGENTRT_LIVE_PG_NOTIFY=pg)
        db = lat.DB(url)
        layers = (
            {"default": redis_channel_layer(lat.REDIS)}
            if redis
            else {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
        )
        try:
            run_lat: list[float] = []
            for r in range(args.ws_runs):
                run, _ = run_submit(tenant=tenant, agent="ticker", input=f"ws {mode} {r}")
                bench.close_django()
                sock = lat.Socket(dep.port, token, str(run.id))
                t_open = time.time()
                try:
                    sock.wait_for(lambda f: f["type"] == "run.completed", 120)
                    frames = list(sock.frames)
                finally:
                    sock.close()
                for at, f in frames:
                    occurred = dt.datetime.fromisoformat(f["occurred_at"]).timestamp()
                    if occurred > t_open:  # committed while the socket was open: live, not the replay
                        run_lat.append((at - occurred) * 1e3)
            marker_lat: list[float] = []
            run_obj = Run.objects.get(id=run.id)
            with override_settings(CHANNEL_LAYERS=layers, AGENTRT_NOTIFY_LIVE=redis, AGENTRT_LIVE_PG_NOTIFY=pg == "1"):
                last = db.one("SELECT max(sequence) FROM events WHERE run_id = %s", [run.id])[0]
                sock = lat.Socket(dep.port, token, str(run.id), after=last)
                try:
                    time.sleep(0.5)
                    for i in range(args.markers):
                        time.sleep(random.uniform(0.05, 0.3))  # a random phase of the poll
                        seq, t_commit = lat._commit_marker(run_obj, i)
                        at, _ = sock.wait_for(lambda f, seq=seq: f["sequence"] == seq, 30)
                        marker_lat.append((at - t_commit) * 1e3)
                finally:
                    sock.close()
                    bench.close_django()
            out[mode] = {
                "run_events_occurred_to_frame_ms": lat.stats(run_lat),
                "marker_commit_to_frame_ms": lat.stats(marker_lat),
            }
            lat.log(f"  {mode}: commit -> frame {out[mode]['marker_commit_to_frame_ms']}")
        finally:
            db.close()
            dep.stop()
    out["targets_ms_p50"] = {"redis": 10, "pg": 50}
    return out


# ------------------------------------------------------------------ 3. the floor


def stats3(values: list[float]) -> dict | None:
    """`latency.stats` to the microsecond: the floor's parts are fractions of a millisecond."""
    if not values:
        return None
    return {
        "p50": round(statistics.median(values), 3),
        "p95": round(bench.pct(values, 0.95), 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
        "n": len(values),
    }


def part_floor(args, url: str, tenant) -> dict:
    # here, not at the top: the script sets Django up at run time, before the project's modules load
    from django.test import override_settings
    from django_q.models import OrmQ

    from runs.runtime.queue import run_claim
    from runs.services import run_submit

    listener = psycopg.connect(url, autocommit=True)
    sender = psycopg.connect(url, autocommit=True)
    notify: list[float] = []
    try:
        listener.execute("LISTEN bench_floor")
        for _ in range(args.floor_samples):
            t0 = time.perf_counter()
            sender.execute("NOTIFY bench_floor")
            for _note in listener.notifies(timeout=5, stop_after=1):
                break
            notify.append((time.perf_counter() - t0) * 1e3)
    finally:
        listener.close()
        sender.close()
    claims: list[float] = []
    runs = [run_submit(tenant=tenant, agent="first", input=f"floor {i}")[0] for i in range(args.floor_samples)]
    OrmQ.objects.all().delete()  # no cluster runs here; nothing else should take them later
    # the worker's claim statement (the tenant's share checked in it), with a share these runs never reach
    with override_settings(AGENTRT_TENANT_MAX_RUNNING=10 * len(runs)):
        for i, run in enumerate(runs):
            t0 = time.perf_counter()
            claimed = run_claim(run_id=run.id, owner=f"bench-floor:{os.getpid()}:{i}")
            claims.append((time.perf_counter() - t0) * 1e3)
            if claimed is None:
                raise SystemExit(f"floor: run {run.id} was not claimed")
    bench.close_django()
    n, c = stats3(notify), stats3(claims)
    return {
        "notify_round_trip_ms": n,
        "claim_transaction_ms": c,
        "floor_p50_ms": round(n["p50"] + c["p50"], 3) if n and c else None,
        "note": "NOTIFY sent in autocommit on one connection -> received on another; run_claim of a QUEUED run "
        "(one transaction: the guarded UPDATE and run.claimed) in this process",
    }


# ------------------------------------------------------------------ main


def main(argv=None) -> dict:
    args = parse_args(argv)
    url = bench.bench_url(args.database_url)
    logs = Path(args.logs) if args.logs else Path(tempfile.mkdtemp(prefix="agentrt-live-latency-"))
    for mode in MODES:
        (logs / mode).mkdir(parents=True, exist_ok=True)
    lat.log(f"bench database: {bench.db_name(url)} (dropped and re-created); logs: {logs}")
    before = loadavg()
    model = lat.ModelServer()
    tenant, token = lat.setup(url, model)
    result: dict = {
        "bench": "agentrt_live_latency",
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.argv[0]).name] + sys.argv[1:]) if argv is None else " ".join(argv),
        "loadavg_before": before,
        "floor_probe_before": bench.floor_probe(url),
        "params": {"workers": args.workers, "database": bench.db_name(url)},
    }
    if "ws" in args.only:
        lat.log("part 1: commit -> WebSocket frame: " + ", ".join(args.modes))
        result["ws"] = part_ws(args, url, tenant, token, logs)
    if "first-call" in args.only:
        lat.log("part 2: submit -> first model call")
        result["first_call"] = lat.part_first_call(args, url, tenant, token, logs, model)
    if "floor" in args.only:
        lat.log("part 3: the floor (NOTIFY round trip, claim transaction)")
        result["floor"] = part_floor(args, url, tenant)
    model.close()
    result["floor_probe_after"] = bench.floor_probe(url)
    result["loadavg_after"] = loadavg()
    print(json.dumps(result), flush=True)
    print_table(result)
    return result


def print_table(r: dict) -> None:
    def f(s):
        if not s:
            return "-"
        return f"p50 {s['p50']:.1f}  p95 {s['p95']:.1f}  (min {s['min']:.1f}, max {s['max']:.1f}, n={s['n']})"

    def f3(s):
        return "-" if not s else f"p50 {s['p50']:.3f}  p95 {s['p95']:.3f}  (n={s['n']})"

    rows = []
    for mode, v in (r.get("ws") or {}).items():
        if mode in MODES:
            rows.append((f"ws {mode}: commit -> frame ms", f(v["marker_commit_to_frame_ms"])))
            rows.append((f"ws {mode}: run event -> frame ms", f(v["run_events_occurred_to_frame_ms"])))
    fc = r.get("first_call")
    if fc:
        rows.append(("submit -> first model call ms", f(fc["total_ms"])))
        for via in ("rest", "python"):
            for k in ("total", "submit", "doorbell", "startup", "first_commit"):
                rows.append((f"  {via} {k}", f(fc[via][k])))
    fl = r.get("floor")
    if fl:
        rows.append(("floor: NOTIFY round trip ms", f3(fl["notify_round_trip_ms"])))
        rows.append(("floor: claim transaction ms", f3(fl["claim_transaction_ms"])))
        rows.append(("floor p50 ms", f"{fl['floor_p50_ms']}"))
    for when in ("before", "after"):
        p = r[f"floor_probe_{when}"]
        probe = f"SELECT 1 {p['select1_txn_ms']:.3f} ms, BEGIN+INSERT+COMMIT {p['insert_commit_ms']:.3f} ms"
        rows.append((f"probe {when}", probe))
    rows.append(("/proc/loadavg", f"before {r['loadavg_before']}; after {r['loadavg_after']}"))
    w = max(len(k) for k, _ in rows)
    lat.log("")
    for k, v in rows:
        lat.log(f"  {k.ljust(w)}  {v}")
    lat.log("")


if __name__ == "__main__":
    main()
