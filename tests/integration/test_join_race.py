"""The join under concurrency (issue 15 §1): two children of one parent end at
the same moment, each in its own worker's finalize on its own database
connection, released together by a barrier. Exactly one of them is the last
sibling: the parent is requeued once, both of its calls are answered, and
neither transaction deadlocks (the lock order is parent, then child)."""

from __future__ import annotations

import functools
import threading

import pytest
from django.db import connections

from runs.domain.cancellation import Token
from runs.domain.values import OutcomeKind, RunOutcome
from runs.models import Event, Run, ToolInvocation
from runs.runtime.executor import run_drive
from runs.runtime.finalize import finalize
from runs.runtime.queue import run_claim
from runs.runtime.wiring import build_context
from runs.services.lifecycle import run_cancel

pytestmark = pytest.mark.django_db(transaction=True)

ROUNDS = 25


class Alive:
    """The lease monitor of a worker whose heartbeats all succeed."""

    def may_start_effect(self) -> bool:
        return True


def together(*plans) -> list:
    """Run each `(prepare, act)` on a thread (and database connection) of its own: every thread prepares,
    they meet at a barrier, then each acts on what it prepared. Return what each act returned or raised."""
    barrier = threading.Barrier(len(plans))
    results: list = [None] * len(plans)

    def worker(i, prepare, act):
        try:
            ready = prepare()
            barrier.wait()
            results[i] = act(ready)
        except Exception as exc:  # a deadlock or any other error is the answer
            results[i] = exc
        finally:
            connections.close_all()

    threads = [threading.Thread(target=worker, args=(i, *plan)) for i, plan in enumerate(plans)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    return results


def child_end(claim):
    """A worker ending its child run COMPLETED through finalize: (prepare, act) for `together`."""
    prepare = functools.partial(build_context, claim, token=Token(), lease=Alive())
    act = functools.partial(_finalize_completed, claim=claim)
    return prepare, act


def _finalize_completed(ctx, *, claim):
    return finalize(ctx, claim, RunOutcome(kind=OutcomeKind.COMPLETED, final_message="done"))


def test_two_siblings_ending_at_the_same_moment_requeue_their_parent_exactly_once(load_agent, submit, settings):
    settings.AGENTRT_TENANT_MAX_RUNNING = 2  # both children leased at once, as on two workers
    load_agent(name="worker", turns=[{"text": "unused"}])
    calls = [{"name": "delegate_run", "arguments": {"agent": "worker", "input": f"part {k}"}} for k in range(2)]
    load_agent(name="lead", turns=[{"tool_calls": calls}], tools=("delegate_run",), delegates=["worker"])
    for round_ in range(ROUNDS):
        parent = submit(agent="lead", text=f"round {round_}")
        assert run_drive(run_id=parent.id).kind is OutcomeKind.SUSPENDED
        children = list(Run.objects.filter(parent_id=parent.id).order_by("created_at"))
        claims = [run_claim(run_id=c.id, owner=f"worker-{k}") for k, c in enumerate(children)]

        results = together(*(child_end(c) for c in claims))

        kinds = [getattr(r, "kind", r) for r in results]
        requeues = Event.objects.filter(run=parent, type="run.requeued").count()
        status = Run.objects.filter(id=parent.id).values_list("status", flat=True).get()
        answered = sorted(ToolInvocation.objects.filter(run=parent).values_list("status", flat=True))
        observed = (kinds, requeues, status, answered)
        # Fail at the first wrong round, not after all of them.
        assert observed == (
            [OutcomeKind.COMPLETED, OutcomeKind.COMPLETED],
            1,
            "QUEUED",
            ["completed", "completed"],
        ), f"round {round_}: {observed}"


def test_a_child_ending_while_its_parent_is_cancelled_neither_deadlocks_nor_requeues_the_parent(load_agent, submit):
    """The other order two transactions could take the family's rows in: cancelling the parent locks the
    parent and then its children; a child's end locks the parent before its own row, so the two queue
    instead of deadlocking (PostgreSQL would abort one of them after deadlock_timeout)."""
    load_agent(name="worker", turns=[{"text": "unused"}])
    calls = [{"name": "delegate_run", "arguments": {"agent": "worker", "input": f"part {k}"}} for k in range(2)]
    load_agent(name="lead", turns=[{"tool_calls": calls}], tools=("delegate_run",), delegates=["worker"])
    for round_ in range(ROUNDS):
        parent = submit(agent="lead", text=f"round {round_}")
        assert run_drive(run_id=parent.id).kind is OutcomeKind.SUSPENDED
        first, second = Run.objects.filter(parent_id=parent.id).order_by("created_at")
        claim = run_claim(run_id=first.id, owner="worker-0")
        cancel = (functools.partial(Run.objects.get, id=parent.id), functools.partial(_cancel, by="alice"))

        results = together(child_end(claim), cancel)

        rows = dict(Run.objects.filter(id__in=[parent.id, first.id, second.id]).values_list("id", "status"))
        observed = (
            getattr(results[0], "kind", results[0]),
            results[1],
            rows[parent.id],
            rows[first.id],
            rows[second.id],
            Event.objects.filter(run=parent, type="run.requeued").count(),
        )
        assert observed == (OutcomeKind.COMPLETED, "CANCELLED", "CANCELLED", "COMPLETED", "CANCELLED", 0), (
            f"round {round_}: {observed}"
        )


def _cancel(run, *, by):
    return run_cancel(run=run, by=by)
