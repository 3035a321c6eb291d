#!/usr/bin/env python
"""`bench/steps.py --long`: does a step cost the same at step 400 as at step 10?

    python bench/steps.py --long [--long-steps 400] [--result-bytes 8192] [--short-runs 20] [--repeats R]
                                 [--database-url URL]

Through a real `manage.py qcluster` with one worker (the path users take:
runs.services.run_submit, the doorbell, the executor), on a bench database
that is dropped and re-created, in this order:

1. one run of `--long-steps` steps, each a `bench_blob` call (bench/bench_tools.py,
   loaded with AGENTRT_TOOL_MODULES) returning `--result-bytes` of text;
2. `--short-runs` runs of 10 steps with a small `echo` result each (the
   reference: the agent of `bench/steps.py`);
3. with `--repeats R`, (1) and (2) again, R times in all, in the same
   cluster: every figure below is then the median over the repeats (per
   bucket for the long runs), and each repeat's ratios are given too. The
   host drifts over minutes; a long run set beside short runs measured just
   after it, repeated, is less at the mercy of one slow minute.

For the long run, per bucket of 50 steps (`--bucket`):

- ms/step: median gap between consecutive `model.request.started` events;
- WAL bytes/step from the server's WAL itself (pg_walinspect over the run's
  LSN range, records of this database only, so other databases on a shared
  server do not count), full-page images apart (how many a step writes
  depends on when the server last checkpointed, not on the step);
- write transactions/step: the transaction ids whose commit records fall in
  the bucket (every write commit has one; a read-only transaction has none —
  those are pinned at zero by tests/integration/test_commits_per_step.py);
- index entries/step (B-tree leaf inserts), heap inserts, updates and HOT
  updates per step, bytes per commit.

pg_stat_database counts commits too, read-only ones included, but a busy
backend publishes them at most once a second, which is coarser than a bucket:
its figure is given for the whole long run and for the short runs
(`commits_per_step`, after the cluster has stopped).

Wall-clock figures on a shared 2-core machine are noisy; the WAL, transaction
and index figures do not depend on load.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
import steps as bench  # noqa: E402 (the sibling script, by path)

TOOL_MODULE = "bench.bench_tools"
SHORT_STEPS = 10


def long_agent(name: str, steps: int, size: int) -> dict:
    turns = [{"tool_calls": [{"name": "bench_blob", "arguments": {"size": size, "seed": i}}]} for i in range(1, steps)]
    turns.append({"text": "done"})
    return {
        "name": name,
        "instructions": "benchmark agent: one large tool result per step, then answer",
        "model": {"provider": "scripted", "turns": turns},
        "tools": ["bench_blob"],
        "limits": {
            "max_steps": steps + 5,
            "max_model_calls": steps + 10,
            "max_tool_calls": steps + 10,
            "deadline_seconds": 3600,
        },
    }


def setup(url: str, steps: int, size: int):
    # here, not at the top: the script sets Django up at run time, before the project's modules load
    from django.core.management import call_command

    from runs.services import agent_load, tenant_create

    call_command("migrate", verbosity=0, interactive=False)
    tenant, _ = tenant_create(name="bench", username="bench")
    agent_load(tenant=tenant, definition=long_agent("long", steps, size))
    agent_load(tenant=tenant, definition=bench.agent_definition("short", SHORT_STEPS))
    agent_load(tenant=tenant, definition=bench.agent_definition("warm", 3))
    return tenant


class Wal:
    """Reads the server's WAL as it is written (pg_walinspect), keeping
    (lsn, xid, resource manager, record type, length, fpi length) of every
    record that touches this database and of every commit record (the caller
    keeps the commits of its own transactions). Read while the runs go on: a
    server checkpoint may recycle the segments of a window read later, and
    on a shared server other databases write most of the WAL."""

    def __init__(self, url: str):
        self.conn = psycopg.connect(url, autocommit=True)
        self.conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        self.oid = self.conn.execute("SELECT oid FROM pg_database WHERE datname = current_database()").fetchone()[0]
        self.records: list[tuple] = []
        self.read_to = self.lsn()

    def lsn(self) -> str:
        return str(self.conn.execute("SELECT pg_current_wal_flush_lsn()").fetchone()[0])

    def collect(self) -> str:
        """Read up to the current end of WAL; return it."""
        end = self.lsn()
        if end != self.read_to:
            self.records += self.conn.execute(
                "SELECT start_lsn - '0/0'::pg_lsn, xid::text::bigint, resource_manager, record_type, record_length,"
                " fpi_length FROM pg_get_wal_records_info(%s, %s)"
                " WHERE block_ref LIKE %s OR (resource_manager = 'Transaction' AND record_type LIKE 'COMMIT%%')"
                " ORDER BY start_lsn",
                [self.read_to, end, f"%/{self.oid}/%"],
            ).fetchall()
            self.read_to = end
        return end

    def between(self, start: str, end: str) -> list[tuple]:
        lo, hi = _lsn(start), _lsn(end)
        return [r for r in self.records if lo <= r[0] < hi]

    def close(self) -> None:
        self.conn.close()


def _lsn(text: str) -> int:
    high, low = text.split("/")
    return (int(high, 16) << 32) + int(low, 16)


def wait_reading_wal(poller, wal: Wal, ids: list, timeout: float, cluster) -> None:
    """The poller's wait, reading the WAL about once a second meanwhile."""
    end = time.time() + timeout
    while True:
        try:
            poller.wait(ids, 1.0, cluster)
            return
        except SystemExit as exc:
            if "timed out" not in str(exc) or time.time() > end:
                raise
        wal.collect()


