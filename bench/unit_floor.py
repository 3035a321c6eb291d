#!/usr/bin/env python
"""What one unit of a read-only step costs PostgreSQL, piece by piece, beside
the machine's floor: the lower bound a step of two synchronous commits has on
this host, whatever the Python around them.

    python bench/unit_floor.py [--steps 40] [--repeat 400] [--database-url URL]

Drives one run in-process on a fresh bench database (the write path users
run) and keeps the statements of its units as they are sent (commit 1: the
model's answer and the decisions; commit 2: the results, the checkpoint and
the next model request). Then, on a connection of its own, with each
statement prepared once and kept (BEGIN and ROLLBACK go straight to libpq:
psycopg discards its prepared statements after a ROLLBACK it sends itself,
which would re-plan every replay), medians of `--repeat` replays of a
mid-run pair:

- `select1`: a prepared `SELECT 1` (the round trip and the client's wake-up);
- `unit`: the unit replayed inside a transaction that is rolled back (round
  trip + bind + execution, no flush); the rows it inserts are deleted first,
  inside the same transaction, so the replay inserts them again;
- `fenced`: the same with the run's lease owner changed, so the fence
  matches nothing and nothing is written (round trip + bind + the plan's
  start-up: the fixed cost);
- `fenced_small_json`: `fenced` with the JSON parameters cut to `[]`/`{}`
  (what parsing the JSON parameters costs at bind);
- `commit`: an autocommit one-row INSERT minus `select1` (a WAL flush).

So a unit's execution = unit − select1, of which fixed = fenced − select1 and
writes = unit − fenced; a step's floor = 2 × (unit + commit) when the Python
between the units costs nothing. Figures, not assertions (bench/RESULTS.md).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
import steps as bench


def capture(url: str, steps: int) -> list[tuple[str, list]]:
    """The statements of one run's units, in the order they were sent."""
    tenant = bench.fresh_product(bench.bench_url(url), {"floor": steps})
    # here, not at the top: the script sets Django up at run time, before the project's modules load
    from runs.runtime.executor import run_drive
    from runs.store import repository

    sent: list[tuple[str, list]] = []
    send = repository._Pipe.send

    def keep(self, cursor, sql, params):
        sent.append((sql, list(params)))
        return send(self, cursor, sql, params)

    run_drive(run_id=bench.submit(tenant, "floor", 1, "warm-up")[0])
    repository._Pipe.send = keep
    try:
        outcome = run_drive(run_id=bench.submit(tenant, "floor", 1, "captured")[0])
    finally:
        repository._Pipe.send = send
    assert outcome is not None and outcome.kind.value == "completed", outcome
    return sent


def inserted_rows(params: list) -> list[tuple[str, list]]:
    """DELETEs of the rows a captured unit inserts (it is replayed after them)."""
    out = []
    for p in params:
        if isinstance(p, uuid.UUID) and p.version == 8:  # the checkpoint id (runs.store.repository._checkpoint_id)
            out.append(("DELETE FROM checkpoints WHERE id = %s", [p]))
        if isinstance(p, str) and p.startswith("[{") and '"call_index"' in p:
            out += [("DELETE FROM tool_invocations WHERE id = %s", [r["id"]]) for r in json.loads(p)]
        if isinstance(p, str) and p.startswith("[{") and '"attempt_number"' in p:
            out += [("DELETE FROM model_calls WHERE id = %s", [r["id"]]) for r in json.loads(p)]
    return out


