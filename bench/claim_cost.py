#!/usr/bin/env python
"""What a claim costs, in-process, on PostgreSQL (issue 34 item 5: the claim
with a tenant's share is on the hot path of every run's start).

    python bench/claim_cost.py [--runs 400] [--rounds 5] [--database-url URL]

Drops and re-creates its database (`…_claim_bench`), submits `--runs` runs of
one tenant with no cluster running, then claims each by id with
`runs.store.lease.claim` — the doorbell's claim: BEGIN, the claim, its
`run.claimed` event, COMMIT — timing each call. After each claim the run is
set back to COMPLETED (not timed), so its tenant holds no lease at the next.
The modes alternate round by round on one connection:

- `share=0`: the claim without a share (one UPDATE, as before issue 34);
- `share=1`: the claim under a share (the one UPDATE, whose guard takes the
  tenant's lock and counts its leases: agentrt_tenant_leases);
- `refused`: a claim while the tenant holds its one lease (the run stays
  QUEUED);
- `look, N queued`: what a run's release adds (`lease.next_for_tenant`:
  the tenant's lock, then its oldest queued run if it has room), with the
  tenant's `--runs` runs queued;
- `look, none queued`: the same for a tenant with nothing queued (most
  releases);
- `paired`: `share=0` and `share=1` claim by claim, the order swapped every
  pair, and the median of each pair's difference: the share's cost on a
  host whose speed drifts (the modes above run `--runs` claims at a time).

`--no-flush-wait` sets synchronous_commit = off on the claiming connection:
on a host whose WAL flush swings (a shared disk), what is left is the
statements and their round trips. Code that predates the share (no `share`
parameter) measures `share=0` only:
run the script from a checkout of that code for the figure before. Prints one
JSON line on stdout and a table on stderr: the median and p90 per call, µs.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import steps as bench  # noqa: E402


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=400, help="runs claimed per mode and round (default 400)")
    p.add_argument("--rounds", type=int, default=5, help="rounds, the modes alternating (default 5)")
    p.add_argument(
        "--no-flush-wait",
        action="store_true",
        help="synchronous_commit = off on the claiming connection: a commit does not wait for its WAL flush, so "
        "what is timed is the statements and their round trips, not the disk (for a host whose flush latency swings)",
    )
    p.add_argument(
        "--database-url",
        default=os.environ.get("DATABASE_URL") or "postgres://postgres@127.0.0.1:5432/agentrt_claim_bench",
    )
    a = p.parse_args(argv)
    url = bench.bench_url(a.database_url)
    load = os.getloadavg()
    tenant = bench.fresh_product(url, {"claim": 2})
    probe = bench.floor_probe(url)

    # here, not at the top: the script sets Django up at run time, before the project's modules load
    from django.db import connection

    from runs.models import Run
    from runs.services import run_submit
    from runs.store import lease

    shared = "share" in inspect.signature(lease.claim).parameters
    if a.no_flush_wait:
        with connection.cursor() as cursor:
            cursor.execute("SET synchronous_commit = off")
    modes = ["share=0", "share=1", "refused", "look, N queued", "look, none queued"] if shared else ["share=0"]
    times: dict[str, list[float]] = {m: [] for m in modes}

    def fresh(n: int) -> list:
        return [run_submit(tenant=tenant, agent="claim", input=f"claim {i}")[0].id for i in range(n)]

    def settle(run_ids) -> None:
        Run.objects.filter(id__in=run_ids).update(status="COMPLETED", lease_owner=None, lease_expires_at=None)

    def one_mode(mode: str, measured: bool) -> None:
        ids = fresh(a.runs) if mode != "look, none queued" else [None] * a.runs
        if mode != "share=0" and mode != "share=1":
            holder = fresh(1)[0]
            assert lease.claim(run_id=holder, owner="holder", lease_seconds=30, share=1) is not None
        for run_id in ids:
            t0 = time.perf_counter()
            if mode == "share=0":
                got = lease.claim(run_id=run_id, owner="w", lease_seconds=30, **({"share": 0} if shared else {}))
                ok = got is not None
            elif mode == "share=1":
                ok = lease.claim(run_id=run_id, owner="w", lease_seconds=30, share=1) is not None
            elif mode == "refused":
                ok = lease.claim(run_id=run_id, owner="w", lease_seconds=30, share=1) is None
            else:  # the tenant holds one lease of a share of 2: room; its oldest queued run, or none
                found = lease.next_for_tenant(tenant_id=tenant.id, released=holder, share=2)
                ok = (found is None) == (mode == "look, none queued")
            dt = time.perf_counter() - t0
            assert ok, mode
            if measured:
                times[mode].append(dt)
            if mode in ("share=0", "share=1"):
                settle([run_id])
        settle(Run.objects.filter(status__in=["QUEUED", "RUNNING"]).values_list("id", flat=True))

    def paired(n: int) -> list[tuple[float, float]]:
        """share=0 and share=1 claim by claim, the order swapped every pair: a host whose speed drifts
        moves both alike, and each pair's difference is the share's cost."""
        pairs = []
        for i in range(n):
            got = {}
            ids = fresh(2)  # a pair at a time: the tenant's active-run quota
            for share in (0, 1) if i % 2 == 0 else (1, 0):
                run_id = ids[share]
                t0 = time.perf_counter()
                assert lease.claim(run_id=run_id, owner="w", lease_seconds=30, share=share) is not None
                got[share] = time.perf_counter() - t0
                settle([run_id])
            pairs.append((got[0], got[1]))
        return pairs

    for mode in modes:  # warm: every statement prepared
        one_mode(mode, measured=False)
    for r in range(a.rounds):
        for mode in modes if r % 2 == 0 else list(reversed(modes)):
            one_mode(mode, measured=True)
    pairs = paired(a.runs * a.rounds) if shared else []
    connection.close()

    def us(values: list[float], q: float) -> float:
        return round(bench.pct(values, q) * 1e6, 1)

    figures = {m: {"median_us": us(v, 0.5), "p90_us": us(v, 0.9), "n": len(v)} for m, v in times.items()}
    if pairs:
        figures["paired"] = {
            "share=0_median_us": us([a for a, _ in pairs], 0.5),
            "share=1_median_us": us([b for _, b in pairs], 0.5),
            "difference_median_us": us([b - a for a, b in pairs], 0.5),
            "difference_p25_us": us([b - a for a, b in pairs], 0.25),
            "difference_p75_us": us([b - a for a, b in pairs], 0.75),
            "n": len(pairs),
        }
    result = {
        "bench": "claim_cost",
        "code_has_share": shared,
        "runs": a.runs,
        "rounds": a.rounds,
        "load_1min_before": round(load[0], 2),
        "no_flush_wait": a.no_flush_wait,
        "pg_floor": probe,
        "results": figures,
    }
    print(json.dumps(result))
    wait = ", commits not waiting for their flush" if a.no_flush_wait else ""
    print(f"claim cost, in-process, {a.runs} x {a.rounds} per mode{wait} (load {load[0]:.2f})", file=sys.stderr)
    print(
        f"  floor: SELECT 1 {probe['select1_txn_ms']} ms, INSERT+COMMIT {probe['insert_commit_ms']} ms", file=sys.stderr
    )
    for m, f in figures.items():
        if m == "paired":
            print(
                f"  paired ({f['n']}): share=0 {f['share=0_median_us']:.1f} us, share=1 {f['share=1_median_us']:.1f}"
                f" us; share=1 - share=0 median {f['difference_median_us']:.1f} us"
                f" (p25 {f['difference_p25_us']:.1f}, p75 {f['difference_p75_us']:.1f})",
                file=sys.stderr,
            )
            continue
        print(f"  {m:<18} median {f['median_us']:8.1f} us   p90 {f['p90_us']:8.1f} us", file=sys.stderr)
    return result


if __name__ == "__main__":
    main()