def run_events(url: str, run_id) -> list[tuple]:
    """(sequence, writing transaction id, type, step) of every event of the run."""
    with psycopg.connect(url, autocommit=True) as c:
        return c.execute(
            "SELECT sequence, xmin::text::bigint, type, (payload->>'step')::int, occurred_at FROM events"
            " WHERE run_id = %s ORDER BY sequence",
            [str(run_id)],
        ).fetchall()


def step_of_transactions(events: list[tuple]) -> dict[int, int]:
    """Each writing transaction's step: the step whose request was the last
    one started before the transaction's first event (commit 2 of step s also
    starts step s + 1's request; it belongs to step s)."""
    first: dict[int, int] = {}
    for seq, xid, _, _, _ in events:
        first.setdefault(xid, seq)
    starts = [(seq, step) for seq, _, type_, step, _ in events if type_ == "model.request.started"]
    owner: dict[int, int] = {}
    for xid, seq in first.items():
        before = [step for s, step in starts if s < seq]
        owner[xid] = before[-1] if before else 0
    return owner


def buckets(url: str, run_id, records: list[tuple], size: int) -> list[dict]:
    events = run_events(url, run_id)
    owner = step_of_transactions(events)
    starts = {step: at.timestamp() for _, _, type_, step, at in events if type_ == "model.request.started"}
    ours = set(owner)
    # The commit record of each of the run's transactions closes it; a bucket
    # runs to the commit of its last transaction.
    commit_lsn = {xid: lsn for lsn, xid, rm, rtype, *_ in records if rm == "Transaction" and xid in ours}
    last_step = max(starts)
    out = []
    lo = 0
    for first_step in range(1, last_step + 1, size):
        steps = range(first_step, min(first_step + size, last_step + 1))
        xids = [x for x, s in owner.items() if s in steps]
        hi = max(commit_lsn[x] for x in xids if x in commit_lsn)
        mine = [
            r for r in records if lo < r[0] <= hi and (r[2] != "Transaction" or r[1] in ours)
        ]  # this database's records and the run's commits
        lo = hi
        n = len(steps)
        gaps = [(starts[s + 1] - starts[s]) * 1e3 for s in steps if s + 1 in starts]
        total = sum(r[4] for r in mine)
        fpi = sum(r[5] for r in mine)
        kinds: dict[str, int] = {}
        for r in mine:
            kinds[f"{r[2]}/{r[3]}"] = kinds.get(f"{r[2]}/{r[3]}", 0) + 1
        commits = sum(1 for x in xids if x in commit_lsn)
        out.append(
            {
                "steps": f"{steps.start}-{steps.stop - 1}",
                "ms_per_step_median": round(statistics.median(gaps), 3) if gaps else None,
                "wal_bytes_per_step": round((total - fpi) / n, 1),
                "fpi_bytes_per_step": round(fpi / n, 1),
                "write_txns_per_step": round(commits / n, 2),
                "index_entries_per_step": round(
                    (kinds.get("Btree/INSERT_LEAF", 0) + kinds.get("Btree/INSERT_POST", 0)) / n, 2
                ),
                "heap_inserts_per_step": round((kinds.get("Heap/INSERT", 0) + kinds.get("Heap/INSERT+INIT", 0)) / n, 2),
                "heap_updates_per_step": round((kinds.get("Heap/UPDATE", 0) + kinds.get("Heap/UPDATE+INIT", 0)) / n, 2),
                "hot_updates_per_step": round(
                    (kinds.get("Heap/HOT_UPDATE", 0) + kinds.get("Heap/HOT_UPDATE+INIT", 0)) / n, 2
                ),
                "wal_bytes_per_commit": round((total - fpi) / commits, 1) if commits else None,
            }
        )
    return out