def small_json(params: list) -> list:
    out = []
    for p in params:
        if isinstance(p, str) and p[:1] in "[{" and len(p) > 40:
            out.append("[]" if p.startswith("[") else '{"id": "00000000-0000-0000-0000-000000000000"}')
        else:
            out.append(p)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--repeat", type=int, default=400)
    p.add_argument(
        "--database-url",
        default=os.environ.get("DATABASE_URL") or "postgres://postgres@127.0.0.1:5432/agentrt_floor_bench",
    )
    a = p.parse_args()
    sent = capture(a.database_url, a.steps)
    ones = [u for u in sent if "finished_model_calls" in u[0] and "new_invocations" in u[0]]
    twos = [
        u for u in sent if "started_model_calls" in u[0] and "changed_invocations" in u[0] and "prior_from" not in u[0]
    ]
    unit1, unit2 = ones[len(ones) // 2], twos[len(twos) // 2]

    conn = psycopg.connect(bench.bench_url(a.database_url))
    run_id, owner, epoch = unit1[1][3], unit1[1][4], unit1[1][5]  # STEP_FENCE's parameters
    conn.execute(
        "UPDATE runs SET status = 'RUNNING', lease_owner = %s, lease_epoch = %s WHERE id = %s", [owner, epoch, run_id]
    )
    conn.commit()

    def replay(sql: str, params: list) -> tuple[float, int]:
        deletes = inserted_rows(params)
        times = []
        fenced = None
        for _ in range(a.repeat):
            conn.pgconn.exec_(b"BEGIN")
            for q, qp in deletes:
                conn.execute(q, qp)
            t0 = time.perf_counter()
            fenced = conn.execute(sql, params, prepare=True).fetchone()[0]
            times.append(time.perf_counter() - t0)
            conn.pgconn.exec_(b"ROLLBACK")
        return statistics.median(times) * 1e3, fenced

    def plain(sql: str) -> float:
        times = []
        for _ in range(a.repeat):
            t0 = time.perf_counter()
            conn.execute(sql, prepare=True)
            times.append(time.perf_counter() - t0)
        return statistics.median(times) * 1e3

    out: dict[str, float] = {}
    for name, (sql, params) in (("commit_1", unit1), ("commit_2", unit2)):
        out[f"{name}_unit_ms"], matched = replay(sql, params)
        assert matched == 1, "the fence should match the run"
    conn.execute("UPDATE runs SET lease_owner = 'someone else' WHERE id = %s", [run_id])
    conn.commit()
    for name, (sql, params) in (("commit_1", unit1), ("commit_2", unit2)):
        out[f"{name}_fenced_ms"], matched = replay(sql, params)
        out[f"{name}_fenced_small_json_ms"], _ = replay(sql, small_json(params))
        assert matched == 0, "the fence should match nothing"
    conn.autocommit = True
    conn.execute("CREATE TABLE IF NOT EXISTS bench_floor_probe (id bigserial PRIMARY KEY, v int)")
    out["select1_ms"] = plain("SELECT 1")
    out["insert_autocommit_ms"] = plain("INSERT INTO bench_floor_probe (v) VALUES (1)")
    out["commit_flush_ms"] = out["insert_autocommit_ms"] - out["select1_ms"]
    r = {k: round(v, 3) for k, v in out.items()}
    floor = 2 * r["commit_flush_ms"] + r["commit_1_unit_ms"] + r["commit_2_unit_ms"]
    r["step_floor_ms"] = round(floor, 3)
    print(json.dumps({"bench": "unit_floor", "steps": a.steps, "repeat": a.repeat, "figures": r}))
    for n in ("commit_1", "commit_2"):
        print(
            f"{n}: {r[f'{n}_unit_ms']:.3f} ms = round trip {r['select1_ms']:.3f}"
            f" + fixed {r[f'{n}_fenced_ms'] - r['select1_ms']:.3f}"
            f" (of which JSON parameters {r[f'{n}_fenced_ms'] - r[f'{n}_fenced_small_json_ms']:.3f})"
            f" + writes {r[f'{n}_unit_ms'] - r[f'{n}_fenced_ms']:.3f}; then its flush {r['commit_flush_ms']:.3f}",
            file=sys.stderr,
        )
    print(
        f"a read-only step's floor (two units and two flushes, no Python between them): {floor:.3f} ms",
        file=sys.stderr,
    )
    conn.close()


if __name__ == "__main__":
    main()
