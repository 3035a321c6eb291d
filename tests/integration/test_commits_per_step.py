"""A read-only step costs exactly two writing transactions on PostgreSQL
(DESIGN §6), counted by the server: every row a transaction writes carries
its id (`xmin`), so the distinct ids across the run's events, model calls,
invocations and checkpoints are the transactions that wrote them, whatever
else the server is doing. Runs of two lengths cancel the per-run writes
(claim, start, finalize) and leave the marginal step."""

from __future__ import annotations

from unittest.mock import patch

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


def transactions_between_model_calls(load_agent, submit, steps: int) -> list[int]:
    """The transactions the executing connection ran between one model call
    and the next (a step: its two commits and anything else), read-only ones
    included, counted by the server: each transaction a backend starts takes
    the next local id of its virtual transaction id (`<backend>/<local>`,
    held as a lock by the transaction itself). Read at each model call, on
    the same connection (the probe is a transaction too, taken off)."""
    from runs.providers.scripted import ScriptedProvider

    def local_xid() -> int:
        with connection.cursor() as cursor:
            cursor.execute("SELECT virtualxid FROM pg_locks WHERE locktype = 'virtualxid' AND pid = pg_backend_pid()")
            return int(cursor.fetchone()[0].split("/")[1])

    marks: list[int] = []
    complete = ScriptedProvider.complete

    def marked(self, request, token):
        marks.append(local_xid())
        return complete(self, request, token)

    load_agent(name=f"all{steps}", turns=echo_steps(steps))
    run = submit(agent=f"all{steps}", text=f"{steps} steps")
    with patch.object(ScriptedProvider, "complete", marked):
        assert run_drive(run_id=run.id).kind.value == "completed"
    return [after - before - 1 for before, after in zip(marks, marks[1:], strict=False)]


def test_a_read_only_step_costs_two_transactions_reads_included(load_agent, submit, tenant):
    """The tenant's policy floor is read once per step inside the commit that
    starts the step's model request, not in a read transaction of its own.
    A warm-up run first: psycopg prepares a statement shape on its second
    use, and a prepare outside pipeline mode is a (read-only) transaction of
    its own, once per shape and connection; the warm-up uses every shape of
    a step twice (a full checkpoint's commit 2 comes every fourth step)."""
    from runs.models import Tenant

    Tenant.objects.filter(id=tenant.id).update(
        policy_floor={"default": "allow", "rules": [{"tool": "http_post", "decision": "require_approval"}]}
    )
    transactions_between_model_calls(load_agent, submit, 10)
    per_step = transactions_between_model_calls(load_agent, submit, 16)
    assert per_step == [2] * 15, per_step
