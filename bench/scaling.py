#!/usr/bin/env python
"""Throughput against worker nodes, with the database's commit rate as the ceiling (issue 14, item 6).

    python bench/scaling.py [--nodes 1,2,3,4] [--workers-per-node 2] [--runs 60] [--steps 20] [--rounds 1]
                            [--json bench/results/scaling.json] [--markdown PATH]

For each node count N (in `--rounds` rounds, N in the given order each round):

1. measures the PostgreSQL commit floor at the concurrency the cluster will
   have (N x workers-per-node connections, each `INSERT; COMMIT` in a loop
   for `--floor-seconds`, no cluster running): the most commits a second
   this server gives that many clients on this machine right now — the
   ceiling. With one connection it is the peers' `commit_1stmt` shape
   (/work/shared/bench/peers/pg_floor.py);
2. starts `manage.py cluster --workers N --web 0 --no-maintenance` (the
   worker nodes of `make cluster`), waits until it is ready and warm
   (2 warm-up runs per worker completed), waits `--settle-seconds`, measures
   the idle nodes' commit rate;
3. submits `--runs` runs of `--steps` steps (bench/steps.py's agent: one
   `echo` per step, a ~0-time scripted model, so what is measured is the
   runtime), waits until all are COMPLETED, stops the cluster, and reads
   `pg_stat_database.xact_commit` before and after.

Reported per N: runs/s and steps/s (first run created → last completed),
the database's commit rate over that window (raw, and per step with the idle
nodes' polling subtracted: the runs' steps, claims and finishes, their
submits and django-q2's queue and result rows), the floor at that concurrency and
the ceiling it implies in steps/s (floor ÷ commits per step), the share of
it reached, and the 1-minute load average before and after. One database
(default `agentrt_scaling_bench`, dropped and re-created once) serves every N.
The machine's other users show in the load average: quote the figures with it.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

import steps as sb  # noqa: E402  (bench/steps.py: database, counters, agent, submit, poller, event figures)

DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/agentrt_scaling_bench"


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--nodes", default="1,2,3,4", help="worker node counts, in order (default 1,2,3,4)")
    p.add_argument("--workers-per-node", type=int, default=2, help="AGENTRT_WORKERS of each node (default 2)")
    p.add_argument("--runs", type=int, default=60, help="runs per measurement (default 60)")
    p.add_argument("--steps", type=int, default=20, help="steps per run (default 20)")
    p.add_argument("--rounds", type=int, default=1, help="repeat the whole sequence (default 1)")
    p.add_argument("--floor-seconds", type=float, default=4.0, help="length of each floor measurement (default 4)")
    p.add_argument("--idle-seconds", type=float, default=5.0)
    p.add_argument("--settle-seconds", type=float, default=11.0, help="idle backends flush their counters within 10 s")
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument(
        "--database-url",
        default=None,
        help=f"default: agentrt_scaling_bench on $DATABASE_URL's server, else {DEFAULT_URL}; DROPPED and re-created",
    )
    p.add_argument("--json", default=None, help="write every measurement here as JSON")
    p.add_argument("--markdown", default=None, help="write the table here")
    p.add_argument("--log-dir", default=None, help="the cluster's node logs (default: a temp folder)")
    a = p.parse_args(argv)
    a.node_counts = [int(x) for x in a.nodes.split(",") if x.strip()]
    if not a.node_counts or min(a.node_counts) < 1 or a.runs < 1 or a.steps < 2:
        p.error("need node counts >= 1, --runs >= 1, --steps >= 2")
    return a


def bench_database(arg: str | None) -> str:
    if arg:
        return sb.bench_url(arg)
    env = os.environ.get("DATABASE_URL", "")
    if env.startswith(("postgres://", "postgresql://")):
        return sb.with_db(env, "agentrt_scaling_bench")
    return DEFAULT_URL


def commit_floor(url: str, clients: int, seconds: float) -> dict:
    """Commits a second that `clients` connections get, each `INSERT; COMMIT` in a loop."""
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("CREATE TABLE IF NOT EXISTS bench_floor (id bigserial primary key, client int, payload jsonb)")
    counts = [0] * clients
    go, stop = threading.Event(), threading.Event()

    def client(k: int) -> None:
        with psycopg.connect(url) as conn:
            go.wait()
            while not stop.is_set():
                conn.execute(
                    'INSERT INTO bench_floor (client, payload) VALUES (%s, \'{"tokens_in": 123, "status": "ok"}\')', [k]
                )
                conn.commit()
                counts[k] += 1

    threads = [threading.Thread(target=client, args=(k,), daemon=True) for k in range(clients)]
    for t in threads:
        t.start()
    time.sleep(0.5)  # connected
    t0 = time.perf_counter()
    go.set()
    time.sleep(seconds)
    stop.set()
    elapsed = time.perf_counter() - t0
    for t in threads:
        t.join()
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("DROP TABLE bench_floor")
    total = sum(counts)
    return {
        "clients": clients,
        "commits_per_s": round(total / elapsed, 1),
        "ms_per_commit_per_client": round(clients * elapsed * 1e3 / total, 3),
    }


class ClusterProc:
    """`manage.py cluster --workers N --web 0 --no-maintenance`."""

    def __init__(self, url: str, nodes: int, workers: int, log_dir: Path):
        env = dict(
            os.environ,
            DATABASE_URL=url,
            AGENTRT_LOG_LEVEL=os.environ.get("AGENTRT_LOG_LEVEL", "WARNING"),
            PYTHONUNBUFFERED="1",
        )
        env.pop("REDIS_URL", None)  # as bench/steps.py: nothing here needs live wake-ups
        # One tenant's runs on every worker of every node, as bench/steps.py (issue 34 item 5's share).
        env.setdefault("AGENTRT_TENANT_MAX_RUNNING", str(nodes * workers))
        log_dir.mkdir(parents=True, exist_ok=True)
        self.out_path = log_dir / f"cluster-{nodes}.log"
        self.out = open(self.out_path, "ab")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "manage.py",
                "cluster",
                "--workers",
                str(nodes),
                "--worker-processes",
                str(workers),
                "--web",
                "0",
                "--no-maintenance",
                "--log-dir",
                str(log_dir / f"nodes-{nodes}"),
            ],
            cwd=ROOT,
            env=env,
            stdout=self.out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def wait_ready(self, timeout: float = 240) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"the cluster exited ({self.proc.returncode}):\n{self.tail()}")
            if "agentrt cluster is running" in self.out_path.read_text(errors="replace"):
                return
            time.sleep(0.2)
        raise SystemExit(f"the cluster was not ready after {timeout} s:\n{self.tail()}")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def tail(self, n: int = 30) -> str:
        return "\n".join(self.out_path.read_text(errors="replace").splitlines()[-n:])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.out.close()


def measure(args, url: str, tenant, counters: sb.Counters, nodes: int, log_dir: Path) -> dict:
    workers = nodes * args.workers_per_node
    load_before = os.getloadavg()[0]
    sb.checkpoint(url)
    floor = commit_floor(url, workers, args.floor_seconds)
    floor1 = commit_floor(url, 1, args.floor_seconds / 2)
    cluster = ClusterProc(url, nodes, args.workers_per_node, log_dir)
    try:
        cluster.wait_ready()
        poller = sb.Poller(url)
        warm = sb.submit(tenant, "warm", 2 * workers, f"warm-{nodes}")
        sb.close_django()
        poller.wait(warm, 240, cluster)
        poller.close()
        time.sleep(args.settle_seconds)
        i0 = counters.read()
        time.sleep(args.idle_seconds)
        i1 = counters.read()
        idle_rate = (i1["xact_commit"] - i0["xact_commit"] - counters.overhead) / (i1["t"] - i0["t"])
        m0 = i1
        poller = sb.Poller(url)
        ids = sb.submit(tenant, "main", args.runs, f"scale-{nodes}")
        sb.close_django()
        poller.wait(ids, args.timeout, cluster)
        poller.close()
        t_seen = time.time()
        m1 = counters.read()
    finally:
        cluster.stop()
    ev = sb.event_figures(url, ids, args.steps)
    wall = ev["last_completed"] - ev["first_created"]
    window = m1["t"] - m0["t"]
    d = sb.delta(m0, m1)
    commits = d["xact_commit"] - counters.overhead - poller.queries
    total_steps = args.runs * args.steps
    per_step = (commits - idle_rate * window) / total_steps
    steps_per_s = total_steps / wall
    ceiling = floor["commits_per_s"] / per_step if per_step > 0 else None
    return {
        "nodes": nodes,
        "workers": workers,
        "runs": args.runs,
        "steps": args.steps,
        "wall_s": round(wall, 2),
        "runs_per_s": round(args.runs / wall, 2),
        "steps_per_s": round(steps_per_s, 1),
        "step_gap_ms": ev["step_gap_ms"],
        "steps_ok": ev["step_counts_ok"],
        "db_commits_per_s": round(commits / window, 1),
        "window_s": round(window, 2),
        "seen_after_s": round(t_seen - m0["t"], 2),
        "commits_per_step": round(per_step, 3),
        "idle_commits_per_s": round(idle_rate, 2),
        "runs_commits_per_s": round(per_step * steps_per_s, 1),
        "floor": floor,
        "floor_1_client": floor1,
        "ceiling_steps_per_s": round(ceiling, 1) if ceiling else None,
        "share_of_ceiling": round(steps_per_s / ceiling, 3) if ceiling else None,
        "wal_sync_per_step": round(d["wal_sync"] / total_steps, 3),
        "loadavg_1m": {"before": round(load_before, 2), "after": round(os.getloadavg()[0], 2)},
    }


def table(results: list[dict], meta: dict) -> str:
    lines = [
        f"`{meta['command']}` — {meta['date']}, {meta['cores']} cores, PostgreSQL {meta['server_version']}, "
        f"{meta['workers_per_node']} workers per node, {meta['runs']} runs x {meta['steps']} steps per measurement.",
        "",
        "| worker nodes (workers) | runs/s | steps/s | step gap median ms | DB commits/s (raw) "
        "| commits/step (idle polling subtracted) | floor commits/s at that many connections "
        "| ceiling steps/s (floor ÷ commits/step) | share of ceiling | load avg before / after |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        g = r["step_gap_ms"] or {}
        lines.append(
            f"| {r['nodes']} ({r['workers']}) | {r['runs_per_s']} | {r['steps_per_s']} | {g.get('median')} "
            f"| {r['db_commits_per_s']} | "
            f"{r['commits_per_step']} | {r['floor']['commits_per_s']} | {r['ceiling_steps_per_s']} | "
            f"{round(100 * r['share_of_ceiling'])} % | {r['loadavg_1m']['before']} / {r['loadavg_1m']['after']} |"
        )
    return "\n".join(lines) + "\n"


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    url = bench_database(args.database_url)
    log_dir = Path(args.log_dir) if args.log_dir else Path(sb.tempfile.mkdtemp(prefix="agentrt-scaling-"))
    sb.log(f"scaling bench: database {sb.db_name(url)} (dropped and re-created); node logs in {log_dir}")
    tenant = sb.fresh_product(url, {"main": args.steps, "warm": 3})
    sb.close_django()
    counters = sb.Counters(url)
    counters.calibrate()
    with psycopg.connect(url, autocommit=True) as c:
        server_version = c.execute("SHOW server_version").fetchone()[0]
    results = []
    for r in range(args.rounds):
        for n in args.node_counts:
            res = measure(args, url, tenant, counters, n, log_dir)
            res["round"] = r + 1
            results.append(res)
            sb.log(
                f"round {r + 1}, {n} node(s) x {args.workers_per_node}: {res['runs_per_s']} runs/s, "
                f"{res['steps_per_s']} steps/s, DB {res['db_commits_per_s']} commits/s "
                f"({res['commits_per_step']}/step); "
                f"floor {res['floor']['commits_per_s']}/s at {res['workers']} connections -> ceiling "
                f"{res['ceiling_steps_per_s']} steps/s; load {res['loadavg_1m']}"
            )
    meta = {
        "bench": "agentrt_scaling",
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": "python bench/scaling.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "cores": os.cpu_count(),
        "server_version": server_version,
        "workers_per_node": args.workers_per_node,
        "runs": args.runs,
        "steps": args.steps,
    }
    md = table(results, meta)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"meta": meta, "results": results}, indent=2))
    if args.markdown:
        Path(args.markdown).write_text(md)
    print(json.dumps({"meta": meta, "results": results}))
    sb.log("\n" + md)
    return results


if __name__ == "__main__":
    main()