def short_figures(url: str, ids: list, records: list[tuple]) -> dict:
    """Per-step figures of the short runs: the step gap and, from the WAL,
    what the runs wrote in all (their per-run writes included)."""
    gaps: list[float] = []
    xids: set[int] = set()
    steps = 0
    for run_id in ids:
        events = run_events(url, run_id)
        xids |= {xid for _, xid, *_ in events}
        starts = [at.timestamp() for _, _, type_, _, at in events if type_ == "model.request.started"]
        gaps += [(b - a) * 1e3 for a, b in zip(starts, starts[1:], strict=False)]
        steps += len(starts)
    records = [r for r in records if r[2] != "Transaction" or r[1] in xids]
    total = sum(r[4] for r in records)
    fpi = sum(r[5] for r in records)
    return {
        "runs": len(ids),
        "steps": steps,
        "ms_per_step_median": round(statistics.median(gaps), 3),
        "ms_per_step_p90": round(bench.pct(gaps, 0.9), 3),
        "wal_bytes_per_step_all_in": round((total - fpi) / steps, 1),
        "note": "WAL per step here includes each run's submit, claim and finalize (10 steps a run)",
    }


def merge_buckets(runs: list[list[dict]]) -> list[dict]:
    """Per bucket, the median of each figure over the repeats (one repeat: itself)."""
    out = []
    for same in zip(*runs, strict=True):
        merged = dict(same[0])
        for key, value in same[0].items():
            if key != "steps" and isinstance(value, (int, float)):
                values = [b[key] for b in same if b[key] is not None]
                merged[key] = round(statistics.median(values), 3) if values else None
        merged["ms_per_step_each_repeat"] = [b["ms_per_step_median"] for b in same]
        out.append(merged)
    return out


def merge_short(runs: list[dict]) -> dict:
    """The short runs of every repeat: medians of their figures."""
    merged = dict(runs[0])
    for key in ("ms_per_step_median", "ms_per_step_p90", "wal_bytes_per_step_all_in"):
        merged[key] = round(statistics.median(r[key] for r in runs), 3)
    merged["runs"] = sum(r["runs"] for r in runs)
    merged["steps"] = sum(r["steps"] for r in runs)
    merged["ms_per_step_each_repeat"] = [r["ms_per_step_median"] for r in runs]
    return merged


def ratios(per_bucket: list[dict], short: dict) -> dict:
    """The long run's step against the short runs': its median bucket and its worst."""
    gaps = [b["ms_per_step_median"] for b in per_bucket if b["ms_per_step_median"] is not None]
    return {
        "median_of_buckets": round(statistics.median(gaps) / short["ms_per_step_median"], 3),
        "worst_bucket": round(max(gaps) / short["ms_per_step_median"], 3),
    }


