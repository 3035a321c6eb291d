"""Races on separate connections behind a barrier (RELIABILITY F10, F13)."""

from __future__ import annotations

import threading

import pytest
from django.db import connection, connections, transaction

from approvals.errors import ApprovalDecided
from approvals.models import Approval
from approvals.services import approval_decide
from runs.models import Event, Run
from runs.runtime.queue import run_claim_next

pytestmark = pytest.mark.django_db(transaction=True)


def race(*fns):
    barrier = threading.Barrier(len(fns))
    results = [None] * len(fns)

    def go(i, fn):
        barrier.wait()
        try:
            results[i] = fn()
        except Exception as exc:  # the loser's answer
            results[i] = exc
        finally:
            connections.close_all()

    threads = [threading.Thread(target=go, args=(i, fn)) for i, fn in enumerate(fns)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    return results


def test_approve_and_reject_racing_have_exactly_one_winner_and_one_requeue(load_agent, submit, operator):
    load_agent(
        turns=[{"tool_calls": [{"name": "echo", "arguments": {"text": "x"}}]}, {"text": "ok"}],
        policy={"default": "require_approval"},
    )
    iterations = 300
    outcomes = []
    for i in range(iterations):
        run = submit(text=f"r{i}")
        # Park the run by hand (a test fixture, not a runtime path): one pending approval.
        with connection.cursor() as cur:
            cur.execute("UPDATE runs SET status = 'WAITING_FOR_APPROVAL' WHERE id = %s", [run.id])
        approval = Approval.objects.create(
            tenant_id=run.tenant_id, run=run, kind="policy", request_hash="h" * 64, presentation={"tool": "echo"}
        )
        results = race(
            lambda: approval_decide(user=operator, approval_id=approval.id, approve=True, request_hash="h" * 64),
            lambda: approval_decide(user=operator, approval_id=approval.id, approve=False, request_hash="h" * 64),
        )
        wins = [r for r in results if isinstance(r, Approval)]
        losses = [r for r in results if isinstance(r, ApprovalDecided)]
        requeues = Event.objects.filter(run=run, type="run.requeued").count()
        outcomes.append(
            (len(wins), len(losses), requeues, Event.objects.filter(run=run, type="approval.resolved").count())
        )
        with connection.cursor() as cur:  # end it so the session frees
            cur.execute("UPDATE runs SET status = 'CANCELLED' WHERE id = %s", [run.id])
    assert outcomes == [(1, 1, 1, 1)] * iterations


def test_claim_next_skips_a_row_another_transaction_holds(load_agent, submit):
    load_agent()
    first, second = submit(text="a"), submit(text="b")
    locked = threading.Event()
    release = threading.Event()

    def hold():
        with transaction.atomic():
            with connection.cursor() as cur:
                cur.execute("SELECT id FROM runs WHERE id = %s FOR UPDATE", [first.id])
                locked.set()
                release.wait(10)
        connections.close_all()

    holder = threading.Thread(target=hold)
    holder.start()
    locked.wait(10)
    claim = run_claim_next(owner="w1")
    release.set()
    holder.join()
    assert claim is not None and claim.run_id == second.id  # SKIP LOCKED: no wait, no double claim
    again = run_claim_next(owner="w2")
    assert again is not None and again.run_id == first.id
    assert run_claim_next(owner="w3") is None
    assert Run.objects.get(id=first.id).lease_owner == "w2"
