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


def transactions_on_this_connection(load_agent, submit, steps: int) -> int:
    """Every transaction the executing connection ran during one run_drive,
    read-only ones included, counted by the server: each transaction a
    backend starts takes the next local id of its virtual transaction id
    (`<backend>/<local>`, held as a lock by the transaction itself)."""

    def local_xid() -> int:
        with connection.cursor() as cursor:
            cursor.execute("SELECT virtualxid FROM pg_locks WHERE locktype = 'virtualxid' AND pid = pg_backend_pid()")
            return int(cursor.fetchone()[0].split("/")[1])

    load_agent(name=f"all{steps}", turns=echo_steps(steps))
    run = submit(agent=f"all{steps}", text=f"{steps} steps")
    before = local_xid()
    assert run_drive(run_id=run.id).kind.value == "completed"
    return local_xid() - before


def test_a_read_only_step_costs_two_transactions_reads_included(load_agent, submit, tenant):
    """The tenant's policy floor is read once per step inside the commit that
    starts the step's model request, not in a read transaction of its own."""
    from runs.models import Tenant

    Tenant.objects.filter(id=tenant.id).update(
        policy_floor={"default": "allow", "rules": [{"tool": "http_post", "decision": "require_approval"}]}
    )
    short = transactions_on_this_connection(load_agent, submit, 6)
    long = transactions_on_this_connection(load_agent, submit, 16)
    assert long - short == 2 * 10, (short, long)