def main(args) -> dict:
    url = bench.bench_url(args.database_url)
    os.environ["AGENTRT_TOOL_MODULES"] = ",".join(
        m for m in (os.environ.get("AGENTRT_TOOL_MODULES", ""), TOOL_MODULE) if m
    )
    cluster_log = (
        Path(args.cluster_log)
        if args.cluster_log
        else Path(tempfile.mkstemp(prefix="agentrt-bench-long-", suffix=".log")[1])
    )
    bench.log(f"bench database: {bench.db_name(url)} (dropped and re-created); qcluster log: {cluster_log}")
    load_before = os.getloadavg()
    bench.recreate_database(url)
    bench.django_setup(url)
    tenant = setup(url, args.long_steps, args.result_bytes)
    bench.close_django()
    counters = bench.Counters(url)
    probe = bench.floor_probe(url)
    counters.calibrate()

    warm = bench.submit(tenant, "warm", 1, "warm")
    bench.close_django()
    cluster = bench.Cluster(url, 1, cluster_log)
    poller = bench.Poller(url)
    wal = Wal(url)
    try:
        poller.wait(warm, 120, cluster)
        time.sleep(args.settle_seconds)
        c0 = counters.read()
        # Long run, then the short runs, `--repeats` times: the host drifts
        # over minutes, so each long run is set beside short runs measured
        # right after it, and a bucket's figure is its median over repeats.
        rounds = []
        for _ in range(args.repeats):
            l0 = wal.collect()
            long_ids = bench.submit(tenant, "long", 1, "long")
            wait_reading_wal(poller, wal, long_ids, args.timeout, cluster)
            l1 = wal.collect()
            short_ids = bench.submit(tenant, "short", args.short_runs, "short")
            wait_reading_wal(poller, wal, short_ids, args.timeout, cluster)
            l2 = wal.collect()
            rounds.append((long_ids[0], short_ids, l0, l1, l2))
        bench.close_django()
    finally:
        cluster.stop()
        poller.close()
        wal.close()
    time.sleep(0.5)
    c1 = counters.read()
    d = bench.delta(c0, c1)
    long_steps, short_steps = args.long_steps, args.short_runs * SHORT_STEPS
    repeats = [
        (buckets(url, long_id, wal.between(l0, l1), args.bucket), short_figures(url, short_ids, wal.between(l1, l2)))
        for long_id, short_ids, l0, l1, l2 in rounds
    ]
    per_bucket = merge_buckets([b for b, _ in repeats])
    short = merge_short([s for _, s in repeats])
    per_repeat = [{**ratios(b, s), "short_ms_per_step_median": s["ms_per_step_median"]} for b, s in repeats]
    result = {
        "bench": "agentrt_long_run",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "params": {
            "long_steps": long_steps,
            "result_bytes": args.result_bytes,
            "short_runs": args.short_runs,
            "short_steps": SHORT_STEPS,
            "bucket": args.bucket,
            "repeats": args.repeats,
            "database": bench.db_name(url),
        },
        "floor_probe_before": probe,
        "loadavg_1m": {"before": round(load_before[0], 2), "after": round(os.getloadavg()[0], 2)},
        "long_run_buckets": per_bucket,
        "short_runs": short,
        "ratio_long_to_short_ms": ratios(per_bucket, short),
        "ratio_per_repeat": per_repeat,
        "commits_per_step_pg_stat_database": {
            "both_runs": round(
                (d["xact_commit"] - counters.overhead - poller.queries) / ((long_steps + short_steps) * args.repeats), 3
            ),
            "note": "the long run and the short runs together, with the bench's polls, idle polling and each run's "
            "submit, claim and finalize; pg_stat_database publishes a busy backend's counts at most once a second",
        },
    }
    print(json.dumps(result), flush=True)
    print_table(result)
    return result


def print_table(r: dict) -> None:
    p = r["params"]
    bench.log(
        f"\n  long run: 1 x {p['long_steps']} steps, {p['result_bytes']} B tool results; "
        f"short: {p['short_runs']} x {p['short_steps']} steps, small results (1 worker)"
    )
    head = (
        "steps",
        "ms/step",
        "WAL B/step",
        "FPI B/step",
        "txns/step",
        "idx/step",
        "ins",
        "upd",
        "hot",
        "WAL B/commit",
    )
    bench.log("  " + "  ".join(f"{h:>12}" for h in head))
    for b in r["long_run_buckets"]:
        row = (
            b["steps"],
            b["ms_per_step_median"],
            b["wal_bytes_per_step"],
            b["fpi_bytes_per_step"],
            b["write_txns_per_step"],
            b["index_entries_per_step"],
            b["heap_inserts_per_step"],
            b["heap_updates_per_step"],
            b["hot_updates_per_step"],
            b["wal_bytes_per_commit"],
        )
        bench.log("  " + "  ".join(f"{v!s:>12}" for v in row))
    s = r["short_runs"]
    bench.log(
        f"  short runs: {s['ms_per_step_median']} ms/step median (p90 {s['ms_per_step_p90']}), "
        f"{s['wal_bytes_per_step_all_in']} WAL B/step all in"
    )
    q = r["ratio_long_to_short_ms"]
    bench.log(f"  long/short ms per step: {q['median_of_buckets']} (median bucket), {q['worst_bucket']} (worst bucket)")
    if p["repeats"] > 1:
        each = ", ".join(f"{x['median_of_buckets']} / {x['worst_bucket']}" for x in r["ratio_per_repeat"])
        bench.log(f"  (buckets: medians over {p['repeats']} repeats; each repeat alone, median / worst: {each})")
    bench.log(f"  commits/step (pg_stat_database, both runs): {r['commits_per_step_pg_stat_database']['both_runs']}")
    bench.log(f"  load average {r['loadavg_1m']['before']} before, {r['loadavg_1m']['after']} after (shared machine)\n")
