"""Races on separate connections behind a barrier (RELIABILITY F10, F13)."""

from __future__ import annotations

import functools

import pytest
from django.db import connection

from approvals.errors import ApprovalDecided
from approvals.models import Approval
from approvals.services import approval_decide
from runs.models import Event
from tests.conftest import race

pytestmark = pytest.mark.django_db(transaction=True)


def test_approve_and_reject_racing_have_exactly_one_winner_and_one_requeue(load_agent, submit, operator):
    load_agent(
        turns=[{"tool_calls": [{"name": "echo", "arguments": {"text": "x"}}]}, {"text": "ok"}],
        policy={"default": "require_approval"},
    )
    iterations = 300
    for i in range(iterations):
        run = submit(text=f"r{i}")
        # Park the run by hand (a test fixture, not a runtime path): one pending approval.
        with connection.cursor() as cur:
            cur.execute("UPDATE runs SET status = 'WAITING_FOR_APPROVAL' WHERE id = %s", [run.id])
        approval = Approval.objects.create(
            tenant_id=run.tenant_id, run=run, kind="policy", request_hash="h" * 64, presentation={"tool": "echo"}
        )
        decide = functools.partial(approval_decide, user=operator, approval_id=approval.id, request_hash="h" * 64)
        results = race(functools.partial(decide, approve=True), functools.partial(decide, approve=False))
        wins = [r for r in results if isinstance(r, Approval)]
        losses = [r for r in results if isinstance(r, ApprovalDecided)]
        requeues = Event.objects.filter(run=run, type="run.requeued").count()
        outcome = (len(wins), len(losses), requeues, Event.objects.filter(run=run, type="approval.resolved").count())
        # Fail at the first wrong round: a broken guard shows on round 0 instead of after 300 rounds.
        assert outcome == (1, 1, 1, 1), f"round {i}: (wins, losses, requeues, resolved) = {outcome}, results {results}"
        with connection.cursor() as cur:  # end it so the session frees
            cur.execute("UPDATE runs SET status = 'CANCELLED' WHERE id = %s", [run.id])


def test_two_decisions_of_one_approval_while_another_is_pending_have_exactly_one_winner(load_agent, submit, operator):
    """The run stays WAITING_FOR_APPROVAL after the first decision (a second
    approval of its batch is still pending), so the run's status cannot be
    what refuses the second decision: only the approval's own `pending`
    guard can. Decisions queue on the run's row (they lock it first), so the
    second reads the first's outcome."""
    load_agent(
        turns=[{"tool_calls": [{"name": "echo", "arguments": {"text": "x"}}]}, {"text": "ok"}],
        policy={"default": "require_approval"},
    )
    for i in range(20):
        run = submit(text=f"r{i}")
        with connection.cursor() as cur:  # parked by hand (a fixture, not a runtime path): two pending approvals
            cur.execute("UPDATE runs SET status = 'WAITING_FOR_APPROVAL' WHERE id = %s", [run.id])
        first, other = (
            Approval.objects.create(
                tenant_id=run.tenant_id, run=run, kind="policy", request_hash=h * 64, presentation={"tool": "echo"}
            )
            for h in "hk"
        )
        decide = functools.partial(approval_decide, user=operator, approval_id=first.id, request_hash="h" * 64)
        results = race(functools.partial(decide, approve=True), functools.partial(decide, approve=False))
        wins = [r for r in results if isinstance(r, Approval)]
        losses = [r for r in results if isinstance(r, ApprovalDecided)]
        resolved = Event.objects.filter(run=run, type="approval.resolved").count()
        outcome = (len(wins), len(losses), resolved, Event.objects.filter(run=run, type="run.requeued").count())
        assert outcome == (1, 1, 1, 0), f"round {i}: (wins, losses, resolved, requeues) = {outcome}, results {results}"
        other.refresh_from_db()
        assert other.status == "pending"
        with connection.cursor() as cur:  # end it so the session frees
            cur.execute("UPDATE runs SET status = 'CANCELLED' WHERE id = %s", [run.id])
