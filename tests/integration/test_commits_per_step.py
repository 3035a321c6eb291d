"""A read-only step costs exactly two writing transactions on PostgreSQL
(DESIGN §6), counted by the server: every row a transaction writes carries
its id (`xmin`), so the distinct ids across the run's events, model calls,
invocations and checkpoints are the transactions that wrote them, whatever
else the server is doing. Runs of two lengths cancel the per-run writes
(claim, start, finalize) and leave the marginal step."""

from __future__ import annotations

import pytest
from django.db import connection

from runs.runtime.executor import run_drive

pytestmark = pytest.mark.django_db(transaction=True)


def echo_steps(n: int) -> list[dict]:
    return [{"tool_calls": [{"name": "echo", "arguments": {"text": f"step {i}"}}]} for i in range(n - 1)] + [
        {"text": "done"}
    ]


def writing_transactions(load_agent, submit, steps: int) -> int:
    load_agent(name=f"bot{steps}", turns=echo_steps(steps))
    run = submit(agent=f"bot{steps}", text=f"{steps} steps")
    assert run_drive(run_id=run.id).kind.value == "completed"
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(DISTINCT x) FROM ("
            " SELECT xmin::text AS x FROM events WHERE run_id = %s"
            " UNION ALL SELECT xmin::text FROM model_calls WHERE run_id = %s"
            " UNION ALL SELECT xmin::text FROM tool_invocations WHERE run_id = %s"
            " UNION ALL SELECT xmin::text FROM checkpoints WHERE run_id = %s) t",
            [run.id] * 4,
        )
        return cursor.fetchone()[0]


def test_a_read_only_step_costs_two_writing_transactions(load_agent, submit):
    short = writing_transactions(load_agent, submit, 6)
    long = writing_transactions(load_agent, submit, 16)
    assert long - short == 2 * 10, (short, long)
