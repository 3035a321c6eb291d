"""A decision and a cancel on one waiting run take their row locks in one
order (parent, run, then the run's approvals), so they queue instead of
deadlocking. Before the fix a decision locked its approval row first and the
run's row second, while a cancel locked the run and then its approvals:
held at the moment between the two, each waited for the other and
PostgreSQL aborted one with `deadlock detected`.

The moment is made deterministic, not hoped for: a trigger on the approval's
update waits on an advisory lock the test holds, so the decision sits with
its approval row locked while the cancel starts on its own connection; the
test lets the decision go only once the cancel is waiting on a row lock."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection, connections

from approvals.models import Approval
from approvals.services import approval_decide
from maintenance.sweeps.expiry import sweep_expiry
from runs.clock import utcnow
from runs.errors import RunTerminal
from runs.models import Event, Run
from runs.services.lifecycle import run_cancel
from tests.conftest import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

GATE = 48151623  # the advisory lock the trigger waits on


@pytest.fixture
def gated_approvals():
    """While the test holds GATE, an update that decides or expires an
    approval waits inside its row lock."""
    with connection.cursor() as cur:
        cur.execute(
            "CREATE FUNCTION decide_gate() RETURNS trigger AS $$"
            f" BEGIN PERFORM pg_advisory_xact_lock({GATE}); RETURN NEW; END $$ LANGUAGE plpgsql"
        )
        cur.execute(
            "CREATE TRIGGER decide_gate BEFORE UPDATE ON approvals FOR EACH ROW"
            " WHEN (NEW.status IN ('approved', 'expired')) EXECUTE FUNCTION decide_gate()"
        )
    yield
    with connection.cursor() as cur:
        cur.execute("DROP TRIGGER IF EXISTS decide_gate ON approvals")
        cur.execute("DROP FUNCTION IF EXISTS decide_gate()")


def parked(load_agent, submit, *, expires_at=None) -> tuple[Run, Approval]:
    load_agent(
        turns=[{"tool_calls": [{"name": "echo", "arguments": {"text": "x"}}]}, {"text": "ok"}],
        policy={"default": "require_approval"},
    )
    run = submit(text="park me")
    with connection.cursor() as cur:  # parked by hand (a fixture, not a runtime path): one pending approval
        cur.execute("UPDATE runs SET status = 'WAITING_FOR_APPROVAL' WHERE id = %s", [run.id])
    approval = Approval.objects.create(
        tenant_id=run.tenant_id,
        run=run,
        kind="policy",
        request_hash="h" * 64,
        presentation={"tool": "echo"},
        expires_at=expires_at,
    )
    return run, approval


def waiting_backends(wait_type: str, event: str | None = None) -> int:
    with connection.cursor() as cur:
        cur.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND wait_event_type = %s AND (%s IS NULL OR wait_event = %s) AND pid <> pg_backend_pid()",
            [wait_type, event, event],
        )
        return cur.fetchone()[0]


def in_thread(fn, results: dict, key: str) -> threading.Thread:
    def go():
        try:
            results[key] = fn()
        except Exception as exc:  # the answer the caller would get
            results[key] = exc
        finally:
            connections.close_all()

    t = threading.Thread(target=go)
    t.start()
    return t


def interleave(first, cancel) -> dict:
    """`first` runs until it holds its approval row (waiting on GATE); then
    the cancel starts and runs until it waits on a row lock; then GATE opens."""
    results: dict = {}
    with connection.cursor() as gate:
        gate.execute("SELECT pg_advisory_lock(%s)", [GATE])
        try:
            a = in_thread(first, results, "first")
            wait_for(lambda: waiting_backends("Lock", "advisory") == 1, message="the decision holds its approval row")
            b = in_thread(cancel, results, "cancel")
            wait_for(
                lambda: waiting_backends("Lock") == 2 or "cancel" in results,
                message="the cancel waits on a row lock",
            )
        finally:
            gate.execute("SELECT pg_advisory_unlock(%s)", [GATE])
    a.join(60)
    b.join(60)
    return results


def test_an_approval_and_a_cancel_at_once_queue_instead_of_deadlocking(load_agent, submit, operator, gated_approvals):
    run, approval = parked(load_agent, submit)
    results = interleave(
        lambda: approval_decide(user=operator, approval_id=approval.id, approve=True, request_hash="h" * 64),
        lambda: run_cancel(run=run, by="op"),
    )
    assert isinstance(results["first"], Approval), results  # was: deadlock detected in one of the two
    assert results["cancel"] == "CANCELLED", results
    approval.refresh_from_db()
    run.refresh_from_db()
    assert (approval.status, run.status) == ("approved", "CANCELLED")
    assert Event.objects.filter(run=run, type="approval.resolved").count() == 1
    assert Event.objects.filter(run=run, type="run.cancelled").count() == 1


def test_an_expiry_and_a_cancel_at_once_queue_instead_of_deadlocking(load_agent, submit, gated_approvals):
    run, approval = parked(load_agent, submit, expires_at=utcnow() - timedelta(seconds=1))
    results = interleave(sweep_expiry, lambda: run_cancel(run=run, by="op"))
    assert results["first"]["approval_expired"] == 1, results  # was: deadlock detected in one of the two
    assert isinstance(results["cancel"], RunTerminal), results  # the run had failed: a clean "already ended"
    approval.refresh_from_db()
    run.refresh_from_db()
    assert (approval.status, run.status, run.failure["reason"]) == ("expired", "FAILED", "approval_expired")
