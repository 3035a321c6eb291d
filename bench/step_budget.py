#!/usr/bin/env python
"""Where a read-only step's time goes, split into what the machine costs and
what our code costs: one in-process run (no qcluster), on the write path users
run, beside the machine's floor measured on the same connection.

The split needs every statement timed, through a Django execute_wrapper; with
one installed the store commits each unit before going on (it overlaps a
unit's flight with the next Python only when nothing watches the connection),
so the split is of the sequential step. `wall_plain_ms` is the same run
without the wrapper: the overlapped step users get.

    python bench/step_budget.py [--steps 200] [--runs 3] [--database-url URL]

Per step (medians over the runs, after a warm-up run):

- wall: the run's wall time / steps;
- unit A / unit B: time inside `cursor.execute` for the step's two commits
  (A: the model's answer and the decisions; B: the results, the checkpoint and
  the next model request), i.e. client send + round trip + server execution
  + WAL flush + result;
- Python, model phase (B acknowledged -> A sent) and tool phase (A
  acknowledged -> B sent);
- client CPU (every thread of this process) and server CPU (the backend's
  utime + stime from /proc, so its WAL fsync's kernel time too) per step;
- the floor on the same connection: `SELECT 1` (a round trip) and an
  autocommit one-row INSERT (a round trip and a WAL flush), each 2,000 times.

Figures, not assertions (bench/RESULTS.md reads them).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import steps as bench


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument(
        "--database-url",
        default=os.environ.get("DATABASE_URL") or "postgres://postgres@127.0.0.1:5432/agentrt_budget_bench",
    )
    a = p.parse_args()
    name = f"budget-{a.steps}"
    tenant = bench.fresh_product(bench.bench_url(a.database_url), {name: a.steps})

    # here, not at the top: the script sets Django up at run time, before the project's modules load
    from django.db import connection

    from runs.runtime.executor import run_drive

    marks: list[tuple[str, float, float]] = []

    def wrapper(execute, sql, params, many, context):
        t0 = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            kind = "A" if "finished_model_calls" in sql else "B" if "started_model_calls" in sql else "-"
            marks.append((kind, t0, time.perf_counter()))

    def backend_cpu(pid: int) -> float:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    run_drive(run_id=bench.submit(tenant, name, 1, "warm-up")[0])
    connection.ensure_connection()
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        pid = cursor.fetchone()[0]
    plain = []
    for r in range(a.runs):
        run_id = bench.submit(tenant, name, 1, f"plain {r}")[0]
        t0 = time.perf_counter()
        outcome = run_drive(run_id=run_id)
        plain.append((time.perf_counter() - t0) * 1e3 / a.steps)
        assert outcome is not None and outcome.kind.value == "completed", outcome
    rows = []
    for r in range(a.runs):
        marks.clear()
        run_id = bench.submit(tenant, name, 1, f"run {r}")[0]
        server0, client0, t0 = backend_cpu(pid), time.process_time(), time.perf_counter()
        with connection.execute_wrapper(wrapper):
            outcome = run_drive(run_id=run_id)
        wall = time.perf_counter() - t0
        assert outcome is not None and outcome.kind.value == "completed", outcome
        model_phase = [b[1] - a_[2] for a_, b in zip(marks, marks[1:], strict=False) if a_[0] == "B" and b[0] == "A"]
        tool_phase = [b[1] - a_[2] for a_, b in zip(marks, marks[1:], strict=False) if a_[0] == "A" and b[0] == "B"]
        rows.append(
            {
                "wall_ms": wall * 1e3 / a.steps,
                "unit_a_ms": statistics.median(m[2] - m[1] for m in marks if m[0] == "A") * 1e3,
                "unit_b_ms": statistics.median(m[2] - m[1] for m in marks if m[0] == "B") * 1e3,
                "python_model_phase_ms": statistics.median(model_phase) * 1e3,
                "python_tool_phase_ms": statistics.median(tool_phase) * 1e3,
                "client_cpu_ms": (time.process_time() - client0) * 1e3 / a.steps,
                "server_cpu_ms": (backend_cpu(pid) - server0) * 1e3 / a.steps,
            }
        )
    floor = {}
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE IF NOT EXISTS bench_floor_probe (id bigserial PRIMARY KEY, v int)")
        for label, sql in (
            ("select1_ms", "SELECT 1"),
            ("autocommit_insert_ms", "INSERT INTO bench_floor_probe (v) VALUES (1)"),
        ):
            for _ in range(200):
                cursor.execute(sql)
            t0 = time.perf_counter()
            for _ in range(2000):
                cursor.execute(sql)
            floor[label] = (time.perf_counter() - t0) * 1e3 / 2000
    result = {k: round(statistics.median(row[k] for row in rows), 3) for k in rows[0]}
    result.update({k: round(v, 3) for k, v in floor.items()})
    result["wall_plain_ms"] = round(statistics.median(plain), 3)
    print(json.dumps({"bench": "step_budget", "steps": a.steps, "runs": a.runs, "per_step": result}))
    r = result
    print(
        f"per step: wall {r['wall_ms']:.3f} ms = unit A {r['unit_a_ms']:.3f} + unit B {r['unit_b_ms']:.3f}"
        f" + Python {r['python_model_phase_ms']:.3f} (model phase) + {r['python_tool_phase_ms']:.3f} (tool phase)"
        f" + the rest; CPU: client {r['client_cpu_ms']:.3f}, server {r['server_cpu_ms']:.3f};"
        f" floor: round trip {r['select1_ms']:.3f}, one-row autocommit INSERT {r['autocommit_insert_ms']:.3f};"
        f" without the wrapper (overlapped, what users run): wall {r['wall_plain_ms']:.3f} ms",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
